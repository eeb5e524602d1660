//! `cargo xtask`: what cargo alone cannot do for memtrace: install the eBPF
//! toolchain (setup), then build, run, demo, test and bench on top of it.
//! Every subcommand runs `setup` first, which is idempotent and fast when
//! nothing is missing.

mod apt;
mod bench;
mod bench_env;
mod dist;
mod free_threaded;
mod interpreters;
mod otelcol;
mod prometheus;
mod setup;
mod soak;
mod test_tools;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "memtrace developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and running memtrace needs: nightly rust-src,
    /// bpf-linker, a mounted tracefs.
    Setup,
    /// Build memtrace (release) with its embedded eBPF object.
    Build,
    /// Build, then run memtrace with the given arguments (as root).
    Run {
        /// Arguments passed to memtrace, e.g. `record --pid 1234`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then trace the bundled pre-fork example service under load and
    /// print memtrace's report; on the interpreter named by
    /// MEMTRACE_DEMO_PYTHON (a path) when set, else pyenv's 3.11.
    Demo {
        /// Seconds of load the load generator sends.
        #[arg(long, default_value_t = 15)]
        seconds: u32,
        /// Where the report files go.
        #[arg(long, default_value = "target/demo")]
        output_dir: PathBuf,
    },
    /// Run the unit and integration tests (integration tests need root and
    /// load real eBPF programs; they run one at a time). As root, a test
    /// that would skip fails (MEMTRACE_REQUIRE_ALL=1).
    Test {
        /// Extra arguments for `cargo test`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build `target/dist/memtrace-VERSION-x86_64-linux.tar.gz`: the release
    /// binary, README, licences and examples/deploy, for a node without Rust.
    Dist,
    /// Measure memtrace's overhead: traced vs untraced, side by side.
    Bench {
        /// Runs of each configuration (medians are reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Also compare with `python -X tracemalloc` and `memray run`, and add
        /// pyperformance workloads (json_loads, deltablue, raytrace); runs in
        /// a virtualenv under target/bench/venv made from PyPI on first use.
        #[arg(long)]
        peers: bool,
        /// Instead: the soak of `memtrace agent` (all three sinks on, the
        /// demo service with 16 workers under load, with and without the
        /// agent in alternate blocks): the agent's RSS every minute, its
        /// CPU time and bytes sent per window, the service's throughput.
        #[arg(long, conflicts_with = "peers")]
        soak: bool,
        /// Minutes of the soak.
        #[arg(long, default_value_t = 30, requires = "soak")]
        minutes: u32,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root)
        .with_context(|| format!("cannot enter the workspace `{}`", root.display()))?;
    setup::run()?;
    match cli.task {
        Task::Setup => Ok(()),
        Task::Build => build().map(|_| ()),
        Task::Run { args } => run_memtrace(&build()?, &args),
        Task::Demo {
            seconds,
            output_dir,
        } => demo(seconds, &output_dir),
        Task::Test { args } => test(&args),
        Task::Dist => dist::run(&build()?).map(|_| ()),
        Task::Bench {
            soak: true,
            minutes,
            ..
        } => soak(minutes),
        Task::Bench { runs, peers, .. } => bench(runs, peers),
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Runs a command, failing with its rendering when it does not exit 0.
pub(crate) fn check(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Builds the release memtrace binary and returns its path.
fn build() -> Result<PathBuf> {
    check(Command::new("cargo").args(["build", "--release", "--package", "memtrace"]))?;
    Ok(PathBuf::from("target/release/memtrace"))
}

fn run_memtrace(bin: &Path, args: &[String]) -> Result<()> {
    check(Command::new(bin).args(args))
}

/// The interpreter the demo and benchmark use: pyenv's 3.11.7 if present,
/// else Debian's python3.11, else `python3` on PATH.
fn python_for_examples() -> Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let candidates = [
        home.join(".pyenv/versions/3.11.7/bin/python3.11"),
        PathBuf::from("/usr/bin/python3.11"),
    ];
    if let Some(found) = candidates.into_iter().find(|p| p.exists()) {
        return Ok(found);
    }
    which_python3().context("no Python 3.11 interpreter found (looked for pyenv 3.11.7, /usr/bin/python3.11 and python3 on PATH)")
}

fn which_python3() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("python3"))
            .find(|p| p.exists())
    })
}

/// The environment variable that names the demo's interpreter (a path),
/// e.g. `target/interpreters/python3.14/usr/bin/python3.14`.
const DEMO_PYTHON: &str = "MEMTRACE_DEMO_PYTHON";

/// The `-dbg` symbols of an interpreter of the test setup's trees
/// (`target/interpreters/pythonX.Y/usr/lib/debug`), if `python` is one.
fn debug_dir_of(python: &Path) -> Option<PathBuf> {
    let trees = std::env::current_dir().ok()?.join("target/interpreters");
    let python = std::path::absolute(python).ok()?;
    let tree = trees.join(python.strip_prefix(&trees).ok()?.components().next()?);
    Some(tree.join("usr/lib/debug")).filter(|dir| dir.is_dir())
}

fn demo(seconds: u32, output_dir: &Path) -> Result<()> {
    let bin = build()?;
    let python = match std::env::var_os(DEMO_PYTHON) {
        Some(python) => PathBuf::from(python),
        None => python_for_examples()?,
    };
    if !python.exists() {
        bail!("{DEMO_PYTHON}=`{}` does not exist", python.display());
    }
    let debug_dir: Vec<PathBuf> = debug_dir_of(&python).into_iter().collect();
    std::fs::create_dir_all(output_dir)
        .with_context(|| format!("cannot create `{}`", output_dir.display()))?;
    println!(
        "demo: tracing examples/prefork_service (master + 4 workers) under {seconds} s of load with {}",
        python.display()
    );
    check(
        Command::new(&bin)
            .arg("run")
            .arg("--output-dir")
            .arg(output_dir)
            .args(["--format", "html"])
            .args(
                debug_dir
                    .iter()
                    .flat_map(|dir| [Path::new("--debug-dir"), dir]),
            )
            .arg("--")
            .arg(&python)
            .arg("examples/prefork_service/run_demo.py")
            .arg("--seconds")
            .arg(seconds.to_string()),
    )
}

/// `cargo xtask bench`: with `peers`, the workloads run on the bench
/// virtualenv's Python (made from the examples' Python).
fn bench(runs: usize, peers: bool) -> Result<()> {
    let base_python = python_for_examples()?;
    let python = if peers {
        bench_env::ensure(&base_python)?
    } else {
        base_python
    };
    bench::run(&bench::BenchArgs {
        runs,
        memtrace_bin: build()?,
        python,
        peers,
    })
}

/// `cargo xtask bench --soak`: the backends the tests use, then the soak.
fn soak(minutes: u32) -> Result<()> {
    prometheus::ensure()?;
    otelcol::ensure()?;
    let args = soak::SoakArgs::bench(minutes, build()?, python_for_examples()?);
    println!(
        "soak: {minutes} min, {} s blocks of load alternately with and without memtrace agent \
         (ABBA), demo service with {} workers, python {}",
        args.block.as_secs(),
        args.workers,
        args.python.display()
    );
    let report = soak::run(&args)?;
    print!("{}", soak::format_report(&report));
    Ok(())
}

fn test(args: &[String]) -> Result<()> {
    if !is_root() {
        println!(
            "note: not root: integration tests that load eBPF programs will print why they skip"
        );
    }
    // The consumers the format tests read reports back with: go tool pprof,
    // headless chromium, the speedscope web app.
    test_tools::ensure()?;
    // The real Prometheus the fleet tests scrape the agent with.
    prometheus::ensure()?;
    // The OpenTelemetry Collector of tests/fleet_profiles.rs, built from
    // Debian's Go sources.
    otelcol::ensure()?;
    // The tarball tests/fleet_dist.rs unpacks and traces with.
    dist::run(&build()?)?;
    // Build first so the test run itself is not timed against compilation.
    check(Command::new("cargo").args(["build", "--workspace", "--tests"]))?;
    let mut harness_args = vec!["--test-threads=1"];
    let mut cargo_test = Command::new("cargo");
    if is_root() {
        // Live eBPF unit tests are #[ignore]d for unprivileged `cargo test`.
        harness_args.push("--include-ignored");
        // Everything a test needs is here (root, BTF, the consumer tools
        // just installed): a test that would skip fails instead.
        cargo_test.env(REQUIRE_ALL, "1");
    }
    check(
        cargo_test
            .args(["test", "--workspace"])
            .args(args)
            .arg("--")
            .args(harness_args),
    )
}

/// Set to `1`, integration tests fail instead of skipping when something
/// they need is missing (tests/common/skip.rs).
const REQUIRE_ALL: &str = "MEMTRACE_REQUIRE_ALL";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
