//! Capture replay: a read [`Capture`] is fed to an
//! [`Aggregator`](crate::aggregate::Aggregator) through the same calls the
//! live run made, so `memtrace report FILE` shows what the live run showed. A window of the capture can be replayed alone (for
//! `memtrace diff --from --to`).

use std::collections::{HashMap, HashSet};

use memtrace_common::ProcessCounters;

use super::format::{ExecLine, Line, ProcessLine};
use super::reader::Capture;
use crate::aggregate::{Aggregator, Frame, ProcessId, ProcessStart, Report, RunMeta, StackId};

/// The report of the whole capture (not yet diagnosed). A capture without an `end` line ends at its latest time, with
/// the command and sampling interval of its header and unknown record
/// counts (0).
pub fn replay(capture: &Capture) -> Report {
    replay_window(capture, None, None)
}

/// The report of the part of the capture from `from_ns` to `to_ns`
/// (nanoseconds since the capture start; `None` for its start or end), not
/// yet diagnosed. Counter reads and sampled bytes count only inside the window;
/// processes alive at some point of it are included (those that exited
/// before it and those that started after it are not); times stay relative
/// to the capture start; bytes held at high-water marks are left out (they
/// belong to whole lives, not windows). The run facts are the capture's,
/// with the duration of the window.
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
            cut_after_ns: Some(capture.covered_ns()),
            ..RunMeta::default()
        })
    };
    replay.aggregator.finish(window.to_ns, meta)
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
/// capture process ids are replayed as which of the aggregator's.
struct Replay {
    aggregator: Aggregator,
    window: Window,
    stacks: HashMap<StackId, Vec<Frame>>,
    /// Capture stack id -> the aggregator's.
    stack_ids: HashMap<StackId, StackId>,
    /// Capture process ids whose process ended before the window.
    ended_before: HashSet<ProcessId>,
    /// Capture process id -> the aggregator's, for the replayed ones.
    replayed: HashMap<ProcessId, ProcessId>,
}

impl Replay {
    fn new(capture: &Capture, window: Window) -> Self {
        Self {
            aggregator: Aggregator::new(capture.header.start_ns),
            window,
            stacks: HashMap::new(),
            stack_ids: HashMap::new(),
            ended_before: if window.whole {
                HashSet::new()
            } else {
                ended_before(&capture.lines, window.from_ns)
            },
            replayed: HashMap::new(),
        }
    }

    /// The aggregator's id of capture process `id`, if it is replayed.
    fn id(&self, id: ProcessId) -> Option<ProcessId> {
        self.replayed.get(&id).copied()
    }

    /// Applies one line, as the live run did, if it counts in the window.
    fn apply(&mut self, line: &Line) {
        match line {
            Line::Process(p) => self.start(p),
            Line::Exec(e) => self.exec(e),
            Line::ExitBegan(e) => {
                if let Some(id) = self.id(e.process).filter(|_| self.window.reached(e.ts_ns)) {
                    self.aggregator.exit_began(id, e.ts_ns, e.by, &e.counters);
                }
            }
            Line::Exit(e) => {
                if let Some(id) = self.id(e.process).filter(|_| self.window.reached(e.ts_ns)) {
                    self.aggregator
                        .process_exited(id, e.ts_ns, e.status, e.counters.as_ref());
                }
            }
            Line::Python(p) => {
                if let Some(id) = self.id(p.process) {
                    self.aggregator.python_status(id, p.status.clone());
                }
            }
            Line::Counters(c) => {
                if let Some(id) = self.id(c.process).filter(|_| self.window.contains(c.ts_ns)) {
                    self.aggregator
                        .counters(id, c.ts_ns, &c.counters, c.sharing);
                }
            }
            Line::Stacks(stacks) => {
                self.stacks
                    .extend(stacks.iter().map(|(id, frames)| (*id, frames.clone())));
            }
            Line::Paths(paths) if self.window.contains(paths.ts_ns) => {
                for delta in &paths.deltas {
                    if let Some(id) = self.id(delta.0) {
                        let stack = self.stack(delta.1);
                        self.aggregator.path_delta(id, paths.ts_ns, stack, delta.2);
                    }
                }
            }
            Line::Peaks(peaks) if self.window.whole => {
                for peak in peaks {
                    if let Some(id) = self.id(peak.0) {
                        let stack = self.stack(peak.1);
                        self.aggregator.peak_held(id, stack, peak.2);
                    }
                }
            }
            Line::Held(h) => {
                if let Some(id) = self.id(h.process) {
                    self.aggregator.held_state(id, h.state);
                }
            }
            _ => {}
        }
    }

    /// A process line: replayed unless it ended before the window or starts
    /// after it.
    fn start(&mut self, line: &ProcessLine) {
        let start = &line.start;
        if self.ended_before.contains(&line.id) || !self.window.reached(start.ts_ns) {
            return;
        }
        let parent = start.parent.and_then(|parent| self.id(parent));
        let mut start = ProcessStart {
            parent,
            ..start.clone()
        };
        if !self.window.contains(start.ts_ns) {
            // What it started from is a counter read before the window: its
            // RSS in the window starts at its first read inside it.
            start.counters = ProcessCounters::default();
        }
        let id = self.aggregator.process_started(start);
        self.replayed.insert(line.id, id);
    }

    /// An exec line: the new image is replayed when the old one was.
    fn exec(&mut self, line: &ExecLine) {
        let Some(id) = self
            .id(line.process)
            .filter(|_| self.window.reached(line.ts_ns))
        else {
            return;
        };
        let image =
            self.aggregator
                .process_exec(id, line.ts_ns, &line.counters, line.cmdline.clone());
        self.replayed.insert(line.image, image);
    }

    /// The aggregator's id of capture stack `id`, interning its frames (an
    /// unknown frame saying so when no `stacks` line defined it).
    fn stack(&mut self, id: StackId) -> StackId {
        if let Some(&interned) = self.stack_ids.get(&id) {
            return interned;
        }
        let frames = self.stacks.get(&id).cloned().unwrap_or_else(|| {
            vec![Frame::Unknown {
                reason: format!("stack {} missing from the capture", id.0),
            }]
        });
        let interned = self.aggregator.intern(frames);
        self.stack_ids.insert(id, interned);
        interned
    }
}

/// Capture process ids (all images) of the processes that exited before
/// `from_ns`.
fn ended_before(lines: &[Line], from_ns: u64) -> HashSet<ProcessId> {
    let mut image_of: HashMap<ProcessId, ProcessId> = HashMap::new();
    let mut images: HashMap<ProcessId, Vec<ProcessId>> = HashMap::new();
    let mut ended = HashSet::new();
    for line in lines {
        match line {
            Line::Process(p) => {
                image_of.insert(p.id, p.id);
                images.insert(p.id, vec![p.id]);
            }
            Line::Exec(e) => {
                if let Some(&first) = image_of.get(&e.process) {
                    image_of.insert(e.image, first);
                    images.entry(first).or_default().push(e.image);
                }
            }
            Line::Exit(e) if e.ts_ns < from_ns => {
                if let Some(first) = image_of.get(&e.process) {
                    ended.extend(images.get(first).into_iter().flatten().copied());
                }
            }
            _ => {}
        }
    }
    ended
}
