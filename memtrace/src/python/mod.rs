//! The `python` stage: per-process CPython layout and frame resolution,
//! between `process` (which says a process appeared, forked, exec'd or
//! exited) and `aggregate` (which needs names and lines).
//!
//! - [`probe`] decides whether a process runs a supported CPython and builds
//!   the `PyProcessInfo` the kernel-side frame walk needs;
//! - [`FrameResolver`] turns the `PyFrame`s BPF recorded into
//!   [`PyLocation`]s (qualified name, file, line);
//! - `offsets` is the per-version layout table, `mem` reads
//!   /proc/PID/mem, `linetable` decodes CPython 3.11+ location tables and
//!   `lnotab` the 3.9/3.10 line tables; `version` reads what a binary's
//!   name and data say about its version, and `debug_offsets` checks
//!   3.13+'s `_Py_DebugOffsets` against the table;
//! - [`remote_exec`] speaks CPython 3.14's remote-debugging protocol
//!   (PEP 768): a running interpreter runs a script file memtrace names.

mod code;
mod debug_offsets;
mod linetable;
mod lnotab;
mod mem;
mod offsets;
mod probe;
pub mod remote_exec;
#[cfg(test)]
mod table_fixtures;
mod threads;
mod types;
mod version;

pub use code::{FrameResolver, PyLocation, ResolveError};
pub use linetable::LineTableError;
pub use mem::MemError;
pub use offsets::VersionLayout;
pub(crate) use probe::load_bias;
pub use probe::{probe, Probe, PythonProcess};
pub use types::{ProbeError, PythonVersion};
