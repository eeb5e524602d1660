//! Part of the last diagnosis step (`causes`): the one [`Amount`] of each
//! [`Cause`](super::Cause), which its headline, its "how much" and its
//! "where" all speak of. Per process image: the bytes its finding's summary
//! quotes (else its growth over its active life), on the memory that
//! finding reads (RSS, RSS without file-backed pages, file-backed pages);
//! how that memory grew over the active life (in one step, "+120 MiB in
//! 0.9 s at 2.1 s", or steadily, a rate); and what it released while
//! shutting down (`teardown`), which is said, never counted as a pattern.

use serde::{Deserialize, Serialize};

use crate::aggregate::{ProcessId, ProcessReport, Report};

use super::memory::{Basis, Memory, Reading};
use super::{files, Finding, Pattern, Scope, MIN_GROWTH_BYTES};

/// Growth is a step when at least this share of it came within one
/// stretch of at most [`STEP_MAX_LIFE_FRACTION`] of the active life. 0.8.
const STEP_SHARE: f64 = 0.8;

/// ... that stretch lasting at most this share of the active life. 0.25.
const STEP_MAX_LIFE_FRACTION: f64 = 0.25;

/// How much one cause is about, process by process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Amount {
    /// What memory the bytes are of: `RSS`, `RSS without file-backed
    /// pages`, `file-backed RSS`.
    pub what: String,
    /// Per process image of the cause, in the cause's order.
    pub each: Vec<ProcessAmount>,
}

/// How much of a cause one process image holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessAmount {
    /// The image.
    pub process: ProcessId,
    /// The bytes the cause's finding about it quotes, else its growth over
    /// its active life.
    pub bytes: u64,
    /// Its active life: traced time before its teardown, in ns.
    pub life_ns: u64,
    /// When most of the growth came in one step, that step.
    pub step: Option<Step>,
    /// Released while it shut down (its teardown), 0 when none.
    pub released_at_shutdown_bytes: u64,
}

/// A rise that came at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// How much it rose.
    pub bytes: u64,
    /// In how long, ns.
    pub in_ns: u64,
    /// Starting when, ns since the run start.
    pub at_ns: u64,
}

/// The amount of a cause of `pattern` about `processes`, from its
/// `findings` (indexes into `all`).
pub(super) fn of(
    report: &Report,
    all: &[Finding],
    pattern: Pattern,
    findings: &[usize],
    processes: &[ProcessId],
) -> Amount {
    let basis_of = |p: &ProcessReport| match pattern {
        Pattern::FileBackedGrowth => Basis::Rss,
        _ => files::basis(p),
    };
    let what = processes
        .iter()
        .filter_map(|&id| report.process(id))
        .map(|p| match pattern {
            Pattern::FileBackedGrowth => "file-backed RSS",
            _ => basis_of(p).what(),
        })
        .next()
        .unwrap_or("RSS")
        .to_owned();
    let quoted = |id: ProcessId| {
        findings
            .iter()
            .map(|&i| &all[i])
            .filter(|f| f.pattern == pattern && f.amount_bytes > 0)
            .find(|f| matches!(f.scope, Scope::Process { process, .. } if process == id))
            .map(|f| f.amount_bytes)
    };
    let each = processes
        .iter()
        .filter_map(|&id| report.process(id))
        .filter_map(|p| {
            let memory = Memory::of(p, basis_of(p))?;
            let grown = match pattern {
                Pattern::Spike => memory.rise_bytes(),
                _ => memory.growth_bytes(),
            };
            Some(ProcessAmount {
                process: p.id,
                bytes: quoted(p.id).unwrap_or(grown),
                life_ns: memory.life_ns,
                step: step(&memory),
                released_at_shutdown_bytes: memory.teardown.map_or(0, |t| t.released_bytes),
            })
        })
        .collect();
    Amount { what, each }
}

/// When `memory` rose by at least [`MIN_GROWTH_BYTES`] and made at least
/// [`STEP_SHARE`] of that rise in one stretch of at most
/// [`STEP_MAX_LIFE_FRACTION`] of its active life, the shortest such
/// stretch.
fn step(memory: &Memory) -> Option<Step> {
    let readings = &memory.readings;
    let base = readings.first()?.bytes;
    let rise = readings.iter().map(|r| r.bytes).max()?.saturating_sub(base);
    if rise < MIN_GROWTH_BYTES {
        return None;
    }
    let wanted = (STEP_SHARE * rise as f64) as u64;
    let mut best: Option<(Reading, Reading)> = None;
    for (i, from) in readings.iter().enumerate() {
        let reached = readings[i..]
            .iter()
            .find(|to| to.bytes.saturating_sub(from.bytes) >= wanted);
        if let Some(to) = reached {
            if best.is_none_or(|(a, b)| to.t_ns - from.t_ns < b.t_ns - a.t_ns) {
                best = Some((*from, *to));
            }
        }
    }
    let (from, to) = best?;
    let in_ns = to.t_ns - from.t_ns;
    (in_ns as f64 <= STEP_MAX_LIFE_FRACTION * memory.life_ns as f64).then_some(Step {
        bytes: to.bytes - from.bytes,
        in_ns,
        at_ns: from.t_ns,
    })
}

/// Whether the place bytes of a cause count what its processes held when
/// their teardown began rather than at their end: the ns of `process`'s
/// teardown start, if it had one.
pub(super) fn teardown_from_ns(report: &Report, process: ProcessId) -> Option<u64> {
    let p = report.process(process)?;
    Memory::of(p, files::basis(p))?.teardown.map(|t| t.from_ns)
}
