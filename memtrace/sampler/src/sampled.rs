//! The sampled live blocks of the process: a fixed table of
//! [`BUCKETS`] cache-line buckets of [`SLOTS`] addresses each, written with
//! compare-and-swap only (no lock, no GIL: safe on free-threaded builds and
//! across sub-interpreters, which share the process's allocators). A free
//! first reads one byte of [`FILTER`] (16 KiB, mostly in the L1 cache): its
//! count of kept blocks of that half-bucket; only a nonzero count looks in
//! the bucket. A block whose bucket is full is not kept (its allocation
//! marker says so, and its free is not reported).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Buckets of the table (a power of two).
pub const BUCKETS: usize = 8192;
/// Addresses per bucket: one 64-byte cache line.
pub const SLOTS: usize = 8;

/// One cache line of addresses; 0 is an empty slot.
#[repr(align(64))]
struct Bucket([AtomicUsize; SLOTS]);

static TABLE: [Bucket; BUCKETS] =
    [const { Bucket([const { AtomicUsize::new(0) }; SLOTS]) }; BUCKETS];

/// Slots of [`FILTER`]: two per bucket.
const FILTER_SLOTS: usize = 2 * BUCKETS;

/// Kept blocks per half-bucket (at most [`SLOTS`] each: no overflow).
static FILTER: [AtomicU8; FILTER_SLOTS] = [const { AtomicU8::new(0) }; FILTER_SLOTS];

/// The [`FILTER`] slot of address `addr` (Fibonacci hashing of its 16-byte
/// units); its bucket is the slot halved.
#[inline(always)]
fn filter_slot(addr: usize) -> usize {
    let hash = ((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (hash >> (64 - FILTER_SLOTS.trailing_zeros())) as usize
}

/// The bucket of address `addr`.
#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    &TABLE[filter_slot(addr) / 2]
}

/// Keeps sampled block `addr` (nonzero); false when its bucket is full.
/// Called before the block is handed to the program, so its free comes
/// after.
pub fn insert(addr: usize) -> bool {
    for slot in &bucket(addr).0 {
        if slot
            .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            FILTER[filter_slot(addr)].fetch_add(1, Ordering::Release);
            return true;
        }
    }
    false
}

/// Takes block `addr` out; whether it was there (sampled).
#[inline(always)]
pub fn remove(addr: usize) -> bool {
    let filter = &FILTER[filter_slot(addr)];
    if filter.load(Ordering::Acquire) == 0 {
        return false;
    }
    for slot in &bucket(addr).0 {
        if slot.load(Ordering::Relaxed) == addr
            && slot
                .compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            filter.fetch_sub(1, Ordering::Release);
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
