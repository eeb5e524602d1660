//! HTML renderer of the report step: one self-contained page (no network,
//! no external files). The first screen (1400 x 900) answers the incident's
//! questions: the verdict ([`verdict`]), the RSS chart of the growing
//! processes and the top paths named by the user's code ([`chart`],
//! [`paths`]). Then the process tree (one row per process image, an image
//! after an execve under the one it replaced), the copy-on-write section,
//! the flame graph (inline SVG from [`super::flamegraph`], with inferno's
//! script for search and click-to-zoom), and, collapsed, an RSS chart per
//! image and every finding per process.

mod chart;
mod paths;
mod verdict;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write};

use super::markup::escape;
use super::text::seconds;
use super::{flamegraph, text, RenderOptions};
use crate::aggregate::{ProcessId, ProcessReport, Report, RunMeta};
use crate::diagnose::Diagnosed;
use crate::units::{format_bytes, format_signed_bytes};

/// Most characters of a command in the process table and chart captions
/// (cut from the left, so the script and its arguments stay).
pub(super) const MAX_COMMAND_CHARS: usize = 60;

/// The page's style sheet. Class names avoid those of inferno's flame graph
/// (`hide`, `parent`), whose style sheet applies to the whole page, and
/// every chart sets its own text font over inferno's `text` rule.
const STYLE: &str = "
body { font-family: sans-serif; margin: 0.6em 1em; color: #222; max-width: 1380px; font-size: 14px; }
header h1 { font-size: 1.25em; margin: 0 0 0.1em 0; overflow-wrap: anywhere; }
header p { margin: 0 0 0.4em 0; color: #555; }
h2 { font-size: 1.1em; margin: 1.2em 0 0.4em 0; border-bottom: 1px solid #ccc; }
h2 small { font-weight: normal; color: #666; font-size: 0.8em; }
summary h2 { display: inline; border: none; }
code, .frames { font-family: monospace; }
.first { display: grid; grid-template-columns: minmax(0, 1fr) 760px; gap: 0 1.4em; align-items: start; }
.first h2 { margin-top: 0.3em; }
#verdict ol.causes { padding-left: 0; list-style: none; margin: 0; }
.cause { margin-bottom: 0.6em; padding-left: 0.6em; }
.cause-head { margin: 0 0 0.2em 0; font-weight: bold; }
.cause dl { display: grid; grid-template-columns: 5.5em minmax(0, 1fr); margin: 0; gap: 0.1em 0.4em; }
.cause dt { color: #666; } .cause dd { margin: 0; }
#verdict p.also, #verdict p.more { margin: 0.3em 0; color: #555; }
.pattern { font-weight: bold; }
.weak { border-left: 4px solid #e0a040; } .strong { border-left: 4px solid #c03030; }
.finding { margin-bottom: 1em; padding-left: 0.6em; }
.finding .caveat { color: #a05a00; font-style: italic; } .finding .next { font-weight: bold; }
.frames { margin: 0.2em 0 0.4em 1em; padding: 0; list-style: none; font-size: 0.9em; }
figure { margin: 0; } figcaption { color: #444; font-size: 0.9em; }
figcaption .fork { color: #3070e0; } figcaption .end { color: #d02020; }
svg.chart text { font-family: sans-serif; font-size: 11px; }
svg.chart .mark-label { visibility: hidden; font-size: 11px; }
svg.chart .mark:hover .mark-label { visibility: visible; }
svg.chart .mark:hover line { stroke-opacity: 1; }
ul.legend { list-style: none; padding: 0; margin: 0.1em 0 0.4em 0; font-size: 0.85em; }
ul.legend li { display: inline-block; margin-right: 1em; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.15em 0.5em; border-bottom: 1px solid #eee; text-align: right; vertical-align: top; white-space: nowrap; }
th, td.place, td.cmd { white-space: normal; } td.place, td.cmd { overflow-wrap: anywhere; }
table.paths { width: 100%; }
td.cmd, th.cmd, td.place, th.place { text-align: left; }
table.paths summary { cursor: pointer; } .via, .none { color: #777; font-size: 0.9em; }
table.cow tr.proc th { background: #f4f4f4; font-weight: normal; }
.charts { display: flex; flex-wrap: wrap; gap: 0.6em 1.2em; }
.flame svg { max-width: 100%; height: auto; }
.flame #search { opacity: 0.7; }
@media (max-width: 1150px) { .first { grid-template-columns: minmax(0, 1fr); } }
";

/// Writes the HTML report of `report`: first the verdict (from the same
/// data as the terminal's), the RSS chart of the growing processes and the
/// `options.top` paths merged across processes ranked by `options.weight`
/// (held at the high-water mark, held at the end, grown; when the first
/// five grew); then the process tree table (one row per image in tree
/// order, with its kind and how and when it ended), the copy-on-write
/// paths per process, the flame graph weighed by `options.weight` (icicles
/// with `options.inverted`), collapsed an RSS chart per image and every
/// finding, and the warnings. All text is escaped; nothing is fetched when
/// the page is viewed.
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Diagnosed, options: &RenderOptions, out: &mut dyn Write) -> io::Result<()> {
    let command = escape(&report.meta.command);
    writeln!(out, "<!DOCTYPE html>")?;
    writeln!(out, "<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">")?;
    writeln!(out, "<title>memtrace: {command}</title>")?;
    writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>")?;
    writeln!(
        out,
        "<header><h1>memtrace report: <code>{command}</code></h1>\n<p>Traced for {}; memory \
         events sampled every {} on average.</p></header>",
        seconds(report.meta.duration_ns),
        format_bytes(report.meta.sample_interval_bytes)
    )?;
    out.write_all(run_lines(&report.meta).as_bytes())?;
    out.write_all(first_screen(report, options).as_bytes())?;
    let order: Vec<&ProcessReport> = tree_order(report).into_iter().map(|(_, p)| p).collect();
    out.write_all(process_tree(report).as_bytes())?;
    out.write_all(paths::cow(report).as_bytes())?;
    flame_graph(report, options, out)?;
    out.write_all(chart::per_image(report, &order).as_bytes())?;
    out.write_all(verdict::findings_section(report).as_bytes())?;
    out.write_all(warnings(report).as_bytes())?;
    writeln!(
        out,
        "<footer><p>Written by memtrace {}.</p></footer>\n</body>\n</html>",
        env!("CARGO_PKG_VERSION")
    )
}

/// Where, when and by which memtrace the run was recorded, how tracing
/// began (what attaching hid) and how the command ended, one paragraph each
/// under the header, as the terminal's header says them.
fn run_lines(meta: &RunMeta) -> String {
    let status = meta.command_status.map(text::command_ended);
    meta.origin
        .describe()
        .into_iter()
        .chain(text::attach_line(meta))
        .chain(status)
        .map(|line| format!("<p class=\"run\">memtrace: {}</p>\n", escape(&line)))
        .collect()
}

/// What the first screen shows: the verdict on the left; the RSS chart of
/// the growing processes and the top paths on the right.
fn first_screen(report: &Diagnosed, options: &RenderOptions) -> String {
    let end_ns = chart::chart_end_ns(report);
    format!(
        "<div class=\"first\">\n<div>\n{}</div>\n<div>\n{}{}</div>\n</div>\n",
        verdict::verdict_section(report),
        chart::overview(report),
        paths::top_paths(report, options, end_ns)
    )
}

/// A `<ul>` of `class` with one escaped item per entry; nothing when empty.
fn list<'a>(class: &str, items: impl Iterator<Item = &'a str>, html: &mut String) {
    let items: Vec<String> = items.map(|i| format!("<li>{}</li>", escape(i))).collect();
    if !items.is_empty() {
        let _ = writeln!(html, "<ul class=\"{class}\">\n{}\n</ul>", items.join("\n"));
    }
}

/// The process images in tree order (each after its parent, an image after
/// an execve right under the image it replaced; children by start time then
/// id), with their depth.
fn tree_order(report: &Report) -> Vec<(usize, &ProcessReport)> {
    let traced: HashSet<ProcessId> = report.processes.iter().map(|p| p.id).collect();
    let mut children: BTreeMap<Option<ProcessId>, Vec<&ProcessReport>> = BTreeMap::new();
    for p in &report.processes {
        // An image after an execve hangs under the image it replaced.
        let parent = p.previous_image.or(p.parent);
        let parent = parent.filter(|t| traced.contains(t) && *t != p.id);
        children.entry(parent).or_default().push(p);
    }
    for list in children.values_mut() {
        list.sort_by_key(|p| (p.started_ns, p.id));
    }
    let mut order = Vec::with_capacity(report.processes.len());
    let mut seen = HashSet::new();
    let mut stack: Vec<(usize, &ProcessReport)> = children
        .get(&None)
        .map(|roots| roots.iter().rev().map(|p| (0, *p)).collect())
        .unwrap_or_default();
    while let Some((depth, p)) = stack.pop() {
        if !seen.insert(p.id) {
            continue;
        }
        order.push((depth, p));
        if let Some(kids) = children.get(&Some(p.id)) {
            stack.extend(kids.iter().rev().map(|k| (depth + 1, *k)));
        }
    }
    // Processes only reachable through a parent cycle: listed at the end.
    for p in &report.processes {
        if seen.insert(p.id) {
            order.push((0, p));
        }
    }
    order
}

/// The process tree table (`#processes`) and the run's totals.
fn process_tree(report: &Report) -> String {
    let mut html = String::from(
        "<section id=\"processes\">\n<h2>Process tree</h2>\n\
         <p>One row per process image: a process the kernel gave a tgid already seen is \
         <code>#2</code>, the image after an execve is <code>image 1</code>. An image's numbers \
         end when it exec'd or began to exit (before the interpreter and the kernel gave its \
         memory back).</p>\n<table class=\"tree\">\n<tr>\
         <th>process</th><th>role</th><th>RSS start</th><th>end</th><th>peak</th>\
         <th>growth</th><th>USS end</th><th>copy-on-write</th><th>held at peak</th><th>Python</th>\
         <th>started</th><th>ended</th><th class=\"cmd\">command</th></tr>\n",
    );
    for (depth, p) in tree_order(report) {
        let dash = || "-".to_owned();
        let rss = p.rss.map_or_else(
            || [dash(), dash(), dash(), dash()],
            |r| {
                [
                    format_bytes(r.start_bytes),
                    format_bytes(r.end_bytes),
                    format_bytes(r.peak_bytes),
                    format_signed_bytes(r.growth_bytes),
                ]
            },
        );
        let cow = p
            .counters
            .map_or_else(dash, |c| format_bytes(c.cow_fault_bytes));
        let uss = p
            .sharing
            .and_then(|s| s.end_uss())
            .map_or_else(dash, format_bytes);
        let ended = text::ended_text(p);
        let indent = "&nbsp;&nbsp;&nbsp;".repeat(depth);
        let branch = if depth > 0 { "└ " } else { "" };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"cmd\">{indent}{branch}{}</td></tr>",
            escape(&p.name()),
            p.kind,
            rss[0],
            rss[1],
            rss[2],
            rss[3],
            uss,
            cow,
            format_bytes(p.peak_held_bytes),
            escape(&text::python_text(p.python.as_ref(), true)),
            seconds(p.started_ns),
            escape(&ended),
            escape(&text::short_command(&p.cmdline, MAX_COMMAND_CHARS)),
        );
    }
    let t = &report.totals;
    let _ = write!(html, "</table>\n<p>{}", escape(&text::totals_line(report)));
    if t.peak_total_pss_bytes > 0 {
        let _ = write!(
            html,
            "; proportional (PSS, shared pages counted once) {} at the end, highest sum {}",
            format_bytes(t.live_pss_end_bytes),
            format_bytes(t.peak_total_pss_bytes),
        );
    }
    let _ = writeln!(
        html,
        "; pages touched, counting re-touches (exact, gross): anonymous {}, file-backed {}; \
         copy-on-write copies of pages still shared {}.</p>\n</section>",
        format_bytes(t.anon_growth_bytes),
        format_bytes(t.file_growth_bytes),
        format_bytes(t.cow_fault_bytes),
    );
    html
}

/// Keeps the browser's own find (Ctrl-F, F3) for the page: inferno's
/// script takes those keys on the whole window for its search, so outside
/// the flame graph they stop before reaching it (capture phase, default
/// left alone).
const FIND_KEYS_SCRIPT: &str = "<script>\nwindow.addEventListener(\"keydown\", function (e) {\n\
  var find = e.keyCode === 114 || (e.ctrlKey && e.keyCode === 70);\n\
  if (find && !document.querySelector(\"#flamegraph .flame:hover\")) e.stopImmediatePropagation();\n\
}, true);\n</script>";

/// The flame graph SVG, inline (its XML prologue dropped), with inferno's
/// script for search and click-to-zoom and [`FIND_KEYS_SCRIPT`].
fn flame_graph(report: &Diagnosed, options: &RenderOptions, out: &mut dyn Write) -> io::Result<()> {
    let mut svg = Vec::new();
    flamegraph::render_inline(report, options, &mut svg)?;
    let svg = String::from_utf8_lossy(&svg);
    let start = svg.find("<svg").unwrap_or(0);
    writeln!(
        out,
        "<section id=\"flamegraph\">\n<h2>Flame graph</h2>\n\
         <p>Sampled bytes by code path, weighed by bytes {} (<code>--weight</code>), one tower \
         per process image. Click a frame to zoom into it (Reset Zoom, top left, goes back); \
         Search (top right, or Ctrl-F with the pointer over the graph) highlights the frames \
         matching a regular expression.</p>\n\
         <div class=\"flame\">\n{}\n</div>\n{FIND_KEYS_SCRIPT}\n</section>",
        options.weight.describe(),
        svg[start..].trim_end()
    )
}

/// The warnings, most important first; nothing when there are none.
fn warnings(report: &Report) -> String {
    if report.warnings.is_empty() {
        return String::new();
    }
    let mut html = String::from("<section id=\"warnings\">\n<h2>Warnings</h2>\n");
    let lines: Vec<String> = report.warnings.iter().map(ToString::to_string).collect();
    list("warnings", lines.iter().map(String::as_str), &mut html);
    html.push_str("</section>\n");
    html
}

#[cfg(test)]
mod tests;
