//! CPU tensor storage: the elements of a tensor in its own dtype (f32, f16 or bf16) behind an `Arc`.
//!
//! Ops read any storage as f32 ([`read_f32`] borrows f32 storage and widens the others) and write f32 results
//! back in the dtype asked for ([`tensor_from_f32`], rounding to nearest even). Invariant: a buffer's variant
//! matches the dtype of every tensor that holds it and its length is the tensor's element count; [`data`]
//! checks both, because `Tensor::from_parts` is public.

use std::borrow::Cow;
use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::{Cpu, simd};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, numel};

/// Elements per rayon task in the memory-bound loops (conversions, elementwise ops).
pub(crate) const PAR_CHUNK: usize = 1 << 15;

/// The elements of a CPU tensor.
#[derive(Debug)]
pub(crate) enum Data {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
        }
    }
}

/// The CPU backend's tensor storage: shared, immutable elements in the tensor's dtype.
#[derive(Debug, Clone)]
pub struct CpuBuf(Arc<Data>);

impl CpuBuf {
    pub(crate) fn new(data: Data) -> CpuBuf {
        CpuBuf(Arc::new(data))
    }
}

/// The storage of `x`, checked against its shape and dtype.
pub(crate) fn data<'a>(x: &'a Tensor<Cpu>, op: &'static str) -> Result<&'a Data> {
    let d = &*x.buf().0;
    if d.dtype() != x.dtype() || d.len() != x.numel() {
        return Err(Error::shape(
            op,
            format!(
                "tensor {:?} of {} holds {} elements of {}",
                x.shape(),
                x.dtype(),
                d.len(),
                d.dtype()
            ),
        ));
    }
    Ok(d)
}

/// The elements of `x` as f32: borrowed when they are f32, widened otherwise.
pub(crate) fn read_f32<'a>(x: &'a Tensor<Cpu>, op: &'static str) -> Result<Cow<'a, [f32]>> {
    read_f32_range(x, 0..x.numel(), op)
}

/// Elements `range` of `x` as f32 (only those widened), or a shape error past its end.
pub(crate) fn read_f32_range<'a>(
    x: &'a Tensor<Cpu>,
    range: std::ops::Range<usize>,
    op: &'static str,
) -> Result<Cow<'a, [f32]>> {
    let d = data(x, op)?;
    if range.start > range.end || range.end > d.len() {
        return Err(Error::shape(op, format!("elements {range:?} of {:?}", x.shape())));
    }
    Ok(match d {
        Data::F32(v) => Cow::Borrowed(&v[range]),
        Data::F16(v) => Cow::Owned(convert(&v[range], |s, o| s.convert_to_f32_slice(o))),
        Data::BF16(v) => Cow::Owned(convert(&v[range], simd::widen_bf16)),
    })
}

/// `src` converted chunk by chunk in parallel by `chunk` (which fills its output from its input).
fn convert<S: Sync, D: Copy + Default + Send>(
    src: &[S],
    chunk: impl Fn(&[S], &mut [D]) + Sync,
) -> Vec<D> {
    let mut out = vec![D::default(); src.len()];
    out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(|(o, s)| chunk(s, o));
    out
}

/// Checks that `dtype` can hold activations.
pub(crate) fn compute_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_compute() {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("{dtype} is a storage type; activations are f32, f16 or bf16"),
        ))
    }
}

/// f32 values as storage of `dtype` (rounded to nearest even).
pub(crate) fn narrow_data(values: Vec<f32>, dtype: DType, op: &'static str) -> Result<Data> {
    compute_dtype(op, dtype)?;
    Ok(match dtype {
        DType::F32 => Data::F32(values),
        // F16C's conversions after one feature check a chunk (value by value, `half` checks for every value),
        // and the bf16 rounding eight lanes at a time: each as `from_f32` rounds.
        DType::F16 => Data::F16(convert(&values, |s, o: &mut [f16]| o.convert_from_f32_slice(s))),
        DType::BF16 => Data::BF16(convert(&values, simd::narrow_bf16)),
        DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 => {
            unreachable!("checked by compute_dtype")
        }
    })
}

/// A tensor of `dtype` from f32 values (rounded to `dtype`); `values.len()` must be `numel(shape)`.
pub(crate) fn tensor_from_f32(
    shape: Vec<usize>,
    values: Vec<f32>,
    dtype: DType,
    op: &'static str,
) -> Result<Tensor<Cpu>> {
    if values.len() != numel(&shape) {
        return Err(Error::shape(op, format!("{} values for shape {shape:?}", values.len())));
    }
    let data = narrow_data(values, dtype, op)?;
    Ok(Tensor::from_parts(CpuBuf::new(data), shape, dtype))
}

/// A tensor holding `data` (whose variant gives the dtype).
pub(crate) fn tensor_from_data(shape: Vec<usize>, data: Data) -> Tensor<Cpu> {
    let dtype = data.dtype();
    debug_assert_eq!(data.len(), numel(&shape));
    Tensor::from_parts(CpuBuf::new(data), shape, dtype)
}

/// `x` converted to `dtype` (a cheap clone when it already is).
pub(crate) fn cast(x: &Tensor<Cpu>, dtype: DType) -> Result<Tensor<Cpu>> {
    compute_dtype("cast", dtype)?;
    data(x, "cast")?;
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    let values = read_f32(x, "cast")?.into_owned();
    tensor_from_f32(x.shape().to_vec(), values, dtype, "cast")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_convert_in_chunks_as_value_by_value() {
        // Mantissas probing each rounding case at every sign and exponent, the specials, and more values than
        // one parallel chunk.
        let mut values: Vec<f32> = [0u32, 1, 0xfff, 0x1000, 0x1001, 0x2fff, 0x7f_ffff, 0x40_0001]
            .iter()
            .flat_map(|&m| (0..512u32).map(move |se| f32::from_bits((se << 23) | m)))
            .collect();
        values.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::from_bits(0x7f80_0001)]);
        values.extend((0..PAR_CHUNK + 7).map(|i| (i as f32 - 3000.0) * 0.0137));
        let Ok(Data::F16(h)) = narrow_data(values.clone(), DType::F16, "test") else {
            panic!("f16")
        };
        let Ok(Data::BF16(b)) = narrow_data(values.clone(), DType::BF16, "test") else {
            panic!("bf16")
        };
        for (i, v) in values.iter().enumerate() {
            assert_eq!(h[i].to_bits(), f16::from_f32(*v).to_bits(), "f16 of {v:e}");
            assert_eq!(b[i].to_bits(), bf16::from_f32(*v).to_bits(), "bf16 of {v:e}");
        }
        let wide = |data: Data| {
            let tensor = tensor_from_data(vec![values.len()], data);
            read_f32_range(&tensor, 0..values.len(), "test").map(|v| v.into_owned())
        };
        let hw = wide(Data::F16(h.clone())).expect("f16 widens");
        let bw = wide(Data::BF16(b.clone())).expect("bf16 widens");
        assert_eq!((hw.len(), bw.len()), (values.len(), values.len()));
        for (i, (hw, bw)) in hw.into_iter().zip(bw).enumerate() {
            assert_eq!(hw.to_bits(), h[i].to_f32().to_bits());
            assert_eq!(bw.to_bits(), b[i].to_f32().to_bits());
        }
    }
}
