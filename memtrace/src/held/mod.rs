//! Which sampled pages each path still holds, by address: held bytes per
//! path now and at each process's high-water mark.
//!
//! Place in the data flow: between `symbolize` (which names the path of each
//! sample) and `aggregate` (which sums bytes per process, path and time).
//! Sampled first touches and exact releases in; per path held bytes now and
//! at the high-water mark out. Growth alone counts a buffer allocated and
//! freed 30 times 30 times; held bytes count it once.
//!
//! Per process image, an interval map (`map`) keeps the sampled pages still
//! resident as `address range -> (path, weight)`. A first touch inserts its
//! pages with the sample's weight; a release (munmap, madvise, brk shrink,
//! MAP_FIXED replacement, mremap) takes the overlapping parts away, each
//! part weighing its share of its entry's weight (integer arithmetic whose
//! parts always sum to the whole). Every change of a path's held bytes goes
//! out as a [`HeldChange`], netted per path and event, in path order. Per
//! process, `peak` keeps each path's value at the highest RSS seen, reported
//! by [`HeldTracker::take_peak_updates`] and [`HeldTracker::end`] as
//! [`PeakHeld`].
//!
//! Memory is bounded by a budget of live entries: over budget, the process
//! with most entries is coarsened (half its entries dropped by a fixed hash
//! of their start page, the others doubled in weight; later samples thinned
//! the same way), which keeps the held estimates unbiased.
//!
//! Keys are generic (`P` one process image, `S` one path), so the module
//! depends on no other memtrace module. Everything is deterministic: the
//! same calls give the same changes in the same order.

mod map;
mod peak;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::size_of;
use std::ops::Range;

use map::{covering_pages, HeldMap, WeightDelta, MAX_LEVEL};
use peak::HeldPaths;

/// A change of one path's held bytes in one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldChange<P, S> {
    /// The process image.
    pub process: P,
    /// The path (call stack).
    pub path: S,
    /// Change of the path's held bytes (estimated, signed; never 0).
    pub delta_bytes: i64,
}

/// A path's held bytes at its process's high-water mark (absolute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeakHeld<P, S> {
    /// The process image.
    pub process: P,
    /// The path (call stack).
    pub path: S,
    /// Bytes the path held when the process's RSS was at its highest so far
    /// (estimated; the latest of several equal highs does not count, the
    /// first does).
    pub held_at_peak_bytes: u64,
}

/// One open process image's map state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessHeldStats {
    /// Live entries of its map.
    pub entries: usize,
    /// 1 in `2^coarsening_level` of its sampled pages kept (0: all).
    pub coarsening_level: u32,
    /// Sampled growth without an address, bytes: held until the image ends.
    pub unplaced_bytes: u64,
}

/// The state of a [`HeldTracker`] (see [`HeldTracker::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldStats<P> {
    /// Live entries over all open process images.
    pub live_entries: usize,
    /// Estimated heap bytes used by the tracker (maps, per-path values,
    /// ended image keys).
    pub memory_bytes: usize,
    /// First touches of pages still held (each means a release was missed;
    /// the old entries were released first), over the whole run.
    pub overlapping_touches: u64,
    /// Per open (not ended) process image.
    pub processes: BTreeMap<P, ProcessHeldStats>,
}

impl<P: Ord> HeldStats<P> {
    /// The coarsening level of `process` (0 when it is not open).
    pub fn coarsening_level(&self, process: P) -> u32 {
        self.processes
            .get(&process)
            .map_or(0, |stats| stats.coarsening_level)
    }

    /// The unplaced bytes of `process` (0 when it is not open).
    pub fn unplaced_bytes(&self, process: P) -> u64 {
        self.processes
            .get(&process)
            .map_or(0, |stats| stats.unplaced_bytes)
    }
}

/// One open process image: its held pages, per-path values and unplaced
/// growth.
#[derive(Debug)]
struct ProcessHeld<S> {
    map: HeldMap<S>,
    paths: HeldPaths<S>,
    /// Sampled growth without an address, bytes.
    unplaced_bytes: u64,
}

impl<S: Copy + Ord> ProcessHeld<S> {
    fn new() -> Self {
        Self {
            map: HeldMap::new(),
            paths: HeldPaths::new(),
            unplaced_bytes: 0,
        }
    }

    fn stats(&self) -> ProcessHeldStats {
        ProcessHeldStats {
            entries: self.map.len(),
            coarsening_level: self.map.level(),
            unplaced_bytes: self.unplaced_bytes,
        }
    }

    fn memory_bytes(&self) -> usize {
        self.map.memory_bytes() + self.paths.memory_bytes()
    }
}

/// The sampled pages each path still holds, per process image.
///
/// `P` identifies one process image (e.g. (tgid, start time, image)), `S`
/// one path (an interned call stack id). Every call takes `O(log n)` in the
/// size of the process's map, plus `O(log n)` per entry it cuts or moves
/// (coarsening, rare, is linear in the coarsened map).
#[derive(Debug)]
pub struct HeldTracker<P, S> {
    /// Budget of live entries over all processes.
    max_entries: usize,
    processes: BTreeMap<P, ProcessHeld<S>>,
    /// Images that ended: later calls for them are ignored.
    ended: BTreeSet<P>,
    /// Sum of the maps' lengths.
    live_entries: usize,
    overlapping_touches: u64,
    /// Scratch: weight deltas of the event being applied.
    deltas: Vec<WeightDelta<S>>,
}

impl<P: Copy + Ord, S: Copy + Ord> HeldTracker<P, S> {
    /// An empty tracker that keeps at most about `max_entries` live entries
    /// over all processes, coarsening past it (an entry costs about 50
    /// heap bytes with 8-byte path keys).
    pub fn new(max_entries: usize) -> Self {
        Self {
            max_entries,
            processes: BTreeMap::new(),
            ended: BTreeSet::new(),
            live_entries: 0,
            overlapping_touches: 0,
            deltas: Vec::new(),
        }
    }

    /// Sampled first touch: the pages covering `range` (bytes; rounded out
    /// to whole pages; an empty range stands for the page holding
    /// `range.start`) became resident for `path`; the sample weighs
    /// `weight_bytes`. Pages still held are released first (counted in
    /// [`HeldStats::overlapping_touches`]). Once the process is coarsened to
    /// level `L`, the sample is kept with probability `2^-L` (by a fixed hash
    /// of its first page) and then weighs `2^L * weight_bytes`. The entry
    /// merges with an adjacent one of the same path and weight per byte.
    /// `rss_bytes`: the process's RSS
    /// right after the event, which decides the high-water mark. Pushes the
    /// held changes onto `changes`.
    pub fn touch(
        &mut self,
        process: P,
        range: Range<u64>,
        path: S,
        weight_bytes: u64,
        rss_bytes: u64,
        changes: &mut Vec<HeldChange<P, S>>,
    ) {
        let end = range.end.max(range.start.saturating_add(1));
        let pages = covering_pages(range.start..end);
        let replaced = self.event(process, rss_bytes, changes, |state, deltas| {
            state.map.touch(pages, path, weight_bytes, deltas)
        });
        if replaced == Some(true) {
            self.overlapping_touches += 1;
        }
    }

    /// Sampled growth without an address, weighing `weight_bytes`: held by
    /// `path` until the process ends (counted in
    /// [`ProcessHeldStats::unplaced_bytes`]). `rss_bytes` as for
    /// [`HeldTracker::touch`].
    pub fn touch_unplaced(
        &mut self,
        process: P,
        path: S,
        weight_bytes: u64,
        rss_bytes: u64,
        changes: &mut Vec<HeldChange<P, S>>,
    ) {
        self.event(process, rss_bytes, changes, |state, deltas| {
            state.unplaced_bytes = state.unplaced_bytes.saturating_add(weight_bytes);
            deltas.push((path, signed(weight_bytes)));
        });
    }

    /// The pages covering `range` (bytes, rounded out) were given back
    /// (munmap, madvise free, brk shrink, MAP_FIXED replacement). Every entry
    /// overlapping them loses the overlapping part and its share of the
    /// weight: of an entry of `len` bytes weighing `w`, the first `x` bytes
    /// weigh `floor(w * x / len)`, so the parts of a split always sum to `w`
    /// (a lost part of `overlap` bytes weighs `w * overlap / len` within one
    /// byte). `rss_bytes` as for [`HeldTracker::touch`].
    pub fn release(
        &mut self,
        process: P,
        range: Range<u64>,
        rss_bytes: u64,
        changes: &mut Vec<HeldChange<P, S>>,
    ) {
        let pages = covering_pages(range);
        self.event(process, rss_bytes, changes, |state, deltas| {
            state.map.release(pages, deltas);
        });
    }

    /// mremap(`old_start`, `old_len`, `new_len`) returned `new_start`
    /// (bytes; lengths rounded up to whole pages): the first
    /// `min(old_len, new_len)` bytes move to `new_start` keeping path and
    /// weight (no change when the address stays); when shrinking,
    /// `[old_start + new_len, old_start + old_len)` is released; on a move,
    /// what the destination held before is released (the kernel unmapped
    /// it). `rss_bytes` as for [`HeldTracker::touch`].
    // The arguments are mremap's own, plus the tracker's usual three.
    #[allow(clippy::too_many_arguments)]
    pub fn remap(
        &mut self,
        process: P,
        old_start: u64,
        old_len: u64,
        new_start: u64,
        new_len: u64,
        rss_bytes: u64,
        changes: &mut Vec<HeldChange<P, S>>,
    ) {
        let old = covering_pages(old_start..old_start.saturating_add(old_len));
        let new = covering_pages(new_start..new_start.saturating_add(new_len));
        self.event(process, rss_bytes, changes, |state, deltas| {
            state.map.remap(old, new, deltas);
        });
    }

    /// The process image ended (exit began, or exec replaced it): later
    /// calls for `process` are ignored, its map is freed and its held values
    /// stand (no change is pushed). Pushes its final held-at-peak values
    /// that changed since last reported onto `peaks`. A second call does
    /// nothing.
    pub fn end(&mut self, process: P, peaks: &mut Vec<PeakHeld<P, S>>) {
        if !self.ended.insert(process) {
            return;
        }
        if let Some(mut state) = self.processes.remove(&process) {
            self.live_entries -= state.map.len();
            state.paths.take_peak_updates(process, peaks);
        }
    }

    /// Forgets that image `process` ended (after [`HeldTracker::end`]), so
    /// that the set of ended images does not grow with every process that
    /// came and went; the caller must send no more calls about it (its ids
    /// are never reused). An image that has not ended is kept.
    pub fn forget_ended(&mut self, process: P) {
        if !self.processes.contains_key(&process) {
            self.ended.remove(&process);
        }
    }

    /// Pushes onto `peaks` the held-at-peak values that changed since the
    /// previous call (or since first seen), for every open process whose
    /// high-water mark moved since then; by process, then path.
    pub fn take_peak_updates(&mut self, peaks: &mut Vec<PeakHeld<P, S>>) {
        for (&process, state) in &mut self.processes {
            state.paths.take_peak_updates(process, peaks);
        }
    }

    /// Every path the open images' maps and per-path values refer to
    /// (each once per image).
    pub fn paths_in_use(&self) -> impl Iterator<Item = S> + '_ {
        self.processes
            .values()
            .flat_map(|state| state.paths.paths())
    }

    /// The open (seen, not ended) process images, in order.
    pub fn processes(&self) -> Vec<P> {
        self.processes.keys().copied().collect()
    }

    /// Live entries, estimated heap bytes, missed releases, and per open
    /// process its entries, coarsening level and unplaced bytes.
    pub fn stats(&self) -> HeldStats<P> {
        HeldStats {
            live_entries: self.live_entries,
            memory_bytes: self.memory_bytes(),
            overlapping_touches: self.overlapping_touches,
            processes: self
                .processes
                .iter()
                .map(|(&process, state)| (process, state.stats()))
                .collect(),
        }
    }

    /// Applies one event of `process` (ignored once it ended): `op` changes
    /// its map and pushes weight deltas, which are netted per path and
    /// pushed as changes; then the RSS may move the high-water mark, then
    /// the budget is enforced. Returns `op`'s result.
    fn event<R>(
        &mut self,
        process: P,
        rss_bytes: u64,
        changes: &mut Vec<HeldChange<P, S>>,
        op: impl FnOnce(&mut ProcessHeld<S>, &mut Vec<WeightDelta<S>>) -> R,
    ) -> Option<R> {
        if self.ended.contains(&process) {
            return None;
        }
        let state = self
            .processes
            .entry(process)
            .or_insert_with(ProcessHeld::new);
        let entries_before = state.map.len();
        let result = op(state, &mut self.deltas);
        self.live_entries = self.live_entries - entries_before + state.map.len();
        state.paths.apply(process, &mut self.deltas, changes);
        state.paths.observe_rss(rss_bytes);
        self.enforce_budget(changes);
        Some(result)
    }

    /// Coarsens the process with most entries until the live entries fit
    /// the budget (or no process can be coarsened further).
    fn enforce_budget(&mut self, changes: &mut Vec<HeldChange<P, S>>) {
        while self.live_entries > self.max_entries {
            let Some(process) = self.coarsening_candidate() else {
                return;
            };
            self.coarsen(process, changes);
        }
    }

    /// The open process with most entries below the highest level (ties:
    /// the smallest key).
    fn coarsening_candidate(&self) -> Option<P> {
        self.processes
            .iter()
            .filter(|(_, state)| state.map.len() > 0 && state.map.level() < MAX_LEVEL)
            .max_by_key(|&(&process, state)| (state.map.len(), Reverse(process)))
            .map(|(&process, _)| process)
    }

    /// Raises the coarsening level of `process` by one and pushes the net
    /// change of each path.
    fn coarsen(&mut self, process: P, changes: &mut Vec<HeldChange<P, S>>) {
        let Some(state) = self.processes.get_mut(&process) else {
            return;
        };
        let entries_before = state.map.len();
        state.map.coarsen(&mut self.deltas);
        self.live_entries = self.live_entries - entries_before + state.map.len();
        state.paths.apply(process, &mut self.deltas, changes);
    }

    /// Estimated heap bytes of everything the tracker holds.
    fn memory_bytes(&self) -> usize {
        let processes = btree_estimate_bytes::<P, ProcessHeld<S>>(self.processes.len());
        let ended = btree_estimate_bytes::<P, ()>(self.ended.len());
        let scratch = self.deltas.capacity() * size_of::<WeightDelta<S>>();
        let maps: usize = self.processes.values().map(ProcessHeld::memory_bytes).sum();
        processes + ended + scratch + maps
    }
}

/// Estimated heap bytes of a `BTreeMap<K, V>` of `len` elements: keys and
/// values, plus half again for nodes about two thirds full and their edges.
fn btree_estimate_bytes<K, V>(len: usize) -> usize {
    len.saturating_mul(size_of::<K>() + size_of::<V>()) / 2 * 3
}

/// `bytes` as a signed change (saturating; byte counts never reach 2^63).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
