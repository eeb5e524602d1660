//! The result of the aggregation step: an immutable [`Report`], the input of
//! the diagnosis and of every reporter (terminal table, folded stacks, JSON,
//! flame graphs, pprof, HTML). Plain data, serde round-trippable.

use std::fmt;

use serde::{Deserialize, Serialize};

use memtrace_common::MemoryEvent;

use super::buckets::{PathPoint, INITIAL_PATH_BUCKET_NS};
use super::stacks::frames_of;
use super::{
    rank_key, ExitBegin, ExitStatus, Frame, ProcessId, PythonStatus, Role, RssPoint, StackId,
};

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
}

/// Exact per-image counters kept by the kernel side
/// (`memtrace_common::ProcessCounters`), as of the image's end (or the
/// latest read while it lives). All in bytes except the two event counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactCounters {
    /// Sum of resident anonymous memory increases.
    pub anon_growth_bytes: u64,
    /// Sum of resident anonymous memory decreases.
    pub anon_release_bytes: u64,
    /// Sum of resident file-backed memory increases.
    #[serde(default)]
    pub file_growth_bytes: u64,
    /// Sum of resident file-backed memory decreases.
    #[serde(default)]
    pub file_release_bytes: u64,
    /// Sum of resident shared-memory increases.
    #[serde(default)]
    pub shmem_growth_bytes: u64,
    /// Sum of resident shared-memory decreases.
    #[serde(default)]
    pub shmem_release_bytes: u64,
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
    /// Given back by `madvise` (DONTNEED, FREE, REMOVE, DONTNEED_LOCKED).
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
            file_growth_bytes: c.file_growth_bytes,
            file_release_bytes: c.file_release_bytes,
            shmem_growth_bytes: c.shmem_growth_bytes,
            shmem_release_bytes: c.shmem_release_bytes,
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
/// `weight_bytes`), per path, per process, or per time bucket of a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledBytes {
    /// Resident anonymous growth (`AnonGrowth`): every first touch, counted
    /// again when freed memory is touched again.
    pub growth_bytes: u64,
    /// Resident file-backed growth (`FileGrowth`): page cache mapped in.
    #[serde(default)]
    pub file_growth_bytes: u64,
    /// Resident shared-memory growth (`ShmemGrowth`).
    #[serde(default)]
    pub shmem_growth_bytes: u64,
    /// Copy-on-write un-sharing (`CowFault`).
    pub cow_bytes: u64,
    /// Address space added (`Mmap`, `MremapGrow`, `BrkGrow`).
    pub mapped_bytes: u64,
    /// Address space removed or given back (`Munmap`, `MremapShrink`,
    /// `BrkShrink`, `MadviseFree`).
    pub unmapped_bytes: u64,
    /// Change of the bytes the path holds (its sampled pages still resident,
    /// by address; `crate::held`): summed over a path's whole life, the
    /// bytes it holds at the end of its process image; per time bucket, the
    /// change in that bucket (negative when it gave memory back).
    #[serde(default)]
    pub held_bytes: i64,
    /// Samples summed.
    pub samples: u64,
}

impl SampledBytes {
    /// One sample: `weight_bytes` in the total its `event` belongs to, and
    /// a sample count of 1 (held bytes come separately, from `crate::held`).
    pub fn from_event(event: MemoryEvent, weight_bytes: u64) -> Self {
        let mut bytes = Self {
            samples: 1,
            ..Self::default()
        };
        let slot = match event {
            MemoryEvent::AnonGrowth => &mut bytes.growth_bytes,
            MemoryEvent::FileGrowth => &mut bytes.file_growth_bytes,
            MemoryEvent::ShmemGrowth => &mut bytes.shmem_growth_bytes,
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

    /// A change of `delta_bytes` in the bytes a path holds (no sample).
    pub fn held_change(delta_bytes: i64) -> Self {
        Self {
            held_bytes: delta_bytes,
            ..Self::default()
        }
    }

    /// Every first touch of resident memory: anonymous + file + shmem growth.
    pub fn grown_bytes(&self) -> u64 {
        self.growth_bytes
            .saturating_add(self.file_growth_bytes)
            .saturating_add(self.shmem_growth_bytes)
    }

    /// Bytes held (never below 0: sampling noise can take a path's sum of
    /// changes slightly negative).
    pub fn held_now_bytes(&self) -> u64 {
        self.held_bytes.max(0).unsigned_abs()
    }

    /// Sums `other` into these totals (saturating).
    pub fn merge(&mut self, other: &Self) {
        self.growth_bytes = self.growth_bytes.saturating_add(other.growth_bytes);
        self.file_growth_bytes = self
            .file_growth_bytes
            .saturating_add(other.file_growth_bytes);
        self.shmem_growth_bytes = self
            .shmem_growth_bytes
            .saturating_add(other.shmem_growth_bytes);
        self.cow_bytes = self.cow_bytes.saturating_add(other.cow_bytes);
        self.mapped_bytes = self.mapped_bytes.saturating_add(other.mapped_bytes);
        self.unmapped_bytes = self.unmapped_bytes.saturating_add(other.unmapped_bytes);
        self.held_bytes = self.held_bytes.saturating_add(other.held_bytes);
        self.samples = self.samples.saturating_add(other.samples);
    }
}

/// Which bytes rank and weigh paths (`--weight`): flame graphs, folded
/// stacks, speedscope and pprof are drawn with it; the table shows all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// Bytes held when the process's RSS was at its high-water mark.
    #[default]
    Peak,
    /// Bytes held at the end (of the trace, or when the process began to
    /// exit or exec'd).
    End,
    /// Every first touch, counted again when memory is freed and touched
    /// again.
    Grown,
}

impl Weight {
    /// Name in tables, headers and file annotations: `held at peak`, `held at
    /// end`, `grown`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Peak => "held at peak",
            Self::End => "held at end",
            Self::Grown => "grown",
        }
    }
}

/// Resident-memory summary of one process image, from its counters at
/// start, at its end and its high-water mark (not from the downsampled
/// timeline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssSummary {
    /// RSS when tracing of the image began (inherited at fork, read at
    /// attach, 0 after an execve).
    pub start_bytes: u64,
    /// RSS at the image's end: when its exit began (before the interpreter's
    /// finalization and the kernel's teardown gave memory back), when it
    /// exec'd, or at the end of the trace.
    pub end_bytes: u64,
    /// High-water mark until the end: the highest RSS read or the kernel's
    /// `rss_peak_bytes`, whichever is higher.
    pub peak_bytes: u64,
    /// `end_bytes - start_bytes` (negative when the process shrank).
    pub growth_bytes: i64,
}

/// Proportional (PSS) and private (USS) memory of one process image over its
/// life, from `/proc/PID/smaps_rollup` read about once a second: a page
/// shared by N processes counts 1/N in each one's PSS, and in no one's USS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingSummary {
    /// PSS at the first reading.
    pub start_pss_bytes: u64,
    /// PSS at the last reading before the image ended.
    pub end_pss_bytes: u64,
    /// Highest PSS read.
    pub peak_pss_bytes: u64,
    /// USS (Private_Clean + Private_Dirty) at the first reading.
    pub start_uss_bytes: u64,
    /// USS at the last reading.
    pub end_uss_bytes: u64,
    /// Highest USS read.
    pub peak_uss_bytes: u64,
}

/// One image of one traced process: from its fork, attach or execve to its
/// execve, the start of its exit, or the end of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Row id (other rows and paths refer to it).
    pub id: ProcessId,
    /// Process id (thread-group id): with `start_time_ns`, the process.
    pub tgid: u32,
    /// When the process started, CLOCK_BOOTTIME ns (`/proc/PID/stat` field
    /// 22 is the same instant in clock ticks).
    pub start_time_ns: u64,
    /// 1 for the first process with this tgid in the trace, 2 for the next
    /// one the kernel gave the same tgid, ...
    pub instance: u32,
    /// 0 for the first traced image of the process, +1 per execve.
    pub image: u32,
    /// The image this one replaced by execve.
    pub previous_image: Option<ProcessId>,
    /// The image that replaced this one by execve.
    pub next_image: Option<ProcessId>,
    /// The traced process it was forked from (its image at the fork).
    pub parent: Option<ProcessId>,
    /// The parent's tgid, when known.
    pub parent_tgid: Option<u32>,
    /// Traced on request or forked descendant.
    pub role: Role,
    /// Command line of this image.
    pub cmdline: String,
    /// Whether Python stacks could be read; `None` if never determined.
    pub python: Option<PythonStatus>,
    /// When tracing of this image began (fork, attach or execve), in
    /// nanoseconds since the run start.
    pub started_ns: u64,
    /// When an execve replaced this image, since the run start.
    pub exec_ns: Option<u64>,
    /// When the process began to exit, since the run start: its numbers end
    /// here.
    pub exit_began_ns: Option<u64>,
    /// What began the exit.
    pub exit_began_by: Option<ExitBegin>,
    /// When the process was gone (its exit record), since the run start.
    pub exited_ns: Option<u64>,
    /// How it ended; `None` while alive or when its exit was not seen.
    pub exit_status: Option<ExitStatus>,
    /// How long this image was traced: from `started_ns` to its end (exec,
    /// exit began, or the end of the run), in nanoseconds.
    pub traced_ns: u64,
    /// RSS summary; `None` if no counters with RSS were ever read.
    pub rss: Option<RssSummary>,
    /// PSS and USS summary; `None` when /proc/PID/smaps_rollup was never read.
    pub sharing: Option<SharingSummary>,
    /// Exact counters at the image's end; `None` if never read.
    pub counters: Option<ExactCounters>,
    /// Sampled totals over all stacks of this image.
    pub sampled: SampledBytes,
    /// Sampled bytes held at the image's high-water mark, over all stacks.
    pub peak_held_bytes: u64,
    /// RSS over time, oldest first, at most
    /// [`crate::aggregate::MAX_TIMELINE_POINTS`] points (each the highest
    /// reading of its time bucket; the last one is the image's end).
    pub timeline: Vec<RssPoint>,
}

impl ProcessReport {
    /// Short name of the process for tables and folded stacks (see
    /// `process_label`).
    pub fn label(&self) -> String {
        process_label(&self.cmdline)
    }

    /// How the process is named to a reader: `tgid 4312`, `tgid 4312#2`
    /// for the second process the kernel gave tgid 4312 in this trace, plus
    /// `, image 1` for an image after an execve.
    pub fn name(&self) -> String {
        let mut name = format!("tgid {}", self.tgid);
        if self.instance > 1 {
            name.push_str(&format!("#{}", self.instance));
        }
        if self.image > 0 || self.next_image.is_some() {
            name.push_str(&format!(", image {}", self.image));
        }
        name
    }

    /// When this image ended, since the run start: exec, or the start of
    /// its exit; `None` when it lived to the end of the trace.
    pub fn ended_ns(&self) -> Option<u64> {
        self.exec_ns.or(self.exit_began_ns)
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

/// One growth path: the sampled bytes one stack caused in one process image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// The process image the bytes belong to.
    pub process: ProcessId,
    /// The call stack: index into [`Report::stacks`].
    pub stack: StackId,
    /// Sampled byte totals of this stack in this image (`held_bytes`: held at
    /// the image's end).
    pub bytes: SampledBytes,
    /// Sampled bytes this path held when its image's RSS was at its
    /// high-water mark.
    pub peak_held_bytes: u64,
    /// `bytes.grown_bytes()` as a fraction (0..=1) of the image's sampled
    /// growth; 0 when it has none.
    pub growth_share: f64,
    /// `peak_held_bytes` as a fraction (0..=1) of the image's sampled bytes
    /// held at its high-water mark; 0 when it has none.
    pub peak_held_share: f64,
    /// `bytes.cow_bytes` as a fraction (0..=1) of the image's sampled
    /// copy-on-write bytes; 0 when it has none.
    pub cow_share: f64,
    /// This path's sampled bytes per time bucket of
    /// [`Report::path_bucket_ns`], oldest first; buckets without any change
    /// are left out.
    #[serde(default)]
    pub timeline: Vec<PathPoint>,
}

impl PathReport {
    /// The bytes `weight` counts for this path.
    pub fn weight_bytes(&self, weight: Weight) -> u64 {
        match weight {
            Weight::Peak => self.peak_held_bytes,
            Weight::End => self.bytes.held_now_bytes(),
            Weight::Grown => self.bytes.grown_bytes(),
        }
    }
}

/// One call stack's sampled bytes summed over every process image it ran
/// in: the merged view of a leak that a pre-fork service repeats in each
/// worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackGrowthReport {
    /// The call stack: index into [`Report::stacks`].
    pub stack: StackId,
    /// Sampled byte totals of this stack, summed over images.
    pub bytes: SampledBytes,
    /// Bytes it held at each image's high-water mark, summed over images.
    pub peak_held_bytes: u64,
    /// `bytes.grown_bytes()` as a fraction (0..=1) of the sampled growth of
    /// all traced images; 0 when there is none.
    pub growth_share: f64,
    /// `peak_held_bytes` as a fraction (0..=1) of all images' bytes held at
    /// their high-water marks; 0 when there is none.
    pub peak_held_share: f64,
    /// Images in which this stack made memory resident, ascending.
    pub processes: Vec<ProcessId>,
}

impl StackGrowthReport {
    /// The bytes `weight` counts for this stack.
    pub fn weight_bytes(&self, weight: Weight) -> u64 {
        match weight {
            Weight::Peak => self.peak_held_bytes,
            Weight::End => self.bytes.held_now_bytes(),
            Weight::Grown => self.bytes.grown_bytes(),
        }
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
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it ([`ProcessReport::name`]).
        name: String,
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
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it ([`ProcessReport::name`]).
        name: String,
    },
    /// The address map of held pages hit its memory bound and kept only a
    /// share of the sampled pages of a process (each kept one weighing
    /// more): held bytes stay unbiased but vary more.
    HeldMapCoarsened {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it ([`ProcessReport::name`]).
        name: String,
        /// 1 in `2^level` sampled pages kept.
        level: u32,
    },
    /// Sampled growth whose address was unknown (memory made resident
    /// without a page fault, e.g. `MAP_POPULATE`): counted as held until
    /// its process ends.
    UnplacedGrowth {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it ([`ProcessReport::name`]).
        name: String,
        /// Sampled bytes without an address.
        bytes: u64,
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
                name,
                cmdline,
                reason,
                ..
            } => write!(f, "{name} (`{cmdline}`): no Python stacks: {reason}"),
            Self::IncompleteStacks { reason, samples } => {
                write!(f, "{samples} samples have incomplete stacks: {reason}")
            }
            Self::NoRssReadings { name, .. } => {
                write!(f, "{name}: no RSS was read (it may have exited first)")
            }
            Self::HeldMapCoarsened { name, level, .. } => write!(
                f,
                "{name}: the map of held pages reached its memory bound and keeps 1 in {} \
                 sampled pages: held bytes are estimates with more variance",
                1_u64 << (*level).min(63)
            ),
            Self::UnplacedGrowth { name, bytes, .. } => write!(
                f,
                "{name}: {} of sampled growth had no address (made resident without a \
                 page fault) and counts as held until the process ends",
                crate::units::format_bytes(*bytes)
            ),
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
