//! `cargo xtask bench`: memtrace's overhead, traced vs untraced, on the
//! benchmark workloads in `tests/scripts/bench_*.py`; with `--peers`, also
//! memtrace's peers (tracemalloc, memray) and pyperformance workloads,
//! side by side in one table.
//!
//! Each workload times its own phase (the allocation loop, the 1 GiB growth,
//! the benchmark's loops) and prints it as a JSON line, so interpreter
//! start-up and tracer attach are not counted. Configurations alternate
//! round-robin (run `r` starts at the `r`-th configuration) so slow drift of
//! the VM hits all alike; the table shows medians and each configuration's
//! ratio to the untraced median. For the growth workload the table also
//! compares the bytes of memtrace's top growth path (its JSON report) with
//! the resident growth the workload measured itself.

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::Value;

/// What `cargo xtask bench` needs from the command line and the build.
pub struct BenchArgs {
    /// Runs of each configuration per workload (>= 1; medians are reported).
    pub runs: usize,
    /// The memtrace binary to trace with (`memtrace run`).
    pub memtrace_bin: PathBuf,
    /// The Python interpreter that runs the workloads (with `peers`, the
    /// bench virtualenv's, which has memray and pyperformance).
    pub python: PathBuf,
    /// Whether to run the peer configurations and the pyperformance workloads.
    pub peers: bool,
}

/// How a workload's process runs: untraced, or under one tracer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    /// `python script`.
    Untraced,
    /// `memtrace run -- python script`, memtrace's default mode.
    Memtrace,
    /// `memtrace run --allocations --alloc-hooks uprobes -- python script`:
    /// allocator uprobes too.
    Allocations,
    /// `memtrace run --allocations --alloc-hooks sampler -- python script`:
    /// the in-process sampler, uprobes on its markers only.
    Sampler,
    /// `python -X tracemalloc script`.
    Tracemalloc,
    /// `python -m memray run script`.
    Memray,
}

/// Configurations of the default bench, in table order.
const DEFAULT_CONFIGS: &[Config] = &[Config::Untraced, Config::Memtrace];

/// Configurations of `--peers`, in table order; the baseline comes first.
const PEER_CONFIGS: &[Config] = &[
    Config::Untraced,
    Config::Memtrace,
    Config::Sampler,
    Config::Allocations,
    Config::Tracemalloc,
    Config::Memray,
];

impl Config {
    /// Column header and progress label.
    fn label(self) -> &'static str {
        match self {
            Config::Untraced => "untraced",
            Config::Memtrace => "memtrace",
            Config::Allocations => "uprobes",
            Config::Sampler => "sampler",
            Config::Tracemalloc => "tracemalloc",
            Config::Memray => "memray",
        }
    }

    /// How the configuration runs, for the legend above the table.
    fn legend(self) -> &'static str {
        match self {
            Config::Untraced => "python SCRIPT",
            Config::Memtrace => "memtrace run --quiet -- python SCRIPT (default mode)",
            Config::Allocations => {
                "memtrace run --quiet --allocations --alloc-hooks uprobes -- python SCRIPT \
                 (a uprobe on every allocator call)"
            }
            Config::Sampler => {
                "memtrace run --quiet --allocations -- python SCRIPT (the in-process sampler, \
                 run's default allocator hooks)"
            }
            Config::Tracemalloc => {
                "python -X tracemalloc SCRIPT (started at startup, default frame depth 1)"
            }
            Config::Memray => {
                "python -m memray run --quiet --force -o FILE SCRIPT (memray's defaults: \
                 pymalloc allocations not traced, no native traces, forks not followed)"
            }
        }
    }
}

/// Which configurations a workload runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peers {
    /// The default configurations only, with or without `--peers`.
    Never,
    /// Only with `--peers`, under the peer configurations.
    Only,
}

/// One benchmark workload and the goal its memtrace/untraced ratio is held to.
struct Workload {
    /// Name in the table.
    name: &'static str,
    /// Short name for scratch files.
    id: &'static str,
    /// Script path, relative to the workspace root.
    script: &'static str,
    /// Largest acceptable median memtrace/untraced phase-time ratio, if any.
    goal_ratio: Option<f64>,
    /// Arguments of the timed run.
    args: &'static [&'static str],
    /// Arguments of an untraced run of the same script before each timed
    /// run, if any: growing and freeing ~1.4 GiB makes this VM's page
    /// allocation times repeatable (toolchain.md), and doing it in its own
    /// process keeps that transient growth out of the traced process.
    settle_args: Option<&'static [&'static str]>,
    /// Whether to compare memtrace's top growth path with the true growth.
    check_growth: bool,
    /// Which configurations it runs under.
    peers: Peers,
}

/// The adapter that runs a pyperformance benchmark in one process.
const PYPERFORMANCE_SCRIPT: &str = "tests/scripts/bench_pyperformance.py";

/// The workloads, in table order. The peer workloads are short (about
/// 0.1-0.5 s untraced on the 2-core VM): allocator mode adds microseconds
/// per allocator call, so the 5M-dict loop would outlast
/// [`TRACE_DURATION`] under it.
const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "alloc loop (5M dicts)",
        id: "alloc_loop",
        script: "tests/scripts/bench_alloc_loop.py",
        goal_ratio: Some(1.05),
        args: &[],
        settle_args: None,
        check_growth: false,
        peers: Peers::Never,
    },
    Workload {
        name: "alloc loop (500k dicts)",
        id: "alloc_loop_500k",
        script: "tests/scripts/bench_alloc_loop.py",
        goal_ratio: None,
        args: &["--iterations", "500000"],
        settle_args: None,
        check_growth: false,
        peers: Peers::Only,
    },
    Workload {
        name: "growth (1 GiB)",
        id: "grow",
        script: "tests/scripts/bench_grow.py",
        goal_ratio: Some(1.15),
        args: &["--mib", "1024", "--settle-mib", "0"],
        settle_args: Some(&["--mib", "0", "--settle-mib", "1434", "--hold", "0"]),
        check_growth: true,
        peers: Peers::Never,
    },
    pyperformance(
        "json_loads (150 loops)",
        "json_loads",
        &["--benchmark", "json_loads", "--loops", "150"],
    ),
    pyperformance(
        "deltablue (25 loops)",
        "deltablue",
        &["--benchmark", "deltablue", "--loops", "25"],
    ),
    pyperformance(
        "raytrace (1 loop)",
        "raytrace",
        &["--benchmark", "raytrace", "--loops", "1"],
    ),
];

/// A pyperformance benchmark run by [`PYPERFORMANCE_SCRIPT`] with `args`:
/// `--peers` only, no goal.
const fn pyperformance(
    name: &'static str,
    id: &'static str,
    args: &'static [&'static str],
) -> Workload {
    Workload {
        name,
        id,
        script: PYPERFORMANCE_SCRIPT,
        goal_ratio: None,
        args,
        settle_args: None,
        check_growth: false,
        peers: Peers::Only,
    }
}

/// Largest acceptable relative error of the top growth path vs the true growth.
const GOAL_GROWTH_ERROR: f64 = 0.25;

/// Upper bound on one traced run, passed as `memtrace run --duration`.
const TRACE_DURATION: &str = "120s";

/// Scratch folder for the traced runs' report files.
const SCRATCH_DIR: &str = "target/bench";

/// What one run of a workload measured.
struct Sample {
    /// The workload's own timing of its phase, in seconds.
    phase_seconds: f64,
    /// The workload's resident growth (`rss_growth_bytes`), if it reports one.
    rss_growth_bytes: Option<u64>,
    /// Bytes of memtrace's first growth path (memtrace runs that check growth).
    top_path_bytes: Option<u64>,
    /// Outermost allocator calls the uprobes saw (`--allocations` runs).
    alloc_calls: Option<u64>,
}

/// Medians of one workload, one table row.
struct Row {
    /// The workload's name in the table.
    name: &'static str,
    /// The workload's goal for the memtrace/untraced ratio, if any.
    goal_ratio: Option<f64>,
    /// Median phase seconds of each configuration the workload ran under.
    medians: Vec<(Config, f64)>,
    /// Median relative error of the top growth path, when checked.
    growth_error: Option<f64>,
    /// Median outermost allocator calls per `--allocations` run, if it ran.
    alloc_calls: Option<f64>,
}

impl Row {
    /// The median phase seconds under `config`, if the workload ran under it.
    fn median(&self, config: Config) -> Option<f64> {
        self.medians
            .iter()
            .find(|(c, _)| *c == config)
            .map(|(_, seconds)| *seconds)
    }
}

/// Runs every selected workload `args.runs` times per configuration and
/// prints the table.
///
/// # Errors
/// A workload or tracer fails to start or exits non-zero, prints no
/// `phase_seconds` line, or (growth workload) memtrace writes no JSON report
/// with a `paths` entry.
pub fn run(args: &BenchArgs) -> Result<()> {
    ensure!(
        args.runs >= 1,
        "--runs must be at least 1, got {}",
        args.runs
    );
    println!(
        "bench: {} runs per configuration, round-robin; python {}, memtrace {}",
        args.runs,
        args.python.display(),
        args.memtrace_bin.display()
    );
    let mut rows = Vec::new();
    for workload in &WORKLOADS {
        if let Some(configs) = configs_for(workload.peers, args.peers) {
            rows.push(bench_workload(args, workload, configs)?);
        }
    }
    print!("{}", format_table(table_configs(args.peers), &rows));
    Ok(())
}

/// The table's configuration columns.
fn table_configs(peers: bool) -> &'static [Config] {
    if peers {
        PEER_CONFIGS
    } else {
        DEFAULT_CONFIGS
    }
}

/// The configurations a workload runs under, or `None` to skip it.
fn configs_for(workload_peers: Peers, peers: bool) -> Option<&'static [Config]> {
    match (workload_peers, peers) {
        (Peers::Only, false) => None,
        (Peers::Never, _) => Some(DEFAULT_CONFIGS),
        (Peers::Only, true) => Some(PEER_CONFIGS),
    }
}

/// Indices into a list of `count` configurations in the order run `run`
/// takes them: rotated by one per run, so each goes first in turn and none
/// always runs on a VM warmed by another.
fn run_order(count: usize, run: usize) -> impl Iterator<Item = usize> {
    (0..count).map(move |index| (index + run) % count)
}

/// Runs one workload round-robin and reduces its samples to medians.
fn bench_workload(args: &BenchArgs, workload: &Workload, configs: &[Config]) -> Result<Row> {
    let mut seconds = vec![Vec::new(); configs.len()];
    let mut growth_errors = Vec::new();
    let mut alloc_calls = Vec::new();
    for run in 0..args.runs {
        for index in run_order(configs.len(), run) {
            let config = configs[index];
            let sample = run_once(args, workload, config, run)?;
            eprintln!(
                "bench: {} run {}/{} {}: {:.3} s",
                workload.name,
                run + 1,
                args.runs,
                config.label(),
                sample.phase_seconds
            );
            seconds[index].push(sample.phase_seconds);
            alloc_calls.extend(sample.alloc_calls.map(|calls| calls as f64));
            if let (Some(top), Some(truth)) = (sample.top_path_bytes, sample.rss_growth_bytes) {
                growth_errors.push(relative_error(top, truth));
            }
        }
    }
    Ok(Row {
        name: workload.name,
        goal_ratio: workload.goal_ratio,
        medians: configs
            .iter()
            .zip(&mut seconds)
            .map(|(config, samples)| (*config, median(samples)))
            .collect(),
        growth_error: (!growth_errors.is_empty()).then(|| median(&mut growth_errors)),
        alloc_calls: (!alloc_calls.is_empty()).then(|| median(&mut alloc_calls)),
    })
}

/// Runs a workload once under `config` and returns what it measured.
fn run_once(args: &BenchArgs, workload: &Workload, config: Config, run: usize) -> Result<Sample> {
    if let Some(settle_args) = workload.settle_args {
        let mut settle = Command::new(&args.python);
        settle.arg(workload.script).args(settle_args);
        let output = settle
            .output()
            .with_context(|| format!("cannot start {settle:?}"))?;
        check_output(&settle, &output)?;
    }
    let scratch = Path::new(SCRATCH_DIR).join(format!("{}-{run}", workload.id));
    let mut cmd = config_command(args, config, &scratch)?;
    cmd.arg(workload.script).args(workload.args);
    let output = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    check_output(&cmd, &output)?;
    let phase = phase_line(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("{cmd:?} printed no JSON line with `phase_seconds`"))?;
    let top_path_bytes = if config == Config::Memtrace && workload.check_growth {
        Some(top_path_bytes(&scratch)?)
    } else {
        None
    };
    let alloc_calls = if config == Config::Allocations {
        Some(report_alloc_calls(&scratch)?)
    } else {
        None
    };
    if config == Config::Memray {
        // Recordings of millions of allocations are large; nothing reads them.
        fs::remove_file(memray_file(&scratch))
            .with_context(|| format!("cannot remove `{}`", memray_file(&scratch).display()))?;
    }
    Ok(Sample {
        phase_seconds: phase["phase_seconds"].as_f64().unwrap_or_default(),
        rss_growth_bytes: phase["rss_growth_bytes"].as_u64(),
        top_path_bytes,
        alloc_calls,
    })
}

/// The command line of `config` up to the script: the interpreter, or the
/// tracer and its options. `scratch` is where memtrace's reports go (cleared
/// first) or, with `.memray.bin` added, memray's recording.
fn config_command(args: &BenchArgs, config: Config, scratch: &Path) -> Result<Command> {
    let mut cmd = match config {
        Config::Untraced => Command::new(&args.python),
        Config::Memtrace => memtrace_command(args, scratch, &[])?,
        Config::Allocations => memtrace_command(
            args,
            scratch,
            &["--allocations", "--alloc-hooks", "uprobes"],
        )?,
        Config::Sampler => memtrace_command(
            args,
            scratch,
            &["--allocations", "--alloc-hooks", "sampler"],
        )?,
        Config::Tracemalloc => {
            let mut cmd = Command::new(&args.python);
            cmd.args(["-X", "tracemalloc"]);
            cmd
        }
        Config::Memray => {
            fs::create_dir_all(SCRATCH_DIR)
                .with_context(|| format!("cannot create `{SCRATCH_DIR}`"))?;
            let mut cmd = Command::new(&args.python);
            cmd.args(["-m", "memray", "run", "--quiet", "--force", "-o"])
                .arg(memray_file(scratch));
            cmd
        }
    };
    cmd.env_remove("PYTHONTRACEMALLOC");
    Ok(cmd)
}

/// `memtrace run --quiet [mode_args] --output-dir SCRATCH -- python`, with
/// `scratch` cleared first.
fn memtrace_command(args: &BenchArgs, scratch: &Path, mode_args: &[&str]) -> Result<Command> {
    fresh_dir(scratch)?;
    let mut cmd = Command::new(&args.memtrace_bin);
    cmd.args(["run", "--quiet", "--duration", TRACE_DURATION])
        .args(mode_args)
        .arg("--output-dir")
        .arg(scratch)
        .arg("--")
        .arg(&args.python);
    Ok(cmd)
}

/// Where memray writes its recording for the run whose scratch path is `scratch`.
fn memray_file(scratch: &Path) -> PathBuf {
    scratch.with_extension("memray.bin")
}

/// Makes `dir` an empty folder.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot clear `{}`", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))
}

/// Fails with the command and its stderr when it did not exit 0.
fn check_output(cmd: &Command, output: &Output) -> Result<()> {
    if !output.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The last stdout line that is a JSON object with a numeric `phase_seconds`.
fn phase_line(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
        .find(|value| value["phase_seconds"].as_f64().is_some())
}

/// The growth bytes of the largest Python path ([`top_python_path_bytes`])
/// in the JSON report that memtrace wrote into `output_dir` (the first
/// `*.json` file that has a path, by name).
fn top_path_bytes(output_dir: &Path) -> Result<u64> {
    for path in &json_reports(output_dir)? {
        let text = fs::read_to_string(path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        if let Some(bytes) = top_python_path_bytes(&text) {
            return Ok(bytes);
        }
    }
    bail!(
        "no JSON report with a `paths` entry in `{}`",
        output_dir.display()
    )
}

/// `allocations.kernel.calls` (outermost allocator calls the uprobes saw)
/// of the JSON report memtrace wrote into `output_dir`.
fn report_alloc_calls(output_dir: &Path) -> Result<u64> {
    for path in &json_reports(output_dir)? {
        let text = fs::read_to_string(path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("`{}` is not JSON", path.display()))?;
        if let Some(calls) = value["allocations"]["kernel"]["calls"].as_u64() {
            return Ok(calls);
        }
    }
    bail!(
        "no JSON report with `allocations.kernel.calls` in `{}`",
        output_dir.display()
    )
}

/// The `*.json` files of `output_dir`, by name.
fn json_reports(output_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut reports: Vec<PathBuf> = fs::read_dir(output_dir)
        .with_context(|| format!("cannot list `{}`", output_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    reports.sort();
    Ok(reports)
}

/// The largest sum of `bytes.growth_bytes` over the report's `paths` that
/// share their Python frames, as the report's top paths count them (one
/// Python line is one path; the native frames under it, such as the two
/// `memcpy` variants a large `bytes` repeat runs, are its parts). `None`
/// when the report has no path.
fn top_python_path_bytes(report: &str) -> Option<u64> {
    let value: Value = serde_json::from_str(report).ok()?;
    let stacks = value["stacks"].as_array();
    let mut by_python_stack: HashMap<String, f64> = HashMap::new();
    for path in value["paths"].as_array()? {
        let frames = path["stack"]
            .as_u64()
            .and_then(|id| stacks?.get(usize::try_from(id).ok()?))
            .and_then(Value::as_array);
        let python: Vec<&Value> = frames
            .into_iter()
            .flatten()
            .filter(|frame| frame["kind"] == "python")
            .collect();
        let key = format!(
            "{}:{}",
            path["process"],
            Value::from(python.into_iter().cloned().collect::<Vec<_>>())
        );
        // Sampled totals may be written as floats.
        *by_python_stack.entry(key).or_default() += path["bytes"]["growth_bytes"].as_f64()?;
    }
    by_python_stack
        .into_values()
        .max_by(f64::total_cmp)
        .map(|bytes| bytes.round() as u64)
}

/// `(measured - truth) / truth`; 0 when the truth is 0 bytes.
fn relative_error(measured_bytes: u64, truth_bytes: u64) -> f64 {
    if truth_bytes == 0 {
        return 0.0;
    }
    (measured_bytes as f64 - truth_bytes as f64) / truth_bytes as f64
}

/// The median of a non-empty slice (the mean of the middle two for an even length).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Width of the workload column.
const NAME_WIDTH: usize = 24;

/// Width of each configuration column.
const CELL_WIDTH: usize = 15;

/// The table: a legend of the configurations, then one row per workload
/// with each configuration's median and its ratio to the untraced median,
/// memtrace's goal, and the growth check.
fn format_table(configs: &[Config], rows: &[Row]) -> String {
    let mut table = String::from("\nmedian phase seconds; ratio = median / untraced median\n");
    for config in configs {
        let _ = writeln!(table, "  {:<12} {}", config.label(), config.legend());
    }
    let _ = write!(table, "\n{:<NAME_WIDTH$}", "workload");
    for config in configs {
        let _ = write!(table, " {:>CELL_WIDTH$}", config.label());
    }
    let _ = writeln!(table, "  {:<21} top path vs true growth", "memtrace goal");
    for row in rows {
        table.push_str(&format_row(configs, row));
    }
    for row in rows {
        if let Some(line) = per_call_line(row) {
            table.push_str(&line);
        }
    }
    table
}

/// What allocator mode adds per allocator call on `row`'s workload: its
/// median time over untraced, divided by the median outermost allocator
/// calls its uprobes saw (each with the free of its block, probed too);
/// `None` when it did not run.
fn per_call_line(row: &Row) -> Option<String> {
    let calls = row.alloc_calls.filter(|calls| *calls > 0.0)?;
    let added_seconds = row.median(Config::Allocations)? - row.median(Config::Untraced)?;
    Some(format!(
        "allocations on {}: {:.0} ns added per allocator call ({calls:.0} calls per run)\n",
        row.name,
        added_seconds / calls * 1e9
    ))
}

/// One table row, newline-terminated.
fn format_row(configs: &[Config], row: &Row) -> String {
    let baseline = row.median(Config::Untraced);
    let mut line = format!("{:<NAME_WIDTH$}", row.name);
    for config in configs {
        let _ = write!(
            line,
            " {:>CELL_WIDTH$}",
            cell(*config, row.median(*config), baseline)
        );
    }
    let goal = match (
        row.goal_ratio,
        ratio(row.median(Config::Memtrace), baseline),
    ) {
        (Some(goal), Some(ratio)) => format!("<= {goal:.2}x: {}", verdict(ratio <= goal)),
        _ => "-".to_owned(),
    };
    let growth = match row.growth_error {
        Some(error) => format!(
            "{:+.1}% (goal within {:.0}%: {})",
            error * 100.0,
            GOAL_GROWTH_ERROR * 100.0,
            verdict(error.abs() <= GOAL_GROWTH_ERROR)
        ),
        None => "-".to_owned(),
    };
    let _ = writeln!(line, "  {goal:<21} {growth}");
    line
}

/// One configuration's cell: `1.234s`, plus ` 1.05x` for a traced
/// configuration; `-` when the workload did not run under it.
fn cell(config: Config, seconds: Option<f64>, baseline: Option<f64>) -> String {
    match (seconds, ratio(seconds, baseline)) {
        (None, _) => "-".to_owned(),
        (Some(seconds), Some(ratio)) if config != Config::Untraced => {
            format!("{seconds:.3}s {ratio:.2}x")
        }
        (Some(seconds), _) => format!("{seconds:.3}s"),
    }
}

/// `seconds / baseline`, when both are known.
fn ratio(seconds: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    Some(seconds? / baseline?)
}

/// `met` or `MISSED`.
fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

#[cfg(test)]
mod tests;
