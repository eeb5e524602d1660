//! The verdict of the report step: the diagnosis's causes
//! ([`crate::diagnose::Cause`]) as the few lines that answer the five
//! questions of a memory incident — which process, which pattern, which
//! line, how much and how fast, what to do next. The terminal prints it last
//! (what stays on the screen), the HTML page first. At most
//! [`MAX_VERDICT_LINES`] lines: strong causes in full (at most
//! [`MAX_CAUSES_SHOWN`]), weak ones in a few words each on one "also seen"
//! line; before them, how the run ended when a signal (the OOM killer
//! named) or a cut capture ended it, and that no Python was traced
//! ([`super::notes`]).

use crate::aggregate::{ProcessKind, ProcessReport, Report};
use crate::diagnose::{
    measure_name, Cause, Diagnosed, Pattern, Place, ProcessAmount, Scope, Strength,
};
use crate::units::format_bytes;

use super::text::{self, pattern_name, short_command};

/// Most lines of the verdict, its heading included.
pub(crate) const MAX_VERDICT_LINES: usize = 29;

/// Strong causes shown in full; the rest are counted.
const MAX_CAUSES_SHOWN: usize = 3;

/// Weak causes named on the "also seen" line; the rest are counted.
const MAX_ALSO_SEEN: usize = 3;

/// Most tgids named in a cause's heading; the rest are counted.
const MAX_TGIDS_NAMED: usize = 6;

/// Most characters of a command in a cause's heading.
const MAX_COMMAND_CHARS: usize = 40;

/// A place's sampling error is said from this fraction of its bytes on
/// (one standard error, [`Place::uncertainty`]: with every sample at the
/// default 512 KiB mean and a third of its size, about 15 MiB). 0.15.
const SAY_UNCERTAINTY_FROM: f64 = 0.15;

/// Traced time from which growth rates are given per minute, not per
/// second. 2 min.
const PER_MINUTE_FROM_NS: u64 = 120_000_000_000;

/// The verdict as parts, for a renderer that lays it out (the HTML page);
/// [`lines`] is its terminal form. Both read the same words.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Verdict {
    /// `Verdict: N cause(s)` (and the caveat when nothing is strong).
    pub heading: String,
    /// What the reader must know of the run before its causes: how it
    /// ended when a signal or a cut capture ended it, and that no Python
    /// was traced; at most four lines ([`super::notes::lines`]).
    pub notes: Vec<String>,
    /// The causes shown in full, most important first.
    pub causes: Vec<CauseText>,
    /// Causes of the same strength left out (past [`MAX_CAUSES_SHOWN`]).
    pub more_causes: usize,
    /// A few words per weak cause shown beside strong ones ([`brief`]).
    pub also_seen: Vec<String>,
    /// Weak causes left out (past [`MAX_ALSO_SEEN`]).
    pub more_also_seen: usize,
}

/// One cause shown in full: the answers to the five questions.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CauseText {
    /// Its rank, from 1.
    pub number: usize,
    /// Whether its evidence is strong.
    pub strength: Strength,
    /// Which pattern(s): `one process grows + retention`.
    pub patterns: String,
    /// Which processes: `4 workers (tgid 1, 2, 3, 4: app.py)`.
    pub who: String,
    /// What the first finding says (`largest: ` when about the most grown
    /// of several processes, `for one of them: ` when about another).
    pub what: Option<String>,
    /// How much and how fast.
    pub how_much: Option<String>,
    /// Where in the code, largest first.
    pub places: Vec<String>,
    /// What to do next.
    pub next: String,
    /// Why its evidence is weak and what would settle it (its first
    /// finding's `weak evidence:` line), for a weak cause.
    pub weak_because: Option<String>,
}

/// The verdict's lines, heading first, without line ends: each strong cause
/// (most important first) as a numbered heading and its `what`, `how much`,
/// `where` and `next` lines, then one line per weak cause. When nothing is
/// strong, the weak causes are shown in full instead.
pub(crate) fn lines(report: &Diagnosed) -> Vec<String> {
    let verdict = verdict(report);
    let mut lines = vec![verdict.heading.clone()];
    lines.extend(verdict.notes.iter().map(|line| format!("  {line}")));
    for cause in &verdict.causes {
        lines.extend(cause_lines(cause));
    }
    if verdict.more_causes > 0 {
        lines.push(format!(
            "  … {} more cause(s): memtrace report --verbose, or the JSON",
            verdict.more_causes
        ));
    }
    if !verdict.also_seen.is_empty() {
        let mut briefs = verdict.also_seen.clone();
        if verdict.more_also_seen > 0 {
            briefs.push(format!("{} more", verdict.more_also_seen));
        }
        lines.push(format!("  also seen, weak evidence: {}", briefs.join("; ")));
    }
    // At most 1 + 4 notes + 3 causes x (heading, what, how much, 2
    // places, next, weak) + 2.
    debug_assert!(lines.len() <= MAX_VERDICT_LINES, "{lines:#?}");
    lines
}

/// The verdict of `report` as parts: the strong causes in full (at most
/// [`MAX_CAUSES_SHOWN`]) and the weak ones briefly, or the weak ones in
/// full when nothing is strong.
pub(crate) fn verdict(report: &Diagnosed) -> Verdict {
    let of = |strength| -> Vec<&Cause> {
        report
            .causes
            .iter()
            .filter(|c| c.strength == strength)
            .collect()
    };
    let (strong, weak) = (of(Strength::Strong), of(Strength::Weak));
    let (full, also) = if strong.is_empty() {
        (weak, Vec::new())
    } else {
        (strong, weak)
    };
    Verdict {
        heading: heading(&full),
        notes: super::notes::lines(report),
        causes: full
            .iter()
            .take(MAX_CAUSES_SHOWN)
            .enumerate()
            .map(|(index, cause)| cause_text(report, index + 1, cause))
            .collect(),
        more_causes: full.len().saturating_sub(MAX_CAUSES_SHOWN),
        also_seen: also
            .iter()
            .take(MAX_ALSO_SEEN)
            .map(|cause| brief(report, cause))
            .collect(),
        more_also_seen: also.len().saturating_sub(MAX_ALSO_SEEN),
    }
}

/// `Verdict: N cause(s) ...`.
fn heading(full: &[&Cause]) -> String {
    let sure = match full.first().map(|c| c.strength) {
        Some(Strength::Weak) => ", weak evidence: the numbers point this way but do not settle it",
        _ => "",
    };
    format!(
        "Verdict: {}{sure}",
        text::counted(full.len() as u64, "cause", "causes")
    )
}

/// A cause in full: pattern, who, what, how much, where, next.
fn cause_text(report: &Diagnosed, number: usize, cause: &Cause) -> CauseText {
    let what = cause.findings.first().map(|&first| {
        let finding = &report.diagnosis[first];
        let about = match finding.scope {
            Scope::Process { process, .. } => Some(process),
            Scope::Tree => None,
        };
        // `cause.processes` is most grown first: "largest" only for it.
        let prefix = match (cause.tree || cause.processes.len() < 2, about) {
            (true, _) | (false, None) => "",
            (false, Some(id)) if Some(&id) == cause.processes.first() => "largest: ",
            (false, Some(_)) => "for one of them: ",
        };
        format!("{prefix}{}", finding.summary)
    });
    CauseText {
        number,
        strength: cause.strength,
        patterns: patterns(report, cause),
        who: who(report, cause),
        what,
        how_much: how_much(report, cause),
        places: cause
            .places
            .iter()
            .enumerate()
            .map(|(index, place)| {
                let above = index.checked_sub(1).map(|i| &cause.places[i]);
                place_text(cause, place, above)
            })
            .collect(),
        next: cause.next_step.clone(),
        weak_because: weak_because(report, cause),
    }
}

/// The first reason a weak cause's first finding gives (its last evidence
/// line is `weak evidence: A; B; ...`; each reason says what would settle
/// it), and how many more there are.
fn weak_because(report: &Diagnosed, cause: &Cause) -> Option<String> {
    if cause.strength != Strength::Weak {
        return None;
    }
    let first = &report.diagnosis[*cause.findings.first()?];
    let reasons = first
        .evidence
        .iter()
        .rev()
        .find_map(|line| line.strip_prefix("weak evidence: "))?;
    let mut reasons = reasons.split("; ");
    let first = reasons.next()?;
    Some(match reasons.count() {
        0 => first.to_owned(),
        more => format!("{first} (and {more} more reason(s): --verbose)"),
    })
}

/// A cause's terminal lines: a numbered heading and its `what`, `how
/// much`, `where` and `next` lines.
fn cause_lines(cause: &CauseText) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>3}. {} in {}",
        cause.number, cause.patterns, cause.who
    )];
    if let Some(what) = &cause.what {
        lines.push(format!("     what:     {what}"));
    }
    if let Some(amount) = &cause.how_much {
        lines.push(format!("     how much: {amount}"));
    }
    for (index, place) in cause.places.iter().enumerate() {
        let label = if index == 0 { "where:   " } else { "         " };
        lines.push(format!("     {label} {place}"));
    }
    lines.push(format!("     next:     {}", cause.next));
    if let Some(reason) = &cause.weak_because {
        lines.push(format!("     weak:     {reason}"));
    }
    lines
}

/// A weak cause in a few words: pattern, which processes, their summed
/// RSS growth, and its largest place: `retention in master tgid 4312 (+21.1
/// MiB, <module> (app.py:3), at import)`.
fn brief(report: &Diagnosed, cause: &Cause) -> String {
    let processes: Vec<&ProcessReport> = cause
        .processes
        .iter()
        .filter_map(|&id| report.process(id))
        .collect();
    let who = match processes.as_slice() {
        [p] => format!("{} {}", p.kind, p.name()),
        _ => who(report, cause),
    };
    let grown: i64 = processes
        .iter()
        .filter_map(|p| p.rss.map(|rss| rss.growth_bytes.max(0)))
        .sum();
    let mut details = vec![format!("+{}", format_bytes(grown.unsigned_abs()))];
    if let Some(place) = cause.places.first() {
        details.push(place.frame.short());
        if place.import_time {
            details.push("at import".to_owned());
        }
    }
    format!(
        "{} in {who} ({})",
        patterns(report, cause),
        details.join(", ")
    )
}

/// The cause's pattern and the others its growth also shows: `one process
/// grows + retention`. A pattern seen in only some of the cause's processes
/// names them (`one process grows (tgid 4312) + retention`), but for the
/// retention a cause is about (its smaller retainers joined it).
fn patterns(report: &Diagnosed, cause: &Cause) -> String {
    std::iter::once(cause.pattern)
        .chain(cause.also_patterns.iter().copied())
        .map(|pattern| {
            let tgids = pattern_tgids(report, cause, pattern);
            let partial = !cause.tree && !tgids.is_empty() && tgids.len() < cause.processes.len();
            if partial && !(pattern == cause.pattern && pattern == Pattern::Retention) {
                format!("{} (tgid {})", pattern_name(pattern), tgids.join(", "))
            } else {
                pattern_name(pattern).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The processes (`4312`, `4312#2`, `4312.1`: the process table's TGID
/// column) whose findings of `pattern` the cause groups.
fn pattern_tgids(report: &Diagnosed, cause: &Cause, pattern: Pattern) -> Vec<String> {
    cause
        .findings
        .iter()
        .map(|&i| &report.diagnosis[i])
        .filter(|f| f.pattern == pattern)
        .filter_map(|f| match f.scope {
            Scope::Process { process, .. } => report.process(process).map(text::process_column),
            Scope::Tree => None,
        })
        .collect()
}

/// The processes of a cause: `worker tgid 13429 (app.py)`, `4 workers
/// (tgid 1, 2, 3, 4: app.py)`, or `the process tree (4 workers)`.
fn who(report: &Report, cause: &Cause) -> String {
    let processes: Vec<&ProcessReport> = cause
        .processes
        .iter()
        .filter_map(|&id| report.process(id))
        .collect();
    if cause.tree {
        let workers = processes
            .iter()
            .filter(|p| p.kind == ProcessKind::Worker)
            .count();
        return match workers {
            0 => "the traced processes".to_owned(),
            n => format!(
                "the process tree ({})",
                text::counted(n as u64, "worker", "workers")
            ),
        };
    }
    let command = processes.first().map_or_else(String::new, |p| {
        short_command(&p.cmdline, MAX_COMMAND_CHARS)
    });
    match processes.as_slice() {
        [] => "no traced process".to_owned(),
        [p] => format!("{} {} ({command})", p.kind, p.name()),
        many => {
            let kind = many[0].kind;
            let noun = if many.iter().all(|p| p.kind == kind) {
                kind.plural()
            } else {
                "processes"
            };
            let list = text::process_list(report, &cause.processes, MAX_TGIDS_NAMED);
            format!("{} {noun} ({list}: {command})", many.len())
        }
    }
}

/// How much the cause is about and how it came, from its one
/// [`crate::diagnose::Amount`] (the numbers its headline quotes): one step
/// ("+120.0 MiB in 0.9 s at 2.1 s"), or a rate for steady growth, and what
/// was released while shutting down; for a spike, how high it rose.
/// `None` when none of its processes has an amount.
fn how_much(report: &Report, cause: &Cause) -> Option<String> {
    if cause.pattern == Pattern::Spike {
        return spike_height(report, cause);
    }
    let each: Vec<&ProcessAmount> = cause.amount.each.iter().filter(|a| a.bytes > 0).collect();
    let what = &cause.amount.what;
    let (min, max) = (
        each.iter().map(|a| a.bytes).min()?,
        each.iter().map(|a| a.bytes).max()?,
    );
    let longest_ns = each.iter().map(|a| a.life_ns).max().unwrap_or(0);
    let released: u64 = each.iter().map(|a| a.released_at_shutdown_bytes).sum();
    let shutdown = if released > 0 {
        format!("; released {} while shutting down", format_bytes(released))
    } else {
        String::new()
    };
    if let [one] = each.as_slice() {
        return Some(format!(
            "{what} +{}{}{shutdown}",
            format_bytes(one.bytes),
            how_it_came(one, longest_ns)
        ));
    }
    let total: u64 = each.iter().map(|a| a.bytes).sum();
    let range = if min == max {
        format!("+{} each", format_bytes(min))
    } else {
        format!("+{} to +{} each", format_bytes(min), format_bytes(max))
    };
    let came = if each.iter().all(|a| a.step.is_some()) {
        let longest_step = each
            .iter()
            .filter_map(|a| a.step)
            .map(|s| s.in_ns)
            .max()
            .unwrap_or(0);
        format!(
            "each in one step of at most {}",
            text::seconds(longest_step)
        )
    } else {
        let rates: Vec<f64> = each
            .iter()
            .map(|a| a.bytes as f64 / (a.life_ns.max(1) as f64 / 1e9))
            .collect();
        let (slow, fast) = (
            rates.iter().copied().fold(f64::MAX, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        );
        format!(
            "{} to {} each",
            rate(slow, longest_ns),
            rate(fast, longest_ns).trim_start_matches('+')
        )
    };
    Some(format!(
        "{what} {range}, +{} in all, within {}; {came}{shutdown}",
        format_bytes(total),
        text::seconds(longest_ns),
    ))
}

/// How one process's amount came: ` in 0.9 s at 2.1 s` for a step (with
/// the step's own bytes when it is not all of it), else ` in T, +R/s`.
fn how_it_came(amount: &ProcessAmount, longest_ns: u64) -> String {
    match amount.step {
        Some(step) if step.bytes >= amount.bytes => format!(
            " in {} at {}",
            text::seconds(step.in_ns),
            text::seconds(step.at_ns)
        ),
        Some(step) => format!(
            ", +{} of it in {} at {}",
            format_bytes(step.bytes),
            text::seconds(step.in_ns),
            text::seconds(step.at_ns)
        ),
        None => format!(
            " in {}, {}",
            text::seconds(amount.life_ns),
            rate(
                amount.bytes as f64 / (amount.life_ns.max(1) as f64 / 1e9),
                longest_ns
            )
        ),
    }
}

/// A rate of `bytes_per_s`, per minute when the longest life is at least
/// [`PER_MINUTE_FROM_NS`]: `+2.1 MiB/s`.
fn rate(bytes_per_s: f64, longest_ns: u64) -> String {
    if longest_ns >= PER_MINUTE_FROM_NS {
        format!("+{}/min", format_bytes((60.0 * bytes_per_s) as u64))
    } else {
        format!("+{}/s", format_bytes(bytes_per_s as u64))
    }
}

/// A native library as people name it: its file name up to `.so` or a
/// CPython extension's ABI tag, e.g. `libsqlite3` for `libsqlite3.so.0.8.6`
/// and `_json` for `_json.cpython-311-x86_64-linux-gnu.so`.
fn library_name(file_name: &str) -> &str {
    let end = [".so", ".cpython-", ".abi3"]
        .iter()
        .filter_map(|cut| file_name.find(cut))
        .min()
        .unwrap_or(file_name.len());
    &file_name[..end.max(1).min(file_name.len())]
}

/// A spike's height in its process: its RSS at the start, at the
/// high-water mark and at the end (the process table's START, PEAK, END),
/// and the rise its headline quotes.
fn spike_height(report: &Report, cause: &Cause) -> Option<String> {
    let rss = report.process(*cause.processes.first()?)?.rss?;
    let rise = cause.amount.each.first().map_or_else(
        || rss.peak_bytes.saturating_sub(rss.start_bytes),
        |a| a.bytes,
    );
    Some(format!(
        "RSS {} -> peak {} (+{}), {} at the end",
        format_bytes(rss.start_bytes),
        format_bytes(rss.peak_bytes),
        format_bytes(rise),
        format_bytes(rss.end_bytes)
    ))
}

/// `render_report (app.py:84) via dumps, at import: 48.5 MiB held at the
/// end (57% of the sampled)`; with the sampling error when it is large
/// (`; ±18% from 31 samples`), and, when byte sampling cannot tell it from
/// the place `above` it, that it is not ranked below it (`; as much as the
/// place above, within sampling error`).
fn place_text(cause: &Cause, place: &Place, above: Option<&Place>) -> String {
    let mut line = place.frame.short();
    if let Some(via) = &place.via {
        line.push_str(&format!(" via {}", via.short()));
    }
    if place.import_time {
        line.push_str(", at import");
    }
    if let Some(library) = &place.native_library {
        line.push_str(&format!(", native memory ({})", library_name(library)));
    }
    let measure = measure_name(cause);
    let mut text = format!(
        "{line}: {} {measure} ({:.0}% of the sampled",
        format_bytes(place.bytes),
        100.0 * place.share
    );
    if place.uncertainty() > SAY_UNCERTAINTY_FROM {
        text.push_str(&format!(
            "; ±{:.0}% from {} samples",
            100.0 * place.uncertainty(),
            place.samples
        ));
    }
    if above.is_some_and(|above| above.tied_with(place)) {
        text.push_str("; as much as the place above, within sampling error");
    }
    text.push(')');
    text
}

#[cfg(test)]
mod tests {
    use super::{library_name, lines};
    use crate::report::fixtures::server_diagnosed;

    /// The server fixture's cause names append (36 MiB) then parse
    /// (12 MiB): with a standard error of 10 MiB each (their difference's,
    /// 14.1 MiB, twice over is more than 24 MiB) they are not told apart, and append's error is said; with records of their true size
    /// (no error) the ranking stands and nothing is said.
    #[test]
    fn places_sampling_cannot_tell_apart_are_said_as_such() {
        let mut report = server_diagnosed();
        let exact = lines(&report).join("\n");
        assert!(exact.contains("append (cache.py:42): 36.0 MiB"), "{exact}");
        assert!(!exact.contains("±") && !exact.contains("within sampling error"));
        for place in &mut report.causes[0].places {
            place.variance_kib2 = (10 * 1024_u64).pow(2);
        }
        let sampled = lines(&report).join("\n");
        assert!(
            sampled.contains("36.0 MiB held at the end (75% of the sampled; ±28% from 2 samples)"),
            "{sampled}"
        );
        assert!(
            sampled.contains(
                "parse (io;v2.py:7): 12.0 MiB held at the end (25% of the sampled; ±83% from 1 \
                 samples; as much as the place above, within sampling error)"
            ),
            "{sampled}"
        );
    }

    #[test]
    fn libraries_are_named_without_version_or_abi_tag() {
        assert_eq!(library_name("libsqlite3.so.0.8.6"), "libsqlite3");
        assert_eq!(
            library_name("_json.cpython-311-x86_64-linux-gnu.so"),
            "_json"
        );
        assert_eq!(library_name("_cffi_backend.abi3.so"), "_cffi_backend");
        assert_eq!(library_name("embedded"), "embedded");
    }
}
