//! Allocator mode's profile files, drawn by the report step's own renderers
//! from the paths of an [`AllocationsReport`]: a flame graph (inferno,
//! [`crate::report::flamegraph`]), speedscope
//! ([`crate::report::speedscope`]) and pprof ([`crate::report::pprof`]).
//! Each path weighs the bytes `--alloc-weight` names, so a file's total is
//! the report's total of that measure.

use std::io::{self, Write};

use super::{folded, AllocWeight};
use crate::allocations::{AllocationsReport, ProcessAllocations};
use crate::report::{flamegraph, pprof, speedscope};

/// pprof sample types, in the order of each sample's values, all sampled
/// bytes: allocated (Go's `alloc_space`), leaked (live at the end:
/// `inuse_space`) and live at the process's high-water mark.
const SAMPLE_TYPES: [(&str, &str); 3] = [
    ("alloc_space", "bytes"),
    ("inuse_space", "bytes"),
    ("peak_space", "bytes"),
];

impl AllocWeight {
    /// The measure in words, for titles: `allocated`, `leaked`, `live at
    /// peak`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Allocated => "allocated",
            Self::Leaked => "leaked",
            Self::Peak => "live at peak",
        }
    }

    /// The pprof sample type shown by default.
    fn sample_type(self) -> &'static str {
        match self {
            Self::Allocated => SAMPLE_TYPES[0].0,
            Self::Leaked => SAMPLE_TYPES[1].0,
            Self::Peak => SAMPLE_TYPES[2].0,
        }
    }
}

/// The run an allocation profile is drawn for.
pub struct ProfileRun<'a> {
    /// The traced command, for titles.
    pub command: &'a str,
    /// Length of the trace, in ns.
    pub duration_ns: u64,
    /// Icicle flame graph (`--inverted`).
    pub inverted: bool,
}

/// `memtrace: allocator bytes leaked by `command`` (the measure of `weight`).
fn title(weight: AllocWeight, run: &ProfileRun<'_>) -> String {
    format!(
        "memtrace: allocator bytes {} by `{}`",
        weight.describe(),
        run.command
    )
}

/// Writes an SVG flame graph of the allocation paths weighed by `weight`:
/// one tower per process (root frame `tgid N`), frame widths in sampled
/// bytes; with no path of `weight` bytes, a small SVG that says so.
///
/// # Errors
/// Any error of `out`.
pub fn render_flamegraph(
    report: &AllocationsReport,
    weight: AllocWeight,
    run: &ProfileRun<'_>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut lines = folded::lines(report, weight);
    lines.sort();
    let drawing = flamegraph::Drawing {
        title: title(weight, run),
        subtitle: None,
        inverted: run.inverted,
        image_width: None,
        weight_described: weight.describe(),
    };
    flamegraph::draw_lines(&lines, drawing, out)
}

/// Writes a speedscope file: one sampled profile per process with `weight`
/// bytes (named `tgid N`), one sample per path, frames outermost first,
/// `endValue` the process's total.
///
/// # Errors
/// Any error of `out`.
pub fn render_speedscope(
    report: &AllocationsReport,
    weight: AllocWeight,
    run: &ProfileRun<'_>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut file = speedscope::FileBuilder::default();
    for process in &report.processes {
        let paths = process
            .paths
            .iter()
            .map(|p| (p.stack.as_slice(), weight.bytes(p)));
        file.profile(instance(process), paths);
    }
    file.write(title(weight, run), out)
}

/// Writes a gzipped pprof profile: sample types `alloc_space`,
/// `inuse_space` (leaked) and `peak_space`, in bytes, the default one
/// picked by `weight`; one sample per process and path, leaf first,
/// labelled `tgid` (number) and `process`/`instance` (`tgid N`).
///
/// # Errors
/// Any error of `out`.
pub fn render_pprof(
    report: &AllocationsReport,
    weight: AllocWeight,
    run: &ProfileRun<'_>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut builder = pprof::Builder::new(&SAMPLE_TYPES);
    for process in &report.processes {
        let name = instance(process);
        let labels = pprof::SampleProcess {
            tgid: process.tgid,
            label: &name,
            name: &name,
        };
        for path in &process.paths {
            let value = [path.allocated_bytes, path.leaked_bytes, path.peak_bytes]
                .map(pprof::signed)
                .to_vec();
            builder.sample(path.stack.iter().rev(), value, &labels);
        }
    }
    let profile = builder.finish(&pprof::ProfileMeta {
        comment: Vec::new(),
        duration_ns: run.duration_ns,
        sample_interval_bytes: report.sample_interval_bytes,
        default_sample_type: weight.sample_type(),
    });
    pprof::write_gzipped(&profile, out)
}

/// `tgid N`: the name of a process in the files.
fn instance(process: &ProcessAllocations) -> String {
    format!("tgid {}", process.tgid)
}
