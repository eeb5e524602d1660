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

#[expect(
    dead_code,
    reason = "formats.rs reads the files memtrace writes itself: it runs no `common::trace`"
)]
mod common;
#[path = "common/svg.rs"]
mod svg;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use memtrace::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, ProcessId, ProcessStart, Role, RunMeta, SampledBytes,
    StackId,
};
use memtrace::diagnose::{self, Diagnosed};
use memtrace::report::Format;
use memtrace::report::{self, RenderOptions};
use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES, MM_FILEPAGES};
use serde_json::{json, Value};
use svg::{parse_svg, titles};

const MIB: u64 = 1024 * 1024;
const S: u64 = 1_000_000_000;
/// CLOCK_MONOTONIC time at which the synthetic run starts.
const START_NS: u64 = 1_000;

const GO: &str = "/usr/bin/go";
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

/// The speedscope web app's `index.html`, installed by `cargo xtask test`.
fn speedscope_index() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-tools/node_modules/speedscope/dist/release/index.html")
}

/// Opens the speedscope `file` in the speedscope web app in headless
/// chromium, as speedscope's own command-line tool does (`index.html
/// #localProfilePath=` a script that calls
/// `speedscope.loadFileFromBase64(name, base64)`), asserting it loaded
/// without errors; returns the DOM. With `screenshot`, also saves one there.
fn speedscope_dom(file: &Path, screenshot: Option<&Path>) -> String {
    let json = std::fs::read_to_string(file).unwrap();
    let dir = tempfile::tempdir().unwrap();
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
        speedscope_index().canonicalize().unwrap().display(),
        script.display()
    );
    let dom = chromium(&url, &["--virtual-time-budget=10000", "--dump-dom"]);
    let (dom_text, stderr) = (common::stdout_of(&dom), common::stderr_of(&dom));
    assert!(dom.status.success(), "{stderr}");
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    assert!(!dom_text.contains("Something went wrong"), "{dom_text}");
    if let Some(shot) = screenshot {
        let screenshot = chromium(
            &url,
            &[
                "--virtual-time-budget=10000",
                "--window-size=1280,720",
                &format!("--screenshot={}", shot.display()),
            ],
        );
        assert!(
            screenshot.status.success(),
            "{}",
            common::stderr_of(&screenshot)
        );
        assert!(shot.metadata().unwrap().len() > 0);
    }
    dom_text
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

/// Opens the HTML report `file` in headless chromium, asserting it loaded
/// without script errors; returns the DOM. With `screenshot`, also saves
/// one there.
fn html_dom(file: &Path, screenshot: Option<&Path>) -> String {
    let url = format!("file://{}", file.canonicalize().unwrap().display());
    let dom = chromium(&url, &["--dump-dom"]);
    let (dom_text, stderr) = (common::stdout_of(&dom), common::stderr_of(&dom));
    assert!(dom.status.success(), "{stderr}");
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    if let Some(shot) = screenshot {
        let screenshot = chromium(
            &url,
            &[
                "--window-size=1280,3400",
                &format!("--screenshot={}", shot.display()),
            ],
        );
        assert!(
            screenshot.status.success(),
            "{}",
            common::stderr_of(&screenshot)
        );
        assert!(script_errors(&common::stderr_of(&screenshot)).is_empty());
        println!("screenshot: {}", shot.display());
    }
    dom_text
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

/// Width and height of the first screen the HTML report is laid out for.
const SCREEN: (u32, u32) = (1400, 900);

/// A script appended to a copy of the HTML report: once the page has
/// loaded, it records the page-coordinate boxes of the first screen's parts
/// and the process table, the boxes of the mark labels a reader sees
/// without hovering, the flame graph's and its title's boxes; then, through
/// inferno's script, searches for the widest frame that is not a root's
/// function and clicks it; and writes it all as JSON into
/// `<pre id="layout">`.
const LAYOUT_PROBE: &str = r##"<script>
window.addEventListener("load", function () { setTimeout(function () {
  function box(element) {
    if (!element) return null;
    var r = element.getBoundingClientRect();
    return { left: r.left + scrollX, top: r.top + scrollY,
             right: r.right + scrollX, bottom: r.bottom + scrollY };
  }
  var out = { width: innerWidth, scroll_width: document.documentElement.scrollWidth,
              boxes: {}, labels: [], hidden_labels: 0, marks: 0 };
  ["#verdict", "#rss-chart", "#top-paths", "#top-paths table", "#top-paths table tr:nth-child(2)",
   "#processes", "#flamegraph svg", "#flamegraph #title"].forEach(function (s) {
    out.boxes[s] = box(document.querySelector(s));
  });
  document.querySelectorAll(".mark").forEach(function () { out.marks += 1; });
  document.querySelectorAll(".mark-label").forEach(function (label) {
    if (getComputedStyle(label).visibility !== "hidden") out.labels.push(box(label));
    else out.hidden_labels += 1;
  });
  var width = function (g) { return parseInt(g.querySelector("rect").getAttribute("fg:w")); };
  var total = parseInt(document.getElementById("frames").getAttribute("total_samples"));
  var frames = Array.prototype.slice.call(document.querySelectorAll("#frames > g"));
  var narrower = frames.filter(function (g) {
    return width(g) < total && g.querySelector("title").textContent.indexOf("(tgid ") < 0;
  });
  narrower.sort(function (a, b) { return width(b) - width(a); });
  var frame = narrower[0] || frames[0];
  var name = frame.querySelector("title").textContent.split(" (")[0];
  out.searched = name;
  var prompted = 0;
  window.prompt = function () { prompted += 1; return null; };
  document.body.dispatchEvent(new KeyboardEvent("keydown", { keyCode: 70, ctrlKey: true, bubbles: true }));
  out.find_prompted = prompted;
  document.getElementById("search").dispatchEvent(new MouseEvent("click", { bubbles: true }));
  out.search_prompted = prompted;
  search(name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  out.matched = document.getElementById("matched").textContent;
  frame.querySelector("rect").dispatchEvent(new MouseEvent("click", { bubbles: true }));
  out.zoomed_width = parseFloat(frame.querySelector("rect").getAttribute("width"));
  out.unzoom_shown = !document.getElementById("unzoom").classList.contains("hide");
  var pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 0); });
</script>"##;

/// Lays out a copy of the HTML report `file` with [`LAYOUT_PROBE`] in
/// headless chromium at [`SCREEN`]; returns what the probe recorded.
fn html_layout(file: &Path) -> Value {
    let html = std::fs::read_to_string(file).unwrap();
    assert!(html.contains("</body>"), "{html}");
    let dir = tempfile::tempdir().unwrap();
    let probed = dir.path().join("probed.html");
    std::fs::write(
        &probed,
        html.replace("</body>", &format!("{LAYOUT_PROBE}</body>")),
    )
    .unwrap();
    let url = format!("file://{}", probed.display());
    let size = format!("--window-size={},{}", SCREEN.0, SCREEN.1);
    let dom = chromium(&url, &[&size, "--virtual-time-budget=5000", "--dump-dom"]);
    let (dom_text, stderr) = (common::stdout_of(&dom), common::stderr_of(&dom));
    assert!(dom.status.success(), "{stderr}");
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    let json = dom_text
        .split("<pre id=\"layout\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("the probe wrote nothing:\n{stderr}"));
    // Text as --dump-dom serializes it.
    let json = json
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap()
}

/// The box the probe recorded for `selector`: left, top, right, bottom.
fn layout_box(layout: &Value, selector: &str) -> [f64; 4] {
    let b = &layout["boxes"][selector];
    assert!(b.is_object(), "no {selector} on the page: {layout}");
    ["left", "top", "right", "bottom"].map(|side| b[side].as_f64().unwrap())
}

/// Asserts the first screen of the HTML report `file` at [`SCREEN`]: the
/// verdict, the whole RSS chart and the top paths' first row above the
/// fold, the process table below all three; every fork/exit mark's label
/// hidden until hovered (so labels never overlap); the flame graph within
/// the width with its title
/// inside it; searching a frame's function matches, clicking it zooms;
/// Ctrl-F away from the graph is left to the browser, its Search button
/// asks for a term.
fn assert_first_screen(file: &Path) {
    let layout = html_layout(file);
    println!("layout of {}: {layout}", file.display());
    assert_eq!(layout["width"], SCREEN.0, "{layout}");
    assert!(
        layout["scroll_width"].as_u64().unwrap() <= u64::from(SCREEN.0),
        "the page scrolls sideways: {layout}"
    );
    let fold = f64::from(SCREEN.1);
    let verdict = layout_box(&layout, "#verdict");
    let chart = layout_box(&layout, "#rss-chart");
    let paths = layout_box(&layout, "#top-paths");
    let first_path = layout_box(&layout, "#top-paths table tr:nth-child(2)");
    for (name, b) in [
        ("verdict", verdict),
        ("RSS chart", chart),
        ("top paths", paths),
    ] {
        assert!(
            b[1] < fold && b[3] > b[1],
            "{name} not above the fold: {b:?}"
        );
    }
    assert!(
        chart[3] <= fold,
        "the RSS chart is cut by the fold: {chart:?}"
    );
    assert!(
        first_path[3] <= fold,
        "no top path above the fold: {first_path:?}"
    );
    let table = layout_box(&layout, "#processes");
    for b in [verdict, chart, paths] {
        assert!(
            table[1] >= b[3],
            "the process table starts inside {b:?}: {table:?}"
        );
    }
    assert!(layout["marks"].as_u64().unwrap() > 0, "{layout}");
    assert!(
        layout["hidden_labels"].as_u64().unwrap() > 0 && layout["labels"] == json!([]),
        "mark labels shown before hover: {layout}"
    );
    let flame = layout_box(&layout, "#flamegraph svg");
    let title = layout_box(&layout, "#flamegraph #title");
    assert!(
        flame[2] <= f64::from(SCREEN.0),
        "flame graph wider than the screen: {flame:?}"
    );
    assert!(
        title[0] >= flame[0] && title[2] <= flame[2],
        "title clipped: {title:?} {flame:?}"
    );
    let zoomed = layout["zoomed_width"].as_f64().unwrap();
    assert!((zoomed - 100.0).abs() < 0.01, "no zoom: {layout}");
    assert_eq!(layout["unzoom_shown"], true, "{layout}");
    assert!(
        layout["matched"].as_str().unwrap().starts_with("Matched: "),
        "{layout}"
    );
    assert_eq!(
        layout["find_prompted"], 0,
        "Ctrl-F taken from the browser: {layout}"
    );
    assert_eq!(
        layout["search_prompted"], 1,
        "Search asked for no term: {layout}"
    );
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
