//! Allocator mode with the in-process sampler (`--alloc-hooks sampler`),
//! before the first step of its data flow: for `run`, writes the sampler
//! library (`memtrace/sampler`, embedded by build.rs) and memtrace's
//! `sitecustomize.py` into a folder of this session under `/run/memtrace`
//! (0700) and gives the command the environment that loads them; for
//! `record --pid`, installs it in running CPython 3.14+ processes
//! ([`remote`]); turns sampling off in the processes still running at the
//! end, and removes the files.

use std::ffi::OsString;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use memtrace_common::{SAMPLER_FILE_NAME, SAMPLER_ON_SYMBOL};
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

pub(super) mod remote;

/// The sampler library, built by memtrace/build.rs.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmemtrace_sampler.so"));

/// Imported first by every Python of the command: installs the sampler on
/// CPython's allocator domains, then imports the program's own
/// `sitecustomize`.
static SITECUSTOMIZE: &str = include_str!("sampler/sitecustomize.py");

/// The folder all sessions' folders are in.
const RUN_DIR: &str = "/run/memtrace";

/// The environment variable naming the library for `sitecustomize.py`.
const LIBRARY_ENV: &str = "MEMTRACE_SAMPLER_LIB";

/// The environment variable giving the sampler its mean (the sampler's
/// `control::MEAN_BYTES_ENV`).
const MEAN_BYTES_ENV: &str = "MEMTRACE_SAMPLER_MEAN_BYTES";

/// This session's sampler files; the folder is removed on drop.
#[derive(Debug)]
pub(super) struct SamplerFiles {
    dir: PathBuf,
    library: PathBuf,
}

impl SamplerFiles {
    /// Writes the library and `sitecustomize.py` into
    /// `/run/memtrace/<memtrace's pid>/` (both folders 0700, the files
    /// 0500 and 0400): a file of its own per session, so that the uprobes
    /// on its markers (per inode) are this session's only.
    ///
    /// # Errors
    /// When a folder or file cannot be created.
    pub(super) fn write() -> Result<Self> {
        let mut builder = DirBuilder::new();
        builder.mode(0o700).recursive(true);
        let dir = Path::new(RUN_DIR).join(std::process::id().to_string());
        builder
            .create(&dir)
            .with_context(|| format!("cannot create `{}`", dir.display()))?;
        let files = Self {
            library: dir.join(SAMPLER_FILE_NAME),
            dir,
        };
        write_file(&files.library, LIBRARY, 0o500)?;
        write_file(
            &files.dir.join("sitecustomize.py"),
            SITECUSTOMIZE.as_bytes(),
            0o400,
        )?;
        Ok(files)
    }

    /// The library's path (the uprobes' target).
    pub(super) fn library(&self) -> &Path {
        &self.library
    }

    /// The variables `run` starts its command with: the library first in
    /// `LD_PRELOAD`, the folder first on `PYTHONPATH` (each before the
    /// value memtrace was given), the library's path and the mean.
    pub(super) fn environment(&self, mean_bytes: u64) -> Vec<(String, OsString)> {
        vec![
            (
                "LD_PRELOAD".to_owned(),
                prepend(&self.library, "LD_PRELOAD", ":"),
            ),
            (
                "PYTHONPATH".to_owned(),
                prepend(&self.dir, "PYTHONPATH", ":"),
            ),
            (
                LIBRARY_ENV.to_owned(),
                self.library.clone().into_os_string(),
            ),
            (MEAN_BYTES_ENV.to_owned(), mean_bytes.to_string().into()),
        ]
    }

    /// Turns sampling off in process `tgid` if it maps this session's
    /// library (writes 0 to its `memtrace_sampler_on` through
    /// `/proc/PID/mem`): its wrappers then only forward to the allocators
    /// under them, which still own every block. Returns whether it did.
    ///
    /// # Errors
    /// When the library's symbol or the process's memory cannot be read or
    /// written.
    pub(super) fn stop_sampling(&self, tgid: u32) -> Result<bool> {
        let Some(base) = mapped_base(tgid, &self.library)? else {
            return Ok(false);
        };
        let offset = symbol_offset(LIBRARY, SAMPLER_ON_SYMBOL)
            .context("the sampler library has no `memtrace_sampler_on`")?;
        write_on_flag(tgid, base + offset, false)?;
        Ok(true)
    }
}

/// How the sampler gets into the traced processes.
#[derive(Debug)]
pub(super) enum Sampler {
    /// `run`: preloaded into the command.
    Preloaded(SamplerFiles),
    /// `record --pid`: installed in each running CPython 3.14+ (PEP 768).
    Remote(remote::RemoteSampler),
}

impl Sampler {
    /// Turns sampling off in `tgid` if it maps this session's library.
    /// Returns whether it did.
    ///
    /// # Errors
    /// When the library's symbol or the process's memory cannot be read or
    /// written.
    pub(super) fn stop_sampling(&self, tgid: u32) -> Result<bool> {
        match self {
            Self::Preloaded(files) => files.stop_sampling(tgid),
            Self::Remote(remote) => remote.stop_sampling(tgid),
        }
    }
}

/// Writes `on` to `memtrace_sampler_on` at `addr` of `tgid` (through
/// /proc/PID/mem).
fn write_on_flag(tgid: u32, addr: u64, on: bool) -> Result<()> {
    let mem = format!("/proc/{tgid}/mem");
    let file = OpenOptions::new()
        .write(true)
        .open(&mem)
        .with_context(|| format!("cannot open `{mem}`"))?;
    file.write_all_at(&u32::from(on).to_ne_bytes(), addr)
        .with_context(|| format!("cannot write `{mem}`"))
}

/// Reads `memtrace_sampler_on` at `addr` of `tgid`.
fn read_on_flag(tgid: u32, addr: u64) -> Result<bool> {
    let mem = format!("/proc/{tgid}/mem");
    let file = std::fs::File::open(&mem).with_context(|| format!("cannot open `{mem}`"))?;
    let mut value = [0u8; 4];
    file.read_exact_at(&mut value, addr)
        .with_context(|| format!("cannot read `{mem}`"))?;
    Ok(u32::from_ne_bytes(value) != 0)
}

impl Drop for SamplerFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Creates `path` (it must not exist) with `bytes` and permissions `mode`.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write as _;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create `{}`", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("cannot write `{}`", path.display()))
}

/// `first`, then the current value of `variable` if set, joined by `sep`.
fn prepend(first: &Path, variable: &str, sep: &str) -> OsString {
    let mut value = first.as_os_str().to_owned();
    if let Some(rest) = std::env::var_os(variable).filter(|v| !v.is_empty()) {
        value.push(sep);
        value.push(rest);
    }
    value
}

/// Where `tgid` maps `library`'s file offset 0 (its load base: the
/// library's first `PT_LOAD` has address 0), if it maps it.
fn mapped_base(tgid: u32, library: &Path) -> Result<Option<u64>> {
    let pid = i32::try_from(tgid).context("pid out of range")?;
    let Ok(process) = procfs::process::Process::new(pid) else {
        return Ok(None); // gone
    };
    let maps = process
        .maps()
        .with_context(|| format!("cannot read /proc/{tgid}/maps"))?;
    Ok(maps.into_iter().find_map(|map| match &map.pathname {
        procfs::process::MMapPath::Path(path) if path == library && map.offset == 0 => {
            Some(map.address.0)
        }
        _ => None,
    }))
}

/// The address of `symbol` (`.dynsym`) relative to the load base of ELF
/// file `elf` (its lowest `PT_LOAD` address subtracted).
fn symbol_offset(elf: &[u8], symbol: &str) -> Option<u64> {
    let file = object::File::parse(elf).ok()?;
    let lowest = file.segments().map(|s| s.address()).min()?;
    file.dynamic_symbols()
        .find(|s| s.name() == Ok(symbol))
        .map(|s| s.address() - lowest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_library_exports_the_markers_and_the_switch() {
        for symbol in [
            SAMPLER_ON_SYMBOL,
            memtrace_common::SAMPLER_ALLOC_SYMBOL,
            memtrace_common::SAMPLER_FREE_SYMBOL,
        ] {
            assert!(symbol_offset(LIBRARY, symbol).is_some(), "{symbol} missing");
        }
    }
}
