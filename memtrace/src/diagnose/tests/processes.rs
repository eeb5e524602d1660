//! Diagnosis tests on one process among its siblings: a worker that grows,
//! thin or short evidence, equal growth everywhere, a reused tgid, an execve.

use super::*;

/// A master (100) and three workers forked at 0.3 s; worker 102 leaks
/// `leak_mib` MiB in `leak_in_worker` between 0.5 s and 2.5 s, then holds it
/// until 6 s, and touches a 20 MiB scratch buffer in `scratch` ten times
/// (200 MiB grown, nothing held); the others stay flat. Returns the report
/// and 102's image.
pub(super) fn one_leaking_worker(leak_mib: u64) -> (Report, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 6 * S, at(14, 4_000));
    let workers: Vec<ProcessId> = [101, 102, 103]
        .into_iter()
        .map(|tgid| run.fork(tgid, master, 3 * S / 10, 12))
        .collect();
    for &id in [workers[0], workers[2]].iter() {
        run.flat(id, S / 2, 6 * S, at(12, 300));
    }
    let leaker = workers[1];
    let step = leak_mib / 4;
    let mut points = vec![(12, 300)];
    points.extend((1..=4).map(|i| (12 + i * step, 300 + i * step * 256)));
    run.readings(leaker, S / 2, &points);
    run.flat(
        leaker,
        3 * S,
        6 * S,
        at(12 + 4 * step, 300 + 4 * step * 256),
    );
    for i in 0..4 {
        run.grow(leaker, "leak_in_worker", S / 2 + i * S / 2, step);
    }
    for i in 0..10 {
        run.grow(leaker, "scratch", S / 2 + i * S / 5, 20);
        run.free(leaker, "scratch", S / 2 + i * S / 5 + S / 10, 20);
    }
    run.grow(workers[0], "handle", S, 1);
    (run.finish(6 * S), leaker)
}

#[test]
fn one_growing_worker_is_named_with_its_path_and_held_bytes() {
    let (report, leaker) = one_leaking_worker(128);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::OneProcessGrows, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, leaker));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "leak_in_worker"));
    assert!(
        first
            .summary
            .starts_with("worker tgid 102 grew +128.0 MiB while its 2 sibling(s) stayed flat"),
        "{}",
        first.summary
    );
    assert!(
        first.summary.ends_with("mostly in leak_in_worker"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("holds 128.0 MiB at the end, held 128.0 MiB at the high-water")),
        "{:#?}",
        first.evidence
    );
    // Its held bytes rose in every bucket: a cache without a bound.
    assert!(
        first.next_step.contains("bound that cache"),
        "{}",
        first.next_step
    );
    assert_eq!(of(&findings, Pattern::OneProcessGrows).len(), 1);
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn thin_growth_is_weak_and_says_so_once() {
    let (report, _) = one_leaking_worker(12);
    let findings = findings(&report);
    let grower = of(&findings, Pattern::OneProcessGrows);
    assert_eq!(grower.len(), 1, "{findings:#?}");
    assert_eq!(grower[0].strength, Strength::Weak);
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
    let id = run.root(1, 0, 10);
    run.readings(
        id,
        0,
        &[(10, 0), (110, 25_600), (210, 51_200), (10, 52_000)],
    );
    run.grow(id, "build_payload", S / 2, 200);
    run.free(id, "build_payload", 3 * S / 2, 200);
    let report = run.finish(2 * S);
    let findings = findings(&report);
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
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 6 * S, at(14, 4_000));
    for tgid in [101, 102, 103] {
        let id = run.fork(tgid, master, 3 * S / 10, 12);
        run.readings(id, S / 2, &[(12, 300), (30, 5_000), (52, 10_000)]);
        run.flat(id, 2 * S, 6 * S, at(52, 10_000));
        run.grow(id, "warm_up", S, 40);
    }
    let findings = findings(&run.finish(6 * S));
    assert!(
        of(&findings, Pattern::OneProcessGrows).is_empty(),
        "{findings:#?}"
    );
}

/// A master (100) whose worker tgid 101 is used twice by the kernel: the
/// first process exits at 2 s flat, the second (forked at 2.5 s) grows
/// 100 MiB in `leak_in_worker`; workers 102 and 103 stay flat. Returns the
/// report and the two instances.
pub(super) fn reused_tgid() -> (Report, ProcessId, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 8 * S, at(14, 4_000));
    let first = run.fork(101, master, S / 5, 12);
    run.flat(first, S / 2, 2 * S, at(12, 300));
    run.exit_begins(first, 2 * S, at(12, 300));
    run.exited(first, 2 * S + S / 10, at(1, 300));
    for tgid in [102, 103] {
        let id = run.fork(tgid, master, S / 5, 12);
        run.flat(id, S / 2, 8 * S, at(12, 300));
    }
    let second = run.started(
        ProcessStart {
            start_time_ns: 900_000_000_000,
            ..start(101, Some(master), Role::Worker, 5 * S / 2)
        },
        at(12, 0),
    );
    let up: Vec<(u64, u64)> = (0..=4).map(|i| (12 + 25 * i, 300 + 8_000 * i)).collect();
    run.readings(second, 3 * S, &up);
    run.flat(second, 5 * S + S / 2, 8 * S, at(112, 32_300));
    for i in 0..4 {
        run.grow(second, "leak_in_worker", 3 * S + i * S / 2, 25);
    }
    (run.finish(8 * S), first, second)
}

#[test]
fn a_reused_tgid_is_two_processes_named_apart() {
    let (report, first, second) = reused_tgid();
    assert_eq!(report.name(first), "tgid 101");
    assert_eq!(report.name(second), "tgid 101#2");
    let findings = findings(&report);
    let grower = of(&findings, Pattern::OneProcessGrows);
    assert_eq!(grower.len(), 1, "{findings:#?}");
    assert_eq!(grower[0].scope, scope(&report, second));
    assert!(
        grower[0]
            .summary
            .starts_with("worker tgid 101#2 grew +100.0 MiB while its 3 sibling(s) stayed flat"),
        "{}",
        grower[0].summary
    );
    // The first process on the same tgid is one of its siblings.
    let siblings = grower[0]
        .evidence
        .iter()
        .find(|e| e.starts_with("siblings: "))
        .unwrap();
    assert!(siblings.contains("tgid 101 +0 B"), "{siblings}");
    assert!(siblings.contains("tgid 102 +0 B"), "{siblings}");
    assert!(!siblings.contains("#2"), "{siblings}");
}

/// A master (100) with workers 101..=103 forked at 0.2 s; worker 102 loads
/// 60 MiB in `load_model` until 2 s, holds it idle until 4 s, then exec's
/// `sleep` (image 1, flat at 1 MiB until 8 s). Returns the report and 102's
/// two images.
pub(super) fn worker_that_execs() -> (Report, ProcessId, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 8 * S, at(14, 4_000));
    let mut images = Vec::new();
    for tgid in [101, 102, 103] {
        let id = run.fork(tgid, master, S / 5, 12);
        if tgid != 102 {
            run.flat(id, S / 2, 8 * S, at(12, 300));
            continue;
        }
        let up: Vec<(u64, u64)> = (0..=4).map(|i| (12 + 15 * i, 300 + 8_000 * i)).collect();
        run.readings(id, S / 2, &up);
        run.flat(id, 3 * S, 4 * S, at(72, 32_300));
        for i in 0..4 {
            run.grow(id, "load_model", S / 2 + i * S / 2, 15);
        }
        let sleep = run.exec(id, 4 * S, "sleep 100");
        run.flat(sleep, 4 * S + S / 2, 8 * S, at(1, 10));
        images = vec![id, sleep];
    }
    (run.finish(8 * S), images[0], images[1])
}

#[test]
fn an_exec_keeps_the_phase_before_it_and_is_not_a_sibling() {
    let (report, python, sleep) = worker_that_execs();
    assert_eq!(report.name(python), "tgid 102, image 0");
    assert_eq!(report.name(sleep), "tgid 102, image 1");
    let findings = findings(&report);
    // The image before the exec is compared with nothing (its siblings are
    // the last images), so it is not "one process grows"...
    assert!(
        of(&findings, Pattern::OneProcessGrows).is_empty(),
        "{findings:#?}"
    );
    // ... but its growth is diagnosed, on its own, named as that image.
    let about_python: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.scope == scope(&report, python))
        .collect();
    assert_eq!(about_python.len(), 1, "{findings:#?}");
    let finding = about_python[0];
    assert_eq!(finding.pattern, Pattern::Retention, "{finding:#?}");
    assert!(
        finding
            .summary
            .starts_with("tgid 102, image 0 retains +60.0 MiB"),
        "{}",
        finding.summary
    );
    assert!(runs_through(&report, finding.paths[0], "load_model"));
    // The exec is not a release.
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
    assert!(findings.iter().all(|f| f.scope != scope(&report, sleep)));
}
