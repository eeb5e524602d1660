//! Diagnosis tests on pre-fork workers: every worker large, worker-count
//! multiplication, copy-on-write unsharing of the master's pages.

use super::processes::one_leaking_worker;
use super::*;

/// Master 200 and workers 201..=203 traced from attach (no fork seen); each
/// worker loads a model of about 85 MiB in its first second, then holds it.
pub(super) fn large_workers() -> Report {
    let mut run = Run::new();
    let master = run.root(200, 0, 30);
    run.flat(master, 0, 6 * S, at(30, 1_000));
    for (tgid, extra) in [(201, 0), (202, 4), (203, 8)] {
        let id = run.started(start(tgid, Some(master), Role::Worker, 0), at(15, 0));
        let size = 95 + extra;
        run.readings(id, 0, &[(15, 0), (55, 10_000), (size, 20_000)]);
        run.flat(id, S + S / 2, 6 * S, at(size, 20_000));
        run.grow(id, "load_model", S / 2, size - 15);
    }
    run.finish(6 * S)
}

#[test]
fn every_worker_large_gives_sizes_spread_and_what_they_are_measured_in() {
    let report = large_workers();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::EveryWorkerLarge, "{findings:#?}");
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong)
    );
    assert!(
        first
            .summary
            .contains("3 workers of about 99.0 MiB RSS each"),
        "{}",
        first.summary
    );
    assert!(first.summary.contains("spread 8%"), "{}", first.summary);
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("RSS: no PSS was read")),
        "{:#?}",
        first.evidence
    );
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
    let findings = findings(&large_workers());
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
        large[0].evidence.iter().any(|e| e.contains(
            "the 3 worker(s) already running when tracing began held a median RSS of 15.0 MiB"
        )),
        "{:#?}",
        large[0].evidence
    );
}

/// Master 300 builds a 56 MiB table in `build_table`, then forks workers at
/// 1, 1.5 and 2 s; each worker un-shares 50 MiB of the table in
/// `walk_table` (copy-on-write) and grows 16 MiB of its own in `handle`.
/// With `pss`, PSS and USS are read as /proc/PID/smaps_rollup would show
/// them (each worker ends at 70 MiB of PSS; the master at 60 MiB).
pub(super) fn prefork_with_shared_table(pss: bool) -> Report {
    let with = |read: Read, pss_mib: u64, uss_mib: u64| {
        if pss {
            read.pss(pss_mib, uss_mib)
        } else {
            read
        }
    };
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.reads(
        master,
        0,
        &[with(at(12, 0), 12, 12), with(at(68, 14_000), 68, 68)],
    );
    run.grow(master, "build_table", S / 4, 56);
    run.read(master, S - S / 10, with(at(68, 14_000), 68, 68));
    run.flat(master, S + S / 2, 7 * S, with(at(68, 14_000), 60, 50));
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        let id = run.fork(tgid, master, forked_ns, 68);
        let first_ns = forked_ns + S / 10;
        run.reads(
            id,
            first_ns,
            &[
                with(at(68, 0), 17, 0),
                with(at(76, 2_000).cow(25), 45, 33),
                with(at(84, 4_000).cow(50), 70, 66),
            ],
        );
        run.flat(id, first_ns + 3 * S / 2, 6 * S, with(at(84, 4_000), 70, 66));
        run.read(id, 6 * S + S / 4, with(at(84, 4_000), 70, 66));
        run.grow(id, "handle", first_ns + S / 2, 16);
        run.cow(id, "walk_table", first_ns + S / 2, 50);
    }
    run.finish(7 * S)
}

#[test]
fn worker_multiplication_counts_steps_and_copy_on_write() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
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
    assert!(
        first.summary.contains(
            "the tree's RSS rose from 68.0 MiB to 320.0 MiB over 3 forks, about 3.0 x the \
             per-worker RSS of 84.0 MiB"
        ),
        "{}",
        first.summary
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "what each fork added: tgid 301 at 1.0 s +68.0 MiB, tgid 302 at 1.5 s +68.0 MiB"
        )),
        "{:#?}",
        first.evidence
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("RSS: no PSS was read")),
        "{:#?}",
        first.evidence
    );
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
    // Its RSS grew along with USS: not copy-on-write un-sharing alone.
    assert!(of(&findings, Pattern::CowUnsharing).is_empty());
    // The same workers are also every-worker-large, ranked after.
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        findings
            .iter()
            .position(|f| f.pattern == Pattern::EveryWorkerLarge)
            > Some(0)
    );
}

#[test]
fn worker_multiplication_counts_shared_pages_once_with_pss() {
    let report = prefork_with_shared_table(true);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(
        first.pattern,
        Pattern::WorkerMultiplication,
        "{findings:#?}"
    );
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    // 60 MiB of master and 3 x 70 MiB of workers, not 68 + 3 x 84 MiB.
    assert!(
        first.summary.contains(
            "the tree's PSS rose from 68.0 MiB to 270.0 MiB over 3 forks, about 2.9 x the \
             per-worker PSS of 70.0 MiB"
        ),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("PSS: a page shared copy-on-write counts once in the tree")),
        "{:#?}",
        first.evidence
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "tgid 301 at 1.0 s: 50.0 MiB un-shared, RSS +16.0 MiB, 70.0 MiB PSS at its peak; \
             tgid 302 at 1.5 s:"
        )),
        "{:#?}",
        first.evidence
    );
    assert!(of(&findings, Pattern::CowUnsharing).is_empty());
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        large[0]
            .summary
            .contains("3 workers of about 70.0 MiB PSS each"),
        "{}",
        large[0].summary
    );
}

#[test]
fn a_preloaded_master_whose_workers_share_its_pages_is_not_multiplication() {
    // The master preloads 200 MiB; four workers fork and write nothing:
    // their RSS counts the master's pages again, their PSS does not.
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.reads(
        master,
        0,
        &[at(12, 0).pss(12, 12), at(212, 50_000).pss(212, 212)],
    );
    run.grow(master, "preload", S / 4, 200);
    run.read(master, S - S / 10, at(212, 50_000).pss(212, 212));
    run.flat(master, S + S / 2, 6 * S, at(212, 50_000).pss(43, 2));
    for (i, tgid) in [301_u32, 302, 303, 304].into_iter().enumerate() {
        let id = run.fork(tgid, master, S + i as u64 * S / 10, 212);
        run.flat(id, 3 * S / 2, 6 * S, at(213, 1_000).pss(43, 1).cow(1));
    }
    let report = run.finish(6 * S);
    let findings = findings(&report);
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
    // Counted in RSS, the tree would have multiplied about 5 x.
    assert!(report.totals.peak_total_rss_bytes >= 5 * 212 * MIB);
    assert!(tree::peak_tree_from(&report, S) <= 220 * MIB);
}

#[test]
fn every_worker_large_names_the_workers_paths_and_what_forks_inherited() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
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
            "the 3 worker(s) forked during the trace started from a median RSS of 68.0 MiB \
             inherited at fork"
        )),
        "{:#?}",
        large[0].evidence
    );
}

#[test]
fn small_or_uneven_workers_are_not_every_worker_large() {
    let (report, _) = one_leaking_worker(128);
    let findings = findings(&report);
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn forks_of_uneven_workers_are_not_multiplication() {
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.flat(master, 0, 6 * S, at(12, 1_000));
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        let id = run.fork(tgid, master, forked_ns, 12);
        let size = if tgid == 302 { 200 } else { 12 };
        run.readings(id, forked_ns + S / 10, &[(12, 0), (size, 50_000)]);
        run.flat(id, forked_ns + S, 6 * S, at(size, 50_000));
    }
    let findings = findings(&run.finish(6 * S));
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
    let master = run.root(300, 0, 20);
    run.flat(master, 0, 8 * S, at(20, 1_000));
    for (i, tgid) in [301_u32, 302, 303, 304].into_iter().enumerate() {
        let forked_ns = S / 10 + i as u64 * S / 100;
        let id = run.fork(tgid, master, forked_ns, 16);
        run.readings(
            id,
            forked_ns + S / 10,
            &[(16, 0), (40, 20_000), (64, 40_000), (80, 60_000)],
        );
        run.flat(id, 4 * S, 8 * S, at(80, 60_000));
        run.grow(id, "render_report", S, 64);
    }
    let findings = findings(&run.finish(8 * S));
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
}

/// A master (100) preloads 148 MiB in `build_shared`, then forks four
/// workers that read every inherited object in `read_inherited`: their RSS
/// stays at about 160 MiB while their USS grows from 1 to 149 MiB, by
/// `cow_mib` of copy-on-write faults each (0: the master's pages became
/// theirs without a write). With `early_read`, each worker's PSS and USS
/// are read 0.1 s after its fork (USS 1 MiB), else first after the
/// un-sharing. Beside them, an unrelated process (200) hoards 700 MiB in
/// `hoard` and keeps it: a strong finding about more bytes.
pub(super) fn prefork_readers(cow_mib: u64, early_read: bool) -> Report {
    let mut run = Run::new();
    let other = run.root(200, 0, 12);
    let up: Vec<(u64, u64)> = (0..=7).map(|i| (12 + 100 * i, 30_000 * i)).collect();
    run.readings(other, 0, &up);
    run.flat(other, 4 * S, 6 * S, at(712, 210_000));
    for i in 0..7 {
        run.grow(other, "hoard", S / 4 + i * S / 2, 100);
    }
    let master = run.root(100, 0, 12);
    run.reads(
        master,
        0,
        &[at(12, 0).pss(12, 12), at(160, 40_000).pss(160, 160)],
    );
    run.grow(master, "build_shared", S / 4, 148);
    run.flat(master, S, 6 * S, at(160, 40_000).pss(150, 140));
    for (i, tgid) in [101_u32, 102, 103, 104].into_iter().enumerate() {
        let forked_ns = S + S / 5 + i as u64 * S / 5;
        let id = run.fork(tgid, master, forked_ns, 160);
        if early_read {
            run.read(id, forked_ns + S / 10, at(160, 100).pss(40, 1));
        }
        let after = at(161, 40_000).pss(150, 149).cow(cow_mib);
        run.flat(id, forked_ns + S, 6 * S, after);
        if cow_mib > 0 {
            run.cow(id, "read_inherited", forked_ns + S / 2, cow_mib);
        }
    }
    run.finish(6 * S)
}

#[test]
fn copy_on_write_unsharing_is_the_first_finding() {
    let report = prefork_readers(148, true);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::CowUnsharing, "{findings:#?}");
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong),
        "{first:#?}"
    );
    assert_eq!(
        first.summary,
        "copy-on-write un-sharing: 4 workers each un-shared ~149.0 MiB of pages inherited from \
         the master (tgid 100) (USS 0 B -> 149.0 MiB while RSS stayed 161.0 MiB), written by \
         read_inherited"
    );
    assert!(runs_through(&report, first.paths[0], "read_inherited"));
    let tree_pss = format!(
        "tree PSS (shared pages counted once) is {}",
        format_bytes(report.totals.peak_total_pss_bytes)
    );
    assert!(
        first.evidence.iter().any(|e| e.starts_with(&tree_pss)),
        "{:#?}",
        first.evidence
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "tgid 101 USS 0 B at fork (first read 1.0 MiB) -> 149.0 MiB, RSS 160.0 MiB -> \
             161.0 MiB, 148.0 MiB copy-on-write (exact)"
        )),
        "{:#?}",
        first.evidence
    );
    let next = &first.next_step;
    for words in [
        "gc.freeze() (Python 3.7+) before fork stops the cyclic GC's writes",
        "reference-count writes still un-share a page",
        "read_inherited touches objects",
        "multiprocessing.shared_memory",
        "load it after fork in each worker if it is small",
        "fewer workers with more threads",
        &tree_pss,
    ] {
        assert!(next.contains(words), "{words:?} not in {next}");
    }
    // It comes before a strong finding about more bytes.
    assert!(
        of(&findings, Pattern::Retention)
            .iter()
            .any(|f| f.strength == Strength::Strong
                && f.summary.starts_with("tgid 200 retains +700.0 MiB")),
        "{findings:#?}"
    );
    // The same pages are not told again as a multiplication or as large
    // workers.
    assert!(of(&findings, Pattern::WorkerMultiplication).is_empty());
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn unsharing_before_the_first_smaps_read_is_still_seen() {
    // The workers un-share within a tick of their fork: their first USS
    // read is already high, but at fork nothing was private.
    let findings = findings(&prefork_readers(148, false));
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::CowUnsharing, "{findings:#?}");
    assert!(
        first
            .summary
            .contains("(USS 0 B -> 149.0 MiB while RSS stayed 161.0 MiB)"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("tgid 101 USS 0 B at fork (first read 149.0 MiB) -> 149.0 MiB")),
        "{:#?}",
        first.evidence
    );
}

#[test]
fn private_memory_that_grew_without_writes_is_not_unsharing() {
    // The same USS growth without copy-on-write faults (e.g. the master
    // exited and its pages became the workers' alone).
    let findings = findings(&prefork_readers(0, true));
    assert!(
        of(&findings, Pattern::CowUnsharing).is_empty(),
        "{findings:#?}"
    );
}
