//! The terminal table of `memtrace diff`: both sides named, the processes
//! with their RSS at the end, then the growth paths with the bytes they held
//! at the end and grew, before, after and the change.

use std::io::{self, Write};

use super::matching::{signed_delta, Diff, PathBytes, ProcessSide};
use super::Sides;
use crate::report::table::frame_lines;
use crate::units::{format_bytes, format_signed_bytes};

/// Most growth paths the table lists; the rest are counted.
const MAX_PATHS_SHOWN: usize = 20;

/// Width of the process name columns (`tgid 4312#2, image 1` fits).
const NAME_WIDTH: usize = 20;

/// Writes `diff` as a terminal table: a header naming both sides, the
/// processes (name and RSS at the end of each side, and the delta; matched
/// pairs first), the live RSS totals, then at most 20 growth paths by the
/// change of what they held at the end, each with its held and grown bytes
/// before, after and the change, and its frames innermost first (Python
/// frames, then the native frames under them).
///
/// # Errors
/// Any error of `out`.
pub fn render_table(diff: &Diff, sides: &Sides, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "memtrace diff")?;
    writeln!(out, "  before: {}", sides.before)?;
    writeln!(out, "  after:  {}", sides.after)?;
    process_table(diff, out)?;
    path_table(diff, out)
}

fn process_table(diff: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "Processes (RSS at the end)")?;
    writeln!(
        out,
        "{:<NAME_WIDTH$} {:>10}  {:<NAME_WIDTH$} {:>10}  {:>11}  COMMAND",
        "BEFORE", "RSS", "AFTER", "RSS", "DELTA"
    )?;
    for p in &diff.processes {
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

fn path_table(diff: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "Paths by change of memory held at the end (sampled, summed over processes; grown: \
         every first touch; innermost frame first)"
    )?;
    if diff.paths.is_empty() {
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
    for (rank, path) in diff.paths.iter().take(MAX_PATHS_SHOWN).enumerate() {
        let bytes = |b: PathBytes| (format_bytes(b.held_bytes), format_bytes(b.grown_bytes));
        let ((held_before, grown_before), (held_after, grown_after)) =
            (bytes(path.before), bytes(path.after));
        writeln!(
            out,
            "{:>3}. {held_before:>12} {held_after:>12} {:>12}  {grown_before:>12} \
             {grown_after:>12} {:>12}",
            rank + 1,
            format_signed_bytes(path.held_delta_bytes()),
            format_signed_bytes(path.grown_delta_bytes()),
        )?;
        frame_lines(&path.frames, out)?;
    }
    if diff.paths.len() > MAX_PATHS_SHOWN {
        writeln!(
            out,
            "  … {} more paths with a smaller change",
            diff.paths.len() - MAX_PATHS_SHOWN
        )?;
    }
    Ok(())
}
