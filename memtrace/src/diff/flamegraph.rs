//! The differential flame graph of `memtrace diff` (inferno; Brendan
//! Gregg's differential flame graphs): widths are the later side's bytes of
//! one [`Measure`] (held at the end by default), colours the change from the
//! earlier side.

use std::io::Write;
use std::path::PathBuf;

use inferno::flamegraph::color::{BasicPalette, Palette};

use super::matching::{Diff, Measure, PathDiff};
use super::{DiffError, Sides};
use crate::report::folded::sanitize;

/// Writes `diff` as a differential flame graph (SVG): frame widths are the
/// later side's `measure` bytes, red where a stack has more of them than on
/// the earlier side, blue where it has fewer. Stacks with none on the later
/// side have no width; the table lists them.
///
/// # Errors
/// [`DiffError::NothingToDraw`] when no stack has `measure` bytes on the
/// later side; [`DiffError::Write`] (path `-`) for an error of `out` or
/// inferno.
pub fn render_flamegraph(
    diff: &Diff,
    sides: &Sides,
    measure: Measure,
    out: &mut dyn Write,
) -> Result<(), DiffError> {
    if diff.paths.iter().all(|p| measure.of(p.after) == 0) {
        return Err(DiffError::NothingToDraw { measure });
    }
    let write_error = |source| DiffError::Write {
        path: PathBuf::from("-"),
        source,
    };
    let before = folded(diff, |p| measure.of(p.before));
    let after = folded(diff, |p| measure.of(p.after));
    let mut differential = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        before.as_bytes(),
        after.as_bytes(),
        &mut differential,
    )
    .map_err(write_error)?;
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("memtrace diff: memory {}", measure.describe());
    options.subtitle = Some(format!(
        "{} → {}; width: bytes {} after; red: more than before, blue: less",
        sides.before,
        sides.after,
        measure.describe()
    ));
    options.count_name = "bytes".to_owned();
    options.colors = Palette::Basic(BasicPalette::Mem);
    options.deterministic = true;
    inferno::flamegraph::from_reader(&mut options, differential.as_slice(), out)
        .map_err(write_error)
}

/// Folded stacks (`outer;...;inner <bytes>`, one line per stack with
/// `bytes(path) > 0`) of one side of `diff`. `;` and line breaks inside
/// frame names become `:` and spaces, as in the folded report.
pub(super) fn folded(diff: &Diff, bytes: impl Fn(&PathDiff) -> u64) -> String {
    let mut text = String::new();
    for path in &diff.paths {
        let count = bytes(path);
        if count == 0 {
            continue;
        }
        let frames: Vec<String> = path
            .frames
            .iter()
            .map(|f| sanitize(&f.to_string()))
            .collect();
        let line = if frames.is_empty() {
            "[empty stack]".to_owned()
        } else {
            frames.join(";")
        };
        text.push_str(&format!("{line} {count}\n"));
    }
    text
}
