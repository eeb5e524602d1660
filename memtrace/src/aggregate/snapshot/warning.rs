//! Caveats of the aggregation step's result: each [`Warning`] a report
//! carries, shown by the reporters so that the reader knows how far to trust
//! its numbers.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::aggregate::ProcessId;

/// Something the reader of a report must know to trust it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Warning {
    /// The ring buffer was full and records were lost.
    DroppedRecords {
        /// Records lost.
        records: u64,
    },
    /// Records failed to decode.
    DecodeErrors {
        /// Records skipped.
        records: u64,
    },
    /// A process's memory has no Python attribution.
    NoPythonStacks {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it
        /// ([`ProcessReport::name`](super::ProcessReport::name)).
        name: String,
        /// Its command line.
        cmdline: String,
        /// Why (not Python, unsupported version, ...).
        reason: String,
    },
    /// Sampled stacks that carry an unknown frame (truncated, unreadable).
    IncompleteStacks {
        /// The unknown frame's reason.
        reason: String,
        /// Samples with such a stack.
        samples: u64,
    },
    /// A process for which no RSS was ever read.
    NoRssReadings {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it
        /// ([`ProcessReport::name`](super::ProcessReport::name)).
        name: String,
    },
    /// The address map of held pages hit its memory bound and kept only a
    /// share of the sampled pages of a process (each kept one weighing
    /// more): held bytes stay unbiased but vary more.
    HeldMapCoarsened {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it
        /// ([`ProcessReport::name`](super::ProcessReport::name)).
        name: String,
        /// 1 in `2^level` sampled pages kept.
        level: u32,
    },
    /// Sampled growth whose address was unknown (memory made resident
    /// without a page fault, e.g. `MAP_POPULATE`): counted as held until
    /// its process ends.
    UnplacedGrowth {
        /// The image.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
        /// How the report names it
        /// ([`ProcessReport::name`](super::ProcessReport::name)).
        name: String,
        /// Sampled bytes without an address.
        bytes: u64,
    },
    /// A CPython binary's exit point was found later than where the
    /// interpreter starts to free its objects, or not at all.
    ExitPoint {
        /// Which symbol was missing and what that costs.
        caveat: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DroppedRecords { records } => write!(
                f,
                "{records} records were dropped because the ring buffer was full: \
                 sampled stack totals undercount (exact per-process counters do not); \
                 a larger --sample-bytes records fewer stacks"
            ),
            Self::DecodeErrors { records } => {
                write!(f, "{records} records could not be decoded and were skipped")
            }
            Self::NoPythonStacks {
                name,
                cmdline,
                reason,
                ..
            } => write!(
                f,
                "{name} (`{cmdline}`): no Python stacks ({reason}): its RSS and growth by \
                 native stack are still traced; no Python function or line can be named"
            ),
            Self::IncompleteStacks { reason, samples } => {
                write!(f, "{samples} samples have incomplete stacks: {reason}")
            }
            Self::NoRssReadings { name, .. } => {
                write!(f, "{name}: no RSS was read (it may have exited first)")
            }
            Self::HeldMapCoarsened { name, level, .. } => write!(
                f,
                "{name}: the map of held pages reached its memory bound and keeps 1 in {} \
                 sampled pages: held bytes are estimates with more variance",
                1_u64 << (*level).min(63)
            ),
            Self::UnplacedGrowth { name, bytes, .. } => write!(
                f,
                "{name}: {} of sampled growth had no address (made resident without a \
                 page fault) and counts as held until the process ends",
                crate::units::format_bytes(*bytes)
            ),
            Self::ExitPoint { caveat } => f.write_str(caveat),
        }
    }
}
