//! ComfyUI's quantized weights on the CPU: dequantizing the row and block formats (MXFP8, NVFP4, int8) a
//! block of rows at a time, and int8's own linear layer, which quantizes its input as comfy-kitchen's
//! `int8_linear` does on every device (weight-formats.md §5.3).

use rayon::prelude::*;

use super::gemm::{Mat, MatMut, Threads, gemm};
use super::int8_dots::{self, I8Rows};
use crate::error::{Error, Result};
use crate::memory::SimDevice;
use crate::quant::{self, Quant};
use crate::tensor::Weight;

/// Weight rows per task of the int8 product: 64 rows of a 4096-wide weight are 256 KiB, an L2's worth.
const INT8_ROWS: usize = 64;

/// The scale table of `w` (the bytes after its values).
fn table(sim: &SimDevice, w: &Weight<'_>, rows: usize, cols: usize) -> Result<Vec<u8>> {
    // A view of some rows still addresses the whole table (block formats) or its own rows' scales (int8).
    let len = match w.quant() {
        Quant::Int8 { per_row: true, .. } => 4 * rows,
        Quant::Int8 { per_row: false, .. } => 4,
        q => q.table_bytes(w.row0() + rows, cols),
    };
    let mut bytes = vec![0u8; len];
    sim.read(w.table(), &mut bytes)?;
    Ok(bytes)
}

/// The f32 scales of an int8 weight, one per row (a tensor scale repeated).
fn int8_scales(bytes: &[u8], rows: usize) -> Vec<f32> {
    let scales: Vec<f32> =
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    match scales[..] {
        [one] => vec![one; rows],
        _ => scales,
    }
}

/// Values `start..start + out.len()` of a weight in a row or block format (flat, row-major over its values),
/// decoded to f32 as comfy-kitchen's eager dequantization computes them in f32.
pub(crate) fn dequantize_range(
    sim: &SimDevice,
    w: &Weight<'_>,
    start: usize,
    out: &mut [f32],
) -> Result<()> {
    let (rows, cols) = w.matrix("dequantize")?;
    if start + out.len() > rows * cols {
        return Err(Error::shape(
            "weight",
            format!("values {start}..{} of {:?}", start + out.len(), w.shape()),
        ));
    }
    if out.is_empty() {
        return Ok(());
    }
    let (r0, r1) = (start / cols, (start + out.len()).div_ceil(cols));
    let table = table(sim, w, rows, cols)?;
    let stored_row = w.numel() / rows * w.dtype().size();
    let mut values = vec![0.0f32; (r1 - r0) * cols];
    // Each task borrows its own row's bytes: a borrow may hold a read lock, so none is held across rayon.
    values.par_chunks_mut(cols).enumerate().try_for_each(|(i, row)| {
        let at = w.ptr().offset(((r0 + i) * stored_row) as u64);
        sim.with_bytes(at, stored_row, &mut |stored| {
            decode_row(w, &table, (r0 + i, cols), stored, row)
        })
    })?;
    let skip = start - r0 * cols;
    out.copy_from_slice(&values[skip..skip + out.len()]);
    Ok(())
}

/// Decodes weight row `r` (of the view) from its stored bytes.
fn decode_row(
    w: &Weight<'_>,
    table: &[u8],
    (r, cols): (usize, usize),
    stored: &[u8],
    out: &mut [f32],
) -> Result<()> {
    let at = w.row0() + r;
    match w.quant() {
        Quant::Mxfp8 => quant::decode_mxfp8(stored, table, (at, 0, cols), out),
        Quant::Nvfp4 { global } => quant::decode_nvfp4(stored, table, global, (at, 0, cols), out),
        Quant::Int8 { per_row, convrot, .. } => {
            let s = if per_row { 4 * r } else { 0 };
            let scale = f32::from_le_bytes([table[s], table[s + 1], table[s + 2], table[s + 3]]);
            for (o, &q) in out.iter_mut().zip(stored) {
                *o = f32::from(q as i8) * scale;
            }
            if let Some(g) = convrot {
                // Rotated back: the stored row is W·H per group, and H is its own inverse.
                let rotated = out.to_vec();
                rotate(&rotated, g, out, Threads::One)?;
            }
        }
        Quant::None | Quant::Tensor(_) => {
            return Err(Error::Unsupported(format!(
                "decoding a {} weight by rows",
                w.quant().name()
            )));
        }
    }
    Ok(())
}

/// `out = x · H_g` per group of `g` consecutive values (rows of x of any length divisible by g).
fn rotate(x: &[f32], g: usize, out: &mut [f32], threads: Threads) -> Result<()> {
    let h = quant::hadamard(g).ok_or_else(|| {
        Error::Unsupported(format!("a ConvRot group of {g} (ComfyUI's groups are powers of 4)"))
    })?;
    if !x.len().is_multiple_of(g) {
        return Err(Error::shape("convrot", format!("{} values in groups of {g}", x.len())));
    }
    let groups = x.len() / g;
    gemm(
        groups,
        g,
        g,
        MatMut::rows(out, g),
        Mat::rows(x, g),
        Mat::rows(&h, g),
        false,
        1.0,
        threads,
    );
    Ok(())
}

/// `out [m, n] = x [m, k] · Wᵀ` for an `int8_tensorwise` weight, as comfy-kitchen's `int8_linear`: x rotated
/// (ConvRot), quantized to int8 per row, multiplied in exact integer arithmetic, and each product scaled by
/// `f32(acc) · (s_x · s_w)`. The bias is the caller's.
pub(crate) fn linear_int8(
    sim: &SimDevice,
    x: &[f32],
    w: &Weight<'_>,
    (m, n, k): (usize, usize, usize),
    out: &mut [f32],
) -> Result<()> {
    let Quant::Int8 { convrot, .. } = w.quant() else {
        return Err(Error::Unsupported(format!(
            "an int8 product on a {} weight",
            w.quant().name()
        )));
    };
    if m == 0 || n == 0 || k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let rotated;
    let x = match convrot {
        Some(g) => {
            let mut r = vec![0.0f32; x.len()];
            rotate(x, g, &mut r, Threads::All)?;
            rotated = r;
            &rotated[..]
        }
        None => x,
    };
    let mut qx = vec![0i8; m * k];
    let mut sx = vec![0.0f32; m];
    qx.par_chunks_mut(k.max(1))
        .zip(sx.par_iter_mut())
        .zip(x.par_chunks(k.max(1)))
        .for_each(|((q, s), row)| *s = quant::quantize_row_i8(row, q));
    let sw = int8_scales(&table(sim, w, n, k)?, n);
    let xrows = I8Rows::new(&qx, k);
    let blocks: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(INT8_ROWS))
        .into_par_iter()
        .map(|b| {
            let j0 = b * INT8_ROWS;
            let rows = INT8_ROWS.min(n - j0);
            let mut acc = vec![0i32; m * rows];
            sim.with_bytes(w.ptr().offset((j0 * k) as u64), rows * k, &mut |bytes| {
                let wq: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
                int8_dots::dots(&xrows, &wq, &mut acc);
                Ok(())
            })?;
            let (sx, sw) = (&sx, &sw[j0..j0 + rows]);
            let block = acc
                .chunks_exact(rows)
                .zip(sx)
                .flat_map(|(row, &s)| row.iter().zip(sw).map(move |(&a, &t)| a as f32 * (s * t)))
                .collect();
            Ok((j0, block))
        })
        .collect::<Result<_>>()?;
    for (j0, block) in blocks {
        let rows = INT8_ROWS.min(n - j0);
        for (orow, brow) in out.chunks_exact_mut(n).zip(block.chunks_exact(rows)) {
            orow[j0..j0 + rows].copy_from_slice(brow);
        }
    }
    Ok(())
}
