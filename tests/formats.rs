//! Every report format read back by the program its users open it with:
//! the pprof file by `go tool pprof`, the speedscope file by the speedscope
//! web app (npm package `speedscope`) in headless chromium, the flame graph
//! SVG by an XML parser, the HTML report by headless chromium (DOM dump and
//! screenshot, no console errors; at 1400 x 900, the verdict, the RSS chart
//! and the top paths above the fold and the process table after them, mark
//! labels that do not overlap, the flame graph's title inside it and its
//! zoom and search working).
//!
//! Most tests render a synthetic pre-fork run built through the public
//! aggregation API (no root, no eBPF; exact numbers to check the consumers'
//! reading against): workers forked 1 s apart, one that exits and a new
//! process the kernel gives its tgid again, paths whose bytes held at the
//! high-water mark, held at the end and grown differ. One test traces a
//! real Python pre-fork master that recycles workers on reused pids with
//! the real memtrace binary (root, eBPF) and hands every format it writes
//! to the same programs.
//!
//! A test whose program is missing prints why and passes, or fails with
//! `MEMTRACE_REQUIRE_ALL=1`; `cargo xtask test` installs them all first
//! (and, as root, sets that variable).

#[path = "formats/browser.rs"]
mod browser;
#[expect(
    dead_code,
    reason = "formats.rs reads the files memtrace writes itself: it runs no `common::trace`"
)]
mod common;
#[path = "common/svg.rs"]
mod svg;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use browser::{
    assert_first_screen, chromium, html_dom, speedscope_dom, speedscope_index, CHROMIUM, SCREEN,
};
use memtrace::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, ProcessId, ProcessStart, Role, RunMeta, SampledBytes,
    StackId,
};
use memtrace::diagnose::{self, Diagnosed};
use memtrace::report::Format;
use memtrace::report::{self, RenderOptions};
use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES};
use serde_json::Value;
use svg::{parse_svg, titles};

const MIB: u64 = 1024 * 1024;
const S: u64 = 1_000_000_000;
/// CLOCK_MONOTONIC time at which the synthetic run starts.
const START_NS: u64 = 1_000;

const GO: &str = "/usr/bin/go";

fn py(function: &str, file: &str, line: u32) -> Frame {
    Frame::Python {
        function: function.to_owned(),
        file: file.to_owned(),
        line,
    }
}

fn native(symbol: &str) -> Frame {
    Frame::Native {
        symbol: symbol.to_owned(),
        module: None,
    }
}

fn counters(anon_bytes: u64) -> ProcessCounters {
    let mut c = ProcessCounters {
        rss_known: (1 << MM_ANONPAGES) | (1 << MM_FILEPAGES),
        ..ProcessCounters::default()
    };
    c.rss_bytes[MM_ANONPAGES] = anon_bytes;
    c.rss_bytes[MM_FILEPAGES] = 8 * MIB;
    c
}

/// `grown` bytes of anonymous growth on `stack` in `id` at `ts_ns`, of which
/// `held` stay held (a held change of `held`).
fn grow(agg: &mut Aggregator, id: ProcessId, ts_ns: u64, stack: StackId, grown: u64, held: u64) {
    let bytes = SampledBytes {
        held_bytes: i64::try_from(held).unwrap(),
        ..SampledBytes::from_event(MemoryEvent::AnonGrowth, grown)
    };
    agg.path_delta(id, ts_ns, stack, bytes);
}

/// A pre-fork service traced for 6 s: master 100 (flat, 20 MiB anonymous)
/// forks worker 101 at 1 s and worker 102 at 2 s; both grow and keep 3 MiB
/// per half second in `append (app/cache.py:42)` (27 MiB each), and 101
/// also touches a 1 MiB buffer again every half second in `parse
/// (app/io.py:7)` (9 MiB grown, 1 MiB held). 101 begins to exit at 5 s
/// (exit 0); the kernel gives tgid 101 to a new worker at 5.5 s, which
/// keeps 6 MiB in `append`. Diagnosed like a real run.
fn prefork_run() -> Diagnosed {
    let mut agg = Aggregator::new(START_NS);
    let start = |tgid, boot_s, parent, role, at_ns| ProcessStart {
        tgid,
        start_time_ns: boot_s * S,
        parent,
        role,
        cmdline: "gunicorn app:wsgi".to_owned(),
        ts_ns: START_NS + at_ns,
        counters: counters(20 * MIB),
        sharing: None,
    };
    let master = agg.process_started(start(100, 100, None, Role::Root, 0));
    let leak = agg.intern(vec![
        py("<module>", "server.py", 1),
        py("handle", "app/views.py", 10),
        py("append", "app/cache.py", 42),
        native("PyList_Append"),
    ]);
    let parse = agg.intern(vec![
        py("<module>", "server.py", 1),
        py("parse", "app/io.py", 7),
        native("malloc"),
    ]);
    // (id, first step, last step).
    let mut workers: Vec<(ProcessId, u64, u64)> = Vec::new();
    for step in 0..=12u64 {
        let t_ns = START_NS + step * S / 2;
        match step {
            2 => workers.push((
                agg.process_started(start(101, 101, Some(master), Role::Worker, step * S / 2)),
                2,
                10,
            )),
            4 => workers.push((
                agg.process_started(start(102, 102, Some(master), Role::Worker, step * S / 2)),
                4,
                12,
            )),
            11 => workers.push((
                agg.process_started(start(101, 105, Some(master), Role::Worker, step * S / 2)),
                11,
                12,
            )),
            _ => {}
        }
        agg.counters(master, t_ns, &counters(20 * MIB), None);
        for &(id, first, last) in &workers {
            if step > last {
                continue;
            }
            agg.counters(
                id,
                t_ns,
                &counters(20 * MIB + (step - first) * 3 * MIB),
                None,
            );
            grow(&mut agg, id, t_ns, leak, 3 * MIB, 3 * MIB);
            if first == 2 {
                let held = if step == first { MIB } else { 0 };
                grow(&mut agg, id, t_ns, parse, MIB, held);
            }
        }
        if step == 10 {
            let first = workers[0].0;
            agg.exit_began(first, t_ns, ExitBegin::PythonFinalize, &counters(44 * MIB));
            agg.process_exited(
                first,
                t_ns + S / 10,
                Some(ExitStatus::Code { code: 0 }),
                None,
            );
        }
    }
    let (first, second, reused) = (workers[0].0, workers[1].0, workers[2].0);
    agg.peak_held(first, leak, 27 * MIB);
    agg.peak_held(first, parse, MIB);
    agg.peak_held(second, leak, 27 * MIB);
    agg.peak_held(reused, leak, 6 * MIB);
    let report = agg.finish(
        START_NS + 6 * S,
        RunMeta {
            command: "gunicorn app:wsgi".to_owned(),
            duration_ns: 6 * S,
            records: 40,
            sample_interval_bytes: 512 * 1024,
            ..RunMeta::default()
        },
    );
    diagnose::diagnose(report)
}

/// Renders `format` of the synthetic run into `dir/name`.
fn rendered(format: Format, options: &RenderOptions, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let mut out = Vec::new();
    report::render(&prefork_run(), format, options, &mut out).unwrap();
    std::fs::write(&path, out).unwrap();
    path
}

/// A folder under the workspace's target/ for files a person may want to
/// look at after the run (screenshots).
fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/formats-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether `program` can be used; prints why the calling test skips if not.
fn available(program: &Path, test: &str) -> bool {
    if program.exists() {
        return true;
    }
    common::skip(&format!(
        "{test}: `{}` is missing (cargo xtask test installs it)",
        program.display()
    ));
    false
}

/// `go tool pprof ARGS FILE` (with its cache under `home`), expecting
/// success; returns its standard output.
fn pprof(file: &Path, home: &Path, args: &[&str]) -> String {
    let output = Command::new(GO)
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", home)
        .output()
        .unwrap();
    let text = common::stdout_of(&output);
    assert!(
        output.status.success(),
        "go tool pprof {args:?} failed:\n{text}\n{}",
        common::stderr_of(&output)
    );
    text
}

/// The `-top` row whose function is `function`.
fn top_row<'a>(top: &'a str, function: &str) -> &'a str {
    top.lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .unwrap_or_else(|| panic!("no {function} row in:\n{top}"))
}

#[test]
fn go_tool_pprof_reads_the_profile() {
    if !available(Path::new(GO), "go_tool_pprof_reads_the_profile") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let file = rendered(
        Format::Pprof,
        &RenderOptions::default(),
        dir.path(),
        "memtrace.pb.gz",
    );
    // Held at each image's high-water mark: append 27 + 27 + 6 MiB, parse
    // 1 MiB (a buffer touched again nine times).
    let top = pprof(&file, home, &["-top"]);
    assert!(top.contains("Type: peak_space"), "{top}");
    assert!(top_row(&top, "PyList_Append").contains("60MB"), "{top}");
    assert!(top_row(&top, "malloc").contains("1MB"), "{top}");
    let grown = pprof(&file, home, &["-top", "-sample_index=alloc_space"]);
    assert!(grown.contains("Type: alloc_space"), "{grown}");
    assert!(top_row(&grown, "malloc").contains("9MB"), "{grown}");
    let end = pprof(&file, home, &["-top", "-sample_index=inuse_space"]);
    // 101 held its 27 MiB until its exit began.
    assert!(top_row(&end, "PyList_Append").contains("60MB"), "{end}");
    let by_function = pprof(&file, home, &["-top", "-cum"]);
    assert!(by_function.contains(" append"), "{by_function}");
    assert!(by_function.contains(" parse"), "{by_function}");
    let tags = pprof(&file, home, &["-tags"]);
    for needle in [
        "tgid",
        "101",
        "102",
        "instance",
        "tgid 101#2",
        "gunicorn app:wsgi",
    ] {
        assert!(tags.contains(needle), "no {needle} in:\n{tags}");
    }
    // The second process on tgid 101 apart from the first.
    let reused = pprof(&file, home, &["-top", "-tagfocus=instance=tgid 101#2"]);
    assert!(
        top_row(&reused, "PyList_Append").contains("6MB"),
        "{reused}"
    );
    assert!(!reused.contains(" malloc"), "{reused}");
    let comments = pprof(&file, home, &["-comments"]);
    let diagnosed = prefork_run();
    assert!(
        comments.contains(&diagnosed.diagnosis[0].summary),
        "{comments}"
    );
}

#[test]
fn go_tool_pprof_shows_the_weight_as_the_default_sample_type() {
    if !available(
        Path::new(GO),
        "go_tool_pprof_shows_the_weight_as_the_default_sample_type",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let options = RenderOptions {
        weight: memtrace::aggregate::Weight::Grown,
        ..RenderOptions::default()
    };
    let file = rendered(Format::Pprof, &options, dir.path(), "grown.pb.gz");
    let top = pprof(&file, dir.path(), &["-top"]);
    assert!(top.contains("Type: alloc_space"), "{top}");
    assert!(top_row(&top, "malloc").contains("9MB"), "{top}");
}

#[test]
fn flame_graph_svg_is_well_formed_xml() {
    let dir = tempfile::tempdir().unwrap();
    for inverted in [false, true] {
        let options = RenderOptions {
            inverted,
            ..RenderOptions::default()
        };
        let file = rendered(Format::Flamegraph, &options, dir.path(), "memtrace.svg");
        let text = std::fs::read_to_string(&file).unwrap();
        let doc = parse_svg(&text);
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let titles = titles(&doc);
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("append (app/cache.py:42) (") && t.contains("bytes")),
            "{titles:?}"
        );
        for tower in ["(tgid 101) (", "(tgid 101#2) (", "(tgid 102) ("] {
            assert!(
                titles
                    .iter()
                    .any(|t| t.starts_with(&format!("gunicorn app:wsgi {tower}"))),
                "no tower {tower} in {titles:?}"
            );
        }
    }
    let per_process = report::render_per_process(
        &prefork_run(),
        Format::Flamegraph,
        &RenderOptions::default(),
        dir.path(),
        report::PER_PROCESS_STEM,
        false,
    )
    .unwrap();
    let mut names: Vec<String> = per_process
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "flamegraph-tgid-100.svg",
            "flamegraph-tgid-101-2.svg",
            "flamegraph-tgid-101.svg",
            "flamegraph-tgid-102.svg"
        ]
    );
    for file in per_process {
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(parse_svg(&text).root_element().tag_name().name(), "svg");
    }
}

#[test]
fn speedscope_web_app_loads_the_profile() {
    let test = "speedscope_web_app_loads_the_profile";
    if !available(Path::new(CHROMIUM), test) || !available(&speedscope_index(), test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = rendered(
        Format::Speedscope,
        &RenderOptions::default(),
        dir.path(),
        "memtrace.speedscope.json",
    );
    let shot = artifacts_dir().join("speedscope.png");
    let dom = speedscope_dom(&file, Some(&shot));
    // The profile selector names the image shown first: the first process
    // on tgid 101 holds the most at its peak (28 MiB).
    assert!(dom.contains("gunicorn app:wsgi (tgid 101)"), "{dom}");
}

#[test]
fn html_report_loads_in_chromium_with_chart_and_flame_graph() {
    if !available(
        Path::new(CHROMIUM),
        "html_report_loads_in_chromium_with_chart_and_flame_graph",
    ) {
        return;
    }
    let dir = artifacts_dir();
    let file = rendered(
        Format::Html,
        &RenderOptions::default(),
        &dir,
        "memtrace.html",
    );
    let dom = html_dom(&file, Some(&dir.join("html-report.png")));
    for needle in [
        "id=\"verdict\"",
        "id=\"rss-p0\"",
        "class=\"rss-line\"",
        "forked tgid 101 at 1.0 s",
        "forked tgid 101#2 at 5.5 s",
        "began to exit at 5.0 s (exit 0)",
        "<td>exit 0 at 5.0 s</td>",
        "<td>tgid 101#2</td>",
        "id=\"frames\"",
        "append (app/cache.py:42)",
    ] {
        assert!(dom.contains(needle), "no {needle} in the DOM:\n{dom}");
    }
}

#[test]
fn html_report_first_screen_at_1400x900() {
    let test = "html_report_first_screen_at_1400x900";
    if !available(Path::new(CHROMIUM), test) {
        return;
    }
    let dir = artifacts_dir();
    let file = rendered(
        Format::Html,
        &RenderOptions::default(),
        &dir,
        "memtrace-first-screen.html",
    );
    assert_first_screen(&file);
    let shot = dir.join("html-1400x900.png");
    let url = format!("file://{}", file.canonicalize().unwrap().display());
    let size = format!("--window-size={},{}", SCREEN.0, SCREEN.1);
    let screenshot = chromium(&url, &[&size, &format!("--screenshot={}", shot.display())]);
    assert!(
        screenshot.status.success(),
        "{}",
        common::stderr_of(&screenshot)
    );
    println!("screenshot: {}", shot.display());
    // Any other page, e.g. `memtrace report --format html` of a capture of
    // `cargo xtask demo`.
    if let Some(other) = std::env::var_os("MEMTRACE_FIRST_SCREEN_HTML") {
        assert_first_screen(Path::new(&other));
    }
}

/// The one file in `dir` whose name ends with `ending`.
fn file_ending(dir: &Path, ending: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ending))
        .collect();
    assert_eq!(found.len(), 1, "files ending in {ending}: {found:?}");
    found.into_iter().next().unwrap()
}

/// The workload's JSON line for `event`.
fn workload_event(stdout: &str, event: &str) -> Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v["event"] == event)
        .unwrap_or_else(|| panic!("the workload printed no `{event}` line:\n{stdout}"))
}

#[test]
fn a_real_trace_writes_files_their_programs_open() {
    let python = common::require_ebpf!(common::python_3_11());
    let test = "a_real_trace_writes_files_their_programs_open";
    let tools = [Path::new(GO), Path::new(CHROMIUM), &speedscope_index()];
    if !tools.iter().all(|tool| available(tool, test)) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Four workers on two pids, one after another, exit codes 0..=3.
    let output = common::memtrace()
        .args(["run", "--quiet", "--output-dir"])
        .arg(dir.path())
        .args(["--format", "pprof", "--format", "speedscope"])
        .args(["--format", "html", "--format", "flamegraph"])
        .arg("--")
        .arg(&python)
        .arg(common::script("recycle_workers.py"))
        .args(["--workers", "4", "--pid-slots", "2", "--base-mib", "16"])
        .args(["--worker-seconds", "0.5"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_success(&output, "memtrace run recycle_workers.py");
    let stdout = common::stdout_of(&output);
    let on_reused_pids = workload_event(&stdout, "exit")["reused"].as_u64().unwrap();
    // `.json` beside the folded stacks (`.speedscope.json` also ends so).
    let report = file_ending(dir.path(), ".folded").with_extension("json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let names: Vec<String> = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["instance"].as_u64() > Some(1))
        .map(|p| format!("tgid {}#{}", p["tgid"], p["instance"]))
        .collect();
    if on_reused_pids > 0 {
        assert!(!names.is_empty(), "no second process on a tgid in {json}");
    } else {
        println!("note: the workload could not steer its workers onto reused pids");
    }

    let home = dir.path();
    let profile = file_ending(dir.path(), ".pb.gz");
    let top = pprof(&profile, home, &["-top"]);
    assert!(top.contains("Type: peak_space"), "{top}");
    let cum = pprof(&profile, home, &["-top", "-cum"]);
    assert!(cum.contains(" work_in_child"), "{cum}");
    let tags = pprof(&profile, home, &["-tags"]);
    assert!(tags.contains("instance") && tags.contains("tgid"), "{tags}");
    for name in &names {
        assert!(tags.contains(name.as_str()), "no {name} in:\n{tags}");
    }

    let svg_file = std::fs::read_to_string(file_ending(dir.path(), ".svg")).unwrap();
    let doc = parse_svg(&svg_file);
    let titles = titles(&doc);
    assert!(
        titles.iter().any(|t| t.starts_with("work_in_child (")),
        "{titles:?}"
    );
    for name in &names {
        assert!(
            titles.iter().any(|t| t.contains(&format!("({name}) ("))),
            "no tower of {name} in {titles:?}"
        );
    }

    let dom = speedscope_dom(&file_ending(dir.path(), ".speedscope.json"), None);
    assert!(dom.contains("(tgid "), "{dom}");

    let html = file_ending(dir.path(), ".html");
    assert_first_screen(&html);
    let dom = html_dom(&html, None);
    for needle in [
        "id=\"rss-p0\"",
        "class=\"rss-line\"",
        "work_in_child",
        "exit 1 at",
    ] {
        assert!(dom.contains(needle), "no {needle} in the DOM:\n{dom}");
    }
    for name in &names {
        assert!(
            dom.contains(&format!("<td>{name}</td>")),
            "no row {name} in the DOM"
        );
    }
}
