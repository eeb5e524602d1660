//! The `symbolize` stage for native code, before `aggregate`: a record's
//! native instruction pointer (`MemoryRecord::native_ip`) or its copied
//! user stack (`NativeStackRecord`, unwound by [`unwind`]) to function
//! names, cut at the interpreter boundary by [`chain`]. Python frames are
//! resolved by `crate::python`.

pub mod chain;
mod native;
pub mod unwind;

pub use native::{NativeName, NativeSymbolizer};
pub use unwind::{NativeUnwinder, StackCopy};

/// Whether the ELF file named `file_name` (`libc.so.6`) is the C runtime:
/// glibc's `libc`, `libm`, `libpthread`, `libdl`, the dynamic loader, the
/// vDSO, or memtrace's allocation sampler (`--alloc-hooks sampler`: its
/// `malloc` wraps glibc's). Code there runs on behalf of whoever called it (a `memcpy` into a
/// buffer an extension asked CPython for), so it names no one's memory.
#[must_use]
pub fn is_c_runtime(file_name: &str) -> bool {
    const RUNTIME: [&str; 8] = [
        "libc.",
        "libc-",
        "ld-linux",
        "libm.",
        "libpthread",
        "libdl",
        "[vdso",
        "libmemtrace_sampler",
    ];
    RUNTIME.iter().any(|prefix| file_name.starts_with(prefix))
}
