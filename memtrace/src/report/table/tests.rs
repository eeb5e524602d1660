//! Tests of the terminal renderer: the process table, the merged and
//! per-process path lists, the copy-on-write paths, the diagnosis and the
//! files written, on the report fixtures and synthetic runs.

use std::path::PathBuf;

use memtrace_common::MemoryEvent;

use super::frames::MAX_FRAMES_SHOWN;
use super::*;
use crate::aggregate::test_support::{native, py, rss, sample, start, MIB};
use crate::aggregate::Frame;
use crate::aggregate::{Aggregator, ExitStatus, ProcessStart, PythonStatus, Role, RunMeta};
use crate::diagnose::diagnose;
use crate::report::fixtures::lifecycle_diagnosed;
use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

fn written() -> FilesWritten {
    let file = |what: &str, path: &str| crate::report::WrittenFile {
        what: what.to_owned(),
        path: PathBuf::from(path),
    };
    FilesWritten {
        files: vec![
            file("JSON report", "/out/memtrace-1.json"),
            file("capture", "/out/memtrace-1.capture"),
        ],
        hint: Some("draw it again".to_owned()),
    }
}

/// The terminal report with `--verbose` (every section, every frame): the
/// details these tests check.
fn render_with(report: &Diagnosed, top: usize, weight: Weight) -> String {
    render_options(
        report,
        &RenderOptions {
            top,
            weight,
            verbose: true,
            ..RenderOptions::default()
        },
    )
}

fn render_options(report: &Diagnosed, options: &RenderOptions) -> String {
    let mut out = Vec::new();
    render(report, options, &written(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn render_text(report: &Diagnosed, top: usize) -> String {
    render_with(report, top, Weight::Peak)
}

/// The default terminal report (no `--verbose`).
fn render_compact(report: &Diagnosed) -> String {
    render_options(report, &RenderOptions::default())
}

/// The lines of the section whose title starts with `title`, up to the
/// next blank line.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(&format!("\n{title}"))
        .unwrap_or_else(|| panic!("no section {title:?} in:\n{text}"))
        + 1;
    let rest = &text[start..];
    rest.find("\n\n").map_or(rest, |end| &rest[..=end])
}

/// The row of the process table whose TGID column is `column`.
fn row<'a>(text: &'a str, column: &str) -> &'a str {
    section(text, PROCESSES)
        .lines()
        .find(|l| l.get(..9).is_some_and(|c| c.trim() == column))
        .unwrap_or_else(|| panic!("no row {column:?} in:\n{text}"))
}

const PROCESSES: &str = "Processes (one row per image";
const MERGED: &str = "Top paths across processes";
const PER_PROCESS: &str = "Top paths per process";

#[test]
fn process_rows_give_every_measure_and_how_each_image_ended() {
    let text = render_text(&lifecycle_diagnosed(), 10);
    let table = section(&text, PROCESSES);
    let header = table.lines().nth(1).unwrap();
    assert_eq!(
        header,
        "     TGID  ROLE     RSS START        END       PEAK      GROWTH    USS END        COW  \
         PYTHON      ENDED             COMMAND"
    );
    assert_eq!(
        row(&text, "201"),
        "      201  worker    30.0 MiB   70.0 MiB   80.0 MiB   +40.0 MiB   50.0 MiB    8.0 MiB  \
         3.12.1      exit 0 at 4.0 s   python3 -m app"
    );
    assert_eq!(
        row(&text, "201#2"),
        "    201#2  worker    30.0 MiB   60.0 MiB   60.0 MiB   +30.0 MiB   40.0 MiB    4.0 MiB  \
         3.12.1      SIGKILL at 7.0 s  python3 -m app"
    );
    assert_eq!(
        row(&text, "202.0"),
        "    202.0  worker    30.0 MiB   90.0 MiB   90.0 MiB   +60.0 MiB   60.0 MiB        0 B  \
         3.12.1      exec'd at 6.0 s   python3 etl.py"
    );
    assert_eq!(
        row(&text, "202.1"),
        "    202.1  helper         0 B    1.0 MiB    1.0 MiB    +1.0 MiB          -        0 B  \
         not Python  alive             sleep 60"
    );
    assert_eq!(
        row(&text, "200"),
        "      200  master    30.0 MiB   30.0 MiB   30.0 MiB         0 B   10.0 MiB        0 B  \
         3.12.1      alive             python3 -m app"
    );
    let order: Vec<&str> = table
        .lines()
        .skip(2)
        .map(|l| l[..9].trim())
        .take(5)
        .collect();
    assert_eq!(order, ["202.0", "201", "201#2", "202.1", "200"], "{table}");
    assert!(
        table.lines().nth(7).unwrap().contains(
            "N#2: the 2nd process the kernel gave tgid N in this trace; \
             N.1: its image after an execve (N.0 before it)"
        ),
        "{table}"
    );
    assert!(
        text.contains(
            "Total: 5 process images (1 master, 3 workers, 1 helper; at most 3 alive at once); \
             RSS of the live processes 31.0 MiB at the end"
        ),
        "{text}"
    );
}

#[test]
fn the_header_says_how_the_command_of_run_ended() {
    let mut report = server_diagnosed();
    let ended = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("memtrace: the command ended"))
            .map(str::to_owned)
    };
    assert_eq!(ended(&render_text(&report, 10)), None, "`record`: no line");
    let cases = [
        (
            ExitStatus::Code { code: 3 },
            "exit 3 (memtrace exits with 3",
        ),
        (
            ExitStatus::Signal {
                signal: 9,
                core_dumped: false,
                oom_killed: false,
            },
            "SIGKILL (memtrace exits with 137",
        ),
        (
            ExitStatus::Signal {
                signal: 11,
                core_dumped: true,
                oom_killed: false,
            },
            "SIGSEGV (core dumped) (memtrace exits with 139",
        ),
    ];
    for (status, expected) in cases {
        report.report.meta.command_status = Some(status);
        let text = render_text(&report, 10);
        assert_eq!(
            ended(&text),
            Some(format!(
                "memtrace: the command ended: {expected}, as a shell would)"
            )),
            "{text}"
        );
        // Right under the line that names the command.
        let first_lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("memtrace: traced"))
            .take(2)
            .collect();
        assert_eq!(
            ended(first_lines[1]).as_deref(),
            Some(first_lines[1]),
            "{text}"
        );
    }
}

#[test]
fn a_reused_tgid_is_two_rows_each_with_its_own_numbers() {
    let text = render_text(&lifecycle_diagnosed(), 10);
    let first = row(&text, "201");
    let second = row(&text, "201#2");
    assert!(
        first.contains("+40.0 MiB") && first.contains("exit 0"),
        "{first}"
    );
    assert!(
        second.contains("+30.0 MiB") && second.contains("SIGKILL"),
        "{second}"
    );
}

#[test]
fn an_execd_image_is_its_own_row() {
    let text = render_text(&lifecycle_diagnosed(), 10);
    let before = row(&text, "202.0");
    let after = row(&text, "202.1");
    assert!(before.contains("exec'd at 6.0 s"), "{before}");
    assert!(before.ends_with("python3 etl.py"), "{before}");
    assert!(after.contains("not Python"), "{after}");
    assert!(after.ends_with("sleep 60"), "{after}");
}

#[test]
fn no_legend_without_reused_tgids_or_execs() {
    let text = render_text(&server_diagnosed(), 10);
    let table = section(&text, PROCESSES);
    // Title, header, two rows, then the totals.
    assert!(
        table.lines().nth(4).unwrap().starts_with("Total: "),
        "{table}"
    );
    assert!(!text.contains("N#2"), "{text}");
}

#[test]
fn merged_paths_show_all_three_measures_ranked_by_held_at_peak() {
    let text = render_text(&lifecycle_diagnosed(), 10);
    let expected = "Top paths across processes (sampled, summed over processes; \
                    one per Python stack, the native frames under it as its children; \
                    ranked by bytes held at peak, share of all held at peak; \
                    ±PEAK: one standard error of HELD AT PEAK from sampling; \
                    innermost frame first)\n\
                    \x20    HELD AT PEAK   HELD AT END       GROWN   SHARE       ±PEAK  SAMPLES  IN\n\
                    \x20 1.     60.0 MiB      60.0 MiB    60.0 MiB   40.0%        ±0 B        1  \
                    1 process: tgid 202.0\n\
                    \x20       load (etl.py:12)\n\
                    \x20       <module> (etl.py:1)\n\
                    \x20       native: malloc 100.0%\n\
                    \x20 2.     50.0 MiB      40.0 MiB   120.0 MiB   33.3%        ±0 B        3  \
                    1 process: tgid 201\n\
                    \x20       handle_job (app/jobs.py:20)\n\
                    \x20       <module> (app/worker.py:1)\n\
                    \x20       native: malloc 100.0%\n\
                    \x20 3.     40.0 MiB      30.0 MiB    40.0 MiB   26.7%        ±0 B        3  \
                    2 processes: tgid 201, 201#2\n\
                    \x20       append (app/cache.py:42)\n\
                    \x20       <module> (app/worker.py:1)\n\
                    \x20       native: PyList_Append 100.0%\n";
    assert_eq!(section(&text, MERGED), expected, "{text}");
    assert!(text.find(MERGED) < text.find(PER_PROCESS), "{text}");
    assert!(text.find("Total: 5") < text.find(MERGED), "{text}");
}

#[test]
fn the_weight_reranks_the_paths_and_their_shares() {
    let report = lifecycle_diagnosed();
    let grown = render_with(&report, 10, Weight::Grown);
    let merged = section(&grown, MERGED);
    assert!(
        merged.starts_with(
            "Top paths across processes (sampled, summed over processes; \
             one per Python stack, the native frames under it as its children; \
             ranked by bytes grown, share of all grown;"
        ),
        "{merged}"
    );
    // handle_job: 120 of 220 MiB grown.
    assert!(
        merged.contains(
            "  1.     50.0 MiB      40.0 MiB   120.0 MiB   54.5%        ±0 B        3  \
             1 process: tgid 201\n\
             \x20       handle_job"
        ),
        "{merged}"
    );
    let end = render_with(&report, 10, Weight::End);
    let per_process = section(&end, PER_PROCESS);
    let ranks: Vec<&str> = per_process
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains(". ") && l.contains("tgid"))
        .collect();
    // append in 201 holds nothing at the end: left out.
    assert_eq!(
        ranks,
        [
            "  1.     60.0 MiB      60.0 MiB    60.0 MiB  100.0%        ±0 B        1  tgid 202.0  python3 etl.py",
            "  2.     50.0 MiB      40.0 MiB   120.0 MiB  100.0%        ±0 B        3  tgid 201  python3 -m app",
            "  3.     30.0 MiB      30.0 MiB    30.0 MiB  100.0%        ±0 B        2  tgid 201#2  python3 -m app",
        ],
        "{per_process}"
    );
}

#[test]
fn per_process_paths_rank_each_image_apart() {
    let text = render_text(&lifecycle_diagnosed(), 10);
    let per_process = section(&text, PER_PROCESS);
    let ranks: Vec<&str> = per_process
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains(". ") && l.contains("tgid"))
        .collect();
    assert_eq!(
        ranks,
        [
            "  1.     60.0 MiB      60.0 MiB    60.0 MiB  100.0%        ±0 B        1  tgid 202.0  python3 etl.py",
            "  2.     50.0 MiB      40.0 MiB   120.0 MiB   83.3%        ±0 B        3  tgid 201  python3 -m app",
            "  3.     30.0 MiB      30.0 MiB    30.0 MiB  100.0%        ±0 B        2  tgid 201#2  python3 -m app",
            "  4.     10.0 MiB           0 B    10.0 MiB   16.7%        ±0 B        1  tgid 201  python3 -m app",
        ],
        "{per_process}"
    );
    assert!(
        per_process.starts_with(
            "Top paths per process (sampled; ranked by bytes held at peak, share of the \
             process's held at peak; ±PEAK: one standard error of HELD AT PEAK from sampling; \
             innermost frame first)\n\
             \x20    HELD AT PEAK   HELD AT END       GROWN   SHARE       ±PEAK  SAMPLES  PROCESS\n"
        ),
        "{per_process}"
    );
}

#[test]
fn the_prefork_leak_ranks_by_its_total_over_workers() {
    let text = render_text(&prefork_diagnosed(), 10);
    let merged = section(&text, MERGED);
    assert!(
        merged.contains(
            "  1.     30.0 MiB      30.0 MiB    30.0 MiB   65.2%        ±0 B        3  \
             3 processes: tgid 101, 102, 103\n\
             \x20       append (app/cache.py:42)"
        ),
        "{merged}"
    );
    let per_process = section(&text, PER_PROCESS);
    assert!(
        per_process.contains("  1.     16.0 MiB      16.0 MiB    16.0 MiB   61.5%        ±0 B"),
        "{per_process}"
    );
}

#[test]
fn top_limits_the_merged_paths_and_caps_the_per_process_ones() {
    let text = render_text(&prefork_diagnosed(), 1);
    assert!(
        section(&text, MERGED).contains("  1.     30.0 MiB"),
        "{text}"
    );
    assert!(!section(&text, MERGED).contains("  2. "), "{text}");
    assert!(
        section(&text, PER_PROCESS).contains("  1.     16.0 MiB"),
        "{text}"
    );
    assert!(!section(&text, PER_PROCESS).contains("  2. "), "{text}");

    let text = render_text(&many_paths_report(8), 7);
    let ranks = |title| {
        section(&text, title)
            .lines()
            .filter(|l| l.contains("MiB") && l.contains("%"))
            .count()
    };
    assert_eq!(ranks(MERGED), 7, "{text}");
    assert_eq!(ranks(PER_PROCESS), MAX_PER_PROCESS_PATHS, "{text}");
}

#[test]
fn no_path_of_the_weight_says_so_in_both_sections() {
    let text = render_text(&many_paths_report(0), 10);
    let none = "  none: no sampled path has bytes held at peak";
    assert!(section(&text, MERGED).contains(none), "{text}");
    assert!(section(&text, PER_PROCESS).contains(none), "{text}");
}

#[test]
fn long_process_lists_are_cut_and_counted() {
    let report = many_processes_report(11);
    let ids: Vec<ProcessId> = (0..11).map(ProcessId).collect();
    assert_eq!(
        text::process_list(&report, &ids[..1], MAX_TGIDS_SHOWN),
        "tgid 1"
    );
    assert_eq!(
        text::process_list(&report, &ids[..3], MAX_TGIDS_SHOWN),
        "tgid 1, 2, 3"
    );
    assert_eq!(
        text::process_list(&report, &ids, MAX_TGIDS_SHOWN),
        "tgid 1, 2, 3, 4, 5, 6, 7, 8, … 3 more"
    );
    assert_eq!(
        text::process_list(&report, &[ProcessId(99)], MAX_TGIDS_SHOWN),
        "tgid ?"
    );
}

/// One process with `n` growth paths of distinct sizes.
fn many_paths_report(n: u32) -> Diagnosed {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start(1, None, Role::Root, 0));
    for i in 0..n {
        let stack = [py(&format!("f{i}"), "m.py", i), native("malloc")];
        let weight_bytes = u64::from(i + 1) * MIB;
        let stack_id = sample(&mut agg, id, MemoryEvent::AnonGrowth, weight_bytes, &stack);
        agg.peak_held(id, stack_id, weight_bytes);
    }
    diagnose(agg.finish(0, RunMeta::default()))
}

/// `n` processes with tgids 1..=n.
fn many_processes_report(n: u32) -> Report {
    let mut agg = Aggregator::new(0);
    for tgid in 1..=n {
        agg.process_started(ProcessStart {
            ..start(tgid, None, Role::Root, 0)
        });
    }
    agg.finish(0, RunMeta::default())
}

#[test]
fn cow_paths_records_warnings_and_files_are_listed() {
    let text = render_text(&server_diagnosed(), 10);
    assert_eq!(
        section(&text, "Top copy-on-write paths"),
        "Top copy-on-write paths (sampled pages shared with the parent, un-shared by a \
         write; share of the process's)\n\
         \x20 1.    4.0 KiB  100.0%  tgid 101  python3 server.py\n\
         \x20       append (app/cache.py:42)\n\
         \x20       handle (app/views.py:10)\n\
         \x20       <module> (server.py:1)\n\
         \x20       native: PyList_Append\n",
        "{text}"
    );
    assert!(
        text.contains("Records: 3 read, 2 dropped (ring buffer full), 0 undecodable"),
        "{text}"
    );
    assert!(
        text.contains("warning: 2 records were dropped because the ring buffer was full"),
        "{text}"
    );
    assert!(
        text.contains(
            "\n\nFiles written\n  JSON report:  /out/memtrace-1.json\n  \
             capture:      /out/memtrace-1.capture\n  draw it again\n\nVerdict: "
        ),
        "{text}"
    );
}

#[test]
fn verbose_puts_every_finding_first_with_names() {
    let report = lifecycle_diagnosed();
    let options = RenderOptions {
        verbose: true,
        ..RenderOptions::default()
    };
    let mut out = Vec::new();
    render(&report, &options, &written(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("Diagnosis\n  1. "), "{text}");
    let first = &report.diagnosis[0];
    let line = text.lines().nth(1).unwrap();
    assert!(
        line.contains(&text::scope_text(&report, first.scope)),
        "{line}"
    );
    assert!(line.ends_with(&first.summary), "{line}");
}

#[test]
fn deep_stacks_are_cut_and_counted() {
    let mut frames: Vec<Frame> = (0..20).map(|i| py(&format!("f{i}"), "m.py", i)).collect();
    frames.push(native("malloc"));
    let mut out = Vec::new();
    frame_lines(&frames, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), MAX_FRAMES_SHOWN + 2, "{text}");
    assert_eq!(lines[0].trim(), "f19 (m.py:19)");
    assert_eq!(lines[MAX_FRAMES_SHOWN].trim(), "… 8 more outer frames");
    assert_eq!(lines[MAX_FRAMES_SHOWN + 1].trim(), "native: malloc");
}

#[test]
fn the_verdict_comes_last_and_fits_one_screen() {
    let report = prefork_diagnosed();
    let text = render_compact(&report);
    assert!(!text.contains("Top paths per process"), "{text}");
    assert!(!text.contains("Top copy-on-write paths"), "{text}");
    assert!(!text.contains("Diagnosis\n"), "{text}");
    let verdict = &text[text.rfind("\nVerdict: ").expect("a verdict") + 1..];
    assert!(
        verdict.lines().count() <= verdict::MAX_VERDICT_LINES,
        "{verdict}"
    );
    // The fixture has no RSS readings: one weak tree-wide cause, named.
    assert!(
        verdict.contains("  1. no growth in the process tree (3 workers)\n"),
        "{verdict}"
    );
    assert!(
        verdict.contains(&format!("next:     {}\n", report.causes[0].next_step)),
        "{verdict}"
    );
    // A weak cause says why, and what would settle it, last.
    assert!(
        verdict.ends_with("     weak:     no RSS readings\n"),
        "{verdict}"
    );
}

#[test]
fn one_python_line_is_one_path_with_its_native_frames_as_children() {
    let mut agg = Aggregator::new(1_000);
    let id = agg.process_started(start(300, None, Role::Root, 1_000));
    let line = |native_frame: &str| {
        vec![
            py("<module>", "app.py", 1),
            py("render_report", "app.py", 84),
            native(native_frame),
        ]
    };
    for (frame, mib) in [("_PyObject_Malloc", 30), ("allocate_from_new_pool", 10)] {
        let stack = sample(
            &mut agg,
            id,
            MemoryEvent::AnonGrowth,
            mib * MIB,
            &line(frame),
        );
        agg.peak_held(id, stack, mib * MIB);
    }
    let report = diagnose(agg.finish(5_000, RunMeta::default()));
    let text = render_text(&report, 10);
    let merged = section(&text, MERGED);
    let entries: Vec<&str> = merged
        .lines()
        .filter(|l| l.contains(" 1 process: "))
        .collect();
    assert_eq!(entries.len(), 1, "{merged}");
    assert!(entries[0].starts_with("  1.     40.0 MiB"), "{merged}");
    assert!(
        merged.contains(
            "        render_report (app.py:84)\n        <module> (app.py:1)\n        \
             native: _PyObject_Malloc 75.0%, allocate_from_new_pool 25.0%\n"
        ),
        "{merged}"
    );
}

#[test]
fn brief_helpers_are_summed_on_one_line() {
    let mut agg = Aggregator::new(1_000);
    let python = PythonStatus::Python {
        version: "3.12.1".to_owned(),
    };
    let master = agg.process_started(start(400, None, Role::Root, 1_000));
    agg.python_status(master, python.clone());
    let worker = agg.process_started(start(401, Some(master), Role::Worker, 2_000));
    agg.python_status(worker, python);
    for tgid in 402..405 {
        let helper = agg.process_started(ProcessStart {
            counters: rss(MIB, 0),
            ..start(tgid, Some(master), Role::Worker, 3_000)
        });
        agg.python_status(helper, PythonStatus::NotPython);
        agg.process_exited(
            helper,
            100_000_000,
            Some(ExitStatus::Code { code: 0 }),
            Some(&rss(3 * MIB, 0)),
        );
    }
    let report = diagnose(agg.finish(2_000_000_000, RunMeta::default()));
    let text = render_text(&report, 10);
    let table = section(&text, PROCESSES);
    assert!(table.contains("\n      401  worker "), "{table}");
    assert!(!table.contains("\n      402 "), "{table}");
    assert!(
        table.contains(
            "        …  3 helpers that lived under 1.0 s (shells, launch shims; no Python): \
             +6.0 MiB of RSS growth in all, at most 2.0 MiB each; every one is in the JSON"
        ),
        "{table}"
    );
    assert_eq!(report.processes.len(), 5, "the report keeps every row");
}

/// The header line under the first one, about what attaching hid.
fn attach_header(report: &Diagnosed) -> Option<String> {
    let text = render_text(report, 10);
    let first = text
        .lines()
        .position(|l| l.starts_with("memtrace: traced `"))
        .unwrap();
    text.lines()
        .nth(first + 1)
        .filter(|l| l.starts_with("memtrace: "))
        .map(str::to_owned)
}

#[test]
fn the_header_says_what_attaching_missed() {
    let mut report = lifecycle_diagnosed();
    assert_eq!(
        attach_header(&report).as_deref(),
        Some(
            "memtrace: growth before 03:04:05 UTC (attaching took 1.4 s) is not seen: RSS START \
             is what each process held then"
        )
    );
    report.report.meta.command_held = true;
    assert_eq!(
        attach_header(&report).as_deref(),
        Some(
            "memtrace: the command was held before its first instruction until tracing was \
             attached (attaching took 1.4 s): none of its growth is missed"
        )
    );
    // Captures of older versions did not measure it: nothing is claimed.
    report.report.meta.attach_ns = 0;
    assert_eq!(attach_header(&report), None);
}

#[test]
fn a_python_path_lists_its_largest_native_children_and_sums_the_rest() {
    let mut agg = Aggregator::new(0);
    let id = agg.process_started(start(1, None, Role::Root, 0));
    // One Python line whose growth ended in 12 native functions of 1..=12
    // MiB (78 MiB in all).
    for i in 1..=12_u64 {
        let stack = [py("load", "m.py", 3), native(&format!("n{i}"))];
        let stack_id = sample(&mut agg, id, MemoryEvent::AnonGrowth, i * MIB, &stack);
        agg.peak_held(id, stack_id, i * MIB);
    }
    let text = render_text(&diagnose(agg.finish(0, RunMeta::default())), 10);
    let natives = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("native: "))
        .unwrap_or_else(|| panic!("no native line:\n{text}"));
    let shown: Vec<&str> = natives.split(", ").collect();
    assert_eq!(shown.len(), MAX_NATIVES_SHOWN + 1, "{natives}");
    assert!(shown[0].starts_with("n12 "), "{natives}");
    // n1..=n4: 10 of 78 MiB.
    assert_eq!(shown[MAX_NATIVES_SHOWN], "… 4 more 12.8%", "{natives}");
}
