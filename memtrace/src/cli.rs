//! Command-line interface (clap derive types only): what the user typed,
//! validated for shape; `app` turns it into a tracing session.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

/// Where `record`/`run` write their files unless `--output-dir` is given.
pub const DEFAULT_OUTPUT_DIR: &str = "memtrace-captures";

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
    /// Run as a node agent: trace every Python process (or those selected)
    /// for days, closing a window every --interval for the fleet's
    /// backends (--metrics: Prometheus).
    Agent(AgentArgs),
    /// Print the shell completion script for SHELL (e.g. `source <(memtrace
    /// completions bash)`).
    Completions(CompletionsArgs),
}

/// Arguments of `memtrace completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete memtrace's subcommands and options in.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// The fleet's backends a session's windows go to (`memtrace agent`, and
/// `record`/`run` for a window every 15 s and one at the end).
#[derive(Debug, Default, Args)]
pub struct SinkArgs {
    /// Serve Prometheus metrics at `http://ADDR/metrics`: `PORT` (bound to
    /// 127.0.0.1) or `HOST:PORT` (e.g. `0.0.0.0:9464` for every interface).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// Arguments of `memtrace agent`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("targets").args(["pids", "matching", "cgroup"])))]
pub struct AgentArgs {
    /// Trace this process and what it forks (several after one flag, or the
    /// flag repeated); by default every Python process on the host is traced.
    /// Given no PID (an empty `$(pgrep ...)`), the agent says so and stops
    /// instead of tracing every process.
    #[arg(long = "pid", value_name = "PID", num_args = 0.., value_parser = parse_pid)]
    pub pids: Option<Vec<u32>>,
    /// Trace every process whose command line (arguments joined with
    /// spaces) matches this regular expression, and what it forks.
    #[arg(long = "match", value_name = "REGEX")]
    pub matching: Option<String>,
    /// Trace every process in this cgroup (v2) or below it, and what it
    /// forks (e.g. `/kubepods.slice` or `/sys/fs/cgroup/system.slice`).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Close a window and send it to the sinks this often.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub interval: Duration,
    /// Stop after this long (after a last window); otherwise on SIGTERM or
    /// Ctrl-C (after a last window too).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Where the windows go.
    #[command(flatten)]
    pub sinks: SinkArgs,
    /// The node's name in the windows (`host.name`); by default the
    /// kernel's host name, which in a Kubernetes pod is the pod's: pass the
    /// node's there (`spec.nodeName` through the downward API).
    #[arg(long, value_name = "NAME")]
    pub host_name: Option<String>,
    /// Paths per service in memtrace_path_held_bytes (the largest held).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Mean bytes between sampled events (as for `record`).
    #[arg(long, value_name = "BYTES", default_value_t = 512 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    pub sample_bytes: u64,
    /// No line per window on standard error (errors and warnings still are).
    #[arg(long, short)]
    pub quiet: bool,
    /// Where each window's profiles go.
    #[command(flatten)]
    pub profile_sinks: ProfileSinkArgs,
}

/// The profile backends a window (the agent's every `--interval`, or
/// `record`/`run`'s one at the end) is sent to.
#[derive(Debug, Default, Clone, Args)]
pub struct ProfileSinkArgs {
    /// Send profiles as OTLP over HTTP (`POST URL/v1development/profiles`,
    /// protobuf, proto v1.10.0) to an OpenTelemetry Collector, e.g.
    /// `http://127.0.0.1:4318`.
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// Send pprof profiles to Grafana Pyroscope (`POST URL/ingest`, one per
    /// service and role), e.g. `http://127.0.0.1:4040`.
    #[arg(long, value_name = "URL")]
    pub pyroscope: Option<String>,
    /// With --pyroscope: the tenant (`X-Scope-OrgID` header).
    #[arg(long, value_name = "ID", requires = "pyroscope")]
    pub pyroscope_tenant: Option<String>,
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
    /// Output format; without it, the extension of -o decides (`.svg`,
    /// `.html`, `.speedscope.json`, `.json`, `.pb.gz`, `.folded`, `.txt`),
    /// else the table.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// The report file (or, with --per-process, this folder) instead of
    /// standard output; its format from --format or its extension.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
    /// Options shared with the formats of `record`/`run`.
    #[command(flatten)]
    pub render: RenderArgs,
    /// The CI gate, on the capture's report.
    #[command(flatten)]
    pub gate: GateArgs,
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
    /// Show frames' files as the interpreter names them (by default, as
    /// py-spy does: relative to the working folder, site-packages or the
    /// standard library).
    #[arg(long)]
    pub full_paths: bool,
}

/// The CI gate of `record`, `run` and `report`: when a condition holds at
/// the end, memtrace prints the report, then one line saying why, and exits
/// with status 86.
#[derive(Debug, Args)]
pub struct GateArgs {
    /// Exit with status 86 when a traced process's peak RSS is above SIZE
    /// (e.g. `160MiB`, `1.5G`, `500MB`).
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_bytes)]
    pub fail_above: Option<u64>,
    /// Exit with status 86 when the verdict has a strong cause of this
    /// pattern (`any`: of any pattern but no-growth); repeat for several.
    #[arg(long, value_enum, value_name = "CAUSE")]
    pub fail_on_cause: Vec<CauseArg>,
}

/// `--fail-on-cause` values: the verdict's patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CauseArg {
    /// Any strong cause but no-growth.
    Any,
    /// One process grows while its siblings stay flat.
    OneProcessGrows,
    /// Every worker holds a large, stable footprint.
    EveryWorkerLarge,
    /// Total memory steps up with each fork.
    WorkerMultiplication,
    /// A sharp rise tied to one code path, released afterwards.
    Spike,
    /// Memory that stays up after activity drops, or rises while idle.
    Retention,
    /// Growth in file-backed pages (page cache of mapped files).
    FileBackedGrowth,
    /// Pages shared copy-on-write with the master un-shared by writes.
    CowUnsharing,
    /// Growth that fits no other pattern.
    UnmatchedGrowth,
    /// Memory the allocator keeps after the program freed it.
    AllocatorFragmentation,
}

impl GateArgs {
    /// The gate these arguments set.
    pub fn gate(&self) -> crate::diagnose::gate::Gate {
        use crate::diagnose::Pattern;
        let pattern = |arg: &CauseArg| match arg {
            CauseArg::Any => None,
            CauseArg::OneProcessGrows => Some(Pattern::OneProcessGrows),
            CauseArg::EveryWorkerLarge => Some(Pattern::EveryWorkerLarge),
            CauseArg::WorkerMultiplication => Some(Pattern::WorkerMultiplication),
            CauseArg::Spike => Some(Pattern::Spike),
            CauseArg::Retention => Some(Pattern::Retention),
            CauseArg::FileBackedGrowth => Some(Pattern::FileBackedGrowth),
            CauseArg::CowUnsharing => Some(Pattern::CowUnsharing),
            CauseArg::UnmatchedGrowth => Some(Pattern::UnmatchedGrowth),
            CauseArg::AllocatorFragmentation => Some(Pattern::AllocatorFragmentation),
        };
        crate::diagnose::gate::Gate {
            fail_above_bytes: self.fail_above,
            fail_on_causes: self.fail_on_cause.iter().map(pattern).collect(),
        }
    }
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

/// `memtrace diff --format` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormatArg {
    /// The terminal table: a summary line, the processes, the paths.
    Table,
    /// A differential flame graph (SVG) of memory held at the end.
    Flamegraph,
    /// The comparison as JSON.
    Json,
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
    /// Without it, the name of -o decides (`.svg`, `.json`, `.txt`), else
    /// the table.
    #[arg(long, value_enum)]
    pub format: Option<DiffFormatArg>,
    /// Growth paths the table lists.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// The report file instead of standard output; its format from
    /// --format or its extension.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `memtrace record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Process to attach to; several after one flag (`--pid $(pgrep -f
    /// app.py)`) or the flag repeated. Its existing descendants are traced
    /// too unless --no-follow-forks is given. Given no PID (an empty
    /// `$(pgrep ...)`), memtrace says so and stops.
    #[arg(
        long = "pid",
        value_name = "PID",
        required = true,
        num_args = 0..,
        value_parser = parse_pid
    )]
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

/// A `--pid`: a process id, more than zero; an empty value (a quoted
/// `"$(pgrep ...)"` that matched nothing) says so.
fn parse_pid(text: &str) -> Result<u32, String> {
    if text.trim().is_empty() {
        return Err(format!("no PID given: {PGREP_HINT}"));
    }
    match text.trim().parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("`{text}` is not a process id (a number above 0)")),
        Ok(pid) => Ok(pid),
    }
}

/// What to check when `--pid` got no PID.
pub const PGREP_HINT: &str = "did `pgrep` match nothing? `--pid $(pgrep -f app.py)` passes no \
                              PID when no process matches; `pgrep -af app.py` lists what is \
                              running";

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
    /// Folder of each run's capture, folded stacks and JSON
    /// (`memtrace-<UTC time>.*`) and of the --format files without -o; in
    /// the default folder only the newest 20 runs are kept.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_OUTPUT_DIR)]
    pub output_dir: PathBuf,
    /// Mean bytes between sampled events: an event of N bytes gets a Python
    /// stack with probability min(1, N / this), weighted so totals stay
    /// unbiased. A process that grows slowly is sampled with a smaller mean
    /// (down to 1/64 of this, at most about 1,000 samples a second). Lower
    /// means more detail and more overhead; 1 records every event.
    #[arg(long, value_name = "BYTES", default_value_t = 512 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    pub sample_bytes: u64,
    /// Write the capture here instead of `--output-dir`'s
    /// `memtrace-<UTC time>.capture`: aggregated data, flushed every
    /// second, that `memtrace report` renders again later (every recording
    /// writes one).
    #[arg(long = "capture", value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// The report file written at the end, in the format of --format or of
    /// its extension (`.svg`, `.html`, `.speedscope.json`, `.json`,
    /// `.pb.gz`, `.folded`, `.txt`), as py-spy and memray do.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Report files to write at the end: with -o, the format of that file
    /// (once); without, extra files in --output-dir (repeat for several).
    /// The capture, folded stacks and JSON are always written.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Vec<FormatArg>,
    /// Replace output files that already exist (a symbolic link is never
    /// followed, not even with --force).
    #[arg(long)]
    pub force: bool,
    /// How reports are drawn.
    #[command(flatten)]
    pub render: RenderArgs,
    /// The CI gate.
    #[command(flatten)]
    pub gate: GateArgs,
    /// The fleet's backends: a window every 15 s and one at the end, the
    /// paths cut to --top per service.
    #[command(flatten)]
    pub sinks: SinkArgs,
    /// No live view while recording.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also hook the allocators of each traced process: per path, bytes
    /// allocated, freed, leaked, live at the high-water mark, and
    /// temporary, sampled by bytes with --sample-bytes as the mean. How
    /// they are hooked: --alloc-hooks.
    #[arg(long)]
    pub allocations: bool,
    /// With --allocations: `sampler` (the default) puts memtrace's sampler
    /// library in the process, which samples there and enters the kernel
    /// for sampled blocks only (1.0-2.0x on allocation-heavy code): `run`
    /// preloads it (LD_PRELOAD and a sitecustomize first on PYTHONPATH),
    /// `record --pid` installs it in running CPython 3.14+ through its
    /// remote debugging (PEP 768); `uprobes` installs nothing and traps
    /// every allocator call into the kernel (2-13 us a call: many times
    /// slower), the way for `record --pid` of CPython 3.9-3.13 and of
    /// processes that disabled remote debugging.
    #[arg(long, value_enum, value_name = "HOOKS")]
    pub alloc_hooks: Option<AllocHooksArg>,
    /// With --allocations: which bytes weigh the allocation folded stacks
    /// written beside the report (`<stem>.allocations.folded`).
    #[arg(long, value_enum, default_value_t = AllocWeightArg::Leaked)]
    pub alloc_weight: AllocWeightArg,
    /// Where the run's profile (one window, the whole run) also goes.
    #[command(flatten)]
    pub profile_sinks: ProfileSinkArgs,
    /// Also look for separate debug files by build-id under this folder
    /// (`DIR/.build-id/xx/rest.debug`, before /usr/lib/debug; repeatable):
    /// the symbols of the exit point and the allocator hooks of stripped
    /// interpreters (Debian's `pythonX.Y-dbg` unpacked elsewhere).
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
}

/// `--alloc-hooks` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocHooksArg {
    /// memtrace's sampler library in the process; uprobes on its markers.
    Sampler,
    /// Uprobes on every allocator entry point.
    Uprobes,
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
