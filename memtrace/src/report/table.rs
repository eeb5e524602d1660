//! Terminal renderer of the report step: the summary a user reads when
//! tracing stops. Processes by RSS growth, then the top growth paths and
//! copy-on-write paths with their frames, then data-quality lines, warnings
//! and where the files went.

use std::io::{self, Write};

use super::{format_bytes, format_signed_bytes, process_label, WrittenFiles};
use crate::aggregate::{Frame, PathReport, ProcessReport, PythonStatus, Report};

/// Most Python frames printed per path (innermost ones); the rest are counted.
const MAX_FRAMES_SHOWN: usize = 12;

/// Nanoseconds per second, for durations shown in seconds.
const NS_PER_S: f64 = 1e9;

/// Writes the terminal summary of `report` to `out`: a header line, the
/// process table (sorted by RSS growth), the run totals, the `top` growth
/// paths and the `top` copy-on-write paths (each with its frames, innermost
/// Python frame first and the native frame under them), the record counts,
/// the warnings and the paths of `written`.
///
/// # Errors
/// Any error of `out` (e.g. a closed pipe).
pub fn render(
    report: &Report,
    top: usize,
    written: &WrittenFiles,
    out: &mut dyn Write,
) -> io::Result<()> {
    header(report, out)?;
    processes(report, out)?;
    totals(report, out)?;
    growth_paths(report, top, out)?;
    cow_paths(report, top, out)?;
    records(report, out)?;
    for warning in &report.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    files(written, out)
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
    writeln!(out, "Processes (by RSS growth)")?;
    writeln!(
        out,
        "{:>7}  {:<6}  {:>10}   {:>10}  {:>10}  {:>11}  {:>10}  {:<11}  COMMAND",
        "TGID", "ROLE", "RSS START", "END", "PEAK", "GROWTH", "COW", "PYTHON"
    )?;
    for p in &report.processes {
        process_row(p, out)?;
    }
    Ok(())
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
    let cow = p
        .counters
        .map_or_else(dash, |c| format_bytes(c.cow_fault_bytes));
    let mut command = process_label(&p.cmdline);
    if let Some(exited_ns) = p.exited_ns {
        command.push_str(&format!(
            " (exited at {:.1} s)",
            exited_ns as f64 / NS_PER_S
        ));
    }
    writeln!(
        out,
        "{:>7}  {:<6}  {start:>10} → {end:>10}  {peak:>10}  {growth:>11}  {cow:>10}  {:<11}  {command}",
        p.tgid,
        p.role.to_string(),
        python_column(p.python.as_ref()),
    )
}

/// The PYTHON column: version, `not Python`, `unsupported` or `?`.
fn python_column(status: Option<&PythonStatus>) -> String {
    match status {
        Some(PythonStatus::Python { version }) => version.clone(),
        Some(PythonStatus::NotPython) => "not Python".to_owned(),
        Some(PythonStatus::Unsupported { .. }) => "unsupported".to_owned(),
        None => "?".to_owned(),
    }
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
    writeln!(
        out,
        "Exact counters: resident anonymous growth {}, copy-on-write {}",
        format_bytes(t.anon_growth_bytes),
        format_bytes(t.cow_fault_bytes),
    )
}

/// `count` with the singular or plural noun.
fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

fn growth_paths(report: &Report, top: usize, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "Top growth paths (sampled resident anonymous growth; innermost frame first)"
    )?;
    let mut any = false;
    for (rank, path) in report.top_growth_paths(top).enumerate() {
        any = true;
        let bytes = (path.bytes.growth_bytes, path.growth_share);
        path_entry(report, rank + 1, path, bytes, "growth", out)?;
    }
    if !any {
        writeln!(out, "  none: no growth was sampled with a stack")?;
    }
    Ok(())
}

fn cow_paths(report: &Report, top: usize, out: &mut dyn Write) -> io::Result<()> {
    let paths = report.top_cow_paths(top);
    if paths.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "Top copy-on-write paths (pages shared with the parent, un-shared by a write)"
    )?;
    for (rank, path) in paths.into_iter().enumerate() {
        let bytes = (path.bytes.cow_bytes, path.cow_share);
        path_entry(report, rank + 1, path, bytes, "copy-on-write", out)?;
    }
    Ok(())
}

/// One ranked path: `(bytes, share)` of the measure named `what`, then its
/// frames.
fn path_entry(
    report: &Report,
    rank: usize,
    path: &PathReport,
    (bytes, share): (u64, f64),
    what: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    let command = report
        .process(path.tgid)
        .map_or_else(|| "?".to_owned(), |p| process_label(&p.cmdline));
    writeln!(
        out,
        "{rank:>3}. {:>10}  {:>5.1}% of tgid {}'s sampled {what}  {command}",
        format_bytes(bytes),
        share * 100.0,
        path.tgid,
    )?;
    frame_lines(report.frames(path.stack), out)
}

/// Frames innermost first: the Python (and marker) frames, at most
/// [`MAX_FRAMES_SHOWN`], then the trailing native frames.
fn frame_lines(frames: &[Frame], out: &mut dyn Write) -> io::Result<()> {
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
        "Folded stacks: {}  (flame graph: inferno-flamegraph --countname bytes {} > memtrace.svg)",
        written.folded.display(),
        written.folded.display(),
    )?;
    writeln!(out, "JSON report:   {}", written.json.display())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::report::test_support::{self, native, py};

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
        let text = render_text(&test_support::report(), 10);
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

    #[test]
    fn growth_paths_show_share_and_frames_innermost_first_native_last() {
        let text = render_text(&test_support::report(), 10);
        let expected = "  1.   36.0 MiB   75.0% of tgid 101's sampled growth  python3 server.py\n\
                        \x20       append (app/cache.py:42)\n\
                        \x20       handle (app/views.py:10)\n\
                        \x20       <module> (server.py:1)\n\
                        \x20       native: PyList_Append\n\
                        \x20 2.   12.0 MiB   25.0% of tgid 101's sampled growth";
        assert!(text.contains(expected), "{text}");
    }

    #[test]
    fn top_limits_the_paths_shown() {
        let text = render_text(&test_support::report(), 1);
        assert!(text.contains("  1.   36.0 MiB"), "{text}");
        assert!(!text.contains("  2.   12.0 MiB"), "{text}");
    }

    #[test]
    fn cow_paths_records_warnings_and_files_are_listed() {
        let text = render_text(&test_support::report(), 10);
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
