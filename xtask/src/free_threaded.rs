//! A free-threaded CPython 3.13t for the tests, built by `cargo xtask test`
//! when missing (shared/notes/interpreters.md): Debian trixie's `python3.13`
//! source package, fetched with a throw-away apt configuration of source
//! packages ([`crate::apt`], in `target/interpreters/apt-src`), carries
//! upstream's `Python-3.13.5.tar.xz` byte for byte as its orig tarball;
//! pyenv's `python-build 3.13.5t` builds it from that file offline (it
//! checks the tarball's sha256 against its own definition) into
//! `target/interpreters/python3.13t`. The build runs under `nice -n 10` and
//! takes minutes; a tree that exists and starts free-threaded is kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::apt::Apt;
use crate::check;

/// The pyenv definition built.
const DEFINITION: &str = "3.13.5t";

/// The Debian suite whose `python3.13` source package holds 3.13.5.
const SUITE: &str = "trixie";

/// The orig tarball of that source package, and the name python-build
/// looks for in its cache folder.
const ORIG: (&str, &str) = ("python3.13_3.13.5.orig.tar.xz", "Python-3.13.5.tar.xz");

/// Where the tree goes, relative to the workspace root.
const TREE: &str = "target/interpreters/python3.13t";

/// Builds the tree when it is missing or does not start; prints a line
/// with the time the build took.
///
/// # Errors
/// pyenv's python-build is not installed, the source package cannot be
/// fetched, or the build fails.
pub fn ensure() -> Result<()> {
    let prefix = std::env::current_dir()?.join(TREE);
    if starts(&prefix) {
        return Ok(());
    }
    let python_build = python_build()?;
    let started = Instant::now();
    let cache = fetch_tarball()?;
    if prefix.exists() {
        std::fs::remove_dir_all(&prefix)?;
    }
    println!("interpreters: building CPython {DEFINITION} (free-threaded) from Debian {SUITE}'s source package, some minutes");
    check(
        Command::new("nice")
            .args(["-n", "10"])
            .arg(&python_build)
            .arg(DEFINITION)
            .arg(&prefix)
            .env("PYTHON_BUILD_CACHE_PATH", &cache)
            .stdout(Stdio::null()),
    )?;
    if !starts(&prefix) {
        bail!(
            "`{}` does not start free-threaded after its build",
            prefix.display()
        );
    }
    println!(
        "interpreters: python3.13t in `{TREE}`, built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Whether the tree's `python3.13t` runs, is 3.13 and has the GIL off.
fn starts(prefix: &Path) -> bool {
    let script = "import sys; print('%d.%d' % sys.version_info[:2], sys._is_gil_enabled())";
    Command::new(prefix.join("bin/python3.13t"))
        .args(["-c", script])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "3.13 False"
        })
}

/// pyenv's python-build (`$PYENV_ROOT`, else `~/.pyenv`).
fn python_build() -> Result<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".pyenv")))
        .context("neither PYENV_ROOT nor HOME is set")?;
    let program = root.join("plugins/python-build/bin/python-build");
    if !program.exists() {
        bail!(
            "building the free-threaded 3.13t needs pyenv's python-build (`{}`)",
            program.display()
        );
    }
    Ok(program)
}

/// Fetches the source package and returns the cache folder holding its
/// orig tarball under upstream's name.
fn fetch_tarball() -> Result<PathBuf> {
    let apt = Apt::sources_of(Path::new("target/interpreters/apt-src"), SUITE)?;
    apt.update("interpreters")?;
    let fetched = apt.download_source("python3.13", "python3.13")?;
    let cache = std::env::current_dir()?.join("target/interpreters/python3.13t-cache");
    std::fs::create_dir_all(&cache)?;
    let (orig, upstream) = ORIG;
    std::fs::rename(fetched.join(orig), cache.join(upstream)).with_context(|| {
        format!(
            "Debian {SUITE}'s python3.13 source package has no `{orig}` (it moved past 3.13.5?)"
        )
    })?;
    apt.forget("python3.13")?;
    Ok(cache)
}
