//! Delivery of the network sinks, the last step of the data flow: each
//! sink's windows go to a thread of its own through a bounded queue, are
//! encoded there ([`Encode`]: Pyroscope's pprof, OTLP profiles) and POSTed
//! over plain HTTP with `ureq`, each request retried with backoff a bounded
//! number of times. The agent's window thread only clones a window into the
//! queue (a full queue drops the window and counts it), so a sink that is
//! down, slow or refuses never blocks it nor the ring-buffer reader.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use super::window::{Sink, Window};

/// One HTTP POST a window turns into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `http://host:port/path`.
    pub url: String,
    /// Query parameters, percent-encoded when sent.
    pub query: Vec<(&'static str, String)>,
    /// Headers (`Content-Type` among them).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What turns a window into the requests of one backend.
pub trait Encode: Send + 'static {
    /// The requests that deliver `window`.
    ///
    /// # Errors
    /// The window cannot be encoded (it is counted as dropped).
    fn requests(&self, window: &Window) -> Result<Vec<Request>>;
}

/// Bounds of one sink's delivery.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Windows waiting to be sent; one more is dropped.
    pub queue_windows: usize,
    /// Attempts per request (the first included).
    pub attempts: u32,
    /// Wait before the second attempt; it doubles after each failure.
    pub first_backoff: Duration,
    /// Time one attempt may take, connection included.
    pub timeout: Duration,
    /// How long the end of a run waits for the queue to empty.
    pub flush_timeout: Duration,
}

impl Default for Policy {
    /// 8 windows queued (2 minutes of 15 s windows), 4 attempts 0.5, 1 and
    /// 2 s apart, 5 s per attempt, 15 s to flush at the end.
    fn default() -> Self {
        Self {
            queue_windows: 8,
            attempts: 4,
            first_backoff: Duration::from_millis(500),
            timeout: Duration::from_secs(5),
            flush_timeout: Duration::from_secs(15),
        }
    }
}

/// What a sink's thread counted so far.
#[derive(Debug, Default)]
struct Counters {
    /// Windows delivered (every request of them answered 2xx).
    sent: AtomicU64,
    /// Windows not delivered: a full queue, an encoding error, retries
    /// exhausted.
    dropped: AtomicU64,
    /// Failed attempts (refused, timed out, non-2xx answer).
    errors: AtomicU64,
}

/// A network sink: a thread, its queue and its counters.
pub struct QueuedSink {
    name: String,
    sender: Option<SyncSender<Window>>,
    counters: Arc<Counters>,
    done: Receiver<()>,
    worker: Option<JoinHandle<()>>,
    policy: Policy,
    /// Whether the previous window found the queue full (to warn once per
    /// run of drops).
    full: bool,
}

impl QueuedSink {
    /// Starts the thread of sink `name`, which delivers with `encoder`.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn start(name: &str, encoder: impl Encode, policy: Policy) -> Result<Self> {
        let (sender, windows) = mpsc::sync_channel(policy.queue_windows);
        let (done_sender, done) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread_name = name.to_owned();
        let worker = std::thread::Builder::new()
            .name(format!("memtrace-{name}"))
            .spawn(move || {
                deliver_all(&thread_name, &encoder, &windows, &thread_counters, policy);
                // The receiver may be gone (a flush that timed out).
                let _ = done_sender.send(());
            })
            .with_context(|| format!("cannot start the {name} sink's thread"))?;
        Ok(Self {
            name: name.to_owned(),
            sender: Some(sender),
            counters,
            done,
            worker: Some(worker),
            policy,
            full: false,
        })
    }

    /// Windows delivered so far.
    pub fn windows_sent(&self) -> u64 {
        self.counters.sent.load(Ordering::Relaxed)
    }
}

impl Sink for QueuedSink {
    fn name(&self) -> &str {
        &self.name
    }

    /// Queues a copy of `window`; a full queue drops it (counted, warned
    /// once per run of drops) and is not an error.
    fn send(&mut self, window: &Window) -> Result<()> {
        let Some(sender) = &self.sender else {
            bail!("the {} sink is closed", self.name);
        };
        match sender.try_send(window.clone()) {
            Ok(()) => self.full = false,
            Err(TrySendError::Full(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.full {
                    eprintln!(
                        "memtrace: warning: {}: {} windows queued, the sink does not keep up: \
                         dropping windows until it does",
                        self.name, self.policy.queue_windows
                    );
                }
                self.full = true;
            }
            Err(TrySendError::Disconnected(_)) => bail!("the {} sink's thread ended", self.name),
        }
        Ok(())
    }

    fn windows_dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    fn send_errors(&self) -> u64 {
        self.counters.errors.load(Ordering::Relaxed)
    }
}

impl Drop for QueuedSink {
    /// Closes the queue and waits up to the policy's flush timeout for the
    /// windows in it to be delivered (or given up), then logs the counts.
    fn drop(&mut self) {
        self.sender = None;
        match self.done.recv_timeout(self.policy.flush_timeout) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(worker) = self.worker.take() {
                    let _ = worker.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => eprintln!(
                "memtrace: warning: {}: windows still queued after {} s: not sent",
                self.name,
                self.policy.flush_timeout.as_secs()
            ),
        }
        eprintln!(
            "memtrace: {}: {} windows sent, {} dropped, {} send errors",
            self.name,
            self.windows_sent(),
            self.windows_dropped(),
            self.send_errors()
        );
    }
}

/// The thread's loop: every window queued, until the queue closes.
fn deliver_all(
    name: &str,
    encoder: &dyn Encode,
    windows: &Receiver<Window>,
    counters: &Counters,
    policy: Policy,
) {
    let agent = http_agent(policy.timeout);
    for window in windows {
        let delivered = encoder
            .requests(&window)
            .context("cannot encode the window")
            .and_then(|requests| {
                requests
                    .iter()
                    .try_for_each(|request| deliver(&agent, request, counters, policy))
            });
        match delivered {
            Ok(()) => counters.sent.fetch_add(1, Ordering::Relaxed),
            Err(err) => {
                eprintln!("memtrace: warning: {name}: window dropped: {err:#}");
                counters.dropped.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// An HTTP client whose attempts end after `timeout`, with non-2xx
/// answers as errors.
fn http_agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .build()
        .into()
}

/// POSTs `request`, retrying with backoff; a 4xx answer other than 429 is
/// not retried (the same body would be refused again).
fn deliver(
    agent: &ureq::Agent,
    request: &Request,
    counters: &Counters,
    policy: Policy,
) -> Result<()> {
    let mut backoff = policy.first_backoff;
    let mut attempt = 1;
    loop {
        let Err(err) = post(agent, request) else {
            return Ok(());
        };
        counters.errors.fetch_add(1, Ordering::Relaxed);
        let refused = matches!(err, ureq::Error::StatusCode(code) if (400..500).contains(&code) && code != 429);
        if refused || attempt >= policy.attempts {
            bail!(
                "POST {} failed after {attempt} attempts: {err}",
                request.url
            );
        }
        std::thread::sleep(backoff);
        backoff = backoff.saturating_mul(2);
        attempt += 1;
    }
}

fn post(agent: &ureq::Agent, request: &Request) -> Result<(), ureq::Error> {
    let mut builder = agent.post(&request.url);
    for (key, value) in &request.query {
        builder = builder.query(*key, value);
    }
    for (key, value) in &request.headers {
        builder = builder.header(*key, value);
    }
    builder.send(request.body.as_slice()).map(drop)
}

/// Checks `url` given to `flag`: `http://host[:port][/path]` (memtrace has
/// no TLS stack: `https` is refused with a hint), and warns when nothing
/// listens there now (windows are retried and counted, not lost silently).
///
/// # Errors
/// `url` is not such a URL.
pub fn check_url(flag: &str, url: &str) -> Result<()> {
    let uri: ureq::http::Uri = url
        .parse()
        .with_context(|| format!("{flag} {url:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => bail!(
            "{flag} {url}: memtrace speaks plain HTTP only (no TLS stack is built in): use \
             http://, e.g. to a local collector or agent that forwards over TLS"
        ),
        _ => bail!("{flag} {url:?}: expected http://HOST[:PORT][/PATH]"),
    }
    let Some(host) = uri.host() else {
        bail!("{flag} {url:?}: no host");
    };
    let port = uri.port_u16().unwrap_or(80);
    let reachable = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok());
    if !reachable {
        eprintln!(
            "memtrace: warning: {flag} {url}: nothing answers at {host}:{port} now; windows will \
             be retried and counted as dropped while it is down"
        );
    }
    Ok(())
}
