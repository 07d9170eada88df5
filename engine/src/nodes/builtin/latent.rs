//! Latent nodes: EmptyLatentImage and LatentUpscale. A latent is `[B, 4, H/8, W/8]`.

use std::sync::Arc;

use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// `EmptyLatentImage`: zeros of the size of a `width` × `height` image.
pub(super) struct EmptyLatentImage(Arc<NodeSpec>);

impl EmptyLatentImage {
    pub(super) fn new() -> EmptyLatentImage {
        EmptyLatentImage(Arc::new(
            NodeSpec::new("EmptyLatentImage", "Empty Latent Image", "model/latent")
                .description(
                    "Create a new batch of empty latent images to be denoised via sampling.",
                )
                .input(
                    InputDef::int("width", 512, 16, 16384)
                        .option("step", 8)
                        .tooltip("The width of the latent images in pixels."),
                )
                .input(
                    InputDef::int("height", 512, 16, 16384)
                        .option("step", 8)
                        .tooltip("The height of the latent images in pixels."),
                )
                .input(
                    InputDef::int("batch_size", 1, 1, 4096)
                        .tooltip("The number of latent images in the batch."),
                )
                .output(OutputDef::new("LATENT").tooltip("The empty latent image batch."))
                .aliases(&[
                    "empty",
                    "empty latent",
                    "new latent",
                    "create latent",
                    "blank latent",
                    "blank",
                ]),
        ))
    }
}

impl Node for EmptyLatentImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        empty_latent(inputs, 4)
    }
}

/// Zeros of `channels` latent channels the size of a `width` × `height` image, `batch_size` of them (an
/// eighth of the pixels on each side, which the latent says: `downscale_ratio_spacial` 8).
pub(super) fn empty_latent(inputs: &Inputs, channels: i64) -> Result<NodeResult, NodeError> {
    let (w, h, b) = (inputs.int("width")?, inputs.int("height")?, inputs.int("batch_size")?);
    let shape = [b, channels, h / 8, w / 8].map(|d| usize::try_from(d).unwrap_or(0));
    let latent = Latent {
        downscale_ratio_spacial: Some(8),
        ..Latent::new(Tensor::full(shape.to_vec(), 0.0))
    };
    Ok(NodeResult::values([Value::Latent(latent)]))
}

/// `LatentUpscale`: resizes a latent to the size of a `width` × `height` image.
pub(super) struct LatentUpscale(Arc<NodeSpec>);

impl LatentUpscale {
    pub(super) fn new() -> LatentUpscale {
        LatentUpscale(Arc::new(
            NodeSpec::new("LatentUpscale", "Upscale Latent", "model/latent")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::choices(
                    "upscale_method",
                    &["nearest-exact", "bilinear", "area", "bicubic", "bislerp"],
                ))
                .input(InputDef::int("width", 512, 0, 16384).option("step", 8))
                .input(InputDef::int("height", 512, 0, 16384).option("step", 8))
                .input(InputDef::choices("crop", &["disabled", "center"]))
                .output(OutputDef::new("LATENT"))
                .aliases(&["enlarge latent", "resize latent"]),
        ))
    }
}

/// `[B, C, H, W]` ↔ `[B, H, W, C]`.
pub(super) fn transpose(t: &Tensor, to_channels_last: bool) -> Result<Tensor, NodeError> {
    let s = t.shape();
    let [b, d1, d2, d3] = [s[0], s[1], s[2], s[3]];
    let (c, h, w) = if to_channels_last { (d1, d2, d3) } else { (d3, d1, d2) };
    let mut out = vec![0.0; t.data().len()];
    for bi in 0..b {
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let chw = ((bi * c + ci) * h + y) * w + x;
                    let hwc = ((bi * h + y) * w + x) * c + ci;
                    if to_channels_last {
                        out[hwc] = t.data()[chw]
                    } else {
                        out[chw] = t.data()[hwc]
                    }
                }
            }
        }
    }
    let shape = if to_channels_last { vec![b, h, w, c] } else { vec![b, c, h, w] };
    Tensor::new(shape, out).map_err(|e| NodeError::new(e.to_string()))
}

impl Node for LatentUpscale {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let latent = inputs.latent("samples")?;
        let samples = &latent.samples;
        if samples.shape().len() != 4 {
            return Err(NodeError::new(format!(
                "expected a LATENT [B, C, H, W], got {:?}",
                samples.shape()
            )));
        }
        let (h, w) = (samples.dim(2), samples.dim(3));
        let (mut width, mut height) =
            (inputs.int("width")?.max(0) as usize / 8, inputs.int("height")?.max(0) as usize / 8);
        if width == 0 && height == 0 {
            return Ok(NodeResult::values([Value::Latent(latent.clone())]));
        }
        if width == 0 {
            width = ((w * height) as f64 / h as f64).round().max(1.0) as usize;
        } else if height == 0 {
            height = ((h * width) as f64 / w as f64).round().max(1.0) as usize;
        }
        let channels_last = transpose(samples, true)?;
        let crop = inputs.string("crop")? == "center";
        let resized =
            resize(&channels_last, width, height, inputs.string("upscale_method")?, crop)?;
        Ok(NodeResult::values([Value::Latent(latent.with_samples(transpose(&resized, false)?))]))
    }
}

/// A `MASK` or image-like tensor as ComfyUI's `mask.reshape((-1, 1, H, W))`.
fn as_noise_mask(mask: &Tensor) -> Result<Tensor, NodeError> {
    let dims = mask.shape();
    let (h, w) = match dims {
        [.., h, w] if dims.len() >= 2 => (*h, *w),
        _ => return Err(NodeError::new(format!("a MASK of shape {dims:?}"))),
    };
    let n = mask.data().len() / (h * w).max(1);
    Tensor::new(vec![n, 1, h, w], mask.data().to_vec()).map_err(|e| NodeError::new(e.to_string()))
}

/// The latent nodes of `nodes.py` that only compute (V1 classes).
pub(super) fn nodes() -> Vec<Pure> {
    vec![
        Pure::new(
            NodeSpec::new("SetLatentNoiseMask", "Set Latent Noise Mask", "model/latent")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::typed("mask", "MASK"))
                .output(OutputDef::new("LATENT")),
            |inputs| {
                let latent = inputs.latent("samples")?;
                let mask = match inputs.get("mask") {
                    Some(Value::Mask(m)) => as_noise_mask(m)?,
                    _ => return Err(NodeError::new("input `mask` is not a MASK")),
                };
                let out = Latent { noise_mask: Some(mask), ..latent.clone() };
                Ok(vec![Value::Latent(out)])
            },
        ),
        Pure::new(
            NodeSpec::new("LatentUpscaleBy", "Upscale Latent By", "model/latent")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::choices(
                    "upscale_method",
                    &["nearest-exact", "bilinear", "area", "bicubic", "bislerp"],
                ))
                .input(InputDef::float("scale_by", 1.5, 0.01, 8.0).option("step", 0.01))
                .output(OutputDef::new("LATENT"))
                .aliases(&["enlarge latent", "resize latent", "scale latent"]),
            |inputs| {
                let latent = inputs.latent("samples")?;
                let samples = &latent.samples;
                let &[_, _, h, w] = samples.shape() else {
                    return Err(NodeError::new(format!(
                        "expected a LATENT [B, C, H, W], got {:?}",
                        samples.shape()
                    )));
                };
                let scale = inputs.float("scale_by")?;
                // Python's round, ties to even.
                let width = ((w as f64 * scale).round_ties_even() as usize).max(1);
                let height = ((h as f64 * scale).round_ties_even() as usize).max(1);
                let resized = resize(
                    &transpose(samples, true)?,
                    width,
                    height,
                    inputs.string("upscale_method")?,
                    false,
                )?;
                Ok(vec![Value::Latent(latent.with_samples(transpose(&resized, false)?))])
            },
        ),
        Pure::new(
            NodeSpec::new("RepeatLatentBatch", "Repeat Latent Batch", "model/latent/batch")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::int("amount", 1, 1, 64))
                .output(OutputDef::new("LATENT"))
                .aliases(&["duplicate latent", "clone latent"]),
            |inputs| {
                let latent = inputs.latent("samples")?;
                let amount = usize::try_from(inputs.int("amount")?).unwrap_or(1).max(1);
                let mut shape = latent.samples.shape().to_vec();
                shape[0] *= amount;
                let samples = Tensor::new(shape, latent.samples.data().repeat(amount))
                    .map_err(|e| NodeError::new(e.to_string()))?;
                let mut out = latent.with_samples(samples);
                // A mask of one sample applies to all; a batch of masks repeats with the samples.
                if let Some(mask) = &latent.noise_mask
                    && mask.shape().first().is_some_and(|&n| n > 1)
                {
                    let mut shape = mask.shape().to_vec();
                    shape[0] *= amount;
                    out.noise_mask = Some(
                        Tensor::new(shape, mask.data().repeat(amount))
                            .map_err(|e| NodeError::new(e.to_string()))?,
                    );
                }
                if let Some(indices) = &latent.batch_index {
                    let (lo, hi) = (indices.iter().min(), indices.iter().max());
                    let offset = hi.zip(lo).map_or(0, |(hi, lo)| hi - lo + 1);
                    let mut all = indices.clone();
                    for i in 1..amount as i64 {
                        all.extend(indices.iter().map(|x| x + i * offset));
                    }
                    out.batch_index = Some(all);
                }
                Ok(vec![Value::Latent(out)])
            },
        ),
        Pure::new(
            NodeSpec::new("LatentFromBatch", "Get Latent From Batch", "model/latent/batch")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::int("batch_index", 0, -16384, 16384))
                .input(InputDef::int("length", 1, 1, 64))
                .output(OutputDef::new("LATENT"))
                .aliases(&["select from batch", "pick latent", "batch subset"]),
            latent_from_batch,
        ),
    ]
}

/// `LatentFromBatch`: `length` samples from `batch_index` (negative from the end, clamped), their masks, and
/// their indices in the original batch (so they keep their noise).
fn latent_from_batch(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latent = inputs.latent("samples")?;
    let shape = latent.samples.shape();
    let batch = shape.first().copied().unwrap_or(0);
    let per: usize = shape.iter().skip(1).product();
    let mut index = inputs.int("batch_index")?;
    if index < 0 {
        index += batch as i64;
    }
    let start = index.clamp(0, (batch as i64 - 1).max(0)) as usize;
    let length = usize::try_from(inputs.int("length")?).unwrap_or(1).min(batch - start);
    let mut out_shape = shape.to_vec();
    out_shape[0] = length;
    let samples =
        Tensor::new(out_shape, latent.samples.data()[start * per..(start + length) * per].to_vec())
            .map_err(|e| NodeError::new(e.to_string()))?;
    let mut out = latent.with_samples(samples);
    if let Some(mask) = &latent.noise_mask {
        let masks = mask.shape().first().copied().unwrap_or(1);
        if masks > 1 {
            let plane: usize = mask.shape().iter().skip(1).product();
            // Masks repeated to the batch, then the same samples taken.
            let values: Vec<f32> = (start..start + length)
                .flat_map(|i| mask.data()[(i % masks) * plane..][..plane].iter().copied())
                .collect();
            let mut mask_shape = mask.shape().to_vec();
            mask_shape[0] = length;
            out.noise_mask =
                Some(Tensor::new(mask_shape, values).map_err(|e| NodeError::new(e.to_string()))?);
        }
    }
    out.batch_index = Some(match &latent.batch_index {
        Some(indices) => indices[start..start + length].to_vec(),
        None => (start..start + length).map(|i| i as i64).collect(),
    });
    Ok(vec![Value::Latent(out)])
}

/// Zeros `[batch_size, channels, height / down, width / down]`: the empty latents of the V3 `Empty*Latent*`
/// nodes.
fn zeros(inputs: &Inputs, channels: usize, down: usize) -> Result<Vec<Value>, NodeError> {
    let dim = |name: &str| -> Result<usize, NodeError> {
        let v = inputs.int(name)?;
        usize::try_from(v)
            .map_err(|_| NodeError::new(format!("`{name}` must be positive, got {v}")))
    };
    let shape = vec![dim("batch_size")?, channels, dim("height")? / down, dim("width")? / down];
    Ok(vec![Value::Latent(Latent::new(Tensor::full(shape, 0.0)))])
}

/// The size inputs of the V3 empty-latent nodes: width and height in steps of 16, the batch size.
fn empty_latent_spec(name: &str, display: &str, category: &str, module: &str) -> NodeSpec {
    let side = |name: &str| InputDef::int(name, 1024, 16, 16384).option("step", 16);
    NodeSpec::new(name, display, category)
        .python_module(module)
        .v3()
        .input(side("width"))
        .input(side("height"))
        .input(InputDef::int("batch_size", 1, 1, 4096))
        .output(OutputDef::new("LATENT"))
}

/// `EmptyFlux2LatentImage` (Flux.2's 128 channels at a sixteenth of the pixels) and
/// `EmptyChromaRadianceLatentImage` (Chroma Radiance samples RGB pixels: 3 channels, full size).
pub(super) fn empty_nodes() -> Vec<Pure> {
    vec![
        Pure::new(
            empty_latent_spec(
                "EmptyFlux2LatentImage",
                "Empty Flux 2 Latent",
                "model/latent/flux",
                "comfy_extras.nodes_flux",
            ),
            |inputs| zeros(inputs, 128, 16),
        ),
        Pure::new(
            empty_latent_spec(
                "EmptyChromaRadianceLatentImage",
                "",
                "model/latent/chroma radiance",
                "comfy_extras.nodes_chroma_radiance",
            ),
            |inputs| zeros(inputs, 3, 1),
        ),
    ]
}

/// `len` entries of dimension `dim` of `t` from `start` (torch's `narrow`).
fn narrow(t: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor, NodeError> {
    let shape = t.shape();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let base = (o * shape[dim] + start) * inner;
        out.extend_from_slice(&t.data()[base..base + len * inner]);
    }
    let mut new_shape = shape.to_vec();
    new_shape[dim] = len;
    Tensor::new(new_shape, out).map_err(|e| NodeError::new(e.to_string()))
}

/// `a` and `b` joined along `dim` (torch's `cat`); the other dimensions must agree.
pub(super) fn cat(a: &Tensor, b: &Tensor, dim: usize) -> Result<Tensor, NodeError> {
    let (sa, sb) = (a.shape(), b.shape());
    let agree =
        sa.len() == sb.len() && sa.iter().zip(sb).enumerate().all(|(i, (x, y))| i == dim || x == y);
    if !agree {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("cannot join latents of shapes {sa:?} and {sb:?} along dimension {dim}"),
        ));
    }
    let outer: usize = sa[..dim].iter().product();
    let inner: usize = sa[dim + 1..].iter().product();
    let (ra, rb) = (sa[dim] * inner, sb[dim] * inner);
    let mut out = Vec::with_capacity(a.data().len() + b.data().len());
    for o in 0..outer {
        out.extend_from_slice(&a.data()[o * ra..(o + 1) * ra]);
        out.extend_from_slice(&b.data()[o * rb..(o + 1) * rb]);
    }
    let mut shape = sa.to_vec();
    shape[dim] += sb[dim];
    Tensor::new(shape, out).map_err(|e| NodeError::new(e.to_string()))
}

/// ComfyUI's `repeat_to_batch_size`: the batch cut to `batch`, or repeated whole until it reaches it and cut.
pub(super) fn repeat_to_batch(t: &Tensor, batch: usize) -> Result<Tensor, NodeError> {
    let have = t.shape().first().copied().unwrap_or(0);
    if have == batch || have == 0 {
        return Ok(t.clone());
    }
    let per = t.data().len() / have;
    let values: Vec<f32> = t.data().iter().copied().cycle().take(batch * per).collect();
    let mut shape = t.shape().to_vec();
    shape[0] = batch;
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

/// The dimension a `dim` choice names, counted from the end (`x` last, `y` before it, `t` before that).
fn latent_dim(choice: &str, ndim: usize) -> Result<usize, NodeError> {
    let from_end = if choice.contains('x') {
        1
    } else if choice.contains('y') {
        2
    } else {
        3
    };
    ndim.checked_sub(from_end).ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("a latent of {ndim} dimensions has no `{choice}`"),
        )
    })
}

/// `LatentCut`, `LatentConcat` and `LatentCutToBatch` (`comfy_extras.nodes_latent`): a latent cut along x, y or
/// t, two joined, and one cut into batch entries.
/// The noise mask and batch indices ride along from the (first) latent, as ComfyUI copies its dict.
pub(super) fn advanced_nodes() -> Vec<Pure> {
    let spec = |name: &str| {
        NodeSpec::new(name, "", "model/latent/advanced")
            .python_module("comfy_extras.nodes_latent")
            .v3()
    };
    vec![
        Pure::new(
            spec("LatentConcat")
                .input(InputDef::typed("samples1", "LATENT"))
                .input(InputDef::typed("samples2", "LATENT"))
                .input(InputDef::v3_combo("dim", &["x", "-x", "y", "-y", "t", "-t"]))
                .output(OutputDef::new("LATENT"))
                .aliases(&["join latents", "stitch latents"]),
            |inputs| {
                let first = inputs.latent("samples1")?;
                let (s1, choice) = (&first.samples, inputs.string("dim")?);
                let s2 = repeat_to_batch(&inputs.latent("samples2")?.samples, s1.shape()[0])?;
                let dim = latent_dim(choice, s1.shape().len())?;
                let joined =
                    if choice.starts_with('-') { cat(&s2, s1, dim)? } else { cat(s1, &s2, dim)? };
                Ok(vec![Value::Latent(first.with_samples(joined))])
            },
        ),
        Pure::new(
            spec("LatentCut")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::v3_combo("dim", &["x", "y", "t"]))
                .input(InputDef::int("index", 0, -16384, 16384).option("step", 1))
                .input(InputDef::int("amount", 1, 1, 16384).option("step", 1))
                .output(OutputDef::new("LATENT"))
                .aliases(&["crop latent", "slice latent", "extract region"]),
            |inputs| {
                let latent = inputs.latent("samples")?;
                let s = &latent.samples;
                let dim = latent_dim(inputs.string("dim")?, s.shape().len())?;
                let size = s.shape()[dim] as i64;
                let (index, amount) = (inputs.int("index")?, inputs.int("amount")?.max(1));
                // As ComfyUI clamps them: a start inside the dimension, as many as are left.
                let (start, len) = if index >= 0 {
                    let index = index.min(size - 1).max(0);
                    (index, amount.min(size - index))
                } else {
                    let index = index.max(-size);
                    (size + index, amount.min(-index))
                };
                let cut = narrow(s, dim, start as usize, len.max(0) as usize)?;
                Ok(vec![Value::Latent(latent.with_samples(cut))])
            },
        ),
        Pure::new(
            spec("LatentCutToBatch")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::v3_combo("dim", &["t", "x", "y"]))
                .input(InputDef::int("slice_size", 1, 1, 16384).option("step", 1))
                .output(OutputDef::new("LATENT"))
                .aliases(&["slice to batch", "split latent", "tile latent"]),
            latent_cut_to_batch,
        ),
    ]
}

/// `LatentCutToBatch`: a latent cut along x, y or t into slices of `slice_size` that become batch entries
/// (each sample's slices in order, sample by sample), as ComfyUI moves the dimension next to the batch and
/// reshapes: a dimension shorter than the slice is one slice; a remainder is dropped; a dimension the latent
/// does not have (t of an image latent) leaves it unchanged.
fn latent_cut_to_batch(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latent = inputs.latent("samples")?;
    let s = &latent.samples;
    let shape = s.shape();
    let from_end = match inputs.string("dim")? {
        d if d.contains('x') => 1,
        d if d.contains('y') => 2,
        _ => 3,
    };
    let Some(dim) = shape.len().checked_sub(from_end).filter(|&d| d >= 2) else {
        return Ok(vec![Value::Latent(latent.clone())]);
    };
    let slice = usize::try_from(inputs.int("slice_size")?).unwrap_or(1).clamp(1, shape[dim].max(1));
    let mut parts = Vec::new();
    for b in 0..shape[0] {
        let sample = narrow(s, 0, b, 1)?;
        for k in 0..shape[dim] / slice {
            parts.extend_from_slice(narrow(&sample, dim, k * slice, slice)?.data());
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[0] = shape[0] * (shape[dim] / slice);
    out_shape[dim] = slice;
    let cut = Tensor::new(out_shape, parts).map_err(|e| NodeError::new(e.to_string()))?;
    Ok(vec![Value::Latent(latent.with_samples(cut))])
}

/// `[B, C, H, W]` of a latent, or an error naming the node.
fn nchw(t: &Tensor, node: &str) -> Result<[usize; 4], NodeError> {
    match *t.shape() {
        [b, c, h, w] => Ok([b, c, h, w]),
        ref other => Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("{node} works on image latents [B, C, H, W], got {other:?}"),
        )),
    }
}

/// `LatentComposite`: `samples_from` pasted into `samples_to` at (x, y) (pixels, a latent cell per 8), cut
/// at its edges; with `feather` (pixels), the pasted edges that lie inside fade in over that many cells,
/// as ComfyUI's mask of products of (t + 1)/feather.
fn latent_composite(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let to = inputs.latent("samples_to")?;
    let from = &inputs.latent("samples_from")?.samples;
    let [b, c, h, w] = nchw(&to.samples, "LatentComposite")?;
    let [fb, fc, fh, fw] = nchw(from, "LatentComposite")?;
    let cell = |name: &str| -> Result<usize, NodeError> {
        usize::try_from(inputs.int(name)? / 8)
            .map_err(|_| NodeError::new(format!("`{name}` must be 0 or more")))
    };
    let (x, y, feather) = (cell("x")?, cell("y")?, cell("feather")?);
    if fc != c || (fb != b && fb != 1) {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "cannot paste a latent of shape {:?} into one of {:?}",
                from.shape(),
                to.samples.shape()
            ),
        ));
    }
    // The pasted block: what of `from` fits from (x, y).
    let (ph, pw) = (fh.min(h.saturating_sub(y)), fw.min(w.saturating_sub(x)));
    let mut mask = vec![1f32; ph * pw];
    if feather > 0 {
        for t in 0..feather {
            let f = ((1.0 / feather as f64) * (t + 1) as f64) as f32;
            for row in 0..ph {
                for col in 0..pw {
                    let m = &mut mask[row * pw + col];
                    if y != 0 && row == t {
                        *m *= f;
                    }
                    if y + ph < h && ph > t && row == ph - 1 - t {
                        *m *= f;
                    }
                    if x != 0 && col == t {
                        *m *= f;
                    }
                    if x + pw < w && pw > t && col == pw - 1 - t {
                        *m *= f;
                    }
                }
            }
        }
    }
    let mut out = to.samples.data().to_vec();
    for bi in 0..b {
        let fbi = if fb == 1 { 0 } else { bi };
        for ci in 0..c {
            for row in 0..ph {
                for col in 0..pw {
                    let src = from.data()[((fbi * c + ci) * fh + row) * fw + col];
                    let dst = &mut out[((bi * c + ci) * h + row + y) * w + col + x];
                    let m = mask[row * pw + col];
                    *dst = if feather == 0 { src } else { src * m + *dst * (1.0 - m) };
                }
            }
        }
    }
    let samples =
        Tensor::new(to.samples.shape().to_vec(), out).map_err(|e| NodeError::new(e.to_string()))?;
    Ok(vec![Value::Latent(to.with_samples(samples))])
}

/// `LatentBlend` (normal mode): samples1·f + samples2·(1 − f), samples2 first resized bicubically (centre-cropped)
/// to samples1's size when the shapes differ.
fn latent_blend(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let first = inputs.latent("samples1")?;
    let (a, b) = (&first.samples, &inputs.latent("samples2")?.samples);
    let [_, _, h, w] = nchw(a, "LatentBlend")?;
    let resized;
    let b = if a.shape() == b.shape() {
        b
    } else {
        nchw(b, "LatentBlend")?;
        resized = transpose(&resize(&transpose(b, true)?, w, h, "bicubic", true)?, false)?;
        if resized.shape() != a.shape() {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("cannot blend latents of shapes {:?} and {:?}", a.shape(), b.shape()),
            ));
        }
        &resized
    };
    let f = inputs.float("blend_factor")? as f32;
    let rest = (1.0 - inputs.float("blend_factor")?) as f32;
    let values = a.data().iter().zip(b.data()).map(|(x, y)| x * f + y * rest).collect();
    let samples =
        Tensor::new(a.shape().to_vec(), values).map_err(|e| NodeError::new(e.to_string()))?;
    Ok(vec![Value::Latent(first.with_samples(samples))])
}

/// `LatentComposite` and `LatentBlend` (`nodes.py`).
pub(super) fn compositing_nodes() -> Vec<Pure> {
    let cells = |name: &str| InputDef::int(name, 0, 0, 16384).option("step", 8);
    vec![
        Pure::new(
            NodeSpec::new("LatentComposite", "Latent Composite", "model/latent")
                .input(InputDef::typed("samples_to", "LATENT"))
                .input(InputDef::typed("samples_from", "LATENT"))
                .input(cells("x"))
                .input(cells("y"))
                .input(cells("feather"))
                .output(OutputDef::new("LATENT"))
                .aliases(&["overlay latent", "layer latent", "paste latent"]),
            latent_composite,
        ),
        Pure::new(
            NodeSpec::new("LatentBlend", "Latent Blend", "experimental")
                .input(InputDef::typed("samples1", "LATENT"))
                .input(InputDef::typed("samples2", "LATENT"))
                .input(
                    InputDef::bare("blend_factor", "FLOAT")
                        .with_options()
                        .option("default", 0.5)
                        .option("min", 0)
                        .option("max", 1)
                        .option("step", 0.01),
                )
                .output(OutputDef::new("LATENT"))
                .aliases(&["mix latents", "interpolate latents"]),
            latent_blend,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::latent_cut_to_batch;
    use crate::nodes::Inputs;
    use crate::tensor::Tensor;
    use crate::value::{Latent, Value};

    /// `LatentCutToBatch` of a `shape` latent holding 0, 1, 2, … along `dim` in slices of `slice`.
    fn cut(shape: Vec<usize>, dim: &str, slice: i64) -> Tensor {
        let n = shape.iter().product::<usize>();
        let samples = Tensor::new(shape, (0..n).map(|i| i as f32).collect()).expect("a tensor");
        let values = BTreeMap::from([
            ("samples".to_owned(), vec![Value::Latent(Latent::new(samples))]),
            ("dim".to_owned(), vec![Value::String(dim.into())]),
            ("slice_size".to_owned(), vec![Value::Int(slice)]),
        ]);
        match latent_cut_to_batch(&Inputs::from_lists(values)).expect("cuts").remove(0) {
            Value::Latent(latent) => latent.samples.clone(),
            other => panic!("not a latent: {other:?}"),
        }
    }

    #[test]
    fn cut_to_batch_orders_slices_sample_by_sample_and_drops_the_remainder() {
        // [2, 1, 1, 5] along x in slices of 2: samples 0 and 1, two slices each, the fifth column dropped.
        let out = cut(vec![2, 1, 1, 5], "x", 2);
        assert_eq!(out.shape(), &[4, 1, 1, 2]);
        assert_eq!(out.data(), &[0.0, 1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 8.0]);
        // Along y of [1, 2, 3, 2] in rows: each slice keeps both channels.
        let out = cut(vec![1, 2, 3, 2], "y", 1);
        assert_eq!(out.shape(), &[3, 2, 1, 2]);
        assert_eq!(&out.data()[..4], &[0.0, 1.0, 6.0, 7.0]);
        // A slice longer than the dimension is the whole dimension; t of an image latent changes nothing.
        assert_eq!(cut(vec![1, 1, 2, 3], "x", 9).shape(), &[1, 1, 2, 3]);
        assert_eq!(cut(vec![2, 1, 2, 3], "t", 1).shape(), &[2, 1, 2, 3]);
        // Frames of a video latent [1, 1, 3, 1, 1] to three single-frame entries.
        let out = cut(vec![1, 1, 3, 1, 1], "t", 1);
        assert_eq!(out.shape(), &[3, 1, 1, 1, 1]);
        assert_eq!(out.data(), &[0.0, 1.0, 2.0]);
    }
}
