//! Last part of the diagnosis step: the findings grouped into [`Cause`]s,
//! one per cause rather than one per process. A pre-fork service leaking
//! through one cache shows the same retention in every worker; that is one
//! cause ("4 workers retain memory via `render_report`"), with the places in
//! the user's own code that hold the memory, summed over those processes.
//!
//! A finding about a single process joins the first cause of its pattern
//! whose function (of the user's code, see [`Frame::is_user_code`], where
//! its largest path starts) is among the finding's named paths; a finding
//! about the whole tree is a cause of its own. A cause then takes in a later
//! one about the same growth told by another pattern (same processes, same
//! function). A cause is as strong as its first (strongest) finding.

use serde::{Deserialize, Serialize};

use crate::aggregate::{
    error_bytes, Frame, PathReport, ProcessId, ProcessKind, ProcessReport, Report, StackId,
};

use super::amount::{self, Amount};
use super::paths::held_until;
use super::{Finding, Pattern, Scope, Strength};

/// Places named per cause.
const MAX_PLACES: usize = 2;

/// One cause of growth: findings of one pattern about the same code, over
/// every process that shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    /// Which pattern (its first finding's).
    pub pattern: Pattern,
    /// Other patterns the same growth also shows (the same processes, held
    /// by the same code: "one worker grows" and "it retains it"), in order.
    #[serde(default)]
    pub also_patterns: Vec<Pattern>,
    /// How sure (its first finding's; the others are as sure or less).
    pub strength: Strength,
    /// Whether it is about the whole tree (one tree-wide finding) rather
    /// than about the processes one by one.
    pub tree: bool,
    /// The findings it groups: indexes into
    /// [`Diagnosed::diagnosis`](super::Diagnosed::diagnosis), most
    /// important first.
    pub findings: Vec<usize>,
    /// The process images it is about, most grown first: its findings'
    /// processes; for a tree-wide finding the workers (every process's last
    /// image when there are none).
    pub processes: Vec<ProcessId>,
    /// Where in the code, largest first (at most 2).
    pub places: Vec<Place>,
    /// What to do next (its first finding's).
    pub next_step: String,
    /// How much, per process: the numbers its headline, "how much" and
    /// "where" speak of.
    #[serde(default)]
    pub amount: Amount,
}

/// A place in the code that holds a cause's memory: the innermost frame of
/// the user's own code of its paths, summed over the cause's processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Place {
    /// The innermost frame of the user's own code (the innermost Python
    /// frame when no frame is the user's, else the innermost frame).
    pub frame: Frame,
    /// The innermost Python frame, when it is not `frame` (a standard
    /// library or package function `frame` called, e.g. `json.dumps`).
    pub via: Option<Frame>,
    /// The memory grew under CPython's import machinery: what an `import`
    /// loads.
    pub import_time: bool,
    /// The innermost native library of the stack's native chain that is not
    /// the interpreter or the C runtime ([`Frame::native_library`]): memory a
    /// C extension or an embedded library (`libsqlite3.so.0`) allocated.
    #[serde(default)]
    pub native_library: Option<String>,
    /// Bytes it holds as the cause's pattern measures them: at the
    /// high-water mark for a spike, copy-on-write bytes for un-sharing,
    /// else at the end (sampled, summed over the processes).
    pub bytes: u64,
    /// `bytes` as a share (0..=1) of the same measure over every path of
    /// the cause's processes.
    pub share: f64,
    /// The stacks summed into it.
    pub stacks: Vec<StackId>,
    /// Samples behind `bytes` (each stands for at most `--sample-bytes`
    /// bytes, less while its process grew slowly).
    #[serde(default)]
    pub samples: u64,
    /// The sampling variance of `bytes`, in KiB² (the paths' shares of
    /// theirs, [`crate::aggregate::SampledBytes::variance_share_kib2`]); its root is
    /// [`Place::error_bytes`].
    #[serde(default)]
    pub variance_kib2: u64,
}

impl Place {
    /// One standard error of `bytes` from byte sampling, in bytes.
    pub fn error_bytes(&self) -> u64 {
        error_bytes(self.variance_kib2)
    }

    /// [`Place::error_bytes`] as a fraction of `bytes` (0 with no bytes).
    pub fn uncertainty(&self) -> f64 {
        if self.bytes == 0 {
            return 0.0;
        }
        self.error_bytes() as f64 / self.bytes as f64
    }

    /// Whether `self` and `other` differ by no more than byte sampling can
    /// explain: two standard errors of their difference (about 95 %).
    pub fn tied_with(&self, other: &Place) -> bool {
        let variance_kib2 = self.variance_kib2.saturating_add(other.variance_kib2);
        self.bytes.abs_diff(other.bytes) <= 2 * error_bytes(variance_kib2)
    }
}

/// Groups `findings` (most important first) into causes, most important
/// first (the order of each cause's first finding).
pub fn causes(report: &Report, findings: &[Finding]) -> Vec<Cause> {
    let mut causes: Vec<Cause> = Vec::new();
    // Per cause about single processes: its pattern and the function of
    // its first finding's largest path.
    let mut keys: Vec<Option<(Pattern, String)>> = Vec::new();
    for (index, finding) in findings.iter().enumerate() {
        let places = finding_functions(report, finding);
        let joined = keys.iter().position(|key| {
            key.as_ref()
                .is_some_and(|(pattern, top)| *pattern == finding.pattern && places.contains(top))
        });
        match joined {
            Some(cause) => causes[cause].findings.push(index),
            None => {
                keys.push(match finding.scope {
                    Scope::Process { .. } => {
                        places.first().map(|top| (finding.pattern, top.clone()))
                    }
                    Scope::Tree => None,
                });
                causes.push(Cause {
                    pattern: finding.pattern,
                    also_patterns: Vec::new(),
                    strength: finding.strength,
                    tree: finding.scope == Scope::Tree,
                    findings: vec![index],
                    processes: Vec::new(),
                    places: Vec::new(),
                    next_step: finding.next_step.clone(),
                    amount: Amount::default(),
                });
            }
        }
    }
    for cause in &mut causes {
        cause.processes = processes(report, findings, cause);
        cause.places = places(report, findings, cause);
    }
    for cause in causes
        .iter_mut()
        .filter(|c| c.pattern == Pattern::Retention)
    {
        add_retaining_siblings(report, findings, cause);
    }
    let mut causes = merge_same_growth(report, findings, causes);
    for cause in &mut causes {
        cause.amount = amount::of(
            report,
            findings,
            cause.pattern,
            &cause.findings,
            &cause.processes,
        );
    }
    causes
}

/// Adds to a retention cause about workers their sibling workers that hold
/// memory at the end through the cause's function but grew too little for
/// a finding of their own (a worker that served fewer of the leaking
/// requests): the same leak, smaller. The cause's numbers then cover them.
fn add_retaining_siblings(report: &Report, findings: &[Finding], cause: &mut Cause) {
    let Some(function) = top_python_function(cause) else {
        return;
    };
    let members: Vec<&ProcessReport> = cause
        .processes
        .iter()
        .filter_map(|&id| report.process(id))
        .collect();
    if cause.tree || members.iter().any(|p| p.kind != ProcessKind::Worker) {
        return;
    }
    let holds_through = |id: ProcessId| {
        report.paths.iter().any(|path| {
            path.process == id
                && path.bytes.held_now_bytes() > 0
                && function_key(place_frame(report.frames(path.stack))) == function
        })
    };
    let siblings: Vec<ProcessId> = report
        .processes
        .iter()
        .filter(|p| p.kind == ProcessKind::Worker && p.next_image.is_none())
        .filter(|p| !cause.processes.contains(&p.id))
        .filter(|p| members.iter().any(|m| m.parent == p.parent))
        .filter(|p| holds_through(p.id))
        .map(|p| p.id)
        .collect();
    if siblings.is_empty() {
        return;
    }
    cause.processes.extend(siblings);
    cause.processes = processes_by_growth(report, std::mem::take(&mut cause.processes));
    cause.places = places(report, findings, cause);
}

/// The functions (`function (file)`) of the user's code that a finding
/// about one process names, largest path first; empty for a finding about
/// the tree. A finding joins a cause of its pattern when the cause's
/// function is among these: a worker that grew less still leaks through
/// the same code.
fn finding_functions(report: &Report, finding: &Finding) -> Vec<String> {
    if finding.scope == Scope::Tree {
        return Vec::new();
    }
    let mut functions: Vec<String> = Vec::new();
    for &stack in &finding.paths {
        let function = function_key(place_frame(report.frames(stack)));
        if !functions.contains(&function) {
            functions.push(function);
        }
    }
    functions
}

/// Folds each cause into an earlier one about the same growth: the
/// processes of one are among the other's and their largest place is the
/// same function (the growth told by another pattern: one worker outgrows
/// its siblings, and it and they retain through that function), or it is
/// the same pattern in processes all among the earlier cause's (a worker's
/// retention is one cause, whichever function held most in it).
fn merge_same_growth(report: &Report, findings: &[Finding], causes: Vec<Cause>) -> Vec<Cause> {
    let mut merged: Vec<Cause> = Vec::new();
    for cause in causes {
        match merged.iter_mut().find(|m| same_growth(m, &cause)) {
            Some(earlier) => {
                if earlier.pattern != cause.pattern
                    && !earlier.also_patterns.contains(&cause.pattern)
                {
                    earlier.also_patterns.push(cause.pattern);
                }
                earlier.findings.extend(cause.findings);
                // A union, not the findings' processes again: siblings a
                // retention cause took in have no finding of their own.
                earlier.processes.extend(cause.processes);
                earlier.processes =
                    processes_by_growth(report, std::mem::take(&mut earlier.processes));
                earlier.places = places(report, findings, earlier);
            }
            None => merged.push(cause),
        }
    }
    merged
}

/// Whether `later` is the growth `earlier` is about.
fn same_growth(earlier: &Cause, later: &Cause) -> bool {
    let within = |a: &Cause, b: &Cause| a.processes.iter().all(|p| b.processes.contains(p));
    let same_function = top_python_function(earlier).is_some()
        && top_python_function(earlier) == top_python_function(later);
    !later.processes.is_empty()
        && ((earlier.pattern == later.pattern && within(later, earlier))
            || (same_function && (within(later, earlier) || within(earlier, later))))
}

/// [`function_key`] of a cause's largest place, when that is a Python
/// frame.
fn top_python_function(cause: &Cause) -> Option<String> {
    let frame = &cause.places.first()?.frame;
    matches!(frame, Frame::Python { .. }).then(|| function_key(frame))
}

/// What tells a place's function apart: `function (file)` of a Python
/// frame (any line of it), else the frame as it is written.
fn function_key(frame: &Frame) -> String {
    match frame {
        Frame::Python { function, file, .. } => format!("{function} ({file})"),
        other => other.to_string(),
    }
}

/// The images `cause` is about, most RSS growth first.
fn processes(report: &Report, findings: &[Finding], cause: &Cause) -> Vec<ProcessId> {
    let ids: Vec<ProcessId> = if cause.tree {
        let last_images = report.processes.iter().filter(|p| p.next_image.is_none());
        let workers: Vec<ProcessId> = last_images
            .clone()
            .filter(|p| p.kind == ProcessKind::Worker)
            .map(|p| p.id)
            .collect();
        if workers.is_empty() {
            last_images.map(|p| p.id).collect()
        } else {
            workers
        }
    } else {
        cause
            .findings
            .iter()
            .filter_map(|&i| match findings[i].scope {
                Scope::Process { process, .. } => Some(process),
                Scope::Tree => None,
            })
            .collect()
    };
    processes_by_growth(report, ids)
}

/// `ids` without repeats, most RSS growth first (ties by id).
fn processes_by_growth(report: &Report, mut ids: Vec<ProcessId>) -> Vec<ProcessId> {
    let growth = |id: &ProcessId| {
        report
            .process(*id)
            .and_then(|p| p.rss)
            .map_or(i64::MIN, |rss| rss.growth_bytes)
    };
    ids.sort_by_key(|id| (std::cmp::Reverse(growth(id)), *id));
    ids.dedup();
    ids
}

/// The places of `cause`: its findings' paths in its processes, grouped by
/// [`place_frame`] (with its line), summed, largest first.
fn places(report: &Report, findings: &[Finding], cause: &Cause) -> Vec<Place> {
    let stacks: Vec<StackId> = cause
        .findings
        .iter()
        .flat_map(|&i| findings[i].paths.iter().copied())
        .collect();
    let in_cause = |p: &&PathReport| cause.processes.contains(&p.process);
    let teardowns: Vec<(ProcessId, Option<u64>)> = cause
        .processes
        .iter()
        .map(|&id| (id, amount::teardown_from_ns(report, id)))
        .collect();
    let measure = |pattern, path: &PathReport| {
        let until = teardowns
            .iter()
            .find(|(id, _)| *id == path.process)
            .and_then(|(_, until)| *until);
        measure(pattern, path, until)
    };
    let total: u64 = report
        .paths
        .iter()
        .filter(in_cause)
        .map(|p| measure(cause.pattern, p))
        .sum();
    let mut places: Vec<Place> = Vec::new();
    for path in report
        .paths
        .iter()
        .filter(in_cause)
        .filter(|p| stacks.contains(&p.stack))
    {
        let place = place_of(report.frames(path.stack));
        let bytes = measure(cause.pattern, path);
        match places
            .iter_mut()
            .find(|p| p.frame == place.frame && p.via == place.via)
        {
            Some(known) => {
                known.bytes += bytes;
                known.samples += path.bytes.samples;
                known.variance_kib2 += path.bytes.variance_share_kib2(bytes);
                known.import_time |= place.import_time;
                if known.native_library.is_none() {
                    known.native_library = place.native_library;
                }
                if !known.stacks.contains(&path.stack) {
                    known.stacks.push(path.stack);
                }
            }
            None => places.push(Place {
                bytes,
                samples: path.bytes.samples,
                variance_kib2: path.bytes.variance_share_kib2(bytes),
                stacks: vec![path.stack],
                ..place
            }),
        }
    }
    places.retain(|p| p.bytes > 0);
    places.sort_by_key(|p| std::cmp::Reverse(p.bytes));
    places.truncate(MAX_PLACES);
    for place in &mut places {
        place.share = if total == 0 {
            0.0
        } else {
            place.bytes as f64 / total as f64
        };
    }
    places
}

/// Which of a path's bytes a cause counts, by its pattern.
#[derive(Clone, Copy)]
enum Measure {
    /// Held at the high-water mark: a spike, every worker large, worker
    /// multiplication, file-backed growth (file pages read and unmapped
    /// again hold nothing at the end).
    HeldAtPeak,
    /// Copy-on-write bytes: un-sharing.
    CopyOnWrite,
    /// Held at the end (of the active life, when the process's teardown
    /// released it): retention and the rest.
    HeldAtEnd,
}

impl Measure {
    fn of(pattern: Pattern) -> Self {
        match pattern {
            Pattern::Spike
            | Pattern::EveryWorkerLarge
            | Pattern::WorkerMultiplication
            | Pattern::FileBackedGrowth => Self::HeldAtPeak,
            Pattern::CowUnsharing => Self::CopyOnWrite,
            _ => Self::HeldAtEnd,
        }
    }
}

/// The bytes of `path` that a cause of `pattern` is about; `until_ns` is
/// its process's teardown start, if it had one.
fn measure(pattern: Pattern, path: &PathReport, until_ns: Option<u64>) -> u64 {
    match Measure::of(pattern) {
        Measure::HeldAtPeak => path.peak_held_bytes,
        Measure::CopyOnWrite => path.bytes.cow_bytes,
        Measure::HeldAtEnd => held_until(path, until_ns),
    }
}

/// What [`Place::bytes`] of `cause` are, in words: `held at the end`
/// (`held until it shut down` when its processes released it in their
/// teardown), `held at the high-water mark`, `un-shared (copy-on-write)`.
pub(crate) fn measure_name(cause: &Cause) -> &'static str {
    let shut_down = cause
        .amount
        .each
        .iter()
        .any(|a| a.released_at_shutdown_bytes > 0);
    match Measure::of(cause.pattern) {
        Measure::HeldAtPeak => "held at the high-water mark",
        Measure::CopyOnWrite => "un-shared (copy-on-write)",
        Measure::HeldAtEnd if shut_down => "held until it shut down",
        Measure::HeldAtEnd => "held at the end",
    }
}

/// The place of a stack (outermost frame first), with no bytes yet.
pub(crate) fn place_of(frames: &[Frame]) -> Place {
    let frame = place_frame(frames).clone();
    let innermost_python = frames
        .iter()
        .rev()
        .find(|f| matches!(f, Frame::Python { .. }));
    Place {
        via: innermost_python.filter(|f| **f != frame).cloned(),
        import_time: frames.iter().any(Frame::is_import_machinery),
        // The innermost library of the native chain under the Python
        // frames (the C runtime's malloc under libsqlite3 names libsqlite3).
        native_library: frames
            .iter()
            .rev()
            .take_while(|f| !matches!(f, Frame::Python { .. }))
            .find_map(Frame::native_library)
            .map(str::to_owned),
        frame,
        bytes: 0,
        share: 0.0,
        stacks: Vec::new(),
        samples: 0,
        variance_kib2: 0,
    }
}

/// The frame a stack is named by for a reader who wants to change code: the
/// innermost frame of the user's own code, else the innermost Python frame,
/// else the innermost frame (an unknown frame when the stack is empty).
pub(crate) fn place_frame(frames: &[Frame]) -> &Frame {
    static EMPTY: Frame = Frame::Unknown {
        reason: String::new(),
    };
    frames
        .iter()
        .rev()
        .find(|f| f.is_user_code())
        .or_else(|| {
            frames
                .iter()
                .rev()
                .find(|f| matches!(f, Frame::Python { .. }))
        })
        .or(frames.last())
        .unwrap_or(&EMPTY)
}

#[cfg(test)]
mod tests {
    use super::place_of;

    const MIB: u64 = 1 << 20;

    #[test]
    fn places_within_two_standard_errors_of_their_difference_are_tied() {
        let place = |mib: u64, error_mib: u64| super::Place {
            bytes: mib * MIB,
            variance_kib2: (error_mib * 1024).pow(2),
            ..place_of(&[])
        };
        // 10 ± 1 and 8 ± 1 MiB: the difference, 2 MiB, is within 2 * 1.41.
        assert!(place(10, 1).tied_with(&place(8, 1)));
        // 10 ± 1 and 5 ± 1 MiB are told apart.
        assert!(!place(10, 1).tied_with(&place(5, 1)));
        // Records of their true size have no error: any difference ranks.
        assert!(!place(10, 0).tied_with(&place(9, 0)));
        assert!((place(10, 1).uncertainty() - 0.1).abs() < 1e-9);
    }
}
