//! `memtrace agent`: one long session that picks its targets itself
//! (`crate::agent::discovery`, polling `/proc` every second), traces them
//! in the default mode, and every `--interval` closes a window
//! (`crate::agent::windows`), hands it to each sink (`crate::sinks`), and
//! forgets the images that ended, so that its memory follows the processes
//! alive, not the windows nor the processes that came and went.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use super::session::{self, monotonic_ns, Session, DRAIN_INTERVAL, FLUSH_INTERVAL, TICK};
use crate::agent::discovery::{cgroup_exists, Discovery, Selector};
use crate::agent::windows::{host_name, own_resident_bytes, WindowBuilder};
use crate::aggregate::{Role, RunMeta};
use crate::cli::{AgentArgs, CommonArgs, GateArgs, ProfileSinkArgs, RenderArgs, WeightArg};
use crate::events::RecordReader;
use crate::process::proc;
use crate::sinks::{prometheus::PrometheusSink, Health, Sink};

/// The agent's records ring buffer: 8 MiB, a quarter of `record`'s. The
/// kernel maps its data pages twice (for records that wrap), so the ring
/// adds up to twice its size to memtrace's RSS once written; 8 MiB kept
/// the drops at 0 for the demo service with 16 workers (README, "Fleet").
const AGENT_RING_BYTES: u32 = 8 << 20;
/// How often `/proc` is polled for processes to trace.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

/// What the loop counts of the sinks.
#[derive(Debug, Default)]
struct SinkCounts {
    errors: u64,
}

/// Runs `memtrace agent` until `--duration`, SIGTERM or SIGINT (each after
/// a last window), or, with `--pid` only, until every traced process
/// exited.
///
/// # Errors
/// Setup failures: a bad `--match` expression, a missing `--cgroup`, a
/// `--pid` that cannot be traced, a `--metrics` address that cannot be
/// bound, the eBPF programs refused.
pub(super) async fn run(args: AgentArgs) -> Result<ExitCode> {
    let selector = selector(&args)?;
    let mut sinks = open_sinks(&args)?;
    let common = common_args(&args);
    let (mut session, mut reader) =
        Session::start_without_files(&common, "memtrace agent", Some(AGENT_RING_BYTES))?;
    session.attached(false);
    let mut discovery = Discovery::new(selector, proc::self_and_ancestors());
    let mut windows =
        WindowBuilder::new(args.host_name.clone().unwrap_or_else(host_name), unix_ns());
    let mut counts = SinkCounts::default();
    discover(&mut session, &mut discovery)?;
    eprintln!(
        "memtrace agent: tracing {} processes; a window every {}{}",
        session.tree.live().count(),
        humantime::format_duration(args.interval),
        sinks
            .iter()
            .map(|s| format!(", to {}", s.name()))
            .collect::<String>()
    );
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    let (mut last_tick, mut last_flush, mut last_poll) =
        (Instant::now(), Instant::now(), Instant::now());
    let mut next_window = Instant::now() + args.interval;
    let mut stop: Option<&str> = None;
    while stop.is_none() {
        tokio::select! {
            ready = reader.wait_readable() => ready.context("ring buffer poll failed")?,
            _ = drain.tick() => {}
            _ = sigterm.recv() => stop = Some("SIGTERM received"),
            _ = sigint.recv() => stop = Some("SIGINT received"),
            _ = session::sleep_until(deadline) => stop = Some("--duration elapsed"),
        }
        session.drain_and_probe(&mut reader);
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            session.tick();
        }
        if last_flush.elapsed() >= FLUSH_INTERVAL {
            last_flush = Instant::now();
            session.flush();
        }
        if last_poll.elapsed() >= DISCOVERY_INTERVAL {
            last_poll = Instant::now();
            discover(&mut session, &mut discovery)?;
        }
        if discovery.fixed_targets() && session.tree.all_exited() {
            stop = stop.or(Some("every traced process exited"));
        }
        if stop.is_some() || Instant::now() >= next_window {
            next_window = Instant::now() + args.interval;
            reader.drain(|record| session.handle(record));
            let window = emit(&mut session, &reader, &mut windows, &mut sinks, &mut counts);
            if !args.quiet || stop.is_some() {
                eprintln!("{window}");
            }
        }
    }
    eprintln!("memtrace agent: {}; stopped", stop.unwrap_or("stopped"));
    Ok(ExitCode::SUCCESS)
}

/// The targets the command line asks for.
fn selector(args: &AgentArgs) -> Result<Selector> {
    if !args.pids.is_empty() {
        for &pid in &args.pids {
            super::check_target(pid, false, false)?;
        }
        return Ok(Selector::Pids(args.pids.clone()));
    }
    if let Some(pattern) = &args.matching {
        let regex = regex::Regex::new(pattern)
            .with_context(|| format!("--match {pattern:?} is not a regular expression"))?;
        return Ok(Selector::Match(regex));
    }
    if let Some(path) = &args.cgroup {
        let selector = Selector::cgroup(path);
        anyhow::ensure!(
            cgroup_exists(&selector),
            "--cgroup {path}: no such cgroup under /sys/fs/cgroup (cgroup v2)"
        );
        return Ok(selector);
    }
    Ok(Selector::Python)
}

/// The sinks the command line asks for, opened before tracing starts (an
/// address that cannot be bound fails here).
fn open_sinks(args: &AgentArgs) -> Result<Vec<Box<dyn Sink>>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(addr) = &args.metrics {
        sinks.push(Box::new(PrometheusSink::bind(addr, args.top)?));
    }
    sinks.extend(crate::sinks::open_profile_sinks(&args.profile_sinks)?);
    Ok(sinks)
}

/// The session options of the agent: the default mode, forks followed, no
/// report files.
fn common_args(args: &AgentArgs) -> CommonArgs {
    CommonArgs {
        duration: args.duration,
        no_follow_forks: false,
        output_dir: ".".into(),
        sample_bytes: args.sample_bytes,
        capture: None,
        output: None,
        format: Vec::new(),
        force: false,
        render: RenderArgs {
            inverted: false,
            per_process: false,
            top: args.top,
            weight: WeightArg::Peak,
            verbose: false,
            full_paths: false,
        },
        quiet: true,
        allocations: false,
        alloc_weight: crate::cli::AllocWeightArg::Leaked,
        alloc_hooks: None,
        gate: GateArgs {
            fail_above: None,
            fail_on_cause: Vec::new(),
        },
        profile_sinks: ProfileSinkArgs::default(),
    }
}

/// Starts tracing the processes discovery found (with their live
/// descendants); one that exits meanwhile is skipped.
fn discover(session: &mut Session, discovery: &mut Discovery) -> Result<()> {
    let found = discovery
        .poll(|tgid| session.tree.id_of(tgid).is_some())
        .context("cannot list /proc")?;
    for tgid in found {
        if session.tree.id_of(tgid).is_some() {
            continue; // a descendant of a root found before it
        }
        match session.add_running(tgid, None, Role::Root) {
            Ok(root) => session.add_descendants(tgid, root),
            Err(err) if discovery.fixed_targets() => return Err(err),
            Err(_) => {} // it exited since the poll
        }
    }
    Ok(())
}

/// Closes the window now: fresh counters of every open image, the report
/// so far, the window to every sink; then forgets the images that ended.
fn emit(
    session: &mut Session,
    reader: &RecordReader,
    windows: &mut WindowBuilder,
    sinks: &mut [Box<dyn Sink>],
    counts: &mut SinkCounts,
) -> WindowLine {
    session.final_counters();
    session.flush();
    let now_ns = monotonic_ns();
    let meta = RunMeta {
        command: session.command.clone(),
        duration_ns: now_ns.saturating_sub(session.start_ns),
        records: reader.records(),
        dropped_records: session.tracer.dropped_records().unwrap_or(0),
        decode_errors: reader.decode_errors(),
        sample_interval_bytes: session.sample_interval_bytes,
        attach_ns: session.attach_ns,
        attached_unix_ns: session.attached_unix_ns,
        ..RunMeta::default()
    };
    let report = session.recorder.report_now(now_ns, meta);
    let health = Health {
        records_read: report.meta.records,
        records_dropped: report.meta.dropped_records,
        windows_emitted: 0,
        sink_errors: counts.errors + sinks.iter().map(|s| s.send_errors()).sum::<u64>(),
        windows_dropped: sinks.iter().map(|s| s.windows_dropped()).sum(),
        own_resident_bytes: own_resident_bytes(),
    };
    let window = windows.close(&report, unix_ns(), health);
    for sink in sinks.iter_mut() {
        if let Err(err) = sink.send(&window) {
            counts.errors += 1;
            eprintln!("memtrace agent: warning: {}: {err:#}", sink.name());
        }
    }
    let compacted = session.recorder.compact_ended();
    WindowLine {
        number: window.health.windows_emitted,
        processes: window.processes.len(),
        compacted,
        health: window.health,
    }
}

/// The line printed per window.
struct WindowLine {
    number: u64,
    processes: usize,
    compacted: usize,
    health: Health,
}

impl std::fmt::Display for WindowLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = &self.health;
        write!(
            f,
            "memtrace agent: window {}: {} processes ({} ended ones forgotten), {} records \
             read, {} dropped, {} sink errors, memtrace RSS {}",
            self.number,
            self.processes,
            self.compacted,
            h.records_read,
            h.records_dropped,
            h.sink_errors,
            crate::units::format_bytes(h.own_resident_bytes)
        )
    }
}

/// Unix time now, in ns.
pub(super) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
