//! A throw-away apt configuration that reads the machine's own Debian mirror
//! (the first non-security `URIs:` of `/etc/apt/sources.list.d/debian.sources`;
//! no host is written here) for Debian sid and bookworm, kept in a folder
//! under `target/`: the interpreters and the OpenTelemetry Collector of the
//! tests are downloaded with it and unpacked with `dpkg-deb -x`; a
//! configuration of source packages only ([`Apt::sources_of`]) fetches the
//! CPython tarball the free-threaded build is made from. `/etc/apt` and
//! dpkg's database are not touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};

use crate::check;

/// A throw-away apt configuration in a folder of its own.
pub(crate) struct Apt {
    dir: PathBuf,
}

impl Apt {
    /// A configuration in `dir` (relative to the workspace root or absolute),
    /// reading sid and bookworm from the machine's mirror.
    ///
    /// # Errors
    /// `dir` cannot be made, or the machine's sources name no Debian mirror.
    pub(crate) fn new(dir: &Path) -> Result<Self> {
        Self::with_lines(dir, &["deb", "sid"], &["deb", "bookworm"])
    }

    /// A configuration in `dir` that reads Debian `suite`'s source
    /// packages (`deb-src`) only, from the machine's mirror.
    ///
    /// # Errors
    /// As [`Apt::new`].
    pub(crate) fn sources_of(dir: &Path, suite: &str) -> Result<Self> {
        Self::with_lines(dir, &["deb-src", suite], &[])
    }

    /// A configuration whose sources list has one `main` line per
    /// non-empty `[kind, suite]`.
    fn with_lines(dir: &Path, first: &[&str], second: &[&str]) -> Result<Self> {
        let dir = std::env::current_dir()?.join(dir);
        for sub in ["parts", "lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot create `{}`", dir.join(sub).display()))?;
        }
        let mirror = debian_mirror()?;
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let sources: String = [first, second]
            .iter()
            .filter_map(|line| match line {
                [kind, suite] => Some(format!(
                    "{kind} [signed-by={keyring}] {mirror} {suite} main\n"
                )),
                _ => None,
            })
            .collect();
        std::fs::write(dir.join("sources.list"), sources)?;
        Ok(Self { dir })
    }

    /// The `-o` options that point apt at this configuration.
    fn options(&self) -> Vec<String> {
        let opt = |key: &str, value: &Path| format!("{key}={}", value.display());
        [
            "APT::Architectures::=amd64".to_owned(),
            opt("Dir::Etc::sourcelist", &self.dir.join("sources.list")),
            opt("Dir::Etc::sourceparts", &self.dir.join("parts")),
            opt("Dir::State::Lists", &self.dir.join("lists")),
            opt("Dir::Cache", &self.dir.join("cache")),
            // Downloads land in a folder under target/, which apt's
            // unprivileged `_apt` user may not reach.
            "APT::Sandbox::User=root".to_owned(),
        ]
        .into_iter()
        .flat_map(|option| ["-o".to_owned(), option])
        .collect()
    }

    /// `apt-get` with this configuration.
    fn apt_get(&self) -> Command {
        let mut cmd = Command::new("apt-get");
        cmd.arg("-qq").args(self.options()).stdout(Stdio::null());
        cmd
    }

    /// Reads the package lists; `who` names the caller in the line printed.
    ///
    /// # Errors
    /// apt-get fails.
    pub(crate) fn update(&self, who: &str) -> Result<()> {
        println!("{who}: reading Debian's package lists");
        check(self.apt_get().arg("update"))
    }

    /// `package` and every package it depends on (`Depends` and
    /// `Pre-Depends`, recursively; virtual packages left out), sorted.
    ///
    /// # Errors
    /// apt-cache fails or `package` is unknown.
    pub(crate) fn depends_recursive(&self, package: &str) -> Result<Vec<String>> {
        let mut cmd = Command::new("apt-cache");
        cmd.args(self.options()).args([
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            package,
        ]);
        let out = cmd
            .output()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| !line.starts_with([' ', '<']))
            .map(str::to_owned)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Downloads `packages` into a fresh folder named `name` and returns
    /// their files.
    ///
    /// # Errors
    /// apt-get fails or the folder cannot be made or read.
    pub(crate) fn download(&self, name: &str, packages: &[String]) -> Result<Vec<PathBuf>> {
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

    /// Downloads the source package `package` (its `.dsc` and tarballs,
    /// `apt-get source --download-only`) into a fresh folder named `name`
    /// and returns that folder.
    ///
    /// # Errors
    /// apt-get fails or the folder cannot be made.
    pub(crate) fn download_source(&self, name: &str, package: &str) -> Result<PathBuf> {
        let into = self.dir.join("debs").join(name);
        if into.exists() {
            std::fs::remove_dir_all(&into)?;
        }
        std::fs::create_dir_all(&into)?;
        check(
            self.apt_get()
                .args(["source", "--download-only", package])
                .current_dir(&into),
        )?;
        Ok(into)
    }

    /// Removes the packages [`Apt::download`] put in `name`'s folder.
    ///
    /// # Errors
    /// The folder cannot be removed.
    pub(crate) fn forget(&self, name: &str) -> Result<()> {
        std::fs::remove_dir_all(self.dir.join("debs").join(name))
            .with_context(|| format!("cannot remove the packages of {name}"))
    }
}

/// Unpacks the Debian package `deb` under `dest` (`dpkg-deb -x`).
///
/// # Errors
/// dpkg-deb fails.
pub(crate) fn unpack(deb: &Path, dest: &Path) -> Result<()> {
    check(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest))
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
