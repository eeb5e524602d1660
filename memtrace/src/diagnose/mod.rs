//! Step 7 of the data flow: reads a finished [`Report`] and says, in plain
//! words and with the numbers that prove it, which of the common growth
//! patterns it shows.
//!
//! The numbers are the report's own: an image's RSS start, end and peak are
//! its [`crate::aggregate::RssSummary`] (what the process table shows), its
//! life ends where its exit began or it exec'd (the interpreter's
//! finalization and the kernel's teardown are never a release), code paths
//! are ranked by the bytes they *hold* (at the high-water mark and at the
//! end), not by the bytes they grew (memory freed and touched again counts
//! once per touch in those), and tree sums count a page shared copy-on-write
//! once (PSS) wherever PSS was read.
//!
//! Copy-on-write un-sharing is in `cow`; tree-wide patterns (one process
//! grows, every worker is large, worker multiplication) in `tree`; growth in
//! file-backed pages in `files`; per-process patterns over time (spike,
//! retention) in `process`; what the paths' held bytes say over time (held
//! bytes that keep rising, a burst) in `paths`. Each is built as a `draft`
//! (evidence lines, named paths, the reasons its evidence is weak) from a
//! process's `memory` as a finding reads it, and returned as the types of
//! `finding`. Every threshold is a named constant below; a finding whose
//! evidence falls short of the strong thresholds is [`Strength::Weak`] and
//! its last evidence line says why. Last, `causes` groups the findings into
//! one [`Cause`] per cause (the same leak in every worker is one cause), the
//! entries of the verdict.
//!
//! Rules that keep one growth from being told twice or wrongly:
//! - a process whose growth is mostly file-backed gets a
//!   [`Pattern::FileBackedGrowth`] finding, and its spike, retention and
//!   sibling comparison read its RSS without file-backed pages (the page
//!   cache is never called retention);
//! - workers covered by a [`Pattern::CowUnsharing`] finding are not
//!   reported again as [`Pattern::WorkerMultiplication`] or
//!   [`Pattern::EveryWorkerLarge`] (the same un-shared pages), and that
//!   finding comes first;
//! - siblings are the last images of processes with the same parent image:
//!   an image an execve replaced is diagnosed on its own, never compared;
//! - with `--allocations`, a process whose allocator holds the memory it
//!   freed gets a [`Pattern::AllocatorFragmentation`] finding
//!   (`fragmentation`) instead of a retention finding.

mod amount;
mod causes;
mod census;
mod cow;
mod draft;
mod files;
mod finding;
mod fragmentation;
pub mod gate;
mod memory;
mod paths;
mod process;
mod teardown;
mod tree;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;

use crate::aggregate::{Frame, ProcessId, ProcessReport, Report, StackId};
use crate::units::format_bytes;

pub use amount::{Amount, ProcessAmount, Step};
pub(crate) use causes::{measure_name, place_frame, place_of};
pub use causes::{Cause, Place};
use draft::{trace_too_short, Draft};
pub use finding::{Diagnosed, Finding, Pattern, Scope, Strength};
use memory::{Basis, Memory};

/// One mebibyte, in bytes.
const MIB: u64 = 1024 * 1024;

/// Growth below this is noise (interpreter start-up, allocator slack, a few
/// pymalloc arenas): no finding is made of it. 8 MiB.
const MIN_GROWTH_BYTES: u64 = 8 * MIB;

/// Growth of at least this is strong evidence on its own; a finding about
/// less (but at least [`MIN_GROWTH_BYTES`]) is weak. 32 MiB.
const STRONG_GROWTH_BYTES: u64 = 32 * MIB;

/// A trace shorter than this is too short to tell a pattern over time: its
/// findings are weak. 3 s.
const MIN_TRACE_NS: u64 = 3_000_000_000;

/// Fewest RSS readings of a process for a finding based on its timeline to
/// be strong (counters are read a few times per second). 4.
const MIN_TIMELINE_POINTS: usize = 4;

/// Fewest samples behind a finding's named paths for their attribution to be
/// trusted; fewer makes the finding weak (each sample stands for about
/// `--sample-bytes` bytes). 16.
const MIN_PATH_SAMPLES: u64 = 16;

/// Code paths named per finding.
const TOP_PATHS: usize = 3;

/// Processes listed one by one in an evidence line; the rest are counted.
/// 8.
const MAX_PROCESSES_LISTED: usize = 8;

/// A process "grows while its siblings stay flat" when its RSS growth is at
/// least this many times the median growth of its siblings (and at least
/// [`MIN_GROWTH_BYTES`]). 4.
const SIBLING_GROWTH_RATIO: u64 = 4;

/// A worker whose memory is at least this holds a large footprint: a bare
/// CPython interpreter is 10-20 MiB resident, so this is mostly application
/// state. 48 MiB.
const LARGE_WORKER_BYTES: u64 = 48 * MIB;

/// Workers hold a similar footprint when `(max - min) / median` of their
/// sizes is at most this. 0.5.
const MAX_WORKER_SPREAD: f64 = 0.5;

/// A worker's footprint is stable when its memory moved by at most this
/// fraction of its size over the second half of its traced life. 0.1.
const STABLE_LATE_CHANGE_FRACTION: f64 = 0.1;

/// The tree's rise over the forks is "about N x the per-worker size" when
/// `|rise / size - N| / N` is at most this. 0.35.
const MULTIPLICATION_TOLERANCE: f64 = 0.35;

/// Worker multiplication needs what the forks themselves added to make at
/// least this share of the tree's rise: the RSS each worker inherited at
/// fork when the tree is summed in RSS, the inherited pages each worker
/// un-shared (exact copy-on-write bytes) when it is summed in PSS (a fork
/// adds nothing to PSS until pages are written). When workers grow mostly
/// after forking, the growth is theirs (a leak or retention in each
/// worker), not the fork count's. 0.5.
const MIN_FORK_STEP_SHARE: f64 = 0.5;

/// Copy-on-write un-sharing needs a worker's RSS to stay flat: its RSS
/// growth at most this fraction of its RSS at the end (un-sharing turns a
/// shared resident page into a private one: RSS does not move, USS does).
/// 0.1.
const COW_FLAT_RSS_FRACTION: f64 = 0.1;

/// ... and its exact copy-on-write fault bytes at least this share of its
/// USS growth: USS also grows without a single write when the master exits
/// or unmaps (its pages become the worker's alone), which is not
/// un-sharing. 0.5.
const COW_FAULT_SHARE: f64 = 0.5;

/// A process's growth is file-backed when its net file-backed growth
/// (exact counters) is at least [`MIN_GROWTH_BYTES`] and at least this
/// share of its net growth of all kinds (file, anonymous, shmem). 0.5.
const FILE_BACKED_SHARE: f64 = 0.5;

/// A spike is released when RSS falls back after the peak by at least this
/// fraction of the rise. 0.5.
const SPIKE_RELEASE_FRACTION: f64 = 0.5;

/// A rise is sharp when it takes at most this fraction of the process's
/// traced time. 0.35.
const SPIKE_MAX_RISE_FRACTION: f64 = 0.35;

/// A spike is tied to one path when that path holds at least this share of
/// the process's sampled bytes held at its high-water mark and, when bucket
/// timelines are known, this share of the path's growth falls in the two
/// busiest adjacent buckets. 0.5.
const SPIKE_PATH_SHARE: f64 = 0.5;

/// An interval between two RSS readings is idle when its activity rate (page
/// faults plus address-space syscalls per second) is at most this fraction of
/// the process's busiest interval. 0.1.
const IDLE_ACTIVITY_FRACTION: f64 = 0.1;

/// Shortest idle tail after which memory that stayed up counts as retained.
/// 1 s.
const MIN_IDLE_NS: u64 = 1_000_000_000;

/// Memory "stays up" when the lowest RSS of the idle tail is at least this
/// fraction of the RSS when activity dropped. 0.8.
const RETAINED_FRACTION: f64 = 0.8;

/// RSS growth during idle intervals is "rising while idle" when it is at
/// least this share of the process's total rise (and at least
/// [`MIN_GROWTH_BYTES`]). 0.25.
const IDLE_GROWTH_SHARE: f64 = 0.25;

/// A path's held bytes keep rising (the unbounded-cache signature) when
/// they rise in at least this fraction of the buckets between its first
/// and last change of held bytes. 0.6.
const STEADY_PRESENT_FRACTION: f64 = 0.6;

/// ... and that span is at least this many buckets. 3.
const STEADY_MIN_BUCKETS: u64 = 3;

/// ... and no single bucket holds more than this share of its rises. 0.5.
const STEADY_MAX_BUCKET_SHARE: f64 = 0.5;

/// ... and it still holds at the end at least this share of what it grew:
/// memory freed and touched again (a reused buffer) grows many times what
/// it holds and is not a cache that keeps growing. 0.5.
const STEADY_MIN_HELD_SHARE: f64 = 0.5;

/// A path line notes that memory was freed and touched again when the path
/// grew more than this many times what it held at most. 2.
const RETOUCHED_RATIO: u64 = 2;

/// Diagnoses `report`: its [`findings`], grouped into [`Cause`]s.
pub fn diagnose(report: Report) -> Diagnosed {
    diagnose_with_allocations(report, None)
}

/// [`diagnose`], with allocator mode's report (`--allocations`) when there
/// is one: its fragmentation notes become findings, and it is kept in the
/// result.
pub fn diagnose_with_allocations(
    report: Report,
    allocations: Option<crate::allocations::AllocationsReport>,
) -> Diagnosed {
    diagnose_with_census(report, allocations, crate::census::CensusReport::default())
}

/// [`diagnose_with_allocations`], with the allocators' census of the
/// default mode: a retention whose memory the allocator holds becomes an
/// allocator finding (`census`); the census is kept in the result when it
/// read any image.
pub fn diagnose_with_census(
    report: Report,
    allocations: Option<crate::allocations::AllocationsReport>,
    census: crate::census::CensusReport,
) -> Diagnosed {
    let mut diagnosis = findings(&report);
    if let Some(allocations) = &allocations {
        fragmentation::add_findings(&report, allocations, &census, &mut diagnosis);
    }
    census::apply(&report, &census, &mut diagnosis);
    let causes = causes::causes(&report, &diagnosis);
    Diagnosed {
        report,
        diagnosis,
        causes,
        allocations,
        census: (!census.images.is_empty()).then_some(census),
    }
}

/// Classifies the report's processes and tree. Always returns at least one
/// finding (when no pattern matched: `NoGrowth` when nothing grew, a weak
/// `UnmatchedGrowth` about the largest riser when it grew), most important
/// first: strong before weak; among equals copy-on-write un-sharing first,
/// then by the bytes each explains, largest first.
pub fn findings(report: &Report) -> Vec<Finding> {
    let (mut drafts, cow_covered) = cow::findings(report);
    drafts.extend(tree::findings(report, &cow_covered));
    for p in &report.processes {
        drafts.extend(files::finding(report, p));
        drafts.extend(process::findings(report, p, files::basis(p)));
    }
    if drafts.is_empty() {
        drafts.push(no_pattern(report));
    }
    for draft in &mut drafts {
        draft.weak_if(trace_too_short(report));
    }
    drafts.sort_by_key(|d| {
        (
            !d.weak_reasons.is_empty(),
            d.pattern != Pattern::CowUnsharing,
            Reverse(d.impact_bytes),
            d.pattern as u8,
            scope_key(d.scope),
        )
    });
    drafts.into_iter().map(Draft::into_finding).collect()
}

/// Sort key of a scope: the tree first, then processes by tgid and row.
fn scope_key(scope: Scope) -> Option<(u32, ProcessId)> {
    match scope {
        Scope::Tree => None,
        Scope::Process { process, tgid } => Some((tgid, process)),
    }
}

/// `ns` as seconds with one decimal, e.g. `2.5 s`.
fn seconds(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

/// `part / whole` as a whole percentage, e.g. `42%` (0% when `whole` is 0).
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".to_owned();
    }
    format!("{:.0}%", 100.0 * part as f64 / whole as f64)
}

/// Lower median of `values` (0 when empty).
fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// `items` joined by `, ` (by `; ` when an item holds a comma), at most
/// [`MAX_PROCESSES_LISTED`] of them, then `… N more`.
fn listed(items: &[String]) -> String {
    let separator = if items.iter().any(|item| item.contains(',')) {
        "; "
    } else {
        ", "
    };
    let mut line = items
        .iter()
        .take(MAX_PROCESSES_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(separator);
    if items.len() > MAX_PROCESSES_LISTED {
        line.push_str(&format!(
            "{separator}… {} more",
            items.len() - MAX_PROCESSES_LISTED
        ));
    }
    line
}

/// The name engineers know a stack by: its innermost Python frame
/// (`function (file:line)`), else its innermost frame, else `?`.
fn path_name(report: &Report, stack: StackId) -> String {
    let frames = report.frames(stack);
    frames
        .iter()
        .rev()
        .find(|f| matches!(f, Frame::Python { .. }))
        .or(frames.last())
        .map_or_else(|| "?".to_owned(), ToString::to_string)
}

/// The function a reader would change for a stack (for sentences): that
/// of its innermost frame of the user's own code, else of its innermost
/// Python frame ([`place_frame`]), else [`path_name`].
fn function_name(report: &Report, stack: StackId) -> String {
    match place_frame(report.frames(stack)) {
        Frame::Python { function, .. } => function.clone(),
        _ => path_name(report, stack),
    }
}

/// The process whose RSS rose the most (peak minus start; the lowest tgid
/// of equals), with that memory.
fn largest_riser(report: &Report) -> Option<(&ProcessReport, Memory)> {
    report
        .processes
        .iter()
        .filter_map(|p| Some((p, Memory::of(p, Basis::Rss)?)))
        .max_by_key(|(p, memory)| (memory.rise_bytes(), Reverse((p.tgid, p.id))))
}

/// The finding when no pattern matched: [`Pattern::NoGrowth`] for the tree
/// when no process rose by [`MIN_GROWTH_BYTES`], else a weak
/// [`Pattern::UnmatchedGrowth`] about the largest riser.
fn no_pattern(report: &Report) -> Draft {
    match largest_riser(report) {
        Some((p, memory)) if memory.rise_bytes() >= MIN_GROWTH_BYTES => {
            unmatched_growth(report, p, &memory)
        }
        largest => no_growth(report, largest.map(|(p, m)| (p.name(), m.rise_bytes()))),
    }
}

/// The finding when nothing rose past [`MIN_GROWTH_BYTES`]: says how much
/// the largest riser (`(name, rise)`) rose.
fn no_growth(report: &Report, largest: Option<(String, u64)>) -> Draft {
    let summary = match &largest {
        Some((name, rise)) => format!(
            "no growth to explain: the largest RSS rise is +{} in {name} (under {})",
            format_bytes(*rise),
            format_bytes(MIN_GROWTH_BYTES)
        ),
        None => "no RSS was read, so no growth pattern can be told".to_owned(),
    };
    let mut draft = Draft::new(Pattern::NoGrowth, Scope::Tree, 0, summary);
    draft.evidence.push(run_line(report));
    if largest.is_none() {
        draft.weak_if(Some("no RSS readings".to_owned()));
    }
    for path in &paths::merged_paths(report, &[]) {
        draft.paths.extend(&path.stacks);
        draft.evidence.push(path.line.clone());
    }
    draft.next_step = "nothing to fix in this trace; if memory grows in production, record \
                       longer or during the traffic or job that grows it"
        .to_owned();
    draft
}

/// The weak finding when `p` rose by at least [`MIN_GROWTH_BYTES`] but no
/// pattern matched: how it grew, and the paths holding the most in it.
fn unmatched_growth(report: &Report, p: &ProcessReport, memory: &Memory) -> Draft {
    let summary = format!(
        "{} grew +{} but matches none of the known growth patterns",
        p.name(),
        format_bytes(memory.rise_bytes())
    );
    let mut draft = Draft::new(
        Pattern::UnmatchedGrowth,
        Scope::of(p),
        memory.rise_bytes(),
        summary,
    );
    draft.evidence.push(memory.line(p));
    draft.evidence.push(run_line(report));
    let paths = paths::merged_paths(report, &[p.id]);
    draft.name_paths(&paths);
    draft.weak_if(Some(
        "no known pattern fits its RSS timeline, so these numbers do not say why it grew"
            .to_owned(),
    ));
    let mut names: Vec<String> = Vec::new();
    for name in paths
        .iter()
        .filter_map(|path| path.stacks.first())
        .map(|&stack| path_name(report, stack))
    {
        // Several stacks end in the same line: it is named once.
        if !names.contains(&name) {
            names.push(name);
        }
    }
    draft.next_step = if names.is_empty() {
        format!(
            "find what {} allocates (no sampled path explains it: record with a smaller \
             --sample-bytes)",
            p.name()
        )
    } else {
        format!(
            "look at what {} allocate(s) in {} and whether it is kept",
            names.join(", "),
            p.name()
        )
    };
    draft
}

/// How many processes (and images) were traced for how long, and the
/// tree's highest summed RSS and PSS (the totals the table shows).
fn run_line(report: &Report) -> String {
    let mut identities: Vec<(u32, u64)> = report
        .processes
        .iter()
        .map(|p| (p.tgid, p.start_time_ns))
        .collect();
    identities.sort_unstable();
    identities.dedup();
    let images = report.processes.len();
    let mut line = format!("{} process(es)", identities.len());
    if images > identities.len() {
        line.push_str(&format!(" ({images} images)"));
    }
    let totals = &report.totals;
    line.push_str(&format!(
        " traced for {}; highest summed RSS {}",
        seconds(report.meta.duration_ns),
        format_bytes(totals.peak_total_rss_bytes)
    ));
    if totals.peak_total_pss_bytes > 0 {
        line.push_str(&format!(
            ", highest summed PSS (shared pages counted once) {}",
            format_bytes(totals.peak_total_pss_bytes)
        ));
    }
    line
}
