//! Native instruction pointers to names: symbolizes a record's native
//! instruction pointer (`MemoryRecord::native_ip`, `AllocRecord::native_ip`)
//! or the frames of its unwound chain (`super::unwind`; a return address is
//! looked up at `ip - 1`) of a traced process with blazesym, so a stack can
//! end in e.g. `sqlite3Malloc` or `__memset_avx2_unaligned_erms` under the
//! Python line that called it.

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

    /// [`NativeSymbolizer::symbolize`] for each of `ips` (an unwound
    /// chain), in order: the addresses not cached yet are symbolized in one
    /// pass over the process's maps rather than one each.
    pub fn symbolize_all(&mut self, tgid: u32, ips: &[u64]) -> Vec<Option<NativeName>> {
        if tgid == 0 {
            return vec![None; ips.len()];
        }
        let cached = self.cache.entry(tgid).or_default();
        let mut missing: Vec<u64> = ips
            .iter()
            .copied()
            .filter(|ip| !cached.contains_key(ip))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let reader = crate::process::proc::reader_pid(tgid).unwrap_or(tgid);
            let mut names = self.symbol_names(reader, &missing);
            let unnamed: Vec<u64> = missing
                .iter()
                .zip(&names)
                .filter(|(_, name)| name.is_none())
                .map(|(&ip, _)| ip)
                .collect();
            if !unnamed.is_empty() {
                let mut offsets = self.module_offsets(reader, &unnamed).into_iter();
                for name in names.iter_mut().filter(|name| name.is_none()) {
                    *name = offsets.next().flatten();
                }
            }
            let cached = self.cache.entry(tgid).or_default();
            cached.extend(missing.into_iter().zip(names));
        }
        let cached = &self.cache[&tgid];
        ips.iter()
            .map(|ip| cached.get(ip).cloned().flatten())
            .collect()
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
        match self
            .symbolizer
            .symbolize_single(&process_source(reader), Input::AbsAddr(ip))
        {
            Ok(symbolized) => named(symbolized),
            Err(_) => None,
        }
    }

    /// The symbols of `ips`, in order, read through `/proc/<reader>` once.
    fn symbol_names(&self, reader: u32, ips: &[u64]) -> Vec<Option<NativeName>> {
        match self
            .symbolizer
            .symbolize(&process_source(reader), Input::AbsAddr(ips))
        {
            Ok(all) => all.into_iter().map(named).collect(),
            Err(_) => vec![None; ips.len()],
        }
    }

    /// `ip`'s file and offset in it, read through `/proc/<reader>`.
    fn module_offset(&self, reader: u32, ip: u64) -> Option<NativeName> {
        self.module_offsets(reader, &[ip]).pop().flatten()
    }

    /// The file and offset of each of `ips` (sorted), in order, read
    /// through `/proc/<reader>` once.
    fn module_offsets(&self, reader: u32, ips: &[u64]) -> Vec<Option<NativeName>> {
        let Ok(output) = self.normalizer.normalize_user_addrs(Pid::from(reader), ips) else {
            return vec![None; ips.len()];
        };
        let name = |&(file_offset, meta_index): &(u64, usize)| {
            let UserMeta::Elf(elf) = output.meta.get(meta_index)? else {
                return None;
            };
            let module = Path::new(&elf.path).file_name()?.to_string_lossy();
            Some(NativeName {
                symbol: format!("{module}+{file_offset:#x}"),
                module: Some(module.into_owned()),
            })
        };
        let mut names: Vec<_> = output.outputs.iter().map(name).collect();
        names.resize(ips.len(), None);
        names
    }
}

/// Process `reader` as a blazesym source, without DWARF (see
/// [`NativeSymbolizer::new`]).
fn process_source(reader: u32) -> Source<'static> {
    let mut process = Process::new(Pid::from(reader));
    process.debug_syms = false;
    Source::Process(process)
}

/// The name blazesym found, if it found one.
fn named(symbolized: Symbolized) -> Option<NativeName> {
    match symbolized {
        Symbolized::Sym(sym) => Some(NativeName {
            module: sym
                .module
                .as_deref()
                .and_then(|module| Path::new(module).file_name())
                .map(|name| name.to_string_lossy().into_owned()),
            symbol: sym.name.into_owned(),
        }),
        Symbolized::Unknown(_) => None,
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

    /// The start of the test executable's first mapping (its ELF header:
    /// mapped, but in no symbol).
    fn executable_start() -> u64 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let first = maps
            .lines()
            .find(|line| line.ends_with(exe.to_str().unwrap()))
            .unwrap();
        u64::from_str_radix(first.split('-').next().unwrap(), 16).unwrap()
    }

    #[test]
    fn names_a_chain_in_one_pass_as_one_by_one() {
        let ips = [
            memtrace_symbolize_test_target as *const () as u64 + 1,
            executable_start() + 0x10,
            nix::libc::getpid as *const () as u64,
            memtrace_symbolize_test_target as *const () as u64 + 1,
        ];
        let mut batch = NativeSymbolizer::new();
        let all = batch.symbolize_all(own_tgid(), &ips);
        let mut single = NativeSymbolizer::new();
        let one_by_one: Vec<_> = ips
            .iter()
            .map(|&ip| single.symbolize(own_tgid(), ip))
            .collect();
        assert_eq!(all, one_by_one);
        assert_eq!(
            all[0].as_ref().map(|n| n.symbol.as_str()),
            Some("memtrace_symbolize_test_target")
        );
        assert!(
            all[1].as_ref().unwrap().symbol.ends_with("+0x10"),
            "{all:?}"
        );
        assert_eq!(batch.symbolize_all(own_tgid(), &ips), all);
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
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let start = executable_start();
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
