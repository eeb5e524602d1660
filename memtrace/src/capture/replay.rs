//! Capture replay: a read [`Capture`] is fed to an
//! [`Aggregator`](crate::aggregate::Aggregator) through the same calls the
//! live app makes, then diagnosed, so `memtrace report FILE` shows what the
//! live run showed. A window of the capture can be replayed alone (for
//! `memtrace diff --from --to`).

use std::collections::{HashMap, HashSet};

use super::format::Line;
use super::reader::Capture;
use crate::aggregate::{Aggregator, Frame, Report, RunMeta, StackId};
use crate::diagnose;

/// The report of the whole capture, diagnosed ([`Report::diagnosis`]
/// filled). A capture without an `end` line ends at its latest time, with
/// the command and sampling interval of its header and unknown record
/// counts (0).
pub fn replay(capture: &Capture) -> Report {
    replay_window(capture, None, None)
}

/// The report of the part of the capture from `from_ns` to `to_ns`
/// (nanoseconds since the capture start; `None` for its start or end),
/// diagnosed. Counter reads and sampled bytes count only inside the window;
/// processes alive at some point of it are included (those that exited
/// before it and those that started after it are not); times stay relative
/// to the capture start. The run facts are the capture's, with the
/// duration of the window.
pub fn replay_window(capture: &Capture, from_ns: Option<u64>, to_ns: Option<u64>) -> Report {
    let start_ns = capture.header.start_ns;
    let capture_end_ns = match capture.end() {
        Some(meta) => start_ns.saturating_add(meta.duration_ns),
        None => capture.latest_ns(),
    };
    let window = Window {
        from_ns: start_ns.saturating_add(from_ns.unwrap_or(0)),
        to_ns: to_ns.map_or(capture_end_ns, |t| {
            start_ns.saturating_add(t).min(capture_end_ns)
        }),
        whole: from_ns.is_none() && to_ns.is_none(),
    };
    let mut replay = Replay::new(capture, window);
    for line in &capture.lines {
        replay.apply(line);
    }
    let meta = RunMeta {
        duration_ns: window.to_ns.saturating_sub(window.from_ns),
        ..capture.end().cloned().unwrap_or_else(|| RunMeta {
            command: capture.header.command.clone(),
            sample_interval_bytes: capture.header.sample_interval_bytes,
            ..RunMeta::default()
        })
    };
    let mut report = replay.aggregator.finish(window.to_ns, meta);
    report.diagnosis = diagnose::diagnose(&report);
    report
}

/// The replayed part of a capture, in CLOCK_MONOTONIC ns.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// Start (included).
    from_ns: u64,
    /// End (excluded, except for the whole capture).
    to_ns: u64,
    /// The whole capture: every line counts.
    whole: bool,
}

impl Window {
    /// Whether a counter read or sampled bytes at `ts_ns` count.
    fn contains(self, ts_ns: u64) -> bool {
        self.whole || (self.from_ns..self.to_ns).contains(&ts_ns)
    }

    /// Whether a process event at `ts_ns` happened before the window ended.
    fn reached(self, ts_ns: u64) -> bool {
        self.whole || ts_ns < self.to_ns
    }
}

/// Replay state: the aggregator, the capture's stacks by id, and which
/// processes are replayed.
struct Replay {
    aggregator: Aggregator,
    window: Window,
    stacks: HashMap<StackId, Vec<Frame>>,
    /// Processes (tgid, start time) that exited before the window.
    ended_before: HashSet<(u32, u64)>,
    /// Processes whose lines are applied now.
    replayed: HashSet<u32>,
    /// Processes whose lines are skipped now (they ended before the window).
    skipped: HashSet<u32>,
}

impl Replay {
    fn new(capture: &Capture, window: Window) -> Self {
        Self {
            aggregator: Aggregator::new(capture.header.start_ns),
            window,
            stacks: HashMap::new(),
            ended_before: if window.whole {
                HashSet::new()
            } else {
                ended_before(&capture.lines, window.from_ns)
            },
            replayed: HashSet::new(),
            skipped: HashSet::new(),
        }
    }

    /// Applies one line, as the live app did, if it counts in the window.
    fn apply(&mut self, line: &Line) {
        match line {
            Line::Process(p) if self.window.reached(p.ts_ns) => {
                if self.ended_before.contains(&(p.tgid, p.ts_ns)) {
                    self.replayed.remove(&p.tgid);
                    self.skipped.insert(p.tgid);
                    return;
                }
                self.skipped.remove(&p.tgid);
                self.replayed.insert(p.tgid);
                self.aggregator.process_started(p.clone());
            }
            Line::Exec(e) if self.applies(e.tgid, e.ts_ns) => {
                self.aggregator
                    .process_exec(e.tgid, e.ts_ns, e.cmdline.clone());
            }
            Line::Exit(e) if self.applies(e.tgid, e.ts_ns) => {
                self.aggregator.process_exited(e.tgid, e.ts_ns);
            }
            Line::Python(p) if self.replayed.contains(&p.tgid) || self.window.whole => {
                self.aggregator.python_status(p.tgid, p.status.clone());
            }
            Line::Counters(c)
                if self.window.contains(c.ts_ns) && !self.skipped.contains(&c.tgid) =>
            {
                self.aggregator.counters(c.tgid, c.ts_ns, &c.counters);
            }
            Line::Stacks(stacks) => {
                self.stacks
                    .extend(stacks.iter().map(|(id, frames)| (*id, frames.clone())));
            }
            Line::Paths(paths) if self.window.contains(paths.ts_ns) => {
                for delta in &paths.deltas {
                    if !self.skipped.contains(&delta.0) {
                        let frames = self.frames(delta.1);
                        self.aggregator
                            .path_delta(delta.0, paths.ts_ns, frames, delta.2);
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether a process event of `tgid` at `ts_ns` is replayed.
    fn applies(&self, tgid: u32, ts_ns: u64) -> bool {
        self.window.whole || (self.window.reached(ts_ns) && self.replayed.contains(&tgid))
    }

    /// Frames of capture stack `id`; an unknown frame saying so when no
    /// `stacks` line defined it.
    fn frames(&self, id: StackId) -> Vec<Frame> {
        self.stacks.get(&id).cloned().unwrap_or_else(|| {
            vec![Frame::Unknown {
                reason: format!("stack {} missing from the capture", id.0),
            }]
        })
    }
}

/// Processes (tgid, start time) that started and exited before `from_ns`.
fn ended_before(lines: &[Line], from_ns: u64) -> HashSet<(u32, u64)> {
    let mut started: HashMap<u32, u64> = HashMap::new();
    let mut ended = HashSet::new();
    for line in lines {
        match line {
            Line::Process(p) => {
                started.insert(p.tgid, p.ts_ns);
            }
            Line::Exit(e) if e.ts_ns < from_ns => {
                if let Some(start_ns) = started.remove(&e.tgid) {
                    ended.insert((e.tgid, start_ns));
                }
            }
            _ => {}
        }
    }
    ended
}
