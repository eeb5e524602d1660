//! Process tree: `sched_process_fork` extends the traced set in the kernel
//! (so a worker forked by a traced master is traced from its first page),
//! `sched_process_exec` and `sched_process_exit` tell userspace that a
//! traced process changed its image or is gone.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use memtrace_common::{ExecRecord, ExitRecord, ForkRecord, ProcessCounters, RecordKind};

use crate::{
    counters::{current_ids, swap},
    maps::{FOLLOW_FORKS, PROCESSES, PY_PROCESSES, TASK_PID_OFFSET, TASK_TGID_OFFSET},
    sample::{emit, header},
};

/// `sched_process_exit` field `bool group_dead` (offset 32, from
/// /sys/kernel/tracing/events/sched/sched_process_exit/format on 6.18).
const EXIT_GROUP_DEAD_OFFSET: usize = 32;

/// BTF tracepoint `sched_process_fork(struct task_struct *parent, struct
/// task_struct *child)` (include/trace/events/sched.h; the raw tracepoint
/// arguments, not the `sched/sched_process_fork/format` record, which lacks
/// the child's tgid). Fires in the parent (`kernel_clone` passes `current`).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    match try_sched_process_fork(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// Reads a `pid_t` of `task` at `offset` (from BTF, set by userspace).
#[inline(always)]
fn task_pid_field(task: *const u8, offset: u64) -> Result<u32, ()> {
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<u32>()) }
        .map_err(|_| ())
}

fn try_sched_process_fork(ctx: &BtfTracePointContext) -> Result<(), ()> {
    if FOLLOW_FORKS.load() == 0 {
        return Ok(());
    }
    let (parent_tgid, _) = current_ids();
    // SAFETY: the value is copied out at once.
    let Some(parent) = (unsafe { PROCESSES.get(parent_tgid) }).copied() else {
        return Ok(());
    };
    let child: *const u8 = ctx.arg(1);
    let child_tgid = task_pid_field(child, TASK_TGID_OFFSET.load())?;
    let child_pid = task_pid_field(child, TASK_PID_OFFSET.load())?;
    if child_pid != child_tgid {
        return Ok(()); // a new thread of a traced process, already covered
    }
    let counters = ProcessCounters {
        rss_bytes: parent.rss_bytes,
        rss_known: parent.rss_known,
        parent_tgid,
        ..ProcessCounters::default()
    };
    PROCESSES
        .insert(child_tgid, counters, BPF_NOEXIST.into())
        .map_err(|_| ())?;
    // SAFETY: the value is copied out at once.
    if let Some(info) = unsafe { PY_PROCESSES.get(parent_tgid) }.copied() {
        // A full map only costs the child its Python stacks, not its counts.
        let _ = PY_PROCESSES.insert(child_tgid, info, 0);
    }
    emit(ForkRecord {
        header: header(RecordKind::Fork, parent_tgid),
        child_tgid,
        _pad: 0,
    });
    Ok(())
}

/// Tracepoint `sched/sched_process_exec` (no field is read: after exec the
/// current task is the process's only thread).
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    try_sched_process_exec();
    0
}

fn try_sched_process_exec() {
    let (tgid, _) = current_ids();
    let Some(counters) = PROCESSES.get_ptr_mut(tgid) else {
        return;
    };
    // The new image has a new heap: learn its end again at the next brk.
    // SAFETY: live map value of a traced process.
    unsafe { swap(&raw mut (*counters).brk_end, 0) };
    let _ = PY_PROCESSES.remove(tgid);
    emit(ExecRecord {
        header: header(RecordKind::Exec, tgid),
    });
}

/// Tracepoint `sched/sched_process_exit`, format
/// (/sys/kernel/tracing/events/sched/sched_process_exit/format):
/// `char comm[16]` @8, `pid_t pid` @24, `int prio` @28, `bool group_dead` @32.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    match try_sched_process_exit(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_sched_process_exit(ctx: &TracePointContext) -> Result<(), ()> {
    // SAFETY: offset within the tracepoint record (format above).
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.map_err(|_| ())?;
    let (tgid, _) = current_ids();
    if group_dead == 0 || PROCESSES.get_ptr(tgid).is_none() {
        return Ok(());
    }
    emit(ExitRecord {
        header: header(RecordKind::Exit, tgid),
    });
    Ok(())
}
