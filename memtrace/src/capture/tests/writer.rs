//! What the writer puts in the file: one `paths` line per second, stacks
//! once before their use, and what is left after a full disk.

use super::*;

#[test]
fn paths_lines_hold_one_second_and_stacks_come_once_before_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    write_synthetic(&path);
    let capture = read(&path).unwrap();
    let mut defined = Vec::new();
    let mut seconds = std::collections::BTreeSet::new();
    let (mut paths_lines, mut image_ends) = (0, 0);
    for line in &capture.lines {
        match line {
            Line::Stacks(stacks) => defined.extend(stacks.iter().map(|(id, _)| id.0)),
            Line::Paths(p) => {
                paths_lines += 1;
                seconds.insert((p.ts_ns - START_NS) / S);
                for delta in &p.deltas {
                    assert!(
                        defined.contains(&delta.1 .0),
                        "stack {} used before written",
                        delta.1 .0
                    );
                }
            }
            Line::Peaks(peaks) => {
                for peak in peaks {
                    assert!(
                        defined.contains(&peak.1 .0),
                        "stack {} used before written",
                        peak.1 .0
                    );
                }
            }
            Line::Exec(_) | Line::ExitBegan(_) | Line::Exit(_) => image_ends += 1,
            _ => {}
        }
    }
    // Stacks 0.. in order, each once.
    let stacks = u32::try_from(defined.len()).unwrap();
    assert_eq!(defined, (0..stacks).collect::<Vec<_>>());
    assert_eq!(stacks, 8);
    // One line per second with samples, split only where an image ended.
    assert_eq!(seconds.len(), 150);
    assert!(
        (150..=150 + image_ends).contains(&paths_lines),
        "{paths_lines}"
    );
    // Small: a few hundred bytes a second for this run.
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 150 * 1_000, "{size} bytes");
}

/// A sink that accepts `room` bytes, then fails like a full disk.
struct FullDisk {
    written: Rc<RefCell<Vec<u8>>>,
    room: usize,
}

impl Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut written = self.written.borrow_mut();
        let n = buf.len().min(self.room - written.len());
        if n == 0 {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        written.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_full_disk_disables_the_writer_once_and_keeps_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.capture");
    let written = Rc::new(RefCell::new(Vec::new()));
    let disk = FullDisk {
        written: Rc::clone(&written),
        room: 6_000,
    };
    let mut feed = recorder(&path, io::BufWriter::with_capacity(512, disk));
    let end_ns = synthetic_run(&mut feed);
    let error = feed.take_capture_error().expect("the disk filled up");
    assert!(matches!(error, CaptureError::Write { .. }), "{error:?}");
    assert!(error.to_string().contains("full.capture"), "{error}");
    assert!(feed.take_capture_error().is_none(), "reported once");
    // Tracing went on: the live report has the whole run (the fork's RSS
    // and one reading a second).
    let (live, error) = feed.finish(end_ns, run_meta(end_ns));
    assert!(error.is_none(), "{error:?}");
    assert_eq!(live.process(LEAKER).unwrap().timeline.len(), 151);
    // What reached the disk opens, cut where the disk filled up.
    std::fs::write(&path, written.borrow().as_slice()).unwrap();
    assert_eq!(written.borrow().len(), 6_000);
    let capture = read(&path).unwrap();
    assert!(matches!(
        capture.warnings[..],
        [
            CaptureWarning::TruncatedLastLine { .. },
            CaptureWarning::NoEnd { .. }
        ]
    ));
    let report = replay(&capture);
    let early = report.process(LEAKER).unwrap();
    assert!(!early.timeline.is_empty());
    assert!(early.timeline.len() < 150);
}

#[test]
fn a_capture_file_that_cannot_be_created_fails_before_tracing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/folder/run.capture");
    let err = CaptureWriter::create(&path, &header(), false).unwrap_err();
    assert!(matches!(err, CaptureError::Write { .. }), "{err:?}");
    assert!(err.to_string().contains("run.capture"), "{err}");
    // A device that is always full: the header cannot reach it.
    let err = CaptureWriter::create(Path::new("/dev/full"), &header(), true).unwrap_err();
    assert!(matches!(err, CaptureError::Write { .. }), "{err:?}");
}

#[test]
fn an_existing_capture_is_replaced_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.capture");
    std::fs::write(&path, "an earlier capture\n").unwrap();
    let err = CaptureWriter::create(&path, &header(), false).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert!(
        chain.contains("`") && chain.contains("run.capture") && chain.contains("--force"),
        "{chain}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "an earlier capture\n"
    );
    let writer = CaptureWriter::create(&path, &header(), true).unwrap();
    drop(writer);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"memtrace_capture\""), "{text}");
}
