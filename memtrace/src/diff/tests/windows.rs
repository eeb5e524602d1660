//! Two windows of one capture: a synthetic capture recorded and replayed
//! as `memtrace diff FILE --from --to` does.

use std::path::Path;

use memtrace_common::MemoryEvent;

use super::*;
use crate::aggregate::{MemorySample, RunMeta};
use crate::capture::{self, AddressChange, CaptureWriter, Header, Recorder, CAPTURE_VERSION};

/// One second, in nanoseconds.
const S: u64 = 1_000_000_000;

/// A capture of 10 s: worker 101 keeps 1 MiB a second and churns a 2 MiB
/// buffer; worker 102 keeps 3 MiB and exits at 3 s; a new process on tgid
/// 102 starts at 5 s and keeps 4 MiB at 6 s.
fn windows_capture(path: &Path) -> capture::Capture {
    let header = Header {
        memtrace_capture: CAPTURE_VERSION,
        created_unix_s: 1,
        command: APP.to_owned(),
        start_ns: S,
        sample_interval_bytes: MIB,
    };
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let writer = CaptureWriter::new(path, file, &header).unwrap();
    let mut feed = Recorder::new(Aggregator::new(S), Some(writer), 1 << 10);
    let fork = |tgid, start_time_ns, parent, ts_ns| ProcessStart {
        cmdline: APP.to_owned(),
        start_time_ns,
        counters: rss(20 * MIB, 0),
        ..start(tgid, parent, Role::Worker, ts_ns)
    };
    let master = feed.process_started(ProcessStart {
        role: Role::Root,
        ..fork(100, 0, None, S)
    });
    let cache = feed.process_started(fork(101, 1, Some(master), S));
    let first = feed.process_started(fork(102, 2, Some(master), S));
    let mut second = None;
    let memory =
        |process, ts_ns, pages: std::ops::Range<u64>, rss_bytes, stack: Vec<Frame>| MemorySample {
            process,
            ts_ns,
            event: MemoryEvent::AnonGrowth,
            weight_bytes: pages.end - pages.start,
            len_bytes: pages.end - pages.start,
            pages: Some(pages),
            rss_bytes,
            stack,
        };
    for s in 0..10_u64 {
        let now = S + s * S;
        feed.counters(master, now + 1, &rss(20 * MIB, 0), None);
        feed.counters(cache, now + 2, &rss((20 + s) * MIB, 0), None);
        let page = 0x1000_0000 + s * MIB;
        feed.memory(memory(
            cache,
            now + 10,
            page..page + MIB,
            (21 + s) * MIB,
            leak_stack(),
        ));
        let buffer = 0x7000_0000..0x7000_0000 + 2 * MIB;
        feed.memory(memory(
            cache,
            now + 20,
            buffer.clone(),
            (23 + s) * MIB,
            parse_stack("app/io.py"),
        ));
        feed.address(
            cache,
            now + 30,
            AddressChange::Release(buffer),
            (21 + s) * MIB,
        );
        if s == 1 {
            let pages = 0x2000_0000..0x2000_0000 + 3 * MIB;
            feed.memory(memory(
                first,
                now + 40,
                pages,
                23 * MIB,
                parse_stack("app/jobs.py"),
            ));
        }
        if s == 3 {
            feed.exit_began(
                first,
                now + 50,
                ExitBegin::PythonFinalize,
                &rss(23 * MIB, 0),
            );
            feed.process_exited(first, now + 60, Some(ExitStatus::Code { code: 0 }), None);
        }
        if s == 5 {
            second = Some(feed.process_started(fork(102, 5 * S, Some(master), now + 70)));
        }
        if let (6, Some(id)) = (s, second) {
            let stack = vec![py("load", "app/tool.py", 5), native("malloc")];
            feed.memory(memory(
                id,
                now + 80,
                0x3000_0000..0x3000_0000 + 4 * MIB,
                24 * MIB,
                stack,
            ));
        }
        feed.flush();
    }
    let end = RunMeta {
        duration_ns: 10 * S,
        ..meta()
    };
    let (_, error) = feed.finish(11 * S, end);
    assert!(error.is_none(), "{error:?}");
    capture::read(path).unwrap()
}

#[test]
fn windows_compare_what_was_held_at_each_end_and_what_grew_within_each() {
    let dir = tempfile::tempdir().unwrap();
    let file = windows_capture(&dir.path().join("w.capture"));
    let (t1, t2) = (4 * S, 8 * S);
    let d = diff_windows(
        &capture::replay_window(&file, None, Some(t1)),
        &capture::replay_window(&file, Some(t1), Some(t2)),
        &capture::replay_window(&file, None, Some(t2)),
        t1,
    );
    let tool = vec![py("load", "app/tool.py", 5), native("malloc")];
    let got: Vec<(&[Frame], PathBytes, PathBytes)> = d
        .paths
        .iter()
        .map(|p| (p.frames.as_slice(), p.before, p.after))
        .collect();
    assert_eq!(
        got,
        vec![
            // The new process: +4 MiB held and grown.
            (tool.as_slice(), bytes(0, 0), bytes(4, 4)),
            // The cache: held 4 MiB at 4 s, 8 MiB at 8 s; grew 4 in each.
            (leak_stack().as_slice(), bytes(4, 4), bytes(8, 4)),
            // The buffer: grown 4 times in each window, never held.
            (
                parse_stack("app/io.py").as_slice(),
                bytes(0, 8),
                bytes(0, 8)
            ),
            // The worker that exited before the later window holds nothing
            // in it.
            (
                parse_stack("app/jobs.py").as_slice(),
                bytes(3, 3),
                bytes(0, 0)
            ),
        ]
    );
    // Images matched by identity and named as in the capture: the second
    // process on tgid 102 is `#2` although the first is not in its window.
    let mut rows = names(&d);
    rows.sort_unstable();
    assert_eq!(
        rows,
        [
            (None, Some("tgid 102#2")),
            (Some("tgid 100"), Some("tgid 100")),
            (Some("tgid 101"), Some("tgid 101")),
            (Some("tgid 102"), None),
        ]
    );
    let worker = d
        .processes
        .iter()
        .find(|p| p.label == APP && p.before.as_ref().is_some_and(|s| s.tgid == 101))
        .unwrap();
    // Its last readings before 4 s and before 8 s.
    assert_eq!(worker.rss_delta_bytes(), Some(4 * 1024 * 1024));
}
