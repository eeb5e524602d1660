//! Wires the data flow together for each command. `record` and `run`
//! (`session`): load and attach the eBPF programs, add the targets, then
//! loop: drain the ring buffer and turn each record into the aggregation
//! step's calls (`records`), sample the kernel's per-process counters,
//! probe new processes for CPython (`probing`), show progress; on stop,
//! diagnose and write and print the report (`output`, into the files chosen
//! before tracing: `files`). `report` replays a
//! capture into the same output; `diff` is `crate::diff`; `agent` runs
//! `memtrace agent`'s long session.

mod agent;
mod allocations;
mod census;
mod clock;
mod files;
mod fleet;
mod output;
mod probing;
mod records;
mod sampler;
mod session;

use std::process::ExitCode;

use anyhow::{Context as _, Result};

use crate::aggregate::Role;
use crate::cli::{AllocHooksArg, Cli, Command, CommonArgs};
use crate::process::{launch::spawn_held, proc};
use session::Session;

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
            Command::Record(args) => record(args.pids, args.allow_init, args.common).await,
            Command::Run(args) => run_command(&args.command, args.python_malloc, args.common).await,
            Command::Report(args) => output::report_command(&args),
            Command::Diff(args) => crate::diff::run(&args),
            Command::Agent(args) => agent::run(args).await,
            Command::Completions(args) => completions(args.shell),
        }
    })
}

/// `memtrace record --pid ...`: traces running processes and, unless
/// `--no-follow-forks`, their existing descendants and later forks.
async fn record(pids: Vec<u32>, allow_init: bool, mut common: CommonArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !pids.is_empty(),
        "--pid was given no PID: {}, or start the program traced: `memtrace run -- COMMAND`",
        crate::cli::PGREP_HINT
    );
    for &pid in &pids {
        check_target(pid, allow_init, common.no_follow_forks)?;
    }
    let files = files::RunFiles::prepare(&mut common)?;
    let profile_sinks = crate::sinks::open_profile_sinks(&common.profile_sinks)?;
    let command = format!("memtrace record --pid {}", join(&pids));
    progress(
        &common,
        &format!(
            "attaching to PID {}{} (loading the eBPF programs takes a few seconds) ...",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if common.no_follow_forks {
                ""
            } else {
                " and its descendants"
            }
        ),
    );
    let sampler = uses_sampler(&common).then(|| {
        sampler::Sampler::Remote(sampler::remote::RemoteSampler::new(common.sample_bytes))
    });
    let (mut session, mut reader) = Session::start(&common, &command, sampler)?;
    for &pid in &pids {
        let root = session.add_running(pid, None, root_role(pid))?;
        if !common.no_follow_forks {
            session.add_descendants(pid, root);
        }
    }
    session.attached(false);
    traced(&common, &session);
    session.trace(&mut reader, &common, None).await?;
    session.finish(&reader, &common, &files, None, profile_sinks)
}

/// `memtrace run -- CMD`: starts the command held before its execve, traces
/// it from its first instruction, and exits with its status; with
/// `python_malloc`, under `PYTHONMALLOC=malloc`.
async fn run_command(
    argv: &[std::ffi::OsString],
    python_malloc: bool,
    mut common: CommonArgs,
) -> Result<ExitCode> {
    let files = files::RunFiles::prepare(&mut common)?;
    let profile_sinks = crate::sinks::open_profile_sinks(&common.profile_sinks)?;
    let command = argv
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    progress(
        &common,
        "loading the eBPF programs (a few seconds) before starting the command ...",
    );
    let sampler = uses_sampler(&common)
        .then(sampler::SamplerFiles::write)
        .transpose()?;
    let mut envs = Vec::new();
    if python_malloc {
        envs.push(("PYTHONMALLOC".to_owned(), "malloc".into()));
    }
    if let Some(files) = &sampler {
        envs.extend(files.environment(common.sample_bytes));
    }
    let sampler = sampler.map(sampler::Sampler::Preloaded);
    let (mut session, mut reader) = Session::start(&common, &command, sampler)?;
    let held = spawn_held(argv, &envs)?;
    session.add_launched(held.pid)?;
    session.attached(true);
    let mut child = held.release()?;
    session
        .trace(&mut reader, &common, Some(&mut child))
        .await?;
    let status = session::stop_child(&mut child);
    session.finish(&reader, &common, &files, status, profile_sinks)
}

/// Whether `--allocations` hooks the allocators with the in-process
/// sampler (the default of `run` and `record`).
fn uses_sampler(common: &CommonArgs) -> bool {
    common.allocations
        && common.alloc_hooks.unwrap_or(AllocHooksArg::Sampler) == AllocHooksArg::Sampler
}

/// `memtrace completions SHELL`: the completion script clap_complete writes
/// for memtrace's command line, on standard output.
fn completions(shell: clap_complete::Shell) -> Result<ExitCode> {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    let mut stdout = std::io::stdout().lock();
    clap_complete::generate(shell, &mut command, "memtrace", &mut stdout);
    std::io::Write::flush(&mut stdout).context("cannot write the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// One line of progress on standard error (not with `--quiet`): attaching
/// is silent for seconds otherwise.
fn progress(common: &CommonArgs, line: &str) {
    if !common.quiet {
        eprintln!("memtrace: {line}");
    }
}

/// Says how many processes `record` traces and how long attaching took.
fn traced(common: &CommonArgs, session: &Session) {
    let processes = session.tree.live().count();
    let stop = match common.duration {
        Some(d) => format!("for {}", humantime::format_duration(d)),
        None => "until Ctrl-C or they exit".to_owned(),
    };
    progress(
        common,
        &format!(
            "tracing {processes} process(es) {stop} (attaching took {:.1} s)",
            session.attach_ns as f64 / 1e9
        ),
    );
}

/// Refuses a `record --pid` target that cannot or should not be traced: a
/// zombie, a kernel thread, a process whose memory may not be read, and
/// PID 1 with its forks followed (every process descends from it: that
/// would trace the whole machine) unless `--allow-init`.
fn check_target(pid: u32, allow_init: bool, no_follow_forks: bool) -> Result<()> {
    if pid == 1 && !allow_init && !no_follow_forks {
        anyhow::bail!(
            "PID 1 (`{}`) is the ancestor of every process: following its forks would trace \
             the whole machine; add --no-follow-forks to trace PID 1 alone, or --allow-init to \
             trace every process",
            proc::command_line(1)
        );
    }
    Ok(proc::check_traceable(pid)?)
}

/// The role of `record --pid PID`: a worker of an untraced master
/// ([`Role::ForkedRoot`]) when its parent forked it without an exec, else a
/// root.
fn root_role(pid: u32) -> Role {
    // Not the children of the scheduler, init or kthreadd.
    let parent = proc::parent_pid(pid).filter(|&ppid| ppid > 2);
    if parent.is_some_and(|parent| proc::forked_without_exec(pid, parent)) {
        Role::ForkedRoot
    } else {
        Role::Root
    }
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" --pid ")
}
