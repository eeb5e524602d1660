//! The end of a session and `memtrace report`: the aggregated report is
//! diagnosed, written as files (folded stacks, JSON, each `--format`) and
//! printed; report files that cannot be written are warnings, never a lost
//! report.

use std::{
    io::{self, BufWriter, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context as _, Result};

use super::session::{monotonic_ns, Session};
use crate::{
    aggregate::{ExitStatus, RunMeta, Weight},
    capture,
    cli::{CommonArgs, FormatArg, RenderArgs, ReportArgs, WeightArg},
    diagnose::{self, Diagnosed},
    events::RecordReader,
    output_file,
    report::{self, Format, RenderOptions},
};

impl Session {
    /// Ends the run: closes the capture, diagnoses, writes the report files
    /// (folded stacks, JSON, and each `--format`) and prints the table.
    /// Returns `command_status` as the exit code (`memtrace run`: the
    /// command's status, 128 + signal when a signal killed it), else
    /// success.
    pub(super) fn finish(
        mut self,
        reader: &RecordReader,
        common: &CommonArgs,
        command_status: Option<ExitStatus>,
    ) -> Result<ExitCode> {
        let end_ns = monotonic_ns().max(self.start_ns);
        // The final allocations report, with the live set counted, goes
        // into the capture before its `end` line.
        let allocations = self.allocations_report(true);
        if let Some(allocations) = &allocations {
            self.recorder.allocations(allocations);
        }
        let meta = RunMeta {
            command: self.command,
            // From the records' clock, so a replayed capture ends where
            // this report ends.
            duration_ns: end_ns - self.start_ns,
            records: reader.records(),
            dropped_records: self.tracer.dropped_records().unwrap_or(0),
            decode_errors: reader.decode_errors(),
            sample_interval_bytes: self.sample_interval_bytes,
            held_map_peak_entries: self.held_map_peak.0,
            held_map_peak_bytes: self.held_map_peak.1,
            attach_ns: self.attach_ns,
            attached_unix_ns: self.attached_unix_ns,
            command_held: self.command_held,
            command_status,
            exit_point_caveats: std::mem::take(&mut self.exit_point_caveats),
        };
        let census = self.census.finish();
        self.recorder.census(&census);
        let stop = self.stop_reason;
        let (report, capture_error) = self.recorder.finish(end_ns, meta);
        if let Some(err) = capture_error {
            eprintln!(
                "memtrace: warning: {:#}; the capture holds what was flushed before",
                anyhow::Error::from(err)
            );
        }
        let diagnosed = diagnose::diagnose_with_census(report, allocations, census);
        let options = render_options(&common.render);
        let written = write_report_files(&diagnosed, options.weight, &common.output_dir);
        if let Some(written) = &written {
            for path in write_format_files(&diagnosed, common, &options, &written.folded) {
                eprintln!("memtrace: wrote {}", path.display());
            }
            if let Some(allocations) = &diagnosed.allocations {
                super::allocations::write_allocation_files(
                    allocations,
                    &diagnosed.meta,
                    common,
                    &written.folded,
                );
            }
        }
        if let Some(reason) = stop {
            eprintln!("memtrace: stopped: {}", reason.describe());
        }
        let mut stdout = io::stdout().lock();
        match &written {
            Some(written) => report::table::render(&diagnosed, &options, written, &mut stdout),
            None => report::table::render_summary(&diagnosed, &options, &mut stdout),
        }
        .context("cannot print the report")?;
        if let Some(allocations) = &diagnosed.allocations {
            report::allocations::render_text(
                allocations,
                &diagnosed.report.processes,
                options.top,
                &mut stdout,
            )
            .context("cannot print the report")?;
        }
        Ok(command_status.map_or(ExitCode::SUCCESS, |s| ExitCode::from(s.shell_status())))
    }
}

/// The drawing options of `args`.
pub(super) fn render_options(args: &RenderArgs) -> RenderOptions {
    RenderOptions {
        inverted: args.inverted,
        top: args.top,
        weight: match args.weight {
            WeightArg::Peak => Weight::Peak,
            WeightArg::End => Weight::End,
            WeightArg::Grown => Weight::Grown,
        },
        verbose: args.verbose,
    }
}

/// `memtrace report FILE`: reads the capture (its warnings to stderr),
/// replays and diagnoses it, and renders it in `--format` to `-o OUT` or
/// standard output; with `--per-process`, one flame graph per process into
/// the folder `-o` (default: the current folder).
///
/// # Errors
/// The capture cannot be read, or the output cannot be written.
pub(super) fn report_command(args: &ReportArgs) -> Result<ExitCode> {
    let capture = capture::read(&args.capture)?;
    for warning in &capture.warnings {
        eprintln!("memtrace: warning: {warning}");
    }
    let diagnosed = diagnose::diagnose_with_census(
        capture::replay(&capture),
        capture.allocations().cloned(),
        capture.census(),
    );
    let options = render_options(&args.render);
    if args.allocations {
        let render = super::allocations::report_renderer(&diagnosed, args)?;
        write_output(args, render)?;
    } else if args.render.per_process {
        let dir = args.output.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the folder `{}`", dir.display()))?;
        for path in report::render_per_process(
            &diagnosed,
            args.format.into(),
            &options,
            &dir,
            report::PER_PROCESS_STEM,
            args.force,
        )? {
            eprintln!("memtrace: wrote {}", path.display());
        }
    } else {
        write_output(args, |out| {
            render_with_allocations(&diagnosed, args.format.into(), &options, out)
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes what `render` writes to `-o OUT` or standard output.
fn write_output(
    args: &ReportArgs,
    render: impl FnOnce(&mut dyn io::Write) -> Result<()>,
) -> Result<()> {
    match &args.output {
        Some(path) => {
            let file = output_file::create(path, args.force)
                .with_context(|| format!("cannot create `{}`", path.display()))?;
            let mut out = BufWriter::new(file);
            render(&mut out)?;
            out.flush()
                .with_context(|| format!("cannot write `{}`", path.display()))
        }
        None => {
            let mut out = io::stdout().lock();
            render(&mut out)?;
            out.flush().context("cannot write to standard output")
        }
    }
}

/// [`report::render`], and for the table the allocations section of a
/// capture recorded with `--allocations` after it (the JSON has it as its
/// `allocations` field).
fn render_with_allocations(
    diagnosed: &Diagnosed,
    format: Format,
    options: &RenderOptions,
    out: &mut dyn io::Write,
) -> Result<()> {
    report::render(diagnosed, format, options, out)?;
    if let (Format::Table, Some(allocations)) = (format, &diagnosed.allocations) {
        report::allocations::render_text(
            allocations,
            &diagnosed.report.processes,
            options.top,
            out,
        )
        .context("cannot print the allocations section")?;
    }
    Ok(())
}

/// File name ending of each `--format` written at the end of `record`/`run`
/// (after the `memtrace-<UTC stamp>` stem of the folded and JSON files);
/// `None` for the formats always written (folded, JSON).
pub(super) fn format_extension(format: Format) -> Option<&'static str> {
    match format {
        Format::Table => Some("txt"),
        Format::Flamegraph => Some("svg"),
        Format::Speedscope => Some("speedscope.json"),
        Format::Pprof => Some("pb.gz"),
        Format::Html => Some("html"),
        Format::Folded | Format::Json => None,
    }
}

/// Writes each `--format` of `common` next to the folded stacks file
/// `folded` (same stem, [`format_extension`]); with `--per-process`, the
/// flame graph as one file per process (`<stem>-tgid-<tgid>.svg`). A format
/// that cannot be written (an existing file without `--force` included) is
/// a warning on standard error and the others are still written. Returns
/// the files written.
fn write_format_files(
    diagnosed: &Diagnosed,
    common: &CommonArgs,
    options: &RenderOptions,
    folded: &Path,
) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for format in common.format.iter().map(|&arg| Format::from(arg)) {
        match write_format_file(diagnosed, format, common, options, folded) {
            Ok(paths) => written.extend(paths),
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
    let Some(extension) = format_extension(format) else {
        return Ok(Vec::new());
    };
    let path = folded.with_extension(extension);
    let file = output_file::create(&path, common.force)
        .with_context(|| format!("cannot create report file `{}`", path.display()))?;
    let mut out = BufWriter::new(file);
    report::render(diagnosed, format, options, &mut out)?;
    out.flush()
        .with_context(|| format!("cannot write report file `{}`", path.display()))?;
    Ok(vec![path])
}

/// Warns, before tracing, about `--per-process` without a flame graph to
/// draw per process.
pub(super) fn check_per_process(common: &CommonArgs) {
    if common.render.per_process && !common.format.contains(&FormatArg::Flamegraph) {
        eprintln!(
            "memtrace: warning: --per-process only applies to flame graphs and none is \
             asked for (add --format flamegraph)"
        );
    }
}

/// Fails early, before any tracing, if report files cannot be written to
/// `dir`.
pub(super) fn check_output_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output folder `{}`", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".memtrace-write-check")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write report files to `{}`", dir.display()))?;
    Ok(())
}

/// Writes the report files to `dir` (folded stacks weighed by `weight`); if
/// that fails at the end of a trace
/// (disk full, folder removed), to the system's temporary folder instead, so
/// the trace is not lost. `None` (after a warning) when both fail.
fn write_report_files(
    diagnosed: &Diagnosed,
    weight: Weight,
    dir: &Path,
) -> Option<report::WrittenFiles> {
    let err = match report::write_files(diagnosed, weight, dir) {
        Ok(written) => return Some(written),
        Err(err) => err,
    };
    let fallback = std::env::temp_dir();
    eprintln!(
        "memtrace: warning: {:#}; writing the report files to `{}` instead",
        anyhow::Error::from(err),
        fallback.display()
    );
    match report::write_files(diagnosed, weight, &fallback) {
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
