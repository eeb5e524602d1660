//! Capture file tests: the real memtrace binary records a real Python
//! script with `--capture`, and `memtrace report FILE` (no root needed)
//! renders the capture: the same report as the live run (held bytes, exit
//! status and an exec's earlier image included), and, after memtrace is
//! SIGKILLed mid-trace, everything up to the last flush.
//!
//! Recording needs root (CAP_BPF + CAP_PERFMON) and a kernel with BTF:
//! without them those tests print why they skip.

#[expect(
    dead_code,
    reason = "capture.rs records and replays captures itself: it runs no `common::trace` and reads no workload events"
)]
mod common;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use common::{assert_success, interpreter, memtrace, pyenv, require_ebpf, script, stack_functions};

/// A supported interpreter, or `None` after printing why the test skips.
fn python() -> Option<PathBuf> {
    interpreter(&[
        pyenv("3.12.1", "python3.12"),
        PathBuf::from("/usr/bin/python3.11"),
    ])
}

/// `memtrace run --quiet [OPTIONS] --output-dir DIR --capture CAPTURE --
/// PYTHON grow_cache.py --mib 64 --hold HOLD_S`, not yet started.
fn record_grow_cache(
    options: &[&str],
    dir: &Path,
    capture: &Path,
    python: &Path,
    hold_s: &str,
) -> Command {
    let mut command = memtrace();
    command
        .args(["run", "--quiet"])
        .args(options)
        .arg("--output-dir")
        .arg(dir)
        .arg("--capture")
        .arg(capture)
        .arg("--")
        .arg(python)
        .arg(script("grow_cache.py"))
        .args(["--mib", "64", "--hold", hold_s])
        .stdin(Stdio::null());
    command
}

/// `memtrace report FILE --format json`, expecting success: the report and
/// memtrace's standard error.
fn report_json(capture: &Path) -> (Value, String) {
    let output = memtrace()
        .arg("report")
        .arg(capture)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_success(&output, "memtrace report");
    let report = serde_json::from_slice(&output.stdout).expect("report --format json is JSON");
    (report, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Python function names of every path of `report` with resident growth.
fn growth_functions(report: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for path in report["paths"].as_array().expect("report has paths") {
        if path["bytes"]["growth_bytes"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let stack = path["stack"].as_u64().expect("path has a stack id");
        names.extend(stack_functions(report, stack));
    }
    names
}

/// The paths of `report` whose stack has a Python frame `function`.
fn paths_through<'a>(report: &'a Value, function: &str) -> Vec<&'a Value> {
    report["paths"]
        .as_array()
        .expect("report has paths")
        .iter()
        .filter(|path| {
            let stack = path["stack"].as_u64().expect("path has a stack id");
            stack_functions(report, stack).iter().any(|f| f == function)
        })
        .collect()
}

/// `field` of `bytes` summed over `paths` (0 where absent).
fn sum(paths: &[&Value], field: &str) -> i64 {
    paths
        .iter()
        .map(|p| p["bytes"][field].as_i64().unwrap_or(0))
        .sum()
}

/// memtrace's JSON report written into `dir` by a run.
fn live_report(dir: &Path) -> Value {
    let json = file_ending(dir, ".json");
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// The only file in `dir` ending in `suffix`.
fn file_ending(dir: &Path, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    assert_eq!(found.len(), 1, "files ending in {suffix}: {found:?}");
    found[0].clone()
}

#[test]
fn the_report_of_a_capture_is_the_report_of_the_live_run() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("grow.capture");
    let output = record_grow_cache(
        &["--format", "flamegraph"],
        dir.path(),
        &capture,
        &python,
        "1.5",
    )
    .output()
    .unwrap();
    assert_success(&output, "memtrace run --capture");
    let live = live_report(dir.path());
    let svg = std::fs::read_to_string(file_ending(dir.path(), ".svg")).unwrap();
    assert!(
        svg.contains("fill_cache"),
        "the flame graph names fill_cache"
    );
    let (replayed, stderr) = report_json(&capture);
    assert!(
        stderr.is_empty(),
        "warnings for a complete capture: {stderr}"
    );
    assert!(
        growth_functions(&replayed)
            .iter()
            .any(|f| f == "fill_cache"),
        "no growth path through fill_cache: {:?}",
        growth_functions(&replayed)
    );
    // The cache is kept until the interpreter finalizes: what fill_cache
    // grew, it still held at the end and at the high-water mark.
    let fill = paths_through(&replayed, "fill_cache");
    let (grown, held) = (sum(&fill, "growth_bytes"), sum(&fill, "held_bytes"));
    assert!(
        held * 2 > grown,
        "fill_cache grew {grown} bytes but held {held}"
    );
    let at_peak: u64 = fill
        .iter()
        .filter_map(|p| p["peak_held_bytes"].as_u64())
        .sum();
    assert!(
        at_peak > 0,
        "fill_cache held nothing at the high-water mark"
    );
    let root = &replayed["processes"][0];
    assert_eq!(root["exit_status"]["how"], "code", "{root}");
    assert_eq!(root["exit_status"]["code"], 0, "{root}");
    assert!(root["exit_began_ns"].is_u64(), "{root}");
    assert!(!replayed["diagnosis"].as_array().unwrap().is_empty());
    assert_eq!(
        replayed, live,
        "the replayed capture differs from the live report"
    );
}

#[test]
fn an_exec_replays_with_the_image_before_it() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("exec.capture");
    let output = memtrace()
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir.path())
        .arg("--capture")
        .arg(&capture)
        .arg("--")
        .arg(&python)
        .arg(script("grow_then_exec.py"))
        .args([
            "--mib",
            "40",
            "--sleep-seconds",
            "0.5",
            "--start-delay",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_success(&output, "memtrace run --capture");
    let live = live_report(dir.path());
    let (replayed, stderr) = report_json(&capture);
    assert!(
        stderr.is_empty(),
        "warnings for a complete capture: {stderr}"
    );
    assert_eq!(
        replayed, live,
        "the replayed capture differs from the live report"
    );
    // One process, two images: Python, then sleep.
    let mut images: Vec<&Value> = replayed["processes"].as_array().unwrap().iter().collect();
    images.sort_by_key(|p| p["image"].as_u64());
    assert_eq!(images.len(), 2, "{images:#?}");
    assert_eq!(images[0]["tgid"], images[1]["tgid"]);
    assert_eq!(images[0]["next_image"], images[1]["id"]);
    assert!(images[0]["exec_ns"].is_u64(), "{:#}", images[0]);
    let sleep = images[1]["cmdline"].as_str().unwrap();
    assert!(sleep.starts_with("sleep"), "{sleep}");
    // The Python phase keeps its growth and its path.
    let grown = paths_through(&replayed, "grow_before_exec");
    assert!(!grown.is_empty(), "no path through grow_before_exec");
    assert!(grown.iter().all(|p| p["process"] == images[0]["id"]));
    assert!(sum(&grown, "growth_bytes") > 20 * 1024 * 1024, "{grown:#?}");
}

#[test]
fn a_capture_cut_by_sigkill_still_reports_what_was_flushed() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("killed.capture");
    let mut tracer = record_grow_cache(&[], dir.path(), &capture, &python, "30")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The workload's JSON lines come through memtrace's standard output.
    let mut workload_pid = None;
    let mut grown = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in BufReader::new(tracer.stdout.take().unwrap()).lines() {
        let Ok(event) = serde_json::from_str::<Value>(&line.unwrap()) else {
            continue;
        };
        workload_pid = workload_pid.or(event["pid"].as_i64());
        if event["event"] == "grown" {
            grown = true;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workload did not grow in time"
        );
    }
    assert!(grown, "the workload exited before growing");
    // Past at least one flush (every second), then killed without warning.
    std::thread::sleep(Duration::from_millis(2_500));
    tracer.kill().unwrap();
    tracer.wait().unwrap();
    if let Some(pid) = workload_pid {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let (report, stderr) = report_json(&capture);
    assert!(stderr.contains("no end"), "no cut-off warning: {stderr}");
    // The verdict says it too, with what it means for the figures.
    let covered_ns = report["meta"]["cut_after_ns"]
        .as_u64()
        .expect("the JSON says the capture was cut");
    assert!(covered_ns > 0, "{covered_ns}");
    let output = memtrace().arg("report").arg(&capture).output().unwrap();
    assert_success(&output, "memtrace report");
    let table = String::from_utf8_lossy(&output.stdout);
    let verdict = &table[table.rfind("\nVerdict: ").expect("a verdict")..];
    let said = verdict
        .lines()
        .find(|l| l.trim_start().starts_with("capture cut after "))
        .unwrap_or_else(|| panic!("the verdict does not say the capture was cut:\n{verdict}"));
    assert!(
        said.contains(&format!("{:.1} s", covered_ns as f64 / 1e9))
            && said.contains("show as alive"),
        "{said}"
    );
    assert!(
        growth_functions(&report).iter().any(|f| f == "fill_cache"),
        "no growth path through fill_cache: {:?}",
        growth_functions(&report)
    );
}

#[test]
fn report_of_a_file_that_is_not_a_capture_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "this is not a capture\n").unwrap();
    let output = memtrace().arg("report").arg(&path).output().unwrap();
    assert!(!output.status.success(), "report of a text file succeeded");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("notes.txt") && stderr.contains("is not a memtrace capture file"),
        "unclear error: {stderr}"
    );
}
