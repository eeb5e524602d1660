//! Unit tests of the sampler weights and the live-set aggregation, with
//! synthetic records (no kernel); its helpers also serve
//! `report::allocations`'s tests.

use super::*;

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const MEAN: u64 = 512 * 1024;

/// Weighted sums are rounded once, at the report: allow one byte.
#[track_caller]
fn assert_close(actual: u64, expected: f64) {
    assert!(
        (actual as f64 - expected).abs() <= 1.0,
        "{actual} vs {expected}"
    );
}

/// The weight of a sampled block of `size` at [`MEAN`].
pub(crate) fn w(size: u64) -> f64 {
    sample_weight_bytes(size, MEAN)
}

/// A sampled glibc block (not through CPython's allocator API).
pub(crate) fn block(ts_ns: u64, addr: u64, size_bytes: u64, untracked: bool) -> SampledBlock {
    SampledBlock {
        ts_ns,
        addr,
        size_bytes,
        untracked,
        ..SampledBlock::default()
    }
}

pub(crate) fn stack(name: &str) -> Vec<String> {
    vec![
        "<module> (app.py:1)".to_owned(),
        format!("{name} (app.py:9)"),
    ]
}

#[test]
fn weights_tend_to_the_mean_and_to_the_size() {
    let tiny = sample_weight_bytes(16, MEAN);
    assert!((tiny / MEAN as f64 - 1.0).abs() < 0.001, "{tiny}");
    let huge = sample_weight_bytes(64 * MIB, MEAN);
    assert!((huge / (64 * MIB) as f64 - 1.0).abs() < 1e-9, "{huge}");
    // At size == mean: s / (1 - 1/e).
    let equal = sample_weight_bytes(MEAN, MEAN);
    let expected = MEAN as f64 / (1.0 - (-1.0f64).exp());
    assert!((equal - expected).abs() < 1e-6);
    assert_eq!(sample_weight_bytes(0, MEAN), 0.0);
}

/// Sampling with the real rule (a Poisson process over bytes) and summing
/// weights estimates the true total: a deterministic pseudo-random stream.
#[test]
fn poisson_sampling_with_these_weights_is_unbiased() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mean = 64 * 1024;
    let mut countdown = -(mean as f64) * (1.0 - uniform()).ln();
    let (mut truth, mut estimate) = (0u64, 0.0);
    for i in 0..400_000u64 {
        let size = [32, 200, 4096, 100_000][(i % 4) as usize];
        truth += size;
        countdown -= size as f64;
        if countdown <= 0.0 {
            countdown = -(mean as f64) * (1.0 - uniform()).ln();
            estimate += sample_weight_bytes(size, mean);
        }
    }
    let error = estimate / truth as f64 - 1.0;
    assert!(error.abs() < 0.03, "relative error {error}");
}

#[test]
fn leaked_freed_temporary_and_peak_per_path() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(10, 5, 0);
    tracker.hooked(10, vec!["libc.so.6".into()], 2_000_000, true);
    assert!(matches!(
        tracker.report(KernelAllocStats::default()).processes[0].hook,
        HookStatus::Hooked {
            gap_ns: 2_000_000,
            ..
        }
    ));
    let s = 1_000_000_000;
    // keep(): 4 blocks of 1 MiB kept to the end.
    for i in 0..4 {
        tracker.alloc(10, block(s + i, 0x1000 + i, MIB, false), stack("keep"));
    }
    // churn(): 3 blocks freed 10 ms later, one freed after 2 s.
    for i in 0..3 {
        tracker.alloc(10, block(2 * s, 0x9000 + i, MIB, false), stack("churn"));
        tracker.free(10, 2 * s + 10_000_000, 0x9000 + i);
    }
    tracker.alloc(10, block(3 * s, 0xa000, 2 * MIB, false), stack("churn"));
    tracker.free(10, 5 * s, 0xa000);
    // A free of a block never sampled changes nothing.
    tracker.free(10, 6 * s, 0xdead);
    tracker.exit_began(10);
    tracker.alloc(10, block(7 * s, 0xb000, MIB, false), stack("late"));
    let report = tracker.report(KernelAllocStats::default());
    let process = &report.processes[0];
    assert_close(process.leaked_bytes, 4.0 * w(MIB));
    // Peak: 4 kept + the 2 MiB churn block.
    assert_close(process.peak_bytes, 4.0 * w(MIB) + w(2 * MIB));
    let keep = &process.paths[0];
    assert_eq!(keep.stack, stack("keep"));
    assert_close(keep.leaked_bytes, 4.0 * w(MIB));
    assert_close(keep.peak_bytes, 4.0 * w(MIB));
    assert_eq!(keep.freed_bytes, 0);
    let churn = &process.paths[1];
    assert_eq!(churn.stack, stack("churn"));
    assert_eq!(churn.leaked_bytes, 0);
    assert_close(churn.allocated_bytes, 3.0 * w(MIB) + w(2 * MIB));
    assert_eq!(churn.freed_bytes, churn.allocated_bytes);
    assert_close(churn.temporary_bytes, 3.0 * w(MIB));
    assert_close(churn.peak_bytes, w(2 * MIB));
    assert_eq!(process.paths.len(), 2, "events after the exit began count");
}

#[test]
fn a_new_peak_keeps_paths_unchanged_since_the_last_one() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.alloc(1, block(0, 0x1, 8 * MIB, false), stack("a"));
    tracker.alloc(1, block(0, 0x2, 8 * MIB, false), stack("b"));
    tracker.free(1, 0, 0x2);
    tracker.alloc(1, block(0, 0x3, 16 * MIB, false), stack("c"));
    let report = tracker.report(KernelAllocStats::default());
    let peak_of = |name: &str| {
        report.processes[0]
            .paths
            .iter()
            .find(|p| p.stack == stack(name))
            .map(|p| p.peak_bytes)
            .unwrap()
    };
    assert_close(peak_of("a"), w(8 * MIB));
    assert_eq!(peak_of("b"), 0);
    assert_close(peak_of("c"), w(16 * MIB));
    assert_close(report.processes[0].peak_bytes, w(8 * MIB) + w(16 * MIB));
}

#[test]
fn a_fork_child_is_its_own_process_and_keeps_its_blocks_at_exit() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 100, 0);
    tracker.process_started(2, 200, 0);
    tracker.alloc(2, block(0, 0x10, 4 * MIB, true), stack("child"));
    tracker.free(1, 0, 0x10); // the parent frees its own block at that address
    tracker.process_ended(2);
    let report = tracker.report(KernelAllocStats::default());
    let child = &report.processes[0];
    assert_eq!((child.tgid, child.start_time_ns), (2, 200));
    assert_close(child.leaked_bytes, w(4 * MIB));
    assert_eq!(child.untracked_allocations, 1);
    assert_eq!(report.processes[1].tgid, 1);
    assert!(report.processes[1].paths.is_empty());
}

#[test]
fn few_bytes_seen_for_a_large_growth_suspects_an_inlined_allocator() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.hooked(1, vec!["python3.11".into()], 0, true);
    tracker.rss_anon(1, 10 * MIB);
    tracker.rss_anon(1, 210 * MIB);
    tracker.alloc(1, block(0, 0x1, 4 * MIB, false), stack("a"));
    let report = tracker.report(KernelAllocStats::default());
    assert!(report.processes[0].inlined_allocator_suspected);
    assert_eq!(report.processes[0].rss_anon_growth_bytes, 200 * MIB);

    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.hooked(1, vec!["python3.11".into()], 0, true);
    tracker.rss_anon(1, 10 * MIB);
    tracker.rss_anon(1, 110 * MIB);
    tracker.alloc(1, block(0, 0x1, 90 * MIB, false), stack("a"));
    tracker.free(1, 0, 0x1); // freed, but it was live at the peak
    let report = tracker.report(KernelAllocStats::default());
    assert!(!report.processes[0].inlined_allocator_suspected);
}

/// A hooked pymalloc process whose anonymous RSS went from 10 MiB to
/// `rss_end_mib` MiB, with `blocks` of `size` bytes allocated through
/// CPython's API (`python_api`) by `threads` threads, all but every
/// `keep_every`th freed.
fn fragmented_process(
    python_api: bool,
    size: u64,
    threads: u32,
    keep_every: u64,
) -> ProcessAllocations {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.hooked(1, vec!["libpython3.11.so.1.0".into()], 0, true);
    tracker.rss_anon(1, 10 * MIB);
    let blocks = 200 * MIB / MEAN;
    for i in 0..blocks {
        let mut sampled = block(0, 0x1000 + i, size, false);
        sampled.python_api = python_api;
        sampled.tid = 100 + (i as u32 % threads);
        tracker.alloc(1, sampled, stack("build"));
    }
    for i in (0..blocks).filter(|i| i % keep_every != 0) {
        tracker.free(1, 0, 0x1000 + i);
    }
    tracker.rss_anon(1, 210 * MIB);
    tracker
        .report(KernelAllocStats::default())
        .processes
        .remove(0)
}

#[test]
fn freed_small_objects_under_a_high_rss_are_pymalloc_fragmentation() {
    let process = fragmented_process(true, 64, 1, 50);
    let note = process.fragmentation.expect("a fragmentation note");
    assert_eq!(note.kind, FragmentationKind::PymallocArenas);
    assert_eq!(note.rss_anon_end_bytes, 210 * MIB);
    assert_eq!(note.rss_anon_retained_bytes, 200 * MIB);
    assert_eq!(note.live_bytes, process.leaked_bytes);
    assert_eq!(note.held_free_bytes, 200 * MIB - process.leaked_bytes);
    assert!(note.freed_pymalloc_bytes > 150 * MIB, "{note:?}");
    assert_eq!(note.freed_glibc_bytes, 0);
}

#[test]
fn freed_glibc_blocks_of_several_threads_are_thread_arenas() {
    let process = fragmented_process(false, 4096, 4, 50);
    let note = process.fragmentation.expect("a fragmentation note");
    assert_eq!(
        note.kind,
        FragmentationKind::GlibcThreadArenas { threads: 4 }
    );
    assert!(note.remedy().contains("MALLOC_ARENA_MAX=2"));
    assert!(note.remedy().contains("malloc_trim(0)"));
    // Large blocks through CPython's API are glibc's too; one thread.
    let process = fragmented_process(true, 4096, 1, 50);
    let note = process.fragmentation.expect("a fragmentation note");
    assert_eq!(note.kind, FragmentationKind::GlibcHeap);
}

#[test]
fn kept_objects_are_no_fragmentation() {
    // Every other block kept: half of the RSS is live objects.
    assert_eq!(fragmented_process(true, 64, 1, 2).fragmentation, None);
    // Everything kept: a leak, not the allocator.
    assert_eq!(fragmented_process(true, 64, 1, 1).fragmentation, None);
}
