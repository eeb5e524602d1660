//! Integration tests of `memtrace diff`: captures recorded by the real
//! memtrace binary from real Python scripts (tests/scripts/), compared as two
//! captures and as two windows of one; the table must name the function that
//! grew with a positive delta, and the differential flame graph must be SVG
//! an XML parser reads. The error cases need no root.
//!
//! Recording needs root (CAP_BPF + CAP_PERFMON) and a kernel with BTF:
//! without them those tests print why they skip.

#[expect(
    dead_code,
    reason = "diff.rs reads diff tables, not JSON reports: `common::trace` and its report readers go unused here"
)]
mod common;
#[path = "common/svg.rs"]
mod svg;

use std::{
    path::{Path, PathBuf},
    process::{Output, Stdio},
};

use common::{assert_success, interpreter, memtrace, pyenv, require_ebpf, script};
use svg::{parse_svg, titles};

/// memtrace run with `args`, standard input closed.
fn run(args: &[&str]) -> Output {
    memtrace().args(args).stdin(Stdio::null()).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A Python 3.12 interpreter (or Debian's 3.11), or `None` after printing
/// why the test skips.
fn python() -> Option<PathBuf> {
    interpreter(&[
        pyenv("3.12.1", "python3.12"),
        PathBuf::from("/usr/bin/python3.11"),
    ])
}

/// Runs memtrace, expecting success; returns its standard output.
fn success(args: &[&str]) -> String {
    let output = run(args);
    assert_success(&output, &format!("memtrace {args:?}"));
    text(&output.stdout)
}

/// Runs memtrace, expecting failure; returns its standard error.
fn failure(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        !output.status.success(),
        "memtrace {args:?} succeeded:\n{}",
        text(&output.stdout)
    );
    text(&output.stderr)
}

/// Records `python SCRIPT args...` (a workload of tests/scripts/) into
/// `capture`.
fn record(dir: &Path, capture: &Path, python: &Path, script_name: &str, script_args: &[&str]) {
    let script = script(script_name);
    let mut args = vec![
        "run",
        "--quiet",
        "--output-dir",
        dir.to_str().unwrap(),
        "--capture",
        capture.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
    ];
    args.extend_from_slice(script_args);
    success(&args);
}

/// The first ranked path of a diff table: its six byte columns (held at
/// the end before, after, delta; grown before, after, delta) and its frames.
fn first_path(table: &str) -> (Vec<String>, Vec<String>) {
    let mut lines = table
        .lines()
        .skip_while(|l| !l.starts_with("Paths by change of memory held at the end"));
    let rank = lines
        .find(|l| l.starts_with("  1. "))
        .unwrap_or_else(|| panic!("no ranked path:\n{table}"));
    // `  1.   10.0 MiB   30.0 MiB  +20.0 MiB ...`: number and unit pairs.
    let tokens: Vec<&str> = rank.split_whitespace().skip(1).collect();
    let columns: Vec<String> = tokens.chunks(2).map(|pair| pair.join(" ")).collect();
    assert_eq!(columns.len(), 6, "{rank}\n{table}");
    let frames = lines
        .take_while(|l| l.starts_with("        "))
        .map(|l| l.trim().to_owned())
        .collect();
    (columns, frames)
}

/// `function` is the innermost Python frame of the top path, which holds
/// more at the end (by more than `min_mib`) and grew more.
fn assert_top_path_grew(table: &str, function: &str, min_mib: f64) {
    let (columns, frames) = first_path(table);
    assert!(
        frames
            .first()
            .is_some_and(|f| f.starts_with(&format!("{function} ("))),
        "top path is not {function}: {frames:?}\n{table}"
    );
    let (held_delta, grown_delta) = (&columns[2], &columns[5]);
    assert!(
        grown_delta.starts_with('+'),
        "grown delta is not positive: {columns:?}\n{table}"
    );
    let held_mib = held_delta
        .strip_prefix('+')
        .and_then(|d| d.strip_suffix(" MiB"))
        .and_then(|d| d.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("held delta is not +N MiB: {columns:?}\n{table}"));
    assert!(held_mib > min_mib, "held delta {held_mib} MiB\n{table}");
}

/// A flame graph file parses as SVG and has a frame named `function`.
fn assert_svg_names(svg_path: &Path, function: &str) {
    let svg = std::fs::read_to_string(svg_path).unwrap();
    let doc = parse_svg(&svg);
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(
        titles(&doc)
            .iter()
            .any(|t| t.starts_with(&format!("{function} ("))),
        "no `{function}` frame in the flame graph"
    );
}

#[test]
fn two_captures_of_a_growing_script_name_the_grown_function() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (
        dir.path().join("small.capture"),
        dir.path().join("big.capture"),
    );
    record(
        dir.path(),
        &before,
        &python,
        "grow_cache.py",
        &["--mib", "16", "--hold", "0.5"],
    );
    record(
        dir.path(),
        &after,
        &python,
        "grow_cache.py",
        &["--mib", "128", "--hold", "0.5"],
    );
    let (before, after) = (before.to_str().unwrap(), after.to_str().unwrap());

    let table = success(&["diff", before, after]);
    assert!(!table.contains("different programs"), "{table}");
    // 128 - 16 MiB more kept until the end.
    assert_top_path_grew(&table, "fill_cache", 56.0);
    // The two runs' processes (other tgids, other arguments) are paired on
    // one row, which says how much more RSS the later one ended with.
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("tgid ") && l.matches("tgid ").count() == 2 && l.contains(" +")),
        "the runs' processes are not paired:\n{table}"
    );

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

    // Every format diff lists works: JSON by --format or by the name.
    let json = success(&["diff", before, after, "--format", "json"]);
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("diff --format json parses");
    assert!(
        parsed["summary"]["paths_holding_more"].as_u64() > Some(0),
        "{json}"
    );
    assert!(
        parsed["paths"].as_array().is_some_and(|p| !p.is_empty()),
        "{json}"
    );
    let named = dir.path().join("diff.json");
    success(&["diff", before, after, "-o", named.to_str().unwrap()]);
    let text = std::fs::read_to_string(&named).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).expect("-o diff.json is JSON");
    // The table: a summary line, --top.
    let top1 = success(&["diff", before, after, "--top", "1"]);
    assert!(top1.contains("\nsummary: "), "{top1}");
    assert!(!top1.contains("\n  2. "), "{top1}");
}

#[test]
fn captures_of_two_programs_are_said_to_differ_and_empty_rows_left_out() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let (cache, hold) = (
        dir.path().join("cache.capture"),
        dir.path().join("hold.capture"),
    );
    record(
        dir.path(),
        &cache,
        &python,
        "grow_cache.py",
        &["--mib", "16", "--hold", "0.5"],
    );
    let hold_args = [
        "--mib",
        "24",
        "--hold-seconds",
        "0.5",
        "--exit-mode",
        "normal",
    ];
    record(dir.path(), &hold, &python, "hold_then_exit.py", &hold_args);
    let (cache, hold) = (cache.to_str().unwrap(), hold.to_str().unwrap());
    let table = success(&["diff", cache, hold]);
    let warning = table
        .lines()
        .find(|l| l.starts_with("warning: the captures trace different programs"))
        .unwrap_or_else(|| panic!("no warning that the programs differ:\n{table}"));
    assert!(
        warning.contains("grow_cache.py") && warning.contains("hold_then_exit.py"),
        "{warning}"
    );
    // Both runs ended: no "0 B → 0 B" total, no row of nothing on both sides.
    assert!(!table.contains("0 B → 0 B"), "{table}");
    for row in table
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains(". "))
    {
        let numbers: Vec<&str> = row.split_whitespace().skip(1).collect();
        assert!(
            numbers
                .chunks(2)
                .any(|pair| pair[0].trim_start_matches(['+', '-']) != "0"),
            "an empty row: {row}\n{table}"
        );
    }
    // The JSON and the flame graph (on standard error) say it too.
    let json: serde_json::Value =
        serde_json::from_str(&success(&["diff", cache, hold, "--format", "json"])).unwrap();
    assert!(
        json["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("different programs")),
        "{json:#}"
    );
    let svg = dir.path().join("two.svg");
    let output = run(&["diff", cache, hold, "-o", svg.to_str().unwrap()]);
    assert_success(&output, "memtrace diff -o two.svg");
    assert!(
        text(&output.stderr).contains("different programs"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn two_windows_of_one_capture_name_what_grew_between_them() {
    let python = require_ebpf!(python());
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("one.capture");
    // Idle for 3 s, grow 64 MiB in grow_after_attach, hold 3 s.
    let args = ["--mib", "64", "--start-delay", "3", "--hold", "3"];
    record(dir.path(), &capture, &python, "wait_then_grow.py", &args);
    let capture = capture.to_str().unwrap();

    let table = success(&["diff", capture, "--from", "2s", "--to", "6s"]);
    // Nothing held at 2 s, 64 MiB at 6 s.
    assert_top_path_grew(&table, "grow_after_attach", 32.0);

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
fn diff_lists_the_formats_it_writes_and_refuses_the_others() {
    // clap lists what --format accepts.
    let stderr = failure(&["diff", "a", "b", "--format", "folded"]);
    assert!(
        stderr.contains("[possible values: table, flamegraph, json]"),
        "{stderr}"
    );
    // A report format named by -o's extension is refused before any work.
    let stderr = failure(&["diff", "a", "b", "-o", "d.html"]);
    assert!(
        stderr.contains("writes `table`, `flamegraph` or `json`, not `html`"),
        "{stderr}"
    );
}

#[test]
fn one_capture_needs_from_and_to() {
    let stderr = failure(&["diff", "a"]);
    assert!(stderr.contains("--from and --to"), "{stderr}");
}
