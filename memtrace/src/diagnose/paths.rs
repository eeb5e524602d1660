//! Growth-path timelines in the diagnosis step: whether a path grew steadily
//! across the run's buckets (the unbounded-cache signature) or in one burst.

use std::collections::BTreeMap;

use crate::aggregate::PathReport;

use super::{STEADY_MAX_BUCKET_SHARE, STEADY_MIN_BUCKETS, STEADY_PRESENT_FRACTION};

/// Growth of `paths` summed per bucket index (bucket start / `bucket_ns`),
/// for the buckets with growth, oldest first.
fn growth_buckets(paths: &[&PathReport], bucket_ns: u64) -> Vec<(u64, u64)> {
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    for pt in paths.iter().flat_map(|p| &p.timeline) {
        *buckets.entry(pt.t_ns / bucket_ns.max(1)).or_default() += pt.growth_bytes;
    }
    buckets.into_iter().filter(|&(_, g)| g > 0).collect()
}

/// How a path's growth spread over the buckets it grew in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Spread {
    /// Buckets from its first to its last growth, both included.
    pub(super) span_buckets: u64,
    /// Buckets with growth among them.
    pub(super) growing_buckets: u64,
    /// Largest share (0..=1) of its growth in any one bucket.
    pub(super) max_bucket_share: f64,
    /// Largest share (0..=1) of its growth in two adjacent buckets.
    pub(super) max_pair_share: f64,
}

impl Spread {
    /// Whether this is the unbounded-cache signature: growth in most buckets
    /// of a span of at least [`STEADY_MIN_BUCKETS`], none dominating.
    pub(super) fn is_steady(&self) -> bool {
        self.span_buckets >= STEADY_MIN_BUCKETS
            && self.growing_buckets as f64 >= STEADY_PRESENT_FRACTION * self.span_buckets as f64
            && self.max_bucket_share <= STEADY_MAX_BUCKET_SHARE
    }
}

/// The spread of the summed growth of `paths` over buckets of `bucket_ns`;
/// `None` when they have no bucket timeline with growth.
pub(super) fn spread(paths: &[&PathReport], bucket_ns: u64) -> Option<Spread> {
    let buckets = growth_buckets(paths, bucket_ns);
    let (first, last) = (buckets.first()?.0, buckets.last()?.0);
    let total: u64 = buckets.iter().map(|&(_, g)| g).sum();
    let max_bucket = buckets.iter().map(|&(_, g)| g).max().unwrap_or(0);
    let max_pair = buckets
        .iter()
        .map(|&(index, g)| {
            let next = buckets
                .iter()
                .find(|&&(i, _)| i == index + 1)
                .map_or(0, |&(_, g)| g);
            g + next
        })
        .max()
        .unwrap_or(0);
    let share = |bytes: u64| bytes as f64 / total.max(1) as f64;
    Some(Spread {
        span_buckets: last - first + 1,
        growing_buckets: buckets.len() as u64,
        max_bucket_share: share(max_bucket),
        max_pair_share: share(max_pair),
    })
}
