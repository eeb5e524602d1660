//! Terminal renderer of the report step: the summary a user reads when
//! tracing stops. The diagnosis first (each finding with its evidence, code
//! paths and next step), then processes by RSS growth (each image of each
//! process, with how it ended), then the top paths merged across processes
//! (a leak a pre-fork service repeats in every worker ranks by its total)
//! with the bytes each held at the high-water mark, held at the end and
//! grew, a shorter per-process list, the copy-on-write paths, each with its
//! frames, then data-quality lines, warnings and where the files went.

use std::io::{self, Write};

use super::{text, RenderOptions, WrittenFiles};
use crate::aggregate::{
    Frame, PathReport, ProcessId, ProcessReport, Report, SampledBytes, StackGrowthReport, Weight,
};
use crate::diagnose::{Diagnosed, Finding};
use crate::units::{format_bytes, format_signed_bytes};

/// Most Python frames printed per path (innermost ones); the rest are counted.
const MAX_FRAMES_SHOWN: usize = 12;

/// Most (process, stack) paths in the per-process growth list; the merged
/// list above it is the one `top` sizes.
const MAX_PER_PROCESS_PATHS: usize = 5;

/// Most processes named per merged path; the rest are counted.
const MAX_TGIDS_SHOWN: usize = 8;

/// Nanoseconds per second, for durations shown in seconds.
const NS_PER_S: f64 = 1e9;

/// Writes the terminal summary of `report` to `out`: the diagnosis, a
/// header line, the process table (sorted by RSS growth), the run totals,
/// the `options.top` paths merged across processes, the `min(top, 5)`
/// largest (process, stack) paths (that many in total, not per process),
/// both ranked by `options.weight` and showing all three measures, and the
/// `top` copy-on-write paths (each with its frames, innermost Python frame
/// first and the native frame under them), the record counts, the warnings
/// and the paths of `written`.
///
/// # Errors
/// Any error of `out` (e.g. a closed pipe).
pub fn render(
    report: &Diagnosed,
    options: &RenderOptions,
    written: &WrittenFiles,
    out: &mut dyn Write,
) -> io::Result<()> {
    render_summary(report, options, out)?;
    files(written, out)
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
    let (top, weight) = (options.top, options.weight);
    diagnosis(report, out)?;
    header(report, out)?;
    processes(report, out)?;
    totals(report, out)?;
    growth_stacks(report, weight, top, out)?;
    growth_paths(report, weight, top.min(MAX_PER_PROCESS_PATHS), out)?;
    cow_paths(report, top, out)?;
    records(report, out)?;
    for warning in &report.warnings {
        writeln!(out, "warning: {warning}")?;
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
    )
}

fn processes(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "Processes (by RSS growth; an image ends when it exec'd or began to exit, before the \
         interpreter and the kernel gave its memory back)"
    )?;
    writeln!(
        out,
        "{:>9}  {:<6}  {:>10}   {:>10}  {:>10}  {:>11}  {:>10}  {:>10}  {:<11}  {:<14}  COMMAND",
        "TGID", "ROLE", "RSS START", "END", "PEAK", "GROWTH", "USS END", "COW", "PYTHON", "ENDED"
    )?;
    for p in &report.processes {
        process_row(p, out)?;
    }
    Ok(())
}

/// The TGID column: `4312`, `4312#2` for a reused tgid, `4312.1` for the
/// image after an execve.
fn process_column(p: &ProcessReport) -> String {
    let mut column = p.tgid.to_string();
    if p.instance > 1 {
        column.push_str(&format!("#{}", p.instance));
    }
    if p.image > 0 || p.next_image.is_some() {
        column.push_str(&format!(".{}", p.image));
    }
    column
}

/// How an image ended: `alive`, `exec'd`, `exit 0`, `SIGKILL`, or `exiting`
/// when its exit began but was not seen to finish.
fn ended_text(p: &ProcessReport) -> String {
    if p.exec_ns.is_some() {
        return "exec'd".to_owned();
    }
    match (p.exit_status, p.exit_began_ns, p.exited_ns) {
        (Some(status), _, _) => status.to_string(),
        (None, _, Some(_)) => "exited (?)".to_owned(),
        (None, Some(_), None) => "exiting".to_owned(),
        (None, None, None) => "alive".to_owned(),
    }
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
        .map_or_else(dash, |s| format_bytes(s.end_uss_bytes));
    let cow = p
        .counters
        .map_or_else(dash, |c| format_bytes(c.cow_fault_bytes));
    let mut command = p.label();
    if let Some(ended_ns) = p.ended_ns() {
        command.push_str(&format!(" (ended at {:.1} s)", ended_ns as f64 / NS_PER_S));
    }
    writeln!(
        out,
        "{:>9}  {:<6}  {start:>10} → {end:>10}  {peak:>10}  {growth:>11}  {uss:>10}  {cow:>10}  \
         {:<11}  {:<14}  {command}",
        process_column(p),
        p.role.to_string(),
        text::python_text(p.python.as_ref(), false),
        ended_text(p),
    )
}

fn totals(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let t = &report.totals;
    writeln!(
        out,
        "Total: {} ({}, {}; at most {} alive at once); \
         RSS of the live processes {} at the end, highest sum {}",
        counted(t.processes, "process", "processes"),
        counted(t.roots, "root", "roots"),
        counted(t.workers, "worker", "workers"),
        t.peak_live_processes,
        format_bytes(t.live_rss_end_bytes),
        format_bytes(t.peak_total_rss_bytes),
    )?;
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
        "Exact counters: resident anonymous growth {}, file-backed growth {}, copy-on-write {}",
        format_bytes(t.anon_growth_bytes),
        format_bytes(t.file_growth_bytes),
        format_bytes(t.cow_fault_bytes),
    )
}

/// `count` with the singular or plural noun.
fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// What a growth section says when nothing was sampled.
const NO_GROWTH: &str = "  none: no growth was sampled with a stack";

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

fn growth_stacks(
    report: &Report,
    weight: Weight,
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    ranked_section(
        &format!(
            "Top paths across processes (sampled, summed over processes, by bytes {}; \
             innermost frame first)",
            weight.describe()
        ),
        &report.top_stacks(weight, top),
        Some(NO_GROWTH),
        out,
        |rank, stack, out| stack_entry(report, rank, stack, out),
    )
}

/// The three measures of a path: `12.0 MiB held at peak, 11.0 MiB at end,
/// 40.0 MiB grown`.
fn measures(peak_held_bytes: u64, bytes: &SampledBytes) -> String {
    format!(
        "{:>10} held at peak {:>10} at end {:>10} grown",
        format_bytes(peak_held_bytes),
        format_bytes(bytes.held_now_bytes()),
        format_bytes(bytes.grown_bytes()),
    )
}

/// One ranked merged path: its measures, share of all bytes held at peak,
/// the processes it grew in, then its frames.
fn stack_entry(
    report: &Report,
    rank: usize,
    stack: &StackGrowthReport,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{rank:>3}. {}  {:>5.1}% of all held at peak  in {} ({})",
        measures(stack.peak_held_bytes, &stack.bytes),
        stack.peak_held_share * 100.0,
        counted(
            u64::try_from(stack.processes.len()).unwrap_or(u64::MAX),
            "process",
            "processes"
        ),
        process_list(report, &stack.processes),
    )?;
    frame_lines(report.frames(stack.stack), out)
}

/// `tgid 1, 2, 3`, at most [`MAX_TGIDS_SHOWN`] named, then `… N more`.
fn process_list(report: &Report, processes: &[ProcessId]) -> String {
    let shown: Vec<String> = processes
        .iter()
        .take(MAX_TGIDS_SHOWN)
        .map(|&id| report.process(id).map_or_else(|| "?".to_owned(), process_column))
        .collect();
    let mut list = format!("tgid {}", shown.join(", "));
    if processes.len() > MAX_TGIDS_SHOWN {
        list.push_str(&format!(", … {} more", processes.len() - MAX_TGIDS_SHOWN));
    }
    list
}

fn growth_paths(
    report: &Report,
    weight: Weight,
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    let paths = report.top_paths(weight, top);
    ranked_section(
        &format!(
            "Top paths per process (sampled, by bytes {}; innermost frame first)",
            weight.describe()
        ),
        &paths,
        Some(NO_GROWTH),
        out,
        |rank, path, out| {
            let line = format!(
                "{}  {:>5.1}% of its held at peak",
                measures(path.peak_held_bytes, &path.bytes),
                path.peak_held_share * 100.0
            );
            path_entry(report, rank, path, &line, out)
        },
    )
}

fn cow_paths(report: &Report, top: usize, out: &mut dyn Write) -> io::Result<()> {
    ranked_section(
        "Top copy-on-write paths (pages shared with the parent, un-shared by a write)",
        &report.top_cow_paths(top),
        None,
        out,
        |rank, path, out| {
            let line = format!(
                "{:>10}  {:>5.1}% of its sampled copy-on-write",
                format_bytes(path.bytes.cow_bytes),
                path.cow_share * 100.0
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
    let process = report
        .process(path.process)
        .map_or_else(|| "?".to_owned(), process_column);
    let command = report.label(path.process);
    writeln!(out, "{rank:>3}. {line}  tgid {process}  {command}")?;
    frame_lines(report.frames(path.stack), out)
}

/// Frames innermost first: the Python (and marker) frames, at most
/// [`MAX_FRAMES_SHOWN`], then the trailing native frames; each line indented
/// eight spaces (the layout `memtrace diff`'s table shares).
///
/// # Errors
/// Any error of `out`.
pub(crate) fn frame_lines(frames: &[Frame], out: &mut dyn Write) -> io::Result<()> {
    let native_start = frames
        .iter()
        .rposition(|f| !matches!(f, Frame::Native { .. }))
        .map_or(0, |last| last + 1);
    let (python, native) = frames.split_at(native_start);
    for frame in python.iter().rev().take(MAX_FRAMES_SHOWN) {
        writeln!(out, "        {frame}")?;
    }
    if python.len() > MAX_FRAMES_SHOWN {
        writeln!(
            out,
            "        … {} more outer frames",
            python.len() - MAX_FRAMES_SHOWN
        )?;
    }
    for frame in native.iter().rev() {
        writeln!(out, "        native: {frame}")?;
    }
    if frames.is_empty() {
        writeln!(out, "        (empty stack)")?;
    }
    Ok(())
}

fn records(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let meta = &report.meta;
    writeln!(out)?;
    writeln!(
        out,
        "Records: {} read, {} dropped (ring buffer full), {} undecodable",
        meta.records, meta.dropped_records, meta.decode_errors
    )
}

fn files(written: &WrittenFiles, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "Folded stacks (bytes held at peak): {}  \
         (flame graph: inferno-flamegraph --countname bytes {} > memtrace.svg)",
        written.folded.display(),
        written.folded.display(),
    )?;
    writeln!(out, "JSON report:   {}", written.json.display())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use memtrace_common::MemoryEvent;

    use super::*;
    use crate::aggregate::test_support::{native, prefork_report, py, sample, server_report, MIB};
    use crate::aggregate::{Aggregator, RunMeta};

    fn written() -> WrittenFiles {
        WrittenFiles {
            folded: PathBuf::from("/out/memtrace-1.folded"),
            json: PathBuf::from("/out/memtrace-1.json"),
        }
    }

    fn render_text(report: &Report, top: usize) -> String {
        let mut out = Vec::new();
        render(report, top, &written(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
    }

    #[test]
    fn process_table_is_sorted_by_growth() {
        let text = render_text(&server_report(), 10);
        let worker = line_with(&text, "    101  worker");
        let root = line_with(&text, "    100  root");
        assert!(text.find(worker) < text.find(root), "{text}");
        assert!(worker.contains("20.0 MiB →   68.0 MiB"), "{worker}");
        assert!(worker.contains("+48.0 MiB"), "{worker}");
        assert!(worker.contains("3.12.1"), "{worker}");
        assert!(worker.ends_with("python3 server.py"), "{worker}");
        assert!(root.contains("0 B"), "{root}");
        assert!(
            text.contains("Total: 2 processes (1 root, 1 worker; at most 2 alive at once)"),
            "{text}"
        );
    }

    /// The lines of the section whose title starts with `title`, up to the
    /// next blank line.
    fn section<'a>(text: &'a str, title: &str) -> &'a str {
        let start = text
            .find(&format!("\n{title}"))
            .unwrap_or_else(|| panic!("no section {title:?} in:\n{text}"))
            + 1;
        let rest = &text[start..];
        rest.find("\n\n").map_or(rest, |end| &rest[..=end])
    }

    const MERGED: &str = "Top growth paths across processes";
    const PER_PROCESS: &str = "Top growth paths per process";

    #[test]
    fn merged_paths_come_first_and_rank_a_leak_by_its_total_over_workers() {
        let text = render_text(&prefork_report(), 10);
        let expected = "Top growth paths across processes \
                        (sampled resident anonymous growth summed over processes; \
                        innermost frame first)\n\
                        \x20 1.   30.0 MiB   65.2% of all sampled growth  \
                        in 3 processes (tgid 101, 102, 103)\n\
                        \x20       append (app/cache.py:42)\n\
                        \x20       handle (app/views.py:10)\n\
                        \x20       <module> (server.py:1)\n\
                        \x20       native: PyList_Append\n\
                        \x20 2.   16.0 MiB   34.8% of all sampled growth  \
                        in 1 process (tgid 101)\n\
                        \x20       parse (app/io.py:7)\n\
                        \x20       <module> (server.py:1)\n\
                        \x20       native: malloc\n";
        assert_eq!(section(&text, MERGED), expected, "{text}");
        assert!(text.find(MERGED) < text.find(PER_PROCESS), "{text}");
        assert!(
            text.find("Total: 4 processes") < text.find(MERGED),
            "{text}"
        );
    }

    #[test]
    fn per_process_paths_follow_with_the_transient_path_first() {
        let text = render_text(&prefork_report(), 10);
        let per_process = section(&text, PER_PROCESS);
        let ranks: Vec<&str> = per_process
            .lines()
            .filter(|l| l.contains("% of tgid"))
            .collect();
        let expected = [
            "  1.   16.0 MiB   61.5% of tgid 101's sampled growth",
            "  2.   10.0 MiB   38.5% of tgid 101's sampled growth",
            "  3.   10.0 MiB  100.0% of tgid 102's sampled growth",
            "  4.   10.0 MiB  100.0% of tgid 103's sampled growth",
        ];
        assert_eq!(ranks.len(), expected.len(), "{per_process}");
        for (rank, want) in ranks.iter().zip(expected) {
            assert!(rank.starts_with(want), "{per_process}");
        }
    }

    #[test]
    fn growth_paths_show_share_and_frames_innermost_first_native_last() {
        let text = render_text(&server_report(), 10);
        let expected = "  1.   36.0 MiB   75.0% of tgid 101's sampled growth  python3 server.py\n\
                        \x20       append (app/cache.py:42)\n\
                        \x20       handle (app/views.py:10)\n\
                        \x20       <module> (server.py:1)\n\
                        \x20       native: PyList_Append\n\
                        \x20 2.   12.0 MiB   25.0% of tgid 101's sampled growth";
        assert!(section(&text, PER_PROCESS).contains(expected), "{text}");
        let merged = section(&text, MERGED);
        assert!(
            merged
                .contains("  1.   36.0 MiB   75.0% of all sampled growth  in 1 process (tgid 101)"),
            "{merged}"
        );
    }

    #[test]
    fn top_limits_the_merged_paths_and_caps_the_per_process_ones() {
        let text = render_text(&prefork_report(), 1);
        assert!(section(&text, MERGED).contains("  1.   30.0 MiB"), "{text}");
        assert!(!section(&text, MERGED).contains("  2. "), "{text}");
        assert!(
            section(&text, PER_PROCESS).contains("  1.   16.0 MiB"),
            "{text}"
        );
        assert!(!section(&text, PER_PROCESS).contains("  2. "), "{text}");

        let text = render_text(&many_paths_report(8), 7);
        let merged_ranks = section(&text, MERGED)
            .matches("% of all sampled growth")
            .count();
        let per_process_ranks = section(&text, PER_PROCESS).matches("% of tgid").count();
        assert_eq!(merged_ranks, 7, "{text}");
        assert_eq!(per_process_ranks, MAX_PER_PROCESS_PATHS, "{text}");
    }

    #[test]
    fn no_sampled_growth_says_so_in_both_sections() {
        let text = render_text(&many_paths_report(0), 10);
        let none = "  none: no growth was sampled with a stack";
        assert!(section(&text, MERGED).contains(none), "{text}");
        assert!(section(&text, PER_PROCESS).contains(none), "{text}");
    }

    #[test]
    fn long_tgid_lists_are_cut_and_counted() {
        assert_eq!(tgid_list(&[7]), "tgid 7");
        assert_eq!(tgid_list(&[1, 2, 3]), "tgid 1, 2, 3");
        let many: Vec<u32> = (1..=11).collect();
        assert_eq!(tgid_list(&many), "tgid 1, 2, 3, 4, 5, 6, 7, 8, … 3 more");
    }

    /// One process with `n` growth paths of distinct sizes.
    fn many_paths_report(n: u32) -> Report {
        let mut agg = Aggregator::new(0);
        for i in 0..n {
            let stack = [py(&format!("f{i}"), "m.py", i), native("malloc")];
            let weight_bytes = u64::from(i + 1) * MIB;
            agg.memory(sample(1, MemoryEvent::AnonGrowth, weight_bytes, &stack));
        }
        agg.finish(0, RunMeta::default())
    }

    #[test]
    fn cow_paths_records_warnings_and_files_are_listed() {
        let text = render_text(&server_report(), 10);
        assert!(text.contains("Top copy-on-write paths"), "{text}");
        assert!(
            text.contains("  1.    4.0 KiB  100.0% of tgid 101's sampled copy-on-write"),
            "{text}"
        );
        assert!(
            text.contains("Records: 3 read, 2 dropped (ring buffer full), 0 undecodable"),
            "{text}"
        );
        assert!(
            text.contains("warning: 2 records were dropped because the ring buffer was full"),
            "{text}"
        );
        assert!(
            text.contains("Folded stacks: /out/memtrace-1.folded"),
            "{text}"
        );
        assert!(
            text.contains("JSON report:   /out/memtrace-1.json"),
            "{text}"
        );
    }

    #[test]
    fn deep_stacks_are_cut_and_counted() {
        let mut frames: Vec<Frame> = (0..20).map(|i| py(&format!("f{i}"), "m.py", i)).collect();
        frames.push(native("malloc"));
        let mut out = Vec::new();
        frame_lines(&frames, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), MAX_FRAMES_SHOWN + 2, "{text}");
        assert_eq!(lines[0].trim(), "f19 (m.py:19)");
        assert_eq!(lines[MAX_FRAMES_SHOWN].trim(), "… 8 more outer frames");
        assert_eq!(lines[MAX_FRAMES_SHOWN + 1].trim(), "native: malloc");
    }
}
