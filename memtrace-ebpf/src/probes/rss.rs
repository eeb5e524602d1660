//! Resident memory of traced processes (`kmem:rss_stat`): keeps each
//! process's RSS per member and its high-water mark, sums anonymous growth
//! and release, and samples anonymous growth with the Python stack (the
//! first touch of an anonymous page raises this event right after its
//! `page_fault_user`).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use memtrace_common::{
    MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, RSS_MEMBER_COUNT,
};

use crate::{
    counters::{add, current_ids, set_bits, swap, traced},
    maps::PENDING_FAULT,
    sample::{emit_memory, MemoryEventArgs},
};

/// `rss_stat` fields (offsets from /sys/kernel/tracing/events/kmem/rss_stat/format
/// on 6.18): `unsigned int mm_id` @8 (hash of the mm's address),
/// `unsigned int curr` @12 (1 when the mm is the current task's),
/// `int member` @16 (`MM_*`), `long size` @24 (the member's size in bytes).
const CURR_OFFSET: usize = 12;
/// See [`CURR_OFFSET`].
const MM_ID_OFFSET: usize = 8;
/// See [`CURR_OFFSET`].
const MEMBER_OFFSET: usize = 16;
/// See [`CURR_OFFSET`].
const SIZE_OFFSET: usize = 24;
/// `rss_known` bits that make up the high-water mark: file + anon + shmem.
const PEAK_MEMBERS: u64 = (1 << MM_FILEPAGES) | (1 << MM_ANONPAGES) | (1 << MM_SHMEMPAGES);

/// Tracepoint `kmem/rss_stat`.
#[tracepoint]
pub fn rss_stat(ctx: TracePointContext) -> u32 {
    match try_rss_stat(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_rss_stat(ctx: &TracePointContext) -> Result<(), ()> {
    // SAFETY: offsets within the tracepoint record (format above).
    let curr: u32 = unsafe { ctx.read_at(CURR_OFFSET) }.map_err(|_| ())?;
    if curr != 1 {
        return Ok(()); // another mm (fork copying, reclaim): not attributable
    }
    let (tgid, tid) = current_ids();
    let Some(counters) = traced(tgid) else {
        return Ok(());
    };
    // SAFETY: as above.
    let mm_id: u32 = unsafe { ctx.read_at(MM_ID_OFFSET) }.map_err(|_| ())?;
    // SAFETY: live map value of a traced process.
    unsafe { adopt_mm(counters, mm_id) };
    // SAFETY: as above.
    let member: i32 = unsafe { ctx.read_at(MEMBER_OFFSET) }.map_err(|_| ())?;
    // SAFETY: as above.
    let size: i64 = unsafe { ctx.read_at(SIZE_OFFSET) }.map_err(|_| ())?;
    let Ok(member) = usize::try_from(member) else {
        return Ok(());
    };
    if member >= RSS_MEMBER_COUNT {
        return Ok(());
    }
    let size_bytes = size.max(0) as u64;
    // SAFETY: live map value of a traced process; member < RSS_MEMBER_COUNT.
    let delta = unsafe { store_member(counters, member, size_bytes) };
    // SAFETY: as above.
    unsafe { update_peak(counters) };
    if member == MM_ANONPAGES {
        // SAFETY: as above.
        unsafe { account_anon(tgid, tid, counters, delta) };
    }
    Ok(())
}

/// Makes `mm_id` the address space the counters follow. A first id (after
/// attach or fork) is adopted as is; a new one means execve installed a fresh
/// address space, whose counters start at zero: the old image's RSS and
/// high-water mark are dropped. Only the exec'ing thread is left by then, so
/// plain writes do not race.
///
/// # Safety
/// `counters` is a live `PROCESSES` value.
#[inline(always)]
unsafe fn adopt_mm(counters: *mut ProcessCounters, mm_id: u32) {
    // SAFETY: see the function's contract.
    let value = unsafe { &mut *counters };
    if value.mm_id == mm_id {
        return;
    }
    if value.mm_id != 0 {
        value.rss_bytes = [0; RSS_MEMBER_COUNT];
        value.rss_known = (1 << RSS_MEMBER_COUNT) - 1;
        value.rss_peak_bytes = 0;
    }
    value.mm_id = mm_id;
}

/// Stores `size_bytes` as member `member`'s RSS and returns the change
/// since the last known value (0 when it was not known).
///
/// # Safety
/// `counters` is a live `PROCESSES` value and `member < RSS_MEMBER_COUNT`.
#[inline(always)]
unsafe fn store_member(counters: *mut ProcessCounters, member: usize, size_bytes: u64) -> i64 {
    let bit = 1u64 << member;
    // SAFETY: see the function's contract; member < RSS_MEMBER_COUNT.
    let slot = unsafe { (&raw mut (*counters).rss_bytes).cast::<u64>().add(member) };
    // Swap, so concurrent threads of one process see consecutive values and
    // the deltas add up to the true change.
    // SAFETY: as above.
    let previous = unsafe { swap(slot, size_bytes) };
    // SAFETY: as above.
    let known = unsafe { set_bits(&raw mut (*counters).rss_known, bit) };
    if known & bit == 0 {
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
    let total = value.rss_bytes[MM_FILEPAGES]
        + value.rss_bytes[MM_ANONPAGES]
        + value.rss_bytes[MM_SHMEMPAGES];
    // A racing thread may store a slightly lower peak; the next event of a
    // growing process raises it again.
    if total > value.rss_peak_bytes {
        // SAFETY: as above.
        unsafe { swap(&raw mut (*counters).rss_peak_bytes, total) };
    }
}

/// Adds an anonymous RSS change to the growth or release total and samples
/// growth with the faulting address and instruction of this thread's last
/// page fault on this CPU.
///
/// # Safety
/// `counters` is the live `PROCESSES` value of `tgid`.
#[inline(always)]
unsafe fn account_anon(tgid: u32, tid: u32, counters: *mut ProcessCounters, delta: i64) {
    if delta < 0 {
        // SAFETY: see the function's contract.
        unsafe {
            add(
                &raw mut (*counters).anon_release_bytes,
                delta.unsigned_abs(),
            )
        };
        return;
    }
    if delta == 0 {
        return;
    }
    let len_bytes = delta as u64;
    // SAFETY: as above.
    unsafe { add(&raw mut (*counters).anon_growth_bytes, len_bytes) };
    let (addr, native_ip) = match PENDING_FAULT.get(0) {
        Some(fault) if fault.tid == tid => (fault.address, fault.ip),
        _ => (0, 0),
    };
    let args = MemoryEventArgs {
        event: MemoryEvent::AnonGrowth,
        addr,
        len_bytes,
        native_ip,
        flags: 0,
    };
    emit_memory(tgid, &args);
}
