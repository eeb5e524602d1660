//! Aggregation step of the data flow: process lifecycle events, counter
//! reads, symbolized samples and held-byte changes in; one immutable
//! [`Report`] out.
//!
//! Pure data: nothing here touches BPF or /proc, so it is driven by synthetic
//! inputs in tests (memray's aggregator tests are the model). A process is
//! `(tgid, start time)`; each of its images (an execve starts a new one) is
//! a row with its own [`ProcessId`], RSS timeline, counters and paths. An
//! image's numbers end when it exec'd or began to exit: the interpreter's
//! finalization and the kernel's teardown are never read as release. Per
//! (image, stack) it sums sampled bytes by kind of event, and the bytes the
//! path holds (from `crate::held`), overall and per time bucket, and at the
//! end merges those sums per stack across images (a leak repeated in every
//! worker of a pre-fork service). Stacks are interned ([`StackId`]).

mod buckets;
mod compact;
mod counters_serde;
mod model;
mod paths;
mod process;
mod progress;
mod snapshot;
mod stacks;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
mod timeline;

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use memtrace_common::ProcessCounters;

pub use buckets::{PathPoint, INITIAL_PATH_BUCKET_NS, MAX_PATH_BUCKETS};
pub(crate) use counters_serde::CountersDef;
pub use model::{
    display_file, show_full_paths, ExitBegin, ExitStatus, Frame, MappingKind, ProcessId,
    ProcessStart, PythonStatus, Role, Sharing,
};
pub use progress::{LivePath, LiveProcess, LiveSnapshot};
pub use snapshot::{
    error_bytes, short_command, ExactCounters, Origin, PathReport, ProcessKind, ProcessReport,
    PythonPath, Report, RssSummary, RunMeta, SampledBytes, SharingSummary, StackGrowthReport,
    Totals, Warning, Weight,
};
pub use stacks::StackId;
pub use timeline::{RssPoint, MAX_TIMELINE_POINTS};

use buckets::BucketWidth;
use paths::PathTable;
use process::ProcessState;
pub(crate) use stacks::StackTable;

/// Most characters of a command in the live view.
const LIVE_COMMAND_CHARS: usize = 48;

/// Sort key of the ranked lists of a report: `bytes` descending, then
/// process ascending (`None` for lists merged over processes), then frames.
fn rank_key(
    bytes: u64,
    process: Option<ProcessId>,
    frames: &[Frame],
) -> (Reverse<u64>, Option<ProcessId>, &[Frame]) {
    (Reverse(bytes), process, frames)
}

/// `part / whole` as a fraction, 0 when `whole` is 0.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// One sampled memory event with its symbolized stack, as the app hands it
/// to the capture recorder (which interns the stack and feeds
/// [`Aggregator::path_delta`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// Process image that caused it.
    pub process: ProcessId,
    /// When (CLOCK_MONOTONIC ns).
    pub ts_ns: u64,
    /// What happened.
    pub event: memtrace_common::MemoryEvent,
    /// Sampling weight, in bytes: what this sample stands for (the mean
    /// the kernel sampled it with, or its true size when larger).
    pub weight_bytes: u64,
    /// The event's true size, in bytes (its weight's share of sampling
    /// error is `weight * (weight - len)`).
    pub len_bytes: u64,
    /// Pages it made resident, `[start, end)`, for growth events with a
    /// known address; `None` otherwise.
    pub pages: Option<std::ops::Range<u64>>,
    /// The process's RSS right after the event, in bytes.
    pub rss_bytes: u64,
    /// Call stack, outermost first; the native frame and any mapping last.
    pub stack: Vec<Frame>,
}

/// What the held-page map says about one image at the end (for warnings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldState {
    /// 1 in `2^coarsening_level` sampled pages kept (0: all).
    pub coarsening_level: u32,
    /// Sampled growth without an address, held until the image ends.
    pub unplaced_bytes: u64,
}

/// Sums over the live processes, kept as readings arrive.
#[derive(Debug, Default)]
struct LiveTotals {
    processes: u64,
    peak_processes: u64,
    rss_bytes: u64,
    peak_rss_bytes: u64,
    pss_bytes: u64,
    peak_pss_bytes: u64,
}

/// Accumulates one run. Feed it in record order; call [`Aggregator::finish`]
/// once at the end. Timestamps are CLOCK_MONOTONIC nanoseconds (the records'
/// clock); the report shows them relative to `start_ns`.
#[derive(Debug)]
pub struct Aggregator {
    start_ns: u64,
    /// Every image not yet compacted away ([`Aggregator::compact_ended`]),
    /// by id.
    processes: BTreeMap<ProcessId, ProcessState>,
    /// The id the next image gets (ids are never reused, not even after
    /// compaction).
    next_id: u32,
    held: HashMap<ProcessId, HeldState>,
    stacks: StackTable,
    paths: PathTable,
    path_bucket: BucketWidth,
    live: LiveTotals,
}

impl Aggregator {
    /// A new run that started at `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            start_ns,
            processes: BTreeMap::new(),
            next_id: 0,
            held: HashMap::new(),
            stacks: StackTable::default(),
            paths: PathTable::default(),
            path_bucket: BucketWidth::default(),
            live: LiveTotals::default(),
        }
    }

    /// `ts_ns` relative to the run start (0 for earlier timestamps).
    fn relative(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.start_ns)
    }

    fn state(&self, id: ProcessId) -> Option<&ProcessState> {
        self.processes.get(&id)
    }

    fn state_mut(&mut self, id: ProcessId) -> Option<&mut ProcessState> {
        self.processes.get_mut(&id)
    }

    /// The next id to hand out.
    fn next_id(&self) -> ProcessId {
        ProcessId(self.next_id)
    }

    /// Enters `state` under the next id and returns that id.
    fn push(&mut self, state: ProcessState) -> ProcessId {
        let id = self.next_id();
        self.processes.insert(id, state);
        self.next_id = self.next_id.saturating_add(1);
        id
    }

    /// The start time (ns since boot, as the image's process entered the
    /// trace with) of image `id`, while it is known.
    pub fn start_time_ns(&self, id: ProcessId) -> Option<u64> {
        self.state(id).map(|s| s.start_time_ns)
    }

    /// A process entered the trace; returns its id (ids are handed out in
    /// call order, so a replay in the same order gets the same ids). Its
    /// first RSS reading is `p.counters` at `p.ts_ns`.
    pub fn process_started(&mut self, p: ProcessStart) -> ProcessId {
        let parent_tgid = p
            .parent
            .and_then(|parent| self.state(parent))
            .map(|s| s.tgid);
        let id = self.push(ProcessState::new(&p, parent_tgid));
        self.live.processes += 1;
        self.live.peak_processes = self.live.peak_processes.max(self.live.processes);
        self.counters(id, p.ts_ns, &p.counters, p.sharing);
        id
    }

    /// Image `id` exec'd at `ts_ns`: it ends with `counters` (its last
    /// values); a new image of the same process starts with the command line
    /// `cmdline` and zero RSS. Returns the new image's id (`id` itself when
    /// it is unknown or already ended).
    pub fn process_exec(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        cmdline: String,
    ) -> ProcessId {
        let next_id = self.next_id();
        let Some(state) = self.state(id).filter(|s| s.is_open()) else {
            return id;
        };
        let next = state.next(id, ts_ns, cmdline);
        self.counters(id, ts_ns, counters, None);
        let (rss, pss) = self
            .state(id)
            .map_or((0, 0), |s| (s.rss_now_bytes(), s.pss_now_bytes()));
        if let Some(state) = self.state_mut(id) {
            state.exec_ns = Some(ts_ns);
            state.next_image = Some(next_id);
        }
        self.push(next);
        self.live.rss_bytes = self.live.rss_bytes.saturating_sub(rss);
        self.live.pss_bytes = self.live.pss_bytes.saturating_sub(pss);
        let start = ProcessCounters {
            rss_known: memtrace_common::RSS_ALL_KNOWN,
            ..ProcessCounters::default()
        };
        self.counters(next_id, ts_ns, &start, None);
        next_id
    }

    /// Image `id` began to exit at `ts_ns` (`by` says how): its numbers end
    /// with `counters`; later readings and samples of it are ignored.
    pub fn exit_began(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        by: ExitBegin,
        counters: &ProcessCounters,
    ) {
        if !self.state(id).is_some_and(ProcessState::is_open) {
            return;
        }
        self.counters(id, ts_ns, counters, None);
        let (rss, pss) = self
            .state(id)
            .map_or((0, 0), |s| (s.rss_now_bytes(), s.pss_now_bytes()));
        if let Some(state) = self.state_mut(id) {
            state.exit_began_ns = Some(ts_ns);
            state.exit_began_by = Some(by);
        }
        self.live.processes = self.live.processes.saturating_sub(1);
        self.live.rss_bytes = self.live.rss_bytes.saturating_sub(rss);
        self.live.pss_bytes = self.live.pss_bytes.saturating_sub(pss);
    }

    /// Image `id` is gone (its exit record at `ts_ns`, with its exit status
    /// and final counters). When its exit had not begun before, it begins
    /// now, with these counters (a fatal signal; the kernel's teardown
    /// comes after them), or with its latest counters when the exit record
    /// was lost (`None`).
    pub fn process_exited(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        status: Option<ExitStatus>,
        counters: Option<&ProcessCounters>,
    ) {
        let last = self.state(id).and_then(ProcessState::latest_counters);
        if let Some(counters) = counters.copied().or(last) {
            self.exit_began(id, ts_ns, ExitBegin::Exit, &counters);
        }
        if let Some(state) = self.state_mut(id) {
            if state.exited_ns.is_none() {
                state.exited_ns = Some(ts_ns);
                state.exit_status = status;
            }
        }
    }

    /// Whether Python stacks can be read in image `id` (latest call wins).
    pub fn python_status(&mut self, id: ProcessId, status: PythonStatus) {
        if let Some(state) = self.state_mut(id) {
            state.python = Some(status);
        }
    }

    /// A read of image `id`'s exact counters at `ts_ns` (and of its PSS and
    /// USS, when read with them): appends an RSS point when any of
    /// file/anon/shmem RSS is known. Ignored once the image has ended.
    pub fn counters(
        &mut self,
        id: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        sharing: Option<Sharing>,
    ) {
        let t_ns = self.relative(ts_ns);
        let Some(state) = self.processes.get_mut(&id).filter(|s| s.is_open()) else {
            return;
        };
        let (rss_before, pss_before) = (state.rss_now_bytes(), state.pss_now_bytes());
        state.read(t_ns, counters, sharing);
        let (rss_after, pss_after) = (state.rss_now_bytes(), state.pss_now_bytes());
        let live = &mut self.live;
        live.rss_bytes = live
            .rss_bytes
            .saturating_sub(rss_before)
            .saturating_add(rss_after);
        live.peak_rss_bytes = live.peak_rss_bytes.max(live.rss_bytes);
        live.pss_bytes = live
            .pss_bytes
            .saturating_sub(pss_before)
            .saturating_add(pss_after);
        live.peak_pss_bytes = live.peak_pss_bytes.max(live.pss_bytes);
    }

    /// The id of `frames` (outermost first), interned on first sight (ids are
    /// handed out in first-seen order; see [`Aggregator::stack_frames`]).
    pub fn intern(&mut self, frames: Vec<Frame>) -> StackId {
        self.stacks.intern(frames)
    }

    /// Frames of the stack [`Aggregator::intern`] returned `id` for,
    /// outermost first; empty for an id it never returned.
    pub fn stack_frames(&self, id: StackId) -> &[Frame] {
        self.stacks.frames(id)
    }

    /// Sampled bytes of image `id` with `stack` at `ts_ns`: the single way
    /// sampled bytes and held changes enter (live through the recorder,
    /// capture replays directly). Added to the path's totals and to its time
    /// bucket; the bucket width doubles first if `ts_ns` lies beyond
    /// [`MAX_PATH_BUCKETS`] buckets. Ignored for an image that has ended (the
    /// interpreter's finalization is not the program's growth).
    pub fn path_delta(&mut self, id: ProcessId, ts_ns: u64, stack: StackId, bytes: SampledBytes) {
        if !self.state(id).is_some_and(ProcessState::is_open) {
            return;
        }
        let t_ns = self.relative(ts_ns);
        self.fit_path_buckets(t_ns);
        self.paths.add(id, stack, self.path_bucket, t_ns, &bytes);
    }

    /// Sets the bytes `stack` held in image `id` when the image's RSS was at
    /// its high-water mark (from `crate::held`, latest call wins; accepted
    /// after the image ended, when its final values come).
    pub fn peak_held(&mut self, id: ProcessId, stack: StackId, held_at_peak_bytes: u64) {
        if self.state(id).is_some() {
            self.paths.set_peak_held(id, stack, held_at_peak_bytes);
        }
    }

    /// Sets what the held-page map says about image `id` (latest call wins).
    pub fn held_state(&mut self, id: ProcessId, state: HeldState) {
        self.held.insert(id, state);
    }

    /// Widens the path buckets (merging neighbours in every path) until
    /// `t_ns` since the run start falls within [`MAX_PATH_BUCKETS`] buckets.
    fn fit_path_buckets(&mut self, t_ns: u64) {
        let doublings = self.path_bucket.doublings_to_fit(t_ns);
        if doublings == 0 {
            return;
        }
        self.path_bucket = self.path_bucket.doubled(doublings);
        self.paths.rebucket(self.path_bucket);
    }

    /// What the live view shows now: open images with their latest RSS, and
    /// the `top` paths holding the most memory so far.
    pub fn live_snapshot(&self, top: usize) -> LiveSnapshot {
        let kinds = snapshot::kinds(&self.kind_facts());
        let processes = self
            .processes
            .iter()
            .zip(kinds)
            .filter(|((_, state), _)| state.is_open())
            .map(|((&id, state), kind)| LiveProcess {
                id,
                tgid: state.tgid,
                kind,
                label: short_command(&state.cmdline, LIVE_COMMAND_CHARS),
                rss_bytes: state.rss_now_bytes(),
            })
            .collect();
        let held = self.paths.held_by_stack();
        let stacks = held
            .into_iter()
            .map(|(stack, held_bytes)| (self.stacks.frames(stack), held_bytes));
        LiveSnapshot {
            processes,
            top_paths: LiveSnapshot::top_paths(stacks, top),
        }
    }

    /// What telling each image's kind needs, in row order.
    fn kind_facts(&self) -> Vec<snapshot::KindFacts<'_>> {
        self.processes
            .iter()
            .map(|(&id, state)| snapshot::KindFacts {
                id,
                tgid: state.tgid,
                parent: state.parent,
                parent_tgid: state.parent_tgid,
                role: state.role,
                image: state.image,
                exec_after_ns: state.exec_ns.map(|ns| ns.saturating_sub(state.started_ns)),
                python: state.python.as_ref(),
            })
            .collect()
    }

    /// Ends the run at `end_ns` and builds the report.
    pub fn finish(mut self, end_ns: u64, meta: RunMeta) -> Report {
        self.fit_path_buckets(self.relative(end_ns));
        self.report_now(end_ns, meta)
    }

    /// The report of the run so far, as if it ended at `end_ns` (see
    /// [`Aggregator::finish`]); tracing goes on.
    fn build_report(&self, end_ns: u64, meta: RunMeta) -> Report {
        let processes = self.process_reports(end_ns);
        let paths = self.paths.path_reports(&self.stacks);
        let warnings = self.warnings(&meta, &processes);
        let totals = self.totals(&processes);
        let growth_stacks = self.paths.stack_reports(&self.stacks);
        Report {
            meta,
            totals,
            processes,
            stacks: self.stacks.to_vecs(),
            paths,
            growth_stacks,
            warnings,
            path_bucket_ns: self.path_bucket.ns(),
        }
    }
}

/// Report building, by [`Aggregator::finish`] and [`Aggregator::report_now`].
impl Aggregator {
    /// One report per image, sorted by RSS growth descending (images
    /// without RSS last), ties by id.
    fn process_reports(&self, end_ns: u64) -> Vec<ProcessReport> {
        let sampled = self.paths.by_process();
        let instances = self.instances();
        let mut reports: Vec<ProcessReport> = self
            .processes
            .iter()
            .map(|(&id, state)| {
                let (bytes, peak_held) = sampled.get(&id).copied().unwrap_or_default();
                let instance = instances.get(&(state.tgid, state.start_time_ns)).copied();
                state.report(
                    id,
                    instance.unwrap_or(1),
                    (self.start_ns, end_ns),
                    bytes,
                    peak_held,
                )
            })
            .collect();
        snapshot::assign_kinds(&mut reports);
        reports.sort_by_key(|p| {
            let growth = p.rss.map_or(i64::MIN, |rss| rss.growth_bytes);
            (Reverse(growth), p.id)
        });
        reports
    }

    /// Instance number of each process `(tgid, start time)`: 1 for the
    /// first with its tgid (by start time), 2 for the next, ...
    fn instances(&self) -> HashMap<(u32, u64), u32> {
        let mut keys: Vec<(u32, u64)> = self
            .processes
            .values()
            .map(|s| (s.tgid, s.start_time_ns))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut instances = HashMap::with_capacity(keys.len());
        let mut previous_tgid = None;
        let mut instance = 0;
        for key in keys {
            instance = if previous_tgid == Some(key.0) {
                instance + 1
            } else {
                1
            };
            previous_tgid = Some(key.0);
            instances.insert(key, instance);
        }
        instances
    }

    /// Caveats: lost records first, then per-image gaps, then stacks with
    /// unknown frames (by reason).
    fn warnings(&self, meta: &RunMeta, processes: &[ProcessReport]) -> Vec<Warning> {
        let mut warnings = Vec::new();
        if meta.dropped_records > 0 {
            warnings.push(Warning::DroppedRecords {
                records: meta.dropped_records,
            });
        }
        if meta.decode_errors > 0 {
            warnings.push(Warning::DecodeErrors {
                records: meta.decode_errors,
            });
        }
        for caveat in &meta.exit_point_caveats {
            warnings.push(Warning::ExitPoint {
                caveat: caveat.clone(),
            });
        }
        for p in processes {
            warnings.extend(self.process_warnings(p));
        }
        warnings.extend(self.paths.incomplete_stack_warnings(&self.stacks));
        warnings
    }

    /// The warnings about one image.
    fn process_warnings(&self, p: &ProcessReport) -> Vec<Warning> {
        let (process, tgid, name) = (p.id, p.tgid, p.name());
        let mut warnings = Vec::new();
        if let Some(reason) = p.python.as_ref().and_then(PythonStatus::missing_reason) {
            warnings.push(Warning::NoPythonStacks {
                process,
                tgid,
                name: name.clone(),
                cmdline: p.cmdline.clone(),
                reason,
            });
        }
        if p.rss.is_none() {
            warnings.push(Warning::NoRssReadings {
                process,
                tgid,
                name: name.clone(),
            });
        }
        let held = self.held.get(&process).copied().unwrap_or_default();
        if held.coarsening_level > 0 {
            warnings.push(Warning::HeldMapCoarsened {
                process,
                tgid,
                name: name.clone(),
                level: held.coarsening_level,
            });
        }
        if held.unplaced_bytes > 0 {
            warnings.push(Warning::UnplacedGrowth {
                process,
                tgid,
                name,
                bytes: held.unplaced_bytes,
            });
        }
        warnings
    }

    fn totals(&self, processes: &[ProcessReport]) -> Totals {
        let mut totals = Totals {
            peak_live_processes: self.live.peak_processes,
            peak_total_rss_bytes: self.live.peak_rss_bytes,
            live_rss_end_bytes: self.live.rss_bytes,
            live_pss_end_bytes: self.live.pss_bytes,
            peak_total_pss_bytes: self.live.peak_pss_bytes,
            distinct_stacks: u64::try_from(self.stacks.len()).unwrap_or(u64::MAX),
            ..Totals::default()
        };
        for p in processes {
            totals.processes += 1;
            if p.role.is_root() {
                totals.roots += 1;
            } else if p.role == Role::Worker {
                totals.workers += 1;
            }
            if let Some(c) = &p.counters {
                totals.anon_growth_bytes =
                    totals.anon_growth_bytes.saturating_add(c.anon_growth_bytes);
                totals.file_growth_bytes =
                    totals.file_growth_bytes.saturating_add(c.file_growth_bytes);
                totals.cow_fault_bytes = totals.cow_fault_bytes.saturating_add(c.cow_fault_bytes);
            }
            totals.sampled.merge(&p.sampled);
            totals.peak_held_bytes = totals.peak_held_bytes.saturating_add(p.peak_held_bytes);
        }
        totals
    }
}
