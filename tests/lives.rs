//! Integration tests of true numbers (issue 6): real eBPF programs trace
//! real Python workloads (tests/scripts/), and what memtrace reports for
//! each process's life and each path's held memory must match what the
//! workload measured about itself in /proc, within the stated tolerances.
//!
//! A process is (tgid, start time): workers that reuse a pid are separate
//! rows; a fork starts from what it inherited; an exit ends where the exit
//! began (before the interpreter's finalization); an exec keeps the image
//! before it; a buffer freed and touched again counts once in held bytes;
//! file-backed growth is credited to the reading function; copy-on-write
//! un-sharing is its own pattern with PSS counted once.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11 (Debian's /usr/bin/python3.11 for the static build); without
//! them each test prints why it skips.

#[expect(
    dead_code,
    reason = "lives.rs traces scripts only through `trace_script*`: it calls neither `trace` nor `assert_success`"
)]
mod common;

use serde_json::Value;

use common::{
    debian_python, interpreter, pyenv, python_3_11, require_ebpf, stack_functions, trace_script,
    trace_script_expecting, Trace,
};

/// One mebibyte, in bytes.
const MIB: f64 = 1024.0 * 1024.0;

/// Nanoseconds per clock tick of /proc/PID/stat (`USER_HZ` = 100).
const NS_PER_TICK: u64 = 10_000_000;

/// Tolerance of exact figures (the kernel's RSS counters) against the
/// workload's own /proc readings: they are read at slightly different
/// instants.
const EXACT: f64 = 0.10;

/// Tolerance of sampled figures (sums of byte-sampled stacks, one sample per
/// 512 KiB on average) against the workload's own measurement.
const SAMPLED: f64 = 0.25;

/// `value` of a JSON number as f64 (panics when missing).
fn num(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// Asserts `actual` is within `tolerance` (a fraction) of `expected`, or
/// within `slack_bytes` for small values.
fn assert_near(actual: f64, expected: f64, tolerance: f64, slack_bytes: f64, what: &str) {
    let error = (actual - expected).abs();
    assert!(
        error <= (expected.abs() * tolerance).max(slack_bytes),
        "{what}: {:.1} MiB, expected {:.1} MiB within {:.0}%",
        actual / MIB,
        expected / MIB,
        tolerance * 100.0
    );
}

/// Anonymous RSS growth of a process row: its last timeline point's minus
/// its first's (exact, from the kernel's counters).
fn anon_growth(row: &Value) -> f64 {
    let timeline = row["timeline"].as_array().expect("timeline");
    let anon = |point: Option<&Value>| num(&point.expect("a reading")["anon_bytes"]);
    anon(timeline.last()) - anon(timeline.first())
}

/// Readers of the report for these tests.
impl Trace {
    /// The report's stack ids whose Python frames include `function`.
    fn stacks_through(&self, function: &str) -> Vec<u64> {
        let count = self.report["stacks"].as_array().map_or(0, Vec::len) as u64;
        (0..count)
            .filter(|&id| {
                stack_functions(&self.report, id)
                    .iter()
                    .any(|f| f == function)
            })
            .collect()
    }

    /// `field` of the `bytes` of the paths of row `id` through `function`,
    /// summed (`peak_held_bytes` is read beside `bytes`).
    fn path_bytes(&self, id: u64, function: &str, field: &str) -> f64 {
        let stacks = self.stacks_through(function);
        self.paths_of(id)
            .into_iter()
            .filter(|p| stacks.contains(&p["stack"].as_u64().unwrap_or(u64::MAX)))
            .map(|p| match field {
                "peak_held_bytes" => num(&p["peak_held_bytes"]),
                _ => p["bytes"][field].as_f64().unwrap_or(0.0),
            })
            .sum()
    }

    /// Summed weights of the folded lines through `function`.
    fn folded_bytes(&self, function: &str) -> f64 {
        self.folded
            .lines()
            .filter(|line| line.contains(&format!(";{function} (")))
            .filter_map(|line| line.rsplit_once(' '))
            .map(|(_, bytes)| bytes.parse::<f64>().expect("folded weight"))
            .sum()
    }

    /// Patterns of the findings, strongest first.
    fn patterns(&self) -> Vec<&str> {
        self.findings()
            .iter()
            .filter_map(|f| f["pattern"].as_str())
            .collect()
    }
}

#[test]
fn forked_workers_start_from_what_they_inherited() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "prefork_staggered.py",
        &[
            "--workers",
            "4",
            "--fork-gap",
            "1.0",
            "--mib",
            "100",
            "--seconds",
            "6",
        ],
    );
    let loaded = trace.workload_events("worker_loaded");
    assert_eq!(loaded.len(), 4);
    let mut starts = Vec::new();
    for worker in &loaded {
        let row = trace.row_of(worker["pid"].as_u64().unwrap());
        // Each worker's growth: its own RssAnon growth within 15%. (File
        // pages are not inherited at fork: the child maps its code again
        // right after, before the workload can read /proc, so anonymous
        // memory is what compares.)
        assert_near(
            anon_growth(row),
            num(&worker["growth_bytes"]),
            0.15,
            0.0,
            "worker growth",
        );
        // Its start: the anonymous memory it inherited at fork.
        assert_near(
            num(&row["timeline"][0]["anon_bytes"]),
            num(&worker["status_before"]["RssAnon"]),
            EXACT,
            MIB,
            "worker start",
        );
        assert_eq!(row["exit_status"]["code"], 0, "{row:#}");
        starts.push(row["started_ns"].as_u64().unwrap());
    }
    starts.sort_unstable();
    for pair in starts.windows(2) {
        let gap = (pair[1] - pair[0]) as f64 / 1e9;
        assert!(
            (0.8..=1.6).contains(&gap),
            "workers started {gap:.2} s apart"
        );
    }
    // The master stays flat: it ends at what it held after the forks.
    let forked = trace.workload_event("forked");
    let master = trace.row_of(forked["pid"].as_u64().unwrap());
    assert_near(
        num(&master["rss"]["end_bytes"]),
        num(&forked["master_status"]["VmRSS"]),
        EXACT,
        MIB,
        "master end",
    );
}

#[test]
fn workers_on_reused_pids_are_separate_processes() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(&python, "recycle_workers.py", &["--workers", "32"]);
    let done = trace.workload_events("worker_done");
    assert_eq!(done.len(), 32, "{}", trace.stdout());
    let exit = trace.workload_event("exit");
    assert!(
        num(&exit["distinct_pids"]) <= 8.0,
        "the workload reused pids (as root): {exit}"
    );
    let mut rows_seen = std::collections::HashSet::new();
    for worker in &done {
        let pid = worker["pid"].as_u64().unwrap();
        let ticks = worker["start_time_ticks"].as_u64().unwrap();
        // The process is (tgid, start time): find this one among the rows
        // of its pid by the start time /proc gave it.
        let rows = trace.rows_of(pid);
        let row = rows
            .iter()
            .find(|r| r["start_time_ns"].as_u64().unwrap() / NS_PER_TICK == ticks)
            .unwrap_or_else(|| panic!("no row of pid {pid} started at tick {ticks}: {rows:#?}"));
        assert!(
            rows_seen.insert(row["id"].as_u64().unwrap()),
            "one row per worker"
        );
        assert!(num(&row["rss"]["growth_bytes"]) >= 0.0, "{row:#}");
        assert_near(
            anon_growth(row),
            num(&worker["growth_bytes"]),
            0.15,
            MIB,
            "worker growth",
        );
        let index = worker["index"].as_u64().unwrap();
        assert_eq!(
            row["exit_status"]["code"].as_u64(),
            Some(index % 4),
            "{row:#}"
        );
    }
}

/// Traces `hold_then_exit.py --exit-mode MODE` on `python`, expecting the
/// shell status `code`; checks the end and the exit, and returns the trace.
fn hold_then_exit(python: &std::path::Path, mode: &str, code: i32, began_by: &str) -> Trace {
    let trace = trace_script_expecting(
        python,
        "hold_then_exit.py",
        &[
            "--mib",
            "200",
            "--hold-seconds",
            "2",
            "--exit-mode",
            mode,
            "--start-delay",
            "2",
        ],
        code,
    );
    check_hold_then_exit(trace, mode, began_by)
}

/// Checks a trace of `hold_then_exit.py --exit-mode MODE`: it ends at what
/// it held just before it began to exit (by `began_by`), with no spike,
/// and what `hold_memory` holds at the end; returns the trace.
fn check_hold_then_exit(trace: Trace, mode: &str, began_by: &str) -> Trace {
    let exiting = trace.workload_event("exiting");
    let row = trace.row_of(exiting["pid"].as_u64().unwrap());
    // It ends at what it held just before it began to exit.
    assert_near(
        num(&row["rss"]["end_bytes"]),
        num(&exiting["status"]["VmRSS"]),
        EXACT,
        0.0,
        &format!(
            "end ({mode}; exit began by {}, python {}, warnings {})",
            row["exit_began_by"], row["python"], trace.report["warnings"]
        ),
    );
    assert!(num(&row["rss"]["peak_bytes"]) >= num(&row["rss"]["end_bytes"]));
    assert_eq!(row["exit_began_by"], began_by, "{mode}: {row:#}");
    // Exit teardown is never read as behaviour.
    let patterns = trace.patterns();
    assert!(!patterns.contains(&"spike"), "{mode}: {patterns:?}");
    assert_near(
        trace.path_bytes(row["id"].as_u64().unwrap(), "hold_memory", "held_bytes"),
        num(&exiting["growth_bytes"]),
        SAMPLED,
        0.0,
        &format!("held by hold_memory at the end ({mode})"),
    );
    trace
}

#[test]
fn a_process_that_exits_ends_at_what_it_held() {
    let python = require_ebpf!(python_3_11());
    let trace = hold_then_exit(&python, "normal", 0, "python_finalize");
    let row = trace.row_of(trace.workload_event("exiting")["pid"].as_u64().unwrap());
    assert_eq!(
        row["exit_status"],
        serde_json::json!({"how": "code", "code": 0})
    );
    let trace = hold_then_exit(&python, "sys_exit", 3, "python_finalize");
    let row = trace.row_of(trace.workload_event("exiting")["pid"].as_u64().unwrap());
    assert_eq!(row["exit_status"]["code"], 3);
    hold_then_exit(&python, "os_exit", 4, "exit_group");
    // Main returns first; Py_FinalizeEx waits for the thread that holds the
    // memory, and the exit begins only after it.
    hold_then_exit(&python, "thread", 0, "python_finalize");
    let trace = hold_then_exit(&python, "sigkill", 137, "exit");
    let row = trace.row_of(trace.workload_event("exiting")["pid"].as_u64().unwrap());
    assert_eq!(
        row["exit_status"],
        serde_json::json!({"how": "signal", "signal": 9, "core_dumped": false})
    );
}

#[test]
fn a_python_3_12_process_ends_after_its_threads_before_finalization() {
    let python = require_ebpf!(interpreter(&[pyenv("3.12.1", "python3.12")]));
    hold_then_exit(&python, "thread", 0, "python_finalize");
}

/// Debian's 3.14 and 3.15 (static, stripped, their symbols in the `-dbg`
/// debug file by build-id, which the test setup unpacks and passes with
/// `--debug-dir`): the exit begins at `_PyThreadState_RemoveExcept` once
/// `Py_FinalizeEx` (whose first instruction is `endbr64`) was entered,
/// after the non-daemon threads.
fn check_debian_exit(minor: &str) {
    let python = require_ebpf!(debian_python(minor));
    for (mode, code) in [("normal", 0), ("sys_exit", 3), ("thread", 0)] {
        let trace = hold_then_exit(&python, mode, code, "python_finalize");
        let warnings = trace.report["warnings"].to_string();
        assert!(!warnings.contains("exit_point"), "{mode}: {warnings}");
    }
}

#[test]
fn a_python_3_14_process_ends_after_its_threads_before_finalization() {
    check_debian_exit("3.14");
}

#[test]
fn a_python_3_15_process_ends_after_its_threads_before_finalization() {
    check_debian_exit("3.15");
}

/// 3.14 started through its loader (`ld-linux-x86-64.so.2 --library-path
/// ... python3.14.unpatched`: `/proc/PID/exe` is the loader, the
/// interpreter a file it mapped, not patchelf'd): stacks and the exit point
/// are found in the interpreter's file; main returns at once (`thread`),
/// so finalization is entered before memtrace has probed the process.
#[test]
fn a_python_3_14_started_through_its_loader_ends_at_what_it_held() {
    let Some(loader) = common::debian_python_through_loader("3.14") else {
        return;
    };
    require_ebpf!();
    let tree = common::debian_tree("3.14");
    let debug_dir = tree.join("usr/lib/debug");
    let script = common::script("hold_then_exit.py");
    let mut args = vec!["run", "--debug-dir", debug_dir.to_str().unwrap(), "--"];
    args.extend(loader.iter().map(String::as_str));
    args.extend([
        script.to_str().unwrap(),
        "--mib",
        "200",
        "--hold-seconds",
        "2",
        "--exit-mode",
        "thread",
        "--start-delay",
        "2",
    ]);
    let trace = check_hold_then_exit(common::trace(&args), "thread", "python_finalize");
    let exiting = trace.workload_event("exiting");
    let row = trace.row_of(exiting["pid"].as_u64().unwrap());
    assert_eq!(
        row["python"]["version"].as_str().map(|v| &v[..4]),
        Some("3.14")
    );
}

#[test]
fn a_stripped_interpreter_without_its_debug_file_says_what_that_costs() {
    let python = require_ebpf!(debian_python("3.14"));
    let script = common::script("hold_then_exit.py");
    let trace = common::trace(&[
        "run",
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        "50",
        "--hold-seconds",
        "1",
    ]);
    let warning = trace.report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["kind"] == "exit_point")
        .unwrap_or_else(|| panic!("no exit_point warning: {:#}", trace.report["warnings"]));
    let caveat = warning["caveat"].as_str().unwrap();
    assert!(
        caveat.contains(
            "no symbol _PyThreadState_RemoveExcept (not in .dynsym, .symtab, nor a debug file"
        ),
        "{caveat}"
    );
    assert!(
        caveat.contains(
            "exit begins at Py_FinalizeEx: a thread still running after main returned is cut off"
        ),
        "{caveat}"
    );
    let exiting = trace.workload_event("exiting");
    let row = trace.row_of(exiting["pid"].as_u64().unwrap());
    assert_eq!(row["exit_began_by"], "python_finalize", "{row:#}");
}

#[test]
fn a_process_of_the_static_interpreter_ends_before_finalization() {
    let python = require_ebpf!(interpreter(&["/usr/bin/python3.11".into()]));
    hold_then_exit(&python, "normal", 0, "python_finalize");
    hold_then_exit(&python, "thread", 0, "python_finalize");
}

/// 3.11 execs Debian's 3.14 (same pid): two Python images, each with its
/// version and its own function's growth.
#[test]
fn an_exec_into_python_3_14_reads_the_new_version() {
    let python = require_ebpf!(python_3_11());
    let next = require_ebpf!(debian_python("3.14"));
    let debug_dir = common::debug_dir_of(&next).unwrap();
    let script = common::script("grow_then_exec.py");
    let trace = common::trace(&[
        "run",
        "--debug-dir",
        debug_dir.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--mib",
        "60",
        "--exec-python",
        next.to_str().unwrap(),
        "--then-mib",
        "80",
        "--start-delay",
        "1",
    ]);
    let before = trace.workload_event("before_exec");
    let grown = trace.workload_event("grown");
    assert_eq!(before["pid"], grown["pid"]);
    let rows = trace.rows_of(before["pid"].as_u64().unwrap());
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[0]["python"]["version"], "3.11.7");
    assert!(
        rows[1]["python"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.14.")),
        "{:#}",
        rows[1]["python"]
    );
    for (row, function, expected) in [
        (rows[0], "grow_before_exec", num(&before["growth_bytes"])),
        (rows[1], "fill_cache", num(&grown["rss_growth_bytes"])),
    ] {
        let id = row["id"].as_u64().unwrap();
        assert_near(
            trace.path_bytes(id, function, "growth_bytes"),
            expected,
            SAMPLED,
            0.0,
            function,
        );
    }
    assert_eq!(rows[1]["exit_began_by"], "python_finalize", "{:#}", rows[1]);
}

#[test]
fn an_exec_keeps_the_python_image_before_it() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "grow_then_exec.py",
        &["--mib", "60", "--start-delay", "1"],
    );
    let before = trace.workload_event("before_exec");
    let rows = trace.rows_of(before["pid"].as_u64().unwrap());
    assert_eq!(
        rows.len(),
        2,
        "the Python image and the sleep image: {rows:#?}"
    );
    let (python_image, sleep_image) = (rows[0], rows[1]);
    assert_eq!(python_image["image"], 0);
    assert_eq!(python_image["python"]["status"], "python");
    assert_eq!(python_image["next_image"], sleep_image["id"]);
    // The Python image ends at what it held right before its execve.
    assert_near(
        num(&python_image["rss"]["end_bytes"]),
        num(&before["status"]["VmRSS"]),
        EXACT,
        0.0,
        "Python image end",
    );
    assert_eq!(
        python_image["rss"]["start_bytes"], 0,
        "memtrace run starts at the execve"
    );
    let id = python_image["id"].as_u64().unwrap();
    assert_near(
        trace.path_bytes(id, "grow_before_exec", "growth_bytes"),
        num(&before["growth_bytes"]),
        SAMPLED,
        0.0,
        "grown by grow_before_exec",
    );
    assert_eq!(sleep_image["image"], 1);
    assert!(
        sleep_image["cmdline"]
            .as_str()
            .unwrap()
            .starts_with("sleep"),
        "{sleep_image:#}"
    );
    assert_eq!(sleep_image["python"]["status"], "not_python");
    assert_eq!(sleep_image["exit_status"]["code"], 0);
}

#[test]
fn a_buffer_freed_and_touched_again_is_held_once() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "reuse_buffer.py",
        &["--jobs", "30", "--buffer-mib", "40", "--keep", "4"],
    );
    let done = trace.workload_event("done");
    let id = trace.row_of(done["pid"].as_u64().unwrap())["id"]
        .as_u64()
        .unwrap();
    let held_end = trace.path_bytes(id, "fill_buffer", "held_bytes");
    let grown = trace.path_bytes(id, "fill_buffer", "growth_bytes");
    let held_peak = trace.path_bytes(id, "fill_buffer", "peak_held_bytes");
    assert_near(
        held_end,
        num(&done["kept_bytes"]),
        SAMPLED,
        0.0,
        "held at end",
    );
    assert_near(grown, num(&done["touched_bytes"]), SAMPLED, 0.0, "grown");
    // At the high-water mark: the kept buffers and the one in use.
    assert_near(
        held_peak,
        num(&done["hwm_growth_bytes"]),
        SAMPLED,
        0.0,
        "held at peak",
    );
    // The folded file weighs by held at peak, not by every touch.
    assert_near(
        trace.folded_bytes("fill_buffer"),
        held_peak,
        0.01,
        0.0,
        "folded weight of fill_buffer",
    );
    assert!(
        !trace.patterns().contains(&"retention")
            || trace
                .findings()
                .iter()
                .all(|f| !f["summary"].as_str().unwrap_or("").contains("unbounded")),
        "{:#}",
        trace.report["diagnosis"]
    );
}

#[test]
fn file_backed_growth_is_credited_to_the_reader() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(&python, "read_mapped_file.py", &["--file-mib", "200"]);
    let read = trace.workload_event("read");
    let id = trace.row_of(read["pid"].as_u64().unwrap())["id"]
        .as_u64()
        .unwrap();
    let file_growth = trace.path_bytes(id, "read_slices", "file_growth_bytes");
    assert_near(
        file_growth,
        num(&read["file_growth_bytes"]),
        SAMPLED,
        0.0,
        "file-backed growth",
    );
    let anon = trace.path_bytes(id, "read_slices", "growth_bytes");
    assert!(
        anon < 0.05 * file_growth,
        "anonymous under read_slices: {anon}"
    );
    let mapped = trace.workload_event("mapped");
    let file = mapped["path"].as_str().unwrap();
    let names_the_file = trace.report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|stack| {
            stack
                .as_array()
                .and_then(|frames| frames.last())
                .is_some_and(|f| f["kind"] == "mapping" && f["name"] == file)
        });
    assert!(names_the_file, "no stack ends in the mapping of {file}");
    let first = &trace.findings()[0];
    assert_eq!(first["pattern"], "file_backed_growth", "{first:#}");
}

#[test]
fn copy_on_write_unsharing_is_the_first_finding() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "prefork_readers.py",
        // 10 s: under load the four reads take seconds, and memtrace must
        // read each worker's PSS after its read.
        &["--mib", "150", "--workers", "4", "--seconds", "10"],
    );
    let first = &trace.findings()[0];
    assert_eq!(
        first["pattern"], "cow_unsharing",
        "{:#}",
        trace.report["diagnosis"]
    );
    // Tree totals count a shared page once: the PSS of the workers as they
    // read it after un-sharing, plus the master's, which rises from its PSS
    // right after the forks (pages shared five ways) toward its RSS as the
    // workers copy the pages (each copy leaves the master's page less
    // shared): the peak lies between the two sums, whenever memtrace read the
    // master (within 15% of either bound).
    let forked = trace.workload_event("forked");
    let after = trace.workload_events("smaps_after");
    assert_eq!(after.len(), 4);
    let workers_pss: f64 = after.iter().map(|w| num(&w["smaps"]["Pss"])).sum();
    let lowest = num(&forked["smaps"]["Pss"]) + workers_pss;
    let highest = num(&forked["smaps"]["Rss"]) + workers_pss;
    let totals = &trace.report["totals"];
    let tree_pss = num(&totals["peak_total_pss_bytes"]);
    assert!(
        tree_pss >= lowest * 0.85 && tree_pss <= highest * 1.15,
        "tree PSS: {:.1} MiB, expected between {:.1} and {:.1} MiB (within 15%)",
        tree_pss / MIB,
        lowest / MIB,
        highest / MIB
    );
    assert!(
        num(&totals["peak_total_pss_bytes"]) < num(&totals["peak_total_rss_bytes"]),
        "RSS counts pages still shared once per process, PSS once: {totals:#}"
    );
    let summary = first["summary"].as_str().unwrap();
    assert!(summary.contains("4 workers"), "{summary}");
    // Each worker's private memory grew while its RSS barely moved.
    for worker in &after {
        let row = trace.row_of(worker["pid"].as_u64().unwrap());
        let sharing = &row["sharing"];
        let uss_growth = num(&sharing["end_uss_bytes"]) - num(&sharing["start_uss_bytes"]);
        assert_near(
            uss_growth,
            num(&worker["uss_growth_bytes"]),
            0.25,
            4.0 * MIB,
            "USS growth",
        );
        assert!(
            num(&row["counters"]["cow_fault_bytes"]) > 0.5 * uss_growth,
            "{row:#}"
        );
    }
}

#[test]
fn a_master_writing_after_its_workers_exited_copies_nothing() {
    let python = require_ebpf!(python_3_11());
    let trace = trace_script(
        &python,
        "master_outlives_workers.py",
        &["--workers", "2", "--table-mib", "120"],
    );
    // The workers' reads copy the master's pages (copy-on-write)...
    let walked = trace.workload_events("worker_walked");
    assert_eq!(walked.len(), 2);
    for worker in &walked {
        let row = trace.row_of(worker["pid"].as_u64().unwrap());
        assert!(
            num(&row["counters"]["cow_fault_bytes"]) > 60.0 * MIB,
            "a worker copies the table it reads: {row:#}"
        );
    }
    // ... but once they are gone, the master's own writes to the same
    // write-protected pages reuse them: no one else maps them.
    let master = trace.workload_event("master_walked");
    let row = trace.row_of(master["pid"].as_u64().unwrap());
    assert!(
        num(&row["counters"]["cow_fault_bytes"]) < 4.0 * MIB,
        "the master alone copies nothing: {row:#}"
    );
    assert!(
        trace
            .findings()
            .iter()
            .all(|f| f["pattern"] != "cow_unsharing" || f["scope"]["scope"] == "tree"),
        "{:#}",
        trace.report["diagnosis"]
    );
}
