//! `memtrace record --pid --allocations` installs the in-process sampler in
//! a running CPython 3.14 started without memtrace, through the
//! interpreter's own remote debugging (PEP 768): the kept function's bytes
//! against the workload's own count, then the process runs on after memtrace
//! detached and prints what an untraced run prints. A process that disabled
//! remote debugging, and a 3.11, are told why and keep the default mode;
//! `--alloc-hooks uprobes` hooks them on request.
//!
//! Real eBPF, Debian's 3.14 under target/interpreters and pyenv's 3.11;
//! skipped without root, BTF or the interpreters, with the reason.

#[expect(
    dead_code,
    reason = "these tests read the allocations section and start their own processes"
)]
mod common;

use std::io::{BufRead as _, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{debian_python, memtrace, python_3_11, require_ebpf, script, stderr_of};

/// Allowed relative error of sampled bytes against the workload's count
/// (the bound; ~1,600 samples at this mean: ~2.5% standard error).
const TOLERANCE: f64 = 0.15;

/// Sampling mean of these runs, in bytes.
const SAMPLE_BYTES: &str = "65536";

/// A workload started without memtrace, its standard output read line by
/// line.
struct Target {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Target {
    /// Starts `python` with `args`, environment `envs`, and waits for its
    /// `ready` line.
    fn start(python: &Path, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut child = Command::new(python)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut target = Self { child, lines };
        target.event("ready");
        target
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads lines up to the JSON line of `event` and returns it.
    fn event(&mut self, event: &str) -> Value {
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                if value["event"] == event {
                    return value;
                }
            }
        }
        panic!("the target ended without a `{event}` line");
    }
}

impl Drop for Target {
    /// Ends it (the idle targets loop forever; a failed test leaves none).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `memtrace record` running in the background, writing into its own
/// folder.
struct Record {
    child: Child,
    dir: tempfile::TempDir,
}

impl Record {
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = memtrace()
            .arg("record")
            .arg("--quiet")
            .arg("--output-dir")
            .arg(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Self { child, dir }
    }

    /// Waits for it to end with success; its standard error and JSON report.
    fn finish(self) -> (String, Value) {
        let output = self.child.wait_with_output().unwrap();
        let stderr = stderr_of(&output);
        assert!(output.status.success(), "memtrace failed: {stderr}");
        let json = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .unwrap_or_else(|| panic!("no JSON report; memtrace said: {stderr}"));
        let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        (stderr, report)
    }

    /// Ctrl-C, then [`Record::finish`].
    fn interrupt(self) -> (String, Value) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        self.finish()
    }
}

/// Waits up to 60 s for `check`, failing with `what` (memtrace may take a
/// while to load its programs on a loaded machine).
fn wait_for(what: &str, record: &mut Record, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        if let Some(status) = record.child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(record.child.stderr.as_mut().unwrap(), &mut stderr)
                .unwrap();
            panic!("memtrace ended ({status}) before {what}: {stderr}");
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` maps memtrace's sampler library.
fn maps_sampler(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("libmemtrace_sampler.so"))
}

/// The value of the sampler's `memtrace_sampler_on` in process `pid`
/// (whether its wrappers sample), if it maps the library: its address
/// from the mapped file's own `.dynsym` (through /proc/PID/map_files: the
/// file is deleted at the end of the record), read in /proc/PID/mem.
fn sampler_on(pid: u32) -> Option<bool> {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    use std::os::unix::fs::FileExt as _;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps.lines().find(|l| {
        l.contains("libmemtrace_sampler.so") && l.split_whitespace().nth(2) == Some("00000000")
    })?;
    let range = line.split_whitespace().next()?;
    let base = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
    let elf = std::fs::read(format!("/proc/{pid}/map_files/{range}")).ok()?;
    let file = object::File::parse(&*elf).ok()?;
    let lowest = file.segments().map(|s| s.address()).min()?;
    let symbol = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("memtrace_sampler_on"))?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut value = [0u8; 4];
    mem.read_exact_at(&mut value, base + symbol.address() - lowest)
        .ok()?;
    Some(u32::from_ne_bytes(value) != 0)
}

/// The allocations entry of `tgid` in `report`.
fn alloc_entry(report: &Value, tgid: u32) -> &Value {
    report["allocations"]["processes"]
        .as_array()
        .expect("the report has an allocations section")
        .iter()
        .find(|p| p["tgid"].as_u64() == Some(u64::from(tgid)))
        .unwrap_or_else(|| panic!("no allocations entry for {tgid}: {report}"))
}

/// The sum of `field` over the paths of `entry` through `function`.
fn function_bytes(entry: &Value, function: &str, field: &str) -> f64 {
    let frame = format!("{function} (");
    entry["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|path| {
            path["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.starts_with(&frame)))
        })
        .map(|path| path[field].as_u64().unwrap() as f64)
        .sum()
}

fn assert_within(actual: f64, expected: f64, what: &str) {
    let error = (actual - expected).abs() / expected;
    assert!(
        error <= TOLERANCE,
        "{what}: memtrace says {actual:.0} bytes, the workload counted {expected:.0} ({:.1}% off)",
        error * 100.0
    );
}

/// The arguments of alloc_remote_target.py with its two gate files.
fn target_args<'a>(workload: &'a Path, go: &'a Path, after: &'a Path) -> Vec<&'a str> {
    vec![
        workload.to_str().unwrap(),
        "--keep-mib",
        "64",
        "--churn-mib",
        "256",
        "--go",
        go.to_str().unwrap(),
        "--after",
        after.to_str().unwrap(),
    ]
}

/// What an untraced run of alloc_remote_target.py prints at the end.
fn untraced_checksum(python: &Path, workload: &Path, gates: &Path, envs: &[(&str, &str)]) -> Value {
    let (go, after) = (gates.join("go-untraced"), gates.join("after-untraced"));
    std::fs::write(&go, b"").unwrap();
    std::fs::write(&after, b"").unwrap();
    let mut target = Target::start(python, &target_args(workload, &go, &after), envs);
    let done = target.event("done");
    assert!(target.child.wait().unwrap().success());
    done["checksum"].clone()
}

#[test]
fn record_installs_the_sampler_in_a_running_3_14_and_leaves_it_running() {
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    record_into_running(&python, &[], Launch::Plain);
}

#[test]
fn record_installs_the_sampler_over_the_debug_allocator() {
    // The debug hooks' allocators have a ctx of their own per domain: the
    // wrappers must hand each its own.
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    record_into_running(&python, &[("PYTHONMALLOC", "debug")], Launch::Plain);
}

#[test]
fn record_installs_the_sampler_in_a_target_of_another_user() {
    // The files memtrace (root) writes are read by the target's uid.
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    record_into_running(&python, &[], Launch::Nobody);
}

#[test]
fn record_installs_the_sampler_in_a_target_with_a_tmp_of_its_own() {
    // A mount namespace of its own with a private /tmp (as systemd's
    // PrivateTmp): the files must be where the target looks.
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    record_into_running(&python, &[], Launch::OwnTmp);
}

/// How the target of [`record_into_running`] starts.
#[derive(Clone, Copy)]
enum Launch {
    /// As the test (root), in its mount namespace.
    Plain,
    /// In a mount namespace of its own with a tmpfs on /tmp (`unshare`).
    OwnTmp,
    /// As user `nobody` (`setpriv`).
    Nobody,
}

/// `record --pid --allocations` into alloc_remote_target.py under `python`
/// with environment `envs`, started without memtrace: the sampler is
/// installed, the kept and churned bytes are seen within [`TOLERANCE`], and
/// after the record the process runs on to the end an untraced run reaches,
/// printing the same, with nothing on its standard error.
fn record_into_running(python: &Path, envs: &[(&str, &str)], launch: Launch) {
    // Not under /tmp: the target with a /tmp of its own sees them too;
    // searchable by all: so does one of another user.
    let gates = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(
        gates.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (go, after) = (gates.path().join("go"), gates.path().join("after"));
    let workload = script("alloc_remote_target.py");
    let args = target_args(&workload, &go, &after);
    let python_arg = python.to_str().unwrap();
    let mut target = match launch {
        Launch::Plain => Target::start(python, &args, envs),
        Launch::OwnTmp => {
            let line = format!(
                "mount --make-rprivate / && mount -t tmpfs memtrace-test /tmp && exec {python_arg} {}",
                args.join(" ")
            );
            let unshare = ["--mount", "sh", "-c", &line];
            Target::start(Path::new("unshare"), &unshare, envs)
        }
        Launch::Nobody => {
            let mut setpriv = vec![
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python_arg,
            ];
            setpriv.extend(&args);
            Target::start(Path::new("setpriv"), &setpriv, envs)
        }
    };
    let pid = target.pid();
    let pid_arg = pid.to_string();
    let mut record = Record::start(&[
        "--pid",
        &pid_arg,
        "--allocations",
        "--sample-bytes",
        SAMPLE_BYTES,
    ]);
    wait_for("the sampler in the target", &mut record, || {
        sampler_on(pid) == Some(true)
    });
    std::fs::write(&go, b"").unwrap();
    let kept = target.event("kept");
    let churned = target.event("churned");
    let (stderr, report) = record.interrupt();
    assert_eq!(sampler_on(pid), Some(false), "sampling after the record");

    std::fs::write(&after, b"").unwrap();
    let done = target.event("done");
    let status = target.child.wait().unwrap();
    let mut target_stderr = String::new();
    std::io::Read::read_to_string(target.child.stderr.as_mut().unwrap(), &mut target_stderr)
        .unwrap();
    assert!(status.success(), "the target failed: {target_stderr}");
    assert_eq!(target_stderr, "", "the target's standard error");
    assert_eq!(
        done["checksum"],
        untraced_checksum(python, &workload, gates.path(), envs),
        "the target's output, traced and untraced"
    );

    assert!(stderr.contains("remote debugging (PEP 768)"), "{stderr}");
    assert!(!stderr.contains("cannot stop its sampler"), "{stderr}");
    let entry = alloc_entry(&report, pid);
    assert_eq!(entry["hook"]["status"], "hooked", "{entry}");
    assert_within(
        function_bytes(entry, "keep_small_objects", "leaked_bytes"),
        kept["getsizeof_bytes"].as_f64().unwrap(),
        "leaked by keep_small_objects",
    );
    let churned = churned["allocated_bytes"].as_f64().unwrap();
    assert_within(
        function_bytes(entry, "churn", "temporary_bytes"),
        churned,
        "temporary in churn",
    );
}

/// An idle CPython that loops in Python code, with `args` before `-c`.
fn idle(python: &Path, args: &[&str], envs: &[(&str, &str)]) -> Target {
    let code = "import json, os, time\n\
                print(json.dumps({'event': 'ready', 'pid': os.getpid()}), flush=True)\n\
                while True:\n    time.sleep(0.02)\n";
    let mut all = args.to_vec();
    all.extend(["-c", code]);
    Target::start(python, &all, envs)
}

#[test]
fn a_target_that_refuses_remote_debugging_is_told_why_and_uprobes_hook_it_on_request() {
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    let Some(old) = python_3_11() else { return };
    let by_env = idle(&python, &[], &[("PYTHON_DISABLE_REMOTE_DEBUG", "1")]);
    // The option is spelled with hyphens: `-X disable_remote_debug` is
    // accepted and ignored (Debian's 3.14.10 still takes scripts then).
    let by_option = idle(&python, &["-X", "disable-remote-debug"], &[]);
    let old_python = idle(&old, &[], &[]);
    let pids: Vec<String> = [&by_env, &by_option, &old_python]
        .iter()
        .map(|t| t.pid().to_string())
        .collect();
    let mut args = vec!["--allocations", "--duration", "4s", "--pid"];
    args.extend(pids.iter().map(String::as_str));
    let (stderr, report) = Record::start(&args).finish();
    for target in [&by_env, &by_option] {
        let pid = target.pid();
        assert!(
            stderr.contains(&format!(
                "process {pid} disabled CPython's remote debugging"
            )),
            "{stderr}"
        );
        let entry = alloc_entry(&report, pid);
        assert_eq!(entry["hook"]["status"], "not_hooked", "{entry}");
        assert!(!maps_sampler(pid));
    }
    assert!(
        stderr.contains("CPython 3.11") && stderr.contains("PEP 768 came with 3.14"),
        "{stderr}"
    );
    assert!(stderr.contains("--alloc-hooks uprobes"), "{stderr}");

    args.extend(["--alloc-hooks", "uprobes"]);
    let (stderr, report) = Record::start(&args).finish();
    assert!(stderr.contains("allocator mode with uprobes"), "{stderr}");
    for target in [&by_env, &by_option, &old_python] {
        let entry = alloc_entry(&report, target.pid());
        assert_eq!(entry["hook"]["status"], "hooked", "{entry}");
    }
}

#[test]
fn a_main_thread_blocked_past_the_timeout_is_told_and_the_request_withdrawn() {
    let python: PathBuf = require_ebpf!(debian_python("3.14"));
    // Its main thread sleeps in the kernel until SIGUSR1, whose handler
    // (Python code: an eval-breaker check) prints `woke`.
    let code = "import json, os, signal, sys, time\n\
                def woke(*_):\n    print(json.dumps({'event': 'woke'}), flush=True)\n\
                signal.signal(signal.SIGUSR1, woke)\n\
                print(json.dumps({'event': 'ready', 'pid': os.getpid()}), flush=True)\n\
                time.sleep(3600)\n";
    let mut target = Target::start(&python, &["-c", code], &[]);
    let pid = target.pid().to_string();
    let args = ["--allocations", "--duration", "13s", "--pid", &pid];
    let (stderr, report) = Record::start(&args).finish();
    assert!(
        stderr.contains("its main thread ran no Python code within 10 s"),
        "{stderr}"
    );
    let entry = alloc_entry(&report, target.pid());
    assert_eq!(entry["hook"]["status"], "not_hooked", "{entry}");
    // Woken after the record, it does not run the withdrawn script (whose
    // file is gone: CPython would say so on its standard error).
    let nix_pid = nix::unistd::Pid::from_raw(i32::try_from(target.pid()).unwrap());
    nix::sys::signal::kill(nix_pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
    target.event("woke");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!maps_sampler(target.pid()));
    target.child.kill().unwrap();
    target.child.wait().unwrap();
    let mut target_stderr = String::new();
    std::io::Read::read_to_string(target.child.stderr.as_mut().unwrap(), &mut target_stderr)
        .unwrap();
    assert_eq!(target_stderr, "", "the target's standard error");
}
