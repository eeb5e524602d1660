//! pymalloc's census on byte images built from the documented layouts
//! (census.md, Objects/obmalloc.c).

use super::*;
use crate::census::remote::Image;

const ARRAY: u64 = 0x10_0000;
const VARS: u64 = 0x1000;
/// An arena that is not pool-aligned, as since 3.10.
const ARENA: u64 = 0x4000_1000;

/// A pool header of size class `szidx` with `count` live blocks, carved up
/// to `carved` blocks.
fn header(szidx: u32, count: u32, carved: u32) -> Vec<u8> {
    let size = (szidx + 1) * 16;
    let mut h = vec![0u8; 48];
    h[0..4].copy_from_slice(&count.to_le_bytes());
    h[32..36].copy_from_slice(&0u32.to_le_bytes());
    h[36..40].copy_from_slice(&szidx.to_le_bytes());
    h[40..44].copy_from_slice(&(48 + carved * size).to_le_bytes());
    h[44..48].copy_from_slice(&(POOL_BYTES as u32 - size).to_le_bytes());
    h
}

/// An image with one arena of `pools` carved pools, each header given.
fn image(pools: &[Vec<u8>]) -> Image {
    let mut image = Image::new();
    image.map(VARS, vec![0; 16]);
    image.write(VARS, &ARRAY.to_le_bytes());
    image.write(VARS + 8, &16u32.to_le_bytes());
    image.map(ARRAY, vec![0; 16 * 48]);
    let first = ARENA.div_ceil(POOL_BYTES) * POOL_BYTES;
    image.write(ARRAY, &ARENA.to_le_bytes());
    image.write(
        ARRAY + 8,
        &(first + pools.len() as u64 * POOL_BYTES).to_le_bytes(),
    );
    image.map(ARENA, vec![0; ARENA_BYTES as usize]);
    for (i, h) in pools.iter().enumerate() {
        image.write(first + i as u64 * POOL_BYTES, h);
    }
    image
}

fn vars() -> ArenaVars {
    ArenaVars {
        arenas_addr: VARS,
        maxarenas_addr: VARS + 8,
    }
}

#[test]
fn live_and_free_bytes_come_from_pool_headers() {
    // Class 24 (400 B): 40 blocks a pool. One survivor in each of two
    // pools, one full pool of class 0 (16 B, 1021 blocks), one empty pool.
    let mut image = image(&[
        header(24, 1, 40),
        header(24, 1, 40),
        header(0, 1021, 1021),
        header(3, 0, 10),
    ]);
    let census = census(&mut image, vars()).unwrap();
    assert_eq!(census.arenas, 1);
    assert_eq!(census.carved_pools, 4);
    assert_eq!(census.live_bytes, 2 * 400 + 1021 * 16);
    assert_eq!(census.live_bytes_by_class[24], 800);
    assert_eq!(census.free_in_used_pools_bytes, 2 * 39 * 400);
    assert_eq!(census.empty_pool_bytes, POOL_BYTES);
    assert_eq!(census.invalid_pools, 0);
    // Headers only: the variables, the array, 48 B a pool.
    assert_eq!(image.bytes_read(), 8 + 4 + 16 * 48 + 4 * 48);
}

#[test]
fn a_torn_header_is_counted_not_guessed() {
    let mut torn = header(24, 1, 40);
    torn[44..48].copy_from_slice(&7u32.to_le_bytes()); // maxnextoffset not the class's
    let mut too_many = header(2, 0, 10);
    too_many[0..4].copy_from_slice(&11u32.to_le_bytes()); // more live than carved
    let mut image = image(&[header(24, 2, 40), torn, too_many]);
    let census = census(&mut image, vars()).unwrap();
    assert_eq!(census.invalid_pools, 2);
    assert_eq!(census.live_bytes, 800);
}

#[test]
fn a_wrong_maxarenas_is_refused() {
    let mut image = image(&[]);
    image.write(VARS + 8, &17u32.to_le_bytes());
    assert!(census(&mut image, vars()).is_err());
}

/// `obmalloc_mgmt` of 3.12/3.13: `arenas`, `maxarenas`, list pointers,
/// then the arena counts at 552.
fn mgmt(arenas: u64, maxarenas: u32, usable: u64, current: u64) -> Vec<u8> {
    let mut m = vec![0u8; 584];
    m[0..8].copy_from_slice(&arenas.to_le_bytes());
    m[8..12].copy_from_slice(&maxarenas.to_le_bytes());
    m[24..32].copy_from_slice(&usable.to_le_bytes());
    m[552..560].copy_from_slice(&current.to_le_bytes());
    m[560..568].copy_from_slice(&(current + 3).to_le_bytes());
    m[568..576].copy_from_slice(&current.to_le_bytes());
    m
}

#[test]
fn the_mgmt_signature_finds_the_state_and_nothing_else() {
    let mut data = vec![0u8; 4096];
    data[1000..1008].copy_from_slice(&0x7f00_0000_0000u64.to_le_bytes()); // a lone pointer
    let state = mgmt(0x5555_0000, 64, 0x5555_0000 + 5 * 48, 7);
    data[2048..2048 + 584].copy_from_slice(&state);
    assert_eq!(find_mgmt(&data, 0x9000), vec![0x9000 + 2048]);
    // A list pointer off the array's 48-byte grid is not the state.
    let bad = mgmt(0x5555_0000, 64, 0x5555_0000 + 5 * 48 + 8, 7);
    data[2048..2048 + 584].copy_from_slice(&bad);
    assert!(find_mgmt(&data, 0x9000).is_empty());
    // More arenas than the high-water mark allows is not the state.
    let mut bad = mgmt(0x5555_0000, 64, 0, 7);
    bad[568..576].copy_from_slice(&100u64.to_le_bytes());
    data[2048..2048 + 584].copy_from_slice(&bad);
    assert!(find_mgmt(&data, 0x9000).is_empty());
}

#[test]
fn loads_of_debians_allocated_blocks_decode() {
    // Debian's /usr/bin/python3.11 (3.11.2), _Py_GetAllocatedBlocks at
    // 0x6d0190 (objdump): mov 0x3b4209(%rip),%rdx; mov 0x3f447a(%rip),%r9d;
    // xor %r8d,%r8d; mov 0x3f4480(%rip),%rdi.
    let code = [
        0x48, 0x8b, 0x15, 0x09, 0x42, 0x3b, 0x00, 0x44, 0x8b, 0x0d, 0x7a, 0x44, 0x3f, 0x00, 0x45,
        0x31, 0xc0, 0x48, 0x8b, 0x3d, 0x80, 0x44, 0x3f, 0x00,
    ];
    let (words32, words64) = loads_of_allocated_blocks(0x6d_0190, &code);
    assert_eq!(words32, vec![0xac_4618]);
    assert_eq!(words64, vec![0xa8_43a0, 0xac_4628]);
}
