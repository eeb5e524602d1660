//! How a traced process ended, said where the on-call engineer reads
//! first: the real memtrace binary traces real Python processes that a
//! signal ends (a script that SIGKILLs itself; one the kernel's OOM killer
//! kills inside a memory-limited cgroup of its own), and the process table,
//! the verdict and the JSON must say so, the OOM killer by name, as the
//! kernel tells it (the cgroup's own `oom_kill` count).
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; the OOM test also needs a cgroup memory controller (v2
//! `memory.max` or v1 `memory.limit_in_bytes`). Without them they print why
//! they skip.

#[expect(
    dead_code,
    reason = "endings.rs reads the process rows and the terminal text: most of `common`'s readers go unused"
)]
mod common;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use common::{python_3_11, require_ebpf, script, skip, trace_expecting, trace_script_expecting};

/// The verdict's lines of a terminal report (from `Verdict: ` on).
fn verdict_of(stdout: &str) -> &str {
    &stdout[stdout.rfind("\nVerdict: ").expect("a verdict") + 1..]
}

/// The process table's row of the image of `tgid` running
/// hold_then_exit.py (its TGID column `tgid`, or `tgid.N` after an exec).
fn table_row(stdout: &str, tgid: u64) -> &str {
    stdout
        .lines()
        .find(|l| {
            let column = l.split_whitespace().next().unwrap_or_default();
            let tgid = tgid.to_string();
            (column == tgid || column.starts_with(&format!("{tgid}.")))
                && l.contains("hold_then_exit.py")
        })
        .unwrap_or_else(|| panic!("no row for tgid {tgid}:\n{stdout}"))
}

#[test]
fn a_process_killed_by_sigkill_is_said_in_the_table_and_the_verdict() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script_expecting(
        &python,
        "hold_then_exit.py",
        &[
            "--mib",
            "40",
            "--hold-seconds",
            "1",
            "--exit-mode",
            "sigkill",
        ],
        137,
    );
    let pid = trace.workload_event("exiting")["pid"].as_u64().unwrap();
    let row = trace.row_of(pid);
    assert_eq!(
        row["exit_status"],
        serde_json::json!({"how": "signal", "signal": 9, "core_dumped": false}),
        "a SIGKILL it sent itself is no OOM kill: {row:#}"
    );
    let stdout = trace.stdout();
    assert!(
        table_row(&stdout, pid).contains(" SIGKILL at "),
        "{}",
        table_row(&stdout, pid)
    );
    let verdict = verdict_of(&stdout);
    let said = verdict
        .lines()
        .find(|l| l.trim_start().starts_with("ended by a signal: "))
        .unwrap_or_else(|| panic!("the verdict does not say it was killed:\n{verdict}"));
    assert!(
        said.contains(&format!("tgid {pid} ("))
            && said.contains(") SIGKILL at ")
            && said.contains("hold_then_exit.py"),
        "{said}"
    );
    assert!(!verdict.contains("OOM killer"), "{verdict}");
}

/// A memory cgroup of its own, limited to `limit_bytes`, removed when
/// dropped (after its processes are gone).
struct LimitedCgroup {
    dir: PathBuf,
    /// The file whose `oom_kill N` line counts the cgroup's OOM kills.
    events: PathBuf,
}

impl LimitedCgroup {
    /// Under cgroup v2 when its memory controller is enabled at the root,
    /// else under the v1 memory hierarchy; `None` when neither is writable.
    fn create(limit_bytes: u64) -> Option<Self> {
        let name = format!("memtrace-oom-test-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup");
        let v2_memory = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
        let (dir, limit_file, events) = if v2_memory {
            let dir = v2.join(&name);
            (
                dir.clone(),
                dir.join("memory.max"),
                dir.join("memory.events"),
            )
        } else {
            let dir = Path::new("/sys/fs/cgroup/memory").join(&name);
            (
                dir.clone(),
                dir.join("memory.limit_in_bytes"),
                dir.join("memory.oom_control"),
            )
        };
        std::fs::create_dir(&dir).ok()?;
        let cgroup = Self { dir, events };
        std::fs::write(limit_file, limit_bytes.to_string()).ok()?;
        Some(cgroup)
    }

    /// The kernel's count of OOM kills in the cgroup.
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        // The killed processes leave the cgroup once reaped.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_process_the_oom_killer_killed_is_named_so() {
    let python = require_ebpf!(python_3_11());
    // 64 MiB for a script that wants 400: only it can run out, not the host.
    let Some(cgroup) = LimitedCgroup::create(64 * 1024 * 1024) else {
        skip("no writable cgroup memory controller (v2 memory.max or v1 memory.limit_in_bytes)");
        return;
    };
    // The shell moves itself into the cgroup and execs the script there.
    let line = format!(
        "echo $$ > {}/cgroup.procs && exec {} {} --mib 400 --hold-seconds 1 --exit-mode normal",
        cgroup.dir.display(),
        python.display(),
        script("hold_then_exit.py").display()
    );
    let trace = trace_expecting(&["run", "--", "sh", "-c", &line], 137);
    assert_eq!(cgroup.oom_kills(), 1, "the kernel counts one OOM kill");
    let killed: Vec<&Value> = trace
        .processes()
        .iter()
        .filter(|p| p["exit_status"]["signal"] == 9)
        .collect();
    let [row] = killed.as_slice() else {
        panic!("not one killed image: {:#?}", trace.processes());
    };
    assert_eq!(row["exit_status"]["oom_killed"], true, "{row:#}");
    assert!(
        row["cmdline"]
            .as_str()
            .unwrap()
            .contains("hold_then_exit.py"),
        "{row:#}"
    );
    // It reached the limit: its peak is near 64 MiB (70.2 MiB in a run
    // here: its RSS counts file pages the cgroup charged before it).
    let peak = row["rss"]["peak_bytes"].as_u64().unwrap();
    assert!(
        (48 * 1024 * 1024..=96 * 1024 * 1024).contains(&peak),
        "peak {peak}"
    );
    let tgid = row["tgid"].as_u64().unwrap();
    let stdout = trace.stdout();
    assert!(
        table_row(&stdout, tgid).contains("SIGKILL (OOM killer) at "),
        "{}",
        table_row(&stdout, tgid)
    );
    let verdict = verdict_of(&stdout);
    let said = verdict
        .lines()
        .find(|l| l.trim_start().starts_with("killed by the OOM killer: "))
        .unwrap_or_else(|| panic!("the verdict does not name the OOM killer:\n{verdict}"));
    assert!(said.contains(&format!("tgid {tgid}")), "{said}");
}
