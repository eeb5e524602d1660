//! A CPython 3.13+ process's thread-state slot and main interpreter, found
//! through the interpreter and thread lists its `_Py_DebugOffsets`
//! describes (`debug_offsets`), and a live check of that layout on one of
//! its frames: part of `probe`, after `debug_offsets`.
//!
//! - The main interpreter is the last of `_PyRuntime.interpreters.head`'s
//!   list (new interpreters are pushed at its head; Python/pystate.c).
//! - The BPF walk reads the current thread's `PyThreadState *` from the
//!   glibc TSD slot of `_PyRuntime.autoTSSkey`, whose position in
//!   `_PyRuntime` is not in `_Py_DebugOffsets`. A bound thread's slot holds
//!   its own thread state, and its `thread_id` is `pthread_self()`, its
//!   thread pointer (fsbase) on glibc x86-64; so the slot is the word after
//!   fsbase that holds the thread state. Its offset is the same in every
//!   thread of the process (one key, one glibc), whatever glibc's `struct
//!   pthread` looks like (sid's glibc 2.42 beside Debian's 2.36).

use memtrace_common::NO_OFFSET;

use super::debug_offsets::{DebugLayout, ObjectLayout};
use super::mem::{MemError, ProcessMemory};
use super::offsets::{RuntimeLayout, VersionLayout};
use super::types::{ProbeError, PythonVersion};

/// glibc x86-64: offset of `struct pthread.specific_1stblock` from the
/// thread pointer on the glibc the 3.9-3.12 table was measured with; each
/// `pthread_key_data` is `{seq, data}` (16 bytes) and `data` is at +8
/// (python-stacks.md §4 A; bcc pyperf).
pub const GLIBC_TSD_FIRST_BLOCK: i32 = 0x310;

/// Bytes searched on each side of a thread pointer for its thread state:
/// after it, `struct pthread` up to and including the first TSD block
/// (0x310 + 32 * 16 on glibc 2.36), with room for a larger one; before it,
/// the static TLS of the executable and the libraries loaded with it.
const TSD_SEARCH_BYTES: usize = 0x1000;

/// Most interpreters and threads followed in a list.
const MAX_LIST: usize = 256;

/// What `probe` hands on for a process, whichever way it was found.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    /// The layout.
    pub layout: VersionLayout,
    /// `PyProcessInfo::tss_slot_offset`.
    pub tss_slot_offset: i32,
    /// `PyProcessInfo::tss_slot_offset_alt` (0: none).
    pub tss_slot_offset_alt: i32,
    /// The main interpreter's `PyInterpreterState *`.
    pub main_interp: u64,
    /// `PyProcessInfo::tstate_current_addr` (0 on 3.12+).
    pub tstate_current_addr: u64,
}

/// The 3.13+ runtime at `runtime` with `layout`; `None` while the
/// interpreter has no bound thread yet, or no thread's slot is told apart
/// (see [`own_slot`]; probe again later).
///
/// # Errors
/// A read fails ([`ProbeError::Memory`]), or the live check fails
/// ([`ProbeError::DebugOffsetsField`] naming the field).
pub fn find(
    memory: &ProcessMemory,
    runtime: u64,
    version: PythonVersion,
    layout: &DebugLayout,
) -> Result<Option<Found>, ProbeError> {
    let tgid = memory.tgid();
    let read = |addr: u64| {
        memory
            .read_u64(addr)
            .map_err(|source| ProbeError::Memory { tgid, source })
    };
    let lists = &layout.threads;
    let head = read(runtime.wrapping_add(lists.interpreters_head))?;
    if head == 0 {
        return Ok(None);
    }
    let main_interp = last_of(head, lists.interp_next, read)?;
    let first_thread = read(main_interp.wrapping_add(lists.interp_threads_head))?;
    if first_thread == 0 {
        return Ok(None);
    }
    let interp = read(first_thread.wrapping_add(u64::from(layout.walk.tstate_interp)))?;
    if interp != main_interp {
        return Err(field_error(
            version,
            "thread_state.interp",
            layout.walk.tstate_interp,
            format!("the main interpreter's thread state names interpreter {interp:#x}, not {main_interp:#x}"),
        ));
    }
    let Some((slot, tstate)) = slot_offset(memory, first_thread, layout)? else {
        return Ok(None);
    };
    check_frame_settled(memory, tstate, layout, version)?;
    Ok(Some(Found {
        layout: VersionLayout {
            major: version.major,
            minor: version.minor,
            walk: layout.walk,
            runtime: RuntimeLayout::ThreadLists(layout.threads),
            code: layout.code,
            bytes: layout.bytes,
            unicode: layout.unicode,
        },
        tss_slot_offset: slot.0,
        tss_slot_offset_alt: slot.1,
        main_interp,
        tstate_current_addr: 0,
    }))
}

/// The last element of the list that starts at `head` and links through
/// the pointer at `next`.
fn last_of(
    head: u64,
    next: u64,
    read: impl Fn(u64) -> Result<u64, ProbeError>,
) -> Result<u64, ProbeError> {
    let mut last = head;
    for _ in 0..MAX_LIST {
        match read(last.wrapping_add(next))? {
            0 => break,
            following => last = following,
        }
    }
    Ok(last)
}

/// A thread's slot offsets from its thread pointer (its own slot, then the
/// alternative: see [`own_slot`]) and that thread's `PyThreadState` address.
type SlotFound = ((i32, i32), u64);

/// The offsets from its thread pointer of a thread's own slot and
/// alternative (see [`own_slot`]; searching the threads from `first`), and
/// that thread's state; `None` when no thread shows them (probe again
/// later).
fn slot_offset(
    memory: &ProcessMemory,
    first: u64,
    layout: &DebugLayout,
) -> Result<Option<SlotFound>, ProbeError> {
    let tgid = memory.tgid();
    let read = |addr: u64| {
        memory
            .read_u64(addr)
            .map_err(|source| ProbeError::Memory { tgid, source })
    };
    let mut tstate = first;
    for _ in 0..MAX_LIST {
        if tstate == 0 {
            return Ok(None);
        }
        let fsbase = read(tstate.wrapping_add(layout.threads.tstate_thread_id))?;
        if let Some(offset) = own_slot(memory, fsbase, tstate) {
            return Ok(Some((offset, tstate)));
        }
        tstate = read(tstate.wrapping_add(layout.threads.tstate_next))?;
    }
    Ok(None)
}

/// The offsets from `fsbase` of the words that hold `tstate`: its TSD slot
/// after the thread pointer (3.13, 3.14: `autoTSSkey`, kept while the
/// thread exists) when one word there holds it, with no alternative; else,
/// below the thread pointer in static TLS, 3.15's `_Py_tss_gilstate` (kept
/// while the thread exists) and `_Py_tss_tstate` (3.13+, NULL while the
/// thread is detached): one word when the thread is detached (with no
/// alternative), two in address order when it is attached (the first
/// non-zero of the two is the thread's state either way). `None` for more,
/// or when the thread's memory is gone.
fn own_slot(memory: &ProcessMemory, fsbase: u64, tstate: u64) -> Option<(i32, i32)> {
    if fsbase < TSD_SEARCH_BYTES as u64 {
        return None;
    }
    // By 256-byte pieces: the range may cross the end of a mapping
    // (a thread's stack and TLS area).
    let start = fsbase - TSD_SEARCH_BYTES as u64;
    let mut matches: Vec<i32> = Vec::new();
    for piece in 0..2 * TSD_SEARCH_BYTES / 256 {
        let at = start + 256 * piece as u64;
        let Ok(bytes) = memory.read_array::<256>(at) else {
            continue;
        };
        let found = bytes.chunks_exact(8).enumerate();
        matches.extend(
            found
                .filter(|(_, word)| *word == tstate.to_le_bytes())
                .filter_map(|(index, _)| {
                    let offset = at.wrapping_sub(fsbase) as i64 + 8 * index as i64;
                    i32::try_from(offset).ok()
                }),
        );
    }
    let (after, before): (Vec<i32>, Vec<i32>) = matches.iter().partition(|&&o| o >= 0);
    match (after.as_slice(), before.as_slice()) {
        ([one], _) | ([], [one]) => Some((*one, 0)),
        ([], [first, second]) => Some((*first, *second)),
        _ => None,
    }
}

/// How often [`check_frame_settled`] tries the live check before it
/// counts as failed.
const FRAME_CHECK_TRIES: usize = 3;

/// [`check_frame`], tried up to [`FRAME_CHECK_TRIES`] times 1 ms apart: the
/// thread runs while memtrace reads it (a frame popped between reading the
/// frame pointer and reading its code, and its memory reused, is a torn
/// read, not a layout that differs), so only a check that fails every time
/// refuses the process.
///
/// # Errors
/// The last try's [`check_frame`] error.
fn check_frame_settled(
    memory: &ProcessMemory,
    tstate: u64,
    layout: &DebugLayout,
    version: PythonVersion,
) -> Result<(), ProbeError> {
    let mut result = check_frame(memory, tstate, layout, version);
    for _ in 1..FRAME_CHECK_TRIES {
        if result.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        result = check_frame(memory, tstate, layout, version);
    }
    result
}

/// Checks the frame offsets on the live process: the innermost Python
/// frame of `tstate` points at an object whose type is named `code`, and
/// that code object's file name at a `str`. A thread with no frame passes.
fn check_frame(
    memory: &ProcessMemory,
    tstate: u64,
    layout: &DebugLayout,
    version: PythonVersion,
) -> Result<(), ProbeError> {
    let walk = &layout.walk;
    let Ok(mut frame) = memory.read_u64(tstate + u64::from(walk.current_frame)) else {
        return Ok(());
    };
    for _ in 0..8 {
        if frame == 0 {
            return Ok(());
        }
        let Ok(owner) = memory.read_array::<1>(frame + u64::from(walk.frame_owner)) else {
            return Ok(());
        };
        if u16::from(owner[0]) < walk.owner_skip_min || walk.owner_skip_min == NO_OFFSET {
            break;
        }
        let Ok(previous) = memory.read_u64(frame + u64::from(walk.frame_previous)) else {
            return Ok(());
        };
        frame = previous;
    }
    let Ok(code) = memory.read_u64(frame + u64::from(walk.frame_code)) else {
        return Ok(());
    };
    let code = code & !3;
    let object = &layout.object;
    if type_name(memory, object, code).ok().as_deref() != Some("code") {
        return Err(field_error(
            version,
            "interpreter_frame.executable",
            walk.frame_code,
            format!("the main thread's frame {frame:#x} holds {code:#x}, not a code object"),
        ));
    }
    let filename = memory.read_u64(code + layout.code.filename).unwrap_or(0);
    if type_name(memory, object, filename).ok().as_deref() != Some("str") {
        return Err(field_error(
            version,
            "code_object.filename",
            u16::try_from(layout.code.filename).unwrap_or(NO_OFFSET),
            format!("code object {code:#x}'s file name {filename:#x} is not a str"),
        ));
    }
    Ok(())
}

/// The `tp_name` of `object`'s type (its first 8 bytes), through the
/// header fields of `layout`.
fn type_name(
    memory: &ProcessMemory,
    layout: &ObjectLayout,
    object: u64,
) -> Result<String, MemError> {
    let object_type = memory.read_u64(object.wrapping_add(layout.ob_type))?;
    let name = memory.read_u64(object_type.wrapping_add(layout.tp_name))?;
    let bytes = memory.read_array::<8>(name)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

fn field_error(version: PythonVersion, field: &'static str, value: u16, why: String) -> ProbeError {
    ProbeError::DebugOffsetsField {
        version,
        field,
        value: Some(u64::from(value)),
        why,
    }
}
