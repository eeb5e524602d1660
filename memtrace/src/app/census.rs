//! The census worker of a session: a thread that takes each traced CPython
//! process's allocator census (`census`) while the session drains the ring
//! buffer, so a census never delays records. Each process is read at most
//! every [`CENSUS_INTERVAL`], and never more than [`MAX_DUTY`] of the time
//! (a census that took 50 ms waits 1 s before the next); it stops when the
//! process's end begins (exit, finalization, exec), keeping the last
//! census before it and the one at its highest anonymous RSS.

use std::{
    collections::HashMap,
    sync::mpsc::{self, Receiver, RecvTimeoutError, Sender},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    census::{CensusReport, Censuses, ImageCensus},
    process::{proc, ProcessId},
    python::PythonProcess,
};

/// Shortest time between two censuses of one process.
const CENSUS_INTERVAL: Duration = Duration::from_secs(1);
/// Largest share of a process's time its censuses may take: after a
/// census of `d`, the next waits at least `d / MAX_DUTY`.
const MAX_DUTY: f64 = 0.05;
/// How often the worker looks for due processes.
const POLL: Duration = Duration::from_millis(100);

enum Message {
    Python(u32, ProcessId, Box<PythonProcess>),
    End(u32),
}

/// The session's handle on the census thread.
pub(super) struct CensusWorker {
    tx: Option<Sender<Message>>,
    thread: Option<JoinHandle<CensusReport>>,
}

impl CensusWorker {
    /// Starts the thread.
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("memtrace-census".to_owned())
            .spawn(move || run(&rx))
            .ok();
        Self {
            tx: Some(tx),
            thread,
        }
    }

    /// A worker that takes no census and has no thread (`memtrace agent`:
    /// its windows carry no census, and the censuses kept per image would
    /// grow with every process that came and went).
    pub(super) fn off() -> Self {
        Self {
            tx: None,
            thread: None,
        }
    }

    /// Image `id` of `tgid` runs `python`: census it from now on.
    pub(super) fn python(&self, tgid: u32, id: ProcessId, python: &PythonProcess) {
        self.send(Message::Python(tgid, id, Box::new(python.clone())));
    }

    /// `tgid`'s image began to end: no census of it after this.
    pub(super) fn end(&self, tgid: u32) {
        self.send(Message::End(tgid));
    }

    fn send(&self, message: Message) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(message);
        }
    }

    /// Stops the thread; every image's censuses.
    pub(super) fn finish(&mut self) -> CensusReport {
        self.tx = None;
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// One process the worker reads.
struct Watched {
    python: PythonProcess,
    image: ImageCensus,
    due: Instant,
}

/// The thread: takes due censuses until the session hangs up.
fn run(rx: &Receiver<Message>) -> CensusReport {
    let mut censuses = Censuses::default();
    let mut watched: HashMap<u32, Watched> = HashMap::new();
    let mut report = CensusReport::default();
    loop {
        match rx.recv_timeout(POLL) {
            Ok(Message::Python(tgid, id, python)) => {
                end(&mut watched, &mut censuses, &mut report, tgid);
                let image = ImageCensus::new(id, tgid);
                let due = Instant::now();
                watched.insert(
                    tgid,
                    Watched {
                        python: *python,
                        image,
                        due,
                    },
                );
            }
            Ok(Message::End(tgid)) => end(&mut watched, &mut censuses, &mut report, tgid),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        for (&tgid, w) in &mut watched {
            if w.due <= Instant::now() {
                take(&mut censuses, tgid, w);
            }
        }
    }
    let tgids: Vec<u32> = watched.keys().copied().collect();
    for tgid in tgids {
        end(&mut watched, &mut censuses, &mut report, tgid);
    }
    report
}

/// Takes one census of `w`.
fn take(censuses: &mut Censuses, tgid: u32, w: &mut Watched) {
    let started = Instant::now();
    let now_ns = super::clock::monotonic_ns();
    let reader = proc::reader_pid(tgid).unwrap_or(tgid);
    if let Ok(census) = censuses.take(tgid, reader, Some(&w.python), now_ns) {
        if let Ok(rss) = proc::rss_bytes(reader) {
            w.image.add(census, rss[memtrace_common::MM_ANONPAGES]);
        }
    }
    let wait = started.elapsed().div_f64(MAX_DUTY).max(CENSUS_INTERVAL);
    w.due = Instant::now() + wait;
}

/// Stops reading `tgid`, keeping its censuses.
fn end(
    watched: &mut HashMap<u32, Watched>,
    censuses: &mut Censuses,
    report: &mut CensusReport,
    tgid: u32,
) {
    censuses.forget(tgid);
    if let Some(w) = watched.remove(&tgid) {
        if w.image.taken > 0 {
            report.images.push(w.image);
        }
    }
}
