//! The harness the eBPF integration tests share (tests/integration.rs,
//! tests/capture.rs, tests/diff.rs, tests/patterns.rs): the real memtrace
//! binary, the Python workloads in tests/scripts/, the interpreters they run
//! on, why a test skips, and reading the JSON report of a run.
//!
//! Flame graph SVG helpers are in `svg.rs` beside this file, included by
//! path only where flame graphs are drawn. A skip fails the test when
//! `MEMTRACE_REQUIRE_ALL=1` (`skip.rs`).

mod skip;
pub use skip::skip;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::Value;

/// A workload script of tests/scripts/.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("tests/scripts")
        .join(name)
}

/// The memtrace binary under test.
pub fn memtrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memtrace"))
}

/// Why eBPF tests cannot run here, if they cannot.
pub fn ebpf_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: loading eBPF programs needs CAP_BPF and CAP_PERFMON".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    None
}

/// Returns from the calling test, after printing why ([`skip`]), when eBPF programs
/// cannot be loaded here. With an `Option<PathBuf>` interpreter (see
/// [`interpreter`]), also returns when it is `None`, and is the interpreter
/// otherwise.
macro_rules! require_ebpf {
    () => {
        if let Some(why) = $crate::common::ebpf_unavailable() {
            $crate::common::skip(&why);
            return;
        }
    };
    ($python:expr) => {{
        $crate::common::require_ebpf!();
        match $python {
            Some(python) => python,
            None => return,
        }
    }};
}
pub(crate) use require_ebpf;

/// pyenv's `exe` of CPython `version`, e.g. `pyenv("3.11.7", "python3.11")`.
pub fn pyenv(version: &str, exe: &str) -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".pyenv/versions")
        .join(version)
        .join("bin")
        .join(exe)
}

/// pyenv's CPython 3.11, or `None` after printing why the test skips.
pub fn python_3_11() -> Option<PathBuf> {
    interpreter(&[pyenv("3.11.7", "python3.11")])
}

/// Debian sid's CPython `minor` ("3.14", "3.15") that `cargo xtask test`
/// unpacks under target/interpreters (xtask/src/interpreters.rs),
/// patchelf'd to its own loader and libraries; `None` after printing why
/// the test skips.
pub fn debian_python(minor: &str) -> Option<PathBuf> {
    interpreter(&[debian_tree(minor).join(format!("usr/bin/python{minor}"))])
}

/// The free-threaded CPython 3.13t that `cargo xtask test` builds under
/// target/interpreters (xtask/src/free_threaded.rs); `None` after printing
/// why the test skips.
pub fn free_threaded_python() -> Option<PathBuf> {
    interpreter(&[Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/interpreters/python3.13t/bin/python3.13t")])
}

/// The unpacked tree of [`debian_python`].
pub fn debian_tree(minor: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/interpreters")
        .join(format!("python{minor}"))
}

/// How to start [`debian_python`]'s unpatched file through the tree's own
/// loader: `[ld-linux-x86-64.so.2, --library-path, LIB, pythonX.Y.unpatched]`
/// (then `/proc/PID/exe` is the loader); `None` after printing why the
/// test skips.
pub fn debian_python_through_loader(minor: &str) -> Option<Vec<String>> {
    let tree = debian_tree(minor);
    let lib = tree.join("usr/lib/x86_64-linux-gnu");
    let unpatched = tree.join(format!("usr/bin/python{minor}.unpatched"));
    interpreter(std::slice::from_ref(&unpatched))?;
    Some(vec![
        lib.join("ld-linux-x86-64.so.2").display().to_string(),
        "--library-path".to_owned(),
        lib.display().to_string(),
        unpatched.display().to_string(),
    ])
}

/// The first of `candidates` that is installed, or `None` after printing
/// why the test skips.
pub fn interpreter(candidates: &[PathBuf]) -> Option<PathBuf> {
    let found = candidates.iter().find(|p| p.exists()).cloned();
    if found.is_none() {
        skip(&format!(
            "none of the interpreters {candidates:?} is installed"
        ));
    }
    found
}

/// A command's standard output, lossily decoded.
pub fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A command's standard error, lossily decoded.
pub fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that the command `what` succeeded, with its output if not.
pub fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A finished trace: memtrace's output and its JSON report.
pub struct Trace {
    /// memtrace's exit status and output (the workload's standard output
    /// comes through memtrace's).
    pub output: Output,
    /// The JSON report memtrace wrote.
    pub report: Value,
    /// The folded stacks file memtrace wrote beside it.
    pub folded: String,
}

impl Trace {
    /// memtrace's standard output, lossily decoded.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// The JSON line the workload printed for `event` (its own measurements).
    pub fn workload_event(&self, event: &str) -> Value {
        self.workload_events(event)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("workload printed no `{event}` line:\n{}", self.stdout()))
    }

    /// Every JSON line the workload printed for `event`, in order.
    pub fn workload_events(&self, event: &str) -> Vec<Value> {
        self.stdout()
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event"] == event)
            .collect()
    }

    /// The report's process rows (one per image of each process).
    pub fn processes(&self) -> &Vec<Value> {
        self.report["processes"]
            .as_array()
            .expect("the report lists processes")
    }

    /// The rows of the processes with `tgid` (several when the kernel reused
    /// it, or after an execve), in id order.
    pub fn rows_of(&self, tgid: u64) -> Vec<&Value> {
        let mut rows: Vec<&Value> = self
            .processes()
            .iter()
            .filter(|p| p["tgid"].as_u64() == Some(tgid))
            .collect();
        rows.sort_by_key(|p| p["id"].as_u64());
        rows
    }

    /// The only row of `tgid` (panics when there are none or several).
    pub fn row_of(&self, tgid: u64) -> &Value {
        let rows = self.rows_of(tgid);
        assert_eq!(rows.len(), 1, "rows of tgid {tgid}: {rows:#?}");
        rows[0]
    }

    /// The report's paths of process row `id`, largest held at peak first.
    pub fn paths_of(&self, id: u64) -> Vec<&Value> {
        self.report["paths"]
            .as_array()
            .expect("the report lists paths")
            .iter()
            .filter(|p| p["process"].as_u64() == Some(id))
            .collect()
    }

    /// The diagnosis' findings, strongest first.
    pub fn findings(&self) -> &Vec<Value> {
        self.report["diagnosis"]
            .as_array()
            .expect("the report has a diagnosis")
    }
}

/// The environment variable that picks the allocator hooks of the
/// allocator-mode tests: `sampler` or `uprobes` (unset: `run`'s default,
/// the sampler); `MEMTRACE_TEST_ALLOC_HOOKS=uprobes cargo xtask test` runs
/// them under the uprobes.
pub const ALLOC_HOOKS_ENV: &str = "MEMTRACE_TEST_ALLOC_HOOKS";

/// `--alloc-hooks` and [`ALLOC_HOOKS_ENV`]'s value, when it is set.
pub fn alloc_hooks_args() -> Vec<&'static str> {
    match std::env::var(ALLOC_HOOKS_ENV).as_deref() {
        Ok("uprobes") => vec!["--alloc-hooks", "uprobes"],
        Ok("sampler") => vec!["--alloc-hooks", "sampler"],
        Ok(other) => panic!("{ALLOC_HOOKS_ENV}={other}: expected sampler or uprobes"),
        Err(_) => Vec::new(),
    }
}

/// Whether the allocator-mode tests run with the uprobe hooks.
pub fn alloc_hooks_are_uprobes() -> bool {
    alloc_hooks_args().contains(&"uprobes")
}

/// Runs memtrace with `args` (plus `--quiet --output-dir TMP` after the
/// subcommand), expecting success, and reads the JSON report it wrote.
pub fn trace(args: &[&str]) -> Trace {
    trace_expecting(args, 0)
}

/// [`trace`], expecting memtrace to exit with `code` (`memtrace run` exits
/// with its command's status).
pub fn trace_expecting(args: &[&str], code: i32) -> Trace {
    let dir = tempfile::tempdir().unwrap();
    let output = memtrace()
        .arg(args[0])
        .arg("--quiet")
        .arg("--output-dir")
        .arg(dir.path())
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(code),
        "memtrace {args:?}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let written = |extension: &str| {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == extension))
            .unwrap_or_else(|| panic!("memtrace wrote no .{extension} report"))
    };
    let report = serde_json::from_str(&std::fs::read_to_string(written("json")).unwrap()).unwrap();
    let folded = std::fs::read_to_string(written("folded")).unwrap();
    Trace {
        output,
        report,
        folded,
    }
}

/// Runs `memtrace run --quiet --output-dir TMP -- PYTHON SCRIPT ARGS` on the
/// workload `script_name` of tests/scripts/, expecting success, and reads
/// its JSON report.
pub fn trace_script(python: &Path, script_name: &str, args: &[&str]) -> Trace {
    trace_script_expecting(python, script_name, args, 0)
}

/// [`trace_script`], expecting the workload (and so `memtrace run`) to exit
/// with `code` (128 + N for signal N, as a shell reports it).
pub fn trace_script_expecting(python: &Path, script_name: &str, args: &[&str], code: i32) -> Trace {
    let script = script(script_name);
    let debug_dir = debug_dir_of(python);
    let mut command = vec!["run"];
    if let Some(dir) = &debug_dir {
        command.extend(["--debug-dir", dir.to_str().unwrap()]);
    }
    command.extend(["--", python.to_str().unwrap(), script.to_str().unwrap()]);
    command.extend_from_slice(args);
    trace_expecting(&command, code)
}

/// The unpacked `-dbg` symbols (`usr/lib/debug`) of an interpreter of the
/// test setup's trees (target/interpreters), which memtrace gets with
/// `--debug-dir`: a user's `pythonX.Y-dbg` is under /usr/lib/debug.
pub fn debug_dir_of(python: &Path) -> Option<PathBuf> {
    let trees = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()?
        .join("target/interpreters");
    let relative = python.strip_prefix(&trees).ok()?;
    let tree = trees.join(relative.components().next()?);
    Some(tree.join("usr/lib/debug"))
}

/// Python function names of stack `stack` of a JSON `report`, in the
/// report's frame order.
pub fn stack_functions(report: &Value, stack: u64) -> Vec<String> {
    report["stacks"][stack as usize]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|frame| frame["function"].as_str())
        .map(str::to_owned)
        .collect()
}
