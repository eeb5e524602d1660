//! Integration test of the live view in a real terminal (issue 8): the real
//! memtrace binary runs, under `memtrace run` in a tmux pane, a Python
//! script that prints 30 numbered lines while the live view refreshes; every
//! one of them must still be in the pane's history at the end (redrawing the
//! view in place used to erase most of them). The same holds when the
//! script writes to `/dev/tty` with its standard streams elsewhere.
//!
//! It needs tmux (`cargo xtask test` installs it), root (CAP_BPF +
//! CAP_PERFMON), a kernel with BTF and pyenv's CPython 3.11; without them it
//! prints why it skips.

#[expect(
    dead_code,
    reason = "terminal.rs reads a tmux pane: it runs no `common::trace` and reads no report"
)]
mod common;

use std::{
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use common::{python_3_11, require_ebpf, script, skip};

const TMUX: &str = "tmux";

/// Lines the script prints, one every 0.25 s: several live-view refreshes
/// (every 2 s) happen among them.
const LINES: usize = 30;

/// Printed by the pane's shell when memtrace has exited.
const DONE: &str = "MEMTRACE-EXITED";

/// A tmux server of its own (`-L`), without the user's configuration,
/// killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts a detached 100x30 session running an interactive bash.
    fn start() -> Self {
        let tmux = Self {
            socket: format!("memtrace-test-{}", std::process::id()),
        };
        let output = tmux.command(&[
            "new-session",
            "-d",
            "-x",
            "100",
            "-y",
            "30",
            "bash --norc --noprofile",
        ]);
        assert!(output.status.success(), "tmux new-session: {output:?}");
        tmux
    }

    fn command(&self, args: &[&str]) -> Output {
        Command::new(TMUX)
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("tmux runs")
    }

    /// Types `line` into the pane and presses Enter.
    fn type_line(&self, line: &str) {
        let output = self.command(&["send-keys", "-l", line]);
        assert!(output.status.success(), "tmux send-keys: {output:?}");
        let output = self.command(&["send-keys", "Enter"]);
        assert!(output.status.success(), "tmux send-keys: {output:?}");
    }

    /// The pane's whole history and screen, wrapped lines joined.
    fn history(&self) -> String {
        let output = self.command(&["capture-pane", "-p", "-J", "-S", "-"]);
        assert!(output.status.success(), "tmux capture-pane: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The history once `marker` starts a line, or after `timeout`.
    fn wait_for(&self, marker: &str, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let history = self.history();
            if history.lines().any(|l| l.starts_with(marker)) || start.elapsed() > timeout {
                return history;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}

fn tmux_installed() -> bool {
    Command::new(TMUX)
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A command line word, quoted for bash.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// Runs `memtrace run -- COMMAND` in a tmux pane, where COMMAND is bash
/// running the line `python print_lines.py ARGS REDIRECTS`, and checks that
/// every line the script printed is still in the pane's history and that
/// the live view showed.
fn assert_the_programs_lines_survive(script_args: &str) {
    let python = require_ebpf!(python_3_11());
    if !tmux_installed() {
        skip("tmux is not installed (cargo xtask test installs it)");
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::start();
    let program = format!(
        "exec {} {} --lines {LINES} --interval 0.25 {script_args}",
        quoted(&python),
        quoted(&script("print_lines.py")),
    );
    tmux.type_line(&format!(
        "{} run --output-dir {} -- bash -c {}; echo {DONE}-$?",
        quoted(Path::new(env!("CARGO_BIN_EXE_memtrace"))),
        quoted(out_dir.path()),
        quoted(Path::new(&program)),
    ));
    let history = tmux.wait_for(DONE, Duration::from_secs(90));
    assert!(
        history.lines().any(|l| l == format!("{DONE}-0")),
        "memtrace did not finish with status 0 in time:\n{history}"
    );
    let missing: Vec<usize> = (1..=LINES)
        .filter(|n| {
            let line = format!("target line {n} of {LINES}");
            !history.lines().any(|l| l == line)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "lines {missing:?} of the program's output are gone:\n{history}"
    );
    // The live view was on: its status lines are there too.
    assert!(
        history
            .lines()
            .any(|l| l.starts_with("memtrace: ") && l.contains(" records, ")),
        "no live view line:\n{history}"
    );
}

#[test]
fn the_live_view_never_overwrites_the_traced_programs_output() {
    assert_the_programs_lines_survive("");
}

#[test]
fn the_live_view_never_overwrites_what_the_program_writes_to_dev_tty() {
    // Its standard streams are elsewhere: only its open /dev/tty, whose
    // terminal is its controlling one, says it writes to the pane.
    assert_the_programs_lines_survive("--tty </dev/null >/dev/null 2>&1");
}
