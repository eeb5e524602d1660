//! One tracing session of `record`/`run`: the loaded programs and every
//! step's state, the targets it starts from, and the loop that drains the
//! ring buffer, reads the kernel's counters and shows progress until
//! `--duration`, a signal, or the exit of every traced process.

use std::{
    fs::File,
    io::BufWriter,
    path::Path,
    process::Child,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use memtrace_common::ProcessCounters;
use tokio::signal::unix::{signal, SignalKind};

/// The session's clock, for the steps that extend it.
pub(super) use super::clock::monotonic_ns;

use crate::{
    aggregate::{Aggregator, ExitStatus, ProcessId, ProcessStart, Role, RunMeta},
    allocations::{AllocationTracker, AllocationsReport},
    bpf::{Tracer, TracerOptions},
    capture::{CaptureWriter, Header, Recorder, CAPTURE_VERSION, HELD_MAP_MAX_ENTRIES},
    cli::CommonArgs,
    events::RecordReader,
    live::{LiveView, MAX_PATHS_SHOWN},
    process::{
        maps::MappingNames,
        proc::{self, command_line},
        sharing::SharingReader,
        ProcessTree,
    },
    stacks::StackAssembler,
};

/// What `--allocations --alloc-hooks uprobes` costs the traced processes,
/// said when it starts: `cargo xtask bench --peers` measured about 2 us
/// added per allocator call with its free on the 2-core VM
/// (docs/allocations.md).
const UPROBES_COST: &str = "allocator mode with uprobes: every allocator call of the traced \
     processes now enters the kernel (about 2 us each, with its free; allocation-heavy code runs \
     many times slower): keep the window short, or trace one worker, not the whole service";

/// What `--allocations` with the sampler costs, said when it starts
/// (docs/allocations.md).
const SAMPLER_COST: &str = "allocator mode with the in-process sampler: memtrace's sampler \
     library is preloaded into the command and wraps CPython's allocators and libc malloc; \
     allocation-heavy code ran 1.0-2.0x slower in the bench (memray: 1.4-4.1x)";

/// What `record --pid --allocations` with the sampler does to the targets,
/// said when it starts (docs/allocations.md).
const REMOTE_SAMPLER_COST: &str = "allocator mode with the in-process sampler: each CPython \
     3.14+ target runs a two-line script memtrace hands it through CPython's remote debugging \
     (PEP 768), which loads memtrace's sampler library with ctypes and wraps its allocators \
     (libc malloc of native code is not seen); at the end they only forward. Allocation-heavy \
     code ran 1.0-2.0x slower under the sampler in the bench (memray: 1.4-4.1x)";

/// How often the kernel's per-process counters are read (the recorder keeps
/// about one read per process per second for the RSS timeline, with PSS and
/// USS), new processes probed for CPython, and progress shown.
pub(super) const TICK: Duration = Duration::from_millis(200);
/// How often a long drain stops to probe new processes for CPython.
const PROBE_DURING_DRAIN: Duration = Duration::from_millis(5);
/// How often the ring buffer is drained when the kernel has not woken us.
pub(super) const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// Bytes pending in the ring buffer before the kernel wakes the reader.
const WAKEUP_THRESHOLD_BYTES: u64 = 256 * 1024;
/// How often the capture file is flushed (and held-at-peak values sent).
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Why tracing stopped.
#[derive(Clone, Copy, Debug)]
pub(super) enum StopReason {
    Duration,
    Signal(&'static str),
    AllExited,
}

impl StopReason {
    /// What the user is told.
    pub(super) fn describe(self) -> String {
        match self {
            Self::Duration => "--duration elapsed".to_owned(),
            Self::Signal(name) => format!("{name} received"),
            Self::AllExited => "every traced process exited".to_owned(),
        }
    }
}

/// One tracing session: the loaded programs and every step's state.
pub(super) struct Session {
    pub(super) tracer: Tracer,
    pub(super) tree: ProcessTree,
    /// The aggregator, the held-page map, and the capture writer with
    /// `--capture`.
    pub(super) recorder: Recorder<BufWriter<File>>,
    pub(super) command: String,
    /// Code objects, symbols, unwind tables and pending native stacks, to
    /// assemble each sampled record's stack with.
    pub(super) stacks: StackAssembler,
    pub(super) mappings: MappingNames,
    /// Paced PSS/USS reads.
    pub(super) sharing: SharingReader,
    /// `memtrace run`'s command until its execve: traced by the kernel side,
    /// entered in the report only when it runs the command.
    pub(super) launched: Option<u32>,
    /// Processes missing from the kernel's map at the last tick whose exit
    /// record has not come (it may still be in the ring buffer).
    pub(super) missing: Vec<u32>,
    /// Most entries and bytes the held-page map had at a flush.
    pub(super) held_map_peak: (u64, u64),
    started: Instant,
    /// When memtrace began to load the programs.
    load_started: Instant,
    /// How long attaching took (see [`Session::attached`]), ns.
    pub(super) attach_ns: u64,
    /// When every target was traced, Unix time in ns.
    pub(super) attached_unix_ns: u64,
    /// `memtrace run`: the command was held until attached.
    pub(super) command_held: bool,
    /// What the missing exit-point symbols of the probed binaries cost,
    /// one line per binary (for the report's warnings).
    pub(super) exit_point_caveats: Vec<String>,
    pub(super) start_ns: u64,
    pub(super) sample_interval_bytes: u64,
    pub(super) stop_reason: Option<StopReason>,
    /// `--allocations`: the allocator-mode aggregation.
    pub(super) allocations: Option<AllocationTracker>,
    /// `--allocations`: the CPython whose allocator API is hooked (its
    /// binary, whether it is free-threaded), per process (a fork's child
    /// gets its parent's).
    pub(super) alloc_python_binary:
        std::collections::HashMap<u32, super::allocations::HookedPython>,
    /// `--alloc-hooks sampler`: how this session's sampler gets into the
    /// processes; the allocator probes go on its library's markers.
    pub(super) alloc_sampler: Option<super::sampler::Sampler>,
    /// `--allocations --capture`: the allocations report last written to
    /// the capture, and when.
    pub(super) alloc_captured: Option<(AllocationsReport, std::time::Instant)>,
    /// The allocators' census of each CPython process, taken on its own
    /// thread.
    pub(super) census: super::census::CensusWorker,
    /// `record`/`run` with the fleet's sinks (`--metrics`): a window every
    /// 15 s and one at the end.
    fleet: Option<super::fleet::Fleet>,
}

impl Session {
    /// Loads and attaches the kernel side and creates the capture file;
    /// returns the session and the reader of its ring buffer.
    /// With `sampler` (`--alloc-hooks sampler`), the allocator probes go on
    /// its library's markers.
    pub(super) fn start(
        common: &CommonArgs,
        command: &str,
        sampler: Option<super::sampler::Sampler>,
    ) -> Result<(Self, RecordReader)> {
        let load_started = Instant::now();
        let fleet = super::fleet::Fleet::open_for_record(&common.sinks, common.render.top)?;
        let (mut session, reader) = Self::load(common, command, sampler, None, load_started)?;
        session.fleet = fleet;
        Ok((session, reader))
    }

    /// [`Session::start`] for a session that writes no report files and
    /// takes no allocator census (`memtrace agent`), with a records ring
    /// buffer of `ring_bytes` (`None`: the object's 32 MiB).
    pub(super) fn start_without_files(
        common: &CommonArgs,
        command: &str,
        ring_bytes: Option<u32>,
    ) -> Result<(Self, RecordReader)> {
        let (mut session, reader) = Self::load(common, command, None, ring_bytes, Instant::now())?;
        session.census.finish();
        session.census = super::census::CensusWorker::off();
        Ok((session, reader))
    }

    /// Loads and attaches the kernel side (begun at `load_started`).
    fn load(
        common: &CommonArgs,
        command: &str,
        sampler: Option<super::sampler::Sampler>,
        ring_bytes: Option<u32>,
        load_started: Instant,
    ) -> Result<(Self, RecordReader)> {
        let options = TracerOptions {
            sample_interval_bytes: common.sample_bytes,
            follow_forks: !common.no_follow_forks,
            wakeup_threshold_bytes: WAKEUP_THRESHOLD_BYTES,
            allocations: common.allocations,
            ring_bytes,
        };
        let mut tracer = Tracer::load(&options)?;
        tracer.set_debug_dirs(&common.debug_dir);
        tracer.attach()?;
        let reader =
            RecordReader::new(tracer.take_records()?).context("cannot watch the ring buffer")?;
        let start_ns = monotonic_ns();
        let writer = match &common.capture {
            Some(path) => Some(create_capture(path, common, command, start_ns)?),
            None => None,
        };
        let session = Self {
            tracer,
            tree: ProcessTree::default(),
            recorder: Recorder::new(Aggregator::new(start_ns), writer, HELD_MAP_MAX_ENTRIES),
            command: command.to_owned(),
            stacks: StackAssembler::default(),
            mappings: MappingNames::default(),
            sharing: SharingReader::default(),
            launched: None,
            missing: Vec::new(),
            held_map_peak: (0, 0),
            started: Instant::now(),
            load_started,
            attach_ns: 0,
            attached_unix_ns: 0,
            command_held: false,
            exit_point_caveats: Vec::new(),
            start_ns,
            sample_interval_bytes: common.sample_bytes,
            stop_reason: None,
            allocations: common
                .allocations
                .then(|| AllocationTracker::new(common.sample_bytes)),
            alloc_python_binary: std::collections::HashMap::new(),
            alloc_sampler: sampler,
            alloc_captured: None,
            census: super::census::CensusWorker::start(),
            fleet: None,
        };
        if common.allocations {
            let cost = match session.alloc_sampler {
                Some(super::sampler::Sampler::Preloaded(_)) => SAMPLER_COST,
                Some(super::sampler::Sampler::Remote(_)) => REMOTE_SAMPLER_COST,
                None => UPROBES_COST,
            };
            eprintln!("memtrace: {cost}");
        }
        Ok((session, reader))
    }

    /// Marks every target traced: the report says how long attaching took
    /// and, unless `command_held` (`memtrace run` holds its command before
    /// its first instruction until now), that growth before now is not
    /// seen.
    pub(super) fn attached(&mut self, command_held: bool) {
        self.attach_ns = u64::try_from(self.load_started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.attached_unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.command_held = command_held;
    }

    /// Starts tracing a process that already runs (a target or one of its
    /// existing descendants), from its RSS in /proc now; a process already
    /// traced (named twice, or a descendant of another target) keeps its
    /// row.
    pub(super) fn add_running(
        &mut self,
        tgid: u32,
        parent: Option<ProcessId>,
        role: Role,
    ) -> Result<ProcessId> {
        if let Some(id) = self.tree.id_of(tgid) {
            return Ok(id);
        }
        let counters = proc::initial_counters(tgid, 0)?;
        let start_time_ns = proc::start_time_ns(tgid)?;
        self.tracer.trace_process(tgid, counters)?;
        let id = self.recorder.process_started(ProcessStart {
            tgid,
            start_time_ns,
            parent,
            role,
            cmdline: command_line(tgid),
            ts_ns: monotonic_ns(),
            counters,
            sharing: self.sharing.read_now(tgid),
        });
        self.tree.add(tgid, id, role);
        self.alloc_started(tgid, monotonic_ns());
        self.probe_python(tgid);
        Ok(id)
    }

    /// Adds the live descendants of `root` (traced as `root_id`), parents
    /// before children; never memtrace itself or what started it.
    pub(super) fn add_descendants(&mut self, root: u32, root_id: ProcessId) {
        let myself = proc::self_and_ancestors();
        let Ok(descendants) = proc::descendants(root) else {
            return;
        };
        for (child, parent) in descendants {
            if myself.contains(&child) {
                continue; // memtrace itself, or what started it
            }
            let parent_id = if parent == root {
                Some(root_id)
            } else {
                self.tree.id_of(parent)
            };
            // A fork that exec'd since runs a program of its own.
            let role = if proc::exec_since_fork(child, parent) {
                Role::Child
            } else {
                Role::Worker
            };
            // A descendant may exit between the listing and now.
            let _ = self.add_running(child, parent_id, role);
        }
    }

    /// Starts tracing `memtrace run`'s held command: the kernel side follows
    /// it now (its counters restart at its execve); it enters the report
    /// when the exec record comes.
    pub(super) fn add_launched(&mut self, tgid: u32) -> Result<()> {
        self.tracer
            .trace_process(tgid, ProcessCounters::default())?;
        self.launched = Some(tgid);
        Ok(())
    }

    /// Traces until `--duration`, SIGINT/SIGTERM, or until every traced
    /// process exited; then drains the last records and reads the final
    /// counters.
    pub(super) async fn trace(
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
            self.drain_and_probe(reader);
            if last_tick.elapsed() < TICK {
                continue;
            }
            last_tick = Instant::now();
            self.tick();
            let elapsed = self.started.elapsed();
            if live.due(elapsed) {
                self.keep_off_shared_terminal(&mut live);
                let snapshot = self.recorder.aggregator().live_snapshot(MAX_PATHS_SHOWN);
                let dropped = self.tracer.dropped_records().unwrap_or(0);
                live.show(elapsed, reader.records(), dropped, &snapshot);
            }
            if last_flush.elapsed() >= FLUSH_INTERVAL {
                last_flush = Instant::now();
                self.flush();
            }
            if self.fleet.as_ref().is_some_and(super::fleet::Fleet::due) {
                self.send_window(reader);
            }
            reap(&mut child);
            if self.tree.all_exited() && self.launched.is_none() {
                self.stop_reason = Some(StopReason::AllExited);
            }
        }
        reader.drain(|record| self.handle(record));
        live.finish();
        self.final_counters();
        self.send_window(reader);
        Ok(())
    }

    /// With the fleet's sinks, closes a window now and sends it (the
    /// session keeps every image: nothing is compacted).
    fn send_window(&mut self, reader: &RecordReader) {
        if let Some(mut fleet) = self.fleet.take() {
            self.close_window(&mut fleet, reader, false);
            self.fleet = Some(fleet);
        }
    }

    /// Closes a window of `fleet` now: fresh counters of every open image,
    /// the report so far to its sinks. With `compact` (`memtrace agent`),
    /// the images that ended are forgotten afterwards.
    pub(super) fn close_window(
        &mut self,
        fleet: &mut super::fleet::Fleet,
        reader: &RecordReader,
        compact: bool,
    ) -> super::fleet::WindowLine {
        let started = Instant::now();
        self.final_counters();
        self.flush();
        let now_ns = monotonic_ns();
        let meta = RunMeta {
            command: self.command.clone(),
            duration_ns: now_ns.saturating_sub(self.start_ns),
            records: reader.records(),
            dropped_records: self.tracer.dropped_records().unwrap_or(0),
            decode_errors: reader.decode_errors(),
            sample_interval_bytes: self.sample_interval_bytes,
            attach_ns: self.attach_ns,
            attached_unix_ns: self.attached_unix_ns,
            ..RunMeta::default()
        };
        let report = self.recorder.report_now(now_ns, meta);
        let recorder = &mut self.recorder;
        fleet.emit(
            started,
            report,
            compact.then_some(|| recorder.compact_ended()),
        )
    }

    /// Turns the live view into plain lines once a traced process (or
    /// `memtrace run`'s command before its execve) has the terminal the view
    /// redraws in place on open (a standard stream, or `/dev/tty`), so that a
    /// redraw never erases that process's own output.
    fn keep_off_shared_terminal(&self, live: &mut LiveView) {
        let Some(rdev) = live.terminal() else {
            return;
        };
        let mut tgids = self.tree.live().map(|p| p.tgid).chain(self.launched);
        if tgids.any(|tgid| proc::uses_terminal(tgid, rdev)) {
            live.share_terminal();
        }
    }

    /// Sends held-at-peak changes and flushes the capture file; a write
    /// error stops the capture (one warning) while tracing goes on.
    pub(super) fn flush(&mut self) {
        let (entries, bytes) = self.recorder.held_map_size();
        self.held_map_peak = (
            self.held_map_peak.0.max(entries),
            self.held_map_peak.1.max(bytes),
        );
        self.capture_allocations();
        self.recorder.flush();
        if let Some(err) = self.recorder.take_capture_error() {
            eprintln!(
                "memtrace: warning: {:#}; the capture stops here (it holds what was flushed \
                 until now), tracing goes on",
                anyhow::Error::from(err)
            );
        }
    }

    /// Periodic work: counters (with PSS/USS) into the timeline, thinned by
    /// the recorder; processes whose exit record was lost.
    pub(super) fn tick(&mut self) {
        let now_ns = monotonic_ns();
        let Ok(all) = self.tracer.counters() else {
            return;
        };
        let mut present = Vec::with_capacity(all.len());
        for (tgid, counters) in &all {
            present.push(*tgid);
            let Some(id) = self.tree.id_of(*tgid) else {
                continue;
            };
            let tgid = *tgid;
            let sharing = &mut self.sharing;
            self.recorder
                .periodic_counters(id, now_ns, counters, || sharing.read(tgid));
            if let Some(tracker) = &mut self.allocations {
                tracker.rss_anon(tgid, counters.rss_bytes[memtrace_common::MM_ANONPAGES]);
            }
        }
        self.sweep_lost_exits(&present, now_ns);
        self.probe_pending_processes();
    }

    /// A traced process missing from the kernel's map on two ticks in a
    /// row, with no exit record in between, lost its exit record (a full
    /// ring buffer): it ended then, status unknown, at its last counters.
    fn sweep_lost_exits(&mut self, present: &[u32], now_ns: u64) {
        let missing: Vec<u32> = self
            .tree
            .live()
            .map(|p| p.tgid)
            .filter(|tgid| !present.contains(tgid) && Some(*tgid) != self.launched)
            .collect();
        for &tgid in &missing {
            if self.missing.contains(&tgid) {
                if let Some(process) = self.tree.exit(tgid) {
                    self.recorder.process_exited(process.id, now_ns, None, None);
                    self.forget_tgid(tgid);
                    self.alloc_exited(tgid);
                }
            }
        }
        self.missing = missing;
    }

    /// A kept counter read (with PSS/USS) of every open image now: at the end
    /// of the trace, and at each window of `memtrace agent`.
    pub(super) fn final_counters(&mut self) {
        let now_ns = monotonic_ns();
        let Ok(all) = self.tracer.counters() else {
            return;
        };
        for (tgid, counters) in &all {
            if let Some(id) = self.tree.id_of(*tgid) {
                let sharing = self.sharing.read_now(*tgid);
                self.recorder.counters(id, now_ns, counters, sharing);
            }
            if let Some(tracker) = &mut self.allocations {
                tracker.rss_anon(*tgid, counters.rss_bytes[memtrace_common::MM_ANONPAGES]);
            }
        }
    }

    /// Drains the ring buffer, probing new processes for CPython after it
    /// and every [`PROBE_DURING_DRAIN`] within it: unwinding and naming the
    /// native stacks of a new process's first records can take tens of
    /// milliseconds, and its Python frames are walked only once its
    /// interpreter is found.
    pub(super) fn drain_and_probe(&mut self, reader: &mut RecordReader) {
        let mut probed = Instant::now();
        reader.drain(|record| {
            self.handle(record);
            if probed.elapsed() >= PROBE_DURING_DRAIN {
                self.probe_new_processes();
                probed = Instant::now();
            }
        });
        self.probe_new_processes();
    }

    /// Forgets the per-process caches of `tgid` (exit or exec).
    pub(super) fn forget_tgid(&mut self, tgid: u32) {
        self.stacks.forget(tgid);
        self.mappings.forget(tgid);
        self.sharing.forget(tgid);
        self.census.end(tgid);
    }
}

/// Creates the capture file of `--capture` with its header, before any
/// tracing (a path that cannot be written, or an existing file without
/// `--force`, fails here).
fn create_capture(
    path: &Path,
    common: &CommonArgs,
    command: &str,
    start_ns: u64,
) -> Result<CaptureWriter<BufWriter<File>>> {
    let created_unix_s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = Header {
        memtrace_capture: CAPTURE_VERSION,
        created_unix_s,
        command: command.to_owned(),
        start_ns,
        sample_interval_bytes: common.sample_bytes,
    };
    Ok(CaptureWriter::create(path, &header, common.force)?)
}

/// Ends `memtrace run`'s command if it outlived the trace (--duration, or a
/// signal memtrace got alone): SIGTERM, then SIGKILL after 5 s. Returns how
/// it ended (`None` when it cannot be told).
pub(super) fn stop_child(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(exit_status(status));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(exit_status(status));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait().ok().map(exit_status)
}

/// `std`'s exit status as the report's.
fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    ExitStatus::from_wait_status(status.into_raw() as u32)
}

/// Collects `memtrace run`'s child once it exits, so it does not linger as a
/// zombie (its exit record has been seen by then).
fn reap(child: &mut Option<&mut Child>) {
    if let Some(c) = child.as_deref_mut() {
        let _ = c.try_wait();
    }
}

pub(super) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
