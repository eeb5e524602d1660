//! Prometheus 3 for the fleet tests (tests/fleet_prometheus.rs), installed
//! by `cargo xtask test` when missing: Debian sid's `prometheus` package (a
//! Go binary) downloaded with the throw-away apt configuration of
//! [`crate::apt`] (in `target/prometheus/apt`) and unpacked under
//! `target/prometheus/tree/`; the tests start
//! `target/prometheus/tree/usr/bin/prometheus`. Bookworm's 2.42 would
//! accept what Prometheus 3 refuses (a scrape's `Content-Type`,
//! shared/notes/fleet.md), so sid's 3.x is the one tested. A binary that
//! exists and starts is kept.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::apt::{unpack, Apt};

/// Where the tree and its apt configuration go, relative to the workspace
/// root.
const ROOT: &str = "target/prometheus";

/// The binary the tests start.
fn program() -> PathBuf {
    Path::new(ROOT).join("tree/usr/bin/prometheus")
}

/// `prometheus --version`'s first line, if it starts.
fn version() -> Option<String> {
    let out = Command::new(program()).arg("--version").output().ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    out.status
        .success()
        .then(|| text.lines().next().unwrap_or_default().to_owned())
}

/// Installs Prometheus from Debian sid unless it is there and starts;
/// prints one line when it installed it, with the time it took.
///
/// # Errors
/// apt-get or dpkg-deb fails, or the unpacked binary does not start.
pub fn ensure() -> Result<()> {
    if version().is_some() {
        return Ok(());
    }
    let started = Instant::now();
    let apt = Apt::new(&Path::new(ROOT).join("apt"))?;
    apt.update("prometheus")?;
    let tree = Path::new(ROOT).join("tree");
    if tree.exists() {
        std::fs::remove_dir_all(&tree)?;
    }
    for deb in apt.download("prometheus", &["prometheus/sid".to_owned()])? {
        unpack(&deb, &tree)?;
    }
    // Not needed once unpacked.
    apt.forget("prometheus")?;
    let Some(version) = version() else {
        bail!("`{}` does not start", program().display());
    };
    println!(
        "prometheus: {version} from Debian sid in `{}`, {:.1} s",
        tree.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
