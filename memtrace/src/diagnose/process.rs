//! Per-process patterns over time in the diagnosis step: a spike (sharp
//! rise, released) and retention (memory that stays up once activity drops,
//! or rises while idle), read from each image's memory over its active life
//! (which ends where its exit began or it exec'd, so the interpreter's
//! finalization and the kernel's teardown are never a release, and before
//! the program's own teardown: `teardown`), its activity (page faults and
//! address-space syscalls between readings) and the bytes its paths hold.

use crate::aggregate::{Frame, ProcessReport, Report};
use crate::units::format_bytes;

use super::draft::{growth_too_small, too_few_readings, Draft};
use super::memory::{anon_counters_line, Basis, Memory, Reading};
use super::paths::{self, HeldRise, Kind, PathGroup, Rank};
use super::{
    function_name, path_name, seconds, Pattern, Scope, IDLE_ACTIVITY_FRACTION, IDLE_GROWTH_SHARE,
    MIN_GROWTH_BYTES, MIN_IDLE_NS, RETAINED_FRACTION, SPIKE_MAX_RISE_FRACTION, SPIKE_PATH_SHARE,
    SPIKE_RELEASE_FRACTION,
};

/// The spike and retention findings of `p`, reading its memory on `basis`.
pub(super) fn findings(report: &Report, p: &ProcessReport, basis: Basis) -> Vec<Draft> {
    let Some(memory) = Memory::of(p, basis) else {
        return Vec::new();
    };
    if memory.readings.len() < 2 {
        return Vec::new();
    }
    spike(report, p, &memory)
        .into_iter()
        .chain(retention(report, p, &memory))
        .collect()
}

/// The highest reading (the first of equals).
fn peak_index(readings: &[Reading]) -> usize {
    let mut best = 0;
    for (i, r) in readings.iter().enumerate() {
        if r.bytes > readings[best].bytes {
            best = i;
        }
    }
    best
}

/// Pattern 4: memory rose by at least [`MIN_GROWTH_BYTES`] within at most
/// [`SPIKE_MAX_RISE_FRACTION`] of the image's active life, then fell back by
/// at least [`SPIKE_RELEASE_FRACTION`] of its rise from its lowest before
/// the peak, before the image ended.
/// The peak is the image's high-water mark (the table's PEAK). The climb
/// is timed and measured from its foot ([`rise_start`]), so that of a series of alike payloads (a parser fed
/// several in a row, the allocator keeping some memory between them) the
/// spike is the same whichever of them peaked highest.
fn spike(report: &Report, p: &ProcessReport, memory: &Memory) -> Option<Draft> {
    let readings = &memory.readings;
    let peak_at = peak_index(readings);
    let peak = readings[peak_at];
    let peak_bytes = memory.peak_bytes.max(peak.bytes);
    let low_after = readings[peak_at..].iter().map(|r| r.bytes).min()?;
    let released = peak_bytes - low_after;
    let foot = rise_start(&readings[..=peak_at], low_after + released / 4)?;
    let base = foot.bytes;
    let rise = peak_bytes.saturating_sub(base);
    let rise_ns = peak.t_ns - foot.t_ns;
    // Released: most of the way back to where memory stood before it
    // (a release of a payload on top of memory kept is a step, not a spike).
    let lowest_before = readings[..=peak_at].iter().map(|r| r.bytes).min()?;
    let whole_rise = peak_bytes.saturating_sub(lowest_before);
    if rise < MIN_GROWTH_BYTES
        || (released as f64) < SPIKE_RELEASE_FRACTION * whole_rise as f64
        || rise_ns as f64 > SPIKE_MAX_RISE_FRACTION * memory.life_ns as f64
    {
        return None;
    }
    let groups = paths::process_groups(report, p.id, Kind::Own, Rank::Peak);
    let top = groups.first();
    let what = memory.basis.what();
    let mut summary = format!(
        "spike in {}: {what} rose +{} in {} to {} at {}, then {} was released before it ended",
        p.name(),
        format_bytes(rise),
        seconds(rise_ns),
        format_bytes(peak_bytes),
        seconds(peak.t_ns),
        format_bytes(released)
    );
    if let Some(group) = top {
        summary.push_str(&format!(
            ", built by {}",
            function_name(report, group.top_stack())
        ));
    }
    let mut draft = Draft::new(Pattern::Spike, Scope::of(p), rise, summary);
    draft.evidence.push(memory.line(p));
    draft.evidence.push(format!(
        "{what} {} before the rise, peak {} at {}, lowest after it {}",
        format_bytes(base),
        format_bytes(peak_bytes),
        seconds(peak.t_ns),
        format_bytes(low_after)
    ));
    draft.evidence.extend(anon_counters_line(p));
    draft.evidence.extend(memory.teardown_line(p));
    draft.name_paths(&paths::describe_groups(report, p, &groups));
    draft.weak_if(one_path_weakness(report, p, top));
    draft.weak_if(growth_too_small("the rise", rise));
    draft.weak_if(too_few_readings(p));
    draft.next_step = match top {
        Some(group) => format!(
            "stream that payload: have {} produce and hand on its result in chunks \
             (a generator, incremental writes) instead of building it whole",
            path_name(report, group.top_stack())
        ),
        None => "find what builds the payload (no sampled path explains it: record with a \
                 smaller --sample-bytes), then stream it in chunks"
            .to_owned(),
    };
    Some(draft)
}

/// Where the climb to the last of `up_to_peak` began: from the last
/// reading at or below `quarter` (a quarter of the way up from where memory
/// fell after the peak, whatever the allocator kept between alike payloads),
/// back down to the foot of that climb (the last reading before memory
/// stopped falling on the way back); the lowest reading when none is that
/// low.
fn rise_start(up_to_peak: &[Reading], quarter: u64) -> Option<Reading> {
    let Some(mut foot) = up_to_peak.iter().rposition(|r| r.bytes <= quarter) else {
        return up_to_peak.iter().min_by_key(|r| r.bytes).copied();
    };
    while foot > 0 && up_to_peak[foot - 1].bytes < up_to_peak[foot].bytes {
        foot -= 1;
    }
    Some(up_to_peak[foot])
}

/// Why the spike is not clearly tied to `top`, if it is not: it held less
/// than [`SPIKE_PATH_SHARE`] of what `p`'s paths held at its high-water
/// mark, or (with a bucket timeline) its growth is spread out rather than a
/// burst.
fn one_path_weakness(
    report: &Report,
    p: &ProcessReport,
    top: Option<&PathGroup<'_>>,
) -> Option<String> {
    let group = top?;
    if group.peak_held_share < SPIKE_PATH_SHARE {
        return Some(format!(
            "the top path held only {:.0}% of what {}'s paths held at its high-water mark",
            100.0 * group.peak_held_share,
            p.name()
        ));
    }
    let burst = paths::burst(&group.paths, report.path_bucket_ns)?;
    (burst.max_pair_share < SPIKE_PATH_SHARE).then(|| {
        format!(
            "the top path's growth is spread over {} buckets, not one burst",
            burst.growing_buckets
        )
    })
}

/// Activity rate of each interval between consecutive readings, in events
/// per second, with the interval's two readings.
fn activity_rates(readings: &[Reading]) -> Vec<(Reading, Reading, f64)> {
    readings
        .windows(2)
        .map(|w| {
            let events = w[1].activity.saturating_sub(w[0].activity);
            let seconds = (w[1].t_ns.saturating_sub(w[0].t_ns)).max(1) as f64 / 1e9;
            (w[0], w[1], events as f64 / seconds)
        })
        .collect()
}

/// What the memory and activity of one image say about retention.
#[derive(Debug)]
struct RetentionFacts {
    /// Memory at the start (the table's RSS START on [`Basis::Rss`]).
    start_bytes: u64,
    /// Memory at the end.
    end_bytes: u64,
    /// Highest memory.
    peak_bytes: u64,
    /// Busiest interval's activity rate, events per second.
    peak_rate: f64,
    /// Where the idle tail starts (activity dropped for good), if the
    /// image ended idle for at least [`MIN_IDLE_NS`].
    idle_tail: Option<IdleTail>,
    /// Memory added during idle intervals anywhere in the trace.
    idle_growth_bytes: u64,
    /// Memory added in all intervals.
    total_rise_bytes: u64,
}

/// The final stretch of an image's life in which it stayed idle.
#[derive(Clone, Copy, Debug)]
struct IdleTail {
    /// When activity dropped, since the run start.
    from_ns: u64,
    /// How long the tail lasted.
    duration_ns: u64,
    /// Memory when activity dropped.
    at_drop_bytes: u64,
    /// Lowest memory during the tail.
    lowest_bytes: u64,
}

impl RetentionFacts {
    fn of(memory: &Memory) -> Self {
        let rates = activity_rates(&memory.readings);
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
                at_drop_bytes: from.bytes,
                lowest_bytes: tail
                    .iter()
                    .map(|r| r.1.bytes)
                    .chain([from.bytes])
                    .min()
                    .unwrap_or(0),
            })
        });
        let rise = |a: &Reading, b: &Reading| b.bytes.saturating_sub(a.bytes);
        Self {
            start_bytes: memory.start_bytes,
            end_bytes: memory.end_bytes,
            peak_bytes: memory.peak_bytes,
            peak_rate,
            idle_tail,
            idle_growth_bytes: rates
                .iter()
                .filter(|r| is_idle(r.2))
                .map(|(a, b, _)| rise(a, b))
                .sum(),
            total_rise_bytes: rates.iter().map(|(a, b, _)| rise(a, b)).sum(),
        }
    }
}

/// How the image retains memory, when it does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Retained {
    /// Memory stayed up for the idle tail after activity dropped.
    AfterActivityDrops,
    /// Memory rose during idle intervals.
    WhileIdle,
    /// Memory grew and stayed near its peak, but activity never dropped:
    /// load and retention cannot be told apart.
    NeverIdle,
}

/// Pattern 5: memory that stays up after activity drops, or rises while
/// idle; strong only when a path's held bytes kept rising (the
/// unbounded-cache signature). Paths are ranked by the bytes they hold at
/// the end, and file-backed paths are never named (their growth is
/// [`Pattern::FileBackedGrowth`]).
fn retention(report: &Report, p: &ProcessReport, memory: &Memory) -> Option<Draft> {
    let facts = RetentionFacts::of(memory);
    let (kind, retained) = classify_retention(&facts)?;
    let teardown = memory.teardown.as_ref();
    let rank = Rank::before_teardown(Rank::End, teardown);
    let groups = paths::process_groups(report, p.id, Kind::Own, rank);
    let until_ns = teardown.map(|t| t.from_ns);
    let steady: Vec<(&PathGroup<'_>, HeldRise)> = groups
        .iter()
        .filter_map(|g| {
            Some((
                g,
                paths::held_rise(&g.paths, report.path_bucket_ns, until_ns)?,
            ))
        })
        .filter(|(_, rise)| rise.is_steady())
        .collect();
    let named: Vec<PathGroup<'_>> = if steady.is_empty() {
        groups.clone()
    } else {
        steady.iter().map(|(g, _)| (*g).clone()).collect()
    };
    let top = named.first();
    let top_function = top.map(|g| function_name(report, g.top_stack()));
    let mut summary = retention_summary(p, kind, retained, &facts, memory);
    if let Some(function) = &top_function {
        summary.push_str(&format!(", held by {function}"));
    }
    if let Some(teardown) = teardown {
        summary.push_str(&format!("; it {}", teardown.phrase()));
    }
    let mut draft = Draft::new(Pattern::Retention, Scope::of(p), retained, summary);
    draft.evidence.push(memory.line(p));
    draft
        .evidence
        .extend(retention_evidence(&facts, memory.basis));
    draft.evidence.extend(memory.teardown_line(p));
    for (group, rise) in &steady {
        draft.evidence.push(format!(
            "held bytes kept rising (unbounded-cache signature): {} held more in {} of {} \
             buckets of {}, at most {:.0}% of its rise in one; it holds {} of the {} it grew",
            path_name(report, group.top_stack()),
            rise.rising_buckets,
            rise.span_buckets,
            seconds(report.path_bucket_ns),
            100.0 * rise.max_bucket_share,
            format_bytes(rise.held_end_bytes),
            format_bytes(rise.grown_bytes)
        ));
    }
    draft.name_paths(&paths::describe_groups(report, p, &named));
    draft.weak_if(growth_too_small("the retained growth", retained));
    draft.weak_if(too_few_readings(p));
    // Held bytes that kept rising tell retention from load without an idle
    // period (load's memory is given back; memory held until the program's
    // own shutdown released it is the same case): only without them does a
    // window that never idled leave it open, whatever the window caught.
    draft.weak_if((kind == Retained::NeverIdle && steady.is_empty()).then(|| {
        "activity never dropped, so load and retention cannot be told apart: record through \
         an idle period"
            .to_owned()
    }));
    draft.weak_if(steady.is_empty().then(|| {
        "no path's held bytes kept rising: this looks like a working set (imports, warm \
         caches, a reused buffer) that stops at its size"
            .to_owned()
    }));
    let import_time = top.is_some_and(|g| {
        report
            .frames(g.top_stack())
            .iter()
            .any(Frame::is_import_machinery)
    });
    draft.next_step = match (&top_function, steady.is_empty()) {
        (Some(function), true) if import_time => format!(
            "nothing to bound: this is what the imports in {function} loaded (modules, their \
             code and data), kept for the process's life; if it matters, import rarely used \
             modules lazily, or import them in the master before it forks so workers share them"
        ),
        (Some(function), false) => format!(
            "find what keeps the references {function} creates, and bound that cache \
             (a size limit or expiry) so idle memory falls back"
        ),
        (Some(function), true) => format!(
            "check whether what {function} holds at the end is meant to stay: it stopped \
             growing, so it is a working set or a buffer of fixed size; drop the references \
             when idle if it need not stay"
        ),
        (None, _) => "find what keeps the retained memory (no sampled path explains it: \
                      record with a smaller --sample-bytes)"
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
        let stayed_up = tail.lowest_bytes as f64 >= RETAINED_FRACTION * tail.at_drop_bytes as f64;
        return (stayed_up && kept >= MIN_GROWTH_BYTES)
            .then_some((Retained::AfterActivityDrops, kept));
    }
    let kept = facts.end_bytes.saturating_sub(facts.start_bytes);
    let near_peak = facts.end_bytes as f64 >= RETAINED_FRACTION * facts.peak_bytes as f64;
    (near_peak && kept >= MIN_GROWTH_BYTES).then_some((Retained::NeverIdle, kept))
}

/// The one-sentence summary of a retention finding (before the path).
fn retention_summary(
    p: &ProcessReport,
    kind: Retained,
    retained: u64,
    facts: &RetentionFacts,
    memory: &Memory,
) -> String {
    let name = p.name();
    let what = memory.basis.what();
    match (kind, facts.idle_tail) {
        (Retained::WhileIdle, _) => format!(
            "{name} kept growing while idle: +{} of {what} added with little activity",
            format_bytes(retained)
        ),
        (Retained::AfterActivityDrops, Some(tail)) => format!(
            "{name} retains +{} of {what} after its activity dropped at {} (held for {})",
            format_bytes(retained),
            seconds(tail.from_ns),
            seconds(tail.duration_ns)
        ),
        _ if memory.teardown.is_some() => format!(
            "{name} grew +{} of {what} over {} and kept it until it shut down",
            format_bytes(retained),
            seconds(memory.life_ns)
        ),
        _ => format!(
            "{name} grew +{} of {what} and kept it until its end",
            format_bytes(retained)
        ),
    }
}

/// The activity lines of a retention finding.
fn retention_evidence(facts: &RetentionFacts, basis: Basis) -> Vec<String> {
    let what = basis.what();
    let mut lines = vec![match facts.idle_tail {
        Some(tail) => format!(
            "activity (page faults + address-space syscalls) peaked at {:.0}/s and stayed \
             under {:.0}% of that from {} for {}; {what} then {}, lowest {}",
            facts.peak_rate,
            100.0 * IDLE_ACTIVITY_FRACTION,
            seconds(tail.from_ns),
            seconds(tail.duration_ns),
            format_bytes(tail.at_drop_bytes),
            format_bytes(tail.lowest_bytes)
        ),
        None => format!(
            "activity (page faults + address-space syscalls) peaked at {:.0}/s; no idle \
             stretch of {} at the end",
            facts.peak_rate,
            seconds(MIN_IDLE_NS)
        ),
    }];
    if facts.idle_growth_bytes > 0 {
        lines.push(format!(
            "{what} added while idle: {} of {} added in all",
            format_bytes(facts.idle_growth_bytes),
            format_bytes(facts.total_rise_bytes)
        ));
    }
    lines
}
