//! What the live view shows while tracing runs, built by the aggregation
//! step from its current state ([`crate::aggregate::Aggregator::live_snapshot`])
//! and drawn by `crate::live`.

use std::collections::HashMap;

use super::Frame;

/// One live process, as the aggregator knows it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveProcess {
    /// Its current image's row (growth rates compare readings of one image,
    /// never of another process that reused the tgid).
    pub id: super::ProcessId,
    /// Its tgid.
    pub tgid: u32,
    /// What it is (master, worker, helper, ...), as the report will say.
    pub kind: super::ProcessKind,
    /// Its command line cut from the left ([`super::short_command`]), so the
    /// script and its arguments stay.
    pub label: String,
    /// Latest RSS reading, in bytes (0 before the first).
    pub rss_bytes: u64,
}

/// One growth path so far: where it allocates and how much it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivePath {
    /// Its innermost Python frame (the innermost frame when it has no
    /// Python frame), as `Frame`'s display text.
    pub frame: String,
    /// Sampled bytes it holds now, summed over processes.
    pub held_bytes: u64,
}

/// What the view shows of the aggregator's state; plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveSnapshot {
    /// The processes alive now, any order.
    pub processes: Vec<LiveProcess>,
    /// The paths holding the most memory now, largest first.
    pub top_paths: Vec<LivePath>,
}

impl LiveSnapshot {
    /// The `top` largest paths of `stacks` — (frames outermost first, sampled
    /// bytes held now) pairs, one per distinct stack (the aggregator sums its
    /// (process, stack) paths per stack first) — merged by innermost Python
    /// frame ([`LivePath::frame`]), largest first, ties by frame text; stacks
    /// holding nothing are left out. Only the merged frames are formatted.
    pub fn top_paths<'a>(
        stacks: impl IntoIterator<Item = (&'a [Frame], u64)>,
        top: usize,
    ) -> Vec<LivePath> {
        let mut merged: HashMap<Option<&Frame>, u64> = HashMap::new();
        for (frames, held_bytes) in stacks {
            if held_bytes == 0 {
                continue;
            }
            let sum = merged.entry(innermost_frame(frames)).or_default();
            *sum = sum.saturating_add(held_bytes);
        }
        let mut paths: Vec<LivePath> = merged
            .into_iter()
            .map(|(frame, held_bytes)| LivePath {
                frame: frame.map_or_else(|| "[empty stack]".to_owned(), ToString::to_string),
                held_bytes,
            })
            .collect();
        paths.sort_by(|a, b| (b.held_bytes, &a.frame).cmp(&(a.held_bytes, &b.frame)));
        paths.truncate(top);
        paths
    }
}

/// The innermost Python frame of `frames` (outermost first), else the
/// innermost frame; `None` for an empty stack.
fn innermost_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .rev()
        .find(|f| matches!(f, Frame::Python { .. }))
        .or_else(|| frames.last())
}
