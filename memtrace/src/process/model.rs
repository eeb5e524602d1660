//! The process step's vocabulary, shared by every later step: which traced
//! image of which process a number belongs to ([`ProcessId`]), why it is
//! traced ([`Role`]), whether its Python stacks can be read
//! ([`PythonStatus`]) and how much of its memory is its own ([`Sharing`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// One traced image of one process: the aggregator's row id, handed out in
/// order of appearance from 0 (`crate::aggregate::Aggregator::process_started`,
/// and a new one per execve). The process itself is `(tgid, start time)`
/// (`crate::aggregate::ProcessReport::tgid` and `start_time_ns`); a tgid
/// reused by the kernel is a new process with a new id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcessId(pub u32);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// Why a process is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A process memtrace was asked to trace.
    Root,
    /// A forked descendant of a traced process.
    Worker,
    /// A descendant that was already running when tracing began and had
    /// exec'd a program of its own since its fork (a load generator, a
    /// subprocess): never a worker.
    Child,
    /// A process memtrace was asked to trace whose (untraced) parent forked
    /// it without an exec: a worker of a master memtrace does not trace.
    ForkedRoot,
}

impl Role {
    /// Whether memtrace was asked to trace the process (`--pid`, or `run`'s
    /// command).
    #[must_use]
    pub fn is_root(self) -> bool {
        matches!(self, Self::Root | Self::ForkedRoot)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Root => "root",
            Self::Worker => "worker",
            Self::Child => "child",
            Self::ForkedRoot => "forked root",
        })
    }
}

/// Whether Python stacks can be read in a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PythonStatus {
    /// A supported CPython; stacks are read.
    Python {
        /// Interpreter version, e.g. "3.12.1".
        version: String,
    },
    /// No Python interpreter in the process.
    NotPython,
    /// Python, but its stacks cannot be read.
    Unsupported {
        /// Why, e.g. "Python 3.10 is not supported".
        reason: String,
    },
}

impl PythonStatus {
    /// Why there are no Python stacks; `None` for a supported interpreter.
    pub fn missing_reason(&self) -> Option<String> {
        match self {
            Self::Python { .. } => None,
            Self::NotPython => Some("not a Python process".to_owned()),
            Self::Unsupported { reason } => Some(reason.clone()),
        }
    }
}

/// One reading of `/proc/PID/smaps_rollup`: how much of the process's memory
/// is its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharing {
    /// Proportional set size (`Pss`): each page divided by the number of
    /// processes mapping it, in bytes.
    pub pss_bytes: u64,
    /// Unique set size (`Private_Clean + Private_Dirty`): pages mapped by
    /// this process only, in bytes.
    pub uss_bytes: u64,
}
