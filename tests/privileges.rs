//! Capability-only operation: the memtrace binary under `setpriv` with
//! exactly the set README's Requirements name runs a real short trace of a
//! real CPython, as uid 0 and as an unprivileged uid; with one capability
//! less, each refusal names the capability that is missing (and root is
//! never told to "run it with sudo").
//!
//! The sets: CAP_BPF + CAP_PERFMON load and attach the programs;
//! CAP_SYS_PTRACE opens /proc/PID/mem of another user's process (Python
//! stacks); a uid other than 0 also needs CAP_DAC_READ_SEARCH, because
//! tracefs (where the syscall tracepoints' ids are read) is mode 0700 root.
//!
//! Needs root (to drop to the sets), BTF, util-linux's `setpriv` (installed
//! by `cargo xtask test`) and Debian's /usr/bin/python3.11 (a target every
//! uid may run, unlike root's pyenv); skips with a printed reason otherwise.

#[expect(
    dead_code,
    reason = "these tests read reports through a few of the shared helpers only"
)]
mod common;

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use common::{require_ebpf, script, skip, stack_functions, stderr_of};
use serde_json::Value;

/// The unprivileged uid and gid the tests drop to (`nobody`).
const NOBODY: u32 = 65534;
/// Debian's interpreter: executable by every uid.
const SYSTEM_PYTHON: &str = "/usr/bin/python3.11";
/// `setpriv`'s path.
const SETPRIV: &str = "/usr/bin/setpriv";
/// What README says is enough as uid 0.
const ROOT_SET: &[&str] = &["bpf", "perfmon", "sys_ptrace"];
/// What README says is enough as any other uid.
const USER_SET: &[&str] = &["bpf", "perfmon", "sys_ptrace", "dac_read_search"];

/// Whether the tools are here; prints why not.
fn tools_missing() -> bool {
    for needed in [SETPRIV, SYSTEM_PYTHON] {
        if !Path::new(needed).exists() {
            skip(&format!("{needed} is not installed"));
            return true;
        }
    }
    false
}

/// `setpriv` running memtrace with exactly `caps` (setpriv names, e.g.
/// `bpf`) in its inheritable, ambient and bounding sets, as `uid` (with the
/// same gid and no supplementary groups) unless it is 0.
fn memtrace_with(uid: u32, caps: &[&str]) -> Command {
    let list = |prefix: &str| {
        std::iter::once("-all".to_owned())
            .chain(caps.iter().map(|c| format!("{prefix}{c}")))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut command = Command::new(SETPRIV);
    if uid != 0 {
        command.args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".to_owned(),
        ]);
    }
    command
        .arg(format!("--inh-caps={}", list("+")))
        .arg(format!("--ambient-caps={}", list("+")))
        .arg(format!("--bounding-set={}", list("+")))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_memtrace"))
        .stdin(Stdio::null());
    command
}

/// A folder every uid may write the report to.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// `memtrace run` of grow_cache.py on the system Python, as `uid` with
/// `caps`, writing into `dir`.
fn run_grow_cache(uid: u32, caps: &[&str], dir: &Path) -> Output {
    memtrace_with(uid, caps)
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir)
        .args(["--", SYSTEM_PYTHON])
        .arg(script("grow_cache.py"))
        .args(["--mib", "32", "--hold", "0.5"])
        .output()
        .unwrap()
}

/// The JSON report in `dir`.
fn json_report(dir: &Path) -> Value {
    let path: PathBuf = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("memtrace wrote a JSON report");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The trace in `dir` attributed growth to `fill_cache` in a Python row.
fn assert_traced_python(output: &Output, dir: &Path) {
    assert!(
        output.status.success(),
        "memtrace failed: {}\n{}",
        output.status,
        stderr_of(output)
    );
    let report = json_report(dir);
    let processes = report["processes"].as_array().unwrap();
    assert!(
        processes.iter().any(|p| p["python"]["status"] == "python"),
        "{processes:#?}"
    );
    let grown = report["paths"].as_array().unwrap().iter().any(|path| {
        stack_functions(&report, path["stack"].as_u64().unwrap())
            .iter()
            .any(|f| f == "fill_cache")
    });
    assert!(grown, "no fill_cache path:\n{}", stderr_of(output));
}

#[test]
fn root_with_only_bpf_perfmon_and_sys_ptrace_traces() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    let dir = shared_dir();
    let output = run_grow_cache(0, ROOT_SET, dir.path());
    assert_traced_python(&output, dir.path());
}

#[test]
fn another_uid_with_the_documented_set_traces() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    let dir = shared_dir();
    let output = run_grow_cache(NOBODY, USER_SET, dir.path());
    assert_traced_python(&output, dir.path());
}

#[test]
fn the_command_run_starts_gets_none_of_memtraces_capabilities() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    let dir = shared_dir();
    let output = memtrace_with(NOBODY, USER_SET)
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir.path())
        .args(["--", "/bin/sh", "-c", "grep '^Cap' /proc/self/status"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    let status = String::from_utf8_lossy(&output.stdout);
    for set in ["CapAmb", "CapPrm", "CapEff"] {
        assert!(
            status.contains(&format!("{set}:\t0000000000000000")),
            "{set} of the command is not empty:\n{status}"
        );
    }
}

#[test]
fn another_uid_without_cap_dac_read_search_is_told_to_add_it() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    let tracefs = std::fs::metadata("/sys/kernel/tracing").unwrap();
    if tracefs.mode() & 0o005 == 0o005 {
        skip("tracefs is searchable by every uid here: nothing to refuse");
        return;
    }
    let dir = shared_dir();
    let output = run_grow_cache(NOBODY, ROOT_SET, dir.path());
    assert!(!output.status.success());
    let text = stderr_of(&output);
    assert!(
        text.contains("cannot be read by uid 65534 without CAP_DAC_READ_SEARCH"),
        "{text}"
    );
    assert!(!text.contains("is not mounted"), "{text}");
}

#[test]
fn root_without_cap_bpf_is_told_which_capability_and_not_sudo() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    let dir = shared_dir();
    // Everything but CAP_BPF and CAP_SYS_ADMIN (which would stand in for it).
    let output = Command::new(SETPRIV)
        .args([
            "--bounding-set=-bpf,-sys_admin",
            "--inh-caps=-bpf,-sys_admin",
        ])
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_memtrace"))
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir.path())
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = stderr_of(&output);
    assert!(
        text.contains("CAP_BPF missing from its effective capabilities"),
        "{text}"
    );
    assert!(text.contains("runs as root (uid 0)"), "{text}");
    assert!(!text.contains("sudo"), "{text}");
}

#[test]
fn recording_another_users_process_names_cap_sys_ptrace() {
    require_ebpf!();
    if tools_missing() {
        return;
    }
    // A process of root, which uid 65534 may not read without CAP_SYS_PTRACE.
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = target.id().to_string();
    let dir = shared_dir();
    let record = |caps: &[&str]| {
        memtrace_with(NOBODY, caps)
            .args(["record", "--quiet", "--duration", "1s", "--output-dir"])
            .arg(dir.path())
            .args(["--pid", &pid])
            .output()
            .unwrap()
    };
    let without: Vec<&str> = USER_SET
        .iter()
        .copied()
        .filter(|&c| c != "sys_ptrace")
        .collect();
    let refused = record(&without);
    let with = record(USER_SET);
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(!refused.status.success());
    let text = stderr_of(&refused);
    assert!(
        text.contains(&format!(
            "cannot read the memory of PID {pid} (uid 0) as uid 65534: memtrace needs \
             CAP_SYS_PTRACE"
        )),
        "{text}"
    );
    assert!(with.status.success(), "{}", stderr_of(&with));
}
