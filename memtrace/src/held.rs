//! TEMPORARY stand-in for the held-page map while `held/` is written: same
//! API, naive implementation. Replaced before commit.
#![allow(missing_docs, dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::ops::Range;

#[derive(Debug)]
pub struct HeldChange<P, S> {
    pub process: P,
    pub path: S,
    pub delta_bytes: i64,
}

pub struct PeakHeld<P, S> {
    pub process: P,
    pub path: S,
    pub held_at_peak_bytes: u64,
}

#[derive(Default)]
pub struct HeldStats<P> {
    pub memory_bytes: usize,
    levels: HashMap<P, u32>,
    unplaced: HashMap<P, u64>,
}

impl<P: Copy + Eq + Hash> HeldStats<P> {
    pub fn coarsening_level(&self, p: P) -> u32 {
        self.levels.get(&p).copied().unwrap_or(0)
    }
    pub fn unplaced_bytes(&self, p: P) -> u64 {
        self.unplaced.get(&p).copied().unwrap_or(0)
    }
}

#[derive(Debug)]
struct Proc<S> {
    map: BTreeMap<u64, (u64, S, u64)>,
    now: HashMap<S, i64>,
    at_peak: HashMap<S, i64>,
    peak_rss: u64,
    reported: HashMap<S, u64>,
    dirty: bool,
    unplaced: u64,
}

#[derive(Debug)]
pub struct HeldTracker<P, S> {
    procs: HashMap<P, Proc<S>>,
    ended: std::collections::HashSet<P>,
}

impl<P: Copy + Eq + Hash + Ord, S: Copy + Eq + Hash + Ord> HeldTracker<P, S> {
    pub fn new(_max: usize) -> Self {
        Self { procs: HashMap::new(), ended: Default::default() }
    }
    fn proc(&mut self, p: P) -> Option<&mut Proc<S>> {
        if self.ended.contains(&p) {
            return None;
        }
        Some(self.procs.entry(p).or_insert_with(|| Proc {
            map: BTreeMap::new(),
            now: HashMap::new(),
            at_peak: HashMap::new(),
            peak_rss: 0,
            reported: HashMap::new(),
            dirty: false,
            unplaced: 0,
        }))
    }
    fn after(pr: &mut Proc<S>, rss: u64) {
        if rss > pr.peak_rss {
            pr.peak_rss = rss;
            pr.at_peak = pr.now.clone();
            pr.dirty = true;
        }
    }
    pub fn touch(&mut self, p: P, r: Range<u64>, s: S, w: u64, rss: u64, out: &mut Vec<HeldChange<P, S>>) {
        self.release(p, r.clone(), 0, out);
        let Some(pr) = self.proc(p) else { return };
        pr.map.insert(r.start, (r.end, s, w));
        *pr.now.entry(s).or_default() += w as i64;
        out.push(HeldChange { process: p, path: s, delta_bytes: w as i64 });
        Self::after(pr, rss);
    }
    pub fn touch_unplaced(&mut self, p: P, s: S, w: u64, rss: u64, out: &mut Vec<HeldChange<P, S>>) {
        let Some(pr) = self.proc(p) else { return };
        pr.unplaced += w;
        *pr.now.entry(s).or_default() += w as i64;
        out.push(HeldChange { process: p, path: s, delta_bytes: w as i64 });
        Self::after(pr, rss);
    }
    pub fn release(&mut self, p: P, r: Range<u64>, rss: u64, out: &mut Vec<HeldChange<P, S>>) {
        let Some(pr) = self.proc(p) else { return };
        let keys: Vec<u64> = pr.map.range(..r.end).filter(|(_, v)| v.0 > r.start).map(|(k, _)| *k).collect();
        for k in keys {
            let (end, s, w) = pr.map.remove(&k).unwrap_or((k, s_dummy(&pr.now), 0));
            let _ = end;
            *pr.now.entry(s).or_default() -= w as i64;
            out.push(HeldChange { process: p, path: s, delta_bytes: -(w as i64) });
        }
        Self::after(pr, rss);
    }
    pub fn remap(&mut self, p: P, old: u64, old_len: u64, new: u64, new_len: u64, rss: u64, out: &mut Vec<HeldChange<P, S>>) {
        if new == old {
            if new_len < old_len {
                self.release(p, old + new_len..old + old_len, rss, out);
            }
            return;
        }
        let Some(pr) = self.proc(p) else { return };
        let keys: Vec<u64> = pr.map.range(old..old + old_len).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some((end, s, w)) = pr.map.remove(&k) {
                if k - old < new_len {
                    pr.map.insert(new + (k - old), (new + (end - old), s, w));
                } else {
                    *pr.now.entry(s).or_default() -= w as i64;
                    out.push(HeldChange { process: p, path: s, delta_bytes: -(w as i64) });
                }
            }
        }
        Self::after(pr, rss);
    }
    pub fn end(&mut self, p: P, peaks: &mut Vec<PeakHeld<P, S>>) {
        self.emit(p, peaks);
        self.procs.remove(&p);
        self.ended.insert(p);
    }
    fn emit(&mut self, p: P, peaks: &mut Vec<PeakHeld<P, S>>) {
        let Some(pr) = self.procs.get_mut(&p) else { return };
        for (s, v) in &pr.at_peak {
            let v = (*v).max(0) as u64;
            if pr.reported.get(s) != Some(&v) {
                pr.reported.insert(*s, v);
                peaks.push(PeakHeld { process: p, path: *s, held_at_peak_bytes: v });
            }
        }
        pr.dirty = false;
    }
    pub fn take_peak_updates(&mut self, peaks: &mut Vec<PeakHeld<P, S>>) {
        let ps: Vec<P> = self.procs.iter().filter(|(_, v)| v.dirty).map(|(k, _)| *k).collect();
        for p in ps {
            self.emit(p, peaks);
        }
    }
    pub fn processes(&self) -> Vec<P> {
        self.procs.keys().copied().collect()
    }
    pub fn stats(&self) -> HeldStats<P> {
        HeldStats {
            memory_bytes: self.procs.values().map(|p| p.map.len() * 64).sum(),
            levels: HashMap::new(),
            unplaced: self.procs.iter().map(|(k, v)| (*k, v.unplaced)).collect(),
        }
    }
}

fn s_dummy<S: Copy>(now: &HashMap<S, i64>) -> S {
    *now.keys().next().expect("temp")
}
