//! Native instruction pointers to names: symbolizes `MemoryRecord::native_ip`
//! (the faulting instruction or the syscall's return address) of a traced
//! process with blazesym, so a stack can end in e.g. `PyList_Append` or
//! `__memset_avx2_unaligned_erms` under the Python line that called it.

use std::collections::HashMap;
use std::path::Path;

use blazesym::normalize::{Normalizer, UserMeta};
use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::Pid;

/// What a native instruction pointer is named by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeName {
    /// The function containing it (demangled, without offset), or
    /// `"<file name>+0x<file offset>"` when its file has no symbol for it.
    pub symbol: String,
    /// File name of the ELF object it is in (`libsqlite3.so.0`), when known.
    pub module: Option<String>,
}

/// Symbolizes native instruction pointers of live processes, caching every
/// answer per (tgid, ip) until [`NativeSymbolizer::forget`].
pub struct NativeSymbolizer {
    symbolizer: Symbolizer,
    normalizer: Normalizer,
    /// tgid → ip → name (`None`: nothing is mapped there).
    cache: HashMap<u32, HashMap<u64, Option<NativeName>>>,
}

impl std::fmt::Debug for NativeSymbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeSymbolizer")
            .field("cached_processes", &self.cache.len())
            .finish_non_exhaustive()
    }
}

impl Default for NativeSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl NativeSymbolizer {
    /// A symbolizer with empty caches. It uses ELF symbol tables (`.symtab`,
    /// else `.dynsym`), not DWARF: names are all memtrace needs and DWARF of a
    /// debug-info libpython takes seconds to load.
    #[must_use]
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            normalizer: Normalizer::new(),
            cache: HashMap::new(),
        }
    }

    /// Name of the function containing address `ip` of process `tgid`
    /// (demangled, without offset) and the file it is in. When the
    /// containing file has no symbol for it, `"<file name>+0x<file offset>"`
    /// (e.g. `"libc.so.6+0x1234"`).
    /// `None` when `ip` is not mapped (0 never is; the app does not ask for
    /// it), in an anonymous mapping, or the process is gone; also for tgid 0,
    /// which blazesym would take as this process.
    pub fn symbolize(&mut self, tgid: u32, ip: u64) -> Option<NativeName> {
        if tgid == 0 {
            return None;
        }
        if let Some(name) = self.cache.get(&tgid).and_then(|by_ip| by_ip.get(&ip)) {
            return name.clone();
        }
        // Through a live thread when the main thread alone has exited.
        let reader = crate::process::proc::reader_pid(tgid).unwrap_or(tgid);
        let name = self
            .symbol_name(reader, ip)
            .or_else(|| self.module_offset(reader, ip));
        self.cache.entry(tgid).or_default().insert(ip, name.clone());
        name
    }

    /// Drops everything cached for `tgid` (it exited or exec'd).
    pub fn forget(&mut self, tgid: u32) {
        self.cache.remove(&tgid);
        let evict = blazesym::symbolize::evict::Process::new(Pid::from(tgid));
        // Nothing cached is not an error for blazesym; any other failure
        // only keeps some memory around until the symbolizer is dropped.
        let _ = self.symbolizer.evict(&evict.into());
    }

    /// `ip`'s symbol, read through `/proc/<reader>` (the process or one of
    /// its live threads).
    fn symbol_name(&self, reader: u32, ip: u64) -> Option<NativeName> {
        let mut process = Process::new(Pid::from(reader));
        process.debug_syms = false;
        let source = Source::Process(process);
        match self
            .symbolizer
            .symbolize_single(&source, Input::AbsAddr(ip))
        {
            Ok(Symbolized::Sym(sym)) => Some(NativeName {
                module: sym
                    .module
                    .as_deref()
                    .and_then(|module| Path::new(module).file_name())
                    .map(|name| name.to_string_lossy().into_owned()),
                symbol: sym.name.into_owned(),
            }),
            Ok(Symbolized::Unknown(_)) | Err(_) => None,
        }
    }

    /// `ip`'s file and offset in it, read through `/proc/<reader>`.
    fn module_offset(&self, reader: u32, ip: u64) -> Option<NativeName> {
        let output = self
            .normalizer
            .normalize_user_addrs(Pid::from(reader), &[ip])
            .ok()?;
        let &(file_offset, meta_index) = output.outputs.first()?;
        let UserMeta::Elf(elf) = output.meta.get(meta_index)? else {
            return None;
        };
        let module = Path::new(&elf.path).file_name()?.to_string_lossy();
        Some(NativeName {
            symbol: format!("{module}+{file_offset:#x}"),
            module: Some(module.into_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[no_mangle]
    #[inline(never)]
    extern "C" fn memtrace_symbolize_test_target(value: u64) -> u64 {
        std::hint::black_box(value.wrapping_mul(3))
    }

    fn own_tgid() -> u32 {
        std::process::id()
    }

    #[test]
    fn names_a_function_of_this_binary() {
        let mut symbolizer = NativeSymbolizer::new();
        let ip = memtrace_symbolize_test_target as *const () as u64;
        assert_eq!(memtrace_symbolize_test_target(2), 6);
        let name = symbolizer.symbolize(own_tgid(), ip + 1);
        let symbol = name.as_ref().map(|n| n.symbol.as_str());
        assert_eq!(symbol, Some("memtrace_symbolize_test_target"));
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let module = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name.as_ref().and_then(|n| n.module.clone()), Some(module));
        let cached = |s: &NativeSymbolizer| {
            s.cache
                .get(&own_tgid())
                .and_then(|by_ip| by_ip.get(&(ip + 1)))
                .cloned()
        };
        // Served from the cache, then recomputed after forget.
        assert_eq!(cached(&symbolizer), Some(name.clone()));
        assert_eq!(symbolizer.symbolize(own_tgid(), ip + 1), name);
        symbolizer.forget(own_tgid());
        assert_eq!(cached(&symbolizer), None);
        assert!(symbolizer.cache.is_empty());
        assert_eq!(symbolizer.symbolize(own_tgid(), ip + 1), name);
        assert_eq!(cached(&symbolizer), Some(name.clone()));
    }

    #[test]
    fn names_a_libc_function() {
        let mut symbolizer = NativeSymbolizer::new();
        let ip = nix::libc::getpid as *const () as u64;
        let name = symbolizer.symbolize(own_tgid(), ip).unwrap();
        assert!(name.symbol.contains("getpid"), "{name:?}");
        let module = name.module.unwrap();
        assert!(module.starts_with("libc"), "{module}");
    }

    #[test]
    fn file_offset_when_no_symbol_covers_the_address() {
        // The ELF header of the test executable: mapped, but in no symbol.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let first = maps
            .lines()
            .find(|line| line.ends_with(exe.to_str().unwrap()))
            .unwrap();
        let start = u64::from_str_radix(first.split('-').next().unwrap(), 16).unwrap();
        let mut symbolizer = NativeSymbolizer::new();
        let name = symbolizer.symbolize(own_tgid(), start + 0x10).unwrap();
        let module = exe.file_name().unwrap().to_string_lossy();
        assert_eq!(name.symbol, format!("{module}+0x10"));
        assert_eq!(name.module.as_deref(), Some(&*module));
    }

    #[test]
    fn nothing_for_anonymous_or_missing() {
        let mut symbolizer = NativeSymbolizer::new();
        let heap = Box::new(7u64);
        let addr = std::ptr::addr_of!(*heap) as u64;
        assert_eq!(symbolizer.symbolize(own_tgid(), addr), None);
        assert_eq!(symbolizer.symbolize(own_tgid(), 0), None);
        assert_eq!(symbolizer.symbolize(u32::MAX - 1, 0x1000), None);
    }
}
