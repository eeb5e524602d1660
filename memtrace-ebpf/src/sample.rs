//! Sampling of memory events, kernel side: decides which memory events get a
//! `MemoryRecord` (by bytes, like heap profilers), reserves it in `RECORDS`
//! (after the thread's user stack, `native_stack`, for a fault in user
//! mode), fills it (with the Python stack from `pystack`) and submits it
//! through `ring`, which counts a record that cannot be reserved.

use aya_ebpf::{helpers::bpf_get_prandom_u32, maps::ring_buf::RingBufEntry};
use memtrace_common::{MemoryEvent, MemoryRecord, RecordHeader, RecordKind};

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

/// The sampling weight of an event of `len_bytes` if it is sampled, or
/// `None`. An event is kept with probability `p = min(1, len / interval)`
/// and then weighs `max(len, interval) = len / p` bytes, so the sum of
/// weights estimates the true total without bias.
#[inline(always)]
fn sample_weight(len_bytes: u64) -> Option<u64> {
    let interval = SAMPLE_INTERVAL_BYTES.load();
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

/// Samples a memory event of process `tgid` and, if it is kept, sends a
/// `MemoryRecord` with the current thread's Python stack, after a
/// `NativeStackRecord` with its user registers and stack when the event has
/// them (a fault in user mode).
#[inline(always)]
pub fn emit_memory(tgid: u32, args: &MemoryEventArgs) {
    let Some(weight_bytes) = sample_weight(args.len_bytes) else {
        return;
    };
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
/// `field` points into the live `PROCESSES` value of `tgid`.
#[inline(always)]
pub unsafe fn count_and_emit(tgid: u32, field: *mut u64, args: &MemoryEventArgs) {
    unsafe { add(field, args.len_bytes) };
    emit_memory(tgid, args);
}
