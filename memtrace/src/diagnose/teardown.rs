//! Part of the diagnosis step, before the pattern modules judge a process
//! image's memory: tells the program's own teardown (its last moments after
//! its work stopped: a pool shut down, a queue or cache cleared, objects
//! dropped on the way out) from a release during its life, so that a
//! release in teardown is said as such and never makes a spike, a
//! retention-then-release or noise. Patterns are judged, and "how much"
//! quoted, over the image's active life: its memory (`super::memory`) up
//! to the teardown, which builds on this module (never the other way).
//!
//! The signals, all from the image's own record:
//! - the image ended by exiting: its exit began (CPython's finalization
//!   after its threads were joined and its `atexit` handlers ran,
//!   `exit_group(2)`, or the exit itself), not an execve and not the end of
//!   the trace while it still ran;
//! - the release is the last thing its memory did: from the highest
//!   reading of its last [`TEARDOWN_MAX_NS`] the memory only fell, to the
//!   reading where the exit began (a rise of a tenth of the release on
//!   the way out is allowed);
//! - the release is short against the life before it: the active life
//!   (run start to the release) lasted at least [`TEARDOWN_MIN_LIFE_RATIO`]
//!   times the release, so the release follows the work instead of being
//!   the work;
//! - it gave back at least [`MIN_GROWTH_BYTES`] and at least
//!   [`TEARDOWN_RELEASE_FRACTION`] of what the active life rose.

use crate::aggregate::{ExitBegin, ProcessReport};
use crate::units::format_bytes;

use super::{seconds, MIN_GROWTH_BYTES};

/// One reading of a process's memory on a basis (its RSS, or its RSS
/// without file-backed pages: `super::memory::Basis`), the input of
/// [`of`] and of `super::memory::Memory`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reading {
    /// Since the run start.
    pub(super) t_ns: u64,
    /// The memory on the basis.
    pub(super) bytes: u64,
    /// Page faults plus address-space syscalls so far (cumulative).
    pub(super) activity: u64,
}

/// A release counts as teardown only when it starts at most this long
/// before the image's exit began: a service's shutdown hook, a pool's
/// `shutdown()`, the clearing of module state right before returning from
/// `main`. 1.5 s.
pub(super) const TEARDOWN_MAX_NS: u64 = 1_500_000_000;

/// The active life before the release lasts at least this many times the
/// release itself. 3.
pub(super) const TEARDOWN_MIN_LIFE_RATIO: u64 = 3;

/// The release gives back at least this share of the active life's rise.
/// 0.5.
pub(super) const TEARDOWN_RELEASE_FRACTION: f64 = 0.5;

/// The program's own teardown at the end of an image's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Teardown {
    /// Index of the reading where the release began (the last reading of
    /// the active life).
    pub(super) from_index: usize,
    /// When the release began, since the run start.
    pub(super) from_ns: u64,
    /// When the exit began (the image's end), since the run start.
    pub(super) to_ns: u64,
    /// Memory (on the memory's basis) given back from `from_ns` to `to_ns`.
    pub(super) released_bytes: u64,
}

impl Teardown {
    /// `released 301.3 MiB while shutting down`.
    pub(super) fn phrase(&self) -> String {
        format!(
            "released {} while shutting down",
            format_bytes(self.released_bytes)
        )
    }

    /// The evidence line: when and how fast it was released, and what ended
    /// the image.
    pub(super) fn line(&self, p: &ProcessReport, what: &str) -> String {
        let ended_by = match p.exit_began_by {
            Some(ExitBegin::PythonFinalize) => "the interpreter's finalization began",
            Some(ExitBegin::ExitGroup) => "it called exit_group",
            Some(ExitBegin::Exit) | None => "it exited",
        };
        format!(
            "teardown, not a pattern: {what} fell by {} in {} from {}, its last change before \
             {ended_by} at {}; patterns are judged over its life before {}",
            format_bytes(self.released_bytes),
            seconds(self.to_ns - self.from_ns),
            seconds(self.from_ns),
            seconds(self.to_ns),
            seconds(self.from_ns)
        )
    }
}

/// The teardown at the end of `p`'s memory `readings` (its whole life,
/// oldest first), if its last moments were one (see the module's signals).
pub(super) fn of(p: &ProcessReport, readings: &[Reading]) -> Option<Teardown> {
    let to_ns = p.exit_began_ns.or(p.exited_ns)?;
    let last = readings.last()?;
    if p.exec_ns.is_some() || readings.len() < 3 {
        return None;
    }
    let window_from = last.t_ns.saturating_sub(TEARDOWN_MAX_NS);
    let from_index = (0..readings.len())
        .filter(|&i| readings[i].t_ns >= window_from)
        .max_by_key(|&i| (readings[i].bytes, std::cmp::Reverse(i)))?;
    let top = readings[from_index];
    let released_bytes = top.bytes.saturating_sub(last.bytes);
    // A few pages touched on the way out are not a new rise.
    let only_falls = readings[from_index..]
        .windows(2)
        .all(|w| w[1].bytes <= w[0].bytes + released_bytes / 10);
    let active = &readings[..=from_index];
    let base = active.iter().map(|r| r.bytes).min()?;
    let rise = top.bytes.saturating_sub(base);
    let release_ns = to_ns.saturating_sub(top.t_ns).max(1);
    let life_ns = top.t_ns.saturating_sub(readings[0].t_ns);
    let teardown = only_falls
        && from_index > 0
        && released_bytes >= MIN_GROWTH_BYTES
        && released_bytes as f64 >= TEARDOWN_RELEASE_FRACTION * rise as f64
        && life_ns >= TEARDOWN_MIN_LIFE_RATIO * release_ns;
    teardown.then_some(Teardown {
        from_index,
        from_ns: top.t_ns,
        to_ns,
        released_bytes,
    })
}
