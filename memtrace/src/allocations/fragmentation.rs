//! Allocator mode, diagnosis step for one process at its end: does its
//! allocator hold memory the program freed (fragmentation), rather than
//! the program holding its objects (a leak)? The sampled live bytes at the
//! end are compared with the anonymous RSS the process gained while traced
//! and still holds (kernel `rss_stat` counters, as `RssAnon` in
//! /proc/PID/status); the freed bytes say which allocator keeps the
//! difference.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Blocks up to this size, allocated through CPython's allocator API
/// (`PyObject_*`, `PyMem_*`) while pymalloc is on, live in pymalloc's
/// pools (`SMALL_REQUEST_THRESHOLD` in Objects/obmalloc.c, 512 since 3.8);
/// larger ones, and every block of glibc's `malloc` called directly, in
/// glibc's heap and arenas.
pub const PYMALLOC_MAX_BYTES: u64 = 512;

/// Retained anonymous RSS minus live bytes, in bytes, from which a gap is
/// worth a note: the same floor as the inlined-allocator check, well above
/// the few MiB an interpreter's own caches and free lists keep.
pub const FRAGMENTATION_MIN_GAP_BYTES: u64 = 32 << 20;

/// Live bytes below this fraction of the retained anonymous RSS (and the
/// peak's live bytes at least this fraction of it, so the RSS was once the
/// program's objects, not memory the hooks never saw) make the gap the
/// allocator's: at most half of what the process holds is its objects.
pub const FRAGMENTATION_LIVE_FRACTION: f64 = 0.5;

/// Which allocator keeps the freed memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "allocator", rename_all = "snake_case")]
pub enum FragmentationKind {
    /// Most freed bytes were pymalloc-sized: pymalloc gives an arena back
    /// to the system only once every pool in it is empty, so a few
    /// surviving objects pin whole arenas.
    PymallocArenas,
    /// Most freed bytes were glibc blocks allocated by several threads:
    /// glibc gives each thread its own arena (up to 8 per core) and trims
    /// only the top of each.
    GlibcThreadArenas {
        /// Threads that allocated the freed glibc blocks.
        threads: u64,
    },
    /// Most freed bytes were glibc blocks of one thread: free chunks below
    /// the top of the heap are not given back until `malloc_trim`.
    GlibcHeap,
}

/// The allocator holds freed memory: the numbers behind the note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragmentation {
    /// Which allocator, and why.
    #[serde(flatten)]
    pub kind: FragmentationKind,
    /// Anonymous RSS at the end (when its exit began, or the trace's last
    /// counter reading), in bytes.
    pub rss_anon_end_bytes: u64,
    /// Anonymous RSS gained while traced and still resident at the end:
    /// end minus first reading, in bytes.
    pub rss_anon_retained_bytes: u64,
    /// Sampled live bytes at the end (the process's `leaked_bytes`).
    pub live_bytes: u64,
    /// `rss_anon_retained_bytes - live_bytes`: held by the allocator, free.
    pub held_free_bytes: u64,
    /// Bytes freed in pymalloc-sized blocks.
    pub freed_pymalloc_bytes: u64,
    /// Bytes freed in glibc blocks.
    pub freed_glibc_bytes: u64,
}

impl Fragmentation {
    /// One sentence: which allocator holds the memory and what to do.
    pub fn remedy(&self) -> String {
        match &self.kind {
            FragmentationKind::PymallocArenas => "pymalloc arenas pinned by a few surviving \
                 objects each (an arena is returned only when all its pools are empty): keep \
                 long-lived objects apart from bulk temporary ones (create them first, or copy \
                 the survivors), or recycle the process"
                .to_owned(),
            FragmentationKind::GlibcThreadArenas { threads } => format!(
                "glibc per-thread arenas ({threads} threads freed blocks): run with \
                 MALLOC_ARENA_MAX=2, or call malloc_trim(0) after the burst"
            ),
            FragmentationKind::GlibcHeap => "glibc heap holes below its top: call \
                 malloc_trim(0) after the burst (ctypes.CDLL(None).malloc_trim(0)), or lower \
                 M_MMAP_THRESHOLD so large blocks are mmap'd"
                .to_owned(),
        }
    }
}

/// Bytes a process freed, by the allocator that held them.
#[derive(Clone, Debug, Default)]
pub(super) struct FreedBytes {
    pymalloc: f64,
    glibc: f64,
    glibc_threads: HashSet<u32>,
}

impl FreedBytes {
    /// A freed block of `weight_bytes`, pymalloc's or glibc's (allocated by
    /// thread `tid`).
    pub(super) fn add(&mut self, pymalloc: bool, weight_bytes: f64, tid: u32) {
        if pymalloc {
            self.pymalloc += weight_bytes;
        } else {
            self.glibc += weight_bytes;
            self.glibc_threads.insert(tid);
        }
    }
}

/// A process's numbers at its end, in bytes.
pub(super) struct EndState<'a> {
    pub rss_anon_first_bytes: Option<u64>,
    pub rss_anon_end_bytes: Option<u64>,
    /// Sampled live bytes now and at the high-water mark.
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub freed: &'a FreedBytes,
}

/// The fragmentation note of a hooked process, if its numbers call for one
/// (see [`FRAGMENTATION_MIN_GAP_BYTES`], [`FRAGMENTATION_LIVE_FRACTION`]).
pub(super) fn diagnose(end: &EndState<'_>) -> Option<Fragmentation> {
    let rss_anon_end_bytes = end.rss_anon_end_bytes?;
    let retained = rss_anon_end_bytes.saturating_sub(end.rss_anon_first_bytes?);
    let held_free_bytes = retained.saturating_sub(end.live_bytes);
    let half = retained as f64 * FRAGMENTATION_LIVE_FRACTION;
    let freed = &end.freed;
    let freed_total = freed.pymalloc + freed.glibc;
    let fragmented = held_free_bytes >= FRAGMENTATION_MIN_GAP_BYTES
        && (end.live_bytes as f64) < half
        && end.peak_bytes as f64 >= half
        && freed_total >= held_free_bytes as f64 * FRAGMENTATION_LIVE_FRACTION;
    if !fragmented {
        return None;
    }
    let threads = freed.glibc_threads.len() as u64;
    let kind = if freed.pymalloc >= freed_total * 0.5 {
        FragmentationKind::PymallocArenas
    } else if threads >= 2 {
        FragmentationKind::GlibcThreadArenas { threads }
    } else {
        FragmentationKind::GlibcHeap
    };
    Some(Fragmentation {
        kind,
        rss_anon_end_bytes,
        rss_anon_retained_bytes: retained,
        live_bytes: end.live_bytes,
        held_free_bytes,
        freed_pymalloc_bytes: super::round(freed.pymalloc),
        freed_glibc_bytes: super::round(freed.glibc),
    })
}
