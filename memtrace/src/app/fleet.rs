//! The fleet's sinks of a session (`crate::sinks`): opened from the
//! command line's `SinkArgs` before tracing starts, and the windows
//! (`crate::agent::windows`) closed from the session's report so far and
//! handed to each sink: every `--interval` for `memtrace agent`, and for
//! `record`/`run` every [`RECORD_WINDOW`] and once at the end (the
//! on-demand window that also lands in the fleet's backends).

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;

use crate::agent::windows::{host_name, own_resident_bytes, WindowBuilder};
use crate::aggregate::Report;
use crate::cli::SinkArgs;
use crate::sinks::{prometheus::PrometheusSink, Health, Sink};

/// How often `record`/`run` close a window for their sinks.
pub(super) const RECORD_WINDOW: Duration = Duration::from_secs(15);

/// A session's sinks and the windows it closed for them.
pub(super) struct Fleet {
    sinks: Vec<Box<dyn Sink>>,
    windows: WindowBuilder,
    sink_errors: u64,
    interval: Duration,
    next_window: Instant,
}

impl Fleet {
    /// The sinks `args` asks for (maybe none) and `others` (the profile
    /// sinks, opened by `crate::sinks::open_profile_sinks`), their paths
    /// cut to the `top` per service, a window every `interval`, of host
    /// `host` (default: the kernel's host name). Opened before tracing
    /// starts: an address that cannot be bound fails here.
    ///
    /// # Errors
    /// A sink that cannot be opened (a `--metrics` address that does not
    /// parse or cannot be bound).
    pub(super) fn open(
        args: &SinkArgs,
        top: usize,
        host: Option<String>,
        interval: Duration,
        others: Vec<Box<dyn Sink>>,
    ) -> Result<Self> {
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(addr) = &args.metrics {
            sinks.push(Box::new(PrometheusSink::bind(addr, top)?));
        }
        sinks.extend(others);
        Ok(Self {
            sinks,
            windows: WindowBuilder::new(host.unwrap_or_else(host_name), unix_ns()),
            sink_errors: 0,
            interval,
            next_window: Instant::now() + interval,
        })
    }

    /// [`Fleet::open`] for `record`/`run`'s `--metrics`: `None` when
    /// `args` asks for none (their profile sinks get one window at the end,
    /// from `super::output`).
    ///
    /// # Errors
    /// As [`Fleet::open`].
    pub(super) fn open_for_record(args: &SinkArgs, top: usize) -> Result<Option<Self>> {
        let fleet = Self::open(args, top, None, RECORD_WINDOW, Vec::new())?;
        Ok((!fleet.sinks.is_empty()).then_some(fleet))
    }

    /// Where the sinks deliver, for the start line.
    pub(super) fn destinations(&self) -> Vec<String> {
        self.sinks.iter().map(|s| s.destination()).collect()
    }

    /// Whether the next window is due.
    pub(super) fn due(&self) -> bool {
        Instant::now() >= self.next_window
    }

    /// Closes the window begun at `started` (the next is due an interval
    /// after it) with `report`, the session's report so far, and hands it
    /// to every sink (a failed send is counted and logged; the next window
    /// goes out as usual). With `compact` (`memtrace agent`), called once
    /// the report is dropped, the images that ended are forgotten (it
    /// returns how many).
    pub(super) fn emit(
        &mut self,
        started: Instant,
        report: Report,
        compact: Option<impl FnOnce() -> usize>,
    ) -> WindowLine {
        self.next_window = started + self.interval;
        let health = Health {
            records_read: report.meta.records,
            records_dropped: report.meta.dropped_records,
            windows_emitted: 0,
            sink_errors: self.sink_errors + self.sinks.iter().map(|s| s.send_errors()).sum::<u64>(),
            windows_dropped: self.sinks.iter().map(|s| s.windows_dropped()).sum(),
            own_resident_bytes: own_resident_bytes(),
        };
        let window = self.windows.close(&report, unix_ns(), health);
        for sink in &mut self.sinks {
            if let Err(err) = sink.send(&window) {
                self.sink_errors += 1;
                eprintln!("memtrace: warning: {}: {err:#}", sink.name());
            }
        }
        let (stacks, paths) = (report.stacks.len(), report.paths.len());
        drop(report);
        let compacted = match compact {
            Some(compact) => {
                let compacted = compact();
                give_back_freed_heap();
                compacted
            }
            None => 0,
        };
        WindowLine {
            number: window.health.windows_emitted,
            processes: window.processes.len(),
            compacted,
            stacks,
            paths,
            health: window.health,
        }
    }
}

/// The line printed per window.
pub(super) struct WindowLine {
    number: u64,
    processes: usize,
    compacted: usize,
    stacks: usize,
    paths: usize,
    health: Health,
}

impl std::fmt::Display for WindowLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = &self.health;
        write!(
            f,
            "memtrace agent: window {}: {} processes ({} ended ones forgotten), {} stacks, {} \
             paths, {} records read, {} dropped, {} sink errors, memtrace RSS {}",
            self.number,
            self.processes,
            self.compacted,
            self.stacks,
            self.paths,
            h.records_read,
            h.records_dropped,
            h.sink_errors,
            crate::units::format_bytes(h.own_resident_bytes)
        )
    }
}

/// Returns the heap memory freed since the last call to the kernel
/// (`malloc_trim(0)`): each window's report and the images compacted away
/// are freed at once, and glibc would otherwise keep those pages resident
/// in memtrace for allocations that may never come.
fn give_back_freed_heap() {
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes no
    // pointer and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Unix time now, in ns.
pub(super) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
