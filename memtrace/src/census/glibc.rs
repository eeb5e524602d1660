//! glibc malloc's census (2.36, x86-64; census.md "glibc"): walks the
//! chunks of every heap of every arena, telling in-use from free by the
//! next chunk's `PREV_INUSE` bit, and moves the chunks that look in use
//! but sit in a thread's tcache or an arena's fastbins to the free side.
//!
//! Every header is untrusted (the target runs while it is read): hard
//! checks (size >= 32, 16-aligned, inside the heap, `IS_MMAPPED` never
//! set, `NON_MAIN_ARENA` clear in the main heap) and, on a failure, one
//! fresh read, then a resync to the next 16-aligned address from which
//! three headers in a row pass (within [`RESYNC_BYTES`]); the bytes skipped
//! are unknown, and a free chunk whose footer disagrees is counted. Those
//! counts say how torn a census was.
//!
//! Layouts (malloc/malloc.c, malloc/arena.c): `malloc_state` (2200 B) has
//! `fastbinsY[10]` @16, `top` @96, `bins[254]` @112, `next` @2160,
//! `system_mem` @2184; `heap_info` (48 B) has `ar_ptr` @0, `prev` @8,
//! `size` @16; heaps are [`HEAP_MAX_BYTES`]-aligned; `malloc_par` `mp_` has
//! `mmapped_mem` @80, `sbrk_base` @96, `tcache_bins` @104,
//! `tcache_max_bytes` @112, `tcache_count` @120.

use std::{io, ops::Range};

use serde::{Deserialize, Serialize};

use super::remote::{u64_at, Memory};

/// `HEAP_MAX_SIZE` on 64-bit (2 * `DEFAULT_MMAP_THRESHOLD_MAX`): 64 MiB.
pub const HEAP_MAX_BYTES: u64 = 64 << 20;
/// `sizeof(struct malloc_state)`.
const ARENA_BYTES: u64 = 2200;
/// `MINSIZE` on x86-64.
const MIN_CHUNK_BYTES: u64 = 32;
/// `PREV_INUSE`, `IS_MMAPPED`, `NON_MAIN_ARENA` bits of a chunk's size.
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const NON_MAIN_ARENA: u64 = 4;
/// Farthest a resync looks for three good headers in a row: 4 MiB.
pub const RESYNC_BYTES: u64 = 4 << 20;
/// The tcache struct's chunk size (`tcache_perthread_struct`, 640 B of
/// data: `counts` u16[64] then `entries[64]`).
const TCACHE_CHUNK_BYTES: u64 = 0x290;
/// Most arenas followed through `next` (glibc's cap is 8 per core).
const MAX_ARENAS: usize = 1024;
/// Most fastbin entries followed per bin.
const MAX_FASTBIN_ENTRIES: usize = 4096;

/// Where glibc's state is, in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlibcVars {
    /// Address of `main_arena`.
    pub main_arena: u64,
    /// Address of `mp_`, when found.
    pub mp: Option<u64>,
}

/// One arena's census.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaCensus {
    /// The main arena (the `brk` heap), or a thread arena.
    pub main: bool,
    /// Bytes of the heaps walked.
    pub heap_bytes: u64,
    /// Chunks in use (tcache and fastbin chunks excluded), bytes.
    pub in_use_bytes: u64,
    /// Free chunks, the top chunk, tcache and fastbin chunks, bytes.
    pub free_bytes: u64,
    /// Of `free_bytes`, pages resident (pagemap), bytes; equal to
    /// `free_bytes` when residency was not read.
    pub free_resident_bytes: u64,
    /// Chunks walked.
    pub chunks: u64,
    /// Resyncs after a header failed its checks twice.
    pub resyncs: u64,
    /// Bytes skipped by resyncs (neither in use nor free).
    pub unknown_bytes: u64,
    /// Free chunks whose footer did not repeat their size.
    pub footer_mismatches: u64,
}

/// glibc's state as its bookkeeping tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlibcCensus {
    /// The main arena first, then the thread arenas.
    pub arenas: Vec<ArenaCensus>,
    /// Live chunks of their own mapping (`mp_.mmapped_mem`), bytes.
    pub mmapped_bytes: u64,
}

impl GlibcCensus {
    /// In-use bytes of every arena plus mmapped chunks.
    #[must_use]
    pub fn in_use_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.in_use_bytes).sum::<u64>() + self.mmapped_bytes
    }

    /// Free bytes resident in every arena.
    #[must_use]
    pub fn free_resident_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.free_resident_bytes).sum()
    }

    /// Free resident bytes in thread arenas only.
    #[must_use]
    pub fn thread_arena_free_resident_bytes(&self) -> u64 {
        self.arenas
            .iter()
            .filter(|a| !a.main)
            .map(|a| a.free_resident_bytes)
            .sum()
    }
}

/// Says which pages of a range are resident (a process's pagemap, or
/// nothing for an image).
pub trait Residency {
    /// Resident bytes of the whole pages inside `range`; `None` when
    /// unknown.
    fn resident_bytes(&mut self, range: Range<u64>) -> Option<u64>;
}

/// Offsets in `data` (a libc's writable data at address `base`) where
/// `main_arena` may be: a small `mutex`, a 16-aligned `top`, `next` set,
/// `system_mem` <= `max_system_mem`, and at least half of the 127 bins
/// empty, which glibc marks by pointing the bin at itself.
#[must_use]
pub fn find_main_arena(data: &[u8], base: u64) -> Vec<u64> {
    let mut hits = Vec::new();
    let mut offset = (base.wrapping_neg() % 8) as usize;
    while offset + ARENA_BYTES as usize <= data.len() {
        let state = &data[offset..offset + ARENA_BYTES as usize];
        if is_arena(state, base + offset as u64, base..base + data.len() as u64) {
            hits.push(base + offset as u64);
        }
        offset += 8;
    }
    hits
}

/// One candidate of [`find_main_arena`] at `addr`, in libc's data `own`:
/// `top` lies outside it (in a heap), `next` is the arena itself or outside
/// it, `system_mem` is whole pages (a candidate shifted by a few bins would
/// see bins pointing at themselves too).
fn is_arena(state: &[u8], addr: u64, own: Range<u64>) -> bool {
    let mutex = u64_at(state, 0) & 0xffff_ffff;
    let top = u64_at(state, 96);
    let next = u64_at(state, 2160);
    let system_mem = u64_at(state, 2184);
    if mutex > 2 || top == 0 || !top.is_multiple_of(16) || own.contains(&top) {
        return false;
    }
    if next == 0 || (next != addr && own.contains(&next)) {
        return false;
    }
    if system_mem == 0 || !system_mem.is_multiple_of(4096) || system_mem > u64_at(state, 2192) {
        return false;
    }
    let empty = (0..127)
        .filter(|i| {
            let own = addr + 96 + 16 * i;
            u64_at(state, 112 + 16 * *i as usize) == own
                && u64_at(state, 120 + 16 * *i as usize) == own
        })
        .count();
    empty >= 64
}

/// Offsets in `data` where `mp_` may be: 64 tcache bins of at most 1032
/// B, a count of 1..=65535, and `sbrk_base` inside `heap`.
#[must_use]
pub fn find_mp(data: &[u8], base: u64, heap: &Range<u64>) -> Vec<u64> {
    let mut hits = Vec::new();
    let mut offset = (base.wrapping_neg() % 8) as usize;
    while offset + 136 <= data.len() {
        let mp = &data[offset..offset + 136];
        let count = u64_at(mp, 120);
        if u64_at(mp, 104) == 64
            && u64_at(mp, 112) == 1032
            && (1..=65535).contains(&count)
            && heap.contains(&u64_at(mp, 96))
        {
            hits.push(base + offset as u64);
        }
        offset += 8;
    }
    hits
}

/// Takes glibc's census: the main arena's heap is `main_heap` (the
/// `[heap]` mapping); thread arenas are found through `next`. A walk stops
/// once `memory` has read `max_read_bytes` (the rest of that heap is
/// unknown bytes).
///
/// # Errors
/// `main_arena` cannot be read.
pub fn census(
    memory: &mut dyn Memory,
    residency: &mut dyn Residency,
    vars: GlibcVars,
    main_heap: Option<Range<u64>>,
    max_read_bytes: u64,
) -> io::Result<GlibcCensus> {
    let mut out = GlibcCensus::default();
    if let Some(mp) = vars.mp {
        let mut word = [0u8; 8];
        if memory.read(mp + 80, &mut word).is_ok() {
            out.mmapped_bytes = u64::from_le_bytes(word);
        }
    }
    let mut arena_addr = vars.main_arena;
    for _ in 0..MAX_ARENAS {
        let mut state = vec![0u8; ARENA_BYTES as usize];
        memory.read(arena_addr, &mut state)?;
        let main = arena_addr == vars.main_arena;
        let heaps = if main {
            main_heap.clone().into_iter().collect()
        } else {
            thread_heaps(memory, arena_addr, u64_at(&state, 96))
        };
        let mut arena = ArenaCensus {
            main,
            ..ArenaCensus::default()
        };
        for heap in heaps {
            let walk = Walk::new(main, heap.clone(), max_read_bytes);
            walk.run(memory, residency, &mut arena);
        }
        move_fastbins(memory, &state, &mut arena);
        out.arenas.push(arena);
        arena_addr = u64_at(&state, 2160);
        if arena_addr == vars.main_arena || arena_addr == 0 {
            break;
        }
    }
    Ok(out)
}

/// The chunk ranges of a thread arena at `arena_addr` whose top chunk is
/// `top`: the heap holding `top`, then each `prev` (a heap's chunks start
/// after its `heap_info`, and after the arena itself in its first heap).
fn thread_heaps(memory: &mut dyn Memory, arena_addr: u64, top: u64) -> Vec<Range<u64>> {
    let mut heaps = Vec::new();
    let mut heap = top & !(HEAP_MAX_BYTES - 1);
    while heap != 0 && heaps.len() < 64 {
        let mut info = [0u8; 48];
        if memory.read(heap, &mut info).is_err() || u64_at(&info, 0) != arena_addr {
            break;
        }
        let size = u64_at(&info, 16).min(HEAP_MAX_BYTES);
        let first = if heap + 48 == arena_addr {
            (arena_addr + ARENA_BYTES).next_multiple_of(16)
        } else {
            heap + 48
        };
        heaps.push(first..heap + size);
        heap = u64_at(&info, 8);
    }
    heaps
}

/// Moves the chunks in `state`'s fastbins from in use to free (each list
/// head is plain; each `fd` is safe-linked: `(&fd >> 12) ^ next`).
fn move_fastbins(memory: &mut dyn Memory, state: &[u8], arena: &mut ArenaCensus) {
    for bin in 0..10u64 {
        let size = MIN_CHUNK_BYTES + 16 * bin;
        let mut chunk = u64_at(state, 16 + 8 * bin as usize);
        for _ in 0..MAX_FASTBIN_ENTRIES {
            let mut header = [0u8; 16];
            if chunk == 0
                || !chunk.is_multiple_of(16)
                || memory.read(chunk + 8, &mut header).is_err()
            {
                break;
            }
            if u64_at(&header, 0) & !7 != size {
                break;
            }
            let moved = size.min(arena.in_use_bytes);
            arena.in_use_bytes -= moved;
            arena.free_bytes += moved;
            arena.free_resident_bytes += moved;
            chunk = u64_at(&header, 8) ^ ((chunk + 16) >> 12);
        }
    }
}

/// One heap's chunk walk, reading a page window at a time.
struct Walk {
    main: bool,
    max_read_bytes: u64,
    heap: Range<u64>,
    window: Vec<u8>,
    window_at: u64,
}

/// Bytes of a read window: the page of a header, and the next when the
/// header crosses it (never further, so no untouched page is read).
const PAGE_BYTES: u64 = 4096;

impl Walk {
    fn new(main: bool, heap: Range<u64>, max_read_bytes: u64) -> Self {
        Self {
            main,
            max_read_bytes,
            heap,
            window: Vec::new(),
            window_at: 0,
        }
    }

    /// The 16 bytes at `addr` (`prev_size`, `size`), from the window, read
    /// afresh when `fresh`.
    fn header(&mut self, memory: &mut dyn Memory, addr: u64, fresh: bool) -> Option<(u64, u64)> {
        let inside =
            addr >= self.window_at && addr + 16 <= self.window_at + self.window.len() as u64;
        if fresh || !inside {
            let end = (addr + 16).next_multiple_of(PAGE_BYTES).min(self.heap.end);
            if end < addr + 16 {
                return None;
            }
            self.window = vec![0; (end - addr) as usize];
            memory.read(addr, &mut self.window).ok()?;
            self.window_at = addr;
        }
        let at = (addr - self.window_at) as usize;
        Some((u64_at(&self.window, at), u64_at(&self.window, at + 8)))
    }

    /// The size of the chunk at `addr` when its header passes the hard
    /// checks.
    fn checked_size(&mut self, memory: &mut dyn Memory, addr: u64, fresh: bool) -> Option<u64> {
        let (_, raw) = self.header(memory, addr, fresh)?;
        let size = raw & !7;
        let ok = size >= MIN_CHUNK_BYTES
            && size % 16 == 0
            && addr
                .checked_add(size)
                .is_some_and(|end| end <= self.heap.end)
            && raw & IS_MMAPPED == 0
            && !(self.main && raw & NON_MAIN_ARENA != 0);
        ok.then_some(size)
    }

    /// Walks the heap into `arena`.
    fn run(
        mut self,
        memory: &mut dyn Memory,
        residency: &mut dyn Residency,
        arena: &mut ArenaCensus,
    ) {
        arena.heap_bytes += self.heap.end - self.heap.start;
        let mut addr = self.heap.start;
        while addr + MIN_CHUNK_BYTES <= self.heap.end {
            if memory.bytes_read() > self.max_read_bytes {
                arena.unknown_bytes += self.heap.end - addr;
                return;
            }
            let size = match self
                .checked_size(memory, addr, false)
                .or_else(|| self.checked_size(memory, addr, true))
            {
                Some(size) => size,
                None => match self.resync(memory, addr) {
                    Some(next) => {
                        arena.resyncs += 1;
                        arena.unknown_bytes += next - addr;
                        addr = next;
                        continue;
                    }
                    None => {
                        arena.resyncs += 1;
                        arena.unknown_bytes += self.heap.end - addr;
                        return;
                    }
                },
            };
            arena.chunks += 1;
            let next = addr + size;
            if next + 16 > self.heap.end {
                // The top chunk: it ends the heap.
                self.add_free(residency, arena, addr, size);
                return;
            }
            let Some((prev_size, next_raw)) = self.header(memory, next, false) else {
                arena.unknown_bytes += size;
                addr = next;
                continue;
            };
            if next_raw & PREV_INUSE == 0 {
                if prev_size != size {
                    arena.footer_mismatches += 1;
                }
                self.add_free(residency, arena, addr, size);
            } else {
                arena.in_use_bytes += size;
                if size == TCACHE_CHUNK_BYTES {
                    self.move_tcache(memory, arena, addr);
                }
            }
            addr = next;
        }
    }

    /// Counts a free chunk, with its resident pages.
    fn add_free(
        &mut self,
        residency: &mut dyn Residency,
        arena: &mut ArenaCensus,
        addr: u64,
        size: u64,
    ) {
        arena.free_bytes += size;
        // Pages wholly inside the chunk may be untouched or given back; the
        // partial pages at its ends hold its header or a neighbour.
        let inner = addr.next_multiple_of(PAGE_BYTES)..(addr + size) / PAGE_BYTES * PAGE_BYTES;
        let inner_bytes = inner.end.saturating_sub(inner.start);
        let resident = if inner_bytes == 0 {
            0
        } else {
            residency.resident_bytes(inner).unwrap_or(inner_bytes)
        };
        arena.free_resident_bytes += size - inner_bytes + resident;
    }

    /// When the in-use chunk at `addr` is a thread's tcache (its counts of
    /// at most 65535 each, an entry set exactly where a count is), moves
    /// the chunks it counts (bin `i` holds chunks of 32 + 16 i B) to free.
    fn move_tcache(&mut self, memory: &mut dyn Memory, arena: &mut ArenaCensus, addr: u64) {
        let mut data = vec![0u8; 640];
        if memory.read(addr + 16, &mut data).is_err() {
            return;
        }
        let counts: Vec<u64> = (0..64)
            .map(|i| u64::from(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])))
            .collect();
        let entries: Vec<u64> = (0..64).map(|i| u64_at(&data, 128 + 8 * i)).collect();
        let consistent = counts
            .iter()
            .zip(&entries)
            .all(|(&c, &e)| (c == 0) == (e == 0) && (e == 0 || e % 16 == 0));
        if !consistent {
            return;
        }
        let bytes: u64 = counts
            .iter()
            .enumerate()
            .map(|(i, c)| c * (32 + 16 * i as u64))
            .sum();
        let moved = bytes.min(arena.in_use_bytes);
        arena.in_use_bytes -= moved;
        arena.free_bytes += moved;
        arena.free_resident_bytes += moved;
    }

    /// The next 16-aligned address after `addr` (within [`RESYNC_BYTES`])
    /// from which three headers in a row pass the hard checks.
    fn resync(&mut self, memory: &mut dyn Memory, addr: u64) -> Option<u64> {
        let limit = (addr + RESYNC_BYTES).min(self.heap.end);
        let mut candidate = addr + 16;
        while candidate + MIN_CHUNK_BYTES <= limit {
            if self.three_good(memory, candidate) {
                return Some(candidate);
            }
            candidate += 16;
        }
        None
    }

    /// Three valid headers from `addr` on (or fewer, ending at the heap's
    /// end).
    fn three_good(&mut self, memory: &mut dyn Memory, mut addr: u64) -> bool {
        for _ in 0..3 {
            let Some(size) = self.checked_size(memory, addr, false) else {
                return false;
            };
            addr += size;
            if addr + 16 > self.heap.end {
                return true;
            }
        }
        true
    }
}

#[cfg(test)]
#[path = "glibc_tests.rs"]
mod tests;
