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

/// A master (100) and three workers forked at 0.3 s; worker 102 leaks
/// `leak_mib` MiB in `leak_in_worker` between 0.5 s and 2.5 s, then holds it
/// until 6 s, and touches a 20 MiB scratch buffer in `scratch` ten times
/// (200 MiB grown, nothing held); the others stay flat. Returns the report
/// and 102's image.
fn one_leaking_worker(leak_mib: u64) -> (Report, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 6 * S, at(14, 4_000));
    let workers: Vec<ProcessId> = [101, 102, 103]
        .into_iter()
        .map(|tgid| run.fork(tgid, master, 3 * S / 10, 12))
        .collect();
    for &id in [workers[0], workers[2]].iter() {
        run.flat(id, S / 2, 6 * S, at(12, 300));
    }
    let leaker = workers[1];
    let step = leak_mib / 4;
    let mut points = vec![(12, 300)];
    points.extend((1..=4).map(|i| (12 + i * step, 300 + i * step * 256)));
    run.readings(leaker, S / 2, &points);
    run.flat(
        leaker,
        3 * S,
        6 * S,
        at(12 + 4 * step, 300 + 4 * step * 256),
    );
    for i in 0..4 {
        run.grow(leaker, "leak_in_worker", S / 2 + i * S / 2, step);
    }
    for i in 0..10 {
        run.grow(leaker, "scratch", S / 2 + i * S / 5, 20);
        run.free(leaker, "scratch", S / 2 + i * S / 5 + S / 10, 20);
    }
    run.grow(workers[0], "handle", S, 1);
    (run.finish(6 * S), leaker)
}

#[test]
fn one_growing_worker_is_named_with_its_path_and_held_bytes() {
    let (report, leaker) = one_leaking_worker(128);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::OneProcessGrows, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, leaker));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "leak_in_worker"));
    assert!(
        first
            .summary
            .starts_with("worker tgid 102 grew +128.0 MiB while its 2 sibling(s) stayed flat"),
        "{}",
        first.summary
    );
    assert!(
        first
            .summary
            .ends_with("mostly in leak_in_worker (128.0 MiB held at the end)"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("holds 128.0 MiB at the end, held 128.0 MiB at the high-water")),
        "{:#?}",
        first.evidence
    );
    // Its held bytes rose in every bucket: a cache without a bound.
    assert!(
        first.next_step.contains("bound that cache"),
        "{}",
        first.next_step
    );
    assert_eq!(of(&findings, Pattern::OneProcessGrows).len(), 1);
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn thin_growth_is_weak_and_says_so_once() {
    let (report, _) = one_leaking_worker(12);
    let findings = findings(&report);
    let grower = of(&findings, Pattern::OneProcessGrows);
    assert_eq!(grower.len(), 1, "{findings:#?}");
    assert_eq!(grower[0].strength, Strength::Weak);
    assert!(
        !grower[0].summary.contains("weak evidence"),
        "{}",
        grower[0].summary
    );
    let last = grower[0].evidence.last().unwrap();
    assert!(last.starts_with("weak evidence: "), "{last}");
    assert!(last.contains("< 32.0 MiB"), "{last}");
    let weak_lines = grower[0]
        .evidence
        .iter()
        .filter(|e| e.contains("weak evidence"))
        .count();
    assert_eq!(weak_lines, 1, "{:#?}", grower[0].evidence);
}

#[test]
fn a_short_trace_is_weak() {
    let mut run = Run::new();
    let id = run.root(1, 0, 10);
    run.readings(
        id,
        0,
        &[(10, 0), (110, 25_600), (210, 51_200), (10, 52_000)],
    );
    run.grow(id, "build_payload", S / 2, 200);
    run.free(id, "build_payload", 3 * S / 2, 200);
    let report = run.finish(2 * S);
    let findings = findings(&report);
    assert!(
        findings.iter().all(|f| f.strength == Strength::Weak),
        "{findings:#?}"
    );
    let last = findings[0].evidence.last().unwrap();
    assert!(last.contains("the trace lasted 2.0 s"), "{last}");
}

#[test]
fn equal_growth_in_every_sibling_is_not_one_process_growing() {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 6 * S, at(14, 4_000));
    for tgid in [101, 102, 103] {
        let id = run.fork(tgid, master, 3 * S / 10, 12);
        run.readings(id, S / 2, &[(12, 300), (30, 5_000), (52, 10_000)]);
        run.flat(id, 2 * S, 6 * S, at(52, 10_000));
        run.grow(id, "warm_up", S, 40);
    }
    let findings = findings(&run.finish(6 * S));
    assert!(
        of(&findings, Pattern::OneProcessGrows).is_empty(),
        "{findings:#?}"
    );
}

/// A master (100) whose worker tgid 101 is used twice by the kernel: the
/// first process exits at 2 s flat, the second (forked at 2.5 s) grows
/// 100 MiB in `leak_in_worker`; workers 102 and 103 stay flat. Returns the
/// report and the two instances.
fn reused_tgid() -> (Report, ProcessId, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 8 * S, at(14, 4_000));
    let first = run.fork(101, master, S / 5, 12);
    run.flat(first, S / 2, 2 * S, at(12, 300));
    run.exit_begins(first, 2 * S, at(12, 300));
    run.exited(first, 2 * S + S / 10, at(1, 300));
    for tgid in [102, 103] {
        let id = run.fork(tgid, master, S / 5, 12);
        run.flat(id, S / 2, 8 * S, at(12, 300));
    }
    let second = run.started(
        ProcessStart {
            start_time_ns: 900_000_000_000,
            ..start(101, Some(master), Role::Worker, 5 * S / 2)
        },
        at(12, 0),
    );
    let up: Vec<(u64, u64)> = (0..=4).map(|i| (12 + 25 * i, 300 + 8_000 * i)).collect();
    run.readings(second, 3 * S, &up);
    run.flat(second, 5 * S + S / 2, 8 * S, at(112, 32_300));
    for i in 0..4 {
        run.grow(second, "leak_in_worker", 3 * S + i * S / 2, 25);
    }
    (run.finish(8 * S), first, second)
}

#[test]
fn a_reused_tgid_is_two_processes_named_apart() {
    let (report, first, second) = reused_tgid();
    assert_eq!(report.name(first), "tgid 101");
    assert_eq!(report.name(second), "tgid 101#2");
    let findings = findings(&report);
    let grower = of(&findings, Pattern::OneProcessGrows);
    assert_eq!(grower.len(), 1, "{findings:#?}");
    assert_eq!(grower[0].scope, scope(&report, second));
    assert!(
        grower[0]
            .summary
            .starts_with("worker tgid 101#2 grew +100.0 MiB while its 3 sibling(s) stayed flat"),
        "{}",
        grower[0].summary
    );
    // The first process on the same tgid is one of its siblings.
    let siblings = grower[0]
        .evidence
        .iter()
        .find(|e| e.starts_with("siblings: "))
        .unwrap();
    assert!(siblings.contains("tgid 101 +0 B"), "{siblings}");
    assert!(siblings.contains("tgid 102 +0 B"), "{siblings}");
    assert!(!siblings.contains("#2"), "{siblings}");
}

/// A master (100) with workers 101..=103 forked at 0.2 s; worker 102 loads
/// 60 MiB in `load_model` until 2 s, holds it idle until 4 s, then exec's
/// `sleep` (image 1, flat at 1 MiB until 8 s). Returns the report and 102's
/// two images.
fn worker_that_execs() -> (Report, ProcessId, ProcessId) {
    let mut run = Run::new();
    let master = run.root(100, 0, 14);
    run.flat(master, 0, 8 * S, at(14, 4_000));
    let mut images = Vec::new();
    for tgid in [101, 102, 103] {
        let id = run.fork(tgid, master, S / 5, 12);
        if tgid != 102 {
            run.flat(id, S / 2, 8 * S, at(12, 300));
            continue;
        }
        let up: Vec<(u64, u64)> = (0..=4).map(|i| (12 + 15 * i, 300 + 8_000 * i)).collect();
        run.readings(id, S / 2, &up);
        run.flat(id, 3 * S, 4 * S, at(72, 32_300));
        for i in 0..4 {
            run.grow(id, "load_model", S / 2 + i * S / 2, 15);
        }
        let sleep = run.exec(id, 4 * S, "sleep 100");
        run.flat(sleep, 4 * S + S / 2, 8 * S, at(1, 10));
        images = vec![id, sleep];
    }
    (run.finish(8 * S), images[0], images[1])
}

#[test]
fn an_exec_keeps_the_phase_before_it_and_is_not_a_sibling() {
    let (report, python, sleep) = worker_that_execs();
    assert_eq!(report.name(python), "tgid 102, image 0");
    assert_eq!(report.name(sleep), "tgid 102, image 1");
    let findings = findings(&report);
    // The image before the exec is compared with nothing (its siblings are
    // the last images), so it is not "one process grows"...
    assert!(
        of(&findings, Pattern::OneProcessGrows).is_empty(),
        "{findings:#?}"
    );
    // ... but its growth is diagnosed, on its own, named as that image.
    let about_python: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.scope == scope(&report, python))
        .collect();
    assert_eq!(about_python.len(), 1, "{findings:#?}");
    let finding = about_python[0];
    assert_eq!(finding.pattern, Pattern::Retention, "{finding:#?}");
    assert!(
        finding
            .summary
            .starts_with("tgid 102, image 0 retains +60.0 MiB"),
        "{}",
        finding.summary
    );
    assert!(runs_through(&report, finding.paths[0], "load_model"));
    // The exec is not a release.
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
    assert!(findings.iter().all(|f| f.scope != scope(&report, sleep)));
}

/// Master 200 and workers 201..=203 traced from attach (no fork seen); each
/// worker loads a model of about 85 MiB in its first second, then holds it.
fn large_workers() -> Report {
    let mut run = Run::new();
    let master = run.root(200, 0, 30);
    run.flat(master, 0, 6 * S, at(30, 1_000));
    for (tgid, extra) in [(201, 0), (202, 4), (203, 8)] {
        let id = run.started(start(tgid, Some(master), Role::Worker, 0), at(15, 0));
        let size = 95 + extra;
        run.readings(id, 0, &[(15, 0), (55, 10_000), (size, 20_000)]);
        run.flat(id, S + S / 2, 6 * S, at(size, 20_000));
        run.grow(id, "load_model", S / 2, size - 15);
    }
    run.finish(6 * S)
}

#[test]
fn every_worker_large_gives_sizes_spread_and_what_they_are_measured_in() {
    let report = large_workers();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::EveryWorkerLarge, "{findings:#?}");
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong)
    );
    assert!(
        first
            .summary
            .contains("3 workers of about 99.0 MiB RSS each"),
        "{}",
        first.summary
    );
    assert!(first.summary.contains("spread 8%"), "{}", first.summary);
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("RSS: no PSS was read")),
        "{:#?}",
        first.evidence
    );
    assert!(runs_through(&report, first.paths[0], "load_model"));
    assert!(first.next_step.contains("reduce per-worker state"));
    // No fork was seen: not a multiplication.
    assert!(of(&findings, Pattern::WorkerMultiplication).is_empty());
    // Loading once and holding is a working set, not a strong retention.
    assert!(of(&findings, Pattern::Retention)
        .iter()
        .all(|f| f.strength == Strength::Weak));
}

#[test]
fn workers_running_before_attach_did_not_inherit_at_fork() {
    let findings = findings(&large_workers());
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        large[0]
            .evidence
            .iter()
            .all(|e| !e.contains("inherited at fork")),
        "{:#?}",
        large[0].evidence
    );
    assert!(
        large[0].evidence.iter().any(|e| e.contains(
            "the 3 worker(s) already running when tracing began held a median RSS of 15.0 MiB"
        )),
        "{:#?}",
        large[0].evidence
    );
}

/// Master 300 builds a 56 MiB table in `build_table`, then forks workers at
/// 1, 1.5 and 2 s; each worker un-shares 50 MiB of the table in
/// `walk_table` (copy-on-write) and grows 16 MiB of its own in `handle`.
/// With `pss`, PSS and USS are read as /proc/PID/smaps_rollup would show
/// them (each worker ends at 70 MiB of PSS; the master at 60 MiB).
fn prefork_with_shared_table(pss: bool) -> Report {
    let with = |read: Read, pss_mib: u64, uss_mib: u64| {
        if pss {
            read.pss(pss_mib, uss_mib)
        } else {
            read
        }
    };
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.reads(
        master,
        0,
        &[with(at(12, 0), 12, 12), with(at(68, 14_000), 68, 68)],
    );
    run.grow(master, "build_table", S / 4, 56);
    run.read(master, S - S / 10, with(at(68, 14_000), 68, 68));
    run.flat(master, S + S / 2, 7 * S, with(at(68, 14_000), 60, 50));
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        let id = run.fork(tgid, master, forked_ns, 68);
        let first_ns = forked_ns + S / 10;
        run.reads(
            id,
            first_ns,
            &[
                with(at(68, 0), 17, 0),
                with(at(76, 2_000).cow(25), 45, 33),
                with(at(84, 4_000).cow(50), 70, 66),
            ],
        );
        run.flat(id, first_ns + 3 * S / 2, 6 * S, with(at(84, 4_000), 70, 66));
        run.read(id, 6 * S + S / 4, with(at(84, 4_000), 70, 66));
        run.grow(id, "handle", first_ns + S / 2, 16);
        run.cow(id, "walk_table", first_ns + S / 2, 50);
    }
    run.finish(7 * S)
}

#[test]
fn worker_multiplication_counts_steps_and_copy_on_write() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(
        first.pattern,
        Pattern::WorkerMultiplication,
        "{findings:#?}"
    );
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong)
    );
    assert!(
        first.summary.contains(
            "the tree's RSS rose from 68.0 MiB to 320.0 MiB over 3 forks, about 3.0 x the \
             per-worker RSS of 84.0 MiB"
        ),
        "{}",
        first.summary
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "what each fork added: tgid 301 at 1.0 s +68.0 MiB, tgid 302 at 1.5 s +68.0 MiB"
        )),
        "{:#?}",
        first.evidence
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("RSS: no PSS was read")),
        "{:#?}",
        first.evidence
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("un-shared 150.0 MiB")),
        "{:#?}",
        first.evidence
    );
    assert!(first
        .paths
        .iter()
        .any(|&s| runs_through(&report, s, "walk_table")));
    assert!(first
        .paths
        .iter()
        .any(|&s| runs_through(&report, s, "handle")));
    assert!(
        first.next_step.contains("walk_table"),
        "{}",
        first.next_step
    );
    // Its RSS grew along with USS: not copy-on-write un-sharing alone.
    assert!(of(&findings, Pattern::CowUnsharing).is_empty());
    // The same workers are also every-worker-large, ranked after.
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        findings
            .iter()
            .position(|f| f.pattern == Pattern::EveryWorkerLarge)
            > Some(0)
    );
}

#[test]
fn worker_multiplication_counts_shared_pages_once_with_pss() {
    let report = prefork_with_shared_table(true);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(
        first.pattern,
        Pattern::WorkerMultiplication,
        "{findings:#?}"
    );
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    // 60 MiB of master and 3 x 70 MiB of workers, not 68 + 3 x 84 MiB.
    assert!(
        first.summary.contains(
            "the tree's PSS rose from 68.0 MiB to 270.0 MiB over 3 forks, about 2.9 x the \
             per-worker PSS of 70.0 MiB"
        ),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("PSS: a page shared copy-on-write counts once in the tree")),
        "{:#?}",
        first.evidence
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "tgid 301 at 1.0 s: 50.0 MiB un-shared, RSS +16.0 MiB, 70.0 MiB PSS at its peak; \
             tgid 302 at 1.5 s:"
        )),
        "{:#?}",
        first.evidence
    );
    assert!(of(&findings, Pattern::CowUnsharing).is_empty());
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    assert!(
        large[0]
            .summary
            .contains("3 workers of about 70.0 MiB PSS each"),
        "{}",
        large[0].summary
    );
}

#[test]
fn a_preloaded_master_whose_workers_share_its_pages_is_not_multiplication() {
    // The master preloads 200 MiB; four workers fork and write nothing:
    // their RSS counts the master's pages again, their PSS does not.
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.reads(
        master,
        0,
        &[at(12, 0).pss(12, 12), at(212, 50_000).pss(212, 212)],
    );
    run.grow(master, "preload", S / 4, 200);
    run.read(master, S - S / 10, at(212, 50_000).pss(212, 212));
    run.flat(master, S + S / 2, 6 * S, at(212, 50_000).pss(43, 2));
    for (i, tgid) in [301_u32, 302, 303, 304].into_iter().enumerate() {
        let id = run.fork(tgid, master, S + i as u64 * S / 10, 212);
        run.flat(id, 3 * S / 2, 6 * S, at(213, 1_000).pss(43, 1).cow(1));
    }
    let report = run.finish(6 * S);
    let findings = findings(&report);
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
    // Counted in RSS, the tree would have multiplied about 5 x.
    assert!(report.totals.peak_total_rss_bytes >= 5 * 212 * MIB);
    assert!(tree::peak_tree_from(&report, S) <= 220 * MIB);
}

#[test]
fn every_worker_large_names_the_workers_paths_and_what_forks_inherited() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
    let large = of(&findings, Pattern::EveryWorkerLarge);
    assert_eq!(large.len(), 1, "{findings:#?}");
    // The master's table is the largest growth stack, but not the workers'.
    assert!(runs_through(
        &report,
        report.growth_stacks[0].stack,
        "build_table"
    ));
    assert!(!large[0].paths.is_empty());
    assert!(
        large[0]
            .paths
            .iter()
            .all(|&s| !runs_through(&report, s, "build_table")),
        "{:#?}",
        large[0]
    );
    assert!(
        large[0].evidence.iter().any(|e| e.contains(
            "the 3 worker(s) forked during the trace started from a median RSS of 68.0 MiB \
             inherited at fork"
        )),
        "{:#?}",
        large[0].evidence
    );
}

#[test]
fn small_or_uneven_workers_are_not_every_worker_large() {
    let (report, _) = one_leaking_worker(128);
    let findings = findings(&report);
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn forks_of_uneven_workers_are_not_multiplication() {
    let mut run = Run::new();
    let master = run.root(300, 0, 12);
    run.flat(master, 0, 6 * S, at(12, 1_000));
    for (i, tgid) in [301_u32, 302, 303].into_iter().enumerate() {
        let forked_ns = S + i as u64 * S / 2;
        let id = run.fork(tgid, master, forked_ns, 12);
        let size = if tgid == 302 { 200 } else { 12 };
        run.readings(id, forked_ns + S / 10, &[(12, 0), (size, 50_000)]);
        run.flat(id, forked_ns + S, 6 * S, at(size, 50_000));
    }
    let findings = findings(&run.finish(6 * S));
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
}

#[test]
fn workers_that_grow_after_forking_are_not_multiplication() {
    // Small at fork (16 MiB each), then each grows 64 MiB in its own cache:
    // the fork steps make a small share of the tree's rise.
    let mut run = Run::new();
    let master = run.root(300, 0, 20);
    run.flat(master, 0, 8 * S, at(20, 1_000));
    for (i, tgid) in [301_u32, 302, 303, 304].into_iter().enumerate() {
        let forked_ns = S / 10 + i as u64 * S / 100;
        let id = run.fork(tgid, master, forked_ns, 16);
        run.readings(
            id,
            forked_ns + S / 10,
            &[(16, 0), (40, 20_000), (64, 40_000), (80, 60_000)],
        );
        run.flat(id, 4 * S, 8 * S, at(80, 60_000));
        run.grow(id, "render_report", S, 64);
    }
    let findings = findings(&run.finish(8 * S));
    assert!(
        of(&findings, Pattern::WorkerMultiplication).is_empty(),
        "{findings:#?}"
    );
}

/// A master (100) preloads 148 MiB in `build_shared`, then forks four
/// workers that read every inherited object in `read_inherited`: their RSS
/// stays at about 160 MiB while their USS grows from 1 to 149 MiB, by
/// `cow_mib` of copy-on-write faults each (0: the master's pages became
/// theirs without a write). With `early_read`, each worker's PSS and USS
/// are read 0.1 s after its fork (USS 1 MiB), else first after the
/// un-sharing. Beside them, an unrelated process (200) hoards 700 MiB in
/// `hoard` and keeps it: a strong finding about more bytes.
fn prefork_readers(cow_mib: u64, early_read: bool) -> Report {
    let mut run = Run::new();
    let other = run.root(200, 0, 12);
    let up: Vec<(u64, u64)> = (0..=7).map(|i| (12 + 100 * i, 30_000 * i)).collect();
    run.readings(other, 0, &up);
    run.flat(other, 4 * S, 6 * S, at(712, 210_000));
    for i in 0..7 {
        run.grow(other, "hoard", S / 4 + i * S / 2, 100);
    }
    let master = run.root(100, 0, 12);
    run.reads(
        master,
        0,
        &[at(12, 0).pss(12, 12), at(160, 40_000).pss(160, 160)],
    );
    run.grow(master, "build_shared", S / 4, 148);
    run.flat(master, S, 6 * S, at(160, 40_000).pss(150, 140));
    for (i, tgid) in [101_u32, 102, 103, 104].into_iter().enumerate() {
        let forked_ns = S + S / 5 + i as u64 * S / 5;
        let id = run.fork(tgid, master, forked_ns, 160);
        if early_read {
            run.read(id, forked_ns + S / 10, at(160, 100).pss(40, 1));
        }
        let after = at(161, 40_000).pss(150, 149).cow(cow_mib);
        run.flat(id, forked_ns + S, 6 * S, after);
        if cow_mib > 0 {
            run.cow(id, "read_inherited", forked_ns + S / 2, cow_mib);
        }
    }
    run.finish(6 * S)
}

#[test]
fn copy_on_write_unsharing_is_the_first_finding() {
    let report = prefork_readers(148, true);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::CowUnsharing, "{findings:#?}");
    assert_eq!(
        (first.scope, first.strength),
        (Scope::Tree, Strength::Strong),
        "{first:#?}"
    );
    assert_eq!(
        first.summary,
        "copy-on-write un-sharing: 4 workers each un-shared ~149.0 MiB of pages inherited from \
         the master (tgid 100) (USS 0 B -> 149.0 MiB while RSS stayed 161.0 MiB), written by \
         read_inherited"
    );
    assert!(runs_through(&report, first.paths[0], "read_inherited"));
    let tree_pss = format!(
        "tree PSS (shared pages counted once) is {}",
        format_bytes(report.totals.peak_total_pss_bytes)
    );
    assert!(
        first.evidence.iter().any(|e| e.starts_with(&tree_pss)),
        "{:#?}",
        first.evidence
    );
    assert!(
        first.evidence.iter().any(|e| e.contains(
            "tgid 101 USS 0 B at fork (first read 1.0 MiB) -> 149.0 MiB, RSS 160.0 MiB -> \
             161.0 MiB, 148.0 MiB copy-on-write (exact)"
        )),
        "{:#?}",
        first.evidence
    );
    let next = &first.next_step;
    for words in [
        "gc.freeze() (Python 3.7+) before fork stops the cyclic GC's writes",
        "reference-count writes still un-share a page",
        "read_inherited touches objects",
        "multiprocessing.shared_memory",
        "load it after fork in each worker if it is small",
        "fewer workers with more threads",
        &tree_pss,
    ] {
        assert!(next.contains(words), "{words:?} not in {next}");
    }
    // It comes before a strong finding about more bytes.
    assert!(
        of(&findings, Pattern::Retention)
            .iter()
            .any(|f| f.strength == Strength::Strong
                && f.summary.starts_with("tgid 200 retains +700.0 MiB")),
        "{findings:#?}"
    );
    // The same pages are not told again as a multiplication or as large
    // workers.
    assert!(of(&findings, Pattern::WorkerMultiplication).is_empty());
    assert!(of(&findings, Pattern::EveryWorkerLarge).is_empty());
}

#[test]
fn unsharing_before_the_first_smaps_read_is_still_seen() {
    // The workers un-share within a tick of their fork: their first USS
    // read is already high, but at fork nothing was private.
    let findings = findings(&prefork_readers(148, false));
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::CowUnsharing, "{findings:#?}");
    assert!(
        first
            .summary
            .contains("(USS 0 B -> 149.0 MiB while RSS stayed 161.0 MiB)"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("tgid 101 USS 0 B at fork (first read 149.0 MiB) -> 149.0 MiB")),
        "{:#?}",
        first.evidence
    );
}

#[test]
fn private_memory_that_grew_without_writes_is_not_unsharing() {
    // The same USS growth without copy-on-write faults (e.g. the master
    // exited and its pages became the workers' alone).
    let findings = findings(&prefork_readers(0, true));
    assert!(
        of(&findings, Pattern::CowUnsharing).is_empty(),
        "{findings:#?}"
    );
}

/// Process 700 reads a 180 MiB mapped file in slices in `read_slices`
/// (15 MiB each half second until 6 s, file-backed RSS 10 -> 190 MiB),
/// plus `anon_mib` of its own growth in `remember` over the same time, then
/// idles until 9 s. `_compile_bytecode` grew 2 MiB at start-up.
fn reads_a_mapped_file(anon_mib: u64) -> (Report, ProcessId) {
    let mut run = Run::new();
    let id = run.started(start(700, None, Role::Root, 0), at(30, 0).file(10));
    let reads: Vec<Read> = (0..=12)
        .map(|i| at(30 + 15 * i + anon_mib * i / 12, 40_000 * i).file(10 + 15 * i))
        .collect();
    run.reads(id, 0, &reads);
    let end = at(30 + 180 + anon_mib, 480_000).file(190);
    run.flat(id, 6 * S + S / 2, 9 * S, end);
    run.grow(id, "_compile_bytecode", S / 10, 2);
    for i in 0..12 {
        let t_ns = S / 4 + i * S / 2;
        run.file_grow(id, "read_slices", "/data/big.bin", t_ns, 15);
        if anon_mib > 0 {
            run.grow(id, "remember", t_ns, anon_mib / 12);
        }
    }
    (run.finish(9 * S), id)
}

#[test]
fn growth_in_a_mapped_file_is_page_cache_not_retention() {
    let (report, id) = reads_a_mapped_file(0);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::FileBackedGrowth, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert_eq!(
        first.summary,
        "RSS grew 180.0 MiB in file-backed pages (page cache of /data/big.bin) mapped by \
         read_slices; the kernel can reclaim these under memory pressure; it is not your heap"
    );
    assert!(runs_through(&report, first.paths[0], "read_slices"));
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("file-backed RSS 10.0 MiB -> 190.0 MiB")),
        "{:#?}",
        first.evidence
    );
    assert!(
        !first.next_step.contains("bound that cache"),
        "{}",
        first.next_step
    );
    assert!(
        first.next_step.contains("MADV_DONTNEED"),
        "{}",
        first.next_step
    );
    // The page cache is not the process's own growth: no retention, spike
    // or unmatched growth, and `_compile_bytecode` is not blamed.
    assert_eq!(findings.len(), 1, "{findings:#?}");
}

#[test]
fn a_mapped_file_unmapped_before_the_end_is_page_cache_not_a_spike() {
    let mut run = Run::new();
    let id = run.started(start(701, None, Role::Root, 0), at(30, 0).file(10));
    let reads: Vec<Read> = (0..=12)
        .map(|i| at(30 + 15 * i, 40_000 * i).file(10 + 15 * i))
        .collect();
    run.reads(id, 0, &reads);
    run.grow(id, "_compile_bytecode", S / 10, 2);
    for i in 0..12 {
        run.file_grow(id, "read_slices", "/data/big.bin", S / 4 + i * S / 2, 15);
    }
    // mmap.close() at 7 s: the file's pages leave RSS.
    let unmapped = SampledBytes {
        held_bytes: -180 * 1024 * 1024,
        ..SampledBytes::default()
    };
    run.sample(
        id,
        7 * S,
        file_stack("read_slices", "/data/big.bin"),
        unmapped,
    );
    run.flat(id, 7 * S, 9 * S, at(30, 480_000).file(10));
    let report = run.finish(9 * S);
    let findings = findings(&report);
    assert_eq!(
        findings[0].pattern,
        Pattern::FileBackedGrowth,
        "{findings:#?}"
    );
    assert!(findings[0]
        .summary
        .starts_with("RSS grew 180.0 MiB in file-backed pages"));
    assert!(
        findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("left RSS before the end")),
        "{:#?}",
        findings[0].evidence
    );
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
}

#[test]
fn a_process_reading_a_file_still_retains_its_own_memory() {
    let (report, id) = reads_a_mapped_file(60);
    let findings = findings(&report);
    assert_eq!(
        findings[0].pattern,
        Pattern::FileBackedGrowth,
        "{findings:#?}"
    );
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    let retention = retention[0];
    assert_eq!(retention.scope, scope(&report, id));
    assert_eq!(retention.strength, Strength::Strong, "{retention:#?}");
    // It reads the process's memory without the page cache, and names the
    // anonymous path, never the mapped file.
    assert!(
        retention
            .summary
            .starts_with("tgid 700 retains +60.0 MiB of RSS without file-backed pages"),
        "{}",
        retention.summary
    );
    assert!(runs_through(&report, retention.paths[0], "remember"));
    assert!(retention
        .paths
        .iter()
        .all(|&s| !runs_through(&report, s, "read_slices")));
}

/// Process 400 idles at 12 MiB, builds a 200 MiB payload in
/// `build_payload` at 1-1.5 s, holds it to 2 s, frees it by 2.5 s, then idles
/// until 6 s.
fn released_spike() -> Report {
    let mut run = Run::new();
    let id = run.root(400, 0, 12);
    run.readings(
        id,
        0,
        &[
            (12, 0),
            (12, 100),
            (12, 200),
            (212, 51_400),
            (212, 51_500),
            (14, 51_900),
        ],
    );
    run.flat(id, 3 * S, 6 * S, at(14, 52_000));
    run.grow(id, "build_payload", S + S / 4, 200);
    run.free(id, "build_payload", 2 * S + S / 4, 200);
    run.finish(6 * S)
}

#[test]
fn a_released_spike_names_its_path_and_is_not_retention() {
    let report = released_spike();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Spike, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, report.processes[0].id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "build_payload"));
    assert!(
        first
            .summary
            .starts_with("spike in tgid 400: RSS rose +200.0 MiB in 0.5 s to 212.0 MiB at 1.5 s"),
        "{}",
        first.summary
    );
    assert!(
        first
            .summary
            .ends_with("built by build_payload (held 200.0 MiB at the peak)"),
        "{}",
        first.summary
    );
    assert!(first.next_step.contains("stream that payload"));
    assert!(
        of(&findings, Pattern::Retention).is_empty(),
        "{findings:#?}"
    );
}

#[test]
fn slow_growth_that_is_released_is_not_a_spike() {
    let mut run = Run::new();
    let id = run.root(1, 0, 12);
    let up: Vec<(u64, u64)> = (0..10).map(|i| (12 + 20 * i, 5_000 * i)).collect();
    run.readings(id, 0, &up);
    run.readings(id, 5 * S, &[(12, 50_000), (12, 50_000)]);
    run.grow(id, "batch", 2 * S, 180);
    run.free(id, "batch", 5 * S, 180);
    let findings = findings(&run.finish(6 * S));
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
}

#[test]
fn an_exit_after_holding_is_no_spike_or_release_and_quotes_the_table() {
    // Process 460 builds 200 MiB in its first second, holds it for 2 s and
    // exits: its interpreter's finalization and the kernel's teardown (the
    // readings after the exit began, one of them bogus) are not its memory.
    let mut run = Run::new();
    let id = run.root(460, 0, 12);
    run.readings(id, 0, &[(12, 0), (112, 25_000), (212, 50_000)]);
    run.flat(id, 3 * S / 2, 3 * S - S / 2, at(212, 50_000));
    run.grow(id, "hold_data", S / 2, 100);
    run.grow(id, "hold_data", S, 100);
    run.exit_begins(id, 3 * S, at(212, 50_000).peak(220));
    run.read(id, 3 * S + S / 10, at(14, 50_100));
    run.read(id, 3 * S + S / 5, at(400, 50_100));
    run.free(id, "hold_data", 3 * S + S / 10, 200);
    run.exited(id, 3 * S + S / 4, at(2, 50_200));
    let report = run.finish(5 * S);
    let p = report.process(id).unwrap();
    let rss = p.rss.unwrap();
    assert_eq!(
        (rss.start_bytes, rss.end_bytes, rss.peak_bytes),
        (12 * MIB, 212 * MIB, 220 * MIB)
    );
    let findings = findings(&report);
    assert!(of(&findings, Pattern::Spike).is_empty(), "{findings:#?}");
    for finding in &findings {
        let text = all_text(finding);
        assert!(!text.contains("released"), "{finding:#?}");
        assert!(!text.contains("400.0 MiB"), "{finding:#?}");
    }
    // What is said about it quotes the process table's numbers.
    let about: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.scope == scope(&report, id))
        .collect();
    assert!(!about.is_empty(), "{findings:#?}");
    for finding in about {
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("RSS 12.0 MiB -> 212.0 MiB (peak 220.0 MiB) over 3.0 s")),
            "{finding:#?}"
        );
    }
}

/// Process 450 runs 30 jobs, one every 0.25 s from 0.25 s: each touches a
/// 40 MiB buffer in `reuse_buffer` and frees it 0.125 s later, except four
/// that it keeps; then it idles until 10 s holding 160 MiB (grown 1.2 GiB).
fn reused_buffer() -> Report {
    let mut run = Run::new();
    let id = run.root(450, 0, 12);
    let kept_jobs = [5_u64, 12, 19, 26];
    let kept_by = |t_ns: u64| kept_jobs.iter().filter(|&&job| job * S / 4 <= t_ns).count() as u64;
    for job in 1..=30_u64 {
        let t_ns = job * S / 4;
        run.grow(id, "reuse_buffer", t_ns, 40);
        if !kept_jobs.contains(&job) {
            run.free(id, "reuse_buffer", t_ns + S / 8, 40);
        }
    }
    for half in 1..=20_u64 {
        let t_ns = half * S / 2;
        let job = t_ns / (S / 4);
        let in_flight = if job <= 30 && !kept_jobs.contains(&job) {
            40
        } else {
            0
        };
        let activity = 20_000 * half.min(15);
        run.read(id, t_ns, at(12 + 40 * kept_by(t_ns) + in_flight, activity));
    }
    run.finish(10 * S)
}

#[test]
fn a_buffer_touched_again_is_held_not_an_unbounded_cache() {
    let report = reused_buffer();
    let path = &report.paths[0];
    assert_eq!(path.bytes.grown_bytes(), 1_200 * MIB);
    assert_eq!(path.bytes.held_now_bytes(), 160 * MIB);
    let findings = findings(&report);
    for finding in &findings {
        let text = all_text(finding);
        assert!(!text.contains("unbounded"), "{finding:#?}");
        assert!(!text.contains("bound that cache"), "{finding:#?}");
    }
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    let retention = retention[0];
    assert_eq!(retention.strength, Strength::Weak, "{retention:#?}");
    assert!(runs_through(&report, retention.paths[0], "reuse_buffer"));
    // Its finding quotes what the buffer holds; what it grew is only noted.
    assert!(
        retention
            .summary
            .ends_with("held by reuse_buffer (160.0 MiB at the end)"),
        "{}",
        retention.summary
    );
    assert!(
        retention.evidence.iter().any(|e| e.contains(
            "holds 160.0 MiB at the end, held 200.0 MiB at the high-water mark (100% of tgid \
             450's held then), 1.2 GiB grown (freed and touched again"
        )),
        "{:#?}",
        retention.evidence
    );
    assert!(
        retention
            .next_step
            .contains("reuse_buffer holds at the end (160.0 MiB)"),
        "{}",
        retention.next_step
    );
    // Its held bytes rose in most buckets; only what it still holds of what
    // it grew tells it apart from a cache that keeps growing.
    let rise = paths::held_rise(&[path], report.path_bucket_ns).unwrap();
    assert!(
        rise.rising_buckets as f64 >= STEADY_PRESENT_FRACTION * rise.span_buckets as f64,
        "{rise:?}"
    );
    assert!(!rise.is_steady(), "{rise:?}");
}

/// Process 500 serves traffic from 0 to 5 s, growing its cache in
/// `remember` by 24 MiB per second, then idles until 9 s holding it.
fn cache_held_after_traffic() -> Report {
    let mut run = Run::new();
    let id = run.root(500, 0, 12);
    let busy: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 12 * i, 40_000 * i)).collect();
    run.readings(id, 0, &busy);
    run.flat(id, 5 * S + S / 2, 9 * S, at(132, 400_050));
    for second in 0..5 {
        run.grow(id, "remember", second * S + S / 2, 24);
    }
    run.grow(id, "<module>", S / 10, 2);
    run.finish(9 * S)
}

#[test]
fn retention_after_traffic_names_the_steady_path() {
    let report = cache_held_after_traffic();
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Retention, "{findings:#?}");
    assert_eq!(first.scope, scope(&report, report.processes[0].id));
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(runs_through(&report, first.paths[0], "remember"));
    assert!(
        first
            .summary
            .starts_with("tgid 500 retains +120.0 MiB of RSS after its activity dropped"),
        "{}",
        first.summary
    );
    assert!(
        first
            .summary
            .ends_with("held by remember (120.0 MiB at the end)"),
        "{}",
        first.summary
    );
    assert!(
        first
            .evidence
            .iter()
            .any(|e| e.contains("held bytes kept rising (unbounded-cache signature)")),
        "{:#?}",
        first.evidence
    );
    assert!(first.next_step.contains("bound that cache"));
    assert!(of(&findings, Pattern::Spike).is_empty());
}

#[test]
fn growth_while_idle_is_retention() {
    let mut run = Run::new();
    let id = run.root(600, 0, 20);
    // Busy without growth for 2 s (50k events/s), then idle while a
    // background refresh adds 8 MiB per second (2k events/s).
    run.readings(
        id,
        0,
        &[
            (20, 0),
            (20, 25_000),
            (20, 50_000),
            (20, 75_000),
            (20, 100_000),
        ],
    );
    let idle: Vec<(u64, u64)> = (1..=12)
        .map(|i| (20 + 4 * i, 100_000 + 1_000 * i))
        .collect();
    run.readings(id, 2 * S + S / 2, &idle);
    for second in 2..8 {
        run.grow(id, "refresh", second * S + S / 2, 8);
    }
    let report = run.finish(9 * S);
    let findings = findings(&report);
    let first = &findings[0];
    assert_eq!(first.pattern, Pattern::Retention, "{findings:#?}");
    assert_eq!(first.strength, Strength::Strong, "{first:#?}");
    assert!(
        first.summary.contains("kept growing while idle"),
        "{}",
        first.summary
    );
    assert!(runs_through(&report, first.paths[0], "refresh"));
}

#[test]
fn growth_without_an_idle_period_is_weak_retention() {
    let mut run = Run::new();
    let id = run.root(700, 0, 12);
    let busy: Vec<(u64, u64)> = (0..=12).map(|i| (12 + 10 * i, 30_000 * i)).collect();
    run.readings(id, 0, &busy);
    for second in 0..6 {
        run.grow(id, "remember", second * S + S / 2, 20);
    }
    let findings = findings(&run.finish(6 * S));
    let retention = of(&findings, Pattern::Retention);
    assert_eq!(retention.len(), 1, "{findings:#?}");
    assert_eq!(retention[0].strength, Strength::Weak);
    let last = retention[0].evidence.last().unwrap();
    assert!(last.contains("activity never dropped"), "{last}");
}

#[test]
fn flat_processes_are_no_growth() {
    let mut run = Run::new();
    let master = run.root(800, 0, 20);
    run.flat(master, 0, 5 * S, at(20, 1_000));
    let worker = run.fork(801, master, S, 20);
    run.readings(worker, S + S / 10, &[(20, 0), (22, 500)]);
    run.flat(worker, 2 * S, 5 * S, at(22, 500));
    run.grow(worker, "handle", 2 * S, 2);
    let findings = findings(&run.finish(5 * S));
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let only = &findings[0];
    assert_eq!((only.pattern, only.scope), (Pattern::NoGrowth, Scope::Tree));
    assert_eq!(only.strength, Strength::Strong);
    assert!(
        only.summary.contains("+2.0 MiB in tgid 801"),
        "{}",
        only.summary
    );
}

#[test]
fn growth_that_fits_no_pattern_is_weak_and_not_called_no_growth() {
    // A lone process rises 100 MiB over 5 s (too slow for a spike), then
    // falls back to 60 MiB while still busy (too far below its peak for
    // retention).
    let mut run = Run::new();
    let id = run.root(900, 0, 12);
    let up: Vec<(u64, u64)> = (0..=10).map(|i| (12 + 10 * i, 20_000 * i)).collect();
    run.readings(id, 0, &up);
    let down: Vec<(u64, u64)> = [100, 90, 80, 70, 60, 60]
        .into_iter()
        .enumerate()
        .map(|(i, mib)| (mib, 220_000 + 20_000 * i as u64))
        .collect();
    run.readings(id, 5 * S + S / 2, &down);
    for second in 0..5 {
        run.grow(id, "accumulate", second * S + S / 2, 20);
    }
    run.free(id, "accumulate", 7 * S, 52);
    let report = run.finish(8 * S);
    let findings = findings(&report);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let only = &findings[0];
    assert_eq!(
        (only.pattern, only.scope, only.strength),
        (Pattern::UnmatchedGrowth, scope(&report, id), Strength::Weak)
    );
    assert!(
        only.summary.contains("tgid 900 grew +100.0 MiB")
            && only.summary.contains("matches none of the known"),
        "{}",
        only.summary
    );
    assert!(!only.summary.contains("no growth"), "{}", only.summary);
    assert!(
        !only.next_step.contains("nothing to fix"),
        "{}",
        only.next_step
    );
    assert!(only.next_step.contains("accumulate"), "{}", only.next_step);
    assert!(runs_through(&report, only.paths[0], "accumulate"));
    assert!(
        only.evidence
            .iter()
            .any(|e| e.contains("RSS 12.0 MiB -> 60.0 MiB (peak 112.0 MiB)")),
        "{:#?}",
        only.evidence
    );
}

#[test]
fn a_report_without_readings_is_weak_no_growth() {
    let findings = findings(&Run::new().finish(5 * S));
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].pattern, Pattern::NoGrowth);
    assert_eq!(findings[0].strength, Strength::Weak);
}

#[test]
fn steady_and_burst_paths_are_told_apart() {
    let report = cache_held_after_traffic();
    let steady = report
        .paths
        .iter()
        .find(|p| runs_through(&report, p.stack, "remember"))
        .unwrap();
    let rise = paths::held_rise(&[steady], report.path_bucket_ns).unwrap();
    assert!(rise.is_steady(), "{rise:?}");
    assert_eq!((rise.rising_buckets, rise.span_buckets), (5, 5));
    let spike = released_spike();
    let payload = &spike.paths[0];
    assert!(runs_through(&spike, payload.stack, "build_payload"));
    let burst = paths::burst(&[payload], spike.path_bucket_ns).unwrap();
    assert_eq!(burst.max_pair_share, 1.0);
    // It held its payload and gave it all back: not rising held bytes.
    let held = paths::held_rise(&[payload], spike.path_bucket_ns).unwrap();
    assert!(!held.is_steady(), "{held:?}");
}

#[test]
fn findings_are_strong_first_then_by_bytes() {
    let report = prefork_with_shared_table(false);
    let findings = findings(&report);
    let strong = findings
        .iter()
        .take_while(|f| f.strength == Strength::Strong)
        .count();
    assert!(strong >= 2, "{findings:#?}");
    assert!(findings[strong..]
        .iter()
        .all(|f| f.strength == Strength::Weak));
    let impact = |f: &Finding| match f.pattern {
        Pattern::WorkerMultiplication => 1,
        Pattern::EveryWorkerLarge => 2,
        _ => 3,
    };
    assert!(
        findings[..strong]
            .windows(2)
            .all(|w| impact(&w[0]) <= impact(&w[1])),
        "{findings:#?}"
    );
}

/// [`tree::peak_tree_from`] the slow way: [`tree::tree_at`] at every
/// reading at or after `from_ns`.
fn peak_tree_by_rescanning(report: &Report, from_ns: u64) -> u64 {
    report
        .processes
        .iter()
        .flat_map(|p| tree::tree_readings(p).map(|(t_ns, _)| t_ns))
        .filter(|&t| t >= from_ns)
        .map(|t| tree::tree_at(report, t))
        .max()
        .unwrap_or(0)
}

#[test]
fn the_tree_sweep_matches_rescanning_at_every_reading() {
    // Exits (one with readings after it in a hand-edited report), readings
    // at the same time in several processes and in one process, forks
    // mid-trace, PSS read for some processes only.
    let mut run = Run::new();
    let root = run.root(1, 0, 10);
    run.reads(
        root,
        0,
        &[
            at(10, 0),
            at(20, 0).pss(20, 20),
            at(15, 0).pss(9, 5),
            at(40, 0),
        ],
    );
    let two = run.fork(2, root, S / 4, 10);
    run.readings(two, S / 2, &[(30, 0), (70, 0), (50, 0)]);
    run.exit_begins(two, 3 * S / 2, at(50, 0));
    run.readings(two, 3 * S / 2, &[(5, 0), (90, 0)]);
    let three = run.fork(3, root, S, 20);
    run.readings(three, S, &[(25, 0), (25, 0), (60, 0)]);
    let mut churn = run.finish(3 * S);
    let two = churn.processes.iter_mut().find(|p| p.id == two).unwrap();
    let mut late = *two.timeline.last().unwrap();
    (late.t_ns, late.rss_bytes) = (2 * S, 500 * MIB);
    two.timeline.push(late);
    let reports = [
        churn,
        prefork_with_shared_table(false),
        prefork_with_shared_table(true),
        prefork_readers(148, true),
        one_leaking_worker(128).0,
        reused_tgid().0,
        worker_that_execs().0,
        released_spike(),
        large_workers(),
    ];
    for report in &reports {
        for from_ns in [0, 1, S / 4, S / 2, S, 3 * S / 2, 2 * S, 10 * S] {
            assert_eq!(
                tree::peak_tree_from(report, from_ns),
                peak_tree_by_rescanning(report, from_ns),
                "from {from_ns} ns in {:#?}",
                report.processes
            );
        }
    }
    // The reading after the exit began never counts.
    assert!(tree::peak_tree_from(&reports[0], 0) < 500 * MIB);
}

#[test]
fn the_diagnosis_round_trips_through_json() {
    let (report, leaker) = one_leaking_worker(128);
    let diagnosed = diagnose(report);
    let json = serde_json::to_value(&diagnosed).unwrap();
    let first = &json["diagnosis"][0];
    assert_eq!(first["pattern"], "one_process_grows");
    assert_eq!(first["scope"]["scope"], "process");
    assert_eq!(first["scope"]["process"], leaker.0);
    assert_eq!(first["scope"]["tgid"], 102);
    assert_eq!(first["strength"], "strong");
    // The report's own fields sit beside the diagnosis.
    assert!(json["processes"].is_array(), "{json:#}");
    let back: Diagnosed = serde_json::from_value(json).unwrap();
    assert_eq!(back.diagnosis, diagnosed.diagnosis);
    assert_eq!(back.report.processes, diagnosed.report.processes);
    assert_eq!(findings(&back.report), diagnosed.diagnosis);
}

mod verdicts;
