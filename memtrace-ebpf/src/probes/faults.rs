//! Page faults of traced processes: `exceptions:page_fault_user` counts
//! them, remembers the last one per CPU for the `rss_stat` event it causes,
//! and records copy-on-write write faults (pages un-shared after fork);
//! `exceptions:page_fault_kernel` remembers faults the kernel takes on a
//! process's user addresses (copying into a fresh buffer in `read()`), so the
//! growth they cause gets its address too.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use memtrace_common::{MemoryEvent, PAGE_SIZE_BYTES};

use crate::{
    counters::{add, current_ids, traced},
    maps::{PendingFault, PENDING_FAULT},
    sample::{count_and_emit, MemoryEventArgs},
};

/// `page_fault_user` / `page_fault_kernel` fields (offsets from
/// /sys/kernel/tracing/events/exceptions/page_fault_{user,kernel}/format on
/// 6.18, the same for both): `unsigned long address` @8, `ip` @16,
/// `error_code` @24.
const ADDRESS_OFFSET: usize = 8;
/// See [`ADDRESS_OFFSET`].
const IP_OFFSET: usize = 16;
/// See [`ADDRESS_OFFSET`].
const ERROR_CODE_OFFSET: usize = 24;
/// x86 page-fault error code bits (arch/x86/include/asm/trap_pf.h):
/// `X86_PF_PROT` (page present) | `X86_PF_WRITE`: a write to a present,
/// read-only page, i.e. copy-on-write in a private mapping.
const COW_ERROR_BITS: u64 = 0b11;
/// Highest user address + 1 on x86-64 with 4-level paging
/// (`TASK_SIZE_MAX`, arch/x86/include/asm/page_64_types.h, rounded): kernel
/// faults above it are on kernel memory, not the process's.
const USER_ADDRESS_END: u64 = 0x0000_8000_0000_0000;

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
    remember_fault(tid, address, ip);
    if error_code & COW_ERROR_BITS == COW_ERROR_BITS {
        let args = MemoryEventArgs {
            event: MemoryEvent::CowFault,
            addr: address,
            len_bytes: PAGE_SIZE_BYTES,
            native_ip: ip,
            flags: 0,
            // SAFETY: as above.
            rss_bytes: unsafe { (*counters).rss_total_bytes() },
        };
        // SAFETY: live map value of `tgid`.
        unsafe { count_and_emit(tgid, &raw mut (*counters).cow_fault_bytes, &args) };
    }
    Ok(())
}

/// Tracepoint `exceptions/page_fault_kernel`: a fault taken in kernel mode.
/// Only faults on user addresses of traced processes are remembered (with no
/// user instruction pointer: the kernel was running).
#[tracepoint]
pub fn page_fault_kernel(ctx: TracePointContext) -> u32 {
    match try_page_fault_kernel(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_page_fault_kernel(ctx: &TracePointContext) -> Result<(), ()> {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return Ok(());
    }
    // SAFETY: offset within the tracepoint record (format above).
    let address: u64 = unsafe { ctx.read_at(ADDRESS_OFFSET) }.map_err(|_| ())?;
    if address < USER_ADDRESS_END {
        remember_fault(tid, address, 0);
    }
    Ok(())
}

/// Makes this fault the CPU's pending one. Written in place (no map-update
/// helper on this hot path); a missing slot only costs later growth records
/// their address.
#[inline(always)]
fn remember_fault(tid: u32, address: u64, ip: u64) {
    if let Some(slot) = PENDING_FAULT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            *slot = PendingFault {
                tid,
                consumed: 0,
                address,
                ip,
            }
        };
    }
}
