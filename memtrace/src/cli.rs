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
    /// Render a capture file written by `record`/`run --capture` (no root
    /// needed, any machine).
    Report(ReportArgs),
    /// Which growth paths grew between two captures (BEFORE AFTER), or
    /// between two times of one capture (BEFORE --from T1 --to T2).
    Diff(DiffArgs),
}

/// `--format` values: the formats of `crate::report::Format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// The terminal summary.
    Table,
    /// Folded stacks (Brendan Gregg), weight in bytes.
    Folded,
    /// Everything, as JSON.
    Json,
    /// An SVG flame graph of the paths (inferno).
    Flamegraph,
    /// JSON that speedscope.app opens.
    Speedscope,
    /// Gzipped profile.proto (go tool pprof, Grafana Pyroscope).
    Pprof,
    /// One self-contained HTML page: verdict, RSS chart and top paths first,
    /// then process tree, copy-on-write, flame graph.
    Html,
}

impl From<FormatArg> for crate::report::Format {
    fn from(arg: FormatArg) -> Self {
        match arg {
            FormatArg::Table => Self::Table,
            FormatArg::Folded => Self::Folded,
            FormatArg::Json => Self::Json,
            FormatArg::Flamegraph => Self::Flamegraph,
            FormatArg::Speedscope => Self::Speedscope,
            FormatArg::Pprof => Self::Pprof,
            FormatArg::Html => Self::Html,
        }
    }
}

/// Arguments of `memtrace report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The capture file.
    #[arg(value_name = "FILE")]
    pub capture: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Table)]
    pub format: FormatArg,
    /// Write to this file (or, with --per-process, this folder) instead of
    /// standard output.
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
    /// Options shared with the formats of `record`/`run`.
    #[command(flatten)]
    pub render: RenderArgs,
    /// Draw the allocation paths of a capture recorded with --allocations
    /// instead of the memory growth (--format folded, flamegraph,
    /// speedscope or pprof; the table and JSON always carry them).
    #[arg(long)]
    pub allocations: bool,
    /// With --allocations: which bytes weigh the allocation paths.
    #[arg(long, value_enum, default_value_t = AllocWeightArg::Leaked)]
    pub alloc_weight: AllocWeightArg,
    /// Also look for separate debug files by build-id under this folder
    /// (`DIR/.build-id/xx/rest.debug`, before /usr/lib/debug; repeatable):
    /// the symbols of the exit point and the allocator hooks of stripped
    /// interpreters (Debian's `pythonX.Y-dbg` unpacked elsewhere).
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
}

/// How reports are drawn (`report`, and the --format outputs of `record`/`run`).
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Flame graphs drawn as icicles (roots at the top).
    #[arg(long)]
    pub inverted: bool,
    /// One flame graph per process instead of one for the whole tree.
    #[arg(long)]
    pub per_process: bool,
    /// Growth paths shown in the table and HTML report.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Which bytes weigh the paths of flame graphs, folded stacks,
    /// speedscope and pprof: bytes held at each process's high-water mark,
    /// bytes held at the end, or every first touch (counted again when
    /// freed memory is touched again).
    #[arg(long, value_enum, default_value_t = WeightArg::Peak)]
    pub weight: WeightArg,
    /// Print every finding, process by process, with the numbers behind it
    /// above the process table (by default the terminal ends with the
    /// verdict: one entry per cause; the JSON and HTML always hold both).
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// `--weight` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightArg {
    /// Held when the process's RSS was highest.
    Peak,
    /// Held at the end (of the trace, or when the process began to exit).
    End,
    /// Every first touch of a page.
    Grown,
}

/// Arguments of `memtrace diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The earlier capture (or the only one, with --from/--to).
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The later capture; omit it to compare two times of BEFORE.
    #[arg(value_name = "AFTER")]
    pub after: Option<PathBuf>,
    /// With one capture: compare what grew in [start, T1) with what grew in
    /// [T1, T2); process RSS is the last reading before T1 against the last
    /// before T2. Times from the start of the capture (e.g. `30s`).
    #[arg(long, value_parser = humantime::parse_duration, requires = "to")]
    pub from: Option<Duration>,
    /// With one capture: T2, the end of the later window; at most the
    /// capture's length.
    #[arg(long, value_parser = humantime::parse_duration, requires = "from")]
    pub to: Option<Duration>,
    /// `table` or `flamegraph` (a differential flame graph).
    #[arg(long, value_enum, default_value_t = FormatArg::Table)]
    pub format: FormatArg,
    /// Write to this file instead of standard output.
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `memtrace record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Process to attach to; repeat for several. Its existing descendants are
    /// traced too unless --no-follow-forks is given.
    #[arg(long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<u32>,
    /// Allow `--pid 1` with its forks followed: PID 1 is the ancestor of
    /// every process, so this traces the whole machine.
    #[arg(long)]
    pub allow_init: bool,
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
    /// Start the command with PYTHONMALLOC=malloc: CPython then allocates
    /// every object with libc malloc, which --allocations hooks, even where
    /// its own allocator is inlined (LTO builds such as Debian's
    /// /usr/bin/python3.11). Changes the program's allocator: memory use
    /// and speed differ from pymalloc's.
    #[arg(long)]
    pub python_malloc: bool,
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
    /// Also write a capture file here: aggregated data, flushed every
    /// second, that `memtrace report` renders later.
    #[arg(short = 'o', long = "capture", value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// Extra report files to write to --output-dir at the end (repeat for
    /// several); the table, folded stacks and JSON are always written.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Vec<FormatArg>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
    /// How reports are drawn.
    #[command(flatten)]
    pub render: RenderArgs,
    /// No live view while recording.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also hook the allocators of each traced process (CPython's
    /// PyObject_/PyMem_ API and libc malloc/calloc/realloc/free, with
    /// uprobes for that process only): per path, bytes allocated, freed,
    /// leaked, live at the high-water mark, and temporary, sampled by bytes
    /// with --sample-bytes as the mean. Costs about 3 us per allocator
    /// call with its free (allocation-heavy code runs many times slower):
    /// for short windows, or one worker of a service.
    #[arg(long)]
    pub allocations: bool,
    /// With --allocations: which bytes weigh the allocation folded stacks
    /// written beside the report (`<stem>.allocations.folded`).
    #[arg(long, value_enum, default_value_t = AllocWeightArg::Leaked)]
    pub alloc_weight: AllocWeightArg,
    /// Also look for separate debug files by build-id under this folder
    /// (`DIR/.build-id/xx/rest.debug`, before /usr/lib/debug; repeatable):
    /// the symbols of the exit point and the allocator hooks of stripped
    /// interpreters (Debian's `pythonX.Y-dbg` unpacked elsewhere).
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
}

/// `--alloc-weight` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocWeightArg {
    /// Bytes allocated.
    Allocated,
    /// Bytes still live at the end (or when the process began to exit).
    Leaked,
    /// Bytes live when the process's sampled live bytes peaked.
    Peak,
}
