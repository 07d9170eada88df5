//! Weights on the CPU backend: their bytes live in the [`SimDevice`] in the stored dtype (f32, f16, bf16,
//! fp8) and are widened to f32 each time an op reads them ("widened per layer").
//!
//! Reading and widening are fused in chunks that stay in cache, in parallel. A convolution's kernel is widened
//! whole, into a buffer its thread keeps for the next one, or lent where it lies when it is stored as plain f32
//! ([`with_f32`]).

use half::{bf16, f16};
use rayon::prelude::*;

use super::packed_gemm::{widen_simd, with_thread_buffer};
use crate::backend::{causal_geometry, generic_causal_taps};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::SimDevice;
use crate::quant::Quant;
use crate::tensor::{OwnedWeight, Weight};

/// Elements widened per rayon task.
const CHUNK: usize = 1 << 15;

/// Values `start..start + out.len()` of `w` (flat, row-major) widened into `out` (decoded, for the row and
/// block formats of quantized weights).
pub(crate) fn widen_range(
    sim: &SimDevice,
    w: &Weight<'_>,
    start: usize,
    out: &mut [f32],
) -> Result<()> {
    if w.quant().has_table() {
        return super::quant::dequantize_range(sim, w, start, out);
    }
    if start + out.len() > w.numel() {
        return Err(Error::shape(
            "weight",
            format!("elements {start}..{} of {:?}", start + out.len(), w.shape()),
        ));
    }
    let dtype = w.dtype();
    let size = dtype.size();
    let base = w.ptr().offset((start * size) as u64);
    out.par_chunks_mut(CHUNK).enumerate().try_for_each(|(i, chunk)| {
        let at = base.offset((i * CHUNK * size) as u64);
        // With the CPU's widest vectors (the conversions compiled for AVX2 or AVX-512), and scaled as ComfyUI
        // dequantizes on the CPU (compute in f32): f32(q) · scale, rounded once.
        sim.with_bytes(at, chunk.len() * size, &mut |bytes| {
            widen_simd(dtype, bytes, chunk, w.scale());
            Ok(())
        })
    })
}

/// Every value of `w` as f32.
pub(crate) fn widen(sim: &SimDevice, w: &Weight<'_>) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; w.values()];
    widen_range(sim, w, 0, &mut out)?;
    Ok(out)
}

/// `f` on every value of `w` as f32: the stored values themselves where `w` is plain f32 (no scale, no
/// quantization) lying aligned in memory or in a mapped file, else a widened copy in a buffer the thread keeps
/// ([`with_widened`]).
///
/// `f` runs while the weight's bytes are lent (under their region's read lock, for memory): it must not touch
/// device memory itself, and nothing may write the weight meanwhile. Weights are written only between ops, on
/// the compute thread, so an op that reads its weight through here holds that.
pub(crate) fn with_f32<R>(
    sim: &SimDevice,
    w: &Weight<'_>,
    f: impl FnOnce(&[f32]) -> Result<R>,
) -> Result<R> {
    // The stored bytes are little-endian.
    let plain = w.dtype() == DType::F32 && w.scale().is_none() && w.quant() == Quant::None;
    if !plain || cfg!(target_endian = "big") {
        return with_widened(sim, w, f);
    }
    let mut f = Some(f);
    let mut answer = None;
    sim.with_bytes(w.ptr(), w.numel() * 4, &mut |bytes| {
        if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes)
            && let Some(f) = f.take()
        {
            answer = Some(f(values));
        }
        Ok(())
    })?;
    match (answer, f) {
        (Some(answer), _) => answer,
        // Bytes not aligned for f32: the copy.
        (None, Some(f)) => with_widened(sim, w, f),
        (None, None) => unreachable!("`f` is taken only where `answer` is set"),
    }
}

thread_local! {
    /// The buffer [`with_widened`] widens into, kept by each thread for its next weight: a convolution's kernel
    /// is widened at every call (a video VAE's taps, frame after frame), and a fresh buffer of tens of MB is
    /// fresh pages the kernel must fault in and zero each time.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` on `w`'s values widened into this thread's [`WIDENED`] buffer (grown to the largest weight the thread has
/// widened: a VAE's largest kernel, 38 MB for a 1024-channel 3×3 one), or into a new one while the thread's is
/// in use ([`with_thread_buffer`]).
fn with_widened<R>(
    sim: &SimDevice,
    w: &Weight<'_>,
    f: impl FnOnce(&[f32]) -> Result<R>,
) -> Result<R> {
    with_thread_buffer(&WIDENED, |buffer| {
        let n = w.values();
        if buffer.len() < n {
            buffer.resize(n, 0.0);
        }
        let values = &mut buffer[..n];
        widen_range(sim, w, 0, values)?;
        f(values)
    })
}

/// Rows of a causal weight (one (output, input) pair's `kt·kh·kw` values) widened per rayon task.
const TAP_ROWS: usize = 1024;

/// [`crate::Backend::causal_taps`] in one pass, into f32, f16 or bf16: each block of the weight's rows is widened
/// into a small buffer and each kept tap's values written from it where they lie in the new weight, in place.
/// Other dtypes (fp8), and NVFP4 sources, take the backend's generic reorder.
pub(crate) fn causal_taps(
    cpu: &super::Cpu,
    w: &Weight<'_>,
    first: usize,
    dtype: DType,
) -> Result<OwnedWeight> {
    let [o, i, kt, kh, kw] = causal_geometry(w, first)?;
    let fused = matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && cfg!(target_endian = "little")
        // NVFP4 packs two values a byte: its values are not its shape's.
        && w.values() == w.numel();
    if !fused {
        return generic_causal_taps(cpu, w, first, dtype);
    }
    let (rows, tap) = (o * i, kh * kw);
    let taps = OwnedWeight::allocate(cpu, &[kt - first, o, i, kh, kw], dtype)?;
    if rows * tap == 0 {
        return Ok(taps);
    }
    let geometry = TapGeometry { rows, tap, kt, first };
    let len = (kt - first) * rows * tap * dtype.size();
    let sim = cpu.sim();
    let mut aligned = true;
    sim.fill(taps.view().ptr(), len, &mut |bytes| match dtype {
        DType::F32 => match bytemuck::try_cast_slice_mut::<u8, f32>(bytes) {
            Ok(out) => scatter_taps(geometry, out, widen_block(sim, w), |v| v),
            Err(_) => {
                aligned = false;
                Ok(())
            }
        },
        _ => match bytemuck::try_cast_slice_mut::<u8, u16>(bytes) {
            // Stored in the dtype asked for, unscaled: the bits move as they are.
            Ok(out) if w.dtype() == dtype && w.scale().is_none() && w.quant() == Quant::None => {
                scatter_taps(geometry, out, |start, block| read_bits(sim, w, start, block), |v| v)
            }
            Ok(out) if dtype == DType::F16 => {
                scatter_taps(geometry, out, widen_block(sim, w), |v| f16::from_f32(v).to_bits())
            }
            Ok(out) => {
                scatter_taps(geometry, out, widen_block(sim, w), |v| bf16::from_f32(v).to_bits())
            }
            Err(_) => {
                aligned = false;
                Ok(())
            }
        },
    })?;
    if !aligned {
        // Device memory not aligned for the elements (never so for a fresh allocation): the generic reorder.
        return generic_causal_taps(cpu, w, first, dtype);
    }
    Ok(taps)
}

/// A causal weight's layout for [`scatter_taps`]: `rows` (output, input) pairs of `kt` taps of `tap` values,
/// taps `first..` kept.
#[derive(Clone, Copy)]
struct TapGeometry {
    rows: usize,
    tap: usize,
    kt: usize,
    first: usize,
}

/// Reads `w`'s values `start..` as f32 into a block (see [`scatter_taps`]).
fn widen_block<'a>(
    sim: &'a SimDevice,
    w: &'a Weight<'_>,
) -> impl Fn(usize, &mut [f32]) -> Result<()> + Sync + 'a {
    move |start, block| widen_range(sim, w, start, block)
}

/// `w`'s stored 16-bit values `start..start + block.len()`, as they are.
fn read_bits(sim: &SimDevice, w: &Weight<'_>, start: usize, block: &mut [u16]) -> Result<()> {
    if start + block.len() > w.numel() || w.dtype().size() != 2 {
        return Err(Error::shape(
            "weight",
            format!("16-bit elements {start}..{} of {:?}", start + block.len(), w.shape()),
        ));
    }
    sim.with_bytes(w.ptr().offset((start * 2) as u64), block.len() * 2, &mut |bytes| {
        for (v, b) in block.iter_mut().zip(bytes.chunks_exact(2)) {
            *v = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    })
}

/// Writes taps `first..` of a weight into `out` `[kt − first, rows, tap]`, each value through `encode`: task b
/// reads rows b·[`TAP_ROWS`].. (every tap of them) with `read(first value, block)` and writes each kept tap's
/// part of them.
fn scatter_taps<S: Copy + Default + Send, T: Send>(
    TapGeometry { rows, tap, kt, first }: TapGeometry,
    out: &mut [T],
    read: impl Fn(usize, &mut [S]) -> Result<()> + Sync,
    encode: impl Fn(S) -> T + Sync,
) -> Result<()> {
    let mut per_tap: Vec<_> =
        out.chunks_mut(rows * tap).map(|t| t.chunks_mut(TAP_ROWS * tap)).collect();
    let blocks: Vec<Vec<&mut [T]>> = (0..rows.div_ceil(TAP_ROWS))
        .map(|_| per_tap.iter_mut().filter_map(Iterator::next).collect())
        .collect();
    blocks.into_par_iter().enumerate().try_for_each(|(block, mut outs)| {
        let n = outs.first().map_or(0, |t| t.len() / tap);
        let mut values = vec![S::default(); n * kt * tap];
        read(block * TAP_ROWS * kt * tap, &mut values)?;
        for (j, out) in outs.iter_mut().enumerate() {
            let t = first + j;
            for (dst, src) in out.chunks_mut(tap).zip(values.chunks(kt * tap)) {
                for (d, &v) in dst.iter_mut().zip(&src[t * tap..(t + 1) * tap]) {
                    *d = encode(v);
                }
            }
        }
        Ok(())
    })
}

/// Checks that `w` has exactly `shape` (for weights whose shape an op fixes, as a norm's `[D]`).
pub(crate) fn expect_shape(
    op: &'static str,
    what: &str,
    w: &Weight<'_>,
    shape: &[usize],
) -> Result<()> {
    if w.shape() == shape {
        Ok(())
    } else {
        Err(Error::shape(op, format!("{what} has shape {:?}, expected {shape:?}", w.shape())))
    }
}

/// A per-channel vector (norm weight or bias) of `len` elements, widened; `None` stays `None`.
pub(crate) fn vector(
    sim: &SimDevice,
    op: &'static str,
    what: &str,
    w: Option<&Weight<'_>>,
    len: usize,
) -> Result<Option<Vec<f32>>> {
    match w {
        None => Ok(None),
        Some(w) => {
            expect_shape(op, what, w, &[len])?;
            Ok(Some(widen(sim, w)?))
        }
    }
}
