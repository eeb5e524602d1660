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

use super::files::RunFiles;
use super::session::{monotonic_ns, Session};
use crate::{
    agent::windows::{host_name, own_resident_bytes, WindowBuilder},
    aggregate::{ExitStatus, Report, RunMeta, Weight},
    capture,
    cli::{CommonArgs, FormatArg, GateArgs, RenderArgs, ReportArgs, WeightArg},
    diagnose::{self, gate::GATE_EXIT_STATUS, Diagnosed},
    events::RecordReader,
    output_file,
    report::{self, Format, RenderOptions},
    sinks::{Health, Sink},
};

impl Session {
    /// Ends the run: closes the capture, diagnoses, writes the report files
    /// (`files`: folded stacks, JSON, `-o` or each `--format`) and prints
    /// the table, which ends with the files written and the verdict.
    /// Returns `command_status` as the exit code (`memtrace run`: the
    /// command's status, 128 + signal when a signal killed it), else
    /// success.
    pub(super) fn finish(
        mut self,
        reader: &RecordReader,
        common: &CommonArgs,
        files: &RunFiles,
        command_status: Option<ExitStatus>,
        profile_sinks: Vec<Box<dyn Sink>>,
    ) -> Result<ExitCode> {
        let end_ns = monotonic_ns().max(self.start_ns);
        self.stop_samplers();
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
            origin: crate::aggregate::Origin::here(self.attached_unix_ns),
            exit_point_caveats: std::mem::take(&mut self.exit_point_caveats),
            cut_after_ns: None,
        };
        let census = self.census.finish();
        self.recorder.census(&census);
        let stop = self.stop_reason;
        let start_unix_ns = self.attached_unix_ns;
        let (report, capture_error) = self.recorder.finish(end_ns, meta);
        if let Some(err) = capture_error {
            eprintln!(
                "memtrace: warning: {:#}; the capture holds what was flushed before",
                anyhow::Error::from(err)
            );
        }
        let diagnosed = diagnose::diagnose_with_census(report, allocations, census);
        let options = render_options(&common.render);
        let written = files.write(&diagnosed, common, &options);
        send_run_profile(profile_sinks, &diagnosed.report, start_unix_ns);
        if let Some(reason) = stop {
            eprintln!("memtrace: stopped: {}", reason.describe());
        }
        let mut stdout = io::stdout().lock();
        report::table::render(&diagnosed, &options, &written, &mut stdout)
            .context("cannot print the report")?;
        if let Some(code) = gate(&common.gate, &diagnosed) {
            return Ok(code);
        }
        Ok(command_status.map_or(ExitCode::SUCCESS, |s| ExitCode::from(s.shell_status())))
    }
}

/// Sends the whole run as one window to `sinks` (`--otlp`, `--pyroscope`)
/// and waits for them to deliver it (each sink's flush timeout at most);
/// failures are warnings.
fn send_run_profile(mut sinks: Vec<Box<dyn Sink>>, report: &Report, start_unix_ns: u64) {
    if sinks.is_empty() {
        return;
    }
    let health = Health {
        records_read: report.meta.records,
        records_dropped: report.meta.dropped_records,
        own_resident_bytes: own_resident_bytes(),
        ..Health::default()
    };
    let mut windows = WindowBuilder::new(host_name(), start_unix_ns);
    let window = windows.close_run(report, super::fleet::unix_ns(), health);
    for sink in &mut sinks {
        if let Err(err) = sink.send(&window) {
            eprintln!("memtrace: warning: {}: {err:#}", sink.name());
        }
    }
    // Dropping a queued sink waits for its queue to empty.
    drop(sinks);
}

/// The CI gate of `args` on `diagnosed`: when it trips, the one line saying
/// why (standard error, after the report) and [`GATE_EXIT_STATUS`], which
/// wins over `run`'s command status.
fn gate(args: &GateArgs, diagnosed: &Diagnosed) -> Option<ExitCode> {
    let reason = args.gate().check(diagnosed)?;
    eprintln!("memtrace: gate: {reason}: exit status {GATE_EXIT_STATUS}");
    Some(ExitCode::from(GATE_EXIT_STATUS))
}

/// The drawing options of `args` (and, for every frame drawn from now on,
/// `--full-paths`).
pub(super) fn render_options(args: &RenderArgs) -> RenderOptions {
    crate::aggregate::show_full_paths(args.full_paths);
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
    let format = report_format(args.format, args.output.as_deref(), args.render.per_process)?;
    if args.allocations {
        let render = super::allocations::report_renderer(&diagnosed, args, format)?;
        write_output(args, render)?;
    } else if args.render.per_process {
        let dir = args.output.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the folder `{}`", dir.display()))?;
        for path in report::render_per_process(
            &diagnosed,
            format,
            &options,
            &dir,
            report::PER_PROCESS_STEM,
            args.force,
        )? {
            eprintln!("memtrace: wrote {}", path.display());
        }
    } else {
        write_output(args, |out| {
            report::render(&diagnosed, format, &options, out).map_err(Into::into)
        })?;
    }
    Ok(gate(&args.gate, &diagnosed).unwrap_or(ExitCode::SUCCESS))
}

/// The format of `memtrace report`: `--format`, else (without
/// `--per-process`, whose `-o` is a folder of flame graphs) the name of
/// `-o FILE`, else the table.
///
/// # Errors
/// `-o` names no known format.
fn report_format(
    format: Option<FormatArg>,
    output: Option<&Path>,
    per_process: bool,
) -> Result<Format> {
    let explicit = format.map(Format::from);
    if per_process {
        return Ok(explicit.unwrap_or(Format::Flamegraph));
    }
    Ok(report::output_format(explicit, output)?)
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
