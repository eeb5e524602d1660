//! The aggregation step's input during `record`/`run`: every call goes to
//! the live [`Aggregator`] and, with `--capture`, to the [`CaptureWriter`],
//! so the capture replays into the report the live run printed. Periodic
//! counter reads are thinned here, for both, to one per process per
//! [`PERIODIC_COUNTERS_INTERVAL_NS`] unless RSS moved by
//! [`PERIODIC_RSS_CHANGE_BYTES`] since the last one kept.

use std::collections::HashMap;
use std::io::Write;

use memtrace_common::ProcessCounters;

use super::{CaptureError, CaptureWriter};
use crate::aggregate::{
    Aggregator, MemorySample, ProcessStart, PythonStatus, Report, RssPoint, RunMeta, SampledBytes,
};

/// Least time between two periodic counter reads of one process that are
/// kept, in nanoseconds, while RSS moves less than
/// [`PERIODIC_RSS_CHANGE_BYTES`]: counter lines were most of a capture's
/// size at one per process per 200 ms tick.
pub const PERIODIC_COUNTERS_INTERVAL_NS: u64 = 1_000_000_000;

/// A periodic read whose RSS differs by at least this many bytes from the
/// process's last kept read is kept however soon it comes, so a short spike
/// (built and released within a second) keeps its peak in the RSS timeline
/// to within this much. The smallest growth the diagnosis reports on
/// (`diagnose::MIN_GROWTH_BYTES`, 8 MiB).
pub const PERIODIC_RSS_CHANGE_BYTES: u64 = 8 * 1024 * 1024;

/// The latest counter read kept for a process.
#[derive(Clone, Copy, Debug)]
struct KeptRead {
    ts_ns: u64,
    /// Its RSS, when known.
    rss_bytes: Option<u64>,
}

impl KeptRead {
    fn new(ts_ns: u64, counters: &ProcessCounters) -> Self {
        Self {
            ts_ns,
            rss_bytes: RssPoint::from_counters(0, counters).map(|p| p.rss_bytes),
        }
    }

    /// Whether a periodic read `next` is worth keeping after this one.
    fn superseded_by(self, next: Self) -> bool {
        let moved = match (self.rss_bytes, next.rss_bytes) {
            (Some(before), Some(now)) => before.abs_diff(now) >= PERIODIC_RSS_CHANGE_BYTES,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        moved || next.ts_ns.saturating_sub(self.ts_ns) >= PERIODIC_COUNTERS_INTERVAL_NS
    }
}

/// The live aggregator and, optionally, a capture writer fed the same calls
/// (see [`Aggregator`] for each call's meaning).
#[derive(Debug)]
pub struct Recorder<W: Write> {
    aggregator: Aggregator,
    writer: Option<CaptureWriter<W>>,
    /// The latest counter read kept, per tgid.
    last_kept: HashMap<u32, KeptRead>,
}

impl<W: Write> Recorder<W> {
    /// Feeds `aggregator`, and `writer` when given.
    pub fn new(aggregator: Aggregator, writer: Option<CaptureWriter<W>>) -> Self {
        Self {
            aggregator,
            writer,
            last_kept: HashMap::new(),
        }
    }

    /// The live aggregator (for progress and the live view).
    pub fn aggregator(&self) -> &Aggregator {
        &self.aggregator
    }

    /// See [`Aggregator::process_started`].
    pub fn process_started(&mut self, p: ProcessStart) {
        // A new process (or a new one reusing the tgid): its first
        // periodic read is kept.
        self.last_kept.remove(&p.tgid);
        if let Some(writer) = &mut self.writer {
            writer.process_started(&p);
        }
        self.aggregator.process_started(p);
    }

    /// See [`Aggregator::process_exec`].
    pub fn process_exec(&mut self, tgid: u32, ts_ns: u64, cmdline: String) {
        if let Some(writer) = &mut self.writer {
            writer.process_exec(tgid, ts_ns, &cmdline);
        }
        self.aggregator.process_exec(tgid, ts_ns, cmdline);
    }

    /// See [`Aggregator::process_exited`].
    pub fn process_exited(&mut self, tgid: u32, ts_ns: u64) {
        if let Some(writer) = &mut self.writer {
            writer.process_exited(tgid, ts_ns);
        }
        self.aggregator.process_exited(tgid, ts_ns);
    }

    /// See [`Aggregator::python_status`].
    pub fn python_status(&mut self, tgid: u32, status: PythonStatus) {
        if let Some(writer) = &mut self.writer {
            writer.python_status(tgid, &status);
        }
        self.aggregator.python_status(tgid, status);
    }

    /// See [`Aggregator::counters`]: a read that must be kept (a process's
    /// start, exec or exit, the end of the run).
    pub fn counters(&mut self, tgid: u32, ts_ns: u64, counters: &ProcessCounters) {
        self.last_kept.insert(tgid, KeptRead::new(ts_ns, counters));
        if let Some(writer) = &mut self.writer {
            writer.counters(tgid, ts_ns, counters);
        }
        self.aggregator.counters(tgid, ts_ns, counters);
    }

    /// A periodic counter read: kept (as [`Recorder::counters`]) only when
    /// [`PERIODIC_COUNTERS_INTERVAL_NS`] passed since the process's latest
    /// kept read or its RSS moved by [`PERIODIC_RSS_CHANGE_BYTES`].
    pub fn periodic_counters(&mut self, tgid: u32, ts_ns: u64, counters: &ProcessCounters) {
        let next = KeptRead::new(ts_ns, counters);
        let keep = self
            .last_kept
            .get(&tgid)
            .is_none_or(|last| last.superseded_by(next));
        if keep {
            self.counters(tgid, ts_ns, counters);
        }
    }

    /// One sampled memory event, as [`Aggregator::path_delta`] bytes; the
    /// stack is interned once, by the aggregator, and the writer gets its id.
    pub fn memory(&mut self, sample: MemorySample) {
        let bytes = SampledBytes::from_event(sample.event, sample.weight_bytes);
        let stack = self
            .aggregator
            .path_delta(sample.tgid, sample.ts_ns, sample.stack, bytes);
        if let Some(writer) = &mut self.writer {
            writer.path_delta(sample.tgid, sample.ts_ns, stack, bytes, &self.aggregator);
        }
    }

    /// Flushes the capture (call about once a second).
    pub fn flush(&mut self) {
        if let Some(writer) = &mut self.writer {
            writer.flush(&self.aggregator);
        }
    }

    /// The capture write error that stopped the capture, once (tracing and
    /// the live report go on).
    pub fn take_capture_error(&mut self) -> Option<CaptureError> {
        self.writer.as_mut().and_then(CaptureWriter::take_error)
    }

    /// Ends the run at `end_ns` (the capture's `end` line says
    /// `meta.duration_ns`, which should be `end_ns` minus the run start):
    /// the live report (not yet diagnosed) and the capture error not yet
    /// taken, if any.
    pub fn finish(self, end_ns: u64, meta: RunMeta) -> (Report, Option<CaptureError>) {
        let aggregator = &self.aggregator;
        let error = self
            .writer
            .and_then(|writer| writer.finish(&meta, aggregator).err());
        (self.aggregator.finish(end_ns, meta), error)
    }
}
