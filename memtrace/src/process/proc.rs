//! Step 3 of the data flow: what /proc says about a process (command line,
//! start time, RSS counters at attach, PSS and USS, descendants), via the
//! procfs crate.

use caps::Capability;
use memtrace_common::{ProcessCounters, MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, MM_SWAPENTS};
use procfs::process::{Process, Stat, StatFlags};
use thiserror::Error;

use super::Sharing;
use crate::privileges::Privileges;

/// A /proc read that failed, or a process that cannot be traced.
#[derive(Debug, Error)]
pub enum ProcError {
    /// No process has this PID.
    #[error("no process with PID {pid}: check the PID (`ps -p {pid}`); it may have exited")]
    NoSuchProcess {
        /// The PID asked for.
        pid: u32,
    },
    /// The process has exited but its parent has not collected its status.
    #[error(
        "PID {pid} exited (zombie); its parent {parent} (`{parent_command}`) has not reaped it: \
         no memory is left to trace"
    )]
    Zombie {
        /// The PID asked for.
        pid: u32,
        /// Its parent's PID.
        parent: u32,
        /// Its parent's command line.
        parent_command: String,
    },
    /// The PID is a kernel thread.
    #[error("PID {pid} (`[{comm}]`) is a kernel thread: it has no user memory to trace")]
    KernelThread {
        /// The PID asked for.
        pid: u32,
        /// Its name.
        comm: String,
    },
    /// The process's memory may not be read by this one.
    #[error("cannot read the memory of PID {pid} (uid {owner_uid}) as uid {uid}: {hint}")]
    NoAccess {
        /// The PID asked for.
        pid: u32,
        /// The uid the process runs as.
        owner_uid: u32,
        /// memtrace's effective uid.
        uid: u32,
        /// What is missing.
        hint: String,
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

/// The process through which /proc shows `pid`'s memory (see
/// [`reader_pid`]).
fn open(pid: u32) -> Result<Process, ProcError> {
    let reader = reader_pid(pid)?;
    Process::new(reader as i32).map_err(|source| classify(pid, source))
}

fn classify(pid: u32, source: procfs::ProcError) -> ProcError {
    match source {
        procfs::ProcError::NotFound(_) => ProcError::NoSuchProcess { pid },
        source => ProcError::Unreadable { pid, source },
    }
}

/// The PID whose /proc directory shows the memory of process `tgid`:
/// `tgid` itself, or, when its main thread has exited (`pthread_exit`)
/// while other threads run, one of those threads (`/proc/TID` shows the
/// process's maps, memory and counters; the leader's is empty).
///
/// # Errors
/// [`ProcError::NoSuchProcess`], [`ProcError::Zombie`] (every thread has
/// exited), [`ProcError::KernelThread`], [`ProcError::Unreadable`].
pub fn reader_pid(tgid: u32) -> Result<u32, ProcError> {
    let process = Process::new(tgid as i32).map_err(|source| classify(tgid, source))?;
    let stat = process.stat().map_err(|source| classify(tgid, source))?;
    if is_kernel_thread(&stat) {
        return Err(ProcError::KernelThread {
            pid: tgid,
            comm: stat.comm,
        });
    }
    if !is_dead(stat.state) {
        return Ok(tgid);
    }
    live_thread(&process, tgid).ok_or_else(|| {
        let parent = u32::try_from(stat.ppid).unwrap_or(0);
        ProcError::Zombie {
            pid: tgid,
            parent,
            parent_command: command_line(parent),
        }
    })
}

/// `Z` (zombie) or `X` (dead): the task has exited.
fn is_dead(state: char) -> bool {
    matches!(state, 'Z' | 'X')
}

fn is_kernel_thread(stat: &Stat) -> bool {
    StatFlags::from_bits_truncate(stat.flags).contains(StatFlags::PF_KTHREAD)
}

/// A thread of `process` other than its leader `tgid` that has not exited.
fn live_thread(process: &Process, tgid: u32) -> Option<u32> {
    process
        .tasks()
        .ok()?
        .filter_map(Result::ok)
        .filter(|task| task.tid != tgid as i32)
        .find(|task| task.stat().is_ok_and(|stat| !is_dead(stat.state)))
        .and_then(|task| u32::try_from(task.tid).ok())
}

/// Checks that `pid` names a live process: not a zombie (a process whose
/// main thread alone exited is live), not a kernel thread.
///
/// # Errors
/// As [`reader_pid`].
pub fn check_exists(pid: u32) -> Result<(), ProcError> {
    reader_pid(pid).map(|_| ())
}

/// Checks that `pid` is a live user process whose memory this process may
/// read, as `record --pid` needs to walk its Python stacks: opening
/// `/proc/PID/mem` takes `PTRACE_MODE_ATTACH` (`CAP_PERFMON` allows only
/// the maps and counters, `PTRACE_MODE_READ`).
///
/// # Errors
/// As [`reader_pid`], and [`ProcError::NoAccess`] naming `CAP_SYS_PTRACE`
/// when it is missing.
pub fn check_traceable(pid: u32) -> Result<(), ProcError> {
    let reader = reader_pid(pid)?;
    match std::fs::File::open(format!("/proc/{reader}/mem")) {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            let owner_uid = Process::new(reader as i32)
                .and_then(|p| p.uid())
                .unwrap_or(u32::MAX);
            Err(no_access(pid, owner_uid, &Privileges::current()))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(ProcError::NoSuchProcess { pid })
        }
        Err(err) => Err(classify(pid, procfs::ProcError::Io(err, None))),
    }
}

/// The error for a process whose memory may not be read.
fn no_access(pid: u32, owner_uid: u32, privileges: &Privileges) -> ProcError {
    let hint = if privileges.has(Capability::CAP_SYS_PTRACE) {
        "access was denied although memtrace has CAP_SYS_PTRACE (Yama's ptrace_scope 3, or a \
         security module?)"
    } else {
        "memtrace needs CAP_SYS_PTRACE to read the memory of another user's process, or of one \
         with capabilities it lacks"
    };
    ProcError::NoAccess {
        pid,
        owner_uid,
        uid: privileges.uid,
        hint: hint.to_owned(),
    }
}

/// The process's command line joined with spaces, or its `comm` in brackets
/// when the command line is empty (kernel threads, exiting processes), or
/// `"?"` when neither can be read. Read through a live thread when the
/// main thread alone has exited.
pub fn command_line(pid: u32) -> String {
    let reader = reader_pid(pid).unwrap_or(pid);
    let Ok(process) = Process::new(reader as i32) else {
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
    // The leader's, even when it alone has exited: the process's identity.
    let stat = Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map_err(|source| classify(pid, source))?;
    let ticks_per_second = procfs::ticks_per_second().max(1);
    Ok(stat
        .starttime
        .saturating_mul(1_000_000_000 / ticks_per_second))
}

/// PSS and USS of process `pid` from `/proc/PID/smaps_rollup` (`Pss`, and
/// `Private_Clean + Private_Dirty`). The kernel walks the whole address
/// space for it (cost grows with RSS; see docs/overhead.md).
///
/// # Errors
/// When the process is gone (or a zombie) or the file cannot be read.
pub fn sharing(pid: u32) -> Result<Sharing, ProcError> {
    let rollup = open(pid)?
        .smaps_rollup()
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

/// `/dev/tty`'s device number: major 5, minor 0 (the kernel's
/// Documentation/admin-guide/devices.txt), whatever terminal it stands for.
const DEV_TTY: (u32, u32) = (5, 0);

/// Whether `pid` has the character device `rdev` (a terminal's `st_rdev`)
/// open on any file descriptor, or `/dev/tty` while that terminal is its
/// controlling terminal: it may write to that terminal, so the live view
/// must not redraw over it. `false` when the descriptors cannot be read.
/// A program that opens `/dev/tty` only for the moment of one write is not
/// seen unless a check falls in that moment.
pub fn uses_terminal(pid: u32, rdev: u64) -> bool {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let mut opens_dev_tty = false;
    for fd in fds.filter_map(Result::ok) {
        let Ok(meta) = std::fs::metadata(fd.path()) else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        if meta.rdev() == rdev {
            return true;
        }
        opens_dev_tty |= device_numbers(meta.rdev()) == DEV_TTY;
    }
    opens_dev_tty && controlling_terminal(pid) == Some(device_numbers(rdev))
}

/// `(major, minor)` of a device number as `stat(2)` gives it.
fn device_numbers(rdev: u64) -> (u32, u32) {
    (libc::major(rdev), libc::minor(rdev))
}

/// `(major, minor)` of the controlling terminal of `pid` (`tty_nr` of
/// `/proc/PID/stat`); `None` without one or when it cannot be read.
fn controlling_terminal(pid: u32) -> Option<(u32, u32)> {
    let stat = Process::new(pid as i32).ok()?.stat().ok()?;
    let (major, minor) = stat.tty_nr();
    (stat.tty_nr != 0).then_some((major as u32, minor as u32))
}

/// Whether `pid` exec'd since `parent` forked it: a fork keeps its
/// parent's auxiliary vector (`mm->saved_auxv`, copied with the mm) until
/// an execve builds a new one (new `AT_RANDOM` and `AT_EXECFN` addresses,
/// with ASLR), so the two `/proc/PID/auxv` differ after an exec. `false`
/// when either cannot be read.
pub fn exec_since_fork(pid: u32, parent: u32) -> bool {
    let auxv = |p: u32| std::fs::read(format!("/proc/{p}/auxv")).ok();
    match (auxv(pid), auxv(parent)) {
        (Some(child), Some(parent)) => child != parent,
        _ => false,
    }
}

/// Whether `pid` still runs the image `parent` forked it with: both
/// auxiliary vectors read and equal (see [`exec_since_fork`]); `false` when
/// either cannot be read.
pub fn forked_without_exec(pid: u32, parent: u32) -> bool {
    let auxv = |p: u32| std::fs::read(format!("/proc/{p}/auxv")).ok();
    matches!((auxv(pid), auxv(parent)), (Some(child), Some(parent)) if child == parent)
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
        .filter_map(|p| {
            let stat = p.stat().ok()?;
            // A dead main thread with live threads is a live process.
            let alive = !is_dead(stat.state) || live_thread(&p, stat.pid as u32).is_some();
            alive.then_some(stat)
        })
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
    fn a_process_with_a_device_open_is_seen_using_it() {
        use std::os::unix::fs::MetadataExt as _;
        use std::process::{Command, Stdio};
        let rdev = |path: &str| std::fs::metadata(path).unwrap().rdev();
        // Standard output on /dev/null; /dev/zero on descriptor 3 once the
        // shell has run its first command.
        let mut child = Command::new("sh")
            .args(["-c", "exec 3</dev/zero; echo opened; exec sleep 10"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create("/dev/null").unwrap())
            .spawn()
            .unwrap();
        let mut opened = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut opened,
        )
        .unwrap();
        let on_null = uses_terminal(child.id(), rdev("/dev/null"));
        let on_zero = uses_terminal(child.id(), rdev("/dev/zero"));
        let on_full = uses_terminal(child.id(), rdev("/dev/full"));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(opened, "opened\n");
        assert!(on_null, "its standard error is /dev/null");
        assert!(on_zero, "descriptor 3 is /dev/zero");
        assert!(!on_full, "nothing of it is /dev/full");
        assert!(!uses_terminal(4_999_999, rdev("/dev/null")));
    }

    #[test]
    fn missing_pid_is_reported_as_such() {
        // PIDs are at most 2^22 on Linux: this one cannot exist.
        let err = check_exists(4_999_999).unwrap_err();
        assert!(matches!(err, ProcError::NoSuchProcess { pid: 4_999_999 }));
        assert!(err.to_string().contains("no process with PID 4999999"));
    }

    /// Waits up to 5 s for `check` to hold.
    fn wait_for(mut check: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if check() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }

    fn state(pid: u32) -> Option<char> {
        Process::new(pid as i32)
            .and_then(|p| p.stat())
            .ok()
            .map(|s| s.state)
    }

    #[test]
    fn a_zombie_is_named_with_the_parent_that_has_not_reaped_it() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        assert!(
            wait_for(|| state(pid) == Some('Z')),
            "{pid} never became a zombie"
        );
        let err = check_exists(pid).unwrap_err();
        let me = std::process::id();
        assert!(
            matches!(err, ProcError::Zombie { pid: p, parent, .. } if p == pid && parent == me),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("PID {pid} exited (zombie); its parent {me} (`")),
            "{text}"
        );
        assert!(text.contains("has not reaped it"), "{text}");
        child.wait().unwrap();
        assert!(matches!(
            check_exists(pid),
            Err(ProcError::NoSuchProcess { .. })
        ));
    }

    #[test]
    fn a_kernel_thread_is_refused_as_one() {
        let Some(kthread) = procfs::process::all_processes()
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|p| p.stat().ok())
            .find(is_kernel_thread)
        else {
            eprintln!("skipping: no kernel thread is visible here (a container?)");
            return;
        };
        let pid = kthread.pid as u32;
        let err = check_exists(pid).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "PID {pid} (`[{}]`) is a kernel thread: it has no user memory to trace",
                kthread.comm
            )
        );
    }

    #[test]
    fn a_process_whose_main_thread_exited_is_read_through_another_thread() {
        let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            eprintln!("skipping: no python3 to run pthread_exit in");
            return;
        };
        let mut child = std::process::Command::new(python)
            .args([
                "-c",
                "import threading,time,ctypes\n\
                 threading.Thread(target=lambda: time.sleep(10)).start()\n\
                 ctypes.CDLL(None).pthread_exit(None)",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(
            wait_for(|| state(pid) == Some('Z')),
            "main thread of {pid} never exited"
        );
        let reader = reader_pid(pid).unwrap();
        assert_ne!(reader, pid);
        assert!(rss_bytes(pid).unwrap()[MM_ANONPAGES] > 0);
        assert!(sharing(pid).unwrap().uss_bytes > 0);
        assert!(
            command_line(pid).contains("pthread_exit"),
            "{}",
            command_line(pid)
        );
        assert!(start_time_ns(pid).unwrap() > 0);
        check_traceable(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn no_access_names_cap_sys_ptrace_when_missing() {
        let without = no_access(
            7,
            1000,
            &Privileges::with(65534, &[Capability::CAP_PERFMON]),
        );
        assert_eq!(
            without.to_string(),
            "cannot read the memory of PID 7 (uid 1000) as uid 65534: memtrace needs \
             CAP_SYS_PTRACE to read the memory of another user's process, or of one with \
             capabilities it lacks"
        );
        let with = no_access(7, 1000, &Privileges::with(0, &[Capability::CAP_SYS_PTRACE]));
        assert!(with
            .to_string()
            .contains("although memtrace has CAP_SYS_PTRACE"));
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
