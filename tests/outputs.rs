//! Integration tests of the files the real memtrace binary writes (issue 8):
//! the capture of `run --capture`, the `--format` files, `report -o` and
//! `diff -o` are created without following a symbolic link planted at
//! their path (the file it points to keeps its content), never replace an
//! existing file unless `--force` is given (and do with it), and a report
//! file that cannot be written never costs the printed report.
//!
//! They need root (CAP_BPF + CAP_PERFMON), a kernel with BTF and pyenv's
//! CPython 3.11; without them each test prints why it skips.

#[expect(
    dead_code,
    reason = "outputs.rs checks files and messages: it reads no report through `common::Trace`"
)]
mod common;

use std::{
    os::unix::fs::{symlink, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::{Duration, SystemTime},
};

use common::{memtrace, python_3_11, require_ebpf, stderr_of, stdout_of};

/// What a planted file holds; it must survive every run.
const SECRET: &str = "another user's data\n";

/// A 0600 file holding [`SECRET`] in `dir`, as another user's would be.
fn private_file(dir: &Path) -> PathBuf {
    let victim = dir.join("victim");
    std::fs::write(&victim, SECRET).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    victim
}

/// Asserts that the planted `victim` is untouched.
fn assert_untouched(victim: &Path) {
    assert_eq!(std::fs::read_to_string(victim).unwrap(), SECRET);
    let mode = std::fs::metadata(victim).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode of {}", victim.display());
}

/// `memtrace ARGS`, standard input closed.
fn memtrace_output(args: &[&str]) -> Output {
    memtrace().args(args).stdin(Stdio::null()).output().unwrap()
}

/// Asserts that `output` failed with an error naming `path` and `words`.
fn assert_refused(output: &Output, path: &Path, words: &str) {
    let err = stderr_of(output);
    assert!(!output.status.success(), "succeeded:\n{err}");
    assert!(
        err.contains(&format!("`{}`", path.display())) && err.contains(words),
        "the error does not name `{}` and say `{words}`:\n{err}",
        path.display()
    );
}

/// `memtrace run --quiet --output-dir DIR EXTRA -- PYTHON -c pass`.
fn run_python(python: &Path, dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--quiet", "--output-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", python.to_str().unwrap(), "-c", "pass"]);
    memtrace_output(&args)
}

#[test]
fn the_capture_file_is_never_written_through_a_link_nor_over_a_file_without_force() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let victim = private_file(dir.path());
    let capture = dir.path().join("run.capture");
    let capture_arg = capture.to_str().unwrap();

    symlink(&victim, &capture).unwrap();
    for force in [&[][..], &["--force"][..]] {
        let mut extra = vec!["--capture", capture_arg];
        extra.extend_from_slice(force);
        let output = run_python(&python, dir.path(), &extra);
        assert_refused(&output, &capture, "symbolic link");
        assert_untouched(&victim);
    }

    std::fs::remove_file(&capture).unwrap();
    std::fs::write(&capture, SECRET).unwrap();
    let output = run_python(&python, dir.path(), &["--capture", capture_arg]);
    assert_refused(&output, &capture, "--force");
    assert_eq!(std::fs::read_to_string(&capture).unwrap(), SECRET);

    let output = run_python(&python, dir.path(), &["--capture", capture_arg, "--force"]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let text = std::fs::read_to_string(&capture).unwrap();
    assert!(text.starts_with("{\"memtrace_capture\""), "{text}");
}

#[test]
fn report_and_diff_outputs_are_never_written_through_a_link_nor_over_a_file_without_force() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    let victim = private_file(dir.path());
    let capture = dir.path().join("run.capture");
    let output = run_python(
        &python,
        dir.path(),
        &["--capture", capture.to_str().unwrap()],
    );
    assert!(output.status.success(), "{}", stderr_of(&output));
    let capture = capture.to_str().unwrap();
    let commands: [(&str, Vec<&str>); 2] = [
        ("report", vec!["report", capture, "--format", "folded"]),
        ("diff", vec!["diff", capture, capture, "--format", "table"]),
    ];
    for (name, command) in commands {
        let out = dir.path().join(format!("{name}.out"));
        let with = |extra: &[&str]| {
            let mut args = command.clone();
            args.extend_from_slice(&["-o", out.to_str().unwrap()]);
            args.extend_from_slice(extra);
            memtrace_output(&args)
        };
        symlink(&victim, &out).unwrap();
        assert_refused(&with(&[]), &out, "symbolic link");
        assert_refused(&with(&["--force"]), &out, "symbolic link");
        assert_untouched(&victim);

        std::fs::remove_file(&out).unwrap();
        std::fs::write(&out, SECRET).unwrap();
        assert_refused(&with(&[]), &out, "--force");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), SECRET, "{name}");

        let replaced = with(&["--force"]);
        assert!(
            replaced.status.success(),
            "{name}: {}",
            stderr_of(&replaced)
        );
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(!text.is_empty() && text != SECRET, "{name}: {text}");
    }
}

/// `memtrace-YYYYMMDD-HHMMSS` (UTC) of `time`: the stem of a run's files.
fn stem(time: SystemTime) -> String {
    let text = humantime::format_rfc3339_seconds(time).to_string();
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    format!("memtrace-{}-{}", &digits[..8], &digits[8..14])
}

#[test]
fn an_existing_format_file_is_a_warning_and_the_report_is_still_printed() {
    let python = require_ebpf!(python_3_11());
    let dir = tempfile::tempdir().unwrap();
    // The flame graph of the run below lands on one of these names (its
    // stem is the UTC second the run ends in).
    let now = SystemTime::now();
    let planted: Vec<PathBuf> = (0..60)
        .map(|s| {
            let path = dir
                .path()
                .join(format!("{}.svg", stem(now + Duration::from_secs(s))));
            std::fs::write(&path, SECRET).unwrap();
            path
        })
        .collect();
    let output = run_python(&python, dir.path(), &["--format", "flamegraph"]);
    let err = stderr_of(&output);
    assert!(output.status.success(), "{err}");
    assert!(
        err.contains(".svg`") && err.contains("--force") && err.contains("is not written"),
        "no warning that names the flame graph and --force:\n{err}"
    );
    for path in &planted {
        assert_eq!(std::fs::read_to_string(path).unwrap(), SECRET);
    }
    let report = stdout_of(&output);
    assert!(report.contains("memtrace: traced `"), "{report}");
    assert!(report.contains("JSON report:"), "{report}");

    // A later second: a new stem (the same one would get `-2`).
    std::thread::sleep(Duration::from_secs(1));
    let output = run_python(&python, dir.path(), &["--format", "flamegraph", "--force"]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let replaced = planted
        .iter()
        .filter(|p| std::fs::read_to_string(p).unwrap() != SECRET)
        .count();
    assert_eq!(replaced, 1, "{}", stderr_of(&output));
}
