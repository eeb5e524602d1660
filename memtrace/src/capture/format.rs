//! The capture file format, shared by the writer and the reader: JSON Lines
//! (one serde_json value per line). Line 1 is a [`Header`]; every further
//! line is one [`Line`], externally tagged by its kind:
//!
//! ```text
//! {"memtrace_capture":1,"created_unix_s":..,"command":"..","start_ns":..,"sample_interval_bytes":..}
//! {"process":{"tgid":..,"parent_tgid":..,"role":"root","cmdline":"..","ts_ns":..}}
//! {"exec":{"tgid":..,"ts_ns":..,"cmdline":".."}}
//! {"exit":{"tgid":..,"ts_ns":..}}
//! {"python":{"tgid":..,"status":{"status":"python","version":"3.12.1"}}}
//! {"counters":{"tgid":..,"ts_ns":..,"counters":{"rss_bytes":[..],"rss_known":..,..}}}
//! {"stacks":[[id,[frame,..]],..]}
//! {"paths":{"ts_ns":..,"deltas":[[tgid,stack_id,{"growth_bytes":..,"samples":..}],..]}}
//! {"end":{"command":"..","duration_ns":..,..}}
//! ```
//!
//! Times are CLOCK_MONOTONIC nanoseconds (the clock of the kernel's
//! records); `start_ns` in the header is the run start. Counter and sampled
//! byte fields that are 0 are left out of their objects.

use memtrace_common::{ProcessCounters, RSS_MEMBER_COUNT};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Frame, ProcessStart, PythonStatus, RunMeta, SampledBytes, StackId};

/// Version of the capture format this build writes and reads (the value of
/// [`Header::memtrace_capture`]).
pub const CAPTURE_VERSION: u32 = 1;

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
    Process(ProcessStart),
    /// A process called execve.
    Exec(ExecLine),
    /// A process exited.
    Exit(ExitLine),
    /// Whether Python stacks can be read in a process.
    Python(PythonLine),
    /// One read of a process's exact counters.
    Counters(CountersLine),
    /// Call stacks first used by the next `paths` line, by capture stack id
    /// (ids are per capture, handed out in first-seen order from 0).
    Stacks(Vec<(StackId, Vec<Frame>)>),
    /// Sampled bytes accumulated since the previous `paths` line.
    Paths(PathsLine),
    /// The run ended normally; absent when the capture was cut off.
    End(RunMeta),
}

impl Line {
    /// The line's time (CLOCK_MONOTONIC ns); `None` for lines without one.
    pub fn ts_ns(&self) -> Option<u64> {
        match self {
            Self::Process(p) => Some(p.ts_ns),
            Self::Exec(e) => Some(e.ts_ns),
            Self::Exit(e) => Some(e.ts_ns),
            Self::Counters(c) => Some(c.ts_ns),
            Self::Paths(p) => Some(p.ts_ns),
            Self::Python(_) | Self::Stacks(_) | Self::End(_) => None,
        }
    }
}

/// A process called execve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecLine {
    /// The process.
    pub tgid: u32,
    /// When.
    pub ts_ns: u64,
    /// Its new command line.
    pub cmdline: String,
}

/// A process exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitLine {
    /// The process.
    pub tgid: u32,
    /// When.
    pub ts_ns: u64,
}

/// Whether Python stacks can be read in a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonLine {
    /// The process.
    pub tgid: u32,
    /// Its status (latest line wins).
    pub status: PythonStatus,
}

/// One read of a process's exact counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersLine {
    /// The process.
    pub tgid: u32,
    /// When they were read.
    pub ts_ns: u64,
    /// The counters (kernel bookkeeping the report does not use, `brk_end`,
    /// `parent_tgid` and `mm_id`, is not written and reads back as 0).
    #[serde(with = "CountersDef")]
    pub counters: ProcessCounters,
}

/// Sampled bytes of one flush period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathsLine {
    /// Time of the earliest sample summed here; every sample summed here
    /// lies in the same second of the run (relative to `start_ns`), so the
    /// time buckets of a replay match the live run's.
    pub ts_ns: u64,
    /// Sampled bytes per (process, stack), ordered by stack id then tgid.
    pub deltas: Vec<PathDelta>,
}

/// `[tgid, stack_id, sampled bytes]`: sampled bytes of one stack in one
/// process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDelta(
    /// The process.
    pub u32,
    /// The stack: a capture stack id from an earlier `stacks` line.
    pub StackId,
    /// The bytes.
    #[serde(with = "SampledBytesDef")]
    pub SampledBytes,
);

/// Whether a number is 0 (fields skipped when serializing).
fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Serde form of [`ProcessCounters`] (a `no_std` type without serde):
/// zero fields left out; the compiler checks the field list against the
/// type.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ProcessCounters")]
struct CountersDef {
    rss_bytes: [u64; RSS_MEMBER_COUNT],
    #[serde(default, skip_serializing_if = "is_zero")]
    rss_known: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    rss_peak_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    anon_growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    anon_release_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    cow_fault_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    page_faults: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    mmap_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    munmap_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    mremap_grow_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    mremap_shrink_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    brk_grow_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    brk_shrink_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    madvise_free_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    syscalls: u64,
    #[serde(skip)]
    brk_end: u64,
    #[serde(skip)]
    parent_tgid: u32,
    #[serde(skip)]
    mm_id: u32,
}

/// Compact serde form of [`SampledBytes`] in `paths` lines: zero fields
/// left out.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SampledBytes")]
struct SampledBytesDef {
    #[serde(default, skip_serializing_if = "is_zero")]
    growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    cow_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    mapped_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    unmapped_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    samples: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_by_kind_and_leave_zeros_out() {
        let line = Line::Paths(PathsLine {
            ts_ns: 5,
            deltas: vec![PathDelta(
                7,
                StackId(2),
                SampledBytes {
                    growth_bytes: 4096,
                    samples: 1,
                    ..SampledBytes::default()
                },
            )],
        });
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(
            text,
            r#"{"paths":{"ts_ns":5,"deltas":[[7,2,{"growth_bytes":4096,"samples":1}]]}}"#
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line);
    }

    #[test]
    fn counters_round_trip_without_kernel_bookkeeping() {
        let mut counters = ProcessCounters {
            rss_known: 3,
            page_faults: 12,
            syscalls: 4,
            brk_end: 0x1000,
            parent_tgid: 9,
            mm_id: 77,
            ..ProcessCounters::default()
        };
        counters.rss_bytes[1] = 8192;
        let line = Line::Counters(CountersLine {
            tgid: 1,
            ts_ns: 2,
            counters,
        });
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(
            text,
            r#"{"counters":{"tgid":1,"ts_ns":2,"counters":{"rss_bytes":[0,8192,0,0],"rss_known":3,"page_faults":12,"syscalls":4}}}"#
        );
        let Line::Counters(back) = serde_json::from_str::<Line>(&text).unwrap() else {
            panic!("not a counters line: {text}");
        };
        let expected = ProcessCounters {
            brk_end: 0,
            parent_tgid: 0,
            mm_id: 0,
            ..counters
        };
        assert_eq!(back.counters, expected);
    }
}
