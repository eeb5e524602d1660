//! The frames of a listed path in the terminal report (and `memtrace
//! diff`'s table): innermost first, in full ([`frame_lines`]) or folded for
//! the compact report ([`compact_frame_lines`]: runs of library frames on
//! one line, a few lines in all).

use std::io::{self, Write};

use crate::aggregate::Frame;
use crate::report::text;

/// Most Python frames printed per path (innermost ones); the rest are counted.
pub(super) const MAX_FRAMES_SHOWN: usize = 12;

/// Most lines of Python frames per path in the compact report.
const MAX_COMPACT_FRAME_LINES: usize = 6;

/// Most file names a folded run of library frames lists.
const MAX_FOLDED_FILES: usize = 3;

/// Frames innermost first: the Python (and marker) frames, at most
/// [`MAX_FRAMES_SHOWN`], then the trailing native frames, every native frame
/// `native: `-prefixed ([`text::frame_text`]); each line indented eight
/// spaces (the layout `memtrace diff`'s table shares).
///
/// # Errors
/// Any error of `out`.
pub(crate) fn frame_lines(frames: &[Frame], out: &mut dyn Write) -> io::Result<()> {
    let (python, native) = split_native(frames);
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

/// [`frame_lines`] for the compact report: the innermost frame, then each
/// run of two or more library frames (standard library, installed
/// packages, frozen import machinery: not [`Frame::is_user_code`]) folded
/// into one line naming their files, at most [`MAX_COMPACT_FRAME_LINES`]
/// lines of Python frames; the native frames follow as in [`frame_lines`].
///
/// # Errors
/// Any error of `out`.
pub(super) fn compact_frame_lines(frames: &[Frame], out: &mut dyn Write) -> io::Result<()> {
    let (python, native) = split_native(frames);
    let innermost_first: Vec<&Frame> = python.iter().rev().collect();
    let lines = folded_lines(&innermost_first);
    for line in lines.iter().take(MAX_COMPACT_FRAME_LINES) {
        writeln!(out, "        {line}")?;
    }
    if lines.len() > MAX_COMPACT_FRAME_LINES {
        writeln!(
            out,
            "        … {} more outer frames",
            outer_frames_left(&innermost_first, MAX_COMPACT_FRAME_LINES)
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

/// `frames` split before its trailing native frames (those under the last
/// Python or marker frame).
fn split_native(frames: &[Frame]) -> (&[Frame], &[Frame]) {
    let native_start = frames
        .iter()
        .rposition(|f| !matches!(f, Frame::Native { .. }))
        .map_or(0, |last| last + 1);
    frames.split_at(native_start)
}

/// Whether `frame` is folded with its neighbours: a Python frame of the
/// standard library, an installed package or the import machinery.
fn is_library(frame: &Frame) -> bool {
    matches!(frame, Frame::Python { .. }) && !frame.is_user_code()
}

/// The runs of `frames` (innermost first): a frame alone, or two or more
/// library frames in a row; the innermost frame always alone.
fn runs<'a>(frames: &[&'a Frame]) -> Vec<Vec<&'a Frame>> {
    let mut runs: Vec<Vec<&Frame>> = Vec::new();
    for (index, &frame) in frames.iter().enumerate() {
        let joins = index > 1
            && is_library(frame)
            && runs
                .last()
                .is_some_and(|run| run.iter().all(|f| is_library(f)));
        match runs.last_mut() {
            Some(run) if joins => run.push(frame),
            _ => runs.push(vec![frame]),
        }
    }
    runs
}

/// One line per run of [`runs`].
fn folded_lines(frames: &[&Frame]) -> Vec<String> {
    runs(frames)
        .iter()
        .map(|run| match run.as_slice() {
            [frame] => text::frame_text(frame),
            run => folded_run(run),
        })
        .collect()
}

/// `… 8 library frames (http/server.py, socketserver.py)`.
fn folded_run(run: &[&Frame]) -> String {
    let mut files: Vec<String> = Vec::new();
    for frame in run {
        if let Frame::Python { file, .. } = frame {
            let shown = crate::aggregate::display_file(file).to_owned();
            if !files.contains(&shown) {
                files.push(shown);
            }
        }
    }
    let mut listed = files
        .iter()
        .take(MAX_FOLDED_FILES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if files.len() > MAX_FOLDED_FILES {
        listed.push_str(", …");
    }
    format!("… {} library frames ({listed})", run.len())
}

/// Frames in the runs after the first `shown` runs.
fn outer_frames_left(frames: &[&Frame], shown: usize) -> usize {
    runs(frames).iter().skip(shown).map(Vec::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, file: &str) -> Frame {
        Frame::Python {
            function: function.to_owned(),
            file: file.to_owned(),
            line: 1,
        }
    }

    #[test]
    fn library_runs_fold_into_one_line_and_the_innermost_stays() {
        // Outermost first, as stacks are stored.
        let frames = vec![
            py("<module>", "app.py"),
            py("serve", "/usr/lib/python3.11/socketserver.py"),
            py("handle", "/usr/lib/python3.11/socketserver.py"),
            py("handle_one", "/usr/lib/python3.11/http/server.py"),
            py("do_GET", "app.py"),
            py("dumps", "/usr/lib/python3.11/json/__init__.py"),
            py("encode", "/usr/lib/python3.11/json/encoder.py"),
            Frame::Native {
                symbol: "malloc".to_owned(),
                module: None,
            },
        ];
        let mut out = Vec::new();
        compact_frame_lines(&frames, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "encode (json/encoder.py:1)",
                "dumps (json/__init__.py:1)",
                "do_GET (app.py:1)",
                "… 3 library frames (http/server.py, socketserver.py)",
                "<module> (app.py:1)",
                "native: malloc"
            ]
        );
    }

    #[test]
    fn long_stacks_stop_at_the_line_budget() {
        let frames: Vec<Frame> = (0..20).map(|i| py(&format!("f{i}"), "m.py")).collect();
        let mut out = Vec::new();
        compact_frame_lines(&frames, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines.len(), MAX_COMPACT_FRAME_LINES + 1, "{text}");
        assert_eq!(lines[0], "f19 (m.py:1)");
        assert_eq!(lines[MAX_COMPACT_FRAME_LINES], "… 14 more outer frames");
    }
}
