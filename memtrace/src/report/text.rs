//! Words shared by the text-carrying renderers of the report step (table,
//! HTML, flame graph titles, pprof comments): how a diagnosis finding, its
//! scope and its code paths read, how a process image ended, and what share
//! of all bytes of a measure a path holds, and how the run began and ended
//! (attach time, the command's exit status).

pub(crate) use crate::aggregate::short_command;
use std::time::{Duration, SystemTime};

use crate::aggregate::{
    ExitStatus, Frame, ProcessId, ProcessKind, ProcessReport, PythonStatus, Report, RunMeta,
    StackId, Weight,
};
use crate::diagnose::{Finding, Pattern, Scope, Strength};
use crate::units::format_bytes;

/// Nanoseconds per second, for times shown in seconds.
const NS_PER_S: f64 = 1e9;

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
        Pattern::AllocatorFragmentation => "allocator fragmentation",
        Pattern::NoGrowth => "no growth",
    }
}

/// Most characters of the command in a finding's scope.
const MAX_SCOPE_COMMAND_CHARS: usize = 48;

/// What a finding is about: `the process tree` or `tgid N (command)`, the
/// process named by [`ProcessReport::name`] (`tgid N#2` for a reused tgid,
/// `tgid N, image 1` after an execve) and its [`short_command`].
pub(crate) fn scope_text(report: &Report, scope: Scope) -> String {
    match scope {
        Scope::Tree => "the process tree".to_owned(),
        Scope::Process { process, .. } => match report.process(process) {
            Some(p) => format!(
                "{} ({})",
                p.name(),
                short_command(&p.cmdline, MAX_SCOPE_COMMAND_CHARS)
            ),
            None => "an untraced process (?)".to_owned(),
        },
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

/// `t_ns` (nanoseconds since the run start) in seconds with one decimal:
/// `1.5 s`.
pub(crate) fn seconds(t_ns: u64) -> String {
    format!("{:.1} s", t_ns as f64 / NS_PER_S)
}

/// How a process image ended and when (since the run start): `alive`,
/// `exec'd at 6.0 s`, `exit 0 at 4.0 s`, `SIGKILL at 7.0 s` (the time its
/// exit began: its numbers end there), `exiting at 2.0 s` when its exit
/// began but its end was not seen, `exited at 3.0 s` when it was gone
/// without a known status.
pub(crate) fn ended_text(p: &ProcessReport) -> String {
    if let Some(exec_ns) = p.exec_ns {
        return format!("exec'd at {}", seconds(exec_ns));
    }
    let Some(at_ns) = p.exit_began_ns.or(p.exited_ns) else {
        return "alive".to_owned();
    };
    let how = match (p.exit_status, p.exited_ns) {
        (Some(status), _) => status.to_string(),
        (None, Some(_)) => "exited".to_owned(),
        (None, None) => "exiting".to_owned(),
    };
    format!("{how} at {}", seconds(at_ns))
}

/// The run's totals line, as the table and the HTML page print it: images
/// by kind, most alive at once, and the tree's RSS at the end and at its
/// highest, e.g. `7 process images (1 master, 4 workers, 1 child, 1
/// helper; at most 6 alive at once); RSS of the live processes 0 B at the
/// end, highest sum 325.3 MiB`.
pub(crate) fn totals_line(report: &Report) -> String {
    let t = &report.totals;
    let kinds = [
        ProcessKind::Master,
        ProcessKind::Main,
        ProcessKind::Worker,
        ProcessKind::Child,
        ProcessKind::Helper,
    ];
    let by_kind: Vec<String> = kinds
        .iter()
        .filter_map(|&kind| {
            let count = report.processes.iter().filter(|p| p.kind == kind).count() as u64;
            (count > 0).then(|| counted(count, &kind.to_string(), kind.plural()))
        })
        .collect();
    format!(
        "{} ({}; at most {} alive at once); RSS of the live processes {} at the end, highest \
         sum {}",
        counted(t.processes, "process image", "process images"),
        by_kind.join(", "),
        t.peak_live_processes,
        format_bytes(t.live_rss_end_bytes),
        format_bytes(t.peak_total_rss_bytes),
    )
}

/// The TGID column of the process table: `4312`, `4312#2` for a reused
/// tgid, `4312.0` and `4312.1` for the images before and after an execve.
pub(crate) fn process_column(p: &ProcessReport) -> String {
    let mut column = p.tgid.to_string();
    if p.instance > 1 {
        column.push_str(&format!("#{}", p.instance));
    }
    if p.image > 0 || p.next_image.is_some() {
        column.push_str(&format!(".{}", p.image));
    }
    column
}

/// `tgid 1, 2#2, 3.1`: at most `max` of `processes` by their
/// [`process_column`], then `… N more`.
pub(crate) fn process_list(report: &Report, processes: &[ProcessId], max: usize) -> String {
    let shown: Vec<String> = processes
        .iter()
        .take(max)
        .map(|&id| {
            report
                .process(id)
                .map_or_else(|| "?".to_owned(), process_column)
        })
        .collect();
    let mut list = format!("tgid {}", shown.join(", "));
    if processes.len() > max {
        list.push_str(&format!(", … {} more", processes.len() - max));
    }
    list
}

/// `count` with the singular or plural noun: `1 root`, `3 workers`.
pub(crate) fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// `part` as a percentage of `whole` with one decimal (`75.0%`); `-` when
/// `whole` is 0.
pub(crate) fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// The `weight` bytes of every path of the report, summed (the whole the
/// shares of the merged path lists are of).
pub(crate) fn all_weight_bytes(report: &Report, weight: Weight) -> u64 {
    report
        .paths
        .iter()
        .fold(0, |sum: u64, p| sum.saturating_add(p.weight_bytes(weight)))
}

/// Frames as the reports list them: the Python (and marker) frames
/// innermost first, then the native frames under them; every native frame
/// `native: `-prefixed (also one between Python frames, or between a
/// `[file ...]` mapping and the Python frames that touched it).
pub(crate) fn frames_innermost_first(frames: &[Frame]) -> Vec<String> {
    let native_start = frames
        .iter()
        .rposition(|f| !matches!(f, Frame::Native { .. }))
        .map_or(0, |last| last + 1);
    let (python, native) = frames.split_at(native_start);
    python
        .iter()
        .rev()
        .chain(native.iter().rev())
        .map(frame_text)
        .collect()
}

/// One frame of a listed path: `native: symbol` for a native frame, its
/// display form otherwise.
pub(crate) fn frame_text(frame: &Frame) -> String {
    match frame {
        Frame::Native { .. } => format!("native: {frame}"),
        _ => frame.to_string(),
    }
}

/// What attaching hid: for attached processes, the growth before tracing
/// began; for a held command, nothing. `None` when attaching was not
/// measured.
pub(crate) fn attach_line(meta: &RunMeta) -> Option<String> {
    if meta.attach_ns == 0 {
        return None;
    }
    let took = meta.attach_ns as f64 / NS_PER_S;
    if meta.command_held {
        return Some(format!(
            "the command was held before its first instruction until tracing was attached \
             (attaching took {took:.1} s): none of its growth is missed"
        ));
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(meta.attached_unix_ns);
    // RFC 3339 in UTC: "2026-11-30T07:04:25Z".
    let rfc3339 = humantime::format_rfc3339_seconds(at).to_string();
    let time_of_day = rfc3339.get(11..19).unwrap_or(&rfc3339);
    Some(format!(
        "growth before {time_of_day} UTC (attaching took {took:.1} s) is not seen: RSS START is \
         what each process held then"
    ))
}

/// `the command ended: SIGKILL (memtrace exits with 137, as a shell
/// would)`.
pub(crate) fn command_ended(status: ExitStatus) -> String {
    format!(
        "the command ended: {status} (memtrace exits with {}, as a shell would)",
        status.shell_status()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::{native, py, server_report};
    use crate::aggregate::{ExitStatus, ProcessId};
    use crate::report::fixtures::{lifecycle_report, S};

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
        let file_backed = [
            py("<module>", "m.py", 1),
            py("read", "m.py", 5),
            native("memcpy"),
            Frame::Mapping {
                mapping: crate::aggregate::MappingKind::File,
                name: "/data/big.bin".to_owned(),
            },
        ];
        assert_eq!(
            frames_innermost_first(&file_backed),
            [
                "[file /data/big.bin]",
                "native: memcpy",
                "read (m.py:5)",
                "<module> (m.py:1)"
            ]
        );
    }

    #[test]
    fn short_commands_keep_file_names_and_fit() {
        assert_eq!(
            short_command(
                "/root/.pyenv/versions/3.11.7/bin/python3.11  /srv/app/worker.py --jobs 4",
                60
            ),
            "python3.11 worker.py --jobs 4"
        );
        assert_eq!(
            short_command("gunicorn --config=/etc/app.py app:wsgi dir/", 60),
            "gunicorn --config=/etc/app.py app:wsgi dir/"
        );
        assert_eq!(short_command("python3 -m app", 10), "-m app");
        assert_eq!(
            short_command("/usr/bin/python3.11 /srv/app/worker.py --jobs 4", 20),
            "worker.py --jobs 4"
        );
        assert_eq!(
            short_command("/usr/bin/python3.11 /srv/app/worker.py --jobs 4", 14),
            "worker.py …"
        );
        assert_eq!(
            short_command("python3 -X importtime run_demo.py --seconds 40", 30),
            "run_demo.py --seconds 40"
        );
        assert_eq!(
            short_command(
                "/usr/bin/python3 /x/run_demo.py --workers 4 --seconds 40 --rps 60",
                40
            ),
            "run_demo.py --workers 4 --seconds 40 …"
        );
        assert_eq!(
            short_command("python3 a-very-long-script-name.py", 12),
            "…ipt-name.py"
        );
        assert_eq!(short_command("  ", 10), "?");
    }

    #[test]
    fn weak_findings_say_so() {
        let report = server_report();
        let finding = Finding {
            pattern: Pattern::OneProcessGrows,
            scope: Scope::Process {
                process: ProcessId(1),
                tgid: 101,
            },
            strength: Strength::Weak,
            summary: "worker 101 grows".to_owned(),
            evidence: Vec::new(),
            paths: Vec::new(),
            next_step: String::new(),
            amount_bytes: 0,
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

    #[test]
    fn scopes_name_a_reused_tgid_and_an_image() {
        let report = lifecycle_report();
        let scope = |id| Scope::Process {
            process: ProcessId(id),
            tgid: report.tgid(ProcessId(id)),
        };
        assert_eq!(scope_text(&report, Scope::Tree), "the process tree");
        assert_eq!(scope_text(&report, scope(1)), "tgid 201 (python3 -m app)");
        assert_eq!(scope_text(&report, scope(3)), "tgid 201#2 (python3 -m app)");
        assert_eq!(
            scope_text(&report, scope(2)),
            "tgid 202, image 0 (python3 etl.py)"
        );
        assert_eq!(
            scope_text(&report, scope(4)),
            "tgid 202, image 1 (sleep 60)"
        );
    }

    #[test]
    fn every_way_an_image_ends_reads_with_its_time() {
        let report = lifecycle_report();
        let ended = |id| ended_text(report.process(ProcessId(id)).unwrap());
        assert_eq!(ended(0), "alive");
        assert_eq!(ended(1), "exit 0 at 4.0 s");
        assert_eq!(ended(2), "exec'd at 6.0 s");
        assert_eq!(ended(3), "SIGKILL at 7.0 s");
        assert_eq!(ended(4), "alive");
        let mut p = report.process(ProcessId(0)).unwrap().clone();
        p.exit_began_ns = Some(2 * S);
        assert_eq!(ended_text(&p), "exiting at 2.0 s");
        p.exited_ns = Some(3 * S);
        assert_eq!(ended_text(&p), "exited at 2.0 s");
        p.exit_began_ns = None;
        p.exit_status = Some(ExitStatus::Code { code: 3 });
        assert_eq!(ended_text(&p), "exit 3 at 3.0 s");
    }

    #[test]
    fn percentages_have_one_decimal_and_no_whole_is_a_dash() {
        assert_eq!(percent(3, 4), "75.0%");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(0, 0), "-");
    }
}
