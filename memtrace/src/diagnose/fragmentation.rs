//! Diagnosis step, allocator mode (`--allocations`): a process whose
//! allocator holds the memory it freed (the allocations section's
//! [`Fragmentation`] note) gets a [`Pattern::AllocatorFragmentation`]
//! finding in place of its retention finding: the default mode sees the
//! pages stay, not whether the program or the allocator keeps them. Not
//! when the allocators' own bookkeeping, read by the census at the image's
//! end, says live objects hold most of its anonymous RSS: then the hooks
//! missed allocations that are still live (a native library's cache), and
//! calling them heap holes would send the reader to `malloc_trim`.

use super::{Finding, Pattern, Scope, Strength};
use crate::aggregate::{ProcessReport, Report};
use crate::allocations::{
    AllocationsReport, Fragmentation, ProcessAllocations, FRAGMENTATION_LIVE_FRACTION,
};
use crate::census::CensusReport;
use crate::units::format_bytes;

/// Adds a finding per process of `allocations` with a fragmentation note to
/// `findings`: it replaces a retention finding about an image of that
/// process (and takes its scope and code paths), or else comes first,
/// about its last image; none when the `census` of that image says live
/// objects hold the memory ([`census_says_live`]).
pub(super) fn add_findings(
    report: &Report,
    allocations: &AllocationsReport,
    census: &CensusReport,
    findings: &mut Vec<Finding>,
) {
    for process in &allocations.processes {
        let Some(note) = &process.fragmentation else {
            continue;
        };
        let is_image = |scope: &Scope| image_of(report, process, *scope).is_some();
        let retention = findings
            .iter()
            .position(|f| f.pattern == Pattern::Retention && is_image(&f.scope));
        let Some(row) = retention
            .and_then(|i| image_of(report, process, findings[i].scope))
            .or_else(|| last_image(report, process))
        else {
            continue;
        };
        if census_says_live(census, row) {
            continue;
        }
        let paths = retention.map(|i| findings.remove(i).paths);
        let finding = finding(row, note, Scope::of(row), paths.unwrap_or_default());
        findings.insert(retention.unwrap_or(0), finding);
    }
}

/// Whether the last census of `row` says live objects (pymalloc's live
/// blocks, glibc's chunks in use) hold at least
/// [`FRAGMENTATION_LIVE_FRACTION`] of its anonymous RSS.
fn census_says_live(census: &CensusReport, row: &ProcessReport) -> bool {
    census
        .image(row.id)
        .and_then(|image| image.latest.as_ref())
        .is_some_and(|reading| {
            reading.census.live_bytes() as f64
                >= FRAGMENTATION_LIVE_FRACTION * reading.rss_anon_bytes as f64
        })
}

/// The image `scope` is about, when it is an image of the process
/// `process` is (its tgid and start time; an execve keeps both).
fn image_of<'a>(
    report: &'a Report,
    process: &ProcessAllocations,
    scope: Scope,
) -> Option<&'a ProcessReport> {
    let Scope::Process { process: id, .. } = scope else {
        return None;
    };
    report
        .process(id)
        .filter(|p| p.tgid == process.tgid && p.start_time_ns == process.start_time_ns)
}

/// The report's last image of the process `process` is (its tgid and start
/// time): the one its allocator report ends with.
fn last_image<'a>(report: &'a Report, process: &ProcessAllocations) -> Option<&'a ProcessReport> {
    report
        .processes
        .iter()
        .rfind(|p| p.tgid == process.tgid && p.start_time_ns == process.start_time_ns)
}

/// The finding about `row`, from its allocator's numbers.
fn finding(
    row: &ProcessReport,
    note: &Fragmentation,
    scope: Scope,
    paths: Vec<crate::aggregate::StackId>,
) -> Finding {
    Finding {
        pattern: Pattern::AllocatorFragmentation,
        scope,
        strength: Strength::Strong,
        summary: format!(
            "{} keeps {} of anonymous RSS it gained, but its live objects are {}: its \
             allocator holds {} it freed",
            row.name(),
            format_bytes(note.rss_anon_retained_bytes),
            format_bytes(note.live_bytes),
            format_bytes(note.held_free_bytes)
        ),
        evidence: vec![
            format!(
                "anonymous RSS {} at the end, {} of it gained while traced",
                format_bytes(note.rss_anon_end_bytes),
                format_bytes(note.rss_anon_retained_bytes)
            ),
            format!(
                "sampled live bytes at the end {}; freed {} in pymalloc-sized blocks, {} in \
                 glibc blocks",
                format_bytes(note.live_bytes),
                format_bytes(note.freed_pymalloc_bytes),
                format_bytes(note.freed_glibc_bytes)
            ),
        ],
        paths,
        next_step: note.remedy(),
        amount_bytes: note.held_free_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::allocations::{FragmentationKind, HookStatus, KernelAllocStats};
    use crate::diagnose::tests::report_with_retention;
    use crate::diagnose::{diagnose, diagnose_with_allocations};

    /// Allocator mode's report of process (`tgid`, `start_time_ns`), with a
    /// pymalloc fragmentation note when `fragmented`.
    fn allocations(tgid: u32, start_time_ns: u64, fragmented: bool) -> AllocationsReport {
        let note = Fragmentation {
            kind: FragmentationKind::PymallocArenas,
            rss_anon_end_bytes: 220 * MIB,
            rss_anon_retained_bytes: 200 * MIB,
            live_bytes: 6 * MIB,
            held_free_bytes: 194 * MIB,
            freed_pymalloc_bytes: 190 * MIB,
            freed_glibc_bytes: 0,
        };
        AllocationsReport {
            sample_interval_bytes: 512 * 1024,
            temporary_ns: 1_000_000_000,
            kernel: KernelAllocStats::default(),
            processes: vec![ProcessAllocations {
                tgid,
                start_time_ns,
                hook: HookStatus::Pending,
                sampled_allocations: 0,
                untracked_allocations: 0,
                allocated_bytes: 0,
                leaked_bytes: 6 * MIB,
                peak_bytes: 0,
                rss_anon_growth_bytes: 200 * MIB,
                rss_anon_end_bytes: Some(220 * MIB),
                inlined_allocator_suspected: false,
                fragmentation: fragmented.then_some(note),
                paths: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_fragmented_process_gets_its_finding_in_place_of_retention() {
        let (report, _) = report_with_retention();
        let plain = diagnose(report.clone());
        let retention = plain
            .diagnosis
            .iter()
            .find(|f| f.pattern == Pattern::Retention)
            .unwrap();
        let Scope::Process { process, tgid } = retention.scope else {
            panic!("retention about the tree");
        };
        let start = report.process(process).unwrap().start_time_ns;

        let diagnosed =
            diagnose_with_allocations(report.clone(), Some(allocations(tgid, start, true)));
        let about: Vec<&Finding> = diagnosed
            .diagnosis
            .iter()
            .filter(|f| f.scope == retention.scope)
            .collect();
        assert!(about.iter().all(|f| f.pattern != Pattern::Retention));
        let finding = about
            .iter()
            .find(|f| f.pattern == Pattern::AllocatorFragmentation)
            .expect("a fragmentation finding");
        assert_eq!(finding.paths, retention.paths);
        assert!(finding.summary.contains("194.0 MiB"), "{}", finding.summary);
        assert!(finding.next_step.contains("pymalloc arenas pinned"));
        assert_eq!(diagnosed.diagnosis.len(), plain.diagnosis.len());

        // Without a note, the diagnosis is the default mode's.
        let kept = diagnose_with_allocations(report, Some(allocations(tgid, start, false)));
        assert_eq!(kept.diagnosis, plain.diagnosis);
    }

    #[test]
    fn memory_the_census_finds_live_is_not_called_heap_holes() {
        let (report, retention) = report_with_retention();
        let Scope::Process { process, tgid } = retention.scope else {
            panic!("retention about the tree");
        };
        let start = report.process(process).unwrap().start_time_ns;
        // glibc's own chunk headers: 180 MiB in use of 200 MiB anonymous
        // RSS (a native library's page cache the hooks did not see).
        let mut image = crate::census::ImageCensus::new(process, tgid);
        let glibc = crate::census::glibc::GlibcCensus {
            arenas: vec![crate::census::glibc::ArenaCensus {
                main: true,
                in_use_bytes: 180 * MIB,
                ..Default::default()
            }],
            mmapped_bytes: 0,
        };
        let census = crate::census::Census {
            glibc: Some(glibc),
            ..Default::default()
        };
        image.add(census, 200 * MIB);
        let census = CensusReport {
            images: vec![image],
        };
        let diagnosed = crate::diagnose::diagnose_with_census(
            report,
            Some(allocations(tgid, start, true)),
            census,
        );
        let finding = diagnosed
            .diagnosis
            .iter()
            .find(|f| f.scope == retention.scope)
            .unwrap();
        assert_eq!(finding.pattern, Pattern::Retention, "{finding:#?}");
        assert!(
            diagnosed
                .diagnosis
                .iter()
                .all(|f| f.pattern != Pattern::AllocatorFragmentation),
            "{:#?}",
            diagnosed.diagnosis
        );
    }
}
