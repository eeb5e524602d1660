//! Capture files: aggregated trace data written incrementally during
//! `record`/`run --capture`, and read back by `memtrace report`.
//! (Being written by helper "capture".)

use std::process::ExitCode;

use crate::cli::ReportArgs;

/// `memtrace report FILE`.
///
/// # Errors
/// The capture cannot be read or the output cannot be written.
pub fn report_command(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`memtrace report {}` is not implemented yet", args.capture.display())
}
