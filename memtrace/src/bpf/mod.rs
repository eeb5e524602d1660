//! Kernel side, userspace half (first step of the data flow): loads the
//! embedded `memtrace-ebpf` object, sets its globals, attaches its
//! tracepoint programs and gives access to its maps (traced processes,
//! Python layouts, counters, dropped records) and to the `RECORDS` ring
//! buffer that `events` drains.

pub mod alloc;
mod alloc_attach;
mod alloc_hooked;
mod btf;
pub mod elf_symbols;
mod finalize;
#[cfg(test)]
mod live_tests;
mod preflight;

use std::path::{Path, PathBuf};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, ProgramError, TracePoint, UProbe},
    Btf, Ebpf, EbpfLoader,
};
use memtrace_common::{
    ProcessCounters, PyProcessInfo, DROPPED_MAP, PROCESSES_MAP, PY_PROCESSES_MAP, RECORDS_MAP,
};

use alloc::{AllocLink, SymbolOffsets};
use alloc_attach::{fill_exp_draws, load_alloc_programs};
use alloc_hooked::HookedProcesses;
use elf_symbols::ElfSymbols;
use finalize::FinalizeProbes;

pub use alloc_attach::AllocStats;

pub use btf::{kernel_offsets, KernelOffsets, VMLINUX_BTF_PATH};
pub use finalize::{teardown_symbol, ExitPoint, PYTHON_FINALIZE_SYMBOLS};
pub use preflight::TRACEFS_PATH;

/// The BPF object built by memtrace/build.rs (empty when the build ran with
/// `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace"));

/// Names of the load-time globals of `memtrace-ebpf/src/maps.rs`.
pub mod globals {
    /// `u64`: mean sampling interval of memory records, in bytes.
    pub const SAMPLE_INTERVAL_BYTES: &str = "SAMPLE_INTERVAL_BYTES";
    /// `u64`: pending ring-buffer bytes above which a submit wakes the reader.
    pub const WAKEUP_THRESHOLD_BYTES: &str = "WAKEUP_THRESHOLD_BYTES";
    /// `u32`: non-zero to trace processes forked by traced ones.
    pub const FOLLOW_FORKS: &str = "FOLLOW_FORKS";
    /// `u64`: `offsetof(task_struct, thread.fsbase)`.
    pub const TASK_FSBASE_OFFSET: &str = "TASK_FSBASE_OFFSET";
    /// `u64`: `offsetof(task_struct, tgid)`.
    pub const TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
    /// `u64`: `offsetof(task_struct, pid)`.
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    /// `u64`: `offsetof(task_struct, exit_code)`.
    pub const TASK_EXIT_CODE_OFFSET: &str = "TASK_EXIT_CODE_OFFSET";
    /// `u64`: `offsetof(task_struct, start_boottime)`.
    pub const TASK_START_BOOTTIME_OFFSET: &str = "TASK_START_BOOTTIME_OFFSET";
    /// `u64`: `offsetof(task_struct, mm)`.
    pub const TASK_MM_OFFSET: &str = "TASK_MM_OFFSET";
    /// `u64`: `offsetof(task_struct, signal)`.
    pub const TASK_SIGNAL_OFFSET: &str = "TASK_SIGNAL_OFFSET";
    /// `u64`: `offsetof(signal_struct, live)`.
    pub const SIGNAL_LIVE_OFFSET: &str = "SIGNAL_LIVE_OFFSET";
    /// `u64`: `offsetof(signal_struct, oom_mm)`.
    pub const SIGNAL_OOM_MM_OFFSET: &str = "SIGNAL_OOM_MM_OFFSET";
    /// `u64`: `offsetof(mm_struct, rss_stat)`.
    pub const MM_RSS_STAT_OFFSET: &str = "MM_RSS_STAT_OFFSET";
    /// `u64`: `sizeof(struct percpu_counter)`.
    pub const PERCPU_COUNTER_SIZE: &str = "PERCPU_COUNTER_SIZE";
    /// `u64`: `offsetof(percpu_counter, count)`.
    pub const PERCPU_COUNTER_COUNT_OFFSET: &str = "PERCPU_COUNTER_COUNT_OFFSET";
    /// `u64`: `offsetof(pt_regs, ip)`.
    pub const PT_REGS_IP_OFFSET: &str = "PT_REGS_IP_OFFSET";
    /// `u64`: `offsetof(pt_regs, sp)`.
    pub const PT_REGS_SP_OFFSET: &str = "PT_REGS_SP_OFFSET";
    /// `u64`: `offsetof(pt_regs, bp)`.
    pub const PT_REGS_BP_OFFSET: &str = "PT_REGS_BP_OFFSET";
}

/// The classic tracepoint programs: (program name, tracefs category,
/// tracepoint name). Program names are the `memtrace-ebpf` functions; a
/// program attached to two tracepoints (`execve` and `execveat`) has a row
/// for each.
const TRACEPOINTS: [(&str, &str, &str); 17] = [
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("sys_enter_exit_group", "syscalls", "sys_enter_exit_group"),
    ("sys_enter_execve", "syscalls", "sys_enter_execve"),
    ("sys_enter_execve", "syscalls", "sys_enter_execveat"),
    ("sys_exit_execve", "syscalls", "sys_exit_execve"),
    ("sys_exit_execve", "syscalls", "sys_exit_execveat"),
    ("sys_enter_mmap", "syscalls", "sys_enter_mmap"),
    ("sys_exit_mmap", "syscalls", "sys_exit_mmap"),
    ("sys_enter_munmap", "syscalls", "sys_enter_munmap"),
    ("sys_exit_munmap", "syscalls", "sys_exit_munmap"),
    ("sys_enter_mremap", "syscalls", "sys_enter_mremap"),
    ("sys_exit_mremap", "syscalls", "sys_exit_mremap"),
    ("sys_enter_brk", "syscalls", "sys_enter_brk"),
    ("sys_exit_brk", "syscalls", "sys_exit_brk"),
    ("sys_enter_madvise", "syscalls", "sys_enter_madvise"),
    ("sys_exit_madvise", "syscalls", "sys_exit_madvise"),
];

/// The BTF tracepoint programs (`tp_btf`), each named after the raw
/// tracepoint it attaches to: the fork (its child's task is an argument) and
/// the per-page hot path, where no trace record is built.
const BTF_TRACEPOINTS: [&str; 4] = [
    "sched_process_fork",
    "page_fault_user",
    "page_fault_kernel",
    "rss_stat",
];

/// Errors of loading, attaching and reading the BPF side.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The process may not load tracing programs: a capability is missing.
    #[error(
        "memtrace cannot load its tracing programs: {missing} missing from its effective \
         capabilities (of CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN it has: {effective}); {hint}"
    )]
    NotPrivileged {
        /// Capabilities that are missing, e.g. `CAP_BPF and CAP_PERFMON`.
        missing: String,
        /// Which of the capabilities that matter it has, by name.
        effective: String,
        /// What to do, which depends on whether it runs as root.
        hint: String,
    },
    /// The kernel publishes no BTF.
    #[error(
        "kernel BTF `{}` is missing: memtrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        path.display()
    )]
    NoBtf {
        /// The BTF path that was looked for.
        path: PathBuf,
    },
    /// tracefs is not mounted and mounting it failed.
    #[error(
        "tracefs is not mounted at `{}` and mounting it failed ({detail}): \
         run `mount -t tracefs nodev {}` as root",
        path.display(), path.display()
    )]
    Tracefs {
        /// The mount point.
        path: PathBuf,
        /// Why `mount` failed.
        detail: String,
    },
    /// tracefs is not mounted and this process may not mount it.
    #[error(
        "tracefs is not mounted at `{}`, and mounting it needs CAP_SYS_ADMIN, which memtrace \
         does not have: run `mount -t tracefs nodev {}` as root once",
        path.display(), path.display()
    )]
    TracefsUnmounted {
        /// The mount point.
        path: PathBuf,
    },
    /// tracefs is mounted but this process may not read it.
    #[error(
        "tracefs at `{}` (mode {mode:04o}, owner uid {owner_uid}) cannot be read by uid {uid} \
         without CAP_DAC_READ_SEARCH: memtrace reads the ids of its syscall tracepoints there; \
         add CAP_DAC_READ_SEARCH, or run as uid {owner_uid}",
        path.display()
    )]
    TracefsDenied {
        /// The mount point.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner_uid: u32,
        /// memtrace's effective uid.
        uid: u32,
    },
    /// The kernel BTF could not be parsed.
    #[error("cannot read kernel BTF `{}`: {detail}", path.display())]
    Btf {
        /// The BTF file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// A struct or field the programs need is not in the kernel BTF.
    #[error("kernel BTF has no field `{field}` in `struct {type_name}`")]
    BtfField {
        /// The struct.
        type_name: String,
        /// The field.
        field: String,
    },
    /// A probed binary's symbols could not be read.
    #[error("cannot read the symbols of `{}`: {detail}", path.display())]
    Symbols {
        /// The binary.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The eBPF object was not built into this binary.
    #[error(
        "this memtrace binary has no eBPF object (built with AYA_BUILD_SKIP=1): \
         rebuild without it (`cargo xtask build`)"
    )]
    ObjectMissing,
    /// The object could not be loaded (maps created, relocations applied).
    #[error("cannot load the eBPF object")]
    Load {
        /// aya's error.
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// The kernel's BTF could not be loaded for the `tp_btf` program.
    #[error("cannot load kernel BTF for program `{program}`")]
    KernelBtf {
        /// The program.
        program: &'static str,
        /// aya's error.
        #[source]
        source: aya::BtfError,
    },
    /// A program is missing from the object or has the wrong type.
    #[error("eBPF program `{program}` is missing from the object")]
    ProgramMissing {
        /// The program name.
        program: &'static str,
    },
    /// The verifier rejected a program, or attaching it failed.
    #[error("eBPF program `{program}`: {action} failed")]
    Program {
        /// The program name.
        program: &'static str,
        /// `load` (verifier) or `attach`.
        action: &'static str,
        /// aya's error (the verifier log for `load`).
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map is missing from the object (or was already taken).
    #[error("eBPF map `{map}` is missing (or was already taken)")]
    MapMissing {
        /// The map name.
        map: &'static str,
    },
    /// A map operation failed.
    #[error("eBPF map `{map}`: {action} failed")]
    Map {
        /// The map name.
        map: &'static str,
        /// What was done, e.g. `insert tgid 1234`.
        action: String,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
}

/// How the kernel side samples and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracerOptions {
    /// Mean sampling interval of memory records, in bytes: an event of `n`
    /// bytes is recorded with probability `min(1, n / interval)`. 1 records
    /// every event; 0 is treated as 1.
    pub sample_interval_bytes: u64,
    /// Trace processes that traced processes fork (workers of a master).
    pub follow_forks: bool,
    /// Pending ring-buffer bytes above which the kernel wakes the reader;
    /// below it records are submitted without a wakeup and the reader polls.
    pub wakeup_threshold_bytes: u64,
    /// Allocator mode: load the `alloc_*` uprobes (attached per process with
    /// [`Tracer::attach_allocator`]) and fill their sampling draws.
    pub allocations: bool,
    /// Records ring-buffer bytes (a power of two of pages; `None`: 32 MiB),
    /// which count in memtrace's RSS once written.
    pub ring_bytes: Option<u32>,
}

/// Size of one verified program, for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramSize {
    /// Program name.
    pub name: String,
    /// Instructions the verifier processed (`verified_insns`, Linux >= 5.16).
    pub verified_instructions: Option<u32>,
    /// Size of the translated (post-verifier) program, in bytes.
    pub translated_bytes: Option<u32>,
}

/// The loaded BPF side: owns the programs (detached when dropped) and maps.
pub struct Tracer {
    ebpf: Ebpf,
    /// The functions of the binaries probed, read once per image.
    symbols: ElfSymbols,
    /// Where each probed binary's processes begin to exit.
    finalize: FinalizeProbes,
    /// Allocator mode: symbol offsets per binary.
    alloc_symbols: SymbolOffsets,
    /// Allocator mode: the probes attached for each process.
    alloc_links: HookedProcesses<AllocLink>,
}

impl Tracer {
    /// Checks privileges and kernel features, loads the object with
    /// `opts` and the running kernel's `task_struct` offsets as globals,
    /// and loads every program (runs the verifier). Nothing is attached yet.
    ///
    /// # Errors
    /// Any preflight error ([`BpfError::NotPrivileged`], [`BpfError::NoBtf`],
    /// [`BpfError::Tracefs`], [`BpfError::TracefsUnmounted`],
    /// [`BpfError::TracefsDenied`]), [`BpfError::ObjectMissing`], a BTF error, or a
    /// load / verifier error.
    pub fn load(opts: &TracerOptions) -> Result<Self, BpfError> {
        preflight::check()?;
        if EBPF_OBJECT.is_empty() {
            return Err(BpfError::ObjectMissing);
        }
        let offsets = kernel_offsets(Path::new(VMLINUX_BTF_PATH))?;
        let sample_interval_bytes = opts.sample_interval_bytes.max(1);
        let follow_forks = u32::from(opts.follow_forks);
        let mut loader = EbpfLoader::new();
        if let Some(bytes) = opts.ring_bytes {
            loader.map_max_entries(RECORDS_MAP, bytes);
        }
        let mut ebpf = loader
            .override_global(globals::SAMPLE_INTERVAL_BYTES, &sample_interval_bytes, true)
            .override_global(
                globals::WAKEUP_THRESHOLD_BYTES,
                &opts.wakeup_threshold_bytes,
                true,
            )
            .override_global(globals::FOLLOW_FORKS, &follow_forks, true)
            .override_global(globals::TASK_FSBASE_OFFSET, &offsets.fsbase, true)
            .override_global(globals::TASK_TGID_OFFSET, &offsets.tgid, true)
            .override_global(globals::TASK_PID_OFFSET, &offsets.pid, true)
            .override_global(globals::TASK_EXIT_CODE_OFFSET, &offsets.exit_code, true)
            .override_global(
                globals::TASK_START_BOOTTIME_OFFSET,
                &offsets.start_boottime,
                true,
            )
            .override_global(globals::TASK_MM_OFFSET, &offsets.mm, true)
            .override_global(globals::TASK_SIGNAL_OFFSET, &offsets.signal, true)
            .override_global(globals::SIGNAL_LIVE_OFFSET, &offsets.signal_live, true)
            .override_global(globals::SIGNAL_OOM_MM_OFFSET, &offsets.signal_oom_mm, true)
            .override_global(globals::MM_RSS_STAT_OFFSET, &offsets.mm_rss_stat, true)
            .override_global(
                globals::PERCPU_COUNTER_SIZE,
                &offsets.percpu_counter_size,
                true,
            )
            .override_global(
                globals::PERCPU_COUNTER_COUNT_OFFSET,
                &offsets.percpu_counter_count,
                true,
            )
            .override_global(globals::PT_REGS_IP_OFFSET, &offsets.pt_regs_ip, true)
            .override_global(globals::PT_REGS_SP_OFFSET, &offsets.pt_regs_sp, true)
            .override_global(globals::PT_REGS_BP_OFFSET, &offsets.pt_regs_bp, true)
            .load(EBPF_OBJECT)
            .map_err(|source| BpfError::Load {
                source: Box::new(source),
            })?;
        load_programs(&mut ebpf)?;
        if opts.allocations {
            load_alloc_programs(&mut ebpf)?;
            fill_exp_draws(&mut ebpf, sample_interval_bytes)?;
        }
        Ok(Self {
            ebpf,
            symbols: ElfSymbols::new(&[]),
            finalize: FinalizeProbes::default(),
            alloc_symbols: SymbolOffsets::default(),
            alloc_links: HookedProcesses::default(),
        })
    }

    /// Looks for separate debug files under each of `dirs` (`--debug-dir`)
    /// before `/usr/lib/debug` (see [`elf_symbols`]).
    pub fn set_debug_dirs(&mut self, dirs: &[PathBuf]) {
        self.symbols = ElfSymbols::new(dirs);
    }

    /// Attaches every program to its tracepoint.
    ///
    /// # Errors
    /// [`BpfError::Program`] naming the program that failed to attach.
    pub fn attach(&mut self) -> Result<(), BpfError> {
        for (program, category, name) in TRACEPOINTS {
            let tracepoint: &mut TracePoint = program_mut(&mut self.ebpf, program)?;
            tracepoint
                .attach(category, name)
                .map_err(|source| program_error(program, "attach", source))?;
        }
        for program in BTF_TRACEPOINTS {
            let tracepoint: &mut BtfTracePoint = program_mut(&mut self.ebpf, program)?;
            tracepoint
                .attach()
                .map_err(|source| program_error(program, "attach", source))?;
        }
        Ok(())
    }

    /// Sizes of the loaded programs as the kernel reports them.
    ///
    /// # Errors
    /// [`BpfError::Program`] when the kernel cannot be queried.
    pub fn program_sizes(&self) -> Result<Vec<ProgramSize>, BpfError> {
        let mut sizes = Vec::new();
        for (name, program) in self.ebpf.programs() {
            let info = match program.info() {
                Ok(info) => info,
                // Allocator mode's programs are loaded only with it.
                Err(ProgramError::NotLoaded) => continue,
                Err(source) => return Err(program_error("(info)", "query", source)),
            };
            sizes.push(ProgramSize {
                name: name.to_owned(),
                verified_instructions: info.verified_instruction_count(),
                translated_bytes: info.size_translated(),
            });
        }
        sizes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(sizes)
    }

    /// Starts tracing process `tgid` with initial `counters` (usually zero,
    /// with `rss_bytes`/`rss_known` from /proc). Its forks follow in the
    /// kernel when `follow_forks` is set.
    ///
    /// # Errors
    /// [`BpfError::Map`] (e.g. the map is full).
    pub fn trace_process(&mut self, tgid: u32, counters: ProcessCounters) -> Result<(), BpfError> {
        let mut processes = self.processes_mut()?;
        processes
            .insert(tgid, counters, 0)
            .map_err(|source| map_error(PROCESSES_MAP, format!("insert tgid {tgid}"), source))
    }

    /// Sets how to walk the Python stacks of process `tgid`.
    ///
    /// # Errors
    /// [`BpfError::Map`].
    pub fn set_python(&mut self, tgid: u32, info: PyProcessInfo) -> Result<(), BpfError> {
        let map = map_mut(&mut self.ebpf, PY_PROCESSES_MAP)?;
        let mut py: HashMap<&mut MapData, u32, PyProcessInfo> = HashMap::try_from(map)
            .map_err(|source| map_error(PY_PROCESSES_MAP, "open".into(), source))?;
        py.insert(tgid, info, 0)
            .map_err(|source| map_error(PY_PROCESSES_MAP, format!("insert tgid {tgid}"), source))
    }

    /// The counters of every traced process, in map order (the kernel side
    /// removes a process when it exits).
    ///
    /// # Errors
    /// [`BpfError::Map`].
    pub fn counters(&self) -> Result<Vec<(u32, ProcessCounters)>, BpfError> {
        self.processes()?
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| map_error(PROCESSES_MAP, "iterate".into(), source))
    }

    /// The counters of traced process `tgid` now; `None` when it is not
    /// traced or the map cannot be read.
    #[must_use]
    pub fn counters_of(&self, tgid: u32) -> Option<ProcessCounters> {
        self.processes().ok()?.get(&tgid, 0).ok()
    }

    /// The `PROCESSES` map, read-only.
    fn processes(&self) -> Result<HashMap<&MapData, u32, ProcessCounters>, BpfError> {
        let map = self
            .ebpf
            .map(PROCESSES_MAP)
            .ok_or(BpfError::MapMissing { map: PROCESSES_MAP })?;
        HashMap::try_from(map).map_err(|source| map_error(PROCESSES_MAP, "open".into(), source))
    }

    /// Records the kernel could not put in the ring buffer (it was full),
    /// summed over CPUs.
    ///
    /// # Errors
    /// [`BpfError::Map`].
    pub fn dropped_records(&self) -> Result<u64, BpfError> {
        let map = self
            .ebpf
            .map(DROPPED_MAP)
            .ok_or(BpfError::MapMissing { map: DROPPED_MAP })?;
        let dropped: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)
            .map_err(|source| map_error(DROPPED_MAP, "open".into(), source))?;
        let per_cpu = dropped
            .get(&0, 0)
            .map_err(|source| map_error(DROPPED_MAP, "read".into(), source))?;
        Ok(per_cpu.iter().sum())
    }

    /// Takes the `RECORDS` ring buffer out of the tracer (once) for the
    /// reader in `events`.
    ///
    /// # Errors
    /// [`BpfError::MapMissing`] on a second call, [`BpfError::Map`].
    pub fn take_records(&mut self) -> Result<RingBuf<MapData>, BpfError> {
        let map = self
            .ebpf
            .take_map(RECORDS_MAP)
            .ok_or(BpfError::MapMissing { map: RECORDS_MAP })?;
        RingBuf::try_from(map).map_err(|source| map_error(RECORDS_MAP, "open".into(), source))
    }

    fn processes_mut(&mut self) -> Result<HashMap<&mut MapData, u32, ProcessCounters>, BpfError> {
        let map = map_mut(&mut self.ebpf, PROCESSES_MAP)?;
        HashMap::try_from(map).map_err(|source| map_error(PROCESSES_MAP, "open".into(), source))
    }
}

/// Loads (verifies) every program of the object.
fn load_programs(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    for (index, (program, _, _)) in TRACEPOINTS.iter().enumerate() {
        if TRACEPOINTS[..index]
            .iter()
            .any(|(loaded, _, _)| loaded == program)
        {
            continue;
        }
        let tracepoint: &mut TracePoint = program_mut(ebpf, program)?;
        tracepoint
            .load()
            .map_err(|source| program_error(program, "load", source))?;
    }
    let btf = Btf::from_sys_fs().map_err(|source| BpfError::KernelBtf {
        program: BTF_TRACEPOINTS[0],
        source,
    })?;
    for program in BTF_TRACEPOINTS {
        let tracepoint: &mut BtfTracePoint = program_mut(ebpf, program)?;
        tracepoint
            .load(program, &btf)
            .map_err(|source| program_error(program, "load", source))?;
    }
    for program in finalize::PROGRAMS {
        let uprobe: &mut UProbe = program_mut(ebpf, program)?;
        uprobe
            .load()
            .map_err(|source| program_error(program, "load", source))?;
    }
    Ok(())
}

/// The program `name` as a `T`.
fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, BpfError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name)
        .and_then(|program| program.try_into().ok())
        .ok_or(BpfError::ProgramMissing { program: name })
}

fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut aya::maps::Map, BpfError> {
    ebpf.map_mut(name).ok_or(BpfError::MapMissing { map: name })
}

fn program_error(
    program: &'static str,
    action: &'static str,
    source: aya::programs::ProgramError,
) -> BpfError {
    BpfError::Program {
        program,
        action,
        source,
    }
}

fn map_error(map: &'static str, action: String, source: aya::maps::MapError) -> BpfError {
    BpfError::Map {
        map,
        action,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_is_in_the_object() {
        if EBPF_OBJECT.is_empty() {
            eprintln!("skipping: built with AYA_BUILD_SKIP=1");
            return;
        }
        let object = aya_obj_names(EBPF_OBJECT);
        for (program, _, _) in TRACEPOINTS {
            assert!(
                object.iter().any(|name| name == program),
                "{program} missing"
            );
        }
        for program in BTF_TRACEPOINTS {
            assert!(
                object.iter().any(|name| name == program),
                "{program} missing"
            );
        }
        for program in finalize::PROGRAMS {
            assert!(
                object.iter().any(|name| name == program),
                "{program} missing"
            );
        }
        for program in alloc::ENTRY_PROGRAMS
            .into_iter()
            .chain([alloc::RETURN_PROGRAM])
        {
            assert!(
                object.iter().any(|name| name == program),
                "{program} missing"
            );
        }
    }

    /// Function symbol names of an ELF object.
    fn aya_obj_names(data: &[u8]) -> Vec<String> {
        use object::{Object as _, ObjectSymbol as _};
        let file = object::File::parse(data).expect("eBPF object parses");
        file.symbols()
            .filter(|symbol| symbol.kind() == object::SymbolKind::Text)
            .filter_map(|symbol| symbol.name().ok().map(str::to_owned))
            .collect()
    }
}
