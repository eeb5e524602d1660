//! Integration tests of the diagnosis: the real memtrace binary records real
//! Python workloads (tests/scripts/prefork_one_leaks.py and
//! tests/scripts/pattern_*.py) and the JSON report's `diagnosis` must name
//! the pattern, the process and the function.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/scripts")
        .join(name)
}

/// Why these tests cannot run here, if they cannot.
fn unavailable(python: &Path) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: loading eBPF programs needs CAP_BPF and CAP_PERFMON".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    if !python.exists() {
        return Some(format!(
            "interpreter `{}` is not installed",
            python.display()
        ));
    }
    None
}

/// pyenv's CPython 3.11.
fn python() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".pyenv/versions/3.11.7/bin/python3.11")
}

/// A finished trace: the workload's JSON lines and memtrace's JSON report.
struct Trace {
    stdout: String,
    report: Value,
}

impl Trace {
    /// The JSON line the workload printed for `event`.
    fn event(&self, event: &str) -> Value {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .find(|v| v["event"] == event)
            .unwrap_or_else(|| panic!("workload printed no `{event}` line:\n{}", self.stdout))
    }

    fn diagnosis(&self) -> &Vec<Value> {
        self.report["diagnosis"]
            .as_array()
            .expect("the report has a diagnosis")
    }

    /// The first finding of `pattern`, with the whole diagnosis in the
    /// failure message.
    fn finding(&self, pattern: &str) -> &Value {
        self.diagnosis()
            .iter()
            .find(|f| f["pattern"] == pattern)
            .unwrap_or_else(|| panic!("no `{pattern}` finding: {:#}", self.report["diagnosis"]))
    }

    /// Whether one of `finding`'s paths runs through Python `function`.
    fn names_function(&self, finding: &Value, function: &str) -> bool {
        finding["paths"]
            .as_array()
            .expect("finding has paths")
            .iter()
            .filter_map(Value::as_u64)
            .any(|id| {
                self.report["stacks"][id as usize]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|frame| frame["function"] == function)
            })
    }
}

/// Runs `memtrace run --quiet --output-dir TMP -- python SCRIPT ARGS`,
/// expecting success, and reads its JSON report; `None` (after printing why)
/// when the test cannot run here.
fn trace(script_name: &str, args: &[&str]) -> Option<Trace> {
    let python = python();
    if let Some(why) = unavailable(&python) {
        println!("skipping: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_memtrace"))
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir.path())
        .arg("--")
        .arg(&python)
        .arg(script(script_name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "memtrace failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("memtrace wrote a JSON report");
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    Some(Trace { stdout, report })
}

#[test]
fn diagnoses_one_leaking_worker() {
    let Some(trace) = trace(
        "prefork_one_leaks.py",
        &["--workers", "3", "--mib", "128", "--seconds", "6"],
    ) else {
        return;
    };
    let leaker = trace.event("forked")["leaker_pid"].as_u64().unwrap();
    let finding = trace.finding("one_process_grows");
    assert_eq!(
        finding["scope"]["tgid"].as_u64(),
        Some(leaker),
        "{finding:#}"
    );
    assert_eq!(finding["strength"], "strong", "{finding:#}");
    assert!(
        trace.names_function(finding, "leak_in_worker"),
        "{finding:#}"
    );
    let growers = trace
        .diagnosis()
        .iter()
        .filter(|f| f["pattern"] == "one_process_grows")
        .count();
    assert_eq!(growers, 1, "{:#}", trace.report["diagnosis"]);
}

#[test]
fn diagnoses_worker_multiplication_with_copy_on_write() {
    let Some(trace) = trace(
        "pattern_prefork_cow.py",
        &["--workers", "3", "--table-mib", "56", "--own-mib", "16"],
    ) else {
        return;
    };
    let finding = trace.finding("worker_multiplication");
    assert_eq!(finding["scope"]["scope"], "tree", "{finding:#}");
    assert_eq!(finding["strength"], "strong", "{finding:#}");
    assert!(
        finding["summary"]
            .as_str()
            .unwrap()
            .contains("over 3 forks"),
        "{finding:#}"
    );
    assert!(trace.names_function(finding, "walk_table"), "{finding:#}");
    assert!(
        trace.names_function(finding, "handle_requests"),
        "{finding:#}"
    );
    assert_eq!(
        trace.diagnosis()[0]["pattern"],
        "worker_multiplication",
        "{:#}",
        trace.report["diagnosis"]
    );
}

#[test]
fn diagnoses_a_released_spike() {
    let Some(trace) = trace("pattern_spike.py", &["--mib", "120"]) else {
        return;
    };
    let pid = trace.event("spike")["pid"].as_u64().unwrap();
    let finding = trace.finding("spike");
    assert_eq!(finding["scope"]["tgid"].as_u64(), Some(pid), "{finding:#}");
    assert_eq!(finding["strength"], "strong", "{finding:#}");
    assert!(
        trace.names_function(finding, "build_payload"),
        "{finding:#}"
    );
    assert!(
        trace
            .diagnosis()
            .iter()
            .all(|f| f["pattern"] != "retention" || f["strength"] == "weak"),
        "a released spike is not retention: {:#}",
        trace.report["diagnosis"]
    );
}

#[test]
fn diagnoses_a_cache_retained_after_traffic() {
    let Some(trace) = trace(
        "pattern_cache_retention.py",
        &[
            "--traffic-seconds",
            "4",
            "--mib-per-second",
            "25",
            "--idle-seconds",
            "3",
        ],
    ) else {
        return;
    };
    let pid = trace.event("idle")["pid"].as_u64().unwrap();
    let finding = trace.finding("retention");
    assert_eq!(finding["scope"]["tgid"].as_u64(), Some(pid), "{finding:#}");
    assert_eq!(finding["strength"], "strong", "{finding:#}");
    assert!(trace.names_function(finding, "remember"), "{finding:#}");
    assert_eq!(
        trace.diagnosis()[0]["pattern"],
        "retention",
        "{:#}",
        trace.report["diagnosis"]
    );
}
