//! `memtrace agent`: one long session that picks its targets itself
//! (`crate::agent::discovery`, polling `/proc` every second), traces them
//! in the default mode, and every `--interval` closes a window
//! (`crate::agent::windows`), hands it to each sink (`crate::sinks`), and
//! forgets the images that ended, so that its memory follows the processes
//! alive, not the windows nor the processes that came and went.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use super::fleet::Fleet;
use super::session::{self, Session, DRAIN_INTERVAL, FLUSH_INTERVAL, TICK};
use crate::agent::discovery::{cgroup_exists, Discovery, Selector};
use crate::aggregate::Role;
use crate::cli::{AgentArgs, CommonArgs, GateArgs, ProfileSinkArgs, RenderArgs, WeightArg};
use crate::process::proc;

/// The agent's records ring buffer: 8 MiB, a quarter of `record`'s. The
/// kernel maps its data pages twice (for records that wrap), so the ring
/// adds up to twice its size to memtrace's RSS once written; 8 MiB kept
/// the drops at 0 for the demo service with 16 workers (docs/fleet.md).
const AGENT_RING_BYTES: u32 = 8 << 20;
/// How often `/proc` is polled for processes to trace.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

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
    let profile_sinks = crate::sinks::open_profile_sinks(&args.profile_sinks)?;
    let mut fleet = Fleet::open(
        &args.sinks,
        args.top,
        args.host_name.clone(),
        args.interval,
        profile_sinks,
    )?;
    let common = common_args(&args);
    let (mut session, mut reader) =
        Session::start_without_files(&common, "memtrace agent", Some(AGENT_RING_BYTES))?;
    session.attached(false);
    session.recorder.drop_path_timelines();
    let mut discovery = Discovery::new(selector, proc::self_and_ancestors());
    discover(&mut session, &mut discovery)?;
    let traced = session.tree.live().count();
    eprintln!(
        "memtrace agent: tracing {traced} processes{}; a window every {}{}",
        if traced == 0 {
            " (none matches yet: new ones are picked up within a second)"
        } else {
            ""
        },
        humantime::format_duration(args.interval),
        fleet
            .destinations()
            .iter()
            .map(|destination| format!(", to {destination}"))
            .collect::<String>()
    );
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    let (mut last_tick, mut last_flush, mut last_poll) =
        (Instant::now(), Instant::now(), Instant::now());
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
        if stop.is_some() || fleet.due() {
            reader.drain(|record| session.handle(record));
            let window = session.close_window(&mut fleet, &reader, true);
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
    if let Some(pids) = &args.pids {
        anyhow::ensure!(
            !pids.is_empty(),
            "--pid was given no PID: {}; without --pid, the agent traces every Python \
             process",
            crate::cli::PGREP_HINT
        );
        for &pid in pids {
            super::check_target(pid, false, false)?;
        }
        return Ok(Selector::Pids(pids.clone()));
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
        debug_dir: Vec::new(),
        alloc_hooks: None,
        gate: GateArgs {
            fail_above: None,
            fail_on_cause: Vec::new(),
        },
        // The agent holds its sinks itself.
        sinks: crate::cli::SinkArgs::default(),
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
