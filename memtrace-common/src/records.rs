//! Ring-buffer records: what the kernel side tells userspace, in the order
//! it happened (one ring buffer for all CPUs, so a fork record precedes
//! every record of the child, and an exit record follows every record of
//! the process).

use crate::{counters::ProcessCounters, python::PyFrame, python::MAX_FRAMES, RSS_MEMBER_COUNT};

/// Tag in [`RecordHeader::kind`]. Values are stable on the wire; new kinds
/// take new numbers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A traced process forked: [`ForkRecord`].
    Fork = 1,
    /// A traced process's execve replaced its image: [`ExecRecord`].
    Exec = 2,
    /// The last thread of a traced process exited: [`ExitRecord`].
    Exit = 3,
    /// A traced process began to exit: [`ExitBeginRecord`].
    ExitBegin = 4,
    /// A sampled memory event with its Python stack: [`MemoryRecord`].
    Memory = 16,
    /// An exact change of the address space that gives memory back or moves
    /// it: [`AddressRecord`].
    Address = 17,
    /// A sampled heap block allocation (allocator mode): [`AllocRecord`].
    Alloc = 32,
    /// A sampled heap block was freed (allocator mode): [`FreeRecord`].
    Free = 33,
    /// The user registers and stack of the thread at a sampled allocation
    /// (allocator mode) or sampled fault, sent right before its
    /// [`AllocRecord`] or [`MemoryRecord`]: [`NativeStackRecord`].
    NativeStack = 34,
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    /// Maps a wire tag to its kind; an unknown tag is returned as the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        match value {
            1 => Ok(Self::Fork),
            2 => Ok(Self::Exec),
            3 => Ok(Self::Exit),
            4 => Ok(Self::ExitBegin),
            16 => Ok(Self::Memory),
            17 => Ok(Self::Address),
            32 => Ok(Self::Alloc),
            33 => Ok(Self::Free),
            34 => Ok(Self::NativeStack),
            other => Err(other),
        }
    }
}

/// First 24 bytes of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// A [`RecordKind`] value.
    pub kind: u32,
    /// Process (thread-group id) the record is about.
    pub tgid: u32,
    /// Thread that was running when the record was made.
    pub tid: u32,
    /// Always zero; keeps `ts_ns` 8-byte aligned.
    pub _pad: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
}

/// `sched_process_fork` of a traced process that created a new process
/// (not a thread). The header's `tgid`/`tid` are the parent's. Sent before
/// the child first runs (the tracepoint fires before `wake_up_new_task`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkRecord {
    /// Common header, `kind == RecordKind::Fork`.
    pub header: RecordHeader,
    /// tgid of the new process; the kernel side has already added it to
    /// [`crate::PROCESSES_MAP`] (and copied the parent's
    /// [`crate::PyProcessInfo`]).
    pub child_tgid: u32,
    /// Non-zero when the child shares its parent's address space
    /// (`CLONE_VM`: `vfork()`, `posix_spawn()`, as `subprocess` and
    /// `os.system` use) until it execs: it owns no memory of its own then,
    /// so `child_rss_bytes` are 0 and the parent's RSS changes are not
    /// counted for it.
    pub shares_parent_mm: u32,
    /// The child's `task_struct.start_boottime` (CLOCK_BOOTTIME ns): with the
    /// tgid, the process's identity (`/proc/PID/stat` field 22 is the same
    /// instant in clock ticks).
    pub child_start_boottime_ns: u64,
    /// The child's RSS per `rss_stat` member (index `MM_*`) right after
    /// fork, in bytes, read from its `mm_struct.rss_stat` counters: what it
    /// inherited (anonymous pages shared copy-on-write; file pages of
    /// private mappings that had anonymous pages).
    pub child_rss_bytes: [u64; RSS_MEMBER_COUNT],
}

/// `sched:sched_process_exec` of a traced process: execve replaced its
/// address space. `counters` are the old image's last values (events of the
/// new address space before this record are not counted); the kernel side
/// restarts the counters from zero for the new image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecRecord {
    /// Common header, `kind == RecordKind::Exec`.
    pub header: RecordHeader,
    /// The replaced image's final counters.
    pub counters: ProcessCounters,
}

/// Why a process began to exit ([`ExitBeginRecord::reason`]). Stable values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitBeginReason {
    /// CPython's finalization is about to free objects: a uprobe on
    /// `_PyThreadState_DeleteExcept` after one on `Py_FinalizeEx` or
    /// `Py_Exit` (3.11, 3.12; Python/pylifecycle.c: `Py_FinalizeEx` first
    /// joins the non-daemon threads and runs the `atexit` handlers), or on
    /// `Py_FinalizeEx`/`Py_Exit` alone where the former is not exported
    /// (3.13+).
    PythonFinalize = 1,
    /// `exit_group(2)` was called (`syscalls:sys_enter_exit_group`): C
    /// `exit()`, `os._exit()`; after Python's finalization when there is one.
    ExitGroup = 2,
}

impl TryFrom<u32> for ExitBeginReason {
    type Error = u32;

    /// Maps a wire value to its reason; an unknown value is the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        match value {
            1 => Ok(Self::PythonFinalize),
            2 => Ok(Self::ExitGroup),
            other => Err(other),
        }
    }
}

/// A traced process began to exit, once per image: its memory at this
/// moment is where its life ends, before the interpreter's finalization and
/// the kernel's teardown give memory back. A process killed by a signal has
/// no such record: its [`ExitRecord`] is taken before `exit_mm()` (Linux
/// 6.16+ calls `trace_sched_process_exit` before it, kernel/exit.c), so its
/// counters there are still its last ones (on older kernels its last
/// periodic reading is).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitBeginRecord {
    /// Common header, `kind == RecordKind::ExitBegin`.
    pub header: RecordHeader,
    /// An [`ExitBeginReason`] value.
    pub reason: u32,
    /// Always zero.
    pub _pad: u32,
    /// The counters at this moment.
    pub counters: ProcessCounters,
}

/// `sched:sched_process_exit` of the last thread (`signal->live` reached
/// 0): the traced process is gone.
/// The kernel side removes it from its maps after sending this record, so
/// a new process reusing the tgid starts fresh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitRecord {
    /// Common header, `kind == RecordKind::Exit`.
    pub header: RecordHeader,
    /// `task_struct.exit_code` of the last thread: `status << 8` for a normal
    /// exit, the signal number (| 0x80 with a core dump) for a fatal signal,
    /// as `wait(2)` encodes it.
    pub exit_code: u32,
    /// Non-zero when the process's address space was already released when
    /// the record was made (kernels before 6.16 run `sched_process_exit`
    /// after `exit_mm()`): `counters` then hold memory after the teardown.
    pub mm_released: u32,
    /// Non-zero when the kernel's OOM killer chose the process as its
    /// victim: `signal_struct.oom_mm` was set (mm/oom_kill.c
    /// `mark_oom_victim`, for the global and the cgroup OOM killer alike).
    pub oom_victim: u32,
    /// Always zero; keeps `counters` 8-byte aligned.
    pub _pad: u32,
    /// The final counters (before `exit_mm()` unless `mm_released`).
    pub counters: ProcessCounters,
}

/// What a [`MemoryRecord`] describes. Values are stable on the wire.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryEvent {
    /// Resident anonymous memory grew: `kmem:rss_stat` saw `MM_ANONPAGES` rise
    /// in the current process (first touch of an anonymous page, usually in
    /// the page fault whose address and instruction are in the record).
    AnonGrowth = 1,
    /// A write fault on a present page (`exceptions:page_fault_user`,
    /// `error_code` has PROTECTION and WRITE set): copy-on-write un-sharing of
    /// a page, typically one inherited from the parent at fork. One page.
    CowFault = 2,
    /// `mmap` succeeded: `addr` is the returned start, `len_bytes` its length.
    Mmap = 3,
    /// `munmap` succeeded on `[addr, addr + len_bytes)`.
    Munmap = 4,
    /// `mremap` grew a mapping: `addr` is the new start, `len_bytes` the growth.
    MremapGrow = 5,
    /// `mremap` shrank a mapping by `len_bytes`.
    MremapShrink = 6,
    /// `brk` moved the heap end up by `len_bytes`; `addr` is the old end.
    BrkGrow = 7,
    /// `brk` moved the heap end down by `len_bytes`; `addr` is the new end.
    BrkShrink = 8,
    /// `madvise(MADV_DONTNEED | MADV_FREE | MADV_REMOVE |
    /// MADV_DONTNEED_LOCKED)` gave back `[addr, addr + len_bytes)`.
    MadviseFree = 9,
    /// Resident file-backed memory grew: `rss_stat` saw `MM_FILEPAGES` rise
    /// (a fault mapped page-cache pages of a file mapping).
    FileGrowth = 10,
    /// Resident shared memory grew: `rss_stat` saw `MM_SHMEMPAGES` rise
    /// (shmem, tmpfs, memfd, shared anonymous mappings).
    ShmemGrowth = 11,
}

impl TryFrom<u32> for MemoryEvent {
    type Error = u32;

    /// Maps a wire value to its event; an unknown value is returned as the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => Self::AnonGrowth,
            2 => Self::CowFault,
            3 => Self::Mmap,
            4 => Self::Munmap,
            5 => Self::MremapGrow,
            6 => Self::MremapShrink,
            7 => Self::BrkGrow,
            8 => Self::BrkShrink,
            9 => Self::MadviseFree,
            10 => Self::FileGrowth,
            11 => Self::ShmemGrowth,
            other => return Err(other),
        })
    }
}

/// A sampled memory event with the Python stack of the thread that caused it
/// (`kind == RecordKind::Memory`). 1,112 bytes.
///
/// Sampling: an event of `len_bytes` is recorded with probability
/// `p = min(1, len_bytes / sample_interval_bytes)` and carries
/// `weight_bytes = len_bytes / p`, so summing `weight_bytes` estimates the
/// true total without bias. Exact per-process totals are in
/// [`ProcessCounters`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRecord {
    /// Common header.
    pub header: RecordHeader,
    /// A [`MemoryEvent`] value.
    pub event: u32,
    /// `STACK_*` bits.
    pub stack_status: u32,
    /// Start address of the range (see [`MemoryEvent`] for each event); for
    /// growth events the faulting address, 0 when unknown.
    pub addr: u64,
    /// True size of this event, in bytes.
    pub len_bytes: u64,
    /// Sampling weight, in bytes (>= `len_bytes`).
    pub weight_bytes: u64,
    /// User instruction pointer of the innermost native frame (the faulting
    /// instruction for user-mode faults), or 0 when unknown (syscalls, faults
    /// taken in the kernel on the process's behalf).
    pub native_ip: u64,
    /// Event flags: `mmap` `flags | prot << 32`; `madvise` advice; `mremap`
    /// flags; 0 otherwise.
    pub flags: u64,
    /// The process's file + anon + shmem RSS right after the event, in bytes
    /// (the kernel's counters): when memory was at its highest.
    pub rss_bytes: u64,
    /// Number of valid entries in `frames`.
    pub frame_count: u32,
    /// Always zero.
    pub _pad: u32,
    /// Python frames, innermost first; entries past `frame_count` are garbage.
    pub frames: [PyFrame; MAX_FRAMES],
}

/// What an [`AddressRecord`] describes. Stable values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressOp {
    /// `munmap(addr, len)` succeeded.
    Munmap = 1,
    /// `madvise(addr, len, MADV_DONTNEED | MADV_FREE | MADV_REMOVE |
    /// MADV_DONTNEED_LOCKED)` succeeded.
    MadviseFree = 2,
    /// `brk` moved the heap end down: `[addr, addr + len)` is gone.
    BrkShrink = 3,
    /// `mremap(addr, len, new_len)` returned `new_addr`: the first
    /// `min(len, new_len)` bytes moved there; a shrink gave the rest back.
    Mremap = 4,
    /// `mmap(MAP_FIXED)` at `[addr, addr + len)` replaced whatever was mapped
    /// there.
    MmapFixed = 5,
}

impl TryFrom<u32> for AddressOp {
    type Error = u32;

    /// Maps a wire value to its operation; an unknown value is the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => Self::Munmap,
            2 => Self::MadviseFree,
            3 => Self::BrkShrink,
            4 => Self::Mremap,
            5 => Self::MmapFixed,
            other => return Err(other),
        })
    }
}

/// An exact address-space change that releases or moves memory, sent for
/// every such successful syscall of a traced process (not sampled, no
/// stack): userspace releases the sampled pages it covers from the paths
/// that hold them (`memtrace::held`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressRecord {
    /// Common header, `kind == RecordKind::Address`.
    pub header: RecordHeader,
    /// An [`AddressOp`] value.
    pub op: u32,
    /// Always zero.
    pub _pad: u32,
    /// Start of the range, page-aligned.
    pub addr: u64,
    /// Length of the range, in bytes, rounded up to whole pages.
    pub len_bytes: u64,
    /// `Mremap`: the new start; 0 otherwise.
    pub new_addr: u64,
    /// `Mremap`: the new length in bytes (whole pages); 0 otherwise.
    pub new_len_bytes: u64,
    /// The process's file + anon + shmem RSS right after the call, in bytes.
    pub rss_bytes: u64,
}

/// Which allocator entry point made an [`AllocRecord`] (the outermost one
/// on the thread: a nested call, e.g. glibc `malloc` inside
/// `PyObject_Malloc`, is not recorded again). Stable values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocCall {
    /// `malloc(size)`, `PyObject_Malloc`, `PyMem_Malloc`, `PyMem_RawMalloc`.
    Malloc = 1,
    /// `calloc(n, size)` and the CPython `*_Calloc` functions: `n * size`.
    Calloc = 2,
    /// `realloc(ptr, size)` and the CPython `*_Realloc` functions: the old
    /// block, if sampled, got a [`FreeRecord`] first.
    Realloc = 3,
    /// glibc `aligned_alloc(alignment, size)`.
    AlignedAlloc = 4,
    /// glibc `posix_memalign(&ptr, alignment, size)`.
    PosixMemalign = 5,
}

impl TryFrom<u32> for AllocCall {
    type Error = u32;

    /// Maps a wire value to its call; an unknown value is the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => Self::Malloc,
            2 => Self::Calloc,
            3 => Self::Realloc,
            4 => Self::AlignedAlloc,
            5 => Self::PosixMemalign,
            other => return Err(other),
        })
    }
}

/// [`AllocRecord::flags`]: the block could not be put in the kernel's live
/// set (`ALLOC_LIVE` full), so its free will not be seen; counted in
/// [`ALLOC_STATS_MAP`](crate::ALLOC_STATS_MAP) too.
pub const ALLOC_UNTRACKED: u32 = 1;

/// [`AllocRecord::flags`]: the outermost call was one of CPython's
/// allocator API that pymalloc may serve (`PyObject_*`, `PyMem_*`; not
/// `PyMem_Raw*`, which always calls the C allocator), not glibc's `malloc`
/// family; its probes carry [`ALLOC_COOKIE_PYTHON_API`].
pub const ALLOC_PYTHON_API: u32 = 2;

/// [`AllocRecord::flags`]: the in-process sampler (`--alloc-hooks
/// sampler`) sampled the block and called its marker: the stack was taken
/// at the marker's entry, under the sampler's own frames, and
/// `native_ip` is the marker's, not a return address.
pub const ALLOC_SAMPLER: u32 = 4;

/// The attach cookie (`bpf_get_attach_cookie`) of the entry probes on
/// CPython's allocator API; glibc's carry 0.
pub const ALLOC_COOKIE_PYTHON_API: u64 = 1;

/// Or'ed into an `AllocThread` cookie by the sampler's marker probe (not
/// an attach cookie): the record gets [`ALLOC_SAMPLER`].
pub const ALLOC_COOKIE_SAMPLER: u64 = 2;

/// A sampled heap allocation of a traced process (allocator mode), sent from
/// the uretprobe of the outermost allocator call on the thread, with the
/// thread's Python stack.
///
/// Sampling is a Poisson process over allocated bytes with mean
/// `sample_interval_bytes`: a block of `size_bytes = s` is sampled with
/// probability `1 - exp(-s / mean)`, so userspace weighs it
/// `s / (1 - exp(-s / mean))` bytes (unbiased).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRecord {
    /// Common header, `kind == RecordKind::Alloc`.
    pub header: RecordHeader,
    /// An [`AllocCall`] value.
    pub call: u32,
    /// `STACK_*` bits.
    pub stack_status: u32,
    /// Address of the block the allocator returned.
    pub addr: u64,
    /// Requested size of the block, in bytes.
    pub size_bytes: u64,
    /// Return address of the allocator call (the instruction after the call
    /// in its caller), or 0.
    pub native_ip: u64,
    /// `ALLOC_*` bits.
    pub flags: u32,
    /// Number of valid entries in `frames`.
    pub frame_count: u32,
    /// Python frames, innermost first; entries past `frame_count` are garbage.
    pub frames: [PyFrame; MAX_FRAMES],
}

/// A sampled block of a traced process was freed (`free`, the CPython
/// `*_Free` functions, or the old block of a `realloc`). Sent only for
/// blocks in the kernel's live set: a free of an unsampled block costs one
/// hash lookup and sends nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeRecord {
    /// Common header, `kind == RecordKind::Free`.
    pub header: RecordHeader,
    /// Address of the freed block.
    pub addr: u64,
    /// Its size as allocated, in bytes.
    pub size_bytes: u64,
}

/// Bytes of user stack copied per read in a [`NativeStackRecord`]: the
/// copy starts at the stack pointer rounded down to this size, so every
/// read ends on a page boundary or inside a page and a stack whose top is
/// near still gives every whole chunk below its end.
pub const NATIVE_STACK_CHUNK_BYTES: usize = 1024;
/// Most chunks of user stack a [`NativeStackRecord`] carries.
pub const NATIVE_STACK_CHUNKS: usize = 16;
/// Most bytes of user stack a [`NativeStackRecord`] carries (16 KiB).
pub const NATIVE_STACK_BYTES: usize = NATIVE_STACK_CHUNK_BYTES * NATIVE_STACK_CHUNKS;

/// The user registers and the top of the user stack of a thread at a
/// sampled allocation (allocator mode: at the uretprobe of the outermost
/// allocator call, where `ip`, `sp` and `bp` are the caller's, right after
/// the call returned: `ip` is a return address) or at a sampled event of a
/// fault taken in user mode (`ip` is the faulting instruction). Sent right
/// before its [`AllocRecord`] or [`MemoryRecord`], with the same header
/// `tid` and `ts_ns`; userspace unwinds it with the binaries' CFI.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeStackRecord {
    /// Common header, `kind == RecordKind::NativeStack`; `tid` and `ts_ns`
    /// are those of the record that follows.
    pub header: RecordHeader,
    /// User instruction pointer (`rip`).
    pub ip: u64,
    /// User stack pointer (`rsp`).
    pub sp: u64,
    /// User frame pointer (`rbp`).
    pub bp: u64,
    /// User address of `stack[0]`: `sp` rounded down to
    /// [`NATIVE_STACK_CHUNK_BYTES`].
    pub stack_start: u64,
    /// Valid bytes of `stack` (whole chunks: reading stops at the first
    /// chunk that cannot be read, e.g. past the stack's top).
    pub stack_len_bytes: u32,
    /// Always zero.
    pub _pad: u32,
    /// A copy of user memory `[stack_start, stack_start + stack_len_bytes)`.
    pub stack: [u8; NATIVE_STACK_BYTES],
}

const _: () = {
    assert!(core::mem::size_of::<NativeStackRecord>() == 64 + NATIVE_STACK_BYTES);
    assert!(core::mem::size_of::<AllocRecord>() == 64 + 16 * MAX_FRAMES);
    assert!(core::mem::size_of::<FreeRecord>() == 40);
    assert!(core::mem::size_of::<RecordHeader>() == 24);
    assert!(core::mem::size_of::<ForkRecord>() == 72);
    assert!(core::mem::size_of::<ExecRecord>() == 24 + 248);
    assert!(core::mem::size_of::<ExitBeginRecord>() == 32 + 248);
    assert!(core::mem::size_of::<ExitRecord>() == 40 + 248);
    assert!(core::mem::size_of::<MemoryRecord>() == 88 + 16 * MAX_FRAMES);
    assert!(core::mem::size_of::<AddressRecord>() == 72);
};
