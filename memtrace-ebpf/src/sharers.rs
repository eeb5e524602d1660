//! Which traced processes may still share pages copy-on-write, for the
//! page-fault programs: a write fault on a present read-only private page
//! copies it only while another address space still maps it; once no one
//! else does, the kernel reuses the page in place (`do_wp_page` ->
//! `wp_page_reuse`, mm/memory.c) and nothing is copied. (A kprobe or
//! `fexit` where the copy happens is not available here: `wp_page_copy` is
//! inlined, and `fexit` is refused on locked-down kernels.)
//!
//! A fork family is a process and the processes forked from it (and from
//! them), none of them exec'd since: only they can map each other's
//! private pages. Its live members are counted at fork, exec and exit
//! (`probes::sched`); a process alone in its family has no sharer. A
//! process with no family (traced from attach or launch, before its first
//! fork) is counted as before (it may share with processes forked before
//! tracing began).

use aya_ebpf::{bindings::BPF_ANY, macros::map, maps::HashMap};

use crate::{counters::add, maps::MAX_PROCESSES};

/// Fork family of each traced process: tgid -> the tgid of the process
/// that founded it (its first traced fork).
#[map]
pub static FAMILY_OF: HashMap<u32, u32> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// Live members of each fork family: founder tgid -> count.
#[map]
pub static FAMILY_LIVE: HashMap<u32, u64> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// `child` was forked (its own address space) from `parent`: it joins the
/// parent's family, founded now (with the parent as its first member) when
/// the parent has none. A full map only costs the exactness of its
/// copy-on-write count.
#[inline(always)]
pub fn forked(parent: u32, child: u32) {
    // SAFETY: the value is copied out at once.
    let family = match unsafe { FAMILY_OF.get(parent) }.copied() {
        Some(family) => family,
        None => {
            if FAMILY_OF.insert(parent, parent, BPF_ANY.into()).is_err()
                || FAMILY_LIVE.insert(parent, 1, BPF_ANY.into()).is_err()
            {
                return;
            }
            parent
        }
    };
    if FAMILY_OF.insert(child, family, BPF_ANY.into()).is_err() {
        return;
    }
    if let Some(live) = FAMILY_LIVE.get_ptr_mut(family) {
        // SAFETY: a live map value.
        unsafe { add(live, 1) };
    }
}

/// `tgid` left its family: it exited (its address space is gone by
/// `sched_process_exit`), or exec'd (a new address space, shared with no
/// one).
#[inline(always)]
pub fn left(tgid: u32) {
    // SAFETY: the value is copied out at once.
    let Some(family) = (unsafe { FAMILY_OF.get(tgid) }).copied() else {
        return;
    };
    let _ = FAMILY_OF.remove(tgid);
    if let Some(live) = FAMILY_LIVE.get_ptr_mut(family) {
        // SAFETY: a live map value; adding u64::MAX subtracts 1.
        unsafe { add(live, u64::MAX) };
    }
}

/// Whether another process may still map `tgid`'s private pages: another
/// live member of its family, or no family known.
#[inline(always)]
pub fn may_share(tgid: u32) -> bool {
    // SAFETY: the values are copied out at once.
    let Some(family) = (unsafe { FAMILY_OF.get(tgid) }).copied() else {
        return true;
    };
    // SAFETY: as above.
    unsafe { FAMILY_LIVE.get(family) }.is_none_or(|&live| live >= 2)
}
