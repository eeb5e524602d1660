//! Allocator mode with the in-process sampler (`--alloc-hooks sampler`),
//! kernel side: uprobes on the sampler library's two marker functions,
//! attached per process by `memtrace::bpf`. The sampler has already counted
//! bytes down and calls the markers for sampled blocks and their frees
//! only, so each hit is recorded as the uprobe mode records a sampled block
//! (`super::alloc`: live set, user stack, Python stack) or forgets one.

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use memtrace_common::{
    AllocCall, ALLOC_COOKIE_PYTHON_API, ALLOC_COOKIE_SAMPLER, SAMPLER_DOMAIN_MEM,
    SAMPLER_DOMAIN_OBJ, SAMPLER_DOMAIN_UNTRACKED,
};

use super::alloc::{forget_block, record_block};
use crate::{counters::current_ids, maps::AllocThread};

/// Uprobe on `memtrace_sampler_alloc(ptr, size, weight, domain)`: a sampled
/// block. The registers are the marker's at entry; userspace drops the
/// sampler's own frames when it unwinds.
#[uprobe]
pub fn alloc_sampled(ctx: ProbeContext) -> u32 {
    let addr = ctx.arg::<u64>(0).unwrap_or(0);
    let size_bytes = ctx.arg::<u64>(1).unwrap_or(0);
    let domain = ctx.arg::<u64>(3).unwrap_or(0) as u32;
    if addr == 0 || size_bytes == 0 {
        return 0;
    }
    let kind = domain & !SAMPLER_DOMAIN_UNTRACKED;
    let python_api = kind == SAMPLER_DOMAIN_MEM || kind == SAMPLER_DOMAIN_OBJ;
    let state = AllocThread {
        depth: 0,
        call: AllocCall::Malloc as u32,
        entry_sp: 0,
        size_bytes,
        old_addr: 0,
        out_ptr: 0,
        countdown_bytes: 0,
        cookie: ALLOC_COOKIE_SAMPLER
            | if python_api {
                ALLOC_COOKIE_PYTHON_API
            } else {
                0
            },
    };
    let (tgid, _) = current_ids();
    let trackable = domain & SAMPLER_DOMAIN_UNTRACKED == 0;
    record_block(tgid, &state, addr, ctx.regs, trackable);
    0
}

/// Uprobe on `memtrace_sampler_free(ptr)`: a sampled block is freed.
#[uprobe]
pub fn alloc_sampled_free(ctx: ProbeContext) -> u32 {
    let addr = ctx.arg::<u64>(0).unwrap_or(0);
    if addr != 0 {
        let (tgid, _) = current_ids();
        forget_block(tgid, addr);
    }
    0
}
