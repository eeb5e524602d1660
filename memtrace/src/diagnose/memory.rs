//! Shared by the pattern modules of the diagnosis step: one process image's
//! [`Memory`] over its life as a finding reads it, on a [`Basis`] (its RSS,
//! or its RSS without file-backed pages), from the report's RSS summary and
//! timeline.

use crate::aggregate::{ProcessReport, RssPoint};
use crate::units::format_bytes;

use super::seconds;
pub(super) use super::teardown::Reading;
use super::teardown::{self, Teardown};

/// Which memory of a process a per-process finding reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Basis {
    /// Its RSS, as the process table shows it.
    Rss,
    /// Its RSS without file-backed pages (anonymous + shmem), for a process
    /// whose growth is mostly file-backed: its page cache is told apart
    /// ([`Pattern::FileBackedGrowth`](super::Pattern::FileBackedGrowth)),
    /// never read as its own growth.
    WithoutFile,
}

impl Basis {
    /// How evidence lines name the memory.
    pub(super) fn what(self) -> &'static str {
        match self {
            Self::Rss => "RSS",
            Self::WithoutFile => "RSS without file-backed pages",
        }
    }
}

/// One process image's memory over its active life (which ends where its
/// exit began or it exec'd: the report's timelines end there; or, when its
/// last moments were the program's own [`Teardown`], where that began), as
/// a finding reads it. On [`Basis::Rss`] the start and peak are the image's
/// [`crate::aggregate::RssSummary`], the numbers of the process table, and
/// so is the end unless a teardown came before it.
#[derive(Clone, Debug)]
pub(super) struct Memory {
    pub(super) basis: Basis,
    pub(super) readings: Vec<Reading>,
    pub(super) start_bytes: u64,
    pub(super) end_bytes: u64,
    pub(super) peak_bytes: u64,
    /// How long the active life lasted (the image's traced time, less its
    /// teardown).
    pub(super) life_ns: u64,
    /// The teardown cut off the end, if there was one.
    pub(super) teardown: Option<Teardown>,
}

impl Memory {
    /// `p`'s memory on `basis`; `None` without RSS readings.
    pub(super) fn of(p: &ProcessReport, basis: Basis) -> Option<Self> {
        let rss = p.rss?;
        let bytes = |pt: &RssPoint| match basis {
            Basis::Rss => pt.rss_bytes,
            Basis::WithoutFile => pt.rss_bytes.saturating_sub(pt.file_bytes),
        };
        let readings: Vec<Reading> = p
            .timeline
            .iter()
            .map(|pt| Reading {
                t_ns: pt.t_ns,
                bytes: bytes(pt),
                activity: pt.page_faults.saturating_add(pt.syscalls),
            })
            .collect();
        let highest = readings.iter().map(|r| r.bytes).max()?;
        let (start_bytes, end_bytes, peak_bytes) = match basis {
            Basis::Rss => (rss.start_bytes, rss.end_bytes, rss.peak_bytes.max(highest)),
            Basis::WithoutFile => (readings.first()?.bytes, readings.last()?.bytes, highest),
        };
        let whole = Self {
            basis,
            readings,
            start_bytes,
            end_bytes,
            peak_bytes,
            life_ns: p.traced_ns,
            teardown: None,
        };
        Some(match teardown::of(p, &whole.readings) {
            Some(teardown) => whole.before(p, teardown),
            None => whole,
        })
    }

    /// This memory cut where `teardown` began: its readings up to that
    /// one, its end that reading.
    fn before(mut self, p: &ProcessReport, teardown: Teardown) -> Self {
        self.readings.truncate(teardown.from_index + 1);
        self.end_bytes = self.readings[teardown.from_index].bytes;
        self.life_ns = teardown.from_ns.saturating_sub(p.started_ns);
        self.teardown = Some(teardown);
        self
    }

    /// `end - start`, 0 when it shrank.
    pub(super) fn growth_bytes(&self) -> u64 {
        self.end_bytes.saturating_sub(self.start_bytes)
    }

    /// `peak - start`: how far it rose, whether or not it fell back.
    pub(super) fn rise_bytes(&self) -> u64 {
        self.peak_bytes.saturating_sub(self.start_bytes)
    }

    /// `tgid N (`label`): RSS a -> b (peak c) over T`, then `, then
    /// released X while shutting down` after a teardown.
    pub(super) fn line(&self, p: &ProcessReport) -> String {
        let mut line = format!(
            "{} (`{}`): {} {} -> {} (peak {}) over {}",
            p.name(),
            p.label(),
            self.basis.what(),
            format_bytes(self.start_bytes),
            format_bytes(self.end_bytes),
            format_bytes(self.peak_bytes),
            seconds(self.life_ns)
        );
        if let Some(teardown) = &self.teardown {
            line.push_str(&format!(", then {}", teardown.phrase()));
        }
        line
    }

    /// The teardown's evidence line, when there was one.
    pub(super) fn teardown_line(&self, p: &ProcessReport) -> Option<String> {
        self.teardown.map(|t| t.line(p, self.basis.what()))
    }
}

/// `anonymous pages touched X, released Y (exact, gross: re-touches
/// counted each time)` from `p`'s counters.
pub(super) fn anon_counters_line(p: &ProcessReport) -> Option<String> {
    p.counters.map(|c| {
        format!(
            "anonymous pages touched {}, released {} (exact, gross: re-touches counted each \
             time)",
            format_bytes(c.anon_growth_bytes),
            format_bytes(c.anon_release_bytes)
        )
    })
}
