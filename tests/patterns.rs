//! Integration tests of the diagnosis: the real memtrace binary records real
//! Python workloads (tests/scripts/prefork_one_leaks.py,
//! tests/scripts/pattern_*.py and the bundled demo service,
//! examples/prefork_service) and the JSON report's `diagnosis` and
//! `causes` must name the pattern, the processes and the function, and the
//! terminal must end with a verdict that fits one screen.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

#[expect(
    dead_code,
    reason = "patterns.rs reads only the diagnosis and stacks of `common::Trace`"
)]
mod common;

use std::path::Path;

use serde_json::Value;

use common::{python_3_11, require_ebpf, stack_functions, trace, trace_script, Trace};

/// Readers of the diagnosis for these tests' assertions.
impl Trace {
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
                stack_functions(&self.report, id)
                    .iter()
                    .any(|f| f == function)
            })
    }
}

#[test]
fn diagnoses_one_leaking_worker() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "prefork_one_leaks.py",
        &["--workers", "3", "--mib", "128", "--seconds", "6"],
    );
    let leaker = trace.workload_event("forked")["leaker_pid"]
        .as_u64()
        .unwrap();
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
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "pattern_prefork_cow.py",
        &["--workers", "3", "--table-mib", "56", "--own-mib", "16"],
    );
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
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(&python, "pattern_spike.py", &["--mib", "120"]);
    let pid = trace.workload_event("spike")["pid"].as_u64().unwrap();
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

/// Debian's 3.14/3.15: a cache of 160 MiB held until the process exits is
/// retention held by `fill_cache`, not a spike released by the
/// interpreter's teardown (the exit begins before finalization frees it).
fn check_held_until_exit(minor: &str) {
    let python = require_ebpf!(common::debian_python(minor));
    let trace = trace_script(&python, "grow_cache.py", &["--mib", "160", "--hold", "2"]);
    let finding = trace.finding("retention");
    assert!(trace.names_function(finding, "fill_cache"), "{finding:#}");
    assert!(
        trace.diagnosis().iter().all(|f| f["pattern"] != "spike"),
        "held until exit is no spike: {:#}",
        trace.report["diagnosis"]
    );
}

#[test]
fn a_cache_held_until_exit_is_retention_on_debian_3_14() {
    check_held_until_exit("3.14");
}

#[test]
fn a_cache_held_until_exit_is_retention_on_debian_3_15() {
    check_held_until_exit("3.15");
}

#[test]
fn diagnoses_a_cache_retained_after_traffic() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "pattern_cache_retention.py",
        &[
            "--traffic-seconds",
            "4",
            "--mib-per-second",
            "25",
            "--idle-seconds",
            "3",
        ],
    );
    let pid = trace.workload_event("idle")["pid"].as_u64().unwrap();
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

#[test]
fn names_native_memory_a_library_allocated_under_the_python_function() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(&python, "pattern_native_cache.py", &["--mib", "80"]);
    let filled = trace.workload_event("filled");
    let grown =
        filled["rss_after_bytes"].as_u64().unwrap() - filled["rss_before_bytes"].as_u64().unwrap();
    let causes = &trace.report["causes"];
    let place = &causes[0]["places"][0];
    assert_eq!(place["frame"]["function"], "fill_page_cache", "{causes:#}");
    assert!(
        place["native_library"]
            .as_str()
            .is_some_and(|l| l.starts_with("libsqlite3")),
        "{causes:#}"
    );
    // Sampled bytes (every 512 KiB on average): within 25% of the
    // workload's own RSS growth.
    let held = place["bytes"].as_u64().unwrap() as f64;
    assert!(
        (held - grown as f64).abs() <= 0.25 * grown as f64,
        "held {held} vs grown {grown}: {causes:#}"
    );
    assert!(
        trace
            .stdout()
            .contains("fill_page_cache (pattern_native_cache.py:"),
        "{}",
        trace.stdout()
    );
    assert!(
        trace.stdout().contains("native memory (libsqlite3)"),
        "{}",
        trace.stdout()
    );
}

#[test]
fn a_launch_shims_shells_are_helpers_not_workers() {
    // The shim runs pyenv's global version (3.11.7 here).
    let _python = require_ebpf!(python_3_11());
    let shim = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_default()
        .join(".pyenv/shims/python3");
    if !shim.exists() {
        common::skip(&format!("no pyenv shim at {}", shim.display()));
        return;
    }
    let trace = trace_script(
        &shim,
        "prefork_one_leaks.py",
        &["--workers", "3", "--mib", "96", "--seconds", "5"],
    );
    let leaker = trace.workload_event("forked")["leaker_pid"]
        .as_u64()
        .unwrap();
    let kinds: Vec<(&str, u64)> = trace
        .processes()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["tgid"].as_u64().unwrap()))
        .collect();
    let workers: Vec<u64> = kinds
        .iter()
        .filter(|k| k.0 == "worker")
        .map(|k| k.1)
        .collect();
    assert_eq!(
        workers.len(),
        3,
        "only the 3 forked Python workers: {kinds:?}"
    );
    assert!(workers.contains(&leaker), "{kinds:?}");
    assert!(
        kinds.iter().filter(|k| k.0 == "helper").count() >= 5,
        "the shim's bash processes are helpers: {kinds:?}"
    );
    let finding = trace.finding("one_process_grows");
    assert_eq!(
        finding["scope"]["tgid"].as_u64(),
        Some(leaker),
        "{finding:#}"
    );
    assert!(
        finding["summary"]
            .as_str()
            .unwrap()
            .contains("while its 2 sibling(s) stayed flat"),
        "{finding:#}"
    );
}

/// Most lines of the terminal verdict (`report::verdict::MAX_VERDICT_LINES`).
const MAX_VERDICT_LINES: usize = 29;

#[test]
fn the_demo_ends_with_one_cause_naming_render_report_in_every_worker() {
    let python = require_ebpf!(python_3_11());
    check_demo(&python);
}

/// The demo on Debian's 3.14 and 3.15 (`cargo xtask demo` with
/// `MEMTRACE_DEMO_PYTHON`) ends with the verdict it has on 3.11.
#[test]
fn the_demo_on_debian_3_14_and_3_15_has_the_verdict_of_3_11() {
    for minor in ["3.14", "3.15"] {
        let python = require_ebpf!(common::debian_python(minor));
        check_demo(&python);
    }
}

/// Traces the demo on `python` for 10 s of load: one strong cause first,
/// about every worker, at `render_report`, in a verdict that fits a screen.
fn check_demo(python: &Path) {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("examples/prefork_service/run_demo.py");
    let debug_dir = common::debug_dir_of(python);
    let mut args = vec!["run"];
    if let Some(dir) = &debug_dir {
        args.extend(["--debug-dir", dir.to_str().unwrap()]);
    }
    args.extend([
        "--",
        python.to_str().unwrap(),
        demo.to_str().unwrap(),
        "--seconds",
        "10",
    ]);
    let trace = trace(&args);
    let started = trace.workload_events("started");
    let master = started
        .iter()
        .find(|e| e["role"] == "master")
        .unwrap_or_else(|| panic!("no master line: {started:#?}"));
    let mut workers: Vec<u64> = master["workers"]
        .as_object()
        .expect("workers by index")
        .values()
        .filter_map(Value::as_u64)
        .collect();
    workers.sort_unstable();
    assert_eq!(workers.len(), 4);
    let all_causes = &trace.report["causes"];
    let causes = all_causes.as_array().expect("causes");
    assert!(
        (1..=3).contains(&causes.len()),
        "at most 3 causes: {all_causes:#}"
    );
    let first = &causes[0];
    assert_eq!(first["strength"], "strong", "{all_causes:#}");
    let mut tgids: Vec<u64> = first["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|id| trace.processes().iter().find(|p| p["id"] == *id)?["tgid"].as_u64())
        .collect();
    tgids.sort_unstable();
    assert_eq!(
        tgids, workers,
        "the first cause is about every worker: {first:#}"
    );
    assert_eq!(
        first["places"][0]["frame"]["function"], "render_report",
        "{first:#}"
    );
    let stdout = trace.stdout();
    let verdict = &stdout[stdout.rfind("\nVerdict: ").expect("a verdict") + 1..];
    let lines: Vec<&str> = verdict.lines().collect();
    assert!(lines.len() <= MAX_VERDICT_LINES, "{verdict}");
    assert!(
        lines[1].contains("in 4 workers (tgid ")
            && verdict.contains("where:    render_report (app.py:"),
        "{verdict}"
    );
}

#[test]
fn a_parser_fed_four_payloads_gets_one_pattern_on_every_run() {
    let python = require_ebpf!(python_3_11());
    // Scheduling noise decides which payload peaks highest and how much the
    // allocator keeps between them; the pattern must not follow it.
    let patterns: Vec<String> = (0..5)
        .map(|_| {
            let trace = trace_script(
                &python,
                "parse_payloads.py",
                &["--payloads", "4", "--mib", "20", "--gap", "0.8"],
            );
            let first = &trace.report["causes"][0];
            assert!(
                trace.names_function(trace.finding("spike"), "parse_payload"),
                "{first:#}"
            );
            first["pattern"].as_str().unwrap_or("?").to_owned()
        })
        .collect();
    assert!(
        patterns.iter().all(|p| p == "spike"),
        "one pattern over 5 runs: {patterns:?}"
    );
}
