//! Emission into the `RECORDS` ring buffer, the last kernel step of the data
//! flow (after `sample`, `native_stack` and the probes have built a record):
//! record headers, submit flags that wake the reader only when enough bytes
//! are pending, and the `DROPPED` count of records that could not be
//! reserved, so none is lost silently. `memtrace::events` drains the ring.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_ktime_get_ns,
};
use memtrace_common::{RecordHeader, RecordKind};

use crate::{
    counters::current_ids,
    maps::{DROPPED, RECORDS, WAKEUP_THRESHOLD_BYTES},
};

/// A header for a record of `kind` about `tgid`, made by the current thread.
#[inline(always)]
pub fn header(kind: RecordKind, tgid: u32) -> RecordHeader {
    let (_, tid) = current_ids();
    RecordHeader {
        kind: kind as u32,
        tgid,
        tid,
        _pad: 0,
        // SAFETY: helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    }
}

/// Submit flags: no wakeup until `WAKEUP_THRESHOLD_BYTES` are pending.
#[inline(always)]
pub fn submit_flags() -> u64 {
    if RECORDS.query(BPF_RB_AVAIL_DATA.into()) >= WAKEUP_THRESHOLD_BYTES.load() {
        BPF_RB_FORCE_WAKEUP.into()
    } else {
        BPF_RB_NO_WAKEUP.into()
    }
}

/// Counts one record that did not fit in the ring buffer.
#[inline(always)]
pub fn count_dropped() {
    if let Some(dropped) = DROPPED.get_ptr_mut(0) {
        // SAFETY: per-CPU slot of this CPU; programs do not nest on one CPU.
        unsafe { *dropped += 1 };
    }
}

/// Sends a fixed-size record without a stack (fork, exec, exit, address).
#[inline(always)]
pub fn emit<T: 'static>(record: T) {
    match RECORDS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(record);
            entry.submit(submit_flags());
        }
        None => count_dropped(),
    }
}
