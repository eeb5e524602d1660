//! Allocator mode, userspace half of the kernel side: finds the allocator
//! entry points of one traced process (CPython's allocator API in its
//! executable or libpython, glibc's `malloc` family in its libc), attaches
//! the `memtrace-ebpf` `alloc_*` uprobes and the `alloc_return` uretprobe
//! to them for that process only, and fills the exponential draws the
//! kernel side samples with.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    UProbe,
};

use super::elf_symbols::{ElfSymbols, Image};

/// The uretprobe attached at every allocating entry point (not the frees).
pub const RETURN_PROGRAM: &str = "alloc_return";

/// The entry uprobe programs of `memtrace-ebpf/src/probes/alloc.rs` and
/// `sampler.rs`.
pub const ENTRY_PROGRAMS: [&str; 9] = [
    "alloc_malloc",
    "alloc_calloc",
    "alloc_realloc",
    "alloc_aligned_alloc",
    "alloc_posix_memalign",
    "alloc_free",
    "alloc_free_second",
    "alloc_sampled",
    "alloc_sampled_free",
];

/// The programs that need no uretprobe: a free returns nothing to record,
/// and the sampler's markers are called with the block already made.
const NO_RETURN_PROGRAMS: [&str; 4] = [
    "alloc_free",
    "alloc_free_second",
    "alloc_sampled",
    "alloc_sampled_free",
];

/// pymalloc's own free, `_PyObject_Free(ctx, ptr)` (Objects/obmalloc.c), a
/// `.symtab` symbol. `PyObject_Free` and `PyMem_Free` jump to it through
/// `_PyObject.free` / `_PyMem.free`, and `PyMem_RawFree` to glibc `free`,
/// with an indirect `jmp` the kernel cannot emulate, so a uprobe anywhere
/// in them is single-stepped (about 12 us a hit here, toolchain.md) while
/// `_PyObject_Free`'s `test; je` lets one sit on the `je`. When it is
/// found, the first two are not hooked: their blocks are freed through it
/// (or, for large blocks, through [`RAW_FREE`]).
const PYMALLOC_FREE: &str = "_PyObject_Free";

/// The frees [`PYMALLOC_FREE`] stands in for.
const PYMALLOC_FREE_CALLERS: [&str; 2] = ["PyObject_Free", "PyMem_Free"];

/// The raw allocator's free, `_PyMem_RawFree(ctx, ptr)` (`mov %rsi,%rdi;
/// jmp free`: its probe sits on the `jmp`). Stands in for `PyMem_RawFree`
/// (an indirect `jmp` to it), so raw blocks are seen freed even when glibc
/// `free` is not hooked (another malloc preloaded, no glibc mapped).
const RAW_FREE: &str = "_PyMem_RawFree";

/// CPython's allocator API (Objects/obmalloc.c; exported since 3.4): symbol
/// and entry program, by argument layout.
pub const PYTHON_HOOKS: [(&str, &str); 16] = [
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
    (PYMALLOC_FREE, "alloc_free_second"),
    (RAW_FREE, "alloc_free_second"),
    // The debug hooks (PYTHONMALLOC=debug, -X dev) free the address the
    // caller got; their own allocator is given another (Objects/obmalloc.c,
    // `_PyMem_DebugRawFree`; inlined into `_PyMem_DebugFree` in 3.9, 3.12,
    // 3.13). Never called without the debug hooks.
    ("_PyMem_DebugRawFree", "alloc_free_second"),
    ("_PyMem_DebugFree", "alloc_free_second"),
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

/// The in-process sampler's marker functions (`memtrace/sampler`, in the
/// library memtrace writes for `--alloc-hooks sampler`): symbol and entry
/// program.
pub const SAMPLER_HOOKS: [(&str, &str); 2] = [
    (memtrace_common::SAMPLER_ALLOC_SYMBOL, "alloc_sampled"),
    (memtrace_common::SAMPLER_FREE_SYMBOL, "alloc_sampled_free"),
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
    /// (found by `symbols`: `.dynsym`, `.symtab`, then the debug file the
    /// build-id names; placed by the program headers), each offset once
    /// (an alias of an earlier hook's address, e.g. glibc's `aligned_alloc`
    /// = `memalign`, is left out so no block is seen twice).
    ///
    /// # Errors
    /// [`AllocAttachError::Symbols`] when `path` cannot be read.
    pub fn resolve(
        &mut self,
        symbols: &mut ElfSymbols,
        path: &Path,
        hooks: &[(&'static str, &'static str)],
    ) -> Result<&HashMap<&'static str, u64>, AllocAttachError> {
        if !self.by_binary.contains_key(path) {
            let image = symbols.image(path).map_err(|e| AllocAttachError::Symbols {
                path: path.to_owned(),
                detail: format!("{e:#}"),
            })?;
            let offsets = read_offsets(&image, hooks);
            self.by_binary.insert(path.to_owned(), offsets);
        }
        Ok(&self.by_binary[path])
    }
}

/// See [`SymbolOffsets::resolve`].
fn read_offsets(
    image: &Image,
    hooks: &[(&'static str, &'static str)],
) -> HashMap<&'static str, u64> {
    let mut addresses: HashMap<&str, (u64, u64)> = HashMap::new();
    for &(hook, program) in hooks {
        let Some(function) = image.function(hook) else {
            continue;
        };
        let code = image.code(function, PROLOGUE_BYTES);
        let shift = probe_offset(&code, arguments_of(program));
        addresses.insert(hook, (function.file_offset, shift));
    }
    if addresses.contains_key(PYMALLOC_FREE) {
        addresses.retain(|hook, _| !PYMALLOC_FREE_CALLERS.contains(hook));
    }
    if addresses.contains_key(RAW_FREE) {
        addresses.remove("PyMem_RawFree");
    }
    let mut seen = HashSet::new();
    let mut offsets = HashMap::new();
    for &(hook, _) in hooks {
        if let Some(&(offset, shift)) = addresses.get(hook) {
            if seen.insert(offset) {
                offsets.insert(hook, offset + shift);
            }
        }
    }
    offsets
}

/// Bytes of a function's start read to place its probe.
const PROLOGUE_BYTES: usize = 16;

/// x86-64 register numbers (ModRM encoding) of the System V argument
/// registers the entry programs read.
const RCX: u8 = 1;
const RDX: u8 = 2;
const RSP: u8 = 4;
const RSI: u8 = 6;
const RDI: u8 = 7;

/// The argument registers entry program `program` reads (its `ctx.arg(N)`
/// in `memtrace-ebpf/src/probes/alloc.rs`).
fn arguments_of(program: &str) -> &'static [u8] {
    match program {
        "alloc_malloc" | "alloc_free" => &[RDI],
        "alloc_calloc" | "alloc_realloc" => &[RDI, RSI],
        "alloc_aligned_alloc" | "alloc_free_second" => &[RSI],
        "alloc_posix_memalign" => &[RDI, RDX],
        "alloc_sampled_free" => &[RDI],
        "alloc_sampled" => &[RDI, RSI, RDX, RCX],
        _ => &[RDI, RSI, RDX],
    }
}

/// Where in a function (bytes from its start; `code` is its first bytes)
/// to put its probe so the kernel emulates the probed instruction rather
/// than single-stepping it: about 1.5 us a hit instead of about 12 us in
/// this VM (toolchain.md). The kernel emulates relative and conditional
/// jumps and `push reg`, among others (arch/x86/kernel/uprobes.c,
/// `branch_setup_xol_ops`, `push_setup_xol_ops`).
///
/// The probe moves past leading instructions only when they are
/// register-to-register `mov` or `test` of 64-bit registers that write
/// none of `arguments` (the registers its program reads) and not the stack
/// pointer, so at the probe the arguments and the return address (at the
/// top of the stack, which the uretprobe at the same place swaps) are as
/// at the call; it stops at the first emulated instruction. Anything else
/// keeps the probe at the start (0): `PyObject_Malloc` (`mov %rdi,%rsi;
/// test %rdi,%rdi; js`) gets 6, glibc `free` (`test %rdi,%rdi; je`) 3,
/// glibc `malloc` (`push %r12`) 0.
fn probe_offset(code: &[u8], arguments: &[u8]) -> u64 {
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        if emulated(rest) {
            return at as u64;
        }
        match rest {
            // REX.W 89 /r (mov r/m64, r64) or 85 /r (test r/m64, r64),
            // register form (ModRM mod = 11).
            [0x48, opcode @ (0x89 | 0x85), modrm, ..] if modrm >> 6 == 0b11 => {
                let written = modrm & 0b111;
                if *opcode == 0x89 && (written == RSP || arguments.contains(&written)) {
                    return 0;
                }
                at += 3;
            }
            _ => return 0,
        }
    }
    0
}

/// Whether the instruction at the start of `code` is one the kernel's
/// uprobes emulate (of those, the ones found at the start of allocator
/// functions): `jcc rel8` (70-7f), `jcc rel32` (0f 80-8f), `jmp rel` (e9,
/// eb), `push r64` (50-57, 41 50-57).
fn emulated(code: &[u8]) -> bool {
    matches!(
        code,
        [0x70..=0x7f | 0xe9 | 0xeb | 0x50..=0x57, ..]
            | [0x0f, 0x80..=0x8f, ..]
            | [0x41, 0x50..=0x57, ..]
    )
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
/// them all on error). `target` is the binary, its hooks and the cookie its
/// entry probes carry (`memtrace_common::ALLOC_COOKIE_PYTHON_API` on
/// [`PYTHON_HOOKS`]).
///
/// # Errors
/// [`AllocAttachError::ProgramMissing`], [`AllocAttachError::Attach`].
pub fn attach_binary(
    ebpf: &mut aya::Ebpf,
    tgid: NonZeroU32,
    target: (&Path, &[(&'static str, &'static str)], Option<u64>),
    offsets: &HashMap<&'static str, u64>,
    phase: Phase,
    links: &mut Vec<AllocLink>,
) -> Result<(), AllocAttachError> {
    let (path, hooks, cookie) = target;
    for &(symbol, program) in hooks {
        let Some(&offset) = offsets.get(symbol) else {
            continue;
        };
        let program = match phase {
            Phase::Returns if NO_RETURN_PROGRAMS.contains(&program) => continue,
            Phase::Returns => RETURN_PROGRAM,
            Phase::Entries => program,
        };
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: cookie.filter(|_| !is_raw_api(symbol)),
        };
        links.push(attach_one(ebpf, (program, symbol), point, path, tgid)?);
    }
    Ok(())
}

/// Whether `symbol` is CPython's raw allocator API (`PyMem_Raw*`), which
/// always calls the C allocator (pymalloc never serves it): its blocks do
/// not get the Python-API cookie.
fn is_raw_api(symbol: &str) -> bool {
    symbol.starts_with("PyMem_Raw")
}

fn attach_one(
    ebpf: &mut aya::Ebpf,
    (program, symbol): (&'static str, &'static str),
    point: UProbeAttachPoint<'_>,
    path: &Path,
    tgid: NonZeroU32,
) -> Result<AllocLink, AllocAttachError> {
    let uprobe: &mut UProbe = ebpf
        .program_mut(program)
        .and_then(|p| p.try_into().ok())
        .ok_or(AllocAttachError::ProgramMissing { program })?;
    let link = uprobe
        .attach(point, path, UProbeScope::OneProcess(tgid))
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
/// Entry probes go first (the reverse of attaching): a call entered while
/// only its return probe is gone would leave its thread counted as nested.
pub fn detach(ebpf: &mut aya::Ebpf, links: Vec<AllocLink>) {
    for AllocLink { program, link } in links.into_iter().rev() {
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
    fn raw_api_blocks_are_not_marked_as_pymalloc_candidates() {
        let python_api: Vec<&str> = PYTHON_HOOKS
            .iter()
            .filter(|(_, program)| *program != "alloc_free" && *program != "alloc_free_second")
            .map(|(symbol, _)| *symbol)
            .filter(|symbol| !is_raw_api(symbol))
            .collect();
        assert_eq!(
            python_api,
            [
                "PyObject_Malloc",
                "PyObject_Calloc",
                "PyObject_Realloc",
                "PyMem_Malloc",
                "PyMem_Calloc",
                "PyMem_Realloc"
            ]
        );
    }

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

    /// Prologues as pyenv's CPython 3.11 and Debian's glibc 2.36 begin
    /// (`gdb -batch -ex 'disassemble PyObject_Malloc' libpython3.11.so`).
    #[test]
    fn probes_sit_on_the_first_emulated_instruction_with_arguments_intact() {
        // PyObject_Malloc: mov %rdi,%rsi; test %rdi,%rdi; js.
        let object_malloc = [0x48, 0x89, 0xfe, 0x48, 0x85, 0xff, 0x78, 0x10];
        assert_eq!(probe_offset(&object_malloc, &[RDI]), 6);
        // PyObject_Realloc: mov %rsi,%rdx; test %rsi,%rsi; js.
        let object_realloc = [0x48, 0x89, 0xf2, 0x48, 0x85, 0xf6, 0x78, 0x18];
        assert_eq!(probe_offset(&object_realloc, &[RDI, RSI]), 6);
        // _PyObject_Free: test %rsi,%rsi; je.
        assert_eq!(probe_offset(&[0x48, 0x85, 0xf6, 0x74, 0x7b], &[RSI]), 3);
        // glibc free: test %rdi,%rdi; je rel32.
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0];
        assert_eq!(probe_offset(&free, &[RDI]), 3);
        // _PyMem_RawFree: mov %rsi,%rdi; jmp free (the block is in %rsi).
        assert_eq!(
            probe_offset(&[0x48, 0x89, 0xf7, 0xe9, 1, 2, 3, 4], &[RSI]),
            3
        );
        // glibc malloc: push %r12 is emulated where it is.
        assert_eq!(probe_offset(&[0x41, 0x54, 0x55, 0x53], &[RDI]), 0);
        // PyObject_Free: mov %rdi,%rsi; mov 0x..(%rip),%rdi; jmp *..: no
        // emulated instruction before the argument is overwritten.
        let object_free = [0x48, 0x89, 0xfe, 0x48, 0x8b, 0x3d, 1, 2, 3, 4, 0xff, 0x25];
        assert_eq!(probe_offset(&object_free, &[RDI]), 0);
    }

    #[test]
    fn a_probe_never_moves_past_a_write_to_an_argument_or_the_stack_pointer() {
        // mov %rdi,%rsi; js: the program reads %rsi.
        assert_eq!(probe_offset(&[0x48, 0x89, 0xfe, 0x78, 0x10], &[RSI]), 0);
        // mov %rdi,%rsp; js.
        assert_eq!(probe_offset(&[0x48, 0x89, 0xfc, 0x78, 0x10], &[RDI]), 0);
        // A memory operand (mod != 11) is not followed.
        assert_eq!(probe_offset(&[0x48, 0x89, 0x3e, 0x78, 0x10], &[RDI]), 0);
        // Code cut short.
        assert_eq!(probe_offset(&[0x48, 0x85], &[RDI]), 0);
        assert_eq!(probe_offset(&[], &[RDI]), 0);
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
        let mut offsets = SymbolOffsets::default();
        let mut symbols = ElfSymbols::new(&[]);
        let offsets = offsets.resolve(&mut symbols, libc, &LIBC_HOOKS).unwrap();
        for symbol in ["malloc", "calloc", "realloc", "free", "posix_memalign"] {
            assert!(offsets.contains_key(symbol), "{symbol} missing");
        }
        let unique: HashSet<_> = offsets.values().collect();
        assert_eq!(unique.len(), offsets.len());
    }
}
