//! RSS timeline of one process inside the aggregation step: periodic counter
//! reads in, a bounded list of points out (downsampled online, always keeping
//! the high-water mark).

use memtrace_common::{ProcessCounters, MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES};
use serde::{Deserialize, Serialize};

/// Most points a process timeline keeps; longer runs are downsampled.
pub const MAX_TIMELINE_POINTS: usize = 600;

/// Resident memory of one process at one moment, from `kmem:rss_stat`
/// counters. Members the kernel has not reported yet count as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssPoint {
    /// Time since the start of the run, in nanoseconds.
    pub t_ns: u64,
    /// file + anon + shmem resident bytes.
    pub rss_bytes: u64,
    /// Resident anonymous bytes (`MM_ANONPAGES`).
    pub anon_bytes: u64,
    /// Resident file-backed bytes (`MM_FILEPAGES`).
    pub file_bytes: u64,
    /// Resident shared-memory bytes (`MM_SHMEMPAGES`).
    pub shmem_bytes: u64,
    /// User page faults seen so far (cumulative: activity between two points
    /// is the increase). Absent in reports written before it existed (0).
    #[serde(default)]
    pub page_faults: u64,
    /// Address-space syscalls (mmap, munmap, mremap, brk, madvise) seen so
    /// far (cumulative). Absent in reports written before it existed (0).
    #[serde(default)]
    pub syscalls: u64,
    /// Latest proportional set size read from /proc/PID/smaps_rollup at or
    /// before this point; absent when none was read yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pss_bytes: Option<u64>,
    /// Latest unique set size (private pages) read with `pss_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uss_bytes: Option<u64>,
}

impl RssPoint {
    /// Builds a point from counters read at `t_ns` (relative to the run
    /// start); `None` when none of file/anon/shmem is known yet.
    pub fn from_counters(t_ns: u64, counters: &ProcessCounters) -> Option<Self> {
        let member = |index: usize| {
            let known = counters.rss_known & (1 << index) != 0;
            known.then_some(counters.rss_bytes[index])
        };
        let (anon, file, shmem) = (
            member(MM_ANONPAGES),
            member(MM_FILEPAGES),
            member(MM_SHMEMPAGES),
        );
        if anon.is_none() && file.is_none() && shmem.is_none() {
            return None;
        }
        let (anon_bytes, file_bytes, shmem_bytes) =
            (anon.unwrap_or(0), file.unwrap_or(0), shmem.unwrap_or(0));
        Some(Self {
            t_ns,
            rss_bytes: anon_bytes
                .saturating_add(file_bytes)
                .saturating_add(shmem_bytes),
            anon_bytes,
            file_bytes,
            shmem_bytes,
            page_faults: counters.page_faults,
            syscalls: counters.syscalls,
            pss_bytes: None,
            uss_bytes: None,
        })
    }
}

/// Keeps the higher of two points (the earlier one on a tie).
fn higher(kept: RssPoint, new: RssPoint) -> RssPoint {
    if new.rss_bytes > kept.rss_bytes {
        new
    } else {
        kept
    }
}

/// Online downsampler: every stored point stands for `stride` consecutive
/// readings and is the one with the highest RSS among them, so the peak
/// survives. When the store fills up, neighbours are merged pairwise and the
/// stride doubles; at most [`MAX_TIMELINE_POINTS`] points are kept, plus the
/// last reading (the process's end, which the report quotes).
#[derive(Clone, Debug)]
pub(crate) struct Timeline {
    /// Finished buckets, oldest first.
    points: Vec<RssPoint>,
    /// Highest point of the bucket being filled.
    pending: Option<RssPoint>,
    /// Readings in the bucket being filled.
    pending_readings: u64,
    /// Readings per bucket (a power of two).
    stride: u64,
    /// The latest reading.
    last: Option<RssPoint>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self {
            points: Vec::new(),
            pending: None,
            pending_readings: 0,
            stride: 1,
            last: None,
        }
    }
}

impl Timeline {
    /// Adds one reading. Readings come from records (a fork, the start of
    /// an exit, an execve: stamped in the kernel) and from periodic reads
    /// (stamped when userspace reads), so one can arrive after a later one
    /// by as much as the ring buffer lags; it is placed at the latest
    /// reading's time, which keeps the timeline in time order.
    pub(crate) fn push(&mut self, mut point: RssPoint) {
        if let Some(last) = self.last {
            point.t_ns = point.t_ns.max(last.t_ns);
        }
        self.last = Some(point);
        let bucket = self.pending.map_or(point, |kept| higher(kept, point));
        self.pending_readings += 1;
        if self.pending_readings < self.stride {
            self.pending = Some(bucket);
            return;
        }
        self.pending = None;
        self.pending_readings = 0;
        self.points.push(bucket);
        if self.points.len() >= MAX_TIMELINE_POINTS {
            self.halve();
        }
    }

    /// Merges neighbouring buckets pairwise and doubles the stride.
    fn halve(&mut self) {
        self.points = self
            .points
            .chunks(2)
            .map(|pair| pair.iter().copied().reduce(higher).unwrap_or_default())
            .collect();
        self.stride = self.stride.saturating_mul(2);
    }

    /// The stored points, oldest first, including the partly filled bucket
    /// and, after it, the latest reading when its bucket kept a higher one.
    pub(crate) fn into_points(mut self) -> Vec<RssPoint> {
        self.points.extend(self.pending);
        if let Some(last) = self.last {
            if self.points.last().is_some_and(|kept| kept.t_ns < last.t_ns) {
                self.points.push(last);
            }
        }
        self.points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t_ns: u64, rss_bytes: u64) -> RssPoint {
        RssPoint {
            t_ns,
            rss_bytes,
            anon_bytes: rss_bytes,
            ..RssPoint::default()
        }
    }

    #[test]
    fn rss_is_the_sum_of_known_members_only() {
        let mut counters = ProcessCounters::default();
        assert_eq!(RssPoint::from_counters(5, &counters), None);
        counters.rss_bytes = [100, 200, 4000, 30];
        counters.rss_known = (1 << MM_ANONPAGES) | (1 << MM_SHMEMPAGES);
        counters.page_faults = 17;
        counters.syscalls = 3;
        let p = RssPoint::from_counters(5, &counters).unwrap();
        assert_eq!(p.rss_bytes, 230);
        assert_eq!((p.page_faults, p.syscalls), (17, 3));
        assert_eq!((p.anon_bytes, p.file_bytes, p.shmem_bytes), (200, 0, 30));
        assert_eq!(p.t_ns, 5);
    }

    #[test]
    fn short_timelines_are_kept_as_is() {
        let mut timeline = Timeline::default();
        for i in 0..10 {
            timeline.push(point(i, i * 10));
        }
        let points = timeline.into_points();
        assert_eq!(points.len(), 10);
        assert_eq!(points[9], point(9, 90));
    }

    #[test]
    fn long_timelines_are_bounded_and_keep_the_peak() {
        let mut timeline = Timeline::default();
        let readings = 10_000_u64;
        for i in 0..readings {
            // A single spike in the middle of a flat line.
            let rss = if i == 4_321 { 9_999 } else { 100 };
            timeline.push(point(i, rss));
        }
        let points = timeline.into_points();
        assert!(points.len() <= MAX_TIMELINE_POINTS, "{}", points.len());
        assert!(points.len() > MAX_TIMELINE_POINTS / 4, "{}", points.len());
        assert!(points.contains(&point(4_321, 9_999)));
        assert!(points.windows(2).all(|w| w[0].t_ns < w[1].t_ns));
        assert_eq!(points.last(), Some(&point(readings - 1, 100)));
    }

    #[test]
    fn a_reading_that_arrives_late_keeps_the_timeline_in_time_order() {
        let mut timeline = Timeline::default();
        timeline.push(point(100, 10));
        timeline.push(point(300, 20));
        // Stamped before the reading it arrives after.
        timeline.push(point(250, 30));
        timeline.push(point(400, 40));
        let points = timeline.into_points();
        assert_eq!(
            points
                .iter()
                .map(|p| (p.t_ns, p.rss_bytes))
                .collect::<Vec<_>>(),
            [(100, 10), (300, 20), (300, 30), (400, 40)]
        );
    }

    #[test]
    fn the_last_reading_ends_the_timeline_even_below_its_bucket_peak() {
        let mut timeline = Timeline::default();
        for i in 0..(MAX_TIMELINE_POINTS as u64 + 3) {
            timeline.push(point(i, 500));
        }
        timeline.push(point(10_000, 7));
        let points = timeline.into_points();
        assert_eq!(points.last(), Some(&point(10_000, 7)));
    }
}
