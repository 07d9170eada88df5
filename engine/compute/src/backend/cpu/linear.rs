//! Products on the CPU: `linear` (activations times a stored weight), batched `matmul` and `embedding`.
//!
//! On CPUs with AVX-512, or AVX2 with FMA and F16C, `linear` runs [`super::packed_gemm`]: the weight is widened
//! while it is packed for the micro-kernel (for a few rows of activations, [`super::skinny`] widens it in place
//! without packing), and bf16 activations times bf16 weights skip widening altogether (AVX512-BF16). Elsewhere
//! the weight `[N, K]` is widened to f32 in blocks of rows, each block multiplied with the `gemm` crate as
//! soon as it is widened, so no `N × K` f32 buffer is allocated for a large weight.

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::Cpu;
use super::gemm::{Mat, MatMut, Threads, gemm};
use super::packed_gemm::{self, Bf16, F32, Kind, WeightRows};
use super::skinny;
use super::storage::{Data, data, read_f32, tensor_from_f32};
use super::weights::{vector, widen_range};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Quant;
use crate::tensor::{Tensor, Weight, numel};

/// Elements of a linear weight widened (and multiplied) at a time for a product of few rows: large enough
/// that the product of a block keeps every thread busy and amortises packing x, small enough that the
/// widened block is not a fresh allocation the size of the weight (whose page faults cost more than the
/// product at 256 rows). Measured on the Z-Image shapes (`benches/cpu_ops.rs`).
const WEIGHT_BLOCK_ELEMS: usize = 1 << 22;

/// `x · wᵀ (+ bias)` (see [`crate::Backend::linear`]).
pub(crate) fn linear(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    w: &Weight<'_>,
    bias: Option<&Weight<'_>>,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "linear";
    let (&k, lead) = x
        .shape()
        .split_last()
        .ok_or_else(|| Error::shape(OP, "x must have at least one dimension"))?;
    let (n, wk) = w.matrix(OP)?;
    if wk != k {
        return Err(Error::shape(
            OP,
            format!("x {:?} has {k} features, weight {:?} takes {wk}", x.shape(), w.shape()),
        ));
    }
    let bias = vector(cpu.sim(), OP, "bias", bias, n)?;
    let m = numel(lead);
    let mut out = vec![0.0f32; m * n];
    let row_bytes = k * w.dtype().size();
    let read_rows = |row: usize, count: usize, f: &mut dyn FnMut(&[u8]) -> Result<()>| {
        cpu.sim().with_bytes(w.ptr().offset((row * row_bytes) as u64), count * row_bytes, f)
    };
    match data(x, OP)? {
        // ComfyUI runs int8 weights with int8 activations on every device.
        _ if matches!(w.quant(), Quant::Int8 { activations: true, .. }) => {
            super::quant::linear_int8(cpu.sim(), &read_f32(x, OP)?, w, (m, n, k), &mut out)?;
        }
        // bf16 activations times bf16 weights: exact products accumulated in f32, at twice the f32 rate.
        Data::BF16(xv)
            if w.dtype() == DType::BF16
                && w.scale().is_none()
                && k % 2 == 0
                && Bf16::available() =>
        {
            packed_gemm::matmul_bt::<Bf16>(
                xv.reinterpret_cast(),
                m,
                n,
                k,
                (DType::BF16, None),
                &read_rows,
                &mut out,
            )?;
        }
        // The block formats are decoded to f32 as they are read, then multiplied by the same kernel as an f32
        // weight holding their values (so a file and its dequantized twin give the same bits).
        _ if F32::available() && w.quant().has_table() => {
            let read_values = |row: usize, count: usize, f: &mut dyn FnMut(&[u8]) -> Result<()>| {
                let mut values = vec![0.0f32; count * k];
                super::quant::dequantize_range(cpu.sim(), w, row * k, &mut values)?;
                // Native byte order is the kernel's: this path runs only where AVX-512 or AVX2 does (x86).
                f(bytemuck::cast_slice(&values))
            };
            f32_product(&read_f32(x, OP)?, (m, n, k), (DType::F32, None), &read_values, &mut out)?;
        }
        _ if F32::available() => {
            f32_product(
                &read_f32(x, OP)?,
                (m, n, k),
                (w.dtype(), w.scale()),
                &read_rows,
                &mut out,
            )?;
        }
        _ => {
            // Larger blocks for many rows: each block's product repacks x, which costs more the more rows.
            let block_elems = if m >= 1024 { WEIGHT_BLOCK_ELEMS * 4 } else { WEIGHT_BLOCK_ELEMS };
            linear_into(cpu, &read_f32(x, OP)?, w, (m, n, k), block_elems, &mut out)?;
        }
    }
    if let Some(bias) = bias {
        add_row_bias(&mut out, &bias);
    }
    let mut shape = lead.to_vec();
    shape.push(n);
    tensor_from_f32(shape, out, x.dtype(), OP)
}

/// `out [m, n] = x [m, k] · wᵀ` on AVX-512 or AVX2 for f32 activations: few rows without packing
/// ([`skinny`]), more through the packed micro-kernels.
fn f32_product(
    x: &[f32],
    (m, n, k): (usize, usize, usize),
    stored: (DType, Option<f32>),
    read_rows: &WeightRows<'_>,
    out: &mut [f32],
) -> Result<()> {
    if m <= skinny::MAX_ROWS && skinny::available() {
        skinny::matmul_bt(x, m, n, k, stored, read_rows, out)
    } else {
        packed_gemm::matmul_bt::<F32>(x, m, n, k, stored, read_rows, out)
    }
}

/// `out [m, n] = x [m, k] · wᵀ` with `w` `[n, k]` widened in blocks of about `block_elems` elements.
fn linear_into(
    cpu: &Cpu,
    x: &[f32],
    w: &Weight<'_>,
    (m, n, k): (usize, usize, usize),
    block_elems: usize,
    out: &mut [f32],
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let block_rows = (block_elems / k.max(1)).clamp(1, n);
    let mut block = vec![0.0f32; block_rows * k];
    let mut n0 = 0;
    while n0 < n {
        let rows = block_rows.min(n - n0);
        let wb = &mut block[..rows * k];
        widen_range(cpu.sim(), w, n0 * k, wb)?;
        let dst = MatMut { data: &mut out[n0..], rs: n, cs: 1 };
        gemm(m, rows, k, dst, Mat::rows(x, k), Mat::rows_t(wb, k), false, 1.0, Threads::All);
        n0 += rows;
    }
    Ok(())
}

/// Adds `bias` to every row of `out` (rows of `bias.len()`).
pub(crate) fn add_row_bias(out: &mut [f32], bias: &[f32]) {
    let n = bias.len();
    if n == 0 {
        return;
    }
    let rows_per_task = (super::storage::PAR_CHUNK / n).max(1);
    out.par_chunks_mut(rows_per_task * n).for_each(|rows| {
        for row in rows.chunks_exact_mut(n) {
            for (o, b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        }
    });
}

/// Batched `a · b` or `a · bᵀ` (see [`crate::Backend::matmul`]).
pub(crate) fn matmul(a: &Tensor<Cpu>, b: &Tensor<Cpu>, transpose_b: bool) -> Result<Tensor<Cpu>> {
    const OP: &str = "matmul";
    let (ra, rb) = (a.shape().len(), b.shape().len());
    if ra < 2 || ra != rb {
        return Err(Error::shape(
            OP,
            format!("a {:?} and b {:?} need equal ranks of at least 2", a.shape(), b.shape()),
        ));
    }
    let (batch_a, mk) = a.shape().split_at(ra - 2);
    let (batch_b, bk) = b.shape().split_at(rb - 2);
    if batch_a != batch_b {
        return Err(Error::shape(
            OP,
            format!("batch dims differ: a {:?}, b {:?}", a.shape(), b.shape()),
        ));
    }
    let (m, k) = (mk[0], mk[1]);
    let (kb, n) = if transpose_b { (bk[1], bk[0]) } else { (bk[0], bk[1]) };
    if kb != k {
        return Err(Error::shape(
            OP,
            format!(
                "a {:?} and b {:?} (transpose_b {transpose_b}) have different inner dims",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let batch = numel(batch_a);
    let (av, bv) = (read_f32(a, OP)?, read_f32(b, OP)?);
    let mut out = vec![0.0f32; batch * m * n];
    let one = |i: usize, dst: &mut [f32], threads: Threads| {
        let ai = &av[i * m * k..(i + 1) * m * k];
        let bi = &bv[i * k * n..(i + 1) * k * n];
        let rhs = if transpose_b { Mat::rows_t(bi, k) } else { Mat::rows(bi, n) };
        gemm(m, n, k, MatMut::rows(dst, n), Mat::rows(ai, k), rhs, false, 1.0, threads);
    };
    if m * n > 0 {
        // Small products run one per thread; large ones each use every thread.
        if batch > 1 && m * n * k < (1 << 22) {
            out.par_chunks_mut(m * n).enumerate().for_each(|(i, dst)| one(i, dst, Threads::One));
        } else {
            out.chunks_mut(m * n).enumerate().for_each(|(i, dst)| one(i, dst, Threads::All));
        }
    }
    let mut shape = batch_a.to_vec();
    shape.extend([m, n]);
    tensor_from_f32(shape, out, a.dtype(), OP)
}

/// Rows of `table` at `ids` (see [`crate::Backend::embedding`]).
pub(crate) fn embedding(cpu: &Cpu, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<Cpu>> {
    const OP: &str = "embedding";
    let &[v, d] = table.shape() else {
        return Err(Error::shape(OP, format!("table must be [V, D], got {:?}", table.shape())));
    };
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= v) {
        return Err(Error::shape(OP, format!("id {bad} is out of range for a table of {v} rows")));
    }
    let mut out = vec![0.0f32; ids.len() * d];
    if d > 0 {
        out.par_chunks_mut(d)
            .zip(ids.par_iter())
            .try_for_each(|(row, &id)| widen_range(cpu.sim(), table, id as usize * d, row))?;
    }
    tensor_from_f32(vec![ids.len(), d], out, cpu.compute_dtype(), OP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::OwnedWeight;

    #[test]
    fn the_portable_path_crosses_weight_blocks() {
        // `linear` takes the SIMD kernels where it can; this runs the gemm-crate path with blocks of 3 rows.
        let cpu = Cpu::new(1 << 20);
        let (m, n, k) = (3, 10, 4);
        let xv: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.25 - 1.0).collect();
        let wv: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let w = OwnedWeight::from_f32(cpu.memory(), DType::BF16, &[n, k], &wv).expect("weight");
        let mut out = vec![f32::NAN; m * n];
        linear_into(&cpu, &xv, &w.view(), (m, n, k), 3 * k, &mut out).expect("linear");
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|l| xv[i * k + l] * wv[j * k + l]).sum();
                assert_eq!(out[i * n + j], want, "({i}, {j})");
            }
        }
    }
}
