//! Diagnosis step, default mode: what the allocators' census (`census`,
//! read from outside the process) says of the memory a process keeps. A
//! retention or unmatched-growth finding whose process's last census shows
//! that live objects hold less than half of its anonymous RSS, and the
//! allocators at least [`FRAGMENTATION_MIN_GAP_BYTES`] of freed memory,
//! becomes a [`Pattern::AllocatorFragmentation`] finding naming the
//! allocator and its remedies ("bound that cache" is for memory live
//! objects hold); any other finding about a censused process gets the
//! census as an evidence line, so a leak says how much live objects hold.

use super::{Finding, Pattern, Scope, Strength};
use crate::aggregate::{ProcessReport, Report};
use crate::allocations::{
    Fragmentation, FragmentationKind, FRAGMENTATION_LIVE_FRACTION, FRAGMENTATION_MIN_GAP_BYTES,
};
use crate::census::{CensusReport, Reading};
use crate::units::format_bytes;

/// A thread arena counts as holding freed memory from this many resident
/// free bytes: 1 MiB.
const THREAD_ARENA_FREE_BYTES: u64 = 1 << 20;

/// Applies `census` to `findings` (see the module docs).
pub(super) fn apply(report: &Report, census: &CensusReport, findings: &mut [Finding]) {
    let fragmented: Vec<Scope> = findings
        .iter()
        .filter(|f| f.pattern == Pattern::AllocatorFragmentation)
        .map(|f| f.scope)
        .collect();
    for finding in findings.iter_mut() {
        let Scope::Process { process, .. } = finding.scope else {
            continue;
        };
        let (Some(row), Some(image)) = (report.process(process), census.image(process)) else {
            continue;
        };
        let Some(reading) = &image.latest else {
            continue;
        };
        let replaceable = matches!(
            finding.pattern,
            Pattern::Retention | Pattern::UnmatchedGrowth
        );
        match fragmentation(reading) {
            Some(note) if replaceable && !fragmented.contains(&finding.scope) => {
                *finding = fragmentation_finding(row, reading, &note, finding);
            }
            _ => finding.evidence.push(census_line(reading)),
        }
    }
}

/// The allocators' share when they, not live objects, hold the memory.
fn fragmentation(reading: &Reading) -> Option<Fragmentation> {
    let census = &reading.census;
    let live = census.live_bytes();
    let free = census.held_free_bytes();
    let allocator_holds = free >= FRAGMENTATION_MIN_GAP_BYTES
        && (live as f64) < FRAGMENTATION_LIVE_FRACTION * reading.rss_anon_bytes as f64;
    if !allocator_holds {
        return None;
    }
    let glibc = census.glibc.as_ref();
    let thread_free = glibc.map_or(
        0,
        crate::census::glibc::GlibcCensus::thread_arena_free_resident_bytes,
    );
    let main_free = census.glibc_free_bytes() - thread_free;
    let pymalloc_free = census.pymalloc_free_bytes();
    let kind = if pymalloc_free >= thread_free.max(main_free) {
        FragmentationKind::PymallocArenas
    } else if thread_free >= main_free {
        let threads = glibc.map_or(0, |g| {
            g.arenas
                .iter()
                .filter(|a| !a.main && a.free_resident_bytes >= THREAD_ARENA_FREE_BYTES)
                .count() as u64
        });
        FragmentationKind::GlibcThreadArenas { threads }
    } else {
        FragmentationKind::GlibcHeap
    };
    Some(Fragmentation {
        kind,
        rss_anon_end_bytes: reading.rss_anon_bytes,
        rss_anon_retained_bytes: reading.rss_anon_bytes,
        live_bytes: live,
        held_free_bytes: free,
        freed_pymalloc_bytes: pymalloc_free,
        freed_glibc_bytes: census.glibc_free_bytes(),
    })
}

/// Which allocator keeps the memory, in words.
fn holder(kind: &FragmentationKind) -> &'static str {
    match kind {
        FragmentationKind::PymallocArenas => "pymalloc arenas pinned by survivors",
        FragmentationKind::GlibcThreadArenas { .. } => "glibc per-thread arenas",
        FragmentationKind::GlibcHeap => "free chunks of glibc's heap",
    }
}

/// The finding that replaces `old`: the allocator holds the memory.
fn fragmentation_finding(
    row: &ProcessReport,
    reading: &Reading,
    note: &Fragmentation,
    old: &Finding,
) -> Finding {
    let mut evidence = vec![census_line(reading)];
    evidence.extend(old.evidence.iter().take(1).cloned());
    Finding {
        pattern: Pattern::AllocatorFragmentation,
        scope: old.scope,
        strength: Strength::Strong,
        summary: format!(
            "{} keeps {} of anonymous RSS, but live objects hold {}: the allocator holds {} \
             of freed memory ({})",
            row.name(),
            format_bytes(reading.rss_anon_bytes),
            format_bytes(note.live_bytes),
            format_bytes(note.held_free_bytes),
            holder(&note.kind)
        ),
        evidence,
        paths: old.paths.clone(),
        next_step: note.remedy(),
        amount_bytes: note.held_free_bytes,
    }
}

/// One evidence line: what the last census read, what it cost, how torn.
fn census_line(reading: &Reading) -> String {
    let census = &reading.census;
    let mut line = format!(
        "allocator census (read from outside, {} in {:.0} ms, the last before its end): live \
         objects hold {} of {} anonymous RSS",
        format_bytes(census.read_bytes),
        census.elapsed_ns as f64 / 1e6,
        format_bytes(census.live_bytes()),
        format_bytes(reading.rss_anon_bytes)
    );
    if let Some(p) = &census.pymalloc {
        line.push_str(&format!(
            "; pymalloc {} arenas, {} live, {} free in its pools",
            p.arenas,
            format_bytes(p.live_bytes),
            format_bytes(p.free_bytes())
        ));
    }
    if census.mimalloc {
        line.push_str(
            "; CPython's objects are in mimalloc's heaps (a free-threaded build), not read",
        );
    }
    if let Some(g) = &census.glibc {
        line.push_str(&format!(
            "; glibc {} arena(s), {} in use, {} free and resident ({} in thread arenas)",
            g.arenas.len(),
            format_bytes(g.in_use_bytes()),
            format_bytes(g.free_resident_bytes()),
            format_bytes(g.thread_arena_free_resident_bytes())
        ));
        let resyncs: u64 = g.arenas.iter().map(|a| a.resyncs).sum();
        let unknown: u64 = g.arenas.iter().map(|a| a.unknown_bytes).sum();
        if resyncs > 0 {
            line.push_str(&format!(
                " ({resyncs} torn header(s) resynced, {} unknown)",
                format_bytes(unknown)
            ));
        }
    }
    if let Some(invalid) = census
        .pymalloc
        .as_ref()
        .map(|p| p.invalid_pools)
        .filter(|&n| n > 0)
    {
        line.push_str(&format!(" ({invalid} torn pool header(s) left out)"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::census::glibc::{ArenaCensus, GlibcCensus};
    use crate::census::pymalloc::PymallocCensus;
    use crate::census::{Census, ImageCensus};
    use crate::diagnose::diagnose_with_census;
    use crate::diagnose::tests::report_with_retention;

    /// A census of `live` bytes in use, `thread_free` free in one thread
    /// arena and `pymalloc_free` free in pymalloc's pools.
    fn census(live: u64, thread_free: u64, pymalloc_free: u64) -> Census {
        let arena = |main: bool, in_use: u64, free: u64| ArenaCensus {
            main,
            in_use_bytes: in_use,
            free_bytes: free,
            free_resident_bytes: free,
            ..ArenaCensus::default()
        };
        Census {
            pymalloc: Some(PymallocCensus {
                arenas: 1,
                live_bytes: MIB,
                free_in_used_pools_bytes: pymalloc_free,
                ..PymallocCensus::default()
            }),
            glibc: Some(GlibcCensus {
                arenas: vec![arena(true, live - MIB, 0), arena(false, 0, thread_free)],
                mmapped_bytes: 0,
            }),
            ..Census::default()
        }
    }

    fn with(report: &Report, scope: Scope, census: Census, rss_anon: u64) -> Vec<Finding> {
        let Scope::Process { process, tgid } = scope else {
            panic!("retention about the tree");
        };
        let mut image = ImageCensus::new(process, tgid);
        image.add(census, rss_anon);
        let census = CensusReport {
            images: vec![image],
        };
        diagnose_with_census(report.clone(), None, census).diagnosis
    }

    #[test]
    fn memory_held_by_thread_arenas_is_the_allocators_not_a_cache() {
        let (report, retention) = report_with_retention();
        let findings = with(
            &report,
            retention.scope,
            census(10 * MIB, 300 * MIB, 0),
            320 * MIB,
        );
        let finding = findings
            .iter()
            .find(|f| f.scope == retention.scope)
            .unwrap();
        assert_eq!(
            finding.pattern,
            Pattern::AllocatorFragmentation,
            "{finding:#?}"
        );
        assert!(
            finding.summary.contains("live objects hold 10.0 MiB"),
            "{}",
            finding.summary
        );
        assert!(
            finding.summary.contains("glibc per-thread arenas"),
            "{}",
            finding.summary
        );
        assert!(
            finding.next_step.contains("MALLOC_ARENA_MAX"),
            "{}",
            finding.next_step
        );
        assert_eq!(finding.paths, retention.paths);
    }

    #[test]
    fn pymalloc_free_pools_name_the_survivors() {
        let (report, retention) = report_with_retention();
        let findings = with(
            &report,
            retention.scope,
            census(8 * MIB, 0, 200 * MIB),
            220 * MIB,
        );
        let finding = findings
            .iter()
            .find(|f| f.scope == retention.scope)
            .unwrap();
        assert!(finding
            .summary
            .contains("pymalloc arenas pinned by survivors"));
        assert!(!finding.next_step.contains("bound that cache"));
    }

    #[test]
    fn memory_live_objects_hold_stays_retention_with_the_census_said() {
        let (report, retention) = report_with_retention();
        let findings = with(
            &report,
            retention.scope,
            census(200 * MIB, 40 * MIB, 0),
            250 * MIB,
        );
        let finding = findings
            .iter()
            .find(|f| f.scope == retention.scope)
            .unwrap();
        assert_eq!(finding.pattern, Pattern::Retention);
        assert_eq!(finding.next_step, retention.next_step);
        let line = finding.evidence.last().unwrap();
        assert!(
            line.contains("live objects hold 200.0 MiB of 250.0 MiB"),
            "{line}"
        );
    }
}
