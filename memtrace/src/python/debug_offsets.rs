//! The layout of a CPython 3.13+ process, read from the interpreter's own
//! description of it, `_Py_DebugOffsets`: part of `probe`, which reads the
//! struct once per image and hands the result ([`DebugLayout`]) to the BPF
//! walk (its [`PyOffsets`]) and to the code-object and line-table readers.
//! No per-version table of struct offsets is involved.
//!
//! `_PyRuntime` starts with the struct (`_PyRuntimeState.debug_offsets`
//! @0; Include/internal/pycore_runtime.h of 3.13,
//! Include/internal/pycore_debug_offsets.h of 3.14+): `char cookie[8] =
//! "xdebugpy"`, `uint64_t version` (`PY_VERSION_HEX`), `uint64_t
//! free_threaded`, then one nested struct per CPython struct, each starting
//! with that struct's `size` and followed by `uint64_t` offsets.
//!
//! A free-threaded build (3.13t) describes its larger object headers in
//! the same struct, at the same positions as the default build's (its
//! values read with 3.13's positions pass [`check`] and the live frame
//! check; `debug_offsets_tests` holds them).
//!
//! Which nested struct starts where changes between minor versions (3.14
//! and 3.15 insert fields), so [`POSITIONS`] holds, per minor version, the
//! start of each nested struct memtrace reads (`ptype /o struct
//! _Py_DebugOffsets` in gdb against the debug info of pyenv's 3.13.0 and of
//! Debian's 3.14.10 and 3.15.2, 2026-12-02; `pyobject` and `type_object`
//! 2026-12-04). Within a nested struct the
//! fields memtrace reads kept their places in all three (3.15 inserted
//! `base_frame` and two profiler fields before `thread_state.thread_id`,
//! which is why that one is per version too). A minor version newer than
//! the newest here is read with the newest positions and accepted only if
//! every value passes [`check`] and the live frame check in `probe`.

use memtrace_common::{PyOffsets, NO_OFFSET};

use super::mem;
use super::offsets::{BytesLayout, CodeLayout, LineFormat, ThreadLists, UnicodeLayout};
use super::types::{ProbeError, PythonVersion};

/// `_Py_DebugOffsets.cookie` (`_Py_Debug_Cookie`).
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes [`check`] reads from `_PyRuntime`: more than any known
/// `sizeof(struct _Py_DebugOffsets)` (584 on 3.13, 760 on 3.14, 888 on 3.15).
pub const DEBUG_OFFSETS_READ_BYTES: usize = 1024;

/// Frames whose `owner` is at least this are not Python frames and are
/// skipped: `FRAME_OWNED_BY_CSTACK` = 3 on 3.12/3.13 (the entry frame of a
/// C→Python call), `FRAME_OWNED_BY_INTERPRETER` = 3 and
/// `FRAME_OWNED_BY_CSTACK` = 4 on 3.14, `FRAME_OWNED_BY_INTERPRETER` = 3 on
/// 3.15 (Include/internal/pycore_frame.h, pycore_interpframe_structs.h).
const OWNER_SKIP_MIN: u16 = 3;

/// Where the nested structs memtrace reads start in one minor version's
/// `_Py_DebugOffsets`, and `sizeof` of the whole struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Positions {
    minor: u8,
    struct_bytes: usize,
    runtime_state: usize,
    interpreter_state: usize,
    thread_state: usize,
    /// `thread_state.thread_id`, from the start of `thread_state`.
    thread_id: usize,
    interpreter_frame: usize,
    code_object: usize,
    bytes_object: usize,
    unicode_object: usize,
    pyobject: usize,
    type_object: usize,
    /// `unicode_object.compactunicodeobject_size` (3.15+), from the start
    /// of `unicode_object`.
    compact_size: Option<usize>,
}

/// The known minor versions, oldest first (gdb `ptype /o`, see the module
/// docs).
const POSITIONS: [Positions; 3] = [
    Positions {
        minor: 13,
        struct_bytes: 584,
        runtime_state: 24,
        interpreter_state: 48,
        thread_state: 152,
        thread_id: 40,
        interpreter_frame: 224,
        code_object: 272,
        bytes_object: 512,
        unicode_object: 536,
        pyobject: 352,
        type_object: 368,
        compact_size: None,
    },
    Positions {
        minor: 14,
        struct_bytes: 760,
        runtime_state: 24,
        interpreter_state: 48,
        thread_state: 176,
        thread_id: 40,
        interpreter_frame: 248,
        code_object: 312,
        bytes_object: 592,
        unicode_object: 616,
        pyobject: 400,
        type_object: 416,
        compact_size: None,
    },
    Positions {
        minor: 15,
        struct_bytes: 888,
        runtime_state: 24,
        interpreter_state: 48,
        thread_state: 176,
        thread_id: 64,
        interpreter_frame: 312,
        code_object: 376,
        bytes_object: 688,
        unicode_object: 712,
        pyobject: 464,
        type_object: 480,
        compact_size: Some(32),
    },
];

/// The fields read, as (name, nested struct, position in it).
#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    position: usize,
    /// Position of the nested struct's `size`.
    struct_size: usize,
}

/// What [`check`] found: everything memtrace needs about a 3.13+ image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugLayout {
    /// The BPF walk's offsets.
    pub walk: PyOffsets,
    /// Where the interpreter and thread lists are (for the TSS key and the
    /// main interpreter).
    pub threads: ThreadLists,
    /// Code-object fields read in userspace.
    pub code: CodeLayout,
    /// Bytes-object fields.
    pub bytes: BytesLayout,
    /// Str-object fields.
    pub unicode: UnicodeLayout,
    /// Object-header fields, for the live check of the layout.
    pub object: ObjectLayout,
    /// `free_threaded`: a `Py_GIL_DISABLED` build (3.13t), whose allocator
    /// is mimalloc, not pymalloc.
    pub free_threaded: bool,
}

/// Where an object's type and a type's name are: `pyobject.ob_type` and
/// `type_object.tp_name` of `_Py_DebugOffsets` (8 and 24 in a default
/// build; 24 and 40 in 3.13t, whose `PyObject` header starts with
/// `ob_tid`, `ob_mutex`, `ob_gc_bits`, `ob_ref_local`, `ob_ref_shared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectLayout {
    /// `PyObject.ob_type` (`PyTypeObject *`).
    pub ob_type: u64,
    /// `PyTypeObject.tp_name` (`const char *`).
    pub tp_name: u64,
}

/// The newest minor version whose free-threaded build memtrace reads:
/// 3.14t runs per-thread copies of the bytecode (`co_tlbc`, indexed by the
/// frame's `tlbc_index`), so its `instr_ptr` is not relative to
/// `co_code_adaptive`; that build is not available to test here.
const NEWEST_FREE_THREADED_MINOR: u8 = 13;

/// The header of `_Py_DebugOffsets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `version`: the `PY_VERSION_HEX` the struct describes.
    pub version_hex: u64,
    /// `free_threaded`: the build defines `Py_GIL_DISABLED` (PEP 703).
    pub free_threaded: bool,
}

/// Parses the header; `None` when `bytes` does not start with [`COOKIE`].
#[must_use]
pub fn parse_header(bytes: &[u8]) -> Option<Header> {
    if bytes.get(..COOKIE.len())? != COOKIE {
        return None;
    }
    Some(Header {
        version_hex: u64_at(bytes, 8)?,
        free_threaded: u64_at(bytes, 16)? != 0,
    })
}

/// The little-endian u64 at `position` of `bytes`.
fn u64_at(bytes: &[u8], position: usize) -> Option<u64> {
    mem::field::<8>(bytes, u64::try_from(position).ok()?).map(u64::from_le_bytes)
}

/// The positions of minor version `minor`: its own, or for a minor newer
/// than every known one the newest (with `false`). `None` below 3.13.
fn positions(minor: u8) -> Option<(Positions, bool)> {
    let newest = POSITIONS[POSITIONS.len() - 1];
    match POSITIONS.iter().find(|p| p.minor == minor) {
        Some(known) => Some((*known, true)),
        None if minor > newest.minor => Some((newest, false)),
        None => None,
    }
}

/// Reads and checks the layout of a 3.13+ interpreter from `debug`, the
/// first [`DEBUG_OFFSETS_READ_BYTES`] (or fewer) bytes of its `_PyRuntime`,
/// with `version_hex` its `Py_Version`.
///
/// # Errors
/// - [`ProbeError::NoDebugOffsets`]: no cookie;
/// - [`ProbeError::DebugOffsetsVersion`]: the struct describes another version;
/// - [`ProbeError::FreeThreaded`]: a `Py_GIL_DISABLED` build newer than
///   3.13t;
/// - [`ProbeError::DebugOffsetsField`]: a field the walk needs is past its
///   struct's size, does not fit the walk's 16-bit offsets, or is unreadable
///   (the message names it).
pub fn check(
    debug: &[u8],
    version_hex: u32,
    binary: &std::path::Path,
) -> Result<DebugLayout, ProbeError> {
    let version = PythonVersion::from_hex(version_hex);
    let binary = binary.to_owned();
    let Some(header) = parse_header(debug) else {
        return Err(ProbeError::NoDebugOffsets { version, binary });
    };
    if header.version_hex != u64::from(version_hex) {
        return Err(ProbeError::DebugOffsetsVersion {
            version,
            binary,
            found: header.version_hex,
        });
    }
    if header.free_threaded && version.minor > NEWEST_FREE_THREADED_MINOR {
        return Err(ProbeError::FreeThreaded { version, binary });
    }
    let Some((pos, _)) = positions(version.minor).filter(|_| version.major == 3) else {
        return Err(ProbeError::NoDebugOffsets { version, binary });
    };
    let reader = Reader { debug, version };
    let p = |base: usize, at: usize, name: &'static str| Field {
        name,
        position: base + at,
        struct_size: base,
    };
    let (rt, is, ts) = (pos.runtime_state, pos.interpreter_state, pos.thread_state);
    let (fr, co) = (pos.interpreter_frame, pos.code_object);
    let (by, un) = (pos.bytes_object, pos.unicode_object);
    let walk = PyOffsets {
        tstate_cframe: NO_OFFSET,
        current_frame: reader.walk(p(ts, 32, "thread_state.current_frame"), 8)?,
        frame_code: reader.walk(p(fr, 16, "interpreter_frame.executable"), 8)?,
        frame_previous: reader.walk(p(fr, 8, "interpreter_frame.previous"), 8)?,
        frame_instr_ptr: reader.walk(p(fr, 24, "interpreter_frame.instr_ptr"), 8)?,
        frame_owner: reader.walk(p(fr, 40, "interpreter_frame.owner"), 1)?,
        owner_skip_min: OWNER_SKIP_MIN,
        code_firstlineno: reader.walk(p(co, 40, "code_object.firstlineno"), 4)?,
        code_adaptive: reader.walk(p(co, 72, "code_object.co_code_adaptive"), 0)?,
        code_name: reader.walk(p(co, 24, "code_object.qualname"), 8)?,
        tstate_interp: reader.walk(p(ts, 24, "thread_state.interp"), 8)?,
        tstate_thread_id: NO_OFFSET,
        // `PyCodeObject` starts with `PyObject_VAR_HEAD`, as `PyBytesObject`.
        code_shape: reader.walk(p(by, 8, "bytes_object.ob_size"), 8)?,
    };
    let threads = ThreadLists {
        interpreters_head: reader.offset(p(rt, 16, "runtime_state.interpreters_head"), 8)?,
        interp_next: reader.offset(p(is, 16, "interpreter_state.next"), 8)?,
        interp_threads_head: reader.offset(p(is, 24, "interpreter_state.threads_head"), 8)?,
        tstate_next: reader.offset(p(ts, 16, "thread_state.next"), 8)?,
        tstate_thread_id: reader.offset(p(ts, pos.thread_id, "thread_state.thread_id"), 8)?,
    };
    let ascii_size = reader.offset(p(un, 24, "unicode_object.asciiobject_size"), 0)?;
    let compact_size = match pos.compact_size {
        Some(at) => reader.offset(p(un, at, "unicode_object.compactunicodeobject_size"), 0)?,
        // PyCompactUnicodeObject adds `utf8_length` and `utf8` (16 bytes)
        // to PyASCIIObject (Include/cpython/unicodeobject.h, 3.12+).
        None => ascii_size + 16,
    };
    Ok(DebugLayout {
        walk,
        threads,
        code: CodeLayout {
            filename: reader.offset(p(co, 8, "code_object.filename"), 8)?,
            qualname: u64::from(walk.code_name),
            linetable: reader.offset(p(co, 32, "code_object.linetable"), 8)?,
            format: LineFormat::Locations,
        },
        bytes: BytesLayout {
            size: reader.offset(p(by, 8, "bytes_object.ob_size"), 8)?,
            data: reader.offset(p(by, 16, "bytes_object.ob_sval"), 0)?,
        },
        unicode: UnicodeLayout {
            length: reader.offset(p(un, 16, "unicode_object.length"), 8)?,
            state: reader.offset(p(un, 8, "unicode_object.state"), 4)?,
            ascii_size_bytes: ascii_size,
            compact_size_bytes: compact_size,
        },
        object: ObjectLayout {
            ob_type: reader.offset(p(pos.pyobject, 8, "pyobject.ob_type"), 8)?,
            tp_name: reader.offset(p(pos.type_object, 8, "type_object.tp_name"), 8)?,
        },
        free_threaded: header.free_threaded,
    })
}

/// Reads and checks fields of one `_Py_DebugOffsets`.
struct Reader<'a> {
    debug: &'a [u8],
    version: PythonVersion,
}

impl Reader<'_> {
    /// The offset `field` holds, checked: readable, and the `width` bytes
    /// at it lie inside the CPython struct (its nested `size`; a `width` of
    /// 0 is an offset that may equal the size, as `co_code_adaptive` or
    /// `ob_sval`, whose data follows the fixed part).
    fn offset(&self, field: Field, width: u64) -> Result<u64, ProbeError> {
        let value = u64_at(self.debug, field.position);
        let size = u64_at(self.debug, field.struct_size);
        let refuse = |why: String| ProbeError::DebugOffsetsField {
            version: self.version,
            field: field.name,
            value,
            why,
        };
        let (Some(value), Some(size)) = (value, size) else {
            return Err(refuse("past the bytes read".to_owned()));
        };
        let end = value.saturating_add(width.max(1));
        if end > size + u64::from(width == 0) {
            return Err(refuse(format!(
                "a {width}-byte field there ends past its struct's size {size}"
            )));
        }
        Ok(value)
    }

    /// As [`Reader::offset`], for an offset the BPF walk reads (a `u16`
    /// below [`NO_OFFSET`]).
    fn walk(&self, field: Field, width: u64) -> Result<u16, ProbeError> {
        let value = self.offset(field, width)?;
        u16::try_from(value)
            .ok()
            .filter(|&v| v != NO_OFFSET)
            .ok_or_else(|| ProbeError::DebugOffsetsField {
                version: self.version,
                field: field.name,
                value: Some(value),
                why: format!("the BPF walk's offsets are below {NO_OFFSET}"),
            })
    }
}

/// Where `_Py_DebugOffsets.debugger_support` (PEP 768, 3.14+) starts: it
/// is the struct's last part, six `uint64_t` with no `size` of their own
/// (Include/internal/pycore_debug_offsets.h; 712 on 3.14.10, 840 on 3.15.2,
/// read from the running interpreters' `_PyRuntime`).
const DEBUGGER_SUPPORT_BYTES: usize = 6 * 8;

/// `interpreter_state.threads_main`, from the start of `interpreter_state`
/// (after `size`, `id`, `next`, `threads_head`; 3.13-3.15).
const THREADS_MAIN: usize = 32;

/// What the remote-debugging protocol of PEP 768 needs (3.14+), read from
/// `_Py_DebugOffsets`: all are offsets, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteDebugLayout {
    /// `runtime_state.interpreters_head` in `_PyRuntime`: the main
    /// interpreter's `PyInterpreterState *`.
    pub interpreters_head: u64,
    /// `interpreter_state.threads_main`: the main thread's `PyThreadState *`.
    pub threads_main: u64,
    /// `PyThreadState.eval_breaker` (a `uintptr_t`).
    pub eval_breaker: u64,
    /// `PyThreadState.remote_debugger_support` (a `_PyRemoteDebuggerSupport`).
    pub support: u64,
    /// `PyInterpreterState.config.remote_debug` (an `int`: 1 when enabled).
    pub enabled: u64,
    /// `_PyRemoteDebuggerSupport.debugger_pending_call` (an `int32_t`).
    pub pending_call: u64,
    /// `_PyRemoteDebuggerSupport.debugger_script_path` (a `char[]`).
    pub script_path: u64,
    /// Bytes of `debugger_script_path`, its NUL included.
    pub script_path_bytes: u64,
}

/// The remote-debugging layout of a 3.14+ interpreter from `debug` (as
/// [`check`] takes it); `None` below 3.14, for a minor version whose
/// struct size is not known, or when a value is out of its range (the
/// support fields past 4 KiB, the path buffer not 16 bytes to 4 KiB).
#[must_use]
pub fn remote_debug(debug: &[u8], version_hex: u32) -> Option<RemoteDebugLayout> {
    let version = PythonVersion::from_hex(version_hex);
    if version.major != 3 || version.minor < 14 {
        return None;
    }
    let (pos, known) = positions(version.minor)?;
    if !known {
        return None;
    }
    let at = |position: usize| u64_at(debug, position);
    let support = pos.struct_bytes - DEBUGGER_SUPPORT_BYTES;
    let layout = RemoteDebugLayout {
        interpreters_head: at(pos.runtime_state + 16)?,
        threads_main: at(pos.interpreter_state + THREADS_MAIN)?,
        eval_breaker: at(support)?,
        support: at(support + 8)?,
        enabled: at(support + 16)?,
        pending_call: at(support + 24)?,
        script_path: at(support + 32)?,
        script_path_bytes: at(support + 40)?,
    };
    let small = |v: u64| v < 4096;
    (small(layout.pending_call)
        && small(layout.script_path)
        && (16..=4096).contains(&layout.script_path_bytes))
    .then_some(layout)
}

#[cfg(test)]
#[path = "debug_offsets_tests.rs"]
mod tests;
