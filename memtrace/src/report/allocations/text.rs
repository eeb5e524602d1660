//! Allocator mode's terminal section, printed after the default table:
//! per process image (named as the table names it), how its hooks went,
//! then its top paths by leaked bytes.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::aggregate::ProcessReport;
use crate::allocations::{AllocationsReport, HookStatus, ProcessAllocations, INLINED_REMEDY};
use crate::units::format_bytes;

/// Frames of a path shown, outermost first (`a -> b -> c`): the innermost
/// Python frame and the native frames nearest the allocator.
const FRAMES_SHOWN: usize = 4;

/// Writes the allocator section with at most `top` paths per process;
/// `processes` are the report's process images, whose names the section
/// uses. Images that ended before their allocator was hooked, with nothing
/// sampled (shells and launch shims under `run`), are one line.
///
/// # Errors
/// Any error of `out`.
pub fn render_text(
    report: &AllocationsReport,
    processes: &[ProcessReport],
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
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
    let names = image_names(report, processes);
    let mut unhooked = 0;
    for (process, name) in report.processes.iter().zip(&names) {
        if ended_unhooked(process) {
            unhooked += 1;
        } else {
            render_process(process, name, top, out)?;
        }
    }
    if unhooked > 0 {
        writeln!(
            out,
            "  {unhooked} process image{} ended before {} allocator could be hooked, with \
             nothing sampled (shells, launch shims): the default mode's table has them",
            if unhooked == 1 { "" } else { "s" },
            if unhooked == 1 { "its" } else { "their" }
        )?;
    }
    Ok(())
}

/// Whether `process` ended before its hooks were attached and has nothing
/// to show.
fn ended_unhooked(process: &ProcessAllocations) -> bool {
    matches!(process.hook, HookStatus::Pending) && process.paths.is_empty()
}

/// The name of each of `report`'s processes as the process table gives it
/// ([`ProcessReport::name`]: `tgid 4312`, `tgid 4312#2`, `, image 1`). The
/// allocator tracker keeps one entry per image, in the order the images
/// began, as the aggregator does: the k-th entry of a tgid is its k-th image
/// in `processes`. When the counts differ, `tgid N`.
fn image_names(report: &AllocationsReport, processes: &[ProcessReport]) -> Vec<String> {
    let mut images: HashMap<u32, Vec<&ProcessReport>> = HashMap::new();
    for p in processes {
        images.entry(p.tgid).or_default().push(p);
    }
    for list in images.values_mut() {
        list.sort_by_key(|p| (p.instance, p.image));
    }
    let mut entries: HashMap<u32, usize> = HashMap::new();
    for process in &report.processes {
        *entries.entry(process.tgid).or_default() += 1;
    }
    let mut seen: HashMap<u32, usize> = HashMap::new();
    report
        .processes
        .iter()
        .map(|process| {
            let index = seen.entry(process.tgid).or_default();
            let image = images
                .get(&process.tgid)
                .filter(|list| list.len() == entries[&process.tgid])
                .map(|list| list[*index].name());
            *index += 1;
            image.unwrap_or_else(|| format!("tgid {}", process.tgid))
        })
        .collect()
}

fn render_process(
    process: &ProcessAllocations,
    name: &str,
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    write!(out, "  {name}: ")?;
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
        writeln!(
            out,
            "    {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
            format_bytes(path.allocated_bytes),
            format_bytes(path.freed_bytes),
            format_bytes(path.leaked_bytes),
            format_bytes(path.peak_bytes),
            format_bytes(path.temporary_bytes),
            shown_path(&path.stack)
        )?;
    }
    Ok(())
}

/// The frames of `stack` (outermost first) the section shows, joined by
/// ` -> `: the innermost Python frame, then the innermost native frames under
/// it, with `…` for the native frames between them left out (a chain through
/// a library can be 30 deep), so the line always names the Python code. A
/// stack without Python frames shows its innermost frames.
pub(super) fn shown_path(stack: &[String]) -> String {
    let start = stack.len().saturating_sub(FRAMES_SHOWN);
    match stack.iter().rposition(|frame| is_python_frame(frame)) {
        Some(python) if python < start => {
            format!(
                "{} -> … -> {}",
                stack[python],
                stack[start + 1..].join(" -> ")
            )
        }
        _ => stack[start..].join(" -> "),
    }
}

/// Whether `frame` is a Python frame as `aggregate::Frame` displays one:
/// `function (file:line)`.
fn is_python_frame(frame: &str) -> bool {
    frame
        .strip_suffix(')')
        .and_then(|rest| rest.rsplit_once(" ("))
        .and_then(|(_, location)| location.rsplit_once(':'))
        .is_some_and(|(_, line)| line.parse::<u32>().is_ok())
}
