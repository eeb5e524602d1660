//! Builds memtrace's kernel side (`memtrace-ebpf`) for `bpfel-unknown-none`
//! with aya-build and leaves the object in `OUT_DIR/memtrace`, where
//! `memtrace::bpf` embeds it with `include_bytes_aligned!`.
//!
//! aya-build runs `rustup run nightly cargo build -Z build-std=core` and needs
//! `bpf-linker` on `PATH` (see `cargo xtask setup`). `AYA_BUILD_SKIP=1` skips
//! it (then an empty object is embedded and `Tracer::load` says so).

use std::path::Path;

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
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
    aya_build::build_ebpf([package], aya_build::Toolchain::default())?;
    ensure_object_exists()
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
