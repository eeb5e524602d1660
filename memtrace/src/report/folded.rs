//! Folded-stacks renderer of the report step (Brendan Gregg's format, as read
//! by inferno and flamegraph.pl): one line per (process, stack), weighed by
//! the chosen bytes (held at the high-water mark by default),
//! `process;outer;...;inner <bytes>`.

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::aggregate::{Frame, PathReport, ProcessId, Report, Weight};

/// Writes one line per (process, stack) with `weight` bytes > 0:
/// `<command> (tgid N);<outermost frame>;...;<innermost frame> <bytes>`
/// (`tgid N#2` for a reused tgid, `tgid N, image 1` after an execve).
/// Frames read `function (file:line)`, `symbol`, `[file NAME]` or
/// `[reason]`; `;` and line breaks inside names become `:` and spaces. Lines
/// are sorted bytewise (what `inferno::flamegraph::from_lines` expects) and
/// identical stacks are summed, so the output is deterministic.
///
/// # Errors
/// Any error of `out`.
pub fn render(report: &Report, weight: Weight, out: &mut dyn Write) -> io::Result<()> {
    for (stack, bytes) in lines(report, weight, None) {
        writeln!(out, "{stack} {bytes}")?;
    }
    Ok(())
}

/// Folded stack (without the count) → summed `weight` bytes, sorted: the
/// lines of [`render`], of all processes or only of `process`.
pub(crate) fn lines(
    report: &Report,
    weight: Weight,
    process: Option<ProcessId>,
) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    let wanted = |p: &&PathReport| {
        p.weight_bytes(weight) > 0 && process.is_none_or(|id| id == p.process)
    };
    for path in report.paths.iter().filter(wanted) {
        let mut line = sanitize(&format!(
            "{} ({})",
            report.label(path.process),
            report.name(path.process)
        ));
        for frame in report.frames(path.stack) {
            line.push(';');
            line.push_str(&folded_frame(frame));
        }
        let total: &mut u64 = lines.entry(line).or_default();
        *total = total.saturating_add(path.weight_bytes(weight));
    }
    lines
}

/// One frame as folded-stack text.
fn folded_frame(frame: &Frame) -> String {
    sanitize(&frame.to_string())
}

/// Replaces the characters the folded format reserves: `;` becomes `:`,
/// line breaks become spaces (also used by `memtrace diff`'s folded sides).
pub(crate) fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::{server_report, MIB};

    #[test]
    fn lines_are_exact_sorted_and_sanitized() {
        let mut out = Vec::new();
        render(&server_report(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected = format!(
            "python3 server.py (tgid 101);<module> (server.py:1);handle (app/views.py:10);\
             append (app/cache.py:42);PyList_Append {}\n\
             python3 server.py (tgid 101);<module> (server.py:1);parse (app/io:v2.py:7);malloc {}\n",
            36 * MIB,
            12 * MIB
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn stacks_that_render_alike_are_summed() {
        let mut report = server_report();
        // Make the second stack print like the first one.
        let first = report.paths[0].stack;
        let second = report.paths[1].stack;
        report.stacks[second.0 as usize] = report.stacks[first.0 as usize].clone();
        let text = lines(&report, None);
        assert_eq!(text.len(), 1);
        assert_eq!(text.values().copied().collect::<Vec<_>>(), vec![48 * MIB]);
    }

    #[test]
    fn lines_of_one_process_leave_the_others_out() {
        let report = crate::aggregate::test_support::prefork_report();
        let of_102 = lines(&report, Some(102));
        assert_eq!(of_102.len(), 1);
        let (stack, bytes) = of_102.iter().next().unwrap();
        assert!(
            stack.starts_with("gunicorn app:wsgi (tgid 102);"),
            "{stack}"
        );
        assert_eq!(*bytes, 10 * MIB);
        assert_eq!(lines(&report, None).len(), 4);
        assert!(lines(&report, Some(100)).is_empty());
    }
}
