//! CPython struct layouts per minor version: the table `probe` looks 3.9
//! to 3.12 up in after reading `Py_Version` (3.13+ describe themselves in
//! `_Py_DebugOffsets`, read by `debug_offsets` into the same types). Its BPF half ([`PyOffsets`]) goes into the
//! `PY_PROCESSES` map for the kernel-side frame walk; the rest is used by
//! `code` to read code objects and strings through /proc/PID/mem.
//!
//! Every number comes from the x86-64, default (GIL, release, glibc) build of
//! CPython and was checked with `offsetof` in gdb against the debug info of
//! the pyenv builds 3.11.7 and 3.12.1 on this project's machines
//! (notes/python-stacks.md §2, tag [V]); the 3.9 and 3.10 numbers were
//! checked with `offsetof` in a C program compiled against the pyenv 3.9.18
//! and 3.10.13 headers (`Py_BUILD_CORE`, internal headers included). The
//! defining headers are named on each field. Debian's static
//! `/usr/bin/python3.11` has the same layout.
//!
//! Versions before 3.13 are done: [`LAYOUTS`] does not grow.

use memtrace_common::{PyOffsets, CODE_SHAPE_OFFSET, NO_OFFSET};

/// Where a process's pthread key of thread states and its main
/// interpreter are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeLayout {
    /// 3.9-3.12: at fixed offsets in `_PyRuntime` (this table).
    Table {
        /// Offset in `_PyRuntime` of `autoTSSkey._key`, the
        /// `pthread_key_t` (u32) whose slot holds the thread's
        /// `PyThreadState *` (Include/internal/pycore_runtime.h;
        /// `gilstate.autoTSSkey` on 3.11). `Py_tss_t._is_initialized`
        /// (`int`) is the 4 bytes before it.
        tss_key: u64,
        /// Offset in `_PyRuntime` of `interpreters.main`
        /// (`PyInterpreterState *`; Include/internal/pycore_runtime.h).
        main_interp: u64,
        /// Offset in `_PyRuntime` of `gilstate.tstate_current`
        /// (`PyThreadState *`, 3.9–3.11; removed in 3.12).
        tstate_current: Option<u64>,
    },
    /// 3.13+: found by following the interpreter and thread lists that
    /// `_Py_DebugOffsets` describes (`debug_offsets`).
    ThreadLists(ThreadLists),
}

/// The lists of interpreters and thread states, as `_Py_DebugOffsets`
/// gives them (3.13+; each field is named after its `_Py_DebugOffsets`
/// field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadLists {
    /// `runtime_state.interpreters_head`: offset in `_PyRuntime` of the
    /// newest `PyInterpreterState *` (the main one is the last).
    pub interpreters_head: u64,
    /// `interpreter_state.next`.
    pub interp_next: u64,
    /// `interpreter_state.threads_head`: the newest `PyThreadState *`.
    pub interp_threads_head: u64,
    /// `thread_state.next`.
    pub tstate_next: u64,
    /// `thread_state.thread_id`: `pthread_self()`, the thread's fsbase on
    /// glibc x86-64.
    pub tstate_thread_id: u64,
}

/// Layout of a `PyCodeObject` (Include/cpython/code.h), in bytes from the
/// start of the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// `co_filename` (`PyObject *`, a str).
    pub filename: u64,
    /// `co_qualname` (`PyObject *`, a str; 3.11+); `co_name` on 3.9 and
    /// 3.10, which have no qualified name in the code object.
    pub qualname: u64,
    /// `co_linetable` (`PyObject *`, a bytes object; the 3.11+ location
    /// table of Objects/locations.md), `co_linetable` of 3.10 or
    /// `co_lnotab` of 3.9 (both Objects/lnotab_notes.txt).
    pub linetable: u64,
    /// How the table at `linetable` encodes lines.
    pub format: LineFormat,
}

/// The line-table encoding of a version, and what the BPF frame's
/// `instr_index` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// 3.9 `co_lnotab`; `instr_index` is `f_lasti`, a byte offset.
    Lnotab39,
    /// 3.10 `co_linetable`; `instr_index` is `f_lasti`, in code units.
    Linetable310,
    /// 3.11+ location table; `instr_index` is in code units from
    /// `co_code_adaptive`.
    Locations,
}

/// Layout of `PyBytesObject` (Include/cpython/bytesobject.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytesLayout {
    /// `ob_base.ob_size` (`Py_ssize_t`): number of bytes.
    pub size: u64,
    /// `ob_sval`: first data byte.
    pub data: u64,
}

/// Layout of compact str objects (Include/cpython/unicodeobject.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnicodeLayout {
    /// `PyASCIIObject.length` (`Py_ssize_t`): length in code points.
    pub length: u64,
    /// `PyASCIIObject.state` (a `u32` bit field: `kind` in bits 2..5,
    /// `compact` bit 5, `ascii` bit 6).
    pub state: u64,
    /// `sizeof(PyASCIIObject)`: where the data of a compact ASCII str starts.
    pub ascii_size_bytes: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where the data of any other compact
    /// str starts.
    pub compact_size_bytes: u64,
}

/// Everything memtrace needs to know about one CPython minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionLayout {
    /// Major version (3).
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// Offsets of the kernel-side frame walk (python-stacks.md §2 and §5).
    pub walk: PyOffsets,
    /// How the thread-state key and the main interpreter are found.
    pub runtime: RuntimeLayout,
    /// Code-object fields read in userspace (`co_firstlineno` is
    /// `walk.code_firstlineno`, read by both halves).
    pub code: CodeLayout,
    /// Bytes-object fields.
    pub bytes: BytesLayout,
    /// Str-object fields.
    pub unicode: UnicodeLayout,
}

/// `PyCodeObject` fields: the same offsets on 3.11, 3.12 and 3.13
/// (Include/cpython/code.h, `_PyCode_DEF`; `co_firstlineno`, which moved,
/// is in each version's `walk`).
const CODE: CodeLayout = CodeLayout {
    filename: 112,
    qualname: 128,
    linetable: 136,
    format: LineFormat::Locations,
};

/// 3.9 `PyCodeObject` (Include/cpython/code.h of 3.9.18): `co_filename`
/// @104, `co_name` @112, `co_lnotab` @120.
const CODE_3_9: CodeLayout = CodeLayout {
    filename: 104,
    qualname: 112,
    linetable: 120,
    format: LineFormat::Lnotab39,
};

/// 3.10 `PyCodeObject` (Include/cpython/code.h of 3.10.13): as 3.9, with
/// `co_linetable` @120 in place of `co_lnotab`.
const CODE_3_10: CodeLayout = CodeLayout {
    linetable: 120,
    format: LineFormat::Linetable310,
    ..CODE_3_9
};

/// The 3.9/3.10 frame walk: `PyThreadState.frame` @24
/// (Include/cpython/pystate.h), `PyFrameObject.f_back` @24 and `f_code` @32
/// (Include/cpython/frameobject.h), `co_firstlineno` @40 (code.h). Frames are
/// `PyFrameObject`s: no entry frames, no owner; `frame_instr_ptr` is
/// `f_lasti` (an `int`), which `code_adaptive` = [`NO_OFFSET`] signals.
const WALK_FRAME_OBJECTS: PyOffsets = PyOffsets {
    tstate_cframe: NO_OFFSET,
    current_frame: 24,
    frame_code: 32,
    frame_previous: 24,
    frame_instr_ptr: 0,
    frame_owner: NO_OFFSET,
    owner_skip_min: NO_OFFSET,
    code_firstlineno: 40,
    code_adaptive: NO_OFFSET,
    // The name str userspace reads is the one BPF fingerprints.
    code_name: CODE_3_9.qualname as u16,
    tstate_interp: 16,
    tstate_thread_id: 176,
    code_shape: CODE_SHAPE_OFFSET as u16,
};

/// `PyBytesObject`: `PyObject_VAR_HEAD` (refcount, type, size) then data.
const BYTES: BytesLayout = BytesLayout { size: 16, data: 32 };

/// 3.9–3.11 str headers: `PyASCIIObject` still carries the `wstr` pointer (48
/// bytes) and `PyCompactUnicodeObject` adds `utf8_length`, `utf8` and
/// `wstr_length` (72 bytes).
const UNICODE_3_11: UnicodeLayout = UnicodeLayout {
    length: 16,
    state: 32,
    ascii_size_bytes: 48,
    compact_size_bytes: 72,
};

/// 3.12+ str headers: `wstr` removed (PEP 623), so 40 and 56 bytes.
const UNICODE_3_12: UnicodeLayout = UnicodeLayout {
    length: 16,
    state: 32,
    ascii_size_bytes: 40,
    compact_size_bytes: 56,
};

/// The supported versions, oldest first.
pub const LAYOUTS: &[VersionLayout] = &[
    // 3.9: `PyFrameObject.f_lasti` @104 (Include/cpython/frameobject.h),
    // `_PyRuntime.gilstate.autoTSSkey._key` @588, `interpreters.main` @40,
    // `gilstate.tstate_current` @568 (Include/internal/pycore_runtime.h);
    // `PyThreadState.interp` @16, `thread_id` @176 (Include/cpython/pystate.h).
    VersionLayout {
        major: 3,
        minor: 9,
        walk: PyOffsets {
            frame_instr_ptr: 104,
            ..WALK_FRAME_OBJECTS
        },
        runtime: RuntimeLayout::Table {
            tss_key: 588,
            main_interp: 40,
            tstate_current: Some(568),
        },
        code: CODE_3_9,
        bytes: BYTES,
        unicode: UNICODE_3_11,
    },
    // 3.10: `f_lasti` @96 (the `f_stacktop` pointer became the int
    // `f_stackdepth`); the runtime and thread-state numbers of 3.9.
    VersionLayout {
        major: 3,
        minor: 10,
        walk: PyOffsets {
            frame_instr_ptr: 96,
            ..WALK_FRAME_OBJECTS
        },
        runtime: RuntimeLayout::Table {
            tss_key: 588,
            main_interp: 40,
            tstate_current: Some(568),
        },
        code: CODE_3_10,
        bytes: BYTES,
        unicode: UNICODE_3_11,
    },
    // 3.11: Include/internal/pycore_frame.h (`_PyInterpreterFrame`:
    // f_code @32, previous @48, prev_instr @56, owner @69; entry frames are
    // real frames flagged by `is_entry` @68, so nothing is skipped),
    // Include/cpython/pystate.h (`PyThreadState.cframe` @56,
    // `_PyCFrame.current_frame` @8), Include/internal/pycore_runtime.h
    // (`gilstate.autoTSSkey` @592, `_key` @596, `interpreters.main` @48,
    // `gilstate.tstate_current` @576), `PyThreadState.interp` @16,
    // `thread_id` @152.
    VersionLayout {
        major: 3,
        minor: 11,
        walk: PyOffsets {
            tstate_cframe: 56,
            current_frame: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_instr_ptr: 56,
            frame_owner: 69,
            owner_skip_min: NO_OFFSET,
            code_firstlineno: 72,
            code_adaptive: 184,
            code_name: CODE.qualname as u16,
            tstate_interp: 16,
            tstate_thread_id: 152,
            code_shape: CODE_SHAPE_OFFSET as u16,
        },
        runtime: RuntimeLayout::Table {
            tss_key: 596,
            main_interp: 48,
            tstate_current: Some(576),
        },
        code: CODE,
        bytes: BYTES,
        unicode: UNICODE_3_11,
    },
    // 3.12: pycore_frame.h (f_code @0, previous @8, prev_instr @56,
    // owner @70; `FRAME_OWNED_BY_CSTACK` = 3 marks the entry frame pushed at
    // every C→Python call), pystate.h (`cframe` @56,
    // `_PyCFrame.current_frame` @0, `interp` @16), pycore_runtime.h
    // (`interpreters.main` @48, no `tstate_current`; `autoTSSkey` @1544,
    // `_key` @1548).
    VersionLayout {
        major: 3,
        minor: 12,
        walk: PyOffsets {
            tstate_cframe: 56,
            current_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr_ptr: 56,
            frame_owner: 70,
            owner_skip_min: 3,
            code_firstlineno: 68,
            code_adaptive: 192,
            code_name: CODE.qualname as u16,
            tstate_interp: 16,
            tstate_thread_id: NO_OFFSET,
            code_shape: CODE_SHAPE_OFFSET as u16,
        },
        runtime: RuntimeLayout::Table {
            tss_key: 1548,
            main_interp: 48,
            tstate_current: None,
        },
        code: CODE,
        bytes: BYTES,
        unicode: UNICODE_3_12,
    },
];

/// The layout of `major.minor`, or `None` when that version is not in
/// [`LAYOUTS`].
#[must_use]
pub fn layout(major: u8, minor: u8) -> Option<&'static VersionLayout> {
    LAYOUTS
        .iter()
        .find(|layout| layout.major == major && layout.minor == minor)
}

/// The supported versions for error messages, e.g. `"3.9, 3.10, 3.11,
/// 3.12, 3.13+"`: the table's, then those whose layout comes from their
/// `_Py_DebugOffsets`.
#[must_use]
pub fn supported_versions() -> String {
    LAYOUTS
        .iter()
        .map(|layout| format!("{}.{}", layout.major, layout.minor))
        .chain(["3.13+".to_owned()])
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_appears_once() {
        for (i, a) in LAYOUTS.iter().enumerate() {
            for b in &LAYOUTS[i + 1..] {
                assert!((a.major, a.minor) != (b.major, b.minor));
            }
        }
    }

    #[test]
    fn lookup_finds_supported_and_rejects_others() {
        assert_eq!(layout(3, 12).map(|l| l.walk.frame_owner), Some(70));
        assert!(matches!(
            layout(3, 11).map(|l| l.runtime),
            Some(RuntimeLayout::Table { tss_key: 596, .. })
        ));
        assert_eq!(layout(3, 10).map(|l| l.walk.frame_instr_ptr), Some(96));
        assert_eq!(
            layout(3, 9).map(|l| l.code.format),
            Some(LineFormat::Lnotab39)
        );
        assert!(layout(3, 8).is_none());
        assert!(layout(2, 7).is_none());
        assert_eq!(supported_versions(), "3.9, 3.10, 3.11, 3.12, 3.13+");
        assert!(layout(3, 13).is_none());
    }
}
