//! The programs the tests hand memtrace's output to, installed by
//! `cargo xtask test` only when missing: `go tool pprof` (Debian's
//! golang-go) for pprof files, Debian's chromium for the HTML report and the
//! speedscope web app, the `speedscope` npm package (pinned) under
//! `target/test-tools`, util-linux's `setpriv` for the capability tests
//! (tests/privileges.rs) and Debian's tmux, the real terminal the live view
//! is tested in (tests/terminal.rs). Running it again installs nothing.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};

use crate::check;

/// Debian packages the tests run, with the program each provides.
const APT_PACKAGES: [(&str, &str); 4] = [
    ("golang-go", "/usr/bin/go"),
    ("chromium", "/usr/bin/chromium"),
    ("util-linux", "/usr/bin/setpriv"),
    ("tmux", "/usr/bin/tmux"),
];

/// The speedscope release the tests load (its `dist/release/index.html`).
const SPEEDSCOPE: &str = "speedscope@1.25.0";

/// Where npm puts the speedscope package, relative to the workspace root.
const NPM_PREFIX: &str = "target/test-tools";

/// Installs what is missing; prints one line per install.
///
/// # Errors
/// apt-get or npm cannot be run or fails.
pub fn ensure() -> Result<()> {
    ensure_apt_packages()?;
    ensure_speedscope()?;
    // CPython 3.14 and 3.15 from Debian sid, unpacked under target/.
    crate::interpreters::ensure()?;
    // A free-threaded 3.13t, built from Debian trixie's source package.
    crate::free_threaded::ensure()
}

fn ensure_apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .filter(|(_, program)| !Path::new(program).exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!(
        "test tools: installing {} with apt-get (for the format consumer, capability and \
         terminal tests)",
        missing.join(", ")
    );
    check(
        Command::new("apt-get")
            .args(["update", "-qq"])
            .stdout(Stdio::null()),
    )?;
    check(
        Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null()),
    )
}

fn ensure_speedscope() -> Result<()> {
    let index = Path::new(NPM_PREFIX).join("node_modules/speedscope/dist/release/index.html");
    let installed_version =
        std::fs::read_to_string(Path::new(NPM_PREFIX).join("node_modules/speedscope/package.json"))
            .ok()
            .and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
            .and_then(|package| package["version"].as_str().map(str::to_owned));
    let wanted = SPEEDSCOPE.rsplit_once('@').map_or("", |(_, v)| v);
    if index.exists() && installed_version.as_deref() == Some(wanted) {
        return Ok(());
    }
    println!("test tools: installing {SPEEDSCOPE} with npm into `{NPM_PREFIX}`");
    std::fs::create_dir_all(NPM_PREFIX).with_context(|| format!("cannot create `{NPM_PREFIX}`"))?;
    check(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                NPM_PREFIX,
                SPEEDSCOPE,
            ])
            .stdout(Stdio::null()),
    )
}
