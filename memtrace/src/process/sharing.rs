//! Step 3 of the data flow: PSS and USS reads from `/proc/PID/smaps_rollup`,
//! paced per process. The kernel walks every page table of the process for
//! such a read (about 10 µs per MiB of 4 KiB-page RSS, measured on 6.18) and
//! holds its `mmap_lock` meanwhile, so the process's own mmap, munmap, brk
//! and mprotect wait (page faults do not: they take per-VMA locks). Reads of
//! one process are spaced so that they take at most 1% of its time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{proc, Sharing};

/// Least time between two reads of one process.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Time between two reads of one process, at least, as a multiple of how
/// long its last read took: 100, so reads hold its `mmap_lock` at most 1% of
/// the time (1 s up to about 1 GiB of RSS, 4 s at 4 GiB).
const INTERVAL_PER_READ_TIME: u32 = 100;

/// When each live process (by tgid) was last read and how long that took.
#[derive(Debug, Default)]
pub struct SharingReader {
    last: HashMap<u32, (Instant, Duration)>,
}

impl SharingReader {
    /// PSS and USS of process `tgid`, unless it was read too recently (see
    /// the module doc) or cannot be read (exited, a zombie).
    pub fn read(&mut self, tgid: u32) -> Option<Sharing> {
        if let Some((at, took)) = self.last.get(&tgid) {
            if at.elapsed() < (*took * INTERVAL_PER_READ_TIME).max(MIN_INTERVAL) {
                return None;
            }
        }
        self.read_now(tgid)
    }

    /// PSS and USS of process `tgid` now, whenever it was last read (a
    /// process entering the trace, the end of the trace).
    pub fn read_now(&mut self, tgid: u32) -> Option<Sharing> {
        let started = Instant::now();
        let sharing = proc::sharing(tgid).ok();
        self.last.insert(tgid, (started, started.elapsed()));
        sharing
    }

    /// Forgets when process `tgid` was last read, so its next [`read`]
    /// happens whatever the pacing: it exited (the tgid may be reused), or
    /// it forked (its pages are shared with the child from then on).
    ///
    /// [`read`]: SharingReader::read
    pub fn forget(&mut self, tgid: u32) {
        self.last.remove(&tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_not_read_again_within_the_interval() {
        let mut reader = SharingReader::default();
        let me = std::process::id();
        assert!(reader.read(me).is_some(), "the first read happens");
        assert!(reader.read(me).is_none(), "a second one waits");
        assert!(reader.read_now(me).is_some(), "unless asked for now");
        reader.forget(me);
        assert!(reader.read(me).is_some());
        assert!(reader.read(4_999_999).is_none(), "no such process");
    }
}
