//! The verdict's notes (report step, beside [`super::verdict`]): the
//! processes a signal ended, the OOM killer's victims named as such (the
//! 3 a.m. question: did memory run out?), a capture cut before its end, and
//! a run with no Python in it, each with what it means for the figures.

use crate::aggregate::{ExitStatus, ProcessReport, PythonStatus, Report};
use crate::units::format_bytes;

use super::text::{self, short_command};

/// Most processes named on one ending line; the rest are counted.
const MAX_NAMED: usize = 3;

/// Most characters of a command on an ending line.
const MAX_COMMAND_CHARS: usize = 40;

/// At most four lines, each without its leading indent or line end: the
/// OOM killer's victims, the processes other signals ended, the capture's
/// cut, and that no traced process was a readable CPython. Empty when every
/// traced process exited on its own (or lived on), the run ended normally
/// and Python stacks were read.
pub(crate) fn lines(report: &Report) -> Vec<String> {
    let killed: Vec<(&ProcessReport, ExitStatus)> = report
        .processes
        .iter()
        .filter_map(|p| match p.exit_status {
            Some(status @ ExitStatus::Signal { .. }) if p.exec_ns.is_none() => Some((p, status)),
            _ => None,
        })
        .collect();
    let (oom, other): (Vec<_>, Vec<_>) = killed.into_iter().partition(|(_, s)| s.oom_killed());
    let whose =
        |ended: &[(&ProcessReport, ExitStatus)]| if ended.len() == 1 { "its" } else { "their" };
    let mut lines = Vec::new();
    if !oom.is_empty() {
        lines.push(format!(
            "killed by the OOM killer: {}: memory ran out (the machine's, or a cgroup's limit); \
             {} figures end there",
            named(&oom, false),
            whose(&oom)
        ));
    }
    if !other.is_empty() {
        lines.push(format!(
            "ended by a signal: {}: {} figures end there",
            named(&other, true),
            whose(&other)
        ));
    }
    lines.extend(cut_line(report));
    lines.extend(no_python_line(report));
    lines
}

/// The line of a run in which no image had Python stacks read (each has a
/// status, and none is a supported CPython): what memtrace still says.
fn no_python_line(report: &Report) -> Option<String> {
    let statuses: Vec<&PythonStatus> = report
        .processes
        .iter()
        .filter_map(|p| p.python.as_ref())
        .collect();
    let python = |s: &&PythonStatus| matches!(s, PythonStatus::Python { .. });
    if statuses.is_empty() || statuses.iter().any(python) {
        return None;
    }
    let reason = if statuses.iter().all(|s| **s == PythonStatus::NotPython) {
        "no traced process is Python"
    } else {
        "no traced process runs a CPython memtrace can read (see the warnings)"
    };
    Some(format!(
        "no Python stacks: {reason}; memtrace still measures RSS (the table's START, END, \
         PEAK, GROWTH), how processes ended and the growth by native stack, but names no \
         Python function or line"
    ))
}

/// `worker tgid 4312 (app.py) at 7.0 s, RSS peak 56.0 MiB` for one
/// process (`SIGKILL at` when `say_signal`), else the first [`MAX_NAMED`]
/// as `tgid 1 SIGTERM at 2.0 s, RSS peak ...; tgid 2 ...` and how many more.
fn named(ended: &[(&ProcessReport, ExitStatus)], say_signal: bool) -> String {
    let how = |p: &ProcessReport, status: ExitStatus| {
        let signal = if say_signal {
            format!(" {status}")
        } else {
            String::new()
        };
        let at = p
            .ended_ns()
            .or(p.exited_ns)
            .map_or_else(String::new, |ns| format!(" at {}", text::seconds(ns)));
        let peak = p.rss.map_or_else(String::new, |rss| {
            format!(", RSS peak {}", format_bytes(rss.peak_bytes))
        });
        format!("{signal}{at}{peak}")
    };
    if let [(p, status)] = ended {
        return format!(
            "{} {} ({}){}",
            p.kind,
            p.name(),
            short_command(&p.cmdline, MAX_COMMAND_CHARS),
            how(p, *status)
        );
    }
    let mut parts: Vec<String> = ended
        .iter()
        .take(MAX_NAMED)
        .map(|(p, status)| format!("{}{}", p.name(), how(p, *status)))
        .collect();
    if ended.len() > MAX_NAMED {
        parts.push(format!("{} more", ended.len() - MAX_NAMED));
    }
    format!("{} processes: {}", ended.len(), parts.join("; "))
}

/// The line of a capture cut before its end (`RunMeta::cut_after_ns`).
fn cut_line(report: &Report) -> Option<String> {
    let cut_ns = report.meta.cut_after_ns?;
    Some(format!(
        "capture cut after {}: memtrace stopped before closing it (killed, or the disk filled): \
         the figures stop at its last complete line, processes still running then show as alive \
         (their END is the last reading), and record and drop counts are unknown",
        text::seconds(cut_ns)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::server_report;

    #[test]
    fn signals_and_the_oom_killer_are_said() {
        let mut report = server_report();
        assert!(lines(&report).is_empty(), "{:?}", lines(&report));
        report.processes[1].exit_status = Some(ExitStatus::from_exit_record(9, true));
        report.processes[1].exited_ns = Some(3_000_000_000);
        let said = lines(&report);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with(&format!(
                "killed by the OOM killer: {} {} (",
                report.processes[1].kind,
                report.processes[1].name()
            )) && said[0].contains(") at 3.0 s, RSS peak "),
            "{said:?}"
        );
        report.processes[0].exit_status = Some(ExitStatus::from_wait_status(9));
        report.processes[0].exited_ns = Some(4_000_000_000);
        let said = lines(&report);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[1].starts_with(&format!(
                "ended by a signal: {} {} (",
                report.processes[0].kind,
                report.processes[0].name()
            )) && said[1].contains(") SIGKILL at 4.0 s"),
            "{said:?}"
        );
    }

    #[test]
    fn several_processes_a_signal_ended_share_one_line() {
        let mut report = server_report();
        for (index, p) in report.processes.iter_mut().enumerate() {
            p.exit_status = Some(ExitStatus::from_wait_status(15));
            p.exited_ns = Some(1_000_000_000 * (index as u64 + 1));
        }
        let said = lines(&report);
        let names: Vec<String> = report.processes.iter().map(|p| p.name()).collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with(&format!(
                "ended by a signal: 2 processes: {} SIGTERM at 1.0 s, RSS peak ",
                names[0]
            )) && said[0].contains(&format!("; {} SIGTERM at 2.0 s", names[1]))
                && said[0].ends_with(": their figures end there"),
            "{said:?}"
        );
    }

    #[test]
    fn a_run_without_python_is_said() {
        let mut report = server_report();
        assert!(no_python_line(&report).is_none());
        for p in &mut report.processes {
            p.python = Some(PythonStatus::NotPython);
        }
        let said = no_python_line(&report).unwrap();
        assert!(
            said.starts_with("no Python stacks: no traced process is Python;"),
            "{said}"
        );
    }

    #[test]
    fn a_cut_capture_is_said() {
        let mut report = server_report();
        report.meta.cut_after_ns = Some(12_300_000_000);
        let said = lines(&report);
        assert_eq!(said.len(), 1);
        assert!(said[0].starts_with("capture cut after 12.3 s:"), "{said:?}");
    }
}
