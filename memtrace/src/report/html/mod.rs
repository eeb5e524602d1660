//! HTML renderer of the report step: one self-contained page (no network,
//! no external files) with the diagnosis first, the process tree (one row
//! per process image, an image after an execve under the one it replaced),
//! an RSS chart per image (inline SVG drawn here, with fork, exec and exit
//! marks; the line stops where the image's numbers end), the top paths with
//! their three measures and the flame graph (inline SVG from
//! [`super::flamegraph`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write};

use super::text::seconds;
use super::{flamegraph, text, RenderOptions};
use crate::aggregate::{ProcessId, ProcessReport, Report, RssPoint};
use crate::diagnose::{Diagnosed, Finding, Strength};
use crate::units::{format_bytes, format_signed_bytes};

/// RSS chart geometry, in SVG user units (pixels).
const CHART_WIDTH: f64 = 720.0;
const CHART_HEIGHT: f64 = 200.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 24.0;
const MARGIN_BOTTOM: f64 = 32.0;

/// The page's style sheet. Class names avoid those of inferno's flame graph
/// (`hide`, `parent`), whose style sheet applies to the whole page.
const STYLE: &str = "
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1300px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
code, .frames { font-family: monospace; }
table.tree { border-collapse: collapse; font-size: 0.9em; }
table.tree th, table.tree td { padding: 0.2em 0.6em; border-bottom: 1px solid #eee; text-align: right; }
table.tree td.cmd, table.tree th.cmd { text-align: left; }
.finding { margin-bottom: 1em; } .finding .caveat { color: #a05a00; font-style: italic; }
.finding .next { font-weight: bold; } .pattern { font-weight: bold; text-transform: capitalize; }
.weak { border-left: 4px solid #e0a040; padding-left: 0.6em; }
.strong { border-left: 4px solid #c03030; padding-left: 0.6em; }
.frames { margin: 0.2em 0 0.8em 1.5em; padding: 0; list-style: none; font-size: 0.9em; }
figure.rss { margin: 0.5em 0 1.2em 0; }
svg.rss text { font-family: sans-serif; font-size: 11px; }
.flame svg { max-width: 100%; height: auto; }
";

/// Writes the HTML report of `report`: the diagnosis (each finding with
/// its caveat when weak, evidence, code paths and next step), the process
/// tree table (one row per image in tree order, with how and when it
/// ended), one RSS-over-time chart per image with readings (fork marks
/// where it forked a traced child, an exec or exit mark where its numbers
/// end, the time after that shaded), the `options.top` paths merged across
/// processes ranked by `options.weight` with the bytes each held at the
/// high-water mark, held at the end and grew, the flame graph weighed by
/// `options.weight` (icicles with `options.inverted`) and the warnings. All
/// text is escaped; nothing is fetched when the page is viewed.
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Diagnosed, options: &RenderOptions, out: &mut dyn Write) -> io::Result<()> {
    let command = escape(&report.meta.command);
    writeln!(out, "<!DOCTYPE html>")?;
    writeln!(out, "<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">")?;
    writeln!(out, "<title>memtrace: {command}</title>")?;
    writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>")?;
    writeln!(out, "<h1>memtrace report: <code>{command}</code></h1>")?;
    writeln!(
        out,
        "<p>Traced for {}; memory events sampled every {} on average.</p>",
        seconds(report.meta.duration_ns),
        format_bytes(report.meta.sample_interval_bytes)
    )?;
    out.write_all(diagnosis(report).as_bytes())?;
    out.write_all(process_tree(report).as_bytes())?;
    out.write_all(rss_charts(report).as_bytes())?;
    out.write_all(growth_paths(report, options).as_bytes())?;
    flame_graph(report, options, out)?;
    out.write_all(warnings(report).as_bytes())?;
    writeln!(
        out,
        "<footer><p>Written by memtrace {}.</p></footer>\n</body>\n</html>",
        env!("CARGO_PKG_VERSION")
    )
}

/// `text` with `& < > " '` replaced by character references, safe in
/// element content and quoted attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

fn diagnosis(report: &Diagnosed) -> String {
    let mut html = String::from("<section id=\"diagnosis\">\n<h2>Diagnosis</h2>\n");
    let findings = &report.diagnosis;
    if findings.is_empty() {
        html.push_str("<p>This report was not diagnosed.</p>\n");
    }
    for finding in findings {
        finding_html(report, finding, &mut html);
    }
    html.push_str("</section>\n");
    html
}

fn finding_html(report: &Report, finding: &Finding, html: &mut String) {
    let class = match finding.strength {
        Strength::Strong => "strong",
        Strength::Weak => "weak",
    };
    let _ = writeln!(
        html,
        "<div class=\"finding {class}\">\n<p><span class=\"pattern\">{}</span> in {}: {}</p>",
        escape(text::pattern_name(finding.pattern)),
        escape(&text::scope_text(report, finding.scope)),
        escape(&finding.summary)
    );
    if let Some(caveat) = text::weakness(finding.strength) {
        let _ = writeln!(html, "<p class=\"caveat\">{}</p>", escape(caveat));
    }
    list(
        "evidence",
        finding.evidence.iter().map(String::as_str),
        html,
    );
    let (mut paths, left_out) = text::finding_path_lines(report, finding);
    if left_out > 0 {
        paths.push(format!("… {left_out} more paths"));
    }
    if !paths.is_empty() {
        html.push_str("<p>Code paths behind it:</p>\n");
        list("frames", paths.iter().map(String::as_str), html);
    }
    if !finding.next_step.is_empty() {
        let _ = writeln!(
            html,
            "<p class=\"next\">Next step: {}</p>",
            escape(&finding.next_step)
        );
    }
    html.push_str("</div>\n");
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
            escape(&p.label()),
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
        "; exact resident anonymous growth {}, file-backed growth {}, copy-on-write {}.</p>\n\
         </section>",
        format_bytes(t.anon_growth_bytes),
        format_bytes(t.file_growth_bytes),
        format_bytes(t.cow_fault_bytes),
    );
    html
}

fn rss_charts(report: &Report) -> String {
    let mut html = String::from(
        "<section id=\"rss\">\n<h2>RSS over time</h2>\n\
         <p>Resident memory of each process image (solid: RSS, dashed: anonymous, dotted: \
         private (USS) when read); blue marks: a traced child was forked; red mark: the image \
         exec'd or began to exit, where its numbers end (shaded after).</p>\n",
    );
    let end_ns = chart_end_ns(report);
    for (_, p) in tree_order(report) {
        let _ = writeln!(
            html,
            "<figure class=\"rss\" id=\"rss-{}\">\n<figcaption>{} <code>{}</code>: {}\
             </figcaption>",
            p.id,
            escape(&p.name()),
            escape(&p.label()),
            escape(&text::ended_text(p))
        );
        if p.timeline.is_empty() {
            html.push_str("<p>No RSS was read for this process.</p>\n");
        } else {
            let forks: Vec<(String, u64)> = report
                .processes
                .iter()
                .filter(|c| c.parent == Some(p.id) && c.id != p.id && c.image == 0)
                .map(|c| (c.name(), c.started_ns))
                .collect();
            html.push_str(&rss_chart(p, &forks, end_ns));
        }
        html.push_str("</figure>\n");
    }
    html.push_str("</section>\n");
    html
}

/// The time axis end: the run's duration, or the latest time any process
/// shows when that is later (or the duration is unknown).
fn chart_end_ns(report: &Report) -> u64 {
    let latest = report
        .processes
        .iter()
        .flat_map(|p| {
            let last_point = p.timeline.last().map_or(0, |point| point.t_ns);
            [last_point, p.started_ns, p.ended_ns().unwrap_or(0)]
        })
        .max()
        .unwrap_or(0);
    report.meta.duration_ns.max(latest).max(1)
}

/// One image's chart: RSS, anonymous RSS and USS (when read) over
/// `0..=end_ns` (the run's axis, shared by every chart), a y axis from 0 to
/// 110% of the highest reading, `forks` as (child name, time) marks, the
/// image's end (exec or start of its exit) as a mark with the time after it
/// shaded.
fn rss_chart(p: &ProcessReport, forks: &[(String, u64)], end_ns: u64) -> String {
    let highest = p
        .timeline
        .iter()
        .map(|point| point.rss_bytes.max(point.uss_bytes.unwrap_or(0)))
        .max();
    // 10% headroom so the highest reading does not run along the frame.
    let highest = highest.unwrap_or(0);
    let max_bytes = highest.saturating_add(highest / 10).max(1);
    let plot_w = CHART_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = CHART_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let x = |t_ns: u64| MARGIN_LEFT + plot_w * (t_ns.min(end_ns) as f64 / end_ns as f64);
    let y = |bytes: u64| MARGIN_TOP + plot_h * (1.0 - bytes as f64 / max_bytes as f64);
    let (bottom, right) = (MARGIN_TOP + plot_h, MARGIN_LEFT + plot_w);
    let mut svg = format!(
        "<svg class=\"rss\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_WIDTH}\" \
         height=\"{CHART_HEIGHT}\" viewBox=\"0 0 {CHART_WIDTH} {CHART_HEIGHT}\" role=\"img\">\n\
         <title>RSS of {} over time</title>\n\
         <rect x=\"{MARGIN_LEFT}\" y=\"{MARGIN_TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" \
         fill=\"#fafafa\" stroke=\"#999\"/>\n",
        escape(&p.name())
    );
    for fraction in [0.0, 0.5, 1.0] {
        let bytes = (max_bytes as f64 * fraction) as u64;
        let _ = writeln!(
            svg,
            "<line x1=\"{MARGIN_LEFT}\" x2=\"{right}\" y1=\"{0:.1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{1}\" y=\"{0:.1}\" text-anchor=\"end\" dominant-baseline=\"middle\">{2}</text>",
            y(bytes),
            MARGIN_LEFT - 6.0,
            format_bytes(bytes)
        );
    }
    for fraction in [0.0, 0.5, 1.0] {
        let t_ns = (end_ns as f64 * fraction) as u64;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x(t_ns),
            bottom + 18.0,
            seconds(t_ns)
        );
    }
    if let Some(ended_ns) = p.ended_ns() {
        let from = x(ended_ns);
        let _ = writeln!(
            svg,
            "<rect class=\"after-end\" x=\"{from:.1}\" y=\"{MARGIN_TOP}\" width=\"{:.1}\" \
             height=\"{plot_h}\" fill=\"#e4e4e4\"/>",
            right - from
        );
    }
    let line = |value: fn(&RssPoint) -> Option<u64>| -> String {
        p.timeline
            .iter()
            .filter_map(|point| value(point).map(|bytes| (point.t_ns, bytes)))
            .map(|(t_ns, bytes)| format!("{:.1},{:.1}", x(t_ns), y(bytes)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let uss = line(|point| point.uss_bytes);
    if !uss.is_empty() {
        let _ = writeln!(
            svg,
            "<polyline class=\"uss\" points=\"{uss}\" fill=\"none\" stroke=\"#309050\" \
             stroke-width=\"1.5\" stroke-dasharray=\"1 2\"/>"
        );
    }
    let _ = writeln!(
        svg,
        "<polyline class=\"anon\" points=\"{}\" fill=\"none\" stroke=\"#e08030\" \
         stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>\n\
         <polyline class=\"rss-line\" points=\"{}\" fill=\"none\" stroke=\"#2060c0\" stroke-width=\"2\"/>",
        line(|point| Some(point.anon_bytes)),
        line(|point| Some(point.rss_bytes))
    );
    if let [only] = p.timeline.as_slice() {
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#2060c0\"/>",
            x(only.t_ns),
            y(only.rss_bytes)
        );
    }
    for (child, t_ns) in forks {
        mark(
            &mut svg,
            x(*t_ns),
            "fork-mark",
            "#3070e0",
            "fork",
            &format!("forked {child} at {}", seconds(*t_ns)),
        );
    }
    if let Some(ended_ns) = p.ended_ns() {
        let (class, label, tooltip) = if p.exec_ns.is_some() {
            (
                "exec-mark",
                "exec",
                format!("exec'd at {}: the next image starts", seconds(ended_ns)),
            )
        } else {
            let how = p
                .exit_status
                .map_or_else(|| "exit".to_owned(), |status| status.to_string());
            (
                "exit-mark",
                "exit",
                format!("began to exit at {} ({how})", seconds(ended_ns)),
            )
        };
        mark(&mut svg, x(ended_ns), class, "#d02020", label, &tooltip);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A vertical dashed mark at `x` across the plot, labelled at the top, with
/// `tooltip` as its title.
fn mark(svg: &mut String, x: f64, class: &str, color: &str, label: &str, tooltip: &str) {
    let bottom = CHART_HEIGHT - MARGIN_BOTTOM;
    let _ = writeln!(
        svg,
        "<g class=\"{class}\"><title>{}</title>\
         <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{MARGIN_TOP}\" y2=\"{bottom}\" stroke=\"{color}\" \
         stroke-dasharray=\"3 2\"/>\
         <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"{color}\">{}</text></g>",
        escape(tooltip),
        MARGIN_TOP - 6.0,
        escape(label)
    );
}

fn growth_paths(report: &Report, options: &RenderOptions) -> String {
    let weight = options.weight;
    let mut html = format!(
        "<section id=\"paths\">\n<h2>Top paths</h2>\n\
         <p>Sampled bytes by code path, summed over processes: held when each process image's \
         RSS was at its high-water mark, held at its end, and grown (every first touch, counted \
         again when freed memory is touched again). Ranked by bytes {0}, with the share of all \
         bytes {0}; innermost frame first.</p>\n",
        weight.describe()
    );
    let stacks = report.top_stacks(weight, options.top);
    if stacks.is_empty() {
        let _ = writeln!(
            html,
            "<p>No sampled path has bytes {}.</p>",
            weight.describe()
        );
    }
    let all = text::all_weight_bytes(report, weight);
    html.push_str("<ol>\n");
    for stack in stacks {
        let names: Vec<String> = stack.processes.iter().map(|&id| report.name(id)).collect();
        let _ = writeln!(
            html,
            "<li><b>{}</b> held at peak, <b>{}</b> held at end, <b>{}</b> grown ({} of all {}) \
             in {}\n<ul class=\"frames\">",
            format_bytes(stack.peak_held_bytes),
            format_bytes(stack.bytes.held_now_bytes()),
            format_bytes(stack.bytes.grown_bytes()),
            text::percent(stack.weight_bytes(weight), all),
            weight.describe(),
            escape(&names.join(", "))
        );
        for frame in text::frames_innermost_first(report.frames(stack.stack)) {
            let _ = writeln!(html, "<li>{}</li>", escape(&frame));
        }
        html.push_str("</ul></li>\n");
    }
    html.push_str("</ol>\n</section>\n");
    html
}

/// The flame graph SVG, inline (its XML prologue dropped).
fn flame_graph(report: &Diagnosed, options: &RenderOptions, out: &mut dyn Write) -> io::Result<()> {
    let mut svg = Vec::new();
    flamegraph::render_inline(report, options, &mut svg)?;
    let svg = String::from_utf8_lossy(&svg);
    let start = svg.find("<svg").unwrap_or(0);
    writeln!(
        out,
        "<section id=\"flamegraph\">\n<h2>Flame graph</h2>\n\
         <p>Sampled bytes by code path, weighed by bytes {} (<code>--weight</code>), one tower \
         per process image (click a frame to zoom).</p>\n\
         <div class=\"flame\">\n{}\n</div>\n</section>",
        options.weight.describe(),
        svg[start..].trim_end()
    )
}

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
