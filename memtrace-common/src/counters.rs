//! Exact per-process counters (`PROCESSES` map value), kept in the kernel
//! with no record per event, read periodically by userspace and copied into
//! the exec, exit-begin and exit records at those moments.

/// Members of `kmem:rss_stat` (`NR_MM_COUNTERS`): `MM_FILEPAGES` = 0,
/// `MM_ANONPAGES` = 1, `MM_SWAPENTS` = 2, `MM_SHMEMPAGES` = 3, from
/// include/linux/mm_types_task.h.
pub const RSS_MEMBER_COUNT: usize = 4;
/// `rss_stat` member index of file pages.
pub const MM_FILEPAGES: usize = 0;
/// `rss_stat` member index of anonymous pages.
pub const MM_ANONPAGES: usize = 1;
/// `rss_stat` member index of swap entries.
pub const MM_SWAPENTS: usize = 2;
/// `rss_stat` member index of shmem pages.
pub const MM_SHMEMPAGES: usize = 3;
/// [`ProcessCounters::rss_known`] with every member known.
pub const RSS_ALL_KNOWN: u64 = (1 << RSS_MEMBER_COUNT) - 1;
/// [`ProcessCounters::mm`] of a child that shares its parent's address
/// space (`CLONE_VM`) until it execs: no `mm_struct` has this address, so
/// no `rss_stat` event is counted for it.
pub const SHARED_PARENT_MM: u64 = u64::MAX;
/// [`ProcessCounters::exit_flags`] bit: the image began to exit.
pub const EXIT_BEGUN: u64 = 1 << 0;
/// [`ProcessCounters::exit_flags`] bit: CPython entered `Py_FinalizeEx`
/// (it still waits for non-daemon threads and runs `atexit` handlers before
/// it frees anything).
pub const FINALIZE_ENTERED: u64 = 1 << 1;
/// [`ProcessCounters::exit_flags`] bit: a child forked by a traced process
/// whose first `_PyThreadState_DeleteExcept` call (the clean-up
/// `os.fork()` runs in the child, not finalization) has not come yet.
pub const AFTER_FORK: u64 = 1 << 2;

/// Value of [`crate::PROCESSES_MAP`]: exact counters of one image of one
/// traced process (execve restarts them). All sizes in bytes. Counters are
/// added atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    /// Latest `kmem:rss_stat` size per member (index `MM_*`), in bytes;
    /// valid only where the `rss_known` bit is set.
    pub rss_bytes: [u64; RSS_MEMBER_COUNT],
    /// Bit `1 << MM_*` set once `rss_bytes[MM_*]` holds a value (from
    /// `rss_stat`, from the child's `mm` at fork, or written by userspace
    /// from /proc at attach).
    pub rss_known: u64,
    /// High-water mark of file + anon + shmem RSS seen by `rss_stat`.
    pub rss_peak_bytes: u64,
    /// Sum of `MM_ANONPAGES` increases (resident anonymous growth).
    pub anon_growth_bytes: u64,
    /// Sum of `MM_ANONPAGES` decreases (anonymous memory released).
    pub anon_release_bytes: u64,
    /// Sum of `MM_FILEPAGES` increases (file pages mapped resident).
    pub file_growth_bytes: u64,
    /// Sum of `MM_FILEPAGES` decreases.
    pub file_release_bytes: u64,
    /// Sum of `MM_SHMEMPAGES` increases (shared memory mapped resident).
    pub shmem_growth_bytes: u64,
    /// Sum of `MM_SHMEMPAGES` decreases.
    pub shmem_release_bytes: u64,
    /// Copy-on-write write faults times the page size.
    pub cow_fault_bytes: u64,
    /// Page faults that made a page resident or un-shared one
    /// (copy-on-write): the process's paging activity. Counted per page
    /// from `rss_stat` growth (the kernel folds each CPU's changes into
    /// the counter in batches of about 32 pages, so events undercount) and
    /// per copy-on-write fault.
    pub page_faults: u64,
    /// Bytes mapped by successful `mmap`.
    pub mmap_bytes: u64,
    /// Bytes unmapped by successful `munmap`.
    pub munmap_bytes: u64,
    /// Net growth from `mremap` calls that grew a mapping.
    pub mremap_grow_bytes: u64,
    /// Net shrink from `mremap` calls that shrank a mapping.
    pub mremap_shrink_bytes: u64,
    /// Heap growth by `brk`.
    pub brk_grow_bytes: u64,
    /// Heap shrink by `brk`.
    pub brk_shrink_bytes: u64,
    /// Bytes given back with `madvise(MADV_DONTNEED | MADV_FREE |
    /// MADV_REMOVE | MADV_DONTNEED_LOCKED)`.
    pub madvise_free_bytes: u64,
    /// mmap/munmap/mremap/brk/madvise calls seen.
    pub syscalls: u64,
    /// Current program break (end of the heap), 0 until first seen.
    pub brk_end: u64,
    /// Where the image is in its exit: bit [`EXIT_BEGUN`] once it began to
    /// exit (an [`crate::ExitBeginRecord`] was sent), bit
    /// [`FINALIZE_ENTERED`] once CPython entered `Py_FinalizeEx`, bit
    /// [`AFTER_FORK`] from fork to its first `_PyThreadState_DeleteExcept`;
    /// reset by execve.
    pub exit_flags: u64,
    /// Address of the `mm_struct` the RSS values belong to; 0 until the
    /// first `rss_stat` event, [`SHARED_PARENT_MM`] while a `CLONE_VM`
    /// child runs in its parent's. Events of another `mm` (the new image of
    /// an execve, before `sched_process_exec` restarts the counters; the
    /// parent's) are not counted.
    pub mm: u64,
    /// tgid of the parent as seen at fork (0 for a process added by userspace).
    pub parent_tgid: u32,
    /// Non-zero while a thread of the process is inside `execve`: from
    /// `sys_enter_execve` to `sys_exit_execve` (or `sched_process_exec`).
    /// `rss_stat` events are not counted then: a successful execve tears the
    /// old address space down while its `mm` is still the one followed.
    pub in_execve: u32,
    /// Successful `execve`s of the process since it entered the trace (its
    /// fork, or userspace adding it): userspace compares it with the exec
    /// records it has handled, so a process that exec'd while its record
    /// is still queued is not probed as the image before.
    pub exec_count: u32,
    /// Always zero.
    pub _pad: u32,
    /// The kernel's adaptive byte sampling of this image (its own
    /// bookkeeping, never read by userspace: each record carries the mean
    /// it was sampled with as its weight).
    pub sampling: SamplingState,
}

/// Time over which a process's growth sets its next sampling mean: long
/// enough that a burst of growth (a 10 MiB step is about 80 `rss_stat`
/// batches and 40 `mmap` calls) fits its budget. 1 s.
pub const SAMPLING_WINDOW_NS: u64 = 1_000_000_000;
/// Samples per [`SAMPLING_WINDOW_NS`] a process is given while it grows
/// slowly: 1,000 a second. A process growing faster than
/// `1000 * --sample-bytes` per second is sampled at `--sample-bytes`, as
/// with a fixed mean; one growing slower gets a smaller mean, down to
/// `--sample-bytes / SAMPLE_MEAN_MIN_DIVISOR`.
pub const SAMPLE_BUDGET_PER_WINDOW: u64 = 1_000;
/// The smallest adaptive mean is `--sample-bytes` divided by this (8 KiB
/// at the default 512 KiB: below the kernel's RSS batch of about 32 pages,
/// so every growth event of a slowly growing process is recorded at its
/// true size). 64.
pub const SAMPLE_MEAN_MIN_DIVISOR: u64 = 64;

/// Adaptive sampling of one process image (`ProcessCounters::sampling`),
/// kept by the kernel side: the mean in force and the current window.
///
/// At the start of each [`SAMPLING_WINDOW_NS`] window the mean becomes the
/// last window's sampled-event bytes divided by
/// [`SAMPLE_BUDGET_PER_WINDOW`] (the mean that would have spent the budget
/// on them), clamped to `[--sample-bytes / SAMPLE_MEAN_MIN_DIVISOR,
/// --sample-bytes]`; once a window has taken its budget of samples the mean
/// is `--sample-bytes` until it ends. An event is sampled with probability
/// `min(1, len / mean)` and weighs `max(len, mean)` with the mean of that
/// moment, so every sum of weights stays an unbiased estimate whatever the
/// mean did. Plain stores: two CPUs racing on one window lose a few bytes
/// of its count, never a weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplingState {
    /// The mean in force, bytes; 0 before the image's first memory event
    /// (which starts a window at `--sample-bytes`: a new image's rate is not
    /// known yet).
    pub mean_bytes: u64,
    /// When the current window began, `bpf_ktime_get_ns` ns.
    pub window_start_ns: u64,
    /// Bytes of the memory events smaller than `--sample-bytes` in the
    /// current window (larger ones are always recorded).
    pub window_bytes: u64,
    /// Records sampled in the current window.
    pub window_samples: u64,
}

impl ProcessCounters {
    /// file + anon + shmem resident bytes, counting unknown members as 0.
    pub const fn rss_total_bytes(&self) -> u64 {
        self.rss_member_bytes(MM_FILEPAGES)
            + self.rss_member_bytes(MM_ANONPAGES)
            + self.rss_member_bytes(MM_SHMEMPAGES)
    }

    /// `rss_bytes[member]` when known, else 0 (`member < RSS_MEMBER_COUNT`).
    pub const fn rss_member_bytes(&self, member: usize) -> u64 {
        if self.rss_known & (1 << member) != 0 {
            self.rss_bytes[member]
        } else {
            0
        }
    }
}

const _: () = {
    assert!(core::mem::size_of::<ProcessCounters>() == 8 * 31);
};
