//! `RebatchLatents` (`comfy_extras.nodes_rebatch`; `RebatchImages` is in `compose`): every latent of a list,
//! regrouped into batches of `batch_size`, as ComfyUI's `LatentRebatch` regroups them.
//!
//! Each latent brings its samples, its noise mask (all ones at 8 pixels a position when it has none; a mask of
//! fewer items repeated to the batch) and its batch indices (its own, or its place in the whole list). Latents
//! of one size are joined and cut into full batches as they come; a latent of another size first sends the
//! batch being gathered out on its own. Every batch carries its indices; a mask of only ones is dropped.

use std::sync::Arc;

use super::compose::batch_size;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, Output, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// The node.
pub(super) struct RebatchLatents(Arc<NodeSpec>);

impl RebatchLatents {
    /// The node as ComfyUI declares it: whole lists in, a list out.
    pub(super) fn new() -> RebatchLatents {
        RebatchLatents(Arc::new(
            NodeSpec::new("RebatchLatents", "Rebatch Latents", "model/latent/batch")
                .python_module("comfy_extras.nodes_rebatch")
                .v3()
                .input_list()
                .input(InputDef::typed("latents", "LATENT").with_options())
                .input(InputDef::int("batch_size", 1, 1, 4096))
                .output(OutputDef::new("LATENT").list()),
        ))
    }
}

/// A batch being gathered, item by item: samples `[n, C, H, W]`, masks (`[1, H', W']` an item, as the latent
/// had them) and indices (one a sample). As in ComfyUI, the masks are cut by position on their own: a latent
/// with more masks than samples keeps them so.
struct Gathered {
    /// The shape of one item's samples.
    item: Vec<usize>,
    /// The shape of one item's mask.
    mask_item: Vec<usize>,
    /// The samples' values, item after item.
    samples: Vec<f32>,
    /// The masks' values, item after item.
    masks: Vec<f32>,
    /// The batch indices.
    indices: Vec<i64>,
}

impl Gathered {
    /// Items of samples gathered.
    fn len(&self) -> usize {
        self.samples.len() / self.item.iter().product::<usize>().max(1)
    }

    /// The first `n` items (of each part) as a latent, and the rest when samples remain.
    fn split(mut self, n: usize) -> Result<(Latent, Option<Gathered>), NodeError> {
        let per: usize = self.item.iter().product::<usize>().max(1);
        let per_mask: usize = self.mask_item.iter().product::<usize>().max(1);
        let (samples_n, masks_n) =
            (n.min(self.samples.len() / per), n.min(self.masks.len() / per_mask));
        let rest = Gathered {
            item: self.item.clone(),
            mask_item: self.mask_item.clone(),
            samples: self.samples.split_off(samples_n * per),
            masks: self.masks.split_off(masks_n * per_mask),
            indices: self.indices.split_off(samples_n),
        };
        let shaped =
            |count: usize, item: &[usize], values: Vec<f32>| -> Result<Tensor, NodeError> {
                let mut shape = vec![count];
                shape.extend_from_slice(item);
                Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
            };
        let all_ones =
            self.masks.iter().map(|&v| f64::from(v)).sum::<f64>() == self.masks.len() as f64;
        let latent = Latent {
            samples: shaped(samples_n, &self.item, self.samples)?,
            noise_mask: if all_ones {
                None
            } else {
                Some(shaped(masks_n, &self.mask_item, self.masks)?)
            },
            batch_index: Some(self.indices),
            downscale_ratio_spacial: None,
        };
        Ok((latent, (!rest.samples.is_empty()).then_some(rest)))
    }
}

/// Latent `latent` as a batch to gather, its indices counted from `offset` when it has none.
fn gather(latent: &Latent, offset: usize) -> Result<Gathered, NodeError> {
    let &[b, c, h, w] = latent.samples.shape() else {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "RebatchLatents takes image latents [B, C, H, W], got shape {:?}",
                latent.samples.shape()
            ),
        ));
    };
    let (mask_item, masks) = match &latent.noise_mask {
        Some(mask) => {
            let m = mask.shape().first().copied().filter(|&m| m > 0).ok_or_else(|| {
                NodeError::of_kind(ErrorKind::InvalidValue, "RebatchLatents: an empty noise mask")
            })?;
            let per = mask.data().len() / m;
            // Fewer masks than samples repeat to the batch (ComfyUI's `repeat`, then cut); more are kept.
            let masks = (0..m.max(b)).flat_map(|i| &mask.data()[(i % m) * per..][..per]).copied();
            (mask.shape()[1..].to_vec(), masks.collect())
        }
        // ComfyUI's default: ones at 8 pixels a position.
        None => (vec![1, h * 8, w * 8], vec![1.0; b * h * 8 * w * 8]),
    };
    let indices = match &latent.batch_index {
        // ComfyUI cuts the indices apart from the samples and fails further on when their counts differ.
        Some(indices) if indices.len() != b => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "RebatchLatents: a latent of {b} samples carries {} batch indices; they must match",
                    indices.len()
                ),
            ));
        }
        Some(indices) => indices.clone(),
        None => (0..b).map(|i| (offset + i) as i64).collect(),
    };
    let samples = latent.samples.data().to_vec();
    Ok(Gathered { item: vec![c, h, w], mask_item, samples, masks, indices })
}

/// `latents` regrouped into batches of `batch_size` (see the module's doc).
fn rebatch(latents: &[&Latent], batch_size: usize) -> Result<Vec<Latent>, NodeError> {
    let mut out = Vec::new();
    let mut current: Option<Gathered> = None;
    let mut processed = 0;
    for latent in latents {
        let next = gather(latent, processed)?;
        processed += next.len();
        current = Some(match current.take() {
            None => next,
            // Another height or width sends the batch being gathered out first.
            Some(batch) if batch.item[1..] != next.item[1..] => {
                out.push(batch.split(batch_size)?.0);
                next
            }
            Some(mut batch) => {
                // Where ComfyUI's `torch.cat` would raise.
                if batch.mask_item != next.mask_item || batch.item != next.item {
                    return Err(NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!(
                            "RebatchLatents cannot join latents {:?} and {:?} (noise masks {:?} and {:?})",
                            batch.item, next.item, batch.mask_item, next.mask_item
                        ),
                    ));
                }
                batch.samples.extend(next.samples);
                batch.masks.extend(next.masks);
                batch.indices.extend(next.indices);
                batch
            }
        });
        // Past the batch size, every full batch goes out at once and the rest (if any) gathers on.
        if current.as_ref().is_some_and(|batch| batch.len() > batch_size) {
            let full = current.as_ref().map_or(0, Gathered::len) / batch_size;
            for _ in 0..full {
                let Some(batch) = current.take() else { break };
                let (batch, rest) = batch.split(batch_size)?;
                out.push(batch);
                current = rest;
            }
        }
    }
    if let Some(batch) = current {
        out.push(batch.split(batch_size)?.0);
    }
    Ok(out)
}

impl Node for RebatchLatents {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let batch_size = batch_size(inputs)?;
        let latents = inputs
            .list("latents")
            .iter()
            .map(|value| match value {
                Value::Latent(latent) => Ok(latent),
                other => Err(NodeError::of_kind(
                    ErrorKind::WrongType,
                    format!("input `latents` holds {}, not LATENT", other.type_name()),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = rebatch(&latents, batch_size)?;
        let list = out.into_iter().map(Value::Latent).collect();
        Ok(NodeResult { outputs: vec![Output::List(list)], ui: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_that_do_not_match_the_samples_are_refused() {
        let latent = Latent {
            samples: Tensor::full(vec![4, 4, 2, 2], 0.0),
            noise_mask: None,
            batch_index: Some(vec![10, 11]),
            downscale_ratio_spacial: None,
        };
        let Err(error) = rebatch(&[&latent], 3) else { panic!("refused") };
        assert!(error.message.contains("4 samples carries 2 batch indices"), "{}", error.message);
    }

    #[test]
    fn latents_rebatch_as_comfyui_rebatches_them() {
        let io = crate::fixtures::tensors("rebatch_latents/io.safetensors");
        let latent = |name: &str| Latent {
            samples: io[name].clone(),
            noise_mask: io.get(&format!("{name}.mask")).cloned(),
            batch_index: io
                .get(&format!("{name}.index"))
                .map(|t| t.data().iter().map(|&v| v as i64).collect()),
            downscale_ratio_spacial: None,
        };
        let list: Vec<Latent> = ["in.0", "in.1", "in.2", "in.3"].map(latent).into();
        let refs: Vec<&Latent> = list.iter().collect();
        for size in [2, 3] {
            let got = rebatch(&refs, size).expect("rebatches");
            let count = io
                .keys()
                .filter(|k| k.starts_with(&format!("b{size}.")) && k.ends_with(".samples"));
            assert_eq!(got.len(), count.count(), "batches at {size}");
            for (i, out) in got.iter().enumerate() {
                let key = |what: &str| format!("b{size}.{i}.{what}");
                assert_eq!(out.samples, io[&key("samples")], "{}", key("samples"));
                let want: Vec<i64> = io[&key("index")].data().iter().map(|&v| v as i64).collect();
                assert_eq!(out.batch_index.as_deref(), Some(want.as_slice()), "{}", key("index"));
                assert_eq!(out.noise_mask.as_ref(), io.get(&key("mask")), "{}", key("mask"));
            }
        }
    }
}
