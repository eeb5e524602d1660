//! Wires the data flow together for `record` and `run`: load and attach the
//! eBPF programs, add the targets, then loop: drain the ring buffer, resolve
//! stacks, aggregate (and, with `--capture`, write the capture file), sample
//! the kernel's per-process counters, probe new processes for CPython, show
//! progress; on stop, diagnose, write the report files and print the report.

use std::{
    fs::File,
    io::BufWriter,
    path::{Path, PathBuf},
    process::{Child, ExitCode},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use memtrace_common::{
    MemoryEvent, MemoryRecord, ProcessCounters, PyFrame, STACK_NO_PYTHON, STACK_NO_THREAD_STATE,
    STACK_READ_ERROR, STACK_TRUNCATED,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    aggregate::{Aggregator, Frame, MemorySample, ProcessStart, PythonStatus, Role, RunMeta},
    bpf::{Tracer, TracerOptions},
    capture::{CaptureWriter, Header, Recorder, CAPTURE_VERSION},
    cli::{Cli, Command, CommonArgs, Format},
    diagnose,
    events::{Record, RecordReader},
    live::{LiveView, MAX_PATHS_SHOWN},
    process::{
        launch::spawn_held,
        proc::{self, command_line},
        ProcessTree, PythonState,
    },
    python::{self, FrameResolver, Probe},
    report,
    symbolize::NativeSymbolizer,
};

/// How often the kernel's per-process counters are read (the recorder keeps
/// about one read per process per second for the RSS timeline), new
/// processes probed for CPython, and progress shown.
const TICK: Duration = Duration::from_millis(200);
/// How often the ring buffer is drained when the kernel has not woken us.
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// Bytes pending in the ring buffer before the kernel wakes the reader.
const WAKEUP_THRESHOLD_BYTES: u64 = 256 * 1024;
/// How often the capture file is flushed.
const CAPTURE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a process appears (or execs) it is probed for CPython on
/// every drain rather than every tick: an interpreter initialises within
/// milliseconds and a short script may be done growing soon after. A process
/// with no CPython runtime by then counts as not Python (the dynamic loader
/// may not have mapped libpython at the first probes).
const EAGER_PROBE_WINDOW: Duration = Duration::from_secs(1);

/// Runs the parsed command line.
///
/// # Errors
/// Setup failures (privileges, kernel features, bad PID, command that cannot
/// start) with an actionable message; the report is printed whenever tracing
/// started.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        match cli.command {
            Command::Record(args) => record(args.pids, args.common).await,
            Command::Run(args) => run_command(&args.command, args.common).await,
            Command::Report(args) => crate::capture::report_command(&args),
            Command::Diff(args) => crate::diff::run(&args),
        }
    })
}

async fn record(pids: Vec<u32>, common: CommonArgs) -> Result<ExitCode> {
    for &pid in &pids {
        proc::check_exists(pid)?;
    }
    let command = format!("memtrace record --pid {}", join(&pids));
    let (mut session, mut reader) = Session::start(&common, &command)?;
    for &pid in &pids {
        session.add_target(pid, None, Role::Root)?;
        if !common.no_follow_forks {
            let myself = proc::self_and_ancestors();
            for (child, parent) in proc::descendants(pid)? {
                if myself.contains(&child) {
                    continue; // memtrace itself, or what started it
                }
                // A descendant may exit between the listing and now.
                let _ = session.add_target(child, Some(parent), Role::Worker);
            }
        }
    }
    session.trace(&mut reader, &common, None).await?;
    session.finish(&reader, &common)
}

async fn run_command(argv: &[std::ffi::OsString], common: CommonArgs) -> Result<ExitCode> {
    let command = argv
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let (mut session, mut reader) = Session::start(&common, &command)?;
    let held = spawn_held(argv)?;
    // Until its execve the child is a copy of memtrace: its RSS is left
    // unknown (no growth is computed from it), and the kernel side restarts
    // the counters from zero when execve installs the new address space.
    session.add_target_counters(held.pid, None, Role::Root, ProcessCounters::default())?;
    let mut child = held.release()?;
    session
        .trace(&mut reader, &common, Some(&mut child))
        .await?;
    stop_child(&mut child);
    session.finish(&reader, &common)
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" --pid ")
}

/// Ends `memtrace run`'s command if it outlived the trace (--duration, or a
/// signal memtrace got alone): SIGTERM, then SIGKILL after 5 s.
fn stop_child(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Why tracing stopped.
#[derive(Clone, Copy, Debug)]
enum StopReason {
    Duration,
    Signal(&'static str),
    AllExited,
}

/// One tracing session: the loaded programs and every step's state.
struct Session {
    tracer: Tracer,
    tree: ProcessTree,
    /// The aggregator, and the capture writer with `--capture`.
    recorder: Recorder<BufWriter<File>>,
    command: String,
    resolver: FrameResolver,
    symbolizer: NativeSymbolizer,
    started: Instant,
    start_ns: u64,
    sample_interval_bytes: u64,
    stop_reason: Option<StopReason>,
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0)
}

impl Session {
    /// Loads and attaches the kernel side and creates the capture file;
    /// returns the session and the reader of its ring buffer.
    fn start(common: &CommonArgs, command: &str) -> Result<(Self, RecordReader)> {
        check_output_dir(&common.output_dir)?;
        check_per_process(common);
        let options = TracerOptions {
            sample_interval_bytes: common.sample_bytes,
            follow_forks: !common.no_follow_forks,
            wakeup_threshold_bytes: WAKEUP_THRESHOLD_BYTES,
        };
        let mut tracer = Tracer::load(&options)?;
        tracer.attach()?;
        let reader =
            RecordReader::new(tracer.take_records()?).context("cannot watch the ring buffer")?;
        let start_ns = monotonic_ns();
        let writer = match &common.capture {
            Some(path) => Some(create_capture(
                path,
                command,
                start_ns,
                common.sample_bytes,
            )?),
            None => None,
        };
        let session = Self {
            tracer,
            tree: ProcessTree::default(),
            recorder: Recorder::new(Aggregator::new(start_ns), writer),
            command: command.to_owned(),
            resolver: FrameResolver::default(),
            symbolizer: NativeSymbolizer::default(),
            started: Instant::now(),
            start_ns,
            sample_interval_bytes: common.sample_bytes,
            stop_reason: None,
        };
        Ok((session, reader))
    }

    /// Starts tracing a process that already exists (a target or one of its
    /// existing descendants).
    fn add_target(&mut self, tgid: u32, parent: Option<u32>, role: Role) -> Result<()> {
        let counters = proc::initial_counters(tgid, parent.unwrap_or(0))?;
        self.add_target_counters(tgid, parent, role, counters)
    }

    /// [`Self::add_target`] with the kernel-side counters to start from.
    fn add_target_counters(
        &mut self,
        tgid: u32,
        parent: Option<u32>,
        role: Role,
        counters: ProcessCounters,
    ) -> Result<()> {
        self.tracer.trace_process(tgid, counters)?;
        self.tree.add(tgid, parent, role);
        self.recorder.process_started(ProcessStart {
            tgid,
            parent_tgid: parent,
            role,
            cmdline: command_line(tgid),
            ts_ns: monotonic_ns(),
        });
        self.recorder.counters(tgid, monotonic_ns(), &counters);
        self.probe_python(tgid);
        Ok(())
    }

    async fn trace(
        &mut self,
        reader: &mut RecordReader,
        common: &CommonArgs,
        mut child: Option<&mut Child>,
    ) -> Result<()> {
        let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let deadline = common.duration.map(|d| tokio::time::Instant::now() + d);
        let mut drain = tokio::time::interval(DRAIN_INTERVAL);
        let mut live = LiveView::new(common.quiet);
        let mut last_tick = Instant::now();
        let mut last_flush = Instant::now();
        while self.stop_reason.is_none() {
            tokio::select! {
                ready = reader.wait_readable() => ready.context("ring buffer poll failed")?,
                _ = drain.tick() => {}
                _ = sigterm.recv() => self.stop_reason = Some(StopReason::Signal("SIGTERM")),
                _ = sigint.recv() => self.stop_reason = Some(StopReason::Signal("SIGINT")),
                _ = sleep_until(deadline) => self.stop_reason = Some(StopReason::Duration),
            }
            reader.drain(|record| self.handle(record));
            self.probe_new_processes();
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.tick(false);
                let elapsed = self.started.elapsed();
                if live.due(elapsed) {
                    let snapshot = self.recorder.aggregator().live_snapshot(MAX_PATHS_SHOWN);
                    let dropped = self.tracer.dropped_records().unwrap_or(0);
                    live.show(elapsed, reader.records(), dropped, &snapshot);
                }
                if last_flush.elapsed() >= CAPTURE_FLUSH_INTERVAL {
                    last_flush = Instant::now();
                    self.flush_capture();
                }
                reap(&mut child);
                if self.tree.all_exited() {
                    self.stop_reason = Some(StopReason::AllExited);
                }
            }
        }
        reader.drain(|record| self.handle(record));
        live.finish();
        self.tick(true);
        Ok(())
    }

    /// Flushes the capture file; a write error stops the capture (one
    /// warning) while tracing goes on.
    fn flush_capture(&mut self) {
        self.recorder.flush();
        if let Some(err) = self.recorder.take_capture_error() {
            eprintln!(
                "memtrace: warning: {:#}; the capture stops here (it holds what was flushed \
                 until now), tracing goes on",
                anyhow::Error::from(err)
            );
        }
    }

    fn handle(&mut self, record: Record) {
        match record {
            Record::Fork(fork) => {
                self.on_fork(fork.header.tgid, fork.child_tgid, fork.header.ts_ns)
            }
            Record::Exec(exec) => self.on_exec(exec.header.tgid, exec.header.ts_ns),
            Record::Exit(exit) => self.on_exit(exit.header.tgid, exit.header.ts_ns),
            Record::Memory(memory) => self.on_memory(&memory),
        }
    }

    fn on_fork(&mut self, parent: u32, child: u32, ts_ns: u64) {
        self.tree.add(child, Some(parent), Role::Worker);
        self.recorder.process_started(ProcessStart {
            tgid: child,
            parent_tgid: Some(parent),
            role: Role::Worker,
            cmdline: command_line(child),
            ts_ns,
        });
        self.resolver.inherit(child, parent);
        // The kernel side copies the parent's CPython layout at fork, but
        // only if the layout reached the kernel before the fork; the probe
        // may have run between the fork and this record, so write it again.
        let Some((info, status)) = self.tree.get(parent).and_then(|p| match &p.python {
            PythonState::Known(status @ PythonStatus::Python { .. }) => {
                Some((p.py_info?, status.clone()))
            }
            _ => None,
        }) else {
            return;
        };
        if self.tracer.set_python(child, info).is_ok() {
            self.tree.set_py_info(child, info);
            self.set_python_status(child, status);
        }
    }

    fn on_exec(&mut self, tgid: u32, ts_ns: u64) {
        self.tree.exec(tgid);
        self.resolver.forget(tgid);
        self.symbolizer.forget(tgid);
        self.recorder.process_exec(tgid, ts_ns, command_line(tgid));
        // The new program's first RSS reading: its start.
        self.sample_counters_of(tgid, ts_ns);
    }

    /// Feeds one process's kernel counters to the aggregator now.
    fn sample_counters_of(&mut self, tgid: u32, ts_ns: u64) {
        if let Ok(Some(counters)) = self.tracer.counters_of(tgid) {
            self.recorder.counters(tgid, ts_ns, &counters);
        }
    }

    fn on_exit(&mut self, tgid: u32, ts_ns: u64) {
        self.sample_counters_of(tgid, ts_ns);
        // A process that exits while its probes still find no CPython
        // runtime was not Python.
        if self.tree.get(tgid).is_some_and(|p| {
            matches!(
                p.python,
                PythonState::Pending {
                    no_runtime_seen: true,
                    ..
                }
            )
        }) {
            self.set_python_status(tgid, PythonStatus::NotPython);
        }
        self.recorder.process_exited(tgid, ts_ns);
        self.tree.exit(tgid);
        self.resolver.forget(tgid);
        self.symbolizer.forget(tgid);
        let _ = self.tracer.forget_process(tgid);
    }

    fn on_memory(&mut self, record: &MemoryRecord) {
        let Ok(event) = MemoryEvent::try_from(record.event) else {
            return; // decode() already rejected unknown events
        };
        let stack = self.stack(record);
        self.recorder.memory(MemorySample {
            tgid: record.header.tgid,
            ts_ns: record.header.ts_ns,
            event,
            weight_bytes: record.weight_bytes,
            stack,
        });
    }

    /// The record's stack, outermost first: Python frames, then the native
    /// frame; markers say why Python frames are missing.
    fn stack(&mut self, record: &MemoryRecord) -> Vec<Frame> {
        let tgid = record.header.tgid;
        let status = record.stack_status;
        let count = (record.frame_count as usize).min(record.frames.len());
        let mut stack = Vec::with_capacity(count + 2);
        if status & STACK_TRUNCATED != 0 {
            stack.push(unknown("outer frames truncated"));
        }
        if status & STACK_NO_PYTHON != 0 {
            stack.push(unknown(self.no_python_reason(tgid)));
        } else if status & STACK_NO_THREAD_STATE != 0 {
            stack.push(unknown("no Python thread state: native thread"));
        } else if status & STACK_READ_ERROR != 0 && count == 0 {
            stack.push(unknown("Python frames unreadable"));
        }
        let frames: &[PyFrame] = &record.frames[..count];
        for frame in frames.iter().rev() {
            stack.push(match self.resolver.resolve(tgid, frame) {
                Ok(location) => Frame::from(location),
                Err(_) => unknown("unresolved Python frame"),
            });
        }
        if record.native_ip != 0 {
            let symbol = self
                .symbolizer
                .symbolize(tgid, record.native_ip)
                .unwrap_or_else(|| format!("{:#x}", record.native_ip));
            stack.push(Frame::Native { symbol });
        }
        stack
    }

    fn no_python_reason(&self, tgid: u32) -> String {
        match self.tree.get(tgid).map(|p| &p.python) {
            Some(PythonState::Known(status)) => status
                .missing_reason()
                .unwrap_or_else(|| "Python stack unavailable".to_owned()),
            _ => "no Python stack yet (interpreter not found or not initialised)".to_owned(),
        }
    }

    /// Probes processes that appeared or exec'd within the eager window.
    fn probe_new_processes(&mut self) {
        for (tgid, pending_for) in self.tree.pending_python() {
            if pending_for < EAGER_PROBE_WINDOW {
                self.probe_python(tgid);
            }
        }
    }

    /// Periodic work: counters into the timeline (thinned by the recorder,
    /// except for the `last` read at the end of the trace), probes of
    /// processes still pending after the eager window.
    fn tick(&mut self, last: bool) {
        let now_ns = monotonic_ns();
        if let Ok(all) = self.tracer.counters() {
            for (tgid, counters) in &all {
                if self.tree.get(*tgid).is_some_and(|p| !p.exited) {
                    if last {
                        self.recorder.counters(*tgid, now_ns, counters);
                    } else {
                        self.recorder.periodic_counters(*tgid, now_ns, counters);
                    }
                }
            }
        }
        for (tgid, pending_for) in self.tree.pending_python() {
            if pending_for >= EAGER_PROBE_WINDOW {
                self.probe_python(tgid);
            }
        }
    }

    fn probe_python(&mut self, tgid: u32) {
        match python::probe(tgid) {
            Ok(Probe::Python(process)) => {
                if let Err(err) = self.tracer.set_python(tgid, process.info) {
                    let reason = err.to_string();
                    self.set_python_status(tgid, PythonStatus::Unsupported { reason });
                    return;
                }
                self.resolver.register(tgid, &process);
                self.tree.set_py_info(tgid, process.info);
                let version = process.version.to_string();
                self.set_python_status(tgid, PythonStatus::Python { version });
            }
            Ok(Probe::NotPython) => {
                if self.tree.note_no_runtime(tgid) >= EAGER_PROBE_WINDOW {
                    self.set_python_status(tgid, PythonStatus::NotPython);
                }
            }
            Ok(Probe::NotReady) => {}
            Err(err) => {
                if proc::check_exists(tgid).is_ok() {
                    let reason = format!("{err:#}");
                    self.set_python_status(tgid, PythonStatus::Unsupported { reason });
                }
            }
        }
    }

    fn set_python_status(&mut self, tgid: u32, status: PythonStatus) {
        self.recorder.python_status(tgid, status.clone());
        self.tree.set_python(tgid, PythonState::Known(status));
    }

    /// Ends the run: closes the capture, diagnoses, writes the report files
    /// (folded stacks, JSON, and each `--format`) and prints the table.
    fn finish(self, reader: &RecordReader, common: &CommonArgs) -> Result<ExitCode> {
        let end_ns = monotonic_ns().max(self.start_ns);
        let meta = RunMeta {
            command: self.command,
            // From the records' clock, so a replayed capture ends where
            // this report ends.
            duration_ns: end_ns - self.start_ns,
            records: reader.records(),
            dropped_records: self.tracer.dropped_records().unwrap_or(0),
            decode_errors: reader.decode_errors(),
            sample_interval_bytes: self.sample_interval_bytes,
        };
        let stop = self.stop_reason;
        let (mut report, capture_error) = self.recorder.finish(end_ns, meta);
        if let Some(err) = capture_error {
            eprintln!(
                "memtrace: warning: {:#}; the capture holds what was flushed before",
                anyhow::Error::from(err)
            );
        }
        report.diagnosis = diagnose::diagnose(&report);
        // Report files that cannot be written are warnings: the table is
        // printed in any case.
        let written = write_report_files(&report, &common.output_dir);
        if let Some(written) = &written {
            for path in write_format_files(&report, common, &written.folded) {
                eprintln!("memtrace: wrote {}", path.display());
            }
        }
        let mut stdout = std::io::stdout().lock();
        if let Some(reason) = stop {
            eprintln!("memtrace: stopped: {}", describe(reason));
        }
        match &written {
            Some(written) => {
                report::table::render(&report, common.render.top, written, &mut stdout)
            }
            None => report::table::render_summary(&report, common.render.top, &mut stdout),
        }
        .context("cannot print the report")?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Creates the capture file of `--capture` with its header, before any
/// tracing (a path that cannot be written fails here).
fn create_capture(
    path: &Path,
    command: &str,
    start_ns: u64,
    sample_interval_bytes: u64,
) -> Result<CaptureWriter<BufWriter<File>>> {
    let created_unix_s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = Header {
        memtrace_capture: CAPTURE_VERSION,
        created_unix_s,
        command: command.to_owned(),
        start_ns,
        sample_interval_bytes,
    };
    Ok(CaptureWriter::create(path, &header)?)
}

/// File name ending of each `--format` written at the end of `record`/`run`
/// (after the `memtrace-<UTC stamp>` stem of the folded and JSON files);
/// `None` for the formats always written (folded, JSON).
fn format_extension(format: Format) -> Option<&'static str> {
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
/// that cannot be written is a warning on standard error and the others are
/// still written. Returns the files written.
fn write_format_files(report: &report::Report, common: &CommonArgs, folded: &Path) -> Vec<PathBuf> {
    let options = report::RenderOptions {
        inverted: common.render.inverted,
        top: common.render.top,
    };
    let mut written = Vec::new();
    for &format in &common.format {
        match write_format_file(report, format, common.render.per_process, &options, folded) {
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
    report: &report::Report,
    format: Format,
    per_process: bool,
    options: &report::RenderOptions,
    folded: &Path,
) -> Result<Vec<PathBuf>> {
    if format == Format::Flamegraph && per_process {
        let dir = folded.parent().unwrap_or(Path::new("."));
        let stem = folded
            .file_stem()
            .map_or_else(|| "memtrace".into(), |s| s.to_string_lossy());
        return Ok(report::render_per_process(
            report, format, options, dir, &stem,
        )?);
    }
    let Some(extension) = format_extension(format) else {
        return Ok(Vec::new());
    };
    let path = folded.with_extension(extension);
    let file = File::create(&path)
        .with_context(|| format!("cannot create report file `{}`", path.display()))?;
    let mut out = BufWriter::new(file);
    report::render(report, format, options, &mut out)?;
    std::io::Write::flush(&mut out)
        .with_context(|| format!("cannot write report file `{}`", path.display()))?;
    Ok(vec![path])
}

/// Warns, before tracing, about `--per-process` without a flame graph to
/// draw per process.
fn check_per_process(common: &CommonArgs) {
    if common.render.per_process && !common.format.contains(&Format::Flamegraph) {
        eprintln!(
            "memtrace: warning: --per-process only applies to flame graphs and none is \
             asked for (add --format flamegraph)"
        );
    }
}

/// Fails early, before any tracing, if report files cannot be written to
/// `dir`.
fn check_output_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output folder `{}`", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".memtrace-write-check")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write report files to `{}`", dir.display()))?;
    Ok(())
}

/// Writes the report files to `dir`; if that fails at the end of a trace
/// (disk full, folder removed), to the system's temporary folder instead, so
/// the trace is not lost. `None` (after a warning) when both fail.
fn write_report_files(report: &report::Report, dir: &Path) -> Option<report::WrittenFiles> {
    let err = match report::write_files(report, dir) {
        Ok(written) => return Some(written),
        Err(err) => err,
    };
    let fallback = std::env::temp_dir();
    eprintln!(
        "memtrace: warning: {:#}; writing the report files to `{}` instead",
        anyhow::Error::from(err),
        fallback.display()
    );
    match report::write_files(report, &fallback) {
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

fn describe(reason: StopReason) -> String {
    match reason {
        StopReason::Duration => "--duration elapsed".to_owned(),
        StopReason::Signal(name) => format!("{name} received"),
        StopReason::AllExited => "every traced process exited".to_owned(),
    }
}

fn unknown(reason: impl Into<String>) -> Frame {
    Frame::Unknown {
        reason: reason.into(),
    }
}

/// Collects `memtrace run`'s child once it exits, so it does not linger as a
/// zombie (its exit record has been seen by then).
fn reap(child: &mut Option<&mut Child>) {
    if let Some(c) = child.as_deref_mut() {
        let _ = c.try_wait();
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
