//! Where `record`/`run` put their files (app step, before tracing and at its
//! end): one stem per run in `--output-dir` for the capture, the folded
//! stacks and the JSON (every recording writes its capture, so it can be
//! rendered again), the `-o` report file in the format of `--format` or of
//! its name, the `--format` files beside the folded stacks, the list the
//! terminal report prints above the verdict, and the pruning of the default
//! folder to its newest runs.

use std::{
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context as _, Result};

use crate::{
    cli::{CommonArgs, FormatArg, DEFAULT_OUTPUT_DIR},
    diagnose::Diagnosed,
    output_file,
    report::{self, FilesWritten, Format, RenderOptions, WrittenFile},
};

/// Runs whose files the default folder keeps; older ones are removed at the
/// end of each run.
pub(super) const KEPT_RUNS: usize = 20;

/// The files of one `record`/`run`, chosen before tracing.
#[derive(Debug)]
pub(super) struct RunFiles {
    /// `--output-dir`.
    dir: PathBuf,
    /// `memtrace-<UTC time>[-N]`, shared by the run's files in `dir`.
    stem: String,
    /// The capture: `--capture`, else `<dir>/<stem>.capture`.
    capture: PathBuf,
    /// `-o FILE` and its format.
    output: Option<(PathBuf, Format)>,
}

impl RunFiles {
    /// Checks `--output-dir` and `-o`, picks the run's stem, sets
    /// `common.capture` to the capture's path (so the session always writes
    /// one), and warns about `--per-process` without a flame graph.
    ///
    /// # Errors
    /// The folder cannot be written; `-o` names no known format, exists
    /// (without `--force`), or comes with several `--format`s or
    /// `--per-process`.
    pub(super) fn prepare(common: &mut CommonArgs) -> Result<Self> {
        check_output_dir(&common.output_dir)?;
        let output = match &common.output {
            Some(path) => Some((path.clone(), output_format(path, common)?)),
            None => None,
        };
        let dir = common.output_dir.clone();
        let stem = report::run_stem(&dir)?;
        let capture = common
            .capture
            .get_or_insert_with(|| dir.join(format!("{stem}.capture")))
            .clone();
        check_per_process(common);
        Ok(Self {
            dir,
            stem,
            capture,
            output,
        })
    }

    /// Writes every report file of the run (see [`report::write_files`],
    /// the `-o` file or else each `--format`, the allocation files) and
    /// returns them with the capture, for the terminal report; a file that
    /// cannot be written is a warning. Then prunes the default folder.
    pub(super) fn write(
        &self,
        diagnosed: &Diagnosed,
        common: &CommonArgs,
        options: &RenderOptions,
    ) -> FilesWritten {
        let mut files = Vec::new();
        if let Some(written) = write_report_files(diagnosed, options.weight, &self.dir, &self.stem)
        {
            let what = format!("folded stacks (bytes {})", written.weight.describe());
            files.push(file(what, written.folded.clone()));
            files.push(file("JSON report".into(), written.json.clone()));
            if self.output.is_none() {
                files.extend(write_format_files(
                    diagnosed,
                    common,
                    options,
                    &written.folded,
                ));
            }
            if let Some(allocations) = &diagnosed.allocations {
                let paths = super::allocations::write_allocation_files(
                    allocations,
                    &diagnosed.meta,
                    common,
                    &written.folded,
                );
                files.extend(paths.into_iter().map(|p| file("allocations".into(), p)));
            }
        }
        if let Some((path, format)) = &self.output {
            match write_report(diagnosed, *format, options, path, common.force) {
                Ok(()) => files.push(file(format_what(*format).into(), path.clone())),
                Err(err) => eprintln!("memtrace: warning: {err:#}; `-o` is not written"),
            }
        }
        files.push(file("capture".into(), self.capture.clone()));
        if common.output_dir == Path::new(DEFAULT_OUTPUT_DIR) {
            prune(&self.dir, KEPT_RUNS);
        }
        FilesWritten {
            files,
            hint: Some(format!(
                "draw it again: memtrace report {} --format flamegraph -o flame.svg \
                 (or html, speedscope, pprof)",
                self.capture.display()
            )),
        }
    }
}

/// Warns, before tracing, about `--per-process` without a flame graph to
/// draw per process.
fn check_per_process(common: &CommonArgs) {
    if common.render.per_process && !common.format.contains(&FormatArg::Flamegraph) {
        eprintln!(
            "memtrace: warning: --per-process only applies to flame graphs and none is \
             asked for (add --format flamegraph)"
        );
    }
}

/// Fails early, before any tracing, if report files cannot be written to
/// `dir`.
fn check_output_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output folder `{}`", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".memtrace-write-check")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write report files to `{}`", dir.display()))?;
    Ok(())
}

/// The format of `-o path`: the one `--format`, else the name's ending.
fn output_format(path: &Path, common: &CommonArgs) -> Result<Format> {
    if common.format.len() > 1 {
        anyhow::bail!(
            "-o writes one file: give it at most one --format (without -o, each --format is \
             written to --output-dir)"
        );
    }
    if common.render.per_process {
        anyhow::bail!(
            "--per-process writes one flame graph per process into --output-dir: drop -o"
        );
    }
    if path.symlink_metadata().is_ok() && !common.force {
        anyhow::bail!(
            "cannot write `{}`: it already exists: pass --force to replace it, or choose \
             another name",
            path.display()
        );
    }
    match common.format.first() {
        Some(&arg) => Ok(arg.into()),
        None => format_from_name(path),
    }
}

/// The format a report file's name says ([`report::format_of_path`]).
///
/// # Errors
/// The name ends in no known way (the error lists the endings).
fn format_from_name(path: &Path) -> Result<Format> {
    Ok(report::output_format(None, Some(path))?)
}

/// What a report file of `format` holds, for the "Files written" list.
fn format_what(format: Format) -> &'static str {
    match format {
        Format::Table => "report",
        Format::Folded => "folded stacks",
        Format::Json => "JSON report",
        Format::Flamegraph => "flame graph",
        Format::Speedscope => "speedscope",
        Format::Pprof => "pprof",
        Format::Html => "HTML report",
    }
}

fn file(what: String, path: PathBuf) -> WrittenFile {
    WrittenFile { what, path }
}

/// Renders `format` into a new file `path` (replaced only with `force`).
fn write_report(
    diagnosed: &Diagnosed,
    format: Format,
    options: &RenderOptions,
    path: &Path,
    force: bool,
) -> Result<()> {
    let created = output_file::create(path, force)
        .with_context(|| format!("cannot create report file `{}`", path.display()))?;
    let mut out = BufWriter::new(created);
    report::render(diagnosed, format, options, &mut out)?;
    out.flush()
        .with_context(|| format!("cannot write report file `{}`", path.display()))
}

/// Writes each `--format` of `common` next to the folded stacks file
/// `folded` (same stem, [`report::format_extension`]); with `--per-process`, the
/// flame graph as one file per process (`<stem>-tgid-<tgid>.svg`). A format
/// that cannot be written (an existing file without `--force` included) is
/// a warning on standard error and the others are still written. Returns
/// the files written.
fn write_format_files(
    diagnosed: &Diagnosed,
    common: &CommonArgs,
    options: &RenderOptions,
    folded: &Path,
) -> Vec<WrittenFile> {
    let mut written = Vec::new();
    for format in common.format.iter().map(|&arg| Format::from(arg)) {
        match write_format_file(diagnosed, format, common, options, folded) {
            Ok(paths) => {
                let what = format_what(format);
                written.extend(paths.into_iter().map(|p| file(what.into(), p)));
            }
            Err(err) => eprintln!(
                "memtrace: warning: {err:#}; the `{}` report is not written",
                report::format_name(format)
            ),
        }
    }
    written
}

/// Writes `format` next to `folded` (see [`write_format_files`]); nothing
/// for the formats always written.
fn write_format_file(
    diagnosed: &Diagnosed,
    format: Format,
    common: &CommonArgs,
    options: &RenderOptions,
    folded: &Path,
) -> Result<Vec<PathBuf>> {
    if format == Format::Flamegraph && common.render.per_process {
        let dir = folded.parent().unwrap_or(Path::new("."));
        let stem = folded
            .file_stem()
            .map_or_else(|| "memtrace".into(), |s| s.to_string_lossy());
        return Ok(report::render_per_process(
            diagnosed,
            format,
            options,
            dir,
            &stem,
            common.force,
        )?);
    }
    let Some(extension) = report::format_extension(format) else {
        return Ok(Vec::new());
    };
    let path = folded.with_extension(extension);
    write_report(diagnosed, format, options, &path, common.force)?;
    Ok(vec![path])
}

/// Writes the folded stacks and JSON to `dir` under `stem`; if that fails
/// at the end of a trace (disk full, folder removed), to the system's
/// temporary folder instead, so the trace is not lost. `None` (after a
/// warning) when both fail.
fn write_report_files(
    diagnosed: &Diagnosed,
    weight: crate::aggregate::Weight,
    dir: &Path,
    stem: &str,
) -> Option<report::WrittenFiles> {
    let err = match report::write_files(diagnosed, weight, dir, stem) {
        Ok(written) => return Some(written),
        Err(err) => err,
    };
    let fallback = std::env::temp_dir();
    eprintln!(
        "memtrace: warning: {:#}; writing the report files to `{}` instead",
        anyhow::Error::from(err),
        fallback.display()
    );
    match report::write_files(diagnosed, weight, &fallback, stem) {
        Ok(written) => Some(written),
        Err(err) => {
            eprintln!(
                "memtrace: warning: {:#}; no report file is written (the report follows)",
                anyhow::Error::from(err)
            );
            None
        }
    }
}

/// The run stem a file name in the output folder begins with
/// (`memtrace-YYYYMMDD-HHMMSS`, with its `-N` when it has one); `None` for
/// any other file.
fn run_stem_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("memtrace-")?;
    let bytes = rest.as_bytes();
    let stamp = bytes.len() >= 15
        && bytes[..8].iter().all(u8::is_ascii_digit)
        && bytes[8] == b'-'
        && bytes[9..15].iter().all(u8::is_ascii_digit);
    if !stamp {
        return None;
    }
    let mut end = "memtrace-".len() + 15;
    let tail = &name[end..];
    if let Some(number) = tail.strip_prefix('-') {
        let digits = number.bytes().take_while(u8::is_ascii_digit).count();
        let after = number.as_bytes().get(digits);
        if digits > 0 && matches!(after, Some(b'.' | b'-')) {
            end += 1 + digits;
        }
    }
    matches!(name.as_bytes().get(end), Some(b'.' | b'-')).then(|| &name[..end])
}

/// Removes the files of all but the `keep` newest runs in `dir` (newest by
/// the latest modification of a run's files); files not named after a run
/// stay. Failures are ignored: pruning never costs a report.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut runs: std::collections::HashMap<String, (SystemTime, Vec<PathBuf>)> =
        std::collections::HashMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = run_stem_of(&name) else {
            continue;
        };
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let run = runs
            .entry(stem.to_owned())
            .or_insert((SystemTime::UNIX_EPOCH, Vec::new()));
        run.0 = run.0.max(modified);
        run.1.push(entry.path());
    }
    let mut runs: Vec<(SystemTime, Vec<PathBuf>)> = runs.into_values().collect();
    runs.sort_by_key(|run| std::cmp::Reverse(run.0));
    for (_, paths) in runs.into_iter().skip(keep) {
        for path in paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn run_stems_are_read_from_every_file_of_a_run() {
        assert_eq!(
            run_stem_of("memtrace-20261203-061500.capture"),
            Some("memtrace-20261203-061500")
        );
        assert_eq!(
            run_stem_of("memtrace-20261203-061500-12.json"),
            Some("memtrace-20261203-061500-12")
        );
        assert_eq!(
            run_stem_of("memtrace-20261203-061500-tgid-7.svg"),
            Some("memtrace-20261203-061500")
        );
        assert_eq!(
            run_stem_of("memtrace-20261203-061500.allocations.folded"),
            Some("memtrace-20261203-061500")
        );
        assert_eq!(run_stem_of("memtrace-notes.txt"), None);
        assert_eq!(run_stem_of("memtrace-20261203-061500"), None);
        assert_eq!(run_stem_of("profile.svg"), None);
    }

    #[test]
    fn pruning_keeps_the_newest_runs_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let base = SystemTime::now() - Duration::from_secs(3600);
        for run in 0..5u64 {
            for ext in ["capture", "json"] {
                let path = dir
                    .path()
                    .join(format!("memtrace-20261203-06150{run}.{ext}"));
                let created = std::fs::File::create(&path).unwrap();
                created
                    .set_modified(base + Duration::from_secs(run * 60))
                    .unwrap();
            }
        }
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        prune(dir.path(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "memtrace-20261203-061503.capture",
                "memtrace-20261203-061503.json",
                "memtrace-20261203-061504.capture",
                "memtrace-20261203-061504.json",
                "notes.txt"
            ]
        );
    }

    #[test]
    fn an_unknown_name_is_an_error_listing_the_endings() {
        let err = format_from_name(Path::new("profile.out")).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("`profile.out`") && text.contains(".svg"),
            "{text}"
        );
        assert_eq!(
            format_from_name(Path::new("p.svg")).unwrap(),
            Format::Flamegraph
        );
    }
}
