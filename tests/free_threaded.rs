//! Integration test of a free-threaded CPython (issue 15): real eBPF
//! programs trace tests/scripts/free_threaded_grow.py on the 3.13t that
//! `cargo xtask test` builds (GIL off), whose `grow_rows` grows on two
//! threads at once. The growth must be credited to `grow_rows`, read
//! through each thread's own thread state and the build's
//! `_Py_DebugOffsets` (its object header is larger), and the census must
//! say it did not read the build's mimalloc heaps. In allocator mode the
//! same growth is a leak of `grow_rows`, and the process is not taken for
//! a pymalloc one.
//!
//! It needs root (CAP_BPF + CAP_PERFMON), a kernel with BTF and the 3.13t
//! build; without them it prints why it skips.

#[expect(
    dead_code,
    reason = "free_threaded.rs reads only the report and workload lines of `common::Trace`"
)]
mod common;

use serde_json::Value;

use common::{free_threaded_python, require_ebpf, stack_functions, trace_expecting, Trace};

/// Tolerance of sampled sums (one sample per 512 KiB on average) against
/// the workload's own RSS growth (tests/frames.rs).
const SAMPLED: f64 = 0.25;

/// Allowed relative error of allocator mode's sampled bytes, at a 64 KiB
/// mean, against the workload's `sys.getsizeof` count (tests/allocations.rs).
const ALLOC_TOLERANCE: f64 = 0.15;

/// Runs free_threaded_grow.py (40 MiB a thread) under `memtrace run` with
/// the options `before` its command.
fn trace_workload(before: &[&str]) -> Option<Trace> {
    let python = free_threaded_python()?;
    let script = common::script("free_threaded_grow.py");
    let mut args = vec!["run"];
    args.extend_from_slice(before);
    args.extend([
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        "40",
        // memtrace finds the interpreter some time after the exec
        // (tests/frames.rs).
        "--start-delay",
        "2",
    ]);
    let trace = trace_expecting(&args, 0);
    assert_eq!(trace.workload_event("ready")["gil_enabled"], false);
    let grown = trace.workload_event("grown");
    assert!(ran_at_once(&grown["threads"]), "{grown}");
    Some(trace)
}

/// Growth credited to paths whose Python stack names `function`.
fn attributed_bytes(trace: &Trace, function: &str) -> f64 {
    trace.report["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .filter(|path| {
            let stack = path["stack"].as_u64().expect("path has a stack id");
            stack_functions(&trace.report, stack)
                .iter()
                .any(|f| f == function)
        })
        .map(|path| path["bytes"]["growth_bytes"].as_f64().unwrap())
        .sum()
}

/// Whether the two threads' `grow_rows` spans overlap in time.
fn ran_at_once(threads: &Value) -> bool {
    let spans: Vec<(u64, u64)> = threads
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| {
            (
                t["start_ns"].as_u64().unwrap(),
                t["end_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    let [(a_start, a_end), (b_start, b_end)] = spans[..] else {
        return false;
    };
    a_start.max(b_start) < a_end.min(b_end)
}

#[test]
fn names_the_function_growing_on_two_threads_of_3_13t() {
    let trace = require_ebpf!(trace_workload(&[]));
    let grown = trace.workload_event("grown");
    let expected = grown["rss_growth_bytes"].as_f64().unwrap();
    let attributed = attributed_bytes(&trace, "grow_rows");
    assert!(
        (attributed - expected).abs() <= SAMPLED * expected,
        "grow_rows: {attributed} attributed, {expected} grown\n{}",
        trace.stdout()
    );
    let pid = trace.workload_event("ready")["pid"].clone();
    let row = trace.row_of(pid.as_u64().unwrap());
    assert_eq!(row["python"]["version"], "3.13.5", "{row:#}");
    let census = trace.report["census"]["images"]
        .as_array()
        .expect("the report has a census")
        .iter()
        .find(|image| image["tgid"] == pid)
        .map(|image| &image["latest"]["census"])
        .expect("a census of the workload");
    assert_eq!(census["mimalloc"], true, "{census:#}");
    assert!(census["pymalloc"].is_null(), "{census:#}");
}

#[test]
fn allocator_mode_on_3_13t_sees_a_leak_of_grow_rows_not_pymalloc() {
    let mut options = vec!["--allocations", "--sample-bytes", "65536"];
    options.extend(common::alloc_hooks_args());
    let trace = require_ebpf!(trace_workload(&options));
    let grown = trace.workload_event("grown");
    let pid = grown["pid"].as_u64().unwrap();
    let process = trace.report["allocations"]["processes"]
        .as_array()
        .expect("the report has an allocations section")
        .iter()
        .find(|p| p["tgid"].as_u64() == Some(pid))
        .expect("an allocations entry of the workload");
    assert_eq!(process["hook"]["status"], "hooked", "{process}");
    assert_eq!(process["hook"]["pymalloc"], false, "{process}");
    let leaked: f64 = process["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|path| {
            path["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|frame| frame.as_str().unwrap().starts_with("grow_rows "))
        })
        .map(|path| path["leaked_bytes"].as_f64().unwrap())
        .sum();
    let expected = grown["getsizeof_bytes"].as_f64().unwrap();
    assert!(
        (leaked - expected).abs() <= ALLOC_TOLERANCE * expected,
        "grow_rows leaked {leaked} sampled, {expected} by sys.getsizeof\n{}",
        trace.stdout()
    );
}
