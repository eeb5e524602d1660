//! Every report format read back by the program its users open it with:
//! the pprof file by `go tool pprof -top`, the speedscope file by the
//! speedscope web app (npm package `speedscope`) in headless chromium, the
//! flame graph SVG by an XML parser, the HTML report by headless chromium
//! (DOM dump and screenshot, no console errors). The report is built from a
//! synthetic pre-fork run through the public aggregation API, so no root and
//! no eBPF are needed. A test whose program is missing prints why and
//! passes, or fails with `MEMTRACE_REQUIRE_ALL=1`; `cargo xtask test`
//! installs them all first (and, as root, sets that variable).

#[path = "common/skip.rs"]
mod skip;
#[path = "common/svg.rs"]
mod svg;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memtrace::aggregate::{Aggregator, Frame, MemorySample, ProcessStart, Report, Role, RunMeta};
use memtrace::cli::Format;
use memtrace::report::{self, RenderOptions};
use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES};
use svg::{parse_svg, titles};

const MIB: u64 = 1024 * 1024;
const S: u64 = 1_000_000_000;
/// CLOCK_MONOTONIC time at which the synthetic run starts.
const START_NS: u64 = 1_000;

const CHROMIUM: &str = "/usr/bin/chromium";
/// Flags for a headless chromium that touches no network and no profile.
const CHROMIUM_FLAGS: [&str; 11] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--hide-scrollbars",
];

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

/// A pre-fork service traced for 6 s: master 100 forks workers 101 (at 1 s)
/// and 102 (at 2 s); both grow in `append (app/cache.py:42)`, 101 also in
/// `parse (app/io.py:7)`; 101 exits at 5 s. Diagnosed like a real run.
fn prefork_run() -> Report {
    let mut agg = Aggregator::new(START_NS);
    for (tgid, parent_tgid, role, at_ns) in [
        (100, None, Role::Root, 0),
        (101, Some(100), Role::Worker, S),
        (102, Some(100), Role::Worker, 2 * S),
    ] {
        agg.process_started(ProcessStart {
            tgid,
            parent_tgid,
            role,
            cmdline: "gunicorn app:wsgi".to_owned(),
            ts_ns: START_NS + at_ns,
        });
    }
    let leak = vec![
        py("<module>", "server.py", 1),
        py("handle", "app/views.py", 10),
        py("append", "app/cache.py", 42),
        native("PyList_Append"),
    ];
    let parse = vec![
        py("<module>", "server.py", 1),
        py("parse", "app/io.py", 7),
        native("malloc"),
    ];
    for step in 0..=12u64 {
        let t_ns = START_NS + step * S / 2;
        agg.counters(100, t_ns, &counters(20 * MIB));
        for (tgid, born_step) in [(101, 2), (102, 4)] {
            if step < born_step || (tgid == 101 && step > 10) {
                continue;
            }
            let grown = (step - born_step) * 4 * MIB;
            agg.counters(tgid, t_ns, &counters(20 * MIB + grown));
            let sample = |stack: &Vec<Frame>, weight_bytes| MemorySample {
                tgid,
                ts_ns: t_ns,
                event: MemoryEvent::AnonGrowth,
                weight_bytes,
                stack: stack.clone(),
            };
            agg.memory(sample(&leak, 3 * MIB));
            if tgid == 101 {
                agg.memory(sample(&parse, MIB));
            }
        }
    }
    agg.process_exited(101, START_NS + 5 * S);
    let mut report = agg.finish(
        START_NS + 6 * S,
        RunMeta {
            command: "gunicorn app:wsgi".to_owned(),
            duration_ns: 6 * S,
            records: 40,
            sample_interval_bytes: 512 * 1024,
            ..RunMeta::default()
        },
    );
    report.diagnosis = memtrace::diagnose::diagnose(&report);
    report
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
    skip::skip(&format!(
        "{test}: `{}` is missing (cargo xtask test installs it)",
        program.display()
    ));
    false
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn go_tool_pprof_reads_the_profile() {
    if !available(Path::new("/usr/bin/go"), "go_tool_pprof_reads_the_profile") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = rendered(
        Format::Pprof,
        &RenderOptions::default(),
        dir.path(),
        "memtrace.pb.gz",
    );
    let pprof = |args: &[&str]| {
        Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&file)
            .env("HOME", dir.path())
            .output()
            .unwrap()
    };
    let top = pprof(&["-top"]);
    let text = stdout_of(&top);
    assert!(top.status.success(), "{text}\n{}", stderr_of(&top));
    // Sampled growth: leak 3 MiB x (9 + 9 steps) = 54 MiB, parse 9 MiB.
    assert!(text.contains("Type: growth_space"), "{text}");
    let leaf = text
        .lines()
        .find(|l| l.trim_end().ends_with("PyList_Append"))
        .unwrap_or_else(|| panic!("no PyList_Append row in:\n{text}"));
    assert!(leaf.contains("54MB"), "{leaf}");
    let by_function = pprof(&["-top", "-cum"]);
    let text = stdout_of(&by_function);
    assert!(text.contains(" append"), "{text}");
    assert!(text.contains(" parse"), "{text}");
    let tags = pprof(&["-tags"]);
    let text = stdout_of(&tags);
    assert!(tags.status.success(), "{}", stderr_of(&tags));
    assert!(
        text.contains("tgid") && text.contains("101") && text.contains("102"),
        "{text}"
    );
    assert!(text.contains("gunicorn app:wsgi"), "{text}");
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
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("gunicorn app:wsgi (tgid 102)")),
            "{titles:?}"
        );
    }
    let per_process = report::render_per_process(
        &prefork_run(),
        Format::Flamegraph,
        &RenderOptions::default(),
        dir.path(),
        report::PER_PROCESS_STEM,
    )
    .unwrap();
    assert_eq!(per_process.len(), 3);
    for file in per_process {
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(parse_svg(&text).root_element().tag_name().name(), "svg");
    }
}

/// Runs headless chromium on `url` with `extra` flags; returns its output.
fn chromium(url: &str, extra: &[&str]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new(CHROMIUM)
        .args(CHROMIUM_FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap()
}

/// Console lines chromium logged for errors thrown by page scripts.
fn script_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") && (l.contains("Uncaught") || l.contains("Error")))
        .collect()
}

#[test]
fn speedscope_web_app_loads_the_profile() {
    let index = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-tools/node_modules/speedscope/dist/release/index.html");
    let test = "speedscope_web_app_loads_the_profile";
    if !available(Path::new(CHROMIUM), test) || !available(&index, test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = rendered(
        Format::Speedscope,
        &RenderOptions::default(),
        dir.path(),
        "memtrace.speedscope.json",
    );
    // speedscope's own command-line tool opens `index.html#localProfilePath=`
    // a script that calls `speedscope.loadFileFromBase64(name, base64)`.
    let json = std::fs::read_to_string(&file).unwrap();
    let script = dir.path().join("load.js");
    std::fs::write(
        &script,
        format!(
            "speedscope.loadFileFromBase64(\"memtrace.speedscope.json\", \
             btoa(unescape(encodeURIComponent({}))));\n",
            serde_json::to_string(&json).unwrap()
        ),
    )
    .unwrap();
    let url = format!(
        "file://{}#localProfilePath={}",
        index.canonicalize().unwrap().display(),
        script.display()
    );
    let dom = chromium(&url, &["--virtual-time-budget=10000", "--dump-dom"]);
    let (dom_text, stderr) = (stdout_of(&dom), stderr_of(&dom));
    assert!(dom.status.success(), "{stderr}");
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    assert!(!dom_text.contains("Something went wrong"), "{dom_text}");
    // The profile selector names the process shown first (tgid 101 grew
    // most) and counts the profiles.
    assert!(
        dom_text.contains("gunicorn app:wsgi (tgid 101)"),
        "{dom_text}"
    );
    let shot = artifacts_dir().join("speedscope.png");
    let screenshot = chromium(
        &url,
        &[
            "--virtual-time-budget=10000",
            "--window-size=1280,720",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(screenshot.status.success(), "{}", stderr_of(&screenshot));
    assert!(shot.metadata().unwrap().len() > 0);
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
    let url = format!("file://{}", file.canonicalize().unwrap().display());
    let dom = chromium(&url, &["--dump-dom"]);
    let (dom_text, stderr) = (stdout_of(&dom), stderr_of(&dom));
    assert!(dom.status.success(), "{stderr}");
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    for needle in [
        "id=\"diagnosis\"",
        "id=\"rss-tgid-100\"",
        "class=\"rss-line\"",
        "forked tgid 101",
        "exited at 5.0 s",
        "id=\"frames\"",
        "append (app/cache.py:42)",
    ] {
        assert!(
            dom_text.contains(needle),
            "no {needle} in the DOM:\n{dom_text}"
        );
    }
    let shot = dir.join("html-report.png");
    let screenshot = chromium(
        &url,
        &[
            "--window-size=1280,3400",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(screenshot.status.success(), "{}", stderr_of(&screenshot));
    assert!(script_errors(&stderr_of(&screenshot)).is_empty());
    println!("screenshot: {}", shot.display());
}
