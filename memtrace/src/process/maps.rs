//! Step 3 of the data flow: which file or shared-memory mapping an address
//! of a traced process belongs to (`/proc/PID/maps`, via procfs), for growth
//! of file-backed and shared memory. Each process's maps are cached and
//! read again when an address is not in them. [`reachable_path`] names a
//! file a process mapped so that memtrace itself can open it (another mount
//! namespace, or deleted and replaced on disk).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use procfs::process::{MMapPath, Process};

/// One mapping: `[start, end)` and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    name: String,
}

/// Mapping names per tgid, read from /proc on demand.
#[derive(Debug, Default)]
pub struct MappingNames {
    by_tgid: HashMap<u32, Vec<Mapping>>,
}

impl MappingNames {
    /// The name of the mapping holding `addr` in process `tgid` (a file's
    /// path, `/memfd:NAME (deleted)`, `[heap]`, ...), reading /proc again
    /// when the cached maps do not hold it; `None` when the process cannot
    /// be read or no mapping holds the address.
    pub fn name(&mut self, tgid: u32, addr: u64) -> Option<String> {
        if let Some(found) = self.cached(tgid, addr) {
            return Some(found);
        }
        self.by_tgid.insert(tgid, read_maps(tgid)?);
        self.cached(tgid, addr)
    }

    fn cached(&self, tgid: u32, addr: u64) -> Option<String> {
        let maps = self.by_tgid.get(&tgid)?;
        let index = maps.partition_point(|m| m.end <= addr);
        maps.get(index)
            .filter(|m| m.start <= addr)
            .map(|m| m.name.clone())
    }

    /// Forgets process `tgid` (exit or exec).
    pub fn forget(&mut self, tgid: u32) {
        self.by_tgid.remove(&tgid);
    }
}

/// The mappings of `tgid`, sorted by address.
fn read_maps(tgid: u32) -> Option<Vec<Mapping>> {
    let reader = super::proc::reader_pid(tgid).ok()?;
    let maps = Process::new(reader as i32).ok()?.maps().ok()?;
    let mut mappings: Vec<Mapping> = maps
        .into_iter()
        .map(|m| Mapping {
            start: m.address.0,
            end: m.address.1,
            name: path_name(&m.pathname),
        })
        .collect();
    mappings.sort_by_key(|m| m.start);
    Some(mappings)
}

/// A path by which memtrace reaches the very file process `tgid` mapped as
/// `path` (a name in the process's mount namespace; `... (deleted)` once it
/// was removed): `path` itself when it names the same file here (same
/// device and inode, so probes attached by it are shared by every process
/// mapping it), else `/proc/PID/map_files/START-END` of one of its mappings
/// (the mapped inode itself, even deleted or in another mount namespace;
/// needs CAP_SYS_ADMIN), else `/proc/PID/root/PATH`; `None` when none
/// opens.
pub fn reachable_path(tgid: u32, path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let identity = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let maps = Process::new(super::proc::reader_pid(tgid).ok()? as i32)
        .ok()?
        .maps()
        .ok()?;
    let via_map_files = maps
        .iter()
        .find(|m| matches!(&m.pathname, MMapPath::Path(p) if p == path))
        .map(|m| {
            PathBuf::from(format!(
                "/proc/{tgid}/map_files/{:x}-{:x}",
                m.address.0, m.address.1
            ))
        })
        .filter(|p| identity(p).is_some());
    match via_map_files {
        Some(mapped) if identity(&mapped) == identity(path) => Some(path.to_owned()),
        Some(mapped) => Some(mapped),
        None if identity(path).is_some() => Some(path.to_owned()),
        None => {
            let via_root = Path::new(&format!("/proc/{tgid}/root"))
                .join(path.strip_prefix("/").unwrap_or(path));
            identity(&via_root).map(|_| via_root)
        }
    }
}

/// How /proc/PID/maps names a mapping.
fn path_name(path: &MMapPath) -> String {
    match path {
        MMapPath::Path(p) => p.display().to_string(),
        MMapPath::Heap => "[heap]".to_owned(),
        MMapPath::Stack => "[stack]".to_owned(),
        MMapPath::TStack(tid) => format!("[stack:{tid}]"),
        MMapPath::Vdso => "[vdso]".to_owned(),
        MMapPath::Vvar => "[vvar]".to_owned(),
        MMapPath::Vsyscall => "[vsyscall]".to_owned(),
        MMapPath::Rollup => "[rollup]".to_owned(),
        MMapPath::Anonymous => "[anonymous]".to_owned(),
        MMapPath::Vsys(key) => format!("/SYSV{key:08x}"),
        MMapPath::Other(other) => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_mapped_file_of_this_process() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(8192).unwrap();
        let map = unsafe {
            nix::sys::mman::mmap(
                None,
                std::num::NonZeroUsize::new(8192).unwrap(),
                nix::sys::mman::ProtFlags::PROT_READ,
                nix::sys::mman::MapFlags::MAP_SHARED,
                file.as_file(),
                0,
            )
        }
        .unwrap();
        let addr = map.as_ptr() as u64 + 4096;
        let mut names = MappingNames::default();
        let name = names.name(std::process::id(), addr).unwrap();
        assert_eq!(name, file.path().display().to_string());
        assert_eq!(names.name(std::process::id(), 8), None);
        unsafe { nix::sys::mman::munmap(map, 8192) }.unwrap();
    }
}
