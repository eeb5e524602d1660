//! `cargo xtask setup`: the toolchain memtrace's eBPF build needs, installed
//! only when missing (measured on this project's machines: rustc's LLVM 22
//! bitcode needs a bpf-linker built against LLVM >= 22, which Debian lacks):
//! nightly `rust-src` (for `-Z build-std=core`), `bpf-linker` 0.13.0 linked
//! statically against LLVM 23 from PyPI, and a mounted tracefs.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

use crate::check;

/// bpf-linker release that reads rustc's LLVM 22/23 bitcode when built
/// against LLVM 23 (toolchain.md, route a).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM 23 static libraries published on PyPI; the BPF backend is only in
/// the `-extra-targets` wheel.
const LLVM_WHEELS: [&str; 2] = [
    "mlc-llvm-static==23.1.1.post0",
    "mlc-llvm-static-extra-targets==23.1.1.post0",
];
const TRACEFS: &str = "/sys/kernel/tracing";

/// Installs whatever is missing; prints one line per step it had to take.
pub fn run() -> Result<()> {
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_tracefs()
}

fn quiet_success(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ensure_rust_src() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", "nightly"])
        .output()
        .context(
            "cannot run rustup: memtrace's eBPF build needs rustup with a nightly toolchain",
        )?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        return Ok(());
    }
    println!("setup: adding rust-src to the nightly toolchain");
    check(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn ensure_bpf_linker() -> Result<()> {
    if quiet_success(Command::new("bpf-linker").arg("--version")) {
        return Ok(());
    }
    let cargo_bin = home()?.join(".cargo/bin/bpf-linker");
    if quiet_success(Command::new(&cargo_bin).arg("--version")) {
        bail!(
            "bpf-linker is installed at `{}` but that folder is not on PATH; add it to PATH",
            cargo_bin.display()
        );
    }
    let llvm_dir = home()?.join(".cache/memtrace/llvm-23");
    let prefix = llvm_dir.join("mlc_llvm_static/static");
    if !prefix.join("lib").is_dir() {
        println!(
            "setup: fetching LLVM 23 static libraries from PyPI into `{}`",
            llvm_dir.display()
        );
        check(
            Command::new(python()?)
                .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
                .arg(&llvm_dir)
                .args(LLVM_WHEELS),
        )?;
    }
    println!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 23 (one to two minutes)"
    );
    let lib = prefix.join("lib");
    check(
        Command::new("cargo")
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
            ])
            .args([
                "--no-default-features",
                "--features",
                "llvm-23,llvm-link-static",
            ])
            .env("LLVM_PREFIX", &prefix)
            .env("ZLIB_PATH", &lib)
            .env("LIBZSTD_PATH", &lib)
            .env("CXXSTDLIB_PATH", cxx_stdlib_dir()?),
    )
}

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set")
}

fn python() -> Result<&'static str> {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| quiet_success(Command::new(p).args(["-m", "pip", "--version"])))
        .context("installing bpf-linker needs python3 with pip (to fetch LLVM 23 from PyPI)")
}

/// Folder holding libstdc++ for static linking: gcc's own library folder.
fn cxx_stdlib_dir() -> Result<PathBuf> {
    let out = Command::new("gcc")
        .arg("-print-file-name=libstdc++.a")
        .output()
        .context("cannot run gcc: bpf-linker's static build needs gcc and libstdc++")?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    match path.parent() {
        Some(dir) if path.is_absolute() => Ok(dir.to_path_buf()),
        _ => bail!("gcc does not know where libstdc++.a is; install g++"),
    }
}

fn ensure_tracefs() -> Result<()> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    println!("setup: mounting tracefs at {TRACEFS}");
    check(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS])).with_context(|| {
        format!("tracefs is not mounted and mounting it failed; as root run: mount -t tracefs nodev {TRACEFS}")
    })
}
