//! Growth paths inside the aggregation step: per (process image, stack) the
//! sampled bytes, their time buckets and the bytes held at the image's
//! high-water mark; at the end, path reports and the same stacks merged
//! over images.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::buckets::{BucketWidth, PathTimeline};
use super::{
    share, Frame, PathReport, ProcessId, SampledBytes, StackGrowthReport, StackId, StackTable,
    Warning,
};

/// Sampled bytes of one (image, stack) path.
#[derive(Debug, Default)]
struct PathState {
    bytes: SampledBytes,
    peak_held_bytes: u64,
    timeline: PathTimeline,
}

/// Every path of the run. Bounded in `memtrace agent`: one entry per
/// (image, stack) that image had sampled bytes or a held change for,
/// without per-bucket timelines ([`PathTable::without_timelines`]); the
/// entries of an ended image go at the next window
/// ([`PathTable::forget`]), so the count follows the distinct stacks of
/// the images open now, never the windows nor the images that came and
/// went.
#[derive(Debug)]
pub(super) struct PathTable {
    paths: HashMap<(ProcessId, StackId), PathState>,
    /// Whether each path keeps its bytes per time bucket (not for
    /// `memtrace agent`, whose windows read only the totals).
    timelines: bool,
}

impl Default for PathTable {
    fn default() -> Self {
        Self {
            paths: HashMap::new(),
            timelines: true,
        }
    }
}

/// Sort key of paths and merged stacks: held at the high-water mark, then
/// grown, both descending.
fn held_then_grown(
    peak_held_bytes: u64,
    bytes: &SampledBytes,
) -> (std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
    (
        std::cmp::Reverse(peak_held_bytes),
        std::cmp::Reverse(bytes.grown_bytes()),
    )
}

impl PathTable {
    /// Adds `bytes` to path (`process`, `stack`) and to its bucket at `t_ns`.
    pub(super) fn add(
        &mut self,
        process: ProcessId,
        stack: StackId,
        width: BucketWidth,
        t_ns: u64,
        bytes: &SampledBytes,
    ) {
        let path = self.paths.entry((process, stack)).or_default();
        path.bytes.merge(bytes);
        if self.timelines {
            path.timeline.add(width, t_ns, bytes);
        }
    }

    /// Keeps no bytes per time bucket from now on (reports' path
    /// timelines are empty): up to [`super::MAX_PATH_BUCKETS`] points per
    /// path that a long trace reading only totals does not need.
    pub(super) fn without_timelines(&mut self) {
        self.timelines = false;
        for path in self.paths.values_mut() {
            path.timeline = PathTimeline::default();
        }
    }

    /// Sets the bytes the path held at its image's high-water mark.
    pub(super) fn set_peak_held(&mut self, process: ProcessId, stack: StackId, bytes: u64) {
        self.paths
            .entry((process, stack))
            .or_default()
            .peak_held_bytes = bytes;
    }

    /// Drops every path of the images `processes`.
    pub(super) fn forget(&mut self, processes: &[ProcessId]) {
        let gone: std::collections::HashSet<ProcessId> = processes.iter().copied().collect();
        self.paths.retain(|(process, _), _| !gone.contains(process));
    }

    /// Adds the stack of every path to `in_use`.
    pub(super) fn stacks_in_use(&self, in_use: &mut std::collections::HashSet<StackId>) {
        in_use.extend(self.paths.keys().map(|&(_, stack)| stack));
    }

    /// Re-buckets every path's timeline into buckets of `width`.
    pub(super) fn rebucket(&mut self, width: BucketWidth) {
        for path in self.paths.values_mut() {
            path.timeline.rebucket(width);
        }
    }

    /// Bytes held now per stack, summed over images.
    pub(super) fn held_by_stack(&self) -> HashMap<StackId, u64> {
        let mut held: HashMap<StackId, u64> = HashMap::new();
        for (&(_, stack), path) in &self.paths {
            let sum = held.entry(stack).or_default();
            *sum = sum.saturating_add(path.bytes.held_now_bytes());
        }
        held
    }

    /// Per image: its sampled totals and its bytes held at its high-water
    /// mark (sums of its paths).
    pub(super) fn by_process(&self) -> HashMap<ProcessId, (SampledBytes, u64)> {
        let mut totals: HashMap<ProcessId, (SampledBytes, u64)> = HashMap::new();
        for (&(process, _), path) in &self.paths {
            let (bytes, peak) = totals.entry(process).or_default();
            bytes.merge(&path.bytes);
            *peak = peak.saturating_add(path.peak_held_bytes);
        }
        totals
    }

    /// Every path, sorted by bytes held at the high-water mark, then growth,
    /// descending, ties by process then frames; shares are of their image's
    /// totals.
    pub(super) fn path_reports(&self, stacks: &StackTable) -> Vec<PathReport> {
        let totals = self.by_process();
        let mut paths: Vec<PathReport> = self
            .paths
            .iter()
            .map(|(&(process, stack), path)| {
                let (image, image_peak) = totals.get(&process).copied().unwrap_or_default();
                PathReport {
                    process,
                    stack,
                    bytes: path.bytes,
                    peak_held_bytes: path.peak_held_bytes,
                    peak_held_error_bytes: path.bytes.standard_error_bytes(path.peak_held_bytes),
                    growth_share: share(path.bytes.grown_bytes(), image.grown_bytes()),
                    peak_held_share: share(path.peak_held_bytes, image_peak),
                    cow_share: share(path.bytes.cow_bytes, image.cow_bytes),
                    timeline: path.timeline.points().to_vec(),
                }
            })
            .collect();
        paths.sort_by(|a, b| {
            let key = |p: &PathReport| (held_then_grown(p.peak_held_bytes, &p.bytes), p.process);
            key(a)
                .cmp(&key(b))
                .then_with(|| stacks.frames(a.stack).cmp(stacks.frames(b.stack)))
        });
        paths
    }

    /// Every stack that made memory resident, its bytes summed over images,
    /// its shares of all images' totals; sorted like the paths, ties by
    /// frames.
    pub(super) fn stack_reports(&self, stacks: &StackTable) -> Vec<StackGrowthReport> {
        let mut merged: HashMap<StackId, (SampledBytes, u64, BTreeSet<ProcessId>)> = HashMap::new();
        let (mut all, mut all_peak) = (SampledBytes::default(), 0_u64);
        for (&(process, stack), path) in &self.paths {
            let (sum, peak, processes) = merged.entry(stack).or_default();
            sum.merge(&path.bytes);
            *peak = peak.saturating_add(path.peak_held_bytes);
            all.merge(&path.bytes);
            all_peak = all_peak.saturating_add(path.peak_held_bytes);
            if path.bytes.grown_bytes() > 0 {
                processes.insert(process);
            }
        }
        let mut reports: Vec<StackGrowthReport> = merged
            .into_iter()
            .filter(|(_, (bytes, _, _))| bytes.grown_bytes() > 0)
            .map(|(stack, (bytes, peak, processes))| StackGrowthReport {
                stack,
                bytes,
                peak_held_bytes: peak,
                growth_share: share(bytes.grown_bytes(), all.grown_bytes()),
                peak_held_share: share(peak, all_peak),
                processes: processes.into_iter().collect(),
            })
            .collect();
        reports.sort_by(|a, b| {
            held_then_grown(a.peak_held_bytes, &a.bytes)
                .cmp(&held_then_grown(b.peak_held_bytes, &b.bytes))
                .then_with(|| stacks.frames(a.stack).cmp(stacks.frames(b.stack)))
        });
        reports
    }

    /// One warning per unknown-frame reason, with the samples whose stack
    /// carries it, in reason order.
    pub(super) fn incomplete_stack_warnings(&self, stacks: &StackTable) -> Vec<Warning> {
        let mut samples_by_reason: BTreeMap<&str, u64> = BTreeMap::new();
        for (&(_, stack), path) in &self.paths {
            for frame in stacks.frames(stack) {
                if let Frame::Unknown { reason } = frame {
                    let samples = samples_by_reason.entry(reason.as_str()).or_default();
                    *samples = samples.saturating_add(path.bytes.samples);
                }
            }
        }
        samples_by_reason
            .into_iter()
            .map(|(reason, samples)| Warning::IncompleteStacks {
                reason: reason.to_owned(),
                samples,
            })
            .collect()
    }
}
