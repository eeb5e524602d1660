//! `memtrace diff`: which growth paths grew between two captures or two
//! times of one capture. (Being written by helper "diff".)

use std::process::ExitCode;

use crate::cli::DiffArgs;

/// `memtrace diff BEFORE [AFTER]`.
///
/// # Errors
/// A capture cannot be read or the output cannot be written.
pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`memtrace diff {}` is not implemented yet", args.before.display())
}
