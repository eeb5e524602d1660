//! Synthetic tests of the held-page tracker: exact arithmetic where it is
//! exact, stated tolerances where coarsening makes it statistical.

use std::collections::BTreeMap;
use std::ops::Range;

use memtrace_common::PAGE_SIZE_BYTES;

use super::map::MAX_LEVEL;
use super::{HeldChange, HeldTracker, PeakHeld};

const PAGE: u64 = PAGE_SIZE_BYTES;

/// Pages `first .. first + count`, as a byte range.
fn pages(first: u64, count: u64) -> Range<u64> {
    first * PAGE..(first + count) * PAGE
}

fn change(process: u32, path: char, delta_bytes: i64) -> HeldChange<u32, char> {
    HeldChange {
        process,
        path,
        delta_bytes,
    }
}

fn peak(process: u32, path: char, held_at_peak_bytes: u64) -> PeakHeld<u32, char> {
    PeakHeld {
        process,
        path,
        held_at_peak_bytes,
    }
}

/// A tracker plus what its changes add up to, per (process, path).
struct Harness {
    tracker: HeldTracker<u32, char>,
    /// Sum of all changes pushed.
    held: BTreeMap<(u32, char), i64>,
    /// Unplaced bytes sent, per (process, path).
    unplaced: BTreeMap<(u32, char), i64>,
}

impl Harness {
    fn new(max_entries: usize) -> Self {
        Self {
            tracker: HeldTracker::new(max_entries),
            held: BTreeMap::new(),
            unplaced: BTreeMap::new(),
        }
    }

    fn record(&mut self, changes: Vec<HeldChange<u32, char>>) -> Vec<HeldChange<u32, char>> {
        for change in &changes {
            assert_ne!(change.delta_bytes, 0, "{change:?}");
            *self.held.entry((change.process, change.path)).or_default() += change.delta_bytes;
        }
        changes
    }

    fn touch(
        &mut self,
        process: u32,
        range: Range<u64>,
        path: char,
        weight_bytes: u64,
        rss_bytes: u64,
    ) -> Vec<HeldChange<u32, char>> {
        let mut changes = Vec::new();
        self.tracker
            .touch(process, range, path, weight_bytes, rss_bytes, &mut changes);
        self.record(changes)
    }

    fn touch_unplaced(
        &mut self,
        process: u32,
        path: char,
        weight_bytes: u64,
        rss_bytes: u64,
    ) -> Vec<HeldChange<u32, char>> {
        let mut changes = Vec::new();
        self.tracker
            .touch_unplaced(process, path, weight_bytes, rss_bytes, &mut changes);
        if self.tracker.processes.contains_key(&process) {
            *self.unplaced.entry((process, path)).or_default() += weight_bytes as i64;
        }
        self.record(changes)
    }

    fn release(
        &mut self,
        process: u32,
        range: Range<u64>,
        rss_bytes: u64,
    ) -> Vec<HeldChange<u32, char>> {
        let mut changes = Vec::new();
        self.tracker
            .release(process, range, rss_bytes, &mut changes);
        self.record(changes)
    }

    fn remap(
        &mut self,
        process: u32,
        old: Range<u64>,
        new_start: u64,
        new_len: u64,
    ) -> Vec<HeldChange<u32, char>> {
        let mut changes = Vec::new();
        let old_len = old.end - old.start;
        self.tracker.remap(
            process,
            old.start,
            old_len,
            new_start,
            new_len,
            0,
            &mut changes,
        );
        self.record(changes)
    }

    fn take_peaks(&mut self) -> Vec<PeakHeld<u32, char>> {
        let mut peaks = Vec::new();
        self.tracker.take_peak_updates(&mut peaks);
        peaks
    }

    fn end(&mut self, process: u32) -> Vec<PeakHeld<u32, char>> {
        let mut peaks = Vec::new();
        self.tracker.end(process, &mut peaks);
        peaks
    }

    fn spans(&self, process: u32) -> Vec<(Range<u64>, char, u64)> {
        self.tracker
            .processes
            .get(&process)
            .map(|state| state.map.spans())
            .unwrap_or_default()
    }

    fn held(&self, process: u32, path: char) -> i64 {
        self.held.get(&(process, path)).copied().unwrap_or(0)
    }

    /// The changes pushed add up to the map's weights plus unplaced bytes,
    /// per open process and path; entries are disjoint, page-aligned and
    /// weigh something; the entry count is the sum of the maps.
    fn assert_consistent(&self) {
        let mut from_maps: BTreeMap<(u32, char), i64> = self.unplaced.clone();
        let mut entries = 0;
        for process in self.tracker.processes() {
            let spans = self.spans(process);
            entries += spans.len();
            for pair in spans.windows(2) {
                assert!(pair[0].0.end <= pair[1].0.start, "{pair:?}");
            }
            for (range, path, weight) in spans {
                assert!(range.start < range.end && weight > 0);
                assert_eq!((range.start % PAGE, range.end % PAGE), (0, 0));
                *from_maps.entry((process, path)).or_default() += weight as i64;
            }
        }
        let open = |&(process, _): &(u32, char)| self.tracker.processes.contains_key(&process);
        let mut held = self.held.clone();
        held.retain(|key, bytes| open(key) && *bytes != 0);
        from_maps.retain(|key, bytes| open(key) && *bytes != 0);
        assert_eq!(held, from_maps);
        assert_eq!(self.tracker.stats().live_entries, entries);
    }
}

/// Deterministic pseudo-random numbers (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn touch_rounds_out_to_whole_pages() {
    let mut h = Harness::new(100);
    assert_eq!(
        h.touch(1, PAGE + 1..PAGE + 4, 'a', 524_288, 10),
        [change(1, 'a', 524_288)]
    );
    // An empty range stands for the page holding its start.
    h.touch(1, 3 * PAGE + 5..3 * PAGE + 5, 'b', 4096, 10);
    assert_eq!(
        h.spans(1),
        [(pages(1, 1), 'a', 524_288), (pages(3, 1), 'b', 4096)]
    );
    h.assert_consistent();
}

#[test]
fn touch_over_held_pages_replaces_them_and_counts_the_overlap() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 3), 'a', 300, 10);
    assert_eq!(
        h.touch(1, pages(1, 1), 'b', 50, 10),
        [change(1, 'a', -100), change(1, 'b', 50)]
    );
    assert_eq!(
        h.spans(1),
        [
            (pages(0, 1), 'a', 100),
            (pages(1, 1), 'b', 50),
            (pages(2, 1), 'a', 100)
        ]
    );
    // The same sample again nets to nothing.
    assert_eq!(h.touch(1, pages(1, 1), 'b', 50, 10), []);
    assert_eq!(h.tracker.stats().overlapping_touches, 2);
    h.assert_consistent();
}

#[test]
fn release_in_the_middle_splits_with_floor_weights() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 3), 'a', 10, 10);
    assert_eq!(h.release(1, pages(1, 1), 5), [change(1, 'a', -3)]);
    assert_eq!(h.spans(1), [(pages(0, 1), 'a', 3), (pages(2, 1), 'a', 4)]);
    assert_eq!(h.tracker.stats().overlapping_touches, 0);
    h.assert_consistent();
}

#[test]
fn release_at_the_edges_shrinks() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 4), 'a', 1001, 10);
    assert_eq!(h.release(1, pages(0, 1), 5), [change(1, 'a', -250)]);
    assert_eq!(h.spans(1), [(pages(1, 3), 'a', 751)]);
    // The last third of 751: floor(751 * 2 / 3) = 500 stay.
    assert_eq!(h.release(1, pages(3, 1), 5), [change(1, 'a', -251)]);
    assert_eq!(h.spans(1), [(pages(1, 2), 'a', 500)]);
    h.assert_consistent();
}

#[test]
fn sub_page_release_rounds_out_to_the_page() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 2), 'a', 8192, 10);
    assert_eq!(h.release(1, PAGE + 1..PAGE + 2, 5), [change(1, 'a', -4096)]);
    assert_eq!(h.spans(1), [(pages(0, 1), 'a', 4096)]);
    assert_eq!(h.release(1, PAGE + 1..PAGE + 1, 5), []);
    h.assert_consistent();
}

#[test]
fn release_spanning_entries_of_several_paths_nets_per_path() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 2), 'a', 200, 10);
    h.touch(1, pages(2, 1), 'b', 70, 10);
    h.touch(1, pages(3, 1), 'a', 90, 10);
    h.touch(1, pages(5, 1), 'c', 10, 10);
    assert_eq!(
        h.release(1, pages(1, 3), 5),
        [change(1, 'a', -190), change(1, 'b', -70)]
    );
    assert_eq!(
        h.spans(1),
        [(pages(0, 1), 'a', 100), (pages(5, 1), 'c', 10)]
    );
    h.assert_consistent();
}

#[test]
fn many_cuts_never_create_or_lose_bytes() {
    const WEIGHT: u64 = 1_000_000_007;
    let mut h = Harness::new(100_000);
    h.touch(1, pages(0, 1000), 'a', WEIGHT, 10);
    let mut rng = Lcg(7);
    let mut released = 0;
    for _ in 0..400 {
        let start = rng.below(1000 * PAGE);
        let len = rng.below(3 * PAGE) + 1;
        for change in h.release(1, start..start + len, 5) {
            assert!(change.delta_bytes < 0);
            released += change.delta_bytes.unsigned_abs();
        }
        let kept: u64 = h.spans(1).iter().map(|span| span.2).sum();
        assert_eq!(kept + released, WEIGHT);
    }
    assert!(h.spans(1).len() > 50, "the cuts split the entry");
    h.assert_consistent();
}

#[test]
fn remap_moves_entries_with_path_and_weight() {
    let mut h = Harness::new(100);
    h.touch(1, pages(10, 2), 'a', 200, 10);
    h.touch(1, pages(12, 1), 'b', 50, 10);
    assert_eq!(h.remap(1, pages(10, 3), 100 * PAGE, 3 * PAGE), []);
    assert_eq!(
        h.spans(1),
        [(pages(100, 2), 'a', 200), (pages(102, 1), 'b', 50)]
    );
    h.assert_consistent();
}

#[test]
fn remap_shrink_in_place_releases_the_tail() {
    let mut h = Harness::new(100);
    h.touch(1, pages(10, 4), 'a', 400, 10);
    assert_eq!(
        h.remap(1, pages(10, 4), 10 * PAGE, 2 * PAGE),
        [change(1, 'a', -200)]
    );
    assert_eq!(h.spans(1), [(pages(10, 2), 'a', 200)]);
    h.assert_consistent();
}

#[test]
fn remap_shrink_and_move_releases_the_tail_and_moves_the_rest() {
    let mut h = Harness::new(100);
    h.touch(1, pages(10, 4), 'a', 400, 10);
    assert_eq!(
        h.remap(1, pages(10, 4), 50 * PAGE, 2 * PAGE),
        [change(1, 'a', -200)]
    );
    assert_eq!(h.spans(1), [(pages(50, 2), 'a', 200)]);
    h.assert_consistent();
}

#[test]
fn remap_grow_moves_everything_and_clears_the_destination() {
    let mut h = Harness::new(100);
    h.touch(1, pages(10, 2), 'a', 200, 10);
    h.touch(1, pages(53, 1), 'b', 30, 10);
    h.touch(1, pages(54, 1), 'c', 40, 10);
    // [50, 54) is the new mapping: 'b' there was unmapped, 'c' is outside.
    assert_eq!(
        h.remap(1, pages(10, 2), 50 * PAGE, 4 * PAGE),
        [change(1, 'b', -30)]
    );
    assert_eq!(
        h.spans(1),
        [(pages(50, 2), 'a', 200), (pages(54, 1), 'c', 40)]
    );
    h.assert_consistent();
}

#[test]
fn remap_at_the_same_address_only_shrinks() {
    let mut h = Harness::new(100);
    h.touch(1, pages(10, 2), 'a', 200, 10);
    assert_eq!(h.remap(1, pages(10, 2), 10 * PAGE, 8 * PAGE), []);
    assert_eq!(h.remap(1, pages(10, 2), 10 * PAGE, 2 * PAGE), []);
    assert_eq!(h.spans(1), [(pages(10, 2), 'a', 200)]);
    h.assert_consistent();
}

#[test]
fn remap_splits_an_entry_straddling_the_source() {
    let mut h = Harness::new(100);
    h.touch(1, pages(8, 4), 'a', 401, 10);
    assert_eq!(h.remap(1, pages(10, 2), 40 * PAGE, 2 * PAGE), []);
    assert_eq!(
        h.spans(1),
        [(pages(8, 2), 'a', 200), (pages(40, 2), 'a', 201)]
    );
    h.assert_consistent();
}

#[test]
fn sequential_touches_of_one_path_merge() {
    let mut h = Harness::new(100);
    for page in 0..5 {
        h.touch(1, pages(page, 1), 'a', 4096, 10);
    }
    assert_eq!(h.spans(1), [(pages(0, 5), 'a', 5 * 4096)]);
    h.release(1, pages(2, 1), 10);
    assert_eq!(h.spans(1).len(), 2);
    // Filling the hole joins both sides.
    h.touch(1, pages(2, 1), 'a', 4096, 10);
    assert_eq!(h.spans(1), [(pages(0, 5), 'a', 5 * 4096)]);
    h.assert_consistent();
}

#[test]
fn no_merge_across_paths_or_densities() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 1), 'a', 4096, 10);
    h.touch(1, pages(1, 1), 'b', 4096, 10);
    h.touch(1, pages(2, 1), 'a', 8192, 10);
    h.touch(1, pages(3, 1), 'a', 8192, 10);
    h.touch(1, pages(4, 1), 'a', 4096, 10);
    // Same density over different lengths merges: 2 pages at 16384.
    h.touch(1, pages(5, 2), 'a', 8192, 10);
    assert_eq!(
        h.spans(1),
        [
            (pages(0, 1), 'a', 4096),
            (pages(1, 1), 'b', 4096),
            (pages(2, 2), 'a', 16_384),
            (pages(4, 3), 'a', 12_288),
        ]
    );
    h.assert_consistent();
}

/// Touches every other page (no merges) `count` times from `first_page`,
/// round-robin over `paths`; returns the changes.
fn touch_spread(
    h: &mut Harness,
    process: u32,
    first_page: u64,
    count: u64,
    paths: &[char],
) -> Vec<HeldChange<u32, char>> {
    let mut all = Vec::new();
    for i in 0..count {
        let path = paths[(i % paths.len() as u64) as usize];
        all.extend(h.touch(process, pages(first_page + 2 * i, 1), path, 4096, 10));
    }
    all
}

#[test]
fn coarsening_halves_entries_and_keeps_per_path_totals() {
    const TOUCHES: u64 = 20_000;
    const PATHS: [char; 4] = ['a', 'b', 'c', 'd'];
    let mut h = Harness::new(15_000);
    touch_spread(&mut h, 1, 0, TOUCHES, &PATHS);
    let stats = h.tracker.stats();
    assert_eq!(stats.coarsening_level(1), 1);
    // 15,000 entries halved, then 5,000 touches kept 1 in 2: 10,000
    // expected, Binomial(20,000, 1/2); within 4 standard deviations.
    let entries = stats.live_entries as f64;
    let entries_sd = (TOUCHES as f64).sqrt() / 2.0;
    assert!((entries - 10_000.0).abs() <= 4.0 * entries_sd, "{entries}");
    // Each touch ends up 0 or 8192 with probability 1/2: the per-path
    // estimate is unbiased with standard deviation 4096 * sqrt(5,000).
    let per_path = TOUCHES / PATHS.len() as u64;
    let truth = (per_path * 4096) as f64;
    let sd = 4096.0 * (per_path as f64).sqrt();
    for path in PATHS {
        let estimate = h.held(1, path) as f64;
        assert!((estimate - truth).abs() <= 4.0 * sd, "{path}: {estimate}");
    }
    h.assert_consistent();
}

#[test]
fn coarsening_pushes_one_net_change_per_path() {
    let mut h = Harness::new(40);
    touch_spread(&mut h, 1, 0, 40, &['a', 'b']);
    let changes = h.touch(1, pages(1000, 1), 'c', 4096, 10);
    assert_eq!(h.tracker.stats().coarsening_level(1), 1);
    // The touch's own change, then at most one per path from coarsening.
    assert_eq!(changes.first(), Some(&change(1, 'c', 4096)));
    let coarsening: Vec<char> = changes[1..].iter().map(|change| change.path).collect();
    let mut unique = coarsening.clone();
    unique.dedup();
    assert_eq!(coarsening, unique);
    assert!(!coarsening.is_empty(), "{changes:?}");
    h.assert_consistent();
}

#[test]
fn coarsening_is_deterministic() {
    let run = || {
        let mut h = Harness::new(500);
        let changes = touch_spread(&mut h, 1, 0, 3000, &['a', 'b', 'c']);
        (changes, h.spans(1), h.tracker.stats())
    };
    let first = run();
    assert!(first.2.coarsening_level(1) >= 2);
    assert_eq!(first, run());
}

#[test]
fn coarsened_process_thins_later_touches() {
    let mut h = Harness::new(3000);
    touch_spread(&mut h, 1, 0, 3001, &['a']);
    assert_eq!(h.tracker.stats().coarsening_level(1), 1);
    touch_spread(&mut h, 1, 100_000, 2000, &['z']);
    assert_eq!(h.tracker.stats().coarsening_level(1), 1);
    let kept: Vec<_> = h
        .spans(1)
        .into_iter()
        .filter(|span| span.1 == 'z')
        .collect();
    // Kept 1 in 2 (Binomial(2000, 1/2), within 4 standard deviations),
    // each weighing twice its sample.
    let sd = (2000f64).sqrt() / 2.0;
    assert!(
        (kept.len() as f64 - 1000.0).abs() <= 4.0 * sd,
        "{}",
        kept.len()
    );
    assert!(kept.iter().all(|span| span.2 == 8192));
    assert_eq!(h.held(1, 'z'), kept.len() as i64 * 8192);
    h.assert_consistent();
}

#[test]
fn budget_coarsens_the_process_with_most_entries() {
    let mut h = Harness::new(40);
    touch_spread(&mut h, 1, 0, 10, &['a']);
    touch_spread(&mut h, 2, 0, 30, &['b']);
    let changes = h.touch(1, pages(1000, 1), 'a', 4096, 10);
    let stats = h.tracker.stats();
    assert_eq!(
        (stats.coarsening_level(1), stats.coarsening_level(2)),
        (0, 1)
    );
    assert_eq!(changes[0], change(1, 'a', 4096));
    assert!(changes[1..].iter().all(|change| change.process == 2));
    h.assert_consistent();
}

#[test]
fn coarsening_stops_when_empty_or_at_the_highest_level() {
    let mut h = Harness::new(0);
    for page in 0..8 {
        h.touch(1, pages(page, 1), 'a', 4096, 10);
    }
    let stats = h.tracker.stats();
    assert!(stats.live_entries == 0 || stats.coarsening_level(1) == MAX_LEVEL);
    h.assert_consistent();
}

#[test]
fn peak_keeps_each_paths_bytes_at_the_highest_rss() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 25), 'a', 100, 100);
    h.release(1, pages(0, 25), 0);
    h.touch(1, pages(100, 15), 'b', 60, 60);
    // At the peak: a = 100, b = 0 (0 is what a path never reported has).
    assert_eq!(h.take_peaks(), [peak(1, 'a', 100)]);
    h.touch(1, pages(200, 22), 'b', 90, 150);
    assert_eq!(h.take_peaks(), [peak(1, 'a', 0), peak(1, 'b', 150)]);
    // A tie does not move the peak.
    h.release(1, pages(100, 200), 0);
    h.touch(1, pages(500, 1), 'c', 150, 150);
    assert_eq!(h.take_peaks(), []);
    // A new high does.
    h.touch(1, pages(600, 1), 'a', 5, 151);
    assert_eq!(
        h.take_peaks(),
        [peak(1, 'a', 5), peak(1, 'b', 0), peak(1, 'c', 150)]
    );
}

#[test]
fn the_first_event_sets_the_peak() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 1), 'a', 100, 0);
    h.release(1, pages(0, 1), 0);
    assert_eq!(h.take_peaks(), [peak(1, 'a', 100)]);
}

#[test]
fn take_peak_updates_reports_only_changed_values() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 1), 'a', 100, 100);
    h.touch(1, pages(1, 1), 'b', 50, 150);
    h.touch(2, pages(0, 1), 'd', 5, 5);
    assert_eq!(
        h.take_peaks(),
        [peak(1, 'a', 100), peak(1, 'b', 50), peak(2, 'd', 5)]
    );
    assert_eq!(h.take_peaks(), []);
    h.touch(1, pages(2, 1), 'c', 30, 180);
    h.release(2, pages(0, 1), 0);
    assert_eq!(h.take_peaks(), [peak(1, 'c', 30)]);
    assert_eq!(h.take_peaks(), []);
}

#[test]
fn end_freezes_the_image_and_reports_its_final_peaks() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 1), 'a', 100, 100);
    h.touch(2, pages(0, 1), 'x', 7, 7);
    assert_eq!(h.take_peaks().len(), 2);
    h.touch(1, pages(1, 1), 'b', 200, 300);
    assert_eq!(h.end(1), [peak(1, 'b', 200)]);
    assert_eq!(h.tracker.processes(), [2]);
    // Later calls for the ended image are ignored.
    assert_eq!(h.touch(1, pages(5, 1), 'a', 100, 900), []);
    assert_eq!(h.touch_unplaced(1, 'a', 100, 900), []);
    assert_eq!(h.release(1, pages(0, 10), 0), []);
    assert_eq!(h.remap(1, pages(0, 2), 50 * PAGE, 2 * PAGE), []);
    assert_eq!(h.end(1), []);
    assert_eq!(h.take_peaks(), []);
    let stats = h.tracker.stats();
    assert_eq!(stats.live_entries, 1);
    assert!(!stats.processes.contains_key(&1));
    // Its held values stand.
    assert_eq!((h.held(1, 'a'), h.held(1, 'b')), (100, 200));
    h.assert_consistent();
}

#[test]
fn an_image_ended_before_any_event_ignores_later_ones() {
    let mut h = Harness::new(100);
    assert_eq!(h.end(3), []);
    assert_eq!(h.touch(3, pages(0, 1), 'a', 100, 100), []);
    assert!(h.tracker.processes().is_empty());
}

#[test]
fn unplaced_growth_is_never_released() {
    let mut h = Harness::new(100);
    assert_eq!(h.touch_unplaced(1, 'a', 1000, 10), [change(1, 'a', 1000)]);
    h.touch(1, pages(0, 1), 'a', 4096, 10);
    assert_eq!(h.release(1, 0..u64::MAX, 0), [change(1, 'a', -4096)]);
    assert_eq!(h.held(1, 'a'), 1000);
    assert_eq!(h.tracker.stats().unplaced_bytes(1), 1000);
    h.assert_consistent();
}

#[test]
fn stats_count_entries_and_memory() {
    let mut h = Harness::new(100);
    h.touch(1, pages(0, 1), 'a', 100, 10);
    h.touch(1, pages(2, 1), 'b', 100, 10);
    h.touch(2, pages(0, 1), 'a', 100, 10);
    let before = h.tracker.stats();
    assert_eq!(before.live_entries, 3);
    assert_eq!(before.processes[&1].entries, 2);
    h.end(1);
    let after = h.tracker.stats();
    assert_eq!(after.live_entries, 1);
    assert!(after.memory_bytes > 0 && after.memory_bytes < before.memory_bytes);
}
