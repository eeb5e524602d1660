//! One process's held bytes per path, now and at the process's high-water
//! mark, kept in one pass (memray's high-water-mark method, applied to the
//! RSS the kernel reports with every event).
//!
//! The process has a peak generation `G` that advances whenever its RSS
//! reaches a new high. A path changed since the latest peak remembers its
//! value at that peak (`at_peak`, tagged with `G`); a path not changed since
//! then still holds its peak value in `now`. Each change is O(log paths).

use std::collections::BTreeMap;

use super::map::WeightDelta;
use super::{btree_estimate_bytes, HeldChange, PeakHeld};

/// One path's held bytes in one process.
#[derive(Debug, Clone, Copy, Default)]
struct PathHeld {
    /// Held bytes now.
    now_bytes: u64,
    /// Held bytes at the latest peak, valid when `generation` is the
    /// process's current generation.
    at_peak_bytes: u64,
    /// The peak generation during which the path last changed.
    generation: u64,
    /// The held-at-peak value last reported (0 before any report).
    reported_bytes: u64,
}

impl PathHeld {
    /// Held bytes at the latest peak of a process now at `generation`.
    fn at_latest_peak(&self, generation: u64) -> u64 {
        if self.generation == generation {
            self.at_peak_bytes
        } else {
            self.now_bytes
        }
    }

    /// Applies `delta_bytes`, first keeping the value at the latest peak if
    /// this is the path's first change since that peak.
    fn apply(&mut self, delta_bytes: i64, generation: u64) {
        if self.generation != generation {
            self.at_peak_bytes = self.now_bytes;
            self.generation = generation;
        }
        self.now_bytes = self.now_bytes.saturating_add_signed(delta_bytes);
    }
}

/// Held bytes per path of one process, and its high-water mark.
#[derive(Debug)]
pub(super) struct HeldPaths<S> {
    paths: BTreeMap<S, PathHeld>,
    /// Highest RSS seen, bytes (`None` before the first event).
    peak_rss_bytes: Option<u64>,
    /// Peak generation: advances with every new RSS high.
    generation: u64,
    /// The generation at the latest report of peak values.
    reported_generation: u64,
}

impl<S: Copy + Ord> HeldPaths<S> {
    /// No paths, no peak yet.
    pub(super) fn new() -> Self {
        Self {
            paths: BTreeMap::new(),
            peak_rss_bytes: None,
            generation: 0,
            reported_generation: 0,
        }
    }

    /// Nets `deltas` per path (leaving it empty), applies them, and pushes
    /// one [`HeldChange`] of `process` per path whose held bytes changed, in
    /// path order.
    pub(super) fn apply<P: Copy>(
        &mut self,
        process: P,
        deltas: &mut Vec<WeightDelta<S>>,
        changes: &mut Vec<HeldChange<P, S>>,
    ) {
        deltas.sort_unstable_by_key(|&(path, _)| path);
        for group in deltas.chunk_by(|a, b| a.0 == b.0) {
            let Some(&(path, _)) = group.first() else {
                continue;
            };
            let delta_bytes = group
                .iter()
                .fold(0i64, |sum, &(_, delta)| sum.saturating_add(delta));
            if delta_bytes != 0 {
                self.change(path, delta_bytes);
                changes.push(HeldChange {
                    process,
                    path,
                    delta_bytes,
                });
            }
        }
        deltas.clear();
    }

    /// The process's RSS right after an event, bytes: its first reading or
    /// a new high (ties do not count) makes the held bytes now those at the
    /// high-water mark.
    pub(super) fn observe_rss(&mut self, rss_bytes: u64) {
        if self.peak_rss_bytes.is_none_or(|peak| rss_bytes > peak) {
            self.peak_rss_bytes = Some(rss_bytes);
            self.generation += 1;
        }
    }

    /// Pushes the held-at-peak values of `process` that differ from those
    /// last reported (a path never reported counts as 0), in path order.
    /// Nothing can differ unless the peak moved since the previous call.
    pub(super) fn take_peak_updates<P: Copy>(
        &mut self,
        process: P,
        peaks: &mut Vec<PeakHeld<P, S>>,
    ) {
        if self.generation == self.reported_generation {
            return;
        }
        self.reported_generation = self.generation;
        for (&path, held) in &mut self.paths {
            let held_at_peak_bytes = held.at_latest_peak(self.generation);
            if held_at_peak_bytes != held.reported_bytes {
                held.reported_bytes = held_at_peak_bytes;
                peaks.push(PeakHeld {
                    process,
                    path,
                    held_at_peak_bytes,
                });
            }
        }
    }

    /// Every path with a value (every path an entry of the map has had a
    /// change here first).
    pub(super) fn paths(&self) -> impl Iterator<Item = S> + '_ {
        self.paths.keys().copied()
    }

    /// Estimated heap bytes of the per-path values.
    pub(super) fn memory_bytes(&self) -> usize {
        btree_estimate_bytes::<S, PathHeld>(self.paths.len())
    }

    /// Applies a net change to one path (created at 0, held 0 at the
    /// latest peak, when new).
    fn change(&mut self, path: S, delta_bytes: i64) {
        let generation = self.generation;
        self.paths
            .entry(path)
            .or_insert(PathHeld {
                generation,
                ..PathHeld::default()
            })
            .apply(delta_bytes, generation);
    }
}
