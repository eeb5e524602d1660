//! Allocator mode, kernel side (first step of its data flow): uprobes on
//! the entry of the CPython allocator API (`PyObject_*`, `PyMem_*`,
//! `PyMem_Raw*`) and glibc's `malloc` family, and one uretprobe on their
//! return, attached by `memtrace::bpf` to each traced process only
//! (`perf_event_open` with its pid: the kernel's uprobe filter matches the
//! process's mm, so every thread of it and no other process).
//!
//! Per thread, `ALLOC_THREADS` keeps the outermost call's arguments (a
//! nested call, e.g. glibc `malloc` inside `PyObject_Malloc`, only deepens
//! it) and a countdown of bytes to the next sample. The uretprobe of the
//! outermost call subtracts the block's size; an unsampled block returns at
//! once. A sampled one goes into `ALLOC_LIVE` and to userspace in a
//! `NativeStackRecord` (the caller's registers and user stack, see
//! `native_stack`) followed by an `AllocRecord` with the Python stack. A
//! free looks its address up in `ALLOC_LIVE` and returns unless the block
//! was sampled.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_attach_cookie, bpf_get_prandom_u32, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    maps::ring_buf::RingBufEntry,
    programs::{ProbeContext, RetProbeContext},
};
use memtrace_common::{
    AllocCall, AllocRecord, FreeRecord, LiveBlock, LiveKey, RecordHeader, RecordKind,
    ALLOC_COOKIE_PYTHON_API, ALLOC_COOKIE_SAMPLER, ALLOC_EXP_DRAWS_LEN, ALLOC_PYTHON_API,
    ALLOC_SAMPLER, ALLOC_STAT_CALLS, ALLOC_STAT_LIVE_FULL, ALLOC_UNTRACKED,
};

use crate::{
    counters::current_ids,
    maps::{
        AllocThread, ALLOC_EXP_DRAWS, ALLOC_LIVE, ALLOC_STATS, ALLOC_THREADS, RECORDS,
        SAMPLE_INTERVAL_BYTES,
    },
    native_stack::{self, UserRegs},
    pystack,
    ring::{count_dropped, emit, header, submit_flags},
};

/// The arguments of one allocator call, as its entry uprobe reads them.
struct CallArgs {
    /// The stack pointer at entry: a call entered while an outer one is in
    /// progress runs below it.
    sp: u64,
    call: AllocCall,
    size_bytes: u64,
    old_addr: u64,
    out_ptr: u64,
    /// The probe's attach cookie: which API was entered.
    cookie: u64,
}

/// Uprobe on `malloc(size)`, `PyObject_Malloc`, `PyMem_Malloc`,
/// `PyMem_RawMalloc` (size in the first argument).
#[uprobe]
pub fn alloc_malloc(ctx: ProbeContext) -> u32 {
    let size_bytes = ctx.arg::<u64>(0).unwrap_or(0);
    enter(CallArgs {
        sp: stack_pointer(&ctx),
        cookie: cookie(&ctx),
        call: AllocCall::Malloc,
        size_bytes,
        old_addr: 0,
        out_ptr: 0,
    });
    0
}

/// Uprobe on `calloc(n, size)` and the CPython `*_Calloc(n, size)`.
#[uprobe]
pub fn alloc_calloc(ctx: ProbeContext) -> u32 {
    let count = ctx.arg::<u64>(0).unwrap_or(0);
    let size = ctx.arg::<u64>(1).unwrap_or(0);
    enter(CallArgs {
        sp: stack_pointer(&ctx),
        cookie: cookie(&ctx),
        call: AllocCall::Calloc,
        // An overflowing product makes calloc fail (no block to record);
        // `saturating_mul` would need a 128-bit libcall BPF cannot link.
        size_bytes: count.wrapping_mul(size),
        old_addr: 0,
        out_ptr: 0,
    });
    0
}

/// Uprobe on `realloc(ptr, size)` and the CPython `*_Realloc(ptr, size)`.
#[uprobe]
pub fn alloc_realloc(ctx: ProbeContext) -> u32 {
    let old_addr = ctx.arg::<u64>(0).unwrap_or(0);
    let size_bytes = ctx.arg::<u64>(1).unwrap_or(0);
    enter(CallArgs {
        sp: stack_pointer(&ctx),
        cookie: cookie(&ctx),
        call: AllocCall::Realloc,
        size_bytes,
        old_addr,
        out_ptr: 0,
    });
    0
}

/// Uprobe on glibc `aligned_alloc(alignment, size)`.
#[uprobe]
pub fn alloc_aligned_alloc(ctx: ProbeContext) -> u32 {
    let size_bytes = ctx.arg::<u64>(1).unwrap_or(0);
    enter(CallArgs {
        sp: stack_pointer(&ctx),
        cookie: cookie(&ctx),
        call: AllocCall::AlignedAlloc,
        size_bytes,
        old_addr: 0,
        out_ptr: 0,
    });
    0
}

/// Uprobe on glibc `posix_memalign(void **memptr, alignment, size)`: the
/// block's address is read from `*memptr` at return.
#[uprobe]
pub fn alloc_posix_memalign(ctx: ProbeContext) -> u32 {
    let out_ptr = ctx.arg::<u64>(0).unwrap_or(0);
    let size_bytes = ctx.arg::<u64>(2).unwrap_or(0);
    enter(CallArgs {
        sp: stack_pointer(&ctx),
        cookie: cookie(&ctx),
        call: AllocCall::PosixMemalign,
        size_bytes,
        old_addr: 0,
        out_ptr,
    });
    0
}

/// Uretprobe on every allocator above: the outermost call's block is
/// counted down and, if sampled, recorded with the caller's registers and
/// stack (`ctx.regs`: after the return, the caller's own).
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let returned = ctx.ret::<u64>();
    leave(returned, ctx.regs);
    0
}

/// Uprobe on `free(ptr)`, and on `PyObject_Free`, `PyMem_Free`,
/// `PyMem_RawFree` where pymalloc's own frees are not found.
#[uprobe]
pub fn alloc_free(ctx: ProbeContext) -> u32 {
    free(ctx.arg::<u64>(0).unwrap_or(0));
    0
}

/// Uprobe on pymalloc's `_PyObject_Free(ctx, ptr)` (Objects/obmalloc.c; a
/// `.symtab` symbol): the block in the second argument. Hooked instead of
/// `PyObject_Free`, whose every instruction must be single-stepped (see
/// `memtrace::bpf::alloc::probe_offset`).
#[uprobe]
pub fn alloc_free_second(ctx: ProbeContext) -> u32 {
    free(ctx.arg::<u64>(1).unwrap_or(0));
    0
}

/// A free of block `addr` (0: nothing) by the current process.
#[inline(always)]
fn free(addr: u64) {
    if addr != 0 {
        let (tgid, _) = current_ids();
        forget_block(tgid, addr);
    }
}

/// The stack pointer saved in the probe's registers.
#[inline(always)]
fn stack_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: `regs` is the probe's context; the verifier allows the load.
    unsafe { (*ctx.regs).rsp }
}

/// The attach cookie of the probe that fired
/// ([`ALLOC_COOKIE_PYTHON_API`] on CPython's allocator API, else 0).
#[inline(always)]
fn cookie(ctx: &ProbeContext) -> u64 {
    // SAFETY: helper reading the context's perf event; any probe may call it.
    unsafe { bpf_get_attach_cookie(ctx.regs.cast()) }
}

/// Entry of an allocator call: the outermost call keeps its arguments.
///
/// A call entered at or above the outermost call's stack pointer is not
/// nested in it: that call's return was missed (it was in progress when
/// the probes were attached), so its depth is dropped rather than blocking
/// the thread's samples for good.
#[inline(always)]
fn enter(args: CallArgs) {
    let (_, tid) = current_ids();
    let Some(thread) = ALLOC_THREADS.get_ptr_mut(tid) else {
        let fresh = AllocThread {
            depth: 1,
            entry_sp: args.sp,
            call: args.call as u32,
            size_bytes: args.size_bytes,
            old_addr: args.old_addr,
            out_ptr: args.out_ptr,
            countdown_bytes: exponential_draw(),
            cookie: args.cookie,
        };
        let _ = ALLOC_THREADS.insert(tid, fresh, 0);
        return;
    };
    // SAFETY: live map value of this thread; only this thread writes it.
    unsafe {
        if (*thread).depth != 0 && args.sp >= (*thread).entry_sp {
            (*thread).depth = 0;
        }
        (*thread).depth += 1;
        if (*thread).depth == 1 {
            (*thread).entry_sp = args.sp;
            (*thread).call = args.call as u32;
            (*thread).size_bytes = args.size_bytes;
            (*thread).old_addr = args.old_addr;
            (*thread).out_ptr = args.out_ptr;
            (*thread).cookie = args.cookie;
        }
    }
}

/// Return of an allocator call that returned `returned`, with the caller's
/// user registers `regs`.
#[inline(always)]
fn leave(returned: u64, regs: *const pt_regs) {
    let (tgid, tid) = current_ids();
    let Some(thread) = ALLOC_THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: live map value of this thread; only this thread writes it.
    let state = unsafe {
        if (*thread).depth == 0 {
            return; // entered before the probes were attached
        }
        (*thread).depth -= 1;
        if (*thread).depth != 0 {
            return;
        }
        *thread
    };
    let Some(addr) = block_address(&state, returned) else {
        return;
    };
    if state.old_addr != 0 {
        forget_block(tgid, state.old_addr);
    }
    count_stat(ALLOC_STAT_CALLS);
    if state.countdown_bytes > state.size_bytes {
        // SAFETY: as above.
        unsafe { (*thread).countdown_bytes = state.countdown_bytes - state.size_bytes };
        return;
    }
    // SAFETY: as above.
    unsafe { (*thread).countdown_bytes = exponential_draw() };
    record_block(tgid, &state, addr, regs, true);
}

/// The block a finished call returned, `None` when it failed or returned
/// no block (`realloc(p, 0)` frees `p`).
#[inline(always)]
fn block_address(state: &AllocThread, returned: u64) -> Option<u64> {
    if state.call == AllocCall::PosixMemalign as u32 {
        if returned != 0 || state.out_ptr == 0 {
            return None; // posix_memalign returns an error number
        }
        // SAFETY: bpf_probe_read_user checks the address.
        let addr = unsafe { bpf_probe_read_user(state.out_ptr as *const u64) }.ok()?;
        return (addr != 0 && state.size_bytes != 0).then_some(addr);
    }
    (returned != 0 && state.size_bytes != 0).then_some(returned)
}

/// A sampled block: into the live set (when its free will be seen,
/// `trackable`), and to userspace the user stack at `regs`
/// (`NativeStackRecord`), then an `AllocRecord` with the same tid and time.
#[inline(always)]
pub(crate) fn record_block(
    tgid: u32,
    state: &AllocThread,
    addr: u64,
    regs: *const pt_regs,
    trackable: bool,
) {
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    let block = LiveBlock {
        size_bytes: state.size_bytes,
    };
    let mut flags = if trackable && ALLOC_LIVE.insert(key, block, 0).is_ok() {
        0
    } else {
        if trackable {
            count_stat(ALLOC_STAT_LIVE_FULL);
        }
        ALLOC_UNTRACKED
    };
    if state.cookie & ALLOC_COOKIE_PYTHON_API != 0 {
        flags |= ALLOC_PYTHON_API;
    }
    if state.cookie & ALLOC_COOKIE_SAMPLER != 0 {
        flags |= ALLOC_SAMPLER;
    }
    let header = header(RecordKind::Alloc, tgid);
    // SAFETY: `regs` is the probe's context; the verifier allows the loads.
    let user_regs = unsafe {
        UserRegs {
            ip: (*regs).rip,
            sp: (*regs).rsp,
            bp: (*regs).rbp,
        }
    };
    native_stack::emit(header, user_regs);
    let Some(mut entry) = RECORDS.reserve::<AllocRecord>(0) else {
        // The block stays in the live set: its free is still reported, and
        // userspace ignores frees of blocks it never saw.
        count_dropped();
        return;
    };
    fill_alloc(&mut entry, header, state, addr, user_regs.ip, flags);
    entry.submit(submit_flags());
}

/// Writes every field of a reserved `AllocRecord` in place (too big for the
/// 512-byte BPF stack).
#[inline(always)]
fn fill_alloc(
    entry: &mut RingBufEntry<AllocRecord>,
    header: RecordHeader,
    state: &AllocThread,
    addr: u64,
    native_ip: u64,
    flags: u32,
) {
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to a reserved, writable ring-buffer entry of
    // `size_of::<AllocRecord>()` bytes; fields are written one by one.
    unsafe {
        (*record).header = header;
        (*record).call = state.call;
        (*record).addr = addr;
        (*record).size_bytes = state.size_bytes;
        (*record).native_ip = native_ip;
        (*record).flags = flags;
        let walk = pystack::walk(header.tgid, &raw mut (*record).frames);
        (*record).frame_count = walk.frame_count;
        (*record).stack_status = walk.stack_status;
    }
}

/// A block of `tgid` at `addr` was freed: if it was sampled, out of the
/// live set and a `FreeRecord` to userspace.
#[inline(always)]
pub(crate) fn forget_block(tgid: u32, addr: u64) {
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    // SAFETY: the value is copied out at once.
    let Some(block) = (unsafe { ALLOC_LIVE.get(key) }).copied() else {
        return;
    };
    if ALLOC_LIVE.remove(key).is_err() {
        return; // another thread's free of the same block won the race
    }
    emit(FreeRecord {
        header: header(RecordKind::Free, tgid),
        addr,
        size_bytes: block.size_bytes,
    });
}

/// An exponential variate with mean `SAMPLE_INTERVAL_BYTES`, from the table
/// userspace filled; the mean itself if the table cannot be read.
#[inline(always)]
fn exponential_draw() -> u64 {
    // SAFETY: helper without arguments.
    let index = unsafe { bpf_get_prandom_u32() } & (ALLOC_EXP_DRAWS_LEN - 1);
    ALLOC_EXP_DRAWS
        .get(index)
        .copied()
        .unwrap_or_else(|| SAMPLE_INTERVAL_BYTES.load())
}

/// Adds one to this CPU's allocator counter `slot`.
#[inline(always)]
fn count_stat(slot: u32) {
    if let Some(counter) = ALLOC_STATS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot of this CPU; programs do not nest on one CPU.
        unsafe { *counter += 1 };
    }
}
