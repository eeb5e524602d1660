//! Growth in file-backed pages, in the diagnosis step: a process whose RSS
//! grew mostly because pages of a mapped file became resident (page cache,
//! `RssFile`), which the kernel reclaims under memory pressure and which is
//! not the program's heap. Read from the RSS readings (the rise to the
//! high-water mark by kind of page: a file mapped, read and unmapped again
//! is a rise of file pages, not a spike of the heap) and the exact counters
//! (what was still resident at the end), and named by the paths that end in
//! a file-backed mapping frame.

use crate::aggregate::{ProcessReport, Report};
use crate::units::format_bytes;

use super::draft::{growth_too_small, too_few_readings, Draft};
use super::memory::{Basis, Memory};
use super::paths::{self, Kind, Rank};
use super::{function_name, Pattern, Scope, FILE_BACKED_SHARE, MIN_GROWTH_BYTES};

/// Growth of one process image by kind of page: net (growth minus release
/// over its life, from its exact counters) or to its high-water mark (from
/// its first reading to its highest one), 0 when it shrank.
#[derive(Clone, Copy, Debug)]
struct NetGrowth {
    file_bytes: u64,
    anon_bytes: u64,
    shmem_bytes: u64,
}

impl NetGrowth {
    /// Net growth over the image's life.
    fn net(p: &ProcessReport) -> Option<Self> {
        let c = p.counters?;
        Some(Self {
            file_bytes: c.file_growth_bytes.saturating_sub(c.file_release_bytes),
            anon_bytes: c.anon_growth_bytes.saturating_sub(c.anon_release_bytes),
            shmem_bytes: c.shmem_growth_bytes.saturating_sub(c.shmem_release_bytes),
        })
    }

    /// The rise from the first reading to the highest one.
    fn to_peak(p: &ProcessReport) -> Option<Self> {
        let first = p.timeline.first()?;
        let peak = p.timeline.iter().max_by_key(|pt| pt.rss_bytes)?;
        Some(Self {
            file_bytes: peak.file_bytes.saturating_sub(first.file_bytes),
            anon_bytes: peak.anon_bytes.saturating_sub(first.anon_bytes),
            shmem_bytes: peak.shmem_bytes.saturating_sub(first.shmem_bytes),
        })
    }

    /// The file-backed one of the net growth and the rise to the peak
    /// (the larger), if either is.
    fn of(p: &ProcessReport) -> Option<Self> {
        [Self::net(p), Self::to_peak(p)]
            .into_iter()
            .flatten()
            .filter(Self::is_file_backed)
            .max_by_key(|g| g.file_bytes)
    }

    /// Whether the growth is mostly file-backed: at least
    /// [`MIN_GROWTH_BYTES`] and [`FILE_BACKED_SHARE`] of all of it.
    fn is_file_backed(&self) -> bool {
        let all = self
            .file_bytes
            .saturating_add(self.anon_bytes)
            .saturating_add(self.shmem_bytes);
        self.file_bytes >= MIN_GROWTH_BYTES
            && self.file_bytes as f64 >= FILE_BACKED_SHARE * all as f64
    }
}

/// The basis `p`'s other findings read: its RSS without file-backed pages
/// when its growth is mostly file-backed, else its RSS.
pub(super) fn basis(p: &ProcessReport) -> Basis {
    if NetGrowth::of(p).is_some() {
        Basis::WithoutFile
    } else {
        Basis::Rss
    }
}

/// Pattern: `p`'s growth is mostly file-backed ([`NetGrowth::is_file_backed`]).
/// The finding says how much, which file and which function mapped it in,
/// that the kernel can reclaim it, and gives no advice to bound a cache.
pub(super) fn finding(report: &Report, p: &ProcessReport) -> Option<Draft> {
    let net = NetGrowth::of(p)?;
    let counters = p.counters?;
    let groups = paths::process_groups(report, p.id, Kind::FileBacked, Rank::Peak);
    let top = groups.first().map(|g| {
        let stack = g.top_stack();
        let file = paths::mapped_file(report, stack).unwrap_or("?").to_owned();
        (file, function_name(report, stack))
    });
    let (what, by) = match &top {
        Some((file, function)) => (
            format!("page cache of {file}"),
            format!(" mapped by {function}"),
        ),
        None => ("page cache of mapped files".to_owned(), String::new()),
    };
    let summary = format!(
        "RSS grew {} in file-backed pages ({what}){by}; the kernel can reclaim these under \
         memory pressure; it is not your heap",
        format_bytes(net.file_bytes)
    );
    let mut draft = Draft::new(
        Pattern::FileBackedGrowth,
        Scope::of(p),
        net.file_bytes,
        summary,
    );
    if let Some(memory) = Memory::of(p, Basis::Rss) {
        draft.evidence.push(memory.line(p));
    }
    if let (Some(first), Some(last)) = (p.timeline.first(), p.timeline.last()) {
        draft.evidence.push(format!(
            "file-backed RSS {} -> {}; anonymous RSS {} -> {}",
            format_bytes(first.file_bytes),
            format_bytes(last.file_bytes),
            format_bytes(first.anon_bytes),
            format_bytes(last.anon_bytes)
        ));
    }
    let released = counters.file_release_bytes;
    if released >= MIN_GROWTH_BYTES {
        draft.evidence.push(format!(
            "{} of file-backed pages left RSS before the end (unmapped or reclaimed): \
             not a release of the heap",
            format_bytes(released)
        ));
    }
    draft.evidence.push(format!(
        "exact file-backed growth {}, released {}; anonymous growth {}, released {}",
        format_bytes(counters.file_growth_bytes),
        format_bytes(counters.file_release_bytes),
        format_bytes(counters.anon_growth_bytes),
        format_bytes(counters.anon_release_bytes)
    ));
    draft.name_paths(&paths::describe_groups(report, p, &groups));
    draft.weak_if(growth_too_small("the file-backed growth", net.file_bytes));
    draft.weak_if(too_few_readings(p));
    let file = top
        .as_ref()
        .map_or("the mapped files", |(file, _)| file.as_str());
    draft.next_step = format!(
        "nothing to free in your heap: these are pages of {file} that the kernel keeps as cache \
         and drops when memory is needed; only if RSS itself must stay low (a monitor or a \
         limit that counts it) unmap the slices you are done with (mmap.close(), or \
         mmap.madvise(mmap.MADV_DONTNEED, start, length) on Python 3.8+) or read the file with \
         plain reads instead of mapping it"
    );
    Some(draft)
}
