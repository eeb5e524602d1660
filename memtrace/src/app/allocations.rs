//! Allocator mode in a session (`--allocations`): each traced process gets
//! its allocator probes once its binaries are known (CPython probing found
//! its interpreter or found none; a fork's child at once), the gap from its
//! start to its probes is kept, and sampled allocation and free records go
//! to the `allocations` aggregation.

use std::path::{Path, PathBuf};

use memtrace_common::{AllocRecord, ForkRecord, FreeRecord, ALLOC_UNTRACKED};

use super::session::{monotonic_ns, Session};
use crate::allocations::{AllocationsReport, KernelAllocStats};

impl Session {
    /// A traced process (image) entered the trace at monotonic `ts_ns`.
    pub(super) fn alloc_started(&mut self, tgid: u32, ts_ns: u64) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        let start_time_ns = crate::process::proc::start_time_ns(tgid).unwrap_or(0);
        tracker.process_started(tgid, start_time_ns, ts_ns);
    }

    /// A fork's child: its own process, hooked at once when its parent is
    /// (it runs the same binaries; the kernel's filter on the parent's
    /// probes does not match the child's mm).
    pub(super) fn alloc_forked(&mut self, fork: &ForkRecord) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        let child = fork.child_tgid;
        tracker.process_started(child, fork.child_start_boottime_ns, fork.header.ts_ns);
        if tracker.pending(fork.header.tgid) {
            return; // the parent is not hooked yet: the child is once probed
        }
        let binary = self.alloc_python_binary.get(&fork.header.tgid).cloned();
        self.hook_allocator(child, binary);
    }

    /// A traced process exec'd: the old image's probes are gone with its
    /// address space; the new image is hooked once probed.
    pub(super) fn alloc_exec(&mut self, tgid: u32, ts_ns: u64) {
        if self.allocations.is_none() {
            return;
        }
        self.alloc_exited(tgid);
        self.alloc_started(tgid, ts_ns);
    }

    /// A traced process is gone: its probes are detached and its blocks
    /// leave the kernel's live set.
    pub(super) fn alloc_exited(&mut self, tgid: u32) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        let addrs = tracker.process_ended(tgid);
        self.alloc_python_binary.remove(&tgid);
        self.tracer.detach_allocator(tgid, &addrs);
    }

    /// Attaches the allocator probes of `tgid` (CPython's in
    /// `python_binary`, libc's in the libc it maps), once; a process that
    /// cannot be hooked keeps the default mode, with the reason printed.
    pub(super) fn hook_allocator(&mut self, tgid: u32, python_binary: Option<PathBuf>) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        if !tracker.pending(tgid) {
            return;
        }
        let libc = mapped_libc(tgid);
        if python_binary.is_none() && libc.is_none() {
            let reason = "it maps no CPython allocator and no glibc libc.so".to_owned();
            report_not_hooked(tgid, &reason);
            tracker.not_hooked(tgid, reason);
            return;
        }
        match self
            .tracer
            .attach_allocator(tgid, python_binary.as_deref(), libc.as_deref())
        {
            Ok(binaries) => {
                let names = binaries.iter().map(|p| file_name(p)).collect();
                tracker.hooked(tgid, names, monotonic_ns());
                if let Some(binary) = python_binary {
                    self.alloc_python_binary.insert(tgid, binary);
                }
            }
            Err(err) => {
                let reason = format!("{:#}", anyhow::Error::from(err));
                report_not_hooked(tgid, &reason);
                tracker.not_hooked(tgid, reason);
            }
        }
    }

    /// A sampled allocation, with the native chain of the stack sent before
    /// it (its innermost frame alone when that record was lost).
    pub(super) fn on_alloc(&mut self, record: &AllocRecord) {
        if self.allocations.is_none() {
            return;
        }
        let tgid = record.header.tgid;
        let count = (record.frame_count as usize).min(record.frames.len());
        let native = match self.take_native_stack(&record.header) {
            Some(copy) => self.native_chain(tgid, &copy, count > 0, true),
            None => self.native_leaf(tgid, record.native_ip),
        };
        let stack = self.stack(tgid, record.stack_status, &record.frames[..count], native);
        let stack = stack.iter().map(ToString::to_string).collect();
        if let Some(tracker) = &mut self.allocations {
            let untracked = record.flags & ALLOC_UNTRACKED != 0;
            tracker.alloc(
                tgid,
                record.header.ts_ns,
                record.addr,
                record.size_bytes,
                stack,
                untracked,
            );
        }
    }

    /// A sampled block was freed.
    pub(super) fn on_free(&mut self, record: &FreeRecord) {
        if let Some(tracker) = &mut self.allocations {
            tracker.free(record.header.tgid, record.header.ts_ns, record.addr);
        }
    }

    /// The allocator-mode report, with the kernel's counters.
    pub(super) fn allocations_report(&self) -> Option<AllocationsReport> {
        let tracker = self.allocations.as_ref()?;
        let stats = self.tracer.alloc_stats().unwrap_or_default();
        Some(tracker.report(KernelAllocStats {
            calls: stats.calls,
            live_full: stats.live_full,
        }))
    }
}

/// Says why a process keeps the default mode only.
fn report_not_hooked(tgid: u32, reason: &str) {
    eprintln!(
        "memtrace: process {tgid}: its allocator cannot be hooked ({reason}); it keeps the \
         default mode (page faults, memory syscalls)"
    );
}

/// The glibc `libc.so.6` that `tgid` maps, if any.
fn mapped_libc(tgid: u32) -> Option<PathBuf> {
    let pid = i32::try_from(tgid).ok()?;
    let maps = procfs::process::Process::new(pid).ok()?.maps().ok()?;
    maps.into_iter().find_map(|map| match map.pathname {
        procfs::process::MMapPath::Path(path)
            if path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("libc.so")) =>
        {
            Some(path)
        }
        _ => None,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
