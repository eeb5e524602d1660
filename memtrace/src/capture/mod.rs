//! Capture files, beside the aggregation step: what the aggregator is fed
//! during `record`/`run --capture FILE` is also written to a file as it
//! goes ([`Recorder`] feeds both; [`CaptureWriter`]: aggregated sampled bytes, process lifecycle and
//! counter reads, flushed every second), read back ([`read`]) and replayed
//! into the same [`crate::aggregate::Report`] ([`replay`],
//! [`replay_window`]) by `memtrace report FILE` and `memtrace diff`, on any
//! machine, without root. The format (JSON Lines, versioned header) is
//! described in [`format`](mod@format).

pub mod format;
mod reader;
mod recorder;
mod replay;
mod writer;

use std::io;
use std::path::PathBuf;

pub use format::{Header, Line, CAPTURE_VERSION};
pub use reader::{read, Capture, CaptureWarning};
pub use recorder::{AddressChange, Recorder, HELD_MAP_MAX_ENTRIES};
pub use replay::{replay, replay_window};
pub use writer::CaptureWriter;

/// Errors reading or writing a capture file.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file's first line is not a capture header.
    #[error("`{}` is not a memtrace capture file (written by `memtrace record --capture`)", path.display())]
    NotACapture {
        /// The file.
        path: PathBuf,
    },
    /// The file is empty: the writer was stopped before its header reached
    /// the disk.
    #[error("`{}` is an empty capture file (nothing was written to it, not even its header)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file holds only the start of a capture header: the writer was
    /// stopped (or the disk filled up) while writing it.
    #[error("the header of capture file `{}` is cut off after {bytes} bytes: the capture holds no data", path.display())]
    HeaderCut {
        /// The file.
        path: PathBuf,
        /// Bytes of the header found.
        bytes: usize,
    },
    /// The file is a capture of a format version this build cannot read.
    #[error(
        "`{}` is a version {found} capture; this memtrace reads version {supported} (use the memtrace that wrote it)",
        path.display()
    )]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version in its header.
        found: u64,
        /// The version this build reads.
        supported: u32,
    },
    /// The file cannot be opened or read.
    #[error("cannot read capture file `{}`", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The header line has the capture marker and version but is not a
    /// valid header (later lines that are not valid are skipped with a
    /// [`CaptureWarning`] instead).
    #[error("capture file `{}` is corrupt at line {line}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Line number (1-based).
        line: u64,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The file cannot be created or written.
    #[error("cannot write capture file `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests;
