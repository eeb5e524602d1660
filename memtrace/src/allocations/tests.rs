//! Unit tests of the sampler weights and the live-set aggregation, with
//! synthetic records (no kernel).

use super::*;

const MIB: u64 = 1 << 20;
const MEAN: u64 = 512 * 1024;

/// Weighted sums are rounded once, at the report: allow one byte.
#[track_caller]
fn assert_close(actual: u64, expected: f64) {
    assert!(
        (actual as f64 - expected).abs() <= 1.0,
        "{actual} vs {expected}"
    );
}

/// The weight of a sampled block of `size` at [`MEAN`].
fn w(size: u64) -> f64 {
    sample_weight_bytes(size, MEAN)
}

fn stack(name: &str) -> Vec<String> {
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
    tracker.hooked(10, vec!["libc.so.6".into()], 2_000_000);
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
        tracker.alloc(10, s + i, 0x1000 + i, MIB, stack("keep"), false);
    }
    // churn(): 3 blocks freed 10 ms later, one freed after 2 s.
    for i in 0..3 {
        tracker.alloc(10, 2 * s, 0x9000 + i, MIB, stack("churn"), false);
        tracker.free(10, 2 * s + 10_000_000, 0x9000 + i);
    }
    tracker.alloc(10, 3 * s, 0xa000, 2 * MIB, stack("churn"), false);
    tracker.free(10, 5 * s, 0xa000);
    // A free of a block never sampled changes nothing.
    tracker.free(10, 6 * s, 0xdead);
    tracker.exit_began(10);
    tracker.alloc(10, 7 * s, 0xb000, MIB, stack("late"), false);
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
fn folded_stacks_carry_the_chosen_weight() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(7, 0, 0);
    tracker.alloc(7, 0, 0x1, 8 * MIB, stack("kept;odd"), false);
    tracker.alloc(7, 0, 0x2, 4 * MIB, stack("freed"), false);
    tracker.free(7, 0, 0x2);
    let report = tracker.report(KernelAllocStats::default());
    let folded = |weight| {
        let mut out = Vec::new();
        render_folded(&report, weight, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    let kept = format!(
        "tgid 7;<module> (app.py:1);kept,odd (app.py:9) {}",
        w(8 * MIB).round()
    );
    assert_eq!(folded(AllocWeight::Leaked), format!("{kept}\n"));
    let allocated = folded(AllocWeight::Allocated);
    assert!(allocated.contains(&kept), "{allocated}");
    assert!(
        allocated.contains(&format!("freed (app.py:9) {}", w(4 * MIB).round())),
        "{allocated}"
    );
    assert_eq!(folded(AllocWeight::Peak), allocated);
}

#[test]
fn a_new_peak_keeps_paths_unchanged_since_the_last_one() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.alloc(1, 0, 0x1, 8 * MIB, stack("a"), false);
    tracker.alloc(1, 0, 0x2, 8 * MIB, stack("b"), false);
    tracker.free(1, 0, 0x2);
    tracker.alloc(1, 0, 0x3, 16 * MIB, stack("c"), false);
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
fn a_fork_child_is_its_own_process_and_exit_returns_live_addresses() {
    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 100, 0);
    tracker.process_started(2, 200, 0);
    tracker.alloc(2, 0, 0x10, 4 * MIB, stack("child"), true);
    tracker.free(1, 0, 0x10); // the parent frees its own block at that address
    let mut addrs = tracker.process_ended(2);
    addrs.sort_unstable();
    assert_eq!(addrs, vec![0x10]);
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
    tracker.hooked(1, vec!["python3.11".into()], 0);
    tracker.rss_anon(1, 10 * MIB);
    tracker.rss_anon(1, 210 * MIB);
    tracker.alloc(1, 0, 0x1, 4 * MIB, stack("a"), false);
    let report = tracker.report(KernelAllocStats::default());
    assert!(report.processes[0].inlined_allocator_suspected);
    assert_eq!(report.processes[0].rss_anon_growth_bytes, 200 * MIB);

    let mut tracker = AllocationTracker::new(MEAN);
    tracker.process_started(1, 0, 0);
    tracker.hooked(1, vec!["python3.11".into()], 0);
    tracker.rss_anon(1, 10 * MIB);
    tracker.rss_anon(1, 110 * MIB);
    tracker.alloc(1, 0, 0x1, 90 * MIB, stack("a"), false);
    tracker.free(1, 0, 0x1); // freed, but it was live at the peak
    let report = tracker.report(KernelAllocStats::default());
    assert!(!report.processes[0].inlined_allocator_suspected);
}
