//! pymalloc's census: walks the arena array and the header of every carved
//! pool (CPython 3.10+ on x86-64, census.md "pymalloc"), giving live bytes
//! by size class, free bytes in partly used pools, and empty pools. Only
//! headers are read (48 B a pool, ~3 MiB per GiB of arenas); uncarved
//! pools are never read, so no untouched page gets mapped.
//!
//! Layouts (Objects/obmalloc.c, Include/internal/pycore_obmalloc.h):
//! `struct arena_object` is 48 B (`address` @0, `pool_address` @8,
//! `nfreepools` u32 @16, `ntotalpools` u32 @20); `struct pool_header` is
//! 48 B (`ref.count` u32 @0, `freeblock` @8, `arenaindex` u32 @32, `szidx`
//! u32 @36, `nextoffset` u32 @40, `maxnextoffset` u32 @44).

use std::io;

use serde::{Deserialize, Serialize};

use super::remote::{u32_at, u64_at, Memory};

/// Arena size since 3.10 (`ARENA_BITS` 20): 1 MiB.
pub const ARENA_BYTES: u64 = 1 << 20;
/// Pool size since 3.10 (`POOL_BITS` 14): 16 KiB.
pub const POOL_BYTES: u64 = 1 << 14;
/// `sizeof(struct pool_header)` and `sizeof(struct arena_object)`.
const HEADER_BYTES: u64 = 48;
/// Size classes (`NB_SMALL_SIZE_CLASSES`, 512 B / 16 B alignment).
pub const SIZE_CLASSES: usize = 32;
/// Most arena objects memtrace reads (4 GiB of arenas' worth of
/// `maxarenas`, 192 KiB of array): a larger count is not pymalloc's.
const MAX_ARENAS: u32 = 4096;

/// Where the arena array's two variables are, in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaVars {
    /// Address of `arenas` (`struct arena_object *`).
    pub arenas_addr: u64,
    /// Address of `maxarenas` (`uint`).
    pub maxarenas_addr: u64,
}

/// pymalloc's state as its own bookkeeping tells it, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PymallocCensus {
    /// Arenas allocated (each [`ARENA_BYTES`] mapped).
    pub arenas: u64,
    /// Pools carved out of those arenas (ever used).
    pub carved_pools: u64,
    /// Bytes of live blocks (`ref.count * block size` over the pools).
    pub live_bytes: u64,
    /// Free block bytes in pools that still hold a live block: pinned by
    /// their survivors.
    pub free_in_used_pools_bytes: u64,
    /// Bytes of carved pools with no live block (kept inside arenas that
    /// some other pool pins).
    pub empty_pool_bytes: u64,
    /// Live bytes per size class (block size `16 * (i + 1)`).
    pub live_bytes_by_class: Vec<u64>,
    /// Pool headers that failed the checks (torn by a concurrent write, or
    /// unreadable): counted as unknown, never guessed.
    pub invalid_pools: u64,
}

impl PymallocCensus {
    /// Carved memory that holds no live block: what pymalloc keeps that
    /// the program freed, in bytes.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.free_in_used_pools_bytes + self.empty_pool_bytes
    }
}

/// One pool header's numbers, once checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pool {
    size_class: usize,
    count: u64,
}

/// Checks a pool header (census.md's signature): a valid size class, the
/// `maxnextoffset` its size gives, `nextoffset` on a block boundary past
/// the first two blocks, no more live blocks than were carved, `freeblock`
/// null or inside the pool.
fn pool(header: &[u8], pool_addr: u64, maxarenas: u32) -> Option<Pool> {
    let count = u64::from(u32_at(header, 0));
    let freeblock = u64_at(header, 8);
    let arenaindex = u32_at(header, 32);
    let szidx = u32_at(header, 36);
    let nextoffset = u64::from(u32_at(header, 40));
    let maxnextoffset = u64::from(u32_at(header, 44));
    if szidx as usize >= SIZE_CLASSES || arenaindex >= maxarenas {
        return None;
    }
    let size = (u64::from(szidx) + 1) * 16;
    let carved_ok = maxnextoffset == POOL_BYTES - size
        && HEADER_BYTES + 2 * size <= nextoffset
        && nextoffset <= maxnextoffset + size
        && (nextoffset - HEADER_BYTES).is_multiple_of(size)
        && count <= (nextoffset - HEADER_BYTES) / size;
    let free_ok = freeblock == 0
        || (pool_addr + HEADER_BYTES <= freeblock && freeblock < pool_addr + POOL_BYTES);
    (carved_ok && free_ok).then_some(Pool {
        size_class: szidx as usize,
        count,
    })
}

/// The carved pools of the arena object `arena` (its `address` and
/// `pool_address`): from the first pool boundary to `pool_address`.
fn carved_pools(arena: &[u8]) -> Vec<u64> {
    let address = u64_at(arena, 0);
    let pool_address = u64_at(arena, 8);
    if address == 0 || pool_address < address || pool_address > address + ARENA_BYTES {
        return Vec::new();
    }
    let first = address.div_ceil(POOL_BYTES) * POOL_BYTES;
    (first..pool_address)
        .step_by(POOL_BYTES as usize)
        .filter(|p| p + POOL_BYTES <= address + ARENA_BYTES)
        .collect()
}

/// Takes pymalloc's census of `memory` through the arena variables
/// `vars`.
///
/// # Errors
/// The variables or the array cannot be read, or `maxarenas` is not
/// pymalloc's (then `vars` is wrong for this process).
pub fn census(memory: &mut dyn Memory, vars: ArenaVars) -> io::Result<PymallocCensus> {
    let mut word = [0u8; 8];
    memory.read(vars.arenas_addr, &mut word)?;
    let arenas = u64::from_le_bytes(word);
    let mut word = [0u8; 4];
    memory.read(vars.maxarenas_addr, &mut word)?;
    let maxarenas = u32::from_le_bytes(word);
    if !is_maxarenas(maxarenas) || arenas == 0 || !arenas.is_multiple_of(8) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not pymalloc's arena array: maxarenas {maxarenas}, arenas {arenas:#x}"),
        ));
    }
    let mut array = vec![0u8; maxarenas as usize * HEADER_BYTES as usize];
    memory.read(arenas, &mut array)?;
    let mut out = PymallocCensus {
        live_bytes_by_class: vec![0; SIZE_CLASSES],
        ..PymallocCensus::default()
    };
    let mut pools = Vec::new();
    for arena in array.chunks(HEADER_BYTES as usize) {
        if u64_at(arena, 0) != 0 {
            out.arenas += 1;
            pools.extend(carved_pools(arena));
        }
    }
    out.carved_pools = pools.len() as u64;
    for (&addr, header) in pools
        .iter()
        .zip(memory.gather(&pools, HEADER_BYTES as usize))
    {
        match header.and_then(|h| pool(&h, addr, maxarenas)) {
            Some(p) => add_pool(&mut out, p),
            None => out.invalid_pools += 1,
        }
    }
    Ok(out)
}

/// `maxarenas` as pymalloc grows it: 16, then doubled.
fn is_maxarenas(value: u32) -> bool {
    (16..=MAX_ARENAS).contains(&value) && value.is_power_of_two()
}

/// Adds one checked pool to the census.
fn add_pool(out: &mut PymallocCensus, p: Pool) {
    let size = (p.size_class as u64 + 1) * 16;
    let capacity = (POOL_BYTES - HEADER_BYTES) / size;
    let live = p.count.min(capacity) * size;
    out.live_bytes += live;
    out.live_bytes_by_class[p.size_class] += live;
    if p.count == 0 {
        out.empty_pool_bytes += POOL_BYTES;
    } else {
        out.free_in_used_pools_bytes += (capacity - p.count.min(capacity)) * size;
    }
}

/// 3.12+: the arena variables from the address of the `mgmt` state
/// (`arenas` @0, `maxarenas` @8).
#[must_use]
pub fn vars_of_mgmt(mgmt_addr: u64) -> ArenaVars {
    ArenaVars {
        arenas_addr: mgmt_addr,
        maxarenas_addr: mgmt_addr + 8,
    }
}

/// 3.12/3.13: offsets in `data` (memory at address `base`) where the
/// `obmalloc_mgmt` state may start (census.md's signature): `arenas`
/// 8-aligned and set, `maxarenas` a power of two >= 16, the list pointers
/// (`unused_arena_objects` @16, `usable_arenas` @24, `nfp2lasta[65]` @32)
/// null or on an arena object of the array, and `narenas_currently_allocated`
/// (@552) <= `narenas_highwater` (@568) <= `maxarenas`, highwater <=
/// `ntimes_arena_allocated` (@560).
#[must_use]
pub fn find_mgmt(data: &[u8], base: u64) -> Vec<u64> {
    const STATE_BYTES: usize = 584;
    let mut hits = Vec::new();
    let mut offset = (base.wrapping_neg() % 8) as usize;
    while offset + STATE_BYTES <= data.len() {
        let state = &data[offset..offset + STATE_BYTES];
        if is_mgmt(state) {
            hits.push(base + offset as u64);
        }
        offset += 8;
    }
    hits
}

/// One candidate of [`find_mgmt`].
fn is_mgmt(state: &[u8]) -> bool {
    let arenas = u64_at(state, 0);
    let maxarenas = u32_at(state, 8);
    if arenas == 0
        || !arenas.is_multiple_of(8)
        || !is_maxarenas(maxarenas)
        || u32_at(state, 12) != 0
    {
        return false;
    }
    let end = arenas + u64::from(maxarenas) * HEADER_BYTES;
    let on_array =
        |p: u64| p == 0 || (arenas <= p && p < end && (p - arenas).is_multiple_of(HEADER_BYTES));
    let lists = (16..32 + 65 * 8)
        .step_by(8)
        .all(|o| on_array(u64_at(state, o)));
    let current = u64_at(state, 552);
    let ntimes = u64_at(state, 560);
    let highwater = u64_at(state, 568);
    lists
        && current >= 1
        && current <= highwater
        && highwater <= u64::from(maxarenas)
        && highwater <= ntimes
}

/// 3.11: the arena variables from the first loads of `_Py_GetAllocatedBlocks`
/// (at link-time address `func_addr`, code `code`), which reads
/// `raw_allocated_blocks`, `maxarenas` and `arenas` (Objects/obmalloc.c)
/// with RIP-relative `mov`s: 32-bit loads are `maxarenas` candidates, 64-bit
/// ones `arenas` candidates (link-time addresses; the caller adds the bias
/// and checks them by reading).
#[must_use]
pub fn loads_of_allocated_blocks(func_addr: u64, code: &[u8]) -> (Vec<u64>, Vec<u64>) {
    let mut words32 = Vec::new();
    let mut words64 = Vec::new();
    let mut i = 0;
    while i + 6 <= code.len() {
        let rex = code[i] & 0xf0 == 0x40;
        let at = if rex { i + 1 } else { i };
        let is_mov =
            code.get(at) == Some(&0x8b) && code.get(at + 1).is_some_and(|m| m & 0xc7 == 0x05);
        if !is_mov || at + 6 > code.len() {
            i += 1;
            continue;
        }
        let disp = i32::from_le_bytes(code[at + 2..at + 6].try_into().unwrap_or([0; 4]));
        let next = func_addr + (at + 6) as u64;
        let target = next.wrapping_add(disp as i64 as u64);
        if rex && code[i] & 0x08 != 0 {
            words64.push(target);
        } else {
            words32.push(target);
        }
        i = at + 6;
    }
    (words32, words64)
}

#[cfg(test)]
#[path = "pymalloc_tests.rs"]
mod tests;
