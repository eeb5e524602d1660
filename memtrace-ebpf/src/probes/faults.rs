//! Page faults: `page_fault_user` remembers the last one per CPU for the
//! `rss_stat` event it causes (for every process: one per-CPU store costs
//! less than finding out whether the process is traced), and counts and
//! records copy-on-write write faults of traced processes (pages un-shared
//! after fork: only while another process may still map them, `sharers`;
//! a write fault of a process alone in its fork family reuses the page);
//! `page_fault_kernel` remembers faults the kernel takes on a process's user
//! addresses (copying into a fresh buffer in `read()`), so the growth they
//! cause gets its address too.
//!
//! Both are BTF tracepoints (`tp_btf`): the raw tracepoint arguments
//! `(unsigned long address, struct pt_regs *regs, unsigned long error_code)`
//! (arch/x86/include/asm/trace/exceptions.h), with no trace record built for
//! them, which is most of what a classic tracepoint costs on this path.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use memtrace_common::{MemoryEvent, PAGE_SIZE_BYTES};

use crate::{
    counters::{add, current_ids, traced},
    maps::{PendingFault, PENDING_FAULT},
    sample::{count_and_emit, MemoryEventArgs},
    sharers::may_share,
};

/// x86 page-fault error code bits (arch/x86/include/asm/trap_pf.h):
/// `X86_PF_PROT` (page present) | `X86_PF_WRITE`: a write to a present,
/// read-only page, i.e. copy-on-write in a private mapping.
const COW_ERROR_BITS: u64 = 0b11;
/// Highest user address + 1 on x86-64 with 4-level paging
/// (`TASK_SIZE_MAX`, arch/x86/include/asm/page_64_types.h, rounded): kernel
/// faults above it are on kernel memory, not the process's.
const USER_ADDRESS_END: u64 = 0x0000_8000_0000_0000;

/// BTF tracepoint `page_fault_user(address, regs, error_code)`.
#[btf_tracepoint(function = "page_fault_user")]
pub fn page_fault_user(ctx: BtfTracePointContext) -> i32 {
    try_page_fault_user(&ctx);
    0
}

fn try_page_fault_user(ctx: &BtfTracePointContext) {
    let (tgid, tid) = current_ids();
    let address: u64 = ctx.arg(0);
    let regs: u64 = ctx.arg(1);
    let error_code: u64 = ctx.arg(2);
    remember_fault(tid, address, regs);
    if error_code & COW_ERROR_BITS != COW_ERROR_BITS {
        return;
    }
    let Some(counters) = traced(tgid) else {
        return;
    };
    // SAFETY: live map value of a traced process.
    unsafe { add(&raw mut (*counters).page_faults, 1) };
    if !may_share(tgid) {
        return;
    }
    let args = MemoryEventArgs {
        event: MemoryEvent::CowFault,
        addr: address,
        len_bytes: PAGE_SIZE_BYTES,
        user_regs: regs,
        flags: 0,
        // SAFETY: as above.
        rss_bytes: unsafe { (*counters).rss_total_bytes() },
    };
    // SAFETY: live map value of `tgid`.
    unsafe { count_and_emit(tgid, counters, &raw mut (*counters).cow_fault_bytes, &args) };
}

/// BTF tracepoint `page_fault_kernel(address, regs, error_code)`: a fault
/// taken in kernel mode. Only faults on user addresses of traced processes
/// are remembered, with no user registers (the kernel was running; `regs`
/// are the kernel's).
#[btf_tracepoint(function = "page_fault_kernel")]
pub fn page_fault_kernel(ctx: BtfTracePointContext) -> i32 {
    try_page_fault_kernel(&ctx);
    0
}

fn try_page_fault_kernel(ctx: &BtfTracePointContext) {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return;
    }
    let address: u64 = ctx.arg(0);
    if address < USER_ADDRESS_END {
        remember_fault(tid, address, 0);
    }
}

/// Makes this fault the CPU's pending one. Written in place (no map-update
/// helper on this hot path); a missing slot only costs later growth records
/// their address.
#[inline(always)]
fn remember_fault(tid: u32, address: u64, user_regs: u64) {
    if let Some(slot) = PENDING_FAULT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            *slot = PendingFault {
                tid,
                consumed: 0,
                address,
                user_regs,
            }
        };
    }
}
