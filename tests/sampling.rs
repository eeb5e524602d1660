//! Integration tests of byte sampling's error (issue 16, item 8), in the
//! default mode at its default settings: the kernel side lowers a process's
//! sampling mean while it grows slowly (`memtrace_common::SamplingState`),
//! so a small site beside a large one, and a file read slice by slice, come
//! out within 15% of what the workload measured of itself in /proc; every
//! path says its samples and its standard error.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

#[expect(
    dead_code,
    reason = "sampling.rs traces scripts only through `trace_script`"
)]
mod common;

use serde_json::Value;

use common::{python_3_11, require_ebpf, stack_functions, trace_script, Trace};

/// One mebibyte, in bytes.
const MIB: f64 = 1024.0 * 1024.0;

/// The tolerance issue 16 sets for sampled figures at default settings.
const TOLERANCE: f64 = 0.15;

/// `value` of a JSON number as f64 (panics when missing).
fn num(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The paths of the process row of `pid` whose stacks run through
/// `function`.
fn paths_through<'a>(trace: &'a Trace, pid: u64, function: &str) -> Vec<&'a Value> {
    let id = trace.row_of(pid)["id"].as_u64().unwrap();
    trace
        .paths_of(id)
        .into_iter()
        .filter(|p| {
            stack_functions(&trace.report, p["stack"].as_u64().unwrap())
                .iter()
                .any(|f| f == function)
        })
        .collect()
}

/// Bytes held at the high-water mark by the paths through `function`, their
/// samples and their summed standard error.
fn held_at_peak(trace: &Trace, pid: u64, function: &str) -> (f64, u64, f64) {
    let paths = paths_through(trace, pid, function);
    let bytes = paths.iter().map(|p| num(&p["peak_held_bytes"])).sum();
    let samples = paths
        .iter()
        .map(|p| p["bytes"]["samples"].as_u64().unwrap())
        .sum();
    let variance: f64 = paths
        .iter()
        .map(|p| num(&p["peak_held_error_bytes"]).powi(2))
        .sum();
    (bytes, samples, variance.sqrt())
}

/// Asserts `actual` is within [`TOLERANCE`] of `expected`.
fn assert_within(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= TOLERANCE * expected,
        "{what}: {:.2} MiB, expected {:.2} MiB within {:.0}%",
        actual / MIB,
        expected / MIB,
        100.0 * TOLERANCE
    );
}

/// The verdict's first cause as printed: its numbered heading and the lines
/// under it up to the next cause (the path tables above it are numbered
/// too: the verdict starts at `Verdict:`).
fn first_cause_lines(stdout: &str) -> String {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Verdict:"))
        .skip_while(|l| !l.trim_start().starts_with("1. "))
        .take_while(|l| !l.trim_start().starts_with("2. "))
        .take_while(|l| !l.is_empty());
    let mut text = String::new();
    for line in &mut lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[test]
fn a_5_mib_site_beside_a_100_mib_one_is_within_15_percent() {
    let python = require_ebpf!(python_3_11());
    let args = [
        "--large-mib",
        "100",
        "--small-mib",
        "5",
        "--start-delay",
        "2",
    ];
    let trace = trace_script(&python, "small_beside_large.py", &args);
    let grown = trace.workload_event("grown");
    let pid = grown["pid"].as_u64().unwrap();
    let (large, large_samples, large_error) = held_at_peak(&trace, pid, "grow_large");
    let (small, small_samples, small_error) = held_at_peak(&trace, pid, "grow_small");
    let stdout = trace.stdout();
    eprintln!(
        "grow_large {:.2} of {:.2} MiB (±{:.2}, {large_samples} samples), grow_small {:.2} of \
         {:.2} MiB (±{:.2}, {small_samples} samples)\nfirst cause:\n{}",
        large / MIB,
        num(&grown["large_bytes"]) / MIB,
        large_error / MIB,
        small / MIB,
        num(&grown["small_bytes"]) / MIB,
        small_error / MIB,
        first_cause_lines(&stdout)
    );
    assert_within(large, num(&grown["large_bytes"]), "grow_large");
    assert_within(small, num(&grown["small_bytes"]), "grow_small");
    // More samples went to the small site than the fixed 512 KiB mean gives
    // it (about 10), and the error it states says it can be trusted.
    assert!(small_samples >= 20 && large_samples > small_samples);
    assert!(
        small_error <= TOLERANCE * small,
        "grow_small states ±{small_error} of {small}"
    );
    assert!(
        stdout.contains("±PEAK") && stdout.contains("SAMPLES"),
        "the path table says each path's error and samples: {stdout}"
    );
}

#[test]
fn an_mmapped_file_read_in_slices_is_said_within_15_percent_with_its_reader() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "read_mapped_file.py",
        &["--file-mib", "200", "--hold-seconds", "1"],
    );
    let read = trace.workload_event("read");
    let truth = num(&read["file_growth_bytes"]) + num(&read["shmem_growth_bytes"]);
    let cause = &trace.report["causes"][0];
    let stdout = trace.stdout();
    eprintln!("first cause:\n{}", first_cause_lines(&stdout));
    assert_eq!(cause["pattern"], "file_backed_growth", "{cause:#}");
    let how_much = num(&cause["amount"]["each"][0]["bytes"]);
    assert_within(how_much, truth, "how much");
    assert_eq!(
        cause["places"][0]["frame"]["function"], "read_slices",
        "{cause:#}"
    );
    assert_within(num(&cause["places"][0]["bytes"]), truth, "where");
    assert!(
        first_cause_lines(&stdout).contains("where:    read_slices"),
        "the verdict names the reader: {stdout}"
    );
}
