//! Copy-on-write un-sharing, in the diagnosis step: forked workers whose
//! RSS stays flat while their private memory (USS, from
//! /proc/PID/smaps_rollup) grows, because writes to pages inherited from
//! the master copy them (exact copy-on-write fault counters). In CPython
//! merely reading an object writes its reference count, so walking shared
//! data is enough. The finding comes first (see [`super::findings`]) and
//! names the code that writes to the inherited pages.

use std::collections::BTreeMap;

use crate::aggregate::{ProcessId, ProcessKind, ProcessReport, Report};
use crate::units::format_bytes;

use super::draft::{growth_too_small, too_few_readings, Draft};
use super::{
    function_name, listed, median, paths, tree, Pattern, Scope, COW_FAULT_SHARE,
    COW_FLAT_RSS_FRACTION, MIN_GROWTH_BYTES,
};

/// How one forked worker's memory changed.
#[derive(Clone, Copy, Debug)]
struct Unsharing<'a> {
    worker: &'a ProcessReport,
    /// USS at its start: 0 for a fork the trace saw (right after fork every
    /// inherited page is shared with the parent, so none is private; the
    /// first smaps_rollup read comes up to a tick later, possibly after the
    /// un-sharing), else its first read.
    start_uss_bytes: u64,
    /// Its first USS read.
    first_uss_bytes: u64,
    /// Whether the trace saw its fork.
    forked: bool,
    /// USS at its last read.
    end_uss_bytes: u64,
    /// RSS at its start (inherited at fork) and end (the table's numbers).
    start_rss_bytes: u64,
    /// See `start_rss_bytes`.
    end_rss_bytes: u64,
    /// Exact copy-on-write fault bytes.
    cow_fault_bytes: u64,
}

impl<'a> Unsharing<'a> {
    /// `w`'s numbers when it is a forked worker with RSS, counters and a
    /// PSS/USS reading that stands for its end.
    fn of(report: &Report, w: &'a ProcessReport) -> Option<Self> {
        if w.kind != ProcessKind::Worker || w.parent.is_none() || w.previous_image.is_some() {
            return None;
        }
        let (sharing, rss, counters) = (w.sharing?, w.rss?, w.counters?);
        let forked = tree::is_observed_fork(report, w);
        Some(Self {
            worker: w,
            start_uss_bytes: if forked { 0 } else { sharing.start_uss_bytes },
            first_uss_bytes: sharing.start_uss_bytes,
            forked,
            end_uss_bytes: sharing.end_uss()?,
            start_rss_bytes: rss.start_bytes,
            end_rss_bytes: rss.end_bytes,
            cow_fault_bytes: counters.cow_fault_bytes,
        })
    }

    /// Its USS at its start, for evidence: `0 B at fork (first read X)`
    /// or `X`.
    fn start_text(&self) -> String {
        if self.forked {
            format!(
                "{} at fork (first read {})",
                format_bytes(self.start_uss_bytes),
                format_bytes(self.first_uss_bytes)
            )
        } else {
            format_bytes(self.start_uss_bytes)
        }
    }

    /// How much its private memory grew.
    fn uss_growth_bytes(&self) -> u64 {
        self.end_uss_bytes.saturating_sub(self.start_uss_bytes)
    }

    /// Whether it is un-sharing: its USS grew at least [`MIN_GROWTH_BYTES`],
    /// its RSS stayed flat ([`COW_FLAT_RSS_FRACTION`]) and copy-on-write
    /// faults made at least [`COW_FAULT_SHARE`] of the USS growth.
    fn is_unsharing(&self) -> bool {
        let uss_growth = self.uss_growth_bytes();
        let rss_growth = self.end_rss_bytes.saturating_sub(self.start_rss_bytes);
        uss_growth >= MIN_GROWTH_BYTES
            && rss_growth as f64 <= COW_FLAT_RSS_FRACTION * self.end_rss_bytes as f64
            && self.cow_fault_bytes as f64 >= COW_FAULT_SHARE * uss_growth as f64
    }
}

/// The copy-on-write un-sharing findings (one per parent whose forked
/// workers un-share), and the workers they cover.
pub(super) fn findings(report: &Report) -> (Vec<Draft>, Vec<ProcessId>) {
    let mut by_parent: BTreeMap<ProcessId, Vec<Unsharing<'_>>> = BTreeMap::new();
    for unsharing in report
        .processes
        .iter()
        .filter_map(|w| Unsharing::of(report, w))
        .filter(Unsharing::is_unsharing)
    {
        if let Some(parent) = unsharing.worker.parent {
            by_parent.entry(parent).or_default().push(unsharing);
        }
    }
    let mut drafts = Vec::new();
    let mut covered = Vec::new();
    for (parent, mut workers) in by_parent {
        workers.sort_by_key(|u| (u.worker.started_ns, u.worker.id));
        covered.extend(workers.iter().map(|u| u.worker.id));
        drafts.push(finding(report, parent, &workers));
    }
    (drafts, covered)
}

/// Lower median of `f` over `workers`.
fn median_by<'a>(workers: &[Unsharing<'a>], f: impl Fn(&Unsharing<'a>) -> u64) -> u64 {
    median(&workers.iter().map(f).collect::<Vec<_>>())
}

/// The finding about `workers`, forked from `parent`, un-sharing its pages.
fn finding(report: &Report, parent: ProcessId, workers: &[Unsharing<'_>]) -> Draft {
    let ids: Vec<ProcessId> = workers.iter().map(|u| u.worker.id).collect();
    let unshared = median_by(workers, Unsharing::uss_growth_bytes);
    let cow_paths = paths::cow_paths(report, &ids);
    let writer = cow_paths
        .first()
        .and_then(|p| p.stacks.first())
        .map(|&stack| function_name(report, stack));
    let who = match workers.len() {
        1 => "1 worker un-shared".to_owned(),
        n => format!("{n} workers each un-shared"),
    };
    let mut summary = format!(
        "copy-on-write un-sharing: {who} ~{} of pages inherited from the master ({}) (USS {} \
         -> {} while RSS stayed {})",
        format_bytes(unshared),
        report.name(parent),
        format_bytes(median_by(workers, |u| u.start_uss_bytes)),
        format_bytes(median_by(workers, |u| u.end_uss_bytes)),
        format_bytes(median_by(workers, |u| u.end_rss_bytes)),
    );
    if let Some(function) = &writer {
        summary.push_str(&format!(", written by {function}"));
    }
    let impact: u64 = workers.iter().map(Unsharing::uss_growth_bytes).sum();
    let mut draft = Draft::new(Pattern::CowUnsharing, Scope::Tree, impact, summary);
    draft.evidence.push(format!(
        "per worker: {}",
        listed(
            &workers
                .iter()
                .map(|u| format!(
                    "{} USS {} -> {}, RSS {} -> {}, {} copy-on-write (exact)",
                    u.worker.name(),
                    u.start_text(),
                    format_bytes(u.end_uss_bytes),
                    format_bytes(u.start_rss_bytes),
                    format_bytes(u.end_rss_bytes),
                    format_bytes(u.cow_fault_bytes)
                ))
                .collect::<Vec<_>>()
        )
    ));
    let tree_pss = format_bytes(report.totals.peak_total_pss_bytes);
    draft.evidence.push(format!(
        "tree PSS (shared pages counted once) is {tree_pss} at its highest; summed RSS, which \
         counts a shared page once per process, is {}",
        format_bytes(report.totals.peak_total_rss_bytes)
    ));
    draft.name_paths(&cow_paths);
    draft.weak_if(growth_too_small("the median un-shared memory", unshared));
    for u in workers {
        draft.weak_if(too_few_readings(u.worker));
    }
    let writes = writer.as_deref().map_or_else(
        || "the workers touch objects".to_owned(),
        |function| format!("{function} touches objects"),
    );
    draft.next_step = format!(
        "gc.freeze() (Python 3.7+) before fork stops the cyclic GC's writes to the GC headers \
         of inherited objects, but reference-count writes still un-share a page whenever a \
         worker touches an object on it (here {writes}); what helps: keep read-mostly shared \
         data in buffers without per-object headers (bytes/bytearray, array, numpy, mmap of a \
         file, multiprocessing.shared_memory), load it after fork in each worker if it is \
         small, or run fewer workers with more threads; tree PSS (shared pages counted once) \
         is {tree_pss}"
    );
    draft
}
