//! `cargo xtask bench`: memtrace's overhead, traced vs untraced, on the
//! benchmark workloads in `tests/scripts/bench_*.py`.
//!
//! Each workload times its own phase (the allocation loop, the 1 GiB growth)
//! and prints it as a JSON line, so interpreter start-up and tracer attach are
//! not counted. Configurations alternate round-robin (untraced, traced,
//! traced, untraced, ...) so slow drift of the VM hits both alike; the table
//! shows medians. For the growth workload the table also compares the
//! bytes of memtrace's top growth path (its JSON report) with the resident
//! growth the workload measured itself. A shorter allocation loop also runs
//! under `memtrace run --allocations` (allocator uprobes) and `python -X
//! tracemalloc`, side by side with untraced and the default mode; its row
//! gives the added time per allocator call (the loop time added by
//! `--allocations` over the outermost allocator calls its uprobes saw, each
//! with the free of its block).

use std::{
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
    /// The Python interpreter that runs the workloads.
    pub python: PathBuf,
}

/// One benchmark workload and the goal its traced/untraced ratio is held to.
struct Workload {
    /// Name in the table.
    name: &'static str,
    /// Script path, relative to the workspace root.
    script: &'static str,
    /// Largest acceptable median traced/untraced phase-time ratio.
    goal_ratio: f64,
    /// Arguments of the timed run.
    args: &'static [&'static str],
    /// Arguments of an untraced run of the same script before each timed
    /// run, if any: growing and freeing ~1.4 GiB makes this VM's page
    /// allocation times repeatable (toolchain.md), and doing it in its own
    /// process keeps that transient growth out of the traced process.
    settle_args: Option<&'static [&'static str]>,
    /// Whether to compare memtrace's top growth path with the true growth.
    check_growth: bool,
    /// Whether to run it under allocator mode and tracemalloc too.
    allocator_peers: bool,
}

/// The workloads, in table order.
const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "alloc loop (5M dicts)",
        script: "tests/scripts/bench_alloc_loop.py",
        goal_ratio: 1.05,
        args: &[],
        settle_args: None,
        check_growth: false,
        allocator_peers: false,
    },
    // The same loop, 10x shorter: allocator uprobes cost microseconds per
    // call, so 5M iterations would take minutes per run.
    Workload {
        name: "alloc loop (500k dicts)",
        script: "tests/scripts/bench_alloc_loop.py",
        goal_ratio: 1.05,
        args: &["--iterations", "500000"],
        settle_args: None,
        check_growth: false,
        allocator_peers: true,
    },
    Workload {
        name: "growth (1 GiB)",
        script: "tests/scripts/bench_grow.py",
        goal_ratio: 1.15,
        args: &["--mib", "1024", "--settle-mib", "0"],
        settle_args: Some(&["--mib", "0", "--settle-mib", "1434", "--hold", "0"]),
        check_growth: true,
        allocator_peers: false,
    },
];

/// Largest acceptable relative error of the top growth path vs the true growth.
const GOAL_GROWTH_ERROR: f64 = 0.25;

/// Upper bound on one traced run, passed as `memtrace run --duration`.
const TRACE_DURATION: &str = "120s";

/// Scratch folder for the traced runs' report files.
const SCRATCH_DIR: &str = "target/bench";

/// How a run is traced.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Config {
    /// Not traced.
    Untraced,
    /// `memtrace run` (default mode).
    Traced,
    /// `memtrace run --allocations`.
    Allocations,
    /// `python -X tracemalloc` (CPython's own allocation tracer).
    Tracemalloc,
}

impl Config {
    fn label(self) -> &'static str {
        match self {
            Self::Untraced => "untraced",
            Self::Traced => "traced",
            Self::Allocations => "allocations",
            Self::Tracemalloc => "tracemalloc",
        }
    }
}

/// What one run of a workload measured.
struct Sample {
    /// The workload's own timing of its phase, in seconds.
    phase_seconds: f64,
    /// The workload's resident growth (`rss_growth_bytes`), if it reports one.
    rss_growth_bytes: Option<u64>,
    /// Bytes of memtrace's first growth path (traced runs that check growth).
    top_path_bytes: Option<u64>,
    /// Outermost allocator calls the uprobes saw (`--allocations` runs).
    alloc_calls: Option<u64>,
}

/// Medians of one workload, one table row.
struct Row {
    untraced_seconds: f64,
    traced_seconds: f64,
    /// Median relative error of the top growth path, when checked.
    growth_error: Option<f64>,
    /// Allocator mode and tracemalloc, for workloads with `allocator_peers`.
    peers: Option<PeerMedians>,
}

/// Medians of the allocator-mode and tracemalloc runs of one workload.
struct PeerMedians {
    allocations_seconds: f64,
    tracemalloc_seconds: f64,
    /// Outermost allocator calls seen per `--allocations` run.
    alloc_calls: f64,
}

/// Runs every workload `args.runs` times per configuration and prints the table.
///
/// # Errors
/// A workload or memtrace fails to start or exits non-zero, prints no
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
        rows.push(bench_workload(args, workload)?);
    }
    print_table(&rows);
    Ok(())
}

/// Runs one workload round-robin and reduces its samples to medians.
fn bench_workload(args: &BenchArgs, workload: &Workload) -> Result<Row> {
    let mut untraced = Vec::new();
    let mut traced = Vec::new();
    let mut allocations = Vec::new();
    let mut tracemalloc = Vec::new();
    let mut alloc_calls = Vec::new();
    let mut growth_errors = Vec::new();
    let mut configs = vec![Config::Untraced, Config::Traced];
    if workload.allocator_peers {
        configs.extend([Config::Allocations, Config::Tracemalloc]);
    }
    for run in 0..args.runs {
        // Rotate which configuration goes first, so none always runs on a
        // VM warmed by another.
        let mut order = configs.clone();
        order.rotate_left(run % configs.len());
        for config in order {
            let sample = run_once(args, workload, config, run)?;
            eprintln!(
                "bench: {} run {}/{} {}: {:.3} s",
                workload.name,
                run + 1,
                args.runs,
                config.label(),
                sample.phase_seconds
            );
            match config {
                Config::Untraced => untraced.push(sample.phase_seconds),
                Config::Traced => {
                    traced.push(sample.phase_seconds);
                    if let (Some(top), Some(truth)) =
                        (sample.top_path_bytes, sample.rss_growth_bytes)
                    {
                        growth_errors.push(relative_error(top, truth));
                    }
                }
                Config::Allocations => {
                    allocations.push(sample.phase_seconds);
                    alloc_calls.extend(sample.alloc_calls.map(|c| c as f64));
                }
                Config::Tracemalloc => tracemalloc.push(sample.phase_seconds),
            }
        }
    }
    let peers = workload.allocator_peers.then(|| PeerMedians {
        allocations_seconds: median(&mut allocations),
        tracemalloc_seconds: median(&mut tracemalloc),
        alloc_calls: if alloc_calls.is_empty() {
            0.0
        } else {
            median(&mut alloc_calls)
        },
    });
    Ok(Row {
        untraced_seconds: median(&mut untraced),
        traced_seconds: median(&mut traced),
        growth_error: (!growth_errors.is_empty()).then(|| median(&mut growth_errors)),
        peers,
    })
}

/// Runs a workload once, traced or not, and returns what it measured.
fn run_once(args: &BenchArgs, workload: &Workload, config: Config, run: usize) -> Result<Sample> {
    if let Some(settle_args) = workload.settle_args {
        let mut settle = Command::new(&args.python);
        settle.arg(workload.script).args(settle_args);
        let output = settle
            .output()
            .with_context(|| format!("cannot start {settle:?}"))?;
        check_output(&settle, &output)?;
    }
    let output_dir = Path::new(SCRATCH_DIR).join(format!("{}-{run}", file_stem(workload.script)));
    let mut cmd = match config {
        Config::Untraced => Command::new(&args.python),
        Config::Tracemalloc => {
            let mut cmd = Command::new(&args.python);
            cmd.args(["-X", "tracemalloc"]);
            cmd
        }
        Config::Traced | Config::Allocations => {
            if output_dir.exists() {
                fs::remove_dir_all(&output_dir)
                    .with_context(|| format!("cannot clear `{}`", output_dir.display()))?;
            }
            fs::create_dir_all(&output_dir)
                .with_context(|| format!("cannot create `{}`", output_dir.display()))?;
            let mut cmd = Command::new(&args.memtrace_bin);
            cmd.args([
                "run",
                "--quiet",
                "--duration",
                TRACE_DURATION,
                "--output-dir",
            ])
            .arg(&output_dir);
            if config == Config::Allocations {
                cmd.arg("--allocations");
            }
            cmd.arg("--").arg(&args.python);
            cmd
        }
    };
    cmd.arg(workload.script).args(workload.args);
    let output = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    check_output(&cmd, &output)?;
    let phase = phase_line(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("{cmd:?} printed no JSON line with `phase_seconds`"))?;
    let top_path_bytes = if config == Config::Traced && workload.check_growth {
        Some(top_path_bytes(&output_dir)?)
    } else {
        None
    };
    let alloc_calls = if config == Config::Allocations {
        Some(report_alloc_calls(&output_dir)?)
    } else {
        None
    };
    Ok(Sample {
        phase_seconds: phase["phase_seconds"].as_f64().unwrap_or_default(),
        rss_growth_bytes: phase["rss_growth_bytes"].as_u64(),
        top_path_bytes,
        alloc_calls,
    })
}

/// `allocations.kernel.calls` of the JSON report in `output_dir`.
fn report_alloc_calls(output_dir: &Path) -> Result<u64> {
    for path in json_reports(output_dir)? {
        let text = fs::read_to_string(&path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        if let Some(calls) = alloc_calls_of(&text) {
            return Ok(calls);
        }
    }
    bail!(
        "no JSON report with an `allocations` section in `{}`",
        output_dir.display()
    )
}

/// `allocations.kernel.calls` of a JSON report, if present.
fn alloc_calls_of(report: &str) -> Option<u64> {
    let value: Value = serde_json::from_str(report).ok()?;
    value["allocations"]["kernel"]["calls"].as_u64()
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

/// `bytes.growth_bytes` of the first entry of `paths` (largest growth first) in the JSON report
/// that memtrace wrote into `output_dir` (the first `*.json` file that has
/// such an entry, by name).
fn top_path_bytes(output_dir: &Path) -> Result<u64> {
    for path in &json_reports(output_dir)? {
        let text = fs::read_to_string(path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        if let Some(bytes) = first_growth_path_bytes(&text) {
            return Ok(bytes);
        }
    }
    bail!(
        "no JSON report with a `paths` entry in `{}`",
        output_dir.display()
    )
}

/// `paths[0].bytes.growth_bytes` of a JSON report, if present.
fn first_growth_path_bytes(report: &str) -> Option<u64> {
    let value: Value = serde_json::from_str(report).ok()?;
    let bytes = &value["paths"][0]["bytes"]["growth_bytes"];
    // Sampled totals may be written as floats; round them.
    bytes
        .as_u64()
        .or_else(|| bytes.as_f64().map(|b| b.round() as u64))
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

/// The script's file name without `.py`, for scratch folder names.
fn file_stem(script: &str) -> &str {
    Path::new(script)
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or(script)
}

/// Prints one row per workload: medians, ratio, goal, and the growth check.
fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<24} {:>11} {:>9} {:>7}  {:<16} top path vs true growth",
        "workload", "untraced s", "traced s", "ratio", "goal"
    );
    for (workload, row) in WORKLOADS.iter().zip(rows) {
        let ratio = row.traced_seconds / row.untraced_seconds;
        let ratio_verdict = verdict(ratio <= workload.goal_ratio);
        let growth = match row.growth_error {
            Some(error) => format!(
                "{:+.1}% (goal within {:.0}%: {})",
                error * 100.0,
                GOAL_GROWTH_ERROR * 100.0,
                verdict(error.abs() <= GOAL_GROWTH_ERROR)
            ),
            None => "-".to_owned(),
        };
        println!(
            "{:<24} {:>11.3} {:>9.3} {:>6.2}x  {:<16} {growth}",
            workload.name,
            row.untraced_seconds,
            row.traced_seconds,
            ratio,
            format!("<= {:.2}x: {ratio_verdict}", workload.goal_ratio),
        );
    }
    for (workload, row) in WORKLOADS.iter().zip(rows) {
        if let Some(peers) = &row.peers {
            print_peers(workload.name, row.untraced_seconds, peers);
        }
    }
}

/// Prints allocator mode and tracemalloc against untraced for one workload,
/// and the time allocator mode adds per allocator call.
fn print_peers(name: &str, untraced_seconds: f64, peers: &PeerMedians) {
    println!();
    println!("{name}: allocation tracers (medians)");
    for (label, seconds) in [
        ("memtrace --allocations", peers.allocations_seconds),
        ("python -X tracemalloc", peers.tracemalloc_seconds),
    ] {
        println!(
            "  {label:<24} {seconds:>9.3} s {:>7.2}x",
            seconds / untraced_seconds
        );
    }
    if peers.alloc_calls > 0.0 {
        let added_ns = (peers.allocations_seconds - untraced_seconds) * 1e9 / peers.alloc_calls;
        println!(
            "  --allocations: {:.0} outermost allocator calls seen per run (the whole process),              {added_ns:.0} ns added per call with the free of its block",
            peers.alloc_calls
        );
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lengths() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn phase_line_takes_the_last_json_object_with_phase_seconds() {
        let stdout = "memtrace: tracing\n{\"event\": \"timed\", \"phase_seconds\": 0.5}\nnot json\n{\"event\": \"exit\"}\n";
        let line = phase_line(stdout).expect("phase line");
        assert_eq!(line["phase_seconds"].as_f64(), Some(0.5));
        assert!(phase_line("{\"event\": \"exit\"}").is_none());
    }

    #[test]
    fn first_growth_path_bytes_reads_integers_and_floats() {
        let report =
            r#"{"paths": [{"bytes": {"growth_bytes": 1048576}}, {"bytes": {"growth_bytes": 1}}]}"#;
        assert_eq!(first_growth_path_bytes(report), Some(1_048_576));
        let sampled = r#"{"paths": [{"bytes": {"growth_bytes": 2047.6}}]}"#;
        assert_eq!(first_growth_path_bytes(sampled), Some(2048));
        assert_eq!(first_growth_path_bytes(r#"{"paths": []}"#), None);
    }

    #[test]
    fn alloc_calls_are_read_from_the_allocations_section() {
        let report = r#"{"allocations": {"kernel": {"calls": 1234, "live_full": 0}}}"#;
        assert_eq!(alloc_calls_of(report), Some(1234));
        assert_eq!(alloc_calls_of(r#"{"paths": []}"#), None);
    }

    #[test]
    fn relative_error_is_signed() {
        assert!((relative_error(1_250, 1_000) - 0.25).abs() < 1e-12);
        assert!((relative_error(750, 1_000) + 0.25).abs() < 1e-12);
        assert_eq!(relative_error(5, 0), 0.0);
    }
}
