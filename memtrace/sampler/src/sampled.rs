//! The sampled live blocks of the process: a fixed table of
//! [`BUCKETS`] cache-line buckets of [`SLOTS`] addresses each, written with
//! compare-and-swap only (no lock, no GIL: safe on free-threaded builds and
//! across sub-interpreters, which share the process's allocators). A free
//! looks in one bucket; a block whose bucket is full is not kept (its
//! allocation marker says so, and its free is not reported).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Buckets of the table (a power of two).
pub const BUCKETS: usize = 8192;
/// Addresses per bucket: one 64-byte cache line.
pub const SLOTS: usize = 8;

/// One cache line of addresses; 0 is an empty slot.
#[repr(align(64))]
struct Bucket([AtomicUsize; SLOTS]);

static TABLE: [Bucket; BUCKETS] =
    [const { Bucket([const { AtomicUsize::new(0) }; SLOTS]) }; BUCKETS];

/// Blocks in the table: frees skip the lookup while it is 0.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The bucket of address `addr` (Fibonacci hashing of its 16-byte units).
#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    let hash = ((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &TABLE[(hash >> (64 - BUCKETS.trailing_zeros())) as usize]
}

/// Keeps sampled block `addr` (nonzero); false when its bucket is full.
pub fn insert(addr: usize) -> bool {
    for slot in &bucket(addr).0 {
        if slot
            .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            LIVE.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

/// Takes block `addr` out; whether it was there (sampled).
#[inline(always)]
pub fn remove(addr: usize) -> bool {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return false;
    }
    for slot in &bucket(addr).0 {
        if slot.load(Ordering::Relaxed) == addr
            && slot
                .compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_found_once_and_a_full_bucket_refuses() {
        let base = 0x7f00_0000_0000_usize;
        assert!(insert(base));
        assert!(remove(base));
        assert!(!remove(base), "removed twice");
        // Addresses 16 * BUCKETS * k apart share no bucket in general; find
        // SLOTS + 1 of them that share base's.
        let same: Vec<usize> = (1..)
            .map(|k| base + 16 * k)
            .filter(|&a| std::ptr::eq(bucket(a), bucket(base)))
            .take(SLOTS + 1)
            .collect();
        for &addr in &same[..SLOTS] {
            assert!(insert(addr));
        }
        assert!(!insert(same[SLOTS]), "a full bucket took a ninth block");
        for &addr in &same[..SLOTS] {
            assert!(remove(addr));
        }
    }
}
