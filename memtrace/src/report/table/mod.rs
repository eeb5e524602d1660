//! Terminal renderer of the report step: the summary a user reads when
//! tracing stops. The diagnosis first (each finding with its evidence, code
//! paths and next step), then the process table (one row per image of each
//! process, by RSS growth, with how and when it ended: its numbers stop
//! there, before the interpreter's finalization and the kernel's teardown),
//! the run totals, the top paths merged across processes (a leak a pre-fork
//! service repeats in every worker ranks by its total) and a shorter
//! per-process list, both with the bytes each path held at the high-water
//! mark, held at the end and grew, ranked by `--weight`; then the
//! copy-on-write paths, each with its frames, data-quality lines, warnings
//! (one line per kind without `--verbose`) and the files written, just
//! above the verdict.

mod frames;
mod warnings;

use std::io::{self, Write};

use frames::compact_frame_lines;
pub(crate) use frames::frame_lines;

use super::{text, verdict, FilesWritten, RenderOptions};
use crate::aggregate::{
    PathReport, ProcessId, ProcessKind, ProcessReport, PythonPath, Report, SampledBytes, Weight,
};
use crate::diagnose::{Diagnosed, Finding};
use crate::units::{format_bytes, format_signed_bytes};

/// Most merged paths the terminal lists without `--verbose` (each with its
/// frames folded: [`compact_frame_lines`]), so the report above the verdict
/// stays about one screen.
const COMPACT_TOP_PATHS: usize = 5;

/// Most (process, stack) paths in the per-process growth list; the merged
/// list above it is the one `top` sizes.
const MAX_PER_PROCESS_PATHS: usize = 5;

/// Most characters of the COMMAND column (a [`text::short_command`]): a row
/// of the process table then fits in 160 columns.
const MAX_COMMAND_CHARS: usize = 40;

/// Most processes named per merged path; the rest are counted.
const MAX_TGIDS_SHOWN: usize = 8;

/// Native children shown under a Python path, largest first; the rest are
/// summed into `… N more`.
const MAX_NATIVES_SHOWN: usize = 8;

/// Helpers that lived under this long ([`is_brief_helper`]) are summed on
/// one line of the process table. 1 s.
const BRIEF_HELPER_NS: u64 = 1_000_000_000;

/// ... and grew under this much. 8 MiB.
const BRIEF_HELPER_BYTES: u64 = 8 * 1024 * 1024;

/// Nanoseconds per second, for durations shown in seconds.
const NS_PER_S: f64 = 1e9;

/// Writes the terminal summary of `report` to `out`: with
/// `options.verbose` every finding first, then a header line, the process
/// table (sorted by RSS growth), the run totals, the `options.top` paths
/// merged across processes, the `min(top, 5)` largest (process, stack)
/// paths (that many in total, not per process), both ranked by
/// `options.weight` and showing all three measures, and the `top`
/// copy-on-write paths (each with its frames, innermost Python frame first
/// and the native frame under them), the record counts, the warnings, the
/// "Files written" section (`written`, in order), and last the verdict (one
/// entry per cause: what stays on the screen).
///
/// # Errors
/// Any error of `out` (e.g. a closed pipe).
pub fn render(
    report: &Diagnosed,
    options: &RenderOptions,
    written: &FilesWritten,
    out: &mut dyn Write,
) -> io::Result<()> {
    details(report, options, out)?;
    files(written, out)?;
    verdict(report, out)
}

/// [`render`] without the lines naming the report files.
///
/// # Errors
/// Any error of `out`.
pub fn render_summary(
    report: &Diagnosed,
    options: &RenderOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    details(report, options, out)?;
    verdict(report, out)
}

/// Everything above the verdict.
fn details(report: &Diagnosed, options: &RenderOptions, out: &mut dyn Write) -> io::Result<()> {
    let (top, weight) = (options.top, options.weight);
    if options.verbose {
        diagnosis(report, out)?;
    }
    header(report, out)?;
    processes(report, out)?;
    totals(report, out)?;
    if options.verbose {
        growth_stacks(report, weight, top, false, out)?;
        growth_paths(report, weight, top.min(MAX_PER_PROCESS_PATHS), out)?;
        cow_paths(report, top, out)?;
    } else {
        growth_stacks(report, weight, top.min(COMPACT_TOP_PATHS), true, out)?;
    }
    records(report, out)?;
    for line in warnings::lines(&report.warnings, options.verbose) {
        writeln!(out, "warning: {line}")?;
    }
    // Allocator mode's section comes before the files and the verdict, so
    // the verdict stays last on the screen.
    if let Some(allocations) = &report.allocations {
        super::allocations::render_text(allocations, &report.report.processes, top, out)?;
    }
    Ok(())
}

/// A blank line, then the verdict; nothing when the report was not
/// diagnosed.
fn verdict(report: &Diagnosed, out: &mut dyn Write) -> io::Result<()> {
    if report.causes.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    for line in verdict::lines(report) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The findings, most important first, then a blank line; nothing when the
/// report was not diagnosed.
fn diagnosis(report: &Diagnosed, out: &mut dyn Write) -> io::Result<()> {
    let findings = &report.diagnosis;
    if findings.is_empty() {
        return Ok(());
    }
    writeln!(out, "Diagnosis")?;
    for (rank, finding) in findings.iter().enumerate() {
        finding_entry(report, rank + 1, finding, out)?;
    }
    writeln!(out)
}

/// One finding: `N. pattern (scope): summary`, the caveat of a weak one,
/// its evidence, its top code paths and the next step.
fn finding_entry(
    report: &Report,
    rank: usize,
    finding: &Finding,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{rank:>3}. {} ({}): {}",
        text::pattern_name(finding.pattern),
        text::scope_text(report, finding.scope),
        finding.summary
    )?;
    if let Some(caveat) = text::weakness(finding.strength) {
        writeln!(out, "       {caveat}")?;
    }
    for evidence in &finding.evidence {
        writeln!(out, "       - {evidence}")?;
    }
    let (paths, left_out) = text::finding_path_lines(report, finding);
    for path in paths {
        writeln!(out, "       path: {path}")?;
    }
    if left_out > 0 {
        writeln!(out, "       … {left_out} more paths")?;
    }
    if !finding.next_step.is_empty() {
        writeln!(out, "       next step: {}", finding.next_step)?;
    }
    Ok(())
}

fn header(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let meta = &report.meta;
    writeln!(
        out,
        "memtrace: traced `{}` for {:.1} s; memory events sampled every {} on average",
        meta.command,
        meta.duration_ns as f64 / NS_PER_S,
        format_bytes(meta.sample_interval_bytes),
    )?;
    if let Some(line) = text::attach_line(meta) {
        writeln!(out, "memtrace: {line}")?;
    }
    match meta.command_status {
        Some(status) => writeln!(out, "memtrace: {}", text::command_ended(status)),
        None => Ok(()),
    }
}

/// The process table: one row per image, by RSS growth, then the legend of
/// the TGID column when a tgid was reused or an image exec'd.
fn processes(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "Processes (one row per image, by RSS growth; an image's numbers end when it exec'd or \
         began to exit)"
    )?;
    writeln!(
        out,
        "{:>9}  {:<6}  {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}  {:<10}  {:<16}  COMMAND",
        "TGID", "ROLE", "RSS START", "END", "PEAK", "GROWTH", "USS END", "COW", "PYTHON", "ENDED"
    )?;
    let (brief, shown): (Vec<&ProcessReport>, Vec<&ProcessReport>) =
        report.processes.iter().partition(|p| is_brief_helper(p));
    for p in shown {
        process_row(p, out)?;
    }
    if !brief.is_empty() {
        brief_helpers_row(&brief, out)?;
    }
    let reused = report.processes.iter().any(|p| p.instance > 1);
    let exec = report.processes.iter().any(|p| p.image > 0);
    if reused || exec {
        let mut legend = Vec::new();
        if reused {
            legend.push("N#2: the 2nd process the kernel gave tgid N in this trace");
        }
        if exec {
            legend.push("N.1: its image after an execve (N.0 before it)");
        }
        writeln!(out, "{:>9}  {}", "", legend.join("; "))?;
    }
    Ok(())
}

/// Whether `p` is a helper (a shell, a launch shim: never runs Python) that
/// a traced process started (a traced root is always shown), lived under
/// [`BRIEF_HELPER_NS`] and grew under [`BRIEF_HELPER_BYTES`]: such rows are
/// summed on one line (the JSON has each).
fn is_brief_helper(p: &ProcessReport) -> bool {
    p.kind == ProcessKind::Helper
        && !p.role.is_root()
        && p.traced_ns < BRIEF_HELPER_NS
        && p.rss
            .is_none_or(|rss| rss.peak_bytes.saturating_sub(rss.start_bytes) < BRIEF_HELPER_BYTES)
}

/// One line for the brief helpers: how many, their summed growth and the
/// largest one's.
fn brief_helpers_row(brief: &[&ProcessReport], out: &mut dyn Write) -> io::Result<()> {
    let growth = |p: &&ProcessReport| {
        p.rss
            .map_or(0, |rss| rss.growth_bytes.max(0).unsigned_abs())
    };
    writeln!(
        out,
        "{:>9}  {} that lived under {} (shells, launch shims; no Python): {} of RSS growth in \
         all, at most {} each; every one is in the JSON",
        "…",
        text::counted(brief.len() as u64, "helper", "helpers"),
        text::seconds(BRIEF_HELPER_NS),
        format_signed_bytes(brief.iter().map(growth).sum::<u64>() as i64),
        format_bytes(brief.iter().map(growth).max().unwrap_or(0)),
    )
}

/// `tgid` and the TGID column of image `id` (`tgid ?` when not traced).
fn process_ref(report: &Report, id: ProcessId) -> String {
    let column = report
        .process(id)
        .map_or_else(|| "?".to_owned(), text::process_column);
    format!("tgid {column}")
}

fn process_row(p: &ProcessReport, out: &mut dyn Write) -> io::Result<()> {
    let dash = || "-".to_owned();
    let (start, end, peak, growth) = p.rss.map_or_else(
        || (dash(), dash(), dash(), dash()),
        |rss| {
            (
                format_bytes(rss.start_bytes),
                format_bytes(rss.end_bytes),
                format_bytes(rss.peak_bytes),
                format_signed_bytes(rss.growth_bytes),
            )
        },
    );
    let uss = p
        .sharing
        .and_then(|s| s.end_uss())
        .map_or_else(dash, format_bytes);
    let cow = p
        .counters
        .map_or_else(dash, |c| format_bytes(c.cow_fault_bytes));
    writeln!(
        out,
        "{:>9}  {:<6}  {start:>10} {end:>10} {peak:>10} {growth:>11} {uss:>10} {cow:>10}  \
         {:<10}  {:<16}  {}",
        text::process_column(p),
        p.kind,
        text::python_text(p.python.as_ref(), false),
        text::ended_text(p),
        text::short_command(&p.cmdline, MAX_COMMAND_CHARS),
    )
}

fn totals(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let t = &report.totals;
    writeln!(out, "Total: {}", text::totals_line(report))?;
    if t.peak_total_pss_bytes > 0 {
        writeln!(
            out,
            "Proportional (PSS, shared pages counted once): {} at the end, highest sum {}",
            format_bytes(t.live_pss_end_bytes),
            format_bytes(t.peak_total_pss_bytes),
        )?;
    }
    writeln!(
        out,
        "Pages touched, counting re-touches (exact, gross): anonymous {}, file-backed {}; \
         copy-on-write copies of pages still shared {}",
        format_bytes(t.anon_growth_bytes),
        format_bytes(t.file_growth_bytes),
        format_bytes(t.cow_fault_bytes),
    )
}

/// What a path section says when no path has bytes of the weight.
fn no_paths(weight: Weight) -> String {
    format!("  none: no sampled path has bytes {}", weight.describe())
}

/// A blank line, `title`, then `entry` for each of `items` with its rank
/// (from 1). With no items, the `none` line, or nothing at all (not even the
/// title) when `none` is `None`.
fn ranked_section<T>(
    title: &str,
    items: &[T],
    none: Option<&str>,
    out: &mut dyn Write,
    mut entry: impl FnMut(usize, &T, &mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    if items.is_empty() && none.is_none() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "{title}")?;
    for (rank, item) in items.iter().enumerate() {
        entry(rank + 1, item, out)?;
    }
    match none {
        Some(none) if items.is_empty() => writeln!(out, "{none}"),
        _ => Ok(()),
    }
}

/// The header line of the path lists: the three measures, the share and
/// `last` (what the rest of the line names).
fn measures_header(last: &str) -> String {
    format!(
        "     {:>12}  {:>12}  {:>10}  {:>6}  {last}",
        "HELD AT PEAK", "HELD AT END", "GROWN", "SHARE"
    )
}

/// The three measures of a path and its `share`, under [`measures_header`].
fn measures(peak_held_bytes: u64, bytes: &SampledBytes, share: &str) -> String {
    format!(
        "{:>12}  {:>12}  {:>10}  {share:>6}",
        format_bytes(peak_held_bytes),
        format_bytes(bytes.held_now_bytes()),
        format_bytes(bytes.grown_bytes()),
    )
}

/// The merged paths, `top` of them; `compact`: their frames folded, and a
/// line saying how to see the rest.
fn growth_stacks(
    report: &Report,
    weight: Weight,
    top: usize,
    compact: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let paths = report.top_python_paths(weight, top);
    let all = text::all_weight_bytes(report, weight);
    let title = format!(
        "Top paths across processes (sampled, summed over processes; one per Python stack, \
         the native frames under it as its children; ranked by bytes {0}, share of all {0}; \
         ±PEAK: one standard error of HELD AT PEAK from sampling; innermost frame first)\n{1}",
        weight.describe(),
        measures_header(&format!("{:>10}  {:>7}  IN", "±PEAK", "SAMPLES"))
    );
    ranked_section(
        &title,
        &paths,
        Some(&no_paths(weight)),
        out,
        |rank, path, out| {
            let share = text::percent(path.weight_bytes(weight), all);
            python_path_entry(report, rank, path, weight, &share, compact, out)
        },
    )?;
    if compact && paths.len() == top && report.top_python_paths(weight, top + 1).len() > top {
        writeln!(
            out,
            "  … more paths, every frame, per process and copy-on-write: --verbose (or the \
             JSON, or memtrace report CAPTURE --format html)"
        )?;
    }
    Ok(())
}

/// One ranked Python path: its measures and `share`, the images it grew
/// in, its frames, then its native children with their share of it.
fn python_path_entry(
    report: &Report,
    rank: usize,
    path: &PythonPath<'_>,
    weight: Weight,
    share: &str,
    compact: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{rank:>3}. {}  {:>10}  {:>7}  {}: {}",
        measures(path.peak_held_bytes, &path.bytes, share),
        format!(
            "±{}",
            format_bytes(path.bytes.standard_error_bytes(path.peak_held_bytes))
        ),
        path.bytes.samples,
        text::counted(
            u64::try_from(path.processes.len()).unwrap_or(u64::MAX),
            "process",
            "processes"
        ),
        text::process_list(report, &path.processes, MAX_TGIDS_SHOWN),
    )?;
    if compact {
        compact_frame_lines(&path.frames, out)?;
    } else {
        frame_lines(&path.frames, out)?;
    }
    let natives = path.natives(report, weight);
    let total = path.weight_bytes(weight);
    let named: Vec<&(String, u64)> = natives.iter().filter(|(name, _)| name != "-").collect();
    let mut children: Vec<String> = named
        .iter()
        .take(MAX_NATIVES_SHOWN)
        .map(|(name, bytes)| format!("{name} {}", text::percent(*bytes, total)))
        .collect();
    if let Some(rest) = named
        .get(MAX_NATIVES_SHOWN..)
        .filter(|rest| !rest.is_empty())
    {
        let bytes = rest.iter().map(|(_, bytes)| bytes).sum();
        children.push(format!(
            "… {} more {}",
            rest.len(),
            text::percent(bytes, total)
        ));
    }
    if !children.is_empty() {
        writeln!(out, "        native: {}", children.join(", "))?;
    }
    Ok(())
}

fn growth_paths(
    report: &Report,
    weight: Weight,
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    let paths = report.top_paths(weight, top);
    let title = format!(
        "Top paths per process (sampled; ranked by bytes {0}, share of the process's {0}; \
         ±PEAK: one standard error of HELD AT PEAK from sampling; innermost frame first)\n{1}",
        weight.describe(),
        measures_header(&format!("{:>10}  {:>7}  PROCESS", "±PEAK", "SAMPLES"))
    );
    ranked_section(
        &title,
        &paths,
        Some(&no_paths(weight)),
        out,
        |rank, path, out| {
            let whole = report
                .paths
                .iter()
                .filter(|p| p.process == path.process)
                .fold(0, |sum: u64, p| sum.saturating_add(p.weight_bytes(weight)));
            let share = text::percent(path.weight_bytes(weight), whole);
            let line = format!(
                "{}  {:>10}  {:>7}",
                measures(path.peak_held_bytes, &path.bytes, &share),
                format!("±{}", format_bytes(path.peak_held_error_bytes)),
                path.bytes.samples
            );
            path_entry(report, rank, path, &line, out)
        },
    )
}

fn cow_paths(report: &Report, top: usize, out: &mut dyn Write) -> io::Result<()> {
    ranked_section(
        "Top copy-on-write paths (sampled pages shared with the parent, un-shared by a write; \
         share of the process's)",
        &report.top_cow_paths(top),
        None,
        out,
        |rank, path, out| {
            let line = format!(
                "{:>10}  {:>6}",
                format_bytes(path.bytes.cow_bytes),
                format!("{:.1}%", path.cow_share * 100.0)
            );
            path_entry(report, rank, path, &line, out)
        },
    )
}

/// One ranked path: its measures `line`, the process, then its frames.
fn path_entry(
    report: &Report,
    rank: usize,
    path: &PathReport,
    line: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    let command = report.process(path.process).map_or_else(
        || "?".to_owned(),
        |p| text::short_command(&p.cmdline, MAX_COMMAND_CHARS),
    );
    writeln!(
        out,
        "{rank:>3}. {line}  {}  {command}",
        process_ref(report, path.process),
    )?;
    frame_lines(report.frames(path.stack), out)
}

fn records(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let meta = &report.meta;
    writeln!(out)?;
    write!(
        out,
        "Records: {} read, {} dropped (ring buffer full), {} undecodable",
        meta.records, meta.dropped_records, meta.decode_errors,
    )?;
    if meta.held_map_peak_entries > 0 {
        write!(
            out,
            "; held-memory map peaked at {} ranges ({})",
            meta.held_map_peak_entries,
            format_bytes(meta.held_map_peak_bytes)
        )?;
    }
    writeln!(out)
}

/// The "Files written" section: one line per file, what it holds then
/// where, aligned, then the hint; nothing when no file was written.
fn files(written: &FilesWritten, out: &mut dyn Write) -> io::Result<()> {
    if written.files.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "Files written")?;
    let width = written.files.iter().map(|f| f.what.chars().count()).max();
    for file in &written.files {
        writeln!(
            out,
            "  {:<width$}  {}",
            format!("{}:", file.what),
            file.path.display(),
            width = width.unwrap_or(0) + 1
        )?;
    }
    match &written.hint {
        Some(hint) => writeln!(out, "  {hint}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
