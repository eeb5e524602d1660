//! Code paths on the HTML page: the top paths (`#top-paths`, on the first
//! screen), each named by the frame of the user's own code that holds the
//! memory ([`place_frame`]; stacks with the same place are one row) with
//! its stacks a click away and, for the first [`TIMELINE_PATHS`], a
//! sparkline of when it grew; and the
//! copy-on-write section (`#cow`): the paths that un-shared the most pages
//! in each process.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::text::{self, seconds};
use super::{escape, RenderOptions};
use crate::aggregate::{
    Frame, PathReport, ProcessId, ProcessKind, ProcessReport, Report, SampledBytes, StackId, Weight,
};
use crate::diagnose::place_of;
use crate::units::format_bytes;

/// Paths drawn with a timeline sparkline.
pub(super) const TIMELINE_PATHS: usize = 5;

/// Sparkline size, in pixels.
const SPARK_WIDTH: f64 = 120.0;
const SPARK_HEIGHT: f64 = 22.0;

/// Stacks listed under one top path.
const STACKS_PER_PLACE: usize = 3;

/// Copy-on-write paths listed per process.
const COW_PATHS_PER_PROCESS: usize = 3;

/// Processes listed in the copy-on-write section.
const MAX_COW_PROCESSES: usize = 8;

/// `name (file:line)` of the place of a stack, and the innermost Python
/// frame it went through when that is another one (`via dumps (...)`).
/// Files are named without their folders.
pub(super) fn place_name(frames: &[Frame]) -> (String, Option<String>) {
    let place = place_of(frames);
    (place.frame.short(), place.via.as_ref().map(Frame::short))
}

/// A top path: every stack whose place (frame of the user's code, and the
/// Python frame it called) is the same, summed over stacks and images.
#[derive(Debug)]
pub(super) struct PlaceRow {
    /// The place's frame, `render_report (app.py:84)`.
    pub place: String,
    /// The innermost Python frame, when another one.
    pub via: Option<String>,
    /// Its stacks, most bytes of the weight first.
    pub stacks: Vec<StackId>,
    /// Bytes held at each image's high-water mark, summed.
    pub peak_held_bytes: u64,
    /// Sampled bytes of its stacks, summed.
    pub bytes: SampledBytes,
    /// The images it ran in, ascending.
    pub processes: Vec<ProcessId>,
}

impl PlaceRow {
    /// The bytes `weight` counts.
    fn weight_bytes(&self, weight: Weight) -> u64 {
        weight.bytes(self.peak_held_bytes, &self.bytes)
    }
}

/// The `n` places with the most bytes of `weight` (> 0), largest first,
/// ties by name: the report's merged stacks grouped by [`place_name`].
pub(super) fn top_places(report: &Report, weight: Weight, n: usize) -> Vec<PlaceRow> {
    let mut rows: Vec<PlaceRow> = Vec::new();
    for stack in report.top_stacks(weight, usize::MAX) {
        let (place, via) = place_name(report.frames(stack.stack));
        let index = match rows.iter().position(|r| r.place == place && r.via == via) {
            Some(index) => index,
            None => {
                rows.push(PlaceRow {
                    place,
                    via,
                    stacks: Vec::new(),
                    peak_held_bytes: 0,
                    bytes: SampledBytes::default(),
                    processes: Vec::new(),
                });
                rows.len() - 1
            }
        };
        let row = &mut rows[index];
        row.stacks.push(stack.stack);
        row.peak_held_bytes += stack.peak_held_bytes;
        row.bytes.merge(&stack.bytes);
        row.processes.extend(&stack.processes);
        row.processes.sort();
        row.processes.dedup();
    }
    rows.sort_by(|a, b| {
        (b.weight_bytes(weight), &a.place, &a.via).cmp(&(a.weight_bytes(weight), &b.place, &b.via))
    });
    rows.truncate(n);
    rows
}

/// A place as HTML: the frame in `<code>`, `via` after it, and its stacks
/// (innermost frame first, at most [`STACKS_PER_PLACE`]) behind a
/// `<details>`.
fn place_html(report: &Report, place: &str, via: Option<&str>, stacks: &[StackId]) -> String {
    let via = via.map_or_else(String::new, |v| {
        format!(" <span class=\"via\">via {}</span>", escape(v))
    });
    let mut lists: Vec<String> = stacks
        .iter()
        .take(STACKS_PER_PLACE)
        .map(|&stack| {
            let items: Vec<String> = text::frames_innermost_first(report.frames(stack))
                .iter()
                .map(|f| format!("<li>{}</li>", escape(f)))
                .collect();
            format!("<ul class=\"frames\">{}</ul>", items.join(""))
        })
        .collect();
    if stacks.len() > STACKS_PER_PLACE {
        lists.push(format!(
            "<p class=\"via\">… {} more stacks</p>",
            stacks.len() - STACKS_PER_PLACE
        ));
    }
    format!(
        "<details><summary><code>{}</code>{via}</summary>{}</details>",
        escape(place),
        lists.join("")
    )
}

/// The place of one stack as HTML ([`place_html`]).
fn place_cell(report: &Report, stack: StackId) -> String {
    let (place, via) = place_name(report.frames(stack));
    place_html(report, &place, via.as_deref(), &[stack])
}

/// The top-paths table: the `options.top` places with the most bytes of
/// `options.weight` summed over stacks and processes, with the three
/// measures, the share of the weight, the processes and, for the first
/// [`TIMELINE_PATHS`], when they grew.
pub(super) fn top_paths(report: &Report, options: &RenderOptions, end_ns: u64) -> String {
    let weight = options.weight;
    let mut html = format!(
        "<section id=\"top-paths\">\n<h2>Top paths <small>by bytes {0}, summed over \
         processes; named by your code's frame (click for the stacks)</small></h2>\n",
        weight.describe()
    );
    let rows = top_places(report, weight, options.top);
    if rows.is_empty() {
        let _ = writeln!(
            html,
            "<p>No sampled path has bytes {}.</p>\n</section>",
            weight.describe()
        );
        return html;
    }
    let all = text::all_weight_bytes(report, weight);
    let _ = writeln!(
        html,
        "<table class=\"paths\">\n<tr><th>#</th><th class=\"place\">where</th>\
         <th>held at peak</th><th>held at end</th><th>grown</th><th>share</th>\
         <th>in</th><th title=\"bytes grown per {} of the run\">when it grew</th></tr>",
        seconds(report.path_bucket_ns)
    );
    for (rank, row) in rows.iter().enumerate() {
        let timeline = if rank < TIMELINE_PATHS {
            sparkline(report, &row.stacks, end_ns)
        } else {
            String::new()
        };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td class=\"place\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{timeline}</td></tr>",
            rank + 1,
            place_html(report, &row.place, row.via.as_deref(), &row.stacks),
            format_bytes(row.peak_held_bytes),
            format_bytes(row.bytes.held_now_bytes()),
            format_bytes(row.bytes.grown_bytes()),
            text::percent(row.weight_bytes(weight), all),
            processes_cell(report, &row.processes),
        );
    }
    html.push_str("</table>\n</section>\n");
    html
}

/// `1 worker` / `4 workers` / `3 processes`, with the images' names as
/// tooltip.
fn processes_cell(report: &Report, processes: &[ProcessId]) -> String {
    let names: Vec<String> = processes.iter().map(|&id| report.name(id)).collect();
    let kinds: Vec<ProcessKind> = processes
        .iter()
        .filter_map(|&id| report.process(id))
        .map(|p| p.kind)
        .collect();
    let same_kind = kinds
        .first()
        .filter(|&&kind| kinds.iter().all(|&k| k == kind));
    let count = names.len();
    let plural = match (same_kind, count) {
        (Some(kind), 1) => kind.to_string(),
        (Some(kind), _) => kind.plural().to_owned(),
        (None, 1) => "process".to_owned(),
        (None, _) => "processes".to_owned(),
    };
    format!(
        "<span title=\"{}\">{count} {plural}</span>",
        escape(&names.join(", "))
    )
}

/// Bytes `stacks` grew per time bucket (bucket start → bytes), summed over
/// every image they ran in.
pub(super) fn growth_per_bucket(report: &Report, stacks: &[StackId]) -> BTreeMap<u64, u64> {
    let mut buckets = BTreeMap::new();
    for path in report.paths.iter().filter(|p| stacks.contains(&p.stack)) {
        for point in &path.timeline {
            *buckets.entry(point.t_ns).or_insert(0) += point.growth_bytes;
        }
    }
    buckets.retain(|_, bytes| *bytes > 0);
    buckets
}

/// A small SVG of when `stacks` grew: one bar per time bucket with growth,
/// placed on the run's axis `0..=end_ns`, heights relative to the largest.
pub(super) fn sparkline(report: &Report, stacks: &[StackId], end_ns: u64) -> String {
    let buckets = growth_per_bucket(report, stacks);
    let Some(&largest) = buckets.values().max() else {
        return "<span class=\"none\">no growth sampled</span>".to_owned();
    };
    let end_ns = end_ns.max(1) as f64;
    let width_of = |ns: u64| SPARK_WIDTH * ns as f64 / end_ns;
    // A pixel between neighbouring bars, so contiguous growth reads as buckets.
    let bar_width = (width_of(report.path_bucket_ns) - 1.0).max(1.5);
    let mut svg = format!(
        "<svg class=\"spark\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{SPARK_WIDTH}\" \
         height=\"{SPARK_HEIGHT}\" viewBox=\"0 0 {SPARK_WIDTH} {SPARK_HEIGHT}\">\
         <line x1=\"0\" x2=\"{SPARK_WIDTH}\" y1=\"{SPARK_HEIGHT}\" y2=\"{SPARK_HEIGHT}\" \
         stroke=\"#bbb\"/>"
    );
    for (&t_ns, &bytes) in &buckets {
        let height = (SPARK_HEIGHT - 1.0) * bytes as f64 / largest as f64;
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bar_width:.1}\" height=\"{height:.1}\" \
             fill=\"#c05030\"><title>{}: +{} grown</title></rect>",
            width_of(t_ns).min(SPARK_WIDTH - bar_width),
            SPARK_HEIGHT - height,
            seconds(t_ns),
            format_bytes(bytes)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The copy-on-write section (`#cow`): for each image that un-shared pages
/// (most exact copy-on-write bytes first), the bytes the kernel counted
/// and its top [`COW_PATHS_PER_PROCESS`] paths by sampled copy-on-write
/// bytes, named by their place.
pub(super) fn cow(report: &Report) -> String {
    let mut html = String::from(
        "<section id=\"cow\">\n<h2>Copy-on-write</h2>\n<p>Pages a process shared with its \
         parent after fork and then wrote, so the kernel copied them (exact bytes from the \
         kernel's counters; the paths that wrote them, sampled).</p>\n",
    );
    let mut processes: Vec<(&ProcessReport, u64)> = report
        .processes
        .iter()
        .map(|p| (p, p.counters.map_or(0, |c| c.cow_fault_bytes)))
        .filter(|(p, exact)| *exact > 0 || cow_paths(report, p).next().is_some())
        .collect();
    if processes.is_empty() {
        html.push_str("<p>No process un-shared copy-on-write pages.</p>\n</section>\n");
        return html;
    }
    processes.sort_by_key(|(p, exact)| (std::cmp::Reverse(*exact), p.id));
    html.push_str(
        "<table class=\"cow\">\n<tr><th class=\"place\">process / path</th>\
         <th>un-shared</th><th>share</th></tr>\n",
    );
    for (p, exact) in processes.iter().take(MAX_COW_PROCESSES) {
        cow_rows(report, p, *exact, &mut html);
    }
    html.push_str("</table>\n");
    if processes.len() > MAX_COW_PROCESSES {
        let _ = writeln!(
            html,
            "<p>… {} more processes un-shared pages (the process table has each one's \
             bytes).</p>",
            processes.len() - MAX_COW_PROCESSES
        );
    }
    html.push_str("</section>\n");
    html
}

/// The paths of `p` with sampled copy-on-write bytes, most first.
fn cow_paths<'a>(report: &'a Report, p: &ProcessReport) -> impl Iterator<Item = &'a PathReport> {
    let id = p.id;
    let mut paths: Vec<&PathReport> = report
        .paths
        .iter()
        .filter(|path| path.process == id && path.bytes.cow_bytes > 0)
        .collect();
    paths.sort_by_key(|path| (std::cmp::Reverse(path.bytes.cow_bytes), path.stack));
    paths.into_iter()
}

/// The rows of one process: its name and exact bytes, then its top paths.
fn cow_rows(report: &Report, p: &ProcessReport, exact: u64, html: &mut String) {
    let _ = writeln!(
        html,
        "<tr class=\"proc\"><th class=\"place\">{} {} <code>{}</code></th><th>{}</th>\
         <th></th></tr>",
        p.kind,
        escape(&p.name()),
        escape(&text::short_command(&p.cmdline, 40)),
        format_bytes(exact)
    );
    let paths: Vec<&PathReport> = cow_paths(report, p).collect();
    for path in paths.iter().take(COW_PATHS_PER_PROCESS) {
        let _ = writeln!(
            html,
            "<tr><td class=\"place\">{}</td><td>{}</td><td>{:.0}%</td></tr>",
            place_cell(report, path.stack),
            format_bytes(path.bytes.cow_bytes),
            100.0 * path.cow_share
        );
    }
    if paths.len() > COW_PATHS_PER_PROCESS {
        let _ = writeln!(
            html,
            "<tr><td class=\"place\">… {} more paths</td><td></td><td></td></tr>",
            paths.len() - COW_PATHS_PER_PROCESS
        );
    }
}
