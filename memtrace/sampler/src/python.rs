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
    before_free, countdown, is_sampled, sampled_alloc, DOMAIN_MEM, DOMAIN_OBJ, DOMAIN_RAW,
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
/// before, which the wrappers call (their `ctx` points here).
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
    for domain in &DOMAINS {
        let id = domain.id as c_int;
        // SAFETY: `previous` is not read before the allocator below is set.
        unsafe { get(id, domain.previous.get()) };
        let mut wrapper = PyMemAllocatorEx {
            ctx: std::ptr::from_ref(domain).cast_mut().cast(),
            malloc: Some(wrapped_malloc),
            calloc: Some(wrapped_calloc),
            realloc: Some(wrapped_realloc),
            free: Some(wrapped_free),
        };
        // SAFETY: CPython copies the struct.
        unsafe { set(id, &mut wrapper) };
    }
    0
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

/// The domain and its previous allocator behind a wrapper's `ctx`.
///
/// # Safety
/// `ctx` is the `ctx` [`memtrace_sampler_install`] installed.
#[inline(always)]
unsafe fn domain<'a>(ctx: *mut c_void) -> (&'a Domain, &'a PyMemAllocatorEx) {
    // SAFETY: `ctx` points into `DOMAINS`; `previous` is no longer written.
    unsafe {
        let domain = &*ctx.cast::<Domain>();
        (domain, &*domain.previous.get())
    }
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

unsafe extern "C" fn wrapped_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: called by CPython with our ctx.
    let (domain, previous) = unsafe { domain(ctx) };
    let Some(malloc) = previous.malloc else {
        return std::ptr::null_mut();
    };
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, size, || unsafe { malloc(previous.ctx, size) })
}

unsafe extern "C" fn wrapped_calloc(ctx: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // SAFETY: called by CPython with our ctx.
    let (domain, previous) = unsafe { domain(ctx) };
    let Some(calloc) = previous.calloc else {
        return std::ptr::null_mut();
    };
    let total = count.saturating_mul(size);
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, total, || unsafe {
        calloc(previous.ctx, count, size)
    })
}

unsafe extern "C" fn wrapped_realloc(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    // SAFETY: called by CPython with our ctx.
    let (domain, previous) = unsafe { domain(ctx) };
    let Some(realloc) = previous.realloc else {
        return std::ptr::null_mut();
    };
    before_free(ptr);
    // SAFETY: the previous allocator, with its own ctx.
    sample_call(domain, size, || unsafe { realloc(previous.ctx, ptr, size) })
}

unsafe extern "C" fn wrapped_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: called by CPython with our ctx.
    let (_, previous) = unsafe { domain(ctx) };
    before_free(ptr);
    if let Some(free) = previous.free {
        // SAFETY: the previous allocator, with its own ctx.
        unsafe { free(previous.ctx, ptr) };
    }
}
