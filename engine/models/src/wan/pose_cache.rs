//! [`PoseCache`]: Wan Animate 2's pose-branch cache (ComfyUI's `PoseBranchCache`, set by `WanAnimate2Cache`).
//!
//! The pose branch reads the same pose latents, pose text and timestep (1) on every sampling step, so its block
//! inputs never change within a run. The cache keeps each block's input of the first sample's pose stream the
//! first time it runs, and later calls with the same pose latents project the block's keys and values from it
//! instead of running the branch (ComfyUI's `kv_from_input`). One slot per distinct pose latents, so each context
//! window keeps its own. Entries are kept as they are (`default`) or quantized per token with ConvRot (`int8`,
//! `int4`: comfy-kitchen's `TensorWiseINT8Layout` and `TensorCoreConvRotW4A4Layout` round trips).

use std::sync::{Mutex, MutexGuard};

use kiln_compute::quant::hadamard_rotate;
use kiln_compute::{Backend, Tensor};
use rayon::prelude::*;

use crate::error::{Error, Result};

/// How the cache stores a block input (`WanAnimate2Cache`'s `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheDtype {
    /// The compute type's values.
    Default,
    /// Signed int8 per token after a ConvRot rotation: a quarter of f32's bytes.
    Int8,
    /// Signed int4 (−7…7) per token after a ConvRot rotation.
    Int4,
}

impl CacheDtype {
    /// The dtype by `WanAnimate2Cache`'s option name.
    pub fn from_name(name: &str) -> Option<CacheDtype> {
        match name {
            "default" => Some(CacheDtype::Default),
            "int8" => Some(CacheDtype::Int8),
            "int4" => Some(CacheDtype::Int4),
            _ => None,
        }
    }
}

/// Where and how a [`PoseCache`] keeps its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// The storage precision.
    pub dtype: CacheDtype,
    /// On the device (`gpu`) rather than in host memory (`cpu`).
    pub on_device: bool,
}

/// ConvRot's largest group; smaller powers of 4 are tried when the width is not a multiple of it.
const CONVROT_GROUP: usize = 256;

/// One run's pose-branch cache on backend `B`.
pub struct PoseCache<B: Backend> {
    settings: CacheSettings,
    slots: Mutex<Vec<Slot<B>>>,
}

/// The block inputs kept for one pose sequence.
struct Slot<B: Backend> {
    /// The pose latents' first sample (shape and values) the slot is for.
    key: (Vec<usize>, Vec<f32>),
    /// Block i's input `[1, N, D]`, in order.
    blocks: Vec<Entry<B>>,
}

impl<B: Backend> Slot<B> {
    /// The bytes its entries hold.
    fn bytes(&self) -> u64 {
        self.blocks.iter().map(Entry::bytes).sum()
    }
}

/// One stored block input.
enum Entry<B: Backend> {
    /// As computed, on the device.
    Device(Tensor<B>),
    /// Its values in host memory, `shape`.
    Host { shape: Vec<usize>, values: Vec<f32> },
    /// Quantized per row of `[N, D]` after rotating each group of `group` values: row r is
    /// `codes[r·D..] · scales[r]`, rotated back.
    Quantized { shape: Vec<usize>, codes: Vec<i8>, scales: Vec<f32>, group: usize },
}

impl<B: Backend> Entry<B> {
    /// The bytes it holds.
    fn bytes(&self) -> u64 {
        match self {
            Entry::Device(t) => (t.numel() * t.dtype().size()) as u64,
            Entry::Host { values, .. } => (values.len() * 4) as u64,
            Entry::Quantized { codes, scales, .. } => (codes.len() + scales.len() * 4) as u64,
        }
    }
}

impl<B: Backend> PoseCache<B> {
    /// An empty cache.
    pub fn new(settings: CacheSettings) -> PoseCache<B> {
        PoseCache { settings, slots: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot<B>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many block inputs the slot of `key` holds (0 for a pose sequence not seen yet); the slot becomes
    /// the most recently used.
    pub fn filled(&self, key: &(Vec<usize>, Vec<f32>)) -> usize {
        let mut slots = self.lock();
        let Some(i) = slots.iter().position(|s| s.key == *key) else { return 0 };
        let slot = slots.remove(i);
        let filled = slot.blocks.len();
        slots.push(slot);
        filled
    }

    /// Keeps `x` `[1, N, D]` as block `block`'s input for the pose sequence `key`; the blocks of a slot come
    /// in order, from 0 (a slot filled part way, by a call that failed, starts again).
    pub fn put(
        &self,
        b: &B,
        key: &(Vec<usize>, Vec<f32>),
        block: usize,
        x: &Tensor<B>,
    ) -> Result<()> {
        let entry = self.entry(b, x)?;
        let mut slots = self.lock();
        let slot = match slots.iter().position(|s| s.key == *key) {
            Some(i) => &mut slots[i],
            None => {
                self.make_room(b, &mut slots)?;
                slots.push(Slot { key: key.clone(), blocks: Vec::new() });
                let last = slots.len() - 1;
                &mut slots[last]
            }
        };
        if block == 0 {
            slot.blocks.clear();
        }
        if slot.blocks.len() != block {
            return Err(Error::Invalid(format!(
                "the Wan Animate 2 cache was handed block {block}'s input after {} blocks",
                slot.blocks.len()
            )));
        }
        slot.blocks.push(entry);
        Ok(())
    }

    /// Room for one more slot, as ComfyUI's cache makes it: while the store has less free than 1.5 times the
    /// largest slot, the least recently used slots go.
    fn make_room(&self, b: &B, slots: &mut Vec<Slot<B>>) -> Result<()> {
        let largest = slots.iter().map(Slot::bytes).max().unwrap_or(0);
        let wanted = largest + largest / 2;
        while !slots.is_empty() && self.free_bytes(b)? < wanted {
            slots.remove(0);
        }
        Ok(())
    }

    /// Free bytes where the entries are kept: the device's, or the host RAM this process may still use.
    fn free_bytes(&self, b: &B) -> Result<u64> {
        if self.settings.on_device && self.settings.dtype == CacheDtype::Default {
            return Ok(b.memory().mem_info()?.free);
        }
        let ram = kiln_compute::memory::pressure::SystemRam::new().snapshot();
        Ok(ram.map_or(u64::MAX, |r| r.available))
    }

    /// Block `block`'s input for the pose sequence `key`, on `b` in its compute type.
    pub fn take(&self, b: &B, key: &(Vec<usize>, Vec<f32>), block: usize) -> Result<Tensor<B>> {
        let slots = self.lock();
        let entry = slots.iter().find(|s| s.key == *key).and_then(|s| s.blocks.get(block));
        let Some(entry) = entry else {
            return Err(Error::Invalid(format!(
                "the Wan Animate 2 cache holds no input of block {block} for these pose latents"
            )));
        };
        match entry {
            Entry::Device(t) => Ok(t.clone()),
            Entry::Host { shape, values } => Ok(b.from_f32(shape, values, b.compute_dtype())?),
            Entry::Quantized { shape, codes, scales, group } => {
                let values = dequantize(codes, scales, *group, shape[shape.len() - 1]);
                Ok(b.from_f32(shape, &values, b.compute_dtype())?)
            }
        }
    }

    /// `x` as this cache keeps it.
    fn entry(&self, b: &B, x: &Tensor<B>) -> Result<Entry<B>> {
        let shape = x.shape().to_vec();
        let width = shape.last().copied().unwrap_or(0);
        let (group, int4) = match self.settings.dtype {
            CacheDtype::Default if self.settings.on_device => {
                return Ok(Entry::Device(b.cast(x, b.compute_dtype())?));
            }
            CacheDtype::Default => return Ok(Entry::Host { shape, values: b.to_f32(x)? }),
            CacheDtype::Int8 => (convrot_group(width), false),
            CacheDtype::Int4 => (convrot_group(width), true),
        };
        if width == 0 || !width.is_multiple_of(group) {
            return Err(Error::Invalid(format!(
                "the Wan Animate 2 cache quantizes rows of {width} values in ConvRot groups of a power of 4; \
                 {width} has none: choose the default dtype"
            )));
        }
        let values = b.to_f32(x)?;
        let (codes, scales) = quantize(&values, group, width, int4);
        Ok(Entry::Quantized { shape, codes, scales, group })
    }
}

/// ComfyUI's group for rows of `width`: 256, quartered while it does not divide the width (down to 4).
fn convrot_group(width: usize) -> usize {
    let mut g = CONVROT_GROUP;
    while g > 4 && !width.is_multiple_of(g) {
        g /= 4;
    }
    g
}

/// Rows of `width` values rotated, then quantized per row: int8 as comfy-kitchen's `quantize_int8_rowwise`
/// (s = max(max|x| / 127, 1e-30)), int4 as its `quantize_signed_int4_rowwise` (s = max(max|x|, 1e-10) / 7,
/// codes clamped to ±7); rounding half to even.
fn quantize(values: &[f32], group: usize, width: usize, int4: bool) -> (Vec<i8>, Vec<f32>) {
    let mut rotated = values.to_vec();
    let mut codes = vec![0i8; values.len()];
    let scales = rotated
        .par_chunks_exact_mut(width)
        .zip(codes.par_chunks_exact_mut(width))
        .map(|(row, q)| {
            hadamard_rotate(row, group);
            if int4 {
                let max = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-10);
                let scale = max / 7.0;
                for (q, v) in q.iter_mut().zip(row.iter()) {
                    *q = (v / scale).round_ties_even().clamp(-7.0, 7.0) as i8;
                }
                scale
            } else {
                kiln_compute::quant::quantize_row_i8(row, q)
            }
        })
        .collect();
    (codes, scales)
}

/// The values of [`quantize`]'s codes: each row's codes times its scale, rotated back.
fn dequantize(codes: &[i8], scales: &[f32], group: usize, width: usize) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(codes.len());
    for (row, &scale) in codes.chunks_exact(width).zip(scales) {
        out.extend(row.iter().map(|&q| f32::from(q) * scale));
    }
    out.par_chunks_exact_mut(width).for_each(|row| hadamard_rotate(row, group));
    out
}

/// The host values `x` holds, as the cache's key for a pose sequence (its first sample).
pub fn pose_key(shape: &[usize], values: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let n = shape.first().copied().unwrap_or(1).max(1);
    let mut first = shape.to_vec();
    if let Some(rows) = first.first_mut() {
        *rows = 1;
    }
    (first, values[..values.len() / n].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_quarter_until_they_divide_the_width() {
        assert_eq!(convrot_group(5120), 256);
        assert_eq!(convrot_group(128), 64);
        assert_eq!(convrot_group(96), 16);
        assert_eq!(convrot_group(6), 4);
    }

    #[test]
    fn a_round_trip_keeps_each_token_within_its_step() {
        let width = 64;
        let values: Vec<f32> =
            (0..4 * width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for int4 in [false, true] {
            let (codes, scales) = quantize(&values, 64, width, int4);
            let back = dequantize(&codes, &scales, 64, width);
            for (r, (row, back)) in values.chunks(width).zip(back.chunks(width)).enumerate() {
                // The rotation is orthonormal: the error's norm is at most half a step per value.
                let err: f32 =
                    row.iter().zip(back).map(|(a, b)| (a - b).powi(2)).sum::<f32>().sqrt();
                let bound = scales[r] * 0.5 * (width as f32).sqrt() * 1.001;
                assert!(err <= bound, "int4 {int4} row {r}: {err} > {bound}");
            }
        }
    }
}
