//! Attaching with `memtrace record --pid`: targets that cannot or should not
//! be traced are refused with their reason (a zombie and the parent that
//! has not reaped it, a kernel thread, PID 1 with its forks followed); a
//! process whose main thread called `pthread_exit` is traced through its
//! other threads (real eBPF, real CPython); and the report says how long
//! attaching took and that growth before it is not seen (`record`), or
//! that the command was held until then (`run`).
//!
//! The refusals need no privilege (they come before loading any program);
//! the traces need root and BTF, and skip with a printed reason otherwise.

#[expect(
    dead_code,
    reason = "these tests read reports through a few of the shared helpers only"
)]
mod common;

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use common::{memtrace, python_3_11, require_ebpf, script, stack_functions, trace, Trace};

/// memtrace's standard error for `args`, expecting it to fail.
fn refusal(args: &[&str]) -> String {
    let output = memtrace().args(args).stdin(Stdio::null()).output().unwrap();
    assert!(
        !output.status.success(),
        "memtrace {args:?} should have refused: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Waits up to 10 s for `check`.
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of task `tid` of process `pid` (`Z` for a zombie).
fn task_state(pid: u32, tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.chars().next()
}

#[test]
fn a_zombie_is_named_with_its_unreaping_parent() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    wait_for("the child to become a zombie", || {
        task_state(pid, pid) == Some('Z')
    });
    let stderr = refusal(&["record", "--pid", &pid.to_string(), "--duration", "1s"]);
    let expected = format!(
        "PID {pid} exited (zombie); its parent {} (`",
        std::process::id()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains("no process with PID"), "{stderr}");
    child.wait().unwrap();
}

#[test]
fn a_kernel_thread_is_refused_as_one() {
    let comm = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
    if comm.trim() != "kthreadd" {
        common::skip("PID 2 is not kthreadd here (a PID namespace?)");
        return;
    }
    let stderr = refusal(&["record", "--pid", "2", "--duration", "1s"]);
    assert!(
        stderr.contains("PID 2 (`[kthreadd]`) is a kernel thread: it has no user memory to trace"),
        "{stderr}"
    );
    assert!(!stderr.contains("not a Python process"), "{stderr}");
}

#[test]
fn pid_1_with_its_forks_followed_needs_allow_init() {
    let stderr = refusal(&["record", "--pid", "1", "--duration", "1s"]);
    assert!(
        stderr.contains("PID 1 (`") && stderr.contains("would trace the whole machine"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--no-follow-forks") && stderr.contains("--allow-init"),
        "{stderr}"
    );
}

#[test]
fn a_process_whose_main_thread_exited_is_traced_through_its_other_threads() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("go");
    let mut target = Command::new(&python)
        .arg(script("main_thread_exits.py"))
        .args(["--mib", "64", "--start-delay", "30", "--hold", "1"])
        .arg("--trigger-file")
        .arg(&trigger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("\"ready\""));
    let pid = target.id();
    wait_for("the main thread to exit", || {
        task_state(pid, pid) == Some('Z')
    });
    // After the attach (1-3.6 s quiet, several times that under load).
    let toucher = touch_later(trigger, Duration::from_secs(10));
    let before = SystemTime::now();
    let trace = trace(&["record", "--pid", &pid.to_string(), "--duration", "60s"]);
    toucher.join().unwrap();
    assert!(target.wait().unwrap().success());
    let row = trace.row_of(u64::from(pid));
    assert_eq!(row["python"]["version"], "3.11.7", "{row:#}");
    assert!(
        row["cmdline"]
            .as_str()
            .unwrap()
            .contains("main_thread_exits.py"),
        "{row:#}"
    );
    let id = row["id"].as_u64().unwrap();
    let top = trace
        .paths_of(id)
        .into_iter()
        .max_by_key(|p| p["peak_held_bytes"].as_u64())
        .expect("the grown process has paths");
    let functions = stack_functions(&trace.report, top["stack"].as_u64().unwrap());
    assert!(
        functions.iter().any(|f| f == "grow_in_worker"),
        "{functions:?}"
    );
    assert_attach_reported(&trace, before, false);
}

#[test]
fn a_flat_master_attached_to_keeps_its_rss() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("go");
    let mut target = Command::new(&python)
        .arg(script("prefork_staggered.py"))
        .args(["--workers", "3", "--fork-gap", "0.5", "--mib", "48"])
        .args(["--seconds", "4", "--start-delay", "60"])
        .arg("--trigger-file")
        .arg(&trigger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let ready: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let pid = target.id();
    // After the attach (1-3.6 s quiet, several times that under load).
    let toucher = touch_later(trigger, Duration::from_secs(10));
    let trace = trace(&["record", "--pid", &pid.to_string(), "--duration", "60s"]);
    toucher.join().unwrap();
    let forked: serde_json::Value = lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .find(|v| v["event"] == "forked")
        .expect("the master forked");
    assert!(target.wait().unwrap().success());
    // What /proc said of the master while flat: at ready and after its forks.
    let vm_rss = |event: &serde_json::Value| event["master_status"]["VmRSS"].as_f64().unwrap();
    let (at_ready, after_forks) = (vm_rss(&ready), vm_rss(&forked));
    let row = trace.row_of(u64::from(pid));
    let rss = &row["rss"];
    let (start, end) = (
        rss["start_bytes"].as_f64().unwrap(),
        rss["end_bytes"].as_f64().unwrap(),
    );
    const MIB: f64 = 1024.0 * 1024.0;
    assert!(
        (start - at_ready).abs() <= 2.0 * MIB,
        "start {start} vs /proc's {at_ready} at attach: {row:#}"
    );
    assert!(
        end >= start - MIB && (end - after_forks).abs() <= 2.0 * MIB,
        "a flat master shows no drop: {start} -> {end}, /proc {after_forks} after the forks: {row:#}"
    );
}

#[test]
fn a_deleted_and_replaced_interpreter_is_probed_as_the_file_it_mapped() {
    let _python = require_ebpf!(common::interpreter(&["/usr/bin/python3.11".into()]));
    let dir = tempfile::tempdir().unwrap();
    // A copy of the static interpreter (its symbols are in the executable).
    let copy = dir.path().join("python3.11");
    std::fs::copy("/usr/bin/python3.11", &copy).unwrap();
    let trigger = dir.path().join("go");
    let mut target = Command::new(&copy)
        .arg(script("wait_then_grow.py"))
        .args(["--mib", "48", "--start-delay", "60", "--hold", "1"])
        .arg("--trigger-file")
        .arg(&trigger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("\"ready\""));
    // Deleted, and another file (with no CPython in it) put at its path.
    std::fs::remove_file(&copy).unwrap();
    std::fs::copy("/bin/true", &copy).unwrap();
    let pid = target.id();
    let toucher = touch_later(trigger, Duration::from_secs(10));
    let trace = trace(&["record", "--pid", &pid.to_string(), "--duration", "60s"]);
    toucher.join().unwrap();
    assert!(target.wait().unwrap().success());
    let stderr = String::from_utf8_lossy(&trace.output.stderr);
    assert!(
        !stderr.contains("has no Py_FinalizeEx/Py_Exit symbol"),
        "{stderr}"
    );
    let row = trace.row_of(u64::from(pid));
    assert_eq!(row["python"]["version"], "3.11.2", "{row:#}");
    // Its life ends where finalization began, before the objects are freed.
    assert_eq!(row["exit_began_by"], "python_finalize", "{row:#}");
}

#[test]
fn run_says_the_command_was_held_until_attached() {
    let python = require_ebpf!(python_3_11());
    let before = SystemTime::now();
    let trace = trace(&["run", "--", python.to_str().unwrap(), "-c", "pass"]);
    assert_attach_reported(&trace, before, true);
}

/// The JSON meta has the attach time, and the table's header says what it
/// hid: growth before then (`record`), or nothing (`run`, held command).
fn assert_attach_reported(trace: &Trace, started: SystemTime, held: bool) {
    let meta = &trace.report["meta"];
    let attach_ns = meta["attach_ns"].as_u64().unwrap();
    assert!(
        attach_ns > 1_000_000 && attach_ns < 60_000_000_000,
        "{meta:#}"
    );
    assert_eq!(meta["command_held"], held, "{meta:#}");
    let attached =
        SystemTime::UNIX_EPOCH + Duration::from_nanos(meta["attached_unix_ns"].as_u64().unwrap());
    assert!(
        attached >= started && attached <= SystemTime::now(),
        "{meta:#}"
    );
    let stdout = trace.stdout();
    let took = format!("attaching took {:.1} s", attach_ns as f64 / 1e9);
    let expected = if held {
        format!("memtrace: the command was held before its first instruction until tracing was attached ({took}): none of its growth is missed")
    } else {
        let clock = humantime::format_rfc3339_seconds(attached).to_string();
        format!(
            "memtrace: growth before {} UTC ({took}) is not seen",
            &clock[11..19]
        )
    };
    assert!(stdout.contains(&expected), "no {expected:?} in:\n{stdout}");
}

/// Creates `path` after `delay`, on another thread.
fn touch_later(path: std::path::PathBuf, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        std::fs::write(path, b"go").unwrap();
    })
}
