//! Code paths in the diagnosis step: a process's paths grouped by function
//! and ranked by the bytes they hold (at the high-water mark or at the end,
//! never by the bytes they grew), paths merged over several processes,
//! copy-on-write paths, and what a path's buckets say over time: whether the
//! bytes it holds keep rising (the unbounded-cache signature) or it grew in
//! one burst.

use std::collections::BTreeMap;

use crate::aggregate::{Frame, MappingKind, PathReport, ProcessId, ProcessReport, Report, StackId};
use crate::units::format_bytes;

use super::draft::PathEvidence;
use super::{
    path_name, RETOUCHED_RATIO, STEADY_MAX_BUCKET_SHARE, STEADY_MIN_BUCKETS, STEADY_MIN_HELD_SHARE,
    STEADY_PRESENT_FRACTION, TOP_PATHS,
};

/// The file a path's pages belong to, when the path ends in a file-backed
/// mapping frame (growth of page cache, not of the program's own memory).
pub(super) fn mapped_file(report: &Report, stack: StackId) -> Option<&str> {
    match report.frames(stack).last() {
        Some(Frame::Mapping {
            mapping: MappingKind::File,
            name,
        }) => Some(name),
        _ => None,
    }
}

/// Which of a process's paths a finding reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Paths of its own memory: anonymous and shared memory, not
    /// file-backed pages.
    Own,
    /// Paths that ended in file-backed pages (page cache of a mapped file).
    FileBacked,
}

/// Which held bytes rank a process's path groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rank {
    /// Held when the process's RSS was at its high-water mark (a spike).
    Peak,
    /// Held at the process's end (what it kept: retention, growth).
    End,
    /// Held at the end of its active life, when its teardown began at this
    /// time (ns since the run start): what it kept until it shut down
    /// ([`held_until`]).
    Until(u64),
}

impl Rank {
    /// [`Rank::Until`] the teardown's start, else `rank`.
    pub(super) fn before_teardown(
        rank: Self,
        teardown: Option<&super::teardown::Teardown>,
    ) -> Self {
        teardown.map_or(rank, |t| Self::Until(t.from_ns))
    }
}

/// The bytes `path` held by `until_ns` at most (the highest running sum of
/// its buckets' held changes over the buckets starting by then: a bucket
/// may hold both the last growth and the first of the release); its bytes
/// held at the end when `until_ns` is `None`.
pub(super) fn held_until(path: &PathReport, until_ns: Option<u64>) -> u64 {
    let Some(until_ns) = until_ns else {
        return path.bytes.held_now_bytes();
    };
    let mut held: i64 = 0;
    let mut most: i64 = 0;
    for pt in path.timeline.iter().filter(|pt| pt.t_ns <= until_ns) {
        held += pt.held_bytes;
        most = most.max(held);
    }
    most.unsigned_abs()
}

/// The paths of one process that end in the same Python function (same
/// function and file, and the same mapped file if any; lines and native
/// frames may differ), summed.
#[derive(Clone, Debug)]
pub(super) struct PathGroup<'a> {
    /// Its paths, most held at the process's high-water mark first.
    pub(super) paths: Vec<&'a PathReport>,
    /// Summed bytes held at the high-water mark.
    pub(super) peak_held_bytes: u64,
    /// Summed bytes held at the end.
    pub(super) held_end_bytes: u64,
    /// Summed bytes grown (every first touch, again after each free).
    pub(super) grown_bytes: u64,
    /// Summed samples.
    pub(super) samples: u64,
    /// Summed share (0..=1) of the process's bytes held at its high-water
    /// mark.
    pub(super) peak_held_share: f64,
}

impl PathGroup<'_> {
    /// Its stack ids, in the order of its paths.
    pub(super) fn stacks(&self) -> Vec<StackId> {
        self.paths.iter().map(|p| p.stack).collect()
    }

    /// Its largest path's stack.
    pub(super) fn top_stack(&self) -> StackId {
        self.paths[0].stack
    }

    /// Its rank key under `rank`: the held bytes `rank` names, then the
    /// other held bytes, then grown, all descending.
    fn key(&self, rank: Rank) -> (u64, u64, u64) {
        match rank {
            Rank::Peak => (self.peak_held_bytes, self.held_end_bytes, self.grown_bytes),
            Rank::End | Rank::Until(_) => {
                (self.held_end_bytes, self.peak_held_bytes, self.grown_bytes)
            }
        }
    }
}

/// What groups paths into a [`PathGroup`]: the innermost Python frame's
/// function and file, else the whole innermost frame, plus the mapped file
/// when the path ends in one.
fn group_key(report: &Report, stack: StackId) -> String {
    let function = report
        .frames(stack)
        .iter()
        .rev()
        .find_map(|f| match f {
            Frame::Python { function, file, .. } => Some(format!("{function} ({file})")),
            _ => None,
        })
        .unwrap_or_else(|| path_name(report, stack));
    match report.frames(stack).last() {
        Some(mapping @ Frame::Mapping { .. }) => format!("{function} {mapping}"),
        _ => function,
    }
}

/// `path_name`, plus the mapping frame (`[file /x]`) when the path ends in
/// one.
fn path_label(report: &Report, stack: StackId) -> String {
    let name = path_name(report, stack);
    match report.frames(stack).last() {
        Some(mapping @ Frame::Mapping { .. }) if !name.starts_with('[') => {
            format!("{name} {mapping}")
        }
        _ => name,
    }
}

/// The paths of image `process` of `kind` that grew or held anything,
/// grouped by function, ranked by `rank`; up to [`TOP_PATHS`] groups. With
/// [`Rank::Until`], a group's `held_end_bytes` are held by then.
pub(super) fn process_groups(
    report: &Report,
    process: ProcessId,
    kind: Kind,
    rank: Rank,
) -> Vec<PathGroup<'_>> {
    let mut groups: Vec<(String, PathGroup<'_>)> = Vec::new();
    let of_kind = |p: &PathReport| {
        let file_backed = mapped_file(report, p.stack).is_some();
        file_backed == (kind == Kind::FileBacked)
    };
    let holds_or_grew = |p: &PathReport| {
        p.peak_held_bytes > 0 || p.bytes.held_now_bytes() > 0 || p.bytes.grown_bytes() > 0
    };
    for path in report
        .paths
        .iter()
        .filter(|p| p.process == process && of_kind(p) && holds_or_grew(p))
    {
        let key = group_key(report, path.stack);
        let index = match groups.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let empty = PathGroup {
                    paths: Vec::new(),
                    peak_held_bytes: 0,
                    held_end_bytes: 0,
                    grown_bytes: 0,
                    samples: 0,
                    peak_held_share: 0.0,
                };
                groups.push((key, empty));
                groups.len() - 1
            }
        };
        let group = &mut groups[index].1;
        group.paths.push(path);
        group.peak_held_bytes += path.peak_held_bytes;
        group.held_end_bytes += held_until(path, until(rank));
        group.grown_bytes += path.bytes.grown_bytes();
        group.samples += path.bytes.samples;
        group.peak_held_share += path.peak_held_share;
    }
    // The report's paths come most held at peak first, so each group's
    // first path is its largest; rank the groups by their sums (stable:
    // ties keep the report's order).
    groups.sort_by_key(|(_, g)| std::cmp::Reverse(g.key(rank)));
    groups.truncate(TOP_PATHS);
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The teardown start of [`Rank::Until`].
fn until(rank: Rank) -> Option<u64> {
    match rank {
        Rank::Until(ns) => Some(ns),
        Rank::Peak | Rank::End => None,
    }
}

/// `, G grown (freed and touched again, counted at each touch)` when a path
/// grew more than [`RETOUCHED_RATIO`] times what it held at most, else
/// `, G grown`.
fn grown_note(grown_bytes: u64, most_held_bytes: u64) -> String {
    if grown_bytes > most_held_bytes.saturating_mul(RETOUCHED_RATIO) {
        format!(
            ", {} grown (freed and touched again: counted at each touch)",
            format_bytes(grown_bytes)
        )
    } else {
        format!(", {} grown", format_bytes(grown_bytes))
    }
}

/// One evidence line per path group of process `p`: its name, the bytes
/// it held at the end and at the high-water mark (with its share of `p`'s),
/// and what it grew.
pub(super) fn describe_groups(
    report: &Report,
    p: &ProcessReport,
    groups: &[PathGroup<'_>],
) -> Vec<PathEvidence> {
    groups
        .iter()
        .map(|g| PathEvidence {
            stacks: g.stacks(),
            samples: g.samples,
            line: format!(
                "path {}: holds {} at the end, held {} at the high-water mark ({:.0}% of {}'s \
                 held then){}; {} stack(s), {} samples",
                path_label(report, g.top_stack()),
                format_bytes(g.held_end_bytes),
                format_bytes(g.peak_held_bytes),
                100.0 * g.peak_held_share,
                p.name(),
                grown_note(g.grown_bytes, g.peak_held_bytes.max(g.held_end_bytes)),
                g.paths.len(),
                g.samples
            ),
        })
        .collect()
}

/// One stack's bytes summed over some images.
#[derive(Debug, Default)]
struct Merged {
    peak_held_bytes: u64,
    held_end_bytes: u64,
    grown_bytes: u64,
    samples: u64,
    images: usize,
}

/// Evidence for the (up to [`TOP_PATHS`]) stacks holding the most at their
/// images' high-water marks, summed over the images `processes` (all when
/// empty); stacks that neither grew nor held are left out.
pub(super) fn merged_paths(report: &Report, processes: &[ProcessId]) -> Vec<PathEvidence> {
    let mut merged: BTreeMap<StackId, Merged> = BTreeMap::new();
    let mut all_peak_held: u64 = 0;
    for path in report
        .paths
        .iter()
        .filter(|p| processes.is_empty() || processes.contains(&p.process))
    {
        all_peak_held += path.peak_held_bytes;
        let sum = merged.entry(path.stack).or_default();
        sum.peak_held_bytes += path.peak_held_bytes;
        sum.held_end_bytes += path.bytes.held_now_bytes();
        sum.grown_bytes += path.bytes.grown_bytes();
        sum.samples += path.bytes.samples;
        sum.images += usize::from(path.bytes.grown_bytes() > 0 || path.peak_held_bytes > 0);
    }
    let mut ranked: Vec<(StackId, Merged)> = merged
        .into_iter()
        .filter(|(_, m)| m.grown_bytes > 0 || m.peak_held_bytes > 0)
        .collect();
    ranked.sort_by(|(a_stack, a), (b_stack, b)| {
        (b.peak_held_bytes, b.held_end_bytes, b.grown_bytes)
            .cmp(&(a.peak_held_bytes, a.held_end_bytes, a.grown_bytes))
            .then_with(|| report.frames(*a_stack).cmp(report.frames(*b_stack)))
    });
    ranked
        .into_iter()
        .take(TOP_PATHS)
        .map(|(stack, m)| PathEvidence {
            stacks: vec![stack],
            samples: m.samples,
            line: format!(
                "path {}: held {} at the high-water marks of {} process image(s) ({} of all \
                 held then), holds {} at the end{}; {} samples",
                path_label(report, stack),
                format_bytes(m.peak_held_bytes),
                m.images,
                super::percent(m.peak_held_bytes, all_peak_held),
                format_bytes(m.held_end_bytes),
                grown_note(m.grown_bytes, m.peak_held_bytes.max(m.held_end_bytes)),
                m.samples
            ),
        })
        .collect()
}

/// The copy-on-write paths of one function, summed over some images.
#[derive(Debug)]
struct CowGroup {
    key: String,
    stacks: Vec<StackId>,
    cow_bytes: u64,
    samples: u64,
    images: Vec<ProcessId>,
}

/// Evidence for the (up to [`TOP_PATHS`]) functions that un-shared the
/// most pages copy-on-write in the images `processes`, summed over them.
pub(super) fn cow_paths(report: &Report, processes: &[ProcessId]) -> Vec<PathEvidence> {
    let mut groups: Vec<CowGroup> = Vec::new();
    for path in report
        .top_cow_paths(usize::MAX)
        .into_iter()
        .filter(|p| processes.contains(&p.process))
    {
        let key = group_key(report, path.stack);
        let index = match groups.iter().position(|g| g.key == key) {
            Some(index) => index,
            None => {
                groups.push(CowGroup {
                    key,
                    stacks: Vec::new(),
                    cow_bytes: 0,
                    samples: 0,
                    images: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[index];
        if !group.stacks.contains(&path.stack) {
            group.stacks.push(path.stack);
        }
        group.cow_bytes += path.bytes.cow_bytes;
        group.samples += path.bytes.samples;
        if !group.images.contains(&path.process) {
            group.images.push(path.process);
        }
    }
    // Stable: ties keep the report's order (largest path first).
    groups.sort_by_key(|g| std::cmp::Reverse(g.cow_bytes));
    groups
        .into_iter()
        .take(TOP_PATHS)
        .map(|g| PathEvidence {
            line: format!(
                "copy-on-write path {}: un-shared {} (sampled) in {} worker(s); {} samples",
                path_name(report, g.stacks[0]),
                format_bytes(g.cow_bytes),
                g.images.len(),
                g.samples
            ),
            stacks: g.stacks,
            samples: g.samples,
        })
        .collect()
}

/// Summed bucket values of `paths` by bucket index (bucket start /
/// `bucket_ns`), oldest first, for buckets where `value` is not 0.
fn buckets(
    paths: &[&PathReport],
    bucket_ns: u64,
    value: impl Fn(&crate::aggregate::PathPoint) -> i64,
) -> Vec<(u64, i64)> {
    let mut buckets: BTreeMap<u64, i64> = BTreeMap::new();
    for pt in paths.iter().flat_map(|p| &p.timeline) {
        *buckets.entry(pt.t_ns / bucket_ns.max(1)).or_default() += value(pt);
    }
    buckets.into_iter().filter(|&(_, v)| v != 0).collect()
}

/// How the bytes some paths hold changed over the run's buckets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct HeldRise {
    /// Buckets from the first to the last change of held bytes, both
    /// included.
    pub(super) span_buckets: u64,
    /// Buckets among them in which the held bytes rose.
    pub(super) rising_buckets: u64,
    /// Largest share (0..=1) of all rises in one bucket.
    pub(super) max_bucket_share: f64,
    /// Bytes held at the end.
    pub(super) held_end_bytes: u64,
    /// Bytes grown.
    pub(super) grown_bytes: u64,
}

impl HeldRise {
    /// Whether this is the unbounded-cache signature: the held bytes rise in
    /// most buckets of a span of at least [`STEADY_MIN_BUCKETS`], no bucket
    /// dominates, and what was grown is mostly still held (not a buffer
    /// freed and touched again).
    pub(super) fn is_steady(&self) -> bool {
        self.span_buckets >= STEADY_MIN_BUCKETS
            && self.rising_buckets as f64 >= STEADY_PRESENT_FRACTION * self.span_buckets as f64
            && self.max_bucket_share <= STEADY_MAX_BUCKET_SHARE
            && self.held_end_bytes as f64 >= STEADY_MIN_HELD_SHARE * self.grown_bytes as f64
    }
}

/// How the summed held bytes of `paths` changed over buckets of
/// `bucket_ns` (the running sum of their buckets' held changes is what they
/// held then) up to `until_ns` (a teardown's start; the end when `None`);
/// `None` when they have no bucket with a held change.
pub(super) fn held_rise(
    paths: &[&PathReport],
    bucket_ns: u64,
    until_ns: Option<u64>,
) -> Option<HeldRise> {
    let mut changes = buckets(paths, bucket_ns, |pt| pt.held_bytes);
    if let Some(until_ns) = until_ns {
        changes.retain(|&(index, _)| index * bucket_ns.max(1) <= until_ns);
    }
    let (first, last) = (changes.first()?.0, changes.last()?.0);
    let rises: Vec<u64> = changes
        .iter()
        .filter(|&&(_, change)| change > 0)
        .map(|&(_, change)| change.unsigned_abs())
        .collect();
    let total_rise: u64 = rises.iter().sum();
    let max_rise = rises.iter().copied().max().unwrap_or(0);
    Some(HeldRise {
        span_buckets: last - first + 1,
        rising_buckets: rises.len() as u64,
        max_bucket_share: max_rise as f64 / total_rise.max(1) as f64,
        held_end_bytes: paths.iter().map(|p| held_until(p, until_ns)).sum(),
        grown_bytes: paths.iter().map(|p| p.bytes.grown_bytes()).sum(),
    })
}

/// How some paths' growth spread over the buckets it fell in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Burst {
    /// Buckets with growth.
    pub(super) growing_buckets: u64,
    /// Largest share (0..=1) of the growth in two adjacent buckets.
    pub(super) max_pair_share: f64,
}

/// How the summed growth of `paths` spread over buckets of `bucket_ns`;
/// `None` when they have no bucket with growth.
pub(super) fn burst(paths: &[&PathReport], bucket_ns: u64) -> Option<Burst> {
    let growth = buckets(paths, bucket_ns, |pt| {
        i64::try_from(pt.growth_bytes).unwrap_or(i64::MAX)
    });
    if growth.is_empty() {
        return None;
    }
    let total: i64 = growth.iter().map(|&(_, g)| g).sum();
    let max_pair = growth
        .iter()
        .map(|&(index, g)| {
            let next = growth
                .iter()
                .find(|&&(i, _)| i == index + 1)
                .map_or(0, |&(_, g)| g);
            g + next
        })
        .max()
        .unwrap_or(0);
    Some(Burst {
        growing_buckets: growth.len() as u64,
        max_pair_share: max_pair as f64 / total.max(1) as f64,
    })
}
