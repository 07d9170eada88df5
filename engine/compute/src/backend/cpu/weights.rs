//! Weights on the CPU backend: their bytes live in the [`SimDevice`] in the stored dtype (f32, f16, bf16,
//! fp8) and are widened to f32 each time an op reads them ("widened per layer").
//!
//! Reading and widening are fused in chunks that stay in cache, in parallel; nothing here keeps a widened copy
//! past the op that asked for it.

use rayon::prelude::*;

use crate::dtype::widen_into;
use crate::error::{Error, Result};
use crate::memory::SimDevice;
use crate::tensor::Weight;

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
        sim.with_bytes(at, chunk.len() * size, &mut |bytes| {
            widen_into(dtype, bytes, chunk);
            Ok(())
        })?;
        if let Some(scale) = w.scale() {
            // ComfyUI's dequantization on the CPU (compute in f32): f32(q) · scale, rounded once.
            chunk.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    })
}

/// Every value of `w` as f32.
pub(crate) fn widen(sim: &SimDevice, w: &Weight<'_>) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; w.values()];
    widen_range(sim, w, 0, &mut out)?;
    Ok(out)
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
