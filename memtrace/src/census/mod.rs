//! Step 4b of the data flow, beside `python`: the allocators' own
//! bookkeeping, read from outside a traced process while it runs (never
//! paused), so the verdict can tell live objects from memory an allocator
//! keeps after the program freed it, in the default mode and at no cost to
//! the target but the reads. `pymalloc` walks CPython's arena array and
//! pool headers; `glibc` walks malloc's heaps and arenas; `binary` finds
//! their state in the mapped files; `remote` reads (`process_vm_readv`)
//! and counts the bytes read. Method and measured accuracy:
//! shared/notes/census.md. A free-threaded CPython (3.13t) allocates its
//! objects with mimalloc, not pymalloc: its heaps are not read, and the
//! census says so ([`Census::mimalloc`]).
//!
//! Cost, bounded: a census reads headers only (48 B per pymalloc pool, a
//! page window per glibc chunk header) and stops a heap's walk past
//! [`MAX_READ_BYTES`]; locating the state reads each binary's writable
//! segment once per process (1.3-2 MiB for libpython, 80 KiB for libc).
//! Torn reads (the target writes while it is read) are counted, never
//! guessed: invalid pool headers, glibc resyncs and unknown bytes.

mod binary;
pub mod glibc;
pub mod pymalloc;
pub mod remote;

#[cfg(test)]
mod live_tests;

use std::{collections::HashMap, ops::Range, time::Instant};

use procfs::process::{MMapPath, MemoryMap};
use serde::{Deserialize, Serialize};

use crate::python::PythonProcess;
use binary::MappedBinary;
use glibc::{GlibcCensus, GlibcVars, Residency};
use pymalloc::{ArenaVars, PymallocCensus};
use remote::Memory;

/// Most bytes one census reads from the target (headers and windows):
/// 64 MiB, about 20 GiB of pymalloc arenas or a dense multi-GiB glibc heap.
pub const MAX_READ_BYTES: u64 = 64 << 20;

/// The allocators' state of one process at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Census {
    /// When it was taken (CLOCK_MONOTONIC, the records' clock), ns.
    pub taken_ns: u64,
    /// pymalloc's arenas; `None` when the process runs no CPython memtrace
    /// can read, or its arena state was not found.
    pub pymalloc: Option<PymallocCensus>,
    /// The process runs a free-threaded CPython, whose objects live in
    /// mimalloc's heaps: not read (no pymalloc arenas to read either), so
    /// [`Self::live_bytes`] counts glibc's chunks only.
    #[serde(default)]
    pub mimalloc: bool,
    /// glibc's heaps; `None` when no glibc 2.26+ malloc state was found.
    pub glibc: Option<GlibcCensus>,
    /// Bytes read from the target for this census.
    pub read_bytes: u64,
    /// Wall time the census took, ns.
    pub elapsed_ns: u64,
}

impl Census {
    /// Bytes in live allocations: pymalloc's live blocks plus glibc's
    /// chunks in use (pymalloc's arenas are mmapped, not in glibc's heap).
    #[must_use]
    pub fn live_bytes(&self) -> u64 {
        self.pymalloc.as_ref().map_or(0, |p| p.live_bytes)
            + self.glibc.as_ref().map_or(0, GlibcCensus::in_use_bytes)
    }

    /// Freed memory the allocators keep resident: pymalloc's free blocks
    /// and empty pools, glibc's resident free chunks.
    #[must_use]
    pub fn held_free_bytes(&self) -> u64 {
        self.pymalloc_free_bytes() + self.glibc_free_bytes()
    }

    /// pymalloc's share of [`Self::held_free_bytes`].
    #[must_use]
    pub fn pymalloc_free_bytes(&self) -> u64 {
        self.pymalloc.as_ref().map_or(0, PymallocCensus::free_bytes)
    }

    /// glibc's share of [`Self::held_free_bytes`].
    #[must_use]
    pub fn glibc_free_bytes(&self) -> u64 {
        self.glibc
            .as_ref()
            .map_or(0, GlibcCensus::free_resident_bytes)
    }
}

/// Why a census could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum CensusError {
    /// /proc/PID/maps could not be read (the process is gone).
    #[error("cannot read the memory map of process {tgid}: {source}")]
    Maps {
        /// The process.
        tgid: u32,
        /// procfs's error.
        #[source]
        source: procfs::ProcError,
    },
    /// Neither allocator's state was found.
    #[error("process {tgid}: neither pymalloc's nor glibc's state was found")]
    NotFound {
        /// The process.
        tgid: u32,
    },
}

/// Where each allocator's state is in one process, found once.
#[derive(Clone, Copy, Debug, Default)]
struct Located {
    pymalloc: Option<ArenaVars>,
    glibc: Option<GlibcVars>,
}

/// Takes censuses, remembering where each process keeps its allocators'
/// state (found once per process image: keyed by tgid and the binary).
#[derive(Debug, Default)]
pub struct Censuses {
    located: HashMap<u32, Located>,
}

impl Censuses {
    /// Forgets process `tgid` (it exited or exec'd).
    pub fn forget(&mut self, tgid: u32) {
        self.located.remove(&tgid);
    }

    /// Takes the census of process `tgid` (through thread `reader`, a live
    /// thread of it), whose CPython is `python` when it runs one; `now_ns`
    /// stamps it.
    ///
    /// # Errors
    /// [`CensusError`] when the process is gone or neither allocator is
    /// found.
    pub fn take(
        &mut self,
        tgid: u32,
        reader: u32,
        python: Option<&PythonProcess>,
        now_ns: u64,
    ) -> Result<Census, CensusError> {
        let started = Instant::now();
        let maps: Vec<MemoryMap> = procfs::process::Process::new(reader as i32)
            .and_then(|p| p.maps())
            .map_err(|source| CensusError::Maps { tgid, source })?
            .into_iter()
            .collect();
        let mut memory = remote::Process::new(reader);
        let heap = maps
            .iter()
            .find(|m| m.pathname == MMapPath::Heap)
            .map(|m| m.address.0..m.address.1);
        let located = match self.located.get(&tgid) {
            Some(found) => *found,
            None => {
                let found = locate(&mut memory, reader, &maps, python, heap.as_ref());
                self.located.insert(tgid, found);
                found
            }
        };
        let pymalloc = located
            .pymalloc
            .and_then(|vars| pymalloc::census(&mut memory, vars).ok());
        let mut residency = Pagemap::open(reader);
        let glibc = located.glibc.and_then(|vars| {
            glibc::census(&mut memory, &mut residency, vars, heap, MAX_READ_BYTES).ok()
        });
        if pymalloc.is_none() && glibc.is_none() {
            return Err(CensusError::NotFound { tgid });
        }
        Ok(Census {
            taken_ns: now_ns,
            pymalloc,
            mimalloc: python.is_some_and(|py| py.free_threaded),
            glibc,
            read_bytes: memory.bytes_read() + residency.bytes_read,
            elapsed_ns: started.elapsed().as_nanos() as u64,
        })
    }
}

/// Finds both allocators' state in a process.
fn locate(
    memory: &mut dyn Memory,
    tgid: u32,
    maps: &[MemoryMap],
    python: Option<&PythonProcess>,
    heap: Option<&Range<u64>>,
) -> Located {
    let pymalloc = python.and_then(|py| locate_pymalloc(memory, tgid, maps, py));
    let libc = MappedBinary::find(
        tgid,
        maps,
        |p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        },
        &[],
    );
    let glibc = libc.and_then(|libc| {
        let data = read_writable(memory, &libc)?;
        let base = libc.writable_in_process().start;
        let [main_arena] = glibc::find_main_arena(&data, base)[..] else {
            return None;
        };
        let mp = heap.and_then(|heap| match glibc::find_mp(&data, base, heap)[..] {
            [mp] => Some(mp),
            _ => None,
        });
        Some(GlibcVars { main_arena, mp })
    });
    Located { pymalloc, glibc }
}

/// pymalloc's arena variables in `py`'s binary: 3.12+ by the `mgmt`
/// signature in its writable segment (one hit only), 3.11 by the loads of
/// `_Py_GetAllocatedBlocks`, checked by reading the array.
fn locate_pymalloc(
    memory: &mut dyn Memory,
    tgid: u32,
    maps: &[MemoryMap],
    py: &PythonProcess,
) -> Option<ArenaVars> {
    if py.free_threaded {
        return None; // mimalloc's heaps, no pymalloc arenas
    }
    let binary = MappedBinary::find(tgid, maps, |p| p == py.binary, &["_Py_GetAllocatedBlocks"])?;
    if (py.version.major, py.version.minor) >= (3, 12) {
        let data = read_writable(memory, &binary)?;
        let hits = pymalloc::find_mgmt(&data, binary.writable_in_process().start);
        return match hits[..] {
            [mgmt] => Some(pymalloc::vars_of_mgmt(mgmt)),
            _ => None,
        };
    }
    if (py.version.major, py.version.minor) < (3, 10) {
        return None;
    }
    let (func, code) = binary.function("_Py_GetAllocatedBlocks")?;
    let (words32, words64) = pymalloc::loads_of_allocated_blocks(func, code);
    words32.iter().find_map(|&max| {
        words64.iter().find_map(|&arenas| {
            let vars = ArenaVars {
                arenas_addr: arenas.wrapping_add(binary.bias),
                maxarenas_addr: max.wrapping_add(binary.bias),
            };
            pymalloc::census(memory, vars)
                .ok()
                .filter(|c| c.arenas > 0 && c.invalid_pools * 10 <= c.carved_pools)
                .map(|_| vars)
        })
    })
}

/// The writable segment (data and bss) of `binary` in the process.
fn read_writable(memory: &mut dyn Memory, binary: &MappedBinary) -> Option<Vec<u8>> {
    let range = binary.writable_in_process();
    let mut data = vec![0u8; usize::try_from(range.end - range.start).ok()?.min(8 << 20)];
    memory.read(range.start, &mut data).ok()?;
    Some(data)
}

/// /proc/PID/pagemap: bit 63 of each page's entry is "present" (readable
/// without CAP_SYS_ADMIN; Documentation/admin-guide/mm/pagemap.rst).
struct Pagemap {
    file: Option<std::fs::File>,
    bytes_read: u64,
}

impl Pagemap {
    fn open(pid: u32) -> Self {
        Self {
            file: std::fs::File::open(format!("/proc/{pid}/pagemap")).ok(),
            bytes_read: 0,
        }
    }
}

impl Residency for Pagemap {
    fn resident_bytes(&mut self, range: Range<u64>) -> Option<u64> {
        use std::os::unix::fs::FileExt as _;
        let file = self.file.as_ref()?;
        let pages = (range.end - range.start) / 4096;
        let mut entries = vec![0u8; usize::try_from(pages).ok()? * 8];
        file.read_exact_at(&mut entries, range.start / 4096 * 8)
            .ok()?;
        self.bytes_read += entries.len() as u64;
        let present = entries
            .chunks(8)
            .filter(|e| remote::u64_at(e, 0) >> 63 == 1)
            .count() as u64;
        Some(present * 4096)
    }
}

/// A census with the anonymous RSS read right after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    /// The allocators' state.
    pub census: Census,
    /// `RssAnon` of /proc/PID/status right after it, bytes.
    pub rss_anon_bytes: u64,
}

/// The censuses of one process image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageCensus {
    /// The image (the report's process row).
    pub process: crate::process::ProcessId,
    /// Its tgid.
    pub tgid: u32,
    /// The last census before its end began (its exit, its interpreter's
    /// finalization, or an exec).
    pub latest: Option<Reading>,
    /// The census taken at its highest anonymous RSS (the high-water mark,
    /// as far as censuses saw it).
    pub at_peak: Option<Reading>,
    /// Censuses taken.
    pub taken: u64,
    /// Bytes read from it over all its censuses.
    pub read_bytes: u64,
    /// Longest census, ns.
    pub max_elapsed_ns: u64,
}

impl ImageCensus {
    /// An image with no census yet.
    #[must_use]
    pub fn new(process: crate::process::ProcessId, tgid: u32) -> Self {
        Self {
            process,
            tgid,
            latest: None,
            at_peak: None,
            taken: 0,
            read_bytes: 0,
            max_elapsed_ns: 0,
        }
    }

    /// Adds a census read at anonymous RSS `rss_anon_bytes`.
    pub fn add(&mut self, census: Census, rss_anon_bytes: u64) {
        self.taken += 1;
        self.read_bytes += census.read_bytes;
        self.max_elapsed_ns = self.max_elapsed_ns.max(census.elapsed_ns);
        let reading = Reading {
            census,
            rss_anon_bytes,
        };
        if self
            .at_peak
            .as_ref()
            .is_none_or(|peak| rss_anon_bytes >= peak.rss_anon_bytes)
        {
            self.at_peak = Some(reading.clone());
        }
        self.latest = Some(reading);
    }
}

/// Every image's censuses, for the verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CensusReport {
    /// Images with at least one census.
    pub images: Vec<ImageCensus>,
}

impl CensusReport {
    /// The censuses of image `process`.
    #[must_use]
    pub fn image(&self, process: crate::process::ProcessId) -> Option<&ImageCensus> {
        self.images.iter().find(|i| i.process == process)
    }
}
