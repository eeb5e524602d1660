//! Diagnosis tests on synthetic runs: each pattern, no growth, thin evidence
//! and the look-alikes that must not be taken for a pattern. The runs go
//! through the real [`Aggregator`] (counter reads, path deltas, forks), so the
//! report shapes are the ones `memtrace` produces.

use crate::aggregate::test_support::{native, py, rss, MIB};
use crate::aggregate::{
    Aggregator, Frame, ProcessStart, Report, Role, RunMeta, SampledBytes, StackId,
};

use super::*;

/// One second, in nanoseconds.
const S: u64 = 1_000_000_000;

/// Bytes one sample stands for in these runs (memtrace's default).
const SAMPLE_BYTES: u64 = 512 * 1024;

/// A stack ending in the Python function `function` of `app.py`.
fn stack(function: &str) -> Vec<Frame> {
    vec![
        py("<module>", "app.py", 1),
        py(function, "app.py", 20),
        native("malloc"),
    ]
}

/// A synthetic run fed to the aggregator.
struct Run {
    agg: Aggregator,
}

impl Run {
    fn new() -> Self {
        Self {
            agg: Aggregator::new(0),
        }
    }

    /// `tgid` enters the trace at `at_ns`.
    fn process(&mut self, tgid: u32, parent_tgid: Option<u32>, role: Role, at_ns: u64) {
        self.agg.process_started(ProcessStart {
            tgid,
            parent_tgid,
            role,
            cmdline: format!("python3 app.py #{tgid}"),
            ts_ns: at_ns,
        });
    }

    /// RSS readings of `tgid`, one every half second from `from_ns`:
    /// `(RSS MiB, cumulative activity events)`.
    fn readings(&mut self, tgid: u32, from_ns: u64, points: &[(u64, u64)]) {
        for (i, &(rss_mib, activity)) in points.iter().enumerate() {
            let mut c = rss(rss_mib * MIB, 0);
            c.page_faults = activity;
            c.syscalls = activity / 100;
            self.agg.counters(tgid, from_ns + i as u64 * S / 2, &c);
        }
    }

    /// Readings at a constant RSS, every half second over `[from_ns, to_ns]`,
    /// with activity frozen at `activity`.
    fn flat(&mut self, tgid: u32, from_ns: u64, to_ns: u64, rss_mib: u64, activity: u64) {
        let n = (to_ns - from_ns) / (S / 2) + 1;
        let points: Vec<(u64, u64)> = (0..n).map(|_| (rss_mib, activity)).collect();
        self.readings(tgid, from_ns, &points);
    }

    /// Sampled growth of `mib` MiB in `function` of `tgid` at `at_ns`.
    fn grow(&mut self, tgid: u32, function: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            growth_bytes: mib * MIB,
            samples: mib * MIB / SAMPLE_BYTES,
            ..SampledBytes::default()
        };
        self.agg.path_delta(tgid, at_ns, stack(function), bytes);
    }

    /// Sampled copy-on-write of `mib` MiB in `function` of `tgid` at `at_ns`.
    fn cow(&mut self, tgid: u32, function: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            cow_bytes: mib * MIB,
            samples: mib * MIB / SAMPLE_BYTES,
            ..SampledBytes::default()
        };
        self.agg.path_delta(tgid, at_ns, stack(function), bytes);
    }

    /// Exact copy-on-write bytes of `tgid` in its final counter read.
    fn final_cow(&mut self, tgid: u32, at_ns: u64, rss_mib: u64, activity: u64, cow_mib: u64) {
        let mut c = rss(rss_mib * MIB, 0);
        c.page_faults = activity;
        c.cow_fault_bytes = cow_mib * MIB;
        self.agg.counters(tgid, at_ns, &c);
    }

    fn finish(self, duration_ns: u64) -> Report {
        self.agg.finish(
            duration_ns,
            RunMeta {
                command: "python3 app.py".to_owned(),
                duration_ns,
                sample_interval_bytes: SAMPLE_BYTES,
                ..RunMeta::default()
            },
        )
    }
}

/// Whether the path `stack` of `report` runs through `function`.
fn runs_through(report: &Report, stack: StackId, function: &str) -> bool {
    report
        .frames(stack)
        .iter()
        .any(|f| matches!(f, Frame::Python { function: name, .. } if name == function))
}

/// The findings of `pattern` in `findings`.
fn of(findings: &[Finding], pattern: Pattern) -> Vec<&Finding> {
    findings.iter().filter(|f| f.pattern == pattern).collect()
}

/// A master (100) and three workers forked at 0.3 s; worker 102 leaks
/// `leak_mib` MiB in `leak_in_worker` between 0.5 s and 2.5 s, then holds it
/// until 6 s; the others stay flat.
fn one_leaking_worker(leak_mib: u64) -> Report {
    let mut run = Run::new();
    run.process(100, None, Role::Root, 0);
    run.flat(100, 0, 6 * S, 14, 4_000);
    for tgid in [101, 102, 103] {
        run.process(tgid, Some(100), Role::Worker, 3 * S / 10);
    }
    for tgid in [101, 103] {
        run.flat(tgid, S / 2, 6 * S, 12, 300);
    }
    let step = leak_mib / 4;
    let mut points = vec![(12, 300)];
    points.extend((1..=4).map(|i| (12 + i * step, 300 + i * step * 256)));
    run.readings(102, S / 2, &points);
    run.flat(102, 3 * S, 6 * S, 12 + 4 * step, 300 + 4 * step * 256);
    for i in 0..4 {
        run.grow(102, "leak_in_worker", S / 2 + i * S / 2, step);
    }
    run.grow(101, "handle", S, 1);
    run.finish(6 * S)
}

#[test]
fn one_growing_worker_is_named_with_its_path() {
    let report = one_leaking_worker(128);
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::OneProcessGrows, "{findings:#?}");
    assert_eq!(first.scope, Scope::Process { tgid: 102 });
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "leak_in_worker"));
    assert!(
        first.summary.contains("leak_in_worker"),
        "{}",
        first.summary
    );
    assert!(
        first.next_step.contains("bound that cache"),
        "{}",
        first.next_step
    );
    assert_eq!(of(&findings, Pattern::OneProcessGrows).len(), 1);
    // Small workers are not a multiplication worth reporting as strong.
    assert!(of(&findings, Pattern::WorkerMultiplication)
        .iter()
        .all(|f| f.strength == Strength::Weak));
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn thin_growth_is_weak_and_says_so() {
    let report = one_leaking_worker(12);
    let findings = diagnose(&report);
    let grower = of(&findings, Pattern::OneProcessGrows);
    assert_eq!(grower.len(), 1, "{findings:#?}");
    assert_eq!(grower[0].strength, Strength::Weak);
    // The reasons are said once, in the last evidence line.
    assert!(
        !grower[0].summary.contains("weak evidence"),
        "{}",
        grower[0].summary
    );
    let last = grower[0].evidence.last().unwrap();
    assert!(last.starts_with("weak evidence: "), "{last}");
    assert!(last.contains("< 32.0 MiB"), "{last}");
    let weak_lines = grower[0]
        .evidence
        .iter()
        .filter(|e| e.contains("weak evidence"))
        .count();
    assert_eq!(weak_lines, 1, "{:#?}", grower[0].evidence);
}

#[test]
fn a_short_trace_is_weak() {
    let mut run = Run::new();
    run.process(1, None, Role::Root, 0);
    run.readings(1, 0, &[(10, 0), (110, 25_600), (210, 51_200), (10, 52_000)]);
    run.grow(1, "build_payload", S / 2, 200);
    let report = run.finish(2 * S);
    let findings = diagnose(&report);
    assert!(
        findings.iter().all(|f| f.strength == Strength::Weak),
        "{findings:#?}"
    );
    let last = findings[0].evidence.last().unwrap();
    assert!(last.contains("the trace lasted 2.0 s"), "{last}");
}

#[test]
fn equal_growth_in_every_sibling_is_not_one_process_growing() {
    let mut run = Run::new();
    run.process(100, None, Role::Root, 0);
    run.flat(100, 0, 6 * S, 14, 4_000);
    for tgid in [101, 102, 103] {
        run.process(tgid, Some(100), Role::Worker, 3 * S / 10);
        run.readings(tgid, S / 2, &[(12, 300), (30, 5_000), (52, 10_000)]);
        run.flat(tgid, 2 * S, 6 * S, 52, 10_000);
        run.grow(tgid, "warm_up", S, 40);
    }
    let findings = diagnose(&run.finish(6 * S));
    assert!(
        of(&findings, Pattern::OneProcessGrows).is_empty(),
        "{findings:#?}"
    );
}

/// Master 200 and workers 201..=203 traced from attach (no fork seen); each
/// worker loads a model of about 85 MiB in its first second, then holds it.
fn large_workers() -> Report {
    let mut run = Run::new();
    run.process(200, None, Role::Root, 0);
    run.flat(200, 0, 6 * S, 30, 1_000);
    for (tgid, extra) in [(201, 0), (202, 4), (203, 8)] {
        run.process(tgid, Some(200), Role::Worker, 0);
        let size = 95 + extra;
        run.readings(tgid, 0, &[(15, 0), (55, 10_000), (size, 20_000)]);
        run.flat(tgid, S + S / 2, 6 * S, size, 20_000);
        run.grow(tgid, "load_model", S / 2, size - 15);
    }
    run.finish(6 * S)
}

#[test]
fn every_worker_large_gives_sizes_and_spread() {
    let report = large_workers();
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::EveryWorkerLarge, "{findings:#?}");
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong)
    );
    assert!(
        first.summary.contains("3 workers of about 99.0 MiB"),
        "{}",
        first.summary
    );
    assert!(first.summary.contains("spread 8%"), "{}", first.summary);
    assert!(runs_through(&report, first.paths[0], "load_model"));
    assert!(first.next_step.contains("reduce per-worker state"));
    // No fork was seen: not a multiplication.
    assert!(of(&findings, Pattern::WorkerMultiplication).is_empty());
    // Loading once and holding is a working set, not a strong retention.
    assert!(of(&findings, Pattern::Retention)
        .iter()
        .all(|f| f.strength == Strength::Weak));
}

#[test]
fn workers_running_before_attach_did_not_inherit_at_fork() {
    let findings = diagnose(&large_workers());
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        large[0]
            .evidence
            .iter()
            .all(|e| !e.contains("inherited at fork")),
        "{:#?}",
        large[0].evidence
    );
    assert!(
        large[0].evidence.iter().any(|e| e
            .contains("the 3 worker(s) already running when tracing began held a median 15.0 MiB")),
        "{:#?}",
        large[0].evidence
    );
}

#[test]
fn every_worker_large_names_the_workers_paths_and_what_forks_inherited() {
    let report = prefork_with_shared_table();
    let findings = diagnose(&report);
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    // The master's table is the largest growth stack, but not the workers'.
    assert!(runs_through(
        &report,
        report.growth_stacks[0].stack,
        "build_table"
    ));
    assert!(!large[0].paths.is_empty());
    assert!(
        large[0]
            .paths
            .iter()
            .all(|&s| !runs_through(&report, s, "build_table")),
        "{:#?}",
        large[0]
    );
    assert!(
        large[0].evidence.iter().any(|e| e.contains(
            "the 3 worker(s) forked during the trace held a median 68.0 MiB at their first \
             reading (inherited at fork)"
        )),
        "{:#?}",
        large[0].evidence
    );
}

#[test]
fn small_or_uneven_workers_are_not_every_worker_large() {
    let findings = diagnose(&one_leaking_worker(128));
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

/// Master 300 builds a 56 MiB table in `build_table`, then forks workers at
/// 1, 1.5 and 2 s; each worker un-shares the table in `walk_table`
/// (copy-on-write) and grows 16 MiB of its own in `handle`.
fn prefork_with_shared_table() -> Report {
    let mut run = Run::new();
    run.process(300, None, Role::Root, 0);
    run.readings(300, 0, &[(12, 0), (68, 14_000)]);
    run.flat(300, S, 7 * S, 68, 14_000);
    run.grow(300, "build_table", S / 4, 56);
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        run.process(tgid, Some(300), Role::Worker, forked_ns);
        let first_ns = forked_ns + S / 10;
        run.readings(tgid, first_ns, &[(68, 0), (76, 2_000), (84, 4_000)]);
        run.flat(tgid, first_ns + 3 * S / 2, 6 * S, 84, 4_000);
        run.final_cow(tgid, 6 * S + S / 4, 84, 4_000, 50);
        run.grow(tgid, "handle", first_ns + S / 2, 16);
        run.cow(tgid, "walk_table", first_ns + S / 2, 50);
    }
    run.finish(7 * S)
}

#[test]
fn worker_multiplication_counts_steps_and_copy_on_write() {
    let report = prefork_with_shared_table();
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(
        first.pattern,
        Pattern::WorkerMultiplication,
        "{findings:#?}"
    );
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong)
    );
    assert!(first.summary.contains("over 3 forks"), "{}", first.summary);
    assert!(first.summary.contains("3.0 x"), "{}", first.summary);
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("un-shared 150.0 MiB")),
        "{:#?}",
        first.evidence
    );
    assert!(first
        .paths
        .iter()
        .any(|&s| runs_through(&report, s, "walk_table")));
    assert!(first
        .paths
        .iter()
        .any(|&s| runs_through(&report, s, "handle")));
    assert!(
        first.next_step.contains("walk_table"),
        "{}",
        first.next_step
    );
    // The same workers are also every-worker-large, ranked after.
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1);
    assert!(
        findings
            .iter()
            .position(|f| f.pattern == Pattern::EveryWorkerLarge)
            > Some(0)
    );
}

#[test]
fn forks_of_uneven_workers_are_not_multiplication() {
    let mut run = Run::new();
    run.process(300, None, Role::Root, 0);
    run.flat(300, 0, 6 * S, 12, 1_000);
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        run.process(tgid, Some(300), Role::Worker, forked_ns);
        let size = if tgid == 302 { 200 } else { 12 };
        run.readings(tgid, forked_ns + S / 10, &[(12, 0), (size, 50_000)]);
        run.flat(tgid, forked_ns + S, 6 * S, size, 50_000);
    }
    let findings = diagnose(&run.finish(6 * S));
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
}

#[test]
fn workers_that_grow_after_forking_are_not_multiplication() {
    // Small at fork (16 MiB each), then each grows 64 MiB in its own cache:
    // the fork steps make a small share of the tree's rise.
    let mut run = Run::new();
    run.process(300, None, Role::Root, 0);
    run.flat(300, 0, 8 * S, 20, 1_000);
    for (i, tgid) in [301_u32, 302, 303, 304].into_iter().enumerate() {
        let forked_ns = S / 10 + i as u64 * S / 100;
        run.process(tgid, Some(300), Role::Worker, forked_ns);
        run.readings(
            tgid,
            forked_ns + S / 10,
            &[(16, 0), (40, 20_000), (64, 40_000), (80, 60_000)],
        );
        run.flat(tgid, 4 * S, 8 * S, 80, 60_000);
        run.grow(tgid, "render_report", S, 64);
    }
    let findings = diagnose(&run.finish(8 * S));
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
}

/// Process 400 idles at 12 MiB, builds a 200 MiB payload in
/// `build_payload` at 1-1.5 s, holds it to 2 s, frees it by 2.5 s, then idles
/// until 6 s.
fn released_spike() -> Report {
    let mut run = Run::new();
    run.process(400, None, Role::Root, 0);
    run.readings(
        400,
        0,
        &[
            (12, 0),
            (12, 100),
            (12, 200),
            (212, 51_400),
            (212, 51_500),
            (14, 51_900),
        ],
    );
    run.flat(400, 3 * S, 6 * S, 14, 52_000);
    run.grow(400, "build_payload", S + S / 4, 200);
    run.finish(6 * S)
}

#[test]
fn a_released_spike_names_its_path_and_is_not_retention() {
    let report = released_spike();
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Spike, "{findings:#?}");
    assert_eq!(first.scope, Scope::Process { tgid: 400 });
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "build_payload"));
    assert!(
        first.summary.contains("rose +200.0 MiB"),
        "{}",
        first.summary
    );
    assert!(first.next_step.contains("stream that payload"));
    assert!(
        of(&findings, Pattern::Retention).is_empty(),
        "{findings:#?}"
    );
}

#[test]
fn slow_growth_that_is_released_is_not_a_spike() {
    let mut run = Run::new();
    run.process(1, None, Role::Root, 0);
    let up: Vec<(u64, u64)> = (0..10).map(|i| (12 + 20 * i, 5_000 * i)).collect();
    run.readings(1, 0, &up);
    run.readings(1, 5 * S, &[(12, 50_000), (12, 50_000)]);
    run.grow(1, "batch", 2 * S, 180);
    let findings = diagnose(&run.finish(6 * S));
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
}

/// Process 500 serves traffic from 0 to 5 s, growing its cache in
/// `remember` by 24 MiB per second, then idles until 9 s holding it.
fn cache_held_after_traffic() -> Report {
    let mut run = Run::new();
    run.process(500, None, Role::Root, 0);
    let busy: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 12 * i, 40_000 * i)).collect();
    run.readings(500, 0, &busy);
    run.flat(500, 5 * S + S / 2, 9 * S, 132, 400_050);
    for second in 0..5 {
        run.grow(500, "remember", second * S + S / 2, 24);
    }
    run.grow(500, "<module>", S / 10, 2);
    run.finish(9 * S)
}

#[test]
fn retention_after_traffic_names_the_steady_path() {
    let report = cache_held_after_traffic();
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Retention, "{findings:#?}");
    assert_eq!(first.scope, Scope::Process { tgid: 500 });
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "remember"));
    assert!(
        first.summary.contains("after its activity dropped"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("unbounded-cache signature")),
        "{:#?}",
        first.evidence
    );
    assert!(first.next_step.contains("bound that cache"));
    assert!(of(&findings, Pattern::Spike).is_empty());
}

#[test]
fn growth_while_idle_is_retention() {
    let mut run = Run::new();
    run.process(600, None, Role::Root, 0);
    // Busy without growth for 2 s (50k events/s), then idle while a
    // background refresh adds 8 MiB per second (2k events/s).
    run.readings(
        600,
        0,
        &[
            (20, 0),
            (20, 25_000),
            (20, 50_000),
            (20, 75_000),
            (20, 100_000),
        ],
    );
    let idle: Vec<(u64, u64)> = (1..=12)
        .map(|i| (20 + 4 * i, 100_000 + 1_000 * i))
        .collect();
    run.readings(600, 2 * S + S / 2, &idle);
    for second in 2..8 {
        run.grow(600, "refresh", second * S + S / 2, 8);
    }
    let report = run.finish(9 * S);
    let findings = diagnose(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Retention, "{findings:#?}");
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(
        first.summary.contains("kept growing while idle"),
        "{}",
        first.summary
    );
    assert!(runs_through(&report, first.paths[0], "refresh"));
}

#[test]
fn growth_without_an_idle_period_is_weak_retention() {
    let mut run = Run::new();
    run.process(700, None, Role::Root, 0);
    let busy: Vec<(u64, u64)> = (0..=12).map(|i| (12 + 10 * i, 30_000 * i)).collect();
    run.readings(700, 0, &busy);
    for second in 0..6 {
        run.grow(700, "remember", second * S + S / 2, 20);
    }
    let findings = diagnose(&run.finish(6 * S));
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    assert_eq!(retention[0].strength, Strength::Weak);
    let last = retention[0].evidence.last().unwrap();
    assert!(last.contains("activity never dropped"), "{last}");
}

#[test]
fn flat_processes_are_no_growth() {
    let mut run = Run::new();
    run.process(800, None, Role::Root, 0);
    run.flat(800, 0, 5 * S, 20, 1_000);
    run.process(801, Some(800), Role::Worker, S);
    run.readings(801, S + S / 10, &[(20, 0), (22, 500)]);
    run.flat(801, 2 * S, 5 * S, 22, 500);
    run.grow(801, "handle", 2 * S, 2);
    let findings = diagnose(&run.finish(5 * S));
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let only = &findings[0];
    assert_eq!((only.pattern, only.scope), (Pattern::NoGrowth, Scope::Tree));
    assert_eq!(only.strength, Strength::Strong);
    assert!(
        only.summary.contains("+2.0 MiB in tgid 801"),
        "{}",
        only.summary
    );
}

#[test]
fn growth_that_fits_no_pattern_is_weak_and_not_called_no_growth() {
    // A lone process rises 100 MiB over 5 s (too slow for a spike), then
    // falls back to 60 MiB while still busy (too far below its peak for
    // retention).
    let mut run = Run::new();
    run.process(900, None, Role::Root, 0);
    let up: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 10 * i, 20_000 * i)).collect();
    run.readings(900, 0, &up);
    let down: Vec<(u64, u64)> = [100, 90, 80, 70, 60, 60]
        .into_iter()
        .enumerate()
        .map(|(i, mib)| (mib, 220_000 + 20_000 * i as u64))
        .collect();
    run.readings(900, 5 * S + S / 2, &down);
    for second in 0..5 {
        run.grow(900, "accumulate", second * S + S / 2, 20);
    }
    let report = run.finish(8 * S);
    let findings = diagnose(&report);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let only = &findings[0];
    assert_eq!(
        (only.pattern, only.scope, only.strength),
        (
            Pattern::UnmatchedGrowth,
            Scope::Process { tgid: 900 },
            Strength::Weak
        )
    );
    assert!(
        only.summary.contains("tgid 900 grew +100.0 MiB")
            && only.summary.contains("matches none of the known"),
        "{}",
        only.summary
    );
    assert!(!only.summary.contains("no growth"), "{}", only.summary);
    assert!(
        !only.next_step.contains("nothing to fix"),
        "{}",
        only.next_step
    );
    assert!(only.next_step.contains("accumulate"), "{}", only.next_step);
    assert!(runs_through(&report, only.paths[0], "accumulate"));
    assert!(
        only.evidence
            .iter()
            .any(|e| e.contains("RSS 12.0 MiB -> 60.0 MiB (peak 112.0 MiB)")),
        "{:#?}",
        only.evidence
    );
}

#[test]
fn no_growth_counts_the_rise_of_the_lived_timeline() {
    // Process 950 is flat while it lives; the reading taken at its exit
    // (address space torn down, then a bogus high value) is not its growth.
    let mut run = Run::new();
    run.process(950, None, Role::Root, 0);
    run.flat(950, 0, 4 * S, 30, 1_000);
    run.agg.process_exited(950, 4 * S + S / 4);
    run.readings(950, 4 * S + S / 2, &[(200, 1_000)]);
    let findings = diagnose(&run.finish(5 * S));
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0].pattern, Pattern::NoGrowth);
    assert!(
        findings[0].summary.contains("+0 B in tgid 950"),
        "{}",
        findings[0].summary
    );
}

#[test]
fn a_report_without_readings_is_weak_no_growth() {
    let findings = diagnose(&Run::new().finish(5 * S));
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].pattern, Pattern::NoGrowth);
    assert_eq!(findings[0].strength, Strength::Weak);
}

#[test]
fn steady_and_burst_paths_are_told_apart() {
    let report = cache_held_after_traffic();
    let steady = report
        .paths
        .iter()
        .find(|p| runs_through(&report, p.stack, "remember"));
    let spread = paths::spread(&[steady.unwrap()], report.path_bucket_ns).unwrap();
    assert!(spread.is_steady(), "{spread:?}");
    let spike = released_spike();
    let burst = paths::spread(&[&spike.paths[0]], spike.path_bucket_ns).unwrap();
    assert!(!burst.is_steady());
    assert_eq!(burst.max_pair_share, 1.0);
}

#[test]
fn findings_are_strong_first_then_by_bytes() {
    let report = prefork_with_shared_table();
    let findings = diagnose(&report);
    let strong = findings
        .iter()
        .take_while(|f| f.strength == Strength::Strong)
        .count();
    assert!(findings[strong..]
        .iter()
        .all(|f| f.strength == Strength::Weak));
    assert!(strong >= 2, "{findings:#?}");
}

/// [`tree::peak_tree_rss_from`] the slow way: [`tree::tree_rss_at`] at
/// every reading at or after `from_ns`.
fn peak_tree_rss_by_rescanning(report: &Report, from_ns: u64) -> u64 {
    report
        .processes
        .iter()
        .flat_map(|p| lived_timeline(p).iter().map(|pt| pt.t_ns))
        .filter(|&t| t >= from_ns)
        .map(|t| tree::tree_rss_at(report, t))
        .max()
        .unwrap_or(0)
}

#[test]
fn the_tree_rss_sweep_matches_rescanning_at_every_reading() {
    // Exits (one with readings after it), readings at the same time in
    // several processes and in one process, forks mid-trace.
    let mut run = Run::new();
    run.process(1, None, Role::Root, 0);
    run.readings(1, 0, &[(10, 0), (20, 0), (15, 0), (40, 0)]);
    run.process(2, Some(1), Role::Worker, S / 4);
    run.readings(2, S / 2, &[(30, 0), (70, 0), (50, 0)]);
    run.agg.process_exited(2, 3 * S / 2);
    run.readings(2, 3 * S / 2, &[(5, 0), (90, 0)]);
    run.process(3, Some(1), Role::Worker, S);
    run.readings(3, S, &[(25, 0), (25, 0), (60, 0)]);
    let churn = run.finish(3 * S);
    let reports = [
        churn,
        prefork_with_shared_table(),
        one_leaking_worker(128),
        released_spike(),
        large_workers(),
    ];
    for report in &reports {
        for from_ns in [0, 1, S / 2, S, 3 * S / 2, 2 * S, 10 * S] {
            assert_eq!(
                tree::peak_tree_rss_from(report, from_ns),
                peak_tree_rss_by_rescanning(report, from_ns),
                "from {from_ns} ns in {:#?}",
                report.processes
            );
        }
    }
}

#[test]
fn findings_round_trip_through_json() {
    let findings = diagnose(&one_leaking_worker(128));
    let json = serde_json::to_value(&findings).unwrap();
    assert_eq!(json[0]["pattern"], "one_process_grows");
    assert_eq!(json[0]["scope"]["scope"], "process");
    assert_eq!(json[0]["scope"]["tgid"], 102);
    assert_eq!(json[0]["strength"], "strong");
    let back: Vec<Finding> = serde_json::from_value(json).unwrap();
    assert_eq!(back, findings);
}
