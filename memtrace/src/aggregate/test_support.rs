//! Synthetic inputs and reports shared by the tests of the aggregation and
//! report steps: frame, sample and counter builders, and two small runs (a
//! pre-fork service and a growing worker).

use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES};

use super::{Aggregator, Frame, MemorySample, ProcessStart, PythonStatus, Report, Role, RunMeta};

/// One mebibyte, in bytes.
pub(crate) const MIB: u64 = 1024 * 1024;

/// A Python frame.
pub(crate) fn py(function: &str, file: &str, line: u32) -> Frame {
    Frame::Python {
        function: function.to_owned(),
        file: file.to_owned(),
        line,
    }
}

/// A native frame.
pub(crate) fn native(symbol: &str) -> Frame {
    Frame::Native {
        symbol: symbol.to_owned(),
    }
}

/// A start of `tgid` with command line `proc <tgid>`.
pub(crate) fn start(tgid: u32, parent_tgid: Option<u32>, role: Role, ts_ns: u64) -> ProcessStart {
    ProcessStart {
        tgid,
        parent_tgid,
        role,
        cmdline: format!("proc {tgid}"),
        ts_ns,
    }
}

/// Counters with known anonymous and file RSS.
pub(crate) fn rss(anon_bytes: u64, file_bytes: u64) -> ProcessCounters {
    let mut c = ProcessCounters {
        rss_known: (1 << MM_ANONPAGES) | (1 << MM_FILEPAGES),
        ..ProcessCounters::default()
    };
    c.rss_bytes[MM_ANONPAGES] = anon_bytes;
    c.rss_bytes[MM_FILEPAGES] = file_bytes;
    c
}

/// A sample of `weight_bytes` with `stack`, at 50 ns.
pub(crate) fn sample(
    tgid: u32,
    event: MemoryEvent,
    weight_bytes: u64,
    stack: &[Frame],
) -> MemorySample {
    MemorySample {
        tgid,
        ts_ns: 50,
        event,
        weight_bytes,
        stack: stack.to_vec(),
    }
}

/// Run facts with only the command set.
pub(crate) fn meta() -> RunMeta {
    RunMeta {
        command: "app".to_owned(),
        ..RunMeta::default()
    }
}

/// The leak of both fixtures: `append` under `handle`, into `PyList_Append`.
pub(crate) fn leak_stack() -> Vec<Frame> {
    vec![
        py("<module>", "server.py", 1),
        py("handle", "app/views.py", 10),
        py("append", "app/cache.py", 42),
        native("PyList_Append"),
    ]
}

/// The transient path of both fixtures: `parse` in `parse_file`, into
/// `malloc`.
pub(crate) fn parse_stack(parse_file: &str) -> Vec<Frame> {
    vec![
        py("<module>", "server.py", 1),
        py("parse", parse_file, 7),
        native("malloc"),
    ]
}

/// A pre-fork service before [`Aggregator::finish`]: a master (100) and
/// three workers (101..=103). The same leak ([`leak_stack`]) grows 10 MiB in
/// each worker (fed out of tgid order); a transient `parse`
/// ([`parse_stack`] in `app/io.py`) grows 16 MiB in worker 101 only, so it
/// outranks the leak per process but not merged (30 MiB). 46 MiB of sampled
/// growth in all.
pub(crate) fn prefork_aggregator() -> Aggregator {
    let mut agg = Aggregator::new(1_000);
    for (tgid, parent_tgid, role) in [
        (100, None, Role::Root),
        (101, Some(100), Role::Worker),
        (102, Some(100), Role::Worker),
        (103, Some(100), Role::Worker),
    ] {
        agg.process_started(ProcessStart {
            cmdline: "gunicorn app:wsgi".to_owned(),
            ..start(tgid, parent_tgid, role, 1_000)
        });
    }
    for tgid in [103, 101, 102] {
        agg.memory(sample(
            tgid,
            MemoryEvent::AnonGrowth,
            10 * MIB,
            &leak_stack(),
        ));
    }
    let parse = parse_stack("app/io.py");
    agg.memory(sample(101, MemoryEvent::AnonGrowth, 16 * MIB, &parse));
    agg
}

/// [`prefork_aggregator`], finished.
pub(crate) fn prefork_report() -> Report {
    prefork_aggregator().finish(
        5_000,
        RunMeta {
            command: "gunicorn app:wsgi".to_owned(),
            duration_ns: 4_000_000_000,
            records: 4,
            ..RunMeta::default()
        },
    )
}

/// A master (100) that stays flat and a worker (101) that grows 48 MiB,
/// 3/4 of it in [`leak_stack`], the rest in [`parse_stack`] (in a file whose
/// name holds a `;`), with one copy-on-write path; 2 records dropped.
pub(crate) fn server_report() -> Report {
    let mut agg = Aggregator::new(1_000);
    agg.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        ..start(100, None, Role::Root, 1_000)
    });
    agg.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        ..start(101, Some(100), Role::Worker, 1_200)
    });
    for tgid in [100, 101] {
        let version = "3.12.1".to_owned();
        agg.python_status(tgid, PythonStatus::Python { version });
    }
    agg.counters(100, 2_000, &rss(20 * MIB, 0));
    agg.counters(101, 2_000, &rss(20 * MIB, 0));
    let cache = leak_stack();
    agg.memory(sample(101, MemoryEvent::AnonGrowth, 36 * MIB, &cache));
    let parse = parse_stack("app/io;v2.py");
    agg.memory(sample(101, MemoryEvent::AnonGrowth, 12 * MIB, &parse));
    agg.memory(sample(101, MemoryEvent::CowFault, 4096, &cache));
    agg.counters(100, 3_000, &rss(20 * MIB, 0));
    agg.counters(101, 3_000, &rss(68 * MIB, 0));
    agg.finish(
        5_000,
        RunMeta {
            command: "python3 server.py".to_owned(),
            duration_ns: 4_000_000_000,
            records: 3,
            dropped_records: 2,
            decode_errors: 0,
            sample_interval_bytes: 512 * 1024,
        },
    )
}
