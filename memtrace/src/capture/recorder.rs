//! The aggregation step's input during `record`/`run`: every call goes to
//! the live [`Aggregator`] and, with `--capture`, to the [`CaptureWriter`],
//! so the capture replays into the report the live run printed.

use std::io::Write;

use memtrace_common::ProcessCounters;

use super::{CaptureError, CaptureWriter};
use crate::aggregate::{
    Aggregator, MemorySample, ProcessStart, PythonStatus, Report, RunMeta, SampledBytes,
};

/// The live aggregator and, optionally, a capture writer fed the same calls
/// (see [`Aggregator`] for each call's meaning).
#[derive(Debug)]
pub struct Recorder<W: Write> {
    aggregator: Aggregator,
    writer: Option<CaptureWriter<W>>,
}

impl<W: Write> Recorder<W> {
    /// Feeds `aggregator`, and `writer` when given.
    pub fn new(aggregator: Aggregator, writer: Option<CaptureWriter<W>>) -> Self {
        Self { aggregator, writer }
    }

    /// The live aggregator (for progress and the live view).
    pub fn aggregator(&self) -> &Aggregator {
        &self.aggregator
    }

    /// See [`Aggregator::process_started`].
    pub fn process_started(&mut self, p: ProcessStart) {
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

    /// See [`Aggregator::counters`].
    pub fn counters(&mut self, tgid: u32, ts_ns: u64, counters: &ProcessCounters) {
        if let Some(writer) = &mut self.writer {
            writer.counters(tgid, ts_ns, counters);
        }
        self.aggregator.counters(tgid, ts_ns, counters);
    }

    /// One sampled memory event, as [`Aggregator::path_delta`] bytes.
    pub fn memory(&mut self, sample: MemorySample) {
        let bytes = SampledBytes::from_event(sample.event, sample.weight_bytes);
        if let Some(writer) = &mut self.writer {
            writer.path_delta(sample.tgid, sample.ts_ns, &sample.stack, bytes);
        }
        self.aggregator
            .path_delta(sample.tgid, sample.ts_ns, sample.stack, bytes);
    }

    /// Flushes the capture (call about once a second).
    pub fn flush(&mut self) {
        if let Some(writer) = &mut self.writer {
            writer.flush();
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
        let error = self.writer.and_then(|writer| writer.finish(&meta).err());
        (self.aggregator.finish(end_ns, meta), error)
    }
}
