//! Per-path part of the aggregation step's result: the sampled bytes of each
//! (process image, stack) path and of each stack merged over images, and the
//! [`Weight`] that ranks them for the diagnosis and the reporters.

use serde::{Deserialize, Serialize};

use memtrace_common::MemoryEvent;

use crate::aggregate::{PathPoint, ProcessId, StackId};

/// Sampled byte totals of memory events: estimates (sums of
/// `weight_bytes`), per path, per process, or per time bucket of a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledBytes {
    /// Resident anonymous growth (`AnonGrowth`): every first touch, counted
    /// again when freed memory is touched again.
    pub growth_bytes: u64,
    /// Resident file-backed growth (`FileGrowth`): page cache mapped in.
    #[serde(default)]
    pub file_growth_bytes: u64,
    /// Resident shared-memory growth (`ShmemGrowth`).
    #[serde(default)]
    pub shmem_growth_bytes: u64,
    /// Copy-on-write un-sharing (`CowFault`).
    pub cow_bytes: u64,
    /// Address space added (`Mmap`, `MremapGrow`, `BrkGrow`).
    pub mapped_bytes: u64,
    /// Address space removed or given back (`Munmap`, `MremapShrink`,
    /// `BrkShrink`, `MadviseFree`).
    pub unmapped_bytes: u64,
    /// Change of the bytes the path holds (its sampled pages still resident,
    /// by address; `crate::held`): summed over a path's whole life, the
    /// bytes it holds at the end of its process image; per time bucket, the
    /// change in that bucket (negative when it gave memory back).
    #[serde(default)]
    pub held_bytes: i64,
    /// Samples summed.
    pub samples: u64,
    /// Sum over the samples of `w * (w - len)` (weight and true size of
    /// each), in KiB²: the unbiased estimate of the variance of the byte
    /// totals above that byte sampling with probability `len / w` gives
    /// (Horvitz-Thompson), 0 for records kept at their true size. Its root
    /// is one standard error, [`SampledBytes::standard_error_bytes`].
    #[serde(default)]
    pub variance_kib2: u64,
}

impl SampledBytes {
    /// One sample: `weight_bytes` in the total its `event` belongs to, and
    /// a sample count of 1 (held bytes come separately, from `crate::held`).
    pub fn from_event(event: MemoryEvent, weight_bytes: u64) -> Self {
        let mut bytes = Self {
            samples: 1,
            ..Self::default()
        };
        let slot = match event {
            MemoryEvent::AnonGrowth => &mut bytes.growth_bytes,
            MemoryEvent::FileGrowth => &mut bytes.file_growth_bytes,
            MemoryEvent::ShmemGrowth => &mut bytes.shmem_growth_bytes,
            MemoryEvent::CowFault => &mut bytes.cow_bytes,
            MemoryEvent::Mmap | MemoryEvent::MremapGrow | MemoryEvent::BrkGrow => {
                &mut bytes.mapped_bytes
            }
            MemoryEvent::Munmap
            | MemoryEvent::MremapShrink
            | MemoryEvent::BrkShrink
            | MemoryEvent::MadviseFree => &mut bytes.unmapped_bytes,
        };
        *slot = weight_bytes;
        bytes
    }

    /// The variance share, in KiB², of one sample of weight `weight_bytes`
    /// for an event of `len_bytes`: `w * (w - len)` (0 when `len >= w`).
    pub fn sample_variance_kib2(weight_bytes: u64, len_bytes: u64) -> u64 {
        let excess = weight_bytes.saturating_sub(len_bytes) as f64;
        (weight_bytes as f64 * excess / (1024.0 * 1024.0)).round() as u64
    }

    /// The variance, in KiB², of `bytes`: a part (held at the high-water
    /// mark or at the end) of what these totals sampled, taken to carry its
    /// share of the variance (`variance * bytes / grown`).
    pub fn variance_share_kib2(&self, bytes: u64) -> u64 {
        let grown = self.grown_bytes().max(self.cow_bytes);
        if grown == 0 || bytes == 0 {
            return 0;
        }
        let share = (bytes as f64 / grown as f64).min(1.0);
        (self.variance_kib2 as f64 * share).round() as u64
    }

    /// One standard error of `bytes` (as in
    /// [`SampledBytes::variance_share_kib2`]), in bytes.
    pub fn standard_error_bytes(&self, bytes: u64) -> u64 {
        error_bytes(self.variance_share_kib2(bytes))
    }

    /// A change of `delta_bytes` in the bytes a path holds (no sample).
    pub fn held_change(delta_bytes: i64) -> Self {
        Self {
            held_bytes: delta_bytes,
            ..Self::default()
        }
    }

    /// Every first touch of resident memory: anonymous + file + shmem growth.
    pub fn grown_bytes(&self) -> u64 {
        self.growth_bytes
            .saturating_add(self.file_growth_bytes)
            .saturating_add(self.shmem_growth_bytes)
    }

    /// Bytes held (never below 0: sampling noise can take a path's sum of
    /// changes slightly negative).
    pub fn held_now_bytes(&self) -> u64 {
        self.held_bytes.max(0).unsigned_abs()
    }

    /// Sums `other` into these totals (saturating).
    pub fn merge(&mut self, other: &Self) {
        self.growth_bytes = self.growth_bytes.saturating_add(other.growth_bytes);
        self.file_growth_bytes = self
            .file_growth_bytes
            .saturating_add(other.file_growth_bytes);
        self.shmem_growth_bytes = self
            .shmem_growth_bytes
            .saturating_add(other.shmem_growth_bytes);
        self.cow_bytes = self.cow_bytes.saturating_add(other.cow_bytes);
        self.mapped_bytes = self.mapped_bytes.saturating_add(other.mapped_bytes);
        self.unmapped_bytes = self.unmapped_bytes.saturating_add(other.unmapped_bytes);
        self.held_bytes = self.held_bytes.saturating_add(other.held_bytes);
        self.samples = self.samples.saturating_add(other.samples);
        self.variance_kib2 = self.variance_kib2.saturating_add(other.variance_kib2);
    }
}

/// One standard error, in bytes, of a variance in KiB².
pub fn error_bytes(variance_kib2: u64) -> u64 {
    (1024.0 * (variance_kib2 as f64).sqrt()) as u64
}

/// Which bytes rank and weigh paths (`--weight`): flame graphs, folded
/// stacks, speedscope and pprof are drawn with it; the table shows all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// Bytes held when the process's RSS was at its high-water mark.
    #[default]
    Peak,
    /// Bytes held at the end (of the trace, or when the process began to
    /// exit or exec'd).
    End,
    /// Every first touch, counted again when memory is freed and touched
    /// again.
    Grown,
}

impl Weight {
    /// The bytes this weight counts of a path (or a sum of paths) that
    /// held `peak_held_bytes` at the high-water mark and has `bytes`.
    pub fn bytes(self, peak_held_bytes: u64, bytes: &SampledBytes) -> u64 {
        match self {
            Self::Peak => peak_held_bytes,
            Self::End => bytes.held_now_bytes(),
            Self::Grown => bytes.grown_bytes(),
        }
    }

    /// Name in tables, headers and file annotations: `held at peak`, `held at
    /// end`, `grown`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Peak => "held at peak",
            Self::End => "held at end",
            Self::Grown => "grown",
        }
    }
}

/// One growth path: the sampled bytes one stack caused in one process image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// The process image the bytes belong to.
    pub process: ProcessId,
    /// The call stack: index into [`Report::stacks`](super::Report::stacks).
    pub stack: StackId,
    /// Sampled byte totals of this stack in this image (`held_bytes`: held at
    /// the image's end).
    pub bytes: SampledBytes,
    /// Sampled bytes this path held when its image's RSS was at its
    /// high-water mark.
    pub peak_held_bytes: u64,
    /// One standard error of `peak_held_bytes` from byte sampling
    /// ([`SampledBytes::standard_error_bytes`]), in bytes: with
    /// `bytes.samples`, how far the figure can be trusted.
    #[serde(default)]
    pub peak_held_error_bytes: u64,
    /// `bytes.grown_bytes()` as a fraction (0..=1) of the image's sampled
    /// growth; 0 when it has none.
    pub growth_share: f64,
    /// `peak_held_bytes` as a fraction (0..=1) of the image's sampled bytes
    /// held at its high-water mark; 0 when it has none.
    pub peak_held_share: f64,
    /// `bytes.cow_bytes` as a fraction (0..=1) of the image's sampled
    /// copy-on-write bytes; 0 when it has none.
    pub cow_share: f64,
    /// This path's sampled bytes per time bucket of
    /// [`Report::path_bucket_ns`](super::Report::path_bucket_ns), oldest
    /// first; buckets without any change are left out.
    #[serde(default)]
    pub timeline: Vec<PathPoint>,
}

impl PathReport {
    /// The bytes `weight` counts for this path.
    pub fn weight_bytes(&self, weight: Weight) -> u64 {
        weight.bytes(self.peak_held_bytes, &self.bytes)
    }
}

/// One call stack's sampled bytes summed over every process image it ran
/// in: the merged view of a leak that a pre-fork service repeats in each
/// worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackGrowthReport {
    /// The call stack: index into [`Report::stacks`](super::Report::stacks).
    pub stack: StackId,
    /// Sampled byte totals of this stack, summed over images.
    pub bytes: SampledBytes,
    /// Bytes it held at each image's high-water mark, summed over images.
    pub peak_held_bytes: u64,
    /// `bytes.grown_bytes()` as a fraction (0..=1) of the sampled growth of
    /// all traced images; 0 when there is none.
    pub growth_share: f64,
    /// `peak_held_bytes` as a fraction (0..=1) of all images' bytes held at
    /// their high-water marks; 0 when there is none.
    pub peak_held_share: f64,
    /// Images in which this stack made memory resident, ascending.
    pub processes: Vec<ProcessId>,
}

impl StackGrowthReport {
    /// The bytes `weight` counts for this stack.
    pub fn weight_bytes(&self, weight: Weight) -> u64 {
        weight.bytes(self.peak_held_bytes, &self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    #[test]
    fn a_record_of_its_true_size_adds_no_variance_and_a_sampled_one_adds_w_times_w_minus_len() {
        assert_eq!(SampledBytes::sample_variance_kib2(128 * KIB, 128 * KIB), 0);
        assert_eq!(SampledBytes::sample_variance_kib2(128 * KIB, 256 * KIB), 0);
        assert_eq!(
            SampledBytes::sample_variance_kib2(512 * KIB, 128 * KIB),
            512 * 384
        );
    }

    #[test]
    fn a_part_of_the_growth_carries_its_share_of_the_variance() {
        // 16 samples of 512 KiB for 128 KiB events: 8 MiB, a variance of
        // 16 * 512 * 384 KiB².
        let bytes = SampledBytes {
            growth_bytes: 16 * 512 * KIB,
            samples: 16,
            variance_kib2: 16 * 512 * 384,
            ..SampledBytes::default()
        };
        let whole = bytes.standard_error_bytes(bytes.growth_bytes);
        assert_eq!(whole, error_bytes(16 * 512 * 384));
        assert_eq!(whole, (1024.0 * (16.0_f64 * 512.0 * 384.0).sqrt()) as u64);
        assert_eq!(
            bytes.variance_share_kib2(bytes.growth_bytes / 4),
            4 * 512 * 384
        );
        assert_eq!(bytes.standard_error_bytes(0), 0);
        assert_eq!(SampledBytes::default().standard_error_bytes(KIB), 0);
    }
}
