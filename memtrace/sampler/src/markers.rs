//! The two functions memtrace attaches its uprobes to (per process, by
//! their `.dynsym` offsets in this library). They do nothing themselves:
//! the uprobe reads their arguments, the thread's registers and stacks.
//! They are called for sampled blocks and their frees only.

/// A sampled block: `ptr` of `size` bytes, which stands for `weight` bytes
/// (`size / (1 - exp(-size / mean))`), from `domain` (a `memtrace_common::SAMPLER_DOMAIN_*` value,
/// with [`crate::DOMAIN_UNTRACKED`] when the sampled set was full).
#[no_mangle]
#[inline(never)]
pub extern "C" fn memtrace_sampler_alloc(ptr: u64, size: u64, weight: u64, domain: u32) {
    std::hint::black_box((ptr, size, weight, domain));
}

/// Sampled block `ptr` is being freed (or moved by a realloc).
#[no_mangle]
#[inline(never)]
pub extern "C" fn memtrace_sampler_free(ptr: u64) {
    std::hint::black_box(ptr);
}
