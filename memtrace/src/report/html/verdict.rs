//! The diagnosis on the HTML page: the verdict first (`#verdict`: each
//! cause's pattern, processes, what, how much, where and next step, the
//! same words as the terminal's, from [`crate::report::verdict::verdict`])
//! and every finding per process further down, collapsed (`#findings`).

use std::fmt::Write as _;

use super::{escape, list, text};
use crate::aggregate::Report;
use crate::diagnose::{Diagnosed, Finding, Strength};
use crate::report::verdict::{self, CauseText};

/// Class of a cause or finding of `strength`: its border colour.
fn strength_class(strength: Strength) -> &'static str {
    match strength {
        Strength::Strong => "strong",
        Strength::Weak => "weak",
    }
}

/// The verdict section: a heading, one entry per cause shown in full, the
/// causes left out, and one line per weak cause also seen.
pub(super) fn verdict_section(report: &Diagnosed) -> String {
    let mut html = String::from("<section id=\"verdict\">\n");
    if report.causes.is_empty() {
        html.push_str("<h2>Verdict</h2>\n<p>This report was not diagnosed.</p>\n</section>\n");
        return html;
    }
    let verdict = verdict::verdict(report);
    let _ = writeln!(html, "<h2>{}</h2>", escape(&verdict.heading));
    for note in &verdict.notes {
        let _ = writeln!(html, "<p class=\"note\">{}</p>", escape(note));
    }
    html.push_str("<ol class=\"causes\">\n");
    for cause in &verdict.causes {
        cause_html(cause, &mut html);
    }
    html.push_str("</ol>\n");
    if verdict.more_causes > 0 {
        let _ = writeln!(
            html,
            "<p class=\"more\">… {} more cause(s): see every finding below.</p>",
            verdict.more_causes
        );
    }
    for brief in &verdict.also_seen {
        let _ = writeln!(
            html,
            "<p class=\"also\">Also seen (weak evidence): {}</p>",
            escape(brief)
        );
    }
    if verdict.more_also_seen > 0 {
        let _ = writeln!(
            html,
            "<p class=\"also\">Also seen: {} more weak cause(s).</p>",
            verdict.more_also_seen
        );
    }
    html.push_str("</section>\n");
    html
}

/// One cause: `pattern in who` as its heading, then what, how much, where
/// (one line per place) and next as a definition list.
fn cause_html(cause: &CauseText, html: &mut String) {
    let _ = writeln!(
        html,
        "<li class=\"cause {}\"><p class=\"cause-head\"><span class=\"pattern\">{}</span> in \
         {}</p>\n<dl>",
        strength_class(cause.strength),
        escape(&cause.patterns),
        escape(&cause.who)
    );
    let mut row = |term: &str, text: &str| {
        let _ = writeln!(html, "<dt>{term}</dt><dd>{}</dd>", escape(text));
    };
    if let Some(what) = &cause.what {
        row("what", what);
    }
    if let Some(amount) = &cause.how_much {
        row("how much", amount);
    }
    for (index, place) in cause.places.iter().enumerate() {
        row(if index == 0 { "where" } else { "" }, place);
    }
    row("next", &cause.next);
    html.push_str("</dl></li>\n");
}

/// Every finding, most important first, collapsed under a summary that
/// counts them.
pub(super) fn findings_section(report: &Diagnosed) -> String {
    let findings = &report.diagnosis;
    let mut html = format!(
        "<section id=\"findings\">\n<details>\n<summary><h2>All findings, per process \
         ({})</h2></summary>\n",
        findings.len()
    );
    if findings.is_empty() {
        html.push_str("<p>This report was not diagnosed.</p>\n");
    }
    for finding in findings {
        finding_html(report, finding, &mut html);
    }
    html.push_str("</details>\n</section>\n");
    html
}

/// One finding: pattern and scope, summary, caveat when weak, evidence,
/// code paths and next step.
fn finding_html(report: &Report, finding: &Finding, html: &mut String) {
    let _ = writeln!(
        html,
        "<div class=\"finding {}\">\n<p><span class=\"pattern\">{}</span> in {}: {}</p>",
        strength_class(finding.strength),
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
