//! The `memtrace diff` command: its arguments checked for shape
//! ([`Plan`]), the captures read and replayed (whole, or as windows), the
//! comparison drawn as a table or a differential flame graph to a file or
//! standard output.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use super::flamegraph::render_flamegraph;
use super::matching::{diff, diff_windows, Diff, Measure};
use super::table::render_table;
use super::{DiffError, Sides};
use crate::aggregate::Report;
use crate::capture;
use crate::cli::{DiffArgs, DiffFormatArg};
use crate::report::Format;

/// Nanoseconds per second, for times shown in seconds.
const NS_PER_S: f64 = 1e9;

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
        diff_format(args)?;
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

/// Writes through `render` to `output` (replacing an existing file only
/// with `force`, see [`crate::output_file::create`]), or to standard output
/// when `None`.
fn write_output(
    output: Option<&Path>,
    force: bool,
    render: impl FnOnce(&mut dyn Write) -> Result<(), DiffError>,
) -> Result<(), DiffError> {
    let (path, result) = match output {
        Some(path) => (
            path.to_owned(),
            crate::output_file::create(path, force)
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

/// `memtrace diff BEFORE AFTER` compares two whole captures: per call stack
/// (summed over processes) the memory held at the end and the growth, and
/// per process (matched by command line, role and order of start) the RSS
/// at the end. `memtrace diff FILE --from T1 --to T2` compares two windows
/// of one capture, times from its start: what each path held at T1 against
/// at T2, what grew in [start, T1) against in [T1, T2), and each process's
/// last RSS reading before T1 against before T2. The captures' warnings go
/// to standard error. Output: the table, or with `--format flamegraph` a
/// differential flame graph of memory held at the end, to `-o OUT` or
/// standard output.
///
/// # Errors
/// A bad combination of arguments ([`Plan::from_args`]), a capture that
/// cannot be read, a window past the end of the capture, or output that
/// cannot be written.
pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let plan = Plan::from_args(args)?;
    let format = diff_format(args)?;
    let (diff, sides) = load(&plan)?;
    // The table says them under its header; other formats on stderr.
    if format != DiffFormatArg::Table {
        for warning in &sides.warnings {
            eprintln!("memtrace: warning: {warning}");
        }
    }
    write_output(args.output.as_deref(), args.force, |out| match format {
        DiffFormatArg::Flamegraph => render_flamegraph(&diff, &sides, Measure::default(), out),
        DiffFormatArg::Json => render_json(&diff, &sides, out),
        DiffFormatArg::Table => {
            render_table(&diff, &sides, args.top, out).map_err(DiffError::from_io(Path::new("-")))
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The format `diff` draws: `--format`, else the name of `-o FILE`
/// (`.svg`, `.json`, `.txt`), else the table.
///
/// # Errors
/// [`DiffError::Format`] for a name that says no format,
/// [`DiffError::UnsupportedFormat`] for a report format `diff` does not
/// write.
fn diff_format(args: &DiffArgs) -> Result<DiffFormatArg, DiffError> {
    if let Some(format) = args.format {
        return Ok(format);
    }
    match crate::report::output_format(None, args.output.as_deref())? {
        Format::Table => Ok(DiffFormatArg::Table),
        Format::Flamegraph => Ok(DiffFormatArg::Flamegraph),
        Format::Json => Ok(DiffFormatArg::Json),
        other => Err(DiffError::UnsupportedFormat {
            format: crate::report::format_name(other).to_owned(),
        }),
    }
}

/// The diff as pretty JSON: both sides' names and lengths, whether growth
/// is compared per second, the summary, the processes, then the paths one
/// per Python line ([`Diff::python_lines`]; frames as in the report's
/// JSON, bytes as integers, not per second).
fn render_json(diff: &Diff, sides: &Sides, out: &mut dyn Write) -> Result<(), DiffError> {
    #[derive(serde::Serialize)]
    struct DiffJson<'a> {
        before: &'a str,
        after: &'a str,
        before_duration_ns: u64,
        after_duration_ns: u64,
        grown_per_second: bool,
        warnings: &'a [String],
        summary: super::matching::Summary,
        processes: &'a [super::ProcessDiff],
        live_rss_end_before_bytes: u64,
        live_rss_end_after_bytes: u64,
        paths: Vec<super::PathDiff>,
    }
    let json = DiffJson {
        before: &sides.before,
        after: &sides.after,
        before_duration_ns: diff.before_duration_ns,
        after_duration_ns: diff.after_duration_ns,
        grown_per_second: diff.grown_per_second(),
        warnings: &sides.warnings,
        summary: diff.summary(),
        processes: &diff.processes,
        live_rss_end_before_bytes: diff.live_rss_end_before_bytes,
        live_rss_end_after_bytes: diff.live_rss_end_after_bytes,
        paths: diff.python_lines(),
    };
    serde_json::to_writer_pretty(&mut *out, &json)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(out))
        .map_err(DiffError::from_io(Path::new("-")))
}

/// Reads the capture at `path`, its warnings to standard error.
fn read(path: &Path) -> Result<capture::Capture, capture::CaptureError> {
    let file = capture::read(path)?;
    for warning in &file.warnings {
        eprintln!("memtrace: warning: `{}`: {warning}", path.display());
    }
    Ok(file)
}

/// Reads and replays the captures of `plan` and compares them; the
/// comparison and the names of its sides.
fn load(plan: &Plan) -> anyhow::Result<(Diff, Sides)> {
    match plan {
        Plan::Captures { before, after } => {
            let before_report = capture::replay(&read(before)?);
            let after_report = capture::replay(&read(after)?);
            let sides = Sides {
                before: capture_name(before, &before_report),
                after: capture_name(after, &after_report),
                warnings: super::matching::programs_differ(&before_report, &after_report)
                    .into_iter()
                    .collect(),
            };
            Ok((diff(&before_report, &after_report), sides))
        }
        Plan::Windows {
            capture: path,
            from,
            to,
        } => {
            let file = read(path)?;
            check_window_end(path, *to, file.covered_ns())?;
            let (from_ns, to_ns) = (duration_ns(*from), duration_ns(*to));
            let sides = Sides {
                before: window_name(path, Duration::ZERO, *from),
                after: window_name(path, *from, *to),
                warnings: Vec::new(),
            };
            let diff = diff_windows(
                &capture::replay_window(&file, None, Some(from_ns)),
                &capture::replay_window(&file, Some(from_ns), Some(to_ns)),
                &capture::replay_window(&file, None, Some(to_ns)),
                from_ns,
            );
            Ok((diff, sides))
        }
    }
}

/// `d` in nanoseconds, saturated.
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::DiffFormatArg as FormatArg;

    fn args(after: Option<&str>, window: Option<(u64, u64)>, format: FormatArg) -> DiffArgs {
        DiffArgs {
            before: PathBuf::from("a.capture"),
            after: after.map(PathBuf::from),
            from: window.map(|(from, _)| Duration::from_secs(from)),
            to: window.map(|(_, to)| Duration::from_secs(to)),
            format: Some(format),
            top: 20,
            output: None,
            force: false,
        }
    }

    #[test]
    fn plans_are_two_captures_or_two_windows_of_one() {
        let plan = Plan::from_args(&args(Some("b.capture"), None, FormatArg::Table)).unwrap();
        assert_eq!(
            plan,
            Plan::Captures {
                before: PathBuf::from("a.capture"),
                after: PathBuf::from("b.capture")
            }
        );
        let plan = Plan::from_args(&args(None, Some((30, 60)), FormatArg::Flamegraph)).unwrap();
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
        let mut html = args(Some("b"), None, FormatArg::Json);
        (html.format, html.output) = (None, Some(PathBuf::from("d.html")));
        assert_eq!(
            diff_format(&html).unwrap_err().to_string(),
            "`memtrace diff` writes `table`, `flamegraph` or `json`, not `html`"
        );
        assert_eq!(
            message(args(None, None, FormatArg::Table)),
            "nothing to compare `a.capture` with: give a second capture, or --from and --to"
        );
        assert_eq!(
            message(args(Some("b"), Some((1, 2)), FormatArg::Table)),
            "give either a second capture (`b`) or --from/--to, not both"
        );
        assert_eq!(
            message(args(None, Some((60, 30)), FormatArg::Table)),
            "--from (1m) must be after the start of the capture and before --to (30s)"
        );
        assert!(Plan::from_args(&args(None, Some((0, 30)), FormatArg::Table)).is_err());
        assert!(Plan::from_args(&args(None, Some((30, 30)), FormatArg::Table)).is_err());
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
        write_output(Some(&file), false, |out| {
            out.write_all(b"hello")
                .map_err(DiffError::from_io(Path::new("-")))
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello");
        let missing = dir.path().join("nope/diff.txt");
        let err = write_output(Some(&missing), false, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("nope/diff.txt"), "{err}");
        // An existing file is kept without --force.
        let err = write_output(Some(&file), false, |_| Ok(())).unwrap_err();
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert!(
            chain.contains("diff.txt") && chain.contains("--force"),
            "{chain}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello");
        let err = write_output(Some(&file), true, |_| {
            Err(DiffError::from_io(Path::new("-"))(
                io::ErrorKind::BrokenPipe.into(),
            ))
        })
        .unwrap_err();
        assert!(err.to_string().contains("diff.txt"), "{err}");
    }
}
