//! Which processes `memtrace agent` traces, found by polling `/proc`: the
//! `--pid` processes (once, at start; their forks are followed by the kernel
//! side), or every process whose command line matches `--match`, or every
//! process in the `--cgroup` subtree, or every Python process. A process
//! that execs into Python later is seen at the next poll (its `comm`
//! changes with the exec); a process whose parent is traced is left to the
//! kernel side, which follows the fork.

use std::collections::HashMap;
use std::path::Path;

use procfs::process::{Process, Stat};
use regex::Regex;

/// Which processes the agent traces.
#[derive(Clone, Debug)]
pub enum Selector {
    /// These processes and what they fork (`--pid`, repeatable).
    Pids(Vec<u32>),
    /// Every process whose command line (arguments joined with spaces)
    /// matches (`--match REGEX`).
    Match(Regex),
    /// Every process whose cgroup v2 path is this one or below it
    /// (`--cgroup PATH`, with or without the `/sys/fs/cgroup` prefix).
    Cgroup(String),
    /// Every Python process on the host (the default).
    Python,
}

impl Selector {
    /// A `--cgroup` path as `/proc/PID/cgroup` writes it: without the
    /// cgroup2 mount point, with a leading `/`, without a trailing one.
    pub fn cgroup(path: &str) -> Self {
        let path = path.strip_prefix("/sys/fs/cgroup").unwrap_or(path);
        let path = path.trim_end_matches('/');
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        Self::Cgroup(path)
    }

    /// Whether process `process` (with `stat`) is selected; `--pid`
    /// processes are selected at start only ([`Discovery::poll`]).
    fn selects(&self, process: &Process, stat: &Stat) -> bool {
        match self {
            Self::Pids(_) => false,
            Self::Match(regex) => process
                .cmdline()
                .is_ok_and(|args| !args.is_empty() && regex.is_match(&args.join(" "))),
            Self::Cgroup(root) => process.cgroups().is_ok_and(|groups| {
                groups
                    .into_iter()
                    .any(|g| g.hierarchy == 0 && in_subtree(&g.pathname, root))
            }),
            Self::Python => is_python(process, stat),
        }
    }
}

/// Whether cgroup `path` is `root` or below it.
fn in_subtree(path: &str, root: &str) -> bool {
    root == "/"
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether a process runs CPython: its executable's name is an
/// interpreter's (`python3.11`; a script run through its `#!` line has the
/// interpreter as executable), or it maps a `libpython` (uwsgi, an
/// embedding program).
fn is_python(process: &Process, stat: &Stat) -> bool {
    let exe_is_python = process.exe().is_ok_and(|exe| {
        exe.file_name()
            .is_some_and(|name| super::labels::is_python_program(&name.to_string_lossy()))
    });
    exe_is_python || stat.comm.starts_with("python") || maps_libpython(stat.pid)
}

/// Whether `/proc/PID/maps` maps a `libpython*.so`.
fn maps_libpython(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("/libpython"))
}

/// Polls `/proc` for processes to trace. Remembers each process it looked
/// at by (pid, start time, `comm`), so a process is judged once per
/// program it runs; forgets the ones that are gone.
#[derive(Debug)]
pub struct Discovery {
    selector: Selector,
    /// Processes looked at: pid to (start time in ticks, comm); rebuilt
    /// at each poll from the processes present, so at most one per
    /// process on the host now.
    seen: HashMap<u32, (u64, String)>,
    /// `--pid` targets not yet handed out.
    pending_pids: Vec<u32>,
    /// memtrace itself and its ancestors: never traced.
    excluded: Vec<u32>,
}

impl Discovery {
    /// Discovery for `selector`, never selecting `excluded` (memtrace and
    /// its ancestors).
    pub fn new(selector: Selector, excluded: Vec<u32>) -> Self {
        let pending_pids = match &selector {
            Selector::Pids(pids) => pids.clone(),
            _ => Vec::new(),
        };
        Self {
            selector,
            seen: HashMap::new(),
            pending_pids,
            excluded,
        }
    }

    /// Whether targets come only from `--pid` (no new roots after start).
    pub fn fixed_targets(&self) -> bool {
        matches!(self.selector, Selector::Pids(_))
    }

    /// The processes to start tracing now, parents before children:
    /// selected, not `traced` yet, and whose parent is not traced (the
    /// kernel side follows a traced parent's forks). The first call returns
    /// the `--pid` targets.
    ///
    /// # Errors
    /// When `/proc` cannot be listed.
    pub fn poll(&mut self, traced: impl Fn(u32) -> bool) -> anyhow::Result<Vec<u32>> {
        if !self.pending_pids.is_empty() {
            return Ok(std::mem::take(&mut self.pending_pids));
        }
        if self.fixed_targets() {
            return Ok(Vec::new());
        }
        let mut present = HashMap::with_capacity(self.seen.len());
        let mut found = Vec::new();
        for process in procfs::process::all_processes()?.filter_map(Result::ok) {
            let Ok(stat) = process.stat() else { continue };
            let Ok(pid) = u32::try_from(stat.pid) else {
                continue;
            };
            let key = (stat.starttime, stat.comm.clone());
            let known = self.seen.get(&pid) == Some(&key);
            present.insert(pid, key);
            if known || traced(pid) || self.excluded.contains(&pid) {
                continue;
            }
            let parent_traced = u32::try_from(stat.ppid).is_ok_and(&traced);
            if !is_candidate(&stat) || parent_traced {
                continue;
            }
            if self.selector.selects(&process, &stat) {
                found.push((stat.starttime, pid));
            } else if mid_exec(&process) {
                // Its new command line is not readable yet: look again at
                // the next poll instead of remembering it as not selected.
                present.remove(&pid);
            }
        }
        self.seen = present;
        found.sort_unstable();
        Ok(found.into_iter().map(|(_, pid)| pid).collect())
    }
}

/// A live user process (not a kernel thread, not a zombie).
/// Whether `process` is between the two halves of an `execve`: the kernel
/// has set its new `comm` (`begin_new_exec`, fs/exec.c) but not yet its new
/// argument area (`create_elf_tables`), so its command line reads empty.
fn mid_exec(process: &Process) -> bool {
    process.cmdline().map_or(true, |args| args.is_empty())
}

fn is_candidate(stat: &Stat) -> bool {
    const PF_KTHREAD: u32 = 0x0020_0000;
    stat.flags & PF_KTHREAD == 0 && !matches!(stat.state, 'Z' | 'X') && stat.ppid != 2
}

/// Whether a `--cgroup` selector's folder exists under `/sys/fs/cgroup`
/// (any other selector: true).
pub fn cgroup_exists(selector: &Selector) -> bool {
    match selector {
        Selector::Cgroup(path) => Path::new(&format!("/sys/fs/cgroup{path}")).is_dir(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_are_normalized_and_matched_by_subtree() {
        let Selector::Cgroup(root) = Selector::cgroup("/sys/fs/cgroup/system.slice/") else {
            unreachable!()
        };
        assert_eq!(root, "/system.slice");
        assert!(in_subtree("/system.slice", &root));
        assert!(in_subtree("/system.slice/ssh.service", &root));
        assert!(!in_subtree("/system.slice2/x", &root));
        assert!(in_subtree("/anything", "/"));
    }

    #[test]
    fn a_python_child_of_this_test_is_found_once_and_not_when_traced() {
        // A marker of this test process's own, so that another run of this
        // test at the same time (another checkout's) is not found.
        let marker = format!("discovery-test-marker-{}", std::process::id());
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(30)", &marker])
            .spawn()
            .expect("python3 starts");
        let pid = child.id();
        let regex = Regex::new(&marker).expect("regex");
        let mut discovery = Discovery::new(Selector::Match(regex), Vec::new());
        // The exec into python may not have happened at the first poll (up
        // to 10 s on a loaded machine).
        let mut found = Vec::new();
        for _ in 0..500 {
            found = discovery.poll(|_| false).expect("poll");
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(found, vec![pid]);
        assert!(
            discovery.poll(|_| false).expect("poll").is_empty(),
            "found twice"
        );
        let mut python = Discovery::new(Selector::Python, Vec::new());
        assert!(python.poll(|_| false).expect("poll").contains(&pid));
        let mut traced = Discovery::new(Selector::Python, Vec::new());
        assert!(!traced.poll(|p| p == pid).expect("poll").contains(&pid));
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}
