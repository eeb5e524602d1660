//! Profile samples of a [`Window`], shared by the profile encoders
//! (`pyroscope` as pprof, `otlp` as OTLP profiles): one sample per (process,
//! path) with its four values in bytes, and the grouping of processes by
//! `(service_name, role)`, the bounded label set a series is keyed by.

use std::collections::BTreeMap;

use super::window::{PathWindow, ProcessWindow, Window};
use crate::aggregate::Frame;
use crate::report::pprof::signed;

/// The sample types of every profile, in the order of [`ProfileSample::values`]
/// (all in sampled bytes, names as in pprof's heap profiles and memtrace's
/// pprof report): held at the window's end, grown within the window, held at
/// the process's RSS high-water mark, copy-on-write un-shared within the
/// window.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("inuse_space", "bytes"),
    ("alloc_space", "bytes"),
    ("peak_space", "bytes"),
    ("cow_space", "bytes"),
];

/// What the sampling period counts (pprof's and OTLP's `period_type`).
pub const PERIOD_TYPE: (&str, &str) = ("space", "bytes");

/// One path of one process, with a value per [`SAMPLE_TYPES`] entry.
#[derive(Clone, Copy, Debug)]
pub struct ProfileSample<'w> {
    /// The process the path belongs to.
    pub process: &'w ProcessWindow,
    /// Its stack, root (outermost) first.
    pub frames: &'w [Frame],
    /// `[held_bytes, grown_bytes, peak_held_bytes, cow_bytes]`, as int64.
    pub values: [i64; 4],
}

/// The samples of `process`: one per path with any value not 0.
pub fn process_samples(process: &ProcessWindow) -> impl Iterator<Item = ProfileSample<'_>> {
    process.paths.iter().filter_map(move |path| {
        let values = values(path);
        values.iter().any(|v| *v != 0).then_some(ProfileSample {
            process,
            frames: &path.frames,
            values,
        })
    })
}

/// A path's four values, in the order of [`SAMPLE_TYPES`].
fn values(path: &PathWindow) -> [i64; 4] {
    [
        path.held_bytes,
        path.grown_bytes,
        path.peak_held_bytes,
        path.cow_bytes,
    ]
    .map(signed)
}

/// The window's processes grouped by `(service_name, role)`, in that order.
pub fn by_service_and_role(window: &Window) -> BTreeMap<(&str, &str), Vec<&ProcessWindow>> {
    let mut groups: BTreeMap<(&str, &str), Vec<&ProcessWindow>> = BTreeMap::new();
    for process in &window.processes {
        let key = (
            process.labels.service_name.as_str(),
            process.labels.role.as_str(),
        );
        groups.entry(key).or_default().push(process);
    }
    groups
}

/// A frame as profiles name it: `(function, file, line)`; Python frames
/// with their file and line, native frames, mappings and unknown frames as
/// a name without a file (as the pprof report has them).
pub fn function_file_line(frame: &Frame) -> (String, String, i64) {
    crate::report::pprof::ProfileFrame::function_file_line(frame)
}
