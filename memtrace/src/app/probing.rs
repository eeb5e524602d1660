//! CPython probing of traced processes: a process that appears or execs is
//! probed on every drain for a short window (an interpreter initialises in
//! milliseconds), then on every tick, until its layout is known. A Python
//! process's layout goes to the kernel side (stack walks), its code objects
//! to the resolver, and its binary gets the finalization uprobe (the start
//! of its exit).

use std::time::Duration;

use super::allocations::HookedPython;
use super::session::Session;
use crate::{
    aggregate::PythonStatus,
    process::{maps, proc, PythonState},
    python::{self, Probe},
};

/// How long after a process appears (or execs) it is probed for CPython on
/// every drain rather than every tick: an interpreter initialises within
/// milliseconds and a short script may be done growing soon after. A process
/// with no CPython runtime by then counts as not Python (the dynamic loader
/// may not have mapped libpython at the first probes).
const EAGER_PROBE_WINDOW: Duration = Duration::from_secs(1);

impl Session {
    /// Probes processes that appeared or exec'd within the eager window.
    pub(super) fn probe_new_processes(&mut self) {
        for (tgid, pending_for) in self.tree.pending_python() {
            if pending_for < EAGER_PROBE_WINDOW {
                self.probe_python(tgid);
            }
        }
    }

    /// Probes, once a tick, processes still pending after the eager window.
    pub(super) fn probe_pending_processes(&mut self) {
        for (tgid, pending_for) in self.tree.pending_python() {
            if pending_for >= EAGER_PROBE_WINDOW {
                self.probe_python(tgid);
            }
        }
    }

    /// Probes `tgid` for CPython once and records what was found; not while
    /// an exec of it is still queued in the ring buffer (what `/proc` shows
    /// is then the next image, not the one the tree holds).
    pub(super) fn probe_python(&mut self, tgid: u32) {
        if self.exec_queued(tgid) {
            return;
        }
        match python::probe(tgid) {
            Ok(Probe::Python(process)) => {
                if let Err(err) = self.tracer.set_python(tgid, process.info) {
                    let reason = err.to_string();
                    self.set_python_status(tgid, PythonStatus::Unsupported { reason });
                    return;
                }
                self.watch_finalization(tgid, &process.binary, process.version);
                if let Some(super::sampler::Sampler::Remote(remote)) = &mut self.alloc_sampler {
                    remote.python_found(tgid, &process);
                }
                let hooked = HookedPython {
                    binary: process.binary.clone(),
                    free_threaded: process.free_threaded,
                };
                self.hook_allocator(tgid, Some(hooked));
                self.stacks.resolver.register(tgid, &process);
                if let Some(id) = self.tree.id_of(tgid) {
                    self.census.python(tgid, id, &process);
                }
                self.tree.set_py_info(tgid, process.info);
                let version = process.version.to_string();
                self.set_python_status(tgid, PythonStatus::Python { version });
            }
            Ok(Probe::NotPython) => {
                if self.tree.note_no_runtime(tgid) >= EAGER_PROBE_WINDOW {
                    self.set_python_status(tgid, PythonStatus::NotPython);
                    self.hook_allocator(tgid, None);
                }
            }
            Ok(Probe::NotReady) => {}
            Err(err) => {
                if proc::check_exists(tgid).is_ok() {
                    let reason = format!("{err:#}");
                    self.set_python_status(tgid, PythonStatus::Unsupported { reason });
                    self.hook_allocator(tgid, None);
                }
            }
        }
    }

    /// Whether the kernel saw `tgid` exec more often than the tree has
    /// handled exec records of it.
    fn exec_queued(&self, tgid: u32) -> bool {
        let handled = self.tree.get(tgid).map(|p| p.exec_count);
        let kernel = self.tracer.counters_of(tgid).map(|c| c.exec_count);
        matches!((kernel, handled), (Some(kernel), Some(handled)) if kernel != handled)
    }

    /// Attaches the finalization uprobes to `binary` for CPython `version`
    /// as `tgid` mapped it (once per file), reached through
    /// [`maps::reachable_path`] (an interpreter in another mount namespace,
    /// or deleted and replaced on disk, is read and probed as the very file
    /// mapped); a missing symbol or a failure costs only the precision of
    /// the end of those processes' lives, said once on stderr and in the
    /// report's warnings.
    fn watch_finalization(
        &mut self,
        tgid: u32,
        binary: &std::path::Path,
        version: python::PythonVersion,
    ) {
        let reachable = maps::reachable_path(tgid, binary).unwrap_or_else(|| binary.to_owned());
        let caveat = match self
            .tracer
            .attach_python_finalize(&reachable, (version.major, version.minor))
        {
            Ok(point) => point.caveat(binary),
            Err(err) => Some(format!(
                "{:#}; the end of the processes of `{}` is taken at exit_group, after the \
                 interpreter freed its objects",
                anyhow::Error::from(err),
                binary.display()
            )),
        };
        if let Some(caveat) = caveat {
            if !self.exit_point_caveats.contains(&caveat) {
                eprintln!("memtrace: warning: {caveat}");
                self.exit_point_caveats.push(caveat);
            }
        }
    }

    /// Records a process's Python status in the tree and the report.
    pub(super) fn set_python_status(&mut self, tgid: u32, status: PythonStatus) {
        if let Some(id) = self.tree.id_of(tgid) {
            self.recorder.python_status(id, status.clone());
        }
        self.tree.set_python(tgid, PythonState::Known(status));
    }
}
