//! Synthetic inputs and reports shared by the tests of the aggregation,
//! diagnosis and report steps: frame, process-start, sample and counter
//! builders, and two small runs (a pre-fork service and a growing worker).

use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES};

use super::{
    Aggregator, Frame, ProcessId, ProcessStart, PythonStatus, Report, Role, RunMeta, SampledBytes,
    StackId,
};

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
        module: None,
    }
}

/// A start of `tgid` with command line `proc <tgid>`, started at boot time
/// `tgid` ms, with no RSS known yet.
pub(crate) fn start(tgid: u32, parent: Option<ProcessId>, role: Role, ts_ns: u64) -> ProcessStart {
    ProcessStart {
        tgid,
        start_time_ns: u64::from(tgid) * 1_000_000,
        parent,
        role,
        cmdline: format!("proc {tgid}"),
        ts_ns,
        counters: ProcessCounters::default(),
        sharing: None,
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

/// One sample of `weight_bytes` with `stack` in image `id` at 50 ns: its
/// sampled bytes and, for growth, the same bytes held (as if never
/// released). Returns the stack's id.
pub(crate) fn sample(
    agg: &mut Aggregator,
    id: ProcessId,
    event: MemoryEvent,
    weight_bytes: u64,
    stack: &[Frame],
) -> StackId {
    sample_at(agg, id, 50, event, weight_bytes, stack)
}

/// [`sample`] at `ts_ns`.
pub(crate) fn sample_at(
    agg: &mut Aggregator,
    id: ProcessId,
    ts_ns: u64,
    event: MemoryEvent,
    weight_bytes: u64,
    stack: &[Frame],
) -> StackId {
    let stack = agg.intern(stack.to_vec());
    let mut bytes = SampledBytes::from_event(event, weight_bytes);
    if bytes.grown_bytes() > 0 {
        bytes.held_bytes = i64::try_from(weight_bytes).unwrap_or(i64::MAX);
    }
    agg.path_delta(id, ts_ns, stack, bytes);
    stack
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

/// A pre-fork service before [`Aggregator::finish`]: a master (tgid 100,
/// id 0) and three workers (tgid 101..=103, ids 1..=3). The same leak
/// ([`leak_stack`]) grows and holds 10 MiB in each worker (fed out of tgid
/// order); a `parse` path ([`parse_stack`] in `app/io.py`) grows and holds
/// 16 MiB in worker 101 only, so it outranks the leak per process but not
/// merged (30 MiB). 46 MiB of sampled growth in all; every path's bytes
/// held at the high-water mark are its bytes held.
pub(crate) fn prefork_aggregator() -> Aggregator {
    let mut agg = Aggregator::new(1_000);
    let master = agg.process_started(ProcessStart {
        cmdline: "gunicorn app:wsgi".to_owned(),
        ..start(100, None, Role::Root, 1_000)
    });
    agg.python_status(
        master,
        PythonStatus::Python {
            version: "3.12.1".to_owned(),
        },
    );
    let mut workers = Vec::new();
    for tgid in [101, 102, 103] {
        workers.push(agg.process_started(ProcessStart {
            cmdline: "gunicorn app:wsgi".to_owned(),
            ..start(tgid, Some(master), Role::Worker, 1_000)
        }));
    }
    for index in [2, 0, 1] {
        let id = workers[index];
        let leak = sample(
            &mut agg,
            id,
            MemoryEvent::AnonGrowth,
            10 * MIB,
            &leak_stack(),
        );
        agg.peak_held(id, leak, 10 * MIB);
    }
    let parse = parse_stack("app/io.py");
    let stack = sample(
        &mut agg,
        workers[0],
        MemoryEvent::AnonGrowth,
        16 * MIB,
        &parse,
    );
    agg.peak_held(workers[0], stack, 16 * MIB);
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

/// A master (tgid 100, id 0) that stays flat and a worker (tgid 101, id 1)
/// that grows 48 MiB, 3/4 of it in [`leak_stack`], the rest in
/// [`parse_stack`] (in a file whose name holds a `;`), with one
/// copy-on-write path; 2 records dropped. Every path's bytes held at the
/// high-water mark are its bytes held.
pub(crate) fn server_report() -> Report {
    let mut agg = Aggregator::new(1_000);
    let master = agg.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        ..start(100, None, Role::Root, 1_000)
    });
    let worker = agg.process_started(ProcessStart {
        cmdline: "python3 server.py".to_owned(),
        ..start(101, Some(master), Role::Worker, 1_200)
    });
    for id in [master, worker] {
        let version = "3.12.1".to_owned();
        agg.python_status(id, PythonStatus::Python { version });
    }
    agg.counters(master, 2_000, &rss(20 * MIB, 0), None);
    agg.counters(worker, 2_000, &rss(20 * MIB, 0), None);
    let cache = leak_stack();
    let leak = sample(&mut agg, worker, MemoryEvent::AnonGrowth, 36 * MIB, &cache);
    agg.peak_held(worker, leak, 36 * MIB);
    let parse = parse_stack("app/io;v2.py");
    let parse = sample(&mut agg, worker, MemoryEvent::AnonGrowth, 12 * MIB, &parse);
    agg.peak_held(worker, parse, 12 * MIB);
    sample(&mut agg, worker, MemoryEvent::CowFault, 4096, &cache);
    agg.counters(master, 3_000, &rss(20 * MIB, 0), None);
    agg.counters(worker, 3_000, &rss(68 * MIB, 0), None);
    agg.finish(
        5_000,
        RunMeta {
            command: "python3 server.py".to_owned(),
            duration_ns: 4_000_000_000,
            records: 3,
            dropped_records: 2,
            decode_errors: 0,
            sample_interval_bytes: 512 * 1024,
            ..RunMeta::default()
        },
    )
}
