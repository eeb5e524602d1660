//! One process image inside the aggregation step: its identity, lifecycle
//! (start, execve, start of exit, exit), RSS readings, PSS/USS readings and
//! latest counters, and how its [`ProcessReport`] is built from them.

use memtrace_common::ProcessCounters;

use super::timeline::Timeline;
use super::{
    ExactCounters, ExitBegin, ExitStatus, ProcessId, ProcessKind, ProcessReport, ProcessStart,
    PythonStatus, Role, RssPoint, RssSummary, SampledBytes, Sharing, SharingSummary,
};

/// Least change of RSS between the last PSS/USS reading and an image's end
/// that makes the reading stale (with [`STALE_SHARING_CHANGE_FRACTION`]).
const STALE_SHARING_CHANGE_BYTES: u64 = 8 * 1024 * 1024;
/// Least change, as a fraction of the end RSS, that makes it stale.
const STALE_SHARING_CHANGE_FRACTION: f64 = 0.25;

/// Running min-first/last/max of PSS and USS readings.
#[derive(Clone, Copy, Debug)]
struct SharingHistory {
    first: Sharing,
    last: Sharing,
    peak: Sharing,
    /// RSS read with `last`, when known.
    last_rss_bytes: Option<u64>,
}

impl SharingHistory {
    fn new(reading: Sharing, rss_bytes: Option<u64>) -> Self {
        Self {
            first: reading,
            last: reading,
            peak: reading,
            last_rss_bytes: rss_bytes,
        }
    }

    fn push(&mut self, reading: Sharing, rss_bytes: Option<u64>) {
        self.last = reading;
        self.last_rss_bytes = rss_bytes;
        self.peak.pss_bytes = self.peak.pss_bytes.max(reading.pss_bytes);
        self.peak.uss_bytes = self.peak.uss_bytes.max(reading.uss_bytes);
    }

    /// The summary for an image that ended at `end_rss_bytes`, if known.
    fn summary(&self, end_rss_bytes: Option<u64>) -> SharingSummary {
        let end_stale = match (self.last_rss_bytes, end_rss_bytes) {
            (Some(read), Some(end)) => {
                let change = read.abs_diff(end);
                change > STALE_SHARING_CHANGE_BYTES
                    && change as f64 > STALE_SHARING_CHANGE_FRACTION * end as f64
            }
            _ => false,
        };
        SharingSummary {
            end_stale,
            start_pss_bytes: self.first.pss_bytes,
            end_pss_bytes: self.last.pss_bytes,
            peak_pss_bytes: self.peak.pss_bytes,
            start_uss_bytes: self.first.uss_bytes,
            end_uss_bytes: self.last.uss_bytes,
            peak_uss_bytes: self.peak.uss_bytes,
        }
    }
}

/// State of one process image during the run. Times are CLOCK_MONOTONIC ns.
#[derive(Debug)]
pub(super) struct ProcessState {
    pub(super) tgid: u32,
    pub(super) start_time_ns: u64,
    pub(super) image: u32,
    pub(super) previous_image: Option<ProcessId>,
    pub(super) next_image: Option<ProcessId>,
    pub(super) parent: Option<ProcessId>,
    pub(super) parent_tgid: Option<u32>,
    pub(super) role: Role,
    pub(super) cmdline: String,
    pub(super) python: Option<PythonStatus>,
    pub(super) started_ns: u64,
    pub(super) exec_ns: Option<u64>,
    pub(super) exit_began_ns: Option<u64>,
    pub(super) exit_began_by: Option<ExitBegin>,
    pub(super) exited_ns: Option<u64>,
    pub(super) exit_status: Option<ExitStatus>,
    first_rss: Option<RssPoint>,
    last_rss: Option<RssPoint>,
    peak_rss_bytes: u64,
    timeline: Timeline,
    counters: Option<ProcessCounters>,
    sharing: Option<SharingHistory>,
}

impl ProcessState {
    /// A new image of `start` (counters not yet applied).
    pub(super) fn new(start: &ProcessStart, parent_tgid: Option<u32>) -> Self {
        Self {
            tgid: start.tgid,
            start_time_ns: start.start_time_ns,
            image: 0,
            previous_image: None,
            next_image: None,
            parent: start.parent,
            parent_tgid,
            role: start.role,
            cmdline: start.cmdline.clone(),
            python: None,
            started_ns: start.ts_ns,
            exec_ns: None,
            exit_began_ns: None,
            exit_began_by: None,
            exited_ns: None,
            exit_status: None,
            first_rss: None,
            last_rss: None,
            peak_rss_bytes: 0,
            timeline: Timeline::default(),
            counters: None,
            sharing: None,
        }
    }

    /// The image an execve at `ts_ns` starts after `self` (`self` is `id`).
    pub(super) fn next(&self, id: ProcessId, ts_ns: u64, cmdline: String) -> Self {
        Self {
            image: self.image + 1,
            previous_image: Some(id),
            cmdline,
            started_ns: ts_ns,
            ..Self::new(
                &ProcessStart {
                    tgid: self.tgid,
                    start_time_ns: self.start_time_ns,
                    parent: self.parent,
                    role: self.role,
                    cmdline: String::new(),
                    ts_ns,
                    counters: ProcessCounters::default(),
                    sharing: None,
                },
                self.parent_tgid,
            )
        }
    }

    /// Whether the image still lives and counts (it has not exec'd nor
    /// begun to exit): later readings and samples are taken.
    pub(super) fn is_open(&self) -> bool {
        self.exec_ns.is_none() && self.exit_began_ns.is_none()
    }

    /// The latest counters read, if any.
    pub(super) fn latest_counters(&self) -> Option<ProcessCounters> {
        self.counters
    }

    /// Latest RSS, 0 before the first reading.
    pub(super) fn rss_now_bytes(&self) -> u64 {
        self.last_rss.map_or(0, |p| p.rss_bytes)
    }

    /// Latest PSS, 0 before the first reading.
    pub(super) fn pss_now_bytes(&self) -> u64 {
        self.sharing.map_or(0, |s| s.last.pss_bytes)
    }

    /// Applies a counter read at `t_ns` since the run start (with the PSS/USS
    /// read at the same time, if any).
    pub(super) fn read(&mut self, t_ns: u64, counters: &ProcessCounters, sharing: Option<Sharing>) {
        self.counters = Some(*counters);
        self.peak_rss_bytes = self.peak_rss_bytes.max(counters.rss_peak_bytes);
        let point = RssPoint::from_counters(t_ns, counters);
        if let Some(reading) = sharing {
            let rss_bytes = point.map(|p| p.rss_bytes);
            match &mut self.sharing {
                Some(history) => history.push(reading, rss_bytes),
                None => self.sharing = Some(SharingHistory::new(reading, rss_bytes)),
            }
        }
        let Some(mut point) = point else {
            return;
        };
        if let Some(history) = &self.sharing {
            point.pss_bytes = Some(history.last.pss_bytes);
            point.uss_bytes = Some(history.last.uss_bytes);
        }
        self.first_rss.get_or_insert(point);
        self.last_rss = Some(point);
        self.peak_rss_bytes = self.peak_rss_bytes.max(point.rss_bytes);
        self.timeline.push(point);
    }

    fn rss_summary(&self) -> Option<RssSummary> {
        let (first, last) = (self.first_rss?, self.last_rss?);
        let signed = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        Some(RssSummary {
            start_bytes: first.rss_bytes,
            end_bytes: last.rss_bytes,
            peak_bytes: self.peak_rss_bytes,
            growth_bytes: signed(last.rss_bytes).saturating_sub(signed(first.rss_bytes)),
        })
    }

    /// The report of this image (`id`), with times relative to `start_ns`,
    /// `end_ns` the end of the run, and its sampled totals.
    pub(super) fn report(
        &self,
        id: ProcessId,
        instance: u32,
        times: (u64, u64),
        sampled: SampledBytes,
        peak_held_bytes: u64,
    ) -> ProcessReport {
        let (start_ns, end_ns) = times;
        let relative = |ts: u64| ts.saturating_sub(start_ns);
        let started_ns = relative(self.started_ns);
        let ended_ns = self.exec_ns.or(self.exit_began_ns).unwrap_or(end_ns);
        ProcessReport {
            id,
            tgid: self.tgid,
            start_time_ns: self.start_time_ns,
            instance,
            image: self.image,
            previous_image: self.previous_image,
            next_image: self.next_image,
            parent: self.parent,
            parent_tgid: self.parent_tgid,
            role: self.role,
            // Told from the whole tree by `snapshot::assign_kinds`.
            kind: ProcessKind::default(),
            cmdline: self.cmdline.clone(),
            python: self.python.clone(),
            started_ns,
            exec_ns: self.exec_ns.map(relative),
            exit_began_ns: self.exit_began_ns.map(relative),
            exit_began_by: self.exit_began_by,
            exited_ns: self.exited_ns.map(relative),
            exit_status: self.exit_status,
            traced_ns: relative(ended_ns).saturating_sub(started_ns),
            rss: self.rss_summary(),
            sharing: self
                .sharing
                .map(|s| s.summary(self.last_rss.map(|p| p.rss_bytes))),
            counters: self.counters.as_ref().map(ExactCounters::from),
            sampled,
            peak_held_bytes,
            timeline: self.timeline.clone().into_points(),
        }
    }
}
