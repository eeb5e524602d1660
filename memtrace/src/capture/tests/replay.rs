//! Replays of the synthetic run: whole (equal to the live report, with
//! reused tgids, execs, exits, held bytes and peaks) and windows of it.

use super::*;

#[test]
fn replay_of_a_capture_equals_the_live_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let capture = read(&path).unwrap();
    assert!(capture.warnings.is_empty(), "{:?}", capture.warnings);
    assert_eq!(capture.header, header());
    assert_eq!(capture.covered_ns(), 150 * S + 42);
    let replayed = replay(&capture);
    // The run is long enough for the path buckets to have widened.
    assert_eq!(live.path_bucket_ns, 2 * S);
    assert!(live.paths.iter().any(|p| p.timeline.len() > 50));
    assert_eq!(replayed, live);
    // And so is everything the diagnosis and the renderers read.
    let json = |report: Report| serde_json::to_string(&report).unwrap();
    assert_eq!(json(replayed), json(live));
}

#[test]
fn a_reused_tgid_and_an_exec_replay_as_their_own_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let replayed = replay(&read(&path).unwrap());
    assert_eq!(replayed, live);
    let first = replayed.process(FIRST_102).unwrap();
    let second = replayed.process(SECOND_102).unwrap();
    let shell = replayed.process(SHELL).unwrap();
    assert_eq!((first.tgid, second.tgid, shell.tgid), (102, 102, 102));
    assert_eq!((first.instance, second.instance, shell.instance), (1, 2, 2));
    assert_eq!(second.start_time_ns, SECOND_102_START_TIME_NS);
    assert_eq!(first.name(), "tgid 102");
    assert_eq!(second.name(), "tgid 102#2, image 0");
    assert_eq!(shell.name(), "tgid 102#2, image 1");
    assert_eq!(first.exit_status, Some(ExitStatus::Code { code: 0 }));
    assert_eq!(first.exit_began_by, Some(ExitBegin::PythonFinalize));
    // Its end is when its exit began: 30 MiB, not the 2 MiB left after
    // the interpreter's finalization.
    assert_eq!(first.rss.unwrap().end_bytes, 31 * MIB);
    // The image before the exec keeps its Python phase.
    assert_eq!(second.next_image, Some(SHELL));
    assert_eq!(shell.previous_image, Some(SECOND_102));
    assert_eq!(second.python, Some(python()));
    assert_eq!(second.exec_ns, Some(40 * S + 200));
    let phase = [py("load", "app/tool.py", 5), native("malloc")];
    assert_eq!(
        path_of(&replayed, SECOND_102, &phase).bytes.growth_bytes,
        6 * MIB
    );
    assert_eq!(second.rss.unwrap().end_bytes, 17 * MIB);
    // The shell starts from nothing, maps a file, and is killed.
    assert_eq!(shell.cmdline, "/bin/sh -c true");
    assert_eq!(shell.python, Some(PythonStatus::NotPython));
    assert_eq!(shell.rss.unwrap().start_bytes, 0);
    assert_eq!(shell.sampled.file_growth_bytes, MIB);
    assert_eq!(shell.exit_began_by, Some(ExitBegin::Exit));
    assert_eq!(shell.exit_status.unwrap().to_string(), "SIGKILL");
}

#[test]
fn held_bytes_and_peaks_replay_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let capture = read(&path).unwrap();
    assert!(capture.lines.iter().any(|l| matches!(l, Line::Peaks(_))));
    let replayed = replay(&capture);
    assert_eq!(replayed, live);
    // The buffer was touched 50 times and released each time: grown 50
    // times, held at the end by none; at the high-water mark (its last
    // touch, 147 s) it held 2 MiB beside 148 s of the leak.
    let buffer = path_of(&replayed, LEAKER, &buffer_stack());
    assert_eq!(buffer.bytes.growth_bytes, 100 * MIB);
    assert_eq!(buffer.bytes.held_bytes, 0);
    assert_eq!(buffer.peak_held_bytes, 2 * MIB);
    let leak = path_of(&replayed, LEAKER, &leak_stack());
    assert_eq!(leak.bytes.held_bytes, 150 * MIB as i64);
    assert_eq!(leak.peak_held_bytes, 148 * MIB);
    // Growth without an address is held until the image ends, and said.
    let populate = path_of(&replayed, LEAKER, &populate_stack());
    assert_eq!(populate.bytes.held_now_bytes(), MIB / 2);
    assert!(replayed.warnings.iter().any(|w| matches!(
        w,
        crate::aggregate::Warning::UnplacedGrowth { process: LEAKER, bytes, .. } if *bytes == MIB / 2
    )));
    // Per-bucket held changes add up to the path's held bytes.
    let held_changes: i64 = buffer.timeline.iter().map(|p| p.held_bytes).sum();
    assert_eq!(held_changes, 0);
    let peak_total = replayed.process(LEAKER).unwrap().peak_held_bytes;
    assert_eq!(peak_total, 150 * MIB + MIB / 2);
}

#[test]
fn growth_just_before_an_exit_is_written_before_the_exit_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let capture = read(&path).unwrap();
    let last_words = parse_stack("app/shutdown.py");
    let stack_id = capture
        .lines
        .iter()
        .find_map(|line| match line {
            Line::Stacks(stacks) => stacks
                .iter()
                .find(|(_, f)| *f == last_words)
                .map(|(id, _)| *id),
            _ => None,
        })
        .expect("the stack is written");
    let position = |wanted: &dyn Fn(&Line) -> bool| capture.lines.iter().position(wanted).unwrap();
    let growth = position(
        &|l| matches!(l, Line::Paths(p) if p.deltas.iter().any(|d| d.0 == FIRST_102 && d.1 == stack_id && d.2.growth_bytes > 0)),
    );
    let exit_began = position(&|l| matches!(l, Line::ExitBegan(e) if e.process == FIRST_102));
    assert!(growth < exit_began, "{growth} >= {exit_began}");
    // No new high-water mark came with it (worker 102's was at 10 s), so
    // no `peaks` line wrote it out first: the exit line did. So the replay
    // counts it, as the live run did; the release during finalization
    // counts in neither.
    let scratch = path_of(&live, FIRST_102, &scratch_stack());
    assert_eq!(
        (scratch.peak_held_bytes, scratch.bytes.held_bytes),
        (8 * MIB, 0)
    );
    let replayed = replay(&capture);
    let grown = path_of(&replayed, FIRST_102, &last_words);
    assert_eq!(grown.bytes.growth_bytes, 4 * MIB);
    assert_eq!(grown.bytes.held_bytes, 4 * MIB as i64);
    assert_eq!(grown.bytes.unmapped_bytes, 0);
    assert_eq!(grown, path_of(&live, FIRST_102, &last_words));
}

#[test]
fn periodic_counter_reads_are_thinned_alike_for_the_report_and_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ticks.capture");
    let file = std::fs::File::create(&path).unwrap();
    let mut feed = recorder(&path, io::BufWriter::new(file));
    let id = feed.process_started(start(1, None, Role::Root, START_NS));
    feed.counters(id, START_NS, &counters(MIB), None);
    // Five seconds of 200 ms ticks, RSS up 5 MiB a second: one read a
    // second is kept (PSS/USS read only then).
    let tick_ns = S / 5;
    let mut sharing_reads = 0;
    for tick in 1..=25_u64 {
        feed.periodic_counters(id, START_NS + tick * tick_ns, &counters(tick * MIB), || {
            sharing_reads += 1;
            None
        });
    }
    assert_eq!(sharing_reads, 5);
    // A spike within a second: up 100 MiB and back, both steps kept.
    feed.periodic_counters(id, START_NS + 5 * S + 200, &counters(125 * MIB), || None);
    feed.periodic_counters(id, START_NS + 5 * S + 400, &counters(26 * MIB), || None);
    // The start of the exit is kept however close to the last read; the
    // exit record's counters (after the teardown) are not a reading.
    feed.exit_began(
        id,
        START_NS + 5 * S + 500,
        ExitBegin::ExitGroup,
        &counters(30 * MIB),
    );
    feed.process_exited(
        id,
        START_NS + 5 * S + 600,
        Some(ExitStatus::Code { code: 3 }),
        Some(&counters(0)),
    );
    let live = finish(feed, START_NS + 6 * S);
    let process = live.process(id).unwrap();
    let kept: Vec<u64> = process.timeline.iter().map(|p| p.t_ns).collect();
    let expected = [
        0,
        S,
        2 * S,
        3 * S,
        4 * S,
        5 * S,
        5 * S + 200,
        5 * S + 400,
        5 * S + 500,
    ];
    assert_eq!(kept, expected);
    let rss = process.rss.unwrap();
    assert_eq!((rss.peak_bytes, rss.end_bytes), (126 * MIB, 31 * MIB));
    assert_eq!(process.exit_status.unwrap().to_string(), "exit 3");
    let capture = read(&path).unwrap();
    let counter_lines = capture
        .lines
        .iter()
        .filter(|line| matches!(line, Line::Counters(_)))
        .count();
    // Every kept reading but the exit's, which its exit_began line carries.
    assert_eq!(counter_lines, kept.len() - 1);
    assert_eq!(replay(&capture), live);
}

/// (tgid, instance, image) of every row of `report`, sorted.
fn identities(report: &Report) -> Vec<(u32, u32, u32)> {
    let mut rows: Vec<_> = report
        .processes
        .iter()
        .map(|p| (p.tgid, p.instance, p.image))
        .collect();
    rows.sort_unstable();
    rows
}

#[test]
fn a_window_holds_the_processes_alive_in_it_and_only_its_counters_and_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let capture = read(&path).unwrap();
    let window = replay_window(&capture, Some(60 * S), Some(90 * S));
    assert_eq!(window.meta.duration_ns, 30 * S);
    // The first worker 102 exited before the window; the second process on
    // tgid 102 (both its images) was alive in it until killed at 70 s;
    // worker 103 started inside it. Instances count within the window: the
    // second process on tgid 102 is its first there (its start time says
    // which process it is).
    assert_eq!(
        identities(&window),
        [
            (100, 1, 0),
            (101, 1, 0),
            (102, 1, 0),
            (102, 1, 1),
            (103, 1, 0)
        ]
    );
    assert!(window
        .processes
        .iter()
        .filter(|p| p.tgid == 102)
        .all(|p| p.start_time_ns == SECOND_102_START_TIME_NS));
    let shell = window.processes.iter().find(|p| p.image == 1).unwrap();
    assert_eq!(shell.exited_ns, Some(70 * S + 5));
    assert_eq!(shell.exit_status.unwrap().to_string(), "SIGKILL");
    let leak = window
        .paths
        .iter()
        .find(|p| window.frames(p.stack) == leak_stack().as_slice())
        .unwrap();
    // One MiB a second, for the 30 s of the window, all still held.
    assert_eq!(leak.bytes.growth_bytes, 30 * MIB);
    assert_eq!(leak.bytes.held_bytes, 30 * MIB as i64);
    assert!(leak
        .timeline
        .iter()
        .all(|p| (60 * S..90 * S).contains(&p.t_ns)));
    // Bytes held at high-water marks belong to whole lives: left out.
    assert!(window.paths.iter().all(|p| p.peak_held_bytes == 0));
    assert_eq!(window.totals.peak_held_bytes, 0);
    // The worker's RSS in the window runs from its first reading in it (not
    // from what it inherited at fork) to its last.
    let worker = window.processes.iter().find(|p| p.tgid == 101).unwrap();
    let rss = worker.rss.unwrap();
    assert_eq!(rss.start_bytes, (20 + 60) * MIB + MIB);
    assert_eq!(rss.end_bytes, (20 + 89) * MIB + MIB);
    assert!(worker
        .timeline
        .iter()
        .all(|p| (60 * S..90 * S).contains(&p.t_ns)));
    // The early copy-on-write sample is outside the window.
    assert_eq!(window.totals.sampled.cow_bytes, 0);

    // An early window: the first worker 102 is in it, what started later
    // is not.
    let early = replay_window(&capture, Some(10 * S), Some(30 * S));
    assert_eq!(identities(&early), [(100, 1, 0), (101, 1, 0), (102, 1, 0)]);

    // A window up to the end has the whole capture's paths, peaks aside.
    let whole = replay(&capture);
    let tail = replay_window(&capture, None, Some(10_000 * S));
    // (Their order differs: paths rank by bytes held at the peak.)
    let without_peaks = |report: &Report| -> Vec<_> {
        let mut paths = report
            .paths
            .iter()
            .map(|p| {
                (
                    p.process,
                    report.frames(p.stack).to_vec(),
                    p.bytes,
                    p.timeline.clone(),
                )
            })
            .collect::<Vec<_>>();
        paths.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        paths
    };
    assert_eq!(without_peaks(&tail), without_peaks(&whole));
    assert!(whole.totals.peak_held_bytes > 0);
}
