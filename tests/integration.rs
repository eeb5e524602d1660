//! Integration tests: the real memtrace binary loads its real eBPF programs
//! and traces real Python interpreters running the workloads in
//! tests/scripts/; the assertions are on what the JSON report attributes
//! (which process, which function, how many bytes).
//!
//! They need root (CAP_BPF + CAP_PERFMON) and a kernel with BTF: without them
//! each test prints why it skips. An interpreter that is absent is skipped
//! with a printed reason. `cargo xtask test` runs them one at a time.

#[expect(
    dead_code,
    reason = "integration.rs reads reports through its own helpers: it uses no process rows, findings or folded stacks of `common::Trace`"
)]
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use common::{
    debian_python, free_threaded_python, interpreter, memtrace, pyenv, python_3_11, require_ebpf,
    script, stack_functions, trace, trace_expecting, trace_script, Trace,
};

/// Allowed relative error of attributed bytes against the workload's own
/// measurement of its growth.
const TOLERANCE: f64 = 0.25;

/// Readers of the report for these tests' assertions.
impl Trace {
    /// Every (process, stack) path, largest resident growth first.
    fn paths(&self) -> &Vec<Value> {
        self.report["paths"].as_array().expect("report has paths")
    }

    /// Python function names of a path's stack, outermost first.
    fn functions(&self, path: &Value) -> Vec<String> {
        let stack = path["stack"].as_u64().expect("path has a stack id");
        stack_functions(&self.report, stack)
    }

    /// tgid of the process row a path belongs to.
    fn path_tgid(&self, path: &Value) -> Option<u64> {
        let id = path["process"].as_u64()?;
        self.processes()
            .iter()
            .find(|p| p["id"].as_u64() == Some(id))
            .and_then(|p| p["tgid"].as_u64())
    }
}

fn assert_within(actual: f64, expected: f64, what: &str) {
    let error = (actual - expected).abs() / expected;
    assert!(
        error <= TOLERANCE,
        "{what}: memtrace says {actual:.0} bytes, the workload measured {expected:.0} ({:.1}% off, tolerance {:.0}%)",
        error * 100.0,
        TOLERANCE * 100.0
    );
}

/// grow_cache.py's `fill_cache` must be the top growth path, with its bytes
/// within 25% of the growth the script measured.
fn check_grow_cache(python: &Path) {
    let trace = trace_script(python, "grow_cache.py", &["--mib", "256"]);
    // The script's own RSS growth across fill_cache (pymalloc rounding
    // included), the same quantity memtrace attributes.
    let expected = trace.workload_event("grown")["rss_growth_bytes"]
        .as_f64()
        .expect("grow_cache.py reports rss_growth_bytes");
    let top = &trace.paths()[0];
    let names = trace.functions(top);
    assert!(
        names.iter().any(|n| n == "fill_cache"),
        "top growth path is not fill_cache: {names:?}\n{}",
        trace.stdout()
    );
    let attributed: f64 = trace
        .paths()
        .iter()
        .filter(|p| trace.functions(p).iter().any(|n| n == "fill_cache"))
        .map(|p| p["bytes"]["growth_bytes"].as_f64().unwrap())
        .sum();
    assert_within(attributed, expected, "fill_cache growth");
}

#[test]
fn attributes_growth_to_function_on_pyenv_3_11() {
    let python = require_ebpf!(python_3_11());
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_pyenv_3_12() {
    let python = require_ebpf!(interpreter(&[pyenv("3.12.1", "python3.12")]));
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_pyenv_3_9() {
    let python = require_ebpf!(interpreter(&[pyenv("3.9.18", "python3.9")]));
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_pyenv_3_10() {
    let python = require_ebpf!(interpreter(&[pyenv("3.10.13", "python3.10")]));
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_debian_3_14() {
    let python = require_ebpf!(debian_python("3.14"));
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_debian_3_15() {
    let python = require_ebpf!(debian_python("3.15"));
    check_grow_cache(&python);
}

/// The free-threaded 3.13t of the test setup (GIL off; mimalloc).
#[test]
fn attributes_growth_to_function_on_free_threaded_3_13t() {
    let python = require_ebpf!(free_threaded_python());
    check_grow_cache(&python);
}

#[test]
fn attributes_growth_to_function_on_debian_static_python() {
    let python = require_ebpf!(interpreter(&[PathBuf::from("/usr/bin/python3.11")]));
    check_grow_cache(&python);
}

/// exec_class_table.py's class bodies (built by `exec` from source with an
/// empty file name) must keep their `GeneratedTable` frame under the exec'd
/// `<module>`, both shown in file `<string>`. A frame whose code object was
/// freed before memtrace read it may be unresolved (said so), never
/// another code object's name; the workload keeps half of its code objects,
/// so at least those resolve.
fn check_exec_class_bodies(python: &Path) {
    let trace = trace_script(python, "exec_class_table.py", &[]);
    let string = "<string>".to_owned();
    let expected = [
        ("<module>".to_owned(), string.clone()),
        ("GeneratedTable".to_owned(), string),
    ];
    let mut under_build = 0.0;
    let mut as_class_body = 0.0;
    for path in trace.paths() {
        let frames = python_frames(&trace, path);
        let build = frames
            .iter()
            .position(|f| f.as_ref().is_some_and(|(name, _)| name == "build_tables"));
        let Some(build) = build else {
            continue;
        };
        let inner = &frames[build + 1..];
        if inner.is_empty() {
            continue; // build_tables's own growth: compile(), the kept namespaces
        }
        assert_eq!(inner.len(), 2, "{inner:?}\n{}", trace.stdout());
        for (got, want) in inner.iter().zip(&expected) {
            assert!(
                got.as_ref().is_none_or(|got| got == want),
                "{got:?} where {want:?} ran\n{}",
                trace.stdout()
            );
        }
        let bytes = path["bytes"]["growth_bytes"].as_f64().unwrap();
        under_build += bytes;
        if inner.iter().all(Option::is_some) {
            as_class_body += bytes;
        }
    }
    assert!(
        under_build > 0.0 && as_class_body / under_build > 0.3,
        "only {as_class_body} of {under_build} bytes under build_tables are resolved\n{}",
        trace.stdout()
    );
}

/// The Python frames of a path, outermost first: `(function, file)`, or
/// `None` for an unresolved Python frame.
fn python_frames(trace: &Trace, path: &Value) -> Vec<Option<(String, String)>> {
    let stack = path["stack"].as_u64().expect("path has a stack id");
    trace.report["stacks"][stack as usize]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| match f["kind"].as_str() {
            Some("python") => Some(Some((
                f["function"].as_str()?.to_owned(),
                f["file"].as_str()?.to_owned(),
            ))),
            Some("unknown") if f["reason"] == "unresolved Python frame" => Some(None),
            _ => None,
        })
        .collect()
}

#[test]
fn keeps_exec_class_bodies_on_pyenv_3_10() {
    let python = require_ebpf!(interpreter(&[pyenv("3.10.13", "python3.10")]));
    check_exec_class_bodies(&python);
}

#[test]
fn keeps_exec_class_bodies_on_pyenv_3_12() {
    let python = require_ebpf!(interpreter(&[pyenv("3.12.1", "python3.12")]));
    check_exec_class_bodies(&python);
}

/// subinterpreter_grow.py: growth inside `run_string` code is
/// `grow_in_sub`'s (under the sub-interpreter marker), not the caller
/// `run_in_subinterpreter`'s; the main interpreter's growth is unmarked.
fn check_subinterpreter(python: &Path, args: &[&str]) {
    let trace = trace_script(python, "subinterpreter_grow.py", args);
    let (mut sub, mut main, mut caller) = (0.0, 0.0, 0.0);
    for path in trace.paths() {
        let stack = path["stack"].as_u64().expect("path has a stack id");
        let frames = trace.report["stacks"][stack as usize]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let marked = frames.first().and_then(|f| f["reason"].as_str())
            == Some("in a sub-interpreter; its caller in the main interpreter not shown");
        let names = trace.functions(path);
        let bytes = path["bytes"]["growth_bytes"].as_f64().unwrap();
        if names.iter().any(|n| n == "grow_in_sub") {
            assert!(marked, "unmarked sub-interpreter path {frames:?}");
            sub += bytes;
        } else if names.iter().any(|n| n == "grow_in_main") {
            assert!(!marked, "main-interpreter path marked {frames:?}");
            main += bytes;
        } else if names.last().is_some_and(|n| n == "run_in_subinterpreter") {
            caller += bytes;
        }
    }
    assert!(
        main > 0.0 && sub / main > 0.6 && caller < 0.1 * sub,
        "grow_in_sub {sub}, grow_in_main {main}, run_in_subinterpreter {caller}\n{}",
        trace.stdout()
    );
}

#[test]
fn attributes_subinterpreter_growth_on_pyenv_3_10() {
    let python = require_ebpf!(interpreter(&[pyenv("3.10.13", "python3.10")]));
    check_subinterpreter(&python, &[]);
}

#[test]
fn attributes_subinterpreter_growth_on_pyenv_3_11() {
    let python = require_ebpf!(python_3_11());
    check_subinterpreter(&python, &[]);
}

#[test]
fn attributes_subinterpreter_growth_on_pyenv_3_12() {
    let python = require_ebpf!(interpreter(&[pyenv("3.12.1", "python3.12")]));
    check_subinterpreter(&python, &[]);
}

#[test]
fn attributes_subinterpreter_growth_on_pyenv_3_13() {
    let python = require_ebpf!(interpreter(&[pyenv("3.13.0", "python3.13")]));
    check_subinterpreter(&python, &[]);
}

/// A sub-interpreter in a thread of its own (3.11: `_xxsubinterpreters`,
/// which swaps its thread state into `gilstate.tstate_current` only).
#[test]
fn attributes_subinterpreter_growth_in_its_own_thread_on_pyenv_3_11() {
    let python = require_ebpf!(python_3_11());
    check_subinterpreter(&python, &["--in-thread"]);
}

/// 3.14's `concurrent.interpreters`, in a thread of its own and on the
/// main thread; closing it (`Py_EndInterpreter`, which calls the exit
/// point's `_PyThreadState_RemoveExcept` too) does not begin the exit.
#[test]
fn attributes_subinterpreter_growth_on_debian_3_14() {
    let python = require_ebpf!(debian_python("3.14"));
    check_subinterpreter(&python, &[]);
    check_subinterpreter(&python, &["--in-thread"]);
}

#[test]
fn names_the_one_leaking_worker() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "prefork_one_leaks.py",
        &["--workers", "3", "--mib", "128"],
    );
    let forked = trace.workload_event("forked");
    let leaker = forked["leaker_pid"].as_u64().expect("leaker_pid");
    let workers: Vec<u64> = forked["workers"]
        .as_object()
        .expect("workers by index")
        .values()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(workers.len(), 3);
    let top = &trace.paths()[0];
    assert_eq!(trace.path_tgid(top), Some(leaker), "top path's process");
    // The leak's bytes may be split over several paths (same Python stack,
    // different innermost native frame): most of the leaker's sampled growth
    // must be under leak_in_worker.
    let (in_leak, total): (f64, f64) = trace
        .paths()
        .iter()
        .filter(|p| trace.path_tgid(p) == Some(leaker))
        .map(|p| {
            let bytes = p["bytes"]["growth_bytes"].as_f64().unwrap();
            let leaking = trace.functions(p).iter().any(|n| n == "leak_in_worker");
            (if leaking { bytes } else { 0.0 }, bytes)
        })
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    assert!(
        in_leak >= 0.5 * total,
        "leak_in_worker holds {in_leak} of the leaker's {total} sampled bytes; top path: {:?}",
        trace.functions(top)
    );
    let leaked = trace.row_of(leaker)["counters"]["anon_growth_bytes"]
        .as_f64()
        .unwrap();
    assert!(
        leaked >= 100.0 * 1024.0 * 1024.0,
        "leaker grew only {leaked} bytes"
    );
    for &worker in workers.iter().filter(|&&w| w != leaker) {
        let grown = trace.row_of(worker)["counters"]["anon_growth_bytes"]
            .as_f64()
            .unwrap();
        assert!(
            grown < leaked / 10.0,
            "idle worker {worker} grew {grown} bytes, leaker {leaked}"
        );
        assert_eq!(trace.row_of(worker)["role"], "worker");
    }
}

#[test]
fn attaches_to_a_running_process() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("go");
    let mut target = Command::new(&python)
        .arg(script("wait_then_grow.py"))
        .args(["--mib", "128", "--start-delay", "30", "--trigger-file"])
        .arg(&trigger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the interpreter initialise before attaching.
    std::thread::sleep(Duration::from_millis(500));
    let pid = target.id().to_string();
    let trigger_later = trigger.clone();
    // Attaching takes 1-3.6 s on a quiet 2-core machine and several times
    // that under a parallel build: the growth must come after it.
    let toucher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        std::fs::write(trigger_later, b"go").unwrap();
    });
    let trace = trace(&["record", "--pid", &pid, "--duration", "60s"]);
    toucher.join().unwrap();
    let status = target.wait().unwrap();
    assert!(status.success());
    let top = &trace.paths()[0];
    assert_eq!(trace.path_tgid(top), Some(u64::from(target.id())));
    let names = trace.functions(top);
    assert!(
        names.iter().any(|n| n == "grow_after_attach"),
        "top path after attach: {names:?}"
    );
    let row = trace.row_of(u64::from(target.id()));
    assert_eq!(row["role"], "root");
    // A process that ran before the trace: its start time is /proc's.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    assert!(stat.is_err(), "the target exited");
    assert!(row["start_time_ns"].as_u64().unwrap() > 0);
}

#[test]
fn traces_a_process_that_is_not_python() {
    require_ebpf!();
    let trace = trace(&[
        "run",
        "--",
        "sh",
        "-c",
        "head -c 50000000 /dev/zero | tail -c 1 >/dev/null",
    ]);
    let root = trace.report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "root")
        .expect("root process in report");
    assert_eq!(
        root["python"]["status"], "not_python",
        "python status: {}",
        root["python"]
    );
    assert!(trace.stdout().to_lowercase().contains("not python"));
}

#[test]
fn rejects_a_pid_that_does_not_exist() {
    require_ebpf!();
    let output = memtrace()
        .args(["record", "--pid", "4999999", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no process with PID 4999999"),
        "stderr: {stderr}"
    );
}

#[test]
fn explains_missing_privileges() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipping: needs root to drop to an unprivileged user");
        return;
    }
    use std::os::unix::process::CommandExt as _;
    let output = memtrace()
        .args([
            "run",
            "--duration",
            "1s",
            "--output-dir",
            "/tmp",
            "--",
            "true",
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("root"),
        "stderr does not explain the missing privileges: {stderr}"
    );
}

/// `memtrace run` exits with its command's status as a shell reports it
/// (the code, or 128 + the signal that killed it), and the printed report
/// and the JSON say how the command ended.
#[test]
fn run_exits_with_the_command_status_and_says_how_it_ended() {
    let python = require_ebpf!(python_3_11());
    let python = python.to_str().unwrap();
    let cases = [
        ("import sys; sys.exit(3)", 3, "exit 3", "code"),
        (
            "import os; os.kill(os.getpid(), 9)",
            137,
            "SIGKILL",
            "signal",
        ),
        (
            "import ctypes; ctypes.string_at(0)",
            139,
            "SIGSEGV",
            "signal",
        ),
    ];
    for (code, status, ended, how) in cases {
        let trace = trace_expecting(&["run", "--", python, "-c", code], status);
        let stdout = trace.stdout();
        let line = format!("memtrace: the command ended: {ended}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&line)
                    && l.contains(&format!("memtrace exits with {status},"))),
            "no `{line}` line for `{code}`:\n{stdout}"
        );
        let json = &trace.report["meta"]["command_status"];
        assert_eq!(json["how"], how, "{json}");
    }
}
