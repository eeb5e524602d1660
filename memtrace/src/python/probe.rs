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
//! the file name and `.rodata`, see `version`), read 3.13+'s layout from
//! its `_Py_DebugOffsets` (`debug_offsets`; free-threaded 3.13t too),
//! look the version up in `offsets::LAYOUTS`, and read
//! the pthread TSS key of `_PyRuntime.autoTSSkey`.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memtrace_common::PyProcessInfo;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use procfs::process::{MMapPath, MemoryMap};

use super::debug_offsets::{self, DEBUG_OFFSETS_READ_BYTES};
use super::mem::{MemError, ProcessMemory};
use super::offsets::{self, RuntimeLayout, VersionLayout};
use super::threads;
pub use super::types::{ProbeError, PythonVersion, MAX_TSS_KEY};
use super::version;

/// A process running a supported CPython.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonProcess {
    /// The interpreter's version, from `Py_Version`.
    pub version: PythonVersion,
    /// A free-threaded build (`_Py_DebugOffsets.free_threaded`, 3.13t):
    /// its allocator is mimalloc, so there are no pymalloc arenas.
    pub free_threaded: bool,
    /// The mapped file that defines `_PyRuntime` (libpython or the
    /// executable), as named in /proc/PID/maps.
    pub binary: PathBuf,
    /// Address of `_PyRuntime` in the process.
    pub runtime_addr: u64,
    /// What the BPF frame walk needs (the `PY_PROCESSES` map value).
    pub info: PyProcessInfo,
    /// Struct layouts of this version, for userspace reads.
    pub layout: VersionLayout,
}

/// Outcome of [`probe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A supported CPython, ready to be walked (boxed: it holds the layout).
    Python(Box<PythonProcess>),
    /// No mapped file defines `_PyRuntime`.
    NotPython,
    /// CPython is mapped but cannot be walked yet: its interpreter is not
    /// initialised (`_PyRuntime.autoTSSkey._is_initialized` is not 1, so the
    /// thread-state key is unset); probe again later.
    NotReady,
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
/// `p_offset & !0xfff` (python-stacks.md §7); `None` when no mapping of
/// `path` matches a segment. The census reads its binaries with it too.
pub(crate) fn load_bias<'data, R: object::ReadRef<'data>>(
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

/// Reads the version, then the layout and the thread-state slot: from the
/// table (3.9-3.12) or the process's `_Py_DebugOffsets` (3.13+).
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
    let runtime = symbols.runtime_addr;
    let mut free_threaded = false;
    let found = if (version.major, version.minor) >= (3, 13) {
        let debug = memory
            .read_array::<DEBUG_OFFSETS_READ_BYTES>(runtime)
            .map_err(|source| memory_error(tgid, source))?;
        let layout = debug_offsets::check(&debug, version_hex, &binary)?;
        free_threaded = layout.free_threaded;
        threads::find(&memory, runtime, version, &layout)?
    } else {
        let Some(layout) = offsets::layout(version.major, version.minor) else {
            return Err(ProbeError::UnsupportedVersion {
                version,
                binary,
                supported: offsets::supported_versions(),
            });
        };
        from_table(&memory, runtime, layout)?
    };
    let Some(found) = found else {
        return Ok(Probe::NotReady);
    };
    Ok(Probe::Python(Box::new(PythonProcess {
        version,
        free_threaded,
        binary,
        runtime_addr: runtime,
        info: PyProcessInfo {
            version_hex,
            tss_slot_offset: found.tss_slot_offset,
            tss_slot_offset_alt: found.tss_slot_offset_alt,
            offsets: found.layout.walk,
            main_interp: found.main_interp,
            tstate_current_addr: found.tstate_current_addr,
        },
        layout: found.layout,
    })))
}

/// The 3.9-3.12 runtime through the table's offsets in `_PyRuntime`;
/// `None` before the interpreter set its thread-state key.
///
/// # Errors
/// A read fails, or the key is too large ([`ProbeError::TssKeyTooLarge`]).
fn from_table(
    memory: &ProcessMemory,
    runtime: u64,
    layout: &'static VersionLayout,
) -> Result<Option<threads::Found>, ProbeError> {
    let tgid = memory.tgid();
    let read_u64 = |addr: u64| {
        memory
            .read_u64(addr)
            .map_err(|source| memory_error(tgid, source))
    };
    let RuntimeLayout::Table {
        tss_key,
        main_interp,
        tstate_current,
    } = layout.runtime
    else {
        return Ok(None);
    };
    // `Py_tss_t` is `{ int _is_initialized; pthread_key_t _key; }`
    // (Include/cpython/pythread.h).
    let tss = memory
        .read_array::<8>(runtime.wrapping_add(tss_key).wrapping_sub(4))
        .map_err(|source| memory_error(tgid, source))?;
    let [i0, i1, i2, i3, k0, k1, k2, k3] = tss;
    if i32::from_le_bytes([i0, i1, i2, i3]) != 1 {
        return Ok(None);
    }
    let key = u32::from_le_bytes([k0, k1, k2, k3]);
    if key >= MAX_TSS_KEY {
        return Err(ProbeError::TssKeyTooLarge { tgid, key });
    }
    Ok(Some(threads::Found {
        layout: *layout,
        tss_slot_offset: threads::GLIBC_TSD_FIRST_BLOCK + 16 * key as i32 + 8,
        tss_slot_offset_alt: 0,
        main_interp: read_u64(runtime.wrapping_add(main_interp))?,
        tstate_current_addr: tstate_current.map_or(0, |offset| runtime.wrapping_add(offset)),
    }))
}

pub(super) fn memory_error(tgid: u32, source: MemError) -> ProbeError {
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
        // `version` ends with '.' for "any micro version".
        let reported = interp.first_line.trim();
        assert!(
            reported == version || version.ends_with('.') && reported.starts_with(version),
            "{reported}"
        );
        let Probe::Python(python) = probe(interp.child.id()).unwrap() else {
            panic!("{exe} not detected as python");
        };
        assert_eq!(python.version.to_string(), reported);
        assert!(python.binary.ends_with(binary_name), "{:?}", python.binary);
        assert_ne!(python.info.tss_slot_offset, 0);
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

    /// Debian sid's CPython `minor` ("3.14") that `cargo xtask test`
    /// unpacks, patchelf'd (xtask/src/interpreters.rs).
    pub(crate) fn debian_python(minor: &str) -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let tree = root.join(format!("target/interpreters/python{minor}"));
        tree.join(format!("usr/bin/python{minor}"))
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn probes_debian_3_14_static() {
        probe_python(&debian_python("3.14"), "3.14.", "python3.14");
    }

    #[test]
    fn probes_debian_3_15_static() {
        probe_python(&debian_python("3.15"), "3.15.", "python3.15");
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
        assert!(
            message.contains("3.9, 3.10, 3.11, 3.12, 3.13+"),
            "{message}"
        );
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
