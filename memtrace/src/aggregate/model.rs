//! The aggregation step's vocabulary: what a process is ([`ProcessId`],
//! [`ProcessStart`]), how it ended ([`ExitStatus`], [`ExitBegin`]), what a
//! frame of a call stack is ([`Frame`]) and whether Python stacks can be
//! read in it ([`PythonStatus`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use memtrace_common::ProcessCounters;
use serde::{Deserialize, Serialize};

use crate::python::PyLocation;

pub use crate::process::{ProcessId, PythonStatus, Role, Sharing};

/// One frame of a call stack after symbolization. JSON form:
/// `{"kind": "python", "function": .., "file": .., "line": ..}`,
/// `{"kind": "native", "symbol": ..}`, `{"kind": "mapping", "mapping": ..,
/// "name": ..}` or `{"kind": "unknown", "reason": ..}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Frame {
    /// A Python function at the line being executed.
    Python {
        /// Qualified function name.
        function: String,
        /// Source file as the code object names it.
        file: String,
        /// Line number (1-based).
        line: u32,
    },
    /// A native instruction, symbolized.
    Native {
        /// Symbol name (or module+offset when no symbol was found).
        symbol: String,
        /// File name of the ELF object it is in (`libsqlite3.so.0`), when
        /// known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        module: Option<String>,
    },
    /// The memory mapping a file-backed or shared-memory page belongs to:
    /// the innermost frame of growth that is not anonymous memory.
    Mapping {
        /// File-backed page cache or shared memory.
        mapping: MappingKind,
        /// The mapped file's path as /proc/PID/maps names it (`?` when the
        /// mapping could not be read).
        name: String,
    },
    /// A frame that could not be read or was cut off.
    Unknown {
        /// Why, e.g. "stack truncated".
        reason: String,
    },
}

/// What a [`Frame::Mapping`] maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingKind {
    /// Pages of a regular file (page cache the kernel can reclaim).
    File,
    /// Shared memory (shmem, tmpfs, memfd, shared anonymous mappings).
    Shmem,
}

/// Whether frames show their files as the code object names them
/// (`--full-paths`) instead of [`display_file`]'s short form.
static FULL_PATHS: AtomicBool = AtomicBool::new(false);

/// memtrace's working folder with a trailing `/`, read once.
static WORKING_FOLDER: OnceLock<Option<String>> = OnceLock::new();

/// Makes every frame show its full file path (`--full-paths`) or not.
pub fn show_full_paths(full: bool) {
    FULL_PATHS.store(full, Ordering::Relaxed);
}

/// A Python file as frames show it, the way py-spy does: relative to the
/// working folder when under it, to `site-packages`/`dist-packages` for an
/// installed package, to `lib/pythonX.Y` for the standard library
/// (`json/decoder.py`); otherwise, and with `--full-paths`, as written.
pub fn display_file(file: &str) -> &str {
    if FULL_PATHS.load(Ordering::Relaxed) || !file.starts_with('/') {
        return file;
    }
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(at) = file.find(marker) {
            return &file[at + marker.len()..];
        }
    }
    for marker in ["/lib/python", "/lib64/python"] {
        if let Some(at) = file.find(marker) {
            let version_end = file[at + marker.len()..].find('/');
            if let Some(end) = version_end {
                return &file[at + marker.len() + end + 1..];
            }
        }
    }
    let cwd = WORKING_FOLDER.get_or_init(|| {
        let dir = std::env::current_dir().ok()?;
        Some(format!("{}/", dir.to_str()?.trim_end_matches('/')))
    });
    match cwd {
        Some(cwd) if cwd != "/" => file.strip_prefix(cwd.as_str()).unwrap_or(file),
        _ => file,
    }
}

impl fmt::Display for Frame {
    /// `function (file:line)` (the file as [`display_file`] shows it),
    /// `symbol`, `[file NAME]` / `[shmem NAME]`, or `[reason]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Python {
                function,
                file,
                line,
            } => write!(f, "{function} ({}:{line})", display_file(file)),
            Self::Native { symbol, .. } => f.write_str(symbol),
            Self::Mapping { mapping, name } => match mapping {
                MappingKind::File => write!(f, "[file {name}]"),
                MappingKind::Shmem => write!(f, "[shmem {name}]"),
            },
            Self::Unknown { reason } => write!(f, "[{reason}]"),
        }
    }
}

impl Frame {
    /// Whether this is a Python frame of the user's own code: not the
    /// standard library, an installed package (a file under a
    /// `lib/pythonX.Y/` or `site-packages`/`dist-packages` folder) or a
    /// frozen module (`<frozen importlib._bootstrap>`). Native, mapping
    /// and unknown frames are not.
    pub fn is_user_code(&self) -> bool {
        match self {
            Self::Python { file, .. } => {
                !file.starts_with('<')
                    && !file.contains("/lib/python")
                    && !file.contains("/lib64/python")
                    && !file.contains("site-packages/")
                    && !file.contains("dist-packages/")
            }
            _ => false,
        }
    }

    /// The native library this frame runs in, when it is neither the
    /// interpreter (`python3.11`, `libpython3.11.so.1.0`) nor the C runtime
    /// (`libc`, the dynamic loader, `libm`, `libpthread`, `libdl`, the vDSO):
    /// memory a C extension or an embedded library (`libsqlite3.so.0`,
    /// `_json.cpython-311-x86_64-linux-gnu.so`) allocated itself.
    pub fn native_library(&self) -> Option<&str> {
        match self {
            Self::Native {
                module: Some(module),
                ..
            } if !module.starts_with("python")
                && !module.starts_with("libpython")
                && !crate::symbolize::is_c_runtime(module) =>
            {
                Some(module)
            }
            _ => None,
        }
    }

    /// Whether this frame is CPython's import machinery (the frozen
    /// `importlib._bootstrap` modules): memory grown under it is what an
    /// `import` loads (code objects, module state), not what a request keeps.
    pub fn is_import_machinery(&self) -> bool {
        matches!(self, Self::Python { file, .. } if file.starts_with("<frozen importlib"))
    }

    /// `function (file name:line)` for a Python frame (the file cut to its
    /// last component, as people say it: `render_report (app.py:84)`),
    /// `[file name]` for a mapping (the file without its folders), else the
    /// frame as [`Display`](fmt::Display) writes it.
    pub fn short(&self) -> String {
        match self {
            Self::Python {
                function,
                file,
                line,
            } => {
                let name = file.rsplit('/').next().unwrap_or(file);
                format!("{function} ({name}:{line})")
            }
            Self::Mapping { mapping, name } => Self::Mapping {
                mapping: *mapping,
                name: name.rsplit('/').next().unwrap_or(name).to_owned(),
            }
            .to_string(),
            other => other.to_string(),
        }
    }
}

impl From<PyLocation> for Frame {
    /// The Python frame at `location`.
    fn from(location: PyLocation) -> Self {
        Self::Python {
            function: location.function,
            file: location.file,
            line: location.line,
        }
    }
}

/// A process entered the trace: a target at attach, a fork's child, or
/// `memtrace run`'s command (also a line of a capture file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStart {
    /// Its tgid.
    pub tgid: u32,
    /// When it started, CLOCK_BOOTTIME nanoseconds (the kernel's
    /// `task_struct.start_boottime` for a fork's child; `/proc/PID/stat`
    /// field 22 times 10 ms for a process that was already running). With
    /// the tgid, the process's identity.
    pub start_time_ns: u64,
    /// The traced process it was forked from, when known.
    pub parent: Option<ProcessId>,
    /// Root or worker.
    pub role: Role,
    /// Its command line.
    pub cmdline: String,
    /// When it entered the trace (CLOCK_MONOTONIC ns, the records' clock).
    pub ts_ns: u64,
    /// Its counters then: the RSS it starts from (inherited at fork, read
    /// from /proc at attach, unknown for `run`'s command before its execve).
    #[serde(with = "crate::aggregate::CountersDef")]
    pub counters: ProcessCounters,
    /// Its PSS and USS when it entered the trace (read as soon as the fork
    /// or attach was seen, before it can un-share much), if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<super::Sharing>,
}

/// How a process ended, as `wait(2)` would tell its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum ExitStatus {
    /// It exited with this status (0-255).
    Code {
        /// The exit status.
        code: u8,
    },
    /// A signal killed it.
    Signal {
        /// The signal number.
        signal: u8,
        /// Whether it dumped core.
        core_dumped: bool,
        /// Whether the kernel's OOM killer sent it (the process was its
        /// victim: `memtrace_common::ExitRecord::oom_victim`); false when
        /// not known (`wait(2)` does not tell).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        oom_killed: bool,
    },
}

impl ExitStatus {
    /// Decodes `task_struct.exit_code` (the `wait(2)` status word: `code <<
    /// 8`, or the signal number with 0x80 for a core dump).
    pub fn from_wait_status(raw: u32) -> Self {
        let signal = (raw & 0x7f) as u8;
        if signal == 0 {
            Self::Code {
                code: ((raw >> 8) & 0xff) as u8,
            }
        } else {
            Self::Signal {
                signal,
                core_dumped: raw & 0x80 != 0,
                oom_killed: false,
            }
        }
    }

    /// [`Self::from_wait_status`] of an exit record's `exit_code`, killed by
    /// the OOM killer when `oom_victim` and a signal ended it (a victim
    /// already exiting on its own keeps its exit code).
    pub fn from_exit_record(raw: u32, oom_victim: bool) -> Self {
        match Self::from_wait_status(raw) {
            Self::Signal {
                signal,
                core_dumped,
                ..
            } => Self::Signal {
                signal,
                core_dumped,
                oom_killed: oom_victim,
            },
            code => code,
        }
    }

    /// Whether the kernel's OOM killer ended it.
    pub fn oom_killed(self) -> bool {
        matches!(
            self,
            Self::Signal {
                oom_killed: true,
                ..
            }
        )
    }

    /// What a shell reports as `$?`: the code, or 128 + the signal.
    pub fn shell_status(self) -> u8 {
        match self {
            Self::Code { code } => code,
            Self::Signal { signal, .. } => 128_u8.saturating_add(signal),
        }
    }
}

impl fmt::Display for ExitStatus {
    /// `exit 3`, `SIGKILL`, `SIGSEGV (core dumped)`, `SIGKILL (OOM
    /// killer)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code { code } => write!(f, "exit {code}"),
            Self::Signal {
                signal,
                core_dumped,
                oom_killed,
            } => {
                match nix::sys::signal::Signal::try_from(i32::from(*signal)) {
                    Ok(sig) => f.write_str(sig.as_str())?,
                    Err(_) => write!(f, "signal {signal}")?,
                }
                if *core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                if *oom_killed {
                    f.write_str(" (OOM killer)")?;
                }
                Ok(())
            }
        }
    }
}

/// What began a process's exit (its memory is taken as it was then).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitBegin {
    /// CPython's finalization, once its threads are joined and its `atexit`
    /// handlers ran (see `memtrace_common::ExitBeginReason`).
    PythonFinalize,
    /// `exit_group(2)` (C `exit()`, `os._exit()`).
    ExitGroup,
    /// The exit record itself: a fatal signal, or no earlier sign.
    Exit,
}

impl From<memtrace_common::ExitBeginReason> for ExitBegin {
    fn from(reason: memtrace_common::ExitBeginReason) -> Self {
        match reason {
            memtrace_common::ExitBeginReason::PythonFinalize => Self::PythonFinalize,
            memtrace_common::ExitBeginReason::ExitGroup => Self::ExitGroup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_decode_like_a_shell() {
        assert_eq!(
            ExitStatus::from_wait_status(3 << 8),
            ExitStatus::Code { code: 3 }
        );
        let killed = ExitStatus::from_wait_status(9);
        assert_eq!(killed.shell_status(), 137);
        assert_eq!(killed.to_string(), "SIGKILL");
        let segv = ExitStatus::from_wait_status(11 | 0x80);
        assert_eq!(segv.shell_status(), 139);
        assert_eq!(segv.to_string(), "SIGSEGV (core dumped)");
        assert_eq!(ExitStatus::from_wait_status(0).to_string(), "exit 0");
    }

    #[test]
    fn oom_victims_killed_by_a_signal_are_said() {
        let oom = ExitStatus::from_exit_record(9, true);
        assert!(oom.oom_killed());
        assert_eq!(oom.to_string(), "SIGKILL (OOM killer)");
        assert_eq!(oom.shell_status(), 137);
        // A victim already exiting on its own keeps its code.
        let exiting = ExitStatus::from_exit_record(1 << 8, true);
        assert_eq!(exiting, ExitStatus::Code { code: 1 });
        assert!(!ExitStatus::from_exit_record(9, false).oom_killed());
        let json = serde_json::to_value(oom).unwrap();
        assert_eq!(json["oom_killed"], true);
        let plain = serde_json::to_value(ExitStatus::from_wait_status(9)).unwrap();
        assert!(plain.get("oom_killed").is_none(), "{plain}");
    }

    #[test]
    fn frames_display_as_in_the_report() {
        let mapping = Frame::Mapping {
            mapping: MappingKind::File,
            name: "/data/big.bin".to_owned(),
        };
        assert_eq!(mapping.to_string(), "[file /data/big.bin]");
        let unknown = Frame::Unknown {
            reason: "no thread state".to_owned(),
        };
        assert_eq!(unknown.to_string(), "[no thread state]");
    }

    #[test]
    fn files_show_py_spy_style() {
        assert_eq!(
            display_file("/usr/lib/python3.11/json/decoder.py"),
            "json/decoder.py"
        );
        assert_eq!(
            display_file("/srv/venv/lib/python3.12/site-packages/flask/app.py"),
            "flask/app.py"
        );
        assert_eq!(
            display_file("<frozen importlib._bootstrap>"),
            "<frozen importlib._bootstrap>"
        );
        let cwd = std::env::current_dir().unwrap();
        let inside = format!("{}/pkg/mod.py", cwd.display());
        assert_eq!(display_file(&inside), "pkg/mod.py");
        assert_eq!(display_file("/elsewhere/app.py"), "/elsewhere/app.py");
    }
}
