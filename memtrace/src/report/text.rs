//! Words shared by the text-carrying renderers of the report step (table,
//! HTML, flame graph titles): how a diagnosis finding, its scope and its
//! code paths read.

use crate::aggregate::{Frame, PythonStatus, Report, StackId};
use crate::diagnose::{Finding, Pattern, Scope, Strength};

/// Most frames of a path shown on one line; the rest are counted.
const MAX_FRAMES_PER_LINE: usize = 4;

/// Short name of a growth pattern, e.g. `worker multiplication`.
pub(crate) fn pattern_name(pattern: Pattern) -> &'static str {
    match pattern {
        Pattern::OneProcessGrows => "one process grows",
        Pattern::EveryWorkerLarge => "every worker is large",
        Pattern::WorkerMultiplication => "worker multiplication",
        Pattern::Spike => "spike",
        Pattern::Retention => "retention",
        Pattern::FileBackedGrowth => "file-backed growth",
        Pattern::CowUnsharing => "copy-on-write un-sharing",
        Pattern::UnmatchedGrowth => "unmatched growth",
        Pattern::NoGrowth => "no growth",
    }
}

/// What a finding is about: `the process tree` or `tgid N (command)` (with
/// `#2` for a reused tgid and the image after an execve).
pub(crate) fn scope_text(report: &Report, scope: Scope) -> String {
    match scope {
        Scope::Tree => "the process tree".to_owned(),
        Scope::Process { process, .. } => {
            format!("{} ({})", report.name(process), report.label(process))
        }
    }
}

/// The caveat a weak finding carries; `None` for a strong one.
pub(crate) fn weakness(strength: Strength) -> Option<&'static str> {
    match strength {
        Strength::Strong => None,
        Strength::Weak => Some("weak evidence: the numbers point this way but do not settle it"),
    }
}

/// `pattern (scope): summary`, plus the caveat of a weak finding: the one
/// line that names a finding (flame graph subtitles, headings).
pub(crate) fn finding_line(report: &Report, finding: &Finding) -> String {
    let mut line = format!(
        "{} ({}): {}",
        pattern_name(finding.pattern),
        scope_text(report, finding.scope),
        finding.summary
    );
    if let Some(caveat) = weakness(finding.strength) {
        line.push_str(&format!(" [{caveat}]"));
    }
    line
}

/// A finding as plain lines: its [`finding_line`], then `- evidence` lines,
/// `path: ...` lines (and `… N more paths`), and `next step: ...` (for
/// formats that carry one string per line, such as pprof comments).
pub(crate) fn finding_lines(report: &Report, finding: &Finding) -> Vec<String> {
    let mut lines = vec![finding_line(report, finding)];
    lines.extend(finding.evidence.iter().map(|e| format!("- {e}")));
    let (paths, left_out) = finding_path_lines(report, finding);
    lines.extend(paths.iter().map(|p| format!("path: {p}")));
    if left_out > 0 {
        lines.push(format!("… {left_out} more paths"));
    }
    if !finding.next_step.is_empty() {
        lines.push(format!("next step: {}", finding.next_step));
    }
    lines
}

/// Code paths shown under a finding, at most.
pub(crate) const MAX_PATHS_PER_FINDING: usize = 3;

/// The finding's code paths as [`path_line`]s, duplicates (stacks that differ
/// only in native frames) dropped, at most [`MAX_PATHS_PER_FINDING`]; and
/// how many distinct ones were left out.
pub(crate) fn finding_path_lines(report: &Report, finding: &Finding) -> (Vec<String>, usize) {
    let mut lines: Vec<String> = Vec::new();
    for stack in &finding.paths {
        let line = path_line(report, *stack);
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    let left_out = lines.len().saturating_sub(MAX_PATHS_PER_FINDING);
    lines.truncate(MAX_PATHS_PER_FINDING);
    (lines, left_out)
}

/// One code path on one line, innermost frame first, e.g.
/// `append (app/cache.py:42) ← handle (app/views.py:10) ← … 2 more`. Native
/// frames under Python ones are left out; a stack of only native frames shows
/// them. `(empty stack)` for an unknown id or an empty stack.
pub(crate) fn path_line(report: &Report, stack: StackId) -> String {
    let frames = report.frames(stack);
    let python: Vec<&Frame> = frames
        .iter()
        .rev()
        .filter(|f| !matches!(f, Frame::Native { .. }))
        .collect();
    let shown: Vec<&Frame> = if python.is_empty() {
        frames.iter().rev().collect()
    } else {
        python
    };
    if shown.is_empty() {
        return "(empty stack)".to_owned();
    }
    let mut line = shown
        .iter()
        .take(MAX_FRAMES_PER_LINE)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ← ");
    if shown.len() > MAX_FRAMES_PER_LINE {
        line.push_str(&format!(" ← … {} more", shown.len() - MAX_FRAMES_PER_LINE));
    }
    line
}

/// Whether Python stacks were read in a process: its version, `not Python`,
/// `unsupported` (with the reason when `with_reason`) or `?` (unknown).
pub(crate) fn python_text(status: Option<&PythonStatus>, with_reason: bool) -> String {
    match status {
        Some(PythonStatus::Python { version }) => version.clone(),
        Some(PythonStatus::NotPython) => "not Python".to_owned(),
        Some(PythonStatus::Unsupported { reason }) if with_reason => {
            format!("unsupported: {reason}")
        }
        Some(PythonStatus::Unsupported { .. }) => "unsupported".to_owned(),
        None => "?".to_owned(),
    }
}

/// Frames as the reports list them: the Python (and marker) frames
/// innermost first, then the native frames under them, `native: `-prefixed.
pub(crate) fn frames_innermost_first(frames: &[Frame]) -> Vec<String> {
    let native_start = frames
        .iter()
        .rposition(|f| !matches!(f, Frame::Native { .. }))
        .map_or(0, |last| last + 1);
    let (python, native) = frames.split_at(native_start);
    python
        .iter()
        .rev()
        .map(ToString::to_string)
        .chain(native.iter().rev().map(|f| format!("native: {f}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::{native, py, server_report};

    #[test]
    fn paths_read_innermost_first_without_native_frames_under_python() {
        let report = server_report();
        let leak = report.paths[0].stack;
        assert_eq!(
            path_line(&report, leak),
            "append (app/cache.py:42) ← handle (app/views.py:10) ← <module> (server.py:1)"
        );
        assert_eq!(path_line(&report, StackId(99)), "(empty stack)");
    }

    #[test]
    fn long_and_native_only_paths() {
        let mut report = server_report();
        report
            .stacks
            .push((0..6).map(|i| py(&format!("f{i}"), "m.py", i)).collect());
        report.stacks.push(vec![native("main"), native("malloc")]);
        let long = StackId(u32::try_from(report.stacks.len() - 2).unwrap());
        let only_native = StackId(long.0 + 1);
        assert_eq!(
            path_line(&report, long),
            "f5 (m.py:5) ← f4 (m.py:4) ← f3 (m.py:3) ← f2 (m.py:2) ← … 2 more"
        );
        assert_eq!(path_line(&report, only_native), "malloc ← main");
    }

    #[test]
    fn listed_frames_put_native_ones_last() {
        let frames = [
            py("<module>", "m.py", 1),
            py("f", "m.py", 2),
            native("malloc"),
        ];
        assert_eq!(
            frames_innermost_first(&frames),
            ["f (m.py:2)", "<module> (m.py:1)", "native: malloc"]
        );
        assert!(frames_innermost_first(&[]).is_empty());
    }

    #[test]
    fn weak_findings_say_so() {
        let report = server_report();
        let finding = Finding {
            pattern: Pattern::OneProcessGrows,
            scope: Scope::Process { tgid: 101 },
            strength: Strength::Weak,
            summary: "worker 101 grows".to_owned(),
            evidence: Vec::new(),
            paths: Vec::new(),
            next_step: String::new(),
        };
        assert_eq!(
            finding_line(&report, &finding),
            "one process grows (tgid 101 (python3 server.py)): worker 101 grows \
             [weak evidence: the numbers point this way but do not settle it]"
        );
        let strong = Finding {
            strength: Strength::Strong,
            ..finding
        };
        assert!(!finding_line(&report, &strong).contains("weak"));
    }
}
