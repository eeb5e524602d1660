//! The sampler installed into running processes (`record --pid
//! --allocations` on CPython 3.14+): per mount namespace of the targets, a
//! copy of the library and of a two-line script in a folder the target
//! sees (`/tmp/memtrace-<memtrace's pid>` of its root, written through
//! `/proc/PID/root` when its namespace is not memtrace's); the script is
//! handed to each target with CPython's remote-debugging protocol
//! (`python::remote_exec`), and the install is seen when the target maps
//! the library and its `memtrace_sampler_on` reads 1.

use std::collections::HashMap;
use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use memtrace_common::{SAMPLER_FILE_NAME, SAMPLER_ON_SYMBOL};

use super::{mapped_base, symbol_offset, write_file, LIBRARY};
use crate::python::remote_exec::{self, PendingExec};
use crate::python::PythonProcess;

/// How long a target's main thread has to run the script and start the
/// sampler.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the install is looked for.
const INSTALL_POLL: Duration = Duration::from_millis(10);

/// What `--alloc-hooks uprobes` costs, for the messages that offer it.
const UPROBES_OFFER: &str = "--alloc-hooks uprobes hooks it without installing anything, \
     but traps every allocator call into the kernel (about 2 us each: allocation-heavy code \
     runs many times slower)";

/// One copy of the files, for the targets of one mount namespace.
#[derive(Debug)]
struct Files {
    /// The folder as memtrace reaches it (removed on drop).
    dir: PathBuf,
    /// The library as memtrace reaches it (the uprobes' target).
    library: PathBuf,
    /// The library and the script as the targets name them.
    library_in_target: PathBuf,
    script_in_target: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The sampler of `record --pid`: the copies, and the CPython processes
/// found that may get it.
#[derive(Debug)]
pub(in crate::app) struct RemoteSampler {
    mean_bytes: u64,
    /// Per mount namespace (its inode).
    copies: HashMap<u64, Files>,
    /// Processes found running CPython, not yet installed.
    pythons: HashMap<u32, Box<PythonProcess>>,
}

impl RemoteSampler {
    /// A sampler with the countdown mean `mean_bytes` (`--sample-bytes`).
    pub(in crate::app) fn new(mean_bytes: u64) -> Self {
        Self {
            mean_bytes,
            copies: HashMap::new(),
            pythons: HashMap::new(),
        }
    }

    /// CPython probing found `process` in `tgid`.
    pub(in crate::app) fn python_found(&mut self, tgid: u32, process: &PythonProcess) {
        self.pythons.insert(tgid, Box::new(process.clone()));
    }

    /// The library the probes of `tgid` go on, once `tgid` is known to take
    /// the sampler: it already maps a copy (a fork's child), or it runs
    /// CPython 3.14+ with remote debugging enabled (its namespace's copy is
    /// written then).
    ///
    /// # Errors
    /// Why it cannot get the sampler, with the way out.
    pub(in crate::app) fn prepare(&mut self, tgid: u32) -> Result<PathBuf> {
        if let Some(copy) = self.mapped_copy(tgid) {
            return Ok(copy.library.clone());
        }
        let Some(process) = self.pythons.get(&tgid) else {
            bail!(
                "the sampler is installed through CPython 3.14+'s remote debugging, and this \
                 process runs no CPython memtrace could read; {UPROBES_OFFER}"
            );
        };
        remote_exec::check(process, tgid).map_err(|err| {
            anyhow::anyhow!(
                "{err}: the sampler cannot be installed without a restart; {UPROBES_OFFER}, \
                 or start it under `memtrace run --allocations`"
            )
        })?;
        let namespace = mount_namespace(tgid)?;
        if !self.copies.contains_key(&namespace) {
            let shared = namespace == mount_namespace(std::process::id())?;
            let copy = write_copy(tgid, shared, self.mean_bytes)?;
            self.copies.insert(namespace, copy);
        }
        Ok(self.copies[&namespace].library.clone())
    }

    /// Installs the sampler in `tgid` (its probes are attached) unless it
    /// maps it already: hands it the script and waits up to
    /// [`INSTALL_TIMEOUT`] for its sampling to be on.
    ///
    /// # Errors
    /// The request failed, or the install was not seen in time (the request
    /// is withdrawn then).
    pub(in crate::app) fn install(&mut self, tgid: u32) -> Result<()> {
        if self.on_flag(tgid)?.is_some() {
            return Ok(()); // inherited from its parent
        }
        let process = self
            .pythons
            .remove(&tgid)
            .context("not a CPython process")?;
        let namespace = mount_namespace(tgid)?;
        let copy = self
            .copies
            .get(&namespace)
            .context("no copy of the sampler")?;
        let pending = remote_exec::request(&process, tgid, &copy.script_in_target)
            .context("cannot hand the sampler's script to CPython")?;
        self.wait_installed(tgid, &pending)
    }

    /// Waits for `tgid`'s sampling to be on; withdraws `pending` on timeout.
    fn wait_installed(&self, tgid: u32, pending: &PendingExec) -> Result<()> {
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        let mut taken_at = None;
        loop {
            if self.on_flag(tgid)? == Some(true) {
                return Ok(());
            }
            if taken_at.is_none() && pending.taken()? {
                taken_at = Some(Instant::now());
            }
            if taken_at.is_some_and(|at| at.elapsed() > Duration::from_secs(2)) {
                bail!(
                    "its main thread ran memtrace's script but the sampler did not start (the \
                     process's standard error says why); {UPROBES_OFFER}"
                );
            }
            if Instant::now() >= deadline {
                pending.withdraw()?;
                bail!(
                    "its main thread ran no Python code within {} s (CPython runs the script \
                     at its next eval-breaker check: a thread blocked in a system call does \
                     not get there); {UPROBES_OFFER}",
                    INSTALL_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(INSTALL_POLL);
        }
    }

    /// The copy of the library `tgid` maps, if any.
    fn mapped_copy(&self, tgid: u32) -> Option<&Files> {
        self.copies
            .values()
            .find(|copy| matches!(mapped_base(tgid, &copy.library_in_target), Ok(Some(_))))
    }

    /// Whether `tgid`'s `memtrace_sampler_on` is set, if it maps a copy.
    fn on_flag(&self, tgid: u32) -> Result<Option<bool>> {
        let Some((addr, _)) = self.mapped(tgid)? else {
            return Ok(None);
        };
        Ok(Some(super::read_on_flag(tgid, addr)?))
    }

    /// The address of `memtrace_sampler_on` in `tgid` and the copy it maps.
    fn mapped(&self, tgid: u32) -> Result<Option<(u64, &Files)>> {
        let offset = symbol_offset(LIBRARY, SAMPLER_ON_SYMBOL)
            .context("the sampler library has no `memtrace_sampler_on`")?;
        for copy in self.copies.values() {
            if let Some(base) = mapped_base(tgid, &copy.library_in_target)? {
                return Ok(Some((base + offset, copy)));
            }
        }
        Ok(None)
    }

    /// Turns sampling off in `tgid` if it maps a copy (its wrappers then
    /// only forward to the allocators under them, which own every block).
    /// Returns whether it did.
    ///
    /// # Errors
    /// When the process's memory cannot be written.
    pub(in crate::app) fn stop_sampling(&self, tgid: u32) -> Result<bool> {
        let Some((addr, _)) = self.mapped(tgid)? else {
            return Ok(false);
        };
        super::write_on_flag(tgid, addr, false)?;
        Ok(true)
    }
}

/// The inode of `tgid`'s mount namespace.
fn mount_namespace(tgid: u32) -> Result<u64> {
    let link = format!("/proc/{tgid}/ns/mnt");
    Ok(std::fs::metadata(&link)
        .with_context(|| format!("cannot read `{link}`"))?
        .ino())
}

/// Writes a copy for the namespace of `tgid`: `/tmp/memtrace-<pid>` of its
/// root (of memtrace's own when `shared`), the folder 0755 and its files
/// read-only for all (the target may run as any user; only root writes
/// them), the script naming the library as the target sees it.
fn write_copy(tgid: u32, shared: bool, mean_bytes: u64) -> Result<Files> {
    let in_target = PathBuf::from(format!("/tmp/memtrace-{}", std::process::id()));
    let dir = if shared {
        in_target.clone()
    } else {
        Path::new(&format!("/proc/{tgid}/root")).join(in_target.strip_prefix("/")?)
    };
    DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .with_context(|| format!("cannot create `{}`", dir.display()))?;
    readable_by_all(&dir, 0o755)?;
    let library_in_target = in_target.join(SAMPLER_FILE_NAME);
    let script_in_target = in_target.join("install_sampler.py");
    let copy = Files {
        library: dir.join(SAMPLER_FILE_NAME),
        dir,
        library_in_target,
        script_in_target,
    };
    write_file(&copy.library, LIBRARY, 0o555)?;
    readable_by_all(&copy.library, 0o555)?;
    let script = script(&copy.library_in_target, mean_bytes)?;
    let script_path = copy.dir.join("install_sampler.py");
    write_file(&script_path, script.as_bytes(), 0o444)?;
    readable_by_all(&script_path, 0o444)?;
    Ok(copy)
}

/// Sets `path`'s permissions to `mode` whatever memtrace's umask took off
/// at its creation.
fn readable_by_all(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the permissions of `{}`", path.display()))
}

/// The script CPython runs: loads the library with ctypes and starts it
/// (`memtrace_sampler_start`: wrappers on the three allocator domains,
/// sampling on with the countdown mean `mean_bytes`), binding no name in
/// the namespace it runs in.
fn script(library: &Path, mean_bytes: u64) -> Result<String> {
    let path = library
        .to_str()
        .context("the sampler's path is not UTF-8")?;
    Ok(format!(
        "# memtrace record --pid --allocations: starts memtrace's allocation sampler\n\
         __import__('ctypes').CDLL({path:?}).memtrace_sampler_start(__import__('ctypes').c_uint64({mean_bytes}))\n"
    ))
}
