//! Live view of `record`/`run`, beside the aggregation step: every ~2 s (on
//! a terminal; every 5 s as plain lines) the app hands it a [`LiveSnapshot`]
//! of the aggregator's current state, and it
//! draws elapsed time, records, drops, the live processes with RSS and
//! growth rate, and the paths holding the most memory now (sampled bytes
//! still resident, by address), on standard error.
//!
//! On a terminal that no traced process uses, the view is redrawn in place
//! (ANSI escapes: cursor up, clear to the end of the screen, line wrap off
//! while drawing so long lines are clipped instead of wrapped). Redrawing
//! in place erases whatever was printed below the previous frame, so as
//! soon as a traced process has its standard input, output or error on the
//! same terminal (`memtrace run`'s command does, unless redirected), the
//! view becomes what it is on a file or pipe: one plain line per refresh,
//! which scrolls up with the traced program's own lines and never
//! overwrites them. Nothing at all with `--quiet`.

use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use crate::aggregate::{LiveProcess, LiveSnapshot, ProcessId};
use crate::units::{format_bytes, format_signed_bytes};

/// Time between two redraws of the view on a terminal.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(2);

/// Time between two plain lines when standard error is a file or pipe (a
/// log should not fill up with them).
pub const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// Most processes listed on a terminal (largest RSS first); the rest are
/// counted.
const MAX_PROCESSES_SHOWN: usize = 10;

/// Most growth paths listed on a terminal.
pub const MAX_PATHS_SHOWN: usize = 5;

/// ANSI: stop wrapping long lines (DECAWM off) / wrap again.
const WRAP_OFF: &str = "\x1b[?7l";
const WRAP_ON: &str = "\x1b[?7h";
/// ANSI: clear from the cursor to the end of the screen.
const CLEAR_BELOW: &str = "\x1b[J";

/// How the view is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing (`--quiet`).
    Quiet,
    /// Redrawn in place on a terminal.
    Terminal,
    /// One plain line per refresh (standard error is a file or pipe).
    Lines,
}

/// The previous refresh, for growth rates.
#[derive(Debug)]
struct Previous {
    elapsed: Duration,
    rss_bytes: HashMap<ProcessId, u64>,
}

/// The live view of one run. Call [`LiveView::due`] often and
/// [`LiveView::show`] when it says so; [`LiveView::finish`] before printing
/// the final report.
pub struct LiveView {
    out: Box<dyn Write + Send>,
    mode: Mode,
    previous: Option<Previous>,
    /// Lines of the frame on screen (terminal mode), to erase next time.
    drawn_lines: usize,
    /// Device number (`st_rdev`) of the terminal drawn on in place.
    terminal_rdev: Option<u64>,
}

impl std::fmt::Debug for LiveView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveView")
            .field("mode", &self.mode)
            .field("drawn_lines", &self.drawn_lines)
            .finish_non_exhaustive()
    }
}

impl LiveView {
    /// A view on standard error: redrawn in place when it is a terminal
    /// (until [`LiveView::share_terminal`]), plain lines otherwise, nothing
    /// when `quiet`.
    pub fn new(quiet: bool) -> Self {
        let stderr = io::stderr();
        let terminal_rdev = stderr
            .is_terminal()
            .then(|| std::fs::metadata("/proc/self/fd/2").ok())
            .flatten()
            .map(|m| m.rdev());
        let mode = match (quiet, terminal_rdev) {
            (true, _) => Mode::Quiet,
            (false, Some(_)) => Mode::Terminal,
            (false, None) => Mode::Lines,
        };
        let mut view = Self::with_writer(Box::new(stderr), mode);
        view.terminal_rdev = terminal_rdev;
        view
    }

    fn with_writer(out: Box<dyn Write + Send>, mode: Mode) -> Self {
        Self {
            out,
            mode,
            previous: None,
            drawn_lines: 0,
            terminal_rdev: None,
        }
    }

    /// The device number (`st_rdev`) of the terminal the view redraws in
    /// place on, while it does: before each refresh the caller checks that
    /// no traced process uses it, and calls [`LiveView::share_terminal`]
    /// when one does.
    pub fn terminal(&self) -> Option<u64> {
        self.terminal_rdev.filter(|_| self.mode == Mode::Terminal)
    }

    /// A traced process uses the view's terminal too: from now on the view
    /// is one plain line per refresh, which scrolls up with that process's
    /// output and is never redrawn over it. A frame already drawn stays
    /// (erasing it would erase whatever the process printed after it).
    pub fn share_terminal(&mut self) {
        if self.mode == Mode::Terminal {
            self.mode = Mode::Lines;
            self.drawn_lines = 0;
        }
    }

    /// Whether a refresh is due at `elapsed` (time since tracing started):
    /// [`REFRESH_INTERVAL`] (terminal) or [`LINE_INTERVAL`] (plain lines)
    /// after the previous one (or after the start); never when quiet.
    pub fn due(&self, elapsed: Duration) -> bool {
        let last = self.previous.as_ref().map_or(Duration::ZERO, |p| p.elapsed);
        let interval = match self.mode {
            Mode::Quiet => return false,
            Mode::Terminal => REFRESH_INTERVAL,
            Mode::Lines => LINE_INTERVAL,
        };
        elapsed.saturating_sub(last) >= interval
    }

    /// Draws `snapshot` taken at `elapsed` after `records` ring-buffer
    /// records were read and `dropped_records` lost. Growth rates are per
    /// second over the time since the previous call. Write errors are
    /// ignored: the view must not stop the trace.
    pub fn show(
        &mut self,
        elapsed: Duration,
        records: u64,
        dropped_records: u64,
        snapshot: &LiveSnapshot,
    ) {
        let rates = self.rates(elapsed, snapshot);
        let status = Status {
            elapsed,
            records,
            dropped_records,
            snapshot,
            rates: &rates,
        };
        // Ignored on purpose: a closed or full stderr must not end tracing.
        let _ = match self.mode {
            Mode::Quiet => Ok(()),
            Mode::Terminal => self.redraw(&status),
            Mode::Lines => writeln!(self.out, "{}", status.line()).and_then(|()| self.out.flush()),
        };
        self.previous = Some(Previous {
            elapsed,
            rss_bytes: snapshot
                .processes
                .iter()
                .map(|p| (p.id, p.rss_bytes))
                .collect(),
        });
    }

    /// Erases the view from the terminal (the final report follows); no-op
    /// otherwise.
    pub fn finish(&mut self) {
        if self.mode == Mode::Terminal && self.drawn_lines > 0 {
            // Ignored on purpose, as in `show`.
            let _ = self.erase().and_then(|()| self.out.flush());
            self.drawn_lines = 0;
        }
    }

    /// Growth rate of each process of `snapshot` since the previous refresh,
    /// in bytes per second; absent for a process not seen then.
    fn rates(&self, elapsed: Duration, snapshot: &LiveSnapshot) -> HashMap<ProcessId, i64> {
        let Some(previous) = &self.previous else {
            return HashMap::new();
        };
        let seconds = elapsed.saturating_sub(previous.elapsed).as_secs_f64();
        if seconds <= 0.0 {
            return HashMap::new();
        }
        snapshot
            .processes
            .iter()
            .filter_map(|p| {
                let before = *previous.rss_bytes.get(&p.id)?;
                let delta = p.rss_bytes as f64 - before as f64;
                Some((p.id, (delta / seconds).round() as i64))
            })
            .collect()
    }

    /// Moves to the first line of the frame on screen and clears below.
    fn erase(&mut self) -> io::Result<()> {
        if self.drawn_lines > 0 {
            // CSI n F: cursor to the start of the line n lines up.
            write!(self.out, "\x1b[{}F", self.drawn_lines)?;
        }
        write!(self.out, "{CLEAR_BELOW}")
    }

    fn redraw(&mut self, status: &Status<'_>) -> io::Result<()> {
        let lines = status.frame();
        self.erase()?;
        write!(self.out, "{WRAP_OFF}")?;
        for line in &lines {
            writeln!(self.out, "{line}")?;
        }
        write!(self.out, "{WRAP_ON}")?;
        self.drawn_lines = lines.len();
        self.out.flush()
    }
}

/// One refresh's data.
struct Status<'a> {
    elapsed: Duration,
    records: u64,
    dropped_records: u64,
    snapshot: &'a LiveSnapshot,
    rates: &'a HashMap<ProcessId, i64>,
}

impl Status<'_> {
    /// Total RSS of the live processes, and its rate when every process has
    /// one.
    fn total(&self) -> (u64, Option<i64>) {
        let processes = &self.snapshot.processes;
        let rss_bytes = processes
            .iter()
            .fold(0_u64, |sum, p| sum.saturating_add(p.rss_bytes));
        let rate = processes
            .iter()
            .map(|p| self.rates.get(&p.id).copied())
            .sum::<Option<i64>>()
            .filter(|_| !processes.is_empty());
        (rss_bytes, rate)
    }

    /// `memtrace: 12 s, 3456 records, 0 dropped; 3 processes, RSS 1.0 MiB (+2.0 KiB/s)`.
    fn summary(&self) -> String {
        let (rss_bytes, rate) = self.total();
        let count = self.snapshot.processes.len();
        format!(
            "memtrace: {} s, {} records, {} dropped; {count} {}, RSS {}{}",
            self.elapsed.as_secs(),
            self.records,
            self.dropped_records,
            if count == 1 { "process" } else { "processes" },
            format_bytes(rss_bytes),
            rate.map_or_else(String::new, |r| format!(" ({})", format_rate(r))),
        )
    }

    /// The single line of the plain mode: the summary and the path holding
    /// the most memory now.
    fn line(&self) -> String {
        let mut line = self.summary();
        if let Some(top) = self.snapshot.top_paths.first() {
            line.push_str(&format!(
                "; most held: {} {}",
                format_bytes(top.held_bytes),
                top.frame
            ));
        }
        line
    }

    /// The terminal frame: summary, process table, top paths.
    fn frame(&self) -> Vec<String> {
        let mut lines = vec![self.summary()];
        lines.push(format!(
            "{:>8}  {:<6}  {:>10}  {:>13}  COMMAND",
            "TGID", "ROLE", "RSS", "GROWTH RATE"
        ));
        let mut processes: Vec<&LiveProcess> = self.snapshot.processes.iter().collect();
        processes.sort_by_key(|p| (std::cmp::Reverse(p.rss_bytes), p.tgid));
        for p in processes.iter().take(MAX_PROCESSES_SHOWN) {
            let rate = self
                .rates
                .get(&p.id)
                .map_or_else(|| "-".to_owned(), |&r| format_rate(r));
            lines.push(format!(
                "{:>8}  {:<6}  {:>10}  {rate:>13}  {}",
                p.tgid,
                p.kind,
                format_bytes(p.rss_bytes),
                p.label
            ));
        }
        if processes.len() > MAX_PROCESSES_SHOWN {
            let more = processes.len() - MAX_PROCESSES_SHOWN;
            lines.push(format!("{:>8}  … {more} more", ""));
        }
        lines.push("Paths holding the most memory now (innermost Python frame):".to_owned());
        if self.snapshot.top_paths.is_empty() {
            lines.push("  none yet".to_owned());
        }
        for path in self.snapshot.top_paths.iter().take(MAX_PATHS_SHOWN) {
            lines.push(format!(
                "  {:>10}  {}",
                format_bytes(path.held_bytes),
                path.frame
            ));
        }
        lines
    }
}

/// A growth rate: `+1.5 MiB/s`, `-4.0 KiB/s`, `0 B/s`.
fn format_rate(bytes_per_s: i64) -> String {
    format!("{}/s", format_signed_bytes(bytes_per_s))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::aggregate::test_support::{leak_stack, native, parse_stack, py, MIB};
    use crate::aggregate::ProcessKind;

    /// A writer whose bytes the test can read after the view took it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        /// Everything written so far, emptied.
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
        }
    }

    fn view(mode: Mode) -> (LiveView, Shared) {
        let out = Shared::default();
        (LiveView::with_writer(Box::new(out.clone()), mode), out)
    }

    fn process(tgid: u32, rss_bytes: u64) -> LiveProcess {
        LiveProcess {
            id: ProcessId(tgid),
            tgid,
            kind: ProcessKind::Worker,
            label: format!("python3 worker.py {tgid}"),
            rss_bytes,
        }
    }

    fn snapshot(worker_rss_bytes: u64) -> LiveSnapshot {
        LiveSnapshot {
            processes: vec![process(100, 20 * MIB), process(101, worker_rss_bytes)],
            top_paths: LiveSnapshot::top_paths([(leak_stack().as_slice(), 36 * MIB)], 5),
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn terminal_frames_redraw_in_place_with_rates() {
        let (mut live, out) = view(Mode::Terminal);
        live.show(2 * SECOND, 10, 0, &snapshot(20 * MIB));
        let first = out.take();
        assert!(first.starts_with(&format!("{CLEAR_BELOW}{WRAP_OFF}memtrace: 2 s, 10 records, 0 dropped; 2 processes, RSS 40.0 MiB\n")), "{first:?}");
        assert!(
            first.contains("     100  worker    20.0 MiB              -  python3 worker.py 100\n"),
            "{first:?}"
        );
        assert!(
            first.contains("    36.0 MiB  append (app/cache.py:42)\n"),
            "{first:?}"
        );
        assert!(first.ends_with(WRAP_ON), "{first:?}");
        let lines = first.matches('\n').count();
        assert_eq!(lines, 6, "{first:?}");

        // 4 s later the worker has 8 MiB more: 2 MiB/s.
        live.show(6 * SECOND, 99, 3, &snapshot(28 * MIB));
        let second = out.take();
        assert!(
            second.starts_with(&format!("\x1b[{lines}F{CLEAR_BELOW}")),
            "{second:?}"
        );
        assert!(
            second.contains(
                "memtrace: 6 s, 99 records, 3 dropped; 2 processes, RSS 48.0 MiB (+2.0 MiB/s)\n"
            ),
            "{second:?}"
        );
        assert!(
            second.contains("     101  worker    28.0 MiB     +2.0 MiB/s  python3 worker.py 101\n"),
            "{second:?}"
        );
        assert!(
            second.contains("     100  worker    20.0 MiB          0 B/s"),
            "{second:?}"
        );

        live.finish();
        assert_eq!(out.take(), format!("\x1b[{lines}F{CLEAR_BELOW}"));
    }

    #[test]
    fn plain_lines_when_not_a_terminal_and_nothing_when_quiet() {
        let (mut live, out) = view(Mode::Lines);
        live.show(2 * SECOND, 10, 0, &snapshot(20 * MIB));
        live.show(4 * SECOND, 20, 0, &snapshot(16 * MIB));
        live.finish();
        assert_eq!(
            out.take(),
            "memtrace: 2 s, 10 records, 0 dropped; 2 processes, RSS 40.0 MiB; \
             most held: 36.0 MiB append (app/cache.py:42)\n\
             memtrace: 4 s, 20 records, 0 dropped; 2 processes, RSS 36.0 MiB (-2.0 MiB/s); \
             most held: 36.0 MiB append (app/cache.py:42)\n"
        );

        let (mut quiet, out) = view(Mode::Quiet);
        assert!(!quiet.due(10 * SECOND));
        quiet.show(2 * SECOND, 10, 0, &snapshot(20 * MIB));
        quiet.finish();
        assert_eq!(out.take(), "");
    }

    #[test]
    fn a_shared_terminal_gets_plain_lines_and_nothing_is_erased() {
        let (mut live, out) = view(Mode::Terminal);
        live.show(2 * SECOND, 10, 0, &snapshot(20 * MIB));
        assert!(out.take().contains(WRAP_OFF));
        live.share_terminal();
        assert_eq!(live.terminal(), None);
        assert!(!live.due(4 * SECOND), "plain lines come less often");
        live.show(LINE_INTERVAL + 2 * SECOND, 20, 0, &snapshot(20 * MIB));
        live.finish();
        let after = out.take();
        assert!(
            !after.contains('\x1b'),
            "no cursor movement, no erasing: {after:?}"
        );
        assert_eq!(after.lines().count(), 1, "{after:?}");
        assert!(after.starts_with("memtrace: 7 s, 20 records"), "{after:?}");
    }

    #[test]
    fn refreshes_are_due_every_interval() {
        let (mut live, _out) = view(Mode::Terminal);
        assert!(!live.due(SECOND));
        assert!(live.due(REFRESH_INTERVAL));
        live.show(REFRESH_INTERVAL, 0, 0, &LiveSnapshot::default());
        assert!(!live.due(REFRESH_INTERVAL + SECOND));
        assert!(live.due(REFRESH_INTERVAL * 2));
    }

    #[test]
    fn plain_lines_are_due_less_often() {
        let (mut live, _out) = view(Mode::Lines);
        assert!(!live.due(REFRESH_INTERVAL));
        assert!(live.due(LINE_INTERVAL));
        live.show(LINE_INTERVAL, 0, 0, &LiveSnapshot::default());
        assert!(!live.due(LINE_INTERVAL + REFRESH_INTERVAL));
        assert!(live.due(LINE_INTERVAL * 2));
    }

    #[test]
    fn new_processes_have_no_rate_and_long_lists_are_cut() {
        let (mut live, out) = view(Mode::Terminal);
        live.show(2 * SECOND, 0, 0, &LiveSnapshot::default());
        out.take();
        let many = LiveSnapshot {
            processes: (1..=12)
                .map(|tgid| process(tgid, u64::from(tgid) * MIB))
                .collect(),
            top_paths: Vec::new(),
        };
        live.show(4 * SECOND, 0, 0, &many);
        let text = out.take();
        assert!(text.contains("12 processes, RSS 78.0 MiB\n"), "{text:?}");
        assert!(
            text.contains("      12  worker    12.0 MiB              -"),
            "{text:?}"
        );
        assert!(!text.contains("python3 worker.py 2\n"), "{text:?}");
        assert!(text.contains("… 2 more\n"), "{text:?}");
        assert!(text.contains("  none yet\n"), "{text:?}");
    }

    #[test]
    fn top_paths_merge_by_innermost_python_frame() {
        let stacks = [
            (leak_stack(), 10 * MIB),
            (leak_stack(), 5 * MIB),
            (parse_stack("a.py"), 20 * MIB),
            (vec![native("main"), native("malloc")], 3 * MIB),
            (vec![py("idle", "b.py", 1)], 0),
            (Vec::new(), MIB),
        ];
        let paths = LiveSnapshot::top_paths(stacks.iter().map(|(f, b)| (f.as_slice(), *b)), 3);
        let got: Vec<(&str, u64)> = paths
            .iter()
            .map(|p| (p.frame.as_str(), p.held_bytes))
            .collect();
        assert_eq!(
            got,
            vec![
                ("parse (a.py:7)", 20 * MIB),
                ("append (app/cache.py:42)", 15 * MIB),
                ("malloc", 3 * MIB),
            ]
        );
    }
}
