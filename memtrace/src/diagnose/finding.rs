//! Output of the diagnosis step: the [`Finding`]s it makes of a report
//! (pattern, scope, strength, evidence, code paths, next step) and the
//! [`Diagnosed`] report every renderer draws.

use serde::{Deserialize, Serialize};

use super::Cause;
use crate::aggregate::{ProcessId, ProcessReport, Report, StackId};

/// A growth pattern memtrace recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// One process grows while its siblings stay flat.
    OneProcessGrows,
    /// Every worker holds a large, stable footprint.
    EveryWorkerLarge,
    /// Total memory steps up with each fork: about N x the per-worker size.
    WorkerMultiplication,
    /// A sharp rise tied to one code path, released afterwards.
    Spike,
    /// Memory that stays up after activity drops, or rises while idle.
    Retention,
    /// RSS grew in file-backed pages (page cache of mapped files), which
    /// the kernel can reclaim, not in the program's own memory.
    FileBackedGrowth,
    /// Workers' RSS stays flat while their private memory grows: pages
    /// shared copy-on-write with the master are un-shared by writes.
    CowUnsharing,
    /// A process grew but fits none of the patterns above (always weak;
    /// scope that process).
    UnmatchedGrowth,
    /// A process keeps memory its allocator holds after the program freed
    /// it (`--allocations` only: pymalloc arenas, glibc arenas or heap).
    AllocatorFragmentation,
    /// Nothing grew enough to explain (scope tree).
    NoGrowth,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum Scope {
    /// The whole traced process tree.
    Tree,
    /// One process image.
    Process {
        /// Its row in the report.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
    },
}

impl Scope {
    /// The scope of one process image.
    pub(super) fn of(p: &ProcessReport) -> Self {
        Self::Process {
            process: p.id,
            tgid: p.tgid,
        }
    }
}

/// How sure a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strength {
    /// The numbers clearly show the pattern.
    Strong,
    /// The numbers point that way but do not settle it; said so.
    Weak,
}

/// One diagnosis, printed first in every format that carries text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Which pattern.
    pub pattern: Pattern,
    /// About what.
    pub scope: Scope,
    /// How sure.
    pub strength: Strength,
    /// One sentence, e.g. "worker tgid 1234 grew +120.0 MiB while its 3
    /// sibling(s) stayed flat"; processes are named as
    /// [`ProcessReport::name`] names them.
    pub summary: String,
    /// The numbers behind it, one per line (the last one says why the
    /// evidence is weak, for a weak finding).
    pub evidence: Vec<String>,
    /// The code paths behind it, largest first (ids into `Report::stacks`).
    pub paths: Vec<StackId>,
    /// What the engineer should do next.
    pub next_step: String,
    /// The bytes its summary quotes for its process (what it retained, how
    /// far it rose, how much grew in file pages): its cause's "how much"
    /// says the same number ([`super::Amount`]); 0 when unknown.
    #[serde(default)]
    pub amount_bytes: u64,
}

/// A report with its diagnosis: what every renderer draws. It reads as the
/// [`Report`] it holds (`Deref`); its JSON form is the report's with a
/// `diagnosis` field added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosed {
    /// The aggregated report.
    #[serde(flatten)]
    pub report: Report,
    /// Growth patterns found, strongest first ([`findings`](super::findings)).
    pub diagnosis: Vec<Finding>,
    /// The findings grouped by cause, most important first
    /// ([`Cause`]): what the verdict shows.
    #[serde(default)]
    pub causes: Vec<Cause>,
    /// `--allocations`: the allocator hooks' report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<crate::allocations::AllocationsReport>,
    /// The allocators' census of each CPython image (default mode), when
    /// one was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub census: Option<crate::census::CensusReport>,
}

impl std::ops::Deref for Diagnosed {
    type Target = Report;

    fn deref(&self) -> &Report {
        &self.report
    }
}
