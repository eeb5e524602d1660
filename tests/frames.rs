//! Integration tests of the Python frames a stack names (issue 15): real
//! eBPF programs trace tests/scripts/frames_grow.py, which grows in a
//! generator, an async function, a class's `__init__` and a nested class's
//! method, on pyenv's 3.11 and Debian's 3.14 and 3.15, and with 3.14's JIT
//! on. Each phase's growth must be credited to its function by qualified
//! name, and no frame that is not Python code (3.13+'s `__init__` shim, an
//! entry frame) may show.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and the
//! interpreters (`cargo xtask test` installs 3.14 and 3.15); without them
//! each test prints why it skips.

#[expect(
    dead_code,
    reason = "frames.rs reads only the stacks and workload lines of `common::Trace`"
)]
mod common;

use std::path::Path;

use serde_json::Value;

use common::{debian_python, python_3_11, require_ebpf, trace_expecting, Trace};

/// Tolerance of sampled sums (one sample per 512 KiB on average) against
/// the workload's own RSS growth of a phase.
const SAMPLED: f64 = 0.25;

/// MiB each phase grows.
const PHASE_MIB: &str = "40";
/// Seconds frames_grow.py waits before its first phase: memtrace finds the
/// interpreter some time after the exec (up to ~1 s under load), and growth
/// before that has no Python stack (the generator phase, first, came out
/// 32.5 of 43.5 MiB once on a loaded machine).
const START_DELAY_SECONDS: &str = "2";

/// The Python function names of a path's stack, outermost first.
fn python_functions(trace: &Trace, path: &Value) -> Vec<String> {
    let stack = path["stack"].as_u64().expect("path has a stack id");
    trace.report["stacks"][stack as usize]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|frame| frame["kind"] == "python")
        .filter_map(|frame| frame["function"].as_str().map(str::to_owned))
        .collect()
}

/// Traces frames_grow.py on `python` with `env` set; checks each phase.
fn check_frames(python: &Path, env: &[(&str, &str)]) -> Trace {
    let script = common::script("frames_grow.py");
    let debug_dir = common::debug_dir_of(python);
    let mut args = vec!["run"];
    if let Some(dir) = &debug_dir {
        args.extend(["--debug-dir", dir.to_str().unwrap()]);
    }
    let mut command = vec!["env"];
    let pairs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    command.extend(pairs.iter().map(String::as_str));
    command.extend([
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        PHASE_MIB,
        "--start-delay",
        START_DELAY_SECONDS,
    ]);
    args.push("--");
    args.extend(command);
    let trace = trace_expecting(&args, 0);
    let paths: Vec<Vec<String>> = trace.report["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .map(|path| python_functions(&trace, path))
        .collect();
    let bytes: Vec<f64> = trace.report["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| path["bytes"]["growth_bytes"].as_f64().unwrap())
        .collect();
    for phase in trace.workload_events("phase") {
        let function = phase["function"].as_str().unwrap();
        let expected = phase["rss_growth_bytes"].as_f64().unwrap();
        let attributed: f64 = paths
            .iter()
            .zip(&bytes)
            .filter(|(names, _)| names.iter().any(|n| n == function))
            .map(|(_, bytes)| bytes)
            .sum();
        assert!(
            (attributed - expected).abs() <= SAMPLED * expected,
            "{function}: {attributed} attributed, {expected} grown\n{}",
            trace.stdout()
        );
    }
    for names in &paths {
        // The shim frame that calls `__init__` (3.13+) has no qualified
        // name of a class: it must not show.
        assert!(!names.iter().any(|n| n == "__init__"), "{names:?}");
        if let Some(at) = names.iter().position(|n| n == "Cache.__init__") {
            assert_eq!(names[at - 1], "main.<locals>.<lambda>", "{names:?}");
        }
        if let Some(at) = names.iter().position(|n| n == "produce_rows") {
            assert_eq!(names[at - 1], "consume_generator", "{names:?}");
        }
    }
    trace
}

#[test]
fn names_generators_coroutines_and_methods_on_pyenv_3_11() {
    let python = require_ebpf!(python_3_11());
    check_frames(&python, &[]);
}

#[test]
fn names_generators_coroutines_and_methods_on_debian_3_14() {
    let python = require_ebpf!(debian_python("3.14"));
    check_frames(&python, &[]);
}

#[test]
fn names_generators_coroutines_and_methods_on_debian_3_15() {
    let python = require_ebpf!(debian_python("3.15"));
    check_frames(&python, &[]);
}

/// Debian builds the JIT in but leaves it off (`yes-off`); `PYTHON_JIT=1`
/// turns it on. JIT-compiled traces keep the interpreter frames, so the
/// same functions are named.
#[test]
fn names_the_same_functions_with_the_jit_on_debian_3_14() {
    let python = require_ebpf!(debian_python("3.14"));
    let trace = check_frames(&python, &[("PYTHON_JIT", "1")]);
    assert_eq!(trace.workload_event("ready")["jit"], true);
}
