//! Each decoded ring-buffer record turned into the aggregation step's calls:
//! the process tree follows forks, execs and exits (a tgid maps to the row
//! of its live process's current image); a sampled memory record gets its
//! stack (assembled by `crate::stacks`, completed by the mapping of
//! file-backed growth) and the pages it made resident; an address record
//! releases or moves pages.

use memtrace_common::{
    AddressOp, AddressRecord, ExitBeginReason, ExitBeginRecord, ExitRecord, ForkRecord,
    MemoryEvent, MemoryRecord, ProcessCounters, RSS_ALL_KNOWN,
};

use super::session::Session;
use crate::{
    aggregate::{
        ExitBegin, ExitStatus, Frame, MappingKind, MemorySample, ProcessStart, PythonStatus, Role,
    },
    capture::AddressChange,
    events::Record,
    process::{proc, PythonState},
    stacks::RecordStack,
};

/// Size of one page, in bytes.
const PAGE: u64 = memtrace_common::PAGE_SIZE_BYTES;

impl Session {
    /// Applies one record.
    pub(super) fn handle(&mut self, record: Record) {
        match record {
            Record::Fork(fork) => self.on_fork(&fork),
            Record::Exec(exec) => self.on_exec(exec.header.tgid, exec.header.ts_ns, &exec.counters),
            Record::ExitBegin(begin) => self.on_exit_begin(&begin),
            Record::Exit(exit) => self.on_exit(&exit),
            Record::Memory(memory) => self.on_memory(&memory),
            Record::Address(address) => self.on_address(&address),
            Record::Alloc(alloc) => self.on_alloc(&alloc),
            Record::Free(free) => self.on_free(&free),
            Record::NativeStack(stack) => self.stacks.keep_native_stack(stack),
        }
    }

    /// A traced process forked: the child starts from what it inherited
    /// (nothing, while it shares its parent's address space).
    fn on_fork(&mut self, fork: &ForkRecord) {
        if self.traced_already(fork) {
            return;
        }
        let (parent_tgid, child) = (fork.header.tgid, fork.child_tgid);
        let counters = ProcessCounters {
            rss_bytes: fork.child_rss_bytes,
            rss_known: RSS_ALL_KNOWN,
            ..ProcessCounters::default()
        };
        let id = self.recorder.process_started(ProcessStart {
            tgid: child,
            start_time_ns: fork.child_start_boottime_ns,
            parent: self.tree.id_of(parent_tgid),
            role: Role::Worker,
            cmdline: proc::command_line(child),
            ts_ns: fork.header.ts_ns,
            counters,
            // smaps_rollup of a CLONE_VM child is its parent's.
            sharing: if fork.shares_parent_mm == 0 {
                self.sharing.read_now(child)
            } else {
                None
            },
        });
        self.tree.add(child, id, Role::Worker);
        if fork.shares_parent_mm == 0 {
            // Its pages are shared with the child from now on: its last PSS
            // beside the child's would count them twice, so its next
            // periodic read reads them again, whatever the pacing.
            self.sharing.forget(parent_tgid);
        }
        self.inherit_python(child, parent_tgid);
        self.alloc_forked(fork);
    }

    /// Whether the child of `fork` is already traced as this very process
    /// (same tgid, same start time to the tick `/proc` counts in): a root
    /// found while it forks is in the kernel's map before the `/proc` scan
    /// of its descendants, so a child forked in between comes both from
    /// the scan and as this record; a second image for it would stay open
    /// for good beside the one the tree keeps.
    fn traced_already(&self, fork: &ForkRecord) -> bool {
        let Some(id) = self.tree.id_of(fork.child_tgid) else {
            return false;
        };
        let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
        self.recorder
            .aggregator()
            .start_time_ns(id)
            .is_some_and(|known| known / tick_ns == fork.child_start_boottime_ns / tick_ns)
    }

    /// A child runs its parent's interpreter: same code objects, same layout.
    fn inherit_python(&mut self, child: u32, parent_tgid: u32) {
        self.stacks.resolver.inherit(child, parent_tgid);
        // The kernel side copies the parent's CPython layout at fork, but
        // only if the layout reached the kernel before the fork; the probe
        // may have run between the fork and this record, so write it again.
        let Some((info, status)) = self.tree.get(parent_tgid).and_then(|p| match &p.python {
            PythonState::Known(status @ PythonStatus::Python { .. }) => {
                Some((p.py_info?, status.clone()))
            }
            _ => None,
        }) else {
            return;
        };
        if self.tracer.set_python(child, info).is_ok() {
            self.tree.set_py_info(child, info);
            self.set_python_status(child, status);
        }
    }

    /// A traced process's execve replaced its image (`counters`: the old
    /// image's last). `memtrace run`'s command enters the report here.
    pub(super) fn on_exec(&mut self, tgid: u32, ts_ns: u64, counters: &ProcessCounters) {
        self.forget_tgid(tgid);
        if self.launched == Some(tgid) {
            self.launched = None;
            self.add_launched_image(tgid, ts_ns);
            return;
        }
        self.alloc_exec(tgid, ts_ns, counters);
        let Some(id) = self.tree.id_of(tgid) else {
            return;
        };
        let image = self
            .recorder
            .process_exec(id, ts_ns, counters, proc::command_line(tgid));
        self.tree.exec(tgid, image);
    }

    /// `memtrace run`'s command, right after its execve: it starts from
    /// nothing (the kernel side restarted its counters).
    fn add_launched_image(&mut self, tgid: u32, ts_ns: u64) {
        let id = self.recorder.process_started(ProcessStart {
            tgid,
            start_time_ns: proc::start_time_ns(tgid).unwrap_or(0),
            parent: None,
            role: Role::Root,
            cmdline: proc::command_line(tgid),
            ts_ns,
            counters: ProcessCounters {
                rss_known: RSS_ALL_KNOWN,
                ..ProcessCounters::default()
            },
            sharing: None,
        });
        self.tree.add(tgid, id, Role::Root);
        self.tree.added_by_exec(tgid);
        self.alloc_started(tgid, ts_ns);
        self.probe_python(tgid);
    }

    /// A traced process began to exit: its numbers end here.
    fn on_exit_begin(&mut self, begin: &ExitBeginRecord) {
        let tgid = begin.header.tgid;
        let Some(id) = self.tree.id_of(tgid) else {
            return;
        };
        let by = ExitBeginReason::try_from(begin.reason).map_or(ExitBegin::Exit, ExitBegin::from);
        self.recorder
            .exit_began(id, begin.header.ts_ns, by, &begin.counters);
        self.tree.exit_began(tgid);
        self.census.end(tgid);
        if let Some(tracker) = &mut self.allocations {
            let anon = memtrace_common::MM_ANONPAGES;
            if begin.counters.rss_known & (1 << anon) != 0 {
                tracker.rss_anon(tgid, begin.counters.rss_bytes[anon]);
            }
            tracker.exit_began(tgid);
        }
    }

    /// A traced process is gone; its tgid is free for a new process.
    fn on_exit(&mut self, exit: &ExitRecord) {
        let tgid = exit.header.tgid;
        if self.launched == Some(tgid) {
            self.launched = None; // its exec failed
        }
        self.missing.retain(|&t| t != tgid);
        let Some(process) = self.tree.exit(tgid) else {
            return;
        };
        // A process that exits while its probes still find no CPython
        // runtime was not Python.
        if matches!(
            process.python,
            PythonState::Pending {
                no_runtime_seen: true,
                ..
            }
        ) {
            self.recorder
                .python_status(process.id, PythonStatus::NotPython);
        }
        let status = ExitStatus::from_exit_record(exit.exit_code, exit.oom_victim != 0);
        // After the teardown (kernels before 6.16) the counters are not the
        // process's memory: its last reading is.
        let counters = (exit.mm_released == 0).then_some(&exit.counters);
        self.recorder
            .process_exited(process.id, exit.header.ts_ns, Some(status), counters);
        self.forget_tgid(tgid);
        self.alloc_exited(tgid);
    }

    /// A sampled memory event: its stack and, for growth, its pages.
    fn on_memory(&mut self, record: &MemoryRecord) {
        let Ok(event) = MemoryEvent::try_from(record.event) else {
            return; // decode() already rejected unknown events
        };
        let tgid = record.header.tgid;
        // Taken first: a stack whose record is ignored must not stay.
        let copy = self.stacks.take_native_stack(&record.header);
        let Some(id) = self.tree.id_of(tgid) else {
            return;
        };
        let frames = &record.frames[..(record.frame_count as usize).min(record.frames.len())];
        let own = RecordStack {
            tgid,
            stack_status: record.stack_status,
            frames,
            native_ip: record.native_ip,
            ip_is_return: false,
        };
        let python = self.tree.get(tgid).map(|p| &p.python);
        let mut stack = self.stacks.assemble(&own, copy.as_deref(), python);
        if let Some(kind) = mapping_kind(event) {
            let name = self
                .mappings
                .name(tgid, record.addr)
                .unwrap_or_else(|| "?".to_owned());
            stack.push(Frame::Mapping {
                mapping: kind,
                name,
            });
        }
        self.recorder.memory(MemorySample {
            process: id,
            ts_ns: record.header.ts_ns,
            event,
            weight_bytes: record.weight_bytes,
            len_bytes: record.len_bytes,
            pages: resident_pages(event, record.addr, record.len_bytes),
            rss_bytes: record.rss_bytes,
            stack,
        });
    }

    /// An exact release or move of address space.
    fn on_address(&mut self, record: &AddressRecord) {
        let Some(id) = self.tree.id_of(record.header.tgid) else {
            return;
        };
        let Ok(op) = AddressOp::try_from(record.op) else {
            return; // decode() already rejected unknown operations
        };
        let change = match op {
            AddressOp::Mremap => AddressChange::Remap {
                old_start: record.addr,
                old_len: record.len_bytes,
                new_start: record.new_addr,
                new_len: record.new_len_bytes,
            },
            AddressOp::Munmap
            | AddressOp::MadviseFree
            | AddressOp::BrkShrink
            | AddressOp::MmapFixed => {
                AddressChange::Release(record.addr..record.addr.saturating_add(record.len_bytes))
            }
        };
        self.recorder
            .address(id, record.header.ts_ns, change, record.rss_bytes);
    }
}

/// The mapping kind whose name completes the stack of `event`'s growth.
fn mapping_kind(event: MemoryEvent) -> Option<MappingKind> {
    match event {
        MemoryEvent::FileGrowth => Some(MappingKind::File),
        MemoryEvent::ShmemGrowth => Some(MappingKind::Shmem),
        _ => None,
    }
}

/// The pages a growth event made resident: `len_bytes` at the faulting
/// address `addr`, aligned to `len_bytes` when it is a power of two (a huge
/// page), else to the page; `None` for other events and unknown addresses.
fn resident_pages(event: MemoryEvent, addr: u64, len_bytes: u64) -> Option<std::ops::Range<u64>> {
    let growth = matches!(
        event,
        MemoryEvent::AnonGrowth | MemoryEvent::FileGrowth | MemoryEvent::ShmemGrowth
    );
    if !growth || addr == 0 || len_bytes == 0 {
        return None;
    }
    let len = len_bytes.div_ceil(PAGE) * PAGE;
    let align = if len.is_power_of_two() { len } else { PAGE };
    let start = addr & !(align - 1);
    Some(start..start.saturating_add(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_pages_are_aligned_to_the_page_or_huge_page() {
        let anon = MemoryEvent::AnonGrowth;
        assert_eq!(resident_pages(anon, 0x1234, 4096), Some(0x1000..0x2000));
        let huge = 2 << 20;
        assert_eq!(
            resident_pages(anon, 0x40_1234, huge),
            Some(0x40_0000..0x60_0000)
        );
        // Fault-around of 3 file pages: page-aligned from the fault.
        assert_eq!(
            resident_pages(MemoryEvent::FileGrowth, 0x5678, 3 * 4096),
            Some(0x5000..0x8000)
        );
        assert_eq!(resident_pages(anon, 0, 4096), None);
        assert_eq!(resident_pages(MemoryEvent::CowFault, 0x1000, 4096), None);
    }
}
