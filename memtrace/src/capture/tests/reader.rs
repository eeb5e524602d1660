//! Reading files that are not captures, come from another version, or are
//! damaged: clear errors for the header, warnings for the rest.

use super::*;

#[test]
fn a_file_that_is_not_a_capture_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [
        ("text", &b"hello world\n"[..]),
        ("no-newline", b"hello"),
        ("binary", b"\x7fELF\x02\x01\x01\0\0\0"),
        ("report.json", b"{\n  \"meta\": {}\n}\n"),
        ("other.jsonl", b"{\"event\":1}\n{\"event\":2}\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let err = read(&path).unwrap_err();
        assert!(
            matches!(err, CaptureError::NotACapture { .. }),
            "{name}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(name), "{message}");
        assert!(message.contains("not a memtrace capture"), "{message}");
    }
    let missing = dir.path().join("missing.capture");
    let err = read(&missing).unwrap_err();
    assert!(matches!(err, CaptureError::Io { .. }), "{err:?}");
}

#[test]
fn an_empty_file_or_a_cut_header_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.capture");
    std::fs::write(&empty, b"").unwrap();
    let err = read(&empty).unwrap_err();
    assert!(matches!(err, CaptureError::Empty { .. }), "{err:?}");
    assert!(err.to_string().contains("empty capture file"), "{err}");

    let whole = dir.path().join("whole.capture");
    write_synthetic(&whole);
    let text = std::fs::read(&whole).unwrap();
    let header_len = text.iter().position(|&b| b == b'\n').unwrap();
    for cut_at in [3, 25, header_len - 1] {
        let cut = dir.path().join(format!("cut-{cut_at}.capture"));
        std::fs::write(&cut, &text[..cut_at]).unwrap();
        let err = read(&cut).unwrap_err();
        assert!(
            matches!(err, CaptureError::HeaderCut { bytes, .. } if bytes == cut_at),
            "{cut_at}: {err:?}"
        );
        assert!(err.to_string().contains("is cut off"), "{err}");
    }
}

#[test]
fn a_capture_of_another_version_says_which() {
    let dir = tempfile::tempdir().unwrap();
    // Version 1 (tgids, no start times) and a future version.
    let v1 = "{\"memtrace_capture\":1,\"created_unix_s\":1,\"command\":\"app\",\"start_ns\":0,\
              \"sample_interval_bytes\":524288}\n\
              {\"process\":{\"tgid\":100,\"parent\":null,\"role\":\"root\",\"cmdline\":\"app\",\"ts_ns\":0}}\n";
    let v3 = "{\"memtrace_capture\":3,\"created_unix_s\":1,\"whatever\":true}\n{\"new_kind\":{}}\n";
    for (found, content) in [(1, v1), (3, v3)] {
        let path = dir.path().join(format!("v{found}.capture"));
        std::fs::write(&path, content).unwrap();
        let err = read(&path).unwrap_err();
        assert!(
            matches!(err, CaptureError::UnknownVersion { found: f, supported: 2, .. } if f == found),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!("is a version {found} capture")),
            "{message}"
        );
        assert!(message.contains("reads version 2"), "{message}");
        assert!(message.contains(&format!("v{found}.capture")), "{message}");
    }
}

/// Byte offsets where each line of `text` starts, and the end.
fn line_starts(text: &[u8]) -> Vec<usize> {
    std::iter::once(0)
        .chain(
            text.iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect()
}

#[test]
fn a_truncated_last_line_is_dropped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let whole = std::fs::read(&path).unwrap();
    let complete = read(&path).unwrap();
    // Cut in the middle of the line before the `end` line.
    let starts = line_starts(&whole);
    let last_kept = starts[starts.len() - 3];
    let cut = last_kept + (starts[starts.len() - 2] - last_kept) / 2;
    std::fs::write(&path, &whole[..cut]).unwrap();
    let capture = read(&path).unwrap();
    let lines_in_file = starts.len() - 1; // header included
    assert_eq!(
        capture.lines[..],
        complete.lines[..complete.lines.len() - 2]
    );
    assert_eq!(
        capture.warnings[0],
        CaptureWarning::TruncatedLastLine {
            line: (lines_in_file - 1) as u64,
            bytes: cut - last_kept,
        }
    );
    assert!(matches!(capture.warnings[1], CaptureWarning::NoEnd { .. }));
    assert!(capture.warnings[0].to_string().contains("cut off"));
    // It still replays, up to its latest time.
    let report = replay(&capture);
    assert_eq!(report.meta.command, "python3 server.py");
    assert!(
        report.meta.duration_ns > 140 * S,
        "{}",
        report.meta.duration_ns
    );
    assert_eq!(report.process(LEAKER).unwrap().tgid, 101);
}

#[test]
fn corrupt_lines_inside_the_file_are_skipped_with_a_counted_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let live = write_synthetic(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    // The paths line of second 100 (the leak's 1 MiB of that second) and a
    // counters line later are damaged.
    let second_100 = format!("{{\"paths\":{{\"ts_ns\":{}", START_NS + 100 * S + 10);
    let damaged = lines
        .iter()
        .position(|l| l.starts_with(&second_100))
        .unwrap();
    lines[damaged] = "{\"paths\":{\"ts_ns\":1".to_owned();
    let counters_line = damaged
        + 1
        + lines[damaged + 1..]
            .iter()
            .position(|l| l.starts_with("{\"counters\":{\"process\":1,"))
            .unwrap();
    lines[counters_line] = "\u{0}\u{0}\u{0}".to_owned();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let capture = read(&path).unwrap();
    let [CaptureWarning::CorruptLines {
        lines: 2,
        first_line,
        reason,
    }] = &capture.warnings[..]
    else {
        panic!("{:?}", capture.warnings);
    };
    assert_eq!(*first_line, damaged as u64 + 1);
    assert!(!reason.is_empty());
    let message = capture.warnings[0].to_string();
    assert!(
        message.contains(&format!(
            "2 corrupt lines of the capture skipped (the first, line {first_line}"
        )),
        "{message}"
    );
    // The rest of the run is still there: only that second's leak is missing.
    let report = replay(&capture);
    let leak = path_of(&report, LEAKER, &leak_stack());
    assert_eq!(leak.bytes.growth_bytes, 149 * MIB);
    assert_eq!(report.processes.len(), live.processes.len());
    assert_eq!(report.process(MASTER), live.process(MASTER));

    // A header with the capture marker that does not parse is an error.
    let bad_header = dir.path().join("bad-header.capture");
    let body = text.split_once('\n').unwrap().1;
    std::fs::write(
        &bad_header,
        format!("{{\"memtrace_capture\":2,\"created_unix_s\":\"yesterday\"}}\n{body}"),
    )
    .unwrap();
    let err = read(&bad_header).unwrap_err();
    assert!(
        matches!(err, CaptureError::Corrupt { line: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("corrupt at line 1"), "{err}");
}

/// Allocator mode's report after `kept_mib` MiB kept by one process.
fn allocations(kept_mib: u64) -> crate::allocations::AllocationsReport {
    use crate::allocations::{AllocationTracker, KernelAllocStats, SampledBlock};
    let mut tracker = AllocationTracker::new(512 * 1024);
    tracker.process_started(101, 7, 0);
    tracker.hooked(101, vec!["libc.so.6".into()], 0, true);
    let block = SampledBlock {
        addr: 0x1000,
        size_bytes: kept_mib * MIB,
        ..SampledBlock::default()
    };
    tracker.alloc(101, block, vec!["keep (app.py:3)".to_owned()]);
    tracker.report(KernelAllocStats::default())
}

#[test]
fn the_latest_whole_allocations_line_survives_a_cut_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let file = std::fs::File::create(&path).unwrap();
    let mut feed = recorder(&path, io::BufWriter::new(file));
    let end_ns = synthetic_run(&mut feed);
    let (first, second) = (allocations(8), allocations(16));
    feed.allocations(&first);
    feed.flush();
    feed.allocations(&second);
    finish(feed, end_ns);
    let complete = read(&path).unwrap();
    assert_eq!(complete.allocations(), Some(&second));
    // Cut in the middle of the second allocations line (before `end`).
    let whole = std::fs::read(&path).unwrap();
    let second_at = line_starts(&whole)
        .into_iter()
        .rfind(|&at| whole[at..].starts_with(b"{\"allocations\""))
        .unwrap();
    std::fs::write(&path, &whole[..second_at + 40]).unwrap();
    let capture = read(&path).unwrap();
    assert_eq!(capture.allocations(), Some(&first));
    assert!(matches!(
        capture.warnings[0],
        CaptureWarning::TruncatedLastLine { .. }
    ));
    // A capture without allocator mode has none.
    write_synthetic(&path);
    assert_eq!(read(&path).unwrap().allocations(), None);
}

#[test]
fn the_census_line_reads_back_and_a_capture_without_one_has_none() {
    use crate::census::{CensusReport, ImageCensus};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    let file = std::fs::File::create(&path).unwrap();
    let mut feed = recorder(&path, io::BufWriter::new(file));
    let end_ns = synthetic_run(&mut feed);
    let mut image = ImageCensus::new(ProcessId(0), 101);
    image.taken = 3;
    image.read_bytes = 4 * MIB;
    let census = CensusReport {
        images: vec![image],
    };
    feed.census(&census);
    finish(feed, end_ns);
    assert_eq!(read(&path).unwrap().census(), census);
    write_synthetic(&path);
    assert_eq!(read(&path).unwrap().census(), CensusReport::default());
}
