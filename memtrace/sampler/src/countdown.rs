//! Per-thread sampling by bytes: a Poisson process over the bytes a thread
//! allocates, with mean [`crate::control::mean_bytes`]. Each thread counts
//! down an exponential draw; the allocation that reaches zero is sampled
//! and a new draw starts. A block of `size` bytes is thus sampled with
//! probability `1 - exp(-size / mean)` and weighs `size` over that, the
//! same process and weights as the uprobe mode's kernel countdown
//! (`memtrace::allocations::sample_weight_bytes`).
//!
//! Also the thread's nesting depth in the wrappers: an allocation made by
//! an allocator on behalf of an outer wrapped call (pymalloc's large blocks
//! through the raw domain, the raw domain through `malloc`) is not sampled
//! again.

use std::cell::Cell;

/// One thread's sampling state. Constant-initialised and without a
/// destructor: reading it never allocates or registers anything.
struct ThreadState {
    /// Bytes left before the next sampled allocation; 0 before the first
    /// draw.
    countdown_bytes: Cell<i64>,
    /// xorshift64* state; 0 until seeded.
    rng: Cell<u64>,
    /// Wrapped allocator calls in progress on this thread.
    depth: Cell<u32>,
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState { countdown_bytes: Cell::new(0), rng: Cell::new(0), depth: Cell::new(0) }
    };
}

/// Counts `size_bytes` down; whether this allocation is sampled.
#[inline(always)]
pub fn take(size_bytes: u64) -> bool {
    STATE.with(|state| {
        let left = state
            .countdown_bytes
            .get()
            .saturating_sub_unsigned(size_bytes);
        if left > 0 {
            state.countdown_bytes.set(left);
            return false;
        }
        slow_take(state, size_bytes)
    })
}

/// The countdown reached zero, or was never drawn.
#[cold]
#[inline(never)]
fn slow_take(state: &ThreadState, size_bytes: u64) -> bool {
    if state.rng.get() == 0 {
        state.rng.set(seed(state));
        let left = draw(state).saturating_sub_unsigned(size_bytes);
        if left > 0 {
            state.countdown_bytes.set(left);
            return false;
        }
    }
    state.countdown_bytes.set(draw(state));
    true
}

/// An exponential variate of mean [`crate::control::mean_bytes`], at least 1.
fn draw(state: &ThreadState) -> i64 {
    let mut x = state.rng.get();
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    state.rng.set(x);
    let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
    // Uniform in (0, 1]: never ln(0).
    let uniform = (bits + 1) as f64 / (1u64 << 53) as f64;
    let mean = crate::control::mean_bytes() as f64;
    (-uniform.ln() * mean).clamp(1.0, i64::MAX as f64) as i64
}

/// A nonzero seed that differs per thread and per process: the state's
/// address, the clock and the pid.
fn seed(state: &ThreadState) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    // SAFETY: no arguments.
    let pid = unsafe { libc::getpid() } as u64;
    let mixed = (state as *const ThreadState as u64)
        ^ (now.tv_nsec as u64).rotate_left(32)
        ^ (now.tv_sec as u64)
        ^ pid.rotate_left(17);
    mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// The weight, in bytes, of a sampled block of `size_bytes` at mean
/// `mean_bytes`: `size / (1 - exp(-size / mean))`.
pub fn weight_bytes(size_bytes: u64, mean_bytes: u64) -> u64 {
    let size = size_bytes as f64;
    let probability = -(-size / mean_bytes.max(1) as f64).exp_m1();
    if probability <= 0.0 {
        return 0;
    }
    (size / probability).round() as u64
}

/// Enters a wrapped allocator call; whether it is the thread's outermost.
#[inline(always)]
pub fn enter() -> bool {
    STATE.with(|state| {
        let depth = state.depth.get();
        state.depth.set(depth + 1);
        depth == 0
    })
}

/// Leaves the call [`enter`] entered.
#[inline(always)]
pub fn leave() {
    STATE.with(|state| state.depth.set(state.depth.get().saturating_sub(1)));
}

/// Whether no wrapped allocator call is in progress on this thread.
#[inline(always)]
pub fn outermost() -> bool {
    STATE.with(|state| state.depth.get() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampled_bytes_estimate_the_allocated_bytes() {
        // 1,000,000 blocks of 1 KiB at the default 512 KiB mean: ~2,000
        // samples, a relative standard error of ~2.2%.
        let size = 1024;
        let sampled = (0..1_000_000).filter(|_| take(size)).count() as u64;
        let estimate = sampled * weight_bytes(size, crate::control::mean_bytes());
        let truth = 1_000_000 * size;
        let error = estimate.abs_diff(truth) as f64 / truth as f64;
        assert!(error < 0.1, "estimate {estimate} vs {truth}");
    }

    #[test]
    fn a_block_larger_than_many_means_is_always_sampled_at_its_size() {
        let huge = 64 * crate::control::mean_bytes();
        assert!(take(huge));
        assert_eq!(weight_bytes(huge, crate::control::mean_bytes()), huge);
    }

    #[test]
    fn nested_calls_are_not_outermost() {
        assert!(outermost());
        assert!(enter());
        assert!(!enter());
        leave();
        leave();
        assert!(outermost());
    }
}
