//! Part of the aggregation step's result, as the reports read it: the
//! merged paths grouped by their Python stack ([`PythonPath`]). One Python
//! line is one path; the native frames under it (`_PyObject_Malloc`,
//! `allocate_from_new_pool`: which allocator function touched the page) are
//! its children, not paths of their own.

use super::paths::{SampledBytes, StackGrowthReport, Weight};
use super::Report;
use crate::aggregate::{rank_key, Frame, ProcessId};

/// The merged paths ([`StackGrowthReport`]) whose frames are the same but
/// for their native frames, summed.
#[derive(Clone, Debug, PartialEq)]
pub struct PythonPath<'a> {
    /// The frames they share, outermost first: every frame but the native
    /// ones (a mapping frame stays: file-backed growth is another path).
    pub frames: Vec<Frame>,
    /// The merged paths, most `weight` bytes first.
    pub stacks: Vec<&'a StackGrowthReport>,
    /// Their sampled bytes, summed.
    pub bytes: SampledBytes,
    /// Their bytes held at each image's high-water mark, summed.
    pub peak_held_bytes: u64,
    /// Images any of them grew in, ascending.
    pub processes: Vec<ProcessId>,
}

impl PythonPath<'_> {
    /// The bytes `weight` counts for this path.
    pub fn weight_bytes(&self, weight: Weight) -> u64 {
        weight.bytes(self.peak_held_bytes, &self.bytes)
    }

    /// Its native children: the innermost native frame of each merged path
    /// (`-` when a path has none) with that path's `weight` bytes, largest
    /// first.
    pub fn natives(&self, report: &Report, weight: Weight) -> Vec<(String, u64)> {
        let mut natives: Vec<(String, u64)> = Vec::new();
        for stack in &self.stacks {
            let name = report
                .frames(stack.stack)
                .iter()
                .rev()
                .find(|f| matches!(f, Frame::Native { .. }))
                .map_or_else(|| "-".to_owned(), ToString::to_string);
            let bytes = stack.weight_bytes(weight);
            match natives.iter_mut().find(|(known, _)| *known == name) {
                Some((_, total)) => *total += bytes,
                None => natives.push((name, bytes)),
            }
        }
        natives.sort_by_key(|(name, bytes)| (std::cmp::Reverse(*bytes), name.clone()));
        natives
    }
}

impl Report {
    /// The `n` Python paths with the most `weight` bytes (> 0), largest
    /// first, ties by frames.
    pub fn top_python_paths(&self, weight: Weight, n: usize) -> Vec<PythonPath<'_>> {
        let mut paths: Vec<PythonPath<'_>> = Vec::new();
        for stack in &self.growth_stacks {
            let frames: Vec<Frame> = self
                .frames(stack.stack)
                .iter()
                .filter(|f| !matches!(f, Frame::Native { .. }))
                .cloned()
                .collect();
            match paths.iter_mut().find(|p| p.frames == frames) {
                Some(path) => {
                    path.stacks.push(stack);
                    path.bytes.merge(&stack.bytes);
                    path.peak_held_bytes += stack.peak_held_bytes;
                    path.processes.extend(&stack.processes);
                }
                None => paths.push(PythonPath {
                    frames,
                    stacks: vec![stack],
                    bytes: stack.bytes,
                    peak_held_bytes: stack.peak_held_bytes,
                    processes: stack.processes.clone(),
                }),
            }
        }
        paths.retain(|p| p.weight_bytes(weight) > 0);
        for path in &mut paths {
            path.processes.sort_unstable();
            path.processes.dedup();
            path.stacks
                .sort_by_key(|s| rank_key(s.weight_bytes(weight), None, self.frames(s.stack)));
        }
        paths.sort_by(|a, b| {
            rank_key(a.weight_bytes(weight), None, &a.frames).cmp(&rank_key(
                b.weight_bytes(weight),
                None,
                &b.frames,
            ))
        });
        paths.truncate(n);
        paths
    }
}
