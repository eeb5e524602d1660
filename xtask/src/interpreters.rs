//! CPython 3.14 and 3.15 for the tests, installed by `cargo xtask test` when
//! missing (shared/notes/interpreters.md): Debian sid's binary packages of
//! each, with their `-dbg` symbols and sid's own glibc, downloaded with the
//! throw-away apt configuration of [`crate::apt`] (in
//! `target/interpreters/apt`) and unpacked under `target/interpreters/pythonX.Y/`.
//!
//! Each tree holds two ways of starting the interpreter:
//! - `usr/bin/pythonX.Y`, patchelf'd (bookworm's patchelf, unpacked too) to
//!   the tree's loader and libraries; patchelf moves every segment's file
//!   offset by a page while its vaddr stays;
//! - `usr/bin/pythonX.Y.unpatched`, Debian's file as shipped, started as
//!   `usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path
//!   usr/lib/x86_64-linux-gnu usr/bin/pythonX.Y.unpatched` (then
//!   `/proc/PID/exe` is the loader).
//!
//! Whatever version sid has is taken (sid replaces 3.14.10-1 when 3.14.11
//! lands); a tree that exists and starts is kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::apt::{unpack, Apt};
use crate::check;

/// Where the trees go, relative to the workspace root.
const ROOT: &str = "target/interpreters";

/// The minor versions installed.
const VERSIONS: [&str; 2] = ["3.14", "3.15"];

/// The packages besides `pythonX.Y*` that the interpreter and its standard
/// library load (interpreters.md: sid's pythons want GLIBC_2.38).
const LIBRARIES: [&str; 16] = [
    "libc6",
    "libgcc-s1",
    "libexpat1",
    "zlib1g",
    "libssl3t64",
    "libffi8",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "libzstd1",
    "libncursesw6",
    "libreadline8t64",
    "libtinfo6",
    "libuuid1",
    "libdb5.3t64",
    "media-types",
];

/// The library directory of a tree, relative to it.
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// Installs each missing interpreter; prints one line per install with the
/// time it took.
///
/// # Errors
/// The machine's apt sources name no Debian mirror, or apt-get, dpkg-deb or
/// patchelf fails.
pub fn ensure() -> Result<()> {
    let missing: Vec<&str> = VERSIONS
        .into_iter()
        .filter(|version| !starts(&tree(version), version))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let apt = Apt::new(&Path::new(ROOT).join("apt"))?;
    apt.update("interpreters")?;
    let patchelf = ensure_patchelf(&apt)?;
    for version in missing {
        install(&apt, &patchelf, version)?;
    }
    println!(
        "interpreters: installed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The tree of `version`.
fn tree(version: &str) -> PathBuf {
    Path::new(ROOT).join(format!("python{version}"))
}

/// Whether the patchelf'd interpreter of `tree` runs and is `version`.
fn starts(tree: &Path, version: &str) -> bool {
    let python = tree.join(format!("usr/bin/python{version}"));
    if !tree
        .join(format!("usr/bin/python{version}.unpatched"))
        .exists()
    {
        return false;
    }
    Command::new(python)
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == version
        })
}

/// Bookworm's patchelf, unpacked under `target/interpreters/patchelf`.
fn ensure_patchelf(apt: &Apt) -> Result<PathBuf> {
    let dest = Path::new(ROOT).join("patchelf");
    let program = dest.join("usr/bin/patchelf");
    if !program.exists() {
        for deb in apt.download("patchelf", &["patchelf/bookworm".to_owned()])? {
            unpack(&deb, &dest)?;
        }
    }
    Ok(program)
}

/// Downloads, unpacks and patches `version` into its tree.
fn install(apt: &Apt, patchelf: &Path, version: &str) -> Result<()> {
    let started = Instant::now();
    let dest = tree(version);
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    let mut packages: Vec<String> = ["", "-minimal", "-dbg"]
        .iter()
        .map(|suffix| format!("python{version}{suffix}"))
        .collect();
    packages.extend(
        ["", "-minimal", "-stdlib"]
            .iter()
            .map(|suffix| format!("libpython{version}{suffix}")),
    );
    packages.extend(LIBRARIES.iter().map(|&name| name.to_owned()));
    let debs = apt.download(&format!("python{version}"), &packages)?;
    for deb in &debs {
        unpack(deb, &dest)?;
    }
    // The packages are not needed once unpacked (~80 MB a version).
    apt.forget(&format!("python{version}"))?;
    let python = dest.join(format!("usr/bin/python{version}"));
    let unpatched = dest.join(format!("usr/bin/python{version}.unpatched"));
    std::fs::copy(&python, &unpatched)
        .with_context(|| format!("cannot copy `{}`", python.display()))?;
    let lib = std::env::current_dir()?.join(&dest).join(LIB_DIR);
    check(
        Command::new(patchelf)
            .arg("--set-interpreter")
            .arg(lib.join("ld-linux-x86-64.so.2"))
            .args(["--force-rpath", "--set-rpath"])
            .arg(&lib)
            .arg(&python),
    )?;
    if !starts(&dest, version) {
        bail!("`{}` does not start after patchelf", python.display());
    }
    println!(
        "interpreters: python{version} from Debian sid ({} packages) in `{}`, {:.1} s",
        debs.len(),
        dest.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
