//! The result of the aggregation step: an immutable [`Report`], the input of
//! the diagnosis and of every reporter (terminal table, folded stacks, JSON,
//! flame graphs, pprof, HTML). Plain data, serde round-trippable.
//!
//! Here the report itself, the run's facts and its totals; by idea in
//! submodules: [`process`] (one row per process image), [`kind`] (what
//! each image is: master, worker, helper, ...), [`paths`] (sampled
//! bytes per path and per stack, and the weights that rank them) and
//! [`warning`] (the caveats).

mod kind;
mod paths;
mod process;
mod python_paths;
mod warning;

use serde::{Deserialize, Serialize};

use super::buckets::INITIAL_PATH_BUCKET_NS;
use super::stacks::frames_of;
use super::{rank_key, ExitStatus, Frame, ProcessId, StackId};

pub use kind::ProcessKind;
pub(super) use kind::{assign as assign_kinds, kinds, Facts as KindFacts};
pub use paths::{error_bytes, PathReport, SampledBytes, StackGrowthReport, Weight};
pub use process::short_command;
pub use process::{ExactCounters, ProcessReport, RssSummary, SharingSummary};
pub use python_paths::PythonPath;
pub use warning::Warning;

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
    /// Most live entries the map of held pages (`crate::held`) had at once.
    #[serde(default)]
    pub held_map_peak_entries: u64,
    /// Most heap bytes it used at once (estimated from its entries).
    #[serde(default)]
    pub held_map_peak_bytes: u64,
    /// How long attaching took, in nanoseconds: from memtrace's start
    /// (loading, verifying and attaching the programs) until every target
    /// was traced. 0 when not known (captures of older versions).
    #[serde(default)]
    pub attach_ns: u64,
    /// When every target was traced, Unix time in nanoseconds: growth
    /// before it is not seen (a target's RSS at start is what it held
    /// then). 0 when not known.
    #[serde(default)]
    pub attached_unix_ns: u64,
    /// The traced command was held before its first instruction until
    /// tracing was attached (`memtrace run`): none of its growth is missed.
    #[serde(default)]
    pub command_held: bool,
    /// How `memtrace run`'s command ended (memtrace exits with its
    /// [`ExitStatus::shell_status`]); `None` for `record`, or when it could
    /// not be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_status: Option<ExitStatus>,
    /// Where, when and by which memtrace the run was recorded (empty in
    /// captures of older versions and in ones cut off before their end).
    #[serde(default)]
    pub origin: Origin,
    /// Per CPython binary whose exit-point symbol was missing, which and
    /// what that costs (`bpf::ExitPoint::caveat`); empty when every exit
    /// was found where the interpreter is about to free its objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_point_caveats: Vec<String>,
    /// Set when the report comes from a capture with no `end` line (memtrace
    /// was killed, or the disk filled): how long it covers, in nanoseconds
    /// from the run start. The figures stop there; `None` for a run that
    /// ended normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_after_ns: Option<u64>,
}

/// Where, when and by which memtrace a run was recorded: what every report
/// file says of its origin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The traced machine's host name (`/proc/sys/kernel/hostname`).
    pub host: String,
    /// When tracing began, RFC 3339 in UTC (`2026-12-03T06:54:02Z`).
    pub date_utc: String,
    /// memtrace's version (`CARGO_PKG_VERSION`).
    pub memtrace_version: String,
}

impl Origin {
    /// This machine, `unix_ns` (Unix time in nanoseconds) and this memtrace.
    #[must_use]
    pub fn here(unix_ns: u64) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(unix_ns);
        Self {
            host: host.trim().to_owned(),
            date_utc: humantime::format_rfc3339_seconds(time).to_string(),
            memtrace_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// `recorded on HOST at DATE by memtrace VERSION`, the parts known.
    #[must_use]
    pub fn describe(&self) -> Option<String> {
        if self.memtrace_version.is_empty() {
            return None;
        }
        let mut text = "recorded".to_owned();
        if !self.host.is_empty() {
            text.push_str(&format!(" on {}", self.host));
        }
        if !self.date_utc.is_empty() {
            text.push_str(&format!(" at {}", self.date_utc));
        }
        text.push_str(&format!(" by memtrace {}", self.memtrace_version));
        Some(text)
    }
}

/// Run-wide totals. Sums over processes count each image once; tree
/// totals of PSS count a page shared by several processes once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Process images seen (an execve adds one).
    pub processes: u64,
    /// Images of processes traced on request.
    pub roots: u64,
    /// Images of forked descendants.
    pub workers: u64,
    /// Most processes alive at once.
    pub peak_live_processes: u64,
    /// Sum of the final RSS of the processes alive at the end.
    pub live_rss_end_bytes: u64,
    /// Highest sum of the latest RSS of all live processes, taken at every
    /// counter read. Pages shared copy-on-write count once per process.
    pub peak_total_rss_bytes: u64,
    /// Sum of the last PSS of the processes alive at the end (0 when never
    /// read): the tree's memory with shared pages counted once.
    pub live_pss_end_bytes: u64,
    /// Highest sum of the latest PSS of all live processes.
    pub peak_total_pss_bytes: u64,
    /// Exact resident anonymous growth, summed over images.
    pub anon_growth_bytes: u64,
    /// Exact resident file-backed growth, summed over images.
    #[serde(default)]
    pub file_growth_bytes: u64,
    /// Exact copy-on-write bytes, summed over images.
    pub cow_fault_bytes: u64,
    /// Sampled totals over all images and stacks.
    pub sampled: SampledBytes,
    /// Sampled bytes held at each image's high-water mark, summed.
    pub peak_held_bytes: u64,
    /// Distinct call stacks seen.
    pub distinct_stacks: u64,
}

/// Everything one run produced, as shown in the terminal and written to JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Run facts from the caller.
    pub meta: RunMeta,
    /// Run-wide totals.
    pub totals: Totals,
    /// One entry per process image, sorted by RSS growth descending (images
    /// without RSS last), ties by id.
    pub processes: Vec<ProcessReport>,
    /// Interned call stacks, outermost frame first (the native frame and
    /// any mapping last); [`PathReport::stack`] indexes this.
    pub stacks: Vec<Vec<Frame>>,
    /// Every (process image, stack) pair with sampled bytes, sorted by bytes
    /// held at the high-water mark, then growth, descending, ties by process
    /// then frames.
    pub paths: Vec<PathReport>,
    /// Every stack that made memory resident, merged over images, sorted
    /// like `paths`.
    #[serde(default)]
    pub growth_stacks: Vec<StackGrowthReport>,
    /// Caveats, most important first.
    pub warnings: Vec<Warning>,
    /// Width of the time buckets of [`PathReport::timeline`], in
    /// nanoseconds: 1 s doubled as often as needed for the whole run to fit
    /// in [`crate::aggregate::MAX_PATH_BUCKETS`] buckets.
    #[serde(default = "initial_path_bucket_ns")]
    pub path_bucket_ns: u64,
}

/// Serde default of [`Report::path_bucket_ns`].
fn initial_path_bucket_ns() -> u64 {
    INITIAL_PATH_BUCKET_NS
}

impl Report {
    /// Frames of `stack`, outermost first; empty for an unknown id.
    pub fn frames(&self, stack: StackId) -> &[Frame] {
        frames_of(&self.stacks, stack)
    }

    /// The process image `id`, if traced.
    pub fn process(&self, id: ProcessId) -> Option<&ProcessReport> {
        self.processes.iter().find(|p| p.id == id)
    }

    /// Short name of process image `id` ([`ProcessReport::label`]); `?`
    /// when it was not traced.
    pub fn label(&self, id: ProcessId) -> String {
        self.process(id)
            .map_or_else(|| "?".to_owned(), ProcessReport::label)
    }

    /// [`ProcessReport::name`] of image `id`; `?` when it was not traced.
    pub fn name(&self, id: ProcessId) -> String {
        self.process(id)
            .map_or_else(|| "?".to_owned(), ProcessReport::name)
    }

    /// tgid of image `id`; 0 when it was not traced.
    pub fn tgid(&self, id: ProcessId) -> u32 {
        self.process(id).map_or(0, |p| p.tgid)
    }

    /// The `n` paths with the most `weight` bytes (> 0), largest first, ties
    /// by process then frames.
    pub fn top_paths(&self, weight: Weight, n: usize) -> Vec<&PathReport> {
        let mut paths: Vec<&PathReport> = self
            .paths
            .iter()
            .filter(|p| p.weight_bytes(weight) > 0)
            .collect();
        paths.sort_by_key(|p| {
            rank_key(
                p.weight_bytes(weight),
                Some(p.process),
                self.frames(p.stack),
            )
        });
        paths.truncate(n);
        paths
    }

    /// The `n` stacks with the most `weight` bytes summed over images (> 0),
    /// largest first, ties by frames.
    pub fn top_stacks(&self, weight: Weight, n: usize) -> Vec<&StackGrowthReport> {
        let mut stacks: Vec<&StackGrowthReport> = self
            .growth_stacks
            .iter()
            .filter(|s| s.weight_bytes(weight) > 0)
            .collect();
        stacks.sort_by_key(|s| rank_key(s.weight_bytes(weight), None, self.frames(s.stack)));
        stacks.truncate(n);
        stacks
    }

    /// The `n` paths with the most sampled copy-on-write bytes (> 0), largest
    /// first, ties by process then frames.
    pub fn top_cow_paths(&self, n: usize) -> Vec<&PathReport> {
        let mut cow: Vec<&PathReport> = self
            .paths
            .iter()
            .filter(|p| p.bytes.cow_bytes > 0)
            .collect();
        cow.sort_by_key(|p| rank_key(p.bytes.cow_bytes, Some(p.process), self.frames(p.stack)));
        cow.truncate(n);
        cow
    }
}

#[cfg(test)]
mod tests {
    use super::process::process_label;
    use super::*;

    #[test]
    fn labels_are_collapsed_and_cut() {
        assert_eq!(process_label("  python3\tapp.py  "), "python3 app.py");
        assert_eq!(process_label(""), "?");
        let long = "x".repeat(100);
        let label = process_label(&long);
        assert_eq!(label.chars().count(), 60);
        assert!(label.starts_with('…'));
        let args = format!("python3 /srv/app.py {}", "--flag ".repeat(20));
        assert_eq!(
            process_label(&args),
            format!("app.py {}…", "--flag ".repeat(7))
        );
    }

    #[test]
    fn weights_pick_held_or_grown_bytes() {
        let path = PathReport {
            process: ProcessId(0),
            stack: StackId(0),
            bytes: SampledBytes {
                growth_bytes: 30,
                file_growth_bytes: 2,
                held_bytes: -1,
                ..SampledBytes::default()
            },
            peak_held_bytes: 20,
            peak_held_error_bytes: 0,
            growth_share: 1.0,
            peak_held_share: 1.0,
            cow_share: 0.0,
            timeline: Vec::new(),
        };
        assert_eq!(path.weight_bytes(Weight::Grown), 32);
        assert_eq!(path.weight_bytes(Weight::Peak), 20);
        assert_eq!(path.weight_bytes(Weight::End), 0);
    }
}
