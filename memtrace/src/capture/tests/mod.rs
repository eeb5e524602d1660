//! Capture tests driven by synthetic runs: a [`Recorder`] feeds the live
//! aggregator, the held-page map and a writer; the file is read back and
//! replayed, and must give the live run's report. This module holds the
//! synthetic run; `replay` checks what replays, `reader` what reading a
//! damaged or foreign file says, `writer` what the file holds.

mod reader;
mod replay;
mod writer;

use std::cell::RefCell;
use std::io::{self, Write};
use std::ops::Range;
use std::path::Path;
use std::rc::Rc;

use memtrace_common::{MemoryEvent, ProcessCounters};

use super::*;
use crate::aggregate::test_support::{leak_stack, native, parse_stack, py, rss, start, MIB};
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, MappingKind, MemorySample, PathReport, ProcessId,
    ProcessStart, PythonStatus, Report, Role, RunMeta, Sharing,
};

/// One second, in nanoseconds.
const S: u64 = 1_000_000_000;
/// Run start of the synthetic runs (CLOCK_MONOTONIC ns).
const START_NS: u64 = 5 * S;

fn header() -> Header {
    Header {
        memtrace_capture: CAPTURE_VERSION,
        created_unix_s: 1_796_022_265,
        command: "python3 server.py".to_owned(),
        start_ns: START_NS,
        sample_interval_bytes: 512 * 1024,
    }
}

/// A recorder writing a capture into `out`, named `path`.
fn recorder<W: Write>(path: &Path, out: W) -> Recorder<W> {
    let writer = CaptureWriter::new(path, out, &header()).unwrap();
    Recorder::new(
        Aggregator::new(START_NS),
        Some(writer),
        HELD_MAP_MAX_ENTRIES,
    )
}

/// A sample of `bytes` in `process` at `ts_ns` that made `pages` resident
/// (growth) with the process's RSS at `rss_bytes` right after.
fn sample(
    process: ProcessId,
    ts_ns: u64,
    event: MemoryEvent,
    bytes: u64,
    pages: Option<Range<u64>>,
    rss_bytes: u64,
    stack: &[Frame],
) -> MemorySample {
    MemorySample {
        process,
        ts_ns,
        event,
        weight_bytes: bytes,
        len_bytes: bytes,
        pages,
        rss_bytes,
        stack: stack.to_vec(),
    }
}

/// `len` bytes of address space from `start`.
fn pages(start: u64, len: u64) -> Option<Range<u64>> {
    Some(start..start + len)
}

/// Ends the recorder: the live report (not yet diagnosed).
fn finish<W: Write>(recorder: Recorder<W>, end_ns: u64) -> Report {
    let (report, error) = recorder.finish(end_ns, run_meta(end_ns));
    assert!(error.is_none(), "{error:?}");
    report
}

fn run_meta(end_ns: u64) -> RunMeta {
    RunMeta {
        command: "python3 server.py".to_owned(),
        duration_ns: end_ns - START_NS,
        records: 40,
        dropped_records: 1,
        decode_errors: 0,
        sample_interval_bytes: 512 * 1024,
        ..RunMeta::default()
    }
}

/// Counters with `anon` resident bytes (plus 1 MiB of file pages) and
/// activity growing with it.
fn counters(anon_bytes: u64) -> ProcessCounters {
    ProcessCounters {
        anon_growth_bytes: anon_bytes,
        page_faults: anon_bytes / 4096,
        syscalls: anon_bytes / MIB,
        ..rss(anon_bytes, MIB)
    }
}

fn python() -> PythonStatus {
    PythonStatus::Python {
        version: "3.12.1".to_owned(),
    }
}

/// The path that touches, releases and touches again the same 2 MiB.
fn buffer_stack() -> Vec<Frame> {
    parse_stack("app/io.py")
}

/// A path whose growth has no address (`MAP_POPULATE`).
fn populate_stack() -> Vec<Frame> {
    vec![py("preload", "app/boot.py", 9), native("mmap")]
}

/// Worker 102's short-lived 8 MiB at its high-water mark.
fn scratch_stack() -> Vec<Frame> {
    vec![py("warm_up", "app/boot.py", 12), native("malloc")]
}

/// Where worker 101's 2 MiB buffer lives.
const BUFFER_ADDR: u64 = 0x7f00_0000_0000;

/// Process ids of [`synthetic_run`], in the order the run hands them out.
const MASTER: ProcessId = ProcessId(0);
/// Worker 101: leaks 1 MiB a second, reuses a 2 MiB buffer.
const LEAKER: ProcessId = ProcessId(1);
/// The first worker 102: exits at 40 s.
const FIRST_102: ProcessId = ProcessId(2);
/// The second process on tgid 102 (forked at 40 s), image 0: Python.
const SECOND_102: ProcessId = ProcessId(3);
/// Its image 1 after an execve at 40 s: a shell, killed at 70 s.
const SHELL: ProcessId = ProcessId(4);
/// Worker 103, forked at 75 s.
const LATE: ProcessId = ProcessId(5);

/// Boot time at which the second process on tgid 102 started.
const SECOND_102_START_TIME_NS: u64 = 900 * S;

/// A master (tgid 100) and workers over 150 s (the path buckets widen
/// once). Worker 101 leaks 1 MiB a second and touches, releases and
/// touches again a 2 MiB buffer every third second (its RSS is highest at
/// the last touch, 147 s); once it grows without an address. Worker 102
/// reaches its high-water mark at 10 s (8 MiB it gives back), grows below
/// it, then exits at 40 s, its last growth in the same second as its
/// exit; the kernel hands tgid 102 to a new fork, which grows in Python,
/// execs a shell that maps a file, and is killed at 70 s. Worker 103 starts
/// at 75 s. The writer is flushed every third second. Returns the end of
/// the run.
fn synthetic_run<W: Write>(feed: &mut Recorder<W>) -> u64 {
    let master = feed.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        counters: counters(10 * MIB),
        ..start(100, None, Role::Root, START_NS)
    });
    feed.python_status(master, python());
    let mut workers = Vec::new();
    for tgid in [101, 102] {
        let id = feed.process_started(ProcessStart {
            counters: rss(10 * MIB, MIB),
            ..start(tgid, Some(master), Role::Worker, START_NS)
        });
        feed.python_status(id, python());
        workers.push(id);
    }
    assert_eq!(
        [master, workers[0], workers[1]],
        [MASTER, LEAKER, FIRST_102]
    );
    let (leak, buffer, populate) = (leak_stack(), buffer_stack(), populate_stack());
    let cow = vec![py("warm", "app/boot.py", 3), native("memcpy")];
    let t0 = START_NS + 7;
    feed.memory(sample(
        FIRST_102,
        t0,
        MemoryEvent::CowFault,
        4096,
        None,
        10 * MIB,
        &cow,
    ));
    for second in 0..150_u64 {
        let now = START_NS + second * S;
        let sharing = (second % 10 == 0).then_some(Sharing {
            pss_bytes: 6 * MIB,
            uss_bytes: 2 * MIB,
        });
        feed.counters(MASTER, now + 1, &counters(10 * MIB), sharing);
        feed.counters(LEAKER, now + 2, &counters((20 + second) * MIB), None);
        let leak_pages = pages(0x1000_0000 + second * MIB, MIB);
        let rss_now = (20 + second) * MIB;
        feed.memory(sample(
            LEAKER,
            now + 10,
            MemoryEvent::AnonGrowth,
            MIB,
            leak_pages,
            rss_now,
            &leak,
        ));
        if second % 3 == 0 {
            let touched = pages(BUFFER_ADDR, 2 * MIB);
            let high = rss_now + 3 * MIB;
            feed.memory(sample(
                LEAKER,
                now + 20,
                MemoryEvent::AnonGrowth,
                2 * MIB,
                touched,
                high,
                &buffer,
            ));
            feed.memory(sample(
                LEAKER,
                now + 30,
                MemoryEvent::Munmap,
                2 * MIB,
                None,
                rss_now,
                &buffer,
            ));
            let release = AddressChange::Release(BUFFER_ADDR..BUFFER_ADDR + 2 * MIB);
            feed.address(LEAKER, now + 31, release, rss_now);
        }
        if second == 10 {
            // Worker 102's high-water mark: 8 MiB touched and given back.
            let scratch = scratch_stack();
            let touched = pages(0x2100_0000, 8 * MIB);
            feed.memory(sample(
                FIRST_102,
                now + 40,
                MemoryEvent::AnonGrowth,
                8 * MIB,
                touched,
                50 * MIB,
                &scratch,
            ));
            let release = AddressChange::Release(0x2100_0000..0x2100_0000 + 8 * MIB);
            feed.address(FIRST_102, now + 41, release, 26 * MIB);
        }
        if second == 75 {
            feed.memory(sample(
                LEAKER,
                now + 40,
                MemoryEvent::AnonGrowth,
                MIB / 2,
                None,
                0,
                &populate,
            ));
            let late = feed.process_started(ProcessStart {
                cmdline: "python3 server.py".to_owned(),
                ..start(103, Some(MASTER), Role::Worker, now + 50)
            });
            assert_eq!(late, LATE);
        }
        if second == 40 {
            exit_and_reuse_102(feed, now);
        }
        if second == 70 {
            // SIGKILL: no sign of the exit before the exit record.
            let killed = Some(ExitStatus::Signal {
                signal: 9,
                core_dumped: false,
                oom_killed: false,
            });
            feed.process_exited(SHELL, now + 5, killed, Some(&counters(4 * MIB)));
        }
        if second % 3 == 2 {
            feed.flush();
        }
    }
    START_NS + 150 * S + 42
}

/// At `now` (40 s): worker 102 grows and begins to exit within the same
/// second (nothing flushed in between), then exits; a new process gets
/// tgid 102, grows in Python and execs a shell that maps a file.
fn exit_and_reuse_102<W: Write>(feed: &mut Recorder<W>, now: u64) {
    let grow = pages(0x2000_0000, 4 * MIB);
    let last_words = parse_stack("app/shutdown.py");
    feed.memory(sample(
        FIRST_102,
        now + 3,
        MemoryEvent::AnonGrowth,
        4 * MIB,
        grow,
        34 * MIB,
        &last_words,
    ));
    feed.exit_began(
        FIRST_102,
        now + 4,
        ExitBegin::PythonFinalize,
        &counters(30 * MIB),
    );
    // The interpreter's finalization freed memory: not a release.
    feed.memory(sample(
        FIRST_102,
        now + 5,
        MemoryEvent::Munmap,
        4 * MIB,
        None,
        2 * MIB,
        &last_words,
    ));
    feed.process_exited(
        FIRST_102,
        now + 6,
        Some(ExitStatus::Code { code: 0 }),
        Some(&counters(2 * MIB)),
    );
    let second = feed.process_started(ProcessStart {
        start_time_ns: SECOND_102_START_TIME_NS,
        counters: rss(10 * MIB, MIB),
        ..start(102, Some(MASTER), Role::Worker, now + 100)
    });
    assert_eq!(second, SECOND_102);
    feed.python_status(SECOND_102, python());
    let phase = vec![py("load", "app/tool.py", 5), native("malloc")];
    feed.memory(sample(
        SECOND_102,
        now + 150,
        MemoryEvent::AnonGrowth,
        6 * MIB,
        pages(0x3000_0000, 6 * MIB),
        16 * MIB,
        &phase,
    ));
    let shell = feed.process_exec(
        SECOND_102,
        now + 200,
        &counters(16 * MIB),
        "/bin/sh -c true".to_owned(),
    );
    assert_eq!(shell, SHELL);
    feed.python_status(SHELL, PythonStatus::NotPython);
    let mapped = vec![
        native("read"),
        Frame::Mapping {
            mapping: MappingKind::File,
            name: "/data/table.bin".to_owned(),
        },
    ];
    feed.memory(sample(
        SHELL,
        now + 300,
        MemoryEvent::FileGrowth,
        MIB,
        pages(0x4000_0000, MIB),
        MIB,
        &mapped,
    ));
}

/// Writes the synthetic run to `path`; the live report.
fn write_synthetic(path: &Path) -> Report {
    let file = std::fs::File::create(path).unwrap();
    let mut feed = recorder(path, io::BufWriter::new(file));
    let end_ns = synthetic_run(&mut feed);
    finish(feed, end_ns)
}

/// The path of `process` with `frames` in `report`.
fn path_of<'a>(report: &'a Report, process: ProcessId, frames: &[Frame]) -> &'a PathReport {
    report
        .paths
        .iter()
        .find(|p| p.process == process && report.frames(p.stack) == frames)
        .unwrap_or_else(|| panic!("no path of {process} with {frames:?}"))
}
