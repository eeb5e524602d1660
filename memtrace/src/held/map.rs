//! One process's interval map: page-aligned address ranges → (path, weight)
//! of the sampled pages it still holds.
//!
//! Entries never overlap and never weigh 0 bytes. Cutting an entry gives each
//! part the weight of its bytes by cumulative flooring (the first `x` of `len`
//! bytes weigh `floor(w * x / len)`), so the parts always sum to the entry's
//! weight: no byte is created or lost by a split. Every change of a path's
//! weight is pushed as a [`WeightDelta`]; the caller nets them per path.

use std::collections::BTreeMap;
use std::ops::Range;

use memtrace_common::PAGE_SIZE_BYTES;

use super::{btree_estimate_bytes, signed};

/// A change of one path's held weight, bytes (signed), before netting.
pub(super) type WeightDelta<S> = (S, i64);

/// Highest coarsening level: 1 in 2^32 sampled pages kept, each weighing
/// 2^32 times its sample.
pub(super) const MAX_LEVEL: u32 = 32;

/// Highest page boundary of the 64-bit address space: range ends that would
/// round past it stop there (the last page is never user memory).
const LAST_PAGE_BOUNDARY: u64 = u64::MAX - (PAGE_SIZE_BYTES - 1);

/// The pages covering `range` (start rounded down, end rounded up to whole
/// pages); empty when `range` is.
pub(super) fn covering_pages(range: Range<u64>) -> Range<u64> {
    let start = range.start - range.start % PAGE_SIZE_BYTES;
    if range.is_empty() {
        return start..start;
    }
    let end = range
        .end
        .checked_next_multiple_of(PAGE_SIZE_BYTES)
        .unwrap_or(LAST_PAGE_BOUNDARY);
    start..end
}

/// One held range (its start is the map key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry<S> {
    /// End address (exclusive, page-aligned).
    end: u64,
    /// The path whose sample made the pages resident.
    path: S,
    /// Estimated bytes the range stands for (> 0).
    weight_bytes: u64,
}

/// One process's held pages by start address, and its coarsening level.
#[derive(Debug)]
pub(super) struct HeldMap<S> {
    entries: BTreeMap<u64, Entry<S>>,
    /// New touches are kept with probability 2^-level, weighing 2^level
    /// times their sample.
    level: u32,
}

impl<S: Copy + Ord> HeldMap<S> {
    /// An empty map at level 0 (every sample kept).
    pub(super) fn new() -> Self {
        Self {
            entries: BTreeMap::new(),
            level: 0,
        }
    }

    /// Live entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Coarsening level (1 in 2^level sampled pages kept).
    pub(super) fn level(&self) -> u32 {
        self.level
    }

    /// Estimated heap bytes of the entries.
    pub(super) fn memory_bytes(&self) -> usize {
        btree_estimate_bytes::<u64, Entry<S>>(self.entries.len())
    }

    /// A sampled first touch of `pages` (page-aligned) by `path`, weighing
    /// `weight_bytes`: entries already there are released first, then the
    /// touch is thinned at the map's level and inserted (merged with equal
    /// neighbours). Returns whether held pages were replaced.
    pub(super) fn touch(
        &mut self,
        pages: Range<u64>,
        path: S,
        weight_bytes: u64,
        deltas: &mut Vec<WeightDelta<S>>,
    ) -> bool {
        let replaced = self.release(pages.clone(), deltas);
        if let Some(weight_bytes) = self.thinned_weight(pages.start, weight_bytes) {
            self.insert(pages, path, weight_bytes, deltas);
        }
        replaced
    }

    /// `pages` (page-aligned) were given back: every entry loses the part
    /// inside them. Returns whether any entry overlapped.
    pub(super) fn release(&mut self, pages: Range<u64>, deltas: &mut Vec<WeightDelta<S>>) -> bool {
        let mut released = false;
        self.take(pages, |_, entry| {
            released = true;
            deltas.push((entry.path, -signed(entry.weight_bytes)));
        });
        released
    }

    /// mremap of the pages `old` to `new` (both page-aligned): a shrink
    /// releases the old tail, the first `min(old, new)` bytes move to
    /// `new.start` keeping path and weight, and whatever the destination
    /// held before is released (the kernel unmaps it).
    pub(super) fn remap(
        &mut self,
        old: Range<u64>,
        new: Range<u64>,
        deltas: &mut Vec<WeightDelta<S>>,
    ) {
        let old_len = old.end - old.start;
        let new_len = new.end - new.start;
        if new_len < old_len {
            self.release(old.start + new_len..old.end, deltas);
        }
        if new.start == old.start {
            return;
        }
        let source = old.start..old.start + old_len.min(new_len);
        let mut moved = Vec::new();
        self.take(source, |start, entry| {
            moved.push((start - old.start, entry))
        });
        self.release(new.clone(), deltas);
        for (offset, entry) in moved {
            let start = new.start + offset;
            let end = start + (entry.end - (old.start + offset));
            self.insert_merged(start, Entry { end, ..entry });
        }
    }

    /// Raises the level by one: each entry survives with probability 1/2
    /// (by the hash of its start page) and its weight doubles; the others
    /// are dropped. Pushes one net delta per path whose weight changed.
    pub(super) fn coarsen(&mut self, deltas: &mut Vec<WeightDelta<S>>) {
        self.level += 1;
        let level = self.level;
        let mut net: BTreeMap<S, i64> = BTreeMap::new();
        self.entries.retain(|&start, entry| {
            let kept = survives_step(start, level);
            let delta = if kept {
                let doubled = entry.weight_bytes.saturating_mul(2);
                let gained = doubled - entry.weight_bytes;
                entry.weight_bytes = doubled;
                signed(gained)
            } else {
                -signed(entry.weight_bytes)
            };
            let sum = net.entry(entry.path).or_default();
            *sum = sum.saturating_add(delta);
            kept
        });
        deltas.extend(net);
    }

    /// The weight a new sample at `page_start` gets at the map's level, or
    /// `None` when the level thins it out.
    fn thinned_weight(&self, page_start: u64, weight_bytes: u64) -> Option<u64> {
        kept_at_level(page_start, self.level).then(|| weight_bytes.saturating_mul(1 << self.level))
    }

    /// Inserts a new entry (nothing for an empty range or no weight) and
    /// pushes its weight.
    fn insert(
        &mut self,
        pages: Range<u64>,
        path: S,
        weight_bytes: u64,
        deltas: &mut Vec<WeightDelta<S>>,
    ) {
        if pages.is_empty() || weight_bytes == 0 {
            return;
        }
        deltas.push((path, signed(weight_bytes)));
        let entry = Entry {
            end: pages.end,
            path,
            weight_bytes,
        };
        self.insert_merged(pages.start, entry);
    }

    /// Inserts `entry` at `start` (a free range), merged with the
    /// neighbours it can join.
    fn insert_merged(&mut self, start: u64, entry: Entry<S>) {
        let (start, entry) = self.merge_left(start, entry);
        let entry = self.merge_right(start, entry);
        self.put(start, entry);
    }

    /// `entry` at `start` joined with its left neighbour when they merge
    /// (the neighbour is removed).
    fn merge_left(&mut self, start: u64, entry: Entry<S>) -> (u64, Entry<S>) {
        let Some((&left_start, &left)) = self.entries.range(..start).next_back() else {
            return (start, entry);
        };
        match merged(left_start, left, start, entry) {
            Some(joined) => {
                self.entries.remove(&left_start);
                (left_start, joined)
            }
            None => (start, entry),
        }
    }

    /// `entry` at `start` joined with its right neighbour when they merge
    /// (the neighbour is removed).
    fn merge_right(&mut self, start: u64, entry: Entry<S>) -> Entry<S> {
        let Some(&right) = self.entries.get(&entry.end) else {
            return entry;
        };
        match merged(start, entry, entry.end, right) {
            Some(joined) => {
                self.entries.remove(&entry.end);
                joined
            }
            None => entry,
        }
    }

    /// Stores a part, unless it is empty or weighs nothing.
    fn put(&mut self, start: u64, entry: Entry<S>) {
        if start < entry.end && entry.weight_bytes > 0 {
            self.entries.insert(start, entry);
        }
    }

    /// Removes the parts of entries inside `pages`, handing each to `taken`
    /// (start, entry) from the highest address down; the parts outside stay
    /// with their share of the weight. O(log n) per entry cut.
    fn take(&mut self, pages: Range<u64>, mut taken: impl FnMut(u64, Entry<S>)) {
        while let Some((start, entry)) = self.last_overlapping(&pages) {
            self.entries.remove(&start);
            let [before, (inside_start, inside), after] = split(start, entry, &pages);
            self.put(before.0, before.1);
            self.put(after.0, after.1);
            if inside.weight_bytes > 0 {
                taken(inside_start, inside);
            }
        }
    }

    /// The entry with the highest start that overlaps `pages`, if any (the
    /// entries are sorted and disjoint, so when the last one starting before
    /// `pages.end` ends before `pages.start`, none overlaps).
    fn last_overlapping(&self, pages: &Range<u64>) -> Option<(u64, Entry<S>)> {
        if pages.is_empty() {
            return None;
        }
        let (&start, &entry) = self.entries.range(..pages.end).next_back()?;
        (entry.end > pages.start).then_some((start, entry))
    }

    /// The entries as (range, path, weight), by address.
    #[cfg(test)]
    pub(super) fn spans(&self) -> Vec<(Range<u64>, S, u64)> {
        self.entries
            .iter()
            .map(|(&start, entry)| (start..entry.end, entry.path, entry.weight_bytes))
            .collect()
    }
}

/// `left` (at `left_start`) and `right` (at `right_start`) as one entry when
/// they touch, share a path, have the same weight per byte
/// (`w1 * len2 == w2 * len1`) and their weights add up without overflow.
fn merged<S: Copy + Eq>(
    left_start: u64,
    left: Entry<S>,
    right_start: u64,
    right: Entry<S>,
) -> Option<Entry<S>> {
    let left_len = u128::from(left.end - left_start);
    let right_len = u128::from(right.end - right_start);
    let same_density =
        u128::from(left.weight_bytes) * right_len == u128::from(right.weight_bytes) * left_len;
    if left.end != right_start || left.path != right.path || !same_density {
        return None;
    }
    let weight_bytes = left.weight_bytes.checked_add(right.weight_bytes)?;
    Some(Entry {
        end: right.end,
        weight_bytes,
        ..left
    })
}

/// `entry` at `start` cut by `pages` into the part before, the part inside
/// and the part after, as (start, entry); parts may be empty (then they weigh
/// 0). The weights sum to the entry's weight exactly.
fn split<S: Copy>(start: u64, entry: Entry<S>, pages: &Range<u64>) -> [(u64, Entry<S>); 3] {
    let cut_start = pages.start.clamp(start, entry.end);
    let cut_end = pages.end.clamp(start, entry.end);
    let len = entry.end - start;
    let before = prefix_weight(entry.weight_bytes, cut_start - start, len);
    let through = prefix_weight(entry.weight_bytes, cut_end - start, len);
    let part = |from: u64, to: u64, weight_bytes: u64| {
        let part = Entry {
            end: to,
            weight_bytes,
            ..entry
        };
        (from, part)
    };
    [
        part(start, cut_start, before),
        part(cut_start, cut_end, through - before),
        part(cut_end, entry.end, entry.weight_bytes - through),
    ]
}

/// Weight of the first `prefix_len` of `len` bytes (`0 < len`,
/// `prefix_len <= len`) of an entry weighing `weight_bytes`:
/// `floor(weight_bytes * prefix_len / len)`, exact in 128 bits.
fn prefix_weight(weight_bytes: u64, prefix_len: u64, len: u64) -> u64 {
    let scaled = u128::from(weight_bytes) * u128::from(prefix_len) / u128::from(len);
    u64::try_from(scaled).unwrap_or(weight_bytes)
}

/// The page's thinning coins: splitmix64 of its page number. Bit `k` decides
/// whether the page passes the step from level `k` to level `k + 1`.
fn page_coins(page_start: u64) -> u64 {
    let mut z = (page_start / PAGE_SIZE_BYTES).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether a new sample at `page_start` is kept at `level`: its first
/// `level` coins are all heads (probability 2^-level). Nested: a page
/// dropped at level k is dropped at every level above.
fn kept_at_level(page_start: u64, level: u32) -> bool {
    page_coins(page_start).trailing_ones() >= level
}

/// Whether an entry starting at `page_start` survives the step up to
/// `level` (>= 1): its coin `level - 1`, independent of the coins that
/// admitted it (probability 1/2).
fn survives_step(page_start: u64, level: u32) -> bool {
    (page_coins(page_start) >> (level - 1)) & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = PAGE_SIZE_BYTES;

    #[test]
    fn covering_pages_round_out_and_keep_empty_ranges_empty() {
        assert_eq!(covering_pages(PAGE + 1..PAGE + 2), PAGE..2 * PAGE);
        assert_eq!(covering_pages(PAGE..3 * PAGE), PAGE..3 * PAGE);
        assert_eq!(covering_pages(PAGE + 5..PAGE + 5), PAGE..PAGE);
        assert_eq!(
            covering_pages(u64::MAX - 10..u64::MAX),
            LAST_PAGE_BOUNDARY..LAST_PAGE_BOUNDARY
        );
    }

    #[test]
    fn prefix_weights_floor_and_never_exceed_the_weight() {
        assert_eq!(prefix_weight(10, 1, 3), 3);
        assert_eq!(prefix_weight(10, 2, 3), 6);
        assert_eq!(prefix_weight(10, 3, 3), 10);
        assert_eq!(prefix_weight(u64::MAX, 7, 7), u64::MAX);
        assert_eq!(prefix_weight(u64::MAX, 1, 2), u64::MAX / 2);
    }

    #[test]
    fn split_parts_sum_to_the_entry() {
        let entry = Entry {
            end: 7 * PAGE,
            path: 'a',
            weight_bytes: 1_000_003,
        };
        let [before, inside, after] = split(0, entry, &(2 * PAGE..5 * PAGE));
        assert_eq!(
            (before.0, before.1.end, before.1.weight_bytes),
            (0, 2 * PAGE, 285_715)
        );
        assert_eq!(
            (inside.0, inside.1.end, inside.1.weight_bytes),
            (2 * PAGE, 5 * PAGE, 428_572)
        );
        assert_eq!(
            (after.0, after.1.end, after.1.weight_bytes),
            (5 * PAGE, 7 * PAGE, 285_716)
        );
    }

    #[test]
    fn thinning_is_nested_and_halves_per_level() {
        let pages = 1u64 << 16;
        for level in 0..8 {
            let kept = (0..pages)
                .filter(|&page| kept_at_level(page * PAGE, level))
                .count();
            let expected = (pages >> level) as f64;
            // Binomial(n, 2^-level): within 5 standard deviations.
            let tolerance = 5.0 * expected.sqrt();
            assert!(
                (kept as f64 - expected).abs() <= tolerance,
                "level {level}: kept {kept}, expected {expected}"
            );
            for page in 0..pages {
                let start = page * PAGE;
                if !kept_at_level(start, level) {
                    assert!(!kept_at_level(start, level + 1), "page {page}");
                }
                let stepped = kept_at_level(start, level) && survives_step(start, level + 1);
                assert_eq!(stepped, kept_at_level(start, level + 1), "page {page}");
            }
        }
    }

    #[test]
    fn coarsening_nets_one_delta_per_path() {
        let mut map = HeldMap::new();
        let mut deltas = Vec::new();
        for page in 0..64 {
            let path = if page % 2 == 0 { 'a' } else { 'b' };
            map.touch(page * PAGE..(page + 1) * PAGE, path, page + 1, &mut deltas);
        }
        let before: Vec<_> = map.spans();
        deltas.clear();
        map.coarsen(&mut deltas);
        assert_eq!(map.level(), 1);
        let paths: Vec<char> = deltas.iter().map(|&(path, _)| path).collect();
        assert_eq!(paths, ['a', 'b']);
        for (path, delta) in deltas {
            let expected: i64 = before
                .iter()
                .filter(|span| span.1 == path)
                .map(|(range, _, weight)| {
                    let weight = *weight as i64;
                    if survives_step(range.start, 1) {
                        weight
                    } else {
                        -weight
                    }
                })
                .sum();
            assert_eq!(delta, expected, "path {path}");
        }
    }
}
