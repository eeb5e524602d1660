//! The user stack of a sampled event, kernel side (first step of the data
//! flow): a thread's user registers and up to `NATIVE_STACK_BYTES` of its
//! stack, copied read-only into a `NativeStackRecord` reserved in `RECORDS`
//! (16 KiB: far too big for the 512-byte BPF stack) and sent right before
//! the event's `AllocRecord` or `MemoryRecord`, for
//! `memtrace::symbolize::unwind` to unwind with the binaries' CFI.

use aya_ebpf::helpers::generated::bpf_probe_read_user;
use memtrace_common::{
    NativeStackRecord, RecordHeader, RecordKind, NATIVE_STACK_CHUNKS, NATIVE_STACK_CHUNK_BYTES,
};

use crate::{
    maps::RECORDS,
    ring::{count_dropped, submit_flags},
};

/// The user registers a stack is unwound from.
#[derive(Clone, Copy)]
pub struct UserRegs {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer.
    pub bp: u64,
}

/// Sends the current thread's user registers `regs` and the top of its
/// stack, with `header`'s tid and time; a full ring buffer is counted in
/// `DROPPED`.
#[inline(always)]
pub fn emit(header: RecordHeader, regs: UserRegs) {
    let Some(mut entry) = RECORDS.reserve::<NativeStackRecord>(0) else {
        count_dropped();
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to a reserved, writable ring-buffer entry of
    // `size_of::<NativeStackRecord>()` bytes, written field by field.
    unsafe {
        let UserRegs { ip, sp, bp } = regs;
        (*record).header = RecordHeader {
            kind: RecordKind::NativeStack as u32,
            ..header
        };
        (*record).ip = ip;
        (*record).sp = sp;
        (*record).bp = bp;
        (*record)._pad = 0;
        let start = sp & !(NATIVE_STACK_CHUNK_BYTES as u64 - 1);
        (*record).stack_start = start;
        let copied = copy_stack(&raw mut (*record).stack as *mut u8, start);
        (*record).stack_len_bytes = copied;
    }
    entry.submit(submit_flags());
}

/// Copies whole chunks of user memory from `start` up into `dst`, stopping
/// at the first chunk that cannot be read; returns the bytes copied.
///
/// # Safety
/// `dst` has room for `NATIVE_STACK_CHUNKS` chunks.
#[inline(always)]
unsafe fn copy_stack(dst: *mut u8, start: u64) -> u32 {
    let mut copied = 0u32;
    for chunk in 0..NATIVE_STACK_CHUNKS {
        let offset = chunk * NATIVE_STACK_CHUNK_BYTES;
        // SAFETY: `dst + offset` has room for one chunk (see the contract);
        // bpf_probe_read_user checks the user address.
        let failed = unsafe {
            bpf_probe_read_user(
                dst.add(offset).cast(),
                NATIVE_STACK_CHUNK_BYTES as u32,
                (start + offset as u64) as *const _,
            )
        } != 0;
        if failed {
            break;
        }
        copied += NATIVE_STACK_CHUNK_BYTES as u32;
    }
    copied
}
