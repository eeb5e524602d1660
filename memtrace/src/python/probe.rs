//! Decides whether a process runs a supported CPython and, if so, builds the
//! [`PyProcessInfo`] the kernel-side frame walk needs: the first step of the
//! `python` stage, run by the app for every process it starts tracing (and
//! again after an exec).
//!
//! Method (notes/python-stacks.md §7): find the mapped ELF whose `.dynsym`
//! defines `_PyRuntime` (libpython3.X.so for shared builds, the executable
//! for static builds such as Debian's `/usr/bin/python3.11`), compute its
//! load bias from its `PT_LOAD` segments and the mapping, read `Py_Version`
//! through /proc/PID/mem (3.9 and 3.10 have none: their version comes from
//! the file name and `.rodata`, see `version`), refuse free-threaded builds,
//! check 3.13+'s `_Py_DebugOffsets` against the table (`debug_offsets`),
//! look the version up in `offsets::LAYOUTS`, and read
//! the pthread TSS key of `_PyRuntime.autoTSSkey`.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memtrace_common::PyProcessInfo;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use procfs::process::{MMapPath, MemoryMap};
use thiserror::Error;

use super::debug_offsets::{self, DEBUG_OFFSETS_3_13_BYTES};
use super::mem::{MemError, ProcessMemory};
use super::offsets::{self, VersionLayout};
use super::version;

/// The glibc x86-64 fast path the BPF program uses reads only the first
/// level of thread-specific data (`struct pthread.specific_1stblock`), which
/// holds keys below `PTHREAD_KEY_2NDLEVEL_SIZE` = 32 (glibc
/// sysdeps/nptl/internaltypes.h; python-stacks.md §4).
pub const MAX_TSS_KEY: u32 = 32;

/// A CPython version as `Py_Version` (`PY_VERSION_HEX`) encodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PythonVersion {
    /// Major version (3).
    pub major: u8,
    /// Minor version (11 for 3.11).
    pub minor: u8,
    /// Micro (patch) version (7 for 3.11.7).
    pub micro: u8,
}

impl PythonVersion {
    /// Decodes `PY_VERSION_HEX` (Include/patchlevel.h: `0xMMmmuuLS`, major,
    /// minor, micro, release level, serial).
    #[must_use]
    pub fn from_hex(version_hex: u32) -> Self {
        let [major, minor, micro, _level] = version_hex.to_be_bytes();
        Self {
            major,
            minor,
            micro,
        }
    }
}

impl PythonVersion {
    /// Encodes as `PY_VERSION_HEX` of a final release (level `0xf`, serial
    /// 0), for versions found without `Py_Version`.
    #[must_use]
    pub fn to_hex(self) -> u32 {
        u32::from_be_bytes([self.major, self.minor, self.micro, 0xf0])
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

/// A process running a supported CPython.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonProcess {
    /// The interpreter's version, from `Py_Version`.
    pub version: PythonVersion,
    /// The mapped file that defines `_PyRuntime` (libpython or the
    /// executable), as named in /proc/PID/maps.
    pub binary: PathBuf,
    /// Address of `_PyRuntime` in the process.
    pub runtime_addr: u64,
    /// What the BPF frame walk needs (the `PY_PROCESSES` map value).
    pub info: PyProcessInfo,
    /// Struct layouts of this version, for userspace reads.
    pub layout: &'static VersionLayout,
}

/// Outcome of [`probe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A supported CPython, ready to be walked.
    Python(PythonProcess),
    /// No mapped file defines `_PyRuntime`.
    NotPython,
    /// CPython is mapped but cannot be walked yet: its interpreter is not
    /// initialised (`_PyRuntime.autoTSSkey._is_initialized` is not 1, so the
    /// thread-state key is unset); probe again later.
    NotReady,
}

/// Why [`probe`] failed.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// The process does not exist (any more).
    #[error("process {tgid} is gone")]
    ProcessGone {
        /// The process.
        tgid: u32,
    },
    /// /proc/PID/maps or the mapped file was not readable.
    #[error(
        "permission denied reading `{path}` of process {tgid}: memtrace needs CAP_SYS_PTRACE to read another user's process"
    )]
    PermissionDenied {
        /// The process.
        tgid: u32,
        /// The file that could not be read.
        path: PathBuf,
    },
    /// /proc/PID/maps could not be read for another reason.
    #[error("cannot read the memory map of process {tgid}: {source}")]
    Maps {
        /// The process.
        tgid: u32,
        /// The error from the procfs crate.
        #[source]
        source: procfs::ProcError,
    },
    /// A mapped ELF file could not be opened.
    #[error("cannot open `{path}` mapped by process {tgid}: {source}")]
    OpenBinary {
        /// The process.
        tgid: u32,
        /// The file.
        path: PathBuf,
        /// The error from open(2).
        #[source]
        source: io::Error,
    },
    /// The mapped file that defines `_PyRuntime` has no `PT_LOAD` segment
    /// matching its mappings, so its load bias is unknown.
    #[error("no mapping of `{binary}` in process {tgid} matches its PT_LOAD segments")]
    NoLoadBias {
        /// The process.
        tgid: u32,
        /// The file.
        binary: PathBuf,
    },
    /// `_PyRuntime` is defined but `Py_Version` is not (CPython before 3.11)
    /// and the file name does not say the version either.
    #[error("`{binary}` defines _PyRuntime but neither Py_Version nor its file name (pythonM.N) gives its version; supported versions: {supported}")]
    NoVersionSymbol {
        /// The file.
        binary: PathBuf,
        /// The supported versions, e.g. "3.11, 3.12, 3.13".
        supported: String,
    },
    /// The version has no entry in `offsets::LAYOUTS`.
    #[error("python {version} (`{binary}`) is not supported; supported versions: {supported}")]
    UnsupportedVersion {
        /// The version found.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
        /// The supported versions.
        supported: String,
    },
    /// A 3.13+ `_PyRuntime` does not start with `_Py_DebugOffsets`.
    #[error("CPython {version} (`{binary}`): _PyRuntime does not start with the _Py_DebugOffsets cookie \"xdebugpy\"; stacks off")]
    NoDebugOffsets {
        /// The version from `Py_Version`.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
    },
    /// `_Py_DebugOffsets.version` is not `Py_Version`.
    #[error("CPython {version} (`{binary}`): its _Py_DebugOffsets describes version {found:#x}; stacks off")]
    DebugOffsetsVersion {
        /// The version from `Py_Version`.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
        /// `_Py_DebugOffsets.version`.
        found: u64,
    },
    /// A free-threaded (`Py_GIL_DISABLED`, PEP 703) build: its object
    /// headers and frames differ from the table's GIL builds.
    #[error("CPython {version} (`{binary}`) is a free-threaded build (Py_GIL_DISABLED): stacks off, only GIL builds are supported")]
    FreeThreaded {
        /// The version.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
    },
    /// A 3.13+ minor version that memtrace's table does not hold.
    #[error("CPython {}.{}: offsets not in memtrace's table; stacks off (`{binary}`, version {version}; supported versions: {supported})", version.major, version.minor)]
    OffsetsNotInTable {
        /// The version.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
        /// The supported versions.
        supported: String,
    },
    /// `_Py_DebugOffsets` disagrees with memtrace's table.
    #[error("CPython {version}: _Py_DebugOffsets.{field} is {}, memtrace's table says {table}; stacks off", found.map_or_else(|| "unreadable".to_owned(), |v| v.to_string()))]
    DebugOffsetsMismatch {
        /// The version.
        version: PythonVersion,
        /// The field, e.g. `interpreter_frame.instr_ptr`.
        field: &'static str,
        /// Its value in the process (`None`: past the bytes read).
        found: Option<u64>,
        /// The table's value.
        table: u64,
    },
    /// Reading the process's memory failed.
    #[error("cannot read python runtime state of process {tgid}: {source}")]
    Memory {
        /// The process.
        tgid: u32,
        /// The failed read.
        #[source]
        source: MemError,
    },
    /// The TSS key cannot be read by the BPF fast path.
    #[error("process {tgid} uses pthread key {key} for the python thread state; only keys below {MAX_TSS_KEY} are supported")]
    TssKeyTooLarge {
        /// The process.
        tgid: u32,
        /// The key.
        key: u32,
    },
}

/// Inspects process `tgid` (see the module docs for the method).
///
/// # Errors
/// [`ProbeError`] when the process is gone, cannot be read, or runs an
/// unsupported CPython (the message names the version and the supported
/// ones).
pub fn probe(tgid: u32) -> Result<Probe, ProbeError> {
    // Through a live thread when the main thread alone has exited.
    let reader =
        crate::process::proc::reader_pid(tgid).map_err(|_| ProbeError::ProcessGone { tgid })?;
    let pid = i32::try_from(reader).map_err(|_| ProbeError::ProcessGone { tgid })?;
    let process = procfs::process::Process::new(pid).map_err(|e| proc_error(tgid, e))?;
    let maps = process.maps().map_err(|e| proc_error(tgid, e))?;
    let exe = process.exe().ok();
    let maps: Vec<MemoryMap> = maps.into_iter().collect();
    for path in candidate_paths(&maps, exe.as_deref()) {
        let Some(symbols) = find_runtime(reader, &maps, &path)? else {
            continue;
        };
        return read_runtime(tgid, path, &symbols);
    }
    Ok(Probe::NotPython)
}

/// Addresses (load bias applied) of the runtime symbols in one binary.
struct RuntimeSymbols {
    runtime_addr: u64,
    version_addr: Option<u64>,
    /// The version from the file name and `.rodata` when `Py_Version` is
    /// absent (3.10 and older).
    name_version: Option<PythonVersion>,
}

/// Files that may hold `_PyRuntime`: the executable, then every mapped file
/// whose name contains "python" (libpython3.X.so, uwsgi's plugin, ...), each
/// once, in map order.
fn candidate_paths(maps: &[MemoryMap], exe: Option<&Path>) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut paths: Vec<PathBuf> = maps
        .iter()
        .filter_map(|map| match &map.pathname {
            MMapPath::Path(path) => Some(path.clone()),
            _ => None,
        })
        .filter(|path| {
            Some(path.as_path()) == exe
                || path
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().contains("python"))
        })
        .filter(|path| seen.insert(path.clone()))
        .collect();
    paths.sort_by_key(|path| Some(path.as_path()) != exe);
    paths
}

/// Looks for `_PyRuntime` in `path`'s `.dynsym` and, if found, relocates it
/// and `Py_Version` into the process.
fn find_runtime(
    tgid: u32,
    maps: &[MemoryMap],
    path: &Path,
) -> Result<Option<RuntimeSymbols>, ProbeError> {
    let Some(file) = open_mapped(tgid, maps, path)? else {
        return Ok(None);
    };
    let cache = object::ReadCache::new(file);
    // Not an ELF we can parse (a data file mapped with "python" in its name).
    let Ok(elf) = object::File::parse(&cache) else {
        return Ok(None);
    };
    let mut runtime = None;
    let mut version = None;
    // Extension modules import `_PyRuntime`: only a definition counts.
    for symbol in elf.dynamic_symbols().filter(|s| !s.is_undefined()) {
        match symbol.name() {
            Ok("_PyRuntime") => runtime = Some(symbol.address()),
            Ok("Py_Version") => version = Some(symbol.address()),
            _ => {}
        }
    }
    let Some(runtime) = runtime else {
        return Ok(None);
    };
    let name_version = if version.is_none() {
        let rodata = elf.section_by_name(".rodata");
        let rodata = rodata.as_ref().and_then(|s| s.data().ok()).unwrap_or(&[]);
        version::from_binary(path, rodata)
    } else {
        None
    };
    let bias = load_bias(&elf, maps, path).ok_or_else(|| ProbeError::NoLoadBias {
        tgid,
        binary: path.to_owned(),
    })?;
    Ok(Some(RuntimeSymbols {
        runtime_addr: runtime.wrapping_add(bias),
        version_addr: version.map(|addr| addr.wrapping_add(bias)),
        name_version,
    }))
}

/// Opens a mapped file through /proc/PID/map_files (works for deleted files
/// and other mount namespaces), else through /proc/PID/root. `None` when the
/// file is gone.
fn open_mapped(tgid: u32, maps: &[MemoryMap], path: &Path) -> Result<Option<File>, ProbeError> {
    let via_map_files = maps
        .iter()
        .find(|map| matches!(&map.pathname, MMapPath::Path(p) if p == path))
        .map(|map| {
            PathBuf::from(format!(
                "/proc/{tgid}/map_files/{:x}-{:x}",
                map.address.0, map.address.1
            ))
        });
    if let Some(file) = via_map_files.and_then(|p| File::open(p).ok()) {
        return Ok(Some(file));
    }
    let via_root =
        Path::new(&format!("/proc/{tgid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    match File::open(&via_root) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            Err(ProbeError::PermissionDenied {
                tgid,
                path: via_root,
            })
        }
        Err(source) => Err(ProbeError::OpenBinary {
            tgid,
            path: path.to_owned(),
            source,
        }),
    }
}

/// `bias = start - (p_vaddr & !0xfff)` for the mapping whose file offset is
/// `p_offset & !0xfff` (python-stacks.md §7).
fn load_bias<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    maps: &[MemoryMap],
    path: &Path,
) -> Option<u64> {
    const PAGE_MASK: u64 = !0xfff;
    let mappings: Vec<&MemoryMap> = maps
        .iter()
        .filter(|map| matches!(&map.pathname, MMapPath::Path(p) if p == path))
        .collect();
    elf.segments().find_map(|segment| {
        let (file_offset, _) = segment.file_range();
        mappings
            .iter()
            .find(|map| map.offset == file_offset & PAGE_MASK)
            .map(|map| map.address.0.wrapping_sub(segment.address() & PAGE_MASK))
    })
}

/// Reads the version and the TSS key once `_PyRuntime` is located.
fn read_runtime(tgid: u32, binary: PathBuf, symbols: &RuntimeSymbols) -> Result<Probe, ProbeError> {
    let memory = ProcessMemory::open(tgid).map_err(|source| memory_error(tgid, source))?;
    let version_hex = match (symbols.version_addr, symbols.name_version) {
        (Some(addr), _) => memory
            .read_u32(addr)
            .map_err(|source| memory_error(tgid, source))?,
        (None, Some(version)) => version.to_hex(),
        (None, None) => {
            return Err(ProbeError::NoVersionSymbol {
                binary,
                supported: offsets::supported_versions(),
            })
        }
    };
    let version = PythonVersion::from_hex(version_hex);
    let free_threaded_name = version::from_file_name(&binary).is_some_and(|n| n.free_threaded);
    if free_threaded_name {
        return Err(ProbeError::FreeThreaded { version, binary });
    }
    let layout = if (version.major, version.minor) >= (3, 13) {
        let debug = memory
            .read_array::<DEBUG_OFFSETS_3_13_BYTES>(symbols.runtime_addr)
            .map_err(|source| memory_error(tgid, source))?;
        Some(debug_offsets::check(&debug, version_hex, &binary)?)
    } else {
        offsets::layout(version.major, version.minor)
    };
    let Some(layout) = layout else {
        return Err(ProbeError::UnsupportedVersion {
            version,
            binary,
            supported: offsets::supported_versions(),
        });
    };
    let key_addr = symbols.runtime_addr.wrapping_add(layout.runtime_tss_key);
    // `Py_tss_t` is `{ int _is_initialized; pthread_key_t _key; }`
    // (Include/cpython/pythread.h).
    let tss = memory
        .read_array::<8>(key_addr.wrapping_sub(4))
        .map_err(|source| memory_error(tgid, source))?;
    let [i0, i1, i2, i3, k0, k1, k2, k3] = tss;
    if i32::from_le_bytes([i0, i1, i2, i3]) != 1 {
        return Ok(Probe::NotReady);
    }
    let tss_key = u32::from_le_bytes([k0, k1, k2, k3]);
    if tss_key >= MAX_TSS_KEY {
        return Err(ProbeError::TssKeyTooLarge { tgid, key: tss_key });
    }
    let runtime = symbols.runtime_addr;
    let main_interp = memory
        .read_u64(runtime.wrapping_add(layout.runtime_main_interp))
        .map_err(|source| memory_error(tgid, source))?;
    Ok(Probe::Python(PythonProcess {
        version,
        binary,
        runtime_addr: runtime,
        info: PyProcessInfo {
            version_hex,
            tss_key,
            offsets: layout.walk,
            main_interp,
            tstate_current_addr: layout
                .runtime_tstate_current
                .map_or(0, |offset| runtime.wrapping_add(offset)),
        },
        layout,
    }))
}

fn memory_error(tgid: u32, source: MemError) -> ProbeError {
    ProbeError::Memory { tgid, source }
}

fn proc_error(tgid: u32, error: procfs::ProcError) -> ProbeError {
    match error {
        procfs::ProcError::NotFound(_) => ProbeError::ProcessGone { tgid },
        procfs::ProcError::PermissionDenied(path) => ProbeError::PermissionDenied {
            tgid,
            path: path.unwrap_or_else(|| PathBuf::from(format!("/proc/{tgid}/maps"))),
        },
        source => ProbeError::Maps { tgid, source },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};

    /// A Python interpreter running `script`, killed on drop.
    pub(crate) struct Interpreter {
        pub child: Child,
        /// The first line the script printed.
        pub first_line: String,
    }

    impl Drop for Interpreter {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Starts `exe -c script` and waits for its first stdout line; `None`
    /// (with a printed reason) when the interpreter is not installed.
    pub(crate) fn spawn(exe: &str, script: &str) -> Option<Interpreter> {
        let exe = exe.replace('~', &std::env::var("HOME").unwrap_or_default());
        if !Path::new(&exe).exists() {
            println!("skipping: {exe} is not installed");
            return None;
        }
        let mut child = Command::new(&exe)
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first_line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first_line)
            .unwrap();
        Some(Interpreter { child, first_line })
    }

    const SLEEP: &str =
        "import sys, time; print(sys.version.split()[0], flush=True); time.sleep(60)";

    fn probe_python(exe: &str, version: &str, binary_name: &str) {
        let Some(interp) = spawn(exe, SLEEP) else {
            return;
        };
        assert_eq!(interp.first_line.trim(), version);
        let Probe::Python(python) = probe(interp.child.id()).unwrap() else {
            panic!("{exe} not detected as python");
        };
        assert_eq!(python.version.to_string(), version);
        assert!(python.binary.ends_with(binary_name), "{:?}", python.binary);
        assert!(python.info.tss_key < MAX_TSS_KEY);
        assert_eq!(python.info.offsets, python.layout.walk);
        assert_ne!(python.info.main_interp, 0);
        if python.version.minor >= 11 {
            // 3.11+: the main interpreter is `_PyRuntime._main_interpreter`.
            let inside = python.runtime_addr..python.runtime_addr + 0x10_0000;
            assert!(inside.contains(&python.info.main_interp), "{python:?}");
        }
        assert_eq!(
            PythonVersion::from_hex(python.info.version_hex),
            python.version
        );
    }

    #[test]
    fn probes_pyenv_3_11_shared() {
        probe_python(
            "~/.pyenv/versions/3.11.7/bin/python3.11",
            "3.11.7",
            "libpython3.11.so.1.0",
        );
    }

    #[test]
    fn probes_debian_3_11_static() {
        probe_python("/usr/bin/python3.11", "3.11.2", "python3.11");
    }

    #[test]
    fn probes_pyenv_3_12_shared() {
        probe_python(
            "~/.pyenv/versions/3.12.1/bin/python3.12",
            "3.12.1",
            "libpython3.12.so.1.0",
        );
    }

    #[test]
    fn probes_pyenv_3_13_shared() {
        probe_python(
            "~/.pyenv/versions/3.13.0/bin/python3.13",
            "3.13.0",
            "libpython3.13.so.1.0",
        );
    }

    #[test]
    fn probes_pyenv_3_9_shared() {
        probe_python(
            "~/.pyenv/versions/3.9.18/bin/python3.9",
            "3.9.18",
            "libpython3.9.so.1.0",
        );
    }

    #[test]
    fn probes_pyenv_3_10_shared() {
        probe_python(
            "~/.pyenv/versions/3.10.13/bin/python3.10",
            "3.10.13",
            "libpython3.10.so.1.0",
        );
    }

    #[test]
    fn rejects_python_3_8() {
        let Some(interp) = spawn("~/.pyenv/versions/3.8.18/bin/python3.8", SLEEP) else {
            return;
        };
        let error = probe(interp.child.id()).unwrap_err();
        assert!(
            matches!(error, ProbeError::UnsupportedVersion { .. }),
            "{error}"
        );
        let message = error.to_string();
        assert!(message.contains("python 3.8.18"), "{message}");
        assert!(message.contains("3.9, 3.10, 3.11, 3.12, 3.13"), "{message}");
    }

    #[test]
    fn test_binary_is_not_python() {
        assert_eq!(probe(std::process::id()).unwrap(), Probe::NotPython);
    }

    #[test]
    fn missing_process_is_gone() {
        assert!(matches!(
            probe(u32::MAX - 1),
            Err(ProbeError::ProcessGone { .. })
        ));
    }

    #[test]
    fn version_hex_decodes() {
        let version = PythonVersion::from_hex(0x030b_07f0);
        assert_eq!(version.to_string(), "3.11.7");
        assert_eq!(version.to_hex(), 0x030b_07f0);
        assert_eq!(PythonVersion::from_hex(0x030c_01f0).minor, 12);
    }
}
