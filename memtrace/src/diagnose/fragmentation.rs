//! Diagnosis step, allocator mode (`--allocations`): a process whose
//! allocator holds the memory it freed (the allocations section's
//! [`Fragmentation`] note) gets a [`Pattern::AllocatorFragmentation`]
//! finding in place of its retention finding: the default mode sees the
//! pages stay, not whether the program or the allocator keeps them.

use super::{Finding, Pattern, Scope, Strength};
use crate::aggregate::{ProcessReport, Report};
use crate::allocations::{AllocationsReport, Fragmentation, ProcessAllocations};
use crate::units::format_bytes;

/// Adds a finding per process of `allocations` with a fragmentation note to
/// `findings`: it replaces a retention finding about that process (and
/// takes its code paths), or else comes first.
pub(super) fn add_findings(
    report: &Report,
    allocations: &AllocationsReport,
    findings: &mut Vec<Finding>,
) {
    for process in &allocations.processes {
        let Some(note) = &process.fragmentation else {
            continue;
        };
        let Some(row) = last_image(report, process) else {
            continue;
        };
        let scope = Scope::of(row);
        let retention = findings
            .iter()
            .position(|f| f.pattern == Pattern::Retention && f.scope == scope);
        let paths = retention.map(|i| findings.remove(i).paths);
        let finding = finding(row, note, scope, paths.unwrap_or_default());
        findings.insert(retention.unwrap_or(0), finding);
    }
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
    }
}
