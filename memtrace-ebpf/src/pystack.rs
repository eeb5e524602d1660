//! Python stack walk inside the BPF program: reads the current thread's
//! CPython frame chain (innermost first) straight into a reserved
//! `MemoryRecord`, using the per-process `PyProcessInfo` that userspace put
//! in `PY_PROCESSES`. Method and offsets: shared/notes/python-stacks.md §4-5
//! (the glibc x86-64 TSS slot at `fsbase + tss_slot_offset`, then the
//! `_PyInterpreterFrame` chain through `previous`, or on 3.9/3.10 the
//! `PyFrameObject` chain through `f_back`).

use aya_ebpf::helpers::bpf_probe_read_user;
use memtrace_common::{
    code_fingerprint, PyFrame, PyOffsets, PyProcessInfo, MAX_FRAMES, NO_OFFSET, STACK_NO_PYTHON,
    STACK_NO_THREAD_STATE, STACK_READ_ERROR, STACK_SUBINTERPRETER, STACK_TRUNCATED,
};

use crate::kernel;
use crate::maps::{PY_PROCESSES, TASK_FSBASE_OFFSET};

/// Outcome of one walk: how many frames were written and the `STACK_*` bits.
pub struct Walk {
    /// Valid entries written to the frames array.
    pub frame_count: u32,
    /// `STACK_*` bits.
    pub stack_status: u32,
}

impl Walk {
    /// A walk that wrote no frame, with `status`.
    const fn empty(status: u32) -> Self {
        Self {
            frame_count: 0,
            stack_status: status,
        }
    }
}

/// Reads a `T` at `addr` in the current process's address space.
#[inline(always)]
fn read_user<T>(addr: u64) -> Result<T, ()> {
    // SAFETY: bpf_probe_read_user checks the address; failure is an Err.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|_| ())
}

/// Walks the Python stack of the current thread of process `tgid` into
/// `frames` (innermost first).
///
/// # Safety
/// `frames` points to writable memory for `MAX_FRAMES` frames (a reserved
/// ring-buffer record).
#[inline(always)]
pub unsafe fn walk(tgid: u32, frames: *mut [PyFrame; MAX_FRAMES]) -> Walk {
    // SAFETY: the value is copied out at once; userspace replaces entries
    // only whole, between walks of this process.
    let Some(info) = (unsafe { PY_PROCESSES.get(tgid) }).copied() else {
        return Walk::empty(STACK_NO_PYTHON);
    };
    let Ok((tss_tstate, fsbase)) = thread_state(&info) else {
        return Walk::empty(STACK_READ_ERROR);
    };
    // A thread a 3.9-3.11 sub-interpreter started has no TSS slot but may
    // hold the GIL: `swapped_thread_state` finds it too.
    let tstate = swapped_thread_state(tss_tstate, fsbase, &info);
    if tstate == 0 {
        return Walk::empty(STACK_NO_THREAD_STATE);
    }
    let Ok(frame) = current_frame(tstate, &info.offsets) else {
        return Walk::empty(STACK_READ_ERROR);
    };
    let mut walk = unsafe { walk_frames(frame, &info.offsets, frames) };
    walk.stack_status |= interpreter_status(tstate, &info);
    walk
}

/// The current thread's `PyThreadState*` from the word at
/// `tss_slot_offset` from its thread pointer (or, when that holds 0, at
/// `tss_slot_offset_alt`), and the thread's fsbase.
#[inline(always)]
fn thread_state(info: &PyProcessInfo) -> Result<(u64, u64), ()> {
    let fsbase: u64 = kernel::field(kernel::current_task(), TASK_FSBASE_OFFSET.load())?;
    let at = |offset: i32| fsbase.wrapping_add(i64::from(offset) as u64);
    let mut tstate: u64 = read_user(at(info.tss_slot_offset))?;
    if tstate == 0 && info.tss_slot_offset_alt != 0 {
        tstate = read_user(at(info.tss_slot_offset_alt))?;
    }
    Ok((tstate, fsbase))
}

/// On 3.9–3.11, the thread state a sub-interpreter swapped in on this
/// thread: `gilstate.tstate_current` when it differs from the TSS slot's
/// and belongs to this thread (`thread_id`, `pthread_self()`, is the
/// fsbase on glibc x86-64; otherwise another thread holds the GIL). Else,
/// and on 3.12+ (whose TSS slot follows the swap), `tss_tstate`.
#[inline(always)]
fn swapped_thread_state(tss_tstate: u64, fsbase: u64, info: &PyProcessInfo) -> u64 {
    if info.tstate_current_addr == 0 {
        return tss_tstate;
    }
    let current = read_user::<u64>(info.tstate_current_addr).unwrap_or(0);
    if current == 0 || current == tss_tstate {
        return tss_tstate;
    }
    let thread_id = read_user::<u64>(current + u64::from(info.offsets.tstate_thread_id));
    if thread_id == Ok(fsbase) {
        current
    } else {
        tss_tstate
    }
}

/// [`STACK_SUBINTERPRETER`] when `tstate` belongs to an interpreter other
/// than the main one.
#[inline(always)]
fn interpreter_status(tstate: u64, info: &PyProcessInfo) -> u32 {
    if info.main_interp == 0 {
        return 0;
    }
    match read_user::<u64>(tstate + u64::from(info.offsets.tstate_interp)) {
        Ok(interp) if interp != info.main_interp => STACK_SUBINTERPRETER,
        _ => 0,
    }
}

/// The innermost `_PyInterpreterFrame*` of thread state `tstate`.
#[inline(always)]
fn current_frame(tstate: u64, offsets: &PyOffsets) -> Result<u64, ()> {
    if offsets.tstate_cframe == NO_OFFSET {
        return read_user(tstate + u64::from(offsets.current_frame));
    }
    let cframe: u64 = read_user(tstate + u64::from(offsets.tstate_cframe))?;
    read_user(cframe + u64::from(offsets.current_frame))
}

/// `frame`, or the first real frame behind it when `frame` is not a
/// Python frame (3.12+: `owner >= owner_skip_min`: an entry frame of a
/// C→Python call, or on 3.14+ a frame the interpreter or the C stack owns).
/// At most [`MAX_SKIPPED_FRAMES`] such frames in a row are skipped; a chain
/// with more is a read error, never a wrong frame.
#[inline(always)]
fn skip_entry_frame(mut frame: u64, offsets: &PyOffsets) -> Result<u64, ()> {
    if offsets.owner_skip_min == NO_OFFSET {
        return Ok(frame);
    }
    for _ in 0..=MAX_SKIPPED_FRAMES {
        if frame == 0 {
            return Ok(0);
        }
        let owner: u8 = read_user(frame + u64::from(offsets.frame_owner))?;
        if u16::from(owner) < offsets.owner_skip_min {
            return Ok(frame);
        }
        frame = read_user(frame + u64::from(offsets.frame_previous))?;
    }
    Err(())
}

/// Non-Python frames skipped in a row: an entry frame, and on 3.14 the
/// frame the interpreter owns beside it.
const MAX_SKIPPED_FRAMES: usize = 2;

/// The entry of the real frame `frame`.
#[inline(always)]
fn read_frame(frame: u64, offsets: &PyOffsets) -> Result<PyFrame, ()> {
    // 3.14 tags `f_executable` in its low bits (python-stacks.md §5); code
    // objects are at least 8-byte aligned, so masking is harmless before it.
    let code = read_user::<u64>(frame + u64::from(offsets.frame_code))? & !3;
    let first_lineno: u32 = read_user(code + u64::from(offsets.code_firstlineno))?;
    let name: u64 = read_user(code + u64::from(offsets.code_name))?;
    let shape: u64 = read_user(code + u64::from(offsets.code_shape))?;
    let instr_index = instr_index(frame, code, offsets)?;
    Ok(PyFrame {
        code_addr: code,
        instr_index,
        fingerprint: code_fingerprint(first_lineno, name, shape),
    })
}

/// The frame's instruction index: `f_lasti` of a 3.9/3.10 `PyFrameObject`
/// (`code_adaptive` is [`NO_OFFSET`]; -1 before the frame starts), else the
/// code units from `co_code_adaptive` to the instruction pointer.
#[inline(always)]
fn instr_index(frame: u64, code: u64, offsets: &PyOffsets) -> Result<i32, ()> {
    if offsets.code_adaptive == NO_OFFSET {
        return read_user(frame + u64::from(offsets.frame_instr_ptr));
    }
    let instr_ptr: u64 = read_user(frame + u64::from(offsets.frame_instr_ptr))?;
    let code_start = code + u64::from(offsets.code_adaptive);
    // A frame that has not started yet has instr_ptr before co_code_adaptive.
    Ok(if instr_ptr < code_start {
        -1
    } else {
        i32::try_from((instr_ptr - code_start) / 2).unwrap_or(i32::MAX)
    })
}

/// Follows `previous` from `frame` for at most `MAX_FRAMES` real frames,
/// writing frame `i` of the chain to `frames[i]`.
///
/// Step `i` always writes entry `i` (entry frames are skipped inside the
/// step), so the verifier sees one state per step instead of one per
/// (step, frames written) pair, which exceeded its 1M-instruction budget.
///
/// # Safety
/// As for [`walk`].
#[inline(always)]
unsafe fn walk_frames(
    mut frame: u64,
    offsets: &PyOffsets,
    frames: *mut [PyFrame; MAX_FRAMES],
) -> Walk {
    for index in 0..MAX_FRAMES {
        if frame == 0 {
            return walk_result(index, 0);
        }
        frame = match skip_entry_frame(frame, offsets) {
            Ok(0) => return walk_result(index, 0),
            Ok(real) => real,
            Err(()) => return walk_result(index, STACK_READ_ERROR),
        };
        let entry = match read_frame(frame, offsets) {
            Ok(entry) => entry,
            Err(()) => return walk_result(index, STACK_READ_ERROR),
        };
        // SAFETY: index < MAX_FRAMES; `frames` is writable (see `walk`).
        unsafe { (*frames)[index] = entry };
        frame = match read_user(frame + u64::from(offsets.frame_previous)) {
            Ok(previous) => previous,
            Err(()) => return walk_result(index + 1, STACK_READ_ERROR),
        };
    }
    walk_result(MAX_FRAMES, if frame == 0 { 0 } else { STACK_TRUNCATED })
}

/// A [`Walk`] of `count` frames.
#[inline(always)]
fn walk_result(count: usize, stack_status: u32) -> Walk {
    Walk {
        frame_count: count as u32,
        stack_status,
    }
}
