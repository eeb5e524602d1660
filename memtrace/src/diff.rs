//! `memtrace diff`, beside the report step of the data flow: two reports in
//! (two captures replayed, or two time windows of one capture), one [`Diff`]
//! out, drawn as a table or a differential flame graph.
//!
//! The comparison itself ([`diff`]) is pure: it matches growth paths by their
//! frames (stack ids are per capture, so they cannot be compared) summed
//! over every process, and processes by command line (same tgid first), so
//! two runs of the same program compare even though their tgids differ.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use inferno::flamegraph::color::{BasicPalette, Palette};

use crate::aggregate::{Frame, ProcessReport, Report, Role};
use crate::capture;
use crate::cli::{DiffArgs, Format};
use crate::report::folded::sanitize;
use crate::report::table::frame_lines;
use crate::units::{format_bytes, format_signed_bytes};

/// Most growth paths the table lists; the rest are counted.
const MAX_PATHS_SHOWN: usize = 20;

/// Nanoseconds per second, for times shown in seconds.
const NS_PER_S: f64 = 1e9;

/// Errors of `memtrace diff` other than those of reading a capture.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// `--format` names a format `diff` cannot draw.
    #[error("`memtrace diff` draws `table` or `flamegraph`, not `{format}`")]
    UnsupportedFormat {
        /// The format asked for, as typed.
        format: String,
    },
    /// Neither a second capture nor `--from`/`--to` was given.
    #[error("nothing to compare `{}` with: give a second capture, or --from and --to", before.display())]
    NothingToCompare {
        /// The only capture given.
        before: PathBuf,
    },
    /// A second capture and `--from`/`--to` were both given.
    #[error("give either a second capture (`{}`) or --from/--to, not both", after.display())]
    CapturesAndWindows {
        /// The second capture.
        after: PathBuf,
    },
    /// The times of `--from`/`--to` do not make two windows.
    #[error("--from ({from}) must be after the start of the capture and before --to ({to})")]
    WindowOrder {
        /// `--from`, as humantime text.
        from: String,
        /// `--to`, as humantime text.
        to: String,
    },
    /// `--to` is past the end of the capture.
    #[error("--to ({to}) is beyond the end of `{}`, which covers {covered}", capture.display())]
    WindowBeyondEnd {
        /// The capture.
        capture: PathBuf,
        /// `--to`, as humantime text.
        to: String,
        /// How long the capture covers, as humantime text.
        covered: String,
    },
    /// The later report has no sampled growth, so the differential flame
    /// graph (widths are the later report's bytes) would be empty.
    #[error(
        "no growth was sampled with a stack in the later report: the differential flame graph \
         would be empty (the table lists what grew less)"
    )]
    NothingToDraw,
    /// The output could not be written.
    #[error("cannot write `{}`", path.display())]
    Write {
        /// The output file, or `-` for standard output.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// One call stack's sampled resident growth in both reports, summed over
/// every process it ran in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathDiff {
    /// The call stack, outermost frame first (the native frame last).
    pub frames: Vec<Frame>,
    /// Sampled growth in the earlier report, in bytes (0 when absent there).
    pub before_bytes: u64,
    /// Sampled growth in the later report, in bytes (0 when absent there).
    pub after_bytes: u64,
}

impl PathDiff {
    /// `after_bytes - before_bytes`, saturated to the `i64` range.
    pub fn delta_bytes(&self) -> i64 {
        signed_delta(self.before_bytes, self.after_bytes)
    }
}

/// One side of a [`ProcessDiff`]: the process in one report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSide {
    /// Its tgid in that report.
    pub tgid: u32,
    /// Its last RSS reading, in bytes; `None` when no RSS was read.
    pub rss_end_bytes: Option<u64>,
}

/// One process matched across the two reports by command line (the same
/// tgid first, then in order of role and start), or found in one only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessDiff {
    /// Short name (see [`ProcessReport::label`]).
    pub label: String,
    /// The process in the earlier report.
    pub before: Option<ProcessSide>,
    /// The process in the later report.
    pub after: Option<ProcessSide>,
}

impl ProcessDiff {
    /// RSS end after minus before, in bytes; `None` unless both are known.
    pub fn rss_delta_bytes(&self) -> Option<i64> {
        let before = self.before?.rss_end_bytes?;
        let after = self.after?.rss_end_bytes?;
        Some(signed_delta(before, after))
    }
}

/// What changed between two reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// Every stack with sampled growth in either report, sorted by
    /// [`PathDiff::delta_bytes`] descending, ties by frames.
    pub paths: Vec<PathDiff>,
    /// Every process of either report: matched pairs by RSS delta
    /// descending, then processes of the earlier report only, then of the
    /// later one only; ties by label.
    pub processes: Vec<ProcessDiff>,
    /// RSS of the processes alive at the end of the earlier report, summed,
    /// in bytes.
    pub live_rss_end_before_bytes: u64,
    /// The same for the later report.
    pub live_rss_end_after_bytes: u64,
}

/// `after - before` as a signed byte count, saturated.
fn signed_delta(before: u64, after: u64) -> i64 {
    let signed = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    signed(after).saturating_sub(signed(before))
}

/// Compares two reports: growth per stack (by frames, summed over
/// processes) and RSS per process (matched by command line).
pub fn diff(before: &Report, after: &Report) -> Diff {
    let mut by_frames: BTreeMap<&[Frame], (u64, u64)> = BTreeMap::new();
    for (report, is_after) in [(before, false), (after, true)] {
        for path in report.paths.iter().filter(|p| p.bytes.growth_bytes > 0) {
            let sums = by_frames.entry(report.frames(path.stack)).or_default();
            let slot = if is_after { &mut sums.1 } else { &mut sums.0 };
            *slot = slot.saturating_add(path.bytes.growth_bytes);
        }
    }
    let mut paths: Vec<PathDiff> = by_frames
        .into_iter()
        .map(|(frames, (before_bytes, after_bytes))| PathDiff {
            frames: frames.to_vec(),
            before_bytes,
            after_bytes,
        })
        .collect();
    // Stable sort: ties stay in frame order.
    paths.sort_by_key(|p| Reverse(p.delta_bytes()));
    Diff {
        paths,
        processes: match_processes(&before.processes, &after.processes),
        live_rss_end_before_bytes: before.totals.live_rss_end_bytes,
        live_rss_end_after_bytes: after.totals.live_rss_end_bytes,
    }
}

/// Pairs processes with equal labels: equal tgids first, then the rest in
/// order of (role, start, tgid); unpaired ones stand alone.
fn match_processes(before: &[ProcessReport], after: &[ProcessReport]) -> Vec<ProcessDiff> {
    let side = |p: &ProcessReport| ProcessSide {
        tgid: p.tgid,
        rss_end_bytes: p.rss.map(|rss| rss.end_bytes),
    };
    let mut after_left: Vec<&ProcessReport> = after.iter().collect();
    after_left.sort_by_key(|p| start_order(p));
    let mut before_sorted: Vec<&ProcessReport> = before.iter().collect();
    before_sorted.sort_by_key(|p| start_order(p));
    let mut pairs = Vec::new();
    let mut before_left = Vec::new();
    // Same label and tgid: the same process recorded twice.
    for b in before_sorted {
        match after_left
            .iter()
            .position(|a| a.tgid == b.tgid && a.label() == b.label())
        {
            Some(i) => pairs.push((b, after_left.remove(i))),
            None => before_left.push(b),
        }
    }
    let mut before_only = Vec::new();
    for b in before_left {
        match after_left.iter().position(|a| a.label() == b.label()) {
            Some(i) => pairs.push((b, after_left.remove(i))),
            None => before_only.push(b),
        }
    }
    let mut matched: Vec<ProcessDiff> = pairs
        .into_iter()
        .map(|(b, a)| ProcessDiff {
            label: b.label(),
            before: Some(side(b)),
            after: Some(side(a)),
        })
        .collect();
    matched.sort_by(|x, y| {
        let key = |d: &ProcessDiff| Reverse(d.rss_delta_bytes().unwrap_or(i64::MIN));
        key(x).cmp(&key(y)).then_with(|| x.label.cmp(&y.label))
    });
    let alone = |p: &ProcessReport, is_after: bool| ProcessDiff {
        label: p.label(),
        before: (!is_after).then(|| side(p)),
        after: is_after.then(|| side(p)),
    };
    matched.extend(before_only.into_iter().map(|p| alone(p, false)));
    matched.extend(after_left.into_iter().map(|p| alone(p, true)));
    matched
}

/// Order in which processes of one label are paired: roots first, then by
/// start time, then tgid.
fn start_order(p: &ProcessReport) -> (bool, u64, u32) {
    (p.role != Role::Root, p.started_ns, p.tgid)
}

/// What the two sides of a diff are, for titles: e.g. "`before.capture`"
/// or "[0 s, 30 s) of `service.capture`".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sides {
    /// The earlier report.
    pub before: String,
    /// The later report.
    pub after: String,
}

/// Writes `diff` as a terminal table: a header naming both sides, the
/// processes (RSS at the end of each side and the delta, matched pairs
/// first), the live RSS totals, then at most 20 growth paths by increase,
/// each with its growth before, after and the delta, and its frames
/// innermost first (Python frames, then the native frames under them).
///
/// # Errors
/// Any error of `out`.
pub fn render_table(diff: &Diff, sides: &Sides, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "memtrace diff")?;
    writeln!(out, "  before: {}", sides.before)?;
    writeln!(out, "  after:  {}", sides.after)?;
    process_table(diff, out)?;
    path_table(diff, out)
}

fn process_table(diff: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "Processes (RSS at the end)")?;
    writeln!(
        out,
        "{:>8} {:>10}  {:>8} {:>10}  {:>11}  COMMAND",
        "TGID", "BEFORE", "TGID", "AFTER", "DELTA"
    )?;
    for p in &diff.processes {
        let (before_tgid, before_rss) = side_columns(p.before);
        let (after_tgid, after_rss) = side_columns(p.after);
        let delta = p
            .rss_delta_bytes()
            .map_or_else(|| "-".to_owned(), format_signed_bytes);
        writeln!(
            out,
            "{before_tgid:>8} {before_rss:>10}  {after_tgid:>8} {after_rss:>10}  {delta:>11}  {}",
            p.label
        )?;
    }
    writeln!(
        out,
        "Total RSS of the live processes at the end: {} → {} ({})",
        format_bytes(diff.live_rss_end_before_bytes),
        format_bytes(diff.live_rss_end_after_bytes),
        format_signed_bytes(signed_delta(
            diff.live_rss_end_before_bytes,
            diff.live_rss_end_after_bytes
        )),
    )
}

/// The tgid and RSS columns of one side, `-` where absent.
fn side_columns(side: Option<ProcessSide>) -> (String, String) {
    let dash = || "-".to_owned();
    side.map_or_else(
        || (dash(), dash()),
        |s| {
            (
                s.tgid.to_string(),
                s.rss_end_bytes.map_or_else(dash, format_bytes),
            )
        },
    )
}

fn path_table(diff: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "Growth paths by increase (sampled resident anonymous growth summed over processes; \
         innermost frame first)"
    )?;
    if diff.paths.is_empty() {
        return writeln!(
            out,
            "  none: no growth was sampled with a stack on either side"
        );
    }
    writeln!(
        out,
        "{:>4} {:>10}  {:>10}  {:>11}",
        "", "BEFORE", "AFTER", "DELTA"
    )?;
    for (rank, path) in diff.paths.iter().take(MAX_PATHS_SHOWN).enumerate() {
        writeln!(
            out,
            "{:>3}. {:>10}  {:>10}  {:>11}",
            rank + 1,
            format_bytes(path.before_bytes),
            format_bytes(path.after_bytes),
            format_signed_bytes(path.delta_bytes()),
        )?;
        frame_lines(&path.frames, out)?;
    }
    if diff.paths.len() > MAX_PATHS_SHOWN {
        writeln!(
            out,
            "  … {} more paths with a smaller increase",
            diff.paths.len() - MAX_PATHS_SHOWN
        )?;
    }
    Ok(())
}

/// Writes `diff` as a differential flame graph (SVG, inferno): frame widths
/// are the later side's sampled growth in bytes, red where a stack grew
/// more than on the earlier side, blue where it grew less (Brendan Gregg's
/// differential flame graphs). Stacks that grew only on the earlier side
/// have no width; the table lists them.
///
/// # Errors
/// [`DiffError::NothingToDraw`] when the later side sampled no growth;
/// [`DiffError::Write`] (path `-`) for an error of `out` or inferno.
pub fn render_flamegraph(diff: &Diff, sides: &Sides, out: &mut dyn Write) -> Result<(), DiffError> {
    if diff.paths.iter().all(|p| p.after_bytes == 0) {
        return Err(DiffError::NothingToDraw);
    }
    let write_error = |source| DiffError::Write {
        path: PathBuf::from("-"),
        source,
    };
    let before = folded(diff, |p| p.before_bytes);
    let after = folded(diff, |p| p.after_bytes);
    let mut differential = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        before.as_bytes(),
        after.as_bytes(),
        &mut differential,
    )
    .map_err(write_error)?;
    let mut options = inferno::flamegraph::Options::default();
    options.title = "memtrace diff: growth paths".to_owned();
    options.subtitle = Some(format!(
        "{} → {}; width: bytes after, red: grew more, blue: grew less",
        sides.before, sides.after
    ));
    options.count_name = "bytes".to_owned();
    options.colors = Palette::Basic(BasicPalette::Mem);
    options.deterministic = true;
    inferno::flamegraph::from_reader(&mut options, differential.as_slice(), out)
        .map_err(write_error)
}

/// Folded stacks (`outer;...;inner <bytes>`, one line per stack with
/// `bytes(path) > 0`) of one side of `diff`. `;` and line breaks inside
/// frame names become `:` and spaces, as in the folded report.
fn folded(diff: &Diff, bytes: impl Fn(&PathDiff) -> u64) -> String {
    let mut text = String::new();
    for path in diff.paths.iter().filter(|p| bytes(p) > 0) {
        let frames: Vec<String> = path
            .frames
            .iter()
            .map(|f| sanitize(&f.to_string()))
            .collect();
        let line = if frames.is_empty() {
            "[empty stack]".to_owned()
        } else {
            frames.join(";")
        };
        text.push_str(&format!("{line} {}\n", bytes(path)));
    }
    text
}

/// What `memtrace diff` was asked to compare, checked for shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `memtrace diff BEFORE AFTER`: the whole of two captures.
    Captures {
        /// The earlier capture.
        before: PathBuf,
        /// The later capture.
        after: PathBuf,
    },
    /// `memtrace diff FILE --from T1 --to T2`: the window [start, T1) of
    /// FILE against the window [T1, T2), times from the start of the capture.
    Windows {
        /// The capture.
        capture: PathBuf,
        /// T1.
        from: Duration,
        /// T2.
        to: Duration,
    },
}

impl Plan {
    /// Checks the shape of `args`: the format, and either two captures or
    /// one with `0 < --from < --to`.
    ///
    /// # Errors
    /// [`DiffError::UnsupportedFormat`], [`DiffError::NothingToCompare`],
    /// [`DiffError::CapturesAndWindows`] or [`DiffError::WindowOrder`].
    pub fn from_args(args: &DiffArgs) -> Result<Self, DiffError> {
        if !matches!(args.format, Format::Table | Format::Flamegraph) {
            return Err(DiffError::UnsupportedFormat {
                format: crate::report::format_name(args.format).to_owned(),
            });
        }
        match (&args.after, args.from.zip(args.to)) {
            (Some(after), None) => Ok(Self::Captures {
                before: args.before.clone(),
                after: after.clone(),
            }),
            (Some(after), Some(_)) => Err(DiffError::CapturesAndWindows {
                after: after.clone(),
            }),
            (None, Some((from, to))) if !from.is_zero() && from < to => Ok(Self::Windows {
                capture: args.before.clone(),
                from,
                to,
            }),
            (None, Some((from, to))) => Err(DiffError::WindowOrder {
                from: humantime::format_duration(from).to_string(),
                to: humantime::format_duration(to).to_string(),
            }),
            (None, None) => Err(DiffError::NothingToCompare {
                before: args.before.clone(),
            }),
        }
    }
}

/// Checks that a window ending at `to` fits in a capture of `capture` that
/// covers `covered_ns` nanoseconds from its start.
///
/// # Errors
/// [`DiffError::WindowBeyondEnd`] when `to` is later than the covered time.
fn check_window_end(capture: &Path, to: Duration, covered_ns: u64) -> Result<(), DiffError> {
    let covered = Duration::from_nanos(covered_ns);
    if to <= covered {
        return Ok(());
    }
    Err(DiffError::WindowBeyondEnd {
        capture: capture.to_owned(),
        to: humantime::format_duration(to).to_string(),
        covered: format!("{:.1} s", covered_ns as f64 / NS_PER_S),
    })
}

/// A window `[from, to)` of `capture`, for titles.
fn window_name(capture: &Path, from: Duration, to: Duration) -> String {
    format!(
        "[{}, {}) of `{}`",
        humantime::format_duration(from),
        humantime::format_duration(to),
        capture.display()
    )
}

/// A whole capture, for titles: its path and what it traced.
fn capture_name(capture: &Path, report: &Report) -> String {
    format!(
        "`{}` (`{}`, {:.1} s)",
        capture.display(),
        report.meta.command,
        report.meta.duration_ns as f64 / NS_PER_S
    )
}

/// Writes through `render` to `output`, or to standard output when `None`.
fn write_output(
    output: Option<&Path>,
    render: impl FnOnce(&mut dyn Write) -> Result<(), DiffError>,
) -> Result<(), DiffError> {
    let (path, result) = match output {
        Some(path) => (
            path.to_owned(),
            File::create(path)
                .map_err(DiffError::from_io(path))
                .and_then(|file| {
                    let mut writer = BufWriter::new(file);
                    render(&mut writer)?;
                    writer.flush().map_err(DiffError::from_io(path))
                }),
        ),
        None => {
            let stdout = io::stdout();
            let mut writer = stdout.lock();
            let result = render(&mut writer)
                .and_then(|()| writer.flush().map_err(DiffError::from_io(Path::new("-"))));
            (PathBuf::from("-"), result)
        }
    };
    // Name the real output in write errors from the renderers.
    result.map_err(|err| match err {
        DiffError::Write { source, .. } => DiffError::Write { path, source },
        other => other,
    })
}

impl DiffError {
    /// Wraps an I/O error on `path`.
    fn from_io(path: &Path) -> impl FnOnce(io::Error) -> Self + '_ {
        move |source| Self::Write {
            path: path.to_owned(),
            source,
        }
    }
}

/// `memtrace diff BEFORE AFTER` compares the sampled growth per call stack
/// (summed over processes) and the RSS at the end per process of two whole
/// captures. `memtrace diff FILE --from T1 --to T2` compares two windows of
/// one capture: what grew in [start, T1) against what grew in [T1, T2),
/// times from the start of the capture; the process RSS compared is the
/// last reading before T1 against the last before T2. Output: the table, or
/// with `--format flamegraph` a differential flame graph, to `-o OUT` or
/// standard output.
///
/// # Errors
/// A bad combination of arguments ([`Plan::from_args`]), a capture that
/// cannot be read, a window past the end of the capture, or output that
/// cannot be written.
pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let plan = Plan::from_args(args)?;
    let (before, after, sides) = load(&plan)?;
    let diff = diff(&before, &after);
    write_output(args.output.as_deref(), |out| match args.format {
        Format::Flamegraph => render_flamegraph(&diff, &sides, out),
        _ => render_table(&diff, &sides, out).map_err(DiffError::from_io(Path::new("-"))),
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Reads and replays the captures of `plan`: the earlier report, the later
/// one, and their names.
fn load(plan: &Plan) -> anyhow::Result<(Report, Report, Sides)> {
    match plan {
        Plan::Captures { before, after } => {
            let before_report = capture::replay(&capture::read(before)?);
            let after_report = capture::replay(&capture::read(after)?);
            let sides = Sides {
                before: capture_name(before, &before_report),
                after: capture_name(after, &after_report),
            };
            Ok((before_report, after_report, sides))
        }
        Plan::Windows {
            capture: path,
            from,
            to,
        } => {
            let file = capture::read(path)?;
            check_window_end(path, *to, file.covered_ns())?;
            let (from_ns, to_ns) = (duration_ns(*from), duration_ns(*to));
            let sides = Sides {
                before: window_name(path, Duration::ZERO, *from),
                after: window_name(path, *from, *to),
            };
            Ok((
                capture::replay_window(&file, None, Some(from_ns)),
                capture::replay_window(&file, Some(from_ns), Some(to_ns)),
                sides,
            ))
        }
    }
}

/// `d` in nanoseconds, saturated.
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Flame graph SVG readers shared with the integration tests.
#[cfg(test)]
#[path = "../../tests/common/svg.rs"]
mod test_svg;

#[cfg(test)]
mod tests {
    use memtrace_common::MemoryEvent;

    use super::test_svg::{parse_svg, titles};
    use super::*;
    use crate::aggregate::test_support::{
        leak_stack, meta, native, parse_stack, py, rss, sample, start, MIB,
    };
    use crate::aggregate::{Aggregator, ProcessStart};

    /// A run of `python3 app.py`: master `master` (flat 20 MiB) and worker
    /// `worker` ending at `worker_rss` MiB; `paths` are (worker?, stack,
    /// MiB of growth).
    fn run(master: u32, worker: u32, worker_rss: u64, paths: &[(bool, Vec<Frame>, u64)]) -> Report {
        let mut agg = Aggregator::new(0);
        for (tgid, parent, role) in [
            (master, None, Role::Root),
            (worker, Some(master), Role::Worker),
        ] {
            agg.process_started(ProcessStart {
                cmdline: "python3 app.py".to_owned(),
                ..start(tgid, parent, role, 10)
            });
        }
        agg.counters(master, 100, &rss(20 * MIB, 0));
        agg.counters(worker, 100, &rss(worker_rss * MIB, 0));
        for (in_worker, stack, mib) in paths {
            let tgid = if *in_worker { worker } else { master };
            agg.memory(sample(tgid, MemoryEvent::AnonGrowth, mib * MIB, stack));
        }
        agg.finish(1_000, meta())
    }

    fn other_stack() -> Vec<Frame> {
        vec![
            py("<module>", "app.py", 1),
            py("render", "app/html.py", 3),
            native("malloc"),
        ]
    }

    /// Before: leak 10 MiB (worker), parse 8 MiB (master + worker). After,
    /// with other tgids and other stack ids: leak 30 MiB, parse 2 MiB, a new
    /// `render` path 5 MiB.
    fn before_after() -> (Report, Report) {
        let before = run(
            100,
            101,
            40,
            &[
                (true, leak_stack(), 10),
                (false, parse_stack("app/io.py"), 4),
                (true, parse_stack("app/io.py"), 4),
            ],
        );
        let after = run(
            200,
            201,
            70,
            &[
                (true, other_stack(), 5),
                (true, parse_stack("app/io.py"), 2),
                (true, leak_stack(), 30),
            ],
        );
        (before, after)
    }

    #[test]
    fn paths_match_by_frames_summed_over_processes_sorted_by_increase() {
        let (before, after) = before_after();
        let diff = diff(&before, &after);
        let got: Vec<(&[Frame], u64, u64, i64)> = diff
            .paths
            .iter()
            .map(|p| {
                (
                    p.frames.as_slice(),
                    p.before_bytes,
                    p.after_bytes,
                    p.delta_bytes(),
                )
            })
            .collect();
        let (leak, render, parse) = (leak_stack(), other_stack(), parse_stack("app/io.py"));
        let mib = |n: i64| n * 1024 * 1024;
        assert_eq!(
            got,
            vec![
                (leak.as_slice(), 10 * MIB, 30 * MIB, mib(20)),
                (render.as_slice(), 0, 5 * MIB, mib(5)),
                (parse.as_slice(), 8 * MIB, 2 * MIB, mib(-6)),
            ]
        );
    }

    #[test]
    fn processes_match_by_label_same_tgid_first_with_rss_deltas() {
        let (before, after) = before_after();
        let d = diff(&before, &after);
        let side = |tgid, mib| {
            Some(ProcessSide {
                tgid,
                rss_end_bytes: Some(mib * MIB),
            })
        };
        assert_eq!(d.processes.len(), 2);
        // Different tgids: paired root with root, worker with worker.
        assert_eq!(
            (d.processes[0].before, d.processes[0].after),
            (side(101, 40), side(201, 70))
        );
        assert_eq!(d.processes[0].rss_delta_bytes(), Some(30 * 1024 * 1024));
        assert_eq!(
            (d.processes[1].before, d.processes[1].after),
            (side(100, 20), side(200, 20))
        );
        assert_eq!(
            (d.live_rss_end_before_bytes, d.live_rss_end_after_bytes),
            (60 * MIB, 90 * MIB)
        );

        // The same process recorded twice keeps its tgid even out of start order;
        // a process found once stands alone.
        let again = run(101, 100, 50, &[]);
        let mut extra = run(300, 301, 10, &[]);
        extra.processes[0].cmdline = "redis-server".to_owned();
        let mut after = again.clone();
        after.processes.push(extra.processes[0].clone());
        let d = diff(&before, &after);
        let pairs: Vec<(Option<u32>, Option<u32>)> = d
            .processes
            .iter()
            .map(|p| (p.before.map(|s| s.tgid), p.after.map(|s| s.tgid)))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (Some(100), Some(100)),
                (Some(101), Some(101)),
                (None, Some(extra.processes[0].tgid))
            ]
        );
        assert_eq!(d.processes[2].label, "redis-server");
        assert_eq!(d.processes[2].rss_delta_bytes(), None);
    }

    fn sides() -> Sides {
        Sides {
            before: "`a.capture`".to_owned(),
            after: "`b.capture`".to_owned(),
        }
    }

    #[test]
    fn table_lists_processes_then_paths_with_before_after_delta_and_frames() {
        let (before, after) = before_after();
        let mut out = Vec::new();
        render_table(&diff(&before, &after), &sides(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected_processes = "    TGID     BEFORE      TGID      AFTER        DELTA  COMMAND\n\
             \x20    101   40.0 MiB       201   70.0 MiB    +30.0 MiB  python3 app.py\n\
             \x20    100   20.0 MiB       200   20.0 MiB          0 B  python3 app.py\n\
             Total RSS of the live processes at the end: 60.0 MiB → 90.0 MiB (+30.0 MiB)\n";
        assert!(
            text.starts_with("memtrace diff\n  before: `a.capture`\n  after:  `b.capture`\n"),
            "{text}"
        );
        assert!(text.contains(expected_processes), "{text}");
        let expected_paths = "         BEFORE       AFTER        DELTA\n\
             \x20 1.   10.0 MiB    30.0 MiB    +20.0 MiB\n\
             \x20       append (app/cache.py:42)\n\
             \x20       handle (app/views.py:10)\n\
             \x20       <module> (server.py:1)\n\
             \x20       native: PyList_Append\n\
             \x20 2.        0 B     5.0 MiB     +5.0 MiB\n\
             \x20       render (app/html.py:3)\n";
        assert!(text.contains(expected_paths), "{text}");
        assert!(
            text.contains("  3.    8.0 MiB     2.0 MiB     -6.0 MiB\n"),
            "{text}"
        );
    }

    #[test]
    fn empty_diffs_say_so_and_draw_no_flame_graph() {
        let empty = run(1, 2, 10, &[]);
        let d = diff(&empty, &empty);
        let mut out = Vec::new();
        render_table(&d, &sides(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("  none: no growth was sampled with a stack on either side"),
            "{text}"
        );
        let err = render_flamegraph(&d, &sides(), &mut Vec::new()).unwrap_err();
        assert!(matches!(err, DiffError::NothingToDraw), "{err}");
    }

    #[test]
    fn folded_sides_hold_each_stack_once_with_its_bytes() {
        let (before, after) = before_after();
        let d = diff(&before, &after);
        let after_text = folded(&d, |p| p.after_bytes);
        assert_eq!(after_text.lines().count(), 3);
        assert!(after_text.contains(&format!(
            "<module> (server.py:1);handle (app/views.py:10);append (app/cache.py:42);PyList_Append {}\n",
            30 * MIB
        )), "{after_text}");
        let before_text = folded(&d, |p| p.before_bytes);
        assert_eq!(before_text.lines().count(), 2, "{before_text}");
        assert_eq!(sanitize("a;b\nc"), "a:b c");
    }

    #[test]
    fn differential_flame_graph_is_svg_with_bytes_and_both_sides_named() {
        let (before, after) = before_after();
        let mut out = Vec::new();
        render_flamegraph(&diff(&before, &after), &sides(), &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let doc = parse_svg(&svg);
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let titles = titles(&doc);
        // inferno's differential tooltips: `name (N bytes, share; +delta%)`,
        // the delta on the leaf frame.
        let leaf = titles
            .iter()
            .find(|t| t.starts_with("PyList_Append ("))
            .unwrap();
        assert!(
            leaf.contains("31,457,280 bytes") && leaf.contains("; +"),
            "{leaf}"
        );
        assert!(svg.contains("`a.capture` → `b.capture`"), "{svg}");
    }

    #[test]
    fn growth_only_before_draws_nothing() {
        let (before, _) = before_after();
        let none = run(1, 2, 10, &[]);
        let mut out = Vec::new();
        let err = render_flamegraph(&diff(&before, &none), &sides(), &mut out).unwrap_err();
        assert!(matches!(err, DiffError::NothingToDraw), "{err}");
    }

    fn args(after: Option<&str>, window: Option<(u64, u64)>, format: Format) -> DiffArgs {
        DiffArgs {
            before: PathBuf::from("a.capture"),
            after: after.map(PathBuf::from),
            from: window.map(|(from, _)| Duration::from_secs(from)),
            to: window.map(|(_, to)| Duration::from_secs(to)),
            format,
            output: None,
        }
    }

    #[test]
    fn plans_are_two_captures_or_two_windows_of_one() {
        let plan = Plan::from_args(&args(Some("b.capture"), None, Format::Table)).unwrap();
        assert_eq!(
            plan,
            Plan::Captures {
                before: PathBuf::from("a.capture"),
                after: PathBuf::from("b.capture")
            }
        );
        let plan = Plan::from_args(&args(None, Some((30, 60)), Format::Flamegraph)).unwrap();
        assert_eq!(
            plan,
            Plan::Windows {
                capture: PathBuf::from("a.capture"),
                from: Duration::from_secs(30),
                to: Duration::from_secs(60)
            }
        );
    }

    #[test]
    fn bad_plans_are_clear_errors() {
        let message = |a: DiffArgs| Plan::from_args(&a).unwrap_err().to_string();
        assert_eq!(
            message(args(Some("b"), None, Format::Folded)),
            "`memtrace diff` draws `table` or `flamegraph`, not `folded`"
        );
        assert_eq!(
            message(args(None, None, Format::Table)),
            "nothing to compare `a.capture` with: give a second capture, or --from and --to"
        );
        assert_eq!(
            message(args(Some("b"), Some((1, 2)), Format::Table)),
            "give either a second capture (`b`) or --from/--to, not both"
        );
        assert_eq!(
            message(args(None, Some((60, 30)), Format::Table)),
            "--from (1m) must be after the start of the capture and before --to (30s)"
        );
        assert!(Plan::from_args(&args(None, Some((0, 30)), Format::Table)).is_err());
        assert!(Plan::from_args(&args(None, Some((30, 30)), Format::Table)).is_err());
    }

    #[test]
    fn windows_must_end_within_the_capture() {
        let path = Path::new("a.capture");
        let ten_s = 10_000_000_000;
        check_window_end(path, Duration::from_secs(10), ten_s).unwrap();
        let err = check_window_end(path, Duration::from_secs(11), ten_s).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--to (11s) is beyond the end of `a.capture`, which covers 10.0 s"
        );
        assert_eq!(
            window_name(path, Duration::ZERO, Duration::from_secs(90)),
            "[0s, 1m 30s) of `a.capture`"
        );
    }

    #[test]
    fn output_goes_to_the_file_and_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("diff.txt");
        write_output(Some(&file), |out| {
            out.write_all(b"hello")
                .map_err(DiffError::from_io(Path::new("-")))
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello");
        let missing = dir.path().join("nope/diff.txt");
        let err = write_output(Some(&missing), |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("nope/diff.txt"), "{err}");
        let err = write_output(Some(&file), |_| {
            Err(DiffError::from_io(Path::new("-"))(
                io::ErrorKind::BrokenPipe.into(),
            ))
        })
        .unwrap_err();
        assert!(err.to_string().contains("diff.txt"), "{err}");
    }
}
