//! Part of the probe step (`bpf`): which file a uprobe is attached to,
//! however it was reached, so a binary mapped by many processes is probed
//! once.

use std::path::{Path, PathBuf};

/// What tells one file from another however it is reached (its own path,
/// `/proc/PID/map_files/...` of each process that maps it): its device and
/// inode, else (when it cannot be read) its path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum FileIdentity {
    Inode { dev: u64, ino: u64 },
    Path(PathBuf),
}

/// The [`FileIdentity`] of `path`.
pub(super) fn file_identity(path: &Path) -> FileIdentity {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map_or_else(
        |_| FileIdentity::Path(path.to_owned()),
        |m| FileIdentity::Inode {
            dev: m.dev(),
            ino: m.ino(),
        },
    )
}
