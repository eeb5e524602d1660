//! Records and map values shared by the kernel side (`memtrace-ebpf`) and the
//! userspace aggregator (`memtrace`): the wire format of the ring buffer and
//! the layout of every BPF map value.
//!
//! Every type is `#[repr(C)]`, has no implicit padding (explicit `_pad`
//! fields instead) and its size is asserted at compile time, so both sides
//! agree byte for byte. Ring-buffer records ([`records`]) start with a
//! [`RecordHeader`] whose `kind` says which record follows; userspace checks
//! the length before reading (see `memtrace::events::decode`). Map values are
//! the per-process counters ([`counters`]) and the CPython layout of a
//! process ([`python`]).
#![no_std]
#![deny(missing_docs)]

pub mod counters;
pub mod python;
pub mod records;
pub mod sampler;

pub use counters::*;
pub use python::*;
pub use records::*;
pub use sampler::*;

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
/// Name of the array map (`u64` per slot) of exponential variates, in
/// bytes, that allocator-mode sampling draws from (filled by userspace).
pub const ALLOC_EXP_DRAWS_MAP: &str = "ALLOC_EXP_DRAWS";
/// Slots of [`ALLOC_EXP_DRAWS_MAP`]: a power of two, indexed by a random
/// draw masked with `ALLOC_EXP_DRAWS_LEN - 1`.
pub const ALLOC_EXP_DRAWS_LEN: u32 = 4096;
/// Name of the hash map `LiveKey -> LiveBlock` of sampled blocks not yet
/// freed (allocator mode).
pub const ALLOC_LIVE_MAP: &str = "ALLOC_LIVE";
/// Name of the per-CPU array of allocator-mode counters (`ALLOC_STAT_*`
/// slots, one `u64` each).
pub const ALLOC_STATS_MAP: &str = "ALLOC_STATS";
/// [`ALLOC_STATS_MAP`] slot: sampled blocks that could not be inserted in
/// the live set (it was full); their frees are not seen.
pub const ALLOC_STAT_LIVE_FULL: u32 = 0;
/// [`ALLOC_STATS_MAP`] slot: allocator calls the uprobes saw (outermost
/// calls that returned a block).
pub const ALLOC_STAT_CALLS: u32 = 1;
/// Slots of [`ALLOC_STATS_MAP`].
pub const ALLOC_STAT_SLOTS: u32 = 2;

/// Key of [`ALLOC_LIVE_MAP`]: a block of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveKey {
    /// The process (thread-group id).
    pub tgid: u32,
    /// Always zero.
    pub _pad: u32,
    /// The block's address.
    pub addr: u64,
}

/// Value of [`ALLOC_LIVE_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBlock {
    /// Requested size, in bytes.
    pub size_bytes: u64,
}

const _: () = {
    assert!(core::mem::size_of::<LiveKey>() == 16);
    assert!(core::mem::size_of::<LiveBlock>() == 8);
};

#[cfg(feature = "user")]
mod user {
    //! `aya::Pod` for the map values, so userspace can read and write maps.
    use super::{LiveBlock, LiveKey, ProcessCounters, PyProcessInfo};

    // SAFETY: #[repr(C)], only integer fields, no implicit padding (asserted
    // in their modules).
    unsafe impl aya::Pod for ProcessCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyProcessInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveBlock {}
}
