//! Diagnosis tests on a whole run: no growth, growth that fits no pattern,
//! the order of findings, the tree sweep and the JSON round trip.

use super::processes::one_leaking_worker;
use super::processes::reused_tgid;
use super::processes::worker_that_execs;
use super::retention::cache_held_after_traffic;
use super::transient::released_spike;
use super::workers::large_workers;
use super::workers::prefork_readers;
use super::workers::prefork_with_shared_table;
use super::*;

#[test]
fn flat_processes_are_no_growth() {
    let mut run = Run::new();
    let master = run.root(800, 0, 20);
    run.flat(master, 0, 5 * S, at(20, 1_000));
    let worker = run.fork(801, master, S, 20);
    run.readings(worker, S + S / 10, &[(20, 0), (22, 500)]);
    run.flat(worker, 2 * S, 5 * S, at(22, 500));
    run.grow(worker, "handle", 2 * S, 2);
    let findings = findings(&run.finish(5 * S));
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
    let id = run.root(900, 0, 12);
    let up: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 10 * i, 20_000 * i)).collect();
    run.readings(id, 0, &up);
    let down: Vec<(u64, u64)> = [100, 90, 80, 70, 60, 60]
        .into_iter()
        .enumerate()
        .map(|(i, mib)| (mib, 220_000 + 20_000 * i as u64))
        .collect();
    run.readings(id, 5 * S + S / 2, &down);
    for second in 0..5 {
        run.grow(id, "accumulate", second * S + S / 2, 20);
    }
    run.free(id, "accumulate", 7 * S, 52);
    let report = run.finish(8 * S);
    let findings = findings(&report);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let only = &findings[0];
    assert_eq!(
        (only.pattern, only.scope, only.strength),
        (Pattern::UnmatchedGrowth, scope(&report, id), Strength::Weak)
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
fn a_report_without_readings_is_weak_no_growth() {
    let findings = findings(&Run::new().finish(5 * S));
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
        .find(|p| runs_through(&report, p.stack, "remember"))
        .unwrap();
    let rise = paths::held_rise(&[steady], report.path_bucket_ns, None).unwrap();
    assert!(rise.is_steady(), "{rise:?}");
    assert_eq!((rise.rising_buckets, rise.span_buckets), (5, 5));
    let spike = released_spike();
    let payload = &spike.paths[0];
    assert!(runs_through(&spike, payload.stack, "build_payload"));
    let burst = paths::burst(&[payload], spike.path_bucket_ns).unwrap();
    assert_eq!(burst.max_pair_share, 1.0);
    // It held its payload and gave it all back: not rising held bytes.
    let held = paths::held_rise(&[payload], spike.path_bucket_ns, None).unwrap();
    assert!(!held.is_steady(), "{held:?}");
}

#[test]
fn findings_are_strong_first_then_by_bytes() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
    let strong = findings
        .iter()
        .take_while(|f| f.strength == Strength::Strong)
        .count();
    assert!(strong >= 2, "{findings:#?}");
    assert!(findings[strong..]
        .iter()
        .all(|f| f.strength == Strength::Weak));
    let impact = |f: &Finding| match f.pattern {
        Pattern::WorkerMultiplication => 1,
        Pattern::EveryWorkerLarge => 2,
        _ => 3,
    };
    assert!(
        findings[..strong]
            .windows(2)
            .all(|w| impact(&w[0]) <= impact(&w[1])),
        "{findings:#?}"
    );
}

/// [`tree::peak_tree_from`] the slow way: [`tree::tree_at`] at every
/// reading at or after `from_ns`.
fn peak_tree_by_rescanning(report: &Report, from_ns: u64) -> u64 {
    report
        .processes
        .iter()
        .flat_map(|p| tree::tree_readings(p).map(|(t_ns, _)| t_ns))
        .filter(|&t| t >= from_ns)
        .map(|t| tree::tree_at(report, t))
        .max()
        .unwrap_or(0)
}

#[test]
fn the_tree_sweep_matches_rescanning_at_every_reading() {
    // Exits (one with readings after it in a hand-edited report), readings
    // at the same time in several processes and in one process, forks
    // mid-trace, PSS read for some processes only.
    let mut run = Run::new();
    let root = run.root(1, 0, 10);
    run.reads(
        root,
        0,
        &[
            at(10, 0),
            at(20, 0).pss(20, 20),
            at(15, 0).pss(9, 5),
            at(40, 0),
        ],
    );
    let two = run.fork(2, root, S / 4, 10);
    run.readings(two, S / 2, &[(30, 0), (70, 0), (50, 0)]);
    run.exit_begins(two, 3 * S / 2, at(50, 0));
    run.readings(two, 3 * S / 2, &[(5, 0), (90, 0)]);
    let three = run.fork(3, root, S, 20);
    run.readings(three, S, &[(25, 0), (25, 0), (60, 0)]);
    let mut churn = run.finish(3 * S);
    let two = churn.processes.iter_mut().find(|p| p.id == two).unwrap();
    let mut late = *two.timeline.last().unwrap();
    (late.t_ns, late.rss_bytes) = (2 * S, 500 * MIB);
    two.timeline.push(late);
    let reports = [
        churn,
        prefork_with_shared_table(false),
        prefork_with_shared_table(true),
        prefork_readers(148, true),
        one_leaking_worker(128).0,
        reused_tgid().0,
        worker_that_execs().0,
        released_spike(),
        large_workers(),
    ];
    for report in &reports {
        for from_ns in [0, 1, S / 4, S / 2, S, 3 * S / 2, 2 * S, 10 * S] {
            assert_eq!(
                tree::peak_tree_from(report, from_ns),
                peak_tree_by_rescanning(report, from_ns),
                "from {from_ns} ns in {:#?}",
                report.processes
            );
        }
    }
    // The reading after the exit began never counts.
    assert!(tree::peak_tree_from(&reports[0], 0) < 500 * MIB);
}

#[test]
fn the_diagnosis_round_trips_through_json() {
    let (report, leaker) = one_leaking_worker(128);
    let diagnosed = diagnose(report);
    let json = serde_json::to_value(&diagnosed).unwrap();
    let first = &json["diagnosis"][0];
    assert_eq!(first["pattern"], "one_process_grows");
    assert_eq!(first["scope"]["scope"], "process");
    assert_eq!(first["scope"]["process"], leaker.0);
    assert_eq!(first["scope"]["tgid"], 102);
    assert_eq!(first["strength"], "strong");
    // The report's own fields sit beside the diagnosis.
    assert!(json["processes"].is_array(), "{json:#}");
    let back: Diagnosed = serde_json::from_value(json).unwrap();
    assert_eq!(back.diagnosis, diagnosed.diagnosis);
    assert_eq!(back.report.processes, diagnosed.report.processes);
    assert_eq!(findings(&back.report), diagnosed.diagnosis);
}
