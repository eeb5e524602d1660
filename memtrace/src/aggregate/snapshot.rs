//! The result of the aggregation step: an immutable [`Report`], the sole
//! input of every reporter (terminal table, folded stacks, JSON). Plain data,
//! serde round-trippable.

use std::fmt;

use serde::{Deserialize, Serialize};

use memtrace_common::MemoryEvent;

use super::buckets::{PathPoint, INITIAL_PATH_BUCKET_NS};
use super::stacks::frames_of;
use super::{rank_key, Frame, PythonStatus, Role, RssPoint, StackId};
use crate::diagnose::Finding;

/// Facts about the run that the aggregator cannot see, given by the caller
/// to [`crate::aggregate::Aggregator::finish`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMeta {
    /// What was traced, as the user would recognise it (command line or
    /// `--pid` list).
    pub command: String,
    /// Wall time traced, in nanoseconds.
    pub duration_ns: u64,
    /// Ring-buffer records read.
    pub records: u64,
    /// Records the kernel side could not reserve in the full ring buffer.
    pub dropped_records: u64,
    /// Records that failed to decode and were skipped.
    pub decode_errors: u64,
    /// Sampling interval of memory events, in bytes (see
    /// `memtrace_common::MemoryRecord`).
    pub sample_interval_bytes: u64,
}

/// Exact per-process counters kept by the kernel side
/// (`memtrace_common::ProcessCounters`), latest read. All in bytes except the
/// two event counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactCounters {
    /// Sum of resident anonymous memory increases.
    pub anon_growth_bytes: u64,
    /// Sum of resident anonymous memory decreases.
    pub anon_release_bytes: u64,
    /// Copy-on-write write faults times the page size.
    pub cow_fault_bytes: u64,
    /// Mapped by `mmap`.
    pub mmap_bytes: u64,
    /// Unmapped by `munmap`.
    pub munmap_bytes: u64,
    /// Growth by `mremap`.
    pub mremap_grow_bytes: u64,
    /// Shrink by `mremap`.
    pub mremap_shrink_bytes: u64,
    /// Heap growth by `brk`.
    pub brk_grow_bytes: u64,
    /// Heap shrink by `brk`.
    pub brk_shrink_bytes: u64,
    /// Given back by `madvise(MADV_DONTNEED | MADV_FREE)`.
    pub madvise_free_bytes: u64,
    /// User page faults seen.
    pub page_faults: u64,
    /// Address-space syscalls seen.
    pub syscalls: u64,
}

impl From<&memtrace_common::ProcessCounters> for ExactCounters {
    fn from(c: &memtrace_common::ProcessCounters) -> Self {
        Self {
            anon_growth_bytes: c.anon_growth_bytes,
            anon_release_bytes: c.anon_release_bytes,
            cow_fault_bytes: c.cow_fault_bytes,
            mmap_bytes: c.mmap_bytes,
            munmap_bytes: c.munmap_bytes,
            mremap_grow_bytes: c.mremap_grow_bytes,
            mremap_shrink_bytes: c.mremap_shrink_bytes,
            brk_grow_bytes: c.brk_grow_bytes,
            brk_shrink_bytes: c.brk_shrink_bytes,
            madvise_free_bytes: c.madvise_free_bytes,
            page_faults: c.page_faults,
            syscalls: c.syscalls,
        }
    }
}

/// Sampled byte totals of memory events: estimates (sums of
/// `weight_bytes`), per stack or per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledBytes {
    /// Resident anonymous growth (`AnonGrowth`).
    pub growth_bytes: u64,
    /// Copy-on-write un-sharing (`CowFault`).
    pub cow_bytes: u64,
    /// Address space added (`Mmap`, `MremapGrow`, `BrkGrow`).
    pub mapped_bytes: u64,
    /// Address space removed or given back (`Munmap`, `MremapShrink`,
    /// `BrkShrink`, `MadviseFree`).
    pub unmapped_bytes: u64,
    /// Samples summed.
    pub samples: u64,
}

impl SampledBytes {
    /// One sample: `weight_bytes` in the total its `event` belongs to, and
    /// a sample count of 1.
    pub fn from_event(event: MemoryEvent, weight_bytes: u64) -> Self {
        let mut bytes = Self {
            samples: 1,
            ..Self::default()
        };
        let slot = match event {
            MemoryEvent::AnonGrowth => &mut bytes.growth_bytes,
            MemoryEvent::CowFault => &mut bytes.cow_bytes,
            MemoryEvent::Mmap | MemoryEvent::MremapGrow | MemoryEvent::BrkGrow => {
                &mut bytes.mapped_bytes
            }
            MemoryEvent::Munmap
            | MemoryEvent::MremapShrink
            | MemoryEvent::BrkShrink
            | MemoryEvent::MadviseFree => &mut bytes.unmapped_bytes,
        };
        *slot = weight_bytes;
        bytes
    }

    /// Sums `other` into these totals (saturating).
    pub fn merge(&mut self, other: &Self) {
        self.growth_bytes = self.growth_bytes.saturating_add(other.growth_bytes);
        self.cow_bytes = self.cow_bytes.saturating_add(other.cow_bytes);
        self.mapped_bytes = self.mapped_bytes.saturating_add(other.mapped_bytes);
        self.unmapped_bytes = self.unmapped_bytes.saturating_add(other.unmapped_bytes);
        self.samples = self.samples.saturating_add(other.samples);
    }
}

/// Resident-memory summary of one process, from its first and last counter
/// reads that carried RSS and its high-water mark (not from the downsampled
/// timeline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssSummary {
    /// RSS at the first reading.
    pub start_bytes: u64,
    /// RSS at the last reading.
    pub end_bytes: u64,
    /// High-water mark: the highest RSS read or the kernel's
    /// `rss_peak_bytes`, whichever is higher.
    pub peak_bytes: u64,
    /// `end_bytes - start_bytes` (negative when the process shrank).
    pub growth_bytes: i64,
}

/// One traced process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Process id (thread-group id).
    pub tgid: u32,
    /// tgid of the parent, when known.
    pub parent_tgid: Option<u32>,
    /// Traced on request or forked descendant.
    pub role: Role,
    /// Latest command line (after any exec).
    pub cmdline: String,
    /// Whether Python stacks could be read; `None` if never determined.
    pub python: Option<PythonStatus>,
    /// When the process started (or tracing of it began), in nanoseconds
    /// since the run start.
    pub started_ns: u64,
    /// When it exited, in nanoseconds since the run start; `None` if alive at
    /// the end.
    pub exited_ns: Option<u64>,
    /// How long it was traced: from `started_ns` to its exit or the end of
    /// the run, in nanoseconds.
    pub traced_ns: u64,
    /// RSS summary; `None` if no counters with RSS were ever read.
    pub rss: Option<RssSummary>,
    /// Latest exact counters; `None` if never read.
    pub counters: Option<ExactCounters>,
    /// Sampled totals over all stacks of this process.
    pub sampled: SampledBytes,
    /// RSS over time, oldest first, at most
    /// [`crate::aggregate::MAX_TIMELINE_POINTS`] points (each the highest
    /// reading of its time bucket).
    pub timeline: Vec<RssPoint>,
}

impl ProcessReport {
    /// Short name of the process for tables and folded stacks (see
    /// [`process_label`]).
    pub fn label(&self) -> String {
        process_label(&self.cmdline)
    }
}

/// Short name of a process: its command line with whitespace collapsed, cut
/// to 60 characters; `?` when empty.
pub(crate) fn process_label(cmdline: &str) -> String {
    const MAX_CHARS: usize = 60;
    let collapsed = cmdline.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "?".to_owned();
    }
    if collapsed.chars().count() <= MAX_CHARS {
        return collapsed;
    }
    let mut cut: String = collapsed.chars().take(MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// One growth path: the sampled bytes one stack caused in one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// Process the bytes belong to.
    pub tgid: u32,
    /// The call stack: index into [`Report::stacks`].
    pub stack: StackId,
    /// Sampled byte totals of this stack in this process.
    pub bytes: SampledBytes,
    /// `bytes.growth_bytes` as a fraction (0..=1) of the process's sampled
    /// growth; 0 when the process has none.
    pub growth_share: f64,
    /// `bytes.cow_bytes` as a fraction (0..=1) of the process's sampled
    /// copy-on-write bytes; 0 when the process has none.
    pub cow_share: f64,
    /// This path's sampled bytes per time bucket of
    /// [`Report::path_bucket_ns`], oldest first; buckets without growth,
    /// copy-on-write or unmapped bytes are left out. Absent in reports
    /// written before it existed (read back as empty).
    #[serde(default)]
    pub timeline: Vec<PathPoint>,
}

/// One call stack's sampled bytes summed over every process it ran in: the
/// merged view of a leak that a pre-fork service repeats in each worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackGrowthReport {
    /// The call stack: index into [`Report::stacks`].
    pub stack: StackId,
    /// Sampled byte totals of this stack, summed over all processes.
    pub bytes: SampledBytes,
    /// `bytes.growth_bytes` as a fraction (0..=1) of the sampled growth of
    /// all traced processes (`Totals::sampled.growth_bytes`); 0 when there
    /// is none.
    pub growth_share: f64,
    /// Processes in which this stack caused sampled growth, ascending.
    pub tgids: Vec<u32>,
}

/// Run-wide totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Processes seen.
    pub processes: u64,
    /// Processes traced on request.
    pub roots: u64,
    /// Forked descendants.
    pub workers: u64,
    /// Most processes alive at once.
    pub peak_live_processes: u64,
    /// Sum of the final RSS of the processes alive at the end.
    pub live_rss_end_bytes: u64,
    /// Highest sum of the latest RSS of all live processes, taken at every
    /// counter read.
    pub peak_total_rss_bytes: u64,
    /// Exact resident anonymous growth, summed over processes.
    pub anon_growth_bytes: u64,
    /// Exact copy-on-write bytes, summed over processes.
    pub cow_fault_bytes: u64,
    /// Sampled totals over all processes and stacks.
    pub sampled: SampledBytes,
    /// Distinct call stacks seen.
    pub distinct_stacks: u64,
}

/// Something the reader of a report must know to trust it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Warning {
    /// The ring buffer was full and records were lost.
    DroppedRecords {
        /// Records lost.
        records: u64,
    },
    /// Records failed to decode.
    DecodeErrors {
        /// Records skipped.
        records: u64,
    },
    /// A process's memory has no Python attribution.
    NoPythonStacks {
        /// The process.
        tgid: u32,
        /// Its command line.
        cmdline: String,
        /// Why (not Python, unsupported version, ...).
        reason: String,
    },
    /// Sampled stacks that carry an unknown frame (truncated, unreadable).
    IncompleteStacks {
        /// The unknown frame's reason.
        reason: String,
        /// Samples with such a stack.
        samples: u64,
    },
    /// A process for which no RSS was ever read.
    NoRssReadings {
        /// The process.
        tgid: u32,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DroppedRecords { records } => write!(
                f,
                "{records} records were dropped because the ring buffer was full: \
                 sampled stack totals undercount (exact per-process counters do not); \
                 a larger --sample-bytes records fewer stacks"
            ),
            Self::DecodeErrors { records } => {
                write!(f, "{records} records could not be decoded and were skipped")
            }
            Self::NoPythonStacks {
                tgid,
                cmdline,
                reason,
            } => write!(f, "tgid {tgid} (`{cmdline}`): no Python stacks: {reason}"),
            Self::IncompleteStacks { reason, samples } => {
                write!(f, "{samples} samples have incomplete stacks: {reason}")
            }
            Self::NoRssReadings { tgid } => {
                write!(f, "tgid {tgid}: no RSS was read (it may have exited first)")
            }
        }
    }
}

/// Everything one run produced, as shown in the terminal and written to JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Run facts from the caller.
    pub meta: RunMeta,
    /// Run-wide totals.
    pub totals: Totals,
    /// One entry per process, sorted by RSS growth descending (processes
    /// without RSS last), ties by tgid.
    pub processes: Vec<ProcessReport>,
    /// Interned call stacks, outermost frame first (the native frame last);
    /// [`PathReport::stack`] indexes this.
    pub stacks: Vec<Vec<Frame>>,
    /// Every (process, stack) pair with sampled bytes, sorted by growth
    /// descending, ties by tgid then frames.
    pub paths: Vec<PathReport>,
    /// Every stack with sampled growth, merged over processes, sorted by
    /// growth descending, ties by frames. Absent in reports written before
    /// it existed (read back as empty).
    #[serde(default)]
    pub growth_stacks: Vec<StackGrowthReport>,
    /// Caveats, most important first.
    pub warnings: Vec<Warning>,
    /// Width of the time buckets of [`PathReport::timeline`], in
    /// nanoseconds: 1 s doubled as often as needed for the whole run to fit
    /// in [`crate::aggregate::MAX_PATH_BUCKETS`] buckets.
    #[serde(default = "initial_path_bucket_ns")]
    pub path_bucket_ns: u64,
    /// Growth patterns found, strongest first: empty from
    /// [`crate::aggregate::Aggregator::finish`]; filled by the caller with
    /// [`crate::diagnose::diagnose`].
    #[serde(default)]
    pub diagnosis: Vec<Finding>,
}

/// Serde default of [`Report::path_bucket_ns`] for reports written before
/// it existed.
fn initial_path_bucket_ns() -> u64 {
    INITIAL_PATH_BUCKET_NS
}

impl Report {
    /// Frames of `stack`, outermost first; empty for an unknown id.
    pub fn frames(&self, stack: StackId) -> &[Frame] {
        frames_of(&self.stacks, stack)
    }

    /// The process with `tgid`, if traced.
    pub fn process(&self, tgid: u32) -> Option<&ProcessReport> {
        self.processes.iter().find(|p| p.tgid == tgid)
    }

    /// Short name of process `tgid` ([`ProcessReport::label`]); `?` when
    /// it was not traced.
    pub fn label(&self, tgid: u32) -> String {
        self.process(tgid)
            .map_or_else(|| "?".to_owned(), ProcessReport::label)
    }

    /// The `n` paths with the most sampled growth (growth > 0), largest first.
    pub fn top_growth_paths(&self, n: usize) -> impl Iterator<Item = &PathReport> {
        self.paths
            .iter()
            .filter(|p| p.bytes.growth_bytes > 0)
            .take(n)
    }

    /// The `n` stacks with the most sampled growth summed over processes,
    /// largest first, ties by frames (a prefix of [`Report::growth_stacks`]).
    pub fn top_growth_stacks(&self, n: usize) -> &[StackGrowthReport] {
        &self.growth_stacks[..n.min(self.growth_stacks.len())]
    }

    /// The `n` paths with the most sampled copy-on-write bytes (> 0), largest
    /// first, ties by tgid then frames.
    pub fn top_cow_paths(&self, n: usize) -> Vec<&PathReport> {
        let mut cow: Vec<&PathReport> = self
            .paths
            .iter()
            .filter(|p| p.bytes.cow_bytes > 0)
            .collect();
        cow.sort_by_key(|p| rank_key(p.bytes.cow_bytes, Some(p.tgid), self.frames(p.stack)));
        cow.truncate(n);
        cow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_collapsed_and_cut() {
        assert_eq!(process_label("  python3\tapp.py  "), "python3 app.py");
        assert_eq!(process_label(""), "?");
        let long = "x".repeat(100);
        let label = process_label(&long);
        assert_eq!(label.chars().count(), 60);
        assert!(label.ends_with('…'));
    }

    #[test]
    fn label_of_an_unknown_tgid_is_a_question_mark() {
        let report = crate::aggregate::test_support::server_report();
        assert_eq!(report.label(101), "python3 server.py");
        assert_eq!(report.label(7), "?");
    }
}
