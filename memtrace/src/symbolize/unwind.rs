//! Step 3 of the data flow (symbolize), native side: the user stack copied
//! at a sampled allocation or user-mode fault (`NativeStackRecord`) to its chain of code
//! addresses, innermost first, unwound with the binaries' DWARF CFI
//! (`.eh_frame`, by framehop; frame pointers where a function has none).
//! The modules are the executable file mappings of /proc/PID/maps; each
//! frame says whether it is in the interpreter (the file holding
//! `_PyEval_EvalFrameDefault`) or in the eval loop itself, for
//! `super::chain` to cut the chain there.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _};
use procfs::process::{MMapPath, Process};

/// The function whose file is the interpreter and whose frames are the
/// Python frames' own.
const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";
/// Most frames unwound per stack.
pub const MAX_UNWOUND_FRAMES: usize = 128;
/// Shortest time between two reads of a process's maps caused by the same
/// address outside every module (JIT code, or an unreadable file): a new
/// unknown address (e.g. in a library just `dlopen`ed) reads them at once.
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// Most unknown instruction pointers remembered per process.
const MAX_UNKNOWN_IPS: usize = 4096;
/// Bytes per page: mappings start on page boundaries.
const PAGE: u64 = memtrace_common::PAGE_SIZE_BYTES;

/// Where a native frame's code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Outside the interpreter: an extension, a library, a host program,
    /// or no known module.
    Native,
    /// In the interpreter binary (libpython or a static python executable).
    Interpreter,
    /// In the interpreter's eval loop (`_PyEval_EvalFrameDefault`).
    EvalLoop,
    /// In the C runtime ([`super::is_c_runtime`]): on behalf of its caller.
    CRuntime,
}

/// One unwound frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFrame {
    /// The address to name the frame by: a return address minus one (inside
    /// the call instruction), an instruction pointer as it is.
    pub lookup_ip: u64,
    /// Where the code is.
    pub place: Place,
}

/// The registers and stack bytes of a thread, as a `NativeStackRecord`
/// carries them.
#[derive(Clone, Copy, Debug)]
pub struct StackCopy<'a> {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer.
    pub bp: u64,
    /// User address of `stack[0]`.
    pub stack_start: u64,
    /// The copied bytes.
    pub stack: &'a [u8],
    /// True when `ip` is a return address (right after a call returned, as
    /// at an allocator's uretprobe): it is named by `ip - 1`.
    pub ip_is_return: bool,
}

impl StackCopy<'_> {
    /// The little-endian `u64` at user address `addr`, if copied.
    fn read_u64(&self, addr: u64) -> Result<u64, ()> {
        let offset =
            usize::try_from(addr.checked_sub(self.stack_start).ok_or(())?).map_err(|_| ())?;
        let bytes = self
            .stack
            .get(offset..offset.checked_add(8).ok_or(())?)
            .ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    }
}

/// One ELF file's unwind sections and interpreter symbols, shared by every
/// process that maps it.
#[derive(Clone)]
struct ModuleFile {
    sections: ExplicitModuleSectionInfo<Bytes>,
    /// `PT_LOAD` segments.
    segments: Vec<Segment>,
    /// `_PyEval_EvalFrameDefault`'s addresses in the file, when it has it.
    eval_loop: Option<Range<u64>>,
}

/// A `PT_LOAD` segment of an ELF file.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// `p_vaddr`.
    vaddr: u64,
    /// `p_offset`.
    offset: u64,
    /// `p_filesz`, in bytes.
    size: u64,
    /// `p_flags` has `PF_X`.
    executable: bool,
}

/// A module mapped in a process.
struct Mapped {
    /// Its executable mapping.
    range: Range<u64>,
    /// Actual address of the file's address 0.
    bias: u64,
    /// Whether it is the interpreter, and where its eval loop is.
    eval_loop: Option<Range<u64>>,
    /// Whether it is the C runtime.
    c_runtime: bool,
    /// Whether it is memtrace's allocation sampler (`--alloc-hooks
    /// sampler`), whose frames at the top of a stack are left out.
    sampler: bool,
}

/// One process's modules and framehop state.
struct ProcessModules {
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    mapped: Vec<Mapped>,
    read_at: Instant,
    /// Instruction pointers found in no module since the maps were read.
    unknown_ips: std::collections::HashSet<u64>,
}

/// Unwinds copied user stacks of live processes, caching each ELF file's
/// unwind data (by device and inode) and each process's modules until
/// [`NativeUnwinder::forget`].
#[derive(Default)]
pub struct NativeUnwinder {
    files: HashMap<(u64, u64), Option<Arc<ModuleFile>>>,
    processes: HashMap<u32, ProcessModules>,
}

impl std::fmt::Debug for NativeUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeUnwinder")
            .field("files", &self.files.len())
            .field("processes", &self.processes.len())
            .finish_non_exhaustive()
    }
}

impl NativeUnwinder {
    /// The frames of `copy`, a stack of process `tgid`, innermost first (at
    /// most [`MAX_UNWOUND_FRAMES`]; the first is `copy.ip`'s). Unwinding
    /// stops where the copy or the unwind data ends. Empty when the
    /// process's maps cannot be read.
    pub fn unwind(&mut self, tgid: u32, copy: &StackCopy) -> Vec<NativeFrame> {
        let Some(process) = self.process(tgid, copy.ip) else {
            return Vec::new();
        };
        let regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
        let mut read = |addr| copy.read_u64(addr);
        let mut iter = process
            .unwinder
            .iter_frames(copy.ip, regs, &mut process.cache, &mut read);
        let mut frames = Vec::new();
        while frames.len() < MAX_UNWOUND_FRAMES {
            let Ok(Some(address)) = iter.next() else {
                break;
            };
            let lookup_ip = match address {
                FrameAddress::InstructionPointer(ip) if !copy.ip_is_return => ip,
                other => other.address().wrapping_sub(1),
            };
            if frames.is_empty() && in_sampler(&process.mapped, lookup_ip) {
                continue; // the allocation sampler's own frames
            }
            frames.push(NativeFrame {
                lookup_ip,
                place: place_of(&process.mapped, lookup_ip),
            });
        }
        frames
    }

    /// Drops what is cached for process `tgid` (it exited or exec'd); the
    /// files stay cached for other processes.
    pub fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// The modules of `tgid`, read again when `ip` is in none of them
    /// (for an address already unknown after the last read, at most once
    /// per [`MAPS_REFRESH`]).
    fn process(&mut self, tgid: u32, ip: u64) -> Option<&mut ProcessModules> {
        let stale = self.processes.get_mut(&tgid).is_none_or(|p| {
            if p.mapped.iter().any(|m| m.range.contains(&ip)) {
                return false;
            }
            p.unknown_ips.insert(ip) || p.read_at.elapsed() >= MAPS_REFRESH
        });
        if stale {
            let mut modules = self.read_process(tgid)?;
            if !modules.mapped.iter().any(|m| m.range.contains(&ip)) {
                // Kept over reads (bounded), so JIT code does not read the
                // maps again for every address already seen.
                let mut unknown = self
                    .processes
                    .remove(&tgid)
                    .map(|p| p.unknown_ips)
                    .unwrap_or_default();
                if unknown.len() >= MAX_UNKNOWN_IPS {
                    unknown.clear();
                }
                unknown.insert(ip);
                modules.unknown_ips = unknown;
            }
            self.processes.insert(tgid, modules);
        }
        self.processes.get_mut(&tgid)
    }

    /// Reads `tgid`'s executable file mappings and their unwind data.
    fn read_process(&mut self, tgid: u32) -> Option<ProcessModules> {
        let reader = crate::process::proc::reader_pid(tgid).ok()?;
        let maps = Process::new(i32::try_from(reader).ok()?)
            .ok()?
            .maps()
            .ok()?;
        let mut unwinder = UnwinderX86_64::new();
        let mut mapped = Vec::new();
        for map in maps {
            let MMapPath::Path(path) = &map.pathname else {
                continue;
            };
            if !map.perms.contains(procfs::process::MMPermissions::EXECUTE) {
                continue;
            }
            let (start, end) = map.address;
            let key = (
                u64::from(map.dev.0 as u32) << 32 | u64::from(map.dev.1 as u32),
                map.inode,
            );
            let file = self
                .files
                .entry(key)
                .or_insert_with(|| {
                    let through = format!("/proc/{reader}/map_files/{start:x}-{end:x}");
                    read_module_file(std::path::Path::new(&through))
                        .or_else(|| read_module_file(path))
                        .map(Arc::new)
                })
                .clone();
            let Some(file) = file else {
                continue;
            };
            let Some(bias) = load_bias(&file.segments, start, map.offset) else {
                continue;
            };
            let name = path.display().to_string();
            let sections = file.sections.clone();
            unwinder.add_module(Module::new(name, start..end, bias, sections));
            let file_name = path.file_name().map(|n| n.to_string_lossy());
            mapped.push(Mapped {
                range: start..end,
                bias,
                eval_loop: file.eval_loop.clone(),
                c_runtime: file_name.as_ref().is_some_and(|n| super::is_c_runtime(n)),
                sampler: file_name.is_some_and(|n| n == memtrace_common::SAMPLER_FILE_NAME),
            });
        }
        Some(ProcessModules {
            unwinder,
            cache: CacheX86_64::new(),
            mapped,
            read_at: Instant::now(),
            unknown_ips: std::collections::HashSet::new(),
        })
    }
}

/// Whether `ip` is in the allocation sampler's library.
fn in_sampler(mapped: &[Mapped], ip: u64) -> bool {
    mapped.iter().any(|m| m.sampler && m.range.contains(&ip))
}

/// Where `ip` is among the modules `mapped`.
fn place_of(mapped: &[Mapped], ip: u64) -> Place {
    let Some(module) = mapped.iter().find(|m| m.range.contains(&ip)) else {
        return Place::Native;
    };
    match &module.eval_loop {
        None if module.c_runtime => Place::CRuntime,
        None => Place::Native,
        Some(eval) if eval.contains(&ip.wrapping_sub(module.bias)) => Place::EvalLoop,
        Some(_) => Place::Interpreter,
    }
}

/// The actual address of the file's address 0, for an executable mapping
/// at `start` of the file from `file_offset` (page-aligned, as the loader
/// maps it): from the executable `PT_LOAD` segment whose pages hold that
/// offset.
fn load_bias(segments: &[Segment], start: u64, file_offset: u64) -> Option<u64> {
    let segment = segments.iter().find(|s| {
        let first_page = s.offset & !(PAGE - 1);
        s.executable && (first_page..s.offset + s.size.max(1)).contains(&file_offset)
    })?;
    let vaddr_page = segment.vaddr & !(PAGE - 1);
    let offset_page = segment.offset & !(PAGE - 1);
    Some(start.wrapping_sub(vaddr_page + (file_offset - offset_page)))
}

/// The unwind sections, load segments and eval-loop symbol of the ELF file
/// at `path`; `None` when it cannot be read or parsed.
fn read_module_file(path: &std::path::Path) -> Option<ModuleFile> {
    let file = MappedFile::open(path)?;
    let elf = object::File::parse(file.bytes()).ok()?;
    let section = |name: &str| {
        let section = elf.section_by_name(name)?;
        let range = section.address()..section.address() + section.size();
        Some((range, section.data().ok().map(Bytes::copy_from_slice)))
    };
    let (text_svma, text) = section(".text").unzip();
    let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
    let got_svma = section(".got").map(|(range, _)| range);
    let sections = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma,
        text: text.flatten(),
        got_svma,
        eh_frame_svma,
        eh_frame: eh_frame.flatten(),
        eh_frame_hdr_svma,
        eh_frame_hdr: eh_frame_hdr.flatten(),
        ..ExplicitModuleSectionInfo::default()
    };
    let segments = elf
        .segments()
        .map(|s| Segment {
            vaddr: s.address(),
            offset: s.file_range().0,
            size: s.file_range().1,
            executable: matches!(
                s.flags(),
                object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
            ),
        })
        .collect();
    Some(ModuleFile {
        sections,
        segments,
        eval_loop: eval_loop(&elf),
    })
}

/// `_PyEval_EvalFrameDefault`'s address range in `elf` (`.symtab`, else
/// `.dynsym`).
fn eval_loop(elf: &object::File) -> Option<Range<u64>> {
    elf.symbols()
        .chain(elf.dynamic_symbols())
        .find(|s| s.name() == Ok(EVAL_LOOP) && s.address() != 0)
        .map(|s| s.address()..s.address() + s.size().max(1))
}

/// A whole file mapped read-only while its ELF headers, unwind sections and
/// symbols are read (only the pages touched are read from disk: a libpython
/// with its symbols is tens of MB); unmapped on drop. The file is a binary
/// a traced process maps: it is not expected to shrink meanwhile.
struct MappedFile {
    start: std::ptr::NonNull<std::ffi::c_void>,
    len: std::num::NonZeroUsize,
}

impl MappedFile {
    /// Maps the file at `path`; `None` when it cannot be opened, is empty
    /// or cannot be mapped.
    fn open(path: &std::path::Path) -> Option<Self> {
        let file = std::fs::File::open(path).ok()?;
        let len = std::num::NonZeroUsize::new(usize::try_from(file.metadata().ok()?.len()).ok()?)?;
        // SAFETY: a new private read-only mapping of a whole file; nothing
        // else refers to its memory.
        let start = unsafe {
            nix::sys::mman::mmap(
                None,
                len,
                nix::sys::mman::ProtFlags::PROT_READ,
                nix::sys::mman::MapFlags::MAP_PRIVATE,
                &file,
                0,
            )
        }
        .ok()?;
        Some(Self { start, len })
    }

    /// The file's bytes.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes are mapped at `start` until drop.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr().cast::<u8>(), self.len.get()) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, no longer borrowed.
        let _ = unsafe { nix::sys::mman::munmap(self.start, self.len.get()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_the_copied_bytes() {
        let stack: Vec<u8> = (0u8..32).collect();
        let copy = StackCopy {
            ip: 0,
            sp: 0x1008,
            bp: 0,
            stack_start: 0x1000,
            stack: &stack,
            ip_is_return: true,
        };
        assert_eq!(
            copy.read_u64(0x1008),
            Ok(u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]))
        );
        assert_eq!(
            copy.read_u64(0x1018),
            Ok(u64::from_le_bytes([24, 25, 26, 27, 28, 29, 30, 31]))
        );
        assert_eq!(copy.read_u64(0x1019), Err(()));
        assert_eq!(copy.read_u64(0xff8), Err(()));
    }

    #[test]
    fn bias_comes_from_the_executable_segment_holding_the_offset() {
        let segment = |vaddr, offset, size, executable| Segment {
            vaddr,
            offset,
            size,
            executable,
        };
        // A shared library: text at file offset 0x28000, vaddr 0x28000.
        let library = [
            segment(0, 0, 0x27000, false),
            segment(0x28000, 0x28000, 0x1000, true),
        ];
        let base = 0x7f00_0000_0000;
        assert_eq!(load_bias(&library, base + 0x28000, 0x28000), Some(base));
        assert_eq!(load_bias(&library, base, 0x99000), None);
        // An executable linked by lld: text at offset 0x50e190, vaddr
        // 0x50f190, sharing its first page with the read-only segment.
        let executable = [
            segment(0, 0, 0x50e188, false),
            segment(0x50f190, 0x50e190, 0xe6a380, true),
        ];
        let start = 0x5573_2e46_d000;
        assert_eq!(
            load_bias(&executable, start, 0x50e000),
            Some(start - 0x50f000)
        );
    }

    /// A function of this test binary with a frame of its own, called
    /// through another, whose stack is copied the way the kernel side does.
    #[inline(never)]
    fn copy_own_stack(depth: u32) -> (u64, u64, u64, Vec<u8>) {
        if depth > 0 {
            let copy = copy_own_stack(std::hint::black_box(depth - 1));
            return std::hint::black_box(copy);
        }
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers and the address of the next
        // instruction; writes nothing.
        unsafe {
            std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp);
        }
        let start = sp & !1023;
        // SAFETY: the 8 KiB above the stack pointer are this thread's
        // stack (callers' frames), mapped and readable.
        let stack = unsafe { std::slice::from_raw_parts(start as *const u8, 8192) }.to_vec();
        (ip, sp, bp, stack)
    }

    #[test]
    fn unwinds_a_copied_stack_of_this_process_through_its_callers() {
        let (ip, sp, bp, stack) = copy_own_stack(3);
        let copy = StackCopy {
            ip,
            sp,
            bp,
            stack_start: sp & !1023,
            stack: &stack,
            ip_is_return: false,
        };
        let mut unwinder = NativeUnwinder::default();
        let frames = unwinder.unwind(std::process::id(), &copy);
        let mut symbolizer = super::super::NativeSymbolizer::new();
        let names: Vec<String> = frames
            .iter()
            .filter_map(|f| symbolizer.symbolize(std::process::id(), f.lookup_ip))
            .map(|n| n.symbol)
            .collect();
        let recursions = names
            .iter()
            .filter(|n| n.contains("copy_own_stack"))
            .count();
        assert!(recursions >= 4, "{names:?}");
        assert!(
            names.iter().any(|n| n.contains("unwinds_a_copied_stack")),
            "{names:?}"
        );
        // This test binary and its libraries: no interpreter here.
        assert!(frames
            .iter()
            .all(|f| matches!(f.place, Place::Native | Place::CRuntime)));
        unwinder.forget(std::process::id());
        assert!(unwinder.processes.is_empty());
    }
}
