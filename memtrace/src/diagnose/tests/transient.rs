//! Diagnosis tests on growth that is not retention: page cache of a mapped
//! file, a payload spike released, a buffer freed and touched again.

use super::*;

/// Process 700 reads a 180 MiB mapped file in slices in `read_slices`
/// (15 MiB each half second until 6 s, file-backed RSS 10 -> 190 MiB),
/// plus `anon_mib` of its own growth in `remember` over the same time, then
/// idles until 9 s. `_compile_bytecode` grew 2 MiB at start-up.
pub(super) fn reads_a_mapped_file(anon_mib: u64) -> (Report, ProcessId) {
    let mut run = Run::new();
    let id = run.started(start(700, None, Role::Root, 0), at(30, 0).file(10));
    let reads: Vec<Read> = (0..=12)
        .map(|i| at(30 + 15 * i + anon_mib * i / 12, 40_000 * i).file(10 + 15 * i))
        .collect();
    run.reads(id, 0, &reads);
    let end = at(30 + 180 + anon_mib, 480_000).file(190);
    run.flat(id, 6 * S + S / 2, 9 * S, end);
    run.grow(id, "_compile_bytecode", S / 10, 2);
    for i in 0..12 {
        let t_ns = S / 4 + i * S / 2;
        run.file_grow(id, "read_slices", "/data/big.bin", t_ns, 15);
        if anon_mib > 0 {
            run.grow(id, "remember", t_ns, anon_mib / 12);
        }
    }
    (run.finish(9 * S), id)
}

#[test]
fn growth_in_a_mapped_file_is_page_cache_not_retention() {
    let (report, id) = reads_a_mapped_file(0);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::FileBackedGrowth, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert_eq!(
        first.summary,
        "RSS grew 180.0 MiB in file-backed pages (page cache of /data/big.bin) mapped by \
         read_slices; the kernel can reclaim these under memory pressure; it is not your heap"
    );
    assert!(runs_through(&report, first.paths[0], "read_slices"));
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("file-backed RSS 10.0 MiB -> 190.0 MiB")),
        "{:#?}",
        first.evidence
    );
    assert!(
        !first.next_step.contains("bound that cache"),
        "{}",
        first.next_step
    );
    assert!(
        first.next_step.contains("MADV_DONTNEED"),
        "{}",
        first.next_step
    );
    // The page cache is not the process's own growth: no retention, spike
    // or unmatched growth, and `_compile_bytecode` is not blamed.
    assert_eq!(findings.len(), 1, "{findings:#?}");
}

#[test]
fn a_mapped_file_unmapped_before_the_end_is_page_cache_not_a_spike() {
    let mut run = Run::new();
    let id = run.started(start(701, None, Role::Root, 0), at(30, 0).file(10));
    let reads: Vec<Read> = (0..=12)
        .map(|i| at(30 + 15 * i, 40_000 * i).file(10 + 15 * i))
        .collect();
    run.reads(id, 0, &reads);
    run.grow(id, "_compile_bytecode", S / 10, 2);
    for i in 0..12 {
        run.file_grow(id, "read_slices", "/data/big.bin", S / 4 + i * S / 2, 15);
    }
    // mmap.close() at 7 s: the file's pages leave RSS.
    let unmapped = SampledBytes {
        held_bytes: -180 * 1024 * 1024,
        ..SampledBytes::default()
    };
    run.sample(
        id,
        7 * S,
        file_stack("read_slices", "/data/big.bin"),
        unmapped,
    );
    run.flat(id, 7 * S, 9 * S, at(30, 480_000).file(10));
    let report = run.finish(9 * S);
    let findings = findings(&report);
    assert_eq!(
        findings[0].pattern,
        Pattern::FileBackedGrowth,
        "{findings:#?}"
    );
    assert!(findings[0]
        .summary
        .starts_with("RSS grew 180.0 MiB in file-backed pages"));
    assert!(
        findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("left RSS before the end")),
        "{:#?}",
        findings[0].evidence
    );
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
}

#[test]
fn a_process_reading_a_file_still_retains_its_own_memory() {
    let (report, id) = reads_a_mapped_file(60);
    let findings = findings(&report);
    assert_eq!(
        findings[0].pattern,
        Pattern::FileBackedGrowth,
        "{findings:#?}"
    );
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    let retention = retention[0];
    assert_eq!(retention.scope, scope(&report, id));
    assert_eq!(retention.strength, Strength::Strong, "{retention:#?}");
    // It reads the process's memory without the page cache, and names the
    // anonymous path, never the mapped file.
    assert!(
        retention
            .summary
            .starts_with("tgid 700 retains +60.0 MiB of RSS without file-backed pages"),
        "{}",
        retention.summary
    );
    assert!(runs_through(&report, retention.paths[0], "remember"));
    assert!(retention
        .paths
        .iter()
        .all(|&s| !runs_through(&report, s, "read_slices")));
}

/// Process 400 idles at 12 MiB, builds a 200 MiB payload in
/// `build_payload` at 1-1.5 s, holds it to 2 s, frees it by 2.5 s, then idles
/// until 6 s.
pub(super) fn released_spike() -> Report {
    let mut run = Run::new();
    let id = run.root(400, 0, 12);
    run.readings(
        id,
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
    run.flat(id, 3 * S, 6 * S, at(14, 52_000));
    run.grow(id, "build_payload", S + S / 4, 200);
    run.free(id, "build_payload", 2 * S + S / 4, 200);
    run.finish(6 * S)
}

#[test]
fn a_released_spike_names_its_path_and_is_not_retention() {
    let report = released_spike();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Spike, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, report.processes[0].id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "build_payload"));
    assert!(
        first
            .summary
            .starts_with("spike in tgid 400: RSS rose +200.0 MiB in 0.5 s to 212.0 MiB at 1.5 s"),
        "{}",
        first.summary
    );
    assert!(
        first.summary.ends_with("built by build_payload"),
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
    let id = run.root(1, 0, 12);
    let up: Vec<(u64, u64)> = (0..10).map(|i| (12 + 20 * i, 5_000 * i)).collect();
    run.readings(id, 0, &up);
    run.readings(id, 5 * S, &[(12, 50_000), (12, 50_000)]);
    run.grow(id, "batch", 2 * S, 180);
    run.free(id, "batch", 5 * S, 180);
    let findings = findings(&run.finish(6 * S));
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
}

#[test]
fn an_exit_after_holding_is_no_spike_or_release_and_quotes_the_table() {
    // Process 460 builds 200 MiB in its first second, holds it for 2 s and
    // exits: its interpreter's finalization and the kernel's teardown (the
    // readings after the exit began, one of them bogus) are not its memory.
    let mut run = Run::new();
    let id = run.root(460, 0, 12);
    run.readings(id, 0, &[(12, 0), (112, 25_000), (212, 50_000)]);
    run.flat(id, 3 * S / 2, 3 * S - S / 2, at(212, 50_000));
    run.grow(id, "hold_data", S / 2, 100);
    run.grow(id, "hold_data", S, 100);
    run.exit_begins(id, 3 * S, at(212, 50_000).peak(220));
    run.read(id, 3 * S + S / 10, at(14, 50_100));
    run.read(id, 3 * S + S / 5, at(400, 50_100));
    run.free(id, "hold_data", 3 * S + S / 10, 200);
    run.exited(id, 3 * S + S / 4, at(2, 50_200));
    let report = run.finish(5 * S);
    let p = report.process(id).unwrap();
    let rss = p.rss.unwrap();
    assert_eq!(
        (rss.start_bytes, rss.end_bytes, rss.peak_bytes),
        (12 * MIB, 212 * MIB, 220 * MIB)
    );
    let findings = findings(&report);
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
    for finding in &findings {
        let text = all_text(finding);
        assert!(!text.contains("released"), "{finding:#?}");
        assert!(!text.contains("400.0 MiB"), "{finding:#?}");
    }
    // What is said about it quotes the process table's numbers.
    let about: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.scope == scope(&report, id))
        .collect();
    assert!(!about.is_empty(), "{findings:#?}");
    for finding in about {
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("RSS 12.0 MiB -> 212.0 MiB (peak 220.0 MiB) over 3.0 s")),
            "{finding:#?}"
        );
    }
}

/// Process 450 runs 30 jobs, one every 0.25 s from 0.25 s: each touches a
/// 40 MiB buffer in `reuse_buffer` and frees it 0.125 s later, except four
/// that it keeps; then it idles until 10 s holding 160 MiB (grown 1.2 GiB).
pub(super) fn reused_buffer() -> Report {
    let mut run = Run::new();
    let id = run.root(450, 0, 12);
    let kept_jobs = [5_u64, 12, 19, 26];
    let kept_by = |t_ns: u64| kept_jobs.iter().filter(|&&job| job * S / 4 <= t_ns).count() as u64;
    for job in 1..=30_u64 {
        let t_ns = job * S / 4;
        run.grow(id, "reuse_buffer", t_ns, 40);
        if !kept_jobs.contains(&job) {
            run.free(id, "reuse_buffer", t_ns + S / 8, 40);
        }
    }
    for half in 1..=20_u64 {
        let t_ns = half * S / 2;
        let job = t_ns / (S / 4);
        let in_flight = if job <= 30 && !kept_jobs.contains(&job) {
            40
        } else {
            0
        };
        let activity = 20_000 * half.min(15);
        run.read(id, t_ns, at(12 + 40 * kept_by(t_ns) + in_flight, activity));
    }
    run.finish(10 * S)
}

#[test]
fn a_buffer_touched_again_is_held_not_an_unbounded_cache() {
    let report = reused_buffer();
    let path = &report.paths[0];
    assert_eq!(path.bytes.grown_bytes(), 1_200 * MIB);
    assert_eq!(path.bytes.held_now_bytes(), 160 * MIB);
    let findings = findings(&report);
    for finding in &findings {
        let text = all_text(finding);
        assert!(!text.contains("unbounded"), "{finding:#?}");
        assert!(!text.contains("bound that cache"), "{finding:#?}");
    }
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    let retention = retention[0];
    assert_eq!(retention.strength, Strength::Weak, "{retention:#?}");
    assert!(runs_through(&report, retention.paths[0], "reuse_buffer"));
    // Its finding quotes what the buffer holds; what it grew is only noted.
    assert!(
        retention.summary.ends_with("held by reuse_buffer"),
        "{}",
        retention.summary
    );
    assert!(
        retention.evidence.iter().any(|e| e.contains(
            "holds 160.0 MiB at the end, held 200.0 MiB at the high-water mark (100% of tgid \
             450's held then), 1.2 GiB grown (freed and touched again"
        )),
        "{:#?}",
        retention.evidence
    );
    assert!(
        retention
            .next_step
            .contains("reuse_buffer holds at the end is meant to stay"),
        "{}",
        retention.next_step
    );
    // Its held bytes rose in most buckets; only what it still holds of what
    // it grew tells it apart from a cache that keeps growing.
    let rise = paths::held_rise(&[path], report.path_bucket_ns, None).unwrap();
    assert!(
        rise.rising_buckets as f64 >= STEADY_PRESENT_FRACTION * rise.span_buckets as f64,
        "{rise:?}"
    );
    assert!(!rise.is_steady(), "{rise:?}");
}
