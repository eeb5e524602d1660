//! Allocator mode, userspace half of the kernel side: finds the allocator
//! entry points of one traced process (CPython's allocator API in its
//! executable or libpython, glibc's `malloc` family in its libc), attaches
//! the `memtrace-ebpf` `alloc_*` uprobes and the `alloc_return` uretprobe
//! to them for that process only, and fills the exponential draws the
//! kernel side samples with.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    UProbe,
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The uretprobe attached at every allocating entry point (not the frees).
pub const RETURN_PROGRAM: &str = "alloc_return";

/// The entry uprobe programs of `memtrace-ebpf/src/probes/alloc.rs`.
pub const ENTRY_PROGRAMS: [&str; 6] = [
    "alloc_malloc",
    "alloc_calloc",
    "alloc_realloc",
    "alloc_aligned_alloc",
    "alloc_posix_memalign",
    "alloc_free",
];

/// The program that needs no uretprobe (a free returns nothing to record).
const FREE_PROGRAM: &str = "alloc_free";

/// CPython's allocator API (Objects/obmalloc.c; exported since 3.4): symbol
/// and entry program, by argument layout.
pub const PYTHON_HOOKS: [(&str, &str); 12] = [
    ("PyObject_Malloc", "alloc_malloc"),
    ("PyObject_Calloc", "alloc_calloc"),
    ("PyObject_Realloc", "alloc_realloc"),
    ("PyObject_Free", "alloc_free"),
    ("PyMem_Malloc", "alloc_malloc"),
    ("PyMem_Calloc", "alloc_calloc"),
    ("PyMem_Realloc", "alloc_realloc"),
    ("PyMem_Free", "alloc_free"),
    ("PyMem_RawMalloc", "alloc_malloc"),
    ("PyMem_RawCalloc", "alloc_calloc"),
    ("PyMem_RawRealloc", "alloc_realloc"),
    ("PyMem_RawFree", "alloc_free"),
];

/// glibc's allocator (malloc/malloc.c): symbol and entry program.
pub const LIBC_HOOKS: [(&str, &str); 6] = [
    ("malloc", "alloc_malloc"),
    ("calloc", "alloc_calloc"),
    ("realloc", "alloc_realloc"),
    ("aligned_alloc", "alloc_aligned_alloc"),
    ("posix_memalign", "alloc_posix_memalign"),
    ("free", "alloc_free"),
];

/// Errors of attaching the allocator probes of one process.
#[derive(Debug, thiserror::Error)]
pub enum AllocAttachError {
    /// The binary could not be opened or parsed as ELF.
    #[error("cannot read the symbols of `{}`: {detail}", path.display())]
    Symbols {
        /// The binary.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The binary defines none of the allocator symbols.
    #[error("`{}` defines none of {symbols}", path.display())]
    NoSymbols {
        /// The binary.
        path: PathBuf,
        /// The symbols looked for.
        symbols: String,
    },
    /// No binary was given to hook.
    #[error("process {tgid} maps no binary with allocator symbols")]
    NoBinary {
        /// The process.
        tgid: u32,
    },
    /// A program is missing from the object.
    #[error("eBPF program `{program}` is missing from the object")]
    ProgramMissing {
        /// The program.
        program: &'static str,
    },
    /// The kernel refused an attach.
    #[error("cannot attach `{program}` to `{symbol}` in `{}` for process {tgid}", path.display())]
    Attach {
        /// The program.
        program: &'static str,
        /// The symbol.
        symbol: &'static str,
        /// The binary.
        path: PathBuf,
        /// The process.
        tgid: u32,
        /// aya's error (boxed: it is large).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
}

/// The file offsets of a binary's allocator symbols, by symbol, read once
/// per binary.
#[derive(Default)]
pub struct SymbolOffsets {
    by_binary: HashMap<PathBuf, HashMap<&'static str, u64>>,
}

impl SymbolOffsets {
    /// File offsets in `path` of the defined function symbols among `hooks`
    /// (`.dynsym`, then `.symtab`), each offset once (an alias of an
    /// earlier hook's address, e.g. glibc's `aligned_alloc` = `memalign`, is
    /// left out so no block is seen twice).
    ///
    /// # Errors
    /// [`AllocAttachError::Symbols`] when `path` cannot be read.
    pub fn resolve(
        &mut self,
        path: &Path,
        hooks: &[(&'static str, &'static str)],
    ) -> Result<&HashMap<&'static str, u64>, AllocAttachError> {
        if !self.by_binary.contains_key(path) {
            let offsets = read_offsets(path, hooks)?;
            self.by_binary.insert(path.to_owned(), offsets);
        }
        Ok(&self.by_binary[path])
    }
}

/// See [`SymbolOffsets::resolve`].
fn read_offsets(
    path: &Path,
    hooks: &[(&'static str, &'static str)],
) -> Result<HashMap<&'static str, u64>, AllocAttachError> {
    let symbols_error = |detail: String| AllocAttachError::Symbols {
        path: path.to_owned(),
        detail,
    };
    let file = File::open(path).map_err(|e| symbols_error(e.to_string()))?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| symbols_error(e.to_string()))?;
    let mut addresses: HashMap<&str, (u64, u64)> = HashMap::new();
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() || symbol.kind() != object::SymbolKind::Text {
            continue;
        }
        let (Ok(name), Some(index)) = (symbol.name(), symbol.section_index()) else {
            continue;
        };
        let Some(&(hook, _)) = hooks.iter().find(|(hook, _)| *hook == name) else {
            continue;
        };
        if addresses.contains_key(hook) {
            continue;
        }
        let Ok(section) = elf.section_by_index(index) else {
            continue;
        };
        let Some((file_offset, _)) = section.file_range() else {
            continue;
        };
        let offset = symbol.address() - section.address() + file_offset;
        addresses.insert(hook, (offset, symbol.address()));
    }
    let mut seen = HashSet::new();
    let mut offsets = HashMap::new();
    for &(hook, _) in hooks {
        if let Some(&(offset, _)) = addresses.get(hook) {
            if seen.insert(offset) {
                offsets.insert(hook, offset);
            }
        }
    }
    Ok(offsets)
}

/// One attached probe: its program and link.
pub struct AllocLink {
    /// The program the link belongs to.
    pub program: &'static str,
    /// aya's link id (detach with the program).
    pub link: UProbeLinkId,
}

/// Which probes [`attach_binary`] attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// [`RETURN_PROGRAM`] at every allocating entry point. Attached first:
    /// a call whose entry is seen must have its return seen too (a call
    /// entered between the two attaches would leave its thread's depth
    /// counted up).
    Returns,
    /// The entry program of every hook.
    Entries,
}

/// The symbols of `hooks` found in `offsets`, or
/// [`AllocAttachError::NoSymbols`] naming `path`.
///
/// # Errors
/// [`AllocAttachError::NoSymbols`] when `offsets` holds none of `hooks`.
pub fn check_symbols(
    path: &Path,
    hooks: &[(&'static str, &'static str)],
    offsets: &HashMap<&'static str, u64>,
) -> Result<(), AllocAttachError> {
    if offsets.is_empty() {
        let symbols = hooks.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ");
        return Err(AllocAttachError::NoSymbols {
            path: path.to_owned(),
            symbols,
        });
    }
    Ok(())
}

/// Attaches `phase`'s probes of `hooks` found at `offsets` in `path` for
/// process `tgid` only, adding their links to `links` (the caller detaches
/// them all on error).
///
/// # Errors
/// [`AllocAttachError::ProgramMissing`], [`AllocAttachError::Attach`].
pub fn attach_binary(
    ebpf: &mut aya::Ebpf,
    tgid: NonZeroU32,
    target: (&Path, &[(&'static str, &'static str)]),
    offsets: &HashMap<&'static str, u64>,
    phase: Phase,
    links: &mut Vec<AllocLink>,
) -> Result<(), AllocAttachError> {
    let (path, hooks) = target;
    for &(symbol, program) in hooks {
        let Some(&offset) = offsets.get(symbol) else {
            continue;
        };
        let program = match phase {
            Phase::Returns if program == FREE_PROGRAM => continue,
            Phase::Returns => RETURN_PROGRAM,
            Phase::Entries => program,
        };
        links.push(attach_one(ebpf, program, symbol, offset, path, tgid)?);
    }
    Ok(())
}

fn attach_one(
    ebpf: &mut aya::Ebpf,
    program: &'static str,
    symbol: &'static str,
    offset: u64,
    path: &Path,
    tgid: NonZeroU32,
) -> Result<AllocLink, AllocAttachError> {
    let uprobe: &mut UProbe = ebpf
        .program_mut(program)
        .and_then(|p| p.try_into().ok())
        .ok_or(AllocAttachError::ProgramMissing { program })?;
    let link = uprobe
        .attach(
            UProbeAttachLocation::AbsoluteOffset(offset),
            path,
            UProbeScope::OneProcess(tgid),
        )
        .map_err(|source| AllocAttachError::Attach {
            program,
            symbol,
            path: path.to_owned(),
            tgid: tgid.get(),
            source: Box::new(source),
        })?;
    Ok(AllocLink { program, link })
}

/// Detaches `links` (a process exited, or attaching failed halfway); a link
/// the kernel already dropped is ignored.
pub fn detach(ebpf: &mut aya::Ebpf, links: Vec<AllocLink>) {
    for AllocLink { program, link } in links {
        let uprobe: Option<&mut UProbe> = ebpf.program_mut(program).and_then(|p| p.try_into().ok());
        if let Some(uprobe) = uprobe {
            let _ = uprobe.detach(link);
        }
    }
}

/// `len` exponential variates with mean `mean_bytes`, in bytes: the
/// quantiles `-mean * ln(1 - (i + 0.5) / len)`, so a uniformly random index
/// draws from the exponential distribution (to `1 / len` in probability).
/// Each is at least 1.
pub fn exponential_draws(mean_bytes: u64, len: u32) -> Vec<u64> {
    (0..len)
        .map(|i| {
            let u = (f64::from(i) + 0.5) / f64::from(len);
            let draw = -(mean_bytes as f64) * (1.0 - u).ln();
            (draw.round() as u64).max(1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_have_the_mean() {
        let mean = 512 * 1024;
        let draws = exponential_draws(mean, 4096);
        let average = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((average / mean as f64 - 1.0).abs() < 0.01, "{average}");
        // The median of an exponential is mean * ln 2.
        let mut sorted = draws.clone();
        sorted.sort_unstable();
        let median = sorted[2048] as f64 / mean as f64;
        assert!((median - std::f64::consts::LN_2).abs() < 0.01, "{median}");
    }

    #[test]
    fn libc_allocator_symbols_resolve_once_per_address() {
        let Some(libc) = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .iter()
        .map(Path::new)
        .find(|p| p.exists()) else {
            eprintln!("skipping: no glibc libc.so.6 here");
            return;
        };
        let mut symbols = SymbolOffsets::default();
        let offsets = symbols.resolve(libc, &LIBC_HOOKS).unwrap();
        for symbol in ["malloc", "calloc", "realloc", "free", "posix_memalign"] {
            assert!(offsets.contains_key(symbol), "{symbol} missing");
        }
        let unique: HashSet<_> = offsets.values().collect();
        assert_eq!(unique.len(), offsets.len());
    }
}
