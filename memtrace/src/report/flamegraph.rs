//! Flame-graph renderer of the report step: the folded stacks
//! ([`super::folded`], weighed by `--weight`: bytes held at the high-water
//! mark by default) drawn as an SVG by the inferno library, bytes as the
//! unit, inferno's memory palette, colours chosen by name so the output is
//! reproducible.

use std::io::{self, Write};

use inferno::flamegraph::{
    self, color::BasicPalette, Direction, Options, Palette, TextTruncateDirection,
};

use super::{folded, text, verdict, RenderOptions};
use crate::aggregate::{ProcessId, Report};
use crate::diagnose::{Diagnosed, Scope};

/// Width of the drawing (inferno's default), in pixels. The standalone SVG
/// stretches to its window with inferno's script; the inline one keeps it.
const IMAGE_WIDTH: usize = 1200;

/// Most characters of the subtitle: about what fits in [`IMAGE_WIDTH`] at
/// inferno's default font (12 px, 0.59 em per character).
const MAX_SUBTITLE_CHARS: usize = 160;

/// Most characters of the command in the title of the inline graph: about
/// what fits in [`IMAGE_WIDTH`] at inferno's title font (17 px).
const MAX_INLINE_TITLE_COMMAND_CHARS: usize = 80;

/// Height of the SVG drawn when no growth was sampled, in pixels.
const EMPTY_HEIGHT: usize = 60;

/// Writes an SVG flame graph of the sampled paths of every process image, or
/// only of image `process`, weighed by `options.weight`: one tower per image
/// (its root frame is `<command> (tgid N)`, named like [`super::folded`]),
/// frame widths in bytes. `options.inverted` draws an
/// icicle graph. The title names the run (and the process); the subtitle is
/// the verdict's first cause and its largest place (for one image's graph,
/// the first finding about it), if any. With no sampled growth, a small SVG
/// that says so. Interactive (search, zoom) through inferno's embedded
/// script.
///
/// # Errors
/// Any error of `out`.
pub fn render(
    report: &Diagnosed,
    options: &RenderOptions,
    process: Option<ProcessId>,
    out: &mut dyn Write,
) -> io::Result<()> {
    draw(report, options, process, None, out)
}

/// [`render`] of the whole tree at a fixed width, to embed inline in a page:
/// inferno's script only stretches a "fluid" graph by taking the page's
/// first `<svg>` as its own, which in a page with other SVGs it is not.
pub(crate) fn render_inline(
    report: &Diagnosed,
    options: &RenderOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    draw(report, options, None, Some(IMAGE_WIDTH), out)
}

/// Draws the graph; `image_width` `None` is inferno's fluid width.
fn draw(
    report: &Diagnosed,
    options: &RenderOptions,
    process: Option<ProcessId>,
    image_width: Option<usize>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let lines: Vec<String> = folded::lines(report, options.weight, process)
        .into_iter()
        .map(|(stack, bytes)| format!("{stack} {bytes}"))
        .collect();
    // The inline graph does not stretch: a longer title would be clipped.
    let title = title(
        report,
        options,
        process,
        image_width.map(|_| MAX_INLINE_TITLE_COMMAND_CHARS),
    );
    let subtitle = match process {
        None => verdict_line(report),
        Some(id) => process_finding_line(report, id),
    };
    let drawing = Drawing {
        title,
        subtitle,
        inverted: options.inverted,
        image_width,
        weight_described: options.weight.describe(),
    };
    draw_lines(&lines, drawing, out)
}

/// How [`draw_lines`] draws a graph.
pub(crate) struct Drawing {
    /// Its title.
    pub title: String,
    /// One line under the title, cut to fit, if any.
    pub subtitle: Option<String>,
    /// Drawn as an icicle graph.
    pub inverted: bool,
    /// Fixed width in pixels; `None` is inferno's fluid width.
    pub image_width: Option<usize>,
    /// Which bytes weigh the lines, as words (`held at peak`): said when no
    /// line has any.
    pub weight_described: &'static str,
}

/// Draws folded `lines` (`frame;frame;leaf BYTES`, sorted) as an SVG flame
/// graph in bytes with inferno's memory palette, deterministic colours;
/// with no lines, a small SVG that says so.
///
/// # Errors
/// Any error of `out`.
pub(crate) fn draw_lines(
    lines: &[String],
    drawing: Drawing,
    out: &mut dyn Write,
) -> io::Result<()> {
    if lines.is_empty() {
        return empty(&drawing.title, drawing.weight_described, out);
    }
    let mut inferno = Options::default();
    inferno.title = drawing.title;
    inferno.subtitle = drawing.subtitle.map(|line| subtitle(&line));
    inferno.count_name = "bytes".to_owned();
    inferno.colors = Palette::Basic(BasicPalette::Mem);
    inferno.deterministic = true;
    inferno.direction = if drawing.inverted {
        Direction::Inverted
    } else {
        Direction::Straight
    };
    inferno.image_width = drawing.image_width;
    // A label too long for its frame keeps its start (the function name)
    // and loses its end (the file and line).
    inferno.text_truncate_direction = TextTruncateDirection::Right;
    flamegraph::from_lines(&mut inferno, lines.iter().map(String::as_str), out)
}

/// The verdict's first cause in one line, as the terminal's verdict words
/// it: `retention in 4 workers (tgid …): render_report (app.py:84): 116.0
/// MiB held at the end (…)`; `None` when there is no cause.
fn verdict_line(report: &Diagnosed) -> Option<String> {
    let verdict = verdict::verdict(report);
    let cause = verdict.causes.first()?;
    let mut line = format!("{} in {}", cause.patterns, cause.who);
    if let Some(place) = cause.places.first() {
        line.push_str(": ");
        line.push_str(place);
    }
    Some(line)
}

/// The first finding about image `process` alone, for its own graph.
fn process_finding_line(report: &Diagnosed, process: ProcessId) -> Option<String> {
    report
        .diagnosis
        .iter()
        .find(|f| matches!(f.scope, Scope::Process { process: id, .. } if id == process))
        .map(|finding| text::finding_line(report, finding))
}

/// `line` cut to [`MAX_SUBTITLE_CHARS`] (with `…`), so it fits the width.
fn subtitle(line: &str) -> String {
    if line.chars().count() <= MAX_SUBTITLE_CHARS {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(MAX_SUBTITLE_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// `memtrace: memory held at peak by `command`` (and `, tgid N (command)`
/// for one process image).
/// With `max_command_chars`, the command is cut to that many characters
/// from the left, so the script stays.
fn title(
    report: &Report,
    options: &RenderOptions,
    process: Option<ProcessId>,
    max_command_chars: Option<usize>,
) -> String {
    let command = &report.meta.command;
    let command =
        max_command_chars.map_or_else(|| command.clone(), |max| text::short_command(command, max));
    let mut title = format!(
        "memtrace: memory {} by `{command}`",
        options.weight.describe(),
    );
    if let Some(id) = process {
        title.push_str(&format!(", {} ({})", report.name(id), report.label(id)));
    }
    title
}

/// A valid SVG holding `title` and a line saying no path has bytes
/// `weight_described` (inferno only draws an error message without input).
fn empty(title: &str, weight_described: &str, out: &mut dyn Write) -> io::Result<()> {
    let middle = IMAGE_WIDTH / 2;
    writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{IMAGE_WIDTH}\" \
         height=\"{EMPTY_HEIGHT}\" viewBox=\"0 0 {IMAGE_WIDTH} {EMPTY_HEIGHT}\">"
    )?;
    writeln!(
        out,
        "<text x=\"{middle}\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">{}</text>",
        super::markup::escape(title)
    )?;
    writeln!(
        out,
        "<text x=\"{middle}\" y=\"48\" text-anchor=\"middle\" font-size=\"12\">\
         no sampled path has bytes {weight_described}</text>"
    )?;
    writeln!(out, "</svg>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Weight;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

    fn svg(report: &Diagnosed, options: &RenderOptions, process: Option<ProcessId>) -> String {
        let mut out = Vec::new();
        render(report, options, process, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn weighed(weight: Weight) -> RenderOptions {
        RenderOptions {
            weight,
            ..RenderOptions::default()
        }
    }

    #[test]
    fn frames_carry_bytes_and_the_title_names_the_run_and_weight() {
        let report = server_diagnosed();
        let text = svg(&report, &RenderOptions::default(), None);
        assert!(
            text.contains("memtrace: memory held at peak by `python3 server.py`"),
            "{text}"
        );
        // 36 MiB of 48 MiB under `append`, with bytes as the count name.
        assert!(
            text.contains("append (app/cache.py:42) (37,748,736 bytes, 75.00%)"),
            "{text}"
        );
        assert!(text.contains("var inverted = false"), "{text}");
        let top = verdict_line(&report).expect("a cause");
        assert!(top.starts_with(&format!(
            "{} in ",
            verdict::verdict(&report).causes[0].patterns
        )));
        assert!(text.contains(&html_escaped(&subtitle(&top))), "{text}");
    }

    /// `text` as inferno escapes it in the SVG.
    fn html_escaped(text: &str) -> String {
        crate::report::markup::escape(text).replace("&#39;", "'")
    }

    #[test]
    fn the_weight_sets_frame_widths_and_title() {
        let report = lifecycle_diagnosed();
        let peak = svg(&report, &RenderOptions::default(), None);
        // handle_job: 50 MiB of 150 MiB held at peak.
        assert!(
            peak.contains("handle_job (app/jobs.py:20) (52,428,800 bytes, 33.33%)"),
            "{peak}"
        );
        let grown = svg(&report, &weighed(Weight::Grown), None);
        assert!(
            grown.contains("memtrace: memory grown by `python3 -m app`"),
            "{grown}"
        );
        // 120 MiB of 220 MiB grown.
        assert!(
            grown.contains("handle_job (app/jobs.py:20) (125,829,120 bytes, 54.55%)"),
            "{grown}"
        );
        let end = svg(&report, &weighed(Weight::End), None);
        assert!(
            end.contains("handle_job (app/jobs.py:20) (41,943,040 bytes, 30.77%)"),
            "{end}"
        );
    }

    #[test]
    fn two_processes_on_one_tgid_are_two_towers() {
        let text = svg(&lifecycle_diagnosed(), &RenderOptions::default(), None);
        // 60 MiB (50 + 10) and 30 MiB of 150 MiB.
        assert!(
            text.contains("python3 -m app (tgid 201) (62,914,560 bytes, 40.00%)"),
            "{text}"
        );
        assert!(
            text.contains("python3 -m app (tgid 201#2) (31,457,280 bytes, 20.00%)"),
            "{text}"
        );
    }

    #[test]
    fn inverted_draws_icicles_and_output_is_deterministic() {
        let options = RenderOptions {
            inverted: true,
            ..RenderOptions::default()
        };
        let first = svg(&server_diagnosed(), &options, None);
        assert!(first.contains("var inverted = true"), "{first}");
        assert_eq!(first, svg(&server_diagnosed(), &options, None));
    }

    #[test]
    fn one_process_graph_holds_only_that_process() {
        let report = prefork_diagnosed();
        let id_of = |tgid| report.processes.iter().find(|p| p.tgid == tgid).unwrap().id;
        let text = svg(&report, &RenderOptions::default(), Some(id_of(102)));
        assert!(text.contains("gunicorn app:wsgi (tgid 102)"), "{text}");
        assert!(!text.contains("(tgid 101)"), "{text}");
        assert!(text.contains(", tgid 102 (gunicorn app:wsgi)"), "{text}");
    }

    #[test]
    fn nothing_of_the_weight_is_a_valid_svg_saying_so() {
        let report = prefork_diagnosed();
        let master = report.processes.iter().find(|p| p.tgid == 100).unwrap().id;
        let text = svg(&report, &RenderOptions::default(), Some(master));
        assert!(
            text.contains("no sampled path has bytes held at peak"),
            "{text}"
        );
        assert!(text.starts_with("<svg xmlns="), "{text}");
        assert!(text.contains(", tgid 100 (gunicorn app:wsgi)"), "{text}");
    }

    #[test]
    fn long_subtitles_are_cut() {
        assert_eq!(subtitle("short"), "short");
        let cut = subtitle(&"x".repeat(500));
        assert_eq!(cut.chars().count(), MAX_SUBTITLE_CHARS);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn inline_form_has_a_fixed_width() {
        let report = server_diagnosed();
        let mut out = Vec::new();
        render_inline(&report, &RenderOptions::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("var fluiddrawing = false"), "{text}");
        let standalone = svg(&report, &RenderOptions::default(), None);
        assert!(
            standalone.contains("var fluiddrawing = true"),
            "{standalone}"
        );
        // Labels are cut from the right: function names stay.
        assert!(
            standalone.contains("var truncate_text_right = true"),
            "{standalone}"
        );
    }

    #[test]
    fn the_inline_title_fits_its_width() {
        let mut report = server_diagnosed();
        let script = "/srv/app/server.py --workers 4 --queue redis://cache:6379/0";
        report.report.meta.command = format!("/usr/bin/python3.12 {script} {}", "-v ".repeat(40));
        let mut out = Vec::new();
        render_inline(&report, &RenderOptions::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let title = text.split("id=\"title\"").nth(1).unwrap();
        let title = &title[title.find('>').unwrap() + 1..title.find("</text>").unwrap()];
        // 17 px at about 0.6 em per character.
        assert!(
            title.chars().count() as f64 * 17.0 * 0.6 < IMAGE_WIDTH as f64,
            "{title}"
        );
        // The script and its first arguments stay; the rest is cut.
        assert!(
            title.starts_with("memtrace: memory held at peak by `server.py --workers 4 "),
            "{title}"
        );
        assert!(title.ends_with(" …`"), "{title}");
    }
}
