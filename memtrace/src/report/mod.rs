//! Report step of the data flow (last): renders an aggregated [`Report`] as
//! a terminal table ([`table`]), folded stacks ([`folded`]) and JSON
//! ([`json`]). Renderers are generic over the writer, so tests render into a
//! `Vec<u8>`; [`write_files`] puts the folded stacks and the JSON next to
//! each other in an output folder.

pub mod folded;
pub mod json;
pub mod table;
mod units;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use crate::aggregate::Report;
pub use units::{format_bytes, format_signed_bytes};

/// Most numbered alternatives [`write_files`] tries when a name is taken.
const MAX_NAME_ATTEMPTS: u32 = 100;

/// Errors writing report files.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A report file could not be created or written.
    #[error("cannot write report file `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Every candidate file name was already taken.
    #[error("no free report file name `{stem}[-N]` in `{}`", dir.display())]
    NamesTaken {
        /// The output folder.
        dir: PathBuf,
        /// The base name tried.
        stem: String,
    },
}

/// Where [`write_files`] put the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenFiles {
    /// Folded stacks of sampled growth (input for inferno or flamegraph.pl).
    pub folded: PathBuf,
    /// The whole report as pretty JSON.
    pub json: PathBuf,
}

/// Writes `memtrace-YYYYMMDD-HHMMSS.folded` and `.json` (UTC time of the
/// call) into `dir`; when either name exists, `-2`, `-3`, ... is appended to
/// the stem, so earlier reports are never overwritten. `dir` must exist.
///
/// # Errors
/// [`ReportError::Write`] when a file cannot be created or written;
/// [`ReportError::NamesTaken`] when 100 candidate names are all taken.
pub fn write_files(report: &Report, dir: &Path) -> Result<WrittenFiles, ReportError> {
    write_files_named(report, dir, &timestamp_stem(SystemTime::now()))
}

/// `memtrace-YYYYMMDD-HHMMSS` for `time` in UTC.
fn timestamp_stem(time: SystemTime) -> String {
    // RFC 3339 in UTC: "2026-11-30T07:04:25Z".
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    let digits = |part: &str| {
        part.chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
    };
    let (date, time_of_day) = rfc3339.split_once('T').unwrap_or((&rfc3339, ""));
    format!("memtrace-{}-{}", digits(date), digits(time_of_day))
}

/// [`write_files`] with a chosen base name.
fn write_files_named(report: &Report, dir: &Path, stem: &str) -> Result<WrittenFiles, ReportError> {
    let files = free_names(dir, stem)?;
    write_one(&files.folded, |w| folded::render(report, w))?;
    write_one(&files.json, |w| json::render(report, w))?;
    Ok(files)
}

/// The first `stem`, `stem-2`, ... whose two files both do not exist.
fn free_names(dir: &Path, stem: &str) -> Result<WrittenFiles, ReportError> {
    for attempt in 1..=MAX_NAME_ATTEMPTS {
        let name = if attempt == 1 {
            stem.to_owned()
        } else {
            format!("{stem}-{attempt}")
        };
        let files = WrittenFiles {
            folded: dir.join(format!("{name}.folded")),
            json: dir.join(format!("{name}.json")),
        };
        if !files.folded.exists() && !files.json.exists() {
            return Ok(files);
        }
    }
    Err(ReportError::NamesTaken {
        dir: dir.to_owned(),
        stem: stem.to_owned(),
    })
}

/// Creates `path` and fills it with `render`.
fn write_one(
    path: &Path,
    render: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), ReportError> {
    let result = File::create(path).and_then(|file| {
        let mut writer = BufWriter::new(file);
        render(&mut writer)?;
        writer.flush()
    });
    result.map_err(|source| ReportError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Short name of a process for folded stacks and tables: its command line
/// with whitespace collapsed, cut to 60 characters; `?` when unknown.
pub fn process_label(cmdline: &str) -> String {
    const MAX_CHARS: usize = 60;
    let collapsed = cmdline.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "?".to_owned();
    }
    if collapsed.chars().count() <= MAX_CHARS {
        return collapsed;
    }
    let mut cut: String = collapsed.chars().take(MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A small synthetic report shared by the renderer tests.

    use memtrace_common::{MemoryEvent, ProcessCounters, MM_ANONPAGES};

    use crate::aggregate::{
        Aggregator, Frame, MemorySample, ProcessStart, PythonStatus, Report, Role, RunMeta,
    };

    pub(crate) const MIB: u64 = 1024 * 1024;

    pub(crate) fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame::Python {
            function: function.to_owned(),
            file: file.to_owned(),
            line,
        }
    }

    pub(crate) fn native(symbol: &str) -> Frame {
        Frame::Native {
            symbol: symbol.to_owned(),
        }
    }

    fn counters(anon_bytes: u64) -> ProcessCounters {
        let mut c = ProcessCounters {
            rss_known: 1 << MM_ANONPAGES,
            ..ProcessCounters::default()
        };
        c.rss_bytes[MM_ANONPAGES] = anon_bytes;
        c
    }

    fn sample(tgid: u32, event: MemoryEvent, weight_bytes: u64, stack: Vec<Frame>) -> MemorySample {
        MemorySample {
            tgid,
            ts_ns: 1_500,
            event,
            len_bytes: 4096,
            weight_bytes,
            stack,
        }
    }

    /// A pre-fork service: a master (100) and three workers (101..=103).
    /// The same leak (`append`) grows 10 MiB in each worker; a transient
    /// `parse` grows 16 MiB in worker 101 only, so it outranks the leak per
    /// process but not merged (30 MiB). 46 MiB of sampled growth in all.
    pub(crate) fn prefork_report() -> Report {
        let mut agg = Aggregator::new(1_000);
        for (tgid, parent_tgid, role) in [
            (100, None, Role::Root),
            (101, Some(100), Role::Worker),
            (102, Some(100), Role::Worker),
            (103, Some(100), Role::Worker),
        ] {
            agg.process_started(ProcessStart {
                tgid,
                parent_tgid,
                role,
                cmdline: "gunicorn app:wsgi".to_owned(),
                ts_ns: 1_000,
            });
        }
        let leak = vec![
            py("<module>", "server.py", 1),
            py("handle", "app/views.py", 10),
            py("append", "app/cache.py", 42),
            native("PyList_Append"),
        ];
        let parse = vec![
            py("<module>", "server.py", 1),
            py("parse", "app/io.py", 7),
            native("malloc"),
        ];
        for tgid in [101, 102, 103] {
            agg.memory(sample(
                tgid,
                MemoryEvent::AnonGrowth,
                10 * MIB,
                leak.clone(),
            ));
        }
        agg.memory(sample(101, MemoryEvent::AnonGrowth, 16 * MIB, parse));
        agg.finish(
            5_000,
            RunMeta {
                command: "gunicorn app:wsgi".to_owned(),
                duration_ns: 4_000_000_000,
                records: 4,
                ..RunMeta::default()
            },
        )
    }

    /// A master (100) that stays flat and a worker (101) that grows 48 MiB,
    /// 3/4 of it in `append` under `handle`, with one CoW path.
    pub(crate) fn report() -> Report {
        let mut agg = Aggregator::new(1_000);
        agg.process_started(ProcessStart {
            tgid: 100,
            parent_tgid: None,
            role: Role::Root,
            cmdline: "python3 server.py".to_owned(),
            ts_ns: 1_000,
        });
        agg.process_started(ProcessStart {
            tgid: 101,
            parent_tgid: Some(100),
            role: Role::Worker,
            cmdline: "python3 server.py".to_owned(),
            ts_ns: 1_200,
        });
        agg.python_status(
            100,
            PythonStatus::Python {
                version: "3.12.1".to_owned(),
            },
        );
        agg.python_status(
            101,
            PythonStatus::Python {
                version: "3.12.1".to_owned(),
            },
        );
        agg.counters(100, 2_000, &counters(20 * MIB));
        agg.counters(101, 2_000, &counters(20 * MIB));
        let cache = vec![
            py("<module>", "server.py", 1),
            py("handle", "app/views.py", 10),
            py("append", "app/cache.py", 42),
            native("PyList_Append"),
        ];
        let parse = vec![
            py("<module>", "server.py", 1),
            py("parse", "app/io;v2.py", 7),
            native("malloc"),
        ];
        agg.memory(sample(
            101,
            MemoryEvent::AnonGrowth,
            36 * MIB,
            cache.clone(),
        ));
        agg.memory(sample(101, MemoryEvent::AnonGrowth, 12 * MIB, parse));
        agg.memory(sample(101, MemoryEvent::CowFault, 4096, cache));
        agg.counters(100, 3_000, &counters(20 * MIB));
        agg.counters(101, 3_000, &counters(68 * MIB));
        agg.finish(
            5_000,
            RunMeta {
                command: "python3 server.py".to_owned(),
                duration_ns: 4_000_000_000,
                records: 3,
                dropped_records: 2,
                decode_errors: 0,
                sample_interval_bytes: 512 * 1024,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn stem_is_the_utc_time() {
        // 2026-11-30T07:04:25Z
        let time = UNIX_EPOCH + Duration::from_secs(1_796_022_265);
        assert_eq!(timestamp_stem(time), "memtrace-20261130-070425");
    }

    #[test]
    fn writes_both_files_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let report = test_support::report();
        let first = write_files_named(&report, dir.path(), "memtrace-x").unwrap();
        assert_eq!(first.folded, dir.path().join("memtrace-x.folded"));
        assert_eq!(first.json, dir.path().join("memtrace-x.json"));
        let second = write_files_named(&report, dir.path(), "memtrace-x").unwrap();
        assert_eq!(second.folded, dir.path().join("memtrace-x-2.folded"));
        let json = std::fs::read_to_string(&first.json).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let folded = std::fs::read_to_string(&first.folded).unwrap();
        assert_eq!(folded.lines().count(), 2);
    }

    #[test]
    fn missing_folder_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = write_files(&test_support::report(), &missing).unwrap_err();
        assert!(matches!(err, ReportError::Write { .. }));
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn labels_are_collapsed_and_cut() {
        assert_eq!(process_label("  python3\tapp.py  "), "python3 app.py");
        assert_eq!(process_label(""), "?");
        let long = "x".repeat(100);
        let label = process_label(&long);
        assert_eq!(label.chars().count(), 60);
        assert!(label.ends_with('…'));
    }
}
