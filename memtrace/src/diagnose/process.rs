//! Per-process patterns over time in the diagnosis step: a spike (sharp
//! rise, released) and retention (memory that stays up once activity drops,
//! or rises while idle), read from each process's RSS timeline, its activity
//! (page faults and address-space syscalls between readings) and its growth
//! paths' bucket timelines.

use crate::aggregate::{ProcessReport, Report, RssPoint};
use crate::units::format_bytes;

use super::paths::{self, Spread};
use super::{
    describe_groups, function_name, growth_too_small, lived_timeline, path_name,
    process_path_groups, seconds, too_few_readings, Draft, PathGroup, Pattern, Scope,
    IDLE_ACTIVITY_FRACTION, IDLE_GROWTH_SHARE, MIN_GROWTH_BYTES, MIN_IDLE_NS, RETAINED_FRACTION,
    SPIKE_MAX_RISE_FRACTION, SPIKE_PATH_SHARE, SPIKE_RELEASE_FRACTION,
};

/// The spike and retention findings of `process`.
pub(super) fn findings(report: &Report, process: &ProcessReport) -> Vec<Draft> {
    if lived_timeline(process).len() < 2 {
        return Vec::new();
    }
    spike(report, process)
        .into_iter()
        .chain(retention(report, process))
        .collect()
}

/// Activity counted at a reading: page faults plus address-space syscalls
/// (cumulative).
fn activity(point: &RssPoint) -> u64 {
    point.page_faults.saturating_add(point.syscalls)
}

/// The highest reading of a timeline (the first of equals).
fn peak_index(timeline: &[RssPoint]) -> usize {
    let mut best = 0;
    for (i, pt) in timeline.iter().enumerate() {
        if pt.rss_bytes > timeline[best].rss_bytes {
            best = i;
        }
    }
    best
}

/// Pattern 4: RSS rose by at least [`MIN_GROWTH_BYTES`] within at most
/// [`SPIKE_MAX_RISE_FRACTION`] of the process's traced time, then fell back
/// by at least [`SPIKE_RELEASE_FRACTION`] of the rise.
fn spike(report: &Report, process: &ProcessReport) -> Option<Draft> {
    let timeline = lived_timeline(process);
    let peak_at = peak_index(timeline);
    let peak = timeline[peak_at];
    let base = timeline[..=peak_at].iter().map(|pt| pt.rss_bytes).min()?;
    let rise = peak.rss_bytes - base;
    let low_after = timeline[peak_at..].iter().map(|pt| pt.rss_bytes).min()?;
    let released = peak.rss_bytes - low_after;
    // The rise starts at the last reading before the peak near the baseline.
    let near_base = base + rise / 10;
    let rise_start_ns = timeline[..=peak_at]
        .iter()
        .rev()
        .find(|pt| pt.rss_bytes <= near_base)
        .map_or(peak.t_ns, |pt| pt.t_ns);
    let rise_ns = peak.t_ns - rise_start_ns;
    if rise < MIN_GROWTH_BYTES
        || (released as f64) < SPIKE_RELEASE_FRACTION * rise as f64
        || rise_ns as f64 > SPIKE_MAX_RISE_FRACTION * process.traced_ns as f64
    {
        return None;
    }
    let groups = process_path_groups(report, process.id);
    let top = groups.first();
    let mut summary = format!(
        "spike in tgid {}: RSS rose +{} in {} to {} at {}, then {} was released",
        process.tgid,
        format_bytes(rise),
        seconds(rise_ns),
        format_bytes(peak.rss_bytes),
        seconds(peak.t_ns),
        format_bytes(released)
    );
    if let Some(group) = top {
        summary.push_str(&format!(
            ", built by {}",
            function_name(report, group.paths[0].stack)
        ));
    }
    let mut draft = Draft::new(
        Pattern::Spike,
        Scope::Process {
            process: process.id,
            tgid: process.tgid,
        },
        rise,
        summary,
    );
    draft.evidence.push(format!(
        "tgid {} (`{}`): RSS {} before, peak {} at {}, lowest after it {}",
        process.tgid,
        process.label(),
        format_bytes(base),
        format_bytes(peak.rss_bytes),
        seconds(peak.t_ns),
        format_bytes(low_after)
    ));
    if let Some(c) = process.counters {
        draft.evidence.push(format!(
            "exact resident anonymous growth {}, released {}",
            format_bytes(c.anon_growth_bytes),
            format_bytes(c.anon_release_bytes)
        ));
    }
    draft.name_paths(&describe_groups(report, process.tgid, &groups));
    draft.weak_if(one_path_weakness(report, top));
    draft.weak_if(growth_too_small("the rise", rise));
    draft.weak_if(too_few_readings(process.tgid, timeline.len()));
    draft.next_step = match top {
        Some(group) => format!(
            "stream that payload: have {} produce and hand on its result in chunks \
             (a generator, incremental writes) instead of building it whole",
            path_name(report, group.paths[0].stack)
        ),
        None => "find what builds the payload (no sampled path explains it: record with a \
                 smaller --sample-bytes), then stream it in chunks"
            .to_owned(),
    };
    Some(draft)
}

/// Why the spike is not clearly tied to `top`, if it is not: it holds less
/// than [`SPIKE_PATH_SHARE`] of the process's growth, or (with a bucket
/// timeline) its growth is spread out rather than a burst.
fn one_path_weakness(report: &Report, top: Option<&PathGroup<'_>>) -> Option<String> {
    let group = top?;
    if group.growth_share < SPIKE_PATH_SHARE {
        return Some(format!(
            "the top path holds only {:.0}% of the process's sampled growth",
            100.0 * group.growth_share
        ));
    }
    let spread = paths::spread(&group.paths, report.path_bucket_ns)?;
    (spread.max_pair_share < SPIKE_PATH_SHARE).then(|| {
        format!(
            "the top path's growth is spread over {} buckets, not one burst",
            spread.growing_buckets
        )
    })
}

/// Activity rate of each interval between consecutive readings, in events
/// per second, with the interval's two readings.
fn activity_rates(timeline: &[RssPoint]) -> Vec<(RssPoint, RssPoint, f64)> {
    timeline
        .windows(2)
        .map(|w| {
            let events = activity(&w[1]).saturating_sub(activity(&w[0]));
            let seconds = (w[1].t_ns.saturating_sub(w[0].t_ns)).max(1) as f64 / 1e9;
            (w[0], w[1], events as f64 / seconds)
        })
        .collect()
}

/// What the RSS timeline and activity of one process say about retention.
#[derive(Debug)]
struct RetentionFacts {
    /// RSS at the first reading.
    start_bytes: u64,
    /// RSS at the last reading.
    end_bytes: u64,
    /// Highest RSS.
    peak_bytes: u64,
    /// Busiest interval's activity rate, events per second.
    peak_rate: f64,
    /// Where the idle tail starts (activity dropped for good), if the
    /// process ended idle for at least [`MIN_IDLE_NS`].
    idle_tail: Option<IdleTail>,
    /// RSS added during idle intervals anywhere in the trace.
    idle_growth_bytes: u64,
    /// RSS added in all intervals.
    total_rise_bytes: u64,
}

/// The final stretch of a process's trace in which it stayed idle.
#[derive(Clone, Copy, Debug)]
struct IdleTail {
    /// When activity dropped, since the run start.
    from_ns: u64,
    /// How long the tail lasted.
    duration_ns: u64,
    /// RSS when activity dropped.
    rss_at_drop_bytes: u64,
    /// Lowest RSS during the tail.
    lowest_bytes: u64,
}

impl RetentionFacts {
    fn of(timeline: &[RssPoint]) -> Option<Self> {
        let rates = activity_rates(timeline);
        let peak_rate = rates.iter().map(|&(_, _, r)| r).fold(0.0, f64::max);
        let is_idle = |rate: f64| peak_rate > 0.0 && rate <= IDLE_ACTIVITY_FRACTION * peak_rate;
        let idle_count = rates.iter().rev().take_while(|r| is_idle(r.2)).count();
        let tail = &rates[rates.len() - idle_count..];
        let idle_tail = tail.first().and_then(|&(from, _, _)| {
            let to = tail.last()?.1;
            let duration_ns = to.t_ns - from.t_ns;
            (duration_ns >= MIN_IDLE_NS).then(|| IdleTail {
                from_ns: from.t_ns,
                duration_ns,
                rss_at_drop_bytes: from.rss_bytes,
                lowest_bytes: tail
                    .iter()
                    .map(|r| r.1.rss_bytes)
                    .chain([from.rss_bytes])
                    .min()
                    .unwrap_or(0),
            })
        });
        let rise = |a: &RssPoint, b: &RssPoint| b.rss_bytes.saturating_sub(a.rss_bytes);
        Some(Self {
            start_bytes: timeline.first()?.rss_bytes,
            end_bytes: timeline.last()?.rss_bytes,
            peak_bytes: timeline.iter().map(|pt| pt.rss_bytes).max()?,
            peak_rate,
            idle_tail,
            idle_growth_bytes: rates
                .iter()
                .filter(|r| is_idle(r.2))
                .map(|(a, b, _)| rise(a, b))
                .sum(),
            total_rise_bytes: rates.iter().map(|(a, b, _)| rise(a, b)).sum(),
        })
    }
}

/// How the process retains memory, when it does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Retained {
    /// RSS stayed up for the idle tail after activity dropped.
    AfterActivityDrops,
    /// RSS rose during idle intervals.
    WhileIdle,
    /// RSS grew and stayed near its peak, but activity never dropped: load
    /// and retention cannot be told apart.
    NeverIdle,
}

/// Pattern 5: memory that stays up after activity drops, or rises while
/// idle; strong only with paths that grow steadily (the unbounded-cache
/// signature).
fn retention(report: &Report, process: &ProcessReport) -> Option<Draft> {
    let timeline = lived_timeline(process);
    let facts = RetentionFacts::of(timeline)?;
    let (kind, retained) = classify_retention(&facts)?;
    let groups = process_path_groups(report, process.id);
    let steady: Vec<(&PathGroup<'_>, Spread)> = groups
        .iter()
        .filter_map(|g| Some((g, paths::spread(&g.paths, report.path_bucket_ns)?)))
        .filter(|(_, s)| s.is_steady())
        .collect();
    let named: Vec<PathGroup<'_>> = if steady.is_empty() {
        groups.clone()
    } else {
        steady.iter().map(|(g, _)| (*g).clone()).collect()
    };
    let top = named
        .first()
        .map(|g| function_name(report, g.paths[0].stack));
    let mut draft = Draft::new(
        Pattern::Retention,
        Scope::Process {
            process: process.id,
            tgid: process.tgid,
        },
        retained,
        retention_summary(process.tgid, kind, retained, &facts, top.as_deref()),
    );
    draft.evidence.extend(retention_evidence(process, &facts));
    for (group, spread) in &steady {
        draft.evidence.push(format!(
            "steady growth (unbounded-cache signature): {} grew in {} of {} buckets of {}, \
             at most {:.0}% in one",
            path_name(report, group.paths[0].stack),
            spread.growing_buckets,
            spread.span_buckets,
            seconds(report.path_bucket_ns),
            100.0 * spread.max_bucket_share
        ));
    }
    draft.name_paths(&describe_groups(report, process.tgid, &named));
    draft.weak_if(growth_too_small("the retained growth", retained));
    draft.weak_if(too_few_readings(process.tgid, timeline.len()));
    draft.weak_if((kind == Retained::NeverIdle).then(|| {
        "activity never dropped, so load and retention cannot be told apart: record through \
         an idle period"
            .to_owned()
    }));
    draft.weak_if(steady.is_empty().then(|| {
        "no path grew steadily: this may be a working set (imports, warm caches) rather than \
         an unbounded cache"
            .to_owned()
    }));
    draft.next_step = match &top {
        Some(function) => format!(
            "find what keeps the references {function} creates, and bound that cache \
             (a size limit or expiry) so idle memory falls back"
        ),
        None => "find what keeps the retained memory (no sampled path explains it: record \
                 with a smaller --sample-bytes)"
            .to_owned(),
    };
    Some(draft)
}

/// Which kind of retention `facts` show, and the bytes retained; `None`
/// when less than [`MIN_GROWTH_BYTES`] is retained.
fn classify_retention(facts: &RetentionFacts) -> Option<(Retained, u64)> {
    if facts.idle_growth_bytes >= MIN_GROWTH_BYTES
        && facts.idle_growth_bytes as f64 >= IDLE_GROWTH_SHARE * facts.total_rise_bytes as f64
    {
        return Some((Retained::WhileIdle, facts.idle_growth_bytes));
    }
    if let Some(tail) = facts.idle_tail {
        let kept = tail.lowest_bytes.saturating_sub(facts.start_bytes);
        let stayed_up =
            tail.lowest_bytes as f64 >= RETAINED_FRACTION * tail.rss_at_drop_bytes as f64;
        return (stayed_up && kept >= MIN_GROWTH_BYTES)
            .then_some((Retained::AfterActivityDrops, kept));
    }
    let kept = facts.end_bytes.saturating_sub(facts.start_bytes);
    let near_peak = facts.end_bytes as f64 >= RETAINED_FRACTION * facts.peak_bytes as f64;
    (near_peak && kept >= MIN_GROWTH_BYTES).then_some((Retained::NeverIdle, kept))
}

/// The one-sentence summary of a retention finding.
fn retention_summary(
    tgid: u32,
    kind: Retained,
    retained: u64,
    facts: &RetentionFacts,
    top: Option<&str>,
) -> String {
    let what = match (kind, facts.idle_tail) {
        (Retained::WhileIdle, _) => format!(
            "tgid {tgid} kept growing while idle: +{} of RSS added with little activity",
            format_bytes(retained)
        ),
        (Retained::AfterActivityDrops, Some(tail)) => format!(
            "tgid {tgid} retains +{} after its activity dropped at {} (held for {})",
            format_bytes(retained),
            seconds(tail.from_ns),
            seconds(tail.duration_ns)
        ),
        _ => format!(
            "tgid {tgid} grew +{} and kept it until the end",
            format_bytes(retained)
        ),
    };
    match top {
        Some(function) => format!("{what}, grown by {function}"),
        None => what,
    }
}

/// The RSS and activity lines of a retention finding.
fn retention_evidence(process: &ProcessReport, facts: &RetentionFacts) -> Vec<String> {
    let mut lines = vec![format!(
        "tgid {} (`{}`): RSS {} -> {} (peak {})",
        process.tgid,
        process.label(),
        format_bytes(facts.start_bytes),
        format_bytes(facts.end_bytes),
        format_bytes(facts.peak_bytes)
    )];
    lines.push(match facts.idle_tail {
        Some(tail) => format!(
            "activity (page faults + address-space syscalls) peaked at {:.0}/s and stayed \
             under {:.0}% of that from {} for {}; RSS then {}, lowest {}",
            facts.peak_rate,
            100.0 * IDLE_ACTIVITY_FRACTION,
            seconds(tail.from_ns),
            seconds(tail.duration_ns),
            format_bytes(tail.rss_at_drop_bytes),
            format_bytes(tail.lowest_bytes)
        ),
        None => format!(
            "activity (page faults + address-space syscalls) peaked at {:.0}/s; no idle \
             stretch of {} at the end",
            facts.peak_rate,
            seconds(MIN_IDLE_NS)
        ),
    });
    if facts.idle_growth_bytes > 0 {
        lines.push(format!(
            "RSS added while idle: {} of {} added in all",
            format_bytes(facts.idle_growth_bytes),
            format_bytes(facts.total_rise_bytes)
        ));
    }
    lines
}
