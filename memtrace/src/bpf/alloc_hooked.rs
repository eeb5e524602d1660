//! Kernel side, userspace half, allocator mode: which process each set of
//! attached allocator probes belongs to. A process is its tgid and its
//! start time: when a process's exit record is lost (a full ring buffer),
//! its links stay, and a later process that reuses the tgid must find them
//! stale (detached, its own attached) rather than take them for its own.

use std::collections::HashMap;

/// What [`HookedProcesses::claim`] found for a process.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim<L> {
    /// This very process (tgid and start time) is hooked already.
    Hooked,
    /// Nothing is attached for the tgid.
    Free,
    /// An earlier process with the tgid left these links (its exit was
    /// not seen): the caller detaches them and drops its blocks.
    Stale(Vec<L>),
}

/// Attached links `L` per process: tgid → (start time, boot-time ns; links).
#[derive(Debug)]
pub struct HookedProcesses<L> {
    by_tgid: HashMap<u32, (u64, Vec<L>)>,
}

impl<L> Default for HookedProcesses<L> {
    fn default() -> Self {
        Self {
            by_tgid: HashMap::new(),
        }
    }
}

impl<L> HookedProcesses<L> {
    /// Whether process (`tgid`, `start_time_ns`) is hooked; links of an
    /// earlier process with that tgid are taken out and returned.
    pub fn claim(&mut self, tgid: u32, start_time_ns: u64) -> Claim<L> {
        match self.by_tgid.get(&tgid) {
            None => Claim::Free,
            Some((start, _)) if *start == start_time_ns => Claim::Hooked,
            Some(_) => Claim::Stale(
                self.by_tgid
                    .remove(&tgid)
                    .map(|(_, l)| l)
                    .unwrap_or_default(),
            ),
        }
    }

    /// Process (`tgid`, `start_time_ns`) is hooked with `links`.
    pub fn insert(&mut self, tgid: u32, start_time_ns: u64, links: Vec<L>) {
        self.by_tgid.insert(tgid, (start_time_ns, links));
    }

    /// The tgids hooked.
    pub fn tgids(&self) -> Vec<u32> {
        self.by_tgid.keys().copied().collect()
    }

    /// The links of whatever process has `tgid` (it exited or exec'd).
    pub fn remove(&mut self, tgid: u32) -> Option<Vec<L>> {
        self.by_tgid.remove(&tgid).map(|(_, links)| links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_tgid_finds_its_predecessors_links_stale() {
        let mut hooked = HookedProcesses::default();
        assert_eq!(hooked.claim(40, 1_000), Claim::Free);
        hooked.insert(40, 1_000, vec!["entry", "return"]);
        assert_eq!(hooked.claim(40, 1_000), Claim::Hooked);
        // Its exit record was lost; a new process got tgid 40.
        assert_eq!(
            hooked.claim(40, 9_000),
            Claim::Stale(vec!["entry", "return"])
        );
        assert_eq!(hooked.claim(40, 9_000), Claim::Free);
        hooked.insert(40, 9_000, vec!["new"]);
        assert_eq!(hooked.claim(40, 9_000), Claim::Hooked);
        assert_eq!(hooked.remove(40), Some(vec!["new"]));
        assert_eq!(hooked.remove(40), None);
    }
}
