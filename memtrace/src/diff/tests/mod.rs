//! Tests of `memtrace diff` on synthetic reports: this module holds the
//! report fixtures and the tests of matching two captures; `windows` the
//! tests of two windows of one (synthetic) capture; `render` those of the
//! table and the flame graph.

mod render;
mod windows;

use super::*;
use crate::aggregate::test_support::{leak_stack, meta, native, parse_stack, py, rss, start, MIB};
use crate::aggregate::{
    Aggregator, ExitBegin, ExitStatus, Frame, ProcessId, ProcessStart, Report, Role, SampledBytes,
};

const APP: &str = "python3 app.py";

/// `grown_mib` grown and `held_mib` held at the end by `stack` in `id`.
fn grow(agg: &mut Aggregator, id: ProcessId, stack: &[Frame], grown_mib: u64, held_mib: u64) {
    let stack = agg.intern(stack.to_vec());
    let bytes = SampledBytes {
        growth_bytes: grown_mib * MIB,
        held_bytes: i64::try_from(held_mib * MIB).unwrap(),
        samples: 1,
        ..SampledBytes::default()
    };
    agg.path_delta(id, 50, stack, bytes);
}

/// A run of `processes` — (tgid, role, command line, RSS at the end in
/// MiB), workers forked from the first — with `paths`: (index of the
/// process, stack, MiB grown, MiB held at the end).
fn report_of(
    processes: &[(u32, Role, &str, u64)],
    paths: &[(usize, Vec<Frame>, u64, u64)],
) -> Report {
    let mut agg = Aggregator::new(0);
    let mut ids: Vec<ProcessId> = Vec::new();
    for &(tgid, role, cmdline, _) in processes {
        let parent = ids.first().copied();
        ids.push(agg.process_started(ProcessStart {
            cmdline: cmdline.to_owned(),
            ..start(tgid, parent, role, 10)
        }));
    }
    for (id, &(.., rss_mib)) in ids.iter().zip(processes) {
        agg.counters(*id, 100, &rss(rss_mib * MIB, 0), None);
    }
    for (index, stack, grown, held) in paths {
        grow(&mut agg, ids[*index], stack, *grown, *held);
    }
    agg.finish(1_000, meta())
}

/// A run of `python3 app.py`: master `master` (flat 20 MiB) and worker
/// `worker` ending at `worker_rss` MiB; `paths` are (in the worker?, stack,
/// MiB grown, MiB held at the end).
fn run(
    master: u32,
    worker: u32,
    worker_rss: u64,
    paths: &[(bool, Vec<Frame>, u64, u64)],
) -> Report {
    let paths: Vec<_> = paths
        .iter()
        .map(|(in_worker, stack, grown, held)| {
            (usize::from(*in_worker), stack.clone(), *grown, *held)
        })
        .collect();
    report_of(
        &[
            (master, Role::Root, APP, 20),
            (worker, Role::Worker, APP, worker_rss),
        ],
        &paths,
    )
}

fn render_stack() -> Vec<Frame> {
    vec![
        py("<module>", "app.py", 1),
        py("render", "app/html.py", 3),
        native("malloc"),
    ]
}

/// Before: the leak grew and holds 10 MiB (worker), parse grew 8 MiB and
/// holds none (master + worker). After, with other tgids and other stack
/// ids: the leak holds 30 MiB; parse churns (grew 40 MiB, holds 2 MiB); a
/// new `render` path holds 5 MiB.
fn before_after() -> (Report, Report) {
    let before = run(
        100,
        101,
        40,
        &[
            (true, leak_stack(), 10, 10),
            (false, parse_stack("app/io.py"), 4, 0),
            (true, parse_stack("app/io.py"), 4, 0),
        ],
    );
    let after = run(
        200,
        201,
        70,
        &[
            (true, render_stack(), 5, 5),
            (true, parse_stack("app/io.py"), 40, 2),
            (true, leak_stack(), 30, 30),
        ],
    );
    (before, after)
}

fn bytes(held_mib: u64, grown_mib: u64) -> PathBytes {
    PathBytes {
        held_bytes: held_mib * MIB,
        grown_bytes: grown_mib * MIB,
    }
}

#[test]
fn paths_match_by_frames_and_rank_by_what_they_hold_not_what_they_churn() {
    let (before, after) = before_after();
    let d = diff(&before, &after);
    let got: Vec<(&[Frame], PathBytes, PathBytes)> = d
        .paths
        .iter()
        .map(|p| (p.frames.as_slice(), p.before, p.after))
        .collect();
    let (leak, render, parse) = (leak_stack(), render_stack(), parse_stack("app/io.py"));
    // parse grew the most (+32 MiB) but holds only 2 MiB more: last.
    assert_eq!(
        got,
        vec![
            (leak.as_slice(), bytes(10, 10), bytes(30, 30)),
            (render.as_slice(), bytes(0, 0), bytes(5, 5)),
            (parse.as_slice(), bytes(0, 8), bytes(2, 40)),
        ]
    );
    let mib = |n: i64| n * 1024 * 1024;
    assert_eq!(
        (
            d.paths[2].held_delta_bytes(),
            d.paths[2].grown_delta_bytes()
        ),
        (mib(2), mib(32))
    );
}

/// (before name, after name) of every row.
fn names(d: &Diff) -> Vec<(Option<&str>, Option<&str>)> {
    d.processes
        .iter()
        .map(|p| {
            (
                p.before.as_ref().map(|s| s.name.as_str()),
                p.after.as_ref().map(|s| s.name.as_str()),
            )
        })
        .collect()
}

#[test]
fn processes_match_by_command_role_and_start_never_by_tgid() {
    let (before, after) = before_after();
    let d = diff(&before, &after);
    // Different tgids: root with root, worker with worker.
    assert_eq!(
        names(&d),
        [
            (Some("tgid 101"), Some("tgid 201")),
            (Some("tgid 100"), Some("tgid 200"))
        ]
    );
    assert_eq!(d.processes[0].rss_delta_bytes(), Some(30 * 1024 * 1024));
    assert_eq!(d.processes[1].rss_delta_bytes(), Some(0));
    assert_eq!(
        (d.live_rss_end_before_bytes, d.live_rss_end_after_bytes),
        (60 * MIB, 90 * MIB)
    );

    // The kernel gave the worker the master's old tgid and the reverse:
    // still root with root. A process found once stands alone.
    let after = report_of(
        &[
            (101, Role::Root, APP, 20),
            (100, Role::Worker, APP, 50),
            (300, Role::Worker, "redis-server", 10),
        ],
        &[],
    );
    let d = diff(&before, &after);
    assert_eq!(
        names(&d),
        [
            (Some("tgid 101"), Some("tgid 100")),
            (Some("tgid 100"), Some("tgid 101")),
            (None, Some("tgid 300"))
        ]
    );
    assert_eq!(d.processes[0].rss_delta_bytes(), Some(10 * 1024 * 1024));
    assert_eq!(d.processes[2].label, "redis-server");
    assert_eq!(d.processes[2].rss_delta_bytes(), None);
}

#[test]
fn runs_with_other_arguments_pair_by_program_after_exact_command_lines() {
    let worker = |args: &str| format!("python3 /srv/app.py {args}");
    let (a, b, c) = (worker("--job a"), worker("--job b"), worker("--job c"));
    let before = report_of(
        &[
            (100, Role::Root, "python3 /srv/app.py --mib 16", 20),
            (101, Role::Worker, &a, 30),
            (102, Role::Worker, &b, 30),
        ],
        &[],
    );
    // Started in another order: `b` first.
    let after = report_of(
        &[
            (200, Role::Root, "python3 ./app.py --mib 128", 20),
            (201, Role::Worker, &b, 40),
            (202, Role::Worker, &c, 50),
            (203, Role::Worker, "python3 /srv/other.py", 10),
        ],
        &[],
    );
    let d = diff(&before, &after);
    // `b` with `b` first; then `a` with `c`, the root with the root (same
    // program, other arguments); other.py stands alone.
    assert_eq!(
        names(&d),
        [
            (Some("tgid 101"), Some("tgid 202")),
            (Some("tgid 102"), Some("tgid 201")),
            (Some("tgid 100"), Some("tgid 200")),
            (None, Some("tgid 203")),
        ]
    );
}

/// A master (`master`) and two workers (`workers`) forked one after the
/// other, the first exiting before the second starts (equal tgids: the
/// kernel reused the first's), each keeping 10 MiB of the leak and ending
/// at `rss_mib`.
fn recycled(master: u32, workers: [u32; 2], rss_mib: [u64; 2]) -> Report {
    let mut agg = Aggregator::new(0);
    let root = agg.process_started(ProcessStart {
        cmdline: APP.to_owned(),
        ..start(master, None, Role::Root, 0)
    });
    agg.counters(root, 10, &rss(20 * MIB, 0), None);
    for (index, (tgid, rss_mib)) in workers.into_iter().zip(rss_mib).enumerate() {
        let t = 100 * (index as u64 + 1);
        let id = agg.process_started(ProcessStart {
            cmdline: APP.to_owned(),
            start_time_ns: t * 1_000_000,
            ..start(tgid, Some(root), Role::Worker, t)
        });
        grow(&mut agg, id, &leak_stack(), 10, 10);
        agg.counters(id, t + 10, &rss(rss_mib * MIB, 0), None);
        if index == 0 {
            agg.exit_began(
                id,
                t + 20,
                ExitBegin::PythonFinalize,
                &rss(rss_mib * MIB, 0),
            );
            agg.process_exited(id, t + 30, Some(ExitStatus::Code { code: 0 }), None);
        }
    }
    agg.finish(1_000, meta())
}

#[test]
fn two_processes_on_one_tgid_match_two_processes_in_order_of_start() {
    let before = recycled(100, [101, 101], [30, 50]);
    let after = recycled(200, [201, 202], [35, 45]);
    let d = diff(&before, &after);
    assert_eq!(
        names(&d),
        [
            (Some("tgid 101"), Some("tgid 201")),
            (Some("tgid 100"), Some("tgid 200")),
            (Some("tgid 101#2"), Some("tgid 202")),
        ]
    );
    let deltas: Vec<Option<i64>> = d
        .processes
        .iter()
        .map(ProcessDiff::rss_delta_bytes)
        .collect();
    let mib = |n: i64| Some(n * 1024 * 1024);
    assert_eq!(deltas, [mib(5), mib(0), mib(-5)]);
    // Both workers' leaks, summed on each side.
    assert_eq!(d.paths[0].before, bytes(20, 20));
    assert_eq!(d.paths[0].after, bytes(20, 20));
}
