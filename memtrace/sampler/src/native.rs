//! `malloc`, `calloc`, `realloc` and `free` for native code (extensions,
//! libraries such as SQLite, an embedding host), interposed when the
//! library is in `LD_PRELOAD`: each calls glibc's own (`__libc_malloc`,
//! ...: no `dlsym` at the first call, which would itself allocate) and
//! samples its block like the CPython domains, unless a wrapped CPython
//! allocator made the call (then that outer call was counted). Blocks from
//! the functions not interposed (`posix_memalign`, `aligned_alloc`, ...)
//! are glibc's; their `free` here forwards to glibc's.

use std::ffi::c_void;

use crate::{before_free, countdown, is_sampled, sampled_alloc, DOMAIN_NATIVE};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
}

/// Samples native block `ptr` of `size_bytes` when no wrapped call is in
/// progress on the thread.
#[inline(always)]
fn sample_native(ptr: *mut c_void, size_bytes: usize) -> *mut c_void {
    if !ptr.is_null() && countdown::outermost() && is_sampled(size_bytes) {
        sampled_alloc(ptr, size_bytes, DOMAIN_NATIVE);
    }
    ptr
}

/// libc `malloc`, sampled.
///
/// # Safety
/// As glibc's.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: glibc's own.
    sample_native(unsafe { __libc_malloc(size) }, size)
}

/// libc `calloc`, sampled.
///
/// # Safety
/// As glibc's.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    // SAFETY: glibc's own.
    sample_native(
        unsafe { __libc_calloc(count, size) },
        count.saturating_mul(size),
    )
}

/// libc `realloc`, sampled; a sampled old block is reported freed first.
///
/// # Safety
/// As glibc's.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    before_free(ptr);
    // SAFETY: glibc's own.
    sample_native(unsafe { __libc_realloc(ptr, size) }, size)
}

/// libc `free`; a sampled block is reported freed first.
///
/// # Safety
/// As glibc's.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    before_free(ptr);
    // SAFETY: glibc's own.
    unsafe { __libc_free(ptr) }
}
