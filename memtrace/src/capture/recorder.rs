//! The aggregation step's input during `record`/`run`: every call goes to
//! the live [`Aggregator`] and, with `--capture`, to the [`CaptureWriter`],
//! so the capture replays into the report the live run printed. Samples and
//! exact address-space releases also go through the held-page map
//! ([`crate::held`]), whose changes reach both as sampled bytes (per path,
//! held now) and, at each flush, as bytes held at the high-water mark.
//! Periodic counter reads are thinned here, for both, to one per process per
//! [`PERIODIC_COUNTERS_INTERVAL_NS`] unless RSS moved by
//! [`PERIODIC_RSS_CHANGE_BYTES`] since the last one kept.

use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;

use memtrace_common::ProcessCounters;

use super::format::{ExecLine, PeakHeld};
use super::{CaptureError, CaptureWriter};
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, HeldState, MemorySample, ProcessId, ProcessStart,
    PythonStatus, Report, RssPoint, RunMeta, SampledBytes, Sharing, StackId,
};
use crate::held::{HeldChange, HeldTracker, PeakHeld as HeldAtPeak};

/// Least time between two periodic counter reads of one process that are
/// kept, in nanoseconds, while RSS moves less than
/// [`PERIODIC_RSS_CHANGE_BYTES`]: counter lines were most of a capture's
/// size at one per process per 200 ms tick.
pub const PERIODIC_COUNTERS_INTERVAL_NS: u64 = 1_000_000_000;

/// A periodic read whose RSS differs by at least this many bytes from the
/// process's last kept read is kept however soon it comes, so a short spike
/// (built and released within a second) keeps its peak in the RSS timeline
/// to within this much. The smallest growth the diagnosis reports on
/// (`diagnose::MIN_GROWTH_BYTES`, 8 MiB).
pub const PERIODIC_RSS_CHANGE_BYTES: u64 = 8 * 1024 * 1024;

/// Most live entries of the held-page map over all processes before it
/// coarsens (each entry is one sampled page range, about 80 bytes with the
/// map's overhead: 2^20 entries is about 80 MiB). At the default 512 KiB
/// sampling interval that is 512 GiB of held memory.
pub const HELD_MAP_MAX_ENTRIES: usize = 1 << 20;

/// The latest counter read kept for a process.
#[derive(Clone, Copy, Debug)]
struct KeptRead {
    ts_ns: u64,
    /// Its RSS, when known.
    rss_bytes: Option<u64>,
}

impl KeptRead {
    fn new(ts_ns: u64, counters: &ProcessCounters) -> Self {
        Self {
            ts_ns,
            rss_bytes: RssPoint::from_counters(0, counters).map(|p| p.rss_bytes),
        }
    }

    /// Whether a periodic read `next` is worth keeping after this one.
    fn superseded_by(self, next: Self) -> bool {
        let moved = match (self.rss_bytes, next.rss_bytes) {
            (Some(before), Some(now)) => before.abs_diff(now) >= PERIODIC_RSS_CHANGE_BYTES,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        moved || next.ts_ns.saturating_sub(self.ts_ns) >= PERIODIC_COUNTERS_INTERVAL_NS
    }
}

/// An exact address-space change of one image, for the held-page map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressChange {
    /// Pages `[start, end)` were given back (munmap, madvise free, brk
    /// shrink, `MAP_FIXED` replacement).
    Release(Range<u64>),
    /// `mremap(old_start, old_len, new_len)` returned `new_start`.
    Remap {
        /// Old start.
        old_start: u64,
        /// Old length, bytes.
        old_len: u64,
        /// New start.
        new_start: u64,
        /// New length, bytes.
        new_len: u64,
    },
}

/// The live aggregator, the held-page map and, optionally, a capture writer
/// fed the same calls (see [`Aggregator`] for each call's meaning).
#[derive(Debug)]
pub struct Recorder<W: Write> {
    aggregator: Aggregator,
    writer: Option<CaptureWriter<W>>,
    held: HeldTracker<ProcessId, StackId>,
    /// The latest counter read kept, per image.
    last_kept: HashMap<ProcessId, KeptRead>,
    /// Scratch buffer of held changes.
    changes: Vec<HeldChange<ProcessId, StackId>>,
}

impl<W: Write> Recorder<W> {
    /// Feeds `aggregator`, and `writer` when given; the held-page map keeps
    /// at most `held_max_entries` entries (see [`HELD_MAP_MAX_ENTRIES`]).
    pub fn new(
        aggregator: Aggregator,
        writer: Option<CaptureWriter<W>>,
        held_max_entries: usize,
    ) -> Self {
        Self {
            aggregator,
            writer,
            held: HeldTracker::new(held_max_entries),
            last_kept: HashMap::new(),
            changes: Vec::new(),
        }
    }

    /// The live aggregator (for progress and the live view).
    pub fn aggregator(&self) -> &Aggregator {
        &self.aggregator
    }

    /// See [`Aggregator::process_started`].
    pub fn process_started(&mut self, start: ProcessStart) -> ProcessId {
        let id = self.aggregator.process_started(start.clone());
        self.last_kept
            .insert(id, KeptRead::new(start.ts_ns, &start.counters));
        if let Some(writer) = &mut self.writer {
            writer.process_started(id, &start);
        }
        id
    }

    /// See [`Aggregator::process_exec`]: the old image's held pages are
    /// final.
    pub fn process_exec(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        cmdline: String,
    ) -> ProcessId {
        self.end_held(id);
        let image = self
            .aggregator
            .process_exec(id, ts_ns, counters, cmdline.clone());
        if let Some(writer) = &mut self.writer {
            let line = ExecLine {
                process: id,
                image,
                ts_ns,
                cmdline,
                counters: *counters,
            };
            writer.process_exec(line, &self.aggregator);
        }
        image
    }

    /// See [`Aggregator::exit_began`]: the image's held pages are final.
    pub fn exit_began(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        by: ExitBegin,
        counters: &ProcessCounters,
    ) {
        self.end_held(id);
        if let Some(writer) = &mut self.writer {
            writer.exit_began(id, ts_ns, by, counters, &self.aggregator);
        }
        self.aggregator.exit_began(id, ts_ns, by, counters);
    }

    /// See [`Aggregator::process_exited`].
    pub fn process_exited(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        status: Option<ExitStatus>,
        counters: Option<&ProcessCounters>,
    ) {
        self.end_held(id);
        if let Some(writer) = &mut self.writer {
            writer.process_exited(id, ts_ns, status, counters, &self.aggregator);
        }
        self.aggregator.process_exited(id, ts_ns, status, counters);
        self.last_kept.remove(&id);
    }

    /// See [`Aggregator::python_status`].
    pub fn python_status(&mut self, id: ProcessId, status: PythonStatus) {
        if let Some(writer) = &mut self.writer {
            writer.python_status(id, &status);
        }
        self.aggregator.python_status(id, status);
    }

    /// See [`Aggregator::counters`]: a read that must be kept (the end of
    /// the run).
    pub fn counters(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        sharing: Option<Sharing>,
    ) {
        self.last_kept.insert(id, KeptRead::new(ts_ns, counters));
        if let Some(writer) = &mut self.writer {
            writer.counters(id, ts_ns, counters, sharing);
        }
        self.aggregator.counters(id, ts_ns, counters, sharing);
    }

    /// A periodic counter read: kept (as [`Recorder::counters`], with the
    /// PSS/USS `read_sharing` gives, read only then) when
    /// `PERIODIC_COUNTERS_INTERVAL_NS` passed since the image's latest kept
    /// read or its RSS moved by `PERIODIC_RSS_CHANGE_BYTES`.
    pub fn periodic_counters(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        read_sharing: impl FnOnce() -> Option<Sharing>,
    ) {
        let next = KeptRead::new(ts_ns, counters);
        let keep = self
            .last_kept
            .get(&id)
            .is_none_or(|last| last.superseded_by(next));
        if keep {
            self.counters(id, ts_ns, counters, read_sharing());
        }
    }

    /// One sampled memory event: its stack interned once, its sampled bytes
    /// and (for growth with an address) the pages it holds now.
    pub fn memory(&mut self, sample: MemorySample) {
        let stack = self.aggregator.intern(sample.stack);
        let mut bytes = SampledBytes::from_event(sample.event, sample.weight_bytes);
        bytes.variance_kib2 =
            SampledBytes::sample_variance_kib2(sample.weight_bytes, sample.len_bytes);
        if bytes.grown_bytes() > 0 {
            self.changes.clear();
            match sample.pages {
                Some(pages) => self.held.touch(
                    sample.process,
                    pages,
                    stack,
                    sample.weight_bytes,
                    sample.rss_bytes,
                    &mut self.changes,
                ),
                None => self.held.touch_unplaced(
                    sample.process,
                    stack,
                    sample.weight_bytes,
                    sample.rss_bytes,
                    &mut self.changes,
                ),
            }
            // The path's own held change travels with its sample.
            let mut changes = std::mem::take(&mut self.changes);
            changes.retain(|change| {
                let own = change.process == sample.process && change.path == stack;
                if own {
                    bytes.held_bytes = bytes.held_bytes.saturating_add(change.delta_bytes);
                }
                !own
            });
            self.apply_held_changes(sample.ts_ns, &changes);
            self.changes = changes;
        }
        self.path_delta(sample.process, sample.ts_ns, stack, bytes);
    }

    /// An exact address-space change of image `id` at `ts_ns` (`rss_bytes`:
    /// its RSS right after): the held pages it releases or moves.
    pub fn address(&mut self, id: ProcessId, ts_ns: u64, change: AddressChange, rss_bytes: u64) {
        let mut changes = std::mem::take(&mut self.changes);
        changes.clear();
        match change {
            AddressChange::Release(range) => self.held.release(id, range, rss_bytes, &mut changes),
            AddressChange::Remap {
                old_start,
                old_len,
                new_start,
                new_len,
            } => self.held.remap(
                id,
                old_start,
                old_len,
                new_start,
                new_len,
                rss_bytes,
                &mut changes,
            ),
        }
        self.apply_held_changes(ts_ns, &changes);
        self.changes = changes;
    }

    /// Sends held changes to the aggregator and the writer as sampled bytes.
    fn apply_held_changes(&mut self, ts_ns: u64, changes: &[HeldChange<ProcessId, StackId>]) {
        for change in changes {
            let bytes = SampledBytes::held_change(change.delta_bytes);
            self.path_delta(change.process, ts_ns, change.path, bytes);
        }
    }

    fn path_delta(&mut self, id: ProcessId, ts_ns: u64, stack: StackId, bytes: SampledBytes) {
        self.aggregator.path_delta(id, ts_ns, stack, bytes);
        if let Some(writer) = &mut self.writer {
            writer.path_delta(id, ts_ns, stack, bytes, &self.aggregator);
        }
    }

    /// The image's held pages are final: its last peak values and its map
    /// state go out.
    fn end_held(&mut self, id: ProcessId) {
        let mut peaks = Vec::new();
        let state = self.held_state(id);
        self.held.end(id, &mut peaks);
        self.apply_peaks(peaks);
        self.set_held_state(id, state);
    }

    /// What the held-page map says about image `id` now.
    fn held_state(&self, id: ProcessId) -> HeldState {
        let stats = self.held.stats();
        HeldState {
            coarsening_level: stats.coarsening_level(id),
            unplaced_bytes: stats.unplaced_bytes(id),
        }
    }

    fn set_held_state(&mut self, id: ProcessId, state: HeldState) {
        if state == HeldState::default() {
            return;
        }
        self.aggregator.held_state(id, state);
        if let Some(writer) = &mut self.writer {
            writer.held(id, state);
        }
    }

    fn apply_peaks(&mut self, peaks: Vec<HeldAtPeak<ProcessId, StackId>>) {
        let lines: Vec<PeakHeld> = peaks
            .into_iter()
            .map(|p| {
                self.aggregator
                    .peak_held(p.process, p.path, p.held_at_peak_bytes);
                PeakHeld(p.process, p.path, p.held_at_peak_bytes)
            })
            .collect();
        if let Some(writer) = &mut self.writer {
            writer.peaks(lines, &self.aggregator);
        }
    }

    /// Sends the held-at-peak values that changed, then flushes the capture
    /// (call about once a second).
    pub fn flush(&mut self) {
        let mut peaks = Vec::new();
        self.held.take_peak_updates(&mut peaks);
        self.apply_peaks(peaks);
        if let Some(writer) = &mut self.writer {
            writer.flush(&self.aggregator);
        }
    }

    /// Whether a capture file is being written.
    pub fn capturing(&self) -> bool {
        self.writer.is_some()
    }

    /// `--allocations`: writes allocator mode's report so far to the
    /// capture.
    pub fn allocations(&mut self, report: &crate::allocations::AllocationsReport) {
        if let Some(writer) = &mut self.writer {
            writer.allocations(report);
        }
    }

    /// Writes the allocators' census of the run to the capture.
    pub fn census(&mut self, report: &crate::census::CensusReport) {
        if let Some(writer) = &mut self.writer {
            writer.census(report);
        }
    }

    /// The report of the run so far, as if it ended at `now_ns` (see
    /// [`Aggregator::report_now`]); tracing goes on.
    pub fn report_now(&self, now_ns: u64, meta: RunMeta) -> Report {
        self.aggregator.report_now(now_ns, meta)
    }

    /// See [`Aggregator::drop_path_timelines`].
    pub fn drop_path_timelines(&mut self) {
        self.aggregator.drop_path_timelines();
    }

    /// Forgets the images that ended (see [`Aggregator::compact_ended`]),
    /// in the aggregator and the held-page map, then the stacks neither
    /// the paths left nor the held-page map refer to
    /// ([`Aggregator::compact_stacks`]); returns how many images. Only for
    /// a session without a capture file (a capture refers to every image
    /// and stack id).
    pub fn compact_ended(&mut self) -> usize {
        let ended = self.aggregator.compact_ended();
        for &id in &ended {
            self.last_kept.remove(&id);
            self.held.forget_ended(id);
        }
        self.aggregator.compact_stacks(self.held.paths_in_use());
        ended.len()
    }

    /// Live entries and estimated heap bytes of the held-page map now.
    pub fn held_map_size(&self) -> (u64, u64) {
        let stats = self.held.stats();
        let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        (as_u64(stats.live_entries), as_u64(stats.memory_bytes))
    }

    /// The capture write error that stopped the capture, once (tracing and
    /// the live report go on).
    pub fn take_capture_error(&mut self) -> Option<CaptureError> {
        self.writer.as_mut().and_then(CaptureWriter::take_error)
    }

    /// Ends the run at `end_ns` (the capture's `end` line says
    /// `meta.duration_ns`, which should be `end_ns` minus the run start):
    /// the held values of the images still open, then the live report (not
    /// yet diagnosed) and the capture error not yet taken, if any.
    pub fn finish(mut self, end_ns: u64, meta: RunMeta) -> (Report, Option<CaptureError>) {
        for id in self.held.processes() {
            self.end_held(id);
        }
        let aggregator = &self.aggregator;
        let error = self
            .writer
            .and_then(|writer| writer.finish(&meta, aggregator).err());
        (self.aggregator.finish(end_ns, meta), error)
    }
}
