//! Allocator mode, aggregation step: sampled `AllocRecord`s and
//! `FreeRecord`s (decoded by `events`, their stacks symbolized by `app`)
//! become, per process and per path (Python stack), the bytes allocated,
//! freed, leaked (still live at the end), live at the process's high-water
//! mark, and temporary (freed within [`TEMPORARY_NS`]). The result,
//! [`AllocationsReport`], goes into the diagnosis and the JSON report, and
//! `report::allocations` draws its terminal section and files;
//! `fragmentation` says when the allocator, not the program, holds the
//! memory.

mod fragmentation;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

pub use fragmentation::{
    Fragmentation, FragmentationKind, FRAGMENTATION_LIVE_FRACTION, FRAGMENTATION_MIN_GAP_BYTES,
    PYMALLOC_MAX_BYTES,
};

/// A block freed within this many nanoseconds of its allocation counts as
/// temporary: 1 s, memray's order of magnitude for short-lived churn (its
/// temporary reporter looks at the next few allocations of a thread), long
/// enough for a request or a loop iteration, short enough that a cache
/// entry is not taken for churn.
pub const TEMPORARY_NS: u64 = 1_000_000_000;

/// Anonymous RSS growth, in bytes, above which sampled live bytes at the
/// high-water mark below [`INLINED_SEEN_FRACTION`] of it mean the hooks miss
/// most allocations (an allocator inlined into its callers, as in Debian's
/// LTO-built `/usr/bin/python3.11`). Live bytes, not allocated ones:
/// short-lived churn does not make RSS grow, and an allocator that keeps
/// freed memory (fragmentation) still had the bytes live at its peak.
pub const INLINED_MIN_GROWTH_BYTES: u64 = 32 << 20;

/// See [`INLINED_MIN_GROWTH_BYTES`]: the fraction of the RSS growth the
/// sampled live bytes at the high-water mark must reach to be taken as
/// complete.
pub const INLINED_SEEN_FRACTION: f64 = 0.25;

/// What the user is told when a process's allocator seems inlined.
pub const INLINED_REMEDY: &str = "the allocator hooks saw few allocations for this process's \
     memory growth: its allocator is likely inlined into the interpreter (LTO builds such as \
     Debian's /usr/bin/python3.11); run it with PYTHONMALLOC=malloc (`memtrace run \
     --allocations --python-malloc`) so every Python allocation goes through libc malloc";

/// The weight, in bytes, of a sampled block of `size_bytes` when sampling
/// is a Poisson process over allocated bytes with mean `mean_bytes`: the
/// block is sampled with probability `p = 1 - exp(-size / mean)` and stands
/// for `size / p` bytes (Horvitz-Thompson: the expected sum of weights is
/// the true total). Tends to `mean` for tiny blocks and `size` for large.
pub fn sample_weight_bytes(size_bytes: u64, mean_bytes: u64) -> f64 {
    let size = size_bytes as f64;
    let probability = -(-size / mean_bytes.max(1) as f64).exp_m1();
    if probability <= 0.0 {
        return 0.0;
    }
    size / probability
}

/// One sampled block as its allocation record gave it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampledBlock {
    /// When it was allocated, monotonic ns.
    pub ts_ns: u64,
    /// The allocating thread.
    pub tid: u32,
    /// Its address.
    pub addr: u64,
    /// Its requested size, in bytes.
    pub size_bytes: u64,
    /// The kernel's live set was full: its free will not be seen.
    pub untracked: bool,
    /// Allocated through CPython's allocator API, not glibc's `malloc`
    /// family called directly.
    pub python_api: bool,
}

/// One sampled block still live.
#[derive(Clone, Copy, Debug)]
struct LiveEntry {
    path: usize,
    weight_bytes: f64,
    ts_ns: u64,
    tid: u32,
    /// In pymalloc's pools (see [`PYMALLOC_MAX_BYTES`]), else glibc's.
    pymalloc: bool,
}

/// Totals of one path in one process, in weighted bytes.
#[derive(Clone, Copy, Debug, Default)]
struct PathTotals {
    allocations: u64,
    allocated_bytes: f64,
    freed_bytes: f64,
    temporary_bytes: f64,
    live_bytes: f64,
    at_peak_bytes: f64,
}

/// How a process's allocator hooks went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum HookStatus {
    /// Not attached yet (or the process ended first).
    Pending,
    /// Attached to these binaries.
    Hooked {
        /// The binaries whose allocator symbols are probed.
        binaries: Vec<String>,
        /// From the process's start (or its exec) to its probes being
        /// attached, in ns: allocations in that window are not seen.
        gap_ns: u64,
        /// Its CPython allocator is pymalloc (no `PYTHONMALLOC=malloc` in
        /// its environment).
        #[serde(default)]
        pymalloc: bool,
    },
    /// Not hooked: the process keeps the default mode only.
    NotHooked {
        /// Why.
        reason: String,
    },
}

/// One process's allocator state.
#[derive(Debug)]
struct ProcessAllocs {
    tgid: u32,
    start_time_ns: u64,
    /// When it entered the trace (fork, exec, or attach), monotonic ns.
    seen_from_ns: u64,
    hook: HookStatus,
    live: HashMap<u64, LiveEntry>,
    paths: HashMap<usize, PathTotals>,
    live_bytes: f64,
    peak_bytes: f64,
    /// Paths whose live bytes changed since the last peak.
    changed_since_peak: HashSet<usize>,
    untracked: u64,
    /// Anonymous RSS, first, highest and last reading, in bytes.
    rss_anon_first_bytes: Option<u64>,
    rss_anon_max_bytes: u64,
    rss_anon_last_bytes: Option<u64>,
    freed: fragmentation::FreedBytes,
    /// No more events count (its exit began, or it exec'd).
    ended: bool,
}

impl ProcessAllocs {
    fn new(tgid: u32, start_time_ns: u64, seen_from_ns: u64) -> Self {
        Self {
            tgid,
            start_time_ns,
            seen_from_ns,
            hook: HookStatus::Pending,
            live: HashMap::new(),
            paths: HashMap::new(),
            live_bytes: 0.0,
            peak_bytes: 0.0,
            changed_since_peak: HashSet::new(),
            untracked: 0,
            rss_anon_first_bytes: None,
            rss_anon_max_bytes: 0,
            rss_anon_last_bytes: None,
            freed: fragmentation::FreedBytes::default(),
            ended: false,
        }
    }

    fn alloc(&mut self, path: usize, entry: LiveEntry, addr: u64) {
        let totals = self.paths.entry(path).or_default();
        totals.allocations += 1;
        totals.allocated_bytes += entry.weight_bytes;
        totals.live_bytes += entry.weight_bytes;
        self.live_bytes += entry.weight_bytes;
        self.changed_since_peak.insert(path);
        // A reused address whose free was missed: the old block is gone.
        if let Some(old) = self.live.insert(addr, entry) {
            self.release(old, entry.ts_ns);
        }
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            for path in self.changed_since_peak.drain() {
                let totals = self.paths.entry(path).or_default();
                totals.at_peak_bytes = totals.live_bytes;
            }
        }
    }

    fn release(&mut self, entry: LiveEntry, ts_ns: u64) {
        let totals = self.paths.entry(entry.path).or_default();
        totals.freed_bytes += entry.weight_bytes;
        totals.live_bytes -= entry.weight_bytes;
        self.freed
            .add(entry.pymalloc, entry.weight_bytes, entry.tid);
        if ts_ns.saturating_sub(entry.ts_ns) < TEMPORARY_NS {
            totals.temporary_bytes += entry.weight_bytes;
        }
        self.live_bytes -= entry.weight_bytes;
        self.changed_since_peak.insert(entry.path);
    }

    fn rss_anon_growth_bytes(&self) -> u64 {
        self.rss_anon_max_bytes
            .saturating_sub(self.rss_anon_first_bytes.unwrap_or(0))
    }

    fn pymalloc(&self) -> bool {
        matches!(self.hook, HookStatus::Hooked { pymalloc: true, .. })
    }

    fn fragmentation(&self, live_bytes: u64, peak_bytes: u64) -> Option<Fragmentation> {
        if !matches!(self.hook, HookStatus::Hooked { .. }) || self.inlined_suspected() {
            return None;
        }
        fragmentation::diagnose(&fragmentation::EndState {
            rss_anon_first_bytes: self.rss_anon_first_bytes,
            rss_anon_end_bytes: self.rss_anon_last_bytes,
            live_bytes,
            peak_bytes,
            freed: &self.freed,
        })
    }

    fn inlined_suspected(&self) -> bool {
        let growth = self.rss_anon_growth_bytes();
        matches!(self.hook, HookStatus::Hooked { .. })
            && growth >= INLINED_MIN_GROWTH_BYTES
            && self.peak_bytes < growth as f64 * INLINED_SEEN_FRACTION
    }
}

/// The allocator-mode state of a whole session.
#[derive(Debug)]
pub struct AllocationTracker {
    mean_bytes: u64,
    /// Processes by tgid while they run.
    running: HashMap<u32, ProcessAllocs>,
    /// Processes that exited or exec'd, in order.
    finished: Vec<ProcessAllocs>,
    /// Interned stacks (frames outermost first).
    stacks: Vec<Vec<String>>,
    stack_ids: HashMap<Vec<String>, usize>,
}

impl AllocationTracker {
    /// A tracker for samples drawn with mean `mean_bytes`.
    pub fn new(mean_bytes: u64) -> Self {
        Self {
            mean_bytes,
            running: HashMap::new(),
            finished: Vec::new(),
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
        }
    }

    /// A traced process (image) appeared at monotonic `seen_from_ns` (its
    /// fork, its exec, or when tracing began); `start_time_ns` is its
    /// boot-time start, its identity with the tgid. A previous process with
    /// that tgid is finished first.
    pub fn process_started(&mut self, tgid: u32, start_time_ns: u64, seen_from_ns: u64) {
        self.process_ended(tgid);
        self.running
            .insert(tgid, ProcessAllocs::new(tgid, start_time_ns, seen_from_ns));
    }

    /// The probes of `tgid` were attached to `binaries` at monotonic
    /// `attached_ns`; `pymalloc` when its CPython allocator is pymalloc.
    pub fn hooked(&mut self, tgid: u32, binaries: Vec<String>, attached_ns: u64, pymalloc: bool) {
        if let Some(process) = self.running.get_mut(&tgid) {
            let gap_ns = attached_ns.saturating_sub(process.seen_from_ns);
            process.hook = HookStatus::Hooked {
                binaries,
                gap_ns,
                pymalloc,
            };
        }
    }

    /// The allocator of `tgid` cannot be hooked, for `reason`.
    pub fn not_hooked(&mut self, tgid: u32, reason: String) {
        if let Some(process) = self.running.get_mut(&tgid) {
            process.hook = HookStatus::NotHooked { reason };
        }
    }

    /// Whether `tgid` runs and still waits for its hooks.
    pub fn pending(&self, tgid: u32) -> bool {
        self.pending_start(tgid).is_some()
    }

    /// The start time (boot-time ns) of `tgid` when it runs and still waits
    /// for its hooks.
    pub fn pending_start(&self, tgid: u32) -> Option<u64> {
        self.running
            .get(&tgid)
            .filter(|p| p.hook == HookStatus::Pending)
            .map(|p| p.start_time_ns)
    }

    /// An anonymous RSS reading of `tgid`, in bytes (the kernel's
    /// `rss_stat` counter: /proc/PID/status `RssAnon`); none once its exit
    /// began, so the last one is its RSS then.
    pub fn rss_anon(&mut self, tgid: u32, bytes: u64) {
        if let Some(process) = self.running.get_mut(&tgid).filter(|p| !p.ended) {
            process.rss_anon_first_bytes.get_or_insert(bytes);
            process.rss_anon_max_bytes = process.rss_anon_max_bytes.max(bytes);
            process.rss_anon_last_bytes = Some(bytes);
        }
    }

    /// A sampled `block` allocated by `tgid` from `stack` (outermost frame
    /// first).
    pub fn alloc(&mut self, tgid: u32, block: SampledBlock, stack: Vec<String>) {
        let weight_bytes = sample_weight_bytes(block.size_bytes, self.mean_bytes);
        let path = self.intern(stack);
        let Some(process) = self.running.get_mut(&tgid).filter(|p| !p.ended) else {
            return;
        };
        if block.untracked {
            process.untracked += 1;
        }
        let entry = LiveEntry {
            path,
            weight_bytes,
            ts_ns: block.ts_ns,
            tid: block.tid,
            pymalloc: process.pymalloc()
                && block.python_api
                && block.size_bytes <= PYMALLOC_MAX_BYTES,
        };
        process.alloc(path, entry, block.addr);
    }

    /// A sampled block of `tgid` at `addr` was freed at `ts_ns`.
    pub fn free(&mut self, tgid: u32, ts_ns: u64, addr: u64) {
        let Some(process) = self.running.get_mut(&tgid).filter(|p| !p.ended) else {
            return;
        };
        if let Some(entry) = process.live.remove(&addr) {
            process.release(entry, ts_ns);
        }
    }

    /// `tgid` began to exit (or exec'd): what is live now is leaked; later
    /// events of it are ignored.
    pub fn exit_began(&mut self, tgid: u32) {
        if let Some(process) = self.running.get_mut(&tgid) {
            process.ended = true;
        }
    }

    /// The start time (boot-time ns) of the running process `tgid`, its
    /// identity with the tgid (an exec keeps it).
    pub fn start_time_of(&self, tgid: u32) -> Option<u64> {
        self.running.get(&tgid).map(|p| p.start_time_ns)
    }

    /// `tgid` is gone (exited, or exec'd into a new image).
    pub fn process_ended(&mut self, tgid: u32) {
        if let Some(mut process) = self.running.remove(&tgid) {
            process.ended = true;
            self.finished.push(process);
        }
    }

    fn intern(&mut self, stack: Vec<String>) -> usize {
        if let Some(&id) = self.stack_ids.get(&stack) {
            return id;
        }
        let id = self.stacks.len();
        self.stacks.push(stack.clone());
        self.stack_ids.insert(stack, id);
        id
    }

    /// The report: every process (finished ones first, then running ones by
    /// tgid), its paths sorted by leaked, then allocated bytes, descending.
    pub fn report(&self, kernel: KernelAllocStats) -> AllocationsReport {
        let mut running: Vec<&ProcessAllocs> = self.running.values().collect();
        running.sort_by_key(|p| p.tgid);
        let processes = self
            .finished
            .iter()
            .chain(running)
            .map(|p| self.process_report(p))
            .collect();
        AllocationsReport {
            sample_interval_bytes: self.mean_bytes,
            temporary_ns: TEMPORARY_NS,
            kernel,
            processes,
        }
    }

    fn process_report(&self, process: &ProcessAllocs) -> ProcessAllocations {
        let mut paths: Vec<PathAllocations> = process
            .paths
            .iter()
            .map(|(&path, totals)| PathAllocations {
                stack: self.stacks[path].clone(),
                allocations: totals.allocations,
                allocated_bytes: round(totals.allocated_bytes),
                freed_bytes: round(totals.freed_bytes),
                leaked_bytes: round(totals.live_bytes),
                peak_bytes: round(totals.at_peak_bytes),
                temporary_bytes: round(totals.temporary_bytes),
            })
            .collect();
        paths.sort_by(|a, b| {
            (b.leaked_bytes, b.allocated_bytes, &a.stack).cmp(&(
                a.leaked_bytes,
                a.allocated_bytes,
                &b.stack,
            ))
        });
        // Totals are sums of the paths' rounded bytes, so every file that
        // weighs paths adds up to them exactly.
        let leaked_bytes = paths.iter().map(|p| p.leaked_bytes).sum();
        let peak_bytes = paths.iter().map(|p| p.peak_bytes).sum();
        ProcessAllocations {
            tgid: process.tgid,
            start_time_ns: process.start_time_ns,
            hook: process.hook.clone(),
            sampled_allocations: paths.iter().map(|p| p.allocations).sum(),
            untracked_allocations: process.untracked,
            allocated_bytes: paths.iter().map(|p| p.allocated_bytes).sum(),
            leaked_bytes,
            peak_bytes,
            rss_anon_growth_bytes: process.rss_anon_growth_bytes(),
            rss_anon_end_bytes: process.rss_anon_last_bytes,
            inlined_allocator_suspected: process.inlined_suspected(),
            fragmentation: process.fragmentation(leaked_bytes, peak_bytes),
            paths,
        }
    }
}

/// Weighted bytes as whole bytes (negative rounding noise as 0).
fn round(bytes: f64) -> u64 {
    bytes.max(0.0).round() as u64
}

/// Allocator-mode counters of the kernel side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelAllocStats {
    /// Outermost allocator calls the uprobes saw return a block, all
    /// processes.
    pub calls: u64,
    /// Sampled blocks the full live set refused (their frees are unseen).
    pub live_full: u64,
    /// Blocks in the kernel's live set at the end of the trace, all
    /// processes (its capacity is 65,536; an ended process leaves none).
    /// Counted at the end only (one pass over the map): `None` in the
    /// reports a capture holds before its end.
    #[serde(default)]
    pub live_set_blocks: Option<u64>,
}

/// Allocator mode's part of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationsReport {
    /// Mean of the Poisson byte sampling, in bytes (`--sample-bytes`).
    pub sample_interval_bytes: u64,
    /// Threshold of [`PathAllocations::temporary_bytes`], in ns.
    pub temporary_ns: u64,
    /// Kernel-side counters.
    pub kernel: KernelAllocStats,
    /// One entry per traced process image.
    pub processes: Vec<ProcessAllocations>,
}

/// One process's allocations. Byte counts are sampled estimates
/// ([`sample_weight_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessAllocations {
    /// The process.
    pub tgid: u32,
    /// Its start, boot-time ns (with the tgid, its identity).
    pub start_time_ns: u64,
    /// Whether and where its allocator is hooked.
    pub hook: HookStatus,
    /// Sampled blocks.
    pub sampled_allocations: u64,
    /// Sampled blocks whose free cannot be seen (the live set was full).
    pub untracked_allocations: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Bytes still live at the end (or when its exit began).
    pub leaked_bytes: u64,
    /// Live bytes at the high-water mark.
    pub peak_bytes: u64,
    /// Growth of its anonymous RSS while traced (highest minus first
    /// reading), in bytes.
    pub rss_anon_growth_bytes: u64,
    /// Its anonymous RSS at the end (when its exit began, or the last
    /// reading of the trace), in bytes; `None` before any reading.
    #[serde(default)]
    pub rss_anon_end_bytes: Option<u64>,
    /// The hooks saw far fewer live bytes at the high-water mark than its
    /// RSS grew by: [`INLINED_REMEDY`].
    pub inlined_allocator_suspected: bool,
    /// The allocator, not the program, holds most of the anonymous RSS it
    /// kept: [`Fragmentation::remedy`].
    #[serde(default)]
    pub fragmentation: Option<Fragmentation>,
    /// Paths sorted by leaked, then allocated bytes, descending.
    pub paths: Vec<PathAllocations>,
}

/// One path (Python stack, then the native caller of the allocator) of one
/// process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathAllocations {
    /// Frames, outermost first.
    pub stack: Vec<String>,
    /// Sampled blocks.
    pub allocations: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Bytes still live at the end.
    pub leaked_bytes: u64,
    /// Bytes live when the process's live bytes peaked.
    pub peak_bytes: u64,
    /// Bytes freed within [`TEMPORARY_NS`] of their allocation.
    pub temporary_bytes: u64,
}
