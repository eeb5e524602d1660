//! Integration tests of the field's conventions (issue 18), on real runs of
//! the real memtrace binary: `-o FILE` is the report file, its format from
//! its name; every recording writes its capture into the default folder
//! (newest 20 runs kept) and prints it last among the files written, just
//! above the verdict, and `memtrace report` renders it again; the CI gate
//! (`--fail-above`, `--fail-on-cause`) exits with status 86 and one line
//! saying why.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

#[expect(
    dead_code,
    reason = "conventions.rs checks files, messages and exit statuses: it reads no report through `common::Trace`"
)]
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Output, Stdio},
};

use common::{memtrace, python_3_11, require_ebpf, script, stderr_of, stdout_of};

/// Most lines of the terminal report above the verdict for the demo
/// service (a master, 4 workers, the load generator): about one screen
/// (measured 66 to 72 under record --pid MASTER; the warnings about
/// incomplete stacks vary by a few lines).
const LINE_BUDGET: usize = 80;

/// memtrace's exit status when the gate trips (README, "A gate for CI").
const GATE_EXIT_STATUS: i32 = 86;

/// `memtrace run --quiet EXTRA -- PYTHON grow_cache.py --mib MIB --hold 0.5`
/// in the folder `cwd` (so the default `./memtrace-captures` is there).
fn run_grow_cache(python: &Path, cwd: &Path, mib: &str, extra: &[&str]) -> Output {
    run_script(
        python,
        cwd,
        &["grow_cache.py", "--mib", mib, "--hold", "0.5"],
        extra,
    )
}

/// `memtrace run --quiet EXTRA -- PYTHON SCRIPT ARGS` (`script_args`: the
/// name of a script of tests/scripts/, then its arguments) in `cwd`.
fn run_script(python: &Path, cwd: &Path, script_args: &[&str], extra: &[&str]) -> Output {
    memtrace()
        .current_dir(cwd)
        .args(["run", "--quiet"])
        .args(extra)
        .arg("--")
        .arg(python)
        .arg(script(script_args[0]))
        .args(&script_args[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The files in `dir`, by name.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The path of the "capture:" line of the "Files written" section.
fn printed_capture(stdout: &str) -> PathBuf {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("capture:"))
        .unwrap_or_else(|| panic!("no capture line:\n{stdout}"));
    PathBuf::from(line.trim_start()["capture:".len()..].trim())
}

#[test]
fn dash_o_is_the_report_file_in_the_format_of_its_name() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    for (name, starts) in [("out.svg", "<?xml"), ("out.html", "<!DOCTYPE html>")] {
        let output = run_grow_cache(&python, dir.path(), "16", &["-o", name]);
        assert!(output.status.success(), "{}", stderr_of(&output));
        let text = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(
            text.starts_with(starts),
            "{name}: {}",
            &text[..80.min(text.len())]
        );
        assert!(
            !text.contains("\"memtrace_capture\""),
            "{name} is a capture"
        );
    }
    // A name that says no format fails before tracing, naming the endings.
    let output = run_grow_cache(&python, dir.path(), "16", &["-o", "profile.out"]);
    let err = stderr_of(&output);
    assert!(!output.status.success());
    assert!(
        err.contains("`profile.out`") && err.contains(".svg") && err.contains("--format"),
        "{err}"
    );
    assert!(!dir.path().join("profile.out").exists());
    // --format decides over the name.
    let output = run_grow_cache(
        &python,
        dir.path(),
        "16",
        &["-o", "flame.out", "--format", "flamegraph"],
    );
    assert!(output.status.success(), "{}", stderr_of(&output));
    let text = std::fs::read_to_string(dir.path().join("flame.out")).unwrap();
    assert!(text.starts_with("<?xml"), "{}", &text[..80.min(text.len())]);
}

#[test]
fn every_recording_writes_a_capture_printed_last_that_renders_again() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let output = run_grow_cache(&python, dir.path(), "32", &[]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let stdout = stdout_of(&output);
    // The files, then the verdict: nothing else after the files.
    let files_at = stdout
        .find("\nFiles written\n")
        .expect("a Files written section");
    let verdict_at = stdout.find("\nVerdict: ").expect("a verdict");
    assert!(files_at < verdict_at, "{stdout}");
    let between = &stdout[files_at..verdict_at];
    assert!(between.contains("--format flamegraph"), "{between}");
    assert!(!stdout.contains("inferno-flamegraph"), "{stdout}");
    let capture = printed_capture(&stdout);
    assert!(
        capture.starts_with("memtrace-captures"),
        "{}",
        capture.display()
    );
    let names = names_in(&dir.path().join("memtrace-captures"));
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".capture")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".json")), "{names:?}");
    // Nothing is left in the working folder itself.
    assert_eq!(names_in(dir.path()), ["memtrace-captures"]);
    let report = memtrace()
        .current_dir(dir.path())
        .arg("report")
        .arg(&capture)
        .args(["-o", "again.svg"])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", stderr_of(&report));
    let svg = std::fs::read_to_string(dir.path().join("again.svg")).unwrap();
    assert!(
        svg.contains("fill_cache"),
        "the flame graph lacks fill_cache"
    );
}

#[test]
fn the_default_folder_keeps_the_newest_20_runs() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("memtrace-captures");
    std::fs::create_dir(&folder).unwrap();
    // 21 older runs (a day before), and a file of the user's.
    for run in 0..21 {
        for ext in ["capture", "json"] {
            let path = folder.join(format!("memtrace-20200101-0000{run:02}.{ext}"));
            let file = std::fs::File::create(&path).unwrap();
            let yesterday = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
            file.set_modified(yesterday + std::time::Duration::from_secs(run))
                .unwrap();
        }
    }
    std::fs::write(folder.join("notes.txt"), "mine").unwrap();
    let output = run_grow_cache(&python, dir.path(), "16", &[]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let names = names_in(&folder);
    let stems: std::collections::BTreeSet<&str> = names
        .iter()
        .filter(|n| n.starts_with("memtrace-"))
        .map(|n| n.split('.').next().unwrap())
        .collect();
    assert_eq!(stems.len(), 20, "{names:?}");
    // The two oldest planted runs went; the new run and the user's file stay.
    assert!(!stems.contains("memtrace-20200101-000000"), "{names:?}");
    assert!(!stems.contains("memtrace-20200101-000001"), "{names:?}");
    assert!(stems.contains("memtrace-20200101-000002"), "{names:?}");
    assert!(names.contains(&"notes.txt".to_owned()), "{names:?}");
    let capture = printed_capture(&stdout_of(&output));
    assert!(dir.path().join(capture).exists());
}

#[test]
fn fail_above_trips_with_its_status_and_one_line_and_not_below_its_limit() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let tripped = run_grow_cache(&python, dir.path(), "160", &["--fail-above", "100MiB"]);
    let err = stderr_of(&tripped);
    assert_eq!(tripped.status.code(), Some(GATE_EXIT_STATUS), "{err}");
    let gate: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("memtrace: gate:"))
        .collect();
    assert_eq!(gate.len(), 1, "{err}");
    assert!(
        gate[0].contains("peaked at") && gate[0].contains("above --fail-above 100.0 MiB"),
        "{}",
        gate[0]
    );
    // The report is printed all the same, verdict last.
    assert!(
        stdout_of(&tripped).contains("\nVerdict: "),
        "{}",
        stdout_of(&tripped)
    );

    let passed = run_grow_cache(&python, dir.path(), "160", &["--fail-above", "1GiB"]);
    assert_eq!(passed.status.code(), Some(0), "{}", stderr_of(&passed));
    assert!(!stderr_of(&passed).contains("memtrace: gate:"));

    // `memtrace report` gates a capture the same way.
    let capture = printed_capture(&stdout_of(&passed));
    let report = |limit: &str| {
        memtrace()
            .current_dir(dir.path())
            .arg("report")
            .arg(&capture)
            .args(["--fail-above", limit])
            .output()
            .unwrap()
    };
    assert_eq!(report("100MiB").status.code(), Some(GATE_EXIT_STATUS));
    assert_eq!(report("1GiB").status.code(), Some(0));
}

#[test]
fn fail_on_cause_trips_on_a_strong_cause_of_its_pattern_only() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    // A cache that grows under traffic and is held while idle: retention
    // (the workload tests/patterns.rs finds strong retention in).
    let workload = [
        "pattern_cache_retention.py",
        "--traffic-seconds",
        "4",
        "--mib-per-second",
        "25",
        "--idle-seconds",
        "3",
    ];
    let output = run_script(&python, dir.path(), &workload, &[]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let capture = printed_capture(&stdout_of(&output));
    let json = memtrace()
        .arg("report")
        .arg(dir.path().join(&capture))
        .args(["--format", "json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let strong: Vec<String> = report["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["strength"] == "strong")
        .flat_map(|c| {
            let also = c["also_patterns"].as_array().cloned().unwrap_or_default();
            std::iter::once(c["pattern"].clone()).chain(also)
        })
        .map(|p| p.as_str().unwrap().replace('_', "-"))
        .collect();
    assert!(
        strong.iter().any(|s| s == "retention"),
        "no strong retention: {:#}",
        report["causes"]
    );
    let gate = |cause: &str| {
        memtrace()
            .arg("report")
            .arg(dir.path().join(&capture))
            .args(["--fail-on-cause", cause])
            .output()
            .unwrap()
    };
    for cause in ["retention", "spike", "any"] {
        let expected = match cause {
            "any" => !strong.is_empty(),
            _ => strong.iter().any(|s| s == cause),
        };
        let output = gate(cause);
        let code = if expected { GATE_EXIT_STATUS } else { 0 };
        assert_eq!(
            output.status.code(),
            Some(code),
            "--fail-on-cause {cause}, strong causes {strong:?}: {}",
            stderr_of(&output)
        );
        if expected {
            assert!(stderr_of(&output).contains("(--fail-on-cause)"));
        }
    }
}

/// The bundled demo service (`examples/prefork_service/run_demo.py`: a
/// master, `workers` forked workers and the load generator it starts with
/// an exec) running for `seconds`; killed when dropped.
struct Demo {
    child: std::process::Child,
    /// The master's pid, and its workers' and load generator's as it
    /// printed them.
    master: u32,
    workers: Vec<u32>,
    loadgen: u32,
}

impl Demo {
    fn start(python: &Path, workers: u32, seconds: u32) -> Self {
        use std::io::{BufRead as _, BufReader};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut child = std::process::Command::new(python)
            .arg(root.join("examples/prefork_service/run_demo.py"))
            .args(["--workers", &workers.to_string()])
            .args(["--seconds", &seconds.to_string(), "--rps", "60"])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let master = child.id();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut found, mut loadgen) = (Vec::new(), None);
        while found.len() < workers as usize || loadgen.is_none() {
            let line = lines.next().expect("the demo ended early").unwrap();
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            match (event["event"].as_str(), event["role"].as_str()) {
                (Some("started"), Some("worker")) => {
                    found.push(event["pid"].as_u64().unwrap() as u32);
                }
                (Some("loadgen_started"), _) => {
                    loadgen = Some(event["loadgen_pid"].as_u64().unwrap() as u32);
                }
                _ => {}
            }
        }
        // The rest of its output is not read: drain it so it never blocks.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            master,
            workers: found,
            loadgen: loadgen.unwrap(),
        }
    }
}

impl Drop for Demo {
    /// Kills the workers and the load generator (orphans otherwise), then
    /// the master.
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        for &pid in self.workers.iter().chain([&self.loadgen]) {
            let _ = kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `memtrace record --quiet --duration D --output-dir DIR --pid ...` from
/// the workspace root (so frames are relative to it); its stdout and JSON.
fn record(pids: &[u32], duration: &str, dir: &Path) -> (String, serde_json::Value) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut command = memtrace();
    command
        .current_dir(root)
        .args(["record", "--quiet", "--duration", duration, "--output-dir"])
        .arg(dir);
    for pid in pids {
        command.args(["--pid", &pid.to_string()]);
    }
    let output = command.stdin(Stdio::null()).output().unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    let json = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a JSON report");
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (stdout_of(&output), report)
}

/// The `kind` of the row of `tgid` in a JSON report.
fn kind_of(report: &serde_json::Value, tgid: u32) -> String {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["tgid"].as_u64() == Some(u64::from(tgid)))
        .unwrap_or_else(|| panic!("no row of tgid {tgid}"))["kind"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn roles_come_from_what_a_process_is() {
    let python = require_ebpf!(python_3_11());
    let demo = Demo::start(&python, 4, 120);
    let dir = tempfile::tempdir().unwrap();
    let (stdout, report) = record(&[demo.master], "8s", dir.path());
    assert_eq!(kind_of(&report, demo.master), "master");
    for &worker in &demo.workers {
        assert_eq!(kind_of(&report, worker), "worker", "{stdout}");
    }
    // The load generator: a different program the master started.
    assert_eq!(kind_of(&report, demo.loadgen), "child", "{stdout}");
    assert!(stdout.contains("1 master, 4 workers, 1 child"), "{stdout}");
    // Frames relative to the working folder or the standard library.
    assert!(
        !stdout.contains("(/"),
        "an absolute path in a frame:\n{stdout}"
    );
    assert!(
        stdout.contains("(examples/prefork_service/app.py:"),
        "{stdout}"
    );
    // About one screen above the verdict, the files written last before it.
    let verdict_at = stdout.rfind("\nVerdict: ").expect("a verdict");
    let above = stdout[..verdict_at].lines().count();
    assert!(
        above <= LINE_BUDGET,
        "{above} lines above the verdict:\n{stdout}"
    );
    // Warnings of one kind on one line (the JSON keeps them all).
    let incomplete = stdout
        .lines()
        .filter(|l| l.starts_with("warning: ") && l.contains("incomplete stacks"))
        .count();
    assert!(
        incomplete <= 1,
        "{incomplete} incomplete-stack lines:\n{stdout}"
    );
    let files_at = stdout.rfind("\nFiles written\n").expect("files written");
    let between = &stdout[files_at..verdict_at];
    assert!(
        between
            .lines()
            .all(|l| l.is_empty() || l.starts_with("  ") || l == "Files written"),
        "something between the files and the verdict:\n{between}"
    );

    // Workers attached by pid, without their master: still workers.
    let dir = tempfile::tempdir().unwrap();
    let (stdout, report) = record(&demo.workers[..2], "5s", dir.path());
    for &worker in &demo.workers[..2] {
        assert_eq!(kind_of(&report, worker), "worker", "{stdout}");
    }
    assert!(!stdout.contains(" mains"), "{stdout}");
}

/// The verdict's lines of a terminal report (from `Verdict: ` on).
fn verdict_of(stdout: &str) -> &str {
    &stdout[stdout.rfind("\nVerdict: ").expect("a verdict") + 1..]
}

#[test]
fn the_same_load_gives_the_same_strength_in_3_attaches() {
    let python = require_ebpf!(python_3_11());
    let demo = Demo::start(&python, 4, 120);
    let mut headings = Vec::new();
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let (stdout, _) = record(&[demo.master], "10s", dir.path());
        let verdict = verdict_of(&stdout);
        // Retention first, or beside "every worker is large" once the
        // workers' caches are large.
        assert!(
            verdict.contains("retention in 4 workers")
                || verdict.contains("retention in the process tree (4 workers)"),
            "{verdict}"
        );
        headings.push(verdict.lines().next().unwrap().to_owned());
    }
    // The demo's cache keeps rising under load (about +30 MiB per worker in
    // 10 s at 60 requests/s): strong every time, idle period or not.
    assert_eq!(headings, ["Verdict: 1 cause"; 3], "{headings:#?}");
}

#[test]
fn a_weak_verdict_says_why_in_one_line() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    // 32 MiB allocated at once and held: a buffer, not a rising cache.
    let output = run_grow_cache(&python, dir.path(), "32", &[]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let stdout = stdout_of(&output);
    let verdict = verdict_of(&stdout);
    assert!(
        verdict.starts_with("Verdict: 1 cause, weak evidence"),
        "{verdict}"
    );
    let weak: Vec<&str> = verdict
        .lines()
        .filter(|l| l.trim_start().starts_with("weak:"))
        .collect();
    assert_eq!(weak.len(), 1, "{verdict}");
    assert!(
        weak[0].contains(": record") || weak[0].contains("looks like"),
        "{}",
        weak[0]
    );
}

#[test]
fn bash_sources_the_completions_and_completes_subcommands_and_options() {
    let script = memtrace().args(["completions", "bash"]).output().unwrap();
    assert!(script.status.success(), "{}", stderr_of(&script));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memtrace.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    // What bash offers after `memtrace rec<TAB>` and `memtrace run --fail<TAB>`.
    let complete = |words: &str, cword: usize| {
        let line = format!(
            "set -e; source '{}'; COMP_WORDS=({words}); COMP_CWORD={cword}; \
             _memtrace memtrace \"${{COMP_WORDS[$COMP_CWORD]}}\" \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; \
             echo \"${{COMPREPLY[@]}}\"",
            path.display()
        );
        let output = std::process::Command::new("bash")
            .args(["-c", &line])
            .output()
            .unwrap();
        assert!(output.status.success(), "bash: {}", stderr_of(&output));
        assert!(output.stderr.is_empty(), "bash: {}", stderr_of(&output));
        stdout_of(&output)
    };
    assert_eq!(complete("memtrace rec", 1).trim(), "record");
    let options = complete("memtrace run --fail", 2);
    assert!(
        options.contains("--fail-above") && options.contains("--fail-on-cause"),
        "{options}"
    );
}

#[test]
fn a_pid_flag_given_no_pid_says_what_to_check() {
    // What `record --pid $(pgrep -f nothing) --duration 5s` runs.
    for args in [
        &["record", "--pid", "--duration", "5s"][..],
        &["record", "--pid", ""],
        &["agent", "--pid"],
    ] {
        let output = memtrace().args(args).stdin(Stdio::null()).output().unwrap();
        assert!(!output.status.success(), "memtrace {args:?} succeeded");
        let err = stderr_of(&output);
        assert!(
            err.contains("no PID") && err.contains("did `pgrep` match nothing?"),
            "memtrace {args:?}: {err}"
        );
    }
    // Without the flag, `record` still says --pid is required.
    let output = memtrace()
        .args(["record", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(
        stderr_of(&output).contains("--pid"),
        "{}",
        stderr_of(&output)
    );
}

#[test]
fn a_program_without_python_is_traced_and_said_so() {
    require_ebpf!();
    let dir = tempfile::tempdir().unwrap();
    // bash holds a 32 MB string its command substitution read.
    let line = "x=$(head -c 32000000 /dev/zero | tr '\\0' a); sleep 0.5; echo ${#x}";
    let output = memtrace()
        .current_dir(dir.path())
        .args([
            "run",
            "--quiet",
            "--output-dir",
            "out",
            "--",
            "bash",
            "-c",
            line,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    let stdout = stdout_of(&output);
    assert!(stdout.contains("32000000"), "{stdout}");
    let verdict = verdict_of(&stdout);
    assert!(
        verdict.lines().any(|l| l.trim_start().starts_with(
            "no Python stacks: no traced process is Python; memtrace still measures RSS"
        )),
        "{verdict}"
    );
    // The warnings say what is still traced, on one line for all of them.
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("warning: ") && l.contains("no Python stacks"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stdout}");
    assert!(warnings[0].contains("still traced"), "{}", warnings[0]);
    // Its RSS is still measured: bash's peak is at least the string above
    // where it started.
    let json = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a JSON report");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let grown = |p: &serde_json::Value| {
        let rss = &p["rss"];
        rss["peak_bytes"].as_u64().unwrap_or(0) - rss["start_bytes"].as_u64().unwrap_or(0)
    };
    let bash = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["cmdline"]
                .as_str()
                .is_some_and(|c| c.starts_with("bash -c"))
        })
        .max_by_key(|p| grown(p))
        .unwrap_or_else(|| panic!("no bash row: {report:#}"));
    assert!(
        grown(bash) >= 32_000_000,
        "bash grew {} bytes: {bash:#}",
        grown(bash)
    );
    assert_eq!(bash["python"]["status"], "not_python", "{bash:#}");
}
