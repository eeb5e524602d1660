//! Sampling of memory events, kernel side: decides, at each process's
//! adaptive mean (`memtrace_common::SamplingState`), which memory events get a
//! `MemoryRecord` (by bytes, like heap profilers), reserves it in `RECORDS`
//! (after the thread's user stack, `native_stack`, for a fault in user
//! mode), fills it (with the Python stack from `pystack`) and submits it
//! through `ring`, which counts a record that cannot be reserved.

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    maps::ring_buf::RingBufEntry,
};
use memtrace_common::{
    MemoryEvent, MemoryRecord, ProcessCounters, RecordHeader, RecordKind, SamplingState,
    SAMPLE_BUDGET_PER_WINDOW, SAMPLE_MEAN_MIN_DIVISOR, SAMPLING_WINDOW_NS,
};

use crate::{
    counters::add,
    kernel,
    maps::{RECORDS, SAMPLE_INTERVAL_BYTES},
    native_stack::{self, UserRegs},
    pystack,
    ring::{count_dropped, header, submit_flags},
};

/// One memory event before sampling.
#[derive(Clone, Copy)]
pub struct MemoryEventArgs {
    /// What happened.
    pub event: MemoryEvent,
    /// Start address (see `MemoryEvent`).
    pub addr: u64,
    /// True size of the event, in bytes.
    pub len_bytes: u64,
    /// The thread's saved user registers (`struct pt_regs *`) whose
    /// instruction pointer is the innermost native frame, or 0 when unknown
    /// (read only for a record that is sent).
    pub user_regs: u64,
    /// Event flags (see `MemoryRecord::flags`).
    pub flags: u64,
    /// The process's RSS right after the event, in bytes.
    pub rss_bytes: u64,
}

/// The mean in force for an event of `len_bytes` of the process whose
/// sampling state is `state`, starting a new window when the last one is
/// over (see `memtrace_common::SamplingState`).
///
/// # Safety
/// `state` points into a live `PROCESSES` value.
#[inline(always)]
unsafe fn mean_in_force(state: *mut SamplingState, len_bytes: u64) -> u64 {
    let max = SAMPLE_INTERVAL_BYTES.load();
    let min = (max / SAMPLE_MEAN_MIN_DIVISOR).max(1);
    // SAFETY: helper without arguments.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    // SAFETY: see the function's contract.
    let state = unsafe { &mut *state };
    if state.mean_bytes == 0 || now_ns.wrapping_sub(state.window_start_ns) >= SAMPLING_WINDOW_NS {
        // A new image starts at `--sample-bytes`, until a window says how
        // fast it grows.
        let wanted = if state.mean_bytes == 0 {
            max
        } else {
            state.window_bytes / SAMPLE_BUDGET_PER_WINDOW
        };
        state.mean_bytes = if wanted < min {
            min
        } else if wanted > max {
            max
        } else {
            wanted
        };
        state.window_start_ns = now_ns;
        state.window_bytes = 0;
        state.window_samples = 0;
    }
    if len_bytes < max {
        state.window_bytes += len_bytes;
    }
    state.mean_bytes
}

/// Counts a record sampled in the current window; once the window took its
/// budget, the mean is `--sample-bytes` until the window ends.
///
/// # Safety
/// As for [`mean_in_force`].
#[inline(always)]
unsafe fn count_sample(state: *mut SamplingState) {
    // SAFETY: see the function's contract.
    let state = unsafe { &mut *state };
    state.window_samples += 1;
    if state.window_samples >= SAMPLE_BUDGET_PER_WINDOW {
        state.mean_bytes = SAMPLE_INTERVAL_BYTES.load();
    }
}

/// The sampling weight of an event of `len_bytes` sampled with mean
/// `interval` if it is sampled, or `None`. An event is kept with
/// probability `p = min(1, len / interval)` and then weighs `max(len,
/// interval) = len / p` bytes, so the sum of weights estimates the true
/// total without bias (the mean may change from one event to the next).
#[inline(always)]
fn sample_weight(len_bytes: u64, interval: u64) -> Option<u64> {
    if len_bytes == 0 {
        return None;
    }
    if len_bytes >= interval {
        return Some(len_bytes);
    }
    // A uniform draw in [0, interval): interval < 2^32 (userspace caps it),
    // so the product fits in 64 bits.
    // SAFETY: helper without arguments.
    let draw = (u64::from(unsafe { bpf_get_prandom_u32() }) * interval) >> 32;
    (draw < len_bytes).then_some(interval)
}

/// Samples a memory event of process `tgid` (its live `PROCESSES` value
/// `counters`) at the process's mean in force and, if it is kept, sends a
/// `MemoryRecord` with the current thread's Python stack, after a
/// `NativeStackRecord` with its user registers and stack when the event has
/// them (a fault in user mode).
///
/// # Safety
/// `counters` is the live `PROCESSES` value of `tgid`.
#[inline(always)]
pub unsafe fn emit_memory(tgid: u32, counters: *mut ProcessCounters, args: &MemoryEventArgs) {
    // SAFETY: see the function's contract.
    let state = unsafe { &raw mut (*counters).sampling };
    // SAFETY: as above.
    let mean_bytes = unsafe { mean_in_force(state, args.len_bytes) };
    let Some(weight_bytes) = sample_weight(args.len_bytes, mean_bytes) else {
        return;
    };
    // SAFETY: as above.
    unsafe { count_sample(state) };
    let header = header(RecordKind::Memory, tgid);
    let mut native_ip = 0;
    if args.user_regs != 0 {
        if let Some((ip, sp, bp)) = kernel::user_ip_sp_bp(args.user_regs) {
            native_ip = ip;
            native_stack::emit(header, UserRegs { ip, sp, bp });
        }
    }
    let Some(mut entry) = RECORDS.reserve::<MemoryRecord>(0) else {
        count_dropped();
        return;
    };
    fill_memory(&mut entry, header, args, weight_bytes, native_ip);
    entry.submit(submit_flags());
}

/// Writes every field of a reserved `MemoryRecord` in place (the record is
/// 1,112 bytes: too big for the 512-byte BPF stack).
#[inline(always)]
fn fill_memory(
    entry: &mut RingBufEntry<MemoryRecord>,
    header: RecordHeader,
    args: &MemoryEventArgs,
    weight_bytes: u64,
    native_ip: u64,
) {
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to a reserved, writable ring-buffer entry of
    // `size_of::<MemoryRecord>()` bytes; fields are written one by one.
    unsafe {
        (*record).header = header;
        (*record).event = args.event as u32;
        (*record).addr = args.addr;
        (*record).len_bytes = args.len_bytes;
        (*record).weight_bytes = weight_bytes;
        (*record).native_ip = native_ip;
        (*record).flags = args.flags;
        (*record).rss_bytes = args.rss_bytes;
        (*record)._pad = 0;
        let walk = pystack::walk(header.tgid, &raw mut (*record).frames);
        (*record).frame_count = walk.frame_count;
        (*record).stack_status = walk.stack_status;
    }
}

/// Adds `len_bytes` to the counter at `field` and samples the event.
///
/// # Safety
/// `counters` is the live `PROCESSES` value of `tgid` and `field` points
/// into it.
#[inline(always)]
pub unsafe fn count_and_emit(
    tgid: u32,
    counters: *mut ProcessCounters,
    field: *mut u64,
    args: &MemoryEventArgs,
) {
    unsafe { add(field, args.len_bytes) };
    // SAFETY: see the function's contract.
    unsafe { emit_memory(tgid, counters, args) };
}
