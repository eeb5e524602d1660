//! The aggregation step for a trace that never ends (`memtrace agent`): the
//! report of the run so far without finishing it, and compaction of the
//! images that ended, so that the aggregator's memory follows the processes
//! alive now, not every process that came and went.

use super::{Aggregator, ProcessId, Report, RunMeta};

impl Aggregator {
    /// The report of the run so far, as if it ended at `now_ns`
    /// (CLOCK_MONOTONIC ns): the same [`Report`] `finish` builds, from the
    /// images not compacted away; tracing goes on.
    pub fn report_now(&self, now_ns: u64, meta: RunMeta) -> Report {
        self.build_report(now_ns, meta)
    }

    /// Forgets every image that ended (it exec'd or began to exit) with its
    /// paths and held-map state; returns their ids. Later calls about them
    /// are ignored, as for any ended image. A report built afterwards no
    /// longer shows them: call this after the window that last showed
    /// them. Stacks stay interned (they are shared by the images alive).
    pub fn compact_ended(&mut self) -> Vec<ProcessId> {
        let ended: Vec<ProcessId> = self
            .processes
            .iter()
            .filter(|(_, state)| !state.is_open())
            .map(|(&id, _)| id)
            .collect();
        for id in &ended {
            self.processes.remove(id);
            self.held.remove(id);
        }
        self.paths.forget(&ended);
        ended
    }
}
