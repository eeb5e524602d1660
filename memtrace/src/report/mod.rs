//! Report step of the data flow (last): renders an aggregated [`Report`] in
//! each [`Format`]: a terminal table ([`table`]), folded stacks ([`folded`]),
//! JSON ([`json`]), an SVG flame graph ([`flamegraph`]), speedscope JSON
//! ([`speedscope`]), gzipped pprof ([`pprof`]) and one self-contained HTML
//! page ([`html`]). Renderers take the diagnosed report ([`Diagnosed`]) and
//! the [`RenderOptions`]; the formats that weigh paths (folded, flame graph,
//! speedscope, pprof) use `options.weight`, bytes held at each process
//! image's high-water mark by default. [`render`] picks the renderer;
//! renderers are generic over the writer, so tests render into a `Vec<u8>`.
//! [`write_files`] puts the folded stacks and the JSON next to each other in
//! an output folder under a run's stem ([`run_stem`]); [`render_per_process`]
//! writes one flame graph per process image; [`format_of_path`] reads the
//! format of a report file from its name.

pub mod allocations;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod flamegraph;
pub mod folded;
#[cfg(test)]
pub(crate) mod golden;
pub mod html;
pub mod json;
mod markup;
mod notes;
pub mod pprof;
pub mod speedscope;
pub mod table;
mod text;
pub(crate) mod verdict;

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::aggregate::{ProcessReport, Report, Weight};
use crate::diagnose::Diagnosed;

/// The formats a report is rendered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The terminal summary ([`table`]).
    Table,
    /// Folded stacks (Brendan Gregg), weight in bytes ([`folded`]).
    Folded,
    /// Everything, as JSON ([`json`]).
    Json,
    /// An SVG flame graph of the paths ([`flamegraph`], inferno).
    Flamegraph,
    /// JSON that speedscope.app opens ([`speedscope`]).
    Speedscope,
    /// Gzipped profile.proto ([`pprof`]: go tool pprof, Grafana Pyroscope).
    Pprof,
    /// One self-contained HTML page ([`html`]).
    Html,
}

/// How a report is drawn (from `--inverted`, `--top` and `--weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Flame graphs drawn as icicles (roots at the top).
    pub inverted: bool,
    /// Growth paths listed in the table and the HTML report.
    pub top: usize,
    /// Which bytes weigh and rank paths.
    pub weight: Weight,
    /// The terminal table prints every finding with its evidence above the
    /// process table, not only the verdict.
    pub verbose: bool,
}

impl Default for RenderOptions {
    /// Upright flame graphs, 10 paths, weighed by bytes held at the
    /// high-water mark (the CLI defaults).
    fn default() -> Self {
        Self {
            inverted: false,
            top: 10,
            weight: Weight::Peak,
            verbose: false,
        }
    }
}

/// Writes `report` in `format` to `out`. The table has no line naming
/// report files (use [`table::render`] for that).
///
/// # Errors
/// [`ReportError::Render`] when `out` fails.
pub fn render(
    report: &Diagnosed,
    format: Format,
    options: &RenderOptions,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let result = match format {
        Format::Table => table::render_summary(report, options, out),
        Format::Folded => folded::render(report, options.weight, out),
        Format::Json => json::render(report, out),
        Format::Flamegraph => flamegraph::render(report, options, None, out),
        Format::Speedscope => speedscope::render(report, options.weight, out),
        Format::Pprof => pprof::render(report, options.weight, out),
        Format::Html => html::render(report, options, out),
    };
    result.map_err(|source| ReportError::Render {
        format: format_name(format),
        source,
    })
}

/// Writes one flame graph per traced process image into `dir` (which must
/// exist): `<stem>-tgid-<tgid>.svg` for the first image of the first
/// process with that tgid, then `<stem>-tgid-<tgid>-2.svg`, `-3`, ... for
/// the next ones in time (by instance, then image: a process on a reused
/// tgid, an image after an execve). Files are written and returned in the
/// order of `Report::processes`; an existing file is replaced only with
/// `force` (`--force`), a symbolic link never (see
/// [`crate::output_file::create`]). `record`/`run` pass their run's stem,
/// `memtrace report` passes [`PER_PROCESS_STEM`]. Only
/// [`Format::Flamegraph`] has a per-process form.
///
/// # Errors
/// [`ReportError::NotPerProcess`] for other formats; [`ReportError::Write`]
/// when a file cannot be written.
pub fn render_per_process(
    report: &Diagnosed,
    format: Format,
    options: &RenderOptions,
    dir: &Path,
    stem: &str,
    force: bool,
) -> Result<Vec<PathBuf>, ReportError> {
    if format != Format::Flamegraph {
        return Err(ReportError::NotPerProcess {
            format: format_name(format),
        });
    }
    let mut written = Vec::with_capacity(report.processes.len());
    for process in &report.processes {
        let path = dir.join(per_process_name(report, process, stem));
        write_one(&path, force, |w| {
            flamegraph::render(report, options, Some(process.id), w)
        })?;
        written.push(path);
    }
    Ok(written)
}

/// `<stem>-tgid-<tgid>.svg`, or `<stem>-tgid-<tgid>-<n>.svg` when `process`
/// is the n-th image with its tgid in time (n >= 2).
fn per_process_name(report: &Report, process: &ProcessReport, stem: &str) -> String {
    let order = |p: &ProcessReport| (p.instance, p.image, p.id);
    let earlier = report
        .processes
        .iter()
        .filter(|p| p.tgid == process.tgid && order(p) < order(process))
        .count();
    match earlier {
        0 => format!("{stem}-tgid-{}.svg", process.tgid),
        n => format!("{stem}-tgid-{}-{}.svg", process.tgid, n + 1),
    }
}

/// The file name stem of `memtrace report --per-process` flame graphs
/// (`flamegraph-tgid-<tgid>.svg`).
pub const PER_PROCESS_STEM: &str = "flamegraph";

/// The `--format` value naming `format` (`table`, `flamegraph`, ...).
pub fn format_name(format: Format) -> &'static str {
    match format {
        Format::Table => "table",
        Format::Folded => "folded",
        Format::Json => "json",
        Format::Flamegraph => "flamegraph",
        Format::Speedscope => "speedscope",
        Format::Pprof => "pprof",
        Format::Html => "html",
    }
}

/// File name ending of each `--format` written at the end of `record`/`run`
/// (after the run's stem); `None` for the formats always written (folded,
/// JSON).
pub fn format_extension(format: Format) -> Option<&'static str> {
    match format {
        Format::Table => Some("txt"),
        Format::Flamegraph => Some("svg"),
        Format::Speedscope => Some("speedscope.json"),
        Format::Pprof => Some("pb.gz"),
        Format::Html => Some("html"),
        Format::Folded | Format::Json => None,
    }
}

/// Most numbered alternatives [`write_files`] tries when a name is taken.
const MAX_NAME_ATTEMPTS: u32 = 100;

/// Errors rendering a report or writing report files.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Rendering into the caller's writer failed.
    #[error("cannot write the `{format}` report")]
    Render {
        /// The format (`--format` value).
        format: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `--per-process` was asked for a format that has no per-process form.
    #[error("format `{format}` has no per-process form (add --format flamegraph)")]
    NotPerProcess {
        /// The format (`--format` value).
        format: &'static str,
    },
    /// A report file could not be created or written.
    #[error("cannot write report file `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A report file's name says no format and none was given.
    #[error("cannot tell the format of `{}` from its name: add --format, or end it in one of {endings}", path.display())]
    UnknownName {
        /// The file.
        path: PathBuf,
        /// The endings memtrace knows.
        endings: String,
    },
    /// Every candidate file name was already taken.
    #[error("no free report file name `{stem}[-N]` in `{}`", dir.display())]
    NamesTaken {
        /// The output folder.
        dir: PathBuf,
        /// The base name tried.
        stem: String,
    },
}

/// Where [`write_files`] put the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenFiles {
    /// Folded stacks (input for inferno or flamegraph.pl).
    pub folded: PathBuf,
    /// The bytes the folded stacks are weighed by.
    pub weight: Weight,
    /// The whole diagnosed report as pretty JSON.
    pub json: PathBuf,
}

/// Writes `<stem>.folded` (weighed by `weight`, the `--weight` of the run)
/// and `<stem>.json` into `dir` (see [`run_stem`]); an existing file is
/// never overwritten. `dir` must exist.
///
/// # Errors
/// [`ReportError::Write`] when a file cannot be created or written.
pub fn write_files(
    report: &Diagnosed,
    weight: Weight,
    dir: &Path,
    stem: &str,
) -> Result<WrittenFiles, ReportError> {
    let files = WrittenFiles {
        folded: dir.join(format!("{stem}.folded")),
        weight,
        json: dir.join(format!("{stem}.json")),
    };
    write_one(&files.folded, false, |w| {
        folded::render(report, files.weight, w)
    })?;
    write_one(&files.json, false, |w| json::render(report, w))?;
    Ok(files)
}

/// The ending of each file a run writes under its stem (capture, folded
/// stacks, JSON): [`run_stem`] picks a stem none of them has in the folder.
pub const RUN_EXTENSIONS: [&str; 3] = ["capture", "folded", "json"];

/// The name shared by the files of one run in `dir`: `memtrace-YYYYMMDD-
/// HHMMSS` (UTC time of the call), or with `-2`, `-3`, ... appended when a
/// file of that name with one of [`RUN_EXTENSIONS`] exists, so earlier runs
/// are never overwritten.
///
/// # Errors
/// [`ReportError::NamesTaken`] when 100 candidate names are all taken.
pub fn run_stem(dir: &Path) -> Result<String, ReportError> {
    free_stem(dir, &timestamp_stem(SystemTime::now()))
}

/// `memtrace-YYYYMMDD-HHMMSS` for `time` in UTC.
fn timestamp_stem(time: SystemTime) -> String {
    // RFC 3339 in UTC: "2026-11-30T07:04:25Z".
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    let digits = |part: &str| {
        part.chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
    };
    let (date, time_of_day) = rfc3339.split_once('T').unwrap_or((&rfc3339, ""));
    format!("memtrace-{}-{}", digits(date), digits(time_of_day))
}

/// The first `stem`, `stem-2`, ... with no file in `dir`.
fn free_stem(dir: &Path, stem: &str) -> Result<String, ReportError> {
    for attempt in 1..=MAX_NAME_ATTEMPTS {
        let name = if attempt == 1 {
            stem.to_owned()
        } else {
            format!("{stem}-{attempt}")
        };
        let taken = RUN_EXTENSIONS
            .iter()
            .any(|ext| dir.join(format!("{name}.{ext}")).exists());
        if !taken {
            return Ok(name);
        }
    }
    Err(ReportError::NamesTaken {
        dir: dir.to_owned(),
        stem: stem.to_owned(),
    })
}

/// The format a report file named `path` is written in, from its ending
/// (see [`FORMAT_EXTENSIONS`]); `None` for any other name.
pub fn format_of_path(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    FORMAT_EXTENSIONS
        .iter()
        .find(|(ending, _)| name.ends_with(ending))
        .map(|&(_, format)| format)
}

/// The format of a report file: `explicit` (`--format`), else the name of
/// `output` (`-o FILE`, [`format_of_path`]), else the table (standard
/// output).
///
/// # Errors
/// [`ReportError::UnknownName`] when `output` ends in no known way and no
/// format is given.
pub fn output_format(
    explicit: Option<Format>,
    output: Option<&Path>,
) -> Result<Format, ReportError> {
    match (explicit, output) {
        (Some(format), _) => Ok(format),
        (None, Some(path)) => format_of_path(path).ok_or_else(|| ReportError::UnknownName {
            path: path.to_owned(),
            endings: FORMAT_EXTENSIONS.map(|e| e.0).join(", "),
        }),
        (None, None) => Ok(Format::Table),
    }
}

/// File name endings and the format each means (py-spy's and memray's
/// `-o` conventions); the longer ending first where one ends another.
pub const FORMAT_EXTENSIONS: [(&str, Format); 9] = [
    (".speedscope.json", Format::Speedscope),
    (".json", Format::Json),
    (".svg", Format::Flamegraph),
    (".html", Format::Html),
    (".htm", Format::Html),
    (".pb.gz", Format::Pprof),
    (".pprof", Format::Pprof),
    (".folded", Format::Folded),
    (".txt", Format::Table),
];

/// The files a run wrote, in the order the terminal report lists them,
/// and a line on how to draw them again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilesWritten {
    /// The files.
    pub files: Vec<WrittenFile>,
    /// Printed under them (e.g. how to draw the capture as a flame graph).
    pub hint: Option<String>,
}

/// One file a run wrote, as the "Files written" section of the terminal
/// report names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenFile {
    /// What it holds (`flame graph`, `capture`, ...).
    pub what: String,
    /// Where it is.
    pub path: PathBuf,
}

/// Creates `path` (replacing an existing file only with `force`, see
/// [`crate::output_file::create`]) and fills it with `render`.
fn write_one(
    path: &Path,
    force: bool,
    render: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), ReportError> {
    let result = crate::output_file::create(path, force).and_then(|file| {
        let mut writer = BufWriter::new(file);
        render(&mut writer)?;
        writer.flush()
    });
    result.map_err(|source| ReportError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::server_diagnosed;

    #[test]
    fn stem_is_the_utc_time() {
        // 2026-11-30T07:04:25Z
        let time = UNIX_EPOCH + Duration::from_secs(1_796_022_265);
        assert_eq!(timestamp_stem(time), "memtrace-20261130-070425");
    }

    #[test]
    fn writes_both_files_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let report = server_diagnosed();
        let first = write_files(&report, Weight::Peak, dir.path(), "memtrace-x").unwrap();
        assert_eq!(first.folded, dir.path().join("memtrace-x.folded"));
        assert_eq!(first.json, dir.path().join("memtrace-x.json"));
        assert_eq!(first.weight, Weight::Peak);
        assert!(write_files(&report, Weight::Peak, dir.path(), "memtrace-x").is_err());
        assert_eq!(free_stem(dir.path(), "memtrace-x").unwrap(), "memtrace-x-2");
        std::fs::write(dir.path().join("memtrace-x-2.capture"), "").unwrap();
        assert_eq!(free_stem(dir.path(), "memtrace-x").unwrap(), "memtrace-x-3");
        let json = std::fs::read_to_string(&first.json).unwrap();
        let back: Diagnosed = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let folded = std::fs::read_to_string(&first.folded).unwrap();
        let mut expected = Vec::new();
        folded::render(&report, Weight::Peak, &mut expected).unwrap();
        assert_eq!(folded.as_bytes(), expected, "{folded}");
        assert_eq!(folded.lines().count(), 2, "{folded}");
    }

    #[test]
    fn the_folded_file_is_weighed_by_bytes_held_at_peak() {
        let dir = tempfile::tempdir().unwrap();
        let report = lifecycle_diagnosed();
        let files = write_files(&report, Weight::Peak, dir.path(), "m").unwrap();
        let folded = std::fs::read_to_string(&files.folded).unwrap();
        let weights: Vec<&str> = folded
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1)
            .collect();
        // handle_job: 50 MiB held at peak (not 40 at end, 120 grown).
        let job = folded.lines().find(|l| l.contains("handle_job")).unwrap();
        assert!(job.ends_with(&format!(" {}", 50 * 1024 * 1024)), "{folded}");
        assert_eq!(weights.len(), 4, "{folded}");
    }

    #[test]
    fn missing_folder_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = write_files(&server_diagnosed(), Weight::Peak, &missing, "m").unwrap_err();
        assert!(matches!(err, ReportError::Write { .. }));
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn the_extension_names_the_format() {
        let of = |name: &str| format_of_path(Path::new(name));
        assert_eq!(of("out/profile.svg"), Some(Format::Flamegraph));
        assert_eq!(of("a.speedscope.json"), Some(Format::Speedscope));
        assert_eq!(of("a.JSON"), Some(Format::Json));
        assert_eq!(of("a.pb.gz"), Some(Format::Pprof));
        assert_eq!(of("report.html"), Some(Format::Html));
        assert_eq!(of("a.txt"), Some(Format::Table));
        assert_eq!(of("a.out"), None);
        assert_eq!(of("svg"), None);
    }

    #[test]
    fn per_process_files_number_the_images_of_a_tgid_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let report = lifecycle_diagnosed();
        let written = render_per_process(
            &report,
            Format::Flamegraph,
            &RenderOptions::default(),
            dir.path(),
            "run",
            false,
        )
        .unwrap();
        let mut names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // In the order of the report's processes (by RSS growth).
        assert_eq!(
            names,
            [
                "run-tgid-202.svg",
                "run-tgid-201.svg",
                "run-tgid-201-2.svg",
                "run-tgid-202-2.svg",
                "run-tgid-200.svg"
            ]
        );
        names.sort();
        let mut on_disk: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        assert_eq!(on_disk, names);
        // The second process on tgid 201 is in its own file, alone.
        let second = std::fs::read_to_string(dir.path().join("run-tgid-201-2.svg")).unwrap();
        assert!(second.contains("python3 -m app (tgid 201#2)"), "{second}");
        assert!(!second.contains("handle_job"), "{second}");
        let first = std::fs::read_to_string(dir.path().join("run-tgid-201.svg")).unwrap();
        assert!(first.contains("handle_job"), "{first}");
        assert!(!first.contains("(tgid 201#2)"), "{first}");
    }

    #[test]
    fn only_flame_graphs_have_a_per_process_form() {
        let dir = tempfile::tempdir().unwrap();
        let err = render_per_process(
            &server_diagnosed(),
            Format::Pprof,
            &RenderOptions::default(),
            dir.path(),
            "run",
            false,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            ReportError::NotPerProcess { format: "pprof" }
        ));
    }
}
