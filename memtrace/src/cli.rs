//! Command-line interface (clap derive types only): what the user typed,
//! validated for shape; `app` turns it into a tracing session.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

/// memtrace: find out why a Python service's memory grows, from outside the
/// process, with eBPF.
#[derive(Debug, Parser)]
#[command(name = "memtrace", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// memtrace's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to running processes (and the workers they fork) and trace them
    /// until Ctrl-C, SIGTERM, --duration, or until they all exit.
    Record(RecordArgs),
    /// Start a command and trace it (and what it forks) from its first
    /// instruction until it exits, Ctrl-C, SIGTERM or --duration.
    Run(RunArgs),
}

/// Arguments of `memtrace record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Process to attach to; repeat for several. Its existing descendants are
    /// traced too unless --no-follow-forks is given.
    #[arg(long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<u32>,
    /// Options shared with `run`.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Arguments of `memtrace run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Options shared with `record`.
    #[command(flatten)]
    pub common: CommonArgs,
    /// The command to start, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// A `--duration`: humantime syntax (`30s`, `5m`, `1h 30m`), more than zero.
fn parse_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".to_owned()),
        Ok(d) => Ok(d),
        Err(err) => Err(err.to_string()),
    }
}

/// Options of both `record` and `run`.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Stop after this long (e.g. `30s`, `5m`); the report is printed then.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Do not trace processes forked by the traced ones (and, for `record`,
    /// not their existing descendants).
    #[arg(long)]
    pub no_follow_forks: bool,
    /// Folder for the report files (folded stacks and JSON).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub output_dir: PathBuf,
    /// Mean bytes between sampled events: an event of N bytes gets a Python
    /// stack with probability min(1, N / this), weighted so totals stay
    /// unbiased. Lower means more detail and more overhead; 1 records every
    /// event.
    #[arg(long, value_name = "BYTES", default_value_t = 512 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    pub sample_bytes: u64,
    /// Growth paths shown in the terminal report.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// No progress line while recording.
    #[arg(long, short)]
    pub quiet: bool,
}
