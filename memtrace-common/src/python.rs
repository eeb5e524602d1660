//! The CPython layout of one traced process (`PY_PROCESSES` map value): how
//! the BPF stack walk finds the current thread's frames. Filled by userspace
//! (`memtrace::python`).

/// Most Python frames one stack walk records; deeper stacks are cut at the
/// innermost `MAX_FRAMES` frames and flagged [`STACK_TRUNCATED`].
pub const MAX_FRAMES: usize = 64;

/// [`crate::MemoryRecord::stack_status`] bit: the stack had more than
/// [`MAX_FRAMES`] frames; the outermost ones are missing.
pub const STACK_TRUNCATED: u32 = 1 << 0;
/// Bit: a read of the frame chain failed (page not resident or garbage);
/// the frames before the failure are kept.
pub const STACK_READ_ERROR: u32 = 1 << 1;
/// Bit: the process has no [`PyProcessInfo`] (not Python, or not probed yet).
pub const STACK_NO_PYTHON: u32 = 1 << 2;
/// Bit: the thread has no Python thread state (a native thread, or Python
/// not initialised yet).
pub const STACK_NO_THREAD_STATE: u32 = 1 << 3;
/// Bit: the thread was running a sub-interpreter (its thread state's
/// interpreter is not the main one): the frames are that interpreter's, and
/// the main-interpreter frames that called into it are not included.
pub const STACK_SUBINTERPRETER: u32 = 1 << 4;

/// One Python frame as read in BPF, innermost first in
/// [`crate::MemoryRecord::frames`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Address of the frame's `PyCodeObject` in the traced process.
    pub code_addr: u64,
    /// Index of the current instruction in code units (`_Py_CODEUNIT`, 2
    /// bytes) from `co_code_adaptive` (3.11+), or `PyFrameObject.f_lasti`
    /// (3.10: code units; 3.9: bytes); -1 when the frame has not started.
    pub instr_index: i32,
    /// [`code_fingerprint`] of the code object's `co_firstlineno`, name
    /// pointer and shape, read in BPF: userspace accepts a cached code object only if
    /// this matches (guards against address reuse).
    pub fingerprint: u32,
}

/// Offset in a code object of the word that goes into [`code_fingerprint`]
/// as its shape in the default (GIL) build: right after `PyObject_HEAD`
/// (16 bytes), `ob_size` (the number of code units, 3.11+) or
/// `co_argcount` and `co_posonlyargcount` (3.9/3.10) (Include/cpython/code.h).
/// A free-threaded build's larger header moves it ([`PyOffsets::code_shape`]).
pub const CODE_SHAPE_OFFSET: u64 = 16;

/// The fingerprint of a code object: a 32-bit hash of its
/// `co_firstlineno`, the address of its name str (`co_qualname` on 3.11+,
/// `co_name` before) and its shape word ([`PyOffsets::code_shape`]).
///
/// The line alone did not tell apart code objects compiled from strings:
/// an `exec`'d module's `<module>` and its class body `GeneratedTable` both
/// start at line 1, and once freed each one's address was reused by the
/// other's next copy; every `<module>` also shares one static name str on
/// 3.11+, which the shape tells apart.
#[inline(always)]
#[must_use]
pub const fn code_fingerprint(first_lineno: u32, name_addr: u64, shape: u64) -> u32 {
    let mixed = (first_lineno as u64) ^ name_addr.rotate_left(29) ^ shape.rotate_left(47);
    // Fibonacci hashing: the high half depends on every input bit.
    (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// Offsets (bytes) into CPython's internal structs that the BPF frame walk
/// needs, for one minor version. Filled by userspace from its version table
/// (`memtrace::python::offsets`); sources are given there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyOffsets {
    /// `PyThreadState.cframe` (3.11, 3.12), or [`NO_OFFSET`] when the thread
    /// state points at the current frame directly (`frame` on 3.9/3.10,
    /// `current_frame` on 3.13+).
    pub tstate_cframe: u16,
    /// `_PyCFrame.current_frame` when `tstate_cframe` is set, else
    /// `PyThreadState.current_frame`.
    pub current_frame: u16,
    /// `_PyInterpreterFrame.f_code` / `f_executable` (`PyFrameObject.f_code`
    /// on 3.9/3.10).
    pub frame_code: u16,
    /// `_PyInterpreterFrame.previous` (`PyFrameObject.f_back` on 3.9/3.10).
    pub frame_previous: u16,
    /// `_PyInterpreterFrame.prev_instr` / `instr_ptr`, or the `int`
    /// `PyFrameObject.f_lasti` when `code_adaptive` is [`NO_OFFSET`].
    pub frame_instr_ptr: u16,
    /// `_PyInterpreterFrame.owner` (u8).
    pub frame_owner: u16,
    /// Frames whose `owner` is >= this are interpreter entry frames and are
    /// skipped (3 = `FRAME_OWNED_BY_CSTACK` on 3.12+); [`NO_OFFSET`] on 3.11.
    pub owner_skip_min: u16,
    /// `PyCodeObject.co_firstlineno` (i32).
    pub code_firstlineno: u16,
    /// `PyCodeObject.co_code_adaptive` (= `PyCode_Type.tp_basicsize`), or
    /// [`NO_OFFSET`] on 3.9/3.10, whose frames hold `f_lasti` instead of an
    /// instruction pointer.
    pub code_adaptive: u16,
    /// `PyCodeObject.co_qualname` (3.11+) or `co_name` (3.9/3.10): the
    /// pointer that goes into [`code_fingerprint`].
    pub code_name: u16,
    /// `PyThreadState.interp`: compared with
    /// [`PyProcessInfo::main_interp`] to flag [`STACK_SUBINTERPRETER`].
    pub tstate_interp: u16,
    /// `PyThreadState.thread_id` (`pthread_self()`, which is the thread's
    /// fsbase on glibc x86-64) on versions with
    /// [`PyProcessInfo::tstate_current_addr`]; [`NO_OFFSET`] otherwise.
    pub tstate_thread_id: u16,
    /// The code object's shape word for [`code_fingerprint`]:
    /// [`CODE_SHAPE_OFFSET`] in default builds; on 3.13+ `ob_size` as
    /// `_Py_DebugOffsets.bytes_object.ob_size` gives it (32 in a
    /// free-threaded build, whose `PyObject` header adds `ob_tid`,
    /// `ob_ref_local` and `ob_ref_shared`).
    pub code_shape: u16,
}

/// "No such field" in [`PyOffsets`].
pub const NO_OFFSET: u16 = u16::MAX;

/// Value of [`crate::PY_PROCESSES_MAP`]: how to walk one process's Python
/// stacks. Copied to a child by the fork program (same address space layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcessInfo {
    /// `PY_VERSION_HEX` of the interpreter (e.g. `0x030b07f0` for 3.11.7).
    pub version_hex: u32,
    /// Where the current thread's `PyThreadState *` is, in bytes from the
    /// thread pointer (fsbase): the glibc x86-64 TSD slot of the pthread key
    /// `_PyRuntime.autoTSSkey` holds, `0x310 + 16 * key + 8` for a key below
    /// 32 on the glibc the 3.9-3.12 table was measured with
    /// (notes/python-stacks.md §4); on 3.13+ found in the process itself
    /// (the word near a thread's pointer that holds its thread state: a TSD
    /// slot, or on 3.15, which has no `autoTSSkey`, the static-TLS
    /// `_Py_tss_gilstate` below the thread pointer, hence signed), so
    /// another glibc's `struct pthread` is read right.
    pub tss_slot_offset: i32,
    /// A second word that may hold the thread state, read when the first
    /// holds 0 (0: none). On 3.15, whose `_Py_tss_gilstate` (kept while
    /// the thread is detached) and `_Py_tss_tstate` (NULL while detached)
    /// both sit in static TLS with no symbol in `.dynsym`, a thread seen
    /// attached shows both and `probe` cannot tell them apart: the first
    /// non-zero of the two is the thread's state either way.
    pub tss_slot_offset_alt: i32,
    /// Struct offsets for this version.
    pub offsets: PyOffsets,
    /// `_PyRuntime.interpreters.main`: the main interpreter's
    /// `PyInterpreterState *` (0: unknown, nothing is flagged).
    pub main_interp: u64,
    /// Address of `_PyRuntime.gilstate.tstate_current` (3.9–3.11; 0 on
    /// 3.12+): the thread state holding the GIL. On these versions a thread
    /// that runs a sub-interpreter (`_xxsubinterpreters.run_string`) swaps
    /// its thread state in there but keeps the main interpreter's in its TSS
    /// slot; 3.12+ moves the TSS slot along (`tstate_activate` rebinds it).
    pub tstate_current_addr: u64,
}

const _: () = {
    assert!(core::mem::size_of::<PyFrame>() == 16);
    assert!(core::mem::size_of::<PyOffsets>() == 26);
    assert!(core::mem::size_of::<PyProcessInfo>() == 56);
};
