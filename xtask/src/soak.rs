//! `cargo xtask bench --soak`: `memtrace agent` for a long run with its
//! three sinks on, on the bundled pre-fork demo service under load: the
//! agent's own RSS and CPU time, the bytes it sends each sink, and the
//! service's throughput with and without the agent, side by side.
//!
//! The agent runs the whole soak (`--match` on the traced copy of the
//! demo, `--metrics` scraped by the real Prometheus, `--otlp` to the real
//! collector, `--pyroscope` to a stand-in receiver; `soak::backends`).
//! The time is cut into blocks, alternately with and without the agent
//! (ABBA order, so slow drift hits both alike): each block starts a fresh
//! demo service (`server.py --workers 16`) from one of two identical
//! copies, the traced one or the other, waits (traced) until the agent's
//! page shows it, loads it closed loop for the block (`tests/scripts/bench_soak_load.py`: the demo's request mix, as
//! fast as it answers) and stops it. A fresh service per block keeps the
//! demo's leak (about 900 KiB per `/report`) from filling the machine,
//! and makes the agent see 17 processes come and go every other block.
//! Every `sample_every` a sampler reads the agent's VmRSS and CPU ticks
//! (`/proc/PID/status`, `/proc/PID/stat`), its health metrics, the bytes
//! counted on the wire and the load average: one table row each.

mod backends;
mod table;
#[cfg(test)]
mod tests;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use backends::{
    collector_exports, free_port, http_get, start_collector, start_prometheus, terminate, wait_for,
    CountingRelay, IngestReceiver, Running,
};
pub use table::format_report;

/// What one soak needs.
pub struct SoakArgs {
    /// How long the soak runs (the blocks fill it).
    pub duration: Duration,
    /// Seconds of load per block.
    pub block: Duration,
    /// The agent's `--interval` (and Prometheus's scrape interval).
    pub interval: Duration,
    /// How often a table row is taken.
    pub sample_every: Duration,
    /// Workers of each demo service.
    pub workers: u32,
    /// The memtrace binary (release for the bench).
    pub memtrace_bin: PathBuf,
    /// The Python that runs the demo and the load.
    pub python: PathBuf,
    /// Scratch folder (cleared first): the demo copies, logs, Prometheus's
    /// data.
    pub scratch: PathBuf,
}

impl SoakArgs {
    /// The bench's soak of `minutes`: 20 s blocks of load (a service at
    /// this machine's ~500 requests/s grows ~140 MiB/s from the demo's
    /// leak), a window every 15 s, a row a minute, 16 workers.
    pub fn bench(minutes: u32, memtrace_bin: PathBuf, python: PathBuf) -> Self {
        Self {
            duration: Duration::from_secs(u64::from(minutes) * 60),
            block: Duration::from_secs(20),
            interval: Duration::from_secs(15),
            sample_every: Duration::from_secs(60),
            workers: 16,
            memtrace_bin,
            python,
            scratch: PathBuf::from("target/bench/soak"),
        }
    }
}

/// One table row: what the sampler read at one time.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Seconds since the agent started.
    pub at_seconds: f64,
    /// The agent's VmRSS, bytes.
    pub rss_bytes: u64,
    /// The agent's user + system CPU time so far, seconds.
    pub cpu_seconds: f64,
    /// `memtrace_windows_emitted_total` on the agent's page.
    pub windows: u64,
    /// `memtrace_records_dropped_total`.
    pub records_dropped: u64,
    /// `memtrace_resident_bytes` (the agent's own RSS at its last window).
    pub own_rss_metric_bytes: u64,
    /// Bytes the agent sent so far: its `/metrics` pages to Prometheus,
    /// OTLP to the collector, `/ingest` to the Pyroscope stand-in.
    pub sent_bytes: [u64; 3],
    /// The 1-minute load average.
    pub load_average: f64,
}

/// One block of load.
#[derive(Clone, Debug)]
pub struct Block {
    /// Under the agent.
    pub traced: bool,
    /// Requests answered per second (the load's own count and clock).
    pub requests_per_second: f64,
    /// Whether the agent's page showed the service's master pid before the
    /// load (traced), or did not show it before nor after (untraced).
    pub confirmed: bool,
}

/// What a soak measured.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// One row per `sample_every`, the first at the agent's start.
    pub samples: Vec<Sample>,
    /// The blocks in order.
    pub blocks: Vec<Block>,
    /// Profiles the collector's debug exporter printed.
    pub collector_exports: u64,
    /// Requests the Pyroscope stand-in got that were pprof `/ingest`.
    pub pprof_requests: u64,
    /// The agent's window interval.
    pub interval: Duration,
    /// Prometheus's answer to `memtrace_resident_bytes` after the last
    /// block, before the agent stops, bytes.
    pub prometheus_own_rss_bytes: Option<f64>,
    /// The agent's last window line (its standard error).
    pub last_window_line: String,
}

/// The regular expression the agent selects the traced copy in `dir`
/// with: its `server.py`'s path, escaped.
fn traced_match(dir: &Path) -> String {
    let path = dir.join("server.py").display().to_string();
    path.chars()
        .flat_map(|c| {
            let escape = !(c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-'));
            escape.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// Client threads of the closed-loop load.
const LOAD_THREADS: u32 = 8;

/// Time a new service is given to start its workers before its load.
const SETTLE: Duration = Duration::from_secs(3);

/// The closed-loop load script.
const LOAD_SCRIPT: &str = "tests/scripts/bench_soak_load.py";

/// Runs the soak and returns what it measured.
///
/// # Errors
/// A backend, the agent, a service or the load fails to start or stops
/// early; the agent's page does not answer.
pub fn run(args: &SoakArgs) -> Result<SoakReport> {
    fresh_dir(&args.scratch)?;
    let scratch = std::path::absolute(&args.scratch)?;
    let traced_dir = copy_demo(&scratch.join("traced"))?;
    let untraced_dir = copy_demo(&scratch.join("untraced"))?;
    let ingest = IngestReceiver::start()?;
    let otlp_port = free_port()?;
    let _collector = start_collector(&scratch, otlp_port)?;
    let otlp_relay = CountingRelay::start(otlp_port)?;
    let agent_port = free_port()?;
    let metrics_relay = CountingRelay::start(agent_port)?;
    let target = format!("127.0.0.1:{}", metrics_relay.port);
    let (_prometheus, prometheus_port) = start_prometheus(&scratch, &target, args.interval)?;
    let sinks = [agent_port, otlp_relay.port, ingest.port];
    let mut agent = start_agent(args, &traced_dir, &scratch, sinks)?;
    let agent_pid = agent.0.id();
    let pprof_requests = Arc::clone(&ingest.pprof_requests);
    let sent = move || {
        [
            metrics_relay.to_client.load(Ordering::Relaxed),
            otlp_relay.to_server.load(Ordering::Relaxed),
            ingest.bytes.load(Ordering::Relaxed),
        ]
    };
    let sampler = Sampler::start(agent_pid, agent_port, args.sample_every, sent);
    let blocks = run_blocks(args, &traced_dir, &untraced_dir, agent_port);
    // Asked while the agent still serves: once it stops, Prometheus marks
    // its series stale and an instant query answers nothing.
    let prometheus_own_rss_bytes = prometheus_value(prometheus_port, "memtrace_resident_bytes");
    terminate(&mut agent.0);
    let samples = sampler.stop();
    let blocks = blocks?;
    let log = std::fs::read_to_string(scratch.join("agent.log")).unwrap_or_default();
    Ok(SoakReport {
        samples,
        blocks,
        collector_exports: collector_exports(&scratch),
        pprof_requests: pprof_requests.load(Ordering::Relaxed),
        interval: args.interval,
        prometheus_own_rss_bytes,
        last_window_line: log
            .lines()
            .rfind(|line| line.contains(": window "))
            .unwrap_or_default()
            .to_owned(),
    })
}

/// Starts `memtrace agent` at normal priority on the demo copy in
/// `traced_dir` with the three sinks (`[metrics, otlp, ingest]` ports),
/// its standard error in `scratch/agent.log`; waits for its first window
/// (its programs loaded: tracing).
fn start_agent(
    args: &SoakArgs,
    traced_dir: &Path,
    scratch: &Path,
    [metrics_port, otlp_port, ingest_port]: [u16; 3],
) -> Result<Running> {
    let log = std::fs::File::create(scratch.join("agent.log"))?;
    let child = Command::new(&args.memtrace_bin)
        .arg("agent")
        .arg("--match")
        .arg(traced_match(traced_dir))
        .arg("--interval")
        .arg(format!("{}s", args.interval.as_secs().max(1)))
        .arg("--metrics")
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--otlp")
        .arg(format!("http://127.0.0.1:{otlp_port}"))
        .arg("--pyroscope")
        .arg(format!("http://127.0.0.1:{ingest_port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start `{}`", args.memtrace_bin.display()))?;
    let mut agent = Running(child);
    let tracing = wait_for(Duration::from_secs(120), || {
        if agent.0.try_wait().ok().flatten().is_some() {
            return Some(false);
        }
        let page = http_get(metrics_port, "/metrics")?;
        let windows = metric_value(&page, "memtrace_windows_emitted_total")?;
        (windows >= 1.0).then_some(true)
    });
    if tracing != Some(true) {
        terminate(&mut agent.0);
        let log = std::fs::read_to_string(scratch.join("agent.log")).unwrap_or_default();
        bail!("memtrace agent closed no window within 120 s:\n{log}");
    }
    Ok(agent)
}

/// Runs blocks in ABBA order (with, without, without, with, ...) until the
/// soak's time is up; at least one of each.
fn run_blocks(
    args: &SoakArgs,
    traced_dir: &Path,
    untraced_dir: &Path,
    agent_port: u16,
) -> Result<Vec<Block>> {
    let started = Instant::now();
    let per_block = args.block + args.interval + SETTLE;
    let mut blocks = Vec::new();
    while blocks.len() < 2 || started.elapsed() + per_block <= args.duration {
        let traced = matches!(blocks.len() % 4, 0 | 3);
        let dir = if traced { traced_dir } else { untraced_dir };
        let block = run_block(args, dir, traced, agent_port)?;
        eprintln!(
            "soak: block {} {}: {:.1} requests/s{}",
            blocks.len() + 1,
            if traced { "with the agent" } else { "without" },
            block.requests_per_second,
            if block.confirmed {
                ""
            } else {
                " (agent's page disagrees!)"
            }
        );
        blocks.push(block);
    }
    Ok(blocks)
}

/// One block: a fresh demo service from `dir`, its load, its stop.
fn run_block(args: &SoakArgs, dir: &Path, traced: bool, agent_port: u16) -> Result<Block> {
    let max_seconds = args.block.as_secs() + 120;
    let mut server = Command::new(&args.python)
        .arg(dir.join("server.py"))
        .args(["--workers", &args.workers.to_string(), "--port", "0"])
        .args(["--max-seconds", &max_seconds.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the demo service")?;
    let result = load_block(args, &mut server, traced, agent_port);
    terminate(&mut server);
    result
}

/// The load of one block on the started `server`: under the agent, once
/// the agent's page shows the service's master (its first window with
/// it: traced from the start of the load); without, once [`SETTLE`]
/// passed and the page does not show it.
fn load_block(args: &SoakArgs, server: &mut Child, traced: bool, agent_port: u16) -> Result<Block> {
    let port = started_port(server)?;
    let master = format!("pid=\"{}\"", server.id());
    let shown = || http_get(agent_port, "/metrics").is_some_and(|page| page.contains(&master));
    let confirmed = if traced {
        let wait = args.interval * 2 + SETTLE;
        wait_for(wait, || shown().then_some(())).is_some()
    } else {
        thread::sleep(SETTLE);
        !shown()
    };
    let mut load = Command::new(&args.python);
    load.arg(LOAD_SCRIPT)
        .args(["--port", &port.to_string()])
        .args(["--seconds", &args.block.as_secs_f64().to_string()])
        .args(["--threads", &LOAD_THREADS.to_string()]);
    let output = load
        .output()
        .with_context(|| format!("cannot start {load:?}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line: Option<Value> = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok());
    let Some(rps) = line
        .as_ref()
        .and_then(|l| l["requests_per_second"].as_f64())
    else {
        bail!("{load:?} printed no requests_per_second: {stdout}");
    };
    Ok(Block {
        traced,
        requests_per_second: rps,
        confirmed: confirmed && (traced || !shown()),
    })
}

/// The port of the service's `started` line; the rest of its output is
/// drained on a thread.
fn started_port(server: &mut Child) -> Result<u16> {
    let stdout = server.stdout.take().context("no service stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let port = lines.by_ref().map_while(Result::ok).find_map(|line| {
        let value: Value = serde_json::from_str(&line).ok()?;
        (value["event"] == "started").then(|| value["port"].as_u64())?
    });
    thread::spawn(move || lines.for_each(drop));
    port.and_then(|p| u16::try_from(p).ok())
        .context("the demo service printed no `started` line with its port")
}

/// The sampler thread and its rows.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: thread::JoinHandle<()>,
    take: Arc<dyn Fn() -> Sample + Send + Sync>,
}

impl Sampler {
    /// Takes a row now and every `every` from `agent_pid`'s `/proc`, its
    /// page on `agent_port` and `sent` (the byte counters).
    fn start(
        agent_pid: u32,
        agent_port: u16,
        every: Duration,
        sent: impl Fn() -> [u64; 3] + Send + Sync + 'static,
    ) -> Self {
        let started = Instant::now();
        let take: Arc<dyn Fn() -> Sample + Send + Sync> =
            Arc::new(move || sample(agent_pid, agent_port, started, &sent));
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let (stop_flag, rows, taker) = (Arc::clone(&stop), Arc::clone(&samples), Arc::clone(&take));
        let thread = thread::spawn(move || {
            let mut next = Instant::now();
            while !stop_flag.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    let row = taker();
                    if let Ok(mut rows) = rows.lock() {
                        rows.push(row);
                    }
                    next += every;
                }
                thread::sleep(Duration::from_millis(200));
            }
        });
        Self {
            stop,
            samples,
            thread,
            take,
        }
    }

    /// Takes a last row (the agent has stopped: its RSS reads 0 then, so
    /// only the counters are kept) and returns every row.
    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let last = (self.take)();
        let mut rows = self.samples.lock().map(|r| r.clone()).unwrap_or_default();
        if let Some(previous) = rows.last() {
            if last.sent_bytes != previous.sent_bytes {
                rows.push(Sample {
                    rss_bytes: previous.rss_bytes,
                    cpu_seconds: previous.cpu_seconds.max(last.cpu_seconds),
                    windows: previous.windows.max(last.windows),
                    ..last
                });
            }
        }
        rows
    }
}

/// One row now.
fn sample(pid: u32, port: u16, started: Instant, sent: &dyn Fn() -> [u64; 3]) -> Sample {
    let page = http_get(port, "/metrics").unwrap_or_default();
    let metric = |name: &str| metric_value(&page, name).unwrap_or_default() as u64;
    Sample {
        at_seconds: started.elapsed().as_secs_f64(),
        rss_bytes: vm_rss_bytes(pid).unwrap_or_default(),
        cpu_seconds: cpu_seconds(pid).unwrap_or_default(),
        windows: metric("memtrace_windows_emitted_total"),
        records_dropped: metric("memtrace_records_dropped_total"),
        own_rss_metric_bytes: metric("memtrace_resident_bytes"),
        sent_bytes: sent(),
        load_average: load_average().unwrap_or_default(),
    }
}

/// The value of the unlabelled sample `name` on a text-format page.
pub fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// VmRSS of `pid`, bytes.
fn vm_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// utime + stime of `pid` (`/proc/PID/stat` fields 14 and 15, in ticks of
/// 1/100 s: `getconf CLK_TCK` on Linux x86-64), seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// The 1-minute load average (`/proc/loadavg`).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The first value Prometheus's query API answers for `query`.
fn prometheus_value(port: u16, query: &str) -> Option<f64> {
    let body = http_get(port, &format!("/api/v1/query?query={query}"))?;
    let json: Value = serde_json::from_str(&body).ok()?;
    json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Copies the demo's Python files into `dir`; returns `dir`.
fn copy_demo(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for name in ["server.py", "app.py", "loadgen.py"] {
        let from = Path::new("examples/prefork_service").join(name);
        std::fs::copy(&from, dir.join(name))
            .with_context(|| format!("cannot copy `{}`", from.display()))?;
    }
    Ok(dir.to_path_buf())
}

/// Makes `dir` an empty folder.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot clear `{}`", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))
}
