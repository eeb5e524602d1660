//! Atomic updates of a traced process's `ProcessCounters` (the `PROCESSES`
//! map value): the exact totals that userspace reads periodically.
//! Several CPUs may update one process at once, so every read-modify-write
//! is one BPF atomic instruction (`BPF_ATOMIC`, kernel >= 5.12 for the
//! fetching forms).
//!
//! `core::sync::atomic` has no read-modify-write operations on
//! `bpfel-unknown-none` (its `target_has_atomic` lists only load/store),
//! so the BPF build uses the compiler intrinsics, which LLVM lowers to
//! `BPF_ATOMIC`; the host build (type-checking only) uses `AtomicU64`.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use memtrace_common::ProcessCounters;

use crate::maps::PROCESSES;

/// Ids of the current task: `(tgid, tid)`.
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// The counters of `tgid` if it is traced.
#[inline(always)]
pub fn traced(tgid: u32) -> Option<*mut ProcessCounters> {
    PROCESSES.get_ptr_mut(tgid)
}

#[cfg(target_arch = "bpf")]
mod imp {
    use core::intrinsics::{atomic_and, atomic_or, atomic_xadd, atomic_xchg, AtomicOrdering};

    #[inline(always)]
    pub unsafe fn fetch_add(field: *mut u64, value: u64) -> u64 {
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(field, value) }
    }

    #[inline(always)]
    pub unsafe fn fetch_or(field: *mut u64, value: u64) -> u64 {
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(field, value) }
    }

    #[inline(always)]
    pub unsafe fn fetch_and(field: *mut u64, value: u64) -> u64 {
        unsafe { atomic_and::<u64, u64, { AtomicOrdering::Relaxed }>(field, value) }
    }

    #[inline(always)]
    pub unsafe fn swap(field: *mut u64, value: u64) -> u64 {
        unsafe { atomic_xchg::<u64, { AtomicOrdering::Relaxed }>(field, value) }
    }
}

#[cfg(not(target_arch = "bpf"))]
mod imp {
    use core::sync::atomic::{AtomicU64, Ordering};

    #[inline(always)]
    pub unsafe fn fetch_add(field: *mut u64, value: u64) -> u64 {
        unsafe { AtomicU64::from_ptr(field) }.fetch_add(value, Ordering::Relaxed)
    }

    #[inline(always)]
    pub unsafe fn fetch_or(field: *mut u64, value: u64) -> u64 {
        unsafe { AtomicU64::from_ptr(field) }.fetch_or(value, Ordering::Relaxed)
    }

    #[inline(always)]
    pub unsafe fn fetch_and(field: *mut u64, value: u64) -> u64 {
        unsafe { AtomicU64::from_ptr(field) }.fetch_and(value, Ordering::Relaxed)
    }

    #[inline(always)]
    pub unsafe fn swap(field: *mut u64, value: u64) -> u64 {
        unsafe { AtomicU64::from_ptr(field) }.swap(value, Ordering::Relaxed)
    }
}

/// Atomically adds `value` to the counter at `field`.
///
/// # Safety
/// `field` points into a live `PROCESSES` value (8-byte aligned map memory).
#[inline(always)]
pub unsafe fn add(field: *mut u64, value: u64) {
    unsafe { imp::fetch_add(field, value) };
}

/// Atomically sets `bits` in the word at `field`, returning the old word.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn set_bits(field: *mut u64, bits: u64) -> u64 {
    unsafe { imp::fetch_or(field, bits) }
}

/// Atomically clears `bits` in the word at `field`, returning the old word.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn clear_bits(field: *mut u64, bits: u64) -> u64 {
    unsafe { imp::fetch_and(field, !bits) }
}

/// Atomically stores `value` at `field`, returning the old value.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn swap(field: *mut u64, value: u64) -> u64 {
    unsafe { imp::swap(field, value) }
}
