//! Stack interning inside the aggregation step: each distinct call stack is
//! stored once and referred to by a [`StackId`], so per-sample work is one
//! hash lookup instead of a `Vec<Frame>` clone.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Frame;

/// Index of an interned call stack: position in [`crate::aggregate::Report::stacks`].
/// Ids are handed out in first-seen order, starting at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StackId(pub u32);

/// Frames of `id` in `stacks` (indexed by id), outermost first; empty for an
/// id out of range. Shared by [`StackTable`] and the report.
pub(crate) fn frames_of<S: AsRef<[Frame]>>(stacks: &[S], id: StackId) -> &[Frame] {
    usize::try_from(id.0)
        .ok()
        .and_then(|index| stacks.get(index))
        .map_or(&[], AsRef::as_ref)
}

/// Table of distinct stacks (outermost frame first), each stored once.
#[derive(Debug, Default)]
pub(crate) struct StackTable {
    /// Stacks in id order.
    stacks: Vec<Arc<[Frame]>>,
    /// Reverse index: stack → id (shares the allocation with `stacks`).
    ids: HashMap<Arc<[Frame]>, StackId>,
}

impl StackTable {
    /// Returns the id of `frames`, interning it on first sight.
    ///
    /// Ids are `u32`; past `u32::MAX` distinct stacks the last id is reused
    /// (attribution of those stacks merges) rather than panicking.
    pub(crate) fn intern(&mut self, frames: Vec<Frame>) -> StackId {
        match self.ids.get(frames.as_slice()) {
            Some(id) => *id,
            None => self.insert(frames.into()),
        }
    }

    /// Stores a stack not seen before under the next id.
    fn insert(&mut self, shared: Arc<[Frame]>) -> StackId {
        let Ok(index) = u32::try_from(self.stacks.len()) else {
            return StackId(u32::MAX);
        };
        let id = StackId(index);
        self.stacks.push(Arc::clone(&shared));
        self.ids.insert(shared, id);
        id
    }

    /// Frames of `id`, outermost first; empty for an id this table never gave out.
    pub(crate) fn frames(&self, id: StackId) -> &[Frame] {
        frames_of(&self.stacks, id)
    }

    /// Number of distinct stacks.
    pub(crate) fn len(&self) -> usize {
        self.stacks.len()
    }

    /// All stacks in id order, as owned vectors (for the report).
    pub(crate) fn to_vecs(&self) -> Vec<Vec<Frame>> {
        self.stacks.iter().map(|stack| stack.to_vec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::native;

    #[test]
    fn equal_stacks_share_one_id_and_distinct_stacks_get_new_ids() {
        let mut table = StackTable::default();
        let a = table.intern(vec![native("main"), native("malloc")]);
        let b = table.intern(vec![native("main"), native("calloc")]);
        let a_again = table.intern(vec![native("main"), native("malloc")]);
        assert_eq!(a, StackId(0));
        assert_eq!(b, StackId(1));
        assert_eq!(a_again, a);
        assert_eq!(table.len(), 2);
        assert_eq!(table.frames(b), &[native("main"), native("calloc")]);
        assert!(table.frames(StackId(7)).is_empty());
    }
}
