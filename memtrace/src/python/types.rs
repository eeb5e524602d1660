//! The vocabulary of the `python` stage's first step, shared by `probe`,
//! `version` and `debug_offsets` (which each build on it, so none imports
//! another's types): a CPython version as `Py_Version` encodes it, and why
//! a process's interpreter cannot be walked.

use std::fmt;
use std::io;
use std::path::PathBuf;

use thiserror::Error;

use super::mem::MemError;

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

/// Why `probe` failed.
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
    /// A free-threaded (`Py_GIL_DISABLED`, PEP 703) build newer than 3.13t:
    /// its frames run per-thread copies of the bytecode (`co_tlbc`), which
    /// the walk does not read.
    #[error("CPython {version} (`{binary}`) is a free-threaded build (Py_GIL_DISABLED): stacks off; memtrace reads the free-threaded 3.13t and the GIL builds, not the per-thread bytecode copies (co_tlbc) of 3.14t and later")]
    FreeThreaded {
        /// The version.
        version: PythonVersion,
        /// The file.
        binary: PathBuf,
    },
    /// A field of `_Py_DebugOffsets` describes a layout the BPF walk or
    /// the code-object reader does not understand (past its struct's
    /// `size`, too large for the walk's 16-bit offsets, or unreadable).
    #[error("CPython {version}: _Py_DebugOffsets.{field} is {}: {why}; stacks off", value.map_or_else(|| "unreadable".to_owned(), |v| v.to_string()))]
    DebugOffsetsField {
        /// The version.
        version: PythonVersion,
        /// The field, e.g. `interpreter_frame.instr_ptr`.
        field: &'static str,
        /// Its value in the process (`None`: past the bytes read).
        value: Option<u64>,
        /// What the walker expects instead.
        why: String,
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
