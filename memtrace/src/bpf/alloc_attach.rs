//! Kernel side, userspace half, allocator mode (`--allocations`): the
//! [`Tracer`] methods that attach and detach one process's allocator
//! probes and read the allocator counters, and the loading of the
//! allocator programs and their exponential draws. Where the probes go is
//! [`super::alloc`]'s.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::UProbe,
    Ebpf,
};
use memtrace_common::{
    LiveBlock, LiveKey, ALLOC_COOKIE_PYTHON_API, ALLOC_EXP_DRAWS_LEN, ALLOC_EXP_DRAWS_MAP,
    ALLOC_LIVE_MAP, ALLOC_STATS_MAP, ALLOC_STAT_CALLS, ALLOC_STAT_LIVE_FULL,
};

use super::alloc::{self, AllocAttachError, LIBC_HOOKS, PYTHON_HOOKS, SAMPLER_HOOKS};
use super::alloc_hooked::Claim;
use super::{map_error, map_mut, program_error, program_mut, BpfError, Tracer};

/// Allocator-mode counters of the kernel side, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Outermost allocator calls that returned a block.
    pub calls: u64,
    /// Sampled blocks the full live set refused: their frees are not seen.
    pub live_full: u64,
}

impl Tracer {
    /// Allocator mode: attaches the allocator probes for process `tgid`
    /// (started at `start_time_ns`, boot-time ns) only, to the CPython
    /// allocator API in `python_binary` (its executable or libpython) and to
    /// glibc's `malloc` family in `libc`; with `sampler` (the in-process
    /// sampler's library, `--alloc-hooks sampler`), to its two marker
    /// functions only, which the process may map later: the kernel places
    /// the probes when it does. Returns the binaries hooked. The
    /// same process already hooked is left as it is; probes an earlier
    /// process with the tgid left (its exit record was lost) are detached
    /// and its blocks dropped from the live set first.
    ///
    /// # Errors
    /// [`AllocAttachError`] when neither binary has the symbols or an attach
    /// fails; nothing stays attached then.
    pub fn attach_allocator(
        &mut self,
        tgid: u32,
        start_time_ns: u64,
        python_binary: Option<&Path>,
        libc: Option<&Path>,
        sampler: Option<&Path>,
    ) -> Result<Vec<PathBuf>, AllocAttachError> {
        match self.alloc_links.claim(tgid, start_time_ns) {
            Claim::Hooked => return Ok(Vec::new()),
            Claim::Free => {}
            Claim::Stale(links) => {
                alloc::detach(&mut self.ebpf, links);
                self.drop_live_blocks(tgid);
            }
        }
        let Some(pid) = NonZeroU32::new(tgid) else {
            return Ok(Vec::new());
        };
        let candidates = match sampler {
            Some(library) => vec![(Some(library), &SAMPLER_HOOKS[..], None)],
            None => vec![
                (
                    python_binary,
                    &PYTHON_HOOKS[..],
                    Some(ALLOC_COOKIE_PYTHON_API),
                ),
                (libc, &LIBC_HOOKS[..], None),
            ],
        };
        let mut targets = Vec::new();
        let mut no_symbols = None;
        for (path, hooks, cookie) in candidates {
            let Some(path) = path else { continue };
            let found = self
                .alloc_symbols
                .resolve(&mut self.symbols, path, hooks)
                .cloned();
            match found.and_then(|o| alloc::check_symbols(path, hooks, &o).map(|()| o)) {
                Ok(offsets) => targets.push(((path, hooks, cookie), offsets)),
                Err(err) => {
                    no_symbols.get_or_insert(err);
                }
            }
        }
        if targets.is_empty() {
            return Err(no_symbols.unwrap_or(AllocAttachError::NoBinary { tgid }));
        }
        let mut links = Vec::new();
        for phase in [alloc::Phase::Returns, alloc::Phase::Entries] {
            for (target, offsets) in &targets {
                let attached =
                    alloc::attach_binary(&mut self.ebpf, pid, *target, offsets, phase, &mut links);
                if let Err(err) = attached {
                    alloc::detach(&mut self.ebpf, links);
                    return Err(err);
                }
            }
        }
        self.alloc_links.insert(tgid, start_time_ns, links);
        Ok(targets
            .iter()
            .map(|((path, _, _), _)| path.to_path_buf())
            .collect())
    }

    /// Allocator mode: detaches the probes of `tgid` (it exited or exec'd)
    /// and drops every block of it from the kernel's live set, including
    /// blocks userspace never saw (sampled as its exit began, or whose
    /// record was lost on a full ring buffer). Returns the blocks dropped.
    /// A process that was never hooked has no blocks: the map is not
    /// scanned (shells and shims end by the dozen).
    pub fn detach_allocator(&mut self, tgid: u32) -> usize {
        let Some(links) = self.alloc_links.remove(tgid) else {
            return 0;
        };
        alloc::detach(&mut self.ebpf, links);
        self.drop_live_blocks(tgid)
    }

    /// Allocator mode: the processes whose allocator probes are attached.
    pub fn hooked_allocators(&self) -> Vec<u32> {
        self.alloc_links.tgids()
    }

    /// Removes every `ALLOC_LIVE` entry of `tgid` (one pass over the map's
    /// keys, at most its 65,536 entries); returns how many.
    fn drop_live_blocks(&mut self, tgid: u32) -> usize {
        let Some(map) = self.ebpf.map_mut(ALLOC_LIVE_MAP) else {
            return 0;
        };
        let Ok(mut live) = HashMap::<&mut MapData, LiveKey, LiveBlock>::try_from(map) else {
            return 0;
        };
        let keys: Vec<LiveKey> = live.keys().flatten().filter(|k| k.tgid == tgid).collect();
        keys.iter().filter(|key| live.remove(key).is_ok()).count()
    }

    /// Allocator mode: the blocks in the kernel's live set, per tgid.
    ///
    /// # Errors
    /// [`BpfError::MapMissing`] when allocator mode is off, [`BpfError::Map`].
    pub fn alloc_live_blocks(&self) -> Result<std::collections::HashMap<u32, u64>, BpfError> {
        let map = self.ebpf.map(ALLOC_LIVE_MAP).ok_or(BpfError::MapMissing {
            map: ALLOC_LIVE_MAP,
        })?;
        let live = HashMap::<&MapData, LiveKey, LiveBlock>::try_from(map)
            .map_err(|source| map_error(ALLOC_LIVE_MAP, "open".into(), source))?;
        let mut blocks = std::collections::HashMap::new();
        for key in live.keys().flatten() {
            *blocks.entry(key.tgid).or_default() += 1;
        }
        Ok(blocks)
    }

    /// Allocator-mode counters, summed over CPUs.
    ///
    /// # Errors
    /// [`BpfError::MapMissing`] when allocator mode is off, [`BpfError::Map`].
    pub fn alloc_stats(&self) -> Result<AllocStats, BpfError> {
        let map = self.ebpf.map(ALLOC_STATS_MAP).ok_or(BpfError::MapMissing {
            map: ALLOC_STATS_MAP,
        })?;
        let stats: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)
            .map_err(|source| map_error(ALLOC_STATS_MAP, "open".into(), source))?;
        let sum = |slot: u32| -> Result<u64, BpfError> {
            let per_cpu = stats
                .get(&slot, 0)
                .map_err(|source| map_error(ALLOC_STATS_MAP, format!("read {slot}"), source))?;
            Ok(per_cpu.iter().sum())
        };
        Ok(AllocStats {
            calls: sum(ALLOC_STAT_CALLS)?,
            live_full: sum(ALLOC_STAT_LIVE_FULL)?,
        })
    }
}

/// Loads (verifies) the allocator-mode programs.
pub(super) fn load_alloc_programs(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    for program in alloc::ENTRY_PROGRAMS
        .into_iter()
        .chain([alloc::RETURN_PROGRAM])
    {
        let uprobe: &mut UProbe = program_mut(ebpf, program)?;
        uprobe
            .load()
            .map_err(|source| program_error(program, "load", source))?;
    }
    Ok(())
}

/// Fills `ALLOC_EXP_DRAWS` with exponential variates of mean `mean_bytes`.
pub(super) fn fill_exp_draws(ebpf: &mut Ebpf, mean_bytes: u64) -> Result<(), BpfError> {
    let map = map_mut(ebpf, ALLOC_EXP_DRAWS_MAP)?;
    let mut draws: Array<&mut MapData, u64> = Array::try_from(map)
        .map_err(|source| map_error(ALLOC_EXP_DRAWS_MAP, "open".into(), source))?;
    for (index, draw) in (0..).zip(alloc::exponential_draws(mean_bytes, ALLOC_EXP_DRAWS_LEN)) {
        draws
            .set(index, draw, 0)
            .map_err(|source| map_error(ALLOC_EXP_DRAWS_MAP, format!("set {index}"), source))?;
    }
    Ok(())
}
