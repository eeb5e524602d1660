//! The programs `formats.rs` hands rendered reports to that run in a
//! browser: headless chromium, the speedscope web app in it, and a layout
//! probe that measures the HTML report's first screen.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";
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

/// Runs headless chromium on `url` with `extra` flags; returns its output.
pub(crate) fn chromium(url: &str, extra: &[&str]) -> Output {
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
pub(crate) fn speedscope_index() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-tools/node_modules/speedscope/dist/release/index.html")
}

/// Opens the speedscope `file` in the speedscope web app in headless
/// chromium, as speedscope's own command-line tool does (`index.html
/// #localProfilePath=` a script that calls
/// `speedscope.loadFileFromBase64(name, base64)`), asserting it loaded
/// without errors; returns the DOM. With `screenshot`, also saves one there.
pub(crate) fn speedscope_dom(file: &Path, screenshot: Option<&Path>) -> String {
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
    let (dom_text, stderr) = (
        crate::common::stdout_of(&dom),
        crate::common::stderr_of(&dom),
    );
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
            crate::common::stderr_of(&screenshot)
        );
        assert!(shot.metadata().unwrap().len() > 0);
    }
    dom_text
}

/// Opens the HTML report `file` in headless chromium, asserting it loaded
/// without script errors; returns the DOM. With `screenshot`, also saves
/// one there.
pub(crate) fn html_dom(file: &Path, screenshot: Option<&Path>) -> String {
    let url = format!("file://{}", file.canonicalize().unwrap().display());
    let dom = chromium(&url, &["--dump-dom"]);
    let (dom_text, stderr) = (
        crate::common::stdout_of(&dom),
        crate::common::stderr_of(&dom),
    );
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
            crate::common::stderr_of(&screenshot)
        );
        assert!(script_errors(&crate::common::stderr_of(&screenshot)).is_empty());
        println!("screenshot: {}", shot.display());
    }
    dom_text
}

/// Width and height of the first screen the HTML report is laid out for.
pub(crate) const SCREEN: (u32, u32) = (1400, 900);

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
    let (dom_text, stderr) = (
        crate::common::stdout_of(&dom),
        crate::common::stderr_of(&dom),
    );
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
pub(crate) fn assert_first_screen(file: &Path) {
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
