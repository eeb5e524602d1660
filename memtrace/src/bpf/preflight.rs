//! Checks run before loading the BPF programs, so that a missing privilege
//! or kernel feature is reported as one clear, actionable error naming the
//! missing capability, instead of a verifier or `EPERM` failure deep inside
//! aya.
//!
//! What is needed and why: `CAP_BPF` and `CAP_PERFMON` (or
//! `CAP_SYS_ADMIN`) to load and attach the programs; and read access to
//! tracefs, where aya reads the ids of the syscall tracepoints
//! (`syscalls:sys_enter_mmap`, ...: unlike `tp_btf` programs, these have
//! no attach point by name). tracefs is `0700 root`, so a uid other than 0
//! also needs `CAP_DAC_READ_SEARCH`; mounting it when it is not mounted
//! needs `CAP_SYS_ADMIN`.

use std::{fs, io, os::unix::fs::MetadataExt as _, path::Path, process::Command};

use caps::Capability;

use super::{btf::VMLINUX_BTF_PATH, BpfError};
use crate::privileges::{self, Privileges};

/// Where tracefs is expected (aya reads tracepoint ids below it).
pub const TRACEFS_PATH: &str = "/sys/kernel/tracing";

/// Runs every check; mounts tracefs when it is missing.
///
/// # Errors
/// [`BpfError::NotPrivileged`], [`BpfError::NoBtf`], [`BpfError::Tracefs`],
/// [`BpfError::TracefsUnmounted`] or [`BpfError::TracefsDenied`], each
/// saying how to fix it.
pub fn check() -> Result<(), BpfError> {
    let privileges = Privileges::current();
    check_capabilities(&privileges)?;
    check_btf(Path::new(VMLINUX_BTF_PATH))?;
    ensure_tracefs(Path::new(TRACEFS_PATH), &privileges)
}

/// Requires `CAP_SYS_ADMIN`, or both `CAP_BPF` and `CAP_PERFMON`.
fn check_capabilities(privileges: &Privileges) -> Result<(), BpfError> {
    let missing = privileges.missing_for_tracing();
    if missing.is_empty() {
        return Ok(());
    }
    let hint = if privileges.uid == 0 {
        "memtrace runs as root (uid 0), but the capability was dropped (capsh --drop, \
         setpriv, a container's or a systemd unit's capability set): keep CAP_BPF and \
         CAP_PERFMON in its effective set"
            .to_owned()
    } else {
        format!(
            "run it as root, or (as uid {}) give it CAP_BPF, CAP_PERFMON and \
             CAP_DAC_READ_SEARCH, plus CAP_SYS_PTRACE to trace other users' processes \
             (README, Requirements)",
            privileges.uid
        )
    };
    Err(BpfError::NotPrivileged {
        missing: privileges::names(&missing),
        effective: privileges.held_names(&[
            Capability::CAP_BPF,
            Capability::CAP_PERFMON,
            Capability::CAP_SYS_ADMIN,
        ]),
        hint,
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

/// Requires tracefs at `path` to be readable; mounts it when it is not
/// mounted (an empty sysfs directory) and `CAP_SYS_ADMIN` allows it.
fn ensure_tracefs(path: &Path, privileges: &Privileges) -> Result<(), BpfError> {
    match fs::metadata(path.join("events")) {
        Ok(events) if events.is_dir() => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
            Err(tracefs_denied(path, privileges))
        }
        _ if !privileges.has(Capability::CAP_SYS_ADMIN) => Err(BpfError::TracefsUnmounted {
            path: path.to_path_buf(),
        }),
        _ => mount_tracefs(path),
    }
}

/// The error for a tracefs this process may not search.
fn tracefs_denied(path: &Path, privileges: &Privileges) -> BpfError {
    let (mode, owner_uid) = fs::metadata(path).map_or((0, 0), |m| (m.mode() & 0o7777, m.uid()));
    BpfError::TracefsDenied {
        path: path.to_path_buf(),
        mode,
        owner_uid,
        uid: privileges.uid,
    }
}

/// Runs `mount -t tracefs nodev PATH`.
fn mount_tracefs(path: &Path) -> Result<(), BpfError> {
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
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn root_and_bpf_perfmon_are_enough() {
        let root = Privileges::with(0, &[Capability::CAP_SYS_ADMIN]);
        assert!(check_capabilities(&root).is_ok());
        let bpf = Privileges::with(1000, &[Capability::CAP_BPF, Capability::CAP_PERFMON]);
        assert!(check_capabilities(&bpf).is_ok());
    }

    #[test]
    fn a_user_without_capabilities_is_told_the_set() {
        let text = check_capabilities(&Privileges::with(1000, &[]))
            .unwrap_err()
            .to_string();
        assert!(text.contains("CAP_BPF and CAP_PERFMON missing"), "{text}");
        assert!(text.contains("CAP_DAC_READ_SEARCH"), "{text}");
        assert!(text.contains("run it as root"), "{text}");
    }

    #[test]
    fn root_without_cap_bpf_is_not_told_to_use_sudo() {
        let root = Privileges::with(0, &[Capability::CAP_PERFMON, Capability::CAP_CHOWN]);
        let text = check_capabilities(&root).unwrap_err().to_string();
        assert!(text.contains("CAP_BPF missing"), "{text}");
        assert!(text.contains("has: CAP_PERFMON)"), "{text}");
        assert!(text.contains("runs as root (uid 0)"), "{text}");
        assert!(
            !text.contains("sudo") && !text.contains("run it as root"),
            "{text}"
        );
    }

    #[test]
    fn missing_btf_is_reported_with_its_path() {
        let err = check_btf(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }

    #[test]
    fn unmounted_tracefs_without_sys_admin_names_it() {
        let empty = tempfile::tempdir().unwrap();
        let user = Privileges::with(1000, &[Capability::CAP_BPF, Capability::CAP_PERFMON]);
        let err = ensure_tracefs(empty.path(), &user).unwrap_err();
        assert!(matches!(err, BpfError::TracefsUnmounted { .. }), "{err}");
        assert!(err.to_string().contains("needs CAP_SYS_ADMIN"), "{err}");
    }

    #[test]
    fn readable_tracefs_passes() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("events")).unwrap();
        assert!(ensure_tracefs(dir.path(), &Privileges::with(1000, &[])).is_ok());
    }

    #[test]
    fn denied_tracefs_names_cap_dac_read_search() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let err = tracefs_denied(dir.path(), &Privileges::with(65534, &[]));
        let text = err.to_string();
        assert!(text.contains("mode 0700"), "{text}");
        assert!(
            text.contains("uid 65534 without CAP_DAC_READ_SEARCH"),
            "{text}"
        );
    }
}
