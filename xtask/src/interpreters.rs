//! CPython 3.14 and 3.15 for the tests, installed by `cargo xtask test` when
//! missing (shared/notes/interpreters.md): Debian sid's binary packages of
//! each, with their `-dbg` symbols and sid's own glibc, downloaded with a
//! throw-away apt configuration that reads the machine's own Debian mirror
//! from `/etc/apt/sources.list.d/debian.sources` (no host is written here)
//! and unpacked with `dpkg-deb -x` under `target/interpreters/pythonX.Y/`.
//! `/etc/apt` and dpkg's database are not touched.
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
    let apt = Apt::new()?;
    apt.update()?;
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

/// A throw-away apt configuration under `target/interpreters/apt`: sid and
/// bookworm from the machine's mirror.
struct Apt {
    dir: PathBuf,
}

impl Apt {
    fn new() -> Result<Self> {
        let dir = std::env::current_dir()?.join(ROOT).join("apt");
        for sub in ["parts", "lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot create `{}`", dir.join(sub).display()))?;
        }
        let mirror = debian_mirror()?;
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let sources = format!(
            "deb [signed-by={keyring}] {mirror} sid main\n\
             deb [signed-by={keyring}] {mirror} bookworm main\n"
        );
        std::fs::write(dir.join("sources.list"), sources)?;
        Ok(Self { dir })
    }

    /// `apt-get` with this configuration.
    fn apt_get(&self) -> Command {
        let mut cmd = Command::new("apt-get");
        let opt = |key: &str, value: &Path| format!("{key}={}", value.display());
        cmd.args(["-qq", "-o", "APT::Architectures::=amd64"])
            .args([
                "-o",
                &opt("Dir::Etc::sourcelist", &self.dir.join("sources.list")),
            ])
            .args(["-o", &opt("Dir::Etc::sourceparts", &self.dir.join("parts"))])
            .args(["-o", &opt("Dir::State::Lists", &self.dir.join("lists"))])
            .args(["-o", &opt("Dir::Cache", &self.dir.join("cache"))])
            // Downloads land in a folder under target/, which apt's
            // unprivileged `_apt` user may not reach.
            .args(["-o", "APT::Sandbox::User=root"])
            .stdout(Stdio::null());
        cmd
    }

    fn update(&self) -> Result<()> {
        println!("interpreters: reading Debian sid's package lists");
        check(self.apt_get().arg("update"))
    }

    /// Downloads `packages` into a fresh folder and returns their files.
    fn download(&self, name: &str, packages: &[String]) -> Result<Vec<PathBuf>> {
        let into = self.dir.join("debs").join(name);
        if into.exists() {
            std::fs::remove_dir_all(&into)?;
        }
        std::fs::create_dir_all(&into)?;
        check(
            self.apt_get()
                .arg("download")
                .args(packages)
                .current_dir(&into),
        )?;
        let mut debs: Vec<PathBuf> = std::fs::read_dir(&into)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        debs.sort();
        Ok(debs)
    }
}

impl Apt {
    /// Removes the packages [`Apt::download`] put in `name`'s folder.
    fn forget(&self, name: &str) -> Result<()> {
        std::fs::remove_dir_all(self.dir.join("debs").join(name))
            .with_context(|| format!("cannot remove the packages of {name}"))
    }
}

/// The `URIs` of the first stanza of `/etc/apt/sources.list.d/debian.sources`
/// that serves Debian itself (not `debian-security`).
fn debian_mirror() -> Result<String> {
    let path = "/etc/apt/sources.list.d/debian.sources";
    let sources = std::fs::read_to_string(path).with_context(|| format!("cannot read `{path}`"))?;
    sources
        .lines()
        .filter_map(|line| line.strip_prefix("URIs:"))
        .flat_map(str::split_whitespace)
        .find(|uri| !uri.contains("security"))
        .map(str::to_owned)
        .with_context(|| format!("`{path}` names no Debian mirror (a `URIs:` line)"))
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

fn unpack(deb: &Path, dest: &Path) -> Result<()> {
    check(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest))
}
