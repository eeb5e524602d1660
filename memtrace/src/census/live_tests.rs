//! Live check of the census against real interpreters (ignored by default:
//! needs root and pyenv's CPython 3.11/3.12/3.13 and Debian's static
//! /usr/bin/python3.11): each runs a workload of tests/scripts that prints
//! the allocators' own totals (`census_truth.py`: `sys._debugmallocstats`,
//! `mallinfo2`), holds still, and is read from outside. Run: `cargo test
//! -p memtrace census::live_tests -- --ignored --nocapture` as root.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use super::{Census, Censuses};
use crate::python::{probe, Probe};

/// The interpreters the census supports, by path.
fn interpreters() -> Vec<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let pyenv = Path::new(&home).join(".pyenv/versions");
    vec![
        pyenv.join("3.11.7/bin/python3.11"),
        pyenv.join("3.12.1/bin/python3.12"),
        pyenv.join("3.13.0/bin/python3.13"),
        PathBuf::from("/usr/bin/python3.11"),
    ]
}

/// A workload and its first JSON line; killed on drop.
struct Workload {
    child: Child,
    truth: serde_json::Value,
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(python: &Path, script: &str, args: &[&str]) -> Workload {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts");
    let mut child = Command::new(python)
        .arg(dir.join(script))
        .args(args)
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let truth = serde_json::from_str(&line).expect("a JSON line");
    Workload { child, truth }
}

fn census_of(workload: &Workload) -> Census {
    let tgid = workload.child.id();
    let Ok(Probe::Python(python)) = probe(tgid) else {
        panic!("{tgid} is not a ready CPython");
    };
    let census = Censuses::default()
        .take(tgid, tgid, Some(&python), 0)
        .expect("a census");
    eprintln!("{}: {census:#?}", python.binary.display());
    census
}

fn truth(workload: &Workload, field: &str) -> f64 {
    workload.truth[field].as_f64().unwrap()
}

fn within(actual: u64, expected: f64, fraction: f64, what: &str) {
    let error = (actual as f64 - expected).abs() / expected;
    assert!(
        error <= fraction,
        "{what}: census {actual}, truth {expected} ({:.2}% off)",
        100.0 * error
    );
}

#[test]
#[ignore = "needs root and the interpreters"]
fn pymalloc_survivors_are_read_as_pinned_free_memory() {
    for python in interpreters().iter().filter(|p| p.exists()) {
        let workload = run(
            python,
            "alloc_fragment.py",
            &["--mib", "120", "--hold", "30"],
        );
        let census = census_of(&workload);
        let pymalloc = census.pymalloc.as_ref().expect("pymalloc found");
        within(
            pymalloc.live_bytes,
            truth(&workload, "pymalloc_live_bytes"),
            0.01,
            "pymalloc live",
        );
        assert_eq!(pymalloc.invalid_pools, 0);
        assert!(pymalloc.free_bytes() > 100 << 20, "{pymalloc:?}");
        let glibc = census.glibc.as_ref().expect("glibc found");
        let truth_in_use =
            truth(&workload, "glibc_in_use_bytes") + truth(&workload, "glibc_mmapped_bytes");
        within(glibc.in_use_bytes(), truth_in_use, 0.1, "glibc in use");
    }
}

#[test]
#[ignore = "needs root and the interpreters"]
fn glibc_thread_arenas_are_read_as_free_memory() {
    for python in interpreters().iter().filter(|p| p.exists()) {
        let workload = run(
            python,
            "census_thread_arenas.py",
            &["--threads", "8", "--mib", "32", "--hold", "30"],
        );
        let census = census_of(&workload);
        let glibc = census.glibc.as_ref().expect("glibc found");
        assert!(glibc.arenas.len() >= 9, "{glibc:?}");
        let truth_in_use =
            truth(&workload, "glibc_in_use_bytes") + truth(&workload, "glibc_mmapped_bytes");
        within(glibc.in_use_bytes(), truth_in_use, 0.1, "glibc in use");
        let free: u64 = glibc.arenas.iter().map(|a| a.free_bytes).sum();
        within(
            free,
            truth(&workload, "glibc_free_bytes"),
            0.02,
            "glibc free",
        );
        assert!(
            glibc.thread_arena_free_resident_bytes() > 200 << 20,
            "{glibc:?}"
        );
    }
}
