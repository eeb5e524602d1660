//! Reads of kernel objects (the current task, a fork's child, an `mm`, saved
//! user registers) at byte offsets the running kernel's BTF gave userspace
//! (aya has no CO-RE), set as load-time globals in `maps`. Every read goes
//! through `bpf_probe_read_kernel`, which checks the address.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use memtrace_common::{
    MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, MM_SWAPENTS, PAGE_SIZE_BYTES, RSS_MEMBER_COUNT,
};

use crate::maps::{
    MM_RSS_STAT_OFFSET, PERCPU_COUNTER_COUNT_OFFSET, PERCPU_COUNTER_SIZE, PT_REGS_BP_OFFSET,
    PT_REGS_IP_OFFSET, PT_REGS_SP_OFFSET, TASK_MM_OFFSET,
};

/// Reads a `T` of kernel object `base` at `offset`.
#[inline(always)]
pub fn field<T>(base: u64, offset: u64) -> Result<T, ()> {
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset) as *const T) }.map_err(|_| ())
}

/// The current task (`struct task_struct *`).
#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_get_current_task() }
}

/// `task->mm` (0 for a kernel thread or an exiting task).
#[inline(always)]
pub fn task_mm(task: u64) -> u64 {
    field(task, TASK_MM_OFFSET.load()).unwrap_or(0)
}

/// The user instruction, stack and frame pointers saved in `user_regs`
/// (`struct pt_regs *`, not 0), or `None` when they cannot be read.
#[inline(always)]
pub fn user_ip_sp_bp(user_regs: u64) -> Option<(u64, u64, u64)> {
    let ip = field(user_regs, PT_REGS_IP_OFFSET.load()).ok()?;
    let sp = field(user_regs, PT_REGS_SP_OFFSET.load()).ok()?;
    let bp = field(user_regs, PT_REGS_BP_OFFSET.load()).ok()?;
    Some((ip, sp, bp))
}

/// Pages counted in `mm`'s RSS member `member` (`< RSS_MEMBER_COUNT`): its
/// `percpu_counter.count`, the value `get_mm_counter()` and the classic
/// `rss_stat` record report (per-CPU deltas below the batch are not in it),
/// negative values as 0.
#[inline(always)]
pub fn mm_member_pages(mm: u64, member: usize) -> u64 {
    let offset = MM_RSS_STAT_OFFSET.load()
        + PERCPU_COUNTER_SIZE.load() * member as u64
        + PERCPU_COUNTER_COUNT_OFFSET.load();
    field::<i64>(mm, offset).map_or(0, |count| count.max(0) as u64)
}

/// RSS of `mm` per `rss_stat` member (index `MM_*`), in bytes.
#[inline(always)]
pub fn mm_rss_bytes(mm: u64) -> [u64; RSS_MEMBER_COUNT] {
    let mut rss = [0; RSS_MEMBER_COUNT];
    for member in [MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES] {
        rss[member] = mm_member_pages(mm, member) * PAGE_SIZE_BYTES;
    }
    rss
}
