//! memtrace's kernel side, the first step of the data flow: tracepoint
//! programs that keep exact per-process counters in `PROCESSES` and send
//! fork/exec/exit records and sampled memory records (with the Python stack
//! of the thread that caused them) to the `RECORDS` ring buffer, which
//! `memtrace::events` drains. Loaded and attached by `memtrace::bpf`.
//!
//! Built for `bpfel-unknown-none` by aya-build (memtrace/build.rs). A host
//! build (`cargo build/clippy --workspace`) only type-checks the same code
//! and produces an empty binary.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "BPF atomics, see counters.rs")
)]

mod counters;
mod kernel;
mod maps;
mod native_stack;
mod probes;
mod pystack;
mod record;
mod ring;
mod sample;
mod sharers;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible licence: needed for `bpf_probe_read_*` and tracepoints.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// Host builds only type-check the programs; there is nothing to run.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
