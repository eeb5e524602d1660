//! Maps and load-time globals of the kernel side: the contract with
//! userspace (`memtrace::bpf`). Map names and value layouts come from
//! `memtrace-common`; globals are set with `EbpfLoader::override_global`
//! under the names in `memtrace::bpf::globals`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    Global,
};
use memtrace_common::{
    LiveBlock, LiveKey, ProcessCounters, PyProcessInfo, ALLOC_EXP_DRAWS_LEN, ALLOC_STAT_SLOTS,
};

/// Most processes traced at once (one `PROCESSES` / `PY_PROCESSES` entry each).
pub const MAX_PROCESSES: u32 = 16_384;
/// Most threads with a memory syscall in flight at once (`PENDING_SYSCALLS`).
pub const MAX_PENDING_SYSCALLS: u32 = 16_384;
/// Size of the `RECORDS` ring buffer, in bytes.
pub const RECORDS_BYTES: u32 = 32 << 20;

/// Ring buffer of records (`memtrace_common::RECORDS_MAP`).
#[map]
pub static RECORDS: RingBuf = RingBuf::with_byte_size(RECORDS_BYTES, 0);

/// Traced processes: tgid -> exact counters (`memtrace_common::PROCESSES_MAP`).
#[map]
pub static PROCESSES: HashMap<u32, ProcessCounters> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// Python processes: tgid -> how to walk their stacks
/// (`memtrace_common::PY_PROCESSES_MAP`).
#[map]
pub static PY_PROCESSES: HashMap<u32, PyProcessInfo> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// Records that could not be reserved in `RECORDS`, one `u64` per CPU
/// (`memtrace_common::DROPPED_MAP`).
#[map]
pub static DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The last `exceptions:page_fault_user` or `page_fault_kernel` (a fault the
/// kernel took on a user address for the process, e.g. in `read()`) on this
/// CPU, read by the `kmem:rss_stat` event that the same fault raises right
/// after.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingFault {
    /// Thread that faulted.
    pub tid: u32,
    /// Non-zero once a growth event took this fault's address: a later
    /// growth with no fault of its own (e.g. `MAP_POPULATE`) gets none.
    pub consumed: u32,
    /// Faulting user address.
    pub address: u64,
    /// The faulting thread's saved user registers (`struct pt_regs *`), 0
    /// for a fault taken in the kernel: its instruction pointer is read only
    /// when a record is sent.
    pub user_regs: u64,
}

/// One [`PendingFault`] per CPU.
#[map]
pub static PENDING_FAULT: PerCpuArray<PendingFault> = PerCpuArray::with_max_entries(1, 0);

/// Arguments of a memory syscall between its `sys_enter_*` and `sys_exit_*`
/// tracepoints, keyed by tid.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingSyscall {
    /// A `memtrace_common::MemoryEvent` family: which syscall this is.
    pub syscall: u32,
    /// Always zero.
    pub _pad: u32,
    /// Syscall arguments as the `sys_enter_*` format lists them.
    pub args: [u64; 4],
}

/// Syscalls in flight: tid -> arguments. LRU so that a thread killed inside a
/// syscall cannot leak an entry forever.
#[map]
pub static PENDING_SYSCALLS: LruHashMap<u32, PendingSyscall> =
    LruHashMap::with_max_entries(MAX_PENDING_SYSCALLS, 0);

/// Most sampled heap blocks live at once, over all processes (allocator
/// mode): at the default 512 KiB mean, 32 GiB of live heap.
pub const MAX_LIVE_BLOCKS: u32 = 65_536;
/// Most threads with allocator state at once (allocator mode); LRU, so a
/// thread that exited gives its slot to a new one.
pub const MAX_ALLOC_THREADS: u32 = 16_384;

/// Allocator mode: one thread's state between an allocator's uprobe and its
/// uretprobe, and its sampling countdown.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocThread {
    /// Allocator calls in progress on the thread (nested calls: >1).
    pub depth: u32,
    /// The outermost call's `memtrace_common::AllocCall`.
    pub call: u32,
    /// The outermost call's stack pointer at entry.
    pub entry_sp: u64,
    /// The outermost call's requested size, in bytes.
    pub size_bytes: u64,
    /// `realloc`'s old block, 0 otherwise.
    pub old_addr: u64,
    /// `posix_memalign`'s `void **memptr`, 0 otherwise.
    pub out_ptr: u64,
    /// Bytes still to allocate before the next sample; a fresh exponential
    /// draw after each sample (memoryless, so sampling stays Poisson).
    pub countdown_bytes: u64,
    /// The outermost call's probe cookie
    /// (`memtrace_common::ALLOC_COOKIE_PYTHON_API` or 0).
    pub cookie: u64,
}

/// Allocator state per thread: tid -> [`AllocThread`].
#[map]
pub static ALLOC_THREADS: LruHashMap<u32, AllocThread> =
    LruHashMap::with_max_entries(MAX_ALLOC_THREADS, 0);

/// Sampled blocks not yet freed (`memtrace_common::ALLOC_LIVE_MAP`). Not LRU:
/// a full map refuses the insert, which is counted, never silent.
#[map]
pub static ALLOC_LIVE: HashMap<LiveKey, LiveBlock> = HashMap::with_max_entries(MAX_LIVE_BLOCKS, 0);

/// Exponential variates with mean `SAMPLE_INTERVAL_BYTES`, in bytes
/// (`memtrace_common::ALLOC_EXP_DRAWS_MAP`, filled by userspace: BPF has no
/// floating point).
#[map]
pub static ALLOC_EXP_DRAWS: Array<u64> = Array::with_max_entries(ALLOC_EXP_DRAWS_LEN, 0);

/// Allocator-mode counters per CPU (`memtrace_common::ALLOC_STATS_MAP`).
#[map]
pub static ALLOC_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ALLOC_STAT_SLOTS, 0);

/// Mean sampling interval of memory records, in bytes, 1..=u32::MAX (1 =
/// record every event). Default 512 KiB.
#[unsafe(no_mangle)]
pub static SAMPLE_INTERVAL_BYTES: Global<u64> = Global::new(512 << 10);
/// Pending ring-buffer bytes above which a submit wakes the reader.
#[unsafe(no_mangle)]
pub static WAKEUP_THRESHOLD_BYTES: Global<u64> = Global::new(256 << 10);
/// Non-zero: a new process forked by a traced one is traced too.
#[unsafe(no_mangle)]
pub static FOLLOW_FORKS: Global<u32> = Global::new(1);
/// `offsetof(struct task_struct, thread.fsbase)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_FSBASE_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, tgid)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_TGID_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, pid)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_PID_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, exit_code)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_EXIT_CODE_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, start_boottime)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_START_BOOTTIME_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, signal)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_SIGNAL_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct signal_struct, live)` (`atomic_t`: threads not yet
/// exited), from the kernel's BTF.
#[unsafe(no_mangle)]
pub static SIGNAL_LIVE_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct signal_struct, oom_mm)` (`struct mm_struct *`, set
/// once the OOM killer chose the group), from the kernel's BTF.
#[unsafe(no_mangle)]
pub static SIGNAL_OOM_MM_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct task_struct, mm)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static TASK_MM_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct mm_struct, rss_stat)` (an array of `NR_MM_COUNTERS`
/// `struct percpu_counter`), from the kernel's BTF.
#[unsafe(no_mangle)]
pub static MM_RSS_STAT_OFFSET: Global<u64> = Global::new(0);
/// `sizeof(struct percpu_counter)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static PERCPU_COUNTER_SIZE: Global<u64> = Global::new(0);
/// `offsetof(struct percpu_counter, count)` (`s64`, in pages), from the
/// kernel's BTF.
#[unsafe(no_mangle)]
pub static PERCPU_COUNTER_COUNT_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct pt_regs, ip)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static PT_REGS_IP_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct pt_regs, sp)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static PT_REGS_SP_OFFSET: Global<u64> = Global::new(0);
/// `offsetof(struct pt_regs, bp)`, from the kernel's BTF.
#[unsafe(no_mangle)]
pub static PT_REGS_BP_OFFSET: Global<u64> = Global::new(0);
