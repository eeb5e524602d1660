//! Allocator mode's terminal section, printed after the default table:
//! per process, how its hooks went, then its top paths by leaked bytes.

use std::io::{self, Write};

use crate::allocations::{AllocationsReport, HookStatus, ProcessAllocations, INLINED_REMEDY};
use crate::units::format_bytes;

/// Innermost frames of a path shown, outermost first (`a -> b -> c`).
const FRAMES_SHOWN: usize = 3;

/// Writes the allocator section with at most `top` paths per process.
///
/// # Errors
/// Any error of `out`.
pub fn render_text(report: &AllocationsReport, top: usize, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nAllocations (allocator hooks, Poisson byte sampling, mean {}; temporary = freed \
         within {} ms):",
        format_bytes(report.sample_interval_bytes),
        report.temporary_ns / 1_000_000
    )?;
    if report.kernel.live_full > 0 {
        writeln!(
            out,
            "  warning: {} sampled blocks did not fit in the kernel's live set: their frees \
             are not seen (they count as leaked)",
            report.kernel.live_full
        )?;
    }
    for process in &report.processes {
        render_process(process, top, out)?;
    }
    Ok(())
}

fn render_process(process: &ProcessAllocations, top: usize, out: &mut dyn Write) -> io::Result<()> {
    write!(out, "  process {}: ", process.tgid)?;
    match &process.hook {
        HookStatus::Pending => writeln!(out, "allocator not hooked (process ended first)")?,
        HookStatus::NotHooked { reason } => {
            writeln!(out, "allocator not hooked ({reason}); default mode only")?;
        }
        HookStatus::Hooked {
            binaries, gap_ns, ..
        } => writeln!(
            out,
            "{} allocated, {} leaked, {} live at peak ({} sampled); hooks in {}; allocations \
             before +{} ms not seen",
            format_bytes(process.allocated_bytes),
            format_bytes(process.leaked_bytes),
            format_bytes(process.peak_bytes),
            process.sampled_allocations,
            binaries.join(", "),
            gap_ns / 1_000_000
        )?,
    }
    if process.inlined_allocator_suspected {
        writeln!(
            out,
            "    note: {} of anonymous RSS growth; {INLINED_REMEDY}",
            format_bytes(process.rss_anon_growth_bytes)
        )?;
    }
    if let Some(note) = &process.fragmentation {
        writeln!(
            out,
            "    note: the allocator holds freed memory: anonymous RSS {} at the end, {} of it \
             gained while traced, but only {} of live objects (sampled): {} is free memory \
             the allocator keeps; {}",
            format_bytes(note.rss_anon_end_bytes),
            format_bytes(note.rss_anon_retained_bytes),
            format_bytes(note.live_bytes),
            format_bytes(note.held_free_bytes),
            note.remedy()
        )?;
    }
    if process.untracked_allocations > 0 {
        writeln!(
            out,
            "    warning: {} sampled blocks untracked (live set full)",
            process.untracked_allocations
        )?;
    }
    if process.paths.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "    {:>10} {:>10} {:>10} {:>10} {:>10}  path",
        "allocated", "freed", "leaked", "at peak", "temporary"
    )?;
    for path in process.paths.iter().take(top) {
        let shown = path.stack.len().saturating_sub(FRAMES_SHOWN);
        writeln!(
            out,
            "    {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
            format_bytes(path.allocated_bytes),
            format_bytes(path.freed_bytes),
            format_bytes(path.leaked_bytes),
            format_bytes(path.peak_bytes),
            format_bytes(path.temporary_bytes),
            path.stack[shown..].join(" -> ")
        )?;
    }
    Ok(())
}
