//! Tree-wide patterns of the diagnosis step: which process grows against its
//! siblings, whether every worker holds a large footprint, and whether the
//! tree's memory multiplies with its forks.

use std::collections::BTreeMap;

use crate::aggregate::{ProcessId, ProcessReport, Report, Role};
use crate::units::format_bytes;

use super::{
    describe_groups, function_name, growth_too_small, lived, lived_timeline, median,
    merged_growth_paths, path_name, percent, process_path_groups, seconds, too_few_readings, Draft,
    PathEvidence, Pattern, Scope, LARGE_WORKER_BYTES, MAX_WORKER_SPREAD, MIN_FORK_STEP_SHARE,
    MIN_GROWTH_BYTES, MULTIPLICATION_TOLERANCE, SIBLING_GROWTH_RATIO, STABLE_LATE_CHANGE_FRACTION,
    TOP_PATHS,
};

/// All tree-wide findings of `report`.
pub(super) fn findings(report: &Report) -> Vec<Draft> {
    let mut drafts = one_process_grows(report);
    drafts.extend(worker_multiplication(report));
    drafts.extend(every_worker_large(report));
    drafts
}

/// RSS growth of `p` while it lived (end minus start), 0 when it shrank or
/// was never read.
fn growth_bytes(p: &ProcessReport) -> u64 {
    lived(p).map_or(0, |r| r.growth_bytes())
}

/// Final RSS of `p` while it lived, 0 when never read.
fn size_bytes(p: &ProcessReport) -> u64 {
    lived(p).map_or(0, |r| r.end_bytes)
}

/// Processes with RSS readings grouped by parent: siblings.
fn sibling_groups(report: &Report) -> BTreeMap<Option<ProcessId>, Vec<&ProcessReport>> {
    let mut groups: BTreeMap<Option<ProcessId>, Vec<&ProcessReport>> = BTreeMap::new();
    for p in report.processes.iter().filter(|p| lived(p).is_some()) {
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
        .filter(|s| s.tgid != p.tgid)
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
        .filter(|s| s.tgid != grower.tgid)
        .collect();
    let other_growth: Vec<u64> = others.iter().map(|s| growth_bytes(s)).collect();
    let growth = growth_bytes(grower);
    let groups = process_path_groups(report, grower.id);
    let top = groups
        .first()
        .map(|g| function_name(report, g.paths[0].stack));
    let mut summary = format!(
        "{} {} grew +{} while its {} sibling(s) stayed flat (median +{})",
        grower.role,
        grower.tgid,
        format_bytes(growth),
        others.len(),
        format_bytes(median(&other_growth))
    );
    if let Some(function) = &top {
        summary.push_str(&format!(", mostly in {function}"));
    }
    let mut draft = Draft::new(
        Pattern::OneProcessGrows,
        Scope::Process {
            process: grower.id,
            tgid: grower.tgid,
        },
        growth,
        summary,
    );
    if let Some(rss) = lived(grower) {
        draft.evidence.push(format!(
            "tgid {} (`{}`): RSS {} -> {} (peak {}) over {}",
            grower.tgid,
            grower.label(),
            format_bytes(rss.start_bytes),
            format_bytes(rss.end_bytes),
            format_bytes(rss.peak_bytes),
            seconds(grower.traced_ns)
        ));
    }
    draft.evidence.push(format!(
        "siblings: {}",
        others
            .iter()
            .map(|s| format!("{} +{}", s.tgid, format_bytes(growth_bytes(s))))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(c) = grower.counters {
        draft.evidence.push(format!(
            "exact resident anonymous growth {}, released {}",
            format_bytes(c.anon_growth_bytes),
            format_bytes(c.anon_release_bytes)
        ));
    }
    draft.name_paths(&describe_groups(report, grower.tgid, &groups));
    draft.weak_if(growth_too_small("its growth", growth));
    draft.weak_if(too_few_readings(grower.tgid, grower.timeline.len()));
    draft.weak_if((growers > 1).then(|| format!("{growers} of the siblings outgrow the rest")));
    draft.next_step = match &top {
        Some(function) => format!(
            "look at what {function} keeps in tgid {}: bound that cache or drop the \
             references once a request is done (compare with a sibling: --per-process)",
            grower.tgid
        ),
        None => format!(
            "find what tgid {} does that its siblings do not (no sampled path explains it: \
             record with a smaller --sample-bytes)",
            grower.tgid
        ),
    };
    draft
}

/// Workers with RSS readings.
fn workers(report: &Report) -> Vec<&ProcessReport> {
    report
        .processes
        .iter()
        .filter(|p| p.role == Role::Worker && lived(p).is_some())
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

/// How much `p`'s RSS moved over the second half of its traced life: the
/// difference between its last reading and the reading nearest the middle.
fn late_change_bytes(p: &ProcessReport) -> u64 {
    let timeline = lived_timeline(p);
    let (Some(first), Some(last)) = (timeline.first(), timeline.last()) else {
        return 0;
    };
    let middle_ns = first.t_ns + (last.t_ns - first.t_ns) / 2;
    let middle = timeline
        .iter()
        .min_by_key(|pt| pt.t_ns.abs_diff(middle_ns))
        .map_or(0, |pt| pt.rss_bytes);
    last.rss_bytes.abs_diff(middle)
}

/// Pattern 2: at least two workers, each at least [`LARGE_WORKER_BYTES`],
/// of similar size (spread at most [`MAX_WORKER_SPREAD`]) and stable over
/// the second half of their lives.
fn every_worker_large(report: &Report) -> Option<Draft> {
    let workers = workers(report);
    let sizes: Vec<u64> = workers.iter().map(|p| size_bytes(p)).collect();
    let large = sizes.iter().all(|&s| s >= LARGE_WORKER_BYTES);
    let stable = workers
        .iter()
        .all(|p| late_change_bytes(p) as f64 <= STABLE_LATE_CHANGE_FRACTION * size_bytes(p) as f64);
    if workers.len() < 2 || !large || !stable || spread(&sizes) > MAX_WORKER_SPREAD {
        return None;
    }
    let per_worker = median(&sizes);
    let total: u64 = sizes.iter().sum();
    let summary = format!(
        "every worker holds a large, stable footprint: {} workers of about {} each \
         (spread {:.0}%)",
        workers.len(),
        format_bytes(per_worker),
        100.0 * spread(&sizes)
    );
    let mut draft = Draft::new(Pattern::EveryWorkerLarge, Scope::Tree, total, summary);
    draft.evidence.push(format!(
        "per-worker RSS: {}",
        workers
            .iter()
            .map(|p| format!("{} {}", p.tgid, format_bytes(size_bytes(p))))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    draft.evidence.push(format!(
        "{} in all; {}",
        format_bytes(total),
        first_readings_line(report, &workers)
    ));
    let ids: Vec<ProcessId> = workers.iter().map(|p| p.id).collect();
    let paths = merged_growth_paths(report, &ids);
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
        draft.weak_if(too_few_readings(p.tgid, p.timeline.len()));
    }
    draft.next_step = format!(
        "reduce per-worker state before adding workers: load shared data once in the master \
         before fork (preload) so the {} workers share it, or move it out of the workers",
        ids.len()
    );
    Some(draft)
}

/// What `workers` held at their first reading: for the forks the trace
/// saw, what they inherited from their parent; for workers already running
/// when tracing began, what they had built before it.
fn first_readings_line(report: &Report, workers: &[&ProcessReport]) -> String {
    let forked: Vec<u32> = observed_forks(report).iter().map(|w| w.tgid).collect();
    let first_bytes = |p: &&ProcessReport| lived(p).map_or(0, |r| r.start_bytes);
    let (seen, running): (Vec<&ProcessReport>, Vec<&ProcessReport>) =
        workers.iter().partition(|w| forked.contains(&w.tgid));
    let mut parts = Vec::new();
    if !seen.is_empty() {
        parts.push(format!(
            "the {} worker(s) forked during the trace held a median {} at their first \
             reading (inherited at fork)",
            seen.len(),
            format_bytes(median(&seen.iter().map(first_bytes).collect::<Vec<_>>()))
        ));
    }
    if !running.is_empty() {
        parts.push(format!(
            "the {} worker(s) already running when tracing began held a median {} at their \
             first reading",
            running.len(),
            format_bytes(median(&running.iter().map(first_bytes).collect::<Vec<_>>()))
        ));
    }
    format!("{}; the rest grew while traced", parts.join("; "))
}

/// Sum of the RSS of the processes alive at `t_ns` (their latest reading at
/// or before it).
pub(super) fn tree_rss_at(report: &Report, t_ns: u64) -> u64 {
    report
        .processes
        .iter()
        .filter(|p| p.exited_ns.is_none_or(|exit| exit > t_ns))
        .filter_map(|p| {
            lived_timeline(p)
                .iter()
                .take_while(|pt| pt.t_ns <= t_ns)
                .last()
        })
        .map(|pt| pt.rss_bytes)
        .sum()
}

/// Highest tree RSS at any reading at or after `from_ns`: [`tree_rss_at`]
/// at each reading's time, in one sweep over all readings and exits in time
/// order, keeping each process's latest RSS and their running sum.
pub(super) fn peak_tree_rss_from(report: &Report, from_ns: u64) -> u64 {
    // (time, exit after readings at the same time, process index, RSS);
    // a reading at or after its process's exit counts for nothing.
    let mut changes: Vec<(u64, bool, usize, u64)> = Vec::new();
    for (index, p) in report.processes.iter().enumerate() {
        let alive_at = |t_ns: u64| p.exited_ns.is_none_or(|exit| exit > t_ns);
        changes.extend(lived_timeline(p).iter().map(|pt| {
            let rss_bytes = if alive_at(pt.t_ns) { pt.rss_bytes } else { 0 };
            (pt.t_ns, false, index, rss_bytes)
        }));
        changes.extend(p.exited_ns.map(|exit| (exit, true, index, 0)));
    }
    // Stable: readings of one process at the same time stay in order.
    changes.sort_by_key(|&(t_ns, is_exit, _, _)| (t_ns, is_exit));
    let mut latest_bytes = vec![0_u64; report.processes.len()];
    let (mut sum_bytes, mut peak_bytes) = (0_u64, 0_u64);
    for same_time in changes.chunk_by(|a, b| a.0 == b.0) {
        for &(_, _, index, rss_bytes) in same_time {
            sum_bytes = sum_bytes - latest_bytes[index] + rss_bytes;
            latest_bytes[index] = rss_bytes;
        }
        let (t_ns, has_reading) = (same_time[0].0, same_time.iter().any(|c| !c.1));
        if t_ns >= from_ns && has_reading {
            peak_bytes = peak_bytes.max(sum_bytes);
        }
    }
    peak_bytes
}

/// Workers forked while their parent was already being read: the forks the
/// trace saw, in fork order.
fn observed_forks(report: &Report) -> Vec<&ProcessReport> {
    let mut forked: Vec<&ProcessReport> = workers(report)
        .into_iter()
        .filter(|w| {
            w.parent
                .and_then(|parent| report.process(parent))
                .and_then(|parent| parent.timeline.first())
                .is_some_and(|first| first.t_ns < w.started_ns)
        })
        .collect();
    forked.sort_by_key(|w| (w.started_ns, w.tgid));
    forked
}

/// Pattern 3: at least two forks seen, and the tree's RSS rose from just
/// before the first fork to its peak by about N x the median worker
/// high-water mark (within [`MULTIPLICATION_TOLERANCE`]). Copy-on-write
/// un-sharing is counted separately, with the paths that caused it.
fn worker_multiplication(report: &Report) -> Option<Draft> {
    let forks = observed_forks(report);
    let first_fork_ns = forks.first()?.started_ns;
    let before = tree_rss_at(report, first_fork_ns.saturating_sub(1));
    let peak = peak_tree_rss_from(report, first_fork_ns);
    let rise = peak.saturating_sub(before);
    let per_worker = median(
        &forks
            .iter()
            .map(|w| lived(w).map_or(0, |r| r.peak_bytes))
            .collect::<Vec<_>>(),
    );
    let n = forks.len() as f64;
    let ratio = if per_worker == 0 {
        0.0
    } else {
        rise as f64 / per_worker as f64
    };
    let fork_steps: u64 = forks
        .iter()
        .map(|w| w.timeline.first().map_or(0, |pt| pt.rss_bytes))
        .sum();
    if forks.len() < 2
        || per_worker < MIN_GROWTH_BYTES
        || (ratio - n).abs() / n > MULTIPLICATION_TOLERANCE
        || (fork_steps as f64) < MIN_FORK_STEP_SHARE * rise as f64
    {
        return None;
    }
    let summary = format!(
        "worker multiplication: the tree's RSS rose from {} to {} over {} forks, about {:.1} x \
         the per-worker size of {}",
        format_bytes(before),
        format_bytes(peak),
        forks.len(),
        ratio,
        format_bytes(per_worker)
    );
    let mut draft = Draft::new(Pattern::WorkerMultiplication, Scope::Tree, peak, summary);
    draft.evidence.push(format!(
        "steps at each fork: {}",
        forks
            .iter()
            .map(|w| format!(
                "{} at {} +{}",
                w.tgid,
                seconds(w.started_ns),
                format_bytes(w.timeline.first().map_or(0, |pt| pt.rss_bytes))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let sizes: Vec<u64> = forks.iter().map(|w| size_bytes(w)).collect();
    draft.evidence.push(format!(
        "per-worker RSS {} median, spread {:.0}% (RSS counts pages still shared with the \
         master in every worker)",
        format_bytes(per_worker),
        100.0 * spread(&sizes)
    ));
    let ids: Vec<ProcessId> = forks.iter().map(|w| w.id).collect();
    let cow_bytes: u64 = forks
        .iter()
        .filter_map(|w| w.counters)
        .map(|c| c.cow_fault_bytes)
        .sum();
    draft.evidence.push(format!(
        "copy-on-write: the workers un-shared {} of inherited pages (exact), {} of their RSS; \
         those are real copies, the rest may still be shared",
        format_bytes(cow_bytes),
        percent(cow_bytes, sizes.iter().sum())
    ));
    let cow_paths = cow_paths(report, &ids);
    let mut paths = merged_growth_paths(report, &ids);
    paths.extend(cow_paths.iter().cloned());
    draft.name_paths(&paths);
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
                "; {} un-shares the master's pages",
                path_name(report, stack)
            )
        })
        .unwrap_or_default();
    draft.next_step = format!(
        "reduce per-worker state before adding workers, or run fewer workers (threads or \
         async inside one){cow_hint}: avoid writing to inherited objects after fork (gc.freeze() \
         before forking keeps the collector from un-sharing them)"
    );
    Some(draft)
}

/// Evidence for the top copy-on-write paths in the processes `ids`.
fn cow_paths(report: &Report, ids: &[ProcessId]) -> Vec<PathEvidence> {
    report
        .top_cow_paths(usize::MAX)
        .into_iter()
        .filter(|p| ids.contains(&p.process))
        .take(TOP_PATHS)
        .map(|p| PathEvidence {
            stacks: vec![p.stack],
            samples: p.bytes.samples,
            line: format!(
                "copy-on-write path {}: {} un-shared in tgid {} ({:.0}% of its copy-on-write)",
                path_name(report, p.stack),
                format_bytes(p.bytes.cow_bytes),
                report.tgid(p.process),
                100.0 * p.cow_share
            ),
        })
        .collect()
}
