//! The diagnosis's causes and the verdict the terminal ends with, on the
//! synthetic runs of each pattern: one cause for a leak every worker
//! repeats, weak causes kept apart, and a golden file of every pattern's
//! verdict (`tests/data/verdicts.txt`; `MEMTRACE_BLESS=1` rewrites it).

use super::processes::one_leaking_worker;
use super::retention::cache_held_after_traffic;
use super::transient::reads_a_mapped_file;
use super::transient::released_spike;
use super::transient::reused_buffer;
use super::workers::large_workers;
use super::workers::prefork_readers;
use super::workers::prefork_with_shared_table;
use super::*;
use crate::report::golden::check_golden;
use crate::report::verdict::{self, MAX_VERDICT_LINES};

/// A master and 5 workers that each keep what `remember` caches per request
/// (24, 20, 16, 12 and 6 MiB/s for 4.5 s: the last one's +27 MiB is weak
/// evidence on its own), then idle until 9 s: a pre-fork service leaking
/// through one cache.
fn leaking_workers() -> Report {
    workers_leaking_at(&[(201, 24), (202, 20), (203, 16), (204, 12), (205, 6)])
}

/// A master and one worker per `(tgid, MiB/s)` keeping what `remember`
/// caches at that rate for 4.5 s, then idling until 9 s.
fn workers_leaking_at(rates: &[(u32, u64)]) -> Report {
    let (run, _) = run_with_workers_leaking_at(rates);
    run.finish(9 * S)
}

/// [`workers_leaking_at`], not finished yet, with its master.
fn run_with_workers_leaking_at(rates: &[(u32, u64)]) -> (Run, ProcessId) {
    let mut run = Run::new();
    let master = run.root(200, 0, 20);
    run.flat(master, 0, 9 * S, at(20, 2_000));
    for &(tgid, mib_per_s) in rates {
        let id = run.fork(tgid, master, S / 10, 12);
        let busy: Vec<(u64, u64)> = (0..=9)
            .map(|i| (12 + mib_per_s * i / 2, 20_000 * i))
            .collect();
        run.readings(id, S / 2, &busy);
        let end_mib = 12 + mib_per_s * 9 / 2;
        run.flat(id, 5 * S + S / 2, 9 * S, at(end_mib, 180_050));
        for second in 0..9 {
            run.grow(id, "remember", S / 2 + second * S / 2, mib_per_s / 2);
        }
    }
    (run, master)
}

/// Worker 204 of `master`: it served few of the leaking requests, +6 MiB
/// by 2.5 s, all held by `remember`, under the 8 MiB a finding needs.
fn small_retainer(run: &mut Run, master: ProcessId) -> ProcessId {
    let small = run.fork(204, master, S / 10, 12);
    run.readings(
        small,
        S / 2,
        &[(12, 0), (14, 20_000), (16, 40_000), (18, 60_000)],
    );
    run.flat(small, 2 * S + S / 2, 9 * S, at(18, 60_050));
    for second in 0..3 {
        run.grow(small, "remember", S / 2 + second * S / 2, 2);
    }
    small
}

/// Worker 203 of `master`: it retains 18 MiB, a little through `remember`,
/// most through three other functions, so its own finding names no
/// `remember` path.
fn retainer_through_other_functions(run: &mut Run, master: ProcessId) -> ProcessId {
    let other = run.fork(203, master, S / 10, 12);
    run.readings(
        other,
        S / 2,
        &[(12, 0), (18, 20_000), (24, 40_000), (30, 60_000)],
    );
    run.flat(other, 2 * S + S / 2, 9 * S, at(30, 60_050));
    for (function, mib) in [("parse", 6), ("render", 5), ("encode", 5), ("remember", 2)] {
        run.grow(other, function, S, mib);
    }
    other
}

#[test]
fn a_leak_every_worker_repeats_is_one_cause() {
    let report = diagnose(leaking_workers());
    assert_eq!(
        of(&report.diagnosis, Pattern::Retention).len(),
        5,
        "{:#?}",
        report.diagnosis
    );
    let strong: Vec<&Cause> = report
        .causes
        .iter()
        .filter(|c| c.strength == Strength::Strong)
        .collect();
    assert_eq!(strong.len(), 1, "{:#?}", report.causes);
    let cause = strong[0];
    assert_eq!(cause.pattern, Pattern::Retention);
    assert_eq!(cause.findings.len(), 5, "the weak fifth worker joins");
    let tgids: Vec<u32> = cause.processes.iter().map(|&id| report.tgid(id)).collect();
    assert_eq!(tgids, [201, 202, 203, 204, 205], "most grown first");
    let place = &cause.places[0];
    assert!(
        matches!(&place.frame, Frame::Python { function, .. } if function == "remember"),
        "{place:?}"
    );
    // 12 + 10 + 8 + 6 + 3 MiB per half second over 9 half seconds, all
    // held.
    assert_eq!(place.bytes, 9 * (12 + 10 + 8 + 6 + 3) * MIB);
    let lines = verdict::lines(&report);
    assert!(lines.len() <= MAX_VERDICT_LINES, "{lines:#?}");
    assert!(
        lines[1].contains("retention in 5 workers (tgid 201, 202, 203, 204, 205"),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("how much: RSS +")
            && l.contains("each, +")
            && l.contains("/s each")),
        "{lines:#?}"
    );
}

#[test]
fn every_patterns_verdict_matches_its_golden_file() {
    let scenarios: Vec<(&str, Report)> = vec![
        ("leaking workers", leaking_workers()),
        ("one leaking worker", one_leaking_worker(120).0),
        ("every worker large", large_workers()),
        ("worker multiplication", prefork_with_shared_table(true)),
        ("copy-on-write un-sharing", prefork_readers(148, true)),
        ("page cache of a mapped file", reads_a_mapped_file(4).0),
        ("released spike", released_spike()),
        ("buffer touched again", reused_buffer()),
        ("cache held after traffic", cache_held_after_traffic()),
    ];
    let mut text = String::new();
    for (name, report) in scenarios {
        let lines = verdict::lines(&diagnose(report));
        assert!(lines.len() <= MAX_VERDICT_LINES, "{name}: {lines:#?}");
        text.push_str(&format!("== {name}\n{}\n\n", lines.join("\n")));
    }
    check_golden("verdicts.txt", text.as_bytes());
}

/// A process that grows 40 MiB while `app.py` imports its modules (under
/// CPython's frozen import machinery, one stdlib frame on top), then idles.
fn imports_then_idle() -> Report {
    let mut run = Run::new();
    let id = run.root(600, 0, 10);
    let busy: Vec<(u64, u64)> = (0..=4).map(|i| (10 + 10 * i, 40_000 * i)).collect();
    run.readings(id, 0, &busy);
    run.flat(id, 2 * S + S / 2, 8 * S, at(50, 160_050));
    let frames = vec![
        py("<module>", "/srv/app.py", 3),
        py("_find_and_load", "<frozen importlib._bootstrap>", 1176),
        py(
            "_compile_bytecode",
            "<frozen importlib._bootstrap_external>",
            729,
        ),
        native("_PyObject_Malloc"),
    ];
    let bytes = SampledBytes {
        growth_bytes: 40 * MIB,
        held_bytes: i64::try_from(40 * MIB).unwrap(),
        samples: 40 * MIB / SAMPLE_BYTES,
        ..SampledBytes::default()
    };
    run.sample(id, S, frames, bytes);
    run.finish(8 * S)
}

#[test]
fn import_time_growth_is_named_by_the_importing_line_and_not_called_a_cache() {
    let report = diagnose(imports_then_idle());
    let retention = of(&report.diagnosis, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{:#?}", report.diagnosis);
    let next = &retention[0].next_step;
    assert!(
        next.starts_with("nothing to bound: this is what the imports in <module> loaded"),
        "{next}"
    );
    assert!(!next.contains("cache"), "{next}");
    let place = &report.causes[0].places[0];
    assert_eq!(place.frame, py("<module>", "/srv/app.py", 3));
    assert_eq!(
        place.via,
        Some(py(
            "_compile_bytecode",
            "<frozen importlib._bootstrap_external>",
            729
        ))
    );
    assert!(place.import_time);
    let lines = verdict::lines(&report).join("\n");
    assert!(
        lines.contains("<module> (app.py:3) via _compile_bytecode (<frozen importlib._bootstrap_external>:729), at import: 40.0 MiB held at the end"),
        "{lines}"
    );
}

#[test]
fn a_pattern_of_some_of_a_causes_workers_names_them() {
    // tgid 201 outgrows its siblings; all four retain through `remember`.
    let report = diagnose(workers_leaking_at(&[
        (201, 60),
        (202, 6),
        (203, 6),
        (204, 6),
    ]));
    let patterns: Vec<(Pattern, Strength, Scope)> = report
        .diagnosis
        .iter()
        .map(|f| (f.pattern, f.strength, f.scope))
        .collect();
    assert_eq!(report.causes.len(), 1, "{patterns:#?}");
    let lines = verdict::lines(&report);
    assert!(
        lines[1].contains("one process grows (tgid 201) + retention in 4 workers (tgid 201, "),
        "{lines:#?}"
    );
}

#[test]
fn a_worker_that_retained_too_little_for_a_finding_joins_its_siblings_cause() {
    let (mut run, master) = run_with_workers_leaking_at(&[(201, 24), (202, 20), (203, 16)]);
    let small = small_retainer(&mut run, master);
    let report = diagnose(run.finish(9 * S));
    assert!(
        report
            .diagnosis
            .iter()
            .all(|f| f.scope != scope(&report, small)),
        "no finding of its own: {:#?}",
        report.diagnosis
    );
    let cause = &report.causes[0];
    let tgids: Vec<u32> = cause.processes.iter().map(|&id| report.tgid(id)).collect();
    assert_eq!(tgids, [201, 202, 203, 204], "{cause:#?}");
    assert_eq!(cause.places[0].bytes, 9 * (12 + 10 + 8) * MIB + 6 * MIB);
    let lines = verdict::lines(&report);
    assert!(lines[1].contains("retention in 4 workers"), "{lines:#?}");
    assert!(
        lines[3].contains("RSS +6.0 MiB to +108.0 MiB each"),
        "{lines:#?}"
    );
}

#[test]
fn a_weak_retention_in_workers_already_in_a_cause_joins_it() {
    let (mut run, master) = run_with_workers_leaking_at(&[(201, 24), (202, 20)]);
    retainer_through_other_functions(&mut run, master);
    let report = diagnose(run.finish(9 * S));
    let retention = of(&report.diagnosis, Pattern::Retention);
    assert_eq!(retention.len(), 3, "{:#?}", report.diagnosis);
    assert_eq!(report.causes.len(), 1, "{:#?}", report.causes);
    let cause = &report.causes[0];
    let tgids: Vec<u32> = cause.processes.iter().map(|&id| report.tgid(id)).collect();
    assert_eq!(tgids, [201, 202, 203], "{cause:#?}");
    assert_eq!(cause.findings.len(), 3);
}

#[test]
fn a_sibling_that_joined_a_cause_stays_when_another_cause_folds_into_it() {
    let (mut run, master) = run_with_workers_leaking_at(&[(201, 24), (202, 20)]);
    // tgid 203 retains 18 MiB mostly through other functions: a cause of
    // its own that folds into the first. tgid 204 retains +6 MiB through
    // `remember`, too little for a finding: a sibling the first cause takes
    // in before the fold, which must not drop it.
    retainer_through_other_functions(&mut run, master);
    small_retainer(&mut run, master);
    let report = diagnose(run.finish(9 * S));
    assert_eq!(report.causes.len(), 1, "{:#?}", verdict::lines(&report));
    let cause = &report.causes[0];
    let tgids: Vec<u32> = cause.processes.iter().map(|&id| report.tgid(id)).collect();
    assert_eq!(tgids, [201, 202, 203, 204], "{cause:#?}");
}
