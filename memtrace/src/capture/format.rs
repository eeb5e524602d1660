//! The capture file format, shared by the writer and the reader: JSON Lines
//! (one serde_json value per line). Line 1 is a [`Header`]; every further
//! line is one [`Line`], externally tagged by its kind:
//!
//! ```text
//! {"memtrace_capture":2,"created_unix_s":..,"command":"..","start_ns":..,"sample_interval_bytes":..}
//! {"process":{"id":0,"start":{"tgid":..,"start_time_ns":..,"parent":null,"role":"root","cmdline":"..","ts_ns":..,"counters":{..}}}}
//! {"exec":{"process":0,"image":1,"ts_ns":..,"cmdline":"..","counters":{..}}}
//! {"exit_began":{"process":1,"ts_ns":..,"by":"python_finalize","counters":{..}}}
//! {"exit":{"process":1,"ts_ns":..,"status":{"how":"code","code":0},"counters":{..}}}
//! {"python":{"process":0,"status":{"status":"python","version":"3.12.1"}}}
//! {"counters":{"process":0,"ts_ns":..,"counters":{"rss_bytes":[..],..},"sharing":{"pss_bytes":..,"uss_bytes":..}}}
//! {"stacks":[[id,[frame,..]],..]}
//! {"paths":{"ts_ns":..,"deltas":[[process,stack_id,{"growth_bytes":..,"held_bytes":..,"samples":..}],..]}}
//! {"peaks":[[process,stack_id,held_at_peak_bytes],..]}
//! {"held":{"process":0,"state":{"coarsening_level":..,"unplaced_bytes":..}}}
//! {"allocations":{"sample_interval_bytes":..,"temporary_ns":..,"kernel":{..},"processes":[..]}}
//! {"census":{"images":[{"process":0,"last":{..},"at_peak":{..}},..]}}
//! {"end":{"command":"..","duration_ns":..,..}}
//! ```
//!
//! `process` numbers are the aggregator's [`ProcessId`]s: each process line
//! starts one (a process is its tgid and start time; a reused tgid is a new
//! process), each exec line starts the next image's. Times are
//! CLOCK_MONOTONIC nanoseconds (the clock of the kernel's records);
//! `start_ns` in the header is the run start. Counter and sampled byte
//! fields that are 0 are left out of their objects. Sampled bytes of an
//! image are written before the line that ends it (exec, exit_began, exit).

use memtrace_common::ProcessCounters;
use serde::{Deserialize, Serialize};

use crate::aggregate::{
    ExitBegin, ExitStatus, Frame, HeldState, ProcessId, ProcessStart, PythonStatus, RunMeta,
    SampledBytes, Sharing, StackId,
};
use crate::allocations::AllocationsReport;
use crate::census::CensusReport;

/// Version of the capture format this build writes and reads (the value of
/// [`Header::memtrace_capture`]). Version 2: processes are (tgid, start
/// time) and images, with exit status and held bytes per path.
pub const CAPTURE_VERSION: u32 = 2;

/// Line 1 of a capture file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Format version ([`CAPTURE_VERSION`]); its presence marks the file as
    /// a capture.
    pub memtrace_capture: u32,
    /// When the capture was created, in seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// What was traced, as the user would recognise it.
    pub command: String,
    /// Run start, CLOCK_MONOTONIC nanoseconds: times in the report are
    /// relative to it.
    pub start_ns: u64,
    /// Sampling interval of memory events, in bytes.
    pub sample_interval_bytes: u64,
}

/// One line after the header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// A process entered the trace.
    Process(ProcessLine),
    /// A process's execve replaced its image.
    Exec(ExecLine),
    /// A process began to exit.
    ExitBegan(ExitBeganLine),
    /// A process is gone.
    Exit(ExitLine),
    /// Whether Python stacks can be read in a process image.
    Python(PythonLine),
    /// One read of a process image's exact counters.
    Counters(CountersLine),
    /// Call stacks first used by the next `paths` line, by capture stack id
    /// (ids are per capture, handed out in first-seen order from 0).
    Stacks(Vec<(StackId, Vec<Frame>)>),
    /// Sampled bytes accumulated since the previous `paths` line.
    Paths(PathsLine),
    /// Bytes paths held at their image's high-water mark, changed since the
    /// previous `peaks` line (latest value wins).
    Peaks(Vec<PeakHeld>),
    /// What the held-page map says about an image (latest line wins).
    Held(HeldLine),
    /// `--allocations`: allocator mode's report so far (latest line wins;
    /// written at a flush when it changed, and at the end).
    Allocations(Box<AllocationsReport>),
    /// The allocators' census of each CPython image (`census`), written
    /// once, at the end, before the `end` line (latest line wins).
    Census(Box<CensusReport>),
    /// The run ended normally; absent when the capture was cut off.
    End(RunMeta),
}

impl Line {
    /// The line's time (CLOCK_MONOTONIC ns); `None` for lines without one.
    pub fn ts_ns(&self) -> Option<u64> {
        match self {
            Self::Process(p) => Some(p.start.ts_ns),
            Self::Exec(e) => Some(e.ts_ns),
            Self::ExitBegan(e) => Some(e.ts_ns),
            Self::Exit(e) => Some(e.ts_ns),
            Self::Counters(c) => Some(c.ts_ns),
            Self::Paths(p) => Some(p.ts_ns),
            Self::Python(_)
            | Self::Stacks(_)
            | Self::Peaks(_)
            | Self::Held(_)
            | Self::Allocations(_)
            | Self::Census(_)
            | Self::End(_) => None,
        }
    }
}

/// A process entered the trace as image `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLine {
    /// The id the live run gave it.
    pub id: ProcessId,
    /// Who it is and what it started from.
    pub start: ProcessStart,
}

/// A process's execve replaced image `process` by image `image`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecLine {
    /// The replaced image.
    pub process: ProcessId,
    /// The new image's id.
    pub image: ProcessId,
    /// When.
    pub ts_ns: u64,
    /// The new command line.
    pub cmdline: String,
    /// The replaced image's last counters.
    #[serde(with = "crate::aggregate::CountersDef")]
    pub counters: ProcessCounters,
}

/// Image `process` began to exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitBeganLine {
    /// The image.
    pub process: ProcessId,
    /// When.
    pub ts_ns: u64,
    /// What began it.
    pub by: ExitBegin,
    /// Its counters then.
    #[serde(with = "crate::aggregate::CountersDef")]
    pub counters: ProcessCounters,
}

/// Image `process` is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitLine {
    /// The image.
    pub process: ProcessId,
    /// When.
    pub ts_ns: u64,
    /// How it ended, when known.
    pub status: Option<ExitStatus>,
    /// Its final counters, when known.
    #[serde(default, with = "optional_counters")]
    pub counters: Option<ProcessCounters>,
}

/// Whether Python stacks can be read in an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonLine {
    /// The image.
    pub process: ProcessId,
    /// Its status (latest line wins).
    pub status: PythonStatus,
}

/// One read of an image's exact counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersLine {
    /// The image.
    pub process: ProcessId,
    /// When they were read.
    pub ts_ns: u64,
    /// The counters.
    #[serde(with = "crate::aggregate::CountersDef")]
    pub counters: ProcessCounters,
    /// PSS and USS read at the same time, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// Sampled bytes of one flush period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathsLine {
    /// Time of the earliest sample summed here; every sample summed here
    /// lies in the same second of the run (relative to `start_ns`), so the
    /// time buckets of a replay match the live run's.
    pub ts_ns: u64,
    /// Sampled bytes per (image, stack), ordered by stack id then image.
    pub deltas: Vec<PathDelta>,
}

/// `[process, stack_id, sampled bytes]`: sampled bytes of one stack in one
/// image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDelta(
    /// The image.
    pub ProcessId,
    /// The stack: a capture stack id from an earlier `stacks` line.
    pub StackId,
    /// The bytes.
    #[serde(with = "SampledBytesDef")]
    pub SampledBytes,
);

/// `[process, stack_id, bytes]`: what a path held at its image's
/// high-water mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakHeld(pub ProcessId, pub StackId, pub u64);

/// What the held-page map says about an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLine {
    /// The image.
    pub process: ProcessId,
    /// Its coarsening level and unplaced bytes.
    pub state: HeldState,
}

/// Whether a number is 0 (fields skipped when serializing).
fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Whether a signed number is 0 (fields skipped when serializing).
fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

/// Serde of `Option<ProcessCounters>` in the compact counters form.
mod optional_counters {
    use memtrace_common::ProcessCounters;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::aggregate::CountersDef;

    #[derive(Serialize, Deserialize)]
    struct Wrapped(#[serde(with = "CountersDef")] ProcessCounters);

    pub(super) fn serialize<S: Serializer>(
        value: &Option<ProcessCounters>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.map(Wrapped).serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<ProcessCounters>, D::Error> {
        Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|w| w.0))
    }
}

/// Compact serde form of [`SampledBytes`] in `paths` lines: zero fields
/// left out.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SampledBytes")]
struct SampledBytesDef {
    #[serde(default, skip_serializing_if = "is_zero")]
    growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    file_growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    shmem_growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    cow_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    mapped_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    unmapped_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    held_bytes: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    samples: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    variance_kib2: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_by_kind_and_leave_zeros_out() {
        let line = Line::Paths(PathsLine {
            ts_ns: 5,
            deltas: vec![PathDelta(
                ProcessId(7),
                StackId(2),
                SampledBytes {
                    growth_bytes: 4096,
                    held_bytes: -4096,
                    samples: 1,
                    ..SampledBytes::default()
                },
            )],
        });
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(
            text,
            r#"{"paths":{"ts_ns":5,"deltas":[[7,2,{"growth_bytes":4096,"held_bytes":-4096,"samples":1}]]}}"#
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line);
    }

    #[test]
    fn exit_lines_round_trip_with_and_without_counters() {
        for counters in [None, Some(ProcessCounters::default())] {
            let line = Line::Exit(ExitLine {
                process: ProcessId(3),
                ts_ns: 9,
                status: Some(ExitStatus::Signal {
                    signal: 9,
                    core_dumped: false,
                    oom_killed: false,
                }),
                counters,
            });
            let text = serde_json::to_string(&line).unwrap();
            assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line, "{text}");
        }
    }
}
