//! Weights by name: a layer's tensors fetched in one call of the per-layer protocol, a Linear stored as
//! `name.weight` and `name.bias` applied in one, and an embedding table's rows widened to f32.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use kiln_compute::backend::UnaryOp;
use kiln_compute::memory::{Layer, Model};
use kiln_compute::quant::Quant;
use kiln_compute::{Backend, DType, Tensor, Weight};

use crate::error::Result;

/// `name.weight` and `name.bias`.
pub(crate) fn weight_and_bias(name: &str) -> [String; 2] {
    [format!("{name}.weight"), format!("{name}.bias")]
}

/// Fetches `names` (one layer of the per-layer protocol).
pub(crate) fn fetch<'m, B: Backend>(
    b: &B,
    model: &'m Model,
    names: &[String],
) -> Result<Layer<'m>> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(model.fetch(b, &names)?)
}

/// `x · Wᵀ + b` for the Linear `name` of `model`.
pub(crate) fn linear<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &weight_and_bias(name))?;
    Ok(b.linear(x, &layer.weight(0), Some(&layer.weight(1)))?)
}

/// The 2-D convolution `name` of `model` (`name.weight`, `name.bias`) with `params`.
pub(crate) fn conv2d<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
    params: kiln_compute::backend::Conv2dParams,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &weight_and_bias(name))?;
    Ok(b.conv2d(x, &layer.weight(0), Some(&layer.weight(1)), params)?)
}

/// The 3×3 "same" convolution `name` of `model` (padding 1, stride 1).
pub(crate) fn conv3<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    conv2d(b, model, name, x, kiln_compute::backend::Conv2dParams::same(1))
}

/// The rows of `table` at `ids` `[N, d]`, widened exactly to f32 (ComfyUI's lookup with
/// `out_dtype=torch.float32`): through the backend's lookup when its compute type holds the table's values
/// exactly, else row by row. An fp8 table's NaNs become 0 and its infinities the largest finite f32, as
/// ComfyUI's `nan_to_num` does for a model stored in fp8.
pub(crate) fn embed_f32<B: Backend>(b: &B, table: &Weight<'_>, ids: &[u32]) -> Result<Tensor<B>> {
    let compute = b.compute_dtype();
    let exact = table.quant() == Quant::None && (compute == DType::F32 || table.dtype() == compute);
    let x = if exact {
        b.cast(&b.embedding(ids, table)?, DType::F32)?
    } else {
        let mut rows: BTreeMap<u32, Tensor<B>> = BTreeMap::new();
        for &id in ids {
            if let Entry::Vacant(slot) = rows.entry(id) {
                slot.insert(b.weight_to_tensor(&table.rows(id as usize, 1)?, DType::F32)?);
            }
        }
        let parts: Vec<&Tensor<B>> = ids.iter().map(|id| &rows[id]).collect();
        b.concat(&parts, 0)?
    };
    if !matches!(table.dtype(), DType::F8E4M3 | DType::F8E5M2) {
        return Ok(x);
    }
    Ok(b.unary(&x, UnaryOp::NanToNum)?)
}
