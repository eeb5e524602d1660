//! Capture tests driven by synthetic runs: a [`Recorder`] feeds the live
//! aggregator and a writer, the file is read back and replayed.

use std::cell::RefCell;
use std::io::{self, Write};
use std::path::Path;
use std::rc::Rc;

use memtrace_common::{MemoryEvent, ProcessCounters};

use super::*;
use crate::aggregate::test_support::{leak_stack, parse_stack, py, rss, start, MIB};
use crate::aggregate::{
    Aggregator, Frame, MemorySample, ProcessStart, PythonStatus, Role, RunMeta,
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
    Recorder::new(Aggregator::new(START_NS), Some(writer))
}

/// A sample of `bytes` at `ts_ns`.
fn sample(tgid: u32, ts_ns: u64, event: MemoryEvent, bytes: u64, stack: &[Frame]) -> MemorySample {
    MemorySample {
        tgid,
        ts_ns,
        event,
        weight_bytes: bytes,
        stack: stack.to_vec(),
    }
}

/// Ends the recorder; the live report, diagnosed as the app does.
fn finish<W: Write>(recorder: Recorder<W>, end_ns: u64) -> Report {
    let (mut report, error) = recorder.finish(end_ns, run_meta(end_ns));
    assert!(error.is_none(), "{error:?}");
    report.diagnosis = crate::diagnose::diagnose(&report);
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
    }
}

/// Counters with `anon` resident bytes and activity growing with it.
fn counters(anon_bytes: u64) -> ProcessCounters {
    ProcessCounters {
        anon_growth_bytes: anon_bytes,
        page_faults: anon_bytes / 4096,
        syscalls: anon_bytes / MIB,
        ..rss(anon_bytes, MIB)
    }
}

/// A master (100) and two workers over 150 s (the path buckets widen once):
/// worker 101 leaks steadily, worker 102 exits and its tgid is reused by a
/// fork that execs; stacks are seen out of order and samples of several
/// seconds arrive between flushes. Returns the end of the run.
fn synthetic_run<W: Write>(feed: &mut Recorder<W>) -> u64 {
    let python = PythonStatus::Python {
        version: "3.12.1".to_owned(),
    };
    feed.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        ..start(100, None, Role::Root, START_NS)
    });
    feed.python_status(100, python.clone());
    feed.counters(100, START_NS, &counters(10 * MIB));
    for tgid in [101, 102] {
        feed.process_started(start(tgid, Some(100), Role::Worker, START_NS + S / 2));
        feed.python_status(tgid, python.clone());
    }
    let leak = leak_stack();
    let parse = parse_stack("app/io.py");
    let cow = vec![
        py("warm", "app/boot.py", 3),
        Frame::Native {
            symbol: "memcpy".to_owned(),
        },
    ];
    feed.memory(sample(
        102,
        START_NS + S / 2 + 7,
        MemoryEvent::CowFault,
        4096,
        &cow,
    ));
    for second in 0..150_u64 {
        let now = START_NS + second * S;
        feed.counters(100, now + 1, &counters(10 * MIB));
        feed.counters(101, now + 2, &counters((20 + second) * MIB));
        feed.memory(sample(101, now + 10, MemoryEvent::AnonGrowth, MIB, &leak));
        if second % 3 == 0 {
            feed.memory(sample(
                101,
                now + 20,
                MemoryEvent::AnonGrowth,
                2 * MIB,
                &parse,
            ));
            feed.memory(sample(101, now + 30, MemoryEvent::Munmap, 2 * MIB, &parse));
        }
        if second == 40 {
            feed.counters(102, now, &counters(30 * MIB));
            feed.process_exited(102, now + 5);
            // The kernel hands tgid 102 to a new fork, which execs.
            feed.process_started(start(102, Some(100), Role::Worker, now + 100));
            feed.process_exec(102, now + 200, "/bin/sh -c true".to_owned());
            feed.python_status(102, PythonStatus::NotPython);
        }
        // The writer is flushed every third second: samples of three
        // seconds, across two path buckets, are pending at once.
        if second % 3 == 2 {
            feed.flush();
        }
    }
    START_NS + 150 * S + 42
}

fn write_synthetic(path: &Path) -> Report {
    let file = std::fs::File::create(path).unwrap();
    let mut feed = recorder(path, io::BufWriter::new(file));
    let end_ns = synthetic_run(&mut feed);
    finish(feed, end_ns)
}

#[test]
fn replay_of_a_capture_equals_the_live_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let capture = read(&path).unwrap();
    assert!(capture.warnings.is_empty(), "{:?}", capture.warnings);
    assert_eq!(capture.header, header());
    assert_eq!(capture.covered_ns(), 150 * S + 42);
    let replayed = replay(&capture);
    // The run is long enough for the path buckets to have widened.
    assert_eq!(live.path_bucket_ns, 2 * S);
    assert!(live.paths.iter().any(|p| p.timeline.len() > 50));
    assert_eq!(replayed, live);
}

#[test]
fn periodic_counter_reads_are_thinned_alike_for_the_report_and_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ticks.capture");
    let file = std::fs::File::create(&path).unwrap();
    let mut feed = recorder(&path, io::BufWriter::new(file));
    feed.process_started(start(1, None, Role::Root, START_NS));
    feed.counters(1, START_NS, &counters(MIB));
    // Five seconds of 200 ms ticks, RSS up 5 MiB a second: one read a
    // second is kept.
    let tick_ns = S / 5;
    for tick in 1..=25_u64 {
        feed.periodic_counters(1, START_NS + tick * tick_ns, &counters(tick * MIB));
    }
    // A spike within a second: up 100 MiB and back, both steps kept.
    feed.periodic_counters(1, START_NS + 5 * S + 200, &counters(125 * MIB));
    feed.periodic_counters(1, START_NS + 5 * S + 400, &counters(26 * MIB));
    // An exit read is kept however close to the last periodic one.
    feed.counters(1, START_NS + 5 * S + 500, &counters(30 * MIB));
    feed.process_exited(1, START_NS + 5 * S + 600);
    let live = finish(feed, START_NS + 6 * S);
    let kept: Vec<u64> = live
        .process(1)
        .unwrap()
        .timeline
        .iter()
        .map(|p| p.t_ns)
        .collect();
    assert_eq!(
        kept,
        [
            0,
            S,
            2 * S,
            3 * S,
            4 * S,
            5 * S,
            5 * S + 200,
            5 * S + 400,
            5 * S + 500
        ]
    );
    assert_eq!(live.process(1).unwrap().rss.unwrap().peak_bytes, 126 * MIB);
    let capture = read(&path).unwrap();
    let counter_lines = capture
        .lines
        .iter()
        .filter(|line| matches!(line, Line::Counters(_)))
        .count();
    assert_eq!(counter_lines, kept.len());
    assert_eq!(replay(&capture), live);
}

#[test]
fn capture_stays_small_and_paths_hold_one_second_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let capture = read(&path).unwrap();
    let paths: Vec<&format::PathsLine> = capture
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Paths(p) => Some(p),
            _ => None,
        })
        .collect();
    // One line per second with samples (the first holds the early
    // copy-on-write sample too).
    assert_eq!(paths.len(), 150);
    for p in &paths {
        let second = (p.ts_ns - START_NS) / S;
        assert!(p.deltas.len() <= 3, "{:?}", p.deltas);
        assert!(p.ts_ns >= START_NS + second * S);
    }
    // Each stack is written once, before its first use.
    let stacks: Vec<u32> = capture
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Stacks(s) => Some(s.iter().map(|(id, _)| id.0)),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(stacks, vec![0, 1, 2]);
}

#[test]
fn a_file_that_is_not_a_capture_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [
        ("text", &b"hello world\n"[..]),
        ("no-newline", b"hello"),
        ("binary", b"\x7fELF\x02\x01\x01\0\0\0"),
        ("report.json", b"{\n  \"meta\": {}\n}\n"),
        ("other.jsonl", b"{\"event\":1}\n{\"event\":2}\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let err = read(&path).unwrap_err();
        assert!(
            matches!(err, CaptureError::NotACapture { .. }),
            "{name}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(name), "{message}");
        assert!(message.contains("not a memtrace capture"), "{message}");
    }
    let missing = dir.path().join("missing.capture");
    let err = read(&missing).unwrap_err();
    assert!(matches!(err, CaptureError::Io { .. }), "{err:?}");
}

#[test]
fn an_empty_file_or_a_cut_header_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.capture");
    std::fs::write(&empty, b"").unwrap();
    let err = read(&empty).unwrap_err();
    assert!(matches!(err, CaptureError::Empty { .. }), "{err:?}");
    assert!(err.to_string().contains("empty capture file"), "{err}");

    let whole = dir.path().join("whole.capture");
    write_synthetic(&whole);
    let text = std::fs::read(&whole).unwrap();
    let header_len = text.iter().position(|&b| b == b'\n').unwrap();
    for cut_at in [3, 25, header_len - 1] {
        let cut = dir.path().join(format!("cut-{cut_at}.capture"));
        std::fs::write(&cut, &text[..cut_at]).unwrap();
        let err = read(&cut).unwrap_err();
        assert!(
            matches!(err, CaptureError::HeaderCut { bytes, .. } if bytes == cut_at),
            "{cut_at}: {err:?}"
        );
        assert!(err.to_string().contains("is cut off"), "{err}");
    }
}

#[test]
fn a_capture_of_another_version_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.capture");
    std::fs::write(
        &path,
        "{\"memtrace_capture\":2,\"created_unix_s\":1,\"whatever\":true}\n{\"new_kind\":{}}\n",
    )
    .unwrap();
    let err = read(&path).unwrap_err();
    assert!(
        matches!(
            err,
            CaptureError::UnknownVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("version 2 capture"), "{err}");
}

#[test]
fn a_truncated_last_line_is_dropped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let whole = std::fs::read(&path).unwrap();
    let complete = read(&path).unwrap();
    // Cut in the middle of the line before the `end` line.
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(
            whole
                .iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    let last_kept = line_starts[line_starts.len() - 3];
    let cut = last_kept + (line_starts[line_starts.len() - 2] - last_kept) / 2;
    std::fs::write(&path, &whole[..cut]).unwrap();
    let capture = read(&path).unwrap();
    let lines_in_file = line_starts.len() - 1; // header included
    assert_eq!(capture.lines.len(), complete.lines.len() - 2);
    assert_eq!(
        capture.lines[..],
        complete.lines[..complete.lines.len() - 2]
    );
    assert_eq!(
        capture.warnings[0],
        CaptureWarning::TruncatedLastLine {
            line: (lines_in_file - 1) as u64,
            bytes: cut - last_kept,
        }
    );
    assert!(matches!(capture.warnings[1], CaptureWarning::NoEnd { .. }));
    assert!(capture.warnings[0].to_string().contains("cut off"));
    // It still replays, up to its latest time.
    let report = replay(&capture);
    assert_eq!(report.meta.command, "python3 server.py");
    assert!(
        report.meta.duration_ns > 140 * S,
        "{}",
        report.meta.duration_ns
    );
    assert!(report.process(101).is_some());
}

#[test]
fn a_corrupt_line_inside_the_file_is_an_error_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[3] = "{\"counters\":";
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let err = read(&path).unwrap_err();
    assert!(
        matches!(err, CaptureError::Corrupt { line: 4, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("line 4"), "{err}");
}

/// A sink that accepts `room` bytes, then fails like a full disk.
struct FullDisk {
    written: Rc<RefCell<Vec<u8>>>,
    room: usize,
}

impl Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut written = self.written.borrow_mut();
        let n = buf.len().min(self.room - written.len());
        if n == 0 {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        written.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_full_disk_disables_the_writer_once_and_keeps_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.capture");
    let written = Rc::new(RefCell::new(Vec::new()));
    let disk = FullDisk {
        written: Rc::clone(&written),
        room: 6_000,
    };
    let mut feed = recorder(&path, io::BufWriter::with_capacity(512, disk));
    let end_ns = synthetic_run(&mut feed);
    let error = feed.take_capture_error().expect("the disk filled up");
    assert!(matches!(error, CaptureError::Write { .. }), "{error:?}");
    assert!(error.to_string().contains("full.capture"), "{error}");
    assert!(feed.take_capture_error().is_none(), "reported once");
    // Tracing went on: the live report has the whole run.
    let (live, error) = feed.finish(end_ns, run_meta(end_ns));
    assert!(error.is_none(), "{error:?}");
    assert_eq!(live.process(101).unwrap().timeline.len(), 150);
    // What reached the disk opens, cut where the disk filled up.
    std::fs::write(&path, written.borrow().as_slice()).unwrap();
    assert_eq!(written.borrow().len(), 6_000);
    let capture = read(&path).unwrap();
    assert!(matches!(
        capture.warnings[..],
        [
            CaptureWarning::TruncatedLastLine { .. },
            CaptureWarning::NoEnd { .. }
        ]
    ));
    let report = replay(&capture);
    let early = report.process(101).unwrap();
    assert!(!early.timeline.is_empty());
    assert!(early.timeline.len() < 150);
}

#[test]
fn a_capture_file_that_cannot_be_created_fails_before_tracing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/folder/run.capture");
    let err = CaptureWriter::create(&path, &header()).unwrap_err();
    assert!(matches!(err, CaptureError::Write { .. }), "{err:?}");
    assert!(err.to_string().contains("run.capture"), "{err}");
    // A device that is always full: the header cannot reach it.
    let err = CaptureWriter::create(Path::new("/dev/full"), &header()).unwrap_err();
    assert!(matches!(err, CaptureError::Write { .. }), "{err:?}");
}

#[test]
fn a_window_counts_only_its_counters_and_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let capture = read(&path).unwrap();
    let window = replay_window(&capture, Some(60 * S), Some(90 * S));
    assert_eq!(window.meta.duration_ns, 30 * S);
    let leak = window
        .paths
        .iter()
        .find(|p| window.frames(p.stack) == leak_stack().as_slice())
        .unwrap();
    // One MiB a second, for the 30 s of the window.
    assert_eq!(leak.bytes.growth_bytes, 30 * MIB);
    assert!(leak
        .timeline
        .iter()
        .all(|p| (60 * S..90 * S).contains(&p.t_ns)));
    let worker = window.process(101).unwrap();
    let rss = worker.rss.unwrap();
    assert_eq!(rss.start_bytes, (20 + 60) * MIB + MIB);
    assert_eq!(rss.end_bytes, (20 + 89) * MIB + MIB);
    assert!(worker
        .timeline
        .iter()
        .all(|p| (60 * S..90 * S).contains(&p.t_ns)));
    // The first worker 102 exited before the window; the one reusing its
    // tgid is in it (as the exec'd shell).
    assert_eq!(window.process(102).unwrap().cmdline, "/bin/sh -c true");
    assert_eq!(window.totals.processes, 3);
    // The early copy-on-write sample is outside the window.
    assert_eq!(window.totals.sampled.cow_bytes, 0);
    // A window up to the end equals nothing cut off at the end.
    let whole = replay(&capture);
    let tail = replay_window(&capture, None, Some(10_000 * S));
    assert_eq!(tail.paths, whole.paths);
}
