//! The last step of the data flow: every file memtrace writes (the report
//! files, each `--format` file, the capture, `report -o`, `diff -o`) is
//! created here, never through a symbolic link (one planted by another user
//! must not make root overwrite what it points to), and never over an
//! existing file unless the user passed `--force`.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
};

use nix::{errno::Errno, fcntl::OFlag};

/// Why [`create`] refused a path; carried inside the `io::Error` it returns,
/// whose context (the caller's error) names the file.
#[derive(Debug, thiserror::Error)]
pub enum OutputFileError {
    /// A file (or anything else) is already there and `--force` was not
    /// given.
    #[error("it already exists: pass --force to replace it, or choose another name")]
    Exists,
    /// The path is a symbolic link, which is never followed, even with
    /// `--force`.
    #[error(
        "it is a symbolic link, which memtrace never writes through (not even with --force): \
         remove it or choose another name"
    )]
    Symlink,
}

/// Opens `path` for writing as a new file; with `force`, an existing
/// regular file is truncated and rewritten instead. The last component of
/// `path` is never followed when it is a symbolic link (`O_NOFOLLOW`, and
/// `O_EXCL` without `force`). New files get mode 0666 less the umask.
///
/// # Errors
/// The `io::Error` of `open(2)`; when `path` exists and `force` is false,
/// one of kind [`io::ErrorKind::AlreadyExists`] carrying
/// [`OutputFileError::Exists`]; when `path` is a symbolic link, one
/// carrying [`OutputFileError::Symlink`].
pub fn create(path: &Path, force: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .mode(0o666)
        .custom_flags(OFlag::O_NOFOLLOW.bits());
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    options.open(path).map_err(|err| explain(path, err))
}

/// Replaces the errors of a refused path with ones that say what to do.
fn explain(path: &Path, err: io::Error) -> io::Error {
    let is_symlink = || path.symlink_metadata().is_ok_and(|m| m.is_symlink());
    let refused_link = err.kind() == io::ErrorKind::AlreadyExists
        || err.raw_os_error() == Some(Errno::ELOOP as i32);
    if refused_link && is_symlink() {
        io::Error::new(err.kind(), OutputFileError::Symlink)
    } else if err.kind() == io::ErrorKind::AlreadyExists {
        io::Error::new(err.kind(), OutputFileError::Exists)
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::fs::{symlink, PermissionsExt as _};

    use super::*;

    /// A 0600 file holding `secret`, as another user's would be.
    fn private_file(dir: &Path) -> std::path::PathBuf {
        let victim = dir.join("victim");
        std::fs::write(&victim, "secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        victim
    }

    fn message(err: &io::Error) -> String {
        err.to_string()
    }

    #[test]
    fn a_new_file_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        create(&path, false).unwrap().write_all(b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}");
    }

    #[test]
    fn an_existing_file_is_kept_without_force_and_replaced_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        std::fs::write(&path, "earlier report").unwrap();
        let err = create(&path, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(message(&err).contains("pass --force"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier report");

        create(&path, true).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    }

    #[test]
    fn a_planted_symlink_is_never_followed_even_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let victim = private_file(dir.path());
        let link = dir.path().join("memtrace.capture");
        symlink(&victim, &link).unwrap();
        for force in [false, true] {
            let err = create(&link, force).unwrap_err();
            assert!(
                message(&err).contains("symbolic link"),
                "force {force}: {err}"
            );
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A dangling link is not created through either.
        let dangling = dir.path().join("dangling");
        symlink(dir.path().join("absent"), &dangling).unwrap();
        assert!(create(&dangling, false).is_err());
        assert!(create(&dangling, true).is_err());
        assert!(!dir.path().join("absent").exists());
    }
}
