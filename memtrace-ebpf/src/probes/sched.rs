//! Process lifecycle: `sched_process_fork` extends the traced set in the
//! kernel (so a worker forked by a traced master is traced from its first
//! page, starting from the memory it inherited); `sched_process_exec` ends
//! an image and restarts the counters for the new one (`execve`'s entry and
//! exit bracket the teardown of the old one, which is not counted); the start of an exit
//! (CPython's finalization, `exit_group`) freezes a process's memory as it
//! was before teardown; `sched_process_exit` reports the exit status and the
//! final counters when the last thread exits and forgets the process, so a
//! reused tgid starts fresh.

use aya_ebpf::{
    bindings::BPF_ANY,
    macros::{btf_tracepoint, tracepoint, uprobe},
    programs::{BtfTracePointContext, ProbeContext, TracePointContext},
};
use memtrace_common::{
    ExecRecord, ExitBeginReason, ExitBeginRecord, ExitRecord, ForkRecord, ProcessCounters,
    RecordKind, AFTER_FORK, EXIT_BEGUN, FINALIZE_ENTERED, MM_ANONPAGES, MM_FILEPAGES,
    MM_SHMEMPAGES, RSS_ALL_KNOWN, RSS_MEMBER_COUNT, SHARED_PARENT_MM,
};

use crate::{
    counters::{clear_bits, current_ids, set_bits, traced},
    kernel,
    maps::{
        ALLOC_THREADS, FOLLOW_FORKS, PROCESSES, PY_PROCESSES, SIGNAL_LIVE_OFFSET,
        SIGNAL_OOM_MM_OFFSET, TASK_EXIT_CODE_OFFSET, TASK_PID_OFFSET, TASK_SIGNAL_OFFSET,
        TASK_START_BOOTTIME_OFFSET, TASK_TGID_OFFSET,
    },
    ring::{emit, header},
    sharers,
};

/// BTF tracepoint `sched_process_fork(struct task_struct *parent, struct
/// task_struct *child)` (include/trace/events/sched.h; the raw tracepoint
/// arguments, not the `sched/sched_process_fork/format` record, which lacks
/// the child's tgid). Fires in the parent (`kernel_clone` passes `current`)
/// after `copy_process`, before the child is woken.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    match try_sched_process_fork(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_sched_process_fork(ctx: &BtfTracePointContext) -> Result<(), ()> {
    if FOLLOW_FORKS.load() == 0 {
        return Ok(());
    }
    let (parent_tgid, _) = current_ids();
    if traced(parent_tgid).is_none() {
        return Ok(());
    }
    let child: u64 = ctx.arg(1);
    let child_tgid: u32 = kernel::field(child, TASK_TGID_OFFSET.load())?;
    let child_pid: u32 = kernel::field(child, TASK_PID_OFFSET.load())?;
    if child_pid != child_tgid {
        return Ok(()); // a new thread of a traced process, already covered
    }
    let start_boottime_ns: u64 = kernel::field(child, TASK_START_BOOTTIME_OFFSET.load())?;
    let mm = kernel::task_mm(child);
    let shares_parent_mm = mm != 0 && mm == kernel::task_mm(kernel::current_task());
    let rss_bytes = if mm == 0 || shares_parent_mm {
        [0; RSS_MEMBER_COUNT]
    } else {
        kernel::mm_rss_bytes(mm)
    };
    let counters = ProcessCounters {
        rss_bytes,
        rss_known: RSS_ALL_KNOWN,
        rss_peak_bytes: rss_bytes[MM_FILEPAGES]
            + rss_bytes[MM_ANONPAGES]
            + rss_bytes[MM_SHMEMPAGES],
        parent_tgid,
        mm: if shares_parent_mm {
            SHARED_PARENT_MM
        } else {
            0
        },
        exit_flags: AFTER_FORK,
        ..ProcessCounters::default()
    };
    // BPF_ANY: an entry left by an earlier process with this tgid (whose
    // exit was not seen) is replaced.
    PROCESSES
        .insert(child_tgid, counters, BPF_ANY.into())
        .map_err(|_| ())?;
    if !shares_parent_mm {
        sharers::forked(parent_tgid, child_tgid);
    }
    // SAFETY: the value is copied out at once.
    match unsafe { PY_PROCESSES.get(parent_tgid) }.copied() {
        // A full map only costs the child its Python stacks, not its counts.
        Some(info) => {
            let _ = PY_PROCESSES.insert(child_tgid, info, BPF_ANY.into());
        }
        None => {
            let _ = PY_PROCESSES.remove(child_tgid);
        }
    }
    emit(ForkRecord {
        header: header(RecordKind::Fork, parent_tgid),
        child_tgid,
        shares_parent_mm: u32::from(shares_parent_mm),
        child_start_boottime_ns: start_boottime_ns,
        child_rss_bytes: rss_bytes,
    });
    Ok(())
}

/// Tracepoint `sched/sched_process_exec` (no field is read: after exec the
/// current task is the process's only thread, and the new address space is
/// installed).
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    try_sched_process_exec();
    0
}

fn try_sched_process_exec() {
    let (tgid, _) = current_ids();
    let Some(counters) = traced(tgid) else {
        return;
    };
    // SAFETY: live map value; only the exec'ing thread is left, so plain
    // reads and writes do not race.
    let old = unsafe { *counters };
    emit(ExecRecord {
        header: header(RecordKind::Exec, tgid),
        counters: old,
    });
    // The new image starts from nothing: every page it makes resident is
    // its growth. Its mm is adopted at its first rss_stat event.
    // SAFETY: as above.
    unsafe {
        *counters = ProcessCounters {
            rss_known: RSS_ALL_KNOWN,
            parent_tgid: old.parent_tgid,
            exec_count: old.exec_count.wrapping_add(1),
            ..ProcessCounters::default()
        };
    }
    let _ = PY_PROCESSES.remove(tgid);
    sharers::left(tgid);
    // Allocator mode: the old image's call in progress (its return never
    // comes) must not leave the new image's thread counted as nested.
    let _ = ALLOC_THREADS.remove(tgid);
}

/// Tracepoints `syscalls/sys_enter_execve` and `sys_enter_execveat` (no
/// field is read).
#[tracepoint]
pub fn sys_enter_execve(_ctx: TracePointContext) -> u32 {
    set_in_execve(1);
    0
}

/// Tracepoints `syscalls/sys_exit_execve` and `sys_exit_execveat` (no
/// field is read): the call failed, or succeeded and `sched_process_exec`
/// already restarted the counters.
#[tracepoint]
pub fn sys_exit_execve(_ctx: TracePointContext) -> u32 {
    set_in_execve(0);
    0
}

/// Marks the current process as inside `execve` (or not) for `rss_stat`.
#[inline(always)]
fn set_in_execve(value: u32) {
    let (tgid, _) = current_ids();
    if let Some(counters) = traced(tgid) {
        // SAFETY: live map value of a traced process.
        unsafe { (*counters).in_execve = value };
    }
}

/// Uprobe on CPython's `Py_FinalizeEx` and `Py_Exit`, for interpreters
/// without the [`python_finalize_teardown`] symbol (3.13+): the exit begins
/// when finalization is entered.
#[uprobe]
pub fn python_finalize(_ctx: ProbeContext) -> u32 {
    exit_begins(ExitBeginReason::PythonFinalize);
    0
}

/// Uprobe on CPython's `Py_FinalizeEx` and `Py_Exit` (3.11, 3.12): marks
/// the process as finalizing. The exit has not begun: `Py_FinalizeEx` first
/// waits for the non-daemon threads and runs the `atexit` handlers, which
/// may still allocate (Python/pylifecycle.c).
#[uprobe]
pub fn python_finalize_entered(_ctx: ProbeContext) -> u32 {
    let (tgid, _) = current_ids();
    if let Some(counters) = traced(tgid) {
        // SAFETY: live map value of a traced process.
        unsafe { set_bits(&raw mut (*counters).exit_flags, FINALIZE_ENTERED) };
    }
    0
}

/// Uprobe on CPython's `_PyThreadState_RemoveExcept` (3.14+): called by
/// `_Py_Finalize` once the threads are joined and the `atexit` handlers
/// ran, but also by `Py_EndInterpreter` (a sub-interpreter ends) and after
/// `os.fork()` in the child. The exit begins here once finalization was
/// entered ([`python_finalize_entered`]), or, when that probe came too late
/// (main returned before the process was probed, and finalization waits
/// for its threads), on the main thread, where finalization runs and where
/// a pool's sub-interpreters (each in a thread of its own) do not end; the
/// call after a fork is ignored as in [`python_finalize_teardown`].
#[uprobe]
pub fn python_finalize_teardown_entered(_ctx: ProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    let Some(counters) = traced(tgid) else {
        return 0;
    };
    // SAFETY: live map value of a traced process.
    let flags = unsafe { clear_bits(&raw mut (*counters).exit_flags, AFTER_FORK) };
    if flags & FINALIZE_ENTERED != 0 || (flags & AFTER_FORK == 0 && tid == tgid) {
        exit_begins(ExitBeginReason::PythonFinalize);
    }
    0
}

/// Uprobe on CPython's `_PyThreadState_DeleteExcept` (3.11, 3.12): called
/// by `Py_FinalizeEx` once the threads are joined and the `atexit`
/// handlers ran, right before the interpreter frees its objects; the exit
/// begins here. It is also the first call in a child after `os.fork()`:
/// that one is ignored, unless `Py_FinalizeEx` was seen first (either probe
/// may be attached too late for a process's first moments; together they
/// cover each other).
#[uprobe]
pub fn python_finalize_teardown(_ctx: ProbeContext) -> u32 {
    let (tgid, _) = current_ids();
    let Some(counters) = traced(tgid) else {
        return 0;
    };
    // SAFETY: live map value of a traced process.
    let flags = unsafe { clear_bits(&raw mut (*counters).exit_flags, AFTER_FORK) };
    if flags & FINALIZE_ENTERED != 0 || flags & AFTER_FORK == 0 {
        exit_begins(ExitBeginReason::PythonFinalize);
    }
    0
}

/// Tracepoint `syscalls/sys_enter_exit_group` (no field is read).
#[tracepoint]
pub fn sys_enter_exit_group(_ctx: TracePointContext) -> u32 {
    exit_begins(ExitBeginReason::ExitGroup);
    0
}

/// Sends the current process's counters in an [`ExitBeginRecord`], once per
/// image.
#[inline(always)]
fn exit_begins(reason: ExitBeginReason) {
    let (tgid, _) = current_ids();
    let Some(counters) = traced(tgid) else {
        return;
    };
    // SAFETY: live map value of a traced process.
    if unsafe { set_bits(&raw mut (*counters).exit_flags, EXIT_BEGUN) } & EXIT_BEGUN != 0 {
        return;
    }
    emit(ExitBeginRecord {
        header: header(RecordKind::ExitBegin, tgid),
        reason: reason as u32,
        _pad: 0,
        // SAFETY: as above (a racing update only changes a counter by a page).
        counters: unsafe { *counters },
    });
}

/// Tracepoint `sched/sched_process_exit` (no field of its record is read:
/// `group_dead` exists only from 6.16). Fires in every exiting thread after
/// `tsk->exit_code` is set and `tsk->signal->live` decremented
/// (kernel/exit.c `do_exit`); on 6.16+ before `exit_mm()`, before that
/// after it.
#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    match try_sched_process_exit() {
        Ok(()) | Err(()) => 0,
    }
}

fn try_sched_process_exit() -> Result<(), ()> {
    let (tgid, _) = current_ids();
    let Some(counters) = traced(tgid) else {
        return Ok(());
    };
    let task = kernel::current_task();
    // The whole thread group is dead once `signal->live` reached 0 (two
    // threads exiting at once may both see 0: the first one reports).
    let signal: u64 = kernel::field(task, TASK_SIGNAL_OFFSET.load())?;
    let live: i32 = kernel::field(signal, SIGNAL_LIVE_OFFSET.load())?;
    if live != 0 {
        return Ok(());
    }
    let exit_code: i32 = kernel::field(task, TASK_EXIT_CODE_OFFSET.load()).unwrap_or(0);
    // Set by `mark_oom_victim` when the OOM killer chose the group; stays
    // until the signal_struct is freed, after this tracepoint.
    let oom_mm: u64 = kernel::field(signal, SIGNAL_OOM_MM_OFFSET.load()).unwrap_or(0);
    emit(ExitRecord {
        header: header(RecordKind::Exit, tgid),
        exit_code: exit_code as u32,
        mm_released: u32::from(kernel::task_mm(task) == 0),
        oom_victim: u32::from(oom_mm != 0),
        _pad: 0,
        // SAFETY: live map value; the last thread is exiting.
        counters: unsafe { *counters },
    });
    let _ = PROCESSES.remove(tgid);
    let _ = PY_PROCESSES.remove(tgid);
    sharers::left(tgid);
    Ok(())
}
