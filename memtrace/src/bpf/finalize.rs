//! Kernel side, userspace half: the uprobes where a Python process's exit
//! begins (`memtrace-ebpf/src/probes/sched.rs` `python_finalize*`), placed
//! per CPython version on the functions [`super::elf_symbols`] finds, and
//! what is lost when a binary lacks one of them.

use std::collections::HashMap;
use std::path::Path;

use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeScope},
    UProbe,
};

use super::elf_symbols::{file_identity, FileIdentity, Function, Image};
use super::{program_error, program_mut, BpfError, Tracer};

/// The uprobe that begins the exit on entry to [`PYTHON_FINALIZE_SYMBOLS`]
/// (binaries without their version's [`teardown_symbol`]).
pub(super) const PYTHON_FINALIZE_PROGRAM: &str = "python_finalize";
/// The uprobe that marks [`PYTHON_FINALIZE_SYMBOLS`] entered (the exit
/// begins later, at the [`teardown_symbol`]).
pub(super) const PYTHON_FINALIZE_ENTERED_PROGRAM: &str = "python_finalize_entered";
/// The uprobe on the [`teardown_symbol`] up to 3.13: begins the exit
/// unless the call is the one after `os.fork()`.
pub(super) const PYTHON_TEARDOWN_PROGRAM: &str = "python_finalize_teardown";
/// The uprobe on the [`teardown_symbol`] from 3.14, where
/// `Py_EndInterpreter` calls it too: begins the exit once finalization was
/// entered, or on the main thread (a sub-interpreter closed on the main
/// thread before finalization then begins it early).
pub(super) const PYTHON_TEARDOWN_ENTERED_PROGRAM: &str = "python_finalize_teardown_entered";

/// The programs of this module, loaded with the others.
pub(super) const PROGRAMS: [&str; 4] = [
    PYTHON_FINALIZE_PROGRAM,
    PYTHON_FINALIZE_ENTERED_PROGRAM,
    PYTHON_TEARDOWN_PROGRAM,
    PYTHON_TEARDOWN_ENTERED_PROGRAM,
];

/// CPython functions entered when the interpreter starts to finalize
/// (Python/pylifecycle.c): `Py_FinalizeEx` (end of `Py_RunMain`, embedders)
/// and `Py_Exit` (`sys.exit()` reaching the top; on 3.13+ it finalizes
/// without calling `Py_FinalizeEx`). Both are exported in `.dynsym` of
/// libpython and of Debian's static interpreters (3.11 to 3.15).
pub const PYTHON_FINALIZE_SYMBOLS: [&str; 2] = ["Py_FinalizeEx", "Py_Exit"];

/// The function `Py_FinalizeEx` calls once it has joined the non-daemon
/// threads and run the `atexit` handlers, right before the interpreter
/// frees its objects: where a Python process's exit begins.
/// `_PyThreadState_DeleteExcept` up to 3.12 (exported);
/// `_PyThreadState_RemoveExcept` from 3.13 (not exported: in `.symtab`, or
/// for Debian's stripped 3.14/3.15 in the `-dbg` debug file), which 3.13
/// introduced when it split removing the other thread states from deleting
/// them. Both are also called in the child after `os.fork()`, which the
/// BPF program ignores (finalization was not entered).
#[must_use]
pub fn teardown_symbol(major: u8, minor: u8) -> &'static str {
    if (major, minor) < (3, 13) {
        "_PyThreadState_DeleteExcept"
    } else {
        "_PyThreadState_RemoveExcept"
    }
}

/// Where the exit of a binary's processes begins, and why not precisely
/// when a symbol is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitPoint {
    /// At the [`teardown_symbol`], after threads and `atexit` handlers: as
    /// precise as it gets.
    Teardown,
    /// At finalization's entry: the teardown symbol (named) was not found.
    FinalizeEntry {
        /// The missing symbol.
        missing: &'static str,
    },
    /// At `exit_group`: neither `Py_FinalizeEx` nor `Py_Exit` was found.
    ExitGroup,
}

/// Where Debian's and Ubuntu's users get the missing symbols.
const SYMBOLS_HINT: &str = "not in .dynsym, .symtab, nor a debug file by build-id under \
    --debug-dir or /usr/lib/debug (Debian: pythonX.Y-dbg)";

impl ExitPoint {
    /// What a report says about `binary` with this exit point, `None` for
    /// [`ExitPoint::Teardown`].
    #[must_use]
    pub fn caveat(&self, binary: &Path) -> Option<String> {
        let binary = binary.display();
        match self {
            Self::Teardown => None,
            Self::FinalizeEntry { missing } => Some(format!(
                "`{binary}` has no symbol {missing} ({SYMBOLS_HINT}): exit begins at \
                 Py_FinalizeEx: a thread still running after main returned is cut off, and \
                 the atexit handlers are not counted"
            )),
            Self::ExitGroup => Some(format!(
                "`{binary}` has no symbol Py_FinalizeEx nor Py_Exit ({SYMBOLS_HINT}): the \
                 exit is taken at exit_group, after the interpreter freed its objects: what a \
                 process held until it exited counts as released"
            )),
        }
    }
}

/// The exit point of each binary probed so far, by file (however it was
/// reached: its own path, or `/proc/PID/map_files/...`).
#[derive(Default)]
pub(super) struct FinalizeProbes {
    by_binary: HashMap<FileIdentity, ExitPoint>,
}

impl Tracer {
    /// Attaches the finalization uprobes to `binary` (a CPython `major.minor`
    /// executable or libpython), once per binary, for every process that
    /// maps it (the programs ignore untraced ones): on the version's
    /// [`teardown_symbol`] and, to mark finalization entered, on
    /// [`PYTHON_FINALIZE_SYMBOLS`]; without the former, on
    /// [`PYTHON_FINALIZE_SYMBOLS`] alone, to begin the exit there. Returns
    /// where the exit of its processes begins.
    ///
    /// # Errors
    /// [`BpfError::Symbols`] when `binary` cannot be read,
    /// [`BpfError::Program`] when attaching fails.
    pub fn attach_python_finalize(
        &mut self,
        binary: &Path,
        (major, minor): (u8, u8),
    ) -> Result<ExitPoint, BpfError> {
        let key = file_identity(binary);
        if let Some(point) = self.finalize.by_binary.get(&key) {
            return Ok(point.clone());
        }
        let image = self
            .symbols
            .image(binary)
            .map_err(|err| BpfError::Symbols {
                path: binary.to_owned(),
                detail: format!("{err:#}"),
            })?;
        let teardown_name = teardown_symbol(major, minor);
        let teardown = image.function(teardown_name).cloned();
        let entries = functions(&image, &PYTHON_FINALIZE_SYMBOLS);
        // From 3.14 `Py_EndInterpreter` calls the teardown too: there it
        // counts only after a finalize entry or on the main thread.
        let strict = (major, minor) >= (3, 14);
        let teardown = teardown.filter(|_| !(strict && entries.is_empty()));
        let point = match (&teardown, entries.is_empty()) {
            (Some(_), _) => ExitPoint::Teardown,
            (None, false) => ExitPoint::FinalizeEntry {
                missing: teardown_name,
            },
            (None, true) => ExitPoint::ExitGroup,
        };
        if let Some(teardown) = &teardown {
            let program = if strict {
                PYTHON_TEARDOWN_ENTERED_PROGRAM
            } else {
                PYTHON_TEARDOWN_PROGRAM
            };
            self.attach_at(program, teardown, binary)?;
        }
        let entry_program = if teardown.is_some() {
            PYTHON_FINALIZE_ENTERED_PROGRAM
        } else {
            PYTHON_FINALIZE_PROGRAM
        };
        for entry in &entries {
            self.attach_at(entry_program, entry, binary)?;
        }
        self.finalize.by_binary.insert(key, point.clone());
        Ok(point)
    }

    /// Attaches uprobe `program` at the first instruction of `function` of
    /// `binary`, for every process.
    fn attach_at(
        &mut self,
        program: &'static str,
        function: &Function,
        binary: &Path,
    ) -> Result<(), BpfError> {
        let uprobe: &mut UProbe = program_mut(&mut self.ebpf, program)?;
        uprobe
            .attach(
                UProbeAttachLocation::AbsoluteOffset(function.file_offset),
                binary,
                UProbeScope::AllProcesses,
            )
            .map(|_| ())
            .map_err(|source| program_error(program, "attach", source))
    }
}

/// The functions among `names` that `image` has, each address once (an
/// alias is probed once).
fn functions(image: &Image, names: &[&str]) -> Vec<Function> {
    let mut found: Vec<Function> = Vec::new();
    for name in names {
        if let Some(function) = image.function(name) {
            if !found.iter().any(|f| f.file_offset == function.file_offset) {
                found.push(function.clone());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_teardown_function_changed_name_in_3_13() {
        assert_eq!(teardown_symbol(3, 9), "_PyThreadState_DeleteExcept");
        assert_eq!(teardown_symbol(3, 12), "_PyThreadState_DeleteExcept");
        assert_eq!(teardown_symbol(3, 13), "_PyThreadState_RemoveExcept");
        assert_eq!(teardown_symbol(3, 15), "_PyThreadState_RemoveExcept");
    }

    #[test]
    fn a_missing_teardown_symbol_is_named_with_its_cost() {
        let point = ExitPoint::FinalizeEntry {
            missing: "_PyThreadState_RemoveExcept",
        };

        let caveat = point.caveat(Path::new("/usr/bin/python3.14")).unwrap();
        assert!(caveat.contains("_PyThreadState_RemoveExcept"), "{caveat}");
        assert!(
            caveat.contains(
                "exit begins at Py_FinalizeEx: a thread still running after main returned is cut off"
            ),
            "{caveat}"
        );
        assert_eq!(ExitPoint::Teardown.caveat(Path::new("/x")), None);
    }
}
