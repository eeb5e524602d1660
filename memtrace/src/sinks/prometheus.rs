//! The Prometheus sink: `--metrics ADDR` serves the latest window at
//! `GET /metrics` in Prometheus's text exposition format 0.0.4
//! (`text/plain; version=0.0.4`, which Prometheus 3 accepts; see
//! <https://prometheus.io/docs/instrumenting/exposition_formats/>), from a
//! thread of its own with std's `TcpListener`: a scrape never waits on the
//! ring-buffer reader, and a send only swaps the page served.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;

use super::{Sink, Window};
use crate::aggregate::Frame;

/// The `Content-Type` of the page: the text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How long one client may take to send its request or read the page.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a request's head read.
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Serves the latest window's metrics.
#[derive(Debug)]
pub struct PrometheusSink {
    page: Arc<Mutex<String>>,
    addr: SocketAddr,
    top: usize,
}

impl PrometheusSink {
    /// Binds `addr` (`PORT`, bound to 127.0.0.1, or `HOST:PORT`) and serves
    /// `/metrics` from a new thread; the page shows the top `top` paths per
    /// service. Until the first window it holds only memtrace's health.
    ///
    /// # Errors
    /// An address that does not parse or cannot be bound.
    pub fn bind(addr: &str, top: usize) -> anyhow::Result<Self> {
        let addr = parse_addr(addr)?;
        let listener =
            TcpListener::bind(addr).with_context(|| format!("--metrics: cannot bind {addr}"))?;
        let addr = listener.local_addr()?;
        let page = Arc::new(Mutex::new(render(&Window::default(), top)));
        let served = Arc::clone(&page);
        std::thread::Builder::new()
            .name("memtrace-metrics".to_owned())
            .spawn(move || serve(&listener, &served))
            .context("cannot start the metrics thread")?;
        Ok(Self { page, addr, top })
    }

    /// The address it listens on (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Sink for PrometheusSink {
    fn name(&self) -> &str {
        "prometheus"
    }

    fn destination(&self) -> String {
        format!("prometheus at http://{}/metrics", self.addr)
    }

    fn send(&mut self, window: &Window) -> anyhow::Result<()> {
        let text = render(window, self.top);
        let mut page = self
            .page
            .lock()
            .map_err(|_| anyhow::anyhow!("the metrics thread panicked"))?;
        *page = text;
        Ok(())
    }
}

/// `PORT` or `HOST:PORT` as a socket address (`PORT` on 127.0.0.1).
fn parse_addr(addr: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| format!("--metrics {addr:?}: expected PORT or HOST:PORT"))
}

/// Answers clients one after the other, for as long as the process lives.
fn serve(listener: &TcpListener, page: &Mutex<String>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        // A client that leaves or stalls only loses its own answer.
        let _ = answer(stream, page);
    }
}

/// Reads one request's head and answers it: the page for `GET /metrics`
/// (headers only for `HEAD`), 404 for another path, 405 for another method.
fn answer(mut stream: TcpStream, page: &Mutex<String>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let head = read_head(&mut stream)?;
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let text = page.lock().map(|p| p.clone()).unwrap_or_default();
            ("200 OK", CONTENT_TYPE, text)
        }
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "see /metrics\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes())
}

/// The request's head (up to the blank line, at most [`MAX_REQUEST_BYTES`]).
fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut buf = [0_u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// One metric family being written: its samples follow its HELP and TYPE.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Self { out, name }
    }

    /// One sample with `labels` (name, value) and `value`.
    fn sample(&mut self, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (name, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{name}=\"{}\"", escape(value));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value escaped as the text format wants: `\`, `"` and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The page for `window`: per process (labels `service_name`, `role`,
/// `pid`) its RSS and parts, PSS, USS, growth and copy-on-write bytes; per
/// service its `top` paths by bytes held; memtrace's health.
pub fn render(window: &Window, top: usize) -> String {
    let mut out = String::new();
    render_processes(&mut out, window);
    render_paths(&mut out, window, top);
    render_health(&mut out, window);
    out
}

/// The per-process families.
fn render_processes(out: &mut String, window: &Window) {
    type Value = fn(&super::ProcessWindow) -> Option<i128>;
    let families: [(&str, &str, &str, Value); 8] = [
        (
            "memtrace_process_resident_bytes",
            "gauge",
            "Resident set size (VmRSS) of a traced process, from the kernel's counters.",
            |p| Some(p.resident_bytes.into()),
        ),
        (
            "memtrace_process_resident_anon_bytes",
            "gauge",
            "Resident anonymous memory (RssAnon) of a traced process.",
            |p| Some(p.anon_bytes.into()),
        ),
        (
            "memtrace_process_resident_file_bytes",
            "gauge",
            "Resident file-backed memory (RssFile) of a traced process.",
            |p| Some(p.file_bytes.into()),
        ),
        (
            "memtrace_process_resident_shmem_bytes",
            "gauge",
            "Resident shared memory (RssShmem) of a traced process.",
            |p| Some(p.shmem_bytes.into()),
        ),
        (
            "memtrace_process_pss_bytes",
            "gauge",
            "Proportional set size of a traced process (smaps_rollup Pss).",
            |p| p.pss_bytes.map(Into::into),
        ),
        (
            "memtrace_process_uss_bytes",
            "gauge",
            "Private memory of a traced process (smaps_rollup Private_Clean + Private_Dirty).",
            |p| p.uss_bytes.map(Into::into),
        ),
        (
            "memtrace_process_growth_bytes",
            "gauge",
            "RSS now minus RSS when tracing of the process began (a fork: what it inherited).",
            |p| Some(p.growth_bytes.into()),
        ),
        (
            "memtrace_process_cow_bytes_total",
            "counter",
            "Copy-on-write faults of a traced process times the page size, since tracing began.",
            |p| Some(p.cow_bytes_total.into()),
        ),
    ];
    for (name, kind, help, value) in families {
        let mut family = Family::new(out, name, kind, help);
        for p in &window.processes {
            let pid = p.labels.pid.to_string();
            let labels = [
                ("service_name", p.labels.service_name.as_str()),
                ("role", p.labels.role.as_str()),
                ("pid", pid.as_str()),
            ];
            if let Some(v) = value(p) {
                family.sample(&labels, v);
            }
        }
    }
}

/// `memtrace_path_held_bytes`: per service, the bytes its processes' paths
/// hold at the window's end, summed by the path's line (its innermost
/// frame of the user's own code, else its innermost Python frame, else its
/// innermost frame), the `top` largest.
fn render_paths(out: &mut String, window: &Window, top: usize) {
    let mut by_service: BTreeMap<&str, BTreeMap<(String, String, u32), u64>> = BTreeMap::new();
    for p in &window.processes {
        let lines = by_service.entry(&p.labels.service_name).or_default();
        for path in p.paths.iter().filter(|path| path.held_bytes > 0) {
            let held = lines.entry(path_line(&path.frames)).or_default();
            *held = held.saturating_add(path.held_bytes);
        }
    }
    let mut family = Family::new(
        out,
        "memtrace_path_held_bytes",
        "gauge",
        "Sampled bytes a service's paths hold now, by the path's innermost line of the \
         service's own code (the top paths per service).",
    );
    for (service, lines) in by_service {
        let mut lines: Vec<_> = lines.into_iter().collect();
        lines.sort_by(|a, b| (b.1, &a.0).cmp(&(a.1, &b.0)));
        for ((function, file, line), held) in lines.into_iter().take(top) {
            let line = line.to_string();
            let labels = [
                ("service_name", service),
                ("function", function.as_str()),
                ("file", file.as_str()),
                ("line", line.as_str()),
            ];
            family.sample(&labels, held);
        }
    }
}

/// The (function, file, line) a path is shown as: its innermost frame of
/// the user's own code, else its innermost Python frame, else its
/// innermost frame (file `""`, line 0).
fn path_line(frames: &[Frame]) -> (String, String, u32) {
    let python = frames.iter().rev().find(|f| f.is_user_code()).or_else(|| {
        frames
            .iter()
            .rev()
            .find(|f| matches!(f, Frame::Python { .. }))
    });
    match python.or_else(|| frames.last()) {
        Some(Frame::Python {
            function,
            file,
            line,
        }) => (function.clone(), file.clone(), *line),
        Some(other) => (other.to_string(), String::new(), 0),
        None => ("[empty stack]".to_owned(), String::new(), 0),
    }
}

/// memtrace's own health families.
fn render_health(out: &mut String, window: &Window) {
    let h = &window.health;
    let families: [(&str, &str, &str, u64); 7] = [
        (
            "memtrace_records_read_total",
            "counter",
            "Ring-buffer records memtrace read.",
            h.records_read,
        ),
        (
            "memtrace_records_dropped_total",
            "counter",
            "Ring-buffer records the kernel dropped (a full buffer).",
            h.records_dropped,
        ),
        (
            "memtrace_windows_emitted_total",
            "counter",
            "Windows memtrace closed and sent to its sinks.",
            h.windows_emitted,
        ),
        (
            "memtrace_sink_errors_total",
            "counter",
            "Sends to a sink that failed.",
            h.sink_errors,
        ),
        (
            "memtrace_sink_windows_dropped_total",
            "counter",
            "Windows sinks dropped without delivering them.",
            h.windows_dropped,
        ),
        (
            "memtrace_resident_bytes",
            "gauge",
            "memtrace's own RSS (VmRSS).",
            h.own_resident_bytes,
        ),
        (
            "memtrace_traced_processes",
            "gauge",
            "Process images traced at the window's end.",
            u64::try_from(window.processes.len()).unwrap_or(u64::MAX),
        ),
    ];
    for (name, kind, help, value) in families {
        Family::new(out, name, kind, help).sample(&[], value);
    }
    let end_s = window.end_ns as f64 / 1e9;
    Family::new(
        out,
        "memtrace_window_end_timestamp_seconds",
        "gauge",
        "When the window shown closed, Unix time.",
    )
    .sample(&[], format!("{end_s:.3}"));
}

#[cfg(test)]
#[path = "prometheus_tests.rs"]
mod tests;
