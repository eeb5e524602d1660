//! Allocator mode's kernel state across the end of a process, through the
//! library's `Tracer` (real eBPF; needs root and BTF, skipped otherwise):
//! the live set (`ALLOC_LIVE`, shared by every process) keeps no block of
//! an ended process, even blocks userspace never saw; and a tgid reused
//! after a lost exit record gets probes of its own.
//!
//! The ring buffer is never drained here: userspace knows none of the
//! sampled blocks, as when their records were lost on a full ring buffer.

#[expect(
    dead_code,
    reason = "these tests drive the Tracer directly: no memtrace run, no report"
)]
mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use memtrace::bpf::{Tracer, TracerOptions};
use memtrace::process::proc::start_time_ns;

use common::{python_3_11, require_ebpf, skip};

/// Keeps 64 blocks of 1 MiB (glibc `malloc`, each sampled at the 4 KiB
/// mean below) after a line on stdin, then exits without freeing them
/// after another.
const KEEPER: &str = r#"
import os, sys
print("ready", flush=True)
sys.stdin.readline()
kept = [bytearray(1 << 20) for _ in range(64)]
print("kept", flush=True)
sys.stdin.readline()
os._exit(0)
"#;

/// Blocks `KEEPER` keeps.
const KEPT_BLOCKS: u64 = 64;

/// A running `KEEPER`.
struct Keeper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Keeper {
    fn spawn(python: &Path) -> Self {
        let mut child = Command::new(python)
            .args(["-c", KEEPER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        expect_line(&mut stdout, "ready");
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn tgid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it allocate; returns once it kept its blocks.
    fn keep(&mut self) {
        self.stdin.write_all(b"\n").unwrap();
        expect_line(&mut self.stdout, "kept");
    }

    /// Lets it exit (past both of its waits), and reaps it.
    fn exit(mut self) {
        let _ = self.stdin.write_all(b"\n\n");
        self.child.wait().unwrap();
    }
}

fn expect_line(stdout: &mut BufReader<ChildStdout>, want: &str) {
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), want);
}

fn tracer() -> Tracer {
    Tracer::load(&TracerOptions {
        sample_interval_bytes: 4096,
        follow_forks: false,
        wakeup_threshold_bytes: 1 << 20,
        allocations: true,
        ring_bytes: None,
    })
    .expect("load the eBPF object with allocator mode")
}

/// The glibc `libc.so.6` process `tgid` maps.
fn libc_of(tgid: u32) -> PathBuf {
    let maps = std::fs::read_to_string(format!("/proc/{tgid}/maps")).unwrap();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("python maps glibc")
}

fn hook(tracer: &mut Tracer, tgid: u32) -> Vec<PathBuf> {
    let start = start_time_ns(tgid).unwrap();
    tracer
        .attach_allocator(tgid, start, None, Some(&libc_of(tgid)), None)
        .expect("attach the allocator probes")
}

fn live_blocks(tracer: &Tracer, tgid: u32) -> u64 {
    tracer
        .alloc_live_blocks()
        .unwrap()
        .get(&tgid)
        .copied()
        .unwrap_or(0)
}

#[test]
fn an_ended_process_leaves_no_block_in_the_live_set() {
    let python = require_ebpf!(python_3_11());
    let mut tracer = tracer();
    let mut keeper = Keeper::spawn(&python);
    let tgid = keeper.tgid();
    assert!(!hook(&mut tracer, tgid).is_empty());
    keeper.keep();
    let before = live_blocks(&tracer, tgid);
    assert!(
        before >= KEPT_BLOCKS,
        "{before} blocks of {tgid} in the live set, {KEPT_BLOCKS} kept"
    );
    keeper.exit();
    let dropped = tracer.detach_allocator(tgid);
    assert_eq!(live_blocks(&tracer, tgid), 0, "{dropped} dropped");
    // Its blocks went (the interpreter may have freed a few on its way out).
    assert!(
        dropped as u64 >= KEPT_BLOCKS,
        "{dropped} dropped of {before}"
    );
}

/// Sets the kernel's last pid so that the next process gets `tgid`.
fn next_pid_is(tgid: u32) -> bool {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (tgid - 1).to_string()).is_ok()
}

#[test]
fn a_tgid_reused_after_a_lost_exit_gets_probes_of_its_own() {
    let python = require_ebpf!(python_3_11());
    let mut tracer = tracer();
    let mut first = Keeper::spawn(&python);
    let tgid = first.tgid();
    assert!(!hook(&mut tracer, tgid).is_empty());
    first.keep();
    assert!(live_blocks(&tracer, tgid) >= KEPT_BLOCKS);
    // It exits and its exit is never told to the tracer (a lost record).
    first.exit();
    let mut second = None;
    for _ in 0..20 {
        if !next_pid_is(tgid) {
            break;
        }
        let keeper = Keeper::spawn(&python);
        if keeper.tgid() == tgid {
            second = Some(keeper);
            break;
        }
        keeper.exit();
    }
    let Some(mut second) = second else {
        skip(&format!("tgid {tgid} could not be reused (ns_last_pid)"));
        return;
    };
    let hooked = hook(&mut tracer, tgid);
    assert!(!hooked.is_empty(), "the new process was taken as hooked");
    // The first process's blocks went with its stale probes.
    assert_eq!(live_blocks(&tracer, tgid), 0);
    second.keep();
    let blocks = live_blocks(&tracer, tgid);
    assert!(
        blocks >= KEPT_BLOCKS,
        "{blocks} blocks of the new process in the live set"
    );
    second.exit();
    tracer.detach_allocator(tgid);
}
