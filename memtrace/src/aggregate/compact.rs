//! The aggregation step for a trace that never ends (`memtrace agent`): the
//! report of the run so far without finishing it, and compaction of the
//! images that ended, so that the aggregator's memory follows the processes
//! alive now, not every process that came and went.

use std::collections::HashSet;

use super::{Aggregator, ProcessId, Report, RunMeta, StackId};

impl Aggregator {
    /// The report of the run so far, as if it ended at `now_ns`
    /// (CLOCK_MONOTONIC ns): the same [`Report`] `finish` builds, from the
    /// images not compacted away; tracing goes on.
    pub fn report_now(&self, now_ns: u64, meta: RunMeta) -> Report {
        self.build_report(now_ns, meta)
    }

    /// Keeps no path timelines from now on (see [`Report::paths`]'
    /// `timeline`, empty afterwards): `memtrace agent` reads only each
    /// path's totals, and the timelines are most of the aggregator's memory
    /// when many processes each have many paths.
    pub fn drop_path_timelines(&mut self) {
        self.paths.without_timelines();
    }

    /// Forgets every image that ended (it exec'd or began to exit) with its
    /// paths and held-map state; returns their ids. Later calls about them
    /// are ignored, as for any ended image. A report built afterwards no
    /// longer shows them: call this after the window that last showed
    /// them. Their stacks stay interned until [`Aggregator::compact_stacks`].
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

    /// Drops the interned stacks that no path refers to any more, nor
    /// `also` (the ids the caller still holds: the held-page map's); their
    /// ids are handed out again. Returns how many were dropped. Afterwards
    /// the stack table holds the distinct stacks of the paths left (those
    /// of the images not compacted away), so it no longer grows with the
    /// images that came and went.
    pub fn compact_stacks(&mut self, also: impl IntoIterator<Item = StackId>) -> usize {
        let mut in_use: HashSet<StackId> = also.into_iter().collect();
        self.paths.stacks_in_use(&mut in_use);
        self.stacks.retain(&in_use)
    }
}

#[cfg(test)]
mod tests {
    use memtrace_common::MemoryEvent;

    use crate::aggregate::test_support::{meta, native, prefork_aggregator, rss, sample, start};
    use crate::aggregate::{ProcessId, Role};

    #[test]
    fn a_report_now_leaves_the_run_going_and_equals_the_finished_one() {
        let agg = prefork_aggregator();
        let now = agg.report_now(5_000, meta());
        assert_eq!(now, agg.finish(5_000, meta()));
    }

    #[test]
    fn ended_images_are_forgotten_with_their_paths_and_ids_are_not_reused() {
        let mut agg = prefork_aggregator();
        let before = agg.report_now(5_000, meta());
        let worker = ProcessId(1);
        agg.process_exited(worker, 2_000, None, Some(&rss(1 << 20, 0)));
        assert_eq!(agg.compact_ended(), vec![worker]);
        let after = agg.report_now(5_000, meta());
        assert_eq!(after.processes.len(), before.processes.len() - 1);
        assert!(after.processes.iter().all(|p| p.id != worker));
        assert!(after.paths.iter().all(|p| p.process != worker));
        assert!(agg.compact_ended().is_empty(), "nothing else ended");
        let next = agg.process_started(start(101, Some(ProcessId(0)), Role::Worker, 3_000));
        assert_eq!(
            next,
            ProcessId(4),
            "a new image gets a new id, not the forgotten one's"
        );
    }

    #[test]
    fn stacks_of_forgotten_images_are_dropped_and_those_in_use_kept() {
        let mut agg = prefork_aggregator();
        let worker = ProcessId(2);
        let only_worker = sample(
            &mut agg,
            worker,
            MemoryEvent::AnonGrowth,
            4096,
            &[native("only_worker")],
        );
        let held_elsewhere = agg.intern(vec![native("held")]);
        let before = agg.report_now(5_000, meta());
        let kept: Vec<_> = before
            .paths
            .iter()
            .filter(|p| p.process != worker)
            .map(|p| (p.process, before.frames(p.stack).to_vec()))
            .collect();
        agg.process_exited(worker, 2_000, None, Some(&rss(1 << 20, 0)));
        agg.compact_ended();
        assert!(agg.compact_stacks([held_elsewhere]) >= 1);
        assert!(
            agg.stack_frames(only_worker).is_empty(),
            "its stack is dropped"
        );
        assert_eq!(
            agg.stack_frames(held_elsewhere),
            &[native("held")],
            "a stack the caller holds stays"
        );
        let after = agg.report_now(5_000, meta());
        let left: Vec<_> = after
            .paths
            .iter()
            .map(|p| (p.process, after.frames(p.stack).to_vec()))
            .collect();
        assert_eq!(left, kept, "the other paths keep their stacks");
        let again = agg.intern(vec![native("new")]);
        assert!(
            usize::try_from(again.0).unwrap() < before.stacks.len(),
            "a dropped id is handed out again: {again:?}"
        );
    }

    #[test]
    fn without_path_timelines_paths_keep_their_totals_only() {
        let mut agg = prefork_aggregator();
        agg.drop_path_timelines();
        let stack = sample(&mut agg, ProcessId(2), MemoryEvent::AnonGrowth, 4096, &[]);
        let report = agg.report_now(5_000, meta());
        assert!(report.paths.iter().all(|p| p.timeline.is_empty()));
        let path = report
            .paths
            .iter()
            .find(|p| p.process == ProcessId(2) && p.stack == stack)
            .expect("the path");
        assert_eq!(path.bytes.growth_bytes, 4096);
    }
}
