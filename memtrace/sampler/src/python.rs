//! Wrappers of CPython's three allocator domains (raw, mem, object),
//! installed with `PyMem_SetAllocator` over the allocators
//! `PyMem_GetAllocator` returns (pymalloc, malloc, mimalloc, or the debug
//! hooks of `PYTHONMALLOC=debug`), which they call for every block. The two
//! functions are looked up with `dlsym` in the process's global scope: no
//! link to libpython, so one library serves static and shared interpreters
//! of every version (the `PyMemAllocatorEx` layout is that of 3.5 on,
//! Include/cpython/pymem.h).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{
    before_free, control, countdown, is_sampled, sampled_alloc, DOMAIN_MEM, DOMAIN_OBJ, DOMAIN_RAW,
};

type MallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
type GetAllocatorFn = unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx);
type SetAllocatorFn = unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx);

/// CPython's `PyMemAllocatorEx`.
#[repr(C)]
struct PyMemAllocatorEx {
    ctx: *mut c_void,
    malloc: Option<MallocFn>,
    calloc: Option<CallocFn>,
    realloc: Option<ReallocFn>,
    free: Option<FreeFn>,
}

/// One domain: its `PyMemAllocatorDomain` value and the allocator it had
/// before, which its wrappers call.
struct Domain {
    id: u32,
    previous: UnsafeCell<PyMemAllocatorEx>,
}

// SAFETY: `previous` is written once, before the wrappers are installed
// (and so before any thread reads it), and only read afterwards.
unsafe impl Sync for Domain {}

impl Domain {
    const fn new(id: u32) -> Self {
        Self {
            id,
            previous: UnsafeCell::new(PyMemAllocatorEx {
                ctx: std::ptr::null_mut(),
                malloc: None,
                calloc: None,
                realloc: None,
                free: None,
            }),
        }
    }
}

static DOMAINS: [Domain; 3] = [
    Domain::new(DOMAIN_RAW),
    Domain::new(DOMAIN_MEM),
    Domain::new(DOMAIN_OBJ),
];

/// Set once the wrappers are installed: a second install does nothing.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installs the wrappers on the three domains. Called once by memtrace's
/// `sitecustomize` (through ctypes, with the GIL held). Returns 0 when
/// installed, 1 when they were already, -1 when the process has no
/// `PyMem_GetAllocator`/`PyMem_SetAllocator` in its global scope.
///
/// Each wrapper keeps the `ctx` of the allocator it replaces, and finds
/// its domain by which wrapper it is, not by `ctx`: a thread that calls the
/// raw domain without the GIL while `PyMem_SetAllocator` copies the struct
/// (possible when `record --pid` installs into a running process) may pair
/// the old functions with the new `ctx` or the reverse, and both pairs are
/// then right.
#[no_mangle]
pub extern "C" fn memtrace_sampler_install() -> c_int {
    let (Some(get), Some(set)) = (
        // SAFETY: the symbols have these signatures (Include/cpython/pymem.h).
        unsafe { lookup::<GetAllocatorFn>(c"PyMem_GetAllocator") },
        unsafe { lookup::<SetAllocatorFn>(c"PyMem_SetAllocator") },
    ) else {
        return -1;
    };
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return 1;
    }
    install::<0>(get, set);
    install::<1>(get, set);
    install::<2>(get, set);
    0
}

/// Installs the sampler on a running process and turns sampling on with a
/// countdown mean of `mean_bytes` (`--sample-bytes`): what the script that
/// `memtrace record --pid --allocations` has CPython run (PEP 768) calls.
/// Returns what [`memtrace_sampler_install`] returns; sampling is on unless
/// that is -1.
#[no_mangle]
pub extern "C" fn memtrace_sampler_start(mean_bytes: u64) -> c_int {
    let installed = memtrace_sampler_install();
    if installed >= 0 {
        control::start(mean_bytes);
    }
    installed
}

/// Puts the wrappers of `DOMAINS[D]` over the allocator it has.
fn install<const D: usize>(get: GetAllocatorFn, set: SetAllocatorFn) {
    let domain = &DOMAINS[D];
    let id = domain.id as c_int;
    // SAFETY: `previous` is not read before the allocator below is set.
    unsafe { get(id, domain.previous.get()) };
    // SAFETY: written just above, no longer written.
    let ctx = unsafe { (*domain.previous.get()).ctx };
    let mut wrapper = PyMemAllocatorEx {
        ctx,
        malloc: Some(wrapped_malloc::<D>),
        calloc: Some(wrapped_calloc::<D>),
        realloc: Some(wrapped_realloc::<D>),
        free: Some(wrapped_free::<D>),
    };
    // SAFETY: CPython copies the struct.
    unsafe { set(id, &mut wrapper) };
}

/// `name` in the process's global scope, as a function of type `F`.
///
/// # Safety
/// `F` must be the symbol's function pointer type.
unsafe fn lookup<F>(name: &CStr) -> Option<F> {
    // SAFETY: a NUL-terminated name.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: the caller vouches for the type; a function pointer has the
    // size of a data pointer on Linux.
    (!symbol.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) })
}

/// `DOMAINS[D]` and the allocator it had before.
#[inline(always)]
fn domain<const D: usize>() -> (&'static Domain, &'static PyMemAllocatorEx) {
    let domain = &DOMAINS[D];
    // SAFETY: `previous` is written before the wrappers are installed and
    // no longer written.
    (domain, unsafe { &*domain.previous.get() })
}

/// Runs `call` as a wrapped allocator call; samples the block it returns
/// when the call is the thread's outermost.
#[inline(always)]
fn sample_call(
    domain: &Domain,
    size_bytes: usize,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    let outermost = countdown::enter();
    let ptr = call();
    countdown::leave();
    if outermost && !ptr.is_null() && is_sampled(size_bytes) {
        sampled_alloc(ptr, size_bytes, domain.id);
    }
    ptr
}

// The wrappers call the previous allocator with the `ctx` they are given:
// the previous allocator's own (see `memtrace_sampler_install`).

unsafe extern "C" fn wrapped_malloc<const D: usize>(ctx: *mut c_void, size: usize) -> *mut c_void {
    let (domain, previous) = domain::<D>();
    let Some(malloc) = previous.malloc else {
        return std::ptr::null_mut();
    };
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, size, || unsafe { malloc(ctx, size) })
}

unsafe extern "C" fn wrapped_calloc<const D: usize>(
    ctx: *mut c_void,
    count: usize,
    size: usize,
) -> *mut c_void {
    let (domain, previous) = domain::<D>();
    let Some(calloc) = previous.calloc else {
        return std::ptr::null_mut();
    };
    let total = count.saturating_mul(size);
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, total, || unsafe { calloc(ctx, count, size) })
}

unsafe extern "C" fn wrapped_realloc<const D: usize>(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    let (domain, previous) = domain::<D>();
    let Some(realloc) = previous.realloc else {
        return std::ptr::null_mut();
    };
    before_free(ptr);
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, size, || unsafe { realloc(ctx, ptr, size) })
}

unsafe extern "C" fn wrapped_free<const D: usize>(ctx: *mut c_void, ptr: *mut c_void) {
    let (_, previous) = domain::<D>();
    before_free(ptr);
    if let Some(free) = previous.free {
        // SAFETY: the previous allocator, with its own ctx.
        unsafe { free(ctx, ptr) };
    }
}
