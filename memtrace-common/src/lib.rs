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

pub use counters::*;
pub use python::*;
pub use records::*;

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

#[cfg(feature = "user")]
mod user {
    //! `aya::Pod` for the map values, so userspace can read and write maps.
    use super::{ProcessCounters, PyProcessInfo};

    // SAFETY: #[repr(C)], only integer fields, no implicit padding (asserted
    // in their modules).
    unsafe impl aya::Pod for ProcessCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyProcessInfo {}
}
