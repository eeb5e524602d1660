//! The soak's backends, all on 127.0.0.1: the real Prometheus and the
//! real OpenTelemetry Collector that `cargo xtask test` installs
//! (`crate::prometheus`, `crate::otelcol`), a stand-in for Pyroscope's
//! `POST /ingest` (Pyroscope cannot be built here), and byte-counting TCP
//! relays between the agent and the first two, so the bytes the agent
//! sends each sink are counted on the wire.

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Sends SIGTERM to `child` and waits up to 10 s, then kills it.
pub fn terminate(child: &mut Child) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    // A pid this process started and has not reaped.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The body of `GET http://127.0.0.1:port{path}`, if it answered 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Polls `f` every 250 ms until it returns `Some` or `timeout` passed.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// A started server, ended (SIGTERM) when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        terminate(&mut self.0);
    }
}

/// A TCP relay from 127.0.0.1:`port` to 127.0.0.1:`upstream` that counts
/// the bytes each way.
pub struct CountingRelay {
    /// Where clients connect.
    pub port: u16,
    /// Bytes from clients to the upstream server.
    pub to_server: Arc<AtomicU64>,
    /// Bytes from the upstream server to clients.
    pub to_client: Arc<AtomicU64>,
}

impl CountingRelay {
    /// Relays every connection to `upstream` on its own threads.
    ///
    /// # Errors
    /// 127.0.0.1:0 cannot be bound.
    pub fn start(upstream: u16) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).context("cannot bind a relay")?;
        let port = listener.local_addr()?.port();
        let (to_server, to_client) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (up, down) = (Arc::clone(&to_server), Arc::clone(&to_client));
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue; // the upstream is down: the client sees a closed connection
                };
                pump(&client, &server, Arc::clone(&up));
                pump(&server, &client, Arc::clone(&down));
            }
        });
        Ok(Self {
            port,
            to_server,
            to_client,
        })
    }
}

/// Copies `from` to `to` on a thread, adding each chunk's length to
/// `count`; closes `to`'s write side at the end.
fn pump(from: &TcpStream, to: &TcpStream, count: Arc<AtomicU64>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let mut buffer = [0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
            count.fetch_add(n as u64, Ordering::Relaxed);
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// The stand-in for Pyroscope's `POST /ingest`: answers every request
/// 200 and counts requests, their bytes on the wire, and those whose
/// target is `/ingest?...format=pprof` with a gzip body.
pub struct IngestReceiver {
    /// Its port.
    pub port: u16,
    /// Requests received.
    pub requests: Arc<AtomicU64>,
    /// Their bytes (request line, headers, body).
    pub bytes: Arc<AtomicU64>,
    /// Requests that were `/ingest` with `format=pprof` and a gzip body.
    pub pprof_requests: Arc<AtomicU64>,
}

impl IngestReceiver {
    /// Listens on a free port.
    ///
    /// # Errors
    /// 127.0.0.1:0 cannot be bound.
    pub fn start() -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).context("cannot bind the receiver")?;
        let port = listener.local_addr()?.port();
        let receiver = Self {
            port,
            requests: Arc::default(),
            bytes: Arc::default(),
            pprof_requests: Arc::default(),
        };
        let counts = [
            Arc::clone(&receiver.requests),
            Arc::clone(&receiver.bytes),
            Arc::clone(&receiver.pprof_requests),
        ];
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counts = counts.clone();
                thread::spawn(move || serve_ingest(stream, &counts));
            }
        });
        Ok(receiver)
    }
}

/// Serves the requests of one connection (keep-alive), counting each.
fn serve_ingest(stream: TcpStream, [requests, bytes, pprof]: &[Arc<AtomicU64>; 3]) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let (Ok(read_half), Ok(mut write_half)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    while let Some((target, size, body)) = read_request(&mut reader) {
        requests.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(size, Ordering::Relaxed);
        let gzip = body.starts_with(&[0x1f, 0x8b]);
        if target.starts_with("/ingest?") && target.contains("format=pprof") && gzip {
            pprof.fetch_add(1, Ordering::Relaxed);
        }
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        if write_half.write_all(answer).is_err() {
            return;
        }
    }
}

/// One request: its target, its size on the wire and its body.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, u64, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let target = line.split_whitespace().nth(1)?.to_owned();
    let mut size = line.len() as u64;
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        size += reader.read_line(&mut header).ok()? as u64;
        let header = header.trim();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((target, size + length as u64, body))
}

/// The real Prometheus, scraping `target` (host:port) every `interval`,
/// its data in `dir`.
pub fn start_prometheus(dir: &Path, target: &str, interval: Duration) -> Result<(Running, u16)> {
    let binary = PathBuf::from("target/prometheus/tree/usr/bin/prometheus");
    if !binary.exists() {
        bail!(
            "`{}` is missing (cargo xtask test installs it)",
            binary.display()
        );
    }
    let config = dir.join("prometheus.yml");
    let seconds = interval.as_secs().max(1);
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: {seconds}s\n  scrape_timeout: {seconds}s\n\
             scrape_configs:\n  - job_name: memtrace\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )?;
    let port = free_port()?;
    let child = Command::new(&binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start `{}`", binary.display()))?;
    let running = Running(child);
    if wait_for(Duration::from_secs(30), || http_get(port, "/-/ready")).is_none() {
        bail!("prometheus did not become ready on 127.0.0.1:{port}");
    }
    Ok((running, port))
}

/// The real OpenTelemetry Collector on 127.0.0.1:`port` (OTLP over HTTP),
/// profiles to its debug exporter at `basic` verbosity (one line per
/// export), its output in `dir/collector.log`.
pub fn start_collector(dir: &Path, port: u16) -> Result<Running> {
    let binary = PathBuf::from("target/otelcol/memtrace-otelcol");
    if !binary.exists() {
        bail!(
            "`{}` is missing (cargo xtask test builds it)",
            binary.display()
        );
    }
    let config = dir.join("collector.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  debug:\n    verbosity: basic\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    \
             profiles:\n      receivers: [otlp]\n      exporters: [debug]\n"
        ),
    )?;
    let log = dir.join("collector.log");
    let out = std::fs::File::create(&log)?;
    let child = Command::new(&binary)
        .arg(format!("--config=file:{}", config.display()))
        .arg("--feature-gates=service.profilesSupport")
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("cannot start `{}`", binary.display()))?;
    let running = Running(child);
    let ready = wait_for(Duration::from_secs(30), || {
        let printout = std::fs::read_to_string(&log).unwrap_or_default();
        printout.contains("Everything is ready").then_some(())
    });
    if ready.is_none() {
        bail!("the collector did not start; see `{}`", log.display());
    }
    Ok(running)
}

/// Profiles the collector's debug exporter logged (`basic` verbosity: one
/// `Profiles` line per export with its `resource profiles` count).
pub fn collector_exports(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("collector.log"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("resource profiles"))
        .count() as u64
}
