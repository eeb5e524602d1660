//! The sampler's switches: the mean of the byte countdown and whether
//! sampling is on. Both are set when the library loads, from
//! `MEMTRACE_SAMPLER_MEAN_BYTES` (memtrace's `--sample-bytes`: sampling is
//! on when it is set), or by `memtrace_sampler_start` when `record --pid`
//! installs the library in a running process; memtrace turns sampling off at the end of a record
//! by writing 0 to [`memtrace_sampler_on`] in the process's memory.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The environment variable memtrace passes `--sample-bytes` in.
pub const MEAN_BYTES_ENV: &std::ffi::CStr = c"MEMTRACE_SAMPLER_MEAN_BYTES";

/// Mean bytes between two sampled allocations of a thread.
static MEAN_BYTES: AtomicU64 = AtomicU64::new(512 * 1024);

/// 1 while the wrappers sample, 0 when they only forward. Exported so that
/// memtrace finds it in `.dynsym` and writes it in a running process.
#[no_mangle]
pub static memtrace_sampler_on: AtomicU32 = AtomicU32::new(0);

/// The countdown's mean, in bytes.
#[inline(always)]
pub fn mean_bytes() -> u64 {
    MEAN_BYTES.load(Ordering::Relaxed)
}

/// Whether the wrappers sample.
#[inline(always)]
pub fn sampling() -> bool {
    memtrace_sampler_on.load(Ordering::Relaxed) != 0
}

/// Turns sampling on with a countdown mean of `mean_bytes` (kept as it is
/// when 0).
pub fn start(mean_bytes: u64) {
    if mean_bytes > 0 {
        MEAN_BYTES.store(mean_bytes, Ordering::Relaxed);
    }
    memtrace_sampler_on.store(1, Ordering::Release);
}

/// Reads [`MEAN_BYTES_ENV`] (a positive decimal number) and turns sampling
/// on when it is there. `getenv` does not allocate.
extern "C" fn configure() {
    // SAFETY: a NUL-terminated name; the value is read before any thread of
    // the program can change the environment (the loader runs this).
    let value = unsafe { libc::getenv(MEAN_BYTES_ENV.as_ptr()) };
    if value.is_null() {
        return;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(value) };
    let Some(mean) = text
        .to_str()
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|&m| m > 0)
    else {
        return;
    };
    MEAN_BYTES.store(mean, Ordering::Relaxed);
    memtrace_sampler_on.store(1, Ordering::Relaxed);
}

/// Runs [`configure`] when the loader maps the library (`LD_PRELOAD` or a
/// `dlopen`), before the program's `main`.
#[used]
#[link_section = ".init_array"]
static CONFIGURE: extern "C" fn() = configure;
