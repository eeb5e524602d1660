//! Integration tests of `memtrace diff`: captures recorded by the real
//! memtrace binary from real Python scripts (tests/scripts/), compared as two
//! captures and as two windows of one; the table must name the function that
//! grew with a positive delta, and the differential flame graph must be SVG
//! an XML parser reads. The error cases need no root.
//!
//! Recording needs root (CAP_BPF + CAP_PERFMON) and a kernel with BTF:
//! without them those tests print why they skip.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script(name: &str) -> String {
    let path = workspace().join("tests/scripts").join(name);
    path.to_str().unwrap().to_owned()
}

fn memtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtrace"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why captures cannot be recorded here, if they cannot.
fn recording_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: loading eBPF programs needs CAP_BPF and CAP_PERFMON".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    None
}

/// A Python 3.12 interpreter, or why there is none.
fn python() -> Result<String, String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let pyenv = home.join(".pyenv/versions/3.12.1/bin/python3.12");
    let debian = PathBuf::from("/usr/bin/python3.11");
    [pyenv, debian]
        .into_iter()
        .find(|p| p.exists())
        .map(|p| p.to_str().unwrap().to_owned())
        .ok_or_else(|| "no Python interpreter (pyenv 3.12.1 or /usr/bin/python3.11)".into())
}

macro_rules! require_recording {
    () => {{
        if let Some(why) = recording_unavailable() {
            println!("skipping: {why}");
            return;
        }
        match python() {
            Ok(python) => python,
            Err(why) => {
                println!("skipping: {why}");
                return;
            }
        }
    }};
}

/// Runs memtrace, expecting success; returns its standard output.
fn success(args: &[&str]) -> String {
    let output = memtrace(args);
    assert!(
        output.status.success(),
        "memtrace {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Runs memtrace, expecting failure; returns its standard error.
fn failure(args: &[&str]) -> String {
    let output = memtrace(args);
    assert!(
        !output.status.success(),
        "memtrace {args:?} succeeded:\n{}",
        text(&output.stdout)
    );
    text(&output.stderr)
}

/// Records `python script args...` into `capture`.
fn record(dir: &Path, capture: &Path, python: &str, script_args: &[&str]) {
    let mut args = vec![
        "run",
        "--quiet",
        "--output-dir",
        dir.to_str().unwrap(),
        "--capture",
        capture.to_str().unwrap(),
        "--",
        python,
    ];
    args.extend_from_slice(script_args);
    success(&args);
}

/// The first ranked path of a diff table: its rank line and its frames.
fn first_path(table: &str) -> (String, Vec<String>) {
    let mut lines = table
        .lines()
        .skip_while(|l| !l.starts_with("Growth paths by increase"));
    let rank = lines
        .find(|l| l.starts_with("  1. "))
        .unwrap_or_else(|| panic!("no ranked path:\n{table}"))
        .to_owned();
    let frames = lines
        .take_while(|l| l.starts_with("        "))
        .map(|l| l.trim().to_owned())
        .collect();
    (rank, frames)
}

/// `function` is the innermost Python frame of the top path, whose delta
/// (the last column) is positive.
fn assert_top_path_grew(table: &str, function: &str) {
    let (rank, frames) = first_path(table);
    assert!(
        frames
            .first()
            .is_some_and(|f| f.starts_with(&format!("{function} ("))),
        "top path is not {function}: {frames:?}\n{table}"
    );
    let delta = rank.split_whitespace().rev().take(2).collect::<Vec<_>>();
    assert!(
        delta[1].starts_with('+'),
        "delta is not positive: {rank}\n{table}"
    );
}

/// A flame graph file parses as SVG and has a frame named `function`.
fn assert_svg_names(svg_path: &Path, function: &str) {
    let svg = std::fs::read_to_string(svg_path).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options)
        .unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(
        doc.descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text())
            .any(|t| t.starts_with(&format!("{function} ("))),
        "no `{function}` frame in the flame graph"
    );
}

#[test]
fn two_captures_of_a_growing_script_name_the_grown_function() {
    let python = require_recording!();
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (
        dir.path().join("small.capture"),
        dir.path().join("big.capture"),
    );
    let grow = script("grow_cache.py");
    record(
        dir.path(),
        &before,
        &python,
        &[&grow, "--mib", "16", "--hold", "0.5"],
    );
    record(
        dir.path(),
        &after,
        &python,
        &[&grow, "--mib", "128", "--hold", "0.5"],
    );
    let (before, after) = (before.to_str().unwrap(), after.to_str().unwrap());

    let table = success(&["diff", before, after]);
    assert_top_path_grew(&table, "fill_cache");

    let svg = dir.path().join("diff.svg");
    success(&[
        "diff",
        before,
        after,
        "--format",
        "flamegraph",
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert_svg_names(&svg, "fill_cache");
}

#[test]
fn two_windows_of_one_capture_name_what_grew_between_them() {
    let python = require_recording!();
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("one.capture");
    // Idle for 3 s, grow 64 MiB in grow_after_attach, hold 3 s.
    let args = [
        script("wait_then_grow.py"),
        "--mib".into(),
        "64".into(),
        "--start-delay".into(),
        "3".into(),
        "--hold".into(),
        "3".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    record(dir.path(), &capture, &python, &args);
    let capture = capture.to_str().unwrap();

    let table = success(&["diff", capture, "--from", "2s", "--to", "6s"]);
    assert_top_path_grew(&table, "grow_after_attach");

    let svg = dir.path().join("windows.svg");
    let svg_arg = svg.to_str().unwrap();
    success(&[
        "diff",
        capture,
        "--from",
        "2s",
        "--to",
        "6s",
        "--format",
        "flamegraph",
        "-o",
        svg_arg,
    ]);
    assert_svg_names(&svg, "grow_after_attach");

    let stderr = failure(&["diff", capture, "--from", "2s", "--to", "1h"]);
    assert!(stderr.contains("beyond the end"), "{stderr}");
}

#[test]
fn a_file_that_is_not_a_capture_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let file = file.to_str().unwrap();
    let stderr = failure(&["diff", file, file]);
    assert!(stderr.contains("notes.txt"), "{stderr}");
    assert!(stderr.contains("capture"), "{stderr}");
}

#[test]
fn formats_other_than_table_and_flamegraph_are_refused() {
    let stderr = failure(&["diff", "a", "b", "--format", "folded"]);
    assert!(
        stderr.contains("`table` or `flamegraph`, not `folded`"),
        "{stderr}"
    );
}

#[test]
fn one_capture_needs_from_and_to() {
    let stderr = failure(&["diff", "a"]);
    assert!(stderr.contains("--from and --to"), "{stderr}");
}
