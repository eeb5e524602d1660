//! The in-process sampler's interface (`memtrace/sampler`, loaded into a
//! traced process with `--alloc-hooks sampler`): the marker functions the
//! kernel side's uprobes sit on, the `domain` values their calls carry, and
//! the switch memtrace writes to stop sampling.

/// `memtrace_sampler_alloc(ptr: u64, size: u64, weight: u64, domain: u32)`:
/// called for each sampled block (`.dynsym` of the sampler library).
pub const SAMPLER_ALLOC_SYMBOL: &str = "memtrace_sampler_alloc";
/// `memtrace_sampler_free(ptr: u64)`: called before a sampled block is
/// freed or moved by a realloc.
pub const SAMPLER_FREE_SYMBOL: &str = "memtrace_sampler_free";
/// `memtrace_sampler_on` (an `AtomicU32`): 1 while the sampler samples; 0
/// makes its wrappers only forward.
pub const SAMPLER_ON_SYMBOL: &str = "memtrace_sampler_on";
/// File name of the sampler library as memtrace writes it.
pub const SAMPLER_FILE_NAME: &str = "libmemtrace_sampler.so";

/// `domain` of a block from CPython's `PYMEM_DOMAIN_RAW`.
pub const SAMPLER_DOMAIN_RAW: u32 = 0;
/// `domain` of a block from CPython's `PYMEM_DOMAIN_MEM`.
pub const SAMPLER_DOMAIN_MEM: u32 = 1;
/// `domain` of a block from CPython's `PYMEM_DOMAIN_OBJ`.
pub const SAMPLER_DOMAIN_OBJ: u32 = 2;
/// `domain` of a block from libc's `malloc` family called by native code.
pub const SAMPLER_DOMAIN_NATIVE: u32 = 3;
/// Or'ed into `domain`: the sampler's set of sampled blocks was full, this
/// block's free will not be reported.
pub const SAMPLER_DOMAIN_UNTRACKED: u32 = 0x100;
