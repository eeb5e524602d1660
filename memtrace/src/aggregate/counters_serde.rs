//! Serde form of the kernel's [`ProcessCounters`] (a `no_std` type without
//! serde) for process starts, captures and reports: zero fields left out,
//! the kernel's own bookkeeping (`brk_end`, `exit_flags`, `mm`,
//! `parent_tgid`, `in_execve`, `exec_count`, `sampling`) not written (read back as 0). The compiler checks the field list
//! against the type.

use memtrace_common::{ProcessCounters, RSS_MEMBER_COUNT};
use serde::{Deserialize, Serialize};

/// Whether a number is 0 (fields skipped when serializing).
fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Use as `#[serde(with = "crate::aggregate::CountersDef")]` on a
/// [`ProcessCounters`] field.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ProcessCounters")]
pub(crate) struct CountersDef {
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
    file_growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    file_release_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    shmem_growth_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    shmem_release_bytes: u64,
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
    exit_flags: u64,
    #[serde(skip)]
    mm: u64,
    #[serde(skip)]
    parent_tgid: u32,
    #[serde(skip)]
    in_execve: u32,
    #[serde(skip)]
    exec_count: u32,
    #[serde(skip)]
    _pad: u32,
    #[serde(skip)]
    sampling: memtrace_common::SamplingState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Wrapper(#[serde(with = "CountersDef")] ProcessCounters);

    #[test]
    fn counters_round_trip_without_kernel_bookkeeping() {
        let mut counters = ProcessCounters {
            rss_known: 3,
            page_faults: 12,
            file_growth_bytes: 4096,
            syscalls: 4,
            brk_end: 0x1000,
            exit_flags: 1,
            parent_tgid: 9,
            mm: 77,
            ..ProcessCounters::default()
        };
        counters.rss_bytes[1] = 8192;
        let text = serde_json::to_string(&Wrapper(counters)).unwrap();
        assert_eq!(
            text,
            r#"{"rss_bytes":[0,8192,0,0],"rss_known":3,"file_growth_bytes":4096,"page_faults":12,"syscalls":4}"#
        );
        let back: Wrapper = serde_json::from_str(&text).unwrap();
        let expected = ProcessCounters {
            brk_end: 0,
            exit_flags: 0,
            parent_tgid: 0,
            mm: 0,
            ..counters
        };
        assert_eq!(back.0, expected);
    }
}
