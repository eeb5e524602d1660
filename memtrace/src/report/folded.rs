//! Folded-stacks renderer of the report step (Brendan Gregg's format, as read
//! by inferno and flamegraph.pl): one line per (process, stack), weighed by
//! the chosen bytes (held at the high-water mark by default),
//! `process;outer;...;inner <bytes>`.

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::aggregate::{Frame, PathReport, ProcessId, Report, Weight};

/// Writes one line per (process, stack) with `weight` bytes > 0:
/// `<command> (tgid N);<outermost frame>;...;<innermost frame> <bytes>`
/// (the process named by [`crate::aggregate::ProcessReport::name`]: `tgid
/// N#2` for the second process with a reused tgid, so two processes on one
/// tgid are two towers; `tgid N, image 0` and `image 1` before and after an
/// execve).
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
    let wanted =
        |p: &&PathReport| p.weight_bytes(weight) > 0 && process.is_none_or(|id| id == p.process);
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
    use crate::aggregate::test_support::{prefork_report, server_report, MIB};
    use crate::report::fixtures::lifecycle_report;

    fn folded(report: &Report, weight: Weight) -> String {
        let mut out = Vec::new();
        render(report, weight, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_are_exact_sorted_and_sanitized() {
        let expected = format!(
            "python3 server.py (tgid 101);<module> (server.py:1);handle (app/views.py:10);\
             append (app/cache.py:42);PyList_Append {}\n\
             python3 server.py (tgid 101);<module> (server.py:1);parse (app/io:v2.py:7);malloc {}\n",
            36 * MIB,
            12 * MIB
        );
        assert_eq!(folded(&server_report(), Weight::Peak), expected);
    }

    /// The lifecycle run's lines under `weight`, in MiB.
    fn lifecycle_lines(weight: Weight) -> Vec<(String, u64)> {
        folded(&lifecycle_report(), weight)
            .lines()
            .map(|line| {
                let (stack, bytes) = line.rsplit_once(' ').unwrap();
                (stack.to_owned(), bytes.parse::<u64>().unwrap() / MIB)
            })
            .collect()
    }

    const JOB_201: &str = "python3 -m app (tgid 201);<module> (app/worker.py:1);\
                           handle_job (app/jobs.py:20);malloc";
    const CACHE_201: &str = "python3 -m app (tgid 201);<module> (app/worker.py:1);\
                             append (app/cache.py:42);PyList_Append";
    const CACHE_201_2: &str = "python3 -m app (tgid 201#2);<module> (app/worker.py:1);\
                               append (app/cache.py:42);PyList_Append";
    const LOAD_202: &str =
        "python3 etl.py (tgid 202, image 0);<module> (etl.py:1);load (etl.py:12);malloc";

    fn expected(lines: &[(&str, u64)]) -> Vec<(String, u64)> {
        lines.iter().map(|(s, b)| ((*s).to_owned(), *b)).collect()
    }

    #[test]
    fn by_default_lines_weigh_bytes_held_at_the_high_water_mark() {
        assert_eq!(
            lifecycle_lines(Weight::Peak),
            expected(&[
                (CACHE_201_2, 30),
                (CACHE_201, 10),
                (JOB_201, 50),
                (LOAD_202, 60)
            ])
        );
    }

    #[test]
    fn weight_end_weighs_bytes_held_at_the_end_and_drops_freed_paths() {
        assert_eq!(
            lifecycle_lines(Weight::End),
            expected(&[(CACHE_201_2, 30), (JOB_201, 40), (LOAD_202, 60)])
        );
    }

    #[test]
    fn weight_grown_weighs_every_first_touch() {
        assert_eq!(
            lifecycle_lines(Weight::Grown),
            expected(&[
                (CACHE_201_2, 30),
                (CACHE_201, 10),
                (JOB_201, 120),
                (LOAD_202, 60)
            ])
        );
    }

    #[test]
    fn a_reused_tgid_is_two_towers() {
        let roots: Vec<String> = lifecycle_lines(Weight::Peak)
            .into_iter()
            .map(|(stack, _)| stack.split(';').next().unwrap().to_owned())
            .collect();
        assert_eq!(
            roots,
            [
                "python3 -m app (tgid 201#2)",
                "python3 -m app (tgid 201)",
                "python3 -m app (tgid 201)",
                "python3 etl.py (tgid 202, image 0)"
            ]
        );
    }

    #[test]
    fn stacks_that_render_alike_are_summed() {
        let mut report = server_report();
        // Make the second stack print like the first one.
        let first = report.paths[0].stack;
        let second = report.paths[1].stack;
        report.stacks[second.0 as usize] = report.stacks[first.0 as usize].clone();
        let lines = lines(&report, Weight::Peak, None);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines.values().copied().collect::<Vec<_>>(), vec![48 * MIB]);
    }

    #[test]
    fn lines_of_one_process_leave_the_others_out() {
        let report = prefork_report();
        let id_of = |tgid| report.processes.iter().find(|p| p.tgid == tgid).unwrap().id;
        let of_102 = lines(&report, Weight::Peak, Some(id_of(102)));
        assert_eq!(of_102.len(), 1);
        let (stack, bytes) = of_102.iter().next().unwrap();
        assert!(
            stack.starts_with("gunicorn app:wsgi (tgid 102);"),
            "{stack}"
        );
        assert_eq!(*bytes, 10 * MIB);
        assert_eq!(lines(&report, Weight::Peak, None).len(), 4);
        assert!(lines(&report, Weight::Peak, Some(id_of(100))).is_empty());
    }

    #[test]
    fn reserved_characters_are_replaced() {
        assert_eq!(sanitize("a;b\nc\rd"), "a:b c d");
    }
}
