//! Growth paths over time inside the aggregation step: each path's sampled
//! bytes summed per time bucket. All paths share one bucket width, which
//! starts at [`INITIAL_PATH_BUCKET_NS`] and doubles (merging neighbouring
//! buckets pairwise) whenever the run no longer fits in
//! [`MAX_PATH_BUCKETS`] buckets.

use serde::{Deserialize, Serialize};

use super::SampledBytes;

/// Width of a path bucket at the start of a run: one second, in nanoseconds.
pub const INITIAL_PATH_BUCKET_NS: u64 = 1_000_000_000;

/// Most buckets a run spans; past that the bucket width doubles.
pub const MAX_PATH_BUCKETS: u64 = 120;

/// Sampled bytes of one growth path in one time bucket (not cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathPoint {
    /// Bucket start, in nanoseconds since the run start (a multiple of
    /// [`crate::aggregate::Report::path_bucket_ns`]).
    pub t_ns: u64,
    /// Sampled resident growth in the bucket (anonymous, file-backed and
    /// shared: [`SampledBytes::grown_bytes`]).
    pub growth_bytes: u64,
    /// Sampled copy-on-write un-sharing in the bucket.
    pub cow_bytes: u64,
    /// Sampled address space removed or given back in the bucket.
    pub unmapped_bytes: u64,
    /// Change of the bytes the path holds in the bucket (negative when it
    /// gave memory back): the running sum is what it held then.
    #[serde(default)]
    pub held_bytes: i64,
}

impl PathPoint {
    /// Whether the point carries no bytes (such points are not stored).
    fn is_empty(&self) -> bool {
        self.growth_bytes == 0
            && self.cow_bytes == 0
            && self.unmapped_bytes == 0
            && self.held_bytes == 0
    }

    /// Sums `other`'s bytes into this point.
    fn merge(&mut self, other: &Self) {
        self.growth_bytes = self.growth_bytes.saturating_add(other.growth_bytes);
        self.cow_bytes = self.cow_bytes.saturating_add(other.cow_bytes);
        self.unmapped_bytes = self.unmapped_bytes.saturating_add(other.unmapped_bytes);
        self.held_bytes = self.held_bytes.saturating_add(other.held_bytes);
    }
}

/// The bucket width shared by all paths of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BucketWidth {
    width_ns: u64,
}

impl Default for BucketWidth {
    fn default() -> Self {
        Self {
            width_ns: INITIAL_PATH_BUCKET_NS,
        }
    }
}

impl BucketWidth {
    /// Current width, in nanoseconds.
    pub(crate) fn ns(self) -> u64 {
        self.width_ns
    }

    /// How many times the width must double so that a run reaching `t_ns`
    /// (relative to its start) fits in [`MAX_PATH_BUCKETS`] buckets.
    pub(crate) fn doublings_to_fit(self, t_ns: u64) -> u32 {
        let mut width_ns = self.width_ns;
        let mut doublings = 0;
        while t_ns / width_ns >= MAX_PATH_BUCKETS {
            width_ns = width_ns.saturating_mul(2);
            doublings += 1;
        }
        doublings
    }

    /// The width after `doublings` doublings.
    pub(crate) fn doubled(self, doublings: u32) -> Self {
        let factor = 1_u64.checked_shl(doublings).unwrap_or(u64::MAX);
        Self {
            width_ns: self.width_ns.saturating_mul(factor),
        }
    }

    /// Start of the bucket holding `t_ns`.
    fn bucket_start(self, t_ns: u64) -> u64 {
        t_ns - t_ns % self.width_ns
    }
}

/// One path's points: only buckets with bytes, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PathTimeline {
    points: Vec<PathPoint>,
}

impl PathTimeline {
    /// Adds `bytes` (growth, copy-on-write, unmapped and held bytes; the
    /// rest is not kept over time) at `t_ns` into its bucket of `width`.
    pub(crate) fn add(&mut self, width: BucketWidth, t_ns: u64, bytes: &SampledBytes) {
        let point = PathPoint {
            t_ns: width.bucket_start(t_ns),
            growth_bytes: bytes.grown_bytes(),
            cow_bytes: bytes.cow_bytes,
            unmapped_bytes: bytes.unmapped_bytes,
            held_bytes: bytes.held_bytes,
        };
        if point.is_empty() {
            return;
        }
        // Samples arrive nearly in time order: the last bucket is the usual hit.
        match self.points.binary_search_by_key(&point.t_ns, |p| p.t_ns) {
            Ok(index) => self.points[index].merge(&point),
            Err(index) => self.points.insert(index, point),
        }
    }

    /// Re-buckets the points into buckets of `width` (a multiple of the
    /// width they were stored with), merging the points that now share one.
    pub(crate) fn rebucket(&mut self, width: BucketWidth) {
        let mut merged: Vec<PathPoint> = Vec::with_capacity(self.points.len());
        for point in &self.points {
            let t_ns = width.bucket_start(point.t_ns);
            match merged.last_mut() {
                Some(last) if last.t_ns == t_ns => last.merge(point),
                _ => merged.push(PathPoint { t_ns, ..*point }),
            }
        }
        self.points = merged;
    }

    /// The stored points, oldest first.
    pub(crate) fn points(&self) -> &[PathPoint] {
        &self.points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn growth(bytes: u64) -> SampledBytes {
        SampledBytes {
            growth_bytes: bytes,
            samples: 1,
            ..SampledBytes::default()
        }
    }

    #[test]
    fn bytes_are_summed_per_bucket_in_time_order() {
        let width = BucketWidth::default();
        let mut timeline = PathTimeline::default();
        timeline.add(width, 2 * S + 5, &growth(10));
        timeline.add(width, 100, &growth(1));
        timeline.add(width, 2 * S + 999, &growth(20));
        let cow = SampledBytes {
            cow_bytes: 4096,
            unmapped_bytes: 7,
            ..SampledBytes::default()
        };
        timeline.add(width, S - 1, &cow);
        // Only mapped bytes: nothing over time.
        let mapped = SampledBytes {
            mapped_bytes: 99,
            ..SampledBytes::default()
        };
        timeline.add(width, 5 * S, &mapped);
        let expected = [
            PathPoint {
                t_ns: 0,
                growth_bytes: 1,
                cow_bytes: 4096,
                unmapped_bytes: 7,
                held_bytes: 0,
            },
            PathPoint {
                t_ns: 2 * S,
                growth_bytes: 30,
                ..PathPoint::default()
            },
        ];
        assert_eq!(timeline.points(), &expected);
    }

    #[test]
    fn width_doubles_until_the_run_fits_in_the_bucket_limit() {
        let width = BucketWidth::default();
        assert_eq!(width.doublings_to_fit(0), 0);
        assert_eq!(width.doublings_to_fit(119 * S + S - 1), 0);
        assert_eq!(width.doublings_to_fit(120 * S), 1);
        assert_eq!(width.doublings_to_fit(239 * S), 1);
        assert_eq!(width.doublings_to_fit(240 * S), 2);
        assert_eq!(width.doubled(2).ns(), 4 * S);
        let hour = 3_600 * S;
        let fitted = width.doubled(width.doublings_to_fit(hour));
        assert!(hour / fitted.ns() < MAX_PATH_BUCKETS);
        assert!(hour / (fitted.ns() / 2) >= MAX_PATH_BUCKETS);
    }

    #[test]
    fn rebucketing_merges_pairs_and_matches_direct_bucketing() {
        let fine = BucketWidth::default();
        let coarse = fine.doubled(1);
        let times = [0, S / 2, S, 3 * S + 1, 4 * S, 9 * S];
        let mut rebucketed = PathTimeline::default();
        let mut direct = PathTimeline::default();
        for (i, &t) in times.iter().enumerate() {
            let bytes = growth(1 << i);
            rebucketed.add(fine, t, &bytes);
            direct.add(coarse, t, &bytes);
        }
        rebucketed.rebucket(coarse);
        assert_eq!(rebucketed, direct);
        let buckets: Vec<(u64, u64)> = direct
            .points()
            .iter()
            .map(|p| (p.t_ns, p.growth_bytes))
            .collect();
        assert_eq!(
            buckets,
            vec![
                (0, 0b111),
                (2 * S, 0b1000),
                (4 * S, 0b1_0000),
                (8 * S, 0b10_0000)
            ]
        );
    }
}
