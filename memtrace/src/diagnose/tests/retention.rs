//! Diagnosis tests on retention: memory held after traffic, growth while
//! idle, and growth with no idle period to tell.

use super::*;

/// Process 500 serves traffic from 0 to 5 s, growing its cache in
/// `remember` by 24 MiB per second, then idles until 9 s holding it.
pub(super) fn cache_held_after_traffic() -> Report {
    let mut run = Run::new();
    let id = run.root(500, 0, 12);
    let busy: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 12 * i, 40_000 * i)).collect();
    run.readings(id, 0, &busy);
    run.flat(id, 5 * S + S / 2, 9 * S, at(132, 400_050));
    for second in 0..5 {
        run.grow(id, "remember", second * S + S / 2, 24);
    }
    run.grow(id, "<module>", S / 10, 2);
    run.finish(9 * S)
}

#[test]
fn retention_after_traffic_names_the_steady_path() {
    let report = cache_held_after_traffic();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Retention, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, report.processes[0].id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "remember"));
    assert!(
        first
            .summary
            .starts_with("tgid 500 retains +120.0 MiB of RSS after its activity dropped"),
        "{}",
        first.summary
    );
    assert!(
        first.summary.ends_with("held by remember"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("held bytes kept rising (unbounded-cache signature)")),
        "{:#?}",
        first.evidence
    );
    assert!(first.next_step.contains("bound that cache"));
    assert!(of(&findings, Pattern::Spike).is_empty());
}

#[test]
fn growth_while_idle_is_retention() {
    let mut run = Run::new();
    let id = run.root(600, 0, 20);
    // Busy without growth for 2 s (50k events/s), then idle while a
    // background refresh adds 8 MiB per second (2k events/s).
    run.readings(
        id,
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
    run.readings(id, 2 * S + S / 2, &idle);
    for second in 2..8 {
        run.grow(id, "refresh", second * S + S / 2, 8);
    }
    let report = run.finish(9 * S);
    let findings = findings(&report);
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
fn growth_without_an_idle_period_is_strong_only_with_a_steady_held_rise() {
    let busy: Vec<(u64, u64)> = (0..=12).map(|i| (12 + 10 * i, 30_000 * i)).collect();
    // Held bytes that rise every second tell retention from load: strong,
    // whether or not the window caught an idle period.
    let mut run = Run::new();
    let id = run.root(700, 0, 12);
    run.readings(id, 0, &busy);
    for second in 0..6 {
        run.grow(id, "remember", second * S + S / 2, 20);
    }
    let steady = findings(&run.finish(6 * S));
    let retention = of(&steady, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{steady:#?}");
    assert_eq!(
        retention[0].strength,
        Strength::Strong,
        "{:#?}",
        retention[0]
    );
    // One burst, held, under constant activity: load and retention cannot
    // be told apart.
    let mut run = Run::new();
    let id = run.root(700, 0, 12);
    run.readings(id, 0, &busy);
    run.grow(id, "remember", S / 2, 120);
    let burst = findings(&run.finish(6 * S));
    let retention = of(&burst, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{burst:#?}");
    assert_eq!(retention[0].strength, Strength::Weak);
    let last = retention[0].evidence.last().unwrap();
    assert!(last.contains("activity never dropped"), "{last}");
}

/// Process 470 piles up 10 MiB of pending work every half second for 6 s
/// (RSS 12 -> 132 MiB, busy all along), clears it in its own shutdown path
/// (RSS 14 MiB at 6.5 s) and begins to finalize `exit_after_ns` after its
/// last busy reading.
fn piled_then_cleared(exit_after_ns: u64) -> Report {
    let mut run = Run::new();
    let id = run.root(470, 0, 12);
    let rising: Vec<(u64, u64)> = (0..=12).map(|i| (12 + 10 * i, 20_000 * i)).collect();
    run.readings(id, 0, &rising);
    for half in 0..12 {
        run.grow(id, "submit", half * S / 2 + S / 4, 10);
    }
    let cleared_ns = 6 * S + S / 4;
    run.free(id, "submit", cleared_ns, 120);
    run.read(id, 6 * S + S / 2, at(14, 240_500));
    let exit_ns = 6 * S + S / 2 + exit_after_ns;
    if exit_after_ns > S / 2 {
        run.flat(id, 7 * S, exit_ns - S / 2, at(14, 240_600));
    }
    run.exit_begins(id, exit_ns, at(14, 240_700));
    run.exited(id, exit_ns + S / 10, at(14, 240_700));
    run.finish(exit_ns + S / 5)
}

#[test]
fn a_release_right_before_the_exit_is_teardown_not_a_pattern() {
    let report = piled_then_cleared(S / 10);
    let findings = findings(&report);
    assert!(
        findings
            .iter()
            .all(|f| f.pattern != Pattern::Spike && f.pattern != Pattern::UnmatchedGrowth),
        "{findings:#?}"
    );
    let retention = of(&findings, Pattern::Retention)[0];
    assert!(
        retention.summary.contains(
            "kept it until it shut down, held by submit; it released 118.0 MiB while shutting down"
        ),
        "{}",
        retention.summary
    );
    assert!(
        retention
            .evidence
            .iter()
            .any(|e| e.starts_with("teardown, not a pattern: RSS fell by 118.0 MiB")),
        "{:#?}",
        retention.evidence
    );
    // One amount: the headline's growth, and what the shutdown released.
    let diagnosed = diagnose(report);
    let amount = &diagnosed.causes[0].amount.each[0];
    assert_eq!(amount.bytes, 120 * MIB, "{amount:?}");
    assert_eq!(amount.released_at_shutdown_bytes, 118 * MIB, "{amount:?}");
    assert_eq!(diagnosed.causes[0].places[0].bytes, 120 * MIB);
}

#[test]
fn a_release_long_before_the_exit_is_not_teardown() {
    let report = piled_then_cleared(3 * S);
    let findings = findings(&report);
    assert!(
        findings
            .iter()
            .all(|f| !f.summary.contains("shutting down")),
        "{findings:#?}"
    );
}
