//! `cargo xtask dist`: a tarball a node runs memtrace from without Rust,
//! `target/dist/memtrace-VERSION-x86_64-linux.tar.gz`: the release binary
//! (its eBPF object is embedded at build time; it needs glibc and a kernel
//! with BTF), README and `docs/`, the licences and `examples/deploy/` (systemd unit,
//! Kubernetes DaemonSet, Prometheus scrape config, Grafana dashboard).
//! tests/fleet_dist.rs unpacks it in an empty folder and traces with it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result};

use crate::check;

/// Where the tarball and its staging folder go, relative to the workspace.
const DIST: &str = "target/dist";

/// The files copied beside the binary, relative to the workspace.
const FILES: [&str; 3] = ["README.md", "LICENSE-MIT", "LICENSE-APACHE"];

/// Builds the release binary and the tarball; returns the tarball's path.
///
/// # Errors
/// The build, a copy or `tar` fails.
pub fn run(bin: &Path) -> Result<PathBuf> {
    let name = format!("memtrace-{}-x86_64-linux", version(bin)?);
    let stage = Path::new(DIST).join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    std::fs::create_dir_all(&stage)?;
    copy(bin, &stage.join("memtrace"))?;
    for file in FILES {
        copy(Path::new(file), &stage.join(file))?;
    }
    copy_tree(Path::new("docs"), &stage.join("docs"))?;
    copy_tree(Path::new("examples/deploy"), &stage.join("examples/deploy"))?;
    let tarball = Path::new(DIST).join(format!("{name}.tar.gz"));
    check(
        Command::new("tar")
            .arg("-C")
            .arg(DIST)
            // The archive's name is not relative to -C's folder.
            .arg("-czf")
            .arg(&tarball)
            .arg(&name),
    )?;
    let bytes = std::fs::metadata(&tarball)?.len();
    println!(
        "dist: `{}` ({:.1} MB)",
        tarball.display(),
        bytes as f64 / 1e6
    );
    Ok(tarball)
}

/// The version `memtrace --version` prints (`memtrace 0.1.0`: `0.1.0`).
fn version(bin: &Path) -> Result<String> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot start `{}`", bin.display()))?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .context("`memtrace --version` printed no version")
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("cannot copy `{}` to `{}`", from.display(), to.display()))?;
    Ok(())
}

/// Copies the files under `from` to `to`, keeping the folders.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot list `{}`", from.display()))?
    {
        let path = entry?.path();
        let dest = to.join(path.file_name().unwrap_or_default());
        if path.is_dir() {
            copy_tree(&path, &dest)?;
        } else {
            copy(&path, &dest)?;
        }
    }
    Ok(())
}
