//! Capture writing, beside the aggregation step: the recorder feeds the
//! writer the same calls it feeds the [`crate::aggregate::Aggregator`];
//! process lifecycle and counter reads are written as they come, sampled
//! bytes are summed per (image, stack) and written at each flush (once a
//! second), when a new second of the run starts, or before a line that ends
//! an image, new stacks first. Stacks are the
//! aggregator's: the writer gets the [`StackId`] the aggregator interned and
//! reads the frames of stacks not written yet from the aggregator.
//!
//! A write error (full disk, removed folder) disables the writer: it is kept
//! for [`CaptureWriter::take_error`], nothing more is written, and the file
//! holds everything up to the last successful write (a cut last line is
//! dropped by the reader).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use memtrace_common::ProcessCounters;

use super::format::{
    CountersLine, ExecLine, ExitBeganLine, ExitLine, Header, HeldLine, Line, PathDelta, PathsLine,
    PeakHeld, ProcessLine, PythonLine,
};
use super::CaptureError;
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, HeldState, ProcessId, ProcessStart, PythonStatus, RunMeta,
    SampledBytes, Sharing, StackId, INITIAL_PATH_BUCKET_NS,
};
use crate::allocations::AllocationsReport;
use crate::census::CensusReport;

/// Sampled bytes not yet written: all from one second of the run.
#[derive(Debug, Default)]
struct PendingPaths {
    /// Per (stack, image): stack first so lines list stacks in id order.
    deltas: BTreeMap<(StackId, ProcessId), SampledBytes>,
    /// The second of the run (since `start_ns`) they belong to.
    second: u64,
    /// Time of the earliest of them.
    ts_ns: u64,
}

/// Writes one capture file incrementally. Feed it in record order, call
/// [`CaptureWriter::flush`] about once a second and
/// [`CaptureWriter::finish`] at the end.
#[derive(Debug)]
pub struct CaptureWriter<W: Write> {
    /// The file, for error messages.
    path: PathBuf,
    /// `None` once a write failed.
    out: Option<W>,
    /// The error that disabled the writer, until taken.
    error: Option<CaptureError>,
    start_ns: u64,
    /// Stacks with an id below this are in the file (the aggregator hands
    /// out ids in first-seen order, so a `stacks` line adds the ids from
    /// here up to the highest id pending).
    stacks_written: u32,
    pending: PendingPaths,
}

impl CaptureWriter<BufWriter<File>> {
    /// Creates the capture file at `path` (replacing an existing file only
    /// with `force`, never through a symbolic link: see
    /// [`crate::output_file::create`]) and writes its header line through
    /// to the file, so a path that cannot be written fails here, before
    /// tracing starts.
    ///
    /// # Errors
    /// [`CaptureError::Write`] when the file cannot be created or written.
    pub fn create(path: &Path, header: &Header, force: bool) -> Result<Self, CaptureError> {
        let file =
            crate::output_file::create(path, force).map_err(|source| CaptureError::Write {
                path: path.to_owned(),
                source,
            })?;
        let mut writer = Self::new(path, BufWriter::new(file), header)?;
        writer.flush_out();
        match writer.take_error() {
            Some(err) => Err(err),
            None => Ok(writer),
        }
    }
}

impl<W: Write> CaptureWriter<W> {
    /// A writer into `out` (buffered by the caller), named `path` in
    /// errors; writes the header line.
    ///
    /// # Errors
    /// [`CaptureError::Write`] when the header cannot be written.
    pub fn new(path: &Path, out: W, header: &Header) -> Result<Self, CaptureError> {
        let mut writer = Self {
            path: path.to_owned(),
            out: Some(out),
            error: None,
            start_ns: header.start_ns,
            stacks_written: 0,
            pending: PendingPaths::default(),
        };
        writer.write_line(header);
        match writer.take_error() {
            Some(err) => Err(err),
            None => Ok(writer),
        }
    }

    /// See [`crate::aggregate::Aggregator::process_started`] (which gave
    /// `id`).
    pub fn process_started(&mut self, id: ProcessId, start: &ProcessStart) {
        self.write_line(&Line::Process(ProcessLine {
            id,
            start: start.clone(),
        }));
    }

    /// See [`crate::aggregate::Aggregator::process_exec`] (which gave
    /// `image`); pending sampled bytes are written first.
    pub fn process_exec(&mut self, line: ExecLine, stacks: &Aggregator) {
        self.write_pending_paths(stacks);
        self.write_line(&Line::Exec(line));
    }

    /// See [`crate::aggregate::Aggregator::exit_began`]; pending sampled
    /// bytes are written first.
    pub fn exit_began(
        &mut self,
        process: ProcessId,
        ts_ns: u64,
        by: ExitBegin,
        counters: &ProcessCounters,
        stacks: &Aggregator,
    ) {
        self.write_pending_paths(stacks);
        self.write_line(&Line::ExitBegan(ExitBeganLine {
            process,
            ts_ns,
            by,
            counters: *counters,
        }));
    }

    /// See [`crate::aggregate::Aggregator::process_exited`]; pending
    /// sampled bytes are written first.
    pub fn process_exited(
        &mut self,
        process: ProcessId,
        ts_ns: u64,
        status: Option<ExitStatus>,
        counters: Option<&ProcessCounters>,
        stacks: &Aggregator,
    ) {
        self.write_pending_paths(stacks);
        self.write_line(&Line::Exit(ExitLine {
            process,
            ts_ns,
            status,
            counters: counters.copied(),
        }));
    }

    /// See [`crate::aggregate::Aggregator::python_status`].
    pub fn python_status(&mut self, process: ProcessId, status: &PythonStatus) {
        let status = status.clone();
        self.write_line(&Line::Python(PythonLine { process, status }));
    }

    /// See [`crate::aggregate::Aggregator::counters`].
    pub fn counters(
        &mut self,
        process: ProcessId,
        ts_ns: u64,
        counters: &ProcessCounters,
        sharing: Option<Sharing>,
    ) {
        self.write_line(&Line::Counters(CountersLine {
            process,
            ts_ns,
            counters: *counters,
            sharing,
        }));
    }

    /// See [`crate::aggregate::Aggregator::path_delta`]: summed until the
    /// next flush, or written first if it belongs to another second of the
    /// run than the bytes already pending.
    pub fn path_delta(
        &mut self,
        process: ProcessId,
        ts_ns: u64,
        stack: StackId,
        bytes: SampledBytes,
        stacks: &Aggregator,
    ) {
        if self.out.is_none() {
            return;
        }
        let second = ts_ns.saturating_sub(self.start_ns) / INITIAL_PATH_BUCKET_NS;
        if !self.pending.deltas.is_empty() && second != self.pending.second {
            self.write_pending_paths(stacks);
        }
        if self.pending.deltas.is_empty() {
            self.pending.second = second;
            self.pending.ts_ns = ts_ns;
        }
        self.pending.ts_ns = self.pending.ts_ns.min(ts_ns);
        self.pending
            .deltas
            .entry((stack, process))
            .or_default()
            .merge(&bytes);
    }

    /// See [`crate::aggregate::Aggregator::peak_held`]: writes the changed
    /// values (after the pending sampled bytes, whose stacks they may use).
    pub fn peaks(&mut self, peaks: Vec<PeakHeld>, stacks: &Aggregator) {
        if peaks.is_empty() {
            return;
        }
        self.write_pending_paths(stacks);
        self.write_stacks_up_to(peaks.iter().map(|p| p.1).max(), stacks);
        self.write_line(&Line::Peaks(peaks));
    }

    /// See [`crate::aggregate::Aggregator::held_state`].
    pub fn held(&mut self, process: ProcessId, state: HeldState) {
        self.write_line(&Line::Held(HeldLine { process, state }));
    }

    /// `--allocations`: allocator mode's report so far.
    pub fn allocations(&mut self, report: &AllocationsReport) {
        self.write_line(&Line::Allocations(Box::new(report.clone())));
    }

    /// The allocators' census of the run's CPython images.
    pub fn census(&mut self, report: &CensusReport) {
        self.write_line(&Line::Census(Box::new(report.clone())));
    }

    /// Writes the pending sampled bytes (their new stacks read from
    /// `stacks`) and pushes everything written so far to the file.
    pub fn flush(&mut self, stacks: &Aggregator) {
        self.write_pending_paths(stacks);
        self.flush_out();
    }

    /// Pushes everything written so far to the file.
    fn flush_out(&mut self) {
        if let Some(out) = self.out.as_mut() {
            if let Err(source) = out.flush() {
                self.fail(source);
            }
        }
    }

    /// Writes the pending sampled bytes and the `end` line, and flushes.
    ///
    /// # Errors
    /// The error that disabled the writer, if [`CaptureWriter::take_error`]
    /// has not returned it yet.
    pub fn finish(mut self, meta: &RunMeta, stacks: &Aggregator) -> Result<(), CaptureError> {
        self.write_pending_paths(stacks);
        self.write_line(&Line::End(meta.clone()));
        self.flush(stacks);
        self.take_error().map_or(Ok(()), Err)
    }

    /// The write error that disabled the writer, once.
    pub fn take_error(&mut self) -> Option<CaptureError> {
        self.error.take()
    }

    /// Writes the stacks not written yet (frames from `stacks`), then the
    /// pending sampled bytes.
    fn write_pending_paths(&mut self, stacks: &Aggregator) {
        // Deltas are keyed stack first: the last one has the highest id.
        let Some(&(highest, _)) = self.pending.deltas.keys().next_back() else {
            return;
        };
        self.write_stacks_up_to(Some(highest), stacks);
        let pending = std::mem::take(&mut self.pending);
        let deltas = pending
            .deltas
            .into_iter()
            .map(|((stack, process), bytes)| PathDelta(process, stack, bytes))
            .collect();
        self.write_line(&Line::Paths(PathsLine {
            ts_ns: pending.ts_ns,
            deltas,
        }));
    }

    /// Writes a `stacks` line with the stacks not written yet up to id
    /// `highest` (frames from `stacks`).
    fn write_stacks_up_to(&mut self, highest: Option<StackId>, stacks: &Aggregator) {
        let Some(highest) = highest.filter(|h| h.0 >= self.stacks_written) else {
            return;
        };
        let new = (self.stacks_written..=highest.0)
            .map(|id| (StackId(id), stacks.stack_frames(StackId(id)).to_vec()))
            .collect();
        self.write_line(&Line::Stacks(new));
        self.stacks_written = highest.0.saturating_add(1);
    }

    /// Writes `value` (the header or a [`Line`]) as one JSON line; a failure
    /// disables the writer.
    fn write_line<T: serde::Serialize>(&mut self, value: &T) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let result = serde_json::to_writer(&mut *out, value)
            .map_err(io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(source) = result {
            self.fail(source);
        }
    }

    /// Disables the writer after `source`.
    fn fail(&mut self, source: io::Error) {
        self.out = None;
        self.pending = PendingPaths::default();
        self.error = Some(CaptureError::Write {
            path: self.path.clone(),
            source,
        });
    }
}
