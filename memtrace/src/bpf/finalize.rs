//! Part of the probe step (`bpf`): CPython's finalization uprobes (the
//! start of a Python process's exit), attached once per file however the
//! file was reached (its own path, or `/proc/PID/map_files/...` of each
//! process that maps it).

use std::path::{Path, PathBuf};

use super::{
    attach_uprobe, BpfError, Tracer, PYTHON_FINALIZE_ENTERED_PROGRAM, PYTHON_FINALIZE_PROGRAM,
    PYTHON_FINALIZE_SYMBOLS, PYTHON_TEARDOWN_PROGRAM, PYTHON_TEARDOWN_SYMBOL,
};

impl Tracer {
    /// Attaches the finalization uprobes to `binary` (a CPython executable
    /// or libpython), once per binary, for every process that maps it (the
    /// programs ignore untraced ones): on [`PYTHON_TEARDOWN_SYMBOL`] and, to
    /// mark finalization entered, on [`PYTHON_FINALIZE_SYMBOLS`]; without the
    /// former, on [`PYTHON_FINALIZE_SYMBOLS`] alone, to begin the exit there.
    /// `Ok(false)` when the binary has none of these symbols.
    ///
    /// # Errors
    /// [`BpfError::Program`] when attaching fails for another reason.
    pub fn attach_python_finalize(&mut self, binary: &Path) -> Result<bool, BpfError> {
        let key = file_identity(binary);
        if self.finalize_attached.contains(&key) {
            return Ok(true);
        }
        let teardown = attach_uprobe(
            &mut self.ebpf,
            PYTHON_TEARDOWN_PROGRAM,
            &[PYTHON_TEARDOWN_SYMBOL],
            binary,
        )?;
        let entry_program = if teardown {
            PYTHON_FINALIZE_ENTERED_PROGRAM
        } else {
            PYTHON_FINALIZE_PROGRAM
        };
        let entered = attach_uprobe(
            &mut self.ebpf,
            entry_program,
            &PYTHON_FINALIZE_SYMBOLS,
            binary,
        )?;
        let attached = teardown || entered;
        if attached {
            self.finalize_attached.insert(key);
        }
        Ok(attached)
    }
}

/// What tells one file from another however it is reached (its own path,
/// `/proc/PID/map_files/...` of each process that maps it): its device and
/// inode, else (when it cannot be read) its path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum FileIdentity {
    Inode { dev: u64, ino: u64 },
    Path(PathBuf),
}

/// The [`FileIdentity`] of `path`.
pub(super) fn file_identity(path: &Path) -> FileIdentity {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map_or_else(
        |_| FileIdentity::Path(path.to_owned()),
        |m| FileIdentity::Inode {
            dev: m.dev(),
            ino: m.ino(),
        },
    )
}
