//! Step 3 of the data flow: the set of traced processes, fed by the user's
//! targets and by fork/exec/exit records, and the Python-probing state of
//! each (a process that just exec'd a Python interpreter is probed again
//! until the interpreter has initialised).

use std::collections::BTreeMap;

use crate::aggregate::Role;

/// Where memtrace is in learning a process's CPython layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PythonState {
    /// Not known yet: probe again on the next tick.
    Pending,
    /// Layout known and handed to the kernel side; the version, e.g. "3.11.7".
    Python(String),
    /// No CPython runtime in this process: it is traced without Python stacks.
    NotPython,
    /// A CPython memtrace cannot walk, with the reason.
    Unsupported(String),
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
            python: PythonState::Pending,
            exited: false,
        };
        self.processes.insert(tgid, process);
    }

    /// Marks a process as having exec'd: its Python layout must be probed anew.
    pub fn exec(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.python = PythonState::Pending;
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

    /// Live processes whose Python layout is still unknown.
    pub fn pending_python(&self) -> Vec<u32> {
        self.live()
            .filter(|p| p.python == PythonState::Pending)
            .map(|p| p.tgid)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_forks_execs_and_exits() {
        let mut tree = ProcessTree::default();
        assert!(!tree.all_exited(), "an empty tree has not 'all exited'");
        tree.add(10, None, Role::Root);
        tree.add(11, Some(10), Role::Worker);
        tree.set_python(10, PythonState::Python("3.11.7".into()));
        assert_eq!(tree.pending_python(), vec![11]);
        tree.set_python(11, PythonState::NotPython);
        tree.exec(11);
        assert_eq!(tree.pending_python(), vec![11]);
        tree.exit(11);
        assert!(tree.pending_python().is_empty());
        assert!(!tree.all_exited());
        tree.exit(10);
        assert!(tree.all_exited());
        assert_eq!(tree.get(11).unwrap().parent_tgid, Some(10));
    }
}
