//! Host-side library target of the eBPF crate: empty. It exists so that
//! `memtrace` can list this crate as a build-dependency (cargo then rebuilds
//! `memtrace` when the BPF sources change); the programs are in `main.rs`,
//! compiled for `bpfel-unknown-none` by aya-build.
#![no_std]
