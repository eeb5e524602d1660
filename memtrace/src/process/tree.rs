//! Step 3 of the data flow: the processes traced now, fed by the user's
//! targets and by fork/exec/exit records. Each live tgid maps to the
//! aggregator's row of its current image ([`ProcessId`]); an exit removes
//! the tgid, so a process the kernel later gives the same tgid is a new one.
//! Also the Python-probing state of each (a process that just exec'd a
//! Python interpreter is probed again until the interpreter has
//! initialised).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use memtrace_common::PyProcessInfo;

use super::{ProcessId, PythonStatus, Role};

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

/// One traced live process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedProcess {
    /// Thread-group id.
    pub tgid: u32,
    /// The aggregator's row of its current image.
    pub id: ProcessId,
    /// Root (asked for) or worker (forked descendant).
    pub role: Role,
    /// Python probing state of the current image.
    pub python: PythonState,
    /// The CPython layout handed to the kernel side, once known.
    pub py_info: Option<PyProcessInfo>,
    /// Set once it began to exit: no more probing.
    pub exiting: bool,
    /// Exec records handled since it entered the trace (the kernel's
    /// `ProcessCounters::exec_count` when none is queued).
    pub exec_count: u32,
}

/// The live traced processes, by tgid.
#[derive(Debug, Default)]
pub struct ProcessTree {
    processes: BTreeMap<u32, TracedProcess>,
    /// Whether any process was ever added.
    ever_traced: bool,
}

impl ProcessTree {
    /// Adds a process (a target or a fork child) as image `id`, in the
    /// `Pending` state; a tgid still present (its exit was never seen) is
    /// replaced.
    pub fn add(&mut self, tgid: u32, id: ProcessId, role: Role) {
        let process = TracedProcess {
            tgid,
            id,
            role,
            python: pending(),
            py_info: None,
            exiting: false,
            exec_count: 0,
        };
        self.processes.insert(tgid, process);
        self.ever_traced = true;
    }

    /// Image `id` replaced the process's image by execve: its Python layout
    /// must be probed anew.
    pub fn exec(&mut self, tgid: u32, id: ProcessId) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.id = id;
            p.python = pending();
            p.py_info = None;
            p.exiting = false;
            p.exec_count = p.exec_count.wrapping_add(1);
        }
    }

    /// The process was traced before the execve that added it (`memtrace
    /// run`'s command, held before its exec): the kernel counted that exec.
    pub fn added_by_exec(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.exec_count = p.exec_count.wrapping_add(1);
        }
    }

    /// The process began to exit: it is no longer probed.
    pub fn exit_began(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.exiting = true;
        }
    }

    /// The process is gone: its tgid is free for a new process.
    pub fn exit(&mut self, tgid: u32) -> Option<TracedProcess> {
        self.processes.remove(&tgid)
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

    /// Records the outcome of probing a process's Python layout.
    pub fn set_python(&mut self, tgid: u32, state: PythonState) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.python = state;
        }
    }

    /// The live process with this tgid, if traced.
    pub fn get(&self, tgid: u32) -> Option<&TracedProcess> {
        self.processes.get(&tgid)
    }

    /// The row of the current image of the live process `tgid`.
    pub fn id_of(&self, tgid: u32) -> Option<ProcessId> {
        self.processes.get(&tgid).map(|p| p.id)
    }

    /// Live processes not exiting whose Python layout is still unknown,
    /// with how long they have been pending.
    pub fn pending_python(&self) -> Vec<(u32, Duration)> {
        self.live()
            .filter(|p| !p.exiting)
            .filter_map(|p| match p.python {
                PythonState::Pending { since, .. } => Some((p.tgid, since.elapsed())),
                _ => None,
            })
            .collect()
    }

    /// The live processes, by tgid.
    pub fn live(&self) -> impl Iterator<Item = &TracedProcess> {
        self.processes.values()
    }

    /// True when at least one process was traced and all have exited.
    pub fn all_exited(&self) -> bool {
        self.ever_traced && self.processes.is_empty()
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
    fn tracks_forks_execs_exits_and_reused_tgids() {
        let mut tree = ProcessTree::default();
        assert!(!tree.all_exited(), "an empty tree has not 'all exited'");
        tree.add(10, ProcessId(0), Role::Root);
        tree.add(11, ProcessId(1), Role::Worker);
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
        tree.exec(11, ProcessId(2));
        assert_eq!(tree.id_of(11), Some(ProcessId(2)));
        assert_eq!(pending(&tree), vec![11]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(tree.note_no_runtime(11) >= Duration::from_millis(5));
        tree.exit_began(11);
        assert!(
            tree.pending_python().is_empty(),
            "an exiting process is not probed"
        );
        assert_eq!(tree.exit(11).map(|p| p.id), Some(ProcessId(2)));
        assert_eq!(tree.id_of(11), None);
        // The kernel gives tgid 11 to a new process.
        tree.add(11, ProcessId(3), Role::Worker);
        assert_eq!(tree.id_of(11), Some(ProcessId(3)));
        tree.exit(11);
        assert!(!tree.all_exited());
        tree.exit(10);
        assert!(tree.all_exited());
    }
}
