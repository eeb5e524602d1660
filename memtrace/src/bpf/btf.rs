//! Kernel struct offsets the BPF programs need (aya has no CO-RE), read at
//! start-up from the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and
//! passed to the programs as load-time globals.

use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};

use super::BpfError;

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Byte offsets into the running kernel's structs that the BPF programs
/// read (`task_struct` of the current task or a fork's child, its
/// `mm_struct` and the `percpu_counter`s of its RSS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `offsetof(struct task_struct, thread.fsbase)`: the user thread
    /// pointer (x86-64), from which the Python stack walk finds the thread's
    /// TLS (3128 on the 6.18 kernel this was written on).
    pub fsbase: u64,
    /// `offsetof(struct task_struct, tgid)`.
    pub tgid: u64,
    /// `offsetof(struct task_struct, pid)`.
    pub pid: u64,
    /// `offsetof(struct task_struct, exit_code)` (`int`, wait(2) encoding).
    pub exit_code: u64,
    /// `offsetof(struct task_struct, start_boottime)` (`u64`, ns).
    pub start_boottime: u64,
    /// `offsetof(struct task_struct, mm)`.
    pub mm: u64,
    /// `offsetof(struct task_struct, signal)` (`struct signal_struct *`).
    pub signal: u64,
    /// `offsetof(struct signal_struct, live)` (`atomic_t`: threads of the
    /// group not yet exited; 0 once the last one is in `do_exit`).
    pub signal_live: u64,
    /// `offsetof(struct signal_struct, oom_mm)` (`struct mm_struct *`: set
    /// by `mark_oom_victim` once the OOM killer chose the group).
    pub signal_oom_mm: u64,
    /// `offsetof(struct mm_struct, rss_stat)`: `struct percpu_counter
    /// rss_stat[NR_MM_COUNTERS]` (Linux 6.2+; inside an anonymous struct).
    pub mm_rss_stat: u64,
    /// `sizeof(struct percpu_counter)`.
    pub percpu_counter_size: u64,
    /// `offsetof(struct percpu_counter, count)` (`s64`).
    pub percpu_counter_count: u64,
    /// `offsetof(struct pt_regs, ip)`: the user instruction pointer saved
    /// at the last kernel entry.
    pub pt_regs_ip: u64,
    /// `offsetof(struct pt_regs, sp)`: the user stack pointer.
    pub pt_regs_sp: u64,
    /// `offsetof(struct pt_regs, bp)`: the user frame pointer.
    pub pt_regs_bp: u64,
}

/// Reads [`KernelOffsets`] from the BTF file at `path`.
///
/// # Errors
/// [`BpfError::Btf`] when the file cannot be parsed, [`BpfError::BtfField`]
/// when a struct or field is missing (e.g. a kernel older than 6.2, whose
/// `mm_struct` has no `percpu_counter` RSS).
pub fn kernel_offsets(path: &Path) -> Result<KernelOffsets, BpfError> {
    let btf = Btf::from_file(path).map_err(|source| btf_error(path, &source))?;
    let task = find_struct(&btf, path, "task_struct")?;
    let thread =
        member_struct(&btf, &task, "thread").ok_or_else(|| field_error("task_struct", "thread"))?;
    let fsbase_bits = byte_offset(&btf, &task, "task_struct", "thread")?
        + byte_offset(&btf, &thread, "thread_struct", "fsbase")?;
    let mm = find_struct(&btf, path, "mm_struct")?;
    let counter = find_struct(&btf, path, "percpu_counter")?;
    let regs = find_struct(&btf, path, "pt_regs")?;
    let signal = find_struct(&btf, path, "signal_struct")?;
    Ok(KernelOffsets {
        fsbase: fsbase_bits,
        tgid: byte_offset(&btf, &task, "task_struct", "tgid")?,
        pid: byte_offset(&btf, &task, "task_struct", "pid")?,
        exit_code: byte_offset(&btf, &task, "task_struct", "exit_code")?,
        start_boottime: byte_offset(&btf, &task, "task_struct", "start_boottime")?,
        mm: byte_offset(&btf, &task, "task_struct", "mm")?,
        signal: byte_offset(&btf, &task, "task_struct", "signal")?,
        signal_live: byte_offset(&btf, &signal, "signal_struct", "live")?,
        signal_oom_mm: byte_offset(&btf, &signal, "signal_struct", "oom_mm")?,
        mm_rss_stat: byte_offset(&btf, &mm, "mm_struct", "rss_stat")?,
        percpu_counter_size: counter.size() as u64,
        percpu_counter_count: byte_offset(&btf, &counter, "percpu_counter", "count")?,
        pt_regs_ip: byte_offset(&btf, &regs, "pt_regs", "ip")?,
        pt_regs_sp: byte_offset(&btf, &regs, "pt_regs", "sp")?,
        pt_regs_bp: byte_offset(&btf, &regs, "pt_regs", "bp")?,
    })
}

/// Byte offset of member `field` of struct `s` (named `type_name` in errors).
fn byte_offset(
    btf: &Btf,
    s: &btf_rs::Struct,
    type_name: &str,
    field: &str,
) -> Result<u64, BpfError> {
    member_bit_offset(btf, s, field)
        .map(|bits| u64::from(bits) / 8)
        .ok_or_else(|| field_error(type_name, field))
}

fn btf_error(path: &Path, source: &dyn std::fmt::Display) -> BpfError {
    BpfError::Btf {
        path: PathBuf::from(path),
        detail: source.to_string(),
    }
}

fn field_error(type_name: &str, field: &str) -> BpfError {
    BpfError::BtfField {
        type_name: type_name.to_owned(),
        field: field.to_owned(),
    }
}

/// The struct named `name` (the first with members: forward declarations
/// have none).
fn find_struct(btf: &Btf, path: &Path, name: &str) -> Result<btf_rs::Struct, BpfError> {
    let types = btf
        .resolve_types_by_name(name)
        .map_err(|source| btf_error(path, &source))?;
    types
        .into_iter()
        .find_map(|ty| match ty {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
        .ok_or_else(|| field_error(name, "(struct definition)"))
}

/// Bit offset of the member `name` in `s`, searching through
/// anonymous struct/union members (randomized-layout groups) as C does.
fn member_bit_offset(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<u32> {
    for member in &s.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        if member_name == name {
            return Some(member.bit_offset());
        }
        if member_name.is_empty() {
            if let Some(inner) = anonymous_aggregate(btf, member) {
                if let Some(offset) = member_bit_offset(btf, &inner, name) {
                    return Some(member.bit_offset() + offset);
                }
            }
        }
    }
    None
}

/// The struct or union type of an anonymous member.
fn anonymous_aggregate(btf: &Btf, member: &btf_rs::Member) -> Option<btf_rs::Struct> {
    match btf.resolve_chained_type(member).ok()? {
        Type::Struct(s) | Type::Union(s) => Some(s),
        _ => None,
    }
}

/// The struct type of the member `name` of `s` (searching anonymous members).
fn member_struct(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<btf_rs::Struct> {
    for member in &s.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        if member_name == name {
            return match btf.resolve_chained_type(member).ok()? {
                Type::Struct(inner) => Some(inner),
                _ => None,
            };
        }
        if member_name.is_empty() {
            if let Some(inner) = anonymous_aggregate(btf, member) {
                if let Some(found) = member_struct(btf, &inner, name) {
                    return Some(found);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF must give distinct, plausible offsets
    /// (skipped when the kernel publishes no BTF).
    #[test]
    fn reads_task_struct_offsets_from_vmlinux() {
        let path = Path::new(VMLINUX_BTF_PATH);
        if !path.exists() {
            eprintln!("skipping: {VMLINUX_BTF_PATH} is absent");
            return;
        }
        let offsets = kernel_offsets(path).expect("kernel offsets");
        assert_ne!(offsets.tgid, offsets.pid);
        assert_eq!(
            offsets.tgid,
            offsets.pid + 4,
            "pid_t pid; pid_t tgid; are adjacent"
        );
        assert!(
            offsets.fsbase > 1000 && offsets.fsbase < 20_000,
            "{offsets:?}"
        );
        let fields = [
            offsets.exit_code,
            offsets.start_boottime,
            offsets.mm,
            offsets.signal,
        ];
        assert!(fields.iter().all(|&o| o > 0 && o < 20_000), "{offsets:?}");
        assert!(offsets.mm_rss_stat > 0, "{offsets:?}");
        assert!(offsets.percpu_counter_count < offsets.percpu_counter_size);
        assert_eq!(offsets.pt_regs_ip, 128, "x86-64: the 17th saved register");
        assert_eq!(offsets.pt_regs_sp, 152, "x86-64: the 20th saved register");
        assert_eq!(offsets.pt_regs_bp, 32, "x86-64: the 5th saved register");
    }

    #[test]
    fn missing_file_is_a_btf_error() {
        let err = kernel_offsets(Path::new("/nonexistent/btf")).unwrap_err();
        assert!(matches!(err, BpfError::Btf { .. }), "{err}");
    }
}
