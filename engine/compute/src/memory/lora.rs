//! In-place LoRA and the other weight adapters (memory-manager.md §5.2 step 5–6, §6).
//!
//! A weight's patches are kept as one packed image: every tensor of every patch of that weight laid out
//! back to back (256-byte aligned) in host memory, so moving them to the device is **one** gathered copy. The
//! visitor of §6.2 has three modes here: [`PatchLayout::measure`] (bytes needed), [`PatchLayout::views`]
//! (typed device views at offsets of a given device range, no copy) and the packing itself
//! ([`PatchSet::pack`], the bytes to copy).
//!
//! [`apply`] computes the patched weight on the backend in f32 — `W ·= strength_model`, then each patch in
//! order: LoRA (`W += strength · alpha/rank · up·down`), DoRA, LoHa, LoKr, diff, set — and writes it back over
//! the weight's device bytes in the stored type with stochastic rounding seeded from the weight's key, as
//! ComfyUI does. The device copy is then "resident and patched"; the original bytes stay in the pinned pool,
//! so restoring is re-copying them (the caller forgets the stored signature when the patch set changes).

use crate::backend::{Backend, BinaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::DevPtr;
use crate::quant::Quant;
use crate::tensor::{Tensor, Weight, numel};

/// Alignment of each tensor inside a packed patch image.
const PACK_ALIGN: usize = 256;

/// A tensor of a patch, in host memory (as read from a LoRA file), in its stored type.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchTensor {
    /// Stored element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian elements.
    pub bytes: Vec<u8>,
}

impl PatchTensor {
    /// A tensor from f32 values stored as `dtype`.
    pub fn from_f32(dtype: DType, shape: &[usize], values: &[f32]) -> PatchTensor {
        PatchTensor { dtype, shape: shape.to_vec(), bytes: crate::dtype::narrow(dtype, values) }
    }

    fn check(&self) -> Result<()> {
        if self.bytes.len() != numel(&self.shape) * self.dtype.size() {
            return Err(Error::shape(
                "patch",
                format!("{:?} of {} has {} bytes", self.shape, self.dtype, self.bytes.len()),
            ));
        }
        Ok(())
    }
}

/// One factor of a LoKr patch: given whole, or as a product `a · b`.
#[derive(Debug, Clone, PartialEq)]
pub enum Factor<T> {
    /// The factor itself.
    Full(T),
    /// The factor as `a · b` (the rank is `b`'s row count).
    Product(T, T),
}

/// What a patch adds to (or puts in place of) a weight. `T` is a [`PatchTensor`] on the host, a [`Weight`]
/// view on the device.
#[derive(Debug, Clone, PartialEq)]
pub enum Adapter<T> {
    /// LoRA / LoCon without a Tucker mid: ΔW = up · down (flattened), scale alpha / rank (1 without alpha).
    /// With `dora_scale`, DoRA.
    Lora {
        /// `[out, rank]` (a conv's `[out, rank, 1, 1]` is flattened).
        up: T,
        /// `[rank, in…]`.
        down: T,
        /// The file's alpha.
        alpha: Option<f32>,
        /// DoRA magnitudes: one per output row, or one per input column.
        dora_scale: Option<T>,
    },
    /// LoHa: ΔW = (w1a · w1b) ⊙ (w2a · w2b), scale alpha / rows(w1b).
    LoHa {
        /// First Hadamard factor, left.
        w1a: T,
        /// First Hadamard factor, right.
        w1b: T,
        /// Second Hadamard factor, left.
        w2a: T,
        /// Second Hadamard factor, right.
        w2b: T,
        /// The file's alpha.
        alpha: Option<f32>,
        /// DoRA magnitudes.
        dora_scale: Option<T>,
    },
    /// LoKr: ΔW = kron(w1, w2), scale alpha / rank only when a factor is given as a product, else 1.
    LoKr {
        /// Left Kronecker factor.
        w1: Factor<T>,
        /// Right Kronecker factor.
        w2: Factor<T>,
        /// The file's alpha.
        alpha: Option<f32>,
        /// DoRA magnitudes.
        dora_scale: Option<T>,
    },
    /// W += diff (a full difference, e.g. a merged fine-tune).
    Diff(T),
    /// W = value.
    Set(T),
}

/// A patch: an adapter with ComfyUI's strengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch<T> {
    /// Multiplies the adapter's ΔW.
    pub strength: f32,
    /// Multiplies the weight before this patch is added (1 leaves it alone).
    pub strength_model: f32,
    /// The adapter.
    pub adapter: Adapter<T>,
}

impl<T> Adapter<T> {
    /// The tensors, in a fixed order (the packing order).
    fn tensors(&self) -> Vec<&T> {
        let mut out = Vec::new();
        match self {
            Adapter::Lora { up, down, dora_scale, .. } => {
                out.push(up);
                out.push(down);
                out.extend(dora_scale.iter());
            }
            Adapter::LoHa { w1a, w1b, w2a, w2b, dora_scale, .. } => {
                out.extend([w1a, w1b, w2a, w2b]);
                out.extend(dora_scale.iter());
            }
            Adapter::LoKr { w1, w2, dora_scale, .. } => {
                for f in [w1, w2] {
                    match f {
                        Factor::Full(t) => out.push(t),
                        Factor::Product(a, b) => out.extend([a, b]),
                    }
                }
                out.extend(dora_scale.iter());
            }
            Adapter::Diff(t) | Adapter::Set(t) => out.push(t),
        }
        out
    }

    /// The same adapter with each tensor mapped through `f` (in [`Adapter::tensors`] order).
    fn map<U>(&self, f: &mut impl FnMut(&T) -> U) -> Adapter<U> {
        let factor = |x: &Factor<T>, f: &mut dyn FnMut(&T) -> U| match x {
            Factor::Full(t) => Factor::Full(f(t)),
            Factor::Product(a, b) => {
                let a = f(a);
                Factor::Product(a, f(b))
            }
        };
        match self {
            Adapter::Lora { up, down, alpha, dora_scale } => {
                let up = f(up);
                let down = f(down);
                Adapter::Lora {
                    up,
                    down,
                    alpha: *alpha,
                    dora_scale: dora_scale.as_ref().map(&mut *f),
                }
            }
            Adapter::LoHa { w1a, w1b, w2a, w2b, alpha, dora_scale } => {
                let (w1a, w1b, w2a, w2b) = (f(w1a), f(w1b), f(w2a), f(w2b));
                Adapter::LoHa {
                    w1a,
                    w1b,
                    w2a,
                    w2b,
                    alpha: *alpha,
                    dora_scale: dora_scale.as_ref().map(&mut *f),
                }
            }
            Adapter::LoKr { w1, w2, alpha, dora_scale } => {
                let w1 = factor(w1, f);
                let w2 = factor(w2, f);
                Adapter::LoKr {
                    w1,
                    w2,
                    alpha: *alpha,
                    dora_scale: dora_scale.as_ref().map(&mut *f),
                }
            }
            Adapter::Diff(t) => Adapter::Diff(f(t)),
            Adapter::Set(t) => Adapter::Set(f(t)),
        }
    }
}

/// The patches of one weight, on the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PatchSet {
    /// Applied in order.
    pub patches: Vec<Patch<PatchTensor>>,
}

/// Where each tensor of a [`PatchSet`] lies in its packed image.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchLayout {
    /// Per patch, per tensor (in [`Adapter`] order): offset in the image, dtype, shape.
    entries: Vec<Vec<(usize, DType, Vec<usize>)>>,
    /// The patches' strengths and scalar parameters, with tensor indices in place of tensors.
    shapes: Vec<Patch<usize>>,
    /// Image size in bytes.
    size: usize,
}

impl PatchSet {
    /// The packed image (every tensor back to back, 256-byte aligned) and its layout.
    pub fn pack(&self) -> Result<(Vec<u8>, PatchLayout)> {
        let mut image = Vec::new();
        let mut entries = Vec::new();
        let mut shapes = Vec::new();
        for patch in &self.patches {
            let mut tensors = Vec::new();
            let mut index = 0;
            for t in patch.adapter.tensors() {
                t.check()?;
                image.resize(image.len().next_multiple_of(PACK_ALIGN), 0);
                tensors.push((image.len(), t.dtype, t.shape.clone()));
                image.extend_from_slice(&t.bytes);
            }
            let adapter = patch.adapter.map(&mut |_| {
                index += 1;
                index - 1
            });
            shapes.push(Patch {
                strength: patch.strength,
                strength_model: patch.strength_model,
                adapter,
            });
            entries.push(tensors);
        }
        let size = image.len();
        Ok((image, PatchLayout { entries, shapes, size }))
    }
}

impl PatchLayout {
    /// Bytes of device memory the patches need (the "measure" mode).
    pub fn measure(&self) -> usize {
        self.size
    }

    /// The patches as device views of an image copied to `base` (the "lay out" mode; no copy).
    pub fn views<'a>(&self, base: DevPtr) -> Vec<Patch<Weight<'a>>> {
        self.shapes
            .iter()
            .zip(&self.entries)
            .map(|(patch, tensors)| {
                let adapter = patch.adapter.map(&mut |&i| {
                    let (offset, dtype, ref shape) = tensors[i];
                    Weight::new(base.offset(offset as u64), dtype, shape.clone())
                });
                Patch { strength: patch.strength, strength_model: patch.strength_model, adapter }
            })
            .collect()
    }
}

/// A seed for stochastic rounding derived from a weight's key (stable across runs and machines).
pub fn seed_for_key(key: &str) -> u64 {
    // FNV-1a, 64 bit.
    key.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Patches `target` in place: computes the patched weight in f32 and writes it over `target`'s bytes in its
/// stored type, rounding stochastically with `seed` (see [`seed_for_key`]).
pub fn apply<B: Backend>(
    b: &B,
    target: &Weight<'_>,
    patches: &[Patch<Weight<'_>>],
    seed: u64,
) -> Result<()> {
    let w = patched(b, target, patches)?;
    b.store(&w, target.ptr(), target.dtype(), Some(seed))
}

/// Patches a per-tensor scaled fp8 weight ([`crate::quant::Quant::Tensor`]) in place the way ComfyUI
/// re-quantizes one (`requantize_from_float` with `scale="recalculate"`): its values times their scale,
/// patched in f32 as [`apply`] does, a new scale — the patched weight's largest magnitude over the largest
/// finite value of the fp8 type — and `W · (1/scale)` stored with stochastic rounding. Returns the new scale,
/// which the weight's readers must use from then on.
///
/// `known` is the scale an earlier application of the same patches to the same original found: the result is
/// a function of those, so a weight patched again at each fetch (streamed, not resident) skips reading the
/// patched values back to find their largest magnitude.
pub fn apply_requantized<B: Backend>(
    b: &B,
    target: &Weight<'_>,
    patches: &[Patch<Weight<'_>>],
    seed: u64,
    known: Option<f32>,
) -> Result<f32> {
    let largest = match target.dtype() {
        fp8 @ (DType::F8E4M3 | DType::F8E5M2) => fp8.max_finite(),
        other => {
            return Err(Error::Unsupported(format!(
                "re-quantizing a patched {other} weight with a per-tensor scale (fp8 only)"
            )));
        }
    };
    let w = patched(b, target, patches)?;
    let scale = match known {
        Some(scale) => scale,
        None => {
            let amax = b.to_f32(&w)?.iter().fold(0f32, |m, v| m.max(v.abs()));
            // An all-zero weight stays zero under any scale; ComfyUI's 0 would divide by zero.
            if amax > 0.0 { amax / largest } else { 1.0 }
        }
    };
    let scaled = b.affine(&w, 1.0 / scale, 0.0)?;
    b.store(&scaled, target.ptr(), target.dtype(), Some(seed))?;
    Ok(scale)
}

/// Patches an `int8_tensorwise` weight ([`Quant::Int8`]) in place the way ComfyUI re-quantizes one
/// (`requantize_from_float` with `scale="recalculate"`, comfy-kitchen's `quantize_int8_convrot_weight` /
/// `quantize_int8_rowwise` / `quantize_int8_tensorwise`): its values dequantized (rotated back), patched in f32
/// as [`apply`] does, rotated again by ConvRot's Hadamard groups when the format has them, then new scales —
/// each row's (or the whole weight's) largest magnitude over 127, at least 1e-30 — and `⌊W / s + u⌋` clamped to
/// ±127/−128 with `u` a uniform draw per element (stochastic rounding; Kiln's draw from `seed`, as [`apply`]'s,
/// not torch's generator). The values and the scale table are written over the weight's bytes; its readers
/// keep reading the format as before.
///
/// The rounding runs on the host (a patched weight is re-quantized once per patch set when resident, at each
/// fetch when streamed).
pub fn apply_requantized_int8<B: Backend>(
    b: &B,
    target: &Weight<'_>,
    patches: &[Patch<Weight<'_>>],
    seed: u64,
) -> Result<()> {
    let Quant::Int8 { per_row, convrot, .. } = target.quant() else {
        return Err(Error::Unsupported(format!(
            "re-quantizing a {} weight as int8",
            target.quant().name()
        )));
    };
    let w = patched(b, target, patches)?;
    let mut values = b.to_f32(&w)?;
    let rows = if per_row { target.shape().first().copied().unwrap_or(1) } else { 1 };
    if rows == 0 || values.len() % rows != 0 {
        return Err(Error::Unsupported(format!(
            "re-quantizing an int8 weight of shape {:?} by rows",
            target.shape()
        )));
    }
    let width = values.len() / rows;
    if let Some(g) = convrot {
        if width % g != 0 {
            return Err(Error::Unsupported(format!(
                "ConvRot groups of {g} across rows of {width} values"
            )));
        }
        crate::quant::hadamard_rotate(&mut values, g);
    }
    let scales: Vec<f32> = values.chunks_exact(width).map(crate::quant::int8_scale).collect();
    for (r, row) in values.chunks_exact_mut(width).enumerate() {
        let s = scales[r];
        for (i, v) in row.iter_mut().enumerate() {
            let u = crate::backend::cpu::store::uniform(seed, (r * width + i) as u64);
            *v = (*v / s + u).floor().clamp(-128.0, 127.0);
        }
    }
    let q = b.from_f32(target.shape(), &values, DType::F32)?;
    b.store(&q, target.ptr(), DType::I8, None)?;
    let table = b.from_f32(&[scales.len()], &scales, DType::F32)?;
    b.store(&table, target.table(), DType::F32, None)
}

/// The weight's values (its quantization scale applied) with every patch applied, in f32.
fn patched<B: Backend>(
    b: &B,
    target: &Weight<'_>,
    patches: &[Patch<Weight<'_>>],
) -> Result<Tensor<B>> {
    let mut w = b.weight_to_tensor(target, DType::F32)?;
    for patch in patches {
        if patch.strength_model != 1.0 {
            w = b.affine(&w, patch.strength_model, 0.0)?;
        }
        w = apply_one(b, &w, patch)?;
    }
    Ok(w)
}

fn f32_of<B: Backend>(b: &B, t: &Weight<'_>) -> Result<Tensor<B>> {
    b.weight_to_tensor(t, DType::F32)
}

/// `t` as a matrix: first dimension by the product of the rest.
fn matrix<B: Backend>(b: &B, t: &Weight<'_>) -> Result<Tensor<B>> {
    let x = f32_of(b, t)?;
    let rows = *t.shape().first().ok_or_else(|| Error::shape("lora", "a rank-0 factor"))?;
    x.reshape(&[rows, usize::MAX])
}

fn product<B: Backend>(b: &B, a: &Weight<'_>, c: &Weight<'_>) -> Result<Tensor<B>> {
    b.matmul(&matrix(b, a)?, &matrix(b, c)?, false)
}

fn rank_scale(alpha: Option<f32>, rank: usize) -> f32 {
    match alpha {
        Some(alpha) if rank > 0 => alpha / rank as f32,
        _ => 1.0,
    }
}

fn apply_one<B: Backend>(b: &B, w: &Tensor<B>, patch: &Patch<Weight<'_>>) -> Result<Tensor<B>> {
    let shape = w.shape().to_vec();
    let (diff, scale, dora) = match &patch.adapter {
        Adapter::Set(v) => return f32_of(b, v)?.reshape(&shape).map_err(mismatch),
        Adapter::Diff(d) => {
            if d.numel() != w.numel() {
                tracing::warn!(weight = ?shape, diff = ?d.shape(), "a diff patch of another shape is skipped");
                return Ok(w.clone());
            }
            (f32_of(b, d)?, 1.0, None)
        }
        Adapter::Lora { up, down, alpha, dora_scale } => {
            let rank = *down.shape().first().unwrap_or(&0);
            (product(b, up, down)?, rank_scale(*alpha, rank), dora_scale.as_ref())
        }
        Adapter::LoHa { w1a, w1b, w2a, w2b, alpha, dora_scale } => {
            let rank = *w1b.shape().first().unwrap_or(&0);
            let d = b.binary(&product(b, w1a, w1b)?, &product(b, w2a, w2b)?, BinaryOp::Mul)?;
            (d, rank_scale(*alpha, rank), dora_scale.as_ref())
        }
        Adapter::LoKr { w1, w2, alpha, dora_scale } => {
            let mut rank = None;
            let mut factor = |f: &Factor<Weight<'_>>| -> Result<Tensor<B>> {
                match f {
                    Factor::Full(t) => matrix(b, t),
                    Factor::Product(a, c) => {
                        rank = c.shape().first().copied();
                        product(b, a, c)
                    }
                }
            };
            let (a, c) = (factor(w1)?, factor(w2)?);
            let scale = match rank {
                Some(r) => rank_scale(*alpha, r),
                None => 1.0,
            };
            (kron(b, &a, &c)?, scale, dora_scale.as_ref())
        }
    };
    let diff = diff.reshape(&shape).map_err(mismatch)?;
    match dora {
        None => b.binary(w, &b.affine(&diff, patch.strength * scale, 0.0)?, BinaryOp::Add),
        Some(dora_scale) => decompose(b, w, &diff, scale, patch.strength, dora_scale),
    }
}

fn mismatch(e: Error) -> Error {
    Error::shape("lora", format!("a patch does not fit its weight: {e}"))
}

/// kron(a, c) of two matrices: `[a0·c0, a1·c1]`.
fn kron<B: Backend>(b: &B, a: &Tensor<B>, c: &Tensor<B>) -> Result<Tensor<B>> {
    let (a0, a1) = (a.dim(0)?, a.dim(1)?);
    let (c0, c1) = (c.dim(0)?, c.dim(1)?);
    let prod =
        b.binary(&a.reshape(&[a0, 1, a1, 1])?, &c.reshape(&[1, c0, 1, c1])?, BinaryOp::Mul)?;
    prod.reshape(&[a0 * c0, a1 * c1])
}

/// DoRA (memory-manager.md §6.1): `Wc = W + scale·ΔW`, normalised per output row when the DoRA scale has one
/// value per row, else per input column, times the DoRA scale; then `W + strength·(Wc − W)`.
fn decompose<B: Backend>(
    b: &B,
    w: &Tensor<B>,
    diff: &Tensor<B>,
    scale: f32,
    strength: f32,
    dora_scale: &Weight<'_>,
) -> Result<Tensor<B>> {
    let rows = w.dim(0)?;
    let cols = w.numel() / rows.max(1);
    let wc = b.binary(w, &b.affine(diff, scale, 0.0)?, BinaryOp::Add)?.reshape(&[rows, cols])?;
    let magnitude = f32_of(b, dora_scale)?;
    let per_row = magnitude.numel() == rows;
    // rms_norm(x) = x / rms(x) = x·√n / ‖x‖, so x·m/‖x‖ = rms_norm(x)·m/√n.
    let normalised = if per_row {
        let n = b.rms_norm(&wc, None, f32::EPSILON)?;
        let m = magnitude.reshape(&[rows, 1])?;
        b.affine(&b.binary(&n, &m, BinaryOp::Mul)?, 1.0 / (cols as f32).sqrt(), 0.0)?
    } else {
        if magnitude.numel() != cols {
            return Err(Error::shape(
                "dora",
                format!("{} magnitudes for a {rows}×{cols} weight", magnitude.numel()),
            ));
        }
        let t = b.permute(&wc, &[1, 0])?;
        let n = b.rms_norm(&t, None, f32::EPSILON)?;
        let m = magnitude.reshape(&[cols, 1])?;
        let scaled =
            b.affine(&b.binary(&n, &m, BinaryOp::Mul)?, 1.0 / (rows as f32).sqrt(), 0.0)?;
        b.permute(&scaled, &[1, 0])?
    };
    let normalised = normalised.reshape(w.shape())?;
    if strength == 1.0 {
        return Ok(normalised);
    }
    let delta = b.binary(&normalised, w, BinaryOp::Sub)?;
    b.binary(w, &b.affine(&delta, strength, 0.0)?, BinaryOp::Add)
}
