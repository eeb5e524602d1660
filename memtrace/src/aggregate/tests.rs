//! Unit tests of the aggregation step, driven by synthetic inputs: process
//! lives (fork start, exit, reused tgids, execve images), RSS and PSS
//! totals, paths with held bytes, merging over processes, buckets and
//! warnings.

use memtrace_common::{MemoryEvent, ProcessCounters, RSS_ALL_KNOWN};

use super::test_support::{
    leak_stack, meta, native, parse_stack, prefork_aggregator, py, rss, sample, sample_at, start,
    MIB,
};
use super::*;

/// RSS summed over the live processes, as the live view sees it.
fn live_rss(agg: &Aggregator) -> u64 {
    agg.live_snapshot(0)
        .processes
        .iter()
        .map(|p| p.rss_bytes)
        .sum()
}

/// A frame of `app.py`.
fn app(function: &str, line: u32) -> Frame {
    py(function, "app.py", line)
}

/// A start of `tgid` from `counters`.
fn start_with(
    tgid: u32,
    parent: Option<ProcessId>,
    ts_ns: u64,
    counters: ProcessCounters,
) -> ProcessStart {
    ProcessStart {
        counters,
        ..start(tgid, parent, Role::Worker, ts_ns)
    }
}

#[test]
fn a_forked_child_starts_from_what_it_inherited_at_fork() {
    let mut agg = Aggregator::new(0);
    let master = agg.process_started(start_with(10, None, 0, rss(100 * MIB, 0)));
    // Forked at 1 s with the master's 100 MiB; read next at 3 s with 220.
    let worker = agg.process_started(start_with(11, Some(master), 1_000, rss(100 * MIB, 0)));
    agg.counters(worker, 3_000, &rss(220 * MIB, 0), None);
    let report = agg.finish(4_000, meta());
    let w = report.process(worker).unwrap();
    let summary = w.rss.unwrap();
    assert_eq!(summary.start_bytes, 100 * MIB);
    assert_eq!(summary.growth_bytes, 120 * 1024 * 1024);
    assert_eq!(w.timeline[0].t_ns, 1_000, "the first point is the fork");
    assert_eq!(w.parent, Some(master));
    assert_eq!(w.parent_tgid, Some(10));
}

#[test]
fn an_exit_ends_the_numbers_where_the_exit_began() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start_with(7, None, 0, rss(10 * MIB, 0)));
    agg.counters(id, 1_000, &rss(250 * MIB, 0), None);
    let stack = sample_at(
        &mut agg,
        id,
        1_500,
        MemoryEvent::AnonGrowth,
        240 * MIB,
        &leak_stack(),
    );
    let mut at_exit = rss(250 * MIB, 0);
    at_exit.rss_peak_bytes = 251 * MIB;
    agg.exit_began(id, 2_000, ExitBegin::PythonFinalize, &at_exit);
    // The interpreter's finalization frees almost everything: never counted.
    agg.counters(id, 2_100, &rss(12 * MIB, 0), None);
    sample_at(
        &mut agg,
        id,
        2_200,
        MemoryEvent::AnonGrowth,
        MIB,
        &leak_stack(),
    );
    agg.path_delta(
        id,
        2_300,
        stack,
        SampledBytes::held_change(-240 * 1024 * 1024),
    );
    agg.process_exited(
        id,
        2_500,
        Some(ExitStatus::Code { code: 0 }),
        Some(&rss(12 * MIB, 0)),
    );
    let report = agg.finish(9_000, meta());
    let p = report.process(id).unwrap();
    let summary = p.rss.unwrap();
    assert_eq!(summary.end_bytes, 250 * MIB);
    assert_eq!(summary.peak_bytes, 251 * MIB);
    assert_eq!(summary.growth_bytes, 240 * 1024 * 1024);
    assert_eq!(
        p.timeline.last().unwrap().rss_bytes,
        250 * MIB,
        "the chart ends there too"
    );
    assert_eq!((p.exit_began_ns, p.exited_ns), (Some(2_000), Some(2_500)));
    assert_eq!(p.exit_began_by, Some(ExitBegin::PythonFinalize));
    assert_eq!(p.exit_status, Some(ExitStatus::Code { code: 0 }));
    assert_eq!(p.traced_ns, 2_000);
    assert_eq!(
        p.sampled.growth_bytes,
        240 * MIB,
        "growth after the exit began is not counted"
    );
    assert_eq!(
        p.sampled.held_now_bytes(),
        240 * MIB,
        "finalization is not a release"
    );
    assert_eq!(report.totals.live_rss_end_bytes, 0);
    assert_eq!(report.totals.peak_total_rss_bytes, 250 * MIB);
}

#[test]
fn a_signal_ends_the_numbers_at_the_exit_record() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start_with(7, None, 0, rss(10 * MIB, 0)));
    let signal = ExitStatus::Signal {
        signal: 9,
        core_dumped: false,
        oom_killed: false,
    };
    agg.process_exited(id, 800, Some(signal), Some(&rss(90 * MIB, 0)));
    let report = agg.finish(2_000, meta());
    let p = report.process(id).unwrap();
    assert_eq!(p.rss.unwrap().end_bytes, 90 * MIB);
    assert_eq!(p.exit_began_by, Some(ExitBegin::Exit));
    assert_eq!(p.exit_status, Some(signal));
}

#[test]
fn a_lost_exit_record_ends_the_image_at_its_latest_reading() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start_with(7, None, 0, rss(10 * MIB, 0)));
    agg.counters(id, 500, &rss(40 * MIB, 0), None);
    agg.process_exited(id, 900, None, None);
    assert!(
        agg.live_snapshot(0).processes.is_empty(),
        "it left the live set"
    );
    let report = agg.finish(2_000, meta());
    let p = report.process(id).unwrap();
    assert_eq!(p.rss.unwrap().end_bytes, 40 * MIB);
    assert_eq!(
        (p.exit_began_ns, p.exited_ns, p.exit_status),
        (Some(900), Some(900), None)
    );
    assert_eq!(report.totals.live_rss_end_bytes, 0);
}

#[test]
fn a_reused_tgid_is_a_new_process_with_its_own_row() {
    let mut agg = Aggregator::new(0);
    let master = agg.process_started(start_with(1, None, 0, rss(10 * MIB, 0)));
    let mut rows = Vec::new();
    for round in 0..3_u64 {
        let ts = 1_000 * (round + 1);
        let mut s = start_with(2, Some(master), ts, rss(10 * MIB, 0));
        s.start_time_ns = 5_000_000 + round;
        let id = agg.process_started(s);
        agg.counters(id, ts + 100, &rss((20 + 10 * round) * MIB, 0), None);
        let code = u8::try_from(round).unwrap();
        let end = rss((20 + 10 * round) * MIB, 0);
        agg.process_exited(id, ts + 500, Some(ExitStatus::Code { code }), Some(&end));
        rows.push(id);
    }
    let report = agg.finish(10_000, meta());
    assert_eq!(report.processes.len(), 4);
    for (round, id) in rows.iter().enumerate() {
        let p = report.process(*id).unwrap();
        assert_eq!(p.tgid, 2);
        assert_eq!(p.instance, u32::try_from(round).unwrap() + 1);
        let growth = p.rss.unwrap().growth_bytes;
        assert_eq!(growth, (10 + 10 * round as i64) * 1024 * 1024, "{p:?}");
        assert_eq!(
            p.exit_status,
            Some(ExitStatus::Code {
                code: u8::try_from(round).unwrap()
            })
        );
    }
    assert_eq!(report.process(rows[1]).unwrap().name(), "tgid 2#2");
    assert_eq!(report.totals.peak_live_processes, 2);
}

#[test]
fn an_exec_keeps_the_image_before_it() {
    let mut agg = Aggregator::new(0);
    let python = agg.process_started(start_with(5, None, 0, rss(8 * MIB, 0)));
    agg.python_status(
        python,
        PythonStatus::Python {
            version: "3.11.7".to_owned(),
        },
    );
    let stack = sample_at(
        &mut agg,
        python,
        500,
        MemoryEvent::AnonGrowth,
        60 * MIB,
        &[app("grow", 3)],
    );
    agg.peak_held(python, stack, 60 * MIB);
    let sleep = agg.process_exec(python, 1_000, &rss(68 * MIB, 0), "sleep 5".to_owned());
    agg.python_status(sleep, PythonStatus::NotPython);
    agg.counters(sleep, 1_500, &rss(MIB, 0), None);
    let report = agg.finish(3_000, meta());
    let before = report.process(python).unwrap();
    assert_eq!(before.next_image, Some(sleep));
    assert_eq!(before.exec_ns, Some(1_000));
    assert_eq!(before.rss.unwrap().end_bytes, 68 * MIB);
    assert_eq!(before.rss.unwrap().growth_bytes, 60 * 1024 * 1024);
    assert!(matches!(before.python, Some(PythonStatus::Python { .. })));
    assert_eq!(before.name(), "tgid 5, image 0");
    let after = report.process(sleep).unwrap();
    assert_eq!((after.image, after.previous_image), (1, Some(python)));
    assert_eq!(
        after.rss.unwrap().start_bytes,
        0,
        "a new image starts from nothing"
    );
    assert_eq!(after.cmdline, "sleep 5");
    assert_eq!(after.python, Some(PythonStatus::NotPython));
    let path = report.paths.iter().find(|p| p.process == python).unwrap();
    assert_eq!(
        (path.peak_held_bytes, path.bytes.growth_bytes),
        (60 * MIB, 60 * MIB)
    );
    assert_eq!(report.totals.peak_live_processes, 1);
    assert_eq!(live_rss_of(&report), MIB);
}

/// The live RSS at the end, from the report.
fn live_rss_of(report: &Report) -> u64 {
    report.totals.live_rss_end_bytes
}

#[test]
fn held_bytes_count_once_however_often_memory_is_touched_again() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start(1, None, Role::Root, 0));
    let buffer = agg.intern(vec![app("fill_buffer", 9)]);
    for job in 0..30_u64 {
        let mut bytes = SampledBytes::from_event(MemoryEvent::AnonGrowth, 40 * MIB);
        bytes.held_bytes = 40 * 1024 * 1024;
        agg.path_delta(id, job * 1_000_000_000, buffer, bytes);
        if job >= 4 {
            let freed = SampledBytes::held_change(-40 * 1024 * 1024);
            agg.path_delta(id, job * 1_000_000_000 + 1, buffer, freed);
        }
    }
    agg.peak_held(id, buffer, 200 * MIB);
    let report = agg.finish(31_000_000_000, meta());
    let path = &report.paths[0];
    assert_eq!(path.bytes.grown_bytes(), 1200 * MIB);
    assert_eq!(path.bytes.held_now_bytes(), 160 * MIB);
    assert_eq!(path.weight_bytes(Weight::Peak), 200 * MIB);
    let held: i64 = path.timeline.iter().map(|p| p.held_bytes).sum();
    assert_eq!(held, 160 * 1024 * 1024, "the buckets add up to the end");
}

#[test]
fn pss_totals_count_shared_pages_once() {
    let mut agg = Aggregator::new(0);
    let master = agg.process_started(start_with(1, None, 0, rss(100 * MIB, 0)));
    let shared = |pss_mib: u64, uss_mib: u64| Sharing {
        pss_bytes: pss_mib * MIB,
        uss_bytes: uss_mib * MIB,
    };
    agg.counters(master, 10, &rss(100 * MIB, 0), Some(shared(100, 100)));
    let mut workers = Vec::new();
    for tgid in 2..=5 {
        workers.push(agg.process_started(start_with(tgid, Some(master), 20, rss(100 * MIB, 0))));
    }
    agg.counters(master, 30, &rss(100 * MIB, 0), Some(shared(20, 0)));
    for &w in &workers {
        agg.counters(w, 30, &rss(100 * MIB, 0), Some(shared(20, 0)));
    }
    let report = agg.finish(100, meta());
    assert_eq!(
        report.totals.live_rss_end_bytes,
        500 * MIB,
        "RSS counts shared pages 5 times"
    );
    assert_eq!(
        report.totals.live_pss_end_bytes,
        100 * MIB,
        "PSS counts them once"
    );
    assert_eq!(report.totals.peak_total_pss_bytes, 100 * MIB);
    let master_report = report.process(master).unwrap();
    let sharing = master_report.sharing.unwrap();
    assert_eq!(
        (sharing.start_uss_bytes, sharing.end_uss_bytes),
        (100 * MIB, 0)
    );
    assert_eq!(
        master_report.timeline.last().unwrap().pss_bytes,
        Some(20 * MIB)
    );
}

#[test]
fn a_private_memory_reading_older_than_a_big_rss_change_is_not_the_end() {
    let mut agg = Aggregator::new(0);
    let shared = Sharing {
        pss_bytes: 2 * MIB,
        uss_bytes: MIB,
    };
    let short = agg.process_started(start_with(1, None, 0, rss(4 * MIB, 0)));
    agg.counters(short, 10, &rss(4 * MIB, 0), Some(shared));
    // Paced reads: none after it grew to 60 MiB.
    agg.counters(short, 20, &rss(60 * MIB, 0), None);
    let steady = agg.process_started(start_with(2, None, 0, rss(80 * MIB, 0)));
    agg.counters(steady, 10, &rss(80 * MIB, 0), Some(shared));
    agg.counters(steady, 20, &rss(70 * MIB, 0), None);
    let report = agg.finish(100, meta());
    let sharing = |id| report.process(id).unwrap().sharing.unwrap();
    assert!(sharing(short).end_stale);
    assert_eq!(sharing(short).end_uss(), None, "USS read at 4 MiB of RSS");
    assert!(!sharing(steady).end_stale, "10 MiB is under 25% of 70 MiB");
    assert_eq!(sharing(steady).end_uss(), Some(MIB));
}

#[test]
fn paths_rank_by_held_at_peak_and_merge_over_workers() {
    let report = prefork_aggregator().finish(5_000, meta());
    let merged = report.top_stacks(Weight::Peak, 10);
    assert_eq!(merged.len(), 2);
    assert_eq!(report.frames(merged[0].stack), &leak_stack()[..]);
    assert_eq!(
        merged[0].processes,
        vec![ProcessId(1), ProcessId(2), ProcessId(3)]
    );
    assert_eq!(merged[0].peak_held_bytes, 30 * MIB);
    assert_eq!(merged[0].peak_held_share, 30.0 / 46.0);
    assert_eq!(
        report.paths[0].peak_held_bytes,
        16 * MIB,
        "per process, parse leads"
    );
    assert_eq!(report.paths[0].process, ProcessId(1));
    let shares: f64 = report.growth_stacks.iter().map(|s| s.peak_held_share).sum();
    assert!((shares - 1.0).abs() < 1e-12, "{shares}");
    assert_eq!(report.top_stacks(Weight::Grown, 1).len(), 1);
    assert!(report.top_stacks(Weight::End, 0).is_empty());
}

#[test]
fn stacks_are_interned_once_across_processes() {
    let mut agg = Aggregator::new(0);
    let (p1, p2) = (
        agg.process_started(start(1, None, Role::Root, 0)),
        agg.process_started(start(2, None, Role::Root, 0)),
    );
    let a = [app("main", 1), native("malloc")];
    let b = [app("main", 2), native("malloc")];
    for id in [p1, p2] {
        sample(&mut agg, id, MemoryEvent::AnonGrowth, MIB, &a);
        sample(&mut agg, id, MemoryEvent::AnonGrowth, MIB, &a);
    }
    sample(&mut agg, p1, MemoryEvent::AnonGrowth, MIB, &b);
    let report = agg.finish(0, meta());
    assert_eq!(report.stacks, vec![a.to_vec(), b.to_vec()]);
    assert_eq!(report.totals.distinct_stacks, 2);
    assert_eq!(report.paths.len(), 3);
    let p1_share: f64 = report
        .paths
        .iter()
        .filter(|p| p.process == p1)
        .map(|p| p.growth_share)
        .sum();
    assert!((p1_share - 1.0).abs() < 1e-12);
}

#[test]
fn path_buckets_widen_for_long_runs_and_keep_their_sums() {
    let second = 1_000_000_000;
    let mut agg = Aggregator::new(0);
    let (p1, p2) = (
        agg.process_started(start(1, None, Role::Root, 0)),
        agg.process_started(start(2, None, Role::Root, 0)),
    );
    let a = agg.intern(vec![app("a", 1)]);
    let b = agg.intern(vec![app("b", 1)]);
    for t in 0..600 {
        agg.path_delta(
            p1,
            t * second,
            a,
            SampledBytes::from_event(MemoryEvent::AnonGrowth, 1),
        );
        if t % 7 == 0 {
            let bytes = SampledBytes::from_event(MemoryEvent::MadviseFree, 2);
            agg.path_delta(p2, t * second + 1, b, bytes);
        }
    }
    let report = agg.finish(1_000 * second, meta());
    assert_eq!(report.path_bucket_ns, 16 * second);
    for path in &report.paths {
        let width = report.path_bucket_ns;
        assert!(path.timeline.iter().all(|p| p.t_ns % width == 0));
        assert!(path.timeline.windows(2).all(|w| w[0].t_ns < w[1].t_ns));
        let growth: u64 = path.timeline.iter().map(|p| p.growth_bytes).sum();
        assert_eq!(growth, path.bytes.grown_bytes());
    }
    let a_path = report.paths.iter().find(|p| p.process == p1).unwrap();
    assert_eq!(a_path.timeline.len(), 38); // ceil(600 / 16)
}

#[test]
fn live_totals_follow_reads_and_ends() {
    let mut agg = Aggregator::new(100);
    let root = agg.process_started(start(1, None, Role::Root, 100));
    let worker = agg.process_started(start(2, Some(root), Role::Worker, 150));
    agg.counters(root, 200, &rss(10 * MIB, 0), None);
    agg.counters(worker, 200, &rss(30 * MIB, 0), None);
    assert_eq!(live_rss(&agg), 40 * MIB);
    agg.counters(worker, 300, &rss(50 * MIB, 0), None);
    assert_eq!(live_rss(&agg), 60 * MIB);
    agg.exit_began(worker, 400, ExitBegin::ExitGroup, &rss(50 * MIB, 0));
    assert_eq!(live_rss(&agg), 10 * MIB);
    // A read after the exit began changes nothing.
    agg.counters(worker, 410, &rss(5 * MIB, 0), None);
    let report = agg.finish(1_100, meta());
    let w = report.process(worker).unwrap();
    assert_eq!(w.rss.unwrap().end_bytes, 50 * MIB);
    assert_eq!(w.exited_ns, None, "its exit record never came");
    assert_eq!(report.totals.peak_total_rss_bytes, 60 * MIB);
    assert_eq!(report.totals.live_rss_end_bytes, 10 * MIB);
    assert_eq!(report.totals.peak_live_processes, 2);
}

#[test]
fn shrinking_process_has_negative_growth_and_sorts_last() {
    let mut agg = Aggregator::new(0);
    let ids: Vec<ProcessId> = (1..=4)
        .map(|tgid| agg.process_started(start(tgid, None, Role::Root, 0)))
        .collect();
    agg.counters(ids[0], 1, &rss(50 * MIB, 0), None);
    agg.counters(ids[0], 2, &rss(30 * MIB, 0), None);
    agg.counters(ids[1], 1, &rss(10 * MIB, 0), None);
    agg.counters(ids[1], 2, &rss(90 * MIB, 0), None);
    agg.counters(ids[2], 1, &rss(10 * MIB, 0), None);
    let report = agg.finish(10, meta());
    let order: Vec<u32> = report.processes.iter().map(|p| p.tgid).collect();
    assert_eq!(order, vec![2, 3, 1, 4]);
    let silent = report.process(ids[3]).unwrap();
    assert_eq!(silent.rss, None);
    assert_eq!(
        report.warnings,
        vec![Warning::NoRssReadings {
            process: ids[3],
            tgid: 4,
            name: "tgid 4".to_owned(),
        }]
    );
}

#[test]
fn warnings_name_drops_missing_python_coarsening_and_incomplete_stacks() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start(1, None, Role::Root, 0));
    agg.counters(id, 1, &rss(MIB, 0), None);
    agg.python_status(id, PythonStatus::NotPython);
    agg.held_state(
        id,
        HeldState {
            coarsening_level: 2,
            unplaced_bytes: 3 * MIB,
        },
    );
    let truncated = Frame::Unknown {
        reason: "outer frames truncated".to_owned(),
    };
    let stack = [truncated, app("f", 1), native("malloc")];
    sample(&mut agg, id, MemoryEvent::AnonGrowth, MIB, &stack);
    sample(&mut agg, id, MemoryEvent::CowFault, 4096, &stack);
    let report = agg.finish(
        10,
        RunMeta {
            dropped_records: 5,
            decode_errors: 1,
            ..meta()
        },
    );
    assert_eq!(
        report.warnings,
        vec![
            Warning::DroppedRecords { records: 5 },
            Warning::DecodeErrors { records: 1 },
            Warning::NoPythonStacks {
                process: id,
                tgid: 1,
                name: "tgid 1".to_owned(),
                cmdline: "proc 1".to_owned(),
                reason: "not a Python process".to_owned(),
            },
            Warning::HeldMapCoarsened {
                process: id,
                tgid: 1,
                name: "tgid 1".to_owned(),
                level: 2
            },
            Warning::UnplacedGrowth {
                process: id,
                tgid: 1,
                name: "tgid 1".to_owned(),
                bytes: 3 * MIB
            },
            Warning::IncompleteStacks {
                reason: "outer frames truncated".to_owned(),
                samples: 2,
            },
        ]
    );
    assert!(report.warnings[3]
        .to_string()
        .contains("keeps 1 in 4 sampled pages"));
}

#[test]
fn exec_of_an_ended_image_is_ignored() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start(1, None, Role::Root, 0));
    agg.exit_began(id, 10, ExitBegin::ExitGroup, &rss(MIB, 0));
    let counters = ProcessCounters {
        rss_known: RSS_ALL_KNOWN,
        ..ProcessCounters::default()
    };
    assert_eq!(agg.process_exec(id, 20, &counters, "x".to_owned()), id);
    assert_eq!(agg.finish(30, meta()).processes.len(), 1);
}

#[test]
fn the_live_view_lists_open_images_and_held_paths() {
    let mut agg = prefork_aggregator();
    let snapshot = agg.live_snapshot(5);
    assert_eq!(snapshot.processes.len(), 4);
    assert_eq!(snapshot.top_paths[0].held_bytes, 30 * MIB);
    assert!(snapshot.top_paths[0].frame.starts_with("append"));
    agg.exit_began(ProcessId(1), 6_000, ExitBegin::ExitGroup, &rss(MIB, 0));
    assert_eq!(agg.live_snapshot(5).processes.len(), 3);
    let parse = parse_stack("app/io.py");
    assert_eq!(
        LiveSnapshot::top_paths([(parse.as_slice(), 0)], 5),
        Vec::new(),
        "paths holding nothing are left out"
    );
}

#[test]
fn kinds_tell_masters_workers_children_and_helpers_apart() {
    let mut agg = Aggregator::new(1_000);
    let python = || PythonStatus::Python {
        version: "3.12.1".to_owned(),
    };
    // `run -- python3 app.py` through a bash launch shim: the shim and its
    // subshells never run Python; the shim execs the interpreter.
    let shim = agg.process_started(start(10, None, Role::Root, 1_000));
    agg.python_status(shim, PythonStatus::NotPython);
    let subshell = agg.process_started(start(11, Some(shim), Role::Worker, 2_000));
    let master = agg.process_exec(shim, 3_000, &rss(0, 0), "python3 app.py".to_owned());
    agg.python_status(master, python());
    // Never probed (short-lived): a fork of a Python image is Python...
    let worker = agg.process_started(start(12, Some(master), Role::Worker, 4_000));
    // ... a program exec'd by an unprobed fork of the shim is not.
    let shim_fork = agg.process_started(start(14, Some(shim), Role::Worker, 2_500));
    let shim_helper = agg.process_exec(shim_fork, 2_600, &rss(0, 0), "bash pyenv-which".to_owned());
    // A subprocess: its fork execs within a millisecond, into Python.
    let fork = agg.process_started(start(13, Some(master), Role::Worker, 5_000));
    agg.python_status(fork, python());
    let child = agg.process_exec(fork, 1_000_000, &rss(0, 0), "python3 loadgen.py".to_owned());
    agg.python_status(child, python());
    let live: Vec<(ProcessId, ProcessKind)> = agg
        .live_snapshot(0)
        .processes
        .iter()
        .map(|p| (p.id, p.kind))
        .collect();
    let report = agg.finish(2_000_000_000, meta());
    let kind = |id: ProcessId| report.process(id).unwrap().kind;
    for (id, live_kind) in live {
        assert_eq!(
            live_kind,
            kind(id),
            "the live view says what the report says"
        );
    }
    assert_eq!(kind(shim), ProcessKind::Helper);
    assert_eq!(kind(subshell), ProcessKind::Helper);
    assert_eq!(kind(master), ProcessKind::Master);
    assert_eq!(kind(worker), ProcessKind::Worker);
    assert_eq!(kind(shim_fork), ProcessKind::Helper);
    assert_eq!(kind(shim_helper), ProcessKind::Helper);
    assert_eq!(kind(fork), ProcessKind::Helper);
    assert_eq!(kind(child), ProcessKind::Child);
}
