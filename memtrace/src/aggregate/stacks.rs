//! Stack interning inside the aggregation step: each distinct call stack is
//! stored once and referred to by a [`StackId`], so per-sample work is one
//! hash lookup instead of a `Vec<Frame>` clone. A trace that never ends
//! (`memtrace agent`) drops the stacks nothing refers to any more
//! ([`StackTable::retain`]) and hands their ids out again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Frame;

/// Index of an interned call stack: position in [`crate::aggregate::Report::stacks`].
/// Ids are handed out in first-seen order, starting at 0; after
/// [`crate::aggregate::Aggregator::compact_ended`] the ids of dropped
/// stacks are handed out again (lowest first) before new ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StackId(pub u32);

/// Frames of `id` in `stacks` (indexed by id), outermost first; empty for an
/// id out of range. For the report's stacks.
pub(crate) fn frames_of<S: AsRef<[Frame]>>(stacks: &[S], id: StackId) -> &[Frame] {
    usize::try_from(id.0)
        .ok()
        .and_then(|index| stacks.get(index))
        .map_or(&[], AsRef::as_ref)
}

/// Table of distinct stacks (outermost frame first), each stored once.
///
/// Bounded by [`StackTable::retain`]: afterwards it holds only the stacks
/// kept, and its slots (`stacks.len()`) never exceed the most stacks held
/// at once, because dropped slots are reused. In `memtrace agent` that is
/// the distinct stacks of the paths of the images open at a window's end
/// plus those interned within one window.
#[derive(Debug, Default)]
pub(crate) struct StackTable {
    /// Stacks in id order; a dropped stack's slot is `None` until reused.
    stacks: Vec<Option<Arc<[Frame]>>>,
    /// Reverse index: stack → id (shares the allocation with `stacks`).
    ids: HashMap<Arc<[Frame]>, StackId>,
    /// Ids of dropped stacks, handed out again before new ones.
    free: Vec<StackId>,
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

    /// Stores a stack not seen before under a dropped stack's id, else
    /// the next id.
    fn insert(&mut self, shared: Arc<[Frame]>) -> StackId {
        if let Some(id) = self.free.pop() {
            if let Some(slot) = usize::try_from(id.0)
                .ok()
                .and_then(|i| self.stacks.get_mut(i))
            {
                *slot = Some(Arc::clone(&shared));
                self.ids.insert(shared, id);
                return id;
            }
        }
        let Ok(index) = u32::try_from(self.stacks.len()) else {
            return StackId(u32::MAX);
        };
        let id = StackId(index);
        self.stacks.push(Some(Arc::clone(&shared)));
        self.ids.insert(shared, id);
        id
    }

    /// Frames of `id`, outermost first; empty for an id this table never gave out.
    pub(crate) fn frames(&self, id: StackId) -> &[Frame] {
        usize::try_from(id.0)
            .ok()
            .and_then(|index| self.stacks.get(index))
            .and_then(Option::as_deref)
            .unwrap_or(&[])
    }

    /// Number of distinct stacks held.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Drops every stack whose id `in_use` does not hold: their frames are
    /// freed and their ids handed out again; the ids kept keep their
    /// stacks. Returns how many were dropped. The caller must hold no
    /// dropped id any more (a path, the held-page map).
    pub(crate) fn retain(&mut self, in_use: &HashSet<StackId>) -> usize {
        let before = self.ids.len();
        self.ids.retain(|_, id| in_use.contains(id));
        for (index, slot) in self.stacks.iter_mut().enumerate() {
            let id = StackId(u32::try_from(index).unwrap_or(u32::MAX));
            if !in_use.contains(&id) {
                *slot = None;
            }
        }
        while self.stacks.last().is_some_and(Option::is_none) {
            self.stacks.pop();
        }
        self.stacks.shrink_to_fit();
        self.ids.shrink_to_fit();
        // Highest first: `insert` pops the lowest from the end.
        self.free = (0..self.stacks.len())
            .rev()
            .filter(|&index| self.stacks[index].is_none())
            .filter_map(|index| u32::try_from(index).ok().map(StackId))
            .collect();
        before - self.ids.len()
    }

    /// All stacks in id order, as owned vectors (for the report).
    /// A dropped stack's slot is empty.
    pub(crate) fn to_vecs(&self) -> Vec<Vec<Frame>> {
        self.stacks
            .iter()
            .map(|stack| stack.as_deref().map(<[Frame]>::to_vec).unwrap_or_default())
            .collect()
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

    #[test]
    fn retain_drops_the_stacks_not_in_use_and_reuses_their_ids() {
        let mut table = StackTable::default();
        let ids: Vec<StackId> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| table.intern(vec![native("main"), native(name)]))
            .collect();
        let in_use: HashSet<StackId> = [ids[0], ids[2]].into_iter().collect();
        assert_eq!(table.retain(&in_use), 2);
        assert_eq!(table.len(), 2);
        assert_eq!(table.frames(ids[2]), &[native("main"), native("c")]);
        assert!(
            table.frames(ids[1]).is_empty(),
            "a dropped stack has no frames"
        );
        assert_eq!(table.to_vecs().len(), 3, "the empty slots at the end go");
        let e = table.intern(vec![native("main"), native("e")]);
        assert_eq!(e, ids[1], "the lowest dropped id is handed out again");
        assert_eq!(table.frames(e), &[native("main"), native("e")]);
        let b = table.intern(vec![native("main"), native("b")]);
        assert_eq!(b, StackId(3), "then the next new one");
        assert_eq!(table.intern(vec![native("main"), native("c")]), ids[2]);
        assert_eq!(table.len(), 4);
    }
}
