//! Allocator mode's folded stacks (inferno / flamegraph.pl input): one line
//! per process and path, weighed by the bytes `--alloc-weight` names.

use std::io::{self, Write};

use crate::allocations::{AllocationsReport, PathAllocations};

/// Which bytes weigh a path in the folded stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocWeight {
    /// Bytes allocated.
    Allocated,
    /// Bytes still live at the end.
    Leaked,
    /// Bytes live at the process's high-water mark.
    Peak,
}

impl AllocWeight {
    /// The bytes of `path` this weight counts.
    pub fn bytes(self, path: &PathAllocations) -> u64 {
        match self {
            Self::Allocated => path.allocated_bytes,
            Self::Leaked => path.leaked_bytes,
            Self::Peak => path.peak_bytes,
        }
    }
}

/// Writes `tgid N;frame;...;frame BYTES` for every path with a non-zero
/// `weight`, in the report's order ([`lines`]).
///
/// # Errors
/// Any error of `out`.
pub fn render_folded(
    report: &AllocationsReport,
    weight: AllocWeight,
    out: &mut dyn Write,
) -> io::Result<()> {
    for line in lines(report, weight) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One folded line `tgid N;frame;...;frame BYTES` per path with a non-zero
/// `weight`, in the report's order: the root frame is the process, frames
/// run outermost first, and a `;` inside a frame (the separator) is
/// written as `,`.
pub fn lines(report: &AllocationsReport, weight: AllocWeight) -> Vec<String> {
    let mut lines = Vec::new();
    for process in &report.processes {
        for path in &process.paths {
            let bytes = weight.bytes(path);
            if bytes == 0 {
                continue;
            }
            let mut line = format!("tgid {}", process.tgid);
            for frame in &path.stack {
                line.push(';');
                line.push_str(&frame.replace(';', ","));
            }
            line.push_str(&format!(" {bytes}"));
            lines.push(line);
        }
    }
    lines
}
