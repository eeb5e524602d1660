//! Step 3 of the data flow: the set of traced processes, fed by the user's
//! targets and by fork/exec/exit records, and the Python-probing state of
//! each (a process that just exec'd a Python interpreter is probed again
//! until the interpreter has initialised).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use memtrace_common::PyProcessInfo;

use crate::aggregate::{PythonStatus, Role};

/// Where memtrace is in learning a process's CPython layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PythonState {
    /// Not known yet: probe again.
    Pending {
        /// When the process appeared or last exec'd.
        since: Instant,
        /// Whether the latest probe found no CPython runtime (the dynamic
        /// loader may not have mapped libpython yet).
        no_runtime_seen: bool,
    },
    /// Probing is over: Python (layout handed to the kernel side), not
    /// Python, or a CPython memtrace cannot walk.
    Known(PythonStatus),
}

/// One traced process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedProcess {
    /// Thread-group id.
    pub tgid: u32,
    /// tgid of the process it was forked from, if that one is traced.
    pub parent_tgid: Option<u32>,
    /// Root (asked for) or worker (forked descendant).
    pub role: Role,
    /// Python probing state.
    pub python: PythonState,
    /// The CPython layout handed to the kernel side, once known.
    pub py_info: Option<PyProcessInfo>,
    /// Set once its exit record arrived.
    pub exited: bool,
}

/// All processes traced in this session, by tgid.
#[derive(Debug, Default)]
pub struct ProcessTree {
    processes: BTreeMap<u32, TracedProcess>,
}

impl ProcessTree {
    /// Adds a process (a target or a fork child) in the `Pending` state;
    /// a tgid seen again (PID reuse after exit) replaces the old entry.
    pub fn add(&mut self, tgid: u32, parent_tgid: Option<u32>, role: Role) {
        let process = TracedProcess {
            tgid,
            parent_tgid,
            role,
            python: pending(),
            py_info: None,
            exited: false,
        };
        self.processes.insert(tgid, process);
    }

    /// Marks a process as having exec'd: its Python layout must be probed anew.
    pub fn exec(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.python = pending();
            p.py_info = None;
        }
    }

    /// Records the CPython layout handed to the kernel side for `tgid`.
    pub fn set_py_info(&mut self, tgid: u32, info: PyProcessInfo) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.py_info = Some(info);
        }
    }

    /// Notes that a probe of a pending process found no CPython runtime;
    /// returns how long the process has been pending (zero if it is not).
    pub fn note_no_runtime(&mut self, tgid: u32) -> Duration {
        match self.processes.get_mut(&tgid).map(|p| &mut p.python) {
            Some(PythonState::Pending {
                since,
                no_runtime_seen,
            }) => {
                *no_runtime_seen = true;
                since.elapsed()
            }
            _ => Duration::ZERO,
        }
    }

    /// Marks a process as exited.
    pub fn exit(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.exited = true;
        }
    }

    /// Records the outcome of probing a process's Python layout.
    pub fn set_python(&mut self, tgid: u32, state: PythonState) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.python = state;
        }
    }

    /// The process with this tgid, if traced.
    pub fn get(&self, tgid: u32) -> Option<&TracedProcess> {
        self.processes.get(&tgid)
    }

    /// Live processes whose Python layout is still unknown, with how long
    /// they have been pending.
    pub fn pending_python(&self) -> Vec<(u32, Duration)> {
        self.live()
            .filter_map(|p| match p.python {
                PythonState::Pending { since, .. } => Some((p.tgid, since.elapsed())),
                _ => None,
            })
            .collect()
    }

    /// Processes that have not exited.
    pub fn live(&self) -> impl Iterator<Item = &TracedProcess> {
        self.processes.values().filter(|p| !p.exited)
    }

    /// True when at least one process was traced and all have exited.
    pub fn all_exited(&self) -> bool {
        !self.processes.is_empty() && self.live().next().is_none()
    }
}

fn pending() -> PythonState {
    PythonState::Pending {
        since: Instant::now(),
        no_runtime_seen: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_forks_execs_and_exits() {
        let mut tree = ProcessTree::default();
        assert!(!tree.all_exited(), "an empty tree has not 'all exited'");
        tree.add(10, None, Role::Root);
        tree.add(11, Some(10), Role::Worker);
        tree.set_python(
            10,
            PythonState::Known(PythonStatus::Python {
                version: "3.11.7".into(),
            }),
        );
        let pending = |tree: &ProcessTree| -> Vec<u32> {
            tree.pending_python().into_iter().map(|(t, _)| t).collect()
        };
        assert_eq!(pending(&tree), vec![11]);
        tree.set_python(11, PythonState::Known(PythonStatus::NotPython));
        assert_eq!(tree.note_no_runtime(11), Duration::ZERO, "not pending");
        tree.exec(11);
        assert_eq!(pending(&tree), vec![11]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(tree.note_no_runtime(11) >= Duration::from_millis(5));
        assert!(matches!(
            tree.get(11).unwrap().python,
            PythonState::Pending {
                no_runtime_seen: true,
                ..
            }
        ));
        tree.exit(11);
        assert!(tree.pending_python().is_empty());
        assert!(!tree.all_exited());
        tree.exit(10);
        assert!(tree.all_exited());
        assert_eq!(tree.get(11).unwrap().parent_tgid, Some(10));
    }
}
