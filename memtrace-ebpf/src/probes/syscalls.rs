//! Address-space changes of traced processes: the `mmap`, `munmap`,
//! `mremap`, `brk` and `madvise` syscall tracepoints. `sys_enter_*` keeps
//! the arguments per thread in `PENDING_SYSCALLS`; `sys_exit_*` pairs them
//! with the result and, for a successful call, updates the process's
//! counters and samples a `MemoryRecord`. Every successful call that gives
//! memory back or moves it (munmap, madvise free, brk shrink, mremap,
//! `MAP_FIXED` mmap) also sends an exact `AddressRecord`, unsampled, so
//! userspace can release the pages the paths hold.
//!
//! Formats (/sys/kernel/tracing/events/syscalls/sys_{enter,exit}_*/format on
//! 6.18): every `sys_enter_*` has its arguments as 8-byte fields from offset
//! 16, in order (`mmap`: addr, len, prot, flags; `munmap`: addr, len;
//! `mremap`: addr, old_len, new_len, flags; `brk`: brk; `madvise`: start,
//! len_in, behavior); every `sys_exit_*` has `long ret` at offset 16.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use memtrace_common::{
    AddressOp, AddressRecord, MemoryEvent, ProcessCounters, RecordKind, PAGE_SIZE_BYTES,
};

use crate::{
    counters::{add, current_ids, swap, traced},
    maps::{PendingSyscall, PENDING_SYSCALLS},
    record::field,
    ring::{emit, header},
    sample::{count_and_emit, MemoryEventArgs},
};

/// Offset of the first argument in a `sys_enter_*` record.
const ARGS_OFFSET: usize = 16;
/// Offset of `long ret` in a `sys_exit_*` record.
const RET_OFFSET: usize = 16;
/// Largest errno a syscall returns as `-errno` (include/linux/err.h).
const MAX_ERRNO: u64 = 4095;
/// `madvise` advice that gives memory back (include/uapi/asm-generic/mman-common.h).
const MADV_DONTNEED: u64 = 4;
/// See [`MADV_DONTNEED`].
const MADV_FREE: u64 = 8;
/// See [`MADV_DONTNEED`].
const MADV_REMOVE: u64 = 9;
/// See [`MADV_DONTNEED`].
const MADV_DONTNEED_LOCKED: u64 = 24;
/// `mmap` flag: replace whatever is mapped at `addr`
/// (include/uapi/asm-generic/mman-common.h).
const MAP_FIXED: u64 = 0x10;

/// Which syscall a pending entry belongs to (stored as `u32`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Syscall {
    Mmap = 1,
    Munmap = 2,
    Mremap = 3,
    Brk = 4,
    Madvise = 5,
}

/// Stores the first `arg_count` arguments of `syscall` for the current
/// thread if its process is traced.
#[inline(always)]
fn enter(ctx: &TracePointContext, syscall: Syscall, arg_count: usize) -> Result<(), ()> {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return Ok(());
    }
    let mut pending = PendingSyscall {
        syscall: syscall as u32,
        _pad: 0,
        args: [0; 4],
    };
    for (index, arg) in pending.args.iter_mut().enumerate().take(arg_count) {
        // SAFETY: u64 argument fields of the tracepoint record (formats
        // above).
        *arg = unsafe { field(ctx, ARGS_OFFSET + 8 * index) };
    }
    PENDING_SYSCALLS.insert(tid, pending, 0).map_err(|_| ())
}

/// A traced syscall that returned.
struct Completed {
    /// The caller's process.
    tgid: u32,
    /// Arguments kept at `sys_enter_*`.
    args: [u64; 4],
    /// The return value (`-errno` on failure).
    ret: u64,
    /// The caller's live `PROCESSES` value.
    counters: *mut ProcessCounters,
}

/// The completed `syscall` of the current thread, removing its pending
/// entry; `None` when it was not traced.
#[inline(always)]
fn exit(ctx: &TracePointContext, syscall: Syscall) -> Result<Option<Completed>, ()> {
    let (tgid, tid) = current_ids();
    // SAFETY: the value is copied out before it is removed.
    let Some(pending) = (unsafe { PENDING_SYSCALLS.get(tid) }).copied() else {
        return Ok(None);
    };
    let _ = PENDING_SYSCALLS.remove(tid);
    if pending.syscall != syscall as u32 {
        return Ok(None);
    }
    let Some(counters) = traced(tgid) else {
        return Ok(None);
    };
    // SAFETY: the u64 `ret` field of the tracepoint record (formats above).
    let ret: u64 = unsafe { field(ctx, RET_OFFSET) };
    // SAFETY: live map value of a traced process.
    unsafe { add(&raw mut (*counters).syscalls, 1) };
    Ok(Some(Completed {
        tgid,
        args: pending.args,
        ret,
        counters,
    }))
}

/// True when a syscall returning an address or 0 failed (`-errno`).
#[inline(always)]
fn failed(ret: u64) -> bool {
    ret > u64::MAX - MAX_ERRNO
}

/// `len` rounded up to whole pages, as the kernel does.
#[inline(always)]
fn page_align(len: u64) -> u64 {
    len.wrapping_add(PAGE_SIZE_BYTES - 1) & !(PAGE_SIZE_BYTES - 1)
}

/// Generates the `sys_enter_*` program of one syscall.
macro_rules! enter_program {
    ($name:ident, $try_name:ident, $syscall:expr, $arg_count:expr) => {
        #[doc = concat!("Tracepoint `syscalls/", stringify!($name), "`: keeps the arguments.")]
        #[tracepoint]
        pub fn $name(ctx: TracePointContext) -> u32 {
            match $try_name(&ctx) {
                Ok(()) | Err(()) => 0,
            }
        }

        fn $try_name(ctx: &TracePointContext) -> Result<(), ()> {
            enter(ctx, $syscall, $arg_count)
        }
    };
}

/// Generates the `sys_exit_*` program of one syscall around its handler.
macro_rules! exit_program {
    ($name:ident, $try_name:ident, $syscall:expr, $handler:ident) => {
        #[doc = concat!("Tracepoint `syscalls/", stringify!($name), "`: accounts a successful call.")]
        #[tracepoint]
        pub fn $name(ctx: TracePointContext) -> u32 {
            match $try_name(&ctx) {
                Ok(()) | Err(()) => 0,
            }
        }

        fn $try_name(ctx: &TracePointContext) -> Result<(), ()> {
            if let Some(call) = exit(ctx, $syscall)? {
                // SAFETY: `counters` is the live map value of `tgid`.
                unsafe { $handler(call.tgid, &call.args, call.ret, call.counters) };
            }
            Ok(())
        }
    };
}

enter_program!(sys_enter_mmap, try_sys_enter_mmap, Syscall::Mmap, 4);
exit_program!(sys_exit_mmap, try_sys_exit_mmap, Syscall::Mmap, on_mmap);
enter_program!(sys_enter_munmap, try_sys_enter_munmap, Syscall::Munmap, 2);
exit_program!(
    sys_exit_munmap,
    try_sys_exit_munmap,
    Syscall::Munmap,
    on_munmap
);
enter_program!(sys_enter_mremap, try_sys_enter_mremap, Syscall::Mremap, 4);
exit_program!(
    sys_exit_mremap,
    try_sys_exit_mremap,
    Syscall::Mremap,
    on_mremap
);
enter_program!(sys_enter_brk, try_sys_enter_brk, Syscall::Brk, 1);
exit_program!(sys_exit_brk, try_sys_exit_brk, Syscall::Brk, on_brk);
enter_program!(
    sys_enter_madvise,
    try_sys_enter_madvise,
    Syscall::Madvise,
    3
);
exit_program!(
    sys_exit_madvise,
    try_sys_exit_madvise,
    Syscall::Madvise,
    on_madvise
);

/// `mmap(addr, len, prot, flags, ..)` returned the mapping's start.
///
/// # Safety
/// `counters` is the live `PROCESSES` value of `tgid`.
#[inline(always)]
unsafe fn on_mmap(tgid: u32, args: &[u64; 4], ret: u64, counters: *mut ProcessCounters) {
    if failed(ret) {
        return;
    }
    let len_bytes = page_align(args[1]);
    // SAFETY: see the function's contract.
    let rss_bytes = unsafe { (*counters).rss_total_bytes() };
    if args[3] & MAP_FIXED != 0 {
        emit_address(
            tgid,
            AddressOp::MmapFixed,
            ret,
            len_bytes,
            (0, 0),
            rss_bytes,
        );
    }
    let event = MemoryEventArgs {
        event: MemoryEvent::Mmap,
        addr: ret,
        len_bytes,
        user_regs: 0,
        flags: (args[3] & 0xffff_ffff) | (args[2] << 32),
        rss_bytes,
    };
    // SAFETY: see the function's contract.
    unsafe { count_and_emit(tgid, counters, &raw mut (*counters).mmap_bytes, &event) };
}

/// Sends the exact [`AddressRecord`] of a successful call of process `tgid`;
/// `moved_to` is the `(new_addr, new_len_bytes)` of an mremap, else
/// `(0, 0)`.
#[inline(always)]
fn emit_address(
    tgid: u32,
    op: AddressOp,
    addr: u64,
    len_bytes: u64,
    moved_to: (u64, u64),
    rss_bytes: u64,
) {
    emit(AddressRecord {
        header: header(RecordKind::Address, tgid),
        op: op as u32,
        _pad: 0,
        addr,
        len_bytes,
        new_addr: moved_to.0,
        new_len_bytes: moved_to.1,
        rss_bytes,
    });
}

/// `munmap(addr, len)` returned 0 on success.
///
/// # Safety
/// As for [`on_mmap`].
#[inline(always)]
unsafe fn on_munmap(tgid: u32, args: &[u64; 4], ret: u64, counters: *mut ProcessCounters) {
    if ret != 0 {
        return;
    }
    let len_bytes = page_align(args[1]);
    // SAFETY: see the function's contract.
    let rss_bytes = unsafe { (*counters).rss_total_bytes() };
    emit_address(
        tgid,
        AddressOp::Munmap,
        args[0],
        len_bytes,
        (0, 0),
        rss_bytes,
    );
    let event = MemoryEventArgs {
        event: MemoryEvent::Munmap,
        addr: args[0],
        len_bytes,
        user_regs: 0,
        flags: 0,
        rss_bytes,
    };
    // SAFETY: see the function's contract.
    unsafe { count_and_emit(tgid, counters, &raw mut (*counters).munmap_bytes, &event) };
}

/// `mremap(addr, old_len, new_len, flags, ..)` returned the new start.
///
/// # Safety
/// As for [`on_mmap`].
#[inline(always)]
unsafe fn on_mremap(tgid: u32, args: &[u64; 4], ret: u64, counters: *mut ProcessCounters) {
    if failed(ret) {
        return;
    }
    let (old_len, new_len) = (page_align(args[1]), page_align(args[2]));
    // SAFETY: see the function's contract.
    let rss_bytes = unsafe { (*counters).rss_total_bytes() };
    emit_address(
        tgid,
        AddressOp::Mremap,
        args[0],
        old_len,
        (ret, new_len),
        rss_bytes,
    );
    let (event, addr, len_bytes, field) = if new_len > old_len {
        let field = unsafe { &raw mut (*counters).mremap_grow_bytes };
        (MemoryEvent::MremapGrow, ret, new_len - old_len, field)
    } else if new_len < old_len {
        let field = unsafe { &raw mut (*counters).mremap_shrink_bytes };
        (
            MemoryEvent::MremapShrink,
            ret + new_len,
            old_len - new_len,
            field,
        )
    } else {
        return;
    };
    let event = MemoryEventArgs {
        event,
        addr,
        len_bytes,
        user_regs: 0,
        flags: args[3],
        rss_bytes,
    };
    // SAFETY: see the function's contract.
    unsafe { count_and_emit(tgid, counters, field, &event) };
}

/// `brk(addr)` returned the new program break (the old one on failure or
/// for `brk(0)`). The first call only learns the break.
///
/// # Safety
/// As for [`on_mmap`].
#[inline(always)]
unsafe fn on_brk(tgid: u32, _args: &[u64; 4], ret: u64, counters: *mut ProcessCounters) {
    // SAFETY: see the function's contract.
    let old_end = unsafe { swap(&raw mut (*counters).brk_end, ret) };
    if old_end == 0 || old_end == ret {
        return;
    }
    // SAFETY: see the function's contract.
    let rss_bytes = unsafe { (*counters).rss_total_bytes() };
    let (event, addr, len_bytes, field) = if ret > old_end {
        let field = unsafe { &raw mut (*counters).brk_grow_bytes };
        (MemoryEvent::BrkGrow, old_end, ret - old_end, field)
    } else {
        let field = unsafe { &raw mut (*counters).brk_shrink_bytes };
        let shrink_bytes = old_end - ret;
        emit_address(
            tgid,
            AddressOp::BrkShrink,
            ret,
            shrink_bytes,
            (0, 0),
            rss_bytes,
        );
        (MemoryEvent::BrkShrink, ret, shrink_bytes, field)
    };
    let event = MemoryEventArgs {
        event,
        addr,
        len_bytes,
        user_regs: 0,
        flags: 0,
        rss_bytes,
    };
    // SAFETY: see the function's contract.
    unsafe { count_and_emit(tgid, counters, field, &event) };
}

/// Whether `madvise` `advice` gives the range's memory back.
#[inline(always)]
fn frees_memory(advice: u64) -> bool {
    matches!(
        advice,
        MADV_DONTNEED | MADV_FREE | MADV_REMOVE | MADV_DONTNEED_LOCKED
    )
}

/// `madvise(start, len, advice)` returned 0 on success; only advice that
/// gives memory back is accounted.
///
/// # Safety
/// As for [`on_mmap`].
#[inline(always)]
unsafe fn on_madvise(tgid: u32, args: &[u64; 4], ret: u64, counters: *mut ProcessCounters) {
    let advice = args[2] & 0xffff_ffff;
    if ret != 0 || !frees_memory(advice) {
        return;
    }
    let len_bytes = page_align(args[1]);
    // SAFETY: see the function's contract.
    let rss_bytes = unsafe { (*counters).rss_total_bytes() };
    emit_address(
        tgid,
        AddressOp::MadviseFree,
        args[0],
        len_bytes,
        (0, 0),
        rss_bytes,
    );
    let event = MemoryEventArgs {
        event: MemoryEvent::MadviseFree,
        addr: args[0],
        len_bytes,
        user_regs: 0,
        flags: advice,
        rss_bytes,
    };
    // SAFETY: see the function's contract.
    unsafe {
        count_and_emit(
            tgid,
            counters,
            &raw mut (*counters).madvise_free_bytes,
            &event,
        )
    };
}
