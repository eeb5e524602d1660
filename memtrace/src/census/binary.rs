//! Where a mapped ELF file (libpython, the python executable, libc) lies in
//! a traced process: its load bias, its writable segment (data and bss,
//! where the allocators keep their state), and the code of an exported
//! function. The file is opened through /proc/PID/map_files (a deleted
//! file, another mount namespace) before /proc/PID/root.

use std::{fs::File, ops::Range, path::Path};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SegmentFlags};
use procfs::process::{MMapPath, MemoryMap};

use crate::python::load_bias;

/// `PF_W` of an ELF program header.
const PF_W: u32 = 2;

/// A mapped ELF file of one process.
#[derive(Clone, Debug)]
pub struct MappedBinary {
    /// Process address minus link-time address.
    pub bias: u64,
    /// Link-time addresses of its writable `PT_LOAD` segment (file data
    /// and bss: `p_vaddr .. p_vaddr + p_memsz`).
    pub writable: Range<u64>,
    /// Link-time address and bytes of each function looked up by name.
    pub functions: Vec<(String, u64, Vec<u8>)>,
}

/// Bytes of a function read from the file (enough for the few loads the
/// census decodes at its start).
const FUNCTION_BYTES: usize = 128;

impl MappedBinary {
    /// The mapped file of process `tgid` whose name ends with one of
    /// `names` (e.g. `libc.so.6`), or `path` exactly, with the exported
    /// `functions`' first bytes; `None` when none is mapped or readable.
    #[must_use]
    pub fn find(
        tgid: u32,
        maps: &[MemoryMap],
        wanted: impl Fn(&Path) -> bool,
        functions: &[&str],
    ) -> Option<Self> {
        let map = maps
            .iter()
            .find(|m| matches!(&m.pathname, MMapPath::Path(p) if wanted(p)))?;
        let MMapPath::Path(path) = &map.pathname else {
            return None;
        };
        let file = open(tgid, map, path)?;
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        let bias = load_bias(&elf, maps, path)?;
        let writable = elf.segments().find_map(|s| {
            let SegmentFlags::Elf { p_flags } = s.flags() else {
                return None;
            };
            (p_flags & PF_W != 0).then(|| s.address()..s.address() + s.size())
        })?;
        let functions = functions
            .iter()
            .filter_map(|name| {
                let symbol = elf
                    .dynamic_symbols()
                    .find(|s| !s.is_undefined() && s.name() == Ok(name))?;
                let code = code_at(&elf, symbol.address())?;
                Some(((*name).to_owned(), symbol.address(), code))
            })
            .collect();
        Some(Self {
            bias,
            writable,
            functions,
        })
    }

    /// The first bytes of function `name` and its link-time address.
    #[must_use]
    pub fn function(&self, name: &str) -> Option<(u64, &[u8])> {
        self.functions
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, addr, code)| (*addr, code.as_slice()))
    }

    /// The writable segment's addresses in the process.
    #[must_use]
    pub fn writable_in_process(&self) -> Range<u64> {
        self.writable.start.wrapping_add(self.bias)..self.writable.end.wrapping_add(self.bias)
    }
}

/// The file of `map` of process `tgid`.
fn open(tgid: u32, map: &MemoryMap, path: &Path) -> Option<File> {
    let via_map_files = format!(
        "/proc/{tgid}/map_files/{:x}-{:x}",
        map.address.0, map.address.1
    );
    File::open(via_map_files).ok().or_else(|| {
        File::open(
            Path::new(&format!("/proc/{tgid}/root")).join(path.strip_prefix("/").unwrap_or(path)),
        )
        .ok()
    })
}

/// The first [`FUNCTION_BYTES`] of the code at link-time address `addr`.
fn code_at<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    addr: u64,
) -> Option<Vec<u8>> {
    elf.segments().find_map(|s| {
        let data = s.data_range(addr, FUNCTION_BYTES as u64).ok()??;
        Some(data.to_vec())
    })
}
