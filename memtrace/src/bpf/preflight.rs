//! Checks run before loading the BPF programs, so that a missing privilege
//! or kernel feature is reported as one clear, actionable error instead of
//! a verifier or `EPERM` failure deep inside aya.

use std::{fs, path::Path, process::Command};

use super::{btf::VMLINUX_BTF_PATH, BpfError};

/// Where tracefs is expected (aya reads tracepoint ids below it).
pub const TRACEFS_PATH: &str = "/sys/kernel/tracing";

/// `CAP_SYS_ADMIN` bit in `CapEff` (include/uapi/linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON` bit (Linux >= 5.8): tracing programs.
const CAP_PERFMON: u32 = 38;
/// `CAP_BPF` bit (Linux >= 5.8): loading programs and maps.
const CAP_BPF: u32 = 39;

/// Runs every check; mounts tracefs when it is missing.
///
/// # Errors
/// [`BpfError::NotPrivileged`], [`BpfError::NoBtf`] or
/// [`BpfError::Tracefs`], each saying how to fix it.
pub fn check() -> Result<(), BpfError> {
    check_capabilities(&fs::read_to_string("/proc/self/status").unwrap_or_default())?;
    check_btf(Path::new(VMLINUX_BTF_PATH))?;
    ensure_tracefs(Path::new(TRACEFS_PATH))
}

/// The effective capability set from a `/proc/<pid>/status` text.
fn effective_capabilities(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Requires `CAP_SYS_ADMIN`, or both `CAP_BPF` and `CAP_PERFMON`.
fn check_capabilities(status: &str) -> Result<(), BpfError> {
    let caps = effective_capabilities(status).unwrap_or(0);
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect::<Vec<_>>()
        .join(" and ");
    Err(BpfError::NotPrivileged {
        missing,
        effective: format!("{caps:#x}"),
    })
}

/// Requires the kernel's BTF (`CONFIG_DEBUG_INFO_BTF`).
fn check_btf(path: &Path) -> Result<(), BpfError> {
    if path.exists() {
        Ok(())
    } else {
        Err(BpfError::NoBtf {
            path: path.to_path_buf(),
        })
    }
}

/// Mounts tracefs at `path` unless its `events` directory is there.
fn ensure_tracefs(path: &Path) -> Result<(), BpfError> {
    if path.join("events").is_dir() {
        return Ok(());
    }
    let output = Command::new("mount")
        .args(["-t", "tracefs", "nodev"])
        .arg(path)
        .output();
    let detail = match output {
        Ok(output) if output.status.success() && path.join("events").is_dir() => return Ok(()),
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        Err(err) => err.to_string(),
    };
    Err(BpfError::Tracefs {
        path: path.to_path_buf(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS_ROOT: &str = "Name:\tx\nCapInh:\t0\nCapEff:\t000001ffffffffff\n";
    const STATUS_NONE: &str = "Name:\tx\nCapEff:\t0000000000000000\n";
    /// CAP_BPF | CAP_PERFMON only.
    const STATUS_BPF: &str = "CapEff:\t000000c000000000\n";
    /// CAP_BPF only.
    const STATUS_BPF_ONLY: &str = "CapEff:\t0000008000000000\n";

    #[test]
    fn root_and_bpf_perfmon_are_enough() {
        assert!(check_capabilities(STATUS_ROOT).is_ok());
        assert!(check_capabilities(STATUS_BPF).is_ok());
    }

    #[test]
    fn missing_capabilities_are_named() {
        let err = check_capabilities(STATUS_NONE).unwrap_err();
        assert!(err.to_string().contains("CAP_BPF and CAP_PERFMON"), "{err}");
        let err = check_capabilities(STATUS_BPF_ONLY).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("CAP_PERFMON") && !text.contains("CAP_BPF and"),
            "{text}"
        );
    }

    #[test]
    fn missing_btf_is_reported_with_its_path() {
        let err = check_btf(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }
}
