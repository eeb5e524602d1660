//! Aggregation step of the data flow: process-tree events, periodic counter
//! reads and symbolized memory samples in; one immutable [`Report`] out.
//!
//! Pure data: nothing here touches BPF or /proc, so it is driven by synthetic
//! inputs in tests (memray's aggregator tests are the model). Per process it
//! keeps an RSS timeline and the latest exact counters; per (process, stack)
//! it sums sampled bytes by kind of event, overall and per time bucket, and
//! at the end merges those sums per stack across processes (a leak repeated
//! in every worker of a pre-fork service). Stacks are interned ([`StackId`]).

mod buckets;
mod snapshot;
mod stacks;
#[cfg(test)]
pub(crate) mod test_support;
mod timeline;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use memtrace_common::{MemoryEvent, ProcessCounters};
use serde::{Deserialize, Serialize};

pub use buckets::{PathPoint, INITIAL_PATH_BUCKET_NS, MAX_PATH_BUCKETS};
pub use snapshot::{
    ExactCounters, PathReport, ProcessReport, Report, RssSummary, RunMeta, SampledBytes,
    StackGrowthReport, Totals, Warning,
};
pub use stacks::StackId;
pub use timeline::{RssPoint, MAX_TIMELINE_POINTS};

use crate::python::PyLocation;
use buckets::{BucketWidth, PathTimeline};
pub(crate) use stacks::StackTable;
use timeline::Timeline;

/// One frame of a call stack after symbolization. JSON form:
/// `{"kind": "python", "function": .., "file": .., "line": ..}`,
/// `{"kind": "native", "symbol": ..}` or `{"kind": "unknown", "reason": ..}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Frame {
    /// A Python function at the line being executed.
    Python {
        /// Qualified function name.
        function: String,
        /// Source file as the code object names it.
        file: String,
        /// Line number (1-based).
        line: u32,
    },
    /// A native instruction, symbolized.
    Native {
        /// Symbol name (or module+offset when no symbol was found).
        symbol: String,
    },
    /// A frame that could not be read or was cut off.
    Unknown {
        /// Why, e.g. "stack truncated".
        reason: String,
    },
}

impl fmt::Display for Frame {
    /// `function (file:line)`, `symbol`, or `[reason]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Python {
                function,
                file,
                line,
            } => write!(f, "{function} ({file}:{line})"),
            Self::Native { symbol } => f.write_str(symbol),
            Self::Unknown { reason } => write!(f, "[{reason}]"),
        }
    }
}

impl From<PyLocation> for Frame {
    /// The Python frame at `location`.
    fn from(location: PyLocation) -> Self {
        Self::Python {
            function: location.function,
            file: location.file,
            line: location.line,
        }
    }
}

/// Sort key of the ranked lists of a report: `bytes` descending, then tgid
/// ascending (`None` for lists merged over processes), then frames.
fn rank_key(
    bytes: u64,
    tgid: Option<u32>,
    frames: &[Frame],
) -> (Reverse<u64>, Option<u32>, &[Frame]) {
    (Reverse(bytes), tgid, frames)
}

/// Why a process is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A process memtrace was asked to trace.
    Root,
    /// A forked descendant of a traced process.
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Root => "root",
            Self::Worker => "worker",
        })
    }
}

/// Whether Python stacks can be read in a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PythonStatus {
    /// A supported CPython; stacks are read.
    Python {
        /// Interpreter version, e.g. "3.12.1".
        version: String,
    },
    /// No Python interpreter in the process.
    NotPython,
    /// Python, but its stacks cannot be read.
    Unsupported {
        /// Why, e.g. "Python 3.10 is not supported".
        reason: String,
    },
}

impl PythonStatus {
    /// Why there are no Python stacks; `None` for a supported interpreter.
    pub fn missing_reason(&self) -> Option<String> {
        match self {
            Self::Python { .. } => None,
            Self::NotPython => Some("not a Python process".to_owned()),
            Self::Unsupported { reason } => Some(reason.clone()),
        }
    }
}

/// A process entered the trace (also a line of a capture file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStart {
    /// Its tgid.
    pub tgid: u32,
    /// Its parent's tgid, when known.
    pub parent_tgid: Option<u32>,
    /// Root or worker.
    pub role: Role,
    /// Its command line.
    pub cmdline: String,
    /// When (CLOCK_MONOTONIC ns, the clock of the records).
    pub ts_ns: u64,
}

/// One sampled memory event with its symbolized stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// Process that caused it.
    pub tgid: u32,
    /// When (CLOCK_MONOTONIC ns).
    pub ts_ns: u64,
    /// What happened.
    pub event: MemoryEvent,
    /// Sampling weight, in bytes: what this sample stands for.
    pub weight_bytes: u64,
    /// Call stack, outermost first; the native frame last.
    pub stack: Vec<Frame>,
}

/// State of one process during the run.
#[derive(Debug)]
struct ProcessState {
    parent_tgid: Option<u32>,
    role: Role,
    cmdline: String,
    python: Option<PythonStatus>,
    started_ns: u64,
    exited_ns: Option<u64>,
    first_rss: Option<RssPoint>,
    last_rss: Option<RssPoint>,
    peak_rss_bytes: u64,
    timeline: Timeline,
    counters: Option<ProcessCounters>,
}

impl ProcessState {
    fn new(parent_tgid: Option<u32>, role: Role, cmdline: String, started_ns: u64) -> Self {
        Self {
            parent_tgid,
            role,
            cmdline,
            python: None,
            started_ns,
            exited_ns: None,
            first_rss: None,
            last_rss: None,
            peak_rss_bytes: 0,
            timeline: Timeline::default(),
            counters: None,
        }
    }

    fn is_live(&self) -> bool {
        self.exited_ns.is_none()
    }

    /// Latest RSS, 0 before the first reading.
    fn rss_now_bytes(&self) -> u64 {
        self.last_rss.map_or(0, |p| p.rss_bytes)
    }

    fn rss_summary(&self) -> Option<RssSummary> {
        let (first, last) = (self.first_rss?, self.last_rss?);
        let signed = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        Some(RssSummary {
            start_bytes: first.rss_bytes,
            end_bytes: last.rss_bytes,
            peak_bytes: self.peak_rss_bytes,
            growth_bytes: signed(last.rss_bytes).saturating_sub(signed(first.rss_bytes)),
        })
    }
}

/// Sampled bytes of one (process, stack) path: totals and per time bucket.
#[derive(Debug, Default)]
struct PathState {
    bytes: SampledBytes,
    timeline: PathTimeline,
}

/// `part / whole` as a fraction, 0 when `whole` is 0.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Accumulates one run. Feed it in record order; call [`Aggregator::finish`]
/// once at the end. Timestamps are CLOCK_MONOTONIC nanoseconds (the records'
/// clock); the report shows them relative to `start_ns`.
#[derive(Debug)]
pub struct Aggregator {
    start_ns: u64,
    processes: BTreeMap<u32, ProcessState>,
    stacks: StackTable,
    paths: HashMap<(u32, StackId), PathState>,
    path_bucket: BucketWidth,
    live_processes: u64,
    peak_live_processes: u64,
    live_rss_bytes: u64,
    peak_total_rss_bytes: u64,
}

impl Aggregator {
    /// A new run that started at `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            start_ns,
            processes: BTreeMap::new(),
            stacks: StackTable::default(),
            paths: HashMap::new(),
            path_bucket: BucketWidth::default(),
            live_processes: 0,
            peak_live_processes: 0,
            live_rss_bytes: 0,
            peak_total_rss_bytes: 0,
        }
    }

    /// `ts_ns` relative to the run start (0 for earlier timestamps).
    fn relative(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.start_ns)
    }

    /// The state of `tgid`, created as a worker with an unknown command line
    /// if the process was never announced (its data is kept when
    /// [`Aggregator::process_started`] arrives later).
    fn process_mut(&mut self, tgid: u32, ts_ns: u64) -> &mut ProcessState {
        if !self.processes.contains_key(&tgid) {
            self.count_live_start();
        }
        self.processes
            .entry(tgid)
            .or_insert_with(|| ProcessState::new(None, Role::Worker, String::new(), ts_ns))
    }

    /// One more live process.
    fn count_live_start(&mut self) {
        self.live_processes += 1;
        self.peak_live_processes = self.peak_live_processes.max(self.live_processes);
    }

    /// A process entered the trace (a root at attach, or a fork). A second
    /// start of a live tgid (its data arrived before its announcement)
    /// updates its identity and keeps its data. A start of a tgid that
    /// exited is a new process reusing the id: it is live again, with fresh
    /// RSS readings, high-water mark, timeline, counters and Python status
    /// (its sampled paths stay summed under the tgid).
    pub fn process_started(&mut self, p: ProcessStart) {
        if let Some(state) = self.processes.get_mut(&p.tgid).filter(|s| s.is_live()) {
            state.parent_tgid = p.parent_tgid;
            state.role = p.role;
            state.cmdline = p.cmdline;
            state.started_ns = state.started_ns.min(p.ts_ns);
            return;
        }
        // New, or replacing the exited process that had this tgid.
        let state = ProcessState::new(p.parent_tgid, p.role, p.cmdline, p.ts_ns);
        self.processes.insert(p.tgid, state);
        self.count_live_start();
    }

    /// A process called execve: its command line changes, and its RSS start,
    /// high-water mark and timeline restart (a new address space). Its Python
    /// status stays until the caller reports a new one with
    /// [`Aggregator::python_status`].
    pub fn process_exec(&mut self, tgid: u32, ts_ns: u64, cmdline: String) {
        let state = self.process_mut(tgid, ts_ns);
        state.cmdline = cmdline;
        // A new program in a new address space: its RSS story starts here.
        state.first_rss = None;
        state.peak_rss_bytes = 0;
        state.timeline = Timeline::default();
    }

    /// A process exited. Counters read after this still update its numbers,
    /// but it no longer counts toward the live RSS.
    pub fn process_exited(&mut self, tgid: u32, ts_ns: u64) {
        let state = self.process_mut(tgid, ts_ns);
        if state.exited_ns.is_some() {
            return;
        }
        state.exited_ns = Some(ts_ns);
        let rss_bytes = state.rss_now_bytes();
        self.live_processes = self.live_processes.saturating_sub(1);
        self.live_rss_bytes = self.live_rss_bytes.saturating_sub(rss_bytes);
    }

    /// Whether Python stacks can be read in `tgid` (latest call wins).
    pub fn python_status(&mut self, tgid: u32, status: PythonStatus) {
        let ts_ns = self.start_ns;
        self.process_mut(tgid, ts_ns).python = Some(status);
    }

    /// A read of `tgid`'s exact counters at `ts_ns` (periodic and final):
    /// keeps them as the latest, and appends an RSS point when any of
    /// file/anon/shmem RSS is known.
    pub fn counters(&mut self, tgid: u32, ts_ns: u64, c: &ProcessCounters) {
        let t_ns = self.relative(ts_ns);
        let state = self.process_mut(tgid, ts_ns);
        state.counters = Some(*c);
        state.peak_rss_bytes = state.peak_rss_bytes.max(c.rss_peak_bytes);
        let Some(point) = RssPoint::from_counters(t_ns, c) else {
            return;
        };
        let previous_bytes = state.rss_now_bytes();
        state.first_rss.get_or_insert(point);
        state.last_rss = Some(point);
        state.peak_rss_bytes = state.peak_rss_bytes.max(point.rss_bytes);
        state.timeline.push(point);
        if state.is_live() {
            self.live_rss_bytes = self
                .live_rss_bytes
                .saturating_sub(previous_bytes)
                .saturating_add(point.rss_bytes);
            self.peak_total_rss_bytes = self.peak_total_rss_bytes.max(self.live_rss_bytes);
        }
    }

    /// One sampled memory event: converted to [`SampledBytes`] and added
    /// with [`Aggregator::path_delta`].
    pub fn memory(&mut self, s: MemorySample) {
        let bytes = SampledBytes::from_event(s.event, s.weight_bytes);
        self.path_delta(s.tgid, s.ts_ns, s.stack, bytes);
    }

    /// Sampled bytes of `tgid` with `stack` (outermost frame first) at
    /// `ts_ns`: the single way sampled bytes enter (live samples through
    /// [`Aggregator::memory`], capture replays directly). Added to the path's
    /// totals and to its time bucket; the bucket width doubles first if
    /// `ts_ns` lies beyond [`MAX_PATH_BUCKETS`] buckets. A process never
    /// announced is created as a worker with an unknown command line.
    /// Returns the id `stack` is interned under (ids are handed out in
    /// first-seen order; see [`Aggregator::stack_frames`]).
    pub fn path_delta(
        &mut self,
        tgid: u32,
        ts_ns: u64,
        stack: Vec<Frame>,
        bytes: SampledBytes,
    ) -> StackId {
        let t_ns = self.relative(ts_ns);
        self.fit_path_buckets(t_ns);
        self.process_mut(tgid, ts_ns);
        let stack = self.stacks.intern(stack);
        let path = self.paths.entry((tgid, stack)).or_default();
        path.bytes.merge(&bytes);
        path.timeline.add(self.path_bucket, t_ns, &bytes);
        stack
    }

    /// Frames of the stack [`Aggregator::path_delta`] returned `id` for,
    /// outermost first; empty for an id it never returned.
    pub fn stack_frames(&self, id: StackId) -> &[Frame] {
        self.stacks.frames(id)
    }

    /// Widens the path buckets (merging neighbours in every path) until
    /// `t_ns` since the run start falls within [`MAX_PATH_BUCKETS`] buckets.
    fn fit_path_buckets(&mut self, t_ns: u64) {
        let doublings = self.path_bucket.doublings_to_fit(t_ns);
        if doublings == 0 {
            return;
        }
        self.path_bucket = self.path_bucket.doubled(doublings);
        for path in self.paths.values_mut() {
            path.timeline.rebucket(self.path_bucket);
        }
    }

    /// What the live view shows now: live processes with their latest RSS,
    /// and the `top` largest growth paths so far.
    pub fn live_snapshot(&self, top: usize) -> crate::live::LiveSnapshot {
        let processes = self
            .processes
            .iter()
            .filter(|(_, state)| state.is_live())
            .map(|(&tgid, state)| crate::live::LiveProcess {
                tgid,
                label: snapshot::process_label(&state.cmdline),
                rss_bytes: state.rss_now_bytes(),
            })
            .collect();
        // Summed per stack first, so the live view merges each distinct
        // stack once, however many processes it grew in.
        let mut growth_by_stack: HashMap<StackId, u64> = HashMap::new();
        for (&(_, stack), path) in &self.paths {
            if path.bytes.growth_bytes > 0 {
                let sum = growth_by_stack.entry(stack).or_default();
                *sum = sum.saturating_add(path.bytes.growth_bytes);
            }
        }
        let stacks = growth_by_stack
            .into_iter()
            .map(|(stack, growth_bytes)| (self.stacks.frames(stack), growth_bytes));
        crate::live::LiveSnapshot {
            processes,
            top_paths: crate::live::LiveSnapshot::top_paths(stacks, top),
        }
    }

    /// Ends the run at `end_ns` and builds the report (with an empty
    /// [`Report::diagnosis`]: the caller fills it).
    pub fn finish(mut self, end_ns: u64, meta: RunMeta) -> Report {
        self.fit_path_buckets(self.relative(end_ns));
        let sampled = self.sampled_by_process();
        let processes = self.process_reports(end_ns, &sampled);
        let paths = self.path_reports(&sampled);
        let warnings = self.warnings(&meta, &processes);
        let totals = self.totals(&processes);
        let growth_stacks = self.growth_stack_reports(totals.sampled.growth_bytes);
        Report {
            meta,
            totals,
            processes,
            stacks: self.stacks.to_vecs(),
            paths,
            growth_stacks,
            warnings,
            path_bucket_ns: self.path_bucket.ns(),
            diagnosis: Vec::new(),
        }
    }
}

/// Report building, called once by [`Aggregator::finish`].
impl Aggregator {
    /// Sampled totals per process: the sums of its paths.
    fn sampled_by_process(&self) -> HashMap<u32, SampledBytes> {
        let mut sampled: HashMap<u32, SampledBytes> = HashMap::new();
        for (&(tgid, _), path) in &self.paths {
            sampled.entry(tgid).or_default().merge(&path.bytes);
        }
        sampled
    }

    /// One report per process, sorted by RSS growth descending (processes
    /// without RSS last), ties by tgid. `sampled` holds each process's
    /// sampled totals.
    fn process_reports(
        &self,
        end_ns: u64,
        sampled: &HashMap<u32, SampledBytes>,
    ) -> Vec<ProcessReport> {
        let mut reports: Vec<ProcessReport> = self
            .processes
            .iter()
            .map(|(&tgid, state)| {
                let sampled = sampled.get(&tgid).copied().unwrap_or_default();
                self.process_report(tgid, state, sampled, end_ns)
            })
            .collect();
        reports.sort_by_key(|p| {
            let growth = p.rss.map_or(i64::MIN, |rss| rss.growth_bytes);
            (std::cmp::Reverse(growth), p.tgid)
        });
        reports
    }

    fn process_report(
        &self,
        tgid: u32,
        state: &ProcessState,
        sampled: SampledBytes,
        end_ns: u64,
    ) -> ProcessReport {
        let started_ns = self.relative(state.started_ns);
        let exited_ns = state.exited_ns.map(|ts| self.relative(ts));
        ProcessReport {
            tgid,
            parent_tgid: state.parent_tgid,
            role: state.role,
            cmdline: state.cmdline.clone(),
            python: state.python.clone(),
            started_ns,
            exited_ns,
            traced_ns: exited_ns
                .unwrap_or_else(|| self.relative(end_ns))
                .saturating_sub(started_ns),
            rss: state.rss_summary(),
            counters: state.counters.as_ref().map(ExactCounters::from),
            sampled,
            timeline: state.timeline.clone().into_points(),
        }
    }

    /// Every (process, stack) path, sorted by growth descending, ties by tgid
    /// then frames; shares are of the process's totals in `sampled`.
    fn path_reports(&self, sampled: &HashMap<u32, SampledBytes>) -> Vec<PathReport> {
        let mut paths: Vec<PathReport> = self
            .paths
            .iter()
            .map(|(&(tgid, stack), path)| {
                let process = sampled.get(&tgid).copied().unwrap_or_default();
                let bytes = path.bytes;
                PathReport {
                    tgid,
                    stack,
                    bytes,
                    growth_share: share(bytes.growth_bytes, process.growth_bytes),
                    cow_share: share(bytes.cow_bytes, process.cow_bytes),
                    timeline: path.timeline.points().to_vec(),
                }
            })
            .collect();
        paths.sort_by_key(|p| {
            rank_key(
                p.bytes.growth_bytes,
                Some(p.tgid),
                self.stacks.frames(p.stack),
            )
        });
        paths
    }

    /// Every stack with sampled growth, its bytes summed over processes and
    /// its growth as a share of `all_growth_bytes`; sorted by growth
    /// descending, ties by frames.
    fn growth_stack_reports(&self, all_growth_bytes: u64) -> Vec<StackGrowthReport> {
        let mut merged: HashMap<StackId, (SampledBytes, BTreeSet<u32>)> = HashMap::new();
        for (&(tgid, stack), path) in &self.paths {
            let (sum, tgids) = merged.entry(stack).or_default();
            sum.merge(&path.bytes);
            if path.bytes.growth_bytes > 0 {
                tgids.insert(tgid);
            }
        }
        let mut stacks: Vec<StackGrowthReport> = merged
            .into_iter()
            .filter(|(_, (bytes, _))| bytes.growth_bytes > 0)
            .map(|(stack, (bytes, tgids))| StackGrowthReport {
                stack,
                bytes,
                growth_share: share(bytes.growth_bytes, all_growth_bytes),
                tgids: tgids.into_iter().collect(),
            })
            .collect();
        stacks.sort_by_key(|s| rank_key(s.bytes.growth_bytes, None, self.stacks.frames(s.stack)));
        stacks
    }

    /// Caveats: lost records first, then per-process gaps, then stacks with
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
        for p in processes {
            if let Some(reason) = p.python.as_ref().and_then(PythonStatus::missing_reason) {
                warnings.push(Warning::NoPythonStacks {
                    tgid: p.tgid,
                    cmdline: p.cmdline.clone(),
                    reason,
                });
            }
            if p.rss.is_none() {
                warnings.push(Warning::NoRssReadings { tgid: p.tgid });
            }
        }
        warnings.extend(self.incomplete_stack_warnings());
        warnings
    }

    /// One warning per unknown-frame reason, with the samples whose stack
    /// carries it, in reason order.
    fn incomplete_stack_warnings(&self) -> Vec<Warning> {
        let mut samples_by_reason: BTreeMap<&str, u64> = BTreeMap::new();
        for (&(_, stack), path) in &self.paths {
            for frame in self.stacks.frames(stack) {
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

    fn totals(&self, processes: &[ProcessReport]) -> Totals {
        let mut totals = Totals {
            peak_live_processes: self.peak_live_processes,
            peak_total_rss_bytes: self.peak_total_rss_bytes,
            live_rss_end_bytes: self.live_rss_bytes,
            distinct_stacks: u64::try_from(self.stacks.len()).unwrap_or(u64::MAX),
            ..Totals::default()
        };
        for p in processes {
            totals.processes += 1;
            match p.role {
                Role::Root => totals.roots += 1,
                Role::Worker => totals.workers += 1,
            }
            if let Some(c) = &p.counters {
                totals.anon_growth_bytes =
                    totals.anon_growth_bytes.saturating_add(c.anon_growth_bytes);
                totals.cow_fault_bytes = totals.cow_fault_bytes.saturating_add(c.cow_fault_bytes);
            }
            totals.sampled.merge(&p.sampled);
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{
        leak_stack, meta, native, parse_stack, prefork_aggregator, rss, sample, start, MIB,
    };
    use super::*;

    /// RSS summed over the live processes, as the live view sees it.
    fn live_rss(agg: &Aggregator) -> u64 {
        agg.live_snapshot(0)
            .processes
            .iter()
            .map(|p| p.rss_bytes)
            .sum()
    }

    /// A frame of `app.py`.
    fn py(function: &str, line: u32) -> Frame {
        test_support::py(function, "app.py", line)
    }

    #[test]
    fn weights_are_summed_per_path_by_kind_of_event() {
        let mut agg = Aggregator::new(0);
        agg.process_started(start(1, None, Role::Root, 0));
        let stack = [py("main", 1), py("grow", 9), native("malloc")];
        agg.memory(sample(1, MemoryEvent::AnonGrowth, 3 * MIB, &stack));
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &stack));
        agg.memory(sample(1, MemoryEvent::CowFault, 4096, &stack));
        agg.memory(sample(1, MemoryEvent::Mmap, 100, &stack));
        agg.memory(sample(1, MemoryEvent::MremapGrow, 10, &stack));
        agg.memory(sample(1, MemoryEvent::BrkGrow, 1, &stack));
        agg.memory(sample(1, MemoryEvent::Munmap, 1000, &stack));
        agg.memory(sample(1, MemoryEvent::MremapShrink, 200, &stack));
        agg.memory(sample(1, MemoryEvent::BrkShrink, 30, &stack));
        agg.memory(sample(1, MemoryEvent::MadviseFree, 4, &stack));
        let report = agg.finish(100, meta());
        assert_eq!(report.paths.len(), 1);
        let expected = SampledBytes {
            growth_bytes: 4 * MIB,
            cow_bytes: 4096,
            mapped_bytes: 111,
            unmapped_bytes: 1234,
            samples: 10,
        };
        assert_eq!(report.paths[0].bytes, expected);
        assert_eq!(report.frames(report.paths[0].stack), &stack);
        assert_eq!(report.processes[0].sampled, expected);
        assert_eq!(report.totals.sampled, expected);
        assert_eq!(report.paths[0].growth_share, 1.0);
    }

    #[test]
    fn path_deltas_sum_totals_and_fill_time_buckets() {
        let second = INITIAL_PATH_BUCKET_NS;
        let mut agg = Aggregator::new(1_000);
        agg.process_started(start(1, None, Role::Root, 1_000));
        let stack = vec![py("main", 1), native("malloc")];
        let growth = SampledBytes::from_event(MemoryEvent::AnonGrowth, MIB);
        let cow = SampledBytes::from_event(MemoryEvent::CowFault, 4096);
        agg.path_delta(1, 1_000 + 10, stack.clone(), growth);
        agg.path_delta(1, 1_000 + second / 2, stack.clone(), cow);
        agg.path_delta(1, 1_000 + 3 * second, stack.clone(), growth);
        // Before the run start: counted in the first bucket.
        agg.path_delta(1, 0, stack.clone(), growth);
        let report = agg.finish(1_000 + 4 * second, meta());
        assert_eq!(report.path_bucket_ns, second);
        assert!(report.diagnosis.is_empty());
        let path = &report.paths[0];
        assert_eq!(path.bytes.growth_bytes, 3 * MIB);
        assert_eq!(path.bytes.samples, 4);
        assert_eq!(
            path.timeline,
            vec![
                PathPoint {
                    t_ns: 0,
                    growth_bytes: 2 * MIB,
                    cow_bytes: 4096,
                    unmapped_bytes: 0,
                },
                PathPoint {
                    t_ns: 3 * second,
                    growth_bytes: MIB,
                    ..PathPoint::default()
                },
            ]
        );
    }

    #[test]
    fn memory_samples_enter_as_path_deltas() {
        let stack = [py("main", 1), native("malloc")];
        let mut by_sample = Aggregator::new(0);
        let mut by_delta = Aggregator::new(0);
        for event in [
            MemoryEvent::AnonGrowth,
            MemoryEvent::Munmap,
            MemoryEvent::Mmap,
        ] {
            by_sample.memory(sample(1, event, 300, &stack));
            let bytes = SampledBytes::from_event(event, 300);
            by_delta.path_delta(1, 50, stack.to_vec(), bytes);
        }
        assert_eq!(by_sample.finish(10, meta()), by_delta.finish(10, meta()));
    }

    #[test]
    fn path_buckets_widen_so_the_run_fits_and_keep_every_byte() {
        let second = INITIAL_PATH_BUCKET_NS;
        let mut agg = Aggregator::new(0);
        let a = vec![py("a", 1)];
        let b = vec![py("b", 1)];
        // One sample per second for 10 minutes in `a`, every 7 s in `b`.
        for t in 0..600 {
            agg.path_delta(
                1,
                t * second,
                a.clone(),
                SampledBytes::from_event(MemoryEvent::AnonGrowth, 1),
            );
            if t % 7 == 0 {
                let bytes = SampledBytes::from_event(MemoryEvent::MadviseFree, 2);
                agg.path_delta(2, t * second + 1, b.clone(), bytes);
            }
        }
        // The run ends later than the last sample: it must fit too.
        let report = agg.finish(1_000 * second, meta());
        assert_eq!(report.path_bucket_ns, 16 * second);
        assert!(1_000 * second / report.path_bucket_ns < MAX_PATH_BUCKETS);
        for path in &report.paths {
            let width = report.path_bucket_ns;
            assert!(path.timeline.iter().all(|p| p.t_ns % width == 0));
            assert!(path.timeline.windows(2).all(|w| w[0].t_ns < w[1].t_ns));
            let growth: u64 = path.timeline.iter().map(|p| p.growth_bytes).sum();
            let unmapped: u64 = path.timeline.iter().map(|p| p.unmapped_bytes).sum();
            assert_eq!(growth, path.bytes.growth_bytes);
            assert_eq!(unmapped, path.bytes.unmapped_bytes);
        }
        let a_path = report.paths.iter().find(|p| p.tgid == 1).unwrap();
        assert_eq!(a_path.timeline.len(), 38); // ceil(600 / 16)
        assert_eq!(a_path.timeline[0].growth_bytes, 16);
        assert_eq!(a_path.timeline[37].growth_bytes, 600 - 37 * 16);
    }

    #[test]
    fn stacks_are_interned_once_across_processes() {
        let mut agg = Aggregator::new(0);
        let a = [py("main", 1), native("malloc")];
        let b = [py("main", 2), native("malloc")];
        for tgid in [1, 2] {
            agg.memory(sample(tgid, MemoryEvent::AnonGrowth, MIB, &a));
            agg.memory(sample(tgid, MemoryEvent::AnonGrowth, MIB, &a));
        }
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &b));
        let report = agg.finish(0, meta());
        assert_eq!(report.stacks, vec![a.to_vec(), b.to_vec()]);
        assert_eq!(report.totals.distinct_stacks, 2);
        assert_eq!(report.paths.len(), 3);
        let growth: Vec<(u32, StackId, u64)> = report
            .paths
            .iter()
            .map(|p| (p.tgid, p.stack, p.bytes.growth_bytes))
            .collect();
        assert_eq!(
            growth,
            vec![
                (1, StackId(0), 2 * MIB),
                (2, StackId(0), 2 * MIB),
                (1, StackId(1), MIB)
            ]
        );
        let shares: Vec<f64> = report.paths.iter().map(|p| p.growth_share).collect();
        assert_eq!(shares, vec![2.0 / 3.0, 1.0, 1.0 / 3.0]);
    }

    #[test]
    fn equal_growth_is_ordered_by_tgid_then_frames() {
        let mut agg = Aggregator::new(0);
        let z = [py("z", 1)];
        let a = [py("a", 1)];
        agg.memory(sample(2, MemoryEvent::AnonGrowth, MIB, &a));
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &z));
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &a));
        agg.memory(sample(3, MemoryEvent::AnonGrowth, 2 * MIB, &z));
        let report = agg.finish(0, meta());
        let order: Vec<(u32, &[Frame])> = report
            .paths
            .iter()
            .map(|p| (p.tgid, report.frames(p.stack)))
            .collect();
        assert_eq!(
            order,
            vec![(3, &z[..]), (1, &a[..]), (1, &z[..]), (2, &a[..])]
        );
    }

    #[test]
    fn growth_stacks_merge_one_stack_across_workers() {
        // The leak repeats in three workers; the transient path is bigger
        // than the leak in any one worker.
        let mut agg = prefork_aggregator();
        let leak = leak_stack();
        let transient = parse_stack("app/io.py");
        agg.memory(sample(102, MemoryEvent::CowFault, 4096, &leak));
        // A process where the leak stack only unmapped: summed, not listed.
        agg.memory(sample(104, MemoryEvent::Munmap, MIB, &leak));
        let report = agg.finish(5_000, meta());
        assert_eq!(report.paths[0].bytes.growth_bytes, 16 * MIB);
        let merged = report.top_growth_stacks(10);
        assert_eq!(merged.len(), 2);
        assert_eq!(report.frames(merged[0].stack), &leak);
        assert_eq!(merged[0].tgids, vec![101, 102, 103]);
        assert_eq!(
            merged[0].bytes,
            SampledBytes {
                growth_bytes: 30 * MIB,
                cow_bytes: 4096,
                unmapped_bytes: MIB,
                samples: 5,
                ..SampledBytes::default()
            }
        );
        assert_eq!(merged[0].growth_share, 30.0 / 46.0);
        assert_eq!(report.frames(merged[1].stack), &transient);
        assert_eq!(merged[1].tgids, vec![101]);
        assert_eq!(merged[1].bytes.growth_bytes, 16 * MIB);
        assert_eq!(merged[1].growth_share, 16.0 / 46.0);
        let shares: f64 = report.growth_stacks.iter().map(|s| s.growth_share).sum();
        assert!((shares - 1.0).abs() < 1e-12, "{shares}");
    }

    #[test]
    fn growth_stacks_skip_stacks_without_growth_and_order_ties_by_frames() {
        let mut agg = Aggregator::new(0);
        let z = [py("z", 1)];
        let a = [py("a", 1)];
        let b = [py("b", 1)];
        let cow_only = [py("cow", 1)];
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &z));
        agg.memory(sample(2, MemoryEvent::AnonGrowth, MIB, &a));
        agg.memory(sample(3, MemoryEvent::AnonGrowth, 3 * MIB, &b));
        agg.memory(sample(1, MemoryEvent::CowFault, 8 * MIB, &cow_only));
        let report = agg.finish(0, meta());
        let order: Vec<(&[Frame], u64)> = report
            .growth_stacks
            .iter()
            .map(|s| (report.frames(s.stack), s.bytes.growth_bytes))
            .collect();
        assert_eq!(order, vec![(&b[..], 3 * MIB), (&a[..], MIB), (&z[..], MIB)]);
        assert_eq!(report.top_growth_stacks(1).len(), 1);
        assert_eq!(report.top_growth_stacks(0).len(), 0);
        assert_eq!(report.top_growth_stacks(99).len(), 3);
    }

    #[test]
    fn growth_stacks_are_empty_without_sampled_growth() {
        let mut agg = Aggregator::new(0);
        agg.memory(sample(1, MemoryEvent::Mmap, MIB, &[py("f", 1)]));
        let report = agg.finish(0, meta());
        assert!(report.growth_stacks.is_empty());
        assert!(report.top_growth_stacks(5).is_empty());
    }

    #[test]
    fn rss_summary_and_timeline_come_from_counter_reads() {
        let mut agg = Aggregator::new(1_000);
        agg.process_started(start(7, None, Role::Root, 1_000));
        agg.counters(7, 1_100, &rss(10 * MIB, MIB));
        agg.counters(7, 1_200, &rss(40 * MIB, MIB));
        let mut last = rss(25 * MIB, MIB);
        last.rss_peak_bytes = 45 * MIB;
        last.anon_growth_bytes = 30 * MIB;
        last.cow_fault_bytes = 8192;
        agg.counters(7, 1_300, &last);
        let report = agg.finish(2_000, meta());
        let p = &report.processes[0];
        assert_eq!(
            p.rss,
            Some(RssSummary {
                start_bytes: 11 * MIB,
                end_bytes: 26 * MIB,
                peak_bytes: 45 * MIB,
                growth_bytes: 15 * 1024 * 1024,
            })
        );
        let times: Vec<u64> = p.timeline.iter().map(|pt| pt.t_ns).collect();
        assert_eq!(times, vec![100, 200, 300]);
        assert_eq!(p.timeline[1].anon_bytes, 40 * MIB);
        assert_eq!(p.timeline[1].file_bytes, MIB);
        let counters = p.counters.unwrap();
        assert_eq!(counters.anon_growth_bytes, 30 * MIB);
        assert_eq!(counters.cow_fault_bytes, 8192);
        assert_eq!(report.totals.anon_growth_bytes, 30 * MIB);
        assert_eq!(p.traced_ns, 1_000);
    }

    #[test]
    fn shrinking_process_has_negative_growth_and_sorts_last() {
        let mut agg = Aggregator::new(0);
        agg.process_started(start(1, None, Role::Root, 0));
        agg.process_started(start(2, Some(1), Role::Worker, 0));
        agg.process_started(start(3, Some(1), Role::Worker, 0));
        agg.process_started(start(4, Some(1), Role::Worker, 0));
        agg.counters(1, 1, &rss(50 * MIB, 0));
        agg.counters(1, 2, &rss(30 * MIB, 0));
        agg.counters(2, 1, &rss(10 * MIB, 0));
        agg.counters(2, 2, &rss(90 * MIB, 0));
        agg.counters(3, 1, &rss(10 * MIB, 0));
        let report = agg.finish(10, meta());
        let order: Vec<u32> = report.processes.iter().map(|p| p.tgid).collect();
        assert_eq!(order, vec![2, 3, 1, 4]);
        assert_eq!(
            report.processes[2].rss.unwrap().growth_bytes,
            -20 * 1024 * 1024
        );
        // Process 4 has no samples and no readings: present, empty, warned about.
        let silent = report.process(4).unwrap();
        assert_eq!(silent.rss, None);
        assert_eq!(silent.sampled, SampledBytes::default());
        assert!(silent.timeline.is_empty());
        assert_eq!(report.warnings, vec![Warning::NoRssReadings { tgid: 4 }]);
        assert_eq!((report.totals.roots, report.totals.workers), (1, 3));
    }

    #[test]
    fn exited_process_leaves_the_live_rss_but_keeps_its_numbers() {
        let mut agg = Aggregator::new(100);
        agg.process_started(start(1, None, Role::Root, 100));
        agg.process_started(start(2, Some(1), Role::Worker, 150));
        agg.counters(1, 200, &rss(10 * MIB, 0));
        agg.counters(2, 200, &rss(30 * MIB, 0));
        assert_eq!(live_rss(&agg), 40 * MIB);
        agg.counters(2, 300, &rss(50 * MIB, 0));
        assert_eq!(live_rss(&agg), 60 * MIB);
        agg.process_exited(2, 400);
        assert_eq!(live_rss(&agg), 10 * MIB);
        // A final read after the exit updates the process, not the live sum.
        agg.counters(2, 410, &rss(5 * MIB, 0));
        assert_eq!(live_rss(&agg), 10 * MIB);
        let report = agg.finish(1_100, meta());
        let worker = report.process(2).unwrap();
        assert_eq!(worker.exited_ns, Some(300));
        assert_eq!(worker.started_ns, 50);
        assert_eq!(worker.traced_ns, 250);
        assert_eq!(worker.rss.unwrap().end_bytes, 5 * MIB);
        assert_eq!(worker.rss.unwrap().peak_bytes, 50 * MIB);
        assert_eq!(report.process(1).unwrap().exited_ns, None);
        assert_eq!(report.process(1).unwrap().traced_ns, 1_000);
        assert_eq!(report.totals.peak_total_rss_bytes, 60 * MIB);
        assert_eq!(report.totals.live_rss_end_bytes, 10 * MIB);
        assert_eq!(report.totals.peak_live_processes, 2);
    }

    #[test]
    fn reused_tgid_starts_a_fresh_live_process() {
        let mut agg = Aggregator::new(0);
        agg.process_started(start(1, None, Role::Root, 0));
        agg.process_started(start(2, Some(1), Role::Worker, 10));
        agg.python_status(2, PythonStatus::NotPython);
        agg.counters(1, 20, &rss(10 * MIB, 0));
        let mut old = rss(90 * MIB, 0);
        old.rss_peak_bytes = 95 * MIB;
        old.cow_fault_bytes = 8192;
        agg.counters(2, 20, &old);
        agg.process_exited(2, 30);
        assert_eq!(live_rss(&agg), 10 * MIB);
        // The kernel hands tgid 2 to a new fork of 1.
        agg.process_started(ProcessStart {
            cmdline: "new worker".to_owned(),
            ..start(2, Some(1), Role::Worker, 40)
        });
        agg.counters(2, 50, &rss(30 * MIB, 0));
        assert_eq!(live_rss(&agg), 40 * MIB);
        let report = agg.finish(100, meta());
        let worker = report.process(2).unwrap();
        assert_eq!(worker.cmdline, "new worker");
        assert_eq!(worker.exited_ns, None);
        assert_eq!((worker.started_ns, worker.traced_ns), (40, 60));
        assert_eq!(worker.python, None);
        assert_eq!(
            worker.rss,
            Some(RssSummary {
                start_bytes: 30 * MIB,
                end_bytes: 30 * MIB,
                peak_bytes: 30 * MIB,
                growth_bytes: 0,
            })
        );
        let times: Vec<u64> = worker.timeline.iter().map(|p| p.t_ns).collect();
        assert_eq!(times, vec![50]);
        assert_eq!(worker.counters.unwrap().cow_fault_bytes, 0);
        assert_eq!(report.totals.live_rss_end_bytes, 40 * MIB);
        assert_eq!(report.totals.peak_live_processes, 2);
        assert_eq!(report.totals.processes, 2);
    }

    #[test]
    fn unannounced_process_keeps_its_data_when_announced_later() {
        let mut agg = Aggregator::new(0);
        agg.memory(sample(9, MemoryEvent::AnonGrowth, MIB, &[py("f", 1)]));
        agg.process_started(start(9, Some(1), Role::Worker, 40));
        agg.process_exec(9, 60, "python3 other.py".to_owned());
        let report = agg.finish(100, meta());
        let p = report.process(9).unwrap();
        assert_eq!(p.cmdline, "python3 other.py");
        assert_eq!(p.parent_tgid, Some(1));
        assert_eq!(p.sampled.growth_bytes, MIB);
        assert_eq!(report.totals.processes, 1);
        assert_eq!(report.totals.peak_live_processes, 1);
    }

    #[test]
    fn warnings_name_drops_missing_python_and_incomplete_stacks() {
        let mut agg = Aggregator::new(0);
        agg.process_started(start(1, None, Role::Root, 0));
        agg.counters(1, 1, &rss(MIB, 0));
        agg.python_status(1, PythonStatus::NotPython);
        let truncated = Frame::Unknown {
            reason: "outer frames truncated".to_owned(),
        };
        let stack = [truncated, py("f", 1), native("malloc")];
        agg.memory(sample(1, MemoryEvent::AnonGrowth, MIB, &stack));
        agg.memory(sample(1, MemoryEvent::CowFault, 4096, &stack));
        let report = agg.finish(
            10,
            RunMeta {
                dropped_records: 5,
                decode_errors: 1,
                ..meta()
            },
        );
        assert_eq!(
            report.warnings,
            vec![
                Warning::DroppedRecords { records: 5 },
                Warning::DecodeErrors { records: 1 },
                Warning::NoPythonStacks {
                    tgid: 1,
                    cmdline: "proc 1".to_owned(),
                    reason: "not a Python process".to_owned(),
                },
                Warning::IncompleteStacks {
                    reason: "outer frames truncated".to_owned(),
                    samples: 2,
                },
            ]
        );
        assert_eq!(
            report.warnings[2].to_string(),
            "tgid 1 (`proc 1`): no Python stacks: not a Python process"
        );
    }

    #[test]
    fn frames_display_as_in_the_report() {
        assert_eq!(py("handle", 12).to_string(), "handle (app.py:12)");
        assert_eq!(native("PyList_Append").to_string(), "PyList_Append");
        let unknown = Frame::Unknown {
            reason: "no thread state".to_owned(),
        };
        assert_eq!(unknown.to_string(), "[no thread state]");
    }
}
