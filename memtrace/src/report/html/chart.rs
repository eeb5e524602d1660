//! RSS charts of the HTML page, drawn here as inline SVG: the overview of
//! the growing processes (one line each, on the first screen) and one chart
//! per process image (RSS, anonymous and USS lines, the time after its end
//! shaded). Fork, exec and exit marks are small ticks above the plot with a
//! faint line across it; their labels show only on hover, so marks close
//! in time never print over each other.

use std::fmt::Write as _;

use super::escape;
use super::text::{self, seconds};
use crate::aggregate::{ProcessReport, Report, RssPoint};
use crate::units::{format_bytes, format_signed_bytes};

/// Most processes drawn on the overview chart.
pub(super) const MAX_OVERVIEW_LINES: usize = 6;

/// Line colours of the overview chart, one per process in order.
const PALETTE: [&str; MAX_OVERVIEW_LINES] = [
    "#2060c0", "#d04020", "#209040", "#8040c0", "#c08000", "#008080",
];

/// Colour of fork marks.
const FORK_COLOR: &str = "#3070e0";

/// Colour of exec and exit marks.
const END_COLOR: &str = "#d02020";

/// Margins around the plot, in pixels: left (y labels), right, top (mark
/// ticks), bottom (x labels).
const MARGIN: Margin = Margin {
    left: 72.0,
    right: 14.0,
    top: 16.0,
    bottom: 26.0,
};

/// Height of a mark's tick above the plot, in pixels.
const TICK: f64 = 8.0;

/// Space around a plot.
struct Margin {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

/// One chart's geometry: its size, the time axis `0..=end_ns` and the byte
/// axis `0..=max_bytes`.
pub(super) struct Plot {
    /// Width of the SVG, in pixels.
    pub width: f64,
    /// Height of the SVG, in pixels.
    pub height: f64,
    /// End of the time axis, in nanoseconds since the run start.
    pub end_ns: u64,
    /// Top of the byte axis.
    pub max_bytes: u64,
}

impl Plot {
    /// A plot of `width` x `height` over `end_ns` whose highest reading is
    /// `highest` bytes (10% headroom above it).
    pub fn new(width: f64, height: f64, end_ns: u64, highest: u64) -> Self {
        Self {
            width,
            height,
            end_ns: end_ns.max(1),
            max_bytes: highest.saturating_add(highest / 10).max(1),
        }
    }

    /// Width of the plot area.
    pub fn plot_width(&self) -> f64 {
        self.width - MARGIN.left - MARGIN.right
    }

    /// Bottom edge of the plot area.
    fn bottom(&self) -> f64 {
        self.height - MARGIN.bottom
    }

    /// x of time `t_ns` (clamped to the axis).
    pub fn x(&self, t_ns: u64) -> f64 {
        let fraction = t_ns.min(self.end_ns) as f64 / self.end_ns as f64;
        MARGIN.left + self.plot_width() * fraction
    }

    /// y of `bytes`.
    fn y(&self, bytes: u64) -> f64 {
        let plot_h = self.bottom() - MARGIN.top;
        MARGIN.top + plot_h * (1.0 - bytes as f64 / self.max_bytes as f64)
    }

    /// The SVG's opening tag, `title`, the plot frame and both axes' labels
    /// (0, half and all of each).
    fn open(&self, class: &str, title: &str) -> String {
        let (w, h, left, top) = (self.width, self.height, MARGIN.left, MARGIN.top);
        let (plot_w, plot_h) = (self.plot_width(), self.bottom() - MARGIN.top);
        let mut svg = format!(
            "<svg class=\"chart {class}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" \
             height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\n<title>{}</title>\n\
             <rect x=\"{left}\" y=\"{top}\" width=\"{plot_w}\" height=\"{plot_h}\" \
             fill=\"#fafafa\" stroke=\"#999\"/>\n",
            escape(title)
        );
        for fraction in [0.0, 0.5, 1.0] {
            let bytes = (self.max_bytes as f64 * fraction) as u64;
            let _ = writeln!(
                svg,
                "<line x1=\"{left}\" x2=\"{0:.1}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{2}\" y=\"{1:.1}\" text-anchor=\"end\" dominant-baseline=\"middle\">\
                 {3}</text>",
                left + plot_w,
                self.y(bytes),
                left - 6.0,
                format_bytes(bytes)
            );
        }
        for fraction in [0.0, 0.5, 1.0] {
            let t_ns = (self.end_ns as f64 * fraction) as u64;
            let anchor = ["start", "middle", "end"][(fraction * 2.0) as usize];
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
                self.x(t_ns),
                self.bottom() + 16.0,
                seconds(t_ns)
            );
        }
        svg
    }

    /// A polyline of `class` through `(time, bytes)` points; `style` holds
    /// its stroke attributes.
    fn polyline(
        &self,
        class: &str,
        style: &str,
        points: impl Iterator<Item = (u64, u64)>,
    ) -> String {
        let points: Vec<String> = points
            .map(|(t_ns, bytes)| format!("{:.1},{:.1}", self.x(t_ns), self.y(bytes)))
            .collect();
        format!(
            "<polyline class=\"{class}\" points=\"{}\" fill=\"none\" {style}/>\n",
            points.join(" ")
        )
    }

    /// The plot shaded from `t_ns` to its right edge.
    fn shade_after(&self, t_ns: u64) -> String {
        let from = self.x(t_ns);
        format!(
            "<rect class=\"after-end\" x=\"{from:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{:.1}\" \
             fill=\"#e4e4e4\"/>\n",
            MARGIN.top,
            MARGIN.left + self.plot_width() - from,
            self.bottom() - MARGIN.top
        )
    }

    /// A mark at `t_ns`: a tick above the plot, a faint dashed line across
    /// it, a wider invisible line to hover, and `label` (also its tooltip)
    /// shown only on hover, anchored so it stays inside the chart.
    fn mark(&self, class: &str, color: &str, t_ns: u64, label: &str) -> String {
        let (x, top, bottom) = (self.x(t_ns), MARGIN.top, self.bottom());
        let anchor = if x < self.width / 3.0 {
            "start"
        } else if x > self.width * 2.0 / 3.0 {
            "end"
        } else {
            "middle"
        };
        let label = escape(label);
        format!(
            "<g class=\"mark {class}\"><title>{label}</title>\
             <line class=\"mark-hit\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{bottom}\" \
             stroke=\"transparent\" stroke-width=\"7\"/>\
             <line class=\"tick\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{top}\" \
             stroke=\"{color}\" stroke-width=\"2\"/>\
             <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top}\" y2=\"{bottom}\" stroke=\"{color}\" \
             stroke-opacity=\"0.35\" stroke-dasharray=\"3 2\"/>\
             <text class=\"mark-label\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" \
             fill=\"{color}\">{label}</text></g>\n",
            top - TICK,
            top - TICK,
            top + 12.0,
        )
    }
}

/// The time axis end: the run's duration, or the latest time any process
/// shows when that is later (or the duration is unknown).
pub(super) fn chart_end_ns(report: &Report) -> u64 {
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

/// The processes of the overview chart: those whose RSS grew, most first
/// (the report's order), at most [`MAX_OVERVIEW_LINES`]; and how many
/// growing ones were left out.
pub(super) fn growing(report: &Report) -> (Vec<&ProcessReport>, usize) {
    let grew: Vec<&ProcessReport> = report
        .processes
        .iter()
        .filter(|p| !p.timeline.is_empty() && p.rss.is_some_and(|r| r.growth_bytes > 0))
        .collect();
    let left_out = grew.len().saturating_sub(MAX_OVERVIEW_LINES);
    (
        grew.into_iter().take(MAX_OVERVIEW_LINES).collect(),
        left_out,
    )
}

/// Forks of traced children (image 0 of a process with a traced parent):
/// (parent, tooltip, time).
fn forks(report: &Report) -> Vec<(&ProcessReport, String, u64)> {
    report
        .processes
        .iter()
        .filter(|c| c.image == 0)
        .filter_map(|c| {
            let parent = report.process(c.parent?).filter(|p| p.id != c.id)?;
            let tooltip = format!("forked {} at {}", c.name(), seconds(c.started_ns));
            Some((parent, tooltip, c.started_ns))
        })
        .collect()
}

/// The mark where image `p` ends (exec or start of its exit), if it ended.
fn end_mark(plot: &Plot, p: &ProcessReport, who: &str) -> Option<String> {
    let ended_ns = p.ended_ns()?;
    let mark = if p.exec_ns.is_some() {
        let label = format!(
            "{who}exec'd at {}: the next image starts",
            seconds(ended_ns)
        );
        plot.mark("exec-mark", END_COLOR, ended_ns, &label)
    } else {
        let how = p
            .exit_status
            .map_or_else(|| "exit".to_owned(), |status| status.to_string());
        let label = format!("{who}began to exit at {} ({how})", seconds(ended_ns));
        plot.mark("exit-mark", END_COLOR, ended_ns, &label)
    };
    Some(mark)
}

/// The overview chart (`#rss-chart`): the RSS of each growing process over
/// the run on one axis, a legend naming each (kind, tgid, command, growth),
/// the forks of traced children and the ends of the processes drawn.
pub(super) fn overview(report: &Report) -> String {
    let (shown, left_out) = growing(report);
    let mut html = String::from(
        "<figure id=\"rss-chart\">\n<figcaption>RSS of the growing processes \
         (ticks: <span class=\"fork\">forks</span>, <span class=\"end\">exits and execs</span>; \
         hover for details)</figcaption>\n",
    );
    if shown.is_empty() {
        html.push_str("<p>No traced process grew.</p>\n</figure>\n");
        return html;
    }
    let highest = shown
        .iter()
        .flat_map(|p| p.timeline.iter().map(|point| point.rss_bytes))
        .max()
        .unwrap_or(0);
    let plot = Plot::new(640.0, 230.0, chart_end_ns(report), highest);
    let mut svg = plot.open("overview", "RSS of the growing processes over time");
    for (index, p) in shown.iter().enumerate() {
        let style = format!("stroke=\"{}\" stroke-width=\"2\"", PALETTE[index]);
        let points = p.timeline.iter().map(|point| (point.t_ns, point.rss_bytes));
        svg.push_str(&plot.polyline("rss-line", &style, points));
    }
    for (_, tooltip, t_ns) in forks(report) {
        svg.push_str(&plot.mark("fork-mark", FORK_COLOR, t_ns, &tooltip));
    }
    for p in &shown {
        let who = format!("{} ", p.name());
        svg.extend(end_mark(&plot, p, &who));
    }
    svg.push_str("</svg>\n");
    html.push_str(&svg);
    html.push_str(&legend(&shown, left_out));
    html.push_str("</figure>\n");
    html
}

/// The overview's legend: a swatch, kind, name, short command and growth
/// per process, and how many growing ones are not drawn.
fn legend(shown: &[&ProcessReport], left_out: usize) -> String {
    let mut html = String::from("<ul class=\"legend\">");
    for (index, p) in shown.iter().enumerate() {
        let growth = p.rss.map_or(0, |r| r.growth_bytes);
        let _ = write!(
            html,
            "<li><span class=\"swatch\" style=\"background:{}\"></span>{} {} \
             <code>{}</code> {}</li>",
            PALETTE[index],
            p.kind,
            escape(&p.name()),
            escape(&text::short_command(&p.cmdline, 32)),
            format_signed_bytes(growth)
        );
    }
    if left_out > 0 {
        let _ = write!(html, "<li>… {left_out} more growing (table below)</li>");
    }
    html.push_str("</ul>\n");
    html
}

/// One chart per process image in `order` (`#rss`), collapsed: each image's
/// RSS, anonymous and USS lines, the forks of its traced children and its
/// end.
pub(super) fn per_image(report: &Report, order: &[&ProcessReport]) -> String {
    let mut html = format!(
        "<section id=\"rss\">\n<details>\n<summary><h2>RSS of each process image ({})</h2>\
         </summary>\n<p>Solid: RSS, dashed: anonymous, dotted: private (USS) when read; blue \
         ticks: a traced child was forked; red: the image exec'd or began to exit, where its \
         numbers end (shaded after). Hover a tick for details.</p>\n<div class=\"charts\">\n",
        order.len()
    );
    let end_ns = chart_end_ns(report);
    let forks = forks(report);
    for p in order {
        let _ = writeln!(
            html,
            "<figure class=\"rss\" id=\"rss-{}\">\n<figcaption>{} <code>{}</code>: {}\
             </figcaption>",
            p.id,
            escape(&p.name()),
            escape(&text::short_command(&p.cmdline, super::MAX_COMMAND_CHARS)),
            escape(&text::ended_text(p))
        );
        if p.timeline.is_empty() {
            html.push_str("<p>No RSS was read for this process.</p>\n");
        } else {
            let own: Vec<(&str, u64)> = forks
                .iter()
                .filter(|(parent, _, _)| parent.id == p.id)
                .map(|(_, tooltip, t_ns)| (tooltip.as_str(), *t_ns))
                .collect();
            html.push_str(&image_chart(p, &own, end_ns));
        }
        html.push_str("</figure>\n");
    }
    html.push_str("</div>\n</details>\n</section>\n");
    html
}

/// One image's chart: RSS, anonymous RSS and USS (when read) over
/// `0..=end_ns` (the run's axis, shared by every chart), `forks` as
/// (tooltip, time) marks, the image's end as a mark with the time after it
/// shaded.
pub(super) fn image_chart(p: &ProcessReport, forks: &[(&str, u64)], end_ns: u64) -> String {
    let highest = p
        .timeline
        .iter()
        .map(|point| point.rss_bytes.max(point.uss_bytes.unwrap_or(0)))
        .max()
        .unwrap_or(0);
    let plot = Plot::new(620.0, 180.0, end_ns, highest);
    let mut svg = plot.open("rss", &format!("RSS of {} over time", p.name()));
    if let Some(ended_ns) = p.ended_ns() {
        svg.push_str(&plot.shade_after(ended_ns));
    }
    let line = |value: fn(&RssPoint) -> Option<u64>| {
        p.timeline
            .iter()
            .filter_map(move |point| value(point).map(|bytes| (point.t_ns, bytes)))
    };
    if line(|point| point.uss_bytes).next().is_some() {
        let style = "stroke=\"#309050\" stroke-width=\"1.5\" stroke-dasharray=\"1 2\"";
        svg.push_str(&plot.polyline("uss", style, line(|point| point.uss_bytes)));
    }
    let anon = "stroke=\"#e08030\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"";
    svg.push_str(&plot.polyline("anon", anon, line(|point| Some(point.anon_bytes))));
    let rss = "stroke=\"#2060c0\" stroke-width=\"2\"";
    svg.push_str(&plot.polyline("rss-line", rss, line(|point| Some(point.rss_bytes))));
    if let [only] = p.timeline.as_slice() {
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#2060c0\"/>",
            plot.x(only.t_ns),
            plot.y(only.rss_bytes)
        );
    }
    for (tooltip, t_ns) in forks {
        svg.push_str(&plot.mark("fork-mark", FORK_COLOR, *t_ns, tooltip));
    }
    svg.extend(end_mark(&plot, p, ""));
    svg.push_str("</svg>\n");
    svg
}
