//! Allocator mode in a session (`--allocations`): each traced process gets
//! its allocator probes once its binaries are known (CPython probing found
//! its interpreter or found none; a fork's child at once), the gap from its
//! start to its probes is kept, and sampled allocation and free records go
//! to the `allocations` aggregation; at the end, its files are written
//! beside the report's.

use std::io::{self, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use memtrace_common::{
    AllocRecord, ForkRecord, FreeRecord, ProcessCounters, ALLOC_PYTHON_API, ALLOC_SAMPLER,
    ALLOC_UNTRACKED, MM_ANONPAGES,
};

use super::sampler::Sampler;
use super::session::{monotonic_ns, Session};
use crate::aggregate::RunMeta;
use crate::allocations::{AllocationsReport, KernelAllocStats, SampledBlock};
use crate::cli::{AllocWeightArg, CommonArgs, ReportArgs};
use crate::diagnose::Diagnosed;
use crate::output_file;
use crate::report::allocations::{
    render_flamegraph, render_folded, render_pprof, render_speedscope, AllocWeight, ProfileRun,
};
use crate::report::Format;
use crate::stacks::RecordStack;

/// Least time between two allocations lines of a capture (the end writes
/// one whatever the time).
const ALLOCATIONS_CAPTURE_INTERVAL: Duration = Duration::from_secs(30);

/// The CPython whose allocator API a process's hooks go on.
#[derive(Clone, Debug)]
pub(super) struct HookedPython {
    /// The mapped file that defines the API (libpython or the executable).
    pub(super) binary: PathBuf,
    /// A free-threaded build (3.13t): its `PyObject_*` and `PyMem_*`
    /// allocate from mimalloc, never from pymalloc's pools.
    pub(super) free_threaded: bool,
}

impl Session {
    /// A traced process (image) entered the trace at monotonic `ts_ns`, its
    /// start time read from /proc (in clock ticks).
    pub(super) fn alloc_started(&mut self, tgid: u32, ts_ns: u64) {
        let start_time_ns = crate::process::proc::start_time_ns(tgid).unwrap_or(0);
        self.alloc_image_started(tgid, start_time_ns, ts_ns);
    }

    /// A traced process's image that starts at monotonic `ts_ns` with the
    /// process's `start_time_ns` (boot-time ns).
    fn alloc_image_started(&mut self, tgid: u32, start_time_ns: u64, ts_ns: u64) {
        if let Some(tracker) = &mut self.allocations {
            tracker.process_started(tgid, start_time_ns, ts_ns);
        }
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
        let python = self.alloc_python_binary.get(&fork.header.tgid).cloned();
        self.hook_allocator(child, python);
    }

    /// A traced process exec'd: the old image's probes are gone with its
    /// address space; the new image is hooked once probed. `counters` are
    /// the old image's last: its anonymous RSS at the end (a periodic read
    /// after the exec, before this record, read the new image's).
    pub(super) fn alloc_exec(&mut self, tgid: u32, ts_ns: u64, counters: &ProcessCounters) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        tracker.rss_anon(tgid, counters.rss_bytes[MM_ANONPAGES]);
        // The process is the same (tgid, start time) after its exec: the
        // new image keeps the start time its fork record gave (exact, where
        // /proc rounds to clock ticks).
        let start_time_ns = tracker.start_time_of(tgid);
        self.alloc_exited(tgid);
        match start_time_ns {
            Some(start_time_ns) => self.alloc_image_started(tgid, start_time_ns, ts_ns),
            None => self.alloc_started(tgid, ts_ns),
        }
    }

    /// A traced process is gone (its exit record, or it was found missing
    /// when its exit record was lost): its probes are detached and all its
    /// blocks leave the kernel's live set.
    pub(super) fn alloc_exited(&mut self, tgid: u32) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        tracker.process_ended(tgid);
        self.alloc_python_binary.remove(&tgid);
        self.tracer.detach_allocator(tgid);
    }

    /// Attaches the allocator probes of `tgid` (CPython's in `python`'s
    /// binary, libc's in the libc it maps), once; a process that cannot be
    /// hooked keeps the default mode, with the reason printed.
    pub(super) fn hook_allocator(&mut self, tgid: u32, python: Option<HookedPython>) {
        let Some(tracker) = &mut self.allocations else {
            return;
        };
        let Some(start_time_ns) = tracker.pending_start(tgid) else {
            return;
        };
        let libc = mapped_libc(tgid);
        let python_binary = python.as_ref().map(|p| p.binary.as_path());
        let sampler = match &mut self.alloc_sampler {
            Some(Sampler::Preloaded(files)) => Some(files.library().to_owned()),
            Some(Sampler::Remote(remote)) => match remote.prepare(tgid) {
                Ok(library) => Some(library),
                Err(err) => {
                    let reason = format!("{err:#}");
                    report_not_hooked(tgid, &reason);
                    tracker.not_hooked(tgid, reason);
                    return;
                }
            },
            None => None,
        };
        if sampler.is_none() && python_binary.is_none() && libc.is_none() {
            let reason = "it maps no CPython allocator and no glibc libc.so".to_owned();
            report_not_hooked(tgid, &reason);
            tracker.not_hooked(tgid, reason);
            return;
        }
        match self.tracer.attach_allocator(
            tgid,
            start_time_ns,
            python_binary,
            libc.as_deref(),
            sampler.as_deref(),
        ) {
            Ok(binaries) => {
                if let Err(err) = self.install_remote_sampler(tgid) {
                    let reason = format!("{err:#}");
                    self.tracer.detach_allocator(tgid);
                    report_not_hooked(tgid, &reason);
                    if let Some(tracker) = &mut self.allocations {
                        tracker.not_hooked(tgid, reason);
                    }
                    return;
                }
                let Some(tracker) = &mut self.allocations else {
                    return;
                };
                let names = binaries.iter().map(|p| file_name(p)).collect();
                let free_threaded = python.as_ref().is_some_and(|p| p.free_threaded);
                let pymalloc = !free_threaded && uses_pymalloc(tgid);
                tracker.hooked(tgid, names, monotonic_ns(), pymalloc);
                if let Some(python) = python {
                    self.alloc_python_binary.insert(tgid, python);
                }
            }
            Err(err) => {
                let reason = format!("{:#}", anyhow::Error::from(err));
                report_not_hooked(tgid, &reason);
                tracker.not_hooked(tgid, reason);
            }
        }
    }

    /// `record --pid`: installs the sampler in `tgid`, whose probes on its
    /// markers are attached (nothing to do for `run`, or for a child that
    /// inherited it).
    fn install_remote_sampler(&mut self, tgid: u32) -> anyhow::Result<()> {
        match &mut self.alloc_sampler {
            Some(Sampler::Remote(remote)) => remote.install(tgid),
            _ => Ok(()),
        }
    }

    /// The end of a session with the sampler: sampling stops in every
    /// hooked process still running (its wrappers only forward from now).
    pub(super) fn stop_samplers(&self) {
        let Some(sampler) = &self.alloc_sampler else {
            return;
        };
        for tgid in self.tracer.hooked_allocators() {
            if let Err(err) = sampler.stop_sampling(tgid) {
                eprintln!("memtrace: process {tgid}: cannot stop its sampler: {err:#}");
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
        // The sampler's marker is entered, not returned to: its own frames
        // are dropped by the unwinder.
        let ip_is_return = record.flags & ALLOC_SAMPLER == 0;
        let copy = self.stacks.take_native_stack(&record.header);
        let own = RecordStack {
            tgid,
            stack_status: record.stack_status,
            frames: &record.frames[..count],
            native_ip: record.native_ip,
            ip_is_return,
        };
        let python = self.tree.get(tgid).map(|p| &p.python);
        let stack = self.stacks.assemble(&own, copy.as_deref(), python);
        let stack = stack.iter().map(ToString::to_string).collect();
        if let Some(tracker) = &mut self.allocations {
            let block = SampledBlock {
                ts_ns: record.header.ts_ns,
                tid: record.header.tid,
                addr: record.addr,
                size_bytes: record.size_bytes,
                untracked: record.flags & ALLOC_UNTRACKED != 0,
                python_api: record.flags & ALLOC_PYTHON_API != 0,
            };
            tracker.alloc(tgid, block, stack);
        }
    }

    /// A sampled block was freed.
    pub(super) fn on_free(&mut self, record: &FreeRecord) {
        if let Some(tracker) = &mut self.allocations {
            tracker.free(record.header.tgid, record.header.ts_ns, record.addr);
        }
    }

    /// `--allocations --capture`: writes the allocations report to the
    /// capture when it changed since it was last written, at most every
    /// [`ALLOCATIONS_CAPTURE_INTERVAL`] (each line is the whole report: one
    /// a second made most of a long capture); the end writes the last one.
    pub(super) fn capture_allocations(&mut self) {
        if !self.recorder.capturing() {
            return;
        }
        if self
            .alloc_captured
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < ALLOCATIONS_CAPTURE_INTERVAL)
        {
            return;
        }
        let Some(report) = self.allocations_report(false) else {
            return;
        };
        if self.alloc_captured.as_ref().map(|(last, _)| last) != Some(&report) {
            self.recorder.allocations(&report);
            self.alloc_captured = Some((report, Instant::now()));
        }
    }

    /// The allocator-mode report, with the kernel's counters; `at_end`
    /// counts the kernel's live set too (one pass over its keys).
    pub(super) fn allocations_report(&self, at_end: bool) -> Option<AllocationsReport> {
        let tracker = self.allocations.as_ref()?;
        let stats = self.tracer.alloc_stats().unwrap_or_default();
        let live_set_blocks = at_end
            .then(|| self.tracer.alloc_live_blocks().ok())
            .flatten()
            .map(|blocks| blocks.values().sum());
        Some(tracker.report(KernelAllocStats {
            calls: stats.calls,
            live_full: stats.live_full,
            live_set_blocks,
        }))
    }
}

/// Writes allocator mode's files beside the folded stacks file `folded`,
/// weighed by `--alloc-weight`: `<stem>.allocations.folded` always, and
/// `<stem>.allocations.svg`, `.allocations.speedscope.json`,
/// `.allocations.pb.gz` for each of `--format flamegraph`, `speedscope`,
/// `pprof`. A file that cannot be written is a warning.
pub(super) fn write_allocation_files(
    allocations: &AllocationsReport,
    meta: &RunMeta,
    common: &CommonArgs,
    folded: &Path,
) -> Vec<std::path::PathBuf> {
    let weight = alloc_weight(common.alloc_weight);
    let run = ProfileRun {
        command: &meta.command,
        duration_ns: meta.duration_ns,
        inverted: common.render.inverted,
    };
    let mut written = Vec::new();
    let mut formats = vec![Format::Folded];
    for format in common.format.iter().map(|&arg| Format::from(arg)) {
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    for format in formats {
        let Some(render) = renderer(format) else {
            continue;
        };
        let extension = match format {
            Format::Folded => "folded",
            _ => crate::report::format_extension(format).unwrap_or("out"),
        };
        let path = folded.with_extension(format!("allocations.{extension}"));
        match write_file(&path, common.force, |out| {
            render(allocations, weight, &run, out)
        }) {
            Ok(()) => written.push(path),
            Err(err) => eprintln!(
                "memtrace: warning: {err:#}; the allocations file `{}` is not written",
                path.display()
            ),
        }
    }
    written
}

/// `memtrace report FILE --allocations`: what draws the allocation paths
/// of the capture's report `diagnosed` in `--format`, weighed by
/// `--alloc-weight`.
///
/// # Errors
/// `--per-process`, a format that does not weigh paths, or a capture
/// recorded without `--allocations`.
pub(super) fn report_renderer<'a>(
    diagnosed: &'a Diagnosed,
    args: &'a ReportArgs,
    format: Format,
) -> anyhow::Result<impl FnOnce(&mut dyn io::Write) -> anyhow::Result<()> + 'a> {
    if args.render.per_process {
        anyhow::bail!("--allocations draws one file: --per-process does not apply");
    }
    let Some(render) = renderer(format) else {
        anyhow::bail!(
            "--allocations draws folded, flamegraph, speedscope or pprof, not `{}` (the table \
             and the JSON carry the allocations without it)",
            crate::report::format_name(format)
        );
    };
    let Some(allocations) = &diagnosed.allocations else {
        anyhow::bail!(
            "`{}` holds no allocations: record it with `--allocations --capture`",
            args.capture.display()
        );
    };
    let weight = alloc_weight(args.alloc_weight);
    Ok(move |out: &mut dyn io::Write| {
        let run = ProfileRun {
            command: &diagnosed.meta.command,
            duration_ns: diagnosed.meta.duration_ns,
            inverted: args.render.inverted,
        };
        render(allocations, weight, &run, out).context("cannot write the allocations")
    })
}

/// The measure `--alloc-weight` names.
fn alloc_weight(arg: AllocWeightArg) -> AllocWeight {
    match arg {
        AllocWeightArg::Allocated => AllocWeight::Allocated,
        AllocWeightArg::Leaked => AllocWeight::Leaked,
        AllocWeightArg::Peak => AllocWeight::Peak,
    }
}

/// A renderer of allocator mode's report in one format.
type Render =
    fn(&AllocationsReport, AllocWeight, &ProfileRun<'_>, &mut dyn io::Write) -> io::Result<()>;

/// The renderer of allocator mode's report in `format`, for the formats
/// that weigh paths.
fn renderer(format: Format) -> Option<Render> {
    match format {
        Format::Folded => Some(|report, weight, _, out| render_folded(report, weight, out)),
        Format::Flamegraph => Some(render_flamegraph),
        Format::Speedscope => Some(render_speedscope),
        Format::Pprof => Some(render_pprof),
        Format::Table | Format::Json | Format::Html => None,
    }
}

/// Creates `path` (replacing a file only with `force`) and writes it with
/// `render`.
fn write_file(
    path: &Path,
    force: bool,
    render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> anyhow::Result<()> {
    let file = output_file::create(path, force)
        .with_context(|| format!("cannot create `{}`", path.display()))?;
    let mut out = BufWriter::new(file);
    render(&mut out).with_context(|| format!("cannot write `{}`", path.display()))?;
    out.flush()
        .with_context(|| format!("cannot write `{}`", path.display()))
}

/// Says why a process keeps the default mode only.
fn report_not_hooked(tgid: u32, reason: &str) {
    eprintln!(
        "memtrace: process {tgid}: its allocator cannot be hooked ({reason}); it keeps the \
         default mode (page faults, memory syscalls)"
    );
}

/// Whether `tgid`'s CPython allocator is pymalloc, from its environment at
/// start ([`pymalloc_in`]); pymalloc when it cannot be read.
fn uses_pymalloc(tgid: u32) -> bool {
    std::fs::read(format!("/proc/{tgid}/environ")).map_or(true, |environ| pymalloc_in(&environ))
}

/// Whether a process with `environ` (NUL-separated `NAME=value`) runs
/// pymalloc: unless `PYTHONMALLOC` names `malloc`, `malloc_debug` or
/// `mimalloc` (`debug` and `pymalloc_debug` keep pymalloc under the debug
/// hooks; `-X` options and later `os.environ` changes are not seen).
fn pymalloc_in(environ: &[u8]) -> bool {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"PYTHONMALLOC="))
        .is_none_or(|value| !(value.starts_with(b"malloc") || value.starts_with(b"mimalloc")))
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

#[cfg(test)]
mod tests {
    use super::pymalloc_in;

    #[test]
    fn pythonmalloc_names_the_allocator() {
        assert!(pymalloc_in(b"HOME=/root\0PATH=/bin\0"));
        assert!(pymalloc_in(b"PYTHONMALLOC=debug\0"));
        assert!(pymalloc_in(b"PYTHONMALLOC=pymalloc_debug"));
        assert!(!pymalloc_in(b"HOME=/root\0PYTHONMALLOC=malloc\0"));
        assert!(!pymalloc_in(b"PYTHONMALLOC=malloc_debug\0"));
        assert!(!pymalloc_in(b"PYTHONMALLOC=mimalloc\0"));
    }
}
