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
//! and where the files went.

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

/// Most characters of the COMMAND column (a [`text::short_command`]): a row
/// of the process table then fits in 160 columns.
const MAX_COMMAND_CHARS: usize = 40;

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
    for p in &report.processes {
        process_row(p, out)?;
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

/// The TGID column: `4312`, `4312#2` for a reused tgid, `4312.0` and
/// `4312.1` for the images before and after an execve.
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

/// `tgid` and the TGID column of image `id` (`tgid ?` when not traced).
fn process_ref(report: &Report, id: ProcessId) -> String {
    let column = report
        .process(id)
        .map_or_else(|| "?".to_owned(), process_column);
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
        .map_or_else(dash, |s| format_bytes(s.end_uss_bytes));
    let cow = p
        .counters
        .map_or_else(dash, |c| format_bytes(c.cow_fault_bytes));
    writeln!(
        out,
        "{:>9}  {:<6}  {start:>10} {end:>10} {peak:>10} {growth:>11} {uss:>10} {cow:>10}  \
         {:<10}  {:<16}  {}",
        process_column(p),
        p.role.to_string(),
        text::python_text(p.python.as_ref(), false),
        text::ended_text(p),
        text::short_command(&p.cmdline, MAX_COMMAND_CHARS),
    )
}

fn totals(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let t = &report.totals;
    writeln!(
        out,
        "Total: {} ({}, {}; at most {} alive at once); \
         RSS of the live processes {} at the end, highest sum {}",
        text::counted(t.processes, "process image", "process images"),
        text::counted(t.roots, "root", "roots"),
        text::counted(t.workers, "worker", "workers"),
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

fn growth_stacks(
    report: &Report,
    weight: Weight,
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    let stacks = report.top_stacks(weight, top);
    let all = text::all_weight_bytes(report, weight);
    let title = format!(
        "Top paths across processes (sampled, summed over processes; ranked by bytes {0}, \
         share of all {0}; innermost frame first)\n{1}",
        weight.describe(),
        measures_header("IN")
    );
    ranked_section(
        &title,
        &stacks,
        Some(&no_paths(weight)),
        out,
        |rank, stack, out| {
            let share = text::percent(stack.weight_bytes(weight), all);
            stack_entry(report, rank, stack, &share, out)
        },
    )
}

/// One ranked merged path: its measures and `share`, the images it grew
/// in, then its frames.
fn stack_entry(
    report: &Report,
    rank: usize,
    stack: &StackGrowthReport,
    share: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{rank:>3}. {}  {}: {}",
        measures(stack.peak_held_bytes, &stack.bytes, share),
        text::counted(
            u64::try_from(stack.processes.len()).unwrap_or(u64::MAX),
            "process",
            "processes"
        ),
        process_list(report, &stack.processes),
    )?;
    frame_lines(report.frames(stack.stack), out)
}

/// `tgid 1, 2#2, 3.1`, at most [`MAX_TGIDS_SHOWN`] named, then `… N more`.
fn process_list(report: &Report, processes: &[ProcessId]) -> String {
    let shown: Vec<String> = processes
        .iter()
        .take(MAX_TGIDS_SHOWN)
        .map(|&id| {
            report
                .process(id)
                .map_or_else(|| "?".to_owned(), process_column)
        })
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
    let title = format!(
        "Top paths per process (sampled; ranked by bytes {0}, share of the process's {0}; \
         innermost frame first)\n{1}",
        weight.describe(),
        measures_header("PROCESS")
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
            let line = measures(path.peak_held_bytes, &path.bytes, &share);
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

/// Frames innermost first: the Python (and marker) frames, at most
/// [`MAX_FRAMES_SHOWN`], then the trailing native frames, every native frame
/// `native: `-prefixed ([`text::frame_text`]); each line indented eight
/// spaces (the layout `memtrace diff`'s table shares).
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
        writeln!(out, "        {}", text::frame_text(frame))?;
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

fn files(written: &WrittenFiles, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "Folded stacks (bytes {}): {}  \
         (flame graph: inferno-flamegraph --countname bytes {} > memtrace.svg)",
        written.weight.describe(),
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
    use crate::aggregate::test_support::{native, py, sample, start, MIB};
    use crate::aggregate::{Aggregator, ProcessStart, Role, RunMeta};
    use crate::diagnose::diagnose;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

    fn written(weight: Weight) -> WrittenFiles {
        WrittenFiles {
            folded: PathBuf::from("/out/memtrace-1.folded"),
            weight,
            json: PathBuf::from("/out/memtrace-1.json"),
        }
    }

    fn render_with(report: &Diagnosed, top: usize, weight: Weight) -> String {
        let options = RenderOptions {
            top,
            weight,
            ..RenderOptions::default()
        };
        let mut out = Vec::new();
        render(report, &options, &written(Weight::Peak), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn render_text(report: &Diagnosed, top: usize) -> String {
        render_with(report, top, Weight::Peak)
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

    /// The row of the process table whose TGID column is `column`.
    fn row<'a>(text: &'a str, column: &str) -> &'a str {
        section(text, PROCESSES)
            .lines()
            .find(|l| l.get(..9).is_some_and(|c| c.trim() == column))
            .unwrap_or_else(|| panic!("no row {column:?} in:\n{text}"))
    }

    const PROCESSES: &str = "Processes (one row per image";
    const MERGED: &str = "Top paths across processes";
    const PER_PROCESS: &str = "Top paths per process";

    #[test]
    fn process_rows_give_every_measure_and_how_each_image_ended() {
        let text = render_text(&lifecycle_diagnosed(), 10);
        let table = section(&text, PROCESSES);
        let header = table.lines().nth(1).unwrap();
        assert_eq!(
            header,
            "     TGID  ROLE     RSS START        END       PEAK      GROWTH    USS END        COW  \
             PYTHON      ENDED             COMMAND"
        );
        assert_eq!(
            row(&text, "201"),
            "      201  worker    30.0 MiB   70.0 MiB   80.0 MiB   +40.0 MiB   50.0 MiB    8.0 MiB  \
             3.12.1      exit 0 at 4.0 s   python3 -m app"
        );
        assert_eq!(
            row(&text, "201#2"),
            "    201#2  worker    30.0 MiB   60.0 MiB   60.0 MiB   +30.0 MiB   40.0 MiB    4.0 MiB  \
             3.12.1      SIGKILL at 7.0 s  python3 -m app"
        );
        assert_eq!(
            row(&text, "202.0"),
            "    202.0  worker    30.0 MiB   90.0 MiB   90.0 MiB   +60.0 MiB   60.0 MiB        0 B  \
             3.12.1      exec'd at 6.0 s   python3 etl.py"
        );
        assert_eq!(
            row(&text, "202.1"),
            "    202.1  worker         0 B    1.0 MiB    1.0 MiB    +1.0 MiB          -        0 B  \
             not Python  alive             sleep 60"
        );
        assert_eq!(
            row(&text, "200"),
            "      200  root      30.0 MiB   30.0 MiB   30.0 MiB         0 B   10.0 MiB        0 B  \
             3.12.1      alive             python3 -m app"
        );
        let order: Vec<&str> = table
            .lines()
            .skip(2)
            .map(|l| l[..9].trim())
            .take(5)
            .collect();
        assert_eq!(order, ["202.0", "201", "201#2", "202.1", "200"], "{table}");
        assert!(
            table.lines().nth(7).unwrap().contains(
                "N#2: the 2nd process the kernel gave tgid N in this trace; \
                 N.1: its image after an execve (N.0 before it)"
            ),
            "{table}"
        );
        assert!(
            text.contains(
                "Total: 5 process images (1 root, 4 workers; at most 3 alive at once); \
                 RSS of the live processes 31.0 MiB at the end"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_reused_tgid_is_two_rows_each_with_its_own_numbers() {
        let text = render_text(&lifecycle_diagnosed(), 10);
        let first = row(&text, "201");
        let second = row(&text, "201#2");
        assert!(
            first.contains("+40.0 MiB") && first.contains("exit 0"),
            "{first}"
        );
        assert!(
            second.contains("+30.0 MiB") && second.contains("SIGKILL"),
            "{second}"
        );
    }

    #[test]
    fn an_execd_image_is_its_own_row() {
        let text = render_text(&lifecycle_diagnosed(), 10);
        let before = row(&text, "202.0");
        let after = row(&text, "202.1");
        assert!(before.contains("exec'd at 6.0 s"), "{before}");
        assert!(before.ends_with("python3 etl.py"), "{before}");
        assert!(after.contains("not Python"), "{after}");
        assert!(after.ends_with("sleep 60"), "{after}");
    }

    #[test]
    fn no_legend_without_reused_tgids_or_execs() {
        let text = render_text(&server_diagnosed(), 10);
        let table = section(&text, PROCESSES);
        // Title, header, two rows, then the totals.
        assert!(
            table.lines().nth(4).unwrap().starts_with("Total: "),
            "{table}"
        );
        assert!(!text.contains("N#2"), "{text}");
    }

    #[test]
    fn merged_paths_show_all_three_measures_ranked_by_held_at_peak() {
        let text = render_text(&lifecycle_diagnosed(), 10);
        let expected = "Top paths across processes (sampled, summed over processes; \
                        ranked by bytes held at peak, share of all held at peak; \
                        innermost frame first)\n\
                        \x20    HELD AT PEAK   HELD AT END       GROWN   SHARE  IN\n\
                        \x20 1.     60.0 MiB      60.0 MiB    60.0 MiB   40.0%  \
                        1 process: tgid 202.0\n\
                        \x20       load (etl.py:12)\n\
                        \x20       <module> (etl.py:1)\n\
                        \x20       native: malloc\n\
                        \x20 2.     50.0 MiB      40.0 MiB   120.0 MiB   33.3%  \
                        1 process: tgid 201\n\
                        \x20       handle_job (app/jobs.py:20)\n\
                        \x20       <module> (app/worker.py:1)\n\
                        \x20       native: malloc\n\
                        \x20 3.     40.0 MiB      30.0 MiB    40.0 MiB   26.7%  \
                        2 processes: tgid 201, 201#2\n\
                        \x20       append (app/cache.py:42)\n\
                        \x20       <module> (app/worker.py:1)\n\
                        \x20       native: PyList_Append\n";
        assert_eq!(section(&text, MERGED), expected, "{text}");
        assert!(text.find(MERGED) < text.find(PER_PROCESS), "{text}");
        assert!(text.find("Total: 5") < text.find(MERGED), "{text}");
    }

    #[test]
    fn the_weight_reranks_the_paths_and_their_shares() {
        let report = lifecycle_diagnosed();
        let grown = render_with(&report, 10, Weight::Grown);
        let merged = section(&grown, MERGED);
        assert!(
            merged.starts_with(
                "Top paths across processes (sampled, summed over processes; \
                 ranked by bytes grown, share of all grown;"
            ),
            "{merged}"
        );
        // handle_job: 120 of 220 MiB grown.
        assert!(
            merged.contains(
                "  1.     50.0 MiB      40.0 MiB   120.0 MiB   54.5%  1 process: tgid 201\n\
                 \x20       handle_job"
            ),
            "{merged}"
        );
        let end = render_with(&report, 10, Weight::End);
        let per_process = section(&end, PER_PROCESS);
        let ranks: Vec<&str> = per_process
            .lines()
            .filter(|l| l.starts_with("  ") && l.contains(". ") && l.contains("tgid"))
            .collect();
        // append in 201 holds nothing at the end: left out.
        assert_eq!(
            ranks,
            [
                "  1.     60.0 MiB      60.0 MiB    60.0 MiB  100.0%  tgid 202.0  python3 etl.py",
                "  2.     50.0 MiB      40.0 MiB   120.0 MiB  100.0%  tgid 201  python3 -m app",
                "  3.     30.0 MiB      30.0 MiB    30.0 MiB  100.0%  tgid 201#2  python3 -m app",
            ],
            "{per_process}"
        );
    }

    #[test]
    fn per_process_paths_rank_each_image_apart() {
        let text = render_text(&lifecycle_diagnosed(), 10);
        let per_process = section(&text, PER_PROCESS);
        let ranks: Vec<&str> = per_process
            .lines()
            .filter(|l| l.starts_with("  ") && l.contains(". ") && l.contains("tgid"))
            .collect();
        assert_eq!(
            ranks,
            [
                "  1.     60.0 MiB      60.0 MiB    60.0 MiB  100.0%  tgid 202.0  python3 etl.py",
                "  2.     50.0 MiB      40.0 MiB   120.0 MiB   83.3%  tgid 201  python3 -m app",
                "  3.     30.0 MiB      30.0 MiB    30.0 MiB  100.0%  tgid 201#2  python3 -m app",
                "  4.     10.0 MiB           0 B    10.0 MiB   16.7%  tgid 201  python3 -m app",
            ],
            "{per_process}"
        );
        assert!(
            per_process.starts_with(
                "Top paths per process (sampled; ranked by bytes held at peak, share of the \
                 process's held at peak; innermost frame first)\n\
                 \x20    HELD AT PEAK   HELD AT END       GROWN   SHARE  PROCESS\n"
            ),
            "{per_process}"
        );
    }

    #[test]
    fn the_prefork_leak_ranks_by_its_total_over_workers() {
        let text = render_text(&prefork_diagnosed(), 10);
        let merged = section(&text, MERGED);
        assert!(
            merged.contains(
                "  1.     30.0 MiB      30.0 MiB    30.0 MiB   65.2%  \
                 3 processes: tgid 101, 102, 103\n\
                 \x20       append (app/cache.py:42)"
            ),
            "{merged}"
        );
        let per_process = section(&text, PER_PROCESS);
        assert!(
            per_process.contains("  1.     16.0 MiB      16.0 MiB    16.0 MiB   61.5%  tgid 101"),
            "{per_process}"
        );
    }

    #[test]
    fn top_limits_the_merged_paths_and_caps_the_per_process_ones() {
        let text = render_text(&prefork_diagnosed(), 1);
        assert!(
            section(&text, MERGED).contains("  1.     30.0 MiB"),
            "{text}"
        );
        assert!(!section(&text, MERGED).contains("  2. "), "{text}");
        assert!(
            section(&text, PER_PROCESS).contains("  1.     16.0 MiB"),
            "{text}"
        );
        assert!(!section(&text, PER_PROCESS).contains("  2. "), "{text}");

        let text = render_text(&many_paths_report(8), 7);
        let ranks = |title| {
            section(&text, title)
                .lines()
                .filter(|l| l.contains("MiB") && l.contains("%"))
                .count()
        };
        assert_eq!(ranks(MERGED), 7, "{text}");
        assert_eq!(ranks(PER_PROCESS), MAX_PER_PROCESS_PATHS, "{text}");
    }

    #[test]
    fn no_path_of_the_weight_says_so_in_both_sections() {
        let text = render_text(&many_paths_report(0), 10);
        let none = "  none: no sampled path has bytes held at peak";
        assert!(section(&text, MERGED).contains(none), "{text}");
        assert!(section(&text, PER_PROCESS).contains(none), "{text}");
    }

    #[test]
    fn long_process_lists_are_cut_and_counted() {
        let report = many_processes_report(11);
        let ids: Vec<ProcessId> = (0..11).map(ProcessId).collect();
        assert_eq!(process_list(&report, &ids[..1]), "tgid 1");
        assert_eq!(process_list(&report, &ids[..3]), "tgid 1, 2, 3");
        assert_eq!(
            process_list(&report, &ids),
            "tgid 1, 2, 3, 4, 5, 6, 7, 8, … 3 more"
        );
        assert_eq!(process_list(&report, &[ProcessId(99)]), "tgid ?");
    }

    /// One process with `n` growth paths of distinct sizes.
    fn many_paths_report(n: u32) -> Diagnosed {
        let mut agg = Aggregator::new(0);
        let id = agg.process_started(start(1, None, Role::Root, 0));
        for i in 0..n {
            let stack = [py(&format!("f{i}"), "m.py", i), native("malloc")];
            let weight_bytes = u64::from(i + 1) * MIB;
            let stack_id = sample(&mut agg, id, MemoryEvent::AnonGrowth, weight_bytes, &stack);
            agg.peak_held(id, stack_id, weight_bytes);
        }
        diagnose(agg.finish(0, RunMeta::default()))
    }

    /// `n` processes with tgids 1..=n.
    fn many_processes_report(n: u32) -> Report {
        let mut agg = Aggregator::new(0);
        for tgid in 1..=n {
            agg.process_started(ProcessStart {
                ..start(tgid, None, Role::Root, 0)
            });
        }
        agg.finish(0, RunMeta::default())
    }

    #[test]
    fn cow_paths_records_warnings_and_files_are_listed() {
        let text = render_text(&server_diagnosed(), 10);
        assert_eq!(
            section(&text, "Top copy-on-write paths"),
            "Top copy-on-write paths (sampled pages shared with the parent, un-shared by a \
             write; share of the process's)\n\
             \x20 1.    4.0 KiB  100.0%  tgid 101  python3 server.py\n\
             \x20       append (app/cache.py:42)\n\
             \x20       handle (app/views.py:10)\n\
             \x20       <module> (server.py:1)\n\
             \x20       native: PyList_Append\n",
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
            text.contains(
                "Folded stacks (bytes held at peak): /out/memtrace-1.folded  (flame graph: \
                 inferno-flamegraph --countname bytes /out/memtrace-1.folded > memtrace.svg)"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("JSON report:   /out/memtrace-1.json\n"),
            "{text}"
        );
    }

    #[test]
    fn the_folded_line_names_the_files_weight() {
        let mut out = Vec::new();
        files(&written(Weight::Grown), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("Folded stacks (bytes grown): /out/memtrace-1.folded"),
            "{text}"
        );
    }

    #[test]
    fn the_diagnosis_comes_first_with_names() {
        let report = lifecycle_diagnosed();
        let text = render_text(&report, 10);
        assert!(text.starts_with("Diagnosis\n  1. "), "{text}");
        let first = &report.diagnosis[0];
        let line = text.lines().nth(1).unwrap();
        assert!(
            line.contains(&text::scope_text(&report, first.scope)),
            "{line}"
        );
        assert!(line.ends_with(&first.summary), "{line}");
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
