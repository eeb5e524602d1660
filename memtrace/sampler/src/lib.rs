//! Allocator mode, first step of its data flow when the sampler is used
//! (`--alloc-hooks sampler`): this shared object, loaded into the traced
//! process (`LD_PRELOAD` and a `sitecustomize` that memtrace writes, see
//! `memtrace::app::sampler`), samples allocations in the process itself
//! and calls the two marker functions ([`markers`]) for sampled blocks and
//! their frees only; memtrace's uprobes sit on the markers alone.
//!
//! - [`countdown`]: the per-thread exponential byte countdown (the mean is
//!   `--sample-bytes`, as in the uprobe mode's kernel countdown).
//! - [`sampled`]: the bounded lock-free set of sampled live blocks.
//! - [`python`]: wrappers of CPython's three allocator domains, installed
//!   with `PyMem_SetAllocator` and chaining to the allocators found.
//! - [`native`]: `malloc`, `calloc`, `realloc`, `free` interposed for
//!   native code (glibc's own behind them).
//! - [`control`]: the switches memtrace sets: the mean and whether sampling
//!   is on (off at the end of a record: the wrappers then only forward).
//!
//! Nothing here allocates: the wrappers run inside the allocator.

pub mod control;
pub mod countdown;
pub mod markers;
pub mod native;
pub mod python;
pub mod sampled;

use memtrace_common::{
    SAMPLER_DOMAIN_MEM as DOMAIN_MEM, SAMPLER_DOMAIN_NATIVE as DOMAIN_NATIVE,
    SAMPLER_DOMAIN_OBJ as DOMAIN_OBJ, SAMPLER_DOMAIN_RAW as DOMAIN_RAW,
    SAMPLER_DOMAIN_UNTRACKED as DOMAIN_UNTRACKED,
};

/// A sampled block `ptr` of `size_bytes` from `domain`: into the sampled
/// set, then the marker. Called by the wrappers after the allocation.
#[inline(never)]
#[cold]
fn sampled_alloc(ptr: *mut libc::c_void, size_bytes: usize, domain: u32) {
    let addr = ptr as usize;
    let domain = if sampled::insert(addr) {
        domain
    } else {
        domain | DOMAIN_UNTRACKED
    };
    let weight = countdown::weight_bytes(size_bytes as u64, control::mean_bytes());
    markers::memtrace_sampler_alloc(addr as u64, size_bytes as u64, weight, domain);
}

/// A block `ptr` is about to be freed (or moved by a realloc): if it was
/// sampled, out of the set and the free marker, before the allocator can
/// hand the address out again.
#[inline(always)]
fn before_free(ptr: *mut libc::c_void) {
    if !ptr.is_null() && sampled::remove(ptr as usize) {
        markers::memtrace_sampler_free(ptr as u64);
    }
}

/// Whether an allocation of `size_bytes` just made by this thread is
/// sampled (counts it down; always false while sampling is off).
#[inline(always)]
fn is_sampled(size_bytes: usize) -> bool {
    control::sampling() && countdown::take(size_bytes as u64)
}
