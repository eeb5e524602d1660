//! Integration tests of the program's own shutdown (diagnose/teardown.rs):
//! the real memtrace binary records real Python programs that release their
//! memory in their own shutdown path right before exiting, and the verdict
//! must judge their active life (a steady pile-up is retention, a pool that
//! kept its buffers is not a spike) and say the release as a shutdown, with
//! one set of numbers (diagnose/amount.rs) checked against /proc as the
//! workload read it.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

#[expect(
    dead_code,
    reason = "shutdown.rs reads only the causes and diagnosis of `common::Trace`"
)]
mod common;

use serde_json::Value;

use common::{python_3_11, require_ebpf, trace_script, Trace};

/// The first cause, with every cause in the failure message.
fn first_cause(trace: &Trace) -> &Value {
    let causes = &trace.report["causes"];
    causes
        .get(0)
        .unwrap_or_else(|| panic!("no cause: {causes:#}"))
}

/// The headline of a cause: its first finding's summary.
fn headline<'a>(trace: &'a Trace, cause: &Value) -> &'a str {
    let first = cause["findings"][0].as_u64().expect("a first finding") as usize;
    trace.findings()[first]["summary"].as_str().unwrap()
}

/// No finding of `trace` is of `pattern`.
fn assert_no_pattern(trace: &Trace, pattern: &str) {
    assert!(
        trace.findings().iter().all(|f| f["pattern"] != pattern),
        "no {pattern} expected: {:#}",
        trace.report["diagnosis"]
    );
}

/// The cause's one amount for its only process, in bytes.
fn amount_bytes(cause: &Value) -> (f64, f64) {
    let each = &cause["amount"]["each"][0];
    (
        each["bytes"].as_f64().unwrap(),
        each["released_at_shutdown_bytes"].as_f64().unwrap(),
    )
}

#[test]
fn pending_work_cleared_at_shutdown_is_a_steady_leak_not_unmatched_growth() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "shutdown_pending_work.py",
        &["--mib", "280", "--seconds", "6"],
    );
    let piled = trace.workload_event("piled");
    let grown =
        piled["rss_peak_bytes"].as_f64().unwrap() - piled["rss_before_bytes"].as_f64().unwrap();
    assert_no_pattern(&trace, "unmatched_growth");
    assert_no_pattern(&trace, "spike");
    let cause = first_cause(&trace);
    assert_eq!(cause["pattern"], "retention", "{cause:#}");
    let summary = headline(&trace, cause);
    assert!(summary.contains("while shutting down"), "{summary}");
    let (bytes, released) = amount_bytes(cause);
    assert!(
        (bytes - grown).abs() <= 0.15 * grown,
        "how much {bytes} vs the workload's peak growth {grown}: {cause:#}"
    );
    assert!(
        released >= 0.8 * grown,
        "released {released} of {grown}: {cause:#}"
    );
    let stdout = trace.stdout();
    assert!(stdout.contains("while shutting down"), "{stdout}");
    assert!(
        stdout.contains("where:    Service.submit"),
        "the verdict names the queueing code: {stdout}"
    );
}

#[test]
fn a_thread_pool_holding_buffers_until_shutdown_is_not_a_spike() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "shutdown_thread_pool.py",
        &["--threads", "4", "--mib", "280", "--seconds", "5"],
    );
    let filled = trace.workload_event("filled");
    let grown =
        filled["rss_peak_bytes"].as_f64().unwrap() - filled["rss_before_bytes"].as_f64().unwrap();
    assert_no_pattern(&trace, "spike");
    let cause = first_cause(&trace);
    assert_eq!(cause["pattern"], "retention", "{cause:#}");
    assert_eq!(
        cause["places"][0]["frame"]["function"], "fill_buffer",
        "{cause:#}"
    );
    let summary = headline(&trace, cause);
    assert!(summary.contains("while shutting down"), "{summary}");
    let (bytes, released) = amount_bytes(cause);
    assert!(
        (bytes - grown).abs() <= 0.15 * grown,
        "how much {bytes} vs the workload's growth {grown}: {cause:#}"
    );
    assert!(
        released >= 0.8 * grown,
        "released {released} of {grown}: {cause:#}"
    );
}
