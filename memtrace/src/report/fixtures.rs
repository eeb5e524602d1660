//! A synthetic run for the report step's tests with every way a process
//! image ends, a tgid the kernel reused and an execve, and paths whose three
//! measures (held at the high-water mark, held at the end, grown) all
//! differ, so a renderer that mixes them up or merges two processes fails.

use memtrace_common::{MemoryEvent, ProcessCounters};

use crate::aggregate::test_support::{native, prefork_report, py, rss, server_report, start, MIB};
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, ProcessId, ProcessStart, PythonStatus, Report, Role,
    RunMeta, SampledBytes, Sharing, StackId,
};
use crate::diagnose::{self, Diagnosed};

/// One second, in nanoseconds.
pub(crate) const S: u64 = 1_000_000_000;

/// The command line of the master and its workers.
const APP: &str = "python3 -m app";

/// `handle_job`: a 40 MiB buffer allocated three times, freed and touched
/// again in between.
pub(crate) fn job_stack() -> Vec<Frame> {
    vec![
        py("<module>", "app/worker.py", 1),
        py("handle_job", "app/jobs.py", 20),
        native("malloc"),
    ]
}

/// `append`: a cache that grows.
pub(crate) fn cache_stack() -> Vec<Frame> {
    vec![
        py("<module>", "app/worker.py", 1),
        py("append", "app/cache.py", 42),
        native("PyList_Append"),
    ]
}

/// `load`: what the ETL job reads before it execs `sleep`.
pub(crate) fn load_stack() -> Vec<Frame> {
    vec![
        py("<module>", "etl.py", 1),
        py("load", "etl.py", 12),
        native("malloc"),
    ]
}

/// Counters of `anon` MiB of anonymous and 4 MiB of file-backed RSS.
fn mib(anon: u64) -> ProcessCounters {
    rss(anon * MIB, 4 * MIB)
}

/// PSS and USS in MiB.
fn sharing(pss: u64, uss: u64) -> Option<Sharing> {
    Some(Sharing {
        pss_bytes: pss * MIB,
        uss_bytes: uss * MIB,
    })
}

/// A sample of `grown` MiB with a held change of `held` MiB on `stack` in
/// `id` at `t_ns` (only the held change when `grown` is 0: memory freed).
fn grow(agg: &mut Aggregator, id: ProcessId, t_ns: u64, stack: StackId, grown: u64, held: i64) {
    let held_bytes = held * i64::try_from(MIB).unwrap_or(i64::MAX);
    let bytes = if grown == 0 {
        SampledBytes::held_change(held_bytes)
    } else {
        SampledBytes {
            held_bytes,
            ..SampledBytes::from_event(MemoryEvent::AnonGrowth, grown * MIB)
        }
    };
    agg.path_delta(id, t_ns, stack, bytes);
}

/// A worker of the master forked at `t_ns` from its 30 MiB.
fn fork(agg: &mut Aggregator, tgid: u32, boot_ns: u64, cmdline: &str, t_ns: u64) -> ProcessId {
    agg.process_started(ProcessStart {
        start_time_ns: boot_ns,
        cmdline: cmdline.to_owned(),
        counters: mib(26),
        ..start(tgid, Some(ProcessId(0)), Role::Worker, t_ns)
    })
}

/// An 8 s run of `python3 -m app` (the run starts at 0 ns), ids in order of
/// appearance:
///
/// | id | process | life | RSS start → end (peak) | paths: peak / end / grown |
/// |---|---|---|---|---|
/// | 0 | tgid 200, master | 0 s - alive, USS 10 MiB | 30 → 30 (30) | - |
/// | 1 | tgid 201 | fork 1 s, began to exit 4 s (Python finalization), exit 0 at 4.5 s | 30 → 70 (80) | `handle_job` 50 / 40 / 120, `append` 10 / 0 / 10 |
/// | 2 | tgid 202, image 0 `python3 etl.py` | fork 2 s, exec'd at 6 s | 30 → 90 (90) | `load` 60 / 60 / 60 |
/// | 3 | tgid 201#2 (reused tgid) | fork 5 s, SIGKILL at 7 s | 30 → 60 (60) | `append` 30 / 30 / 30, and 4 MiB copy-on-write |
/// | 4 | tgid 202, image 1 `sleep 60` | exec 6 s - alive, not Python | 0 → 1 (1) | - |
///
/// (MiB.) Ranked by held at peak the paths are `load`, `handle_job`,
/// `append` (201#2), `append` (201); by held at end `append` (201) drops
/// out; by grown `handle_job` comes first.
pub(crate) fn lifecycle_report() -> Report {
    let mut agg = Aggregator::new(0);
    let master = agg.process_started(ProcessStart {
        cmdline: APP.to_owned(),
        counters: mib(26),
        ..start(200, None, Role::Root, 0)
    });
    let python = || PythonStatus::Python {
        version: "3.12.1".to_owned(),
    };
    agg.python_status(master, python());
    let (job, cache, load) = (
        agg.intern(job_stack()),
        agg.intern(cache_stack()),
        agg.intern(load_stack()),
    );

    let first = fork(&mut agg, 201, 101 * S, APP, S);
    agg.python_status(first, python());
    grow(&mut agg, first, S + S / 5, cache, 10, 10);
    grow(&mut agg, first, S + S / 2, job, 40, 40);
    agg.counters(first, 2 * S, &mib(56), sharing(40, 30));

    let etl = fork(&mut agg, 202, 102 * S, "python3 etl.py", 2 * S);
    agg.python_status(etl, python());
    agg.counters(master, 2 * S, &mib(26), sharing(20, 10));
    grow(&mut agg, first, 2 * S + S / 2, job, 40, 10);
    grow(&mut agg, etl, 3 * S, load, 60, 60);
    let mut at_peak = mib(76);
    at_peak.cow_fault_bytes = 8 * MIB;
    agg.counters(first, 3 * S, &at_peak, sharing(60, 50));
    agg.peak_held(first, job, 50 * MIB);
    agg.peak_held(first, cache, 10 * MIB);
    grow(&mut agg, first, 3 * S + S / 2, job, 40, -10);
    grow(&mut agg, first, 3 * S + S * 4 / 5, cache, 0, -10);
    agg.counters(etl, 4 * S, &mib(86), sharing(70, 60));
    agg.peak_held(etl, load, 60 * MIB);
    let mut exiting = mib(66);
    exiting.cow_fault_bytes = 8 * MIB;
    agg.exit_began(first, 4 * S, ExitBegin::PythonFinalize, &exiting);
    // Finalization frees the job's buffer: not the program's release.
    grow(&mut agg, first, 4 * S + S / 5, job, 0, -40);
    agg.process_exited(
        first,
        4 * S + S / 2,
        Some(ExitStatus::Code { code: 0 }),
        None,
    );
    agg.counters(master, 4 * S, &mib(26), sharing(20, 10));

    let second = fork(&mut agg, 201, 105 * S, APP, 5 * S);
    agg.python_status(second, python());
    agg.counters(second, 6 * S, &mib(41), sharing(35, 25));
    let sleep = agg.process_exec(etl, 6 * S, &mib(86), "sleep 60".to_owned());
    agg.python_status(sleep, PythonStatus::NotPython);
    agg.counters(master, 6 * S, &mib(26), sharing(20, 10));
    grow(&mut agg, second, 6 * S + S / 2, cache, 30, 30);
    let cow = SampledBytes::from_event(MemoryEvent::CowFault, 4 * MIB);
    agg.path_delta(second, 6 * S + S / 2, cache, cow);
    agg.counters(sleep, 6 * S + S / 2, &rss(MIB, 0), None);
    let mut killed = mib(56);
    killed.cow_fault_bytes = 4 * MIB;
    agg.counters(second, 6 * S + S * 9 / 10, &killed, sharing(50, 40));
    agg.peak_held(second, cache, 30 * MIB);
    agg.process_exited(
        second,
        7 * S,
        Some(ExitStatus::Signal {
            signal: 9,
            core_dumped: false,
            oom_killed: false,
        }),
        Some(&killed),
    );
    agg.counters(sleep, 8 * S, &rss(MIB, 0), None);
    agg.counters(master, 8 * S, &mib(26), sharing(20, 10));
    agg.finish(
        8 * S,
        RunMeta {
            command: APP.to_owned(),
            duration_ns: 8 * S,
            records: 120,
            dropped_records: 0,
            decode_errors: 0,
            sample_interval_bytes: 512 * 1024,
            held_map_peak_entries: 1_200,
            held_map_peak_bytes: 96 * 1024,
            attach_ns: 1_400_000_000,
            // 2026-01-02 03:04:05.600 UTC.
            attached_unix_ns: 1_767_323_045_600_000_000,
            command_held: false,
            command_status: None,
            origin: crate::aggregate::Origin {
                host: "build-7".to_owned(),
                date_utc: "2026-01-02T03:04:05Z".to_owned(),
                memtrace_version: "0.1.0".to_owned(),
            },
            exit_point_caveats: Vec::new(),
            cut_after_ns: None,
        },
    )
}

/// [`lifecycle_report`], diagnosed.
pub(crate) fn lifecycle_diagnosed() -> Diagnosed {
    diagnose::diagnose(lifecycle_report())
}

/// `aggregate::test_support::prefork_report`, diagnosed.
pub(crate) fn prefork_diagnosed() -> Diagnosed {
    diagnose::diagnose(prefork_report())
}

/// `aggregate::test_support::server_report`, diagnosed.
pub(crate) fn server_diagnosed() -> Diagnosed {
    diagnose::diagnose(server_report())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Weight;

    /// The fixture is what its documentation says (the renderers' tests
    /// rely on it).
    #[test]
    fn the_fixture_holds_what_it_says() {
        let report = lifecycle_report();
        let p = |id| report.process(ProcessId(id)).unwrap();
        let names: Vec<String> = (0..5).map(|id| p(id).name()).collect();
        assert_eq!(
            names,
            [
                "tgid 200",
                "tgid 201",
                "tgid 202, image 0",
                "tgid 201#2",
                "tgid 202, image 1"
            ]
        );
        let rss = |id| {
            let r = p(id).rss.unwrap();
            [r.start_bytes, r.end_bytes, r.peak_bytes].map(|b| b / MIB)
        };
        assert_eq!(rss(0), [30, 30, 30]);
        assert_eq!(rss(1), [30, 70, 80]);
        assert_eq!(rss(2), [30, 90, 90]);
        assert_eq!(rss(3), [30, 60, 60]);
        assert_eq!(rss(4), [0, 1, 1]);
        let measures = |id, stack: Vec<Frame>| {
            let path = report
                .paths
                .iter()
                .find(|path| path.process == ProcessId(id) && *report.frames(path.stack) == stack)
                .unwrap();
            [Weight::Peak, Weight::End, Weight::Grown].map(|w| path.weight_bytes(w) / MIB)
        };
        assert_eq!(measures(1, job_stack()), [50, 40, 120]);
        assert_eq!(measures(1, cache_stack()), [10, 0, 10]);
        assert_eq!(measures(2, load_stack()), [60, 60, 60]);
        assert_eq!(measures(3, cache_stack()), [30, 30, 30]);
        assert_eq!(report.paths.len(), 4);
    }
}
