//! ComfyUI's quantized weights on CUDA (`kernels/quant.cu`): the row and block formats (int8, MXFP8, NVFP4)
//! dequantized into a compute type where a weight is read whole, and int8's own linear layer, which quantizes
//! its input per row and multiplies in integers as comfy-kitchen's `int8_linear` does on every device.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Cuda;
use super::buf::Allocation;
use super::gemm::{LinearShape, linear_shape};
use super::kernels::{Arg, Grid, KernelFile, dtype_code};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{self, Quant};
use crate::tensor::{Tensor, Weight};

/// ConvRot's Hadamard matrices on the device, by group size and element type (built once per backend).
#[derive(Default)]
pub(crate) struct Hadamards(Mutex<HashMap<(usize, DType), Tensor<Cuda>>>);

/// The smallest normal value of a compute type: what torch divides by when a row scale rounds to 0 there.
fn tiny(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 6.103_515_6e-5,
        _ => f32::MIN_POSITIVE,
    }
}

impl Cuda {
    /// ConvRot's `g × g` matrix as a `dtype` tensor.
    fn hadamard(&self, g: usize, dtype: DType) -> Result<Tensor<Cuda>> {
        let mut cache = self.hadamards.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = cache.get(&(g, dtype)) {
            return Ok(h.clone());
        }
        let values = quant::hadamard(g).ok_or_else(|| {
            Error::Unsupported(format!("a ConvRot group of {g} (ComfyUI's groups are powers of 4)"))
        })?;
        let h = self.from_f32(&[g, g], &values, dtype)?;
        cache.insert((g, dtype), h.clone());
        Ok(h)
    }

    /// `x · H_g` per group of g values along the last dimension, in x's type.
    fn rotate(&self, x: &Tensor<Cuda>, g: usize) -> Result<Tensor<Cuda>> {
        if !x.numel().is_multiple_of(g) {
            return Err(Error::shape("convrot", format!("{:?} in groups of {g}", x.shape())));
        }
        let h = self.hadamard(g, x.dtype())?;
        let grouped = x.reshape(&[x.numel() / g, g])?;
        self.op_matmul(&grouped, &h, false)?.reshape(x.shape())
    }

    /// Writes the values of `w`, a weight in a row or block format, as `dtype` at `dst`.
    pub(crate) fn dequantize_ptr(&self, w: &Weight<'_>, dst: u64, dtype: DType) -> Result<()> {
        let (rows, cols) = w.matrix("dequantize")?;
        let n = rows * cols;
        let (ptr, table, row0) = (w.ptr().0, w.table().0, w.row0() as i64);
        match w.quant() {
            Quant::Mxfp8 => self.launch(
                KernelFile::Quant,
                "dequant_mxfp8",
                Grid::linear(n),
                &[
                    Arg::Ptr(ptr),
                    Arg::Ptr(table),
                    Arg::Ptr(dst),
                    Arg::I32(dtype_code(dtype)),
                    Arg::n(rows),
                    Arg::n(cols),
                    Arg::I64(row0),
                ],
            ),
            Quant::Nvfp4 { global } => self.launch(
                KernelFile::Quant,
                "dequant_nvfp4",
                Grid::linear(n),
                &[
                    Arg::Ptr(ptr),
                    Arg::Ptr(table),
                    Arg::F32(global),
                    Arg::Ptr(dst),
                    Arg::I32(dtype_code(dtype)),
                    Arg::n(rows),
                    Arg::n(cols),
                    Arg::I64(row0),
                ],
            ),
            Quant::Int8 { per_row, convrot, .. } => {
                // f32(q) · s in f32, rotated back (ConvRot) in f32, then cast: comfy-kitchen's order.
                let f32s = self.empty(vec![rows, cols], DType::F32)?;
                self.launch(
                    KernelFile::Quant,
                    "dequant_int8",
                    Grid::linear(n),
                    &[
                        Arg::Ptr(ptr),
                        Arg::Ptr(table),
                        Arg::I32(i32::from(per_row)),
                        Arg::Ptr(f32s.buf().ptr().0),
                        Arg::n(rows),
                        Arg::n(cols),
                    ],
                )?;
                let values = match convrot {
                    Some(g) => self.rotate(&f32s, g)?,
                    None => f32s,
                };
                self.cast_ptr(values.buf().ptr().0, DType::F32, dst, dtype, n)
            }
            Quant::None | Quant::Tensor(_) => Err(Error::Unsupported(format!(
                "dequantizing a {} weight as a block format",
                w.quant().name()
            ))),
        }
    }

    /// `x · Wᵀ (+ bias)` for an `int8_tensorwise` weight: x rotated by ConvRot's groups when the weight was,
    /// quantized to int8 per row, multiplied exactly in 32-bit integers, each sum scaled by `s_x · s_w` and
    /// rounded to x's type, the bias added in that type.
    pub(crate) fn op_linear_int8(
        &self,
        x: &Tensor<Cuda>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
    ) -> Result<Tensor<Cuda>> {
        let Quant::Int8 { per_row, convrot, .. } = w.quant() else {
            return Err(Error::Unsupported(format!(
                "an int8 product on a {} weight",
                w.quant().name()
            )));
        };
        let dtype = Self::compute_type("linear", x.dtype())?;
        let LinearShape { m, n, k, out: shape } = linear_shape(x, w, bias)?;
        let out = self.empty(shape, dtype)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        if k == 0 {
            self.fill_ptr(out.buf().ptr().0, dtype, out.numel(), 0.0)?;
            return Ok(out);
        }
        let x = match convrot {
            Some(g) => self.rotate(x, g)?,
            None => x.clone(),
        };
        let qx = self.alloc((m * k) as u64)?;
        let sx: Allocation = self.alloc((m * 4) as u64)?;
        self.launch(
            KernelFile::Quant,
            "quantize_rows_i8",
            Grid::rows(m, 256),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dtype)),
                Arg::Ptr(qx.ptr().0),
                Arg::Ptr(sx.ptr().0),
                Arg::n(m),
                Arg::n(k),
                Arg::F32(tiny(dtype)),
            ],
        )?;
        let grid = Grid {
            grid: (n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1),
            block: (16, 16, 1),
            shared: 0,
        };
        self.launch(
            KernelFile::Quant,
            "gemm_i8",
            grid,
            &[
                Arg::Ptr(qx.ptr().0),
                Arg::Ptr(w.ptr().0),
                Arg::Ptr(sx.ptr().0),
                Arg::Ptr(w.table().0),
                Arg::I32(i32::from(per_row)),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dtype)),
                Arg::n(m),
                Arg::n(n),
                Arg::n(k),
            ],
        )?;
        if let Some(b) = bias {
            self.bias_add(&out, b, n, 1)?;
        }
        Ok(out)
    }
}
