//! Part of the aggregation step's result: what each process image is to a
//! reader ([`ProcessKind`]: master, worker, helper, child, main), told from
//! the traced tree's shape (who forked whom, which images exec'd) and
//! whether the image runs Python. Worker statistics (siblings, "every worker
//! is large", multiplication) read only [`ProcessKind::Worker`] images, so a
//! shell, a launch shim or a load generator never counts as a worker.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ProcessReport;
use crate::aggregate::{ProcessId, PythonStatus, Role};

/// A forked image that exec'd within this long of its fork is the fork of a
/// subprocess (`subprocess.Popen`, `os.posix_spawn`), not a worker that
/// later ran another program. 1 s.
const PRE_EXEC_NS: u64 = 1_000_000_000;

/// What a process image is, as a reader of a service's process tree names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    /// A traced root (or its image after an exec) with at least one worker.
    Master,
    /// A traced root (or its image after an exec) without workers: the
    /// program itself.
    #[default]
    Main,
    /// A forked child that keeps running its parent's Python program (no
    /// exec): a pre-fork server's worker, a `multiprocessing` fork child.
    Worker,
    /// A Python program a traced process started (a child's image after an
    /// exec that runs Python): a subprocess, a load generator.
    Child,
    /// An image that never runs Python: a shell, a launch shim
    /// (`pyenv`'s bash), `sh -c`, the short-lived fork of a subprocess
    /// before its exec.
    Helper,
}

impl ProcessKind {
    /// The kind's plural noun: `masters`, `children`, ...
    #[must_use]
    pub fn plural(self) -> &'static str {
        match self {
            Self::Master => "masters",
            Self::Main => "mains",
            Self::Worker => "workers",
            Self::Child => "children",
            Self::Helper => "helpers",
        }
    }
}

impl fmt::Display for ProcessKind {
    /// The kind's noun, padded to the formatter's width.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Self::Master => "master",
            Self::Main => "main",
            Self::Worker => "worker",
            Self::Child => "child",
            Self::Helper => "helper",
        })
    }
}

/// What telling an image's kind needs of it: the report's row, or the
/// aggregator's state while tracing runs (the live view).
pub(in crate::aggregate) struct Facts<'a> {
    /// Its row.
    pub(in crate::aggregate) id: ProcessId,
    /// Its tgid.
    pub(in crate::aggregate) tgid: u32,
    /// The image it was forked from.
    pub(in crate::aggregate) parent: Option<ProcessId>,
    /// Its parent's tgid.
    pub(in crate::aggregate) parent_tgid: Option<u32>,
    /// Traced on request or forked.
    pub(in crate::aggregate) role: Role,
    /// 0 for the first image, +1 per execve.
    pub(in crate::aggregate) image: u32,
    /// Nanoseconds from its start to the exec that replaced it, if any.
    pub(in crate::aggregate) exec_after_ns: Option<u64>,
    /// Its probed Python status, if probed.
    pub(in crate::aggregate) python: Option<&'a PythonStatus>,
}

impl<'a> Facts<'a> {
    /// The facts of a report's row.
    fn of(p: &'a ProcessReport) -> Self {
        Self {
            id: p.id,
            tgid: p.tgid,
            parent: p.parent,
            parent_tgid: p.parent_tgid,
            role: p.role,
            image: p.image,
            exec_after_ns: p.exec_ns.map(|_| p.traced_ns),
            python: p.python.as_ref(),
        }
    }
}

/// Sets [`ProcessReport::kind`] of every image of `reports` (a whole run's
/// images, in any order; see [`kinds`]).
pub(in crate::aggregate) fn assign(reports: &mut [ProcessReport]) {
    let kinds = kinds(&reports.iter().map(Facts::of).collect::<Vec<_>>());
    for (p, kind) in reports.iter_mut().zip(kinds) {
        p.kind = kind;
    }
}

/// The kind of each image of `images` (a whole run's, in any order): helpers
/// first (no Python), then workers (forked Python images that did not exec),
/// then each root image is a master when a worker's parent is one of its
/// process's images.
pub(in crate::aggregate) fn kinds(images: &[Facts<'_>]) -> Vec<ProcessKind> {
    let mut kinds: Vec<ProcessKind> = images
        .iter()
        .map(|p| leaf_kind(p, runs_python(p, images)))
        .collect();
    let worker_parents: HashSet<u32> = images
        .iter()
        .zip(&kinds)
        .filter(|(_, kind)| **kind == ProcessKind::Worker)
        .filter_map(|(p, _)| p.parent_tgid)
        .collect();
    for (p, kind) in images.iter().zip(kinds.iter_mut()) {
        if *kind == ProcessKind::Main && worker_parents.contains(&p.tgid) {
            *kind = ProcessKind::Master;
        }
    }
    kinds
}

/// The kind of `p` before masters are told apart from mains.
fn leaf_kind(p: &Facts<'_>, is_python: bool) -> ProcessKind {
    match (p.role, is_python) {
        (_, false) => ProcessKind::Helper,
        (Role::Root, true) => ProcessKind::Main,
        // Attached by pid, but a fork of its parent that did not exec.
        (Role::ForkedRoot, true) => ProcessKind::Worker,
        (Role::Child, true) => ProcessKind::Child,
        // The fork of a subprocess, soon replaced by its exec: not a worker.
        (Role::Worker, true)
            if p.image == 0 && p.exec_after_ns.is_some_and(|ns| ns < PRE_EXEC_NS) =>
        {
            ProcessKind::Helper
        }
        (Role::Worker, true) if p.image == 0 => ProcessKind::Worker,
        (Role::Worker, true) => ProcessKind::Child,
    }
}

/// Whether image `p` runs Python: its probed status says so, or it was
/// never probed (it lived too briefly) and it is the fork, before any exec,
/// of an image that runs Python. An image after an exec that was never
/// probed does not count: the short-lived programs a launch shim or a shell
/// runs (`pyenv`'s bash helpers) are never probed.
fn runs_python(p: &Facts<'_>, images: &[Facts<'_>]) -> bool {
    match p.python {
        Some(PythonStatus::Python { .. } | PythonStatus::Unsupported { .. }) => true,
        Some(PythonStatus::NotPython) => false,
        None => {
            p.image == 0
                && p.parent
                    .and_then(|parent| images.iter().find(|r| r.id == parent))
                    .is_some_and(|parent| runs_python(parent, images))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProcessKind;

    #[test]
    fn kinds_read_as_nouns_and_pad() {
        assert_eq!(format!("{:<7}|", ProcessKind::Child), "child  |");
        assert_eq!(ProcessKind::Child.plural(), "children");
        assert_eq!(ProcessKind::Master.plural(), "masters");
    }
}
