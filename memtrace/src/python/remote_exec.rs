//! CPython's remote-debugging protocol (PEP 768, 3.14+; what
//! `sys.remote_exec` speaks), spoken by memtrace itself: asks a running
//! interpreter to run a Python script file at its next safe point. Part of
//! the `python` stage, used by allocator mode when `record --pid` installs
//! the in-process sampler (`app::sampler`).
//!
//! From the target's `_Py_DebugOffsets` ([`RemoteDebugLayout`]): the main
//! interpreter (`_PyRuntime` + `interpreters_head`) must have
//! `config.remote_debug` set (cleared by `PYTHON_DISABLE_REMOTE_DEBUG` and
//! `-X disable-remote-debug`); in its main thread's state the script's path
//! goes into `remote_debugger_support.debugger_script_path` (NUL-terminated),
//! then `debugger_pending_call` becomes 1, then the eval breaker gets
//! `_PY_EVAL_PLEASE_STOP_BIT`. The thread runs the file (the audit event
//! `cpython.remote_debugger_script`, then its source) when it next checks
//! its eval breaker, and clears the pending flag first. The writes use
//! `process_vm_writev`.

use std::path::Path;

use thiserror::Error;

use super::debug_offsets::{remote_debug, RemoteDebugLayout, DEBUG_OFFSETS_READ_BYTES};
use super::mem::{MemError, ProcessMemory};
use super::types::PythonVersion;
use super::PythonProcess;

/// `_PY_EVAL_PLEASE_STOP_BIT` of `PyThreadState.eval_breaker`
/// (Include/internal/pycore_ceval.h, 3.14 and 3.15).
const EVAL_PLEASE_STOP_BIT: u64 = 1 << 5;

/// Why a script could not be handed to a process.
#[derive(Debug, Error)]
pub enum RemoteExecError {
    /// Below 3.14 (or a minor version whose struct memtrace does not know).
    #[error("CPython {version} has no remote-debugging interface (PEP 768 came with 3.14)")]
    Unsupported {
        /// The process's version.
        version: PythonVersion,
    },
    /// The interpreter's `config.remote_debug` is not 1.
    #[error(
        "process {tgid} disabled CPython's remote debugging (PYTHON_DISABLE_REMOTE_DEBUG, \
         -X disable-remote-debug, or a build without it)"
    )]
    Disabled {
        /// The process.
        tgid: u32,
    },
    /// No main interpreter or no main thread state (not started, or
    /// finalizing).
    #[error("process {tgid} has no main {what} yet (or any more)")]
    NotRunning {
        /// The process.
        tgid: u32,
        /// `interpreter` or `thread state`.
        what: &'static str,
    },
    /// The path does not fit `debugger_script_path`.
    #[error("the script path `{path}` is longer than the {max_bytes} bytes CPython keeps")]
    PathTooLong {
        /// The path.
        path: String,
        /// `debugger_script_path_size` less the NUL.
        max_bytes: u64,
    },
    /// A read of the target's memory failed.
    #[error(transparent)]
    Read(#[from] MemError),
    /// A write of the target's memory failed.
    #[error("cannot write {len_bytes} bytes at {addr:#x} of process {tgid}")]
    Write {
        /// The process.
        tgid: u32,
        /// Where.
        addr: u64,
        /// How many.
        len_bytes: usize,
        /// The error of `process_vm_writev`.
        #[source]
        source: std::io::Error,
    },
}

/// A script handed to a process's main thread, not necessarily run yet.
#[derive(Debug)]
pub struct PendingExec {
    tgid: u32,
    /// Address of the main thread's `debugger_pending_call`.
    pending_addr: u64,
}

/// The main thread's `_PyRemoteDebuggerSupport` of `process` after the
/// checks of the protocol: the address of its pending flag and path, and
/// the path's capacity.
struct Target {
    tstate: u64,
    layout: RemoteDebugLayout,
}

/// Finds `process`'s main thread state and checks that it accepts
/// scripts.
fn target(memory: &ProcessMemory, process: &PythonProcess) -> Result<Target, RemoteExecError> {
    let tgid = memory.tgid();
    let debug = memory.read_array::<DEBUG_OFFSETS_READ_BYTES>(process.runtime_addr)?;
    let Some(layout) = remote_debug(&debug, process.info.version_hex) else {
        return Err(RemoteExecError::Unsupported {
            version: process.version,
        });
    };
    let interp = memory.read_u64(process.runtime_addr + layout.interpreters_head)?;
    if interp == 0 {
        let what = "interpreter";
        return Err(RemoteExecError::NotRunning { tgid, what });
    }
    if memory.read_u32(interp + layout.enabled)? != 1 {
        return Err(RemoteExecError::Disabled { tgid });
    }
    let tstate = memory.read_u64(interp + layout.threads_main)?;
    if tstate == 0 {
        let what = "thread state";
        return Err(RemoteExecError::NotRunning { tgid, what });
    }
    Ok(Target { tstate, layout })
}

/// Checks, without writing anything, that `process` would accept a script:
/// 3.14+, remote debugging enabled, a main thread.
///
/// # Errors
/// As [`request`], but never [`RemoteExecError::PathTooLong`] or `Write`.
pub fn check(process: &PythonProcess, tgid: u32) -> Result<(), RemoteExecError> {
    target(&ProcessMemory::open(tgid)?, process).map(|_| ())
}

/// Asks process `tgid` (running `process`) to run the script at `script`
/// (a path the target opens itself: in its mount namespace) in its main
/// thread.
///
/// # Errors
/// [`RemoteExecError`]: the version, the interpreter's refusal, the path's
/// length, or a failed read or write of its memory.
pub fn request(
    process: &PythonProcess,
    tgid: u32,
    script: &Path,
) -> Result<PendingExec, RemoteExecError> {
    let memory = ProcessMemory::open(tgid)?;
    let Target { tstate, layout } = target(&memory, process)?;
    let mut path = script.as_os_str().as_encoded_bytes().to_vec();
    if path.len() as u64 >= layout.script_path_bytes {
        return Err(RemoteExecError::PathTooLong {
            path: script.display().to_string(),
            max_bytes: layout.script_path_bytes - 1,
        });
    }
    path.push(0);
    let support = tstate + layout.support;
    write(tgid, support + layout.script_path, &path)?;
    let pending_addr = support + layout.pending_call;
    write(tgid, pending_addr, &1i32.to_ne_bytes())?;
    let breaker_addr = tstate + layout.eval_breaker;
    let breaker = memory.read_u64(breaker_addr)?;
    write(
        tgid,
        breaker_addr,
        &(breaker | EVAL_PLEASE_STOP_BIT).to_ne_bytes(),
    )?;
    Ok(PendingExec { tgid, pending_addr })
}

impl PendingExec {
    /// Whether the main thread took the script (cleared its pending flag).
    ///
    /// # Errors
    /// The flag cannot be read (the process is gone).
    pub fn taken(&self) -> Result<bool, RemoteExecError> {
        let memory = ProcessMemory::open(self.tgid)?;
        Ok(memory.read_u32(self.pending_addr)? == 0)
    }

    /// Withdraws the request if the thread has not taken it yet (a thread
    /// that takes it at this very moment still runs the script).
    ///
    /// # Errors
    /// The flag cannot be written.
    pub fn withdraw(&self) -> Result<(), RemoteExecError> {
        write(self.tgid, self.pending_addr, &0i32.to_ne_bytes())
    }
}

/// Writes `bytes` at `addr` of process `tgid` with `process_vm_writev`.
fn write(tgid: u32, addr: u64, bytes: &[u8]) -> Result<(), RemoteExecError> {
    let error = |source| RemoteExecError::Write {
        tgid,
        addr,
        len_bytes: bytes.len(),
        source,
    };
    let pid = libc::pid_t::try_from(tgid)
        .map_err(|_| error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    let local = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: usize::try_from(addr).unwrap_or(usize::MAX) as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: one local iovec over `bytes` (only read), one remote iovec;
    // the kernel checks the remote range.
    let written = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    match usize::try_from(written) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(error(std::io::Error::from(std::io::ErrorKind::WriteZero))),
        Err(_) => Err(error(std::io::Error::last_os_error())),
    }
}
