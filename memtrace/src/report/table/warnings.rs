//! The terminal's warning lines (report step, table renderer): repeated
//! warnings of one kind folded into one line with a count, so a run with
//! many processes or stack-unwinding reasons keeps the verdict on screen;
//! `--verbose` and the JSON list every warning.

use crate::aggregate::Warning;

/// Most warnings of one kind named before the rest are counted.
const NAMED_PER_KIND: usize = 1;

/// The warning lines, without `warning: ` or line ends: every warning when
/// `verbose`, else one line per kind (in the order kinds first appear). A
/// kind seen once is its warning; incomplete stacks are summed (`N samples
/// have incomplete stacks, for K reasons: the largest, ...`); another kind
/// seen several times is its first warning and how many more.
pub(super) fn lines(warnings: &[Warning], verbose: bool) -> Vec<String> {
    if verbose {
        return warnings.iter().map(ToString::to_string).collect();
    }
    let mut kinds: Vec<(std::mem::Discriminant<Warning>, Vec<&Warning>)> = Vec::new();
    for warning in warnings {
        let kind = std::mem::discriminant(warning);
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, same)) => same.push(warning),
            None => kinds.push((kind, vec![warning])),
        }
    }
    kinds.into_iter().map(|(_, same)| folded(&same)).collect()
}

/// One line for warnings of one kind (at least one).
fn folded(same: &[&Warning]) -> String {
    if let [one] = same {
        return one.to_string();
    }
    if let Some(line) = incomplete_stacks(same) {
        return line;
    }
    let named: Vec<String> = same
        .iter()
        .take(NAMED_PER_KIND)
        .map(ToString::to_string)
        .collect();
    format!(
        "{} (and {} more like it: --verbose or the JSON lists them)",
        named.join("; "),
        same.len() - NAMED_PER_KIND
    )
}

/// `1234 samples have incomplete stacks, for 6 reasons: the largest,
/// outer frames truncated (900 samples); every reason: --verbose or the
/// JSON`; `None` for another kind.
fn incomplete_stacks(same: &[&Warning]) -> Option<String> {
    let mut reasons: Vec<(&str, u64)> = same
        .iter()
        .map(|w| match w {
            Warning::IncompleteStacks { reason, samples } => Some((reason.as_str(), *samples)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let total: u64 = reasons.iter().map(|r| r.1).sum();
    let (reason, samples) = reasons[0];
    Some(format!(
        "{total} samples have incomplete stacks, for {} reasons: the largest, {reason} \
         ({samples} samples); every reason: --verbose or the JSON",
        reasons.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ProcessId;

    fn incomplete(reason: &str, samples: u64) -> Warning {
        Warning::IncompleteStacks {
            reason: reason.to_owned(),
            samples,
        }
    }

    fn no_rss(tgid: u32) -> Warning {
        Warning::NoRssReadings {
            process: ProcessId(tgid),
            tgid,
            name: format!("tgid {tgid}"),
        }
    }

    #[test]
    fn warnings_of_one_kind_fold_into_one_line_with_a_count() {
        let warnings = vec![
            incomplete("native unwinding stopped", 3),
            no_rss(7),
            incomplete("outer frames truncated", 40),
            no_rss(8),
            no_rss(9),
            Warning::DroppedRecords { records: 2 },
        ];
        let folded = lines(&warnings, false);
        assert_eq!(
            folded,
            [
                "43 samples have incomplete stacks, for 2 reasons: the largest, outer frames \
                 truncated (40 samples); every reason: --verbose or the JSON",
                "tgid 7: no RSS was read (it may have exited first) (and 2 more like it: \
                 --verbose or the JSON lists them)",
                &warnings[5].to_string(),
            ]
        );
        assert_eq!(lines(&warnings, true).len(), warnings.len());
        assert_eq!(lines(&warnings[..1], false), [warnings[0].to_string()]);
    }
}
