//! The bench virtualenv of `cargo xtask bench --peers`: the bench's Python
//! with memray and pyperformance from PyPI at pinned versions, so memtrace's
//! peers and the pyperformance workloads run on the same interpreter as the
//! untraced baseline.
//!
//! Made once under `target/bench/venv` and reused while its marker file
//! lists the same base interpreter and pins.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

/// Where the virtualenv lives, relative to the workspace root.
const VENV_DIR: &str = "target/bench/venv";

/// File inside the virtualenv recording what it was made from; written last,
/// so an interrupted install is redone.
const MARKER_FILE: &str = "memtrace-bench-pins.txt";

/// What is installed from PyPI, pinned. pyperf is a dependency of
/// pyperformance, pinned here too because its `Runner` is what the
/// pyperformance adapter stands in for. Their own dependencies are not pinned.
pub const PINS: [(&str, &str); 3] = [
    ("memray", "1.20.0"),
    ("pyperformance", "1.14.0"),
    ("pyperf", "2.11.0"),
];

/// Returns the bench virtualenv's Python, making or remaking the virtualenv
/// with `base_python` when it is missing or its marker does not match.
///
/// # Errors
/// `python -m venv` or `pip install` fails (pip's output is shown above the
/// error), or the virtualenv cannot be cleared or its marker written.
pub fn ensure(base_python: &Path) -> Result<PathBuf> {
    let venv = Path::new(VENV_DIR);
    let venv_python = venv.join("bin/python");
    let marker = venv.join(MARKER_FILE);
    let wanted = marker_text(base_python);
    if venv_python.exists() && fs::read_to_string(&marker).ok().as_deref() == Some(&wanted) {
        return Ok(venv_python);
    }
    println!(
        "bench: making the bench virtualenv `{VENV_DIR}` with {} ({})",
        base_python.display(),
        requirements().join(", ")
    );
    if venv.exists() {
        fs::remove_dir_all(venv).with_context(|| format!("cannot clear `{VENV_DIR}`"))?;
    }
    run_step(
        Command::new(base_python).args(["-m", "venv"]).arg(venv),
        "cannot create the bench virtualenv",
    )?;
    run_step(
        Command::new(&venv_python)
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(requirements()),
        "pip could not install the bench's packages from PyPI (is PyPI reachable? pip's output is above)",
    )?;
    fs::write(&marker, wanted).with_context(|| format!("cannot write `{}`", marker.display()))?;
    Ok(venv_python)
}

/// The pins as pip requirements, `name==version`.
fn requirements() -> Vec<String> {
    PINS.iter()
        .map(|(name, version)| format!("{name}=={version}"))
        .collect()
}

/// The marker's content: the base interpreter, then one requirement a line.
fn marker_text(base_python: &Path) -> String {
    let mut text = format!("python {}\n", base_python.display());
    for requirement in requirements() {
        text.push_str(&requirement);
        text.push('\n');
    }
    text
}

/// Runs one setup step with its output shown; fails with `what` and the
/// command when it does not exit 0.
fn run_step(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{what}: {cmd:?} failed: {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_are_exact_pins() {
        assert_eq!(
            requirements(),
            ["memray==1.20.0", "pyperformance==1.14.0", "pyperf==2.11.0"]
        );
    }

    #[test]
    fn marker_names_the_base_python_and_every_pin() {
        let text = marker_text(Path::new("/usr/bin/python3.11"));
        assert_eq!(
            text,
            "python /usr/bin/python3.11\nmemray==1.20.0\npyperformance==1.14.0\npyperf==2.11.0\n"
        );
        assert_ne!(text, marker_text(Path::new("/other/python3")));
    }
}
