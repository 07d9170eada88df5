//! Weights by name: a layer's tensors fetched in one call of the per-layer protocol, and a Linear stored as
//! `name.weight` and `name.bias` applied in one.

use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, Tensor};

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
