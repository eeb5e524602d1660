//! Step 3 of the data flow: what /proc says about a process (command line,
//! start time, RSS counters at attach, PSS and USS, descendants), via the
//! procfs crate.

use memtrace_common::{ProcessCounters, MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, MM_SWAPENTS};
use procfs::process::Process;
use thiserror::Error;

use super::Sharing;

/// A /proc read that failed.
#[derive(Debug, Error)]
pub enum ProcError {
    /// No process has this PID.
    #[error("no process with PID {pid}: check the PID (`ps -p {pid}`); it may have exited")]
    NoSuchProcess {
        /// The PID asked for.
        pid: u32,
    },
    /// The process exists but cannot be read.
    #[error("cannot read /proc/{pid}")]
    Unreadable {
        /// The PID asked for.
        pid: u32,
        /// What procfs reported.
        #[source]
        source: procfs::ProcError,
    },
}

fn open(pid: u32) -> Result<Process, ProcError> {
    let process = Process::new(pid as i32).map_err(|source| classify(pid, source))?;
    // A zombie has no memory to trace.
    match process.stat() {
        Ok(stat) if stat.state == 'Z' => Err(ProcError::NoSuchProcess { pid }),
        Ok(_) => Ok(process),
        Err(source) => Err(classify(pid, source)),
    }
}

fn classify(pid: u32, source: procfs::ProcError) -> ProcError {
    match source {
        procfs::ProcError::NotFound(_) => ProcError::NoSuchProcess { pid },
        source => ProcError::Unreadable { pid, source },
    }
}

/// Checks that `pid` names a live (not zombie) process.
///
/// # Errors
/// [`ProcError::NoSuchProcess`] when it does not; [`ProcError::Unreadable`]
/// when /proc cannot be read.
pub fn check_exists(pid: u32) -> Result<(), ProcError> {
    open(pid).map(|_| ())
}

/// The process's command line joined with spaces, or its `comm` in brackets
/// when the command line is empty (kernel threads, exiting processes), or
/// `"?"` when neither can be read.
pub fn command_line(pid: u32) -> String {
    let Ok(process) = Process::new(pid as i32) else {
        return "?".to_owned();
    };
    match process.cmdline() {
        Ok(args) if !args.is_empty() => args.join(" "),
        _ => process
            .stat()
            .map_or_else(|_| "?".to_owned(), |stat| format!("[{}]", stat.comm)),
    }
}

/// RSS per `kmem:rss_stat` member (index `MM_*`), in bytes, from
/// /proc/PID/status (`RssFile`, `RssAnon`, `VmSwap`, `RssShmem`, given there
/// in KiB).
///
/// # Errors
/// When the process is gone or /proc cannot be read.
pub fn rss_bytes(pid: u32) -> Result<[u64; 4], ProcError> {
    let status = open(pid)?
        .status()
        .map_err(|source| classify(pid, source))?;
    let kib = |v: Option<u64>| v.unwrap_or(0) * 1024;
    let mut rss = [0; 4];
    rss[MM_FILEPAGES] = kib(status.rssfile);
    rss[MM_ANONPAGES] = kib(status.rssanon);
    rss[MM_SWAPENTS] = kib(status.vmswap);
    rss[MM_SHMEMPAGES] = kib(status.rssshmem);
    Ok(rss)
}

/// Counters for a process memtrace starts tracing now: its RSS from /proc
/// marked known, everything else zero.
///
/// # Errors
/// As [`rss_bytes`].
pub fn initial_counters(pid: u32, parent_tgid: u32) -> Result<ProcessCounters, ProcError> {
    let rss = rss_bytes(pid)?;
    Ok(ProcessCounters {
        rss_bytes: rss,
        rss_known: 0b1111,
        rss_peak_bytes: rss[MM_FILEPAGES] + rss[MM_ANONPAGES] + rss[MM_SHMEMPAGES],
        parent_tgid,
        ..ProcessCounters::default()
    })
}

/// When process `pid` started, CLOCK_BOOTTIME nanoseconds: `/proc/PID/stat`
/// field 22 (`starttime`, clock ticks since boot) times the tick length (10
/// ms at the usual 100 ticks per second), so the kernel's
/// `task_struct.start_boottime` truncated to the tick.
///
/// # Errors
/// When the process is gone or /proc cannot be read.
pub fn start_time_ns(pid: u32) -> Result<u64, ProcError> {
    let stat = open(pid)?.stat().map_err(|source| classify(pid, source))?;
    let ticks_per_second = procfs::ticks_per_second().max(1);
    Ok(stat
        .starttime
        .saturating_mul(1_000_000_000 / ticks_per_second))
}

/// PSS and USS of process `pid` from `/proc/PID/smaps_rollup` (`Pss`, and
/// `Private_Clean + Private_Dirty`). The kernel walks the whole address
/// space for it (cost grows with RSS; see README "Overhead").
///
/// # Errors
/// When the process is gone (or a zombie) or the file cannot be read.
pub fn sharing(pid: u32) -> Result<Sharing, ProcError> {
    let rollup = Process::new(pid as i32)
        .and_then(|p| p.smaps_rollup())
        .map_err(|source| classify(pid, source))?;
    let field = |name: &str| -> u64 {
        rollup
            .memory_map_rollup
            .iter()
            .filter_map(|map| map.extension.map.get(name))
            .sum()
    };
    Ok(Sharing {
        pss_bytes: field("Pss"),
        uss_bytes: field("Private_Clean") + field("Private_Dirty"),
    })
}

/// This process and its ancestors up to PID 1: never traced as someone's
/// descendant (e.g. `memtrace record --pid 1`).
pub fn self_and_ancestors() -> Vec<u32> {
    let mut chain = vec![std::process::id()];
    while let Some(parent) = chain.last().and_then(|&pid| parent_pid(pid)) {
        if parent == 0 || chain.contains(&parent) {
            break;
        }
        chain.push(parent);
    }
    chain
}

/// Whether standard input, output or error of `pid` is the character
/// device `rdev` (a terminal's `st_rdev`): the live view must not redraw
/// over a terminal a traced process uses. `false` when they cannot be read.
pub fn std_streams_on_device(pid: u32, rdev: u64) -> bool {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    (0..=2).any(|fd| {
        std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
            .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == rdev)
    })
}

/// Parent PID of `pid`, if it can be read.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = Process::new(pid as i32).ok()?.stat().ok()?;
    u32::try_from(stat.ppid).ok()
}

/// Live descendants of `root` (children, grandchildren, ...), as
/// `(tgid, parent_tgid)` pairs, parents before children.
///
/// # Errors
/// When /proc cannot be listed.
pub fn descendants(root: u32) -> Result<Vec<(u32, u32)>, ProcError> {
    let all = procfs::process::all_processes().map_err(|source| classify(root, source))?;
    let pairs: Vec<(u32, u32)> = all
        .filter_map(Result::ok)
        .filter_map(|p| p.stat().ok())
        .filter(|stat| stat.state != 'Z')
        .filter_map(|stat| {
            Some((
                u32::try_from(stat.pid).ok()?,
                u32::try_from(stat.ppid).ok()?,
            ))
        })
        .collect();
    Ok(descendants_of(root, &pairs))
}

/// Walks `(pid, ppid)` pairs down from `root`; a parent precedes its children.
fn descendants_of(root: u32, pairs: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in pairs {
            if ppid == parent && pid != root {
                found.push((pid, ppid));
                frontier.push(pid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_descendants() {
        let pairs = [(1, 0), (10, 1), (11, 10), (12, 10), (13, 12), (20, 1)];
        let mut found = descendants_of(10, &pairs);
        found.sort_unstable();
        assert_eq!(found, vec![(11, 10), (12, 10), (13, 12)]);
    }

    #[test]
    fn a_process_whose_output_goes_to_a_device_is_seen_using_it() {
        use std::os::unix::fs::MetadataExt as _;
        use std::process::{Command, Stdio};
        let rdev = |path: &str| std::fs::metadata(path).unwrap().rdev();
        let mut child = Command::new("sleep")
            .arg("10")
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create("/dev/null").unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let on_null = std_streams_on_device(child.id(), rdev("/dev/null"));
        let on_zero = std_streams_on_device(child.id(), rdev("/dev/zero"));
        let _ = child.kill();
        let _ = child.wait();
        assert!(on_null, "its standard output is /dev/null");
        assert!(!on_zero, "none of its streams is /dev/zero");
        assert!(!std_streams_on_device(4_999_999, rdev("/dev/null")));
    }

    #[test]
    fn missing_pid_is_reported_as_such() {
        // PIDs are at most 2^22 on Linux: this one cannot exist.
        let err = check_exists(4_999_999).unwrap_err();
        assert!(matches!(err, ProcError::NoSuchProcess { pid: 4_999_999 }));
        assert!(err.to_string().contains("no process with PID 4999999"));
    }

    #[test]
    fn reads_own_rss_start_time_sharing_and_command_line() {
        let me = std::process::id();
        let rss = rss_bytes(me).unwrap();
        assert!(rss[MM_ANONPAGES] > 0);
        assert!(!command_line(me).is_empty());
        let sharing = sharing(me).unwrap();
        assert!(sharing.uss_bytes > 0 && sharing.pss_bytes >= sharing.uss_bytes);
        let boottime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        let now_ns = boottime.tv_sec() as u64 * 1_000_000_000 + boottime.tv_nsec() as u64;
        let started = start_time_ns(me).unwrap();
        assert!(started > 0 && started <= now_ns, "{started} vs {now_ns}");
    }
}
