//! Allocator mode (`--allocations`) end to end: the real memtrace binary
//! hooks the allocators of real interpreters running the workloads
//! tests/scripts/alloc_*.py; the assertions are on the `allocations`
//! section of the JSON report (which process, which function, how many
//! bytes leaked, freed, temporary) against the workload's own measurements.
//!
//! They need root and a kernel with BTF (skipped otherwise, with the
//! reason); an absent interpreter is skipped with a printed reason.

#[expect(
    dead_code,
    reason = "these tests read only the allocations section: no process rows, paths or folded stacks of `common::Trace`"
)]
mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

use common::{interpreter, python_3_11, require_ebpf, script, trace, Trace};

/// Allowed relative error of sampled bytes against the workload's own count
/// (the bound; at a 64 KiB mean, 100 MiB is ~1,600 samples: a
/// relative standard error of ~2.5%).
const TOLERANCE: f64 = 0.15;

/// Sampling mean of these runs, in bytes.
const SAMPLE_BYTES: &str = "65536";

/// How long the workloads wait before allocating, in seconds: memtrace
/// attaches a process's allocator probes once its interpreter is found,
/// tens of milliseconds after it starts on a quiet machine, and never
/// pauses it; at a load average of 20 the gap was 0.4-1.1 s.
const START_DELAY_SECONDS: &str = "2";

/// Debian's LTO-built interpreter, whose pymalloc is inlined.
const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// `memtrace run --allocations` of `script_name` with `args` under
/// `python`, plus `extra` memtrace options.
fn trace_allocations(python: &Path, extra: &[&str], script_name: &str, args: &[&str]) -> Trace {
    let script = script(script_name);
    let mut command = vec!["run", "--allocations", "--sample-bytes", SAMPLE_BYTES];
    if !extra.contains(&"--alloc-hooks") {
        command.extend(common::alloc_hooks_args());
    }
    command.extend_from_slice(extra);
    command.extend(["--", python.to_str().unwrap(), script.to_str().unwrap()]);
    command.extend_from_slice(args);
    command.extend(["--start-delay", START_DELAY_SECONDS]);
    trace(&command)
}

/// Readers of the allocations section.
impl Trace {
    fn alloc_process(&self, tgid: u64) -> &Value {
        self.report["allocations"]["processes"]
            .as_array()
            .expect("the report has an allocations section")
            .iter()
            .find(|p| p["tgid"].as_u64() == Some(tgid))
            .unwrap_or_else(|| panic!("no allocations entry for tgid {tgid}"))
    }

    /// The sum of `field` over the paths of `tgid` with a frame of
    /// `function`.
    fn function_bytes(&self, tgid: u64, function: &str, field: &str) -> f64 {
        entry_bytes(self.alloc_process(tgid), function, field)
    }
}

fn assert_within(actual: f64, expected: f64, what: &str) {
    let error = (actual - expected).abs() / expected;
    assert!(
        error <= TOLERANCE,
        "{what}: memtrace says {actual:.0} bytes, the workload counted {expected:.0} ({:.1}% off, \
         tolerance {:.0}%)",
        error * 100.0,
        TOLERANCE * 100.0
    );
}

#[test]
fn kept_objects_are_leaked_and_churn_is_temporary() {
    let python = require_ebpf!(python_3_11());
    let args = ["--keep-mib", "100", "--churn-mib", "400"];
    let trace = trace_allocations(&python, &[], "alloc_leak_churn.py", &args);
    let kept = trace.workload_event("kept");
    let tgid = kept["pid"].as_u64().unwrap();
    let kept_bytes = kept["getsizeof_bytes"].as_f64().unwrap();
    let leaked = trace.function_bytes(tgid, "keep_small_objects", "leaked_bytes");
    assert_within(leaked, kept_bytes, "leaked by keep_small_objects");

    let churned = trace.workload_event("churned")["allocated_bytes"]
        .as_f64()
        .unwrap();
    let allocated = trace.function_bytes(tgid, "churn", "allocated_bytes");
    let freed = trace.function_bytes(tgid, "churn", "freed_bytes");
    let temporary = trace.function_bytes(tgid, "churn", "temporary_bytes");
    let churn_leaked = trace.function_bytes(tgid, "churn", "leaked_bytes");
    assert_within(allocated, churned, "allocated by churn");
    assert_within(freed, churned, "freed by churn");
    assert_within(temporary, churned, "temporary in churn");
    assert!(
        churn_leaked < 0.02 * churned,
        "churn leaked {churn_leaked:.0} bytes of {churned:.0}"
    );
    let process = trace.alloc_process(tgid);
    assert_eq!(process["hook"]["status"], "hooked", "{process}");
    assert_eq!(process["inlined_allocator_suspected"], false);
    assert!(process["fragmentation"].is_null(), "{process}");
    assert!(trace.stdout().contains("allocations before +"));
    assert!(!trace.stdout().contains("the allocator holds freed memory"));
    // The verdict stays last on the screen, after the allocations table.
    let stdout = trace.stdout();
    let (table_at, verdict_at) = (
        stdout
            .find("\nAllocations (")
            .expect("an allocations section"),
        stdout.rfind("\nVerdict: ").expect("a verdict"),
    );
    assert!(table_at < verdict_at, "{stdout}");
    assert!(trace
        .findings()
        .iter()
        .all(|f| f["pattern"] != "allocator_fragmentation"));
}

/// Allowed relative difference between the report's anonymous RSS at the
/// end (the kernel's `rss_stat` counter, read when the process's exit
/// began) and the `RssAnon` the workload read from /proc/self/status (the
/// same counter) about 1.5 s before, while it only slept.
const RSS_TOLERANCE: f64 = 0.05;

#[test]
fn survivors_pinning_pymalloc_arenas_are_fragmentation_not_a_leak() {
    let python = require_ebpf!(python_3_11());
    let args = ["--mib", "200", "--keep-every", "32", "--hold", "1.5"];
    let trace = trace_allocations(&python, &[], "alloc_fragment.py", &args);
    let thinned = trace.workload_event("thinned");
    let tgid = thinned["pid"].as_u64().unwrap();
    let process = trace.alloc_process(tgid);
    let note = &process["fragmentation"];
    assert_eq!(note["allocator"], "pymalloc_arenas", "{process}");
    let rss_anon = thinned["rss_anon_bytes"].as_f64().unwrap();
    let rss_end = note["rss_anon_end_bytes"].as_f64().unwrap();
    let off = (rss_end - rss_anon).abs() / rss_anon;
    assert!(
        off <= RSS_TOLERANCE,
        "RSS at the end {rss_end:.0} vs RssAnon {rss_anon:.0} ({:.1}% off)",
        off * 100.0
    );
    assert_eq!(process["rss_anon_end_bytes"], note["rss_anon_end_bytes"]);
    let live = note["live_bytes"].as_u64().unwrap();
    assert_eq!(process["leaked_bytes"].as_u64(), Some(live));
    assert!(
        (live as f64) < 0.1 * rss_anon,
        "live {live} bytes is not far below RssAnon {rss_anon:.0}"
    );
    let retained = note["rss_anon_retained_bytes"].as_u64().unwrap();
    assert_eq!(note["held_free_bytes"].as_u64(), Some(retained - live));
    // The objects were live once: the high-water mark saw them.
    let built = thinned["built_bytes"].as_f64().unwrap();
    let peak = trace.function_bytes(tgid, "build_and_thin", "peak_bytes");
    assert!(peak >= 0.85 * built, "peak {peak:.0} of {built:.0} built");
    assert!(
        trace.stdout().contains("pymalloc arenas pinned"),
        "{}",
        trace.stdout()
    );
    // The verdict says so too, instead of calling it retention.
    let patterns: Vec<&str> = trace
        .findings()
        .iter()
        .filter(|f| f["scope"]["tgid"].as_u64() == Some(tgid))
        .map(|f| f["pattern"].as_str().unwrap())
        .collect();
    assert!(
        patterns.contains(&"allocator_fragmentation"),
        "{patterns:?}"
    );
    assert!(!patterns.contains(&"retention"), "{patterns:?}");
}

#[test]
fn ctypes_malloc_is_attributed_to_its_python_function() {
    let python = require_ebpf!(python_3_11());
    let args = ["--native-mib", "32"];
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("run.capture");
    let extra = ["--capture", capture.to_str().unwrap()];
    let trace = trace_allocations(&python, &extra, "alloc_leak_churn.py", &args);
    let native = trace.workload_event("native");
    let tgid = native["pid"].as_u64().unwrap();
    let expected = native["malloc_bytes"].as_f64().unwrap();
    let leaked = trace.function_bytes(tgid, "native_malloc", "leaked_bytes");
    assert_within(leaked, expected, "malloc'd by native_malloc");
    // Its native chain, unwound from malloc's caller up to the Python
    // function: ctypes, then libffi.
    let chains: Vec<String> = trace.alloc_process(tgid)["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| {
            let frames = path["stack"].as_array().unwrap().iter();
            frames
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" -> ")
        })
        .filter(|chain| chain.contains("native_malloc ("))
        .collect();
    assert!(
        chains.iter().any(|chain| {
            let native = &chain[chain.find("native_malloc (").unwrap()..];
            native.contains(" -> _ctypes_callproc -> ") && native.contains(" -> ffi_call")
        }),
        "no native_malloc -> ... -> _ctypes_callproc -> ffi_call chain in {chains:?}"
    );
    // The report says from when allocations were seen: before the workload
    // began to allocate.
    let gap_ns = trace.alloc_process(tgid)["hook"]["gap_ns"]
        .as_u64()
        .unwrap();
    assert!(gap_ns < 500_000_000, "probes attached after {gap_ns} ns");
    // The capture redraws the same allocations section.
    let replayed = common::memtrace()
        .args(["report", capture.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    common::assert_success(&replayed, "memtrace report");
    let replayed: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!(replayed["allocations"], trace.report["allocations"]);
    // And draws its allocation paths: the folded lines add up to the
    // leaked bytes of every process.
    let folded = common::memtrace()
        .args(["report", capture.to_str().unwrap(), "--allocations"])
        .args(["--alloc-weight", "leaked", "--format", "folded"])
        .output()
        .unwrap();
    common::assert_success(&folded, "memtrace report --allocations");
    let drawn: u64 = common::stdout_of(&folded)
        .lines()
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let leaked: u64 = trace.report["allocations"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["leaked_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(drawn, leaked);
}

#[test]
fn a_forked_child_owns_its_allocations() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_allocations(&python, &[], "alloc_fork_child.py", &["--mib", "32"]);
    let child = trace.workload_event("child");
    let parent = trace.workload_event("parent");
    let child_tgid = child["pid"].as_u64().unwrap();
    let parent_tgid = parent["pid"].as_u64().unwrap();
    assert_ne!(child_tgid, parent_tgid);
    let expected = child["getsizeof_bytes"].as_f64().unwrap();
    let in_child = trace.function_bytes(child_tgid, "child_keeps", "leaked_bytes");
    assert_within(in_child, expected, "kept by child_keeps in the child");
    let in_parent = trace.function_bytes(parent_tgid, "child_keeps", "allocated_bytes");
    assert_eq!(
        in_parent, 0.0,
        "the parent is credited with its child's bytes"
    );
    // The child's identity: its start time (boot-time ns) is the one it
    // read from /proc/self/stat (clock ticks of 10 ms).
    let start_ns = trace.alloc_process(child_tgid)["start_time_ns"]
        .as_u64()
        .unwrap();
    let ticks = child["start_time_ticks"].as_u64().unwrap();
    assert!(
        (start_ns / 10_000_000).abs_diff(ticks) <= 1,
        "start {start_ns} ns vs {ticks} ticks"
    );
    // Both ended: the kernel's live set keeps no block of either.
    assert_eq!(
        trace.report["allocations"]["kernel"]["live_set_blocks"], 0,
        "{}",
        trace.report["allocations"]["kernel"]
    );
}

#[test]
fn debian_static_python_gets_the_inlined_allocator_message_and_its_remedy_works() {
    let python: PathBuf = require_ebpf!(interpreter(&[PathBuf::from(DEBIAN_PYTHON)]));
    let args = ["--tuples-mib", "48"];
    let uprobes = ["--alloc-hooks", "uprobes"];
    let inlined = trace_allocations(&python, &uprobes, "alloc_leak_churn.py", &args);
    let tgid = inlined.workload_event("tuples")["pid"].as_u64().unwrap();
    assert_eq!(
        inlined.alloc_process(tgid)["inlined_allocator_suspected"],
        true
    );
    assert!(
        inlined.stdout().contains("PYTHONMALLOC=malloc"),
        "{}",
        inlined.stdout()
    );

    let remedy = ["--alloc-hooks", "uprobes", "--python-malloc"];
    let remedied = trace_allocations(&python, &remedy, "alloc_leak_churn.py", &args);
    let kept = remedied.workload_event("tuples");
    let tgid = kept["pid"].as_u64().unwrap();
    let leaked = remedied.function_bytes(tgid, "keep_tuples", "leaked_bytes");
    assert_within(
        leaked,
        kept["getsizeof_bytes"].as_f64().unwrap(),
        "leaked by keep_tuples under PYTHONMALLOC=malloc",
    );
    assert_eq!(
        remedied.alloc_process(tgid)["inlined_allocator_suspected"],
        false
    );
}

#[test]
fn the_sampler_sees_debian_static_pythons_inlined_allocator_whole() {
    // The sampler wraps the allocator domains themselves, which the
    // inlined PyObject_Malloc still calls through: no remedy needed.
    let python: PathBuf = require_ebpf!(interpreter(&[PathBuf::from(DEBIAN_PYTHON)]));
    let args = ["--tuples-mib", "48"];
    let sampler = ["--alloc-hooks", "sampler"];
    let trace = trace_allocations(&python, &sampler, "alloc_leak_churn.py", &args);
    let kept = trace.workload_event("tuples");
    let tgid = kept["pid"].as_u64().unwrap();
    assert_within(
        trace.function_bytes(tgid, "keep_tuples", "leaked_bytes"),
        kept["getsizeof_bytes"].as_f64().unwrap(),
        "leaked by keep_tuples, pymalloc inlined",
    );
    assert_eq!(
        trace.alloc_process(tgid)["inlined_allocator_suspected"],
        false
    );
}

#[test]
fn the_programs_own_sitecustomize_runs_and_the_debug_allocator_is_sampled() {
    // The program puts its own sitecustomize on PYTHONPATH (after
    // memtrace's) and runs under CPython's debug hooks.
    let python = require_ebpf!(python_3_11());
    let own = script("own_sitecustomize");
    let workload = script("alloc_leak_churn.py");
    let line = format!(
        "PYTHONPATH=\"$PYTHONPATH:{}\" PYTHONMALLOC=debug exec {} {} --keep-mib 24 --start-delay {}",
        own.display(),
        python.display(),
        workload.display(),
        START_DELAY_SECONDS
    );
    let mut args = vec!["run", "--allocations", "--sample-bytes", SAMPLE_BYTES];
    args.extend(common::alloc_hooks_args());
    args.extend(["--", "sh", "-c", &line]);
    let trace = trace(&args);
    let ran = trace.workload_event("own_sitecustomize");
    assert_eq!(ran["pythonmalloc"], "debug", "{ran}");
    let kept = trace.workload_event("kept");
    let tgid = kept["pid"].as_u64().unwrap();
    assert_eq!(ran["pid"].as_u64(), Some(tgid));
    let images = images_of(&trace, tgid);
    let python_image = images.last().expect("an entry per image");
    assert_within(
        entry_bytes(python_image, "keep_small_objects", "leaked_bytes"),
        kept["getsizeof_bytes"].as_f64().unwrap(),
        "leaked by keep_small_objects under PYTHONMALLOC=debug",
    );
}

/// The allocations entries of `tgid`, one per image, in the order the
/// images began.
fn images_of(trace: &Trace, tgid: u64) -> Vec<&Value> {
    trace.report["allocations"]["processes"]
        .as_array()
        .expect("the report has an allocations section")
        .iter()
        .filter(|p| p["tgid"].as_u64() == Some(tgid))
        .collect()
}

/// The sum of `field` over the paths of one allocations entry that run
/// through `function`.
fn entry_bytes(entry: &Value, function: &str, field: &str) -> f64 {
    let frame = format!("{function} (");
    entry["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|path| {
            path["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.starts_with(&frame)))
        })
        .map(|path| path[field].as_u64().unwrap() as f64)
        .sum()
}

#[test]
fn pythons_a_shell_forks_and_execs_are_hooked_as_their_new_images() {
    // Two children of one shell exec Python at once: while the drain is
    // busy with one, the other's exec record is still queued when /proc
    // already shows Python. Probing then must wait for that record, or the
    // probes go to the shell's image and the exec record detaches them.
    let python = require_ebpf!(python_3_11());
    let script = script("alloc_leak_churn.py");
    let one = format!(
        "{} {} --keep-mib 30 --start-delay {START_DELAY_SECONDS}",
        python.display(),
        script.display()
    );
    let shell = format!("{one} & {one}; wait");
    let mut args = vec!["run", "--allocations", "--sample-bytes", SAMPLE_BYTES];
    args.extend(common::alloc_hooks_args());
    args.extend(["--", "sh", "-c", &shell]);
    let trace = trace(&args);
    let kept = trace.workload_events("kept");
    assert_eq!(kept.len(), 2, "two workloads");
    for event in kept {
        let tgid = event["pid"].as_u64().unwrap();
        let images = images_of(&trace, tgid);
        let (python_image, before) = images.split_last().expect("an entry per image");
        assert_eq!(python_image["hook"]["status"], "hooked", "{python_image}");
        let leaked = entry_bytes(python_image, "keep_small_objects", "leaked_bytes");
        assert_within(
            leaked,
            event["getsizeof_bytes"].as_f64().unwrap(),
            &format!("leaked by keep_small_objects in tgid {tgid}'s Python image"),
        );
        for image in before {
            assert_eq!(
                entry_bytes(image, "keep_small_objects", "allocated_bytes"),
                0.0,
                "the image before the exec got the Python image's allocations: {image}"
            );
        }
    }
}
