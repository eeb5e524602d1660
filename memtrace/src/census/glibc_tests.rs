//! glibc's census on byte images built from the documented layouts
//! (census.md, malloc/malloc.c).

use super::*;
use crate::census::remote::Image;

const LIBC: u64 = 0x7f00_0000_0000;
const HEAP: u64 = 0x5555_0000_0000;
const HEAP_BYTES: u64 = 0x4_0000;

/// Every page resident.
struct AllResident;

impl Residency for AllResident {
    fn resident_bytes(&mut self, range: Range<u64>) -> Option<u64> {
        Some(range.end - range.start)
    }
}

/// Pages from `from` on are not resident.
struct ResidentBelow(u64);

impl Residency for ResidentBelow {
    fn resident_bytes(&mut self, range: Range<u64>) -> Option<u64> {
        Some(range.end.min(self.0).saturating_sub(range.start))
    }
}

/// A main arena at `LIBC + 0x100` with every bin empty and `top`.
fn arena(top: u64) -> Vec<u8> {
    let addr = LIBC + 0x100;
    let mut a = vec![0u8; ARENA_BYTES as usize];
    a[96..104].copy_from_slice(&top.to_le_bytes());
    for i in 0..127u64 {
        let own = addr + 96 + 16 * i;
        let at = 112 + 16 * i as usize;
        a[at..at + 8].copy_from_slice(&own.to_le_bytes());
        a[at + 8..at + 16].copy_from_slice(&own.to_le_bytes());
    }
    a[2160..2168].copy_from_slice(&addr.to_le_bytes());
    a[2184..2192].copy_from_slice(&HEAP_BYTES.to_le_bytes());
    a[2192..2200].copy_from_slice(&HEAP_BYTES.to_le_bytes());
    a
}

/// Chunks of `(size, in_use)` laid from the heap's start, then the top.
fn heap(image: &mut Image, chunks: &[(u64, bool)]) -> u64 {
    image.map(HEAP, vec![0; HEAP_BYTES as usize]);
    let mut addr = HEAP;
    let mut prev_in_use = true;
    for &(size, in_use) in chunks {
        image.write(addr + 8, &(size | u64::from(prev_in_use)).to_le_bytes());
        if !in_use {
            image.write(addr + size, &size.to_le_bytes()); // footer
        }
        prev_in_use = in_use;
        addr += size;
    }
    let top = HEAP + HEAP_BYTES - addr;
    image.write(addr + 8, &(top | u64::from(prev_in_use)).to_le_bytes());
    addr
}

fn take(image: &mut Image, residency: &mut dyn Residency) -> GlibcCensus {
    let vars = GlibcVars {
        main_arena: LIBC + 0x100,
        mp: None,
    };
    census(
        image,
        residency,
        vars,
        Some(HEAP..HEAP + HEAP_BYTES),
        u64::MAX,
    )
    .unwrap()
}

#[test]
fn a_walk_tells_in_use_from_free_and_reads_residency() {
    let mut image = Image::new();
    let top = heap(
        &mut image,
        &[
            (0x290, true),
            (0x1000, true),
            (0x2_0000, false),
            (0x40, true),
        ],
    );
    image.map(LIBC, vec![0; 0x1000]);
    image.write(LIBC + 0x100, &arena(top));
    let census = take(&mut image, &mut AllResident);
    let main = &census.arenas[0];
    assert_eq!(census.arenas.len(), 1);
    assert_eq!(main.in_use_bytes, 0x290 + 0x1000 + 0x40);
    assert_eq!(main.free_bytes, HEAP_BYTES - main.in_use_bytes);
    assert_eq!(main.free_resident_bytes, main.free_bytes);
    assert_eq!(
        (main.chunks, main.resyncs, main.footer_mismatches),
        (5, 0, 0)
    );

    // The free chunk's pages past 0x8000 into it were given back.
    let census = take(&mut image, &mut ResidentBelow(HEAP + 0x1290 + 0x8000));
    let main = &census.arenas[0];
    assert!(
        main.free_resident_bytes < main.free_bytes - 0x1_0000,
        "{main:?}"
    );
}

#[test]
fn tcache_chunks_count_as_free() {
    let mut image = Image::new();
    let top = heap(
        &mut image,
        &[(0x290, true), (0x30, true), (0x30, true), (0x40, true)],
    );
    // The tcache struct: two 48-byte chunks in bin 1, their entry set.
    image.write(HEAP + 16 + 2, &2u16.to_le_bytes());
    image.write(HEAP + 16 + 128 + 8, &(HEAP + 0x2a0).to_le_bytes());
    image.map(LIBC, vec![0; 0x1000]);
    image.write(LIBC + 0x100, &arena(top));
    let main = take(&mut image, &mut AllResident).arenas.remove(0);
    assert_eq!(main.in_use_bytes, 0x290 + 0x40);
}

#[test]
fn a_torn_header_resyncs_and_counts_unknown_bytes() {
    let mut image = Image::new();
    let top = heap(
        &mut image,
        &[
            (0x100, true),
            (0x100, true),
            (0x100, true),
            (0x100, true),
            (0x100, true),
        ],
    );
    image.write(HEAP + 0x100 + 8, &0x13u64.to_le_bytes()); // a size that is user data
    image.map(LIBC, vec![0; 0x1000]);
    image.write(LIBC + 0x100, &arena(top));
    let main = take(&mut image, &mut AllResident).arenas.remove(0);
    assert_eq!(main.resyncs, 1);
    assert_eq!(main.unknown_bytes, 0x100);
    assert_eq!(main.in_use_bytes, 4 * 0x100);
}

#[test]
fn the_arena_signature_finds_main_arena_only() {
    let top = HEAP + 0x1000;
    let mut data = vec![0u8; 0x1000];
    data[0x100..0x100 + ARENA_BYTES as usize].copy_from_slice(&arena(top));
    assert_eq!(find_main_arena(&data, LIBC), vec![LIBC + 0x100]);
    let mp_at = 0xa00;
    data[mp_at + 96..mp_at + 104].copy_from_slice(&HEAP.to_le_bytes());
    data[mp_at + 104..mp_at + 112].copy_from_slice(&64u64.to_le_bytes());
    data[mp_at + 112..mp_at + 120].copy_from_slice(&1032u64.to_le_bytes());
    data[mp_at + 120..mp_at + 128].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(
        find_mp(&data, LIBC, &(HEAP..HEAP + HEAP_BYTES)),
        vec![LIBC + mp_at as u64]
    );
}
