//! memtrace: an eBPF memory tracer for live Python processes.
//!
//! Data flow (one module per step):
//! `bpf` (load and attach the kernel programs, read their maps) →
//! `events` (drain the ring buffer, decode records) →
//! `process` (process tree: roles, forks, exits, /proc) →
//! `python` / `symbolize` (CPython layout per process; code objects and
//! native instructions to names, files and lines) →
//! `stacks` (each sampled record's Python and native frames, one stack) →
//! `held` (which sampled pages each path still holds, by address: held now
//! and at the high-water mark) →
//! `aggregate` (per process, per stack, over time; `allocations` is its
//! allocator-mode counterpart; `capture` writes it to a
//! file as it goes and replays it) →
//! `diagnose` (which growth pattern, with evidence) →
//! `report` (table, folded stacks, JSON, flame graph, speedscope, pprof,
//! HTML); `diff` compares two captures or two times of one;
//! `sinks` (the windows `memtrace agent` closes, for Prometheus, an
//! OpenTelemetry Collector and Pyroscope);
//! `output_file` creates every file they write (no symbolic link followed,
//! no file replaced without `--force`). `privileges` says which capability
//! a refusal lacks, before any step.
//! `app` wires the steps together for each command; `units` formats
//! sizes for every step that prints them.
#![deny(missing_docs)]

pub mod agent;
pub mod aggregate;
pub mod allocations;
pub mod app;
pub mod bpf;
pub mod capture;
pub mod census;
pub mod cli;
pub mod diagnose;
pub mod diff;
pub mod events;
pub mod held;
pub mod live;
pub mod output_file;
pub mod privileges;
pub mod process;
pub mod python;
pub mod report;
pub mod sinks;
pub mod stacks;
pub mod symbolize;
pub mod units;
