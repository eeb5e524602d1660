//! Capture reading, the first step of `memtrace report` and `memtrace diff`:
//! a capture file in, its header and lines out, with a clear error for a
//! file that is not a capture, comes from an unknown version, or has a
//! corrupt header, and a warning (not an error) for a capture cut off
//! mid-line or with corrupt lines inside (they are skipped: the rest of the
//! capture still makes a report).

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::format::{Header, Line, CAPTURE_VERSION};
use super::CaptureError;
use crate::aggregate::RunMeta;

/// Most bytes read looking for the header line: a file whose first line is
/// longer is not a capture.
const MAX_HEADER_BYTES: u64 = 64 * 1024;

/// A capture file, read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its header line.
    pub header: Header,
    /// Every line after the header, in file order (a cut last line and
    /// corrupt lines left out).
    pub lines: Vec<Line>,
    /// What the reader of a report from it must know, in file order.
    pub warnings: Vec<CaptureWarning>,
}

impl Capture {
    /// Allocator mode's report, from the last `allocations` line read;
    /// `None` without `--allocations`.
    pub fn allocations(&self) -> Option<&crate::allocations::AllocationsReport> {
        self.lines.iter().rev().find_map(|line| match line {
            Line::Allocations(report) => Some(&**report),
            _ => None,
        })
    }

    /// The allocators' census, from the last `census` line read; empty when
    /// the run took none (or the capture was cut before its end).
    pub fn census(&self) -> crate::census::CensusReport {
        self.lines
            .iter()
            .rev()
            .find_map(|line| match line {
                Line::Census(report) => Some((**report).clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The `end` line's run facts; `None` when the capture was cut off.
    pub fn end(&self) -> Option<&RunMeta> {
        self.lines.iter().rev().find_map(|line| match line {
            Line::End(meta) => Some(meta),
            _ => None,
        })
    }

    /// How long the capture covers, in nanoseconds from the run start: the
    /// run's duration when it ended normally, else up to its latest time.
    pub fn covered_ns(&self) -> u64 {
        match self.end() {
            Some(meta) => meta.duration_ns,
            None => self.latest_ns().saturating_sub(self.header.start_ns),
        }
    }

    /// The latest time of any line (CLOCK_MONOTONIC ns); the run start
    /// when no line has one.
    pub(crate) fn latest_ns(&self) -> u64 {
        self.lines
            .iter()
            .filter_map(Line::ts_ns)
            .fold(self.header.start_ns, u64::max)
    }
}

/// Something wrong with a capture that still leaves it readable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureWarning {
    /// Complete lines after the header that are not valid capture lines (a
    /// disk or copy error, an edit) were skipped: what they held (a process
    /// start, stacks, sampled bytes) is missing from the report.
    CorruptLines {
        /// How many were skipped.
        lines: u64,
        /// The first one's line number (1-based).
        first_line: u64,
        /// Why the first one does not parse.
        reason: String,
    },
    /// The last line was cut off (the writer was killed or the disk filled
    /// up mid-line) and was dropped.
    TruncatedLastLine {
        /// Its line number (1-based).
        line: u64,
        /// Bytes of it found.
        bytes: usize,
    },
    /// There is no `end` line: tracing was cut off (SIGKILL, full disk, or
    /// still running) and the capture holds what was flushed until then.
    NoEnd {
        /// How long the capture covers, in nanoseconds from the run start.
        covered_ns: u64,
    },
}

impl fmt::Display for CaptureWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CorruptLines {
                lines,
                first_line,
                reason,
            } => write!(
                f,
                "{lines} corrupt line{} of the capture skipped (the first, line {first_line}: \
                 {reason}): the report misses what {} held",
                if *lines == 1 { "" } else { "s" },
                if *lines == 1 { "it" } else { "they" },
            ),
            Self::TruncatedLastLine { line, bytes } => write!(
                f,
                "the capture's last line ({line}, {bytes} bytes) was cut off and is ignored"
            ),
            Self::NoEnd { covered_ns } => write!(
                f,
                "the capture has no end: tracing was cut off (killed, disk full, or still \
                 running); reporting its first {:.1} s",
                *covered_ns as f64 / 1e9
            ),
        }
    }
}

/// Reads the capture file at `path`.
///
/// # Errors
/// [`CaptureError::Io`] when it cannot be read; [`CaptureError::Empty`]
/// for an empty file; [`CaptureError::HeaderCut`] when it holds only the
/// start of a header; [`CaptureError::NotACapture`] when its first line is
/// not a capture header;
/// [`CaptureError::UnknownVersion`] for another format version;
/// [`CaptureError::Corrupt`] for a header line that is not valid. Later
/// lines that are not valid do not fail the read: a cut last line is
/// dropped, corrupt complete lines are skipped, each with a
/// [`CaptureWarning`].
pub fn read(path: &Path) -> Result<Capture, CaptureError> {
    let io_error = |source| CaptureError::Io {
        path: path.to_owned(),
        source,
    };
    let mut input = BufReader::new(File::open(path).map_err(io_error)?);
    let header = read_header(path, &mut input)?;
    let mut capture = Capture {
        path: path.to_owned(),
        header,
        lines: Vec::new(),
        warnings: Vec::new(),
    };
    let mut buf = Vec::new();
    let mut line_number = 1;
    let mut corrupt: Option<CaptureWarning> = None;
    let mut truncated = None;
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf).map_err(io_error)? == 0 {
            break;
        }
        line_number += 1;
        let complete = buf.ends_with(b"\n");
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Line>(&buf) {
            Ok(line) => capture.lines.push(line),
            // Without its newline, the line is the last one and was cut.
            Err(_) if !complete => {
                truncated = Some(CaptureWarning::TruncatedLastLine {
                    line: line_number,
                    bytes: buf.len(),
                });
            }
            Err(source) => match &mut corrupt {
                Some(CaptureWarning::CorruptLines { lines, .. }) => *lines += 1,
                _ => {
                    corrupt = Some(CaptureWarning::CorruptLines {
                        lines: 1,
                        first_line: line_number,
                        reason: source.to_string(),
                    });
                }
            },
        }
    }
    // In file order: the corrupt lines come before the cut last one.
    capture.warnings.extend(corrupt);
    capture.warnings.extend(truncated);
    if capture.end().is_none() {
        let covered_ns = capture.covered_ns();
        capture.warnings.push(CaptureWarning::NoEnd { covered_ns });
    }
    Ok(capture)
}

/// How every header line starts (the writer serializes
/// [`Header::memtrace_capture`] first).
const HEADER_START: &[u8] = b"{\"memtrace_capture\":";

/// Whether `first`, the file's first line, is the start of a header cut off
/// before its end of line (shorter or longer than [`HEADER_START`]).
fn is_cut_header(first: &[u8]) -> bool {
    let cut = !first.ends_with(b"\n") && serde_json::from_slice::<Header>(first).is_err();
    cut && (first.starts_with(HEADER_START) || HEADER_START.starts_with(first))
}

/// Reads and checks line 1.
fn read_header(path: &Path, input: &mut impl BufRead) -> Result<Header, CaptureError> {
    let not_a_capture = || CaptureError::NotACapture {
        path: path.to_owned(),
    };
    let mut first = Vec::new();
    input
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut first)
        .map_err(|source| CaptureError::Io {
            path: path.to_owned(),
            source,
        })?;
    if first.is_empty() {
        return Err(CaptureError::Empty {
            path: path.to_owned(),
        });
    }
    if is_cut_header(&first) {
        return Err(CaptureError::HeaderCut {
            path: path.to_owned(),
            bytes: first.len(),
        });
    }
    let value: serde_json::Value = serde_json::from_slice(&first).map_err(|_| not_a_capture())?;
    let found = value
        .get("memtrace_capture")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(not_a_capture)?;
    if found != u64::from(CAPTURE_VERSION) {
        return Err(CaptureError::UnknownVersion {
            path: path.to_owned(),
            found,
            supported: CAPTURE_VERSION,
        });
    }
    serde_json::from_value(value).map_err(|source| CaptureError::Corrupt {
        path: path.to_owned(),
        line: 1,
        source,
    })
}
