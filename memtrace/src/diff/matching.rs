//! The comparison of `memtrace diff`, pure: what each growth path held at
//! the end and grew on each side, and each process's RSS at the end on each
//! side, with processes paired as a user would pair them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::aggregate::{Frame, PathReport, ProcessId, ProcessReport, Report};

/// Which bytes of a path weigh it where one number must be chosen (the
/// differential flame graph); the table shows both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Measure {
    /// Bytes the path held at the end: what it kept (default).
    #[default]
    HeldAtEnd,
    /// Bytes it grew: every first touch, counted again when freed memory is
    /// touched again.
    Grown,
}

impl Measure {
    /// `held at the end` or `grown`, for titles and messages.
    pub fn describe(self) -> &'static str {
        match self {
            Self::HeldAtEnd => "held at the end",
            Self::Grown => "grown",
        }
    }

    /// The bytes of `bytes` this measure counts.
    pub fn of(self, bytes: PathBytes) -> u64 {
        match self {
            Self::HeldAtEnd => bytes.held_bytes,
            Self::Grown => bytes.grown_bytes,
        }
    }
}

/// One call stack's sampled bytes on one side, summed over the side's
/// process images.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathBytes {
    /// Held at the end: what its pages still held when each image ended
    /// (exec, start of its exit, or the end of the side), in bytes.
    pub held_bytes: u64,
    /// Grown on that side (anonymous, file-backed and shared first
    /// touches), in bytes.
    pub grown_bytes: u64,
}

impl PathBytes {
    /// Sums `other` into these bytes (saturating).
    fn add(&mut self, other: Self) {
        self.held_bytes = self.held_bytes.saturating_add(other.held_bytes);
        self.grown_bytes = self.grown_bytes.saturating_add(other.grown_bytes);
    }
}

/// [`Diff::summary`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Paths that hold more at the end of the later side.
    pub paths_holding_more: usize,
    /// Paths that hold less.
    pub paths_holding_less: usize,
    /// Every path's bytes on the earlier side, summed.
    pub before: PathBytes,
    /// The same on the later side.
    pub after: PathBytes,
}

/// One call stack on both sides.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PathDiff {
    /// The call stack, outermost frame first (the native frame and any
    /// mapping last).
    pub frames: Vec<Frame>,
    /// Its bytes in the earlier report (0 when absent there).
    pub before: PathBytes,
    /// Its bytes in the later report (0 when absent there).
    pub after: PathBytes,
}

impl PathDiff {
    /// Held at the end, after minus before, in bytes.
    pub fn held_delta_bytes(&self) -> i64 {
        self.delta_bytes(Measure::HeldAtEnd)
    }

    /// Grown, after minus before, in bytes.
    pub fn grown_delta_bytes(&self) -> i64 {
        self.delta_bytes(Measure::Grown)
    }

    /// `measure`'s bytes, after minus before, saturated to the `i64` range.
    pub fn delta_bytes(&self, measure: Measure) -> i64 {
        signed_delta(measure.of(self.before), measure.of(self.after))
    }
}

/// One side of a [`ProcessDiff`]: the process image in one report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessSide {
    /// How the capture names it (`tgid 4312`, `tgid 4312#2, image 1`; see
    /// [`ProcessReport::name`]).
    pub name: String,
    /// Its tgid in that report.
    pub tgid: u32,
    /// RSS at its end (or the end of the side), in bytes; `None` when no
    /// RSS was read.
    pub rss_end_bytes: Option<u64>,
}

/// One process image matched across the two reports, or found in one only.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessDiff {
    /// Short name (see [`ProcessReport::label`]).
    pub label: String,
    /// The image in the earlier report.
    pub before: Option<ProcessSide>,
    /// The image in the later report.
    pub after: Option<ProcessSide>,
}

impl ProcessDiff {
    /// RSS end after minus before, in bytes; `None` unless both are known.
    pub fn rss_delta_bytes(&self) -> Option<i64> {
        let before = self.before.as_ref()?.rss_end_bytes?;
        let after = self.after.as_ref()?.rss_end_bytes?;
        Some(signed_delta(before, after))
    }
}

/// What changed between two reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// Every stack that held or grew memory on either side, sorted by held
    /// at the end delta descending, then grown delta descending, then
    /// frames.
    pub paths: Vec<PathDiff>,
    /// Every process image of either side: matched pairs by RSS delta
    /// descending, then images of the earlier report only, then of the
    /// later one only; ties in order of start.
    pub processes: Vec<ProcessDiff>,
    /// RSS of the processes alive at the end of the earlier report, summed,
    /// in bytes.
    pub live_rss_end_before_bytes: u64,
    /// The same for the later report.
    pub live_rss_end_after_bytes: u64,
    /// How long the earlier side covers, in nanoseconds.
    pub before_duration_ns: u64,
    /// How long the later side covers, in nanoseconds.
    pub after_duration_ns: u64,
}

/// Sides whose lengths differ by more than this fraction of the longer
/// one have their growth compared per second ([`Diff::grown_per_second`]).
const LENGTH_TOLERANCE: f64 = 0.1;

impl Diff {
    /// Whether the two sides differ in length by more than 10%: their
    /// growth is then compared in bytes per second (a path growing at one
    /// pace grows twice as much in a window twice as long); held bytes are
    /// levels, compared as they are.
    pub fn grown_per_second(&self) -> bool {
        let (a, b) = (self.before_duration_ns, self.after_duration_ns);
        let longer = a.max(b);
        longer > 0 && (a.abs_diff(b) as f64) > LENGTH_TOLERANCE * longer as f64
    }

    /// The comparison in a few numbers: how many paths hold more and less,
    /// and what all paths held at the end and grew on each side.
    pub fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        for path in &self.paths {
            match path.held_delta_bytes().signum() {
                1 => summary.paths_holding_more += 1,
                -1 => summary.paths_holding_less += 1,
                _ => {}
            }
            summary.before.add(path.before);
            summary.after.add(path.after);
        }
        summary
    }

    /// The paths with one row per Python line: the stacks that differ only
    /// in the native frames under their innermost Python (or marker) frame
    /// summed into one, those native frames dropped; sorted as
    /// [`Diff::paths`].
    pub fn python_lines(&self) -> Vec<PathDiff> {
        let mut before: BTreeMap<Vec<Frame>, PathBytes> = BTreeMap::new();
        let mut after: BTreeMap<Vec<Frame>, PathBytes> = BTreeMap::new();
        for path in &self.paths {
            let line = python_line(&path.frames);
            if path.before != PathBytes::default() {
                before.entry(line.to_vec()).or_default().add(path.before);
            }
            if path.after != PathBytes::default() {
                after.entry(line.to_vec()).or_default().add(path.after);
            }
        }
        compare_paths(before, after)
    }

    /// `bytes` grown on the side of `duration_ns` as the table compares
    /// them: per second when [`Self::grown_per_second`], else as they are.
    pub fn grown_compared(&self, bytes: u64, duration_ns: u64) -> u64 {
        if self.grown_per_second() && duration_ns > 0 {
            (bytes as f64 * 1e9 / duration_ns as f64).round() as u64
        } else {
            bytes
        }
    }
}

/// `after - before` as a signed byte count, saturated.
pub(super) fn signed_delta(before: u64, after: u64) -> i64 {
    let signed = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    signed(after).saturating_sub(signed(before))
}

/// Compares the reports of two captures (e.g. two runs of one program):
/// paths by frames, summed over processes; processes paired by command line
/// and role, in order of start (the first `gunicorn` worker with the first),
/// then the rest by program (executable and script) and role, never by
/// tgid.
pub fn diff(before: &Report, after: &Report) -> Diff {
    let all = |_: &PathReport| true;
    let paths = compare_paths(sum_paths(before, all, all), sum_paths(after, all, all));
    Diff {
        paths,
        processes: pair_by_command(before, after),
        live_rss_end_before_bytes: before.totals.live_rss_end_bytes,
        live_rss_end_after_bytes: after.totals.live_rss_end_bytes,
        before_duration_ns: before.meta.duration_ns,
        after_duration_ns: after.meta.duration_ns,
    }
}

/// The warning for two captures of different programs, `None` when they
/// share one: the programs ([`program_key`]: executable and script) of
/// their root images, compared as sets; named by the first root's command
/// line on each side.
pub fn programs_differ(before: &Report, after: &Report) -> Option<String> {
    let roots = |report: &Report| -> Vec<(String, String)> {
        in_start_order(&report.processes)
            .into_iter()
            .filter(|p| p.role.is_root())
            .map(|p| {
                (
                    program_key(p).0,
                    crate::aggregate::short_command(&p.cmdline, 60),
                )
            })
            .collect()
    };
    let (before_roots, after_roots) = (roots(before), roots(after));
    let shared = before_roots
        .iter()
        .any(|(program, _)| after_roots.iter().any(|(other, _)| other == program));
    if shared || before_roots.is_empty() || after_roots.is_empty() {
        return None;
    }
    Some(format!(
        "the captures trace different programs (before: `{}`, after: `{}`): paths and \
         processes are compared by frames and command lines, not as two runs of one program",
        before_roots[0].1, after_roots[0].1
    ))
}

/// Compares two windows of one capture: `first` replays `[start, T1)`,
/// `second` `[T1, T2)` and `through_second` `[start, T2)`, with
/// `second_from_ns` = T1 in nanoseconds since the capture start. Growth is
/// what grew inside each window; held bytes are what each path held at the
/// end of each window (from `first` and `through_second`); the later side
/// holds the images alive in `[T1, T2)` only. Images are matched by
/// identity (tgid, start time, image) and named as in `through_second`,
/// whose instance numbers are the capture's.
pub fn diff_windows(
    first: &Report,
    second: &Report,
    through_second: &Report,
    second_from_ns: u64,
) -> Diff {
    let alive: Vec<&ProcessReport> = second
        .processes
        .iter()
        .filter(|p| p.ended_ns().is_none_or(|end| end >= second_from_ns))
        .collect();
    let alive_ids: HashSet<ProcessId> = alive.iter().map(|p| p.id).collect();
    let alive_identities: HashSet<Identity> = alive.iter().map(|p| identity(p)).collect();
    let through_alive: HashSet<ProcessId> = through_second
        .processes
        .iter()
        .filter(|p| alive_identities.contains(&identity(p)))
        .map(|p| p.id)
        .collect();
    let all = |_: &PathReport| true;
    let mut after = sum_paths(second, |p| alive_ids.contains(&p.process), |_| false);
    for (frames, bytes) in sum_paths(
        through_second,
        |_| false,
        |p| through_alive.contains(&p.process),
    ) {
        after.entry(frames).or_default().add(bytes);
    }
    let paths = compare_paths(sum_paths(first, all, all), after);
    let names: HashMap<Identity, String> = through_second
        .processes
        .iter()
        .map(|p| (identity(p), p.name()))
        .collect();
    let name = |p: &ProcessReport| names.get(&identity(p)).cloned().unwrap_or_else(|| p.name());
    let mut after_left: HashMap<Identity, &ProcessReport> =
        alive.iter().map(|p| (identity(p), *p)).collect();
    let mut pairs: Vec<Pair> = in_start_order(&first.processes)
        .into_iter()
        .map(|b| (Some(b), after_left.remove(&identity(b))))
        .collect();
    let mut after_only: Vec<&ProcessReport> = after_left.into_values().collect();
    after_only.sort_by_key(|p| start_order(p));
    pairs.extend(after_only.into_iter().map(|a| (None, Some(a))));
    Diff {
        paths,
        processes: process_diffs(pairs, name),
        live_rss_end_before_bytes: first.totals.live_rss_end_bytes,
        live_rss_end_after_bytes: second.totals.live_rss_end_bytes,
        before_duration_ns: second_from_ns,
        after_duration_ns: through_second
            .meta
            .duration_ns
            .saturating_sub(second_from_ns),
    }
}

/// A process image within one capture: (tgid, start time, image).
type Identity = (u32, u64, u32);

fn identity(p: &ProcessReport) -> Identity {
    (p.tgid, p.start_time_ns, p.image)
}

/// A process image of the earlier report, the later one, or both.
type Pair<'a> = (Option<&'a ProcessReport>, Option<&'a ProcessReport>);

/// Per stack (by frames), the held bytes of the paths `held` keeps plus the
/// grown bytes of those `grown` keeps.
fn sum_paths(
    report: &Report,
    grown: impl Fn(&PathReport) -> bool,
    held: impl Fn(&PathReport) -> bool,
) -> BTreeMap<Vec<Frame>, PathBytes> {
    let mut sums: BTreeMap<Vec<Frame>, PathBytes> = BTreeMap::new();
    for path in &report.paths {
        let bytes = PathBytes {
            held_bytes: if held(path) {
                path.bytes.held_now_bytes()
            } else {
                0
            },
            grown_bytes: if grown(path) {
                path.bytes.grown_bytes()
            } else {
                0
            },
        };
        if bytes != PathBytes::default() {
            let frames = report.frames(path.stack);
            match sums.get_mut(frames) {
                Some(sum) => sum.add(bytes),
                None => {
                    sums.insert(frames.to_vec(), bytes);
                }
            }
        }
    }
    sums
}

/// What a row of [`Diff::python_lines`] is keyed by: a stack without the native frames under
/// its innermost Python (or marker) frame, so one Python line is one row
/// whatever native leaf its bytes came through; a stack of native frames
/// only stays whole.
fn python_line(frames: &[Frame]) -> &[Frame] {
    match frames
        .iter()
        .rposition(|f| !matches!(f, Frame::Native { .. }))
    {
        Some(last) => &frames[..=last],
        None => frames,
    }
}

/// Joins both sides' sums by frames, sorted by held delta, then grown
/// delta, both descending, then frames.
fn compare_paths(
    before: BTreeMap<Vec<Frame>, PathBytes>,
    mut after: BTreeMap<Vec<Frame>, PathBytes>,
) -> Vec<PathDiff> {
    let mut paths: Vec<PathDiff> = before
        .into_iter()
        .map(|(frames, before)| {
            let after = after.remove(&frames).unwrap_or_default();
            PathDiff {
                frames,
                before,
                after,
            }
        })
        .collect();
    paths.extend(after.into_iter().map(|(frames, after)| PathDiff {
        frames,
        before: PathBytes::default(),
        after,
    }));
    paths.sort_by(|a, b| {
        let key = |p: &PathDiff| {
            (
                Reverse(p.held_delta_bytes()),
                Reverse(p.grown_delta_bytes()),
            )
        };
        key(a).cmp(&key(b)).then_with(|| a.frames.cmp(&b.frames))
    });
    paths
}

/// Order in which a report's images started: trace time, then boot time
/// (processes found at attach all enter at 0), then image, then id.
fn start_order(p: &ProcessReport) -> (u64, u64, u32, ProcessId) {
    (p.started_ns, p.start_time_ns, p.image, p.id)
}

fn in_start_order(processes: &[ProcessReport]) -> Vec<&ProcessReport> {
    let mut sorted: Vec<&ProcessReport> = processes.iter().collect();
    sorted.sort_by_key(|p| start_order(p));
    sorted
}

/// What two images of two captures must share to be paired: a command
/// line or program, and whether they are roots.
type MatchKey = (String, bool);

/// What makes two images of two captures the same process: the command
/// line (whitespace collapsed) and the role.
fn command_key(p: &ProcessReport) -> MatchKey {
    let cmdline = p.cmdline.split_whitespace().collect::<Vec<_>>().join(" ");
    (cmdline, p.role.is_root())
}

/// What makes two images of two captures runs of the same program with
/// other arguments: the executable's file name, the file name of its first
/// argument that is not an option (the script or module), and the role.
fn program_key(p: &ProcessReport) -> MatchKey {
    let file_name = |word: &str| word.rsplit('/').next().unwrap_or(word).to_owned();
    let mut words = p.cmdline.split_whitespace();
    let exe = words.next().map(file_name).unwrap_or_default();
    let script = words
        .find(|w| !w.starts_with('-'))
        .map(file_name)
        .unwrap_or_default();
    (format!("{exe} {script}"), p.role.is_root())
}

/// Pairs the images of two captures: first those with equal
/// [`command_key`]s, then the rest with equal [`program_key`]s, each time
/// the n-th to start with the n-th; the rest stand alone.
fn pair_by_command(before: &Report, after: &Report) -> Vec<ProcessDiff> {
    let before_sorted = in_start_order(&before.processes);
    let after_sorted = in_start_order(&after.processes);
    let mut partners: Vec<Option<&ProcessReport>> = vec![None; before_sorted.len()];
    let mut taken: HashSet<ProcessId> = HashSet::new();
    let keys: [fn(&ProcessReport) -> MatchKey; 2] = [command_key, program_key];
    for key in keys {
        let mut groups: HashMap<MatchKey, VecDeque<&ProcessReport>> = HashMap::new();
        for a in after_sorted.iter().filter(|a| !taken.contains(&a.id)) {
            groups.entry(key(a)).or_default().push_back(a);
        }
        for (b, partner) in before_sorted.iter().zip(&mut partners) {
            if partner.is_some() {
                continue;
            }
            if let Some(a) = groups.get_mut(&key(b)).and_then(VecDeque::pop_front) {
                taken.insert(a.id);
                *partner = Some(a);
            }
        }
    }
    let mut pairs: Vec<Pair> = before_sorted
        .into_iter()
        .zip(partners)
        .map(|(b, a)| (Some(b), a))
        .collect();
    pairs.extend(
        after_sorted
            .into_iter()
            .filter(|a| !taken.contains(&a.id))
            .map(|a| (None, Some(a))),
    );
    process_diffs(pairs, ProcessReport::name)
}

/// The rows of `pairs` (earlier images in start order, then later-only
/// ones), named by `name`: matched pairs by RSS delta descending (unknown
/// last), then earlier-only, then later-only, each in the order given.
fn process_diffs(pairs: Vec<Pair>, name: impl Fn(&ProcessReport) -> String) -> Vec<ProcessDiff> {
    let side = |p: &ProcessReport| ProcessSide {
        name: name(p),
        tgid: p.tgid,
        rss_end_bytes: p.rss.map(|rss| rss.end_bytes),
    };
    let mut rows: Vec<(u8, ProcessDiff)> = pairs
        .into_iter()
        .filter_map(|(b, a)| {
            let label = b.or(a)?.label();
            let rank = match (b, a) {
                (Some(_), Some(_)) => 0,
                (Some(_), None) => 1,
                _ => 2,
            };
            let row = ProcessDiff {
                label,
                before: b.map(side),
                after: a.map(side),
            };
            Some((rank, row))
        })
        .collect();
    // Stable: equal keys keep the order of start.
    rows.sort_by_key(|(rank, row)| (*rank, Reverse(row.rss_delta_bytes().unwrap_or(i64::MIN))));
    rows.into_iter().map(|(_, row)| row).collect()
}
