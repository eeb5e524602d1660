//! Tree-wide patterns of the diagnosis step: which process grows against its
//! siblings, whether every worker holds a large footprint, and whether the
//! tree's memory multiplies with its forks.
//!
//! Sizes and tree sums count a page shared copy-on-write once: a process
//! whose PSS was read is measured by its PSS, one without by its RSS, and
//! the evidence says which ([`Measure`]).

use std::collections::BTreeMap;

use crate::aggregate::{ProcessId, ProcessKind, ProcessReport, Report, RssPoint};
use crate::units::{format_bytes, format_signed_bytes};

use super::draft::{growth_too_small, too_few_readings, Draft, PathEvidence};
use super::memory::{anon_counters_line, Memory};
use super::paths::{self, HeldRise, Kind, Rank};
use super::{
    files, function_name, listed, median, percent, seconds, Pattern, Scope, LARGE_WORKER_BYTES,
    MAX_WORKER_SPREAD, MIN_FORK_STEP_SHARE, MIN_GROWTH_BYTES, MULTIPLICATION_TOLERANCE,
    SIBLING_GROWTH_RATIO, STABLE_LATE_CHANGE_FRACTION,
};

/// All tree-wide findings of `report`; workers in `cow_covered` are already
/// explained by a copy-on-write un-sharing finding, so a multiplication or
/// every-worker-large finding made only of them is not made again.
pub(super) fn findings(report: &Report, cow_covered: &[ProcessId]) -> Vec<Draft> {
    let mut drafts = one_process_grows(report);
    drafts.extend(worker_multiplication(report, cow_covered));
    drafts.extend(every_worker_large(report, cow_covered));
    drafts
}

/// What a process's size and the tree's sums are measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Measure {
    /// Proportional set size: a page shared by N processes counts 1/N in
    /// each (read from /proc/PID/smaps_rollup).
    Pss,
    /// Resident set size: a page shared by N processes counts in each.
    Rss,
}

impl Measure {
    /// PSS when `p`'s PSS was read, else RSS.
    pub(super) fn of(p: &ProcessReport) -> Self {
        if p.sharing.is_some() {
            Self::Pss
        } else {
            Self::Rss
        }
    }

    /// `p`'s memory at reading `pt` in this measure; `None` for a reading
    /// taken before its first PSS read.
    pub(super) fn at(self, pt: &RssPoint) -> Option<u64> {
        match self {
            Self::Pss => pt.pss_bytes,
            Self::Rss => Some(pt.rss_bytes),
        }
    }

    /// `p`'s memory at its end in this measure (0 when never read).
    fn end_bytes(self, p: &ProcessReport) -> u64 {
        match self {
            Self::Pss => p.sharing.map_or(0, |s| s.end_pss_bytes),
            Self::Rss => p.rss.map_or(0, |r| r.end_bytes),
        }
    }

    /// `p`'s highest memory in this measure (0 when never read).
    fn peak_bytes(self, p: &ProcessReport) -> u64 {
        match self {
            Self::Pss => p.sharing.map_or(0, |s| s.peak_pss_bytes),
            Self::Rss => p.rss.map_or(0, |r| r.peak_bytes),
        }
    }
}

/// How a set of processes was measured, for the evidence.
fn measured(processes: &[&ProcessReport]) -> (&'static str, &'static str) {
    let pss = processes
        .iter()
        .filter(|p| Measure::of(p) == Measure::Pss)
        .count();
    if pss == processes.len() {
        (
            "PSS",
            "PSS: a page shared copy-on-write counts once in the tree",
        )
    } else if pss == 0 {
        (
            "RSS",
            "RSS: no PSS was read, so a page still shared copy-on-write counts once per process",
        )
    } else {
        (
            "PSS or RSS",
            "PSS where it was read, RSS for the processes without PSS readings (their shared \
             pages count once per process)",
        )
    }
}

/// `p`'s size: its memory at its end, in its [`Measure`].
fn size_bytes(p: &ProcessReport) -> u64 {
    Measure::of(p).end_bytes(p)
}

/// Growth of `p`'s own memory while it lived (end minus start on its
/// diagnosis basis: RSS, or RSS without file-backed pages when its growth
/// is mostly file-backed), 0 when it shrank or was never read.
fn growth_bytes(p: &ProcessReport) -> u64 {
    Memory::of(p, files::basis(p)).map_or(0, |m| m.growth_bytes())
}

/// Where an image's numbers end for the tree: its exec or the start of
/// its exit, else its exit record; `None` when it lived to the end.
fn end_ns(p: &ProcessReport) -> Option<u64> {
    p.ended_ns().or(p.exited_ns)
}

/// Processes with RSS readings grouped by parent image: siblings. Only the
/// last image of each process is a sibling (an image an execve replaced is
/// not compared with anything).
fn sibling_groups(report: &Report) -> BTreeMap<Option<ProcessId>, Vec<&ProcessReport>> {
    let mut groups: BTreeMap<Option<ProcessId>, Vec<&ProcessReport>> = BTreeMap::new();
    for p in report
        .processes
        .iter()
        .filter(|p| p.kind == ProcessKind::Worker && p.rss.is_some() && p.next_image.is_none())
    {
        groups.entry(p.parent).or_default().push(p);
    }
    groups
}

/// Pattern 1: in a group of siblings, the few (at most half) whose growth is
/// at least [`SIBLING_GROWTH_RATIO`] times the median of the others'.
fn one_process_grows(report: &Report) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for siblings in sibling_groups(report).values().filter(|g| g.len() >= 2) {
        let growers: Vec<&ProcessReport> = siblings
            .iter()
            .copied()
            .filter(|p| outgrows_siblings(p, siblings))
            .collect();
        if growers.len() * 2 > siblings.len() {
            continue;
        }
        for grower in &growers {
            drafts.push(grower_finding(report, grower, siblings, growers.len()));
        }
    }
    drafts
}

/// Whether `p` grew at least [`MIN_GROWTH_BYTES`] and
/// [`SIBLING_GROWTH_RATIO`] times the median growth of the other `siblings`.
fn outgrows_siblings(p: &ProcessReport, siblings: &[&ProcessReport]) -> bool {
    let others: Vec<u64> = siblings
        .iter()
        .filter(|s| s.id != p.id)
        .map(|s| growth_bytes(s))
        .collect();
    let growth = growth_bytes(p);
    growth >= MIN_GROWTH_BYTES && growth >= median(&others).saturating_mul(SIBLING_GROWTH_RATIO)
}

/// The OneProcessGrows finding for `grower` among `siblings`.
fn grower_finding(
    report: &Report,
    grower: &ProcessReport,
    siblings: &[&ProcessReport],
    growers: usize,
) -> Draft {
    let others: Vec<&ProcessReport> = siblings
        .iter()
        .copied()
        .filter(|s| s.id != grower.id)
        .collect();
    let other_growth: Vec<u64> = others.iter().map(|s| growth_bytes(s)).collect();
    let growth = growth_bytes(grower);
    let groups = paths::process_groups(report, grower.id, Kind::Own, Rank::End);
    let top = groups.first();
    let top_function = top.map(|g| function_name(report, g.top_stack()));
    let steady = top
        .and_then(|g| paths::held_rise(&g.paths, report.path_bucket_ns, None))
        .is_some_and(|rise: HeldRise| rise.is_steady());
    let mut summary = format!(
        "{} {} grew +{} while its {} sibling(s) stayed flat (median +{})",
        grower.kind,
        grower.name(),
        format_bytes(growth),
        others.len(),
        format_bytes(median(&other_growth))
    );
    if let Some(function) = &top_function {
        summary.push_str(&format!(", mostly in {function}"));
    }
    let mut draft = Draft::new(Pattern::OneProcessGrows, Scope::of(grower), growth, summary);
    if let Some(memory) = Memory::of(grower, files::basis(grower)) {
        draft.evidence.push(memory.line(grower));
    }
    draft.evidence.push(format!(
        "siblings: {}",
        listed(
            &others
                .iter()
                .map(|s| format!("{} +{}", s.name(), format_bytes(growth_bytes(s))))
                .collect::<Vec<_>>()
        )
    ));
    draft.evidence.extend(anon_counters_line(grower));
    draft.name_paths(&paths::describe_groups(report, grower, &groups));
    draft.weak_if(growth_too_small("its growth", growth));
    draft.weak_if(too_few_readings(grower));
    draft.weak_if((growers > 1).then(|| format!("{growers} of the siblings outgrow the rest")));
    let name = grower.name();
    draft.next_step = match (&top_function, steady) {
        (Some(function), true) => format!(
            "look at what {function} keeps in {name}: bound that cache or drop the \
             references once a request is done (compare with a sibling: --per-process)"
        ),
        (Some(function), false) => format!(
            "look at what {function} holds in {name} ({} at the end) and why its siblings \
             do not (compare with a sibling: --per-process)",
            format_bytes(top.map_or(0, |g| g.held_end_bytes))
        ),
        (None, _) => format!(
            "find what {name} does that its siblings do not (no sampled path explains it: \
             record with a smaller --sample-bytes)"
        ),
    };
    draft
}

/// Workers with RSS readings: the last image of each.
fn workers(report: &Report) -> Vec<&ProcessReport> {
    report
        .processes
        .iter()
        .filter(|p| p.kind == ProcessKind::Worker && p.rss.is_some() && p.next_image.is_none())
        .collect()
}

/// `(max - min) / median` of `sizes` (0 when the median is 0).
fn spread(sizes: &[u64]) -> f64 {
    let (min, max) = (
        sizes.iter().copied().min().unwrap_or(0),
        sizes.iter().copied().max().unwrap_or(0),
    );
    let mid = median(sizes);
    if mid == 0 {
        0.0
    } else {
        (max - min) as f64 / mid as f64
    }
}

/// How much `p`'s memory (in its [`Measure`]) moved over the second half of
/// its traced life: the difference between its last reading and the
/// reading nearest the middle.
fn late_change_bytes(p: &ProcessReport) -> u64 {
    let measure = Measure::of(p);
    let readings: Vec<(u64, u64)> = p
        .timeline
        .iter()
        .filter_map(|pt| Some((pt.t_ns, measure.at(pt)?)))
        .collect();
    let (Some(first), Some(last)) = (readings.first(), readings.last()) else {
        return 0;
    };
    let middle_ns = first.0 + (last.0 - first.0) / 2;
    let middle = readings
        .iter()
        .min_by_key(|(t_ns, _)| t_ns.abs_diff(middle_ns))
        .map_or(0, |&(_, bytes)| bytes);
    last.1.abs_diff(middle)
}

/// Pattern 2: at least two workers, each at least [`LARGE_WORKER_BYTES`]
/// (PSS where read), of similar size (spread at most [`MAX_WORKER_SPREAD`])
/// and stable over the second half of their lives; not made when every
/// worker is in `cow_covered`.
fn every_worker_large(report: &Report, cow_covered: &[ProcessId]) -> Option<Draft> {
    let workers = workers(report);
    let sizes: Vec<u64> = workers.iter().map(|p| size_bytes(p)).collect();
    let large = sizes.iter().all(|&s| s >= LARGE_WORKER_BYTES);
    let stable = workers
        .iter()
        .all(|p| late_change_bytes(p) as f64 <= STABLE_LATE_CHANGE_FRACTION * size_bytes(p) as f64);
    let covered = workers.iter().all(|w| cow_covered.contains(&w.id));
    if workers.len() < 2 || !large || !stable || covered || spread(&sizes) > MAX_WORKER_SPREAD {
        return None;
    }
    let (unit, how) = measured(&workers);
    let per_worker = median(&sizes);
    let total: u64 = sizes.iter().sum();
    let summary = format!(
        "every worker holds a large, stable footprint: {} workers of about {} {unit} each \
         (spread {:.0}%)",
        workers.len(),
        format_bytes(per_worker),
        100.0 * spread(&sizes)
    );
    let mut draft = Draft::new(Pattern::EveryWorkerLarge, Scope::Tree, total, summary);
    draft.evidence.push(format!(
        "per-worker {unit} at the end: {}",
        listed(
            &workers
                .iter()
                .map(|p| format!("{} {}", p.name(), format_bytes(size_bytes(p))))
                .collect::<Vec<_>>()
        )
    ));
    draft.evidence.push(format!(
        "{} in all ({how}); {}",
        format_bytes(total),
        first_readings_line(report, &workers)
    ));
    let ids: Vec<ProcessId> = workers.iter().map(|p| p.id).collect();
    let paths = paths::merged_paths(report, &ids);
    if paths.is_empty() {
        // The footprint is plain from RSS alone; only its origin is unknown.
        draft.evidence.push(
            "no growth was sampled: the footprint was built before tracing began (record \
             from the start with `memtrace run` to see which code builds it)"
                .to_owned(),
        );
    } else {
        draft.name_paths(&paths);
    }
    for p in &workers {
        draft.weak_if(too_few_readings(p));
    }
    draft.next_step = format!(
        "reduce per-worker state before adding workers: load shared data once in the master \
         before fork (preload) so the {} workers share it, or move it out of the workers",
        ids.len()
    );
    Some(draft)
}

/// What `workers` held at their first reading: for the forks the trace
/// saw, the RSS they inherited from their parent (shared until written);
/// for images an execve started, nothing; for workers already running when
/// tracing began, what they had built before it.
fn first_readings_line(report: &Report, workers: &[&ProcessReport]) -> String {
    let forked: Vec<ProcessId> = observed_forks(report).iter().map(|w| w.id).collect();
    let first_bytes = |p: &&ProcessReport| p.rss.map_or(0, |r| r.start_bytes);
    let (seen, rest): (Vec<&ProcessReport>, Vec<&ProcessReport>) =
        workers.iter().partition(|w| forked.contains(&w.id));
    let (execed, running): (Vec<&ProcessReport>, Vec<&ProcessReport>) =
        rest.into_iter().partition(|w| w.previous_image.is_some());
    let mut parts = Vec::new();
    if !seen.is_empty() {
        parts.push(format!(
            "the {} worker(s) forked during the trace started from a median RSS of {} \
             inherited at fork (shared with their parent until written)",
            seen.len(),
            format_bytes(median(&seen.iter().map(first_bytes).collect::<Vec<_>>()))
        ));
    }
    if !execed.is_empty() {
        parts.push(format!(
            "the {} worker image(s) started by an execve started from nothing",
            execed.len()
        ));
    }
    if !running.is_empty() {
        parts.push(format!(
            "the {} worker(s) already running when tracing began held a median RSS of {} at \
             their first reading",
            running.len(),
            format_bytes(median(&running.iter().map(first_bytes).collect::<Vec<_>>()))
        ));
    }
    format!("{}; the rest grew while traced", parts.join("; "))
}

/// Each image's readings that count for the tree, in its [`Measure`]:
/// `(time, memory)` up to its end, oldest first.
pub(super) fn tree_readings(p: &ProcessReport) -> impl Iterator<Item = (u64, u64)> + '_ {
    let measure = Measure::of(p);
    let end = end_ns(p);
    p.timeline
        .iter()
        .filter(move |pt| end.is_none_or(|end| pt.t_ns <= end))
        .filter_map(move |pt| Some((pt.t_ns, measure.at(pt)?)))
}

/// The tree's memory at `t_ns`: the sum, over the images that had not ended
/// before `t_ns`, of their latest [`tree_readings`] at or before it.
pub(super) fn tree_at(report: &Report, t_ns: u64) -> u64 {
    report
        .processes
        .iter()
        .filter(|p| end_ns(p).is_none_or(|end| end >= t_ns))
        .filter_map(|p| tree_readings(p).take_while(|&(t, _)| t <= t_ns).last())
        .map(|(_, bytes)| bytes)
        .sum()
}

/// Highest [`tree_at`] at any reading at or after `from_ns`, in one sweep
/// over all readings and ends in time order, keeping each image's latest
/// memory and their running sum (an image counts through its end, and
/// drops out after the readings of that instant).
pub(super) fn peak_tree_from(report: &Report, from_ns: u64) -> u64 {
    // (time, is an end, image index, memory).
    let mut changes: Vec<(u64, bool, usize, u64)> = Vec::new();
    for (index, p) in report.processes.iter().enumerate() {
        changes.extend(tree_readings(p).map(|(t_ns, bytes)| (t_ns, false, index, bytes)));
        changes.extend(end_ns(p).map(|end| (end, true, index, 0)));
    }
    // Stable: readings of one image at the same time stay in order.
    changes.sort_by_key(|&(t_ns, is_end, _, _)| (t_ns, is_end));
    let mut latest_bytes = vec![0_u64; report.processes.len()];
    let (mut sum_bytes, mut peak_bytes) = (0_u64, 0_u64);
    for same_time in changes.chunk_by(|a, b| a.0 == b.0) {
        let t_ns = same_time[0].0;
        let (ends, readings): (Vec<_>, Vec<_>) = same_time.iter().partition(|c| c.1);
        for &&(_, _, index, bytes) in &readings {
            sum_bytes = sum_bytes - latest_bytes[index] + bytes;
            latest_bytes[index] = bytes;
        }
        if t_ns >= from_ns && !readings.is_empty() {
            peak_bytes = peak_bytes.max(sum_bytes);
        }
        for &&(_, _, index, _) in &ends {
            sum_bytes -= latest_bytes[index];
            latest_bytes[index] = 0;
        }
    }
    peak_bytes
}

/// Whether `w` is a fork the trace saw: a worker's first image, forked
/// while its parent was already being read (its start is the fork).
pub(super) fn is_observed_fork(report: &Report, w: &ProcessReport) -> bool {
    w.kind == ProcessKind::Worker
        && w.rss.is_some()
        && w.previous_image.is_none()
        && w.parent
            .and_then(|parent| report.process(parent))
            .and_then(|parent| parent.timeline.first())
            .is_some_and(|first| first.t_ns < w.started_ns)
}

/// The forks the trace saw ([`is_observed_fork`]), in fork order.
fn observed_forks(report: &Report) -> Vec<&ProcessReport> {
    let mut forked: Vec<&ProcessReport> = report
        .processes
        .iter()
        .filter(|w| is_observed_fork(report, w))
        .collect();
    forked.sort_by_key(|w| (w.started_ns, w.tgid, w.id));
    forked
}

/// What fork `w` added to the tree by itself: in RSS, all it inherited at
/// fork (counted again in the worker); in PSS, the inherited pages it
/// un-shared (exact copy-on-write bytes, at most what it inherited), since
/// a page still shared adds nothing.
fn fork_step_bytes(w: &ProcessReport) -> u64 {
    let inherited = w.rss.map_or(0, |r| r.start_bytes);
    match Measure::of(w) {
        Measure::Rss => inherited,
        Measure::Pss => w.counters.map_or(0, |c| c.cow_fault_bytes).min(inherited),
    }
}

/// Pattern 3: at least two forks seen, and the tree's memory (PSS where
/// read) rose from just before the first fork to its peak by about N x the
/// median worker high-water mark (within [`MULTIPLICATION_TOLERANCE`]),
/// mostly by what the forks themselves added ([`MIN_FORK_STEP_SHARE`]).
/// Not made when every fork is in `cow_covered`.
fn worker_multiplication(report: &Report, cow_covered: &[ProcessId]) -> Option<Draft> {
    let forks = observed_forks(report);
    if forks.len() < 2 || forks.iter().all(|w| cow_covered.contains(&w.id)) {
        return None;
    }
    let first_fork_ns = forks[0].started_ns;
    let before = tree_at(report, first_fork_ns.saturating_sub(1));
    let peak = peak_tree_from(report, first_fork_ns);
    let rise = peak.saturating_sub(before);
    let peaks: Vec<u64> = forks.iter().map(|w| Measure::of(w).peak_bytes(w)).collect();
    let per_worker = median(&peaks);
    let n = forks.len() as f64;
    let ratio = if per_worker == 0 {
        0.0
    } else {
        rise as f64 / per_worker as f64
    };
    let fork_steps: u64 = forks.iter().map(|w| fork_step_bytes(w)).sum();
    if per_worker < MIN_GROWTH_BYTES
        || (ratio - n).abs() / n > MULTIPLICATION_TOLERANCE
        || (fork_steps as f64) < MIN_FORK_STEP_SHARE * rise as f64
    {
        return None;
    }
    let mut tree: Vec<&ProcessReport> = report.processes.iter().collect();
    tree.retain(|p| p.rss.is_some());
    let (tree_unit, tree_how) = measured(&tree);
    let (unit, _) = measured(&forks);
    let summary = format!(
        "worker multiplication: the tree's {tree_unit} rose from {} to {} over {} forks, about \
         {ratio:.1} x the per-worker {unit} of {}",
        format_bytes(before),
        format_bytes(peak),
        forks.len(),
        format_bytes(per_worker)
    );
    let mut draft = Draft::new(Pattern::WorkerMultiplication, Scope::Tree, peak, summary);
    draft
        .evidence
        .push(format!("the tree is summed in {tree_how}"));
    draft.evidence.push(fork_steps_line(&forks));
    let sizes: Vec<u64> = forks.iter().map(|w| size_bytes(w)).collect();
    draft.evidence.push(format!(
        "per-worker {unit}: median {} at its peak, spread {:.0}% at the end",
        format_bytes(per_worker),
        100.0 * spread(&sizes)
    ));
    let ids: Vec<ProcessId> = forks.iter().map(|w| w.id).collect();
    let cow_bytes: u64 = forks
        .iter()
        .filter_map(|w| w.counters)
        .map(|c| c.cow_fault_bytes)
        .sum();
    let rss_sizes: u64 = forks.iter().map(|w| w.rss.map_or(0, |r| r.end_bytes)).sum();
    draft.evidence.push(format!(
        "copy-on-write: the workers un-shared {} of inherited pages (exact), {} of their RSS; \
         those are real copies, the rest may still be shared",
        format_bytes(cow_bytes),
        percent(cow_bytes, rss_sizes)
    ));
    let cow_paths = paths::cow_paths(report, &ids);
    let mut named: Vec<PathEvidence> = paths::merged_paths(report, &ids);
    named.extend(cow_paths.iter().cloned());
    draft.name_paths(&named);
    draft.weak_if(growth_too_small(
        "the per-worker size",
        per_worker.min(rise),
    ));
    draft.weak_if((per_worker < LARGE_WORKER_BYTES).then(|| {
        format!(
            "workers are small ({} < {}): the multiplication costs little",
            format_bytes(per_worker),
            format_bytes(LARGE_WORKER_BYTES)
        )
    }));
    let cow_hint = cow_paths
        .first()
        .and_then(|p| p.stacks.first())
        .map(|&stack| {
            format!(
                "; {} un-shares the master's pages (see copy-on-write)",
                super::path_name(report, stack)
            )
        })
        .unwrap_or_default();
    draft.next_step = format!(
        "reduce per-worker state before adding workers, or run fewer workers (threads or \
         async inside one){cow_hint}"
    );
    Some(draft)
}

/// What each fork added: in RSS the step at the fork (its inherited RSS);
/// in PSS what it un-shared and grew.
fn fork_steps_line(forks: &[&ProcessReport]) -> String {
    let steps: Vec<String> = forks
        .iter()
        .map(|w| match Measure::of(w) {
            Measure::Rss => format!(
                "{} at {} +{}",
                w.name(),
                seconds(w.started_ns),
                format_bytes(fork_step_bytes(w))
            ),
            Measure::Pss => format!(
                "{} at {}: {} un-shared, RSS {}, {} PSS at its peak",
                w.name(),
                seconds(w.started_ns),
                format_bytes(fork_step_bytes(w)),
                format_signed_bytes(w.rss.map_or(0, |r| r.growth_bytes)),
                format_bytes(Measure::Pss.peak_bytes(w))
            ),
        })
        .collect();
    format!("what each fork added: {}", listed(&steps))
}
