//! The OpenTelemetry Collector the fleet tests send OTLP profiles to
//! (tests/fleet_profiles.rs), built by `cargo xtask test` when missing, offline,
//! from Debian sid's Go *source* packages (shared/notes/fleet.md: the Go
//! module proxy is not reachable): `golang-opentelemetry-collector-dev` and
//! every `golang-*-dev` it depends on, with sid's Go toolchain, downloaded
//! with the throw-away apt configuration of [`crate::apt`] (in
//! `target/otelcol/apt`), unpacked under `target/otelcol/tree/` and built in
//! GOPATH mode (`GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local`) from the
//! project's own `xtask/otelcol/main.go` (the OTLP receiver, the debug
//! exporter, `otelconftelemetry`). The binary is kept at
//! `target/otelcol/memtrace-otelcol` with a copy of the `main.go` it was
//! built from; the sources, the tree and Go's cache (~2.5 GB) are removed.
//! A binary that starts and was built from today's `main.go` is kept.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::apt::{unpack, Apt};
use crate::check;

/// Where everything goes, relative to the workspace root.
const ROOT: &str = "target/otelcol";

/// The project's collector program.
const MAIN_GO: &str = "xtask/otelcol/main.go";

/// The Debian source package of the collector.
const COLLECTOR_PACKAGE: &str = "golang-opentelemetry-collector-dev";

/// The binary the tests start.
fn program() -> PathBuf {
    Path::new(ROOT).join("memtrace-otelcol")
}

/// The copy of `main.go` the binary was built from.
fn built_from() -> PathBuf {
    Path::new(ROOT).join("main.go.built")
}

/// `memtrace-otelcol --version`'s output, if it starts.
fn version() -> Option<String> {
    let out = Command::new(program()).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether the binary is there, starts and was built from today's `main.go`.
fn up_to_date() -> bool {
    let same_source = std::fs::read(MAIN_GO).ok() == std::fs::read(built_from()).ok();
    same_source && version().is_some()
}

/// Builds the collector unless it is up to date; prints one line when it
/// built it, with the package version, the count of packages and the time.
///
/// # Errors
/// apt-get, dpkg-deb or `go build` fails, or the binary does not start.
pub fn ensure() -> Result<()> {
    if up_to_date() {
        return Ok(());
    }
    let started = Instant::now();
    let apt = Apt::new(&Path::new(ROOT).join("apt"))?;
    apt.update("otelcol")?;
    let packages = packages(&apt)?;
    let tree = Path::new(ROOT).join("tree");
    remove(&tree)?;
    println!(
        "otelcol: unpacking {} Debian packages (the collector's Go sources and Go)",
        packages.len()
    );
    for deb in apt.download("otelcol", &packages)? {
        unpack(&deb, &tree)?;
    }
    apt.forget("otelcol")?;
    go_build(&tree)?;
    std::fs::copy(MAIN_GO, built_from())?;
    remove(&tree)?;
    remove(&Path::new(ROOT).join("gocache"))?;
    remove(&Path::new(ROOT).join("gopath"))?;
    let Some(version) = version() else {
        bail!("`{}` does not start", program().display());
    };
    println!(
        "otelcol: {version} from Debian sid's {COLLECTOR_PACKAGE} ({} packages) in `{}`, {:.1} s",
        packages.len(),
        program().display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The Go source packages the collector depends on (recursively), and the
/// Go toolchain (`golang-go` and the `golang-*` packages it depends on).
fn packages(apt: &Apt) -> Result<Vec<String>> {
    let mut packages: Vec<String> = apt
        .depends_recursive(COLLECTOR_PACKAGE)?
        .into_iter()
        .filter(|name| name.starts_with("golang-") && name.ends_with("-dev"))
        .collect();
    packages.extend(
        apt.depends_recursive("golang-go")?
            .into_iter()
            .filter(|name| name.starts_with("golang-")),
    );
    packages.sort();
    packages.dedup();
    Ok(packages)
}

/// `go build` of `main.go` in GOPATH mode against the unpacked sources.
fn go_build(tree: &Path) -> Result<()> {
    let root = std::env::current_dir()?.join(ROOT);
    let tree = std::env::current_dir()?.join(tree);
    let goroot = tree.join("usr/lib/go");
    let main_dir = root.join("gopath/src/memtrace-otelcol");
    std::fs::create_dir_all(&main_dir)
        .with_context(|| format!("cannot create `{}`", main_dir.display()))?;
    std::fs::copy(MAIN_GO, main_dir.join("main.go"))?;
    let gopath = std::env::join_paths([root.join("gopath"), tree.join("usr/share/gocode")])?;
    let path = std::env::join_paths(std::iter::once(goroot.join("bin")).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    println!("otelcol: go build (GOPATH mode, offline; about 2 min)");
    check(
        Command::new(goroot.join("bin/go"))
            .args(["build", "-o"])
            .arg(root.join("memtrace-otelcol"))
            .arg(".")
            .current_dir(&main_dir)
            .env("GOROOT", &goroot)
            .env("GOPATH", gopath)
            .env("PATH", path)
            .env("GO111MODULE", "off")
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0")
            .env("GOCACHE", root.join("gocache")),
    )
}

/// Removes `dir` if it exists.
fn remove(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot remove `{}`", dir.display()))?;
    }
    Ok(())
}
