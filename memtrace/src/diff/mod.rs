//! `memtrace diff`, beside the report step of the data flow: two reports in
//! (two captures replayed, or two time windows of one capture), one [`Diff`]
//! out, drawn as a table or a differential flame graph.
//!
//! - `matching`: the comparison itself, pure. Growth paths are matched by
//!   their frames (stack ids are per capture) summed over processes, each
//!   with the bytes it held at the end and the bytes it grew. Processes of
//!   two captures are matched as a user would (same command line and role,
//!   in order of start, then same program with other arguments; never by a
//!   bare tgid, which the kernel reuses);
//!   processes of two windows of one capture by identity (tgid, start time,
//!   image).
//! - `table`: the terminal table (processes, then paths by held bytes).
//! - `flamegraph`: the differential flame graph (held at the end by
//!   default).
//! - `command`: the `memtrace diff` command: arguments, loading, output.

mod command;
mod flamegraph;
mod matching;
mod table;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use command::{run, Plan};
pub use flamegraph::render_flamegraph;
pub use matching::{
    diff, diff_windows, Diff, Measure, PathBytes, PathDiff, ProcessDiff, ProcessSide,
};
pub use table::render_table;

/// Errors of `memtrace diff` other than those of reading a capture.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// `-o FILE` says no format and `--format` is missing.
    #[error(transparent)]
    Format(#[from] crate::report::ReportError),
    /// `--format` names a format `diff` cannot draw.
    #[error("`memtrace diff` writes `table`, `flamegraph` or `json`, not `{format}`")]
    UnsupportedFormat {
        /// The format asked for, as typed.
        format: String,
    },
    /// Neither a second capture nor `--from`/`--to` was given.
    #[error("nothing to compare `{}` with: give a second capture, or --from and --to", before.display())]
    NothingToCompare {
        /// The only capture given.
        before: PathBuf,
    },
    /// A second capture and `--from`/`--to` were both given.
    #[error("give either a second capture (`{}`) or --from/--to, not both", after.display())]
    CapturesAndWindows {
        /// The second capture.
        after: PathBuf,
    },
    /// The times of `--from`/`--to` do not make two windows.
    #[error("--from ({from}) must be after the start of the capture and before --to ({to})")]
    WindowOrder {
        /// `--from`, as humantime text.
        from: String,
        /// `--to`, as humantime text.
        to: String,
    },
    /// `--to` is past the end of the capture.
    #[error("--to ({to}) is beyond the end of `{}`, which covers {covered}", capture.display())]
    WindowBeyondEnd {
        /// The capture.
        capture: PathBuf,
        /// `--to`, as humantime text.
        to: String,
        /// How long the capture covers, as humantime text.
        covered: String,
    },
    /// No path of the later report has bytes of the measure drawn, so the
    /// differential flame graph (widths are the later report's bytes) would
    /// be empty.
    #[error(
        "no path has memory {} in the later report: the differential flame graph would be \
         empty (the table lists what changed)",
        measure.describe()
    )]
    NothingToDraw {
        /// The bytes the flame graph would be drawn with.
        measure: Measure,
    },
    /// The output could not be written.
    #[error("cannot write `{}`", path.display())]
    Write {
        /// The output file, or `-` for standard output.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl DiffError {
    /// Wraps an I/O error on `path`.
    fn from_io(path: &std::path::Path) -> impl FnOnce(io::Error) -> Self + '_ {
        move |source| Self::Write {
            path: path.to_owned(),
            source,
        }
    }
}

/// What the two sides of a diff are, for titles: e.g. "`before.capture`"
/// or "[0 s, 30 s) of `service.capture`".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sides {
    /// The earlier report.
    pub before: String,
    /// The later report.
    pub after: String,
    /// What the reader must know before comparing (e.g. the captures trace
    /// different programs: [`matching::programs_differ`]).
    pub warnings: Vec<String>,
}

/// Flame graph SVG readers shared with the integration tests.
#[cfg(test)]
#[path = "../../../tests/common/svg.rs"]
mod test_svg;
