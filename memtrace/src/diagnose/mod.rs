//! Step 7 of the data flow: reads a finished [`Report`] and says, in plain
//! words and with the numbers that prove it, which of the common growth
//! patterns it shows.
//!
//! Tree-wide patterns (one process grows, every worker is large, worker
//! multiplication) are in `tree`; per-process patterns over time (spike,
//! retention) in `process`; what the growth paths' bucket timelines say
//! (steady growth, a burst) in `paths`. Every threshold is a named constant
//! below; a finding whose evidence falls short of the strong thresholds is
//! [`Strength::Weak`] and its summary says why.

mod paths;
mod process;
mod tree;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;

use serde::{Deserialize, Serialize};

use crate::aggregate::{
    Frame, PathReport, ProcessId, ProcessReport, Report, RssPoint, StackId,
};
use crate::units::format_bytes;

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

/// A process "grows while its siblings stay flat" when its RSS growth is at
/// least this many times the median growth of its siblings (and at least
/// [`MIN_GROWTH_BYTES`]). 4.
const SIBLING_GROWTH_RATIO: u64 = 4;

/// A worker whose RSS is at least this holds a large footprint: a bare
/// CPython interpreter is 10-20 MiB resident, so this is mostly application
/// state. 48 MiB.
const LARGE_WORKER_BYTES: u64 = 48 * MIB;

/// Workers hold a similar footprint when `(max - min) / median` of their
/// sizes is at most this. 0.5.
const MAX_WORKER_SPREAD: f64 = 0.5;

/// A worker's footprint is stable when its RSS moved by at most this
/// fraction of its size over the second half of its traced life. 0.1.
const STABLE_LATE_CHANGE_FRACTION: f64 = 0.1;

/// The tree's RSS rise over the forks is "about N x the per-worker size"
/// when `|rise / size - N| / N` is at most this. 0.35.
const MULTIPLICATION_TOLERANCE: f64 = 0.35;

/// Worker multiplication needs the steps at the forks themselves (each new
/// worker's first RSS reading) to make at least this share of the tree's
/// rise; when workers grow mostly after forking, the growth is theirs
/// (a leak or retention in each worker), not the fork count's. 0.5.
const MIN_FORK_STEP_SHARE: f64 = 0.5;

/// A spike is released when RSS falls back after the peak by at least this
/// fraction of the rise. 0.5.
const SPIKE_RELEASE_FRACTION: f64 = 0.5;

/// A rise is sharp when it takes at most this fraction of the process's
/// traced time. 0.35.
const SPIKE_MAX_RISE_FRACTION: f64 = 0.35;

/// A spike is tied to one path when that path holds at least this share of
/// the process's sampled growth and, when bucket timelines are known, this
/// share of the path's own growth falls in the two busiest adjacent buckets.
/// 0.5.
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

/// A path grows steadily (the unbounded-cache signature) when it grows in at
/// least this fraction of the buckets between its first and last growth.
/// 0.6.
const STEADY_PRESENT_FRACTION: f64 = 0.6;

/// ... and spans at least this many buckets. 3.
const STEADY_MIN_BUCKETS: u64 = 3;

/// ... and no single bucket holds more than this share of its growth. 0.5.
const STEADY_MAX_BUCKET_SHARE: f64 = 0.5;

/// A growth pattern memtrace recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// One process grows while its siblings stay flat.
    OneProcessGrows,
    /// Every worker holds a large, stable footprint.
    EveryWorkerLarge,
    /// Total memory steps up with each fork: about N x the per-worker size.
    WorkerMultiplication,
    /// A sharp rise tied to one code path, released afterwards.
    Spike,
    /// Memory that stays up after activity drops, or rises while idle.
    Retention,
    /// RSS grew in file-backed pages (page cache of mapped files), which
    /// the kernel can reclaim, not in the program's own memory.
    FileBackedGrowth,
    /// Workers' RSS stays flat while their private memory grows: pages
    /// shared copy-on-write with the master are un-shared by writes.
    CowUnsharing,
    /// A process grew but fits none of the patterns above (always weak;
    /// scope that process).
    UnmatchedGrowth,
    /// Nothing grew enough to explain (scope tree).
    NoGrowth,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum Scope {
    /// The whole traced process tree.
    Tree,
    /// One process image.
    Process {
        /// Its row in the report.
        process: ProcessId,
        /// Its tgid.
        tgid: u32,
    },
}

/// How sure a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strength {
    /// The numbers clearly show the pattern.
    Strong,
    /// The numbers point that way but do not settle it; said so.
    Weak,
}

/// One diagnosis, printed first in every format that carries text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Which pattern.
    pub pattern: Pattern,
    /// About what.
    pub scope: Scope,
    /// How sure.
    pub strength: Strength,
    /// One sentence, e.g. "worker 1234 grows while its 3 siblings stay flat".
    pub summary: String,
    /// The numbers behind it, one per line.
    pub evidence: Vec<String>,
    /// The code paths behind it, largest first (ids into `Report::stacks`).
    pub paths: Vec<StackId>,
    /// What the engineer should do next.
    pub next_step: String,
}

/// A report with its diagnosis: what every renderer draws. It reads as the
/// [`Report`] it holds (`Deref`); its JSON form is the report's with a
/// `diagnosis` field added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosed {
    /// The aggregated report.
    #[serde(flatten)]
    pub report: Report,
    /// Growth patterns found, strongest first ([`findings`]).
    pub diagnosis: Vec<Finding>,
}

impl std::ops::Deref for Diagnosed {
    type Target = Report;

    fn deref(&self) -> &Report {
        &self.report
    }
}

/// Diagnoses `report` ([`findings`]).
pub fn diagnose(report: Report) -> Diagnosed {
    let diagnosis = findings(&report);
    Diagnosed { report, diagnosis }
}

/// Classifies the report's processes and tree. Always returns at least one
/// finding (when no pattern matched: `NoGrowth` when nothing grew, a weak
/// `UnmatchedGrowth` about the largest riser when it grew), most important
/// first: strong
/// before weak, then by the bytes each explains, largest first.
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut drafts = tree::findings(report);
    for process in &report.processes {
        drafts.extend(process::findings(report, process));
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

/// A finding being built: its weak reasons are kept apart until the end, and
/// `impact_bytes` (the memory it explains) ranks it.
#[derive(Debug)]
struct Draft {
    pattern: Pattern,
    scope: Scope,
    impact_bytes: u64,
    summary: String,
    evidence: Vec<String>,
    paths: Vec<StackId>,
    next_step: String,
    weak_reasons: Vec<String>,
}

impl Draft {
    /// A draft with no evidence, paths or weak reasons yet.
    fn new(pattern: Pattern, scope: Scope, impact_bytes: u64, summary: String) -> Self {
        Self {
            pattern,
            scope,
            impact_bytes,
            summary,
            evidence: Vec::new(),
            paths: Vec::new(),
            next_step: String::new(),
            weak_reasons: Vec::new(),
        }
    }

    /// Records why the evidence is thin, if it is.
    fn weak_if(&mut self, reason: Option<String>) {
        if let Some(reason) = reason {
            if !self.weak_reasons.contains(&reason) {
                self.weak_reasons.push(reason);
            }
        }
    }

    /// Names `paths` (ids and one evidence line each) and marks the draft
    /// weak when few samples stand behind them.
    fn name_paths(&mut self, paths: &[PathEvidence]) {
        for path in paths {
            for stack in &path.stacks {
                if !self.paths.contains(stack) {
                    self.paths.push(*stack);
                }
            }
            self.evidence.push(path.line.clone());
        }
        let samples: u64 = paths.iter().map(|p| p.samples).sum();
        if paths.is_empty() {
            self.weak_if(Some("no sampled code path explains it".to_owned()));
        } else if samples < MIN_PATH_SAMPLES {
            self.weak_if(Some(format!(
                "only {samples} samples stand behind the named paths (< {MIN_PATH_SAMPLES})"
            )));
        }
    }

    /// The finished finding: weak when any reason was recorded, and then its
    /// last evidence line says why (once; the summary stays one sentence).
    fn into_finding(mut self) -> Finding {
        let strength = if self.weak_reasons.is_empty() {
            Strength::Strong
        } else {
            let reasons = self.weak_reasons.join("; ");
            self.evidence.push(format!("weak evidence: {reasons}"));
            Strength::Weak
        };
        Finding {
            pattern: self.pattern,
            scope: self.scope,
            strength,
            summary: self.summary,
            evidence: self.evidence,
            paths: self.paths,
            next_step: self.next_step,
        }
    }
}

/// A code path named by a finding (the stacks that make it up, largest
/// first), with its evidence line.
#[derive(Clone, Debug)]
struct PathEvidence {
    stacks: Vec<StackId>,
    samples: u64,
    line: String,
}

/// Why the whole trace is too short for strong findings, if it is.
fn trace_too_short(report: &Report) -> Option<String> {
    (report.meta.duration_ns < MIN_TRACE_NS).then(|| {
        format!(
            "the trace lasted {} (< {})",
            seconds(report.meta.duration_ns),
            seconds(MIN_TRACE_NS)
        )
    })
}

/// Why `growth_bytes` is too little for a strong finding, if it is.
fn growth_too_small(what: &str, growth_bytes: u64) -> Option<String> {
    (growth_bytes < STRONG_GROWTH_BYTES).then(|| {
        format!(
            "{what} is {} (< {})",
            format_bytes(growth_bytes),
            format_bytes(STRONG_GROWTH_BYTES)
        )
    })
}

/// Why `readings` RSS readings of `tgid` are too few, if they are.
fn too_few_readings(tgid: u32, readings: usize) -> Option<String> {
    (readings < MIN_TIMELINE_POINTS)
        .then(|| format!("tgid {tgid} has only {readings} RSS readings (< {MIN_TIMELINE_POINTS})"))
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

/// The function name of a stack's innermost Python frame (for sentences),
/// else [`path_name`].
fn function_name(report: &Report, stack: StackId) -> String {
    report
        .frames(stack)
        .iter()
        .rev()
        .find_map(|f| match f {
            Frame::Python { function, .. } => Some(function.clone()),
            _ => None,
        })
        .unwrap_or_else(|| path_name(report, stack))
}

/// The growth paths of one process that end in the same Python function
/// (same function and file; lines and native frames may differ), summed.
#[derive(Clone, Debug)]
struct PathGroup<'a> {
    /// Its paths, largest growth first.
    paths: Vec<&'a PathReport>,
    /// Summed sampled growth.
    growth_bytes: u64,
    /// Summed samples.
    samples: u64,
    /// Summed share (0..=1) of the process's sampled growth.
    growth_share: f64,
}

impl PathGroup<'_> {
    /// Its stack ids, largest first.
    fn stacks(&self) -> Vec<StackId> {
        self.paths.iter().map(|p| p.stack).collect()
    }
}

/// What groups paths into a [`PathGroup`]: the innermost Python frame's
/// function and file, else the whole innermost frame.
fn group_key(report: &Report, stack: StackId) -> String {
    let frames = report.frames(stack);
    frames
        .iter()
        .rev()
        .find_map(|f| match f {
            Frame::Python { function, file, .. } => Some(format!("{function} ({file})")),
            _ => None,
        })
        .unwrap_or_else(|| path_name(report, stack))
}

/// The top growth paths of `tgid` grouped by function (up to
/// [`TOP_PATHS`] groups with growth, largest first).
fn process_path_groups(report: &Report, process: ProcessId) -> Vec<PathGroup<'_>> {
    let mut groups: Vec<(String, PathGroup<'_>)> = Vec::new();
    for path in report
        .paths
        .iter()
        .filter(|p| p.process == process && p.bytes.growth_bytes > 0)
    {
        let key = group_key(report, path.stack);
        let index = match groups.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let empty = PathGroup {
                    paths: Vec::new(),
                    growth_bytes: 0,
                    samples: 0,
                    growth_share: 0.0,
                };
                groups.push((key, empty));
                groups.len() - 1
            }
        };
        let group = &mut groups[index].1;
        group.paths.push(path);
        group.growth_bytes += path.bytes.growth_bytes;
        group.samples += path.bytes.samples;
        group.growth_share += path.growth_share;
    }
    // Paths come largest first, so groups are in order of their largest
    // path; rank them by their sums.
    groups.sort_by_key(|(_, g)| Reverse(g.growth_bytes));
    groups.truncate(TOP_PATHS);
    groups.into_iter().map(|(_, g)| g).collect()
}

/// One evidence line per path group of one process: its name, sampled
/// growth and share of the process's sampled growth.
fn describe_groups(report: &Report, tgid: u32, groups: &[PathGroup<'_>]) -> Vec<PathEvidence> {
    groups
        .iter()
        .map(|g| PathEvidence {
            stacks: g.stacks(),
            samples: g.samples,
            line: format!(
                "path {}: +{} sampled growth ({:.0}% of tgid {tgid}'s) in {} stack(s), {} samples",
                path_name(report, g.paths[0].stack),
                format_bytes(g.growth_bytes),
                100.0 * g.growth_share,
                g.paths.len(),
                g.samples
            ),
        })
        .collect()
}

/// The RSS readings of `p` while it lived. The last readings of an exited
/// process, taken at its exit, show its address space being torn down rather
/// than what the program held, so they are left out (one reading is always
/// kept).
fn lived_timeline(p: &ProcessReport) -> &[RssPoint] {
    let Some(exit_ns) = p.exited_ns else {
        return &p.timeline;
    };
    let before_exit = p.timeline.iter().take_while(|pt| pt.t_ns < exit_ns).count();
    &p.timeline[..before_exit.max(p.timeline.len().min(1))]
}

/// RSS of a process over its [`lived_timeline`].
#[derive(Clone, Copy, Debug)]
struct Lived {
    /// First reading.
    start_bytes: u64,
    /// Last reading.
    end_bytes: u64,
    /// Highest reading.
    peak_bytes: u64,
}

impl Lived {
    /// `end - start`, 0 when it shrank.
    fn growth_bytes(&self) -> u64 {
        self.end_bytes.saturating_sub(self.start_bytes)
    }

    /// `peak - start`: how far it rose, whether or not it fell back.
    fn rise_bytes(&self) -> u64 {
        self.peak_bytes.saturating_sub(self.start_bytes)
    }
}

/// `p`'s RSS over its [`lived_timeline`]; `None` without readings.
fn lived(p: &ProcessReport) -> Option<Lived> {
    let timeline = lived_timeline(p);
    Some(Lived {
        start_bytes: timeline.first()?.rss_bytes,
        end_bytes: timeline.last()?.rss_bytes,
        peak_bytes: timeline.iter().map(|pt| pt.rss_bytes).max()?,
    })
}

/// Evidence for the top growth stacks merged over the processes in
/// `processes` (all processes when empty).
fn merged_growth_paths(report: &Report, processes: &[ProcessId]) -> Vec<PathEvidence> {
    report
        .growth_stacks
        .iter()
        .filter(|s| processes.is_empty() || s.processes.iter().any(|t| processes.contains(t)))
        .take(TOP_PATHS)
        .map(|s| PathEvidence {
            stacks: vec![s.stack],
            samples: s.bytes.samples,
            line: format!(
                "path {}: +{} sampled growth ({:.0}% of all) in {} process(es), {} samples",
                path_name(report, s.stack),
                format_bytes(s.bytes.growth_bytes),
                100.0 * s.growth_share,
                s.processes.len(),
                s.bytes.samples
            ),
        })
        .collect()
}

/// The process whose RSS rose the most over its [`lived_timeline`] (peak
/// minus first reading; the lowest tgid of equals), with that RSS.
fn largest_riser(report: &Report) -> Option<(&ProcessReport, Lived)> {
    report
        .processes
        .iter()
        .filter_map(|p| Some((p, lived(p)?)))
        .max_by_key(|(p, rss)| (rss.rise_bytes(), Reverse(p.tgid)))
}

/// The finding when no pattern matched: [`Pattern::NoGrowth`] for the tree
/// when no process rose by [`MIN_GROWTH_BYTES`], else a weak
/// [`Pattern::UnmatchedGrowth`] about the largest riser.
fn no_pattern(report: &Report) -> Draft {
    match largest_riser(report) {
        Some((p, rss)) if rss.rise_bytes() >= MIN_GROWTH_BYTES => unmatched_growth(report, p, rss),
        largest => no_growth(report, largest.map(|(p, rss)| (p.tgid, rss.rise_bytes()))),
    }
}

/// The finding when nothing rose past [`MIN_GROWTH_BYTES`]: says how much
/// the largest riser (`(tgid, rise)`) rose.
fn no_growth(report: &Report, largest: Option<(u32, u64)>) -> Draft {
    let summary = match largest {
        Some((tgid, rise)) => format!(
            "no growth to explain: the largest RSS rise is +{} in tgid {tgid} (under {})",
            format_bytes(rise),
            format_bytes(MIN_GROWTH_BYTES)
        ),
        None => "no RSS was read, so no growth pattern can be told".to_owned(),
    };
    let mut draft = Draft::new(Pattern::NoGrowth, Scope::Tree, 0, summary);
    draft.evidence.push(run_line(report));
    if largest.is_none() {
        draft.weak_if(Some("no RSS readings".to_owned()));
    }
    for path in &merged_growth_paths(report, &[]) {
        draft.paths.extend(&path.stacks);
        draft.evidence.push(path.line.clone());
    }
    draft.next_step = "nothing to fix in this trace; if memory grows in production, record \
                       longer or during the traffic or job that grows it"
        .to_owned();
    draft
}

/// The weak finding when `p` rose by at least [`MIN_GROWTH_BYTES`] (its
/// lived RSS is `rss`) but no pattern matched: how it grew, and its growth
/// paths merged over the tree.
fn unmatched_growth(report: &Report, p: &ProcessReport, rss: Lived) -> Draft {
    let summary = format!(
        "tgid {} grew +{} but matches none of the known growth patterns",
        p.tgid,
        format_bytes(rss.rise_bytes())
    );
    let mut draft = Draft::new(
        Pattern::UnmatchedGrowth,
        Scope::Process {
            process: p.id,
            tgid: p.tgid,
        },
        rss.rise_bytes(),
        summary,
    );
    draft.evidence.push(format!(
        "tgid {} (`{}`): RSS {} -> {} (peak {}) over {}",
        p.tgid,
        p.label(),
        format_bytes(rss.start_bytes),
        format_bytes(rss.end_bytes),
        format_bytes(rss.peak_bytes),
        seconds(p.traced_ns)
    ));
    draft.evidence.push(run_line(report));
    let paths = merged_growth_paths(report, &[p.id]);
    draft.name_paths(&paths);
    draft.weak_if(Some(
        "no known pattern fits its RSS timeline, so these numbers do not say why it grew"
            .to_owned(),
    ));
    let names: Vec<String> = paths
        .iter()
        .filter_map(|path| path.stacks.first())
        .map(|&stack| path_name(report, stack))
        .collect();
    draft.next_step = if names.is_empty() {
        format!(
            "find what tgid {} allocates (no sampled path explains it: record with a smaller \
             --sample-bytes)",
            p.tgid
        )
    } else {
        format!(
            "look at what {} allocate(s) in tgid {} and whether it is kept",
            names.join(", "),
            p.tgid
        )
    };
    draft
}

/// How many processes were traced for how long, and the tree's peak RSS.
fn run_line(report: &Report) -> String {
    format!(
        "{} process(es) traced for {}; peak total RSS {}",
        report.totals.processes,
        seconds(report.meta.duration_ns),
        format_bytes(report.totals.peak_total_rss_bytes)
    )
}
