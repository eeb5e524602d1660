//! Capture files, beside the aggregation step: what the aggregator is fed
//! during `record`/`run --capture FILE` is also written to a file as it
//! goes ([`Recorder`] feeds both; [`CaptureWriter`]: aggregated sampled bytes, process lifecycle and
//! counter reads, flushed every second), read back ([`read`]) and replayed
//! into the same [`Report`] ([`replay`], [`replay_window`]) by
//! `memtrace report FILE` and `memtrace diff`, on any machine, without
//! root. The format (JSON Lines, versioned header) is described in
//! [`format`].

pub mod format;
mod reader;
mod recorder;
mod replay;
mod writer;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

pub use format::{Header, Line, CAPTURE_VERSION};
pub use reader::{read, Capture, CaptureWarning};
pub use recorder::Recorder;
pub use replay::{replay, replay_window};
pub use writer::CaptureWriter;

use crate::aggregate::Report;
use crate::cli::ReportArgs;
use crate::report::{self, RenderOptions};

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
    /// A complete line (not the cut last one) is not a valid capture line.
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

/// `memtrace report FILE`: reads the capture (its warnings to stderr),
/// replays and diagnoses it, and renders it in `--format` to `-o OUT` or
/// standard output; with `--per-process`, one flame graph per process into
/// the folder `-o` (default: the current folder).
///
/// # Errors
/// The capture cannot be read, or the output cannot be written.
pub fn report_command(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let capture = read(&args.capture)?;
    for warning in &capture.warnings {
        eprintln!("memtrace: warning: {warning}");
    }
    let report = replay(&capture);
    let options = RenderOptions {
        inverted: args.render.inverted,
        top: args.render.top,
    };
    if args.render.per_process {
        let dir = args.output.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the folder `{}`", dir.display()))?;
        for path in report::render_per_process(
            &report,
            args.format,
            &options,
            &dir,
            report::PER_PROCESS_STEM,
        )? {
            eprintln!("memtrace: wrote {}", path.display());
        }
    } else {
        render_to(&report, args, &options)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Renders `report` to `-o OUT` or standard output.
fn render_to(report: &Report, args: &ReportArgs, options: &RenderOptions) -> anyhow::Result<()> {
    match &args.output {
        Some(path) => {
            let file = File::create(path)
                .with_context(|| format!("cannot create `{}`", path.display()))?;
            let mut out = BufWriter::new(file);
            report::render(report, args.format, options, &mut out)?;
            out.flush()
                .with_context(|| format!("cannot write `{}`", path.display()))
        }
        None => {
            let mut out = io::stdout().lock();
            report::render(report, args.format, options, &mut out)?;
            out.flush().context("cannot write to standard output")
        }
    }
}

#[cfg(test)]
mod tests;
