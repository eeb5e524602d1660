//! Capture file tests: the real memtrace binary records a real Python
//! script with `--capture`, and `memtrace report FILE` (no root needed)
//! renders the capture: the same report as the live run, and, after
//! memtrace is SIGKILLed mid-trace, everything up to the last flush.
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
    let live_json = file_ending(dir.path(), ".json");
    let live: Value = serde_json::from_str(&std::fs::read_to_string(live_json).unwrap()).unwrap();
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
    assert!(!replayed["diagnosis"].as_array().unwrap().is_empty());
    assert_eq!(
        replayed, live,
        "the replayed capture differs from the live report"
    );
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
