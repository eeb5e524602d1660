//! Step 3 of the data flow, for `memtrace run`: start the user's command
//! held just before its `execve`, so the caller can add it to the traced set
//! and then let it run: nothing it does, from its first instruction, is
//! missed.

use std::{
    ffi::OsString,
    io::{Read as _, Write as _},
    os::{fd::OwnedFd, unix::process::CommandExt as _},
    process::{Child, Command},
    thread::JoinHandle,
};

use thiserror::Error;

/// Starting the command failed.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// No command was given.
    #[error("no command given after `--`")]
    Empty,
    /// The hand-shake pipes could not be made.
    #[error("cannot create a pipe to start `{command}`")]
    Pipe {
        /// The command.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// fork or exec failed (e.g. the program does not exist).
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A forked child waiting before `execve` until [`HeldChild::release`].
pub struct HeldChild {
    /// PID of the child (its tgid).
    pub pid: u32,
    command: String,
    go: std::fs::File,
    spawner: JoinHandle<std::io::Result<Child>>,
}

/// Forks `argv` with the extra environment variables `envs`, returning once
/// the child is waiting before its `execve`.
///
/// # Errors
/// [`LaunchError`] when `argv` is empty, the pipes cannot be made, or fork
/// fails; an exec failure (no such program) is reported by
/// [`HeldChild::release`].
pub fn spawn_held(
    argv: &[OsString],
    envs: &[(String, OsString)],
) -> Result<HeldChild, LaunchError> {
    let (program, args) = argv.split_first().ok_or(LaunchError::Empty)?;
    let command = argv
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let pipe_err = |source| LaunchError::Pipe {
        command: command.clone(),
        source,
    };
    let (pid_rx, pid_tx) = std::io::pipe().map_err(pipe_err)?;
    let (go_rx, go_tx) = std::io::pipe().map_err(pipe_err)?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.envs(envs.iter().map(|(name, value)| (name, value)));
    let pid_tx = OwnedFd::from(pid_tx);
    let go_rx = OwnedFd::from(go_rx);
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe functions (prctl, getpid, write, read).
    unsafe {
        cmd.pre_exec(move || {
            clear_ambient_capabilities()?;
            let mut tx = std::fs::File::from(pid_tx.try_clone()?);
            tx.write_all(&std::process::id().to_ne_bytes())?;
            drop(tx);
            let mut rx = std::fs::File::from(go_rx.try_clone()?);
            let mut go = [0u8; 1];
            rx.read_exact(&mut go)
        });
    }
    // `Command::spawn` returns only once exec succeeded or failed, so it runs
    // on its own thread while this one traces the held child.
    let spawner = std::thread::spawn(move || cmd.spawn());
    let mut pid_bytes = [0u8; 4];
    let mut rx = std::fs::File::from(OwnedFd::from(pid_rx));
    if let Err(source) = rx.read_exact(&mut pid_bytes) {
        let source = match spawner.join() {
            Ok(Err(spawn_err)) => spawn_err,
            _ => source,
        };
        return Err(LaunchError::Spawn { command, source });
    }
    Ok(HeldChild {
        pid: u32::from_ne_bytes(pid_bytes),
        command,
        go: std::fs::File::from(OwnedFd::from(go_tx)),
        spawner,
    })
}

/// Empties the calling process's ambient capability set, so the command
/// runs with the privileges of its uid only: capabilities memtrace was given
/// to trace (`setpriv --ambient-caps=+bpf,...`) are not passed on through
/// `execve` (capabilities(7), "Transformation of capabilities during
/// execve()"). Makes no allocation: it runs between fork and exec.
///
/// # Errors
/// The OS error of `prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)`
/// (EINVAL before Linux 4.3, which has no ambient set).
fn clear_ambient_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl HeldChild {
    /// Lets the child exec the command.
    ///
    /// # Errors
    /// [`LaunchError::Spawn`] when the exec failed (no such program, not
    /// executable); the child has then exited.
    pub fn release(mut self) -> Result<Child, LaunchError> {
        let spawn_err = |source| LaunchError::Spawn {
            command: self.command.clone(),
            source,
        };
        self.go.write_all(&[1]).map_err(spawn_err)?;
        match self.spawner.join() {
            Ok(result) => result.map_err(spawn_err),
            Err(_) => Err(spawn_err(std::io::Error::other(
                "the spawning thread panicked",
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_child_runs_only_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let argv: Vec<OsString> = vec![
            "sh".into(),
            "-c".into(),
            format!("touch {}", marker.display()).into(),
        ];
        let held = spawn_held(&argv, &[]).unwrap();
        assert!(held.pid > 0);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "the command ran before release");
        let mut child = held.release().unwrap();
        assert!(child.wait().unwrap().success());
        assert!(marker.exists());
    }

    #[test]
    fn missing_program_is_reported_on_release() {
        let argv: Vec<OsString> = vec!["/nonexistent/memtrace-test-program".into()];
        let held = spawn_held(&argv, &[]).unwrap();
        let err = held.release().unwrap_err();
        assert!(err
            .to_string()
            .contains("cannot run `/nonexistent/memtrace-test-program`"));
    }
}
