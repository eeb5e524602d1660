//! Mixed Python + native stacks end to end: the real memtrace binary
//! unwinds the user stacks it copied at sampled allocations (allocator
//! mode, `--allocations`) and sampled page faults (default mode) of real
//! programs, and the JSON report's paths show the native chain under the
//! Python function that called it. Workloads:
//! tests/scripts/native_sqlite_cache.py (libsqlite3's page cache) and
//! tests/native/embed_host.c (a host embedding CPython, compiled here).
//!
//! They need root and a kernel with BTF (skipped otherwise, with the
//! reason); an absent interpreter, compiler or library is skipped with a
//! printed reason.

#[expect(
    dead_code,
    reason = "these tests read only the allocations section of `common::Trace`"
)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use common::{python_3_11, require_ebpf, script, skip, trace, Trace};

/// Sampling mean of these runs, in bytes: ~570 samples over the ~37 MB page
/// cache of the SQLite run (a relative standard error of ~4%).
const SAMPLE_BYTES: &str = "65536";

/// How long the workloads wait before the measured allocations, in seconds
/// (memtrace attaches a process's allocator probes once its interpreter is
/// found).
const START_DELAY_SECONDS: &str = "0.5";

/// Allowed relative error of the sampled page-cache bytes against SQLite's
/// own count (`SQLITE_STATUS_MEMORY_USED`): ~3.5 standard errors.
const SQLITE_TOLERANCE: f64 = 0.15;

/// Allowed relative error for the host's one 24 MiB block: a block far
/// above the sampling mean is always sampled and weighs its own size.
const HOST_TOLERANCE: f64 = 0.01;

/// `memtrace run --allocations` of `command`.
fn trace_allocations(command: &[&str]) -> Trace {
    let mut args = vec!["run", "--allocations", "--sample-bytes", SAMPLE_BYTES];
    args.extend(common::alloc_hooks_args());
    args.push("--");
    args.extend_from_slice(command);
    trace(&args)
}

/// The allocation paths of process `tgid`: (stack frames outermost first,
/// leaked bytes).
fn paths_of(trace: &Trace, tgid: u64) -> Vec<(Vec<String>, f64)> {
    let process = trace.report["allocations"]["processes"]
        .as_array()
        .expect("the report has an allocations section")
        .iter()
        .find(|p| p["tgid"].as_u64() == Some(tgid))
        .unwrap_or_else(|| panic!("no allocations entry for tgid {tgid}"));
    process["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| {
            let stack = path["stack"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().to_owned())
                .collect();
            (stack, path["leaked_bytes"].as_u64().unwrap() as f64)
        })
        .collect()
}

/// The frames under Python function `function` in `stack`, if it has it.
fn below<'a>(stack: &'a [String], function: &str) -> Option<&'a [String]> {
    let frame = format!("{function} (");
    let at = stack.iter().rposition(|f| f.starts_with(&frame))?;
    Some(&stack[at + 1..])
}

/// Whether `python` can import `sqlite3`; says why the test skips when not.
fn has_sqlite3(python: &Path) -> bool {
    let probe = Command::new(python)
        .args(["-c", "import sqlite3"])
        .status()
        .unwrap();
    if !probe.success() {
        skip(&format!("{} has no sqlite3 module", python.display()));
    }
    probe.success()
}

fn assert_within(actual: f64, expected: f64, tolerance: f64, what: &str) {
    let error = (actual - expected).abs() / expected;
    assert!(
        error <= tolerance,
        "{what}: memtrace says {actual:.0} bytes, the workload counted {expected:.0} ({:.1}% off, \
         tolerance {:.0}%)",
        error * 100.0,
        tolerance * 100.0
    );
}

#[test]
fn sqlite_page_cache_is_shown_in_libsqlite3_under_its_python_function() {
    let python = require_ebpf!(python_3_11());
    if !has_sqlite3(&python) {
        return;
    }
    let script = script("native_sqlite_cache.py");
    let trace = trace_allocations(&[
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        "32",
        "--start-delay",
        START_DELAY_SECONDS,
    ]);
    let cached = trace.workload_event("cached");
    let tgid = cached["pid"].as_u64().unwrap();
    let expected = cached["sqlite_memory_bytes"].as_f64().unwrap();
    let in_sqlite: Vec<_> = paths_of(&trace, tgid)
        .into_iter()
        .filter(|(stack, _)| {
            below(stack, "lookup_customer_total")
                .is_some_and(|native| native.iter().any(|f| f.starts_with("sqlite3")))
        })
        .collect();
    let example = in_sqlite.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    let example = example.map(|(stack, _)| stack.join(" -> "));
    // The chain reaches libsqlite3's allocator through the query.
    let chain = example.clone().unwrap_or_default();
    for frame in ["sqlite3_step", "sqlite3Malloc"] {
        assert!(chain.contains(frame), "no {frame} in {example:?}");
    }
    let leaked: f64 = in_sqlite.iter().map(|(_, bytes)| bytes).sum();
    assert_within(
        leaked,
        expected,
        SQLITE_TOLERANCE,
        "page cache leaked in libsqlite3 under lookup_customer_total",
    );
}

/// Allowed relative error of the default mode's sampled resident growth
/// under libsqlite3 against SQLite's own count: pages touched by malloc'd
/// blocks, not the blocks, so the bound of the default mode's other path
/// tests (25%).
const SQLITE_GROWTH_TOLERANCE: f64 = 0.25;

#[test]
fn default_mode_names_libsqlite3_under_the_python_function_that_grew_it() {
    let python = require_ebpf!(python_3_11());
    if !has_sqlite3(&python) {
        return;
    }
    let script = script("native_sqlite_cache.py");
    let trace = trace(&[
        "run",
        "--sample-bytes",
        SAMPLE_BYTES,
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        "32",
    ]);
    let expected = trace.workload_event("cached")["sqlite_memory_bytes"]
        .as_f64()
        .unwrap();
    let report = &trace.report;
    let in_sqlite = |stack: &Value| {
        let frames = stack.as_array().unwrap();
        let at = frames
            .iter()
            .rposition(|f| f["function"] == "lookup_customer_total");
        at.is_some_and(|at| {
            frames[at + 1..].iter().any(|f| {
                f["module"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("libsqlite3"))
            })
        })
    };
    let held: f64 = report["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| in_sqlite(&report["stacks"][p["stack"].as_u64().unwrap() as usize]))
        .map(|p| p["bytes"]["held_bytes"].as_f64().unwrap())
        .sum();
    assert_within(
        held,
        expected,
        SQLITE_GROWTH_TOLERANCE,
        "resident growth held in libsqlite3 under lookup_customer_total",
    );
}

/// `python3.11-config` of pyenv's 3.11.7 and gcc, or `None` after printing
/// why the test skips.
fn embedding_toolchain() -> Option<PathBuf> {
    let config = common::pyenv("3.11.7", "python3.11-config");
    if !config.exists() {
        skip(&format!("{} is not installed", config.display()));
        return None;
    }
    if Command::new("gcc").arg("--version").output().is_err() {
        skip("gcc is not installed");
        return None;
    }
    Some(config)
}

/// Compiles tests/native/embed_host.c into `dir` with gcc -O2 against the
/// libpython of `config`; returns the program.
fn build_host(config: &Path, dir: &Path) -> PathBuf {
    let flags = |args: &[&str]| {
        let output = Command::new(config).args(args).output().unwrap();
        assert!(output.status.success(), "{config:?} {args:?} failed");
        String::from_utf8(output.stdout).unwrap()
    };
    let cflags = flags(&["--cflags"]);
    let ldflags = flags(&["--ldflags", "--embed"]);
    let libdir = config.parent().unwrap().parent().unwrap().join("lib");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/native/embed_host.c");
    let host = dir.join("embed_host");
    let status = Command::new("gcc")
        .arg("-O2")
        .arg("-o")
        .arg(&host)
        .arg(&source)
        .args(cflags.split_whitespace())
        .args(ldflags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .status()
        .unwrap();
    assert!(status.success(), "gcc failed to build {source:?}");
    host
}

#[test]
fn an_embedding_hosts_own_function_is_named_under_the_python_caller() {
    require_ebpf!();
    let Some(config) = embedding_toolchain() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let host = build_host(&config, dir.path());
    let trace = trace_allocations(&[host.to_str().unwrap(), START_DELAY_SECONDS, "24"]);
    let filled = trace.workload_event("filled");
    let tgid = filled["pid"].as_u64().unwrap();
    let expected = filled["malloc_bytes"].as_f64().unwrap();
    let paths = paths_of(&trace, tgid);
    let host_paths: Vec<_> = paths
        .iter()
        .filter(|(stack, _)| {
            below(stack, "warm_cache").is_some_and(|native| {
                native.last().map(String::as_str) == Some("host_fill_cache")
                    && native.iter().any(|f| f == "host_fill")
            })
        })
        .collect();
    let leaked: f64 = host_paths.iter().map(|(_, bytes)| bytes).sum();
    let stacks: Vec<Value> = paths
        .iter()
        .filter(|(_, bytes)| *bytes > 1e6)
        .map(|(stack, _)| Value::from(stack.join(" -> ")))
        .collect();
    let hook = trace.report["allocations"]["processes"]
        .as_array()
        .and_then(|processes| processes.iter().find(|p| p["tgid"].as_u64() == Some(tgid)))
        .map(|p| p["hook"].clone());
    assert!(
        !host_paths.is_empty(),
        "no path warm_cache -> host_fill -> host_fill_cache; hook {hook:?}; paths over 1 MB: \
         {stacks:?}"
    );
    assert_within(
        leaked,
        expected,
        HOST_TOLERANCE,
        "leaked by host_fill_cache under warm_cache",
    );
}
