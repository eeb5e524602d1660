//! Page faults of traced processes (`exceptions:page_fault_user`): counts
//! them, remembers the last one per CPU for the `rss_stat` event it causes,
//! and records copy-on-write write faults (pages un-shared after fork).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use memtrace_common::{MemoryEvent, PAGE_SIZE_BYTES};

use crate::{
    counters::{add, current_ids, traced},
    maps::{PendingFault, PENDING_FAULT},
    sample::{count_and_emit, MemoryEventArgs},
};

/// `page_fault_user` fields (offsets from
/// /sys/kernel/tracing/events/exceptions/page_fault_user/format on 6.18):
/// `unsigned long address` @8, `ip` @16, `error_code` @24.
const ADDRESS_OFFSET: usize = 8;
/// See [`ADDRESS_OFFSET`].
const IP_OFFSET: usize = 16;
/// See [`ADDRESS_OFFSET`].
const ERROR_CODE_OFFSET: usize = 24;
/// x86 page-fault error code bits (arch/x86/include/asm/trap_pf.h):
/// `X86_PF_PROT` (page present) | `X86_PF_WRITE`: a write to a present,
/// read-only page, i.e. copy-on-write in a private mapping.
const COW_ERROR_BITS: u64 = 0b11;

/// Tracepoint `exceptions/page_fault_user`.
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    match try_page_fault_user(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_page_fault_user(ctx: &TracePointContext) -> Result<(), ()> {
    let (tgid, tid) = current_ids();
    let Some(counters) = traced(tgid) else {
        return Ok(());
    };
    // SAFETY: offsets within the tracepoint record (format above).
    let (address, ip, error_code) = unsafe {
        (
            ctx.read_at::<u64>(ADDRESS_OFFSET).map_err(|_| ())?,
            ctx.read_at::<u64>(IP_OFFSET).map_err(|_| ())?,
            ctx.read_at::<u64>(ERROR_CODE_OFFSET).map_err(|_| ())?,
        )
    };
    // SAFETY: live map value of a traced process.
    unsafe { add(&raw mut (*counters).page_faults, 1) };
    // Written in place (no map-update helper on this hot path); a missing
    // slot only costs later AnonGrowth records their address.
    if let Some(slot) = PENDING_FAULT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            *slot = PendingFault {
                tid,
                _pad: 0,
                address,
                ip,
            }
        };
    }
    if error_code & COW_ERROR_BITS == COW_ERROR_BITS {
        let args = MemoryEventArgs {
            event: MemoryEvent::CowFault,
            addr: address,
            len_bytes: PAGE_SIZE_BYTES,
            native_ip: ip,
            flags: 0,
        };
        // SAFETY: live map value of `tgid`.
        unsafe { count_and_emit(tgid, &raw mut (*counters).cow_fault_bytes, &args) };
    }
    Ok(())
}
