//! The CI gate, after the diagnosis: whether a diagnosed report trips
//! `--fail-above` (a traced process's peak RSS above a size) or
//! `--fail-on-cause` (a strong cause of the verdict of a given pattern), and
//! the one line that says why. `record`, `run` and `report` exit with
//! [`GATE_EXIT_STATUS`] when it trips.

use super::{Diagnosed, Pattern, Strength};
use crate::units::format_bytes;

/// memtrace's exit status when the gate trips: distinct from 0, 1
/// (memtrace's own errors), 2 (usage errors), 126-128+N (a shell's and
/// `run`'s command killed by a signal), so CI can tell it apart.
pub const GATE_EXIT_STATUS: u8 = 86;

/// What trips the gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// `--fail-above`: the highest peak RSS any traced process image may
    /// reach, bytes.
    pub fail_above_bytes: Option<u64>,
    /// `--fail-on-cause`: patterns that trip the gate when a strong cause of
    /// the verdict shows them (as its pattern or one it also shows); `None`
    /// in the list stands for any pattern but "no growth".
    pub fail_on_causes: Vec<Option<Pattern>>,
}

impl Gate {
    /// Why `report` trips the gate, in one line; `None` when it passes.
    /// The peak RSS is each image's [`crate::aggregate::RssSummary`]
    /// `peak_bytes` (the process table's PEAK).
    pub fn check(&self, report: &Diagnosed) -> Option<String> {
        let mut reasons = Vec::new();
        if let Some(limit) = self.fail_above_bytes {
            let highest = report
                .processes
                .iter()
                .filter_map(|p| p.rss.as_ref().map(|rss| (p, rss.peak_bytes)))
                .max_by_key(|&(_, peak)| peak);
            if let Some((process, peak)) = highest.filter(|&(_, peak)| peak > limit) {
                reasons.push(format!(
                    "{} peaked at {} of RSS, above --fail-above {}",
                    process.name(),
                    format_bytes(peak),
                    format_bytes(limit)
                ));
            }
        }
        let tripped = report.causes.iter().find(|cause| {
            cause.strength == Strength::Strong
                && std::iter::once(&cause.pattern)
                    .chain(&cause.also_patterns)
                    .any(|&pattern| self.trips_on(pattern))
        });
        if let Some(cause) = tripped {
            reasons.push(format!(
                "a strong cause of the verdict is {} (--fail-on-cause)",
                cause_name(cause.pattern)
            ));
        }
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// Whether a strong cause of `pattern` trips `--fail-on-cause`.
    fn trips_on(&self, pattern: Pattern) -> bool {
        self.fail_on_causes.iter().any(|wanted| match wanted {
            Some(wanted) => *wanted == pattern,
            None => pattern != Pattern::NoGrowth,
        })
    }
}

/// The `--fail-on-cause` value of `pattern`.
pub fn cause_name(pattern: Pattern) -> &'static str {
    match pattern {
        Pattern::OneProcessGrows => "one-process-grows",
        Pattern::EveryWorkerLarge => "every-worker-large",
        Pattern::WorkerMultiplication => "worker-multiplication",
        Pattern::Spike => "spike",
        Pattern::Retention => "retention",
        Pattern::FileBackedGrowth => "file-backed-growth",
        Pattern::CowUnsharing => "cow-unsharing",
        Pattern::UnmatchedGrowth => "unmatched-growth",
        Pattern::AllocatorFragmentation => "allocator-fragmentation",
        Pattern::NoGrowth => "no-growth",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::report::fixtures::lifecycle_diagnosed;

    #[test]
    fn a_peak_above_the_limit_trips_and_names_the_process() {
        // The fixture's highest peak: tgid 202, image 0, 90 MiB.
        let report = lifecycle_diagnosed();
        let gate = |bytes| Gate {
            fail_above_bytes: Some(bytes),
            ..Gate::default()
        };
        assert_eq!(gate(90 * MIB).check(&report), None);
        assert_eq!(
            gate(90 * MIB - 1).check(&report).unwrap(),
            "tgid 202, image 0 peaked at 90.0 MiB of RSS, above --fail-above 90.0 MiB"
        );
        assert_eq!(gate(1024 * MIB).check(&report), None);
    }

    #[test]
    fn only_a_strong_cause_of_the_pattern_trips() {
        let mut report = lifecycle_diagnosed();
        let first = report
            .causes
            .first()
            .expect("the fixture has a cause")
            .pattern;
        let gate = |patterns: Vec<Option<Pattern>>| Gate {
            fail_on_causes: patterns,
            ..Gate::default()
        };
        for cause in &mut report.causes {
            cause.strength = Strength::Weak;
        }
        assert_eq!(gate(vec![Some(first)]).check(&report), None);
        assert_eq!(gate(vec![None]).check(&report), None);
        report.causes[0].strength = Strength::Strong;
        let reason = gate(vec![Some(first)]).check(&report).unwrap();
        assert_eq!(
            reason,
            format!(
                "a strong cause of the verdict is {} (--fail-on-cause)",
                cause_name(first)
            )
        );
        assert!(gate(vec![None]).check(&report).is_some());
        let other = [Pattern::AllocatorFragmentation, Pattern::FileBackedGrowth]
            .into_iter()
            .find(|p| *p != first && !report.causes[0].also_patterns.contains(p))
            .unwrap();
        assert_eq!(gate(vec![Some(other)]).check(&report), None);
        assert_eq!(Gate::default().check(&report), None);
    }
}
