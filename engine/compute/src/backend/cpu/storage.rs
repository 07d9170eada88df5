//! CPU tensor storage: the elements of a tensor in its own dtype (f32, f16 or bf16) behind an `Arc`.
//!
//! Ops read any storage as f32 ([`read_f32`] borrows f32 storage and widens the others) and write f32 results
//! back in the dtype asked for ([`tensor_from_f32`], rounding to nearest even). Invariant: a buffer's variant
//! matches the dtype of every tensor that holds it and its length is the tensor's element count; [`data`]
//! checks both, because `Tensor::from_parts` is public.

use std::borrow::Cow;
use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use super::Cpu;
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
        Data::F16(v) => Cow::Owned(widen_halves(&v[range], |h| h.to_f32())),
        Data::BF16(v) => Cow::Owned(widen_halves(&v[range], |h| h.to_f32())),
    })
}

fn widen_halves<T: Copy + Sync>(src: &[T], f: impl Fn(T) -> f32 + Sync) -> Vec<f32> {
    let mut out = vec![0.0f32; src.len()];
    out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(|(o, s)| {
        for (o, &s) in o.iter_mut().zip(s) {
            *o = f(s);
        }
    });
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
        DType::F16 => Data::F16(narrow_halves(&values, f16::from_f32)),
        DType::BF16 => Data::BF16(narrow_halves(&values, bf16::from_f32)),
        DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 => {
            unreachable!("checked by compute_dtype")
        }
    })
}

fn narrow_halves<T: Copy + Send + Default>(src: &[f32], f: impl Fn(f32) -> T + Sync) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(|(o, s)| {
        for (o, &s) in o.iter_mut().zip(s) {
            *o = f(s);
        }
    });
    out
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
