//! Fields of a classic tracepoint's record, read with a direct load: the
//! verifier allows loads from the context at constant, aligned offsets
//! within the record (kernel/trace/bpf_trace.c `tp_prog_is_valid_access`),
//! so no `bpf_probe_read_kernel` call is paid per field on hot paths (a
//! page fault reads five fields).

use aya_ebpf::{programs::TracePointContext, EbpfContext as _};

/// The `T` at byte `offset` of the tracepoint record behind `ctx`.
///
/// # Safety
/// `offset` is a field of type `T` in the record's format (the caller cites
/// it), aligned to `size_of::<T>()`.
#[inline(always)]
pub unsafe fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: see the function's contract; the verifier checks the bounds.
    unsafe { ctx.as_ptr().cast::<u8>().add(offset).cast::<T>().read() }
}
