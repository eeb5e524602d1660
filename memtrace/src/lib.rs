//! memtrace: an eBPF memory tracer for live Python processes.
//!
//! Data flow (one module per step):
//! `bpf` (load and attach the kernel programs, read their maps) →
//! `events` (drain the ring buffer, decode records) →
//! `process` (process tree: roles, forks, exits, /proc) →
//! `python` / `symbolize` (CPython layout per process; code objects and
//! native instructions to names, files and lines) →
//! `aggregate` (per process, per stack, over time) →
//! `report` (terminal table, folded stacks, JSON).
//! `app` wires the steps together for the `record` and `run` commands.
#![deny(missing_docs)]

pub mod aggregate;
pub mod app;
pub mod bpf;
pub mod cli;
pub mod events;
pub mod process;
pub mod python;
pub mod report;
pub mod symbolize;
