//! Resident memory of traced processes (`rss_stat`): keeps each
//! process's RSS per member and its high-water mark, sums growth and
//! release per member, and samples growth of anonymous, file-backed and
//! shared memory with the Python stack (the first touch of a page raises
//! this event right after its page fault).

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use memtrace_common::{
    MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, PAGE_SIZE_BYTES,
    RSS_MEMBER_COUNT,
};

use crate::{
    counters::{add, current_ids, set_bits, swap, traced},
    kernel::{current_task, mm_member_pages, task_mm},
    maps::PENDING_FAULT,
    sample::{emit_memory, MemoryEventArgs},
};

const _: () = assert!(RSS_MEMBER_COUNT.is_power_of_two());

/// `rss_known` bits that make up the high-water mark: file + anon + shmem.
const PEAK_MEMBERS: u64 = (1 << MM_FILEPAGES) | (1 << MM_ANONPAGES) | (1 << MM_SHMEMPAGES);

/// BTF tracepoint `rss_stat(struct mm_struct *mm, int member)`
/// (include/trace/events/kmem.h; called by `add_mm_counter()` and friends
/// after the member changed). A BTF tracepoint builds no trace record: the
/// program reads the member's size (`percpu_counter.count`, what the
/// classic record's `size` holds) itself, and only for traced processes.
#[btf_tracepoint(function = "rss_stat")]
pub fn rss_stat(ctx: BtfTracePointContext) -> i32 {
    try_rss_stat(&ctx);
    0
}

fn try_rss_stat(ctx: &BtfTracePointContext) {
    let (tgid, tid) = current_ids();
    let Some(counters) = traced(tgid) else {
        return;
    };
    let mm: u64 = ctx.arg(0);
    let member: i32 = ctx.arg(1);
    let Ok(member) = usize::try_from(member) else {
        return;
    };
    if member >= RSS_MEMBER_COUNT || mm == 0 {
        return;
    }
    // Only the process's own address space counts: not a child's during
    // fork, another process's during direct reclaim, nor the old image torn
    // down inside an execve. (The teardown at exit comes after
    // `sched_process_exit` forgot the process.)
    // SAFETY: live map value of a traced process.
    if unsafe { (*counters).in_execve } != 0 || !unsafe { same_mm(counters, mm) } {
        return;
    }
    let size_bytes = mm_member_pages(mm, member) * PAGE_SIZE_BYTES;
    // SAFETY: live map value of a traced process; member < RSS_MEMBER_COUNT.
    let delta = unsafe { store_member(counters, member, size_bytes) };
    // SAFETY: as above.
    unsafe { update_peak(counters) };
    // SAFETY: as above.
    unsafe { account_member(tgid, tid, counters, member, delta) };
}

/// Whether `mm` is the address space the counters follow. A first one
/// (after attach, fork or exec) is adopted only when it is the current
/// task's own `task->mm`: `rss_stat` also fires in the traced process for
/// other address spaces (a child's page tables copied during fork, another
/// mm reached through `/proc/PID/mem` or reclaim), and adopting one of those
/// after an attach made a flat master's RSS the child's (13.4 -> 9.0 MiB).
/// A different one later is the new image of an execve whose
/// `sched_process_exec` has not restarted the counters yet, and is not
/// counted (member sizes are absolute: the next event of each member after
/// the restart carries them).
///
/// # Safety
/// `counters` is a live `PROCESSES` value.
#[inline(always)]
unsafe fn same_mm(counters: *mut ProcessCounters, mm: u64) -> bool {
    // SAFETY: see the function's contract.
    let value = unsafe { &mut *counters };
    if value.mm == 0 && mm == task_mm(current_task()) {
        value.mm = mm;
    }
    value.mm == mm
}

/// Stores `size_bytes` as member `member`'s RSS and returns the change
/// since the last known value (0 when it was not known).
///
/// # Safety
/// `counters` is a live `PROCESSES` value and `member < RSS_MEMBER_COUNT`.
#[inline(always)]
unsafe fn store_member(counters: *mut ProcessCounters, member: usize, size_bytes: u64) -> i64 {
    // The mask changes nothing (`member < RSS_MEMBER_COUNT`, a power of
    // two) but gives the verifier a bound on the register it indexes with;
    // the volatile read keeps LLVM from dropping it as redundant.
    // SAFETY: a read of a local.
    let member = unsafe { core::ptr::read_volatile(&member) } & (RSS_MEMBER_COUNT - 1);
    let bit = 1u64 << member;
    // SAFETY: see the function's contract; member < RSS_MEMBER_COUNT.
    let slot = unsafe { (&raw mut (*counters).rss_bytes).cast::<u64>().add(member) };
    // Swap, so concurrent threads of one process see consecutive values and
    // the deltas add up to the true change.
    // SAFETY: as above.
    let previous = unsafe { swap(slot, size_bytes) };
    // A plain read first: the member is known after its first event, and
    // the atomic is paid only then.
    // SAFETY: as above.
    if unsafe { (*counters).rss_known } & bit == 0
        // SAFETY: as above.
        && unsafe { set_bits(&raw mut (*counters).rss_known, bit) } & bit == 0
    {
        return 0;
    }
    size_bytes as i64 - previous as i64
}

/// Raises `rss_peak_bytes` to file + anon + shmem when all three are known.
///
/// # Safety
/// `counters` is a live `PROCESSES` value.
#[inline(always)]
unsafe fn update_peak(counters: *mut ProcessCounters) {
    // SAFETY: see the function's contract.
    let value = unsafe { &*counters };
    if value.rss_known & PEAK_MEMBERS != PEAK_MEMBERS {
        return;
    }
    let total = value.rss_total_bytes();
    // A racing thread may store a slightly lower peak; the next event of a
    // growing process raises it again.
    if total > value.rss_peak_bytes {
        // SAFETY: as above.
        unsafe { swap(&raw mut (*counters).rss_peak_bytes, total) };
    }
}

/// The growth and release counters of `member` and the event its growth is
/// sampled as; `None` for swap entries (not resident memory).
///
/// # Safety
/// `counters` is a live `PROCESSES` value.
#[inline(always)]
unsafe fn member_accounts(
    counters: *mut ProcessCounters,
    member: usize,
) -> Option<(*mut u64, *mut u64, MemoryEvent)> {
    // SAFETY: field addresses of a live map value.
    unsafe {
        match member {
            MM_ANONPAGES => Some((
                &raw mut (*counters).anon_growth_bytes,
                &raw mut (*counters).anon_release_bytes,
                MemoryEvent::AnonGrowth,
            )),
            MM_FILEPAGES => Some((
                &raw mut (*counters).file_growth_bytes,
                &raw mut (*counters).file_release_bytes,
                MemoryEvent::FileGrowth,
            )),
            MM_SHMEMPAGES => Some((
                &raw mut (*counters).shmem_growth_bytes,
                &raw mut (*counters).shmem_release_bytes,
                MemoryEvent::ShmemGrowth,
            )),
            _ => None,
        }
    }
}

/// Adds a member's RSS change to its growth or release total and samples
/// growth with the address and instruction of this thread's pending page
/// fault on this CPU (taken once: a second growth without a fault of its
/// own gets no address).
///
/// # Safety
/// `counters` is the live `PROCESSES` value of `tgid`; `member <
/// RSS_MEMBER_COUNT`.
#[inline(always)]
unsafe fn account_member(
    tgid: u32,
    tid: u32,
    counters: *mut ProcessCounters,
    member: usize,
    delta: i64,
) {
    // SAFETY: see the function's contract.
    let Some((growth, release, event)) = (unsafe { member_accounts(counters, member) }) else {
        return;
    };
    if delta < 0 {
        // SAFETY: as above.
        unsafe { add(release, delta.unsigned_abs()) };
        return;
    }
    if delta == 0 {
        return;
    }
    let len_bytes = delta as u64;
    // SAFETY: as above.
    unsafe {
        add(growth, len_bytes);
        // Per page: one `rss_stat` growth carries a batch of per-CPU
        // changes (about 32 pages), each page one fault.
        add(
            &raw mut (*counters).page_faults,
            len_bytes / PAGE_SIZE_BYTES,
        );
    }
    let (addr, user_regs) = take_pending_fault(tid);
    let args = MemoryEventArgs {
        event,
        addr,
        len_bytes,
        user_regs,
        flags: 0,
        // SAFETY: as above.
        rss_bytes: unsafe { (*counters).rss_total_bytes() },
    };
    // SAFETY: as above.
    unsafe { emit_memory(tgid, counters, &args) };
}

/// `(address, user registers)` of thread `tid`'s pending fault on this CPU,
/// marking it consumed; `(0, 0)` when there is none.
#[inline(always)]
fn take_pending_fault(tid: u32) -> (u64, u64) {
    let Some(fault) = PENDING_FAULT.get_ptr_mut(0) else {
        return (0, 0);
    };
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        if (*fault).tid != tid || (*fault).consumed != 0 {
            return (0, 0);
        }
        (*fault).consumed = 1;
        ((*fault).address, (*fault).user_regs)
    }
}
