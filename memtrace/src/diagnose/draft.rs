//! Shared by the pattern modules of the diagnosis step: the [`Draft`] a
//! finding is built as (its evidence lines, the code paths it names as
//! [`PathEvidence`], the reasons its evidence is weak), made a
//! [`Finding`] at the end.

use crate::aggregate::{ProcessReport, Report, StackId};
use crate::units::format_bytes;

use super::{
    seconds, Finding, Pattern, Scope, Strength, MIN_PATH_SAMPLES, MIN_TIMELINE_POINTS,
    MIN_TRACE_NS, STRONG_GROWTH_BYTES,
};

/// A finding being built: its weak reasons are kept apart until the end, and
/// `impact_bytes` (the memory it explains) ranks it.
#[derive(Debug)]
pub(super) struct Draft {
    pub(super) pattern: Pattern,
    pub(super) scope: Scope,
    pub(super) impact_bytes: u64,
    summary: String,
    pub(super) evidence: Vec<String>,
    pub(super) paths: Vec<StackId>,
    pub(super) next_step: String,
    pub(super) weak_reasons: Vec<String>,
}

impl Draft {
    /// A draft with no evidence, paths or weak reasons yet.
    pub(super) fn new(pattern: Pattern, scope: Scope, impact_bytes: u64, summary: String) -> Self {
        Self {
            pattern,
            scope,
            impact_bytes,
            summary,
            evidence: Vec::new(),
            paths: Vec::new(),
            next_step: String::new(),
            weak_reasons: Vec::new(),
        }
    }

    /// Records why the evidence is thin, if it is.
    pub(super) fn weak_if(&mut self, reason: Option<String>) {
        if let Some(reason) = reason {
            if !self.weak_reasons.contains(&reason) {
                self.weak_reasons.push(reason);
            }
        }
    }

    /// Names `paths` (ids and one evidence line each) and marks the draft
    /// weak when few samples stand behind them.
    pub(super) fn name_paths(&mut self, paths: &[PathEvidence]) {
        for path in paths {
            for stack in &path.stacks {
                if !self.paths.contains(stack) {
                    self.paths.push(*stack);
                }
            }
            self.evidence.push(path.line.clone());
        }
        let samples: u64 = paths.iter().map(|p| p.samples).sum();
        if paths.is_empty() {
            self.weak_if(Some("no sampled code path explains it".to_owned()));
        } else if samples < MIN_PATH_SAMPLES {
            self.weak_if(Some(format!(
                "only {samples} samples stand behind the named paths (< {MIN_PATH_SAMPLES}): \
                 record longer, or with a smaller --sample-bytes"
            )));
        }
    }

    /// The finished finding: weak when any reason was recorded, and then its
    /// last evidence line says why (once; the summary stays one sentence).
    pub(super) fn into_finding(mut self) -> Finding {
        let strength = if self.weak_reasons.is_empty() {
            Strength::Strong
        } else {
            let reasons = self.weak_reasons.join("; ");
            self.evidence.push(format!("weak evidence: {reasons}"));
            Strength::Weak
        };
        Finding {
            pattern: self.pattern,
            scope: self.scope,
            strength,
            summary: self.summary,
            evidence: self.evidence,
            paths: self.paths,
            next_step: self.next_step,
            amount_bytes: self.impact_bytes,
        }
    }
}

/// A code path named by a finding (the stacks that make it up, largest
/// first), with its evidence line.
#[derive(Clone, Debug)]
pub(super) struct PathEvidence {
    pub(super) stacks: Vec<StackId>,
    pub(super) samples: u64,
    pub(super) line: String,
}

/// Why the whole trace is too short for strong findings, if it is.
pub(super) fn trace_too_short(report: &Report) -> Option<String> {
    (report.meta.duration_ns < MIN_TRACE_NS).then(|| {
        format!(
            "the trace lasted {} (< {}): record longer",
            seconds(report.meta.duration_ns),
            seconds(MIN_TRACE_NS)
        )
    })
}

/// Why `growth_bytes` is too little for a strong finding, if it is.
pub(super) fn growth_too_small(what: &str, growth_bytes: u64) -> Option<String> {
    (growth_bytes < STRONG_GROWTH_BYTES).then(|| {
        format!(
            "{what} is {} (< {}): record longer, while it grows",
            format_bytes(growth_bytes),
            format_bytes(STRONG_GROWTH_BYTES)
        )
    })
}

/// Why `p`'s RSS readings are too few, if they are.
pub(super) fn too_few_readings(p: &ProcessReport) -> Option<String> {
    let readings = p.timeline.len();
    (readings < MIN_TIMELINE_POINTS).then(|| {
        format!(
            "{} has only {readings} RSS readings (< {MIN_TIMELINE_POINTS}): record longer",
            p.name()
        )
    })
}
