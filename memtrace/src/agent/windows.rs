//! Each `--interval` of `memtrace agent` closed into a [`Window`]: the
//! aggregator's report so far (the same [`Report`] the reporters read)
//! narrowed to the process images open now, each with its labels, its RSS
//! parts from the kernel's counters, and its paths with the bytes they hold
//! now and grew since the previous window.

use std::collections::HashMap;

use super::labels::Identity;
use crate::aggregate::{ProcessId, ProcessReport, Report, StackId};
use crate::sinks::{Health, PathWindow, ProcessLabels, ProcessWindow, Window};

/// A path's cumulative sums at the previous window's end.
#[derive(Clone, Copy, Debug, Default)]
struct PathSums {
    grown_bytes: u64,
    cow_bytes: u64,
}

/// Closes windows one after the other; remembers only what the next window
/// needs of the open images (their labels and their paths' sums), so it
/// does not grow with the processes that came and went: `previous` has one
/// entry per path of the last window's open images, `identities` one per
/// image open at the last window.
#[derive(Debug)]
pub struct WindowBuilder {
    host_name: String,
    /// End of the previous window (the next one's start), Unix ns.
    last_end_ns: u64,
    previous: HashMap<(ProcessId, StackId), PathSums>,
    identities: HashMap<ProcessId, Identity>,
    windows_emitted: u64,
}

impl WindowBuilder {
    /// Windows of host `host_name`, the first starting at `start_unix_ns`.
    pub fn new(host_name: String, start_unix_ns: u64) -> Self {
        Self {
            host_name,
            last_end_ns: start_unix_ns,
            previous: HashMap::new(),
            identities: HashMap::new(),
            windows_emitted: 0,
        }
    }

    /// The window from the previous one's end to `end_unix_ns`, from
    /// `report` (the aggregator's report now); `health` as the agent counts
    /// it, with this window counted in [`Health::windows_emitted`].
    pub fn close(&mut self, report: &Report, end_unix_ns: u64, health: Health) -> Window {
        self.close_images(report, end_unix_ns, health, is_open)
    }

    /// The one window of a whole `record`/`run`: every image of `report`,
    /// the ended ones too, those labelled from their recorded command line
    /// (their `/proc` entry is gone, or another process's now).
    pub fn close_run(&mut self, report: &Report, end_unix_ns: u64, health: Health) -> Window {
        self.close_images(report, end_unix_ns, health, |_| true)
    }

    /// The window of the images `keep` selects.
    fn close_images(
        &mut self,
        report: &Report,
        end_unix_ns: u64,
        mut health: Health,
        keep: fn(&ProcessReport) -> bool,
    ) -> Window {
        let open: Vec<&ProcessReport> = report.processes.iter().filter(|p| keep(p)).collect();
        self.identities
            .retain(|id, _| open.iter().any(|p| p.id == *id));
        let mut paths_of: HashMap<ProcessId, Vec<PathWindow>> = HashMap::new();
        let mut sums = HashMap::new();
        for path in &report.paths {
            if !open.iter().any(|p| p.id == path.process) {
                continue;
            }
            let now = PathSums {
                grown_bytes: path.bytes.grown_bytes(),
                cow_bytes: path.bytes.cow_bytes,
            };
            let before = self
                .previous
                .get(&(path.process, path.stack))
                .copied()
                .unwrap_or_default();
            sums.insert((path.process, path.stack), now);
            let window = PathWindow {
                frames: report.frames(path.stack).to_vec(),
                held_bytes: path.bytes.held_now_bytes(),
                grown_bytes: now.grown_bytes.saturating_sub(before.grown_bytes),
                peak_held_bytes: path.peak_held_bytes,
                cow_bytes: now.cow_bytes.saturating_sub(before.cow_bytes),
            };
            if window.held_bytes > 0 || window.grown_bytes > 0 || window.cow_bytes > 0 {
                paths_of.entry(path.process).or_default().push(window);
            }
        }
        self.previous = sums;
        let processes = open
            .into_iter()
            .map(|p| {
                let identity = self.identities.entry(p.id).or_insert_with(|| {
                    if is_open(p) {
                        Identity::read(p.tgid)
                    } else {
                        Identity::from_cmdline(&p.cmdline)
                    }
                });
                let mut paths = paths_of.remove(&p.id).unwrap_or_default();
                paths.sort_by(|a, b| {
                    (b.held_bytes, b.grown_bytes, &a.frames).cmp(&(
                        a.held_bytes,
                        a.grown_bytes,
                        &b.frames,
                    ))
                });
                process_window(p, identity, paths)
            })
            .collect();
        self.windows_emitted += 1;
        health.windows_emitted = self.windows_emitted;
        let window = Window {
            start_ns: self.last_end_ns,
            end_ns: end_unix_ns,
            host_name: self.host_name.clone(),
            sample_interval_bytes: report.meta.sample_interval_bytes,
            processes,
            health,
        };
        self.last_end_ns = end_unix_ns;
        window
    }
}

/// Whether image `p` still lives and counts: it has not exec'd nor begun
/// to exit.
fn is_open(p: &ProcessReport) -> bool {
    p.exec_ns.is_none() && p.exit_began_ns.is_none()
}

/// One open image's window: its latest counter reading (the report's
/// timeline ends with it) and its labels.
fn process_window(p: &ProcessReport, identity: &Identity, paths: Vec<PathWindow>) -> ProcessWindow {
    let last = p.timeline.last();
    ProcessWindow {
        labels: ProcessLabels {
            service_name: identity.service_name.clone(),
            role: p.kind.to_string(),
            pid: p.tgid,
            start_time_ns: p.start_time_ns,
            cgroup: identity.cgroup.clone(),
            pod_uid: identity.pod_uid.clone(),
            container_id: identity.container_id.clone(),
        },
        resident_bytes: last.map_or(0, |l| l.rss_bytes),
        anon_bytes: last.map_or(0, |l| l.anon_bytes),
        file_bytes: last.map_or(0, |l| l.file_bytes),
        shmem_bytes: last.map_or(0, |l| l.shmem_bytes),
        pss_bytes: last.and_then(|l| l.pss_bytes),
        uss_bytes: last.and_then(|l| l.uss_bytes),
        growth_bytes: p.rss.map_or(0, |r| r.growth_bytes),
        cow_bytes_total: p.counters.as_ref().map_or(0, |c| c.cow_fault_bytes),
        paths,
    }
}

/// The node's host name (`/proc/sys/kernel/hostname`), `localhost` when it
/// cannot be read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// memtrace's own RSS (`VmRSS` of `/proc/self/status`), 0 when unreadable.
pub fn own_resident_bytes() -> u64 {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .ok()
        .and_then(|s| s.vmrss)
        .map_or(0, |kib| kib * 1024)
}
