//! Builds memtrace's kernel side (`memtrace-ebpf`) for `bpfel-unknown-none`
//! with aya-build and leaves the object in `OUT_DIR/memtrace`, where
//! `memtrace::bpf` embeds it with `include_bytes_aligned!`; and the
//! in-process allocation sampler (`memtrace/sampler`, a cdylib) with a
//! nested `cargo build --release` into `OUT_DIR/sampler-target`, leaving
//! `OUT_DIR/libmemtrace_sampler.so` for `memtrace::app::sampler` to embed.
//!
//! aya-build runs `rustup run nightly cargo build -Z build-std=core` and needs
//! `bpf-linker` on `PATH` (see `cargo xtask setup`). `AYA_BUILD_SKIP=1` skips
//! it (then an empty object is embedded and `Tracer::load` says so).
//!
//! aya-build turns every line the nested cargo prints into a
//! `cargo:warning`, which cargo then repeats on every later command, rebuilt
//! or not. So this script runs aya-build in a child copy of itself and
//! passes on only cargo's instructions (`rerun-if-changed`, ...) when the
//! nested build succeeds, and all of its output when it fails.

use std::{
    path::Path,
    process::{Command, Output},
};

use anyhow::{anyhow, bail, Context as _};

/// Set in the child copy of this script, which runs aya-build itself.
const NESTED: &str = "MEMTRACE_BUILD_SCRIPT_NESTED";

/// aya-build's switch to skip the eBPF build.
const AYA_BUILD_SKIP: &str = "AYA_BUILD_SKIP";

fn main() -> anyhow::Result<()> {
    if std::env::var_os(NESTED).is_some() {
        return build_ebpf();
    }
    if std::env::var_os(AYA_BUILD_SKIP).is_some() {
        // aya-build's one warning says that the build is skipped.
        build_ebpf()?;
    } else {
        build_ebpf_quietly()?;
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../memtrace-common");
    println!("cargo:rerun-if-changed=sampler");
    build_sampler()?;
    ensure_object_exists()
}

/// The sampler library's file name (`memtrace_common::SAMPLER_FILE_NAME`).
const SAMPLER_FILE: &str = "libmemtrace_sampler.so";

/// Builds `memtrace-sampler` in release mode with its own target folder
/// (the outer build holds the workspace's) and copies the library to
/// `OUT_DIR`.
fn build_sampler() -> anyhow::Result<()> {
    let out_dir = std::env::var("OUT_DIR").context("OUT_DIR is not set by cargo")?;
    let target_dir = Path::new(&out_dir).join("sampler-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(["build", "--release", "--package", "memtrace-sampler"])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags and profile are not the library's.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_PROFILE_RELEASE_DEBUG")
        .output()
        .with_context(|| format!("cannot run `{cargo} build` for memtrace-sampler"))?;
    if !output.status.success() {
        print_all(&output);
        bail!(
            "building memtrace-sampler failed ({}); its output is above",
            output.status
        );
    }
    let built = target_dir.join("release").join(SAMPLER_FILE);
    let embedded = Path::new(&out_dir).join(SAMPLER_FILE);
    std::fs::copy(&built, &embedded).with_context(|| {
        format!(
            "cannot copy `{}` to `{}`",
            built.display(),
            embedded.display()
        )
    })?;
    Ok(())
}

/// Runs aya-build on `memtrace-ebpf`; it prints cargo instructions and
/// warnings on standard output.
fn build_ebpf() -> anyhow::Result<()> {
    let manifest_dir =
        std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR is not set by cargo")?;
    let ebpf_dir = Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("`{manifest_dir}` has no parent directory"))?
        .join("memtrace-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("`{}` is not UTF-8", ebpf_dir.display()))?;
    let package = aya_build::Package {
        name: "memtrace-ebpf",
        root_dir: ebpf_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}

/// Runs [`build_ebpf`] in a child copy of this script and passes on its
/// cargo instructions without its warnings when it succeeds, or everything
/// it printed when it fails.
fn build_ebpf_quietly() -> anyhow::Result<()> {
    let script = std::env::current_exe().context("cannot find the build script's own path")?;
    let output = Command::new(&script)
        .env(NESTED, "1")
        .output()
        .with_context(|| format!("cannot run `{}`", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.success() {
        for line in stdout.lines().filter(|line| is_quiet_instruction(line)) {
            println!("{line}");
        }
        return Ok(());
    }
    print_all(&output);
    bail!(
        "building memtrace-ebpf failed ({}); its output is above",
        output.status
    )
}

/// Whether `line` is a cargo instruction other than a warning.
fn is_quiet_instruction(line: &str) -> bool {
    let Some(instruction) = line
        .strip_prefix("cargo::")
        .or_else(|| line.strip_prefix("cargo:"))
    else {
        return false;
    };
    !instruction.starts_with("warning=")
}

/// Passes on everything the child printed (cargo shows it when a build
/// script fails).
fn print_all(output: &Output) {
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
}

/// Leaves an empty `OUT_DIR/memtrace` when aya-build skipped the build, so
/// that `include_bytes_aligned!` compiles.
fn ensure_object_exists() -> anyhow::Result<()> {
    let out_dir = std::env::var("OUT_DIR").context("OUT_DIR is not set by cargo")?;
    let object = Path::new(&out_dir).join("memtrace");
    if !object.exists() {
        std::fs::write(&object, [])
            .with_context(|| format!("cannot create `{}`", object.display()))?;
    }
    Ok(())
}
