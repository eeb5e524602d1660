//! Diagnosis tests on synthetic runs: each pattern, no growth, thin evidence
//! and the look-alikes that must not be taken for a pattern (exit teardown,
//! a buffer freed and touched again, page cache, pages still shared with
//! the master, an image an execve replaced). The runs go through the real
//! [`Aggregator`] (forks with their inherited RSS, counter reads with PSS and
//! USS, the start of an exit, execve, path deltas with held bytes), so the
//! report shapes are the ones `memtrace` produces.

use std::collections::HashMap;

use memtrace_common::ProcessCounters;

use crate::aggregate::test_support::{native, py, rss, start, MIB};
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, MappingKind, ProcessId, ProcessStart, PythonStatus,
    Report, Role, RunMeta, SampledBytes, Sharing, StackId,
};
use crate::units::format_bytes;

use super::*;

/// A report fixture whose diagnosis has a retention finding, and that
/// finding: the case the allocator findings (census, fragmentation) replace.
pub(super) fn report_with_retention() -> (Report, Finding) {
    let report = [
        crate::report::fixtures::lifecycle_report(),
        crate::aggregate::test_support::server_report(),
        crate::aggregate::test_support::prefork_report(),
    ]
    .into_iter()
    .find(|r| {
        diagnose(r.clone())
            .diagnosis
            .iter()
            .any(|f| f.pattern == Pattern::Retention)
    })
    .expect("a fixture with a retention finding");
    let finding = diagnose(report.clone())
        .diagnosis
        .into_iter()
        .find(|f| f.pattern == Pattern::Retention)
        .unwrap();
    (report, finding)
}

/// One second, in nanoseconds.
const S: u64 = 1_000_000_000;

/// Bytes one sample stands for in these runs (memtrace's default).
const SAMPLE_BYTES: u64 = 512 * 1024;

/// What the probe finds in these runs' roots and exec'd images.
fn python_3_12() -> PythonStatus {
    PythonStatus::Python {
        version: "3.12.1".to_owned(),
    }
}

/// A stack ending in the Python function `function` of `app.py`.
fn stack(function: &str) -> Vec<Frame> {
    vec![
        py("<module>", "app.py", 1),
        py(function, "app.py", 20),
        native("malloc"),
    ]
}

/// A stack in which `function` made pages of the mapped `file` resident.
fn file_stack(function: &str, file: &str) -> Vec<Frame> {
    vec![
        py("<module>", "app.py", 1),
        py(function, "app.py", 30),
        native("memcpy"),
        Frame::Mapping {
            mapping: MappingKind::File,
            name: file.to_owned(),
        },
    ]
}

/// One counter read of a synthetic process, in MiB.
#[derive(Clone, Copy, Debug, Default)]
struct Read {
    /// RSS (anonymous + file-backed).
    rss_mib: u64,
    /// Its file-backed part.
    file_mib: u64,
    /// Cumulative page faults (address-space syscalls are 1/100 of it).
    activity: u64,
    /// PSS and USS read with it.
    sharing: Option<(u64, u64)>,
    /// Cumulative copy-on-write fault bytes, when they changed.
    cow_mib: Option<u64>,
    /// The kernel's high-water mark, when above the readings.
    peak_mib: Option<u64>,
}

/// A read of `rss_mib` MiB of anonymous RSS after `activity` events.
fn at(rss_mib: u64, activity: u64) -> Read {
    Read {
        rss_mib,
        activity,
        ..Read::default()
    }
}

impl Read {
    /// With PSS and USS read.
    fn pss(self, pss_mib: u64, uss_mib: u64) -> Self {
        Self {
            sharing: Some((pss_mib, uss_mib)),
            ..self
        }
    }

    /// With `file_mib` of the RSS file-backed.
    fn file(self, file_mib: u64) -> Self {
        Self { file_mib, ..self }
    }

    /// With `cow_mib` of copy-on-write faults so far.
    fn cow(self, cow_mib: u64) -> Self {
        Self {
            cow_mib: Some(cow_mib),
            ..self
        }
    }

    /// With the kernel's high-water mark at `peak_mib`.
    fn peak(self, peak_mib: u64) -> Self {
        Self {
            peak_mib: Some(peak_mib),
            ..self
        }
    }
}

/// What the synthetic kernel side keeps per image: its current anonymous
/// and file RSS and cumulative counters (growth and release sums follow
/// the reads, as `kmem:rss_stat` would).
#[derive(Debug)]
struct Image {
    open: bool,
    anon_bytes: u64,
    file_bytes: u64,
    counters: ProcessCounters,
}

/// A synthetic run fed to the aggregator. It also keeps the readings and
/// held changes it fed, to give each path the bytes it held at its image's
/// high-water mark at the end (what `crate::held` does live).
struct Run {
    agg: Aggregator,
    images: HashMap<ProcessId, Image>,
    readings: Vec<(ProcessId, u64, u64)>,
    held: Vec<(ProcessId, StackId, u64, i64)>,
}

impl Run {
    fn new() -> Self {
        Self {
            agg: Aggregator::new(0),
            images: HashMap::new(),
            readings: Vec::new(),
            held: Vec::new(),
        }
    }

    /// `p` enters the trace with the RSS of `read` (inherited at fork, or
    /// read at attach).
    fn started(&mut self, p: ProcessStart, read: Read) -> ProcessId {
        let (anon_bytes, file_bytes) = ((read.rss_mib - read.file_mib) * MIB, read.file_mib * MIB);
        let counters = rss(anon_bytes, file_bytes);
        let at_ns = p.ts_ns;
        let is_root = p.role == Role::Root;
        let id = self.agg.process_started(ProcessStart {
            counters,
            cmdline: format!("python3 app.py #{}", p.tgid),
            ..p
        });
        if is_root {
            // Probed at attach; forks inherit it (`ProcessKind`).
            self.agg.python_status(id, python_3_12());
        }
        self.images.insert(
            id,
            Image {
                open: true,
                anon_bytes,
                file_bytes,
                counters,
            },
        );
        self.readings.push((id, at_ns, read.rss_mib * MIB));
        id
    }

    /// A root process `tgid` traced from `at_ns`.
    fn root(&mut self, tgid: u32, at_ns: u64, rss_mib: u64) -> ProcessId {
        self.started(start(tgid, None, Role::Root, at_ns), at(rss_mib, 0))
    }

    /// Worker `tgid` forked by `parent` at `at_ns`, inheriting `rss_mib`.
    fn fork(&mut self, tgid: u32, parent: ProcessId, at_ns: u64, rss_mib: u64) -> ProcessId {
        self.started(
            start(tgid, Some(parent), Role::Worker, at_ns),
            at(rss_mib, 0),
        )
    }

    /// The counters of image `id` after `read`.
    fn counters(&mut self, id: ProcessId, read: Read) -> ProcessCounters {
        let image = self.images.get_mut(&id).expect("a started image");
        let (anon, file) = ((read.rss_mib - read.file_mib) * MIB, read.file_mib * MIB);
        let c = &mut image.counters;
        c.anon_growth_bytes += anon.saturating_sub(image.anon_bytes);
        c.anon_release_bytes += image.anon_bytes.saturating_sub(anon);
        c.file_growth_bytes += file.saturating_sub(image.file_bytes);
        c.file_release_bytes += image.file_bytes.saturating_sub(file);
        (image.anon_bytes, image.file_bytes) = (anon, file);
        let resident = rss(anon, file);
        c.rss_bytes = resident.rss_bytes;
        c.rss_known = resident.rss_known;
        c.page_faults = read.activity;
        c.syscalls = read.activity / 100;
        if let Some(cow_mib) = read.cow_mib {
            c.cow_fault_bytes = cow_mib * MIB;
        }
        c.rss_peak_bytes = c
            .rss_peak_bytes
            .max(read.peak_mib.map_or(0, |mib| mib * MIB));
        *c
    }

    /// A counter read of `id` at `at_ns`.
    fn read(&mut self, id: ProcessId, at_ns: u64, read: Read) {
        let counters = self.counters(id, read);
        let sharing = read.sharing.map(|(pss, uss)| Sharing {
            pss_bytes: pss * MIB,
            uss_bytes: uss * MIB,
        });
        if self.images[&id].open {
            self.readings.push((id, at_ns, read.rss_mib * MIB));
        }
        self.agg.counters(id, at_ns, &counters, sharing);
    }

    /// `reads` of `id`, one every half second from `from_ns`.
    fn reads(&mut self, id: ProcessId, from_ns: u64, reads: &[Read]) {
        for (i, &read) in reads.iter().enumerate() {
            self.read(id, from_ns + i as u64 * S / 2, read);
        }
    }

    /// Anonymous RSS readings of `id`, one every half second from
    /// `from_ns`: `(RSS MiB, cumulative activity events)`.
    fn readings(&mut self, id: ProcessId, from_ns: u64, points: &[(u64, u64)]) {
        let reads: Vec<Read> = points
            .iter()
            .map(|&(mib, events)| at(mib, events))
            .collect();
        self.reads(id, from_ns, &reads);
    }

    /// `read` every half second over `[from_ns, to_ns]`.
    fn flat(&mut self, id: ProcessId, from_ns: u64, to_ns: u64, read: Read) {
        let n = (to_ns - from_ns) / (S / 2) + 1;
        self.reads(id, from_ns, &vec![read; n as usize]);
    }

    /// Sampled `bytes` with `frames` in `id` at `at_ns`.
    fn sample(&mut self, id: ProcessId, at_ns: u64, frames: Vec<Frame>, bytes: SampledBytes) {
        let stack = self.agg.intern(frames);
        if self.images[&id].open && bytes.held_bytes != 0 {
            self.held.push((id, stack, at_ns, bytes.held_bytes));
        }
        self.agg.path_delta(id, at_ns, stack, bytes);
    }

    /// `mib` MiB of anonymous growth in `function`, still held.
    fn grow(&mut self, id: ProcessId, function: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            growth_bytes: mib * MIB,
            held_bytes: i64::try_from(mib * MIB).unwrap(),
            samples: mib * MIB / SAMPLE_BYTES,
            ..SampledBytes::default()
        };
        self.sample(id, at_ns, stack(function), bytes);
    }

    /// `mib` MiB that `function` grew given back (no longer held).
    fn free(&mut self, id: ProcessId, function: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            unmapped_bytes: mib * MIB,
            held_bytes: -i64::try_from(mib * MIB).unwrap(),
            ..SampledBytes::default()
        };
        self.sample(id, at_ns, stack(function), bytes);
    }

    /// `mib` MiB of copy-on-write un-sharing in `function`.
    fn cow(&mut self, id: ProcessId, function: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            cow_bytes: mib * MIB,
            samples: mib * MIB / SAMPLE_BYTES,
            ..SampledBytes::default()
        };
        self.sample(id, at_ns, stack(function), bytes);
    }

    /// `mib` MiB of pages of `file` made resident by `function`, held.
    fn file_grow(&mut self, id: ProcessId, function: &str, file: &str, at_ns: u64, mib: u64) {
        let bytes = SampledBytes {
            file_growth_bytes: mib * MIB,
            held_bytes: i64::try_from(mib * MIB).unwrap(),
            samples: mib * MIB / SAMPLE_BYTES,
            ..SampledBytes::default()
        };
        self.sample(id, at_ns, file_stack(function, file), bytes);
    }

    /// `id`'s interpreter begins to finalize at `at_ns`, after `read`.
    fn exit_begins(&mut self, id: ProcessId, at_ns: u64, read: Read) {
        let counters = self.counters(id, read);
        self.readings.push((id, at_ns, read.rss_mib * MIB));
        self.images.get_mut(&id).unwrap().open = false;
        self.agg
            .exit_began(id, at_ns, ExitBegin::PythonFinalize, &counters);
    }

    /// `id` is gone at `at_ns` with status 0, its counters then `read`.
    fn exited(&mut self, id: ProcessId, at_ns: u64, read: Read) {
        let counters = self.counters(id, read);
        self.images.get_mut(&id).unwrap().open = false;
        let status = Some(ExitStatus::Code { code: 0 });
        self.agg.process_exited(id, at_ns, status, Some(&counters));
    }

    /// `id` exec's `cmdline` at `at_ns`; returns the new image.
    fn exec(&mut self, id: ProcessId, at_ns: u64, cmdline: &str) -> ProcessId {
        let counters = self.images[&id].counters;
        self.images.get_mut(&id).unwrap().open = false;
        let next = self
            .agg
            .process_exec(id, at_ns, &counters, cmdline.to_owned());
        self.agg.python_status(next, python_3_12());
        self.images.insert(
            next,
            Image {
                open: true,
                anon_bytes: 0,
                file_bytes: 0,
                counters: rss(0, 0),
            },
        );
        self.readings.push((next, at_ns, 0));
        next
    }

    /// Ends the run; each path gets the bytes it held when its image's RSS
    /// was at its highest reading (the first of equals).
    fn finish(mut self, duration_ns: u64) -> Report {
        let mut peak_at: HashMap<ProcessId, (u64, u64)> = HashMap::new();
        for &(id, t_ns, bytes) in &self.readings {
            let best = peak_at.entry(id).or_insert((t_ns, bytes));
            if bytes > best.1 {
                *best = (t_ns, bytes);
            }
        }
        let mut held_at_peak: HashMap<(ProcessId, StackId), i64> = HashMap::new();
        for &(id, stack, t_ns, delta) in &self.held {
            let sum = held_at_peak.entry((id, stack)).or_default();
            if peak_at
                .get(&id)
                .is_some_and(|&(peak_ns, _)| t_ns <= peak_ns)
            {
                *sum += delta;
            }
        }
        for ((id, stack), bytes) in held_at_peak {
            let bytes = u64::try_from(bytes.max(0)).unwrap();
            self.agg.peak_held(id, stack, bytes);
        }
        self.agg.finish(
            duration_ns,
            RunMeta {
                command: "python3 app.py".to_owned(),
                duration_ns,
                sample_interval_bytes: SAMPLE_BYTES,
                ..RunMeta::default()
            },
        )
    }
}

/// Whether the path `stack` of `report` runs through `function`.
fn runs_through(report: &Report, stack: StackId, function: &str) -> bool {
    report
        .frames(stack)
        .iter()
        .any(|f| matches!(f, Frame::Python { function: name, .. } if name == function))
}

/// The findings of `pattern` in `findings`.
fn of(findings: &[Finding], pattern: Pattern) -> Vec<&Finding> {
    findings.iter().filter(|f| f.pattern == pattern).collect()
}

/// Everything a finding says, for negative checks.
fn all_text(finding: &Finding) -> String {
    let mut text = finding.summary.clone();
    for line in &finding.evidence {
        text.push('\n');
        text.push_str(line);
    }
    text.push('\n');
    text.push_str(&finding.next_step);
    text
}

/// The scope of image `id` of `report`.
fn scope(report: &Report, id: ProcessId) -> Scope {
    Scope::Process {
        process: id,
        tgid: report.tgid(id),
    }
}

mod processes;
mod retention;
mod transient;
mod verdicts;
mod whole_run;
mod workers;
