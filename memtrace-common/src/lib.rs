//! Records and map values shared by the kernel side (`memtrace-ebpf`) and the
//! userspace aggregator (`memtrace`): the wire format of the ring buffer and
//! the layout of every BPF map value.
//!
//! Every type is `#[repr(C)]`, has no implicit padding (explicit `_pad`
//! fields instead) and its size is asserted at compile time, so both sides
//! agree byte for byte. Ring-buffer records start with a [`RecordHeader`]
//! whose `kind` says which record follows; userspace checks the length before
//! reading (see `memtrace::events::decode`).
#![no_std]
#![deny(missing_docs)]

/// Most Python frames one stack walk records; deeper stacks are cut at the
/// innermost `MAX_FRAMES` frames and flagged [`STACK_TRUNCATED`].
pub const MAX_FRAMES: usize = 64;

/// Size of one page on x86-64, in bytes: the unit of a page fault.
pub const PAGE_SIZE_BYTES: u64 = 4096;

/// Name of the ring buffer map (`BPF_MAP_TYPE_RINGBUF`) carrying records.
pub const RECORDS_MAP: &str = "RECORDS";
/// Name of the hash map `tgid (u32) -> ProcessCounters` of traced processes.
pub const PROCESSES_MAP: &str = "PROCESSES";
/// Name of the hash map `tgid (u32) -> PyProcessInfo` of Python processes.
pub const PY_PROCESSES_MAP: &str = "PY_PROCESSES";
/// Name of the per-CPU array (one `u64` slot) counting records that could
/// not be reserved in the ring buffer.
pub const DROPPED_MAP: &str = "DROPPED";

/// Tag in [`RecordHeader::kind`]. Values are stable on the wire; new kinds
/// take new numbers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A traced process forked: [`ForkRecord`].
    Fork = 1,
    /// A traced process called execve: [`ExecRecord`].
    Exec = 2,
    /// The last thread of a traced process exited: [`ExitRecord`].
    Exit = 3,
    /// A sampled memory event with its Python stack: [`MemoryRecord`].
    Memory = 16,
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    /// Maps a wire tag to its kind; an unknown tag is returned as the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        match value {
            1 => Ok(Self::Fork),
            2 => Ok(Self::Exec),
            3 => Ok(Self::Exit),
            16 => Ok(Self::Memory),
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

/// `sched:sched_process_fork` of a traced process that created a new process
/// (not a thread). The header's `tgid`/`tid` are the parent's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkRecord {
    /// Common header, `kind == RecordKind::Fork`.
    pub header: RecordHeader,
    /// tgid of the new process; the kernel side has already added it to
    /// [`PROCESSES_MAP`] (and copied the parent's [`PyProcessInfo`]).
    pub child_tgid: u32,
    /// Always zero.
    pub _pad: u32,
}

/// `sched:sched_process_exec` of a traced process: its address space was
/// replaced, so its Python layout (if any) is gone until userspace probes it
/// again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecRecord {
    /// Common header, `kind == RecordKind::Exec`.
    pub header: RecordHeader,
}

/// `sched:sched_process_exit` with `group_dead`: the traced process is gone.
/// Its [`ProcessCounters`] stay in the map until userspace reads and removes
/// them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitRecord {
    /// Common header, `kind == RecordKind::Exit`.
    pub header: RecordHeader,
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
    /// `madvise(MADV_DONTNEED | MADV_FREE)` gave back `[addr, addr + len_bytes)`.
    MadviseFree = 9,
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
            other => return Err(other),
        })
    }
}

/// [`MemoryRecord::stack_status`] bit: the stack had more than
/// [`MAX_FRAMES`] frames; the outermost ones are missing.
pub const STACK_TRUNCATED: u32 = 1 << 0;
/// Bit: a read of the frame chain failed (page not resident or garbage);
/// the frames before the failure are kept.
pub const STACK_READ_ERROR: u32 = 1 << 1;
/// Bit: the process has no [`PyProcessInfo`] (not Python, or not probed yet).
pub const STACK_NO_PYTHON: u32 = 1 << 2;
/// Bit: the thread has no Python thread state (a native thread, or Python
/// not initialised yet).
pub const STACK_NO_THREAD_STATE: u32 = 1 << 3;

/// One Python frame as read in BPF, innermost first in [`MemoryRecord::frames`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Address of the frame's `PyCodeObject` in the traced process.
    pub code_addr: u64,
    /// Index of the current instruction in code units (`_Py_CODEUNIT`, 2
    /// bytes) from `co_code_adaptive`; -1 when the frame has not started.
    pub instr_index: i32,
    /// `co_firstlineno` read from the code object in BPF: userspace accepts a
    /// cached code object only if this matches (guards against address reuse).
    pub first_lineno: u32,
}

/// A sampled memory event with the Python stack of the thread that caused it
/// (`kind == RecordKind::Memory`). 1,104 bytes.
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
    /// Start address of the range (see [`MemoryEvent`] for each event).
    pub addr: u64,
    /// True size of this event, in bytes.
    pub len_bytes: u64,
    /// Sampling weight, in bytes (>= `len_bytes`).
    pub weight_bytes: u64,
    /// User instruction pointer of the innermost native frame (the faulting
    /// instruction for faults, the syscall return address for syscalls), or 0
    /// when unknown.
    pub native_ip: u64,
    /// Event flags: `mmap` `flags | prot << 32`; `madvise` advice; `mremap`
    /// flags; 0 otherwise.
    pub flags: u64,
    /// Number of valid entries in `frames`.
    pub frame_count: u32,
    /// Always zero.
    pub _pad: u32,
    /// Python frames, innermost first; entries past `frame_count` are garbage.
    pub frames: [PyFrame; MAX_FRAMES],
}

/// Offsets (bytes) into CPython's internal structs that the BPF frame walk
/// needs, for one minor version. Filled by userspace from its version table
/// (`memtrace::python::offsets`); sources are given there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyOffsets {
    /// `PyThreadState.cframe` (3.11, 3.12), or [`NO_OFFSET`] when the thread
    /// state points at the current frame directly (3.13+).
    pub tstate_cframe: u16,
    /// `_PyCFrame.current_frame` when `tstate_cframe` is set, else
    /// `PyThreadState.current_frame`.
    pub current_frame: u16,
    /// `_PyInterpreterFrame.f_code` / `f_executable`.
    pub frame_code: u16,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u16,
    /// `_PyInterpreterFrame.prev_instr` / `instr_ptr`.
    pub frame_instr_ptr: u16,
    /// `_PyInterpreterFrame.owner` (u8).
    pub frame_owner: u16,
    /// Frames whose `owner` is >= this are interpreter entry frames and are
    /// skipped (3 = `FRAME_OWNED_BY_CSTACK` on 3.12+); [`NO_OFFSET`] on 3.11.
    pub owner_skip_min: u16,
    /// `PyCodeObject.co_firstlineno` (i32).
    pub code_firstlineno: u16,
    /// `PyCodeObject.co_code_adaptive` (= `PyCode_Type.tp_basicsize`).
    pub code_adaptive: u16,
    /// Always zero.
    pub _pad: [u16; 3],
}

/// "No such field" in [`PyOffsets`].
pub const NO_OFFSET: u16 = u16::MAX;

/// Value of [`PY_PROCESSES_MAP`]: how to walk one process's Python stacks.
/// Copied to a child by the fork program (same address space layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcessInfo {
    /// `PY_VERSION_HEX` of the interpreter (e.g. `0x030b07f0` for 3.11.7).
    pub version_hex: u32,
    /// pthread TSS key of `_PyRuntime.autoTSSkey`; the BPF program reads the
    /// thread state at `fsbase + 0x310 + 16 * key + 8` (glibc x86-64, key < 32,
    /// see notes/python-stacks.md §4).
    pub tss_key: u32,
    /// Struct offsets for this version.
    pub offsets: PyOffsets,
}

/// [`ProcessCounters::rss_known`] bit per `kmem:rss_stat` member
/// (`MM_FILEPAGES` = 0, `MM_ANONPAGES` = 1, `MM_SWAPENTS` = 2,
/// `MM_SHMEMPAGES` = 3, from include/linux/mm_types_task.h).
pub const RSS_MEMBER_COUNT: usize = 4;
/// `rss_stat` member index of file pages.
pub const MM_FILEPAGES: usize = 0;
/// `rss_stat` member index of anonymous pages.
pub const MM_ANONPAGES: usize = 1;
/// `rss_stat` member index of swap entries.
pub const MM_SWAPENTS: usize = 2;
/// `rss_stat` member index of shmem pages.
pub const MM_SHMEMPAGES: usize = 3;

/// Value of [`PROCESSES_MAP`]: exact counters of one traced process, kept in
/// the kernel (no record per event) and read periodically by userspace.
/// All sizes in bytes. Counters are added atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    /// Latest `kmem:rss_stat` size per member (index `MM_*`), in bytes;
    /// valid only where the `rss_known` bit is set.
    pub rss_bytes: [u64; RSS_MEMBER_COUNT],
    /// Bit `1 << MM_*` set once `rss_bytes[MM_*]` holds a value (from
    /// `rss_stat` or written by userspace from /proc at attach).
    pub rss_known: u64,
    /// High-water mark of file + anon + shmem RSS seen by `rss_stat`.
    pub rss_peak_bytes: u64,
    /// Sum of `MM_ANONPAGES` increases (resident anonymous growth).
    pub anon_growth_bytes: u64,
    /// Sum of `MM_ANONPAGES` decreases (anonymous memory released).
    pub anon_release_bytes: u64,
    /// Copy-on-write write faults times the page size.
    pub cow_fault_bytes: u64,
    /// `exceptions:page_fault_user` events seen.
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
    /// Bytes given back with `madvise(MADV_DONTNEED | MADV_FREE)`.
    pub madvise_free_bytes: u64,
    /// mmap/munmap/mremap/brk/madvise calls seen.
    pub syscalls: u64,
    /// Current program break (end of the heap), 0 until first seen.
    pub brk_end: u64,
    /// tgid of the parent as seen at fork (0 for a process added by userspace).
    pub parent_tgid: u32,
    /// `kmem:rss_stat` `mm_id` (a hash of the `mm_struct` address) of the
    /// address space the RSS values belong to; 0 until the first event. A
    /// different id means execve replaced the address space: RSS values and
    /// the high-water mark restart from zero.
    pub mm_id: u32,
}

#[cfg(feature = "user")]
mod user {
    //! `aya::Pod` for the map values, so userspace can read and write maps.
    use super::{ProcessCounters, PyProcessInfo};

    // SAFETY: #[repr(C)], only integer fields, no implicit padding (asserted below).
    unsafe impl aya::Pod for ProcessCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyProcessInfo {}
}

const _: () = {
    assert!(core::mem::size_of::<RecordHeader>() == 24);
    assert!(core::mem::size_of::<ForkRecord>() == 32);
    assert!(core::mem::size_of::<ExecRecord>() == 24);
    assert!(core::mem::size_of::<ExitRecord>() == 24);
    assert!(core::mem::size_of::<PyFrame>() == 16);
    assert!(core::mem::size_of::<MemoryRecord>() == 80 + 16 * MAX_FRAMES);
    assert!(core::mem::size_of::<PyOffsets>() == 24);
    assert!(core::mem::size_of::<PyProcessInfo>() == 32);
    assert!(core::mem::size_of::<ProcessCounters>() == 8 * 19 + 8);
};
