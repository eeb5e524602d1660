//! Per-process part of the aggregation step's result: one [`ProcessReport`]
//! per process image, with its RSS, PSS and USS summaries and exact
//! counters, as the diagnosis and the reporters read it.

use serde::{Deserialize, Serialize};

use super::kind::ProcessKind;
use super::paths::SampledBytes;
use crate::aggregate::{ExitBegin, ExitStatus, ProcessId, PythonStatus, Role, RssPoint};

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
    /// The last reading is not the end's: RSS moved more than
    /// `STALE_SHARING_CHANGE_BYTES` (8 MiB) and 25% between it and the
    /// image's end (reads are paced; a short life may have only the one at
    /// its fork). `end_*` are then that older reading's.
    #[serde(default)]
    pub end_stale: bool,
}

impl SharingSummary {
    /// USS at the end, when the last reading stands for it.
    pub fn end_uss(&self) -> Option<u64> {
        (!self.end_stale).then_some(self.end_uss_bytes)
    }
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
    /// What the image is to a reader (master, worker, helper, ...), from
    /// the tree's shape.
    #[serde(default)]
    pub kind: ProcessKind,
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

/// A command line as every output shows it (the process table, a
/// finding's scope, the verdict, the live view, diff, flame graphs,
/// speedscope, pprof, HTML), by one rule: whitespace collapsed, every word
/// that is a path (holds a `/` and is not an option) cut to its file name;
/// when longer than `max_chars`, first a Python interpreter's name and its
/// options before the script go (`-m module` stays), then arguments are cut
/// from the right behind ` …`, so the script and its first arguments always
/// show; a script name longer than `max_chars` alone keeps its end. `?`
/// when empty. E.g. `/usr/bin/python3.11 /srv/app/worker.py --jobs 4` reads
/// `python3.11 worker.py --jobs 4`, in 20 characters `worker.py --jobs 4`,
/// in 14 `worker.py …`.
pub fn short_command(cmdline: &str, max_chars: usize) -> String {
    let words: Vec<&str> = cmdline
        .split_whitespace()
        .map(|word| match word.rsplit_once('/') {
            Some((_, name)) if !word.starts_with('-') && !name.is_empty() => name,
            _ => word,
        })
        .collect();
    if words.is_empty() {
        return "?".to_owned();
    }
    let fits = |words: &[&str]| words.join(" ").chars().count() <= max_chars;
    if fits(&words) {
        return words.join(" ");
    }
    let words = &words[script_index(&words)..];
    if fits(words) {
        return words.join(" ");
    }
    let mut kept = words.len();
    while kept > 1 && words[..kept].join(" ").chars().count() + 2 > max_chars {
        kept -= 1;
    }
    let head = words[..kept].join(" ");
    let head_chars = head.chars().count();
    if head_chars + 2 <= max_chars {
        return format!("{head} …");
    }
    // The script's name alone is too long: keep its end (`…name.py`).
    let keep = max_chars.saturating_sub(1);
    let tail: String = head.chars().skip(head_chars.saturating_sub(keep)).collect();
    format!("…{tail}")
}

/// Where the script starts in a command's `words`: after a Python
/// interpreter (a first word `python…`) and its options, at `-m` for a
/// module; at the first word for any other program.
fn script_index(words: &[&str]) -> usize {
    if !words[0].starts_with("python") {
        return 0;
    }
    let mut index = 1;
    while index < words.len() {
        let word = words[index];
        if word == "-m" || !word.starts_with('-') {
            return index;
        }
        // Options that take a value: `-X importtime`, `-W error`.
        index += if matches!(word, "-X" | "-W" | "-Q") {
            2
        } else {
            1
        };
    }
    0
}

/// Short name of a process for labels (diff, folded stacks, speedscope,
/// pprof): [`short_command`] in 60 characters.
pub(crate) fn process_label(cmdline: &str) -> String {
    const MAX_CHARS: usize = 60;
    short_command(cmdline, MAX_CHARS)
}
