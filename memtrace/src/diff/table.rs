//! The terminal table of `memtrace diff`: both sides named, the processes
//! with their RSS at the end, then the growth paths with the bytes they held
//! at the end and grew, before, after and the change.

use std::io::{self, Write};

use super::matching::{signed_delta, Diff, ProcessSide};
use super::Sides;
use crate::report::table::frame_lines;
use crate::units::{format_bytes, format_signed_bytes};

/// Width of the process name columns (`tgid 4312#2, image 1` fits).
const NAME_WIDTH: usize = 20;

/// Writes `diff` as a terminal table: a header naming both sides, a
/// summary line (and, for sides of unequal length, that growth is compared
/// per second), the processes (name and RSS at the end of each side, and
/// the delta; matched pairs first), the live RSS totals, then at most `top`
/// growth paths (one per Python line) by the change of what they held at
/// the end, each with its held and grown bytes before, after and the
/// change, and its frames innermost first.
///
/// # Errors
/// Any error of `out`.
pub fn render_table(diff: &Diff, sides: &Sides, top: usize, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "memtrace diff")?;
    writeln!(out, "  before: {}", sides.before)?;
    writeln!(out, "  after:  {}", sides.after)?;
    for warning in &sides.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    writeln!(out, "{}", summary_line(diff))?;
    if diff.grown_per_second() {
        writeln!(
            out,
            "  the sides differ in length ({:.1} s before, {:.1} s after): GROWN is compared \
             in bytes per second; HELD (a level) as it is",
            diff.before_duration_ns as f64 / 1e9,
            diff.after_duration_ns as f64 / 1e9
        )?;
    }
    process_table(diff, out)?;
    path_table(diff, top, out)
}

/// `summary: 3 paths hold more, 1 less; held at the end 10.0 MiB → 52.0
/// MiB (+42.0 MiB); grown 60.0 MiB → 95.0 MiB (+35.0 MiB)` (grown per
/// second when the sides differ in length).
pub(super) fn summary_line(diff: &Diff) -> String {
    let s = diff.summary();
    let grown = |bytes: u64, duration_ns: u64| diff.grown_compared(bytes, duration_ns);
    let (grown_before, grown_after) = (
        grown(s.before.grown_bytes, diff.before_duration_ns),
        grown(s.after.grown_bytes, diff.after_duration_ns),
    );
    let unit = if diff.grown_per_second() { "/s" } else { "" };
    format!(
        "summary: {} paths hold more, {} less; held at the end {} → {} ({}); grown {}{unit} → \
         {}{unit} ({}{unit})",
        s.paths_holding_more,
        s.paths_holding_less,
        format_bytes(s.before.held_bytes),
        format_bytes(s.after.held_bytes),
        format_signed_bytes(signed_delta(s.before.held_bytes, s.after.held_bytes)),
        format_bytes(grown_before),
        format_bytes(grown_after),
        format_signed_bytes(signed_delta(grown_before, grown_after)),
    )
}

fn process_table(diff: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "Processes (RSS at the end)")?;
    writeln!(
        out,
        "{:<NAME_WIDTH$} {:>10}  {:<NAME_WIDTH$} {:>10}  {:>11}  COMMAND",
        "BEFORE", "RSS", "AFTER", "RSS", "DELTA"
    )?;
    // A row with no RSS on either side says nothing.
    let (shown, empty): (Vec<_>, Vec<_>) = diff.processes.iter().partition(|p| {
        [&p.before, &p.after]
            .iter()
            .any(|side| side.as_ref().and_then(|s| s.rss_end_bytes).unwrap_or(0) > 0)
    });
    for p in shown {
        let (before_name, before_rss) = side_columns(p.before.as_ref());
        let (after_name, after_rss) = side_columns(p.after.as_ref());
        let delta = p
            .rss_delta_bytes()
            .map_or_else(|| "-".to_owned(), format_signed_bytes);
        writeln!(
            out,
            "{before_name:<NAME_WIDTH$} {before_rss:>10}  {after_name:<NAME_WIDTH$} \
             {after_rss:>10}  {delta:>11}  {}",
            p.label
        )?;
    }
    if !empty.is_empty() {
        writeln!(
            out,
            "  … {} image{} with no RSS read on either side left out",
            empty.len(),
            if empty.len() == 1 { "" } else { "s" }
        )?;
    }
    let (before_live, after_live) = (
        diff.live_rss_end_before_bytes,
        diff.live_rss_end_after_bytes,
    );
    if before_live == 0 && after_live == 0 {
        return writeln!(
            out,
            "No traced process was alive at the end of either side (RSS above is each image's \
             last reading before it ended)"
        );
    }
    writeln!(
        out,
        "Total RSS of the live processes at the end: {} → {} ({})",
        format_bytes(diff.live_rss_end_before_bytes),
        format_bytes(diff.live_rss_end_after_bytes),
        format_signed_bytes(signed_delta(
            diff.live_rss_end_before_bytes,
            diff.live_rss_end_after_bytes
        )),
    )
}

/// The name and RSS columns of one side, `-` where absent.
fn side_columns(side: Option<&ProcessSide>) -> (String, String) {
    let dash = || "-".to_owned();
    side.map_or_else(
        || (dash(), dash()),
        |s| {
            (
                s.name.clone(),
                s.rss_end_bytes.map_or_else(dash, format_bytes),
            )
        },
    )
}

fn path_table(diff: &Diff, top: usize, out: &mut dyn Write) -> io::Result<()> {
    // A row of zeros on both sides (growth per second rounded to 0 B) says
    // nothing.
    let compared = |bytes: super::PathBytes, duration_ns| {
        bytes.held_bytes + diff.grown_compared(bytes.grown_bytes, duration_ns)
    };
    let paths: Vec<_> = diff
        .python_lines()
        .into_iter()
        .filter(|p| {
            compared(p.before, diff.before_duration_ns) + compared(p.after, diff.after_duration_ns)
                > 0
        })
        .collect();
    writeln!(out)?;
    writeln!(
        out,
        "Paths by change of memory held at the end (sampled, summed over processes, one per \
         Python line; grown: every first touch{}; innermost frame first)",
        if diff.grown_per_second() {
            ", per second"
        } else {
            ""
        }
    )?;
    if paths.is_empty() {
        return writeln!(
            out,
            "  none: no memory was held or grown with a stack on either side"
        );
    }
    writeln!(
        out,
        "{:>4} {:>12} {:>12} {:>12}  {:>12} {:>12} {:>12}",
        "", "HELD BEFORE", "HELD AFTER", "HELD DELTA", "GROWN BEFORE", "GROWN AFTER", "GROWN DELTA"
    )?;
    for (rank, path) in paths.iter().take(top).enumerate() {
        let grown_before = diff.grown_compared(path.before.grown_bytes, diff.before_duration_ns);
        let grown_after = diff.grown_compared(path.after.grown_bytes, diff.after_duration_ns);
        writeln!(
            out,
            "{:>3}. {:>12} {:>12} {:>12}  {:>12} {:>12} {:>12}",
            rank + 1,
            format_bytes(path.before.held_bytes),
            format_bytes(path.after.held_bytes),
            format_signed_bytes(path.held_delta_bytes()),
            format_bytes(grown_before),
            format_bytes(grown_after),
            format_signed_bytes(signed_delta(grown_before, grown_after)),
        )?;
        frame_lines(&path.frames, out)?;
    }
    if paths.len() > top {
        writeln!(
            out,
            "  … {} more paths with a smaller change (--top N shows more)",
            paths.len() - top
        )?;
    }
    Ok(())
}
