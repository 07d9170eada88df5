//! The latent arithmetic of `comfy_extras.nodes_latent`: `LatentAdd`, `LatentSubtract`, `LatentMultiply`,
//! `LatentInterpolate`, `LatentBatch`, `LatentBatchSeedBehavior` and `ReplaceVideoLatentFrames`, and
//! `BatchLatentsNode` (`comfy_extras.nodes_post_processing`). What rides with
//! the first latent (noise mask, batch indices) rides on, as ComfyUI copies its dict.
//!
//! Invariant: a second latent of another size is fitted to the first as ComfyUI's `reshape_latent_to` fits it:
//! resized bilinearly with the centre crop (each frame of a video latent), then cut or repeated to the batch.

use super::latent::{cat, repeat_to_batch};
use super::mask::tensor;
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let spec = |name: &str, display: &str, category: &str| {
        NodeSpec::new(name, display, category).python_module("comfy_extras.nodes_latent").v3()
    };
    let advanced = |name: &str| spec(name, "", "model/latent/advanced");
    let two = |s: NodeSpec| {
        s.input(InputDef::typed("samples1", "LATENT")).input(InputDef::typed("samples2", "LATENT"))
    };
    let ratio = |name: &str, default: f64, min: f64, max: f64| {
        InputDef::float(name, default, min, max).option("step", 0.01)
    };
    vec![
        Pure::new(
            two(advanced("LatentAdd"))
                .output(OutputDef::new("LATENT"))
                .aliases(&["combine latents", "sum latents"]),
            |inputs| combine(inputs, |a, b| a + b),
        ),
        Pure::new(
            two(advanced("LatentSubtract"))
                .output(OutputDef::new("LATENT"))
                .aliases(&["difference latent", "remove features"]),
            |inputs| combine(inputs, |a, b| a - b),
        ),
        Pure::new(
            advanced("LatentMultiply")
                .input(InputDef::typed("samples", "LATENT"))
                .input(ratio("multiplier", 1.0, -10.0, 10.0))
                .output(OutputDef::new("LATENT"))
                .aliases(&["scale latent", "amplify latent", "latent gain"]),
            |inputs| {
                let latent = inputs.latent("samples")?;
                let m = inputs.float("multiplier")? as f32;
                Ok(vec![Value::Latent(latent.with_samples(latent.samples.map(|v| v * m)))])
            },
        ),
        Pure::new(
            two(advanced("LatentInterpolate"))
                .input(ratio("ratio", 1.0, 0.0, 1.0))
                .output(OutputDef::new("LATENT"))
                .aliases(&["blend latent", "mix latent", "lerp latent", "transition"]),
            latent_interpolate,
        ),
        Pure::new(
            two(spec("LatentBatch", "Batch Latents (DEPRECATED)", "model/latent/batch").deprecated())
                .output(OutputDef::new("LATENT"))
                .aliases(&["combine latents", "merge latents", "join latents"]),
            latent_batch,
        ),
        Pure::new(
            NodeSpec::new("BatchLatentsNode", "Batch Latents", "model/latent/batch")
                .python_module("comfy_extras.nodes_post_processing")
                .v3()
                .autogrow_prefix("latents", InputDef::typed("latent", "LATENT"), "latent", (1, 50))
                .output(OutputDef::new("LATENT"))
                .aliases(&["combine latents", "stack latents", "merge latents"]),
            batch_latents_node,
        ),
        Pure::new(
            advanced("LatentBatchSeedBehavior")
                .input(InputDef::typed("samples", "LATENT"))
                .input(
                    InputDef::bare("seed_behavior", "COMBO")
                        .option("default", "fixed")
                        .option("multiselect", false)
                        .option("options", vec!["random".to_owned(), "fixed".to_owned()]),
                )
                .output(OutputDef::new("LATENT")),
            seed_behavior,
        ),
        Pure::new(
            spec("ReplaceVideoLatentFrames", "Replace Video Latent Frames", "model/latent/batch")
                .input(
                    InputDef::typed("destination", "LATENT")
                        .tooltip("The destination latent where frames will be replaced."),
                )
                .optional(InputDef::typed("source", "LATENT").tooltip(
                    "The source latent providing frames to insert into the destination latent. If not \
                     provided, the destination latent is returned unchanged.",
                ))
                .input(
                    InputDef::bare("index", "INT")
                        .tooltip(
                            "The starting latent frame index in the destination latent where the source latent \
                             frames will be placed. Negative values count from the end.",
                        )
                        .option("default", 0)
                        .option("min", -MAX_RESOLUTION)
                        .option("max", MAX_RESOLUTION)
                        .option("step", 1),
                )
                .output(OutputDef::new("LATENT")),
            replace_video_latent_frames,
        ),
    ]
}

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// `samples1` with `f(a, b)` of each value and `samples2`'s, fitted to it.
fn combine(inputs: &Inputs, f: impl Fn(f32, f32) -> f32) -> Result<Vec<Value>, NodeError> {
    let first = inputs.latent("samples1")?;
    let a = &first.samples;
    let b = fit_to(&inputs.latent("samples2")?.samples, a.shape(), true)?;
    let values = a.data().iter().zip(b.data()).map(|(&x, &y)| f(x, y)).collect();
    Ok(vec![Value::Latent(first.with_samples(tensor(a.shape().to_vec(), values)?))])
}

/// ComfyUI's `reshape_latent_to`: `latent` resized (bilinear, centre crop) to `target`'s last two dimensions
/// where its other dimensions differ, then, with `repeat_batch`, cut or repeated to `target`'s batch. A
/// latent of one frame meets a video latent's frames as torch broadcasts it: repeated over them (Kiln keeps
/// an image's latent from a video VAE 4-D, ComfyUI's `[B, C, 1, h, w]`).
fn fit_to(latent: &Tensor, target: &[usize], repeat_batch: bool) -> Result<Tensor, NodeError> {
    let latent = &over_frames(&as_frame(latent, target.len())?, target)?;
    let shape = latent.shape();
    let mut fitted = latent.clone();
    if shape[1..] != target[1..] {
        let n = shape.len();
        if n != target.len() || !(n == 4 || n == 5) || shape[1..n - 2] != target[1..n - 2] {
            return Err(invalid(format!(
                "latents of shapes {shape:?} and {target:?} cannot be combined: only their width, height and \
                 batch may differ"
            )));
        }
        let (h, w) = (target[n - 2], target[n - 1]);
        fitted = resize_frames(latent, w, h)?;
    }
    if repeat_batch { repeat_to_batch(&fitted, target[0]) } else { Ok(fitted) }
}

/// `latent` `[B, C, h, w]` as one frame `[B, C, 1, h, w]` when a `dims`-dimensional video latent is wanted;
/// otherwise as it is.
fn as_frame(latent: &Tensor, dims: usize) -> Result<Tensor, NodeError> {
    match (latent.shape(), dims) {
        (&[b, c, h, w], 5) => tensor(vec![b, c, 1, h, w], latent.data().to_vec()),
        _ => Ok(latent.clone()),
    }
}

/// A video latent of one frame repeated to `target`'s frames (torch's broadcasting), where `target` has more;
/// otherwise `latent` as it is.
fn over_frames(latent: &Tensor, target: &[usize]) -> Result<Tensor, NodeError> {
    let &[b, c, 1, h, w] = latent.shape() else { return Ok(latent.clone()) };
    let frames = match target {
        &[_, _, t, _, _] if t > 1 => t,
        _ => return Ok(latent.clone()),
    };
    let plane = h * w;
    let values = latent.data().chunks(plane).flat_map(|p| p.repeat(frames)).collect();
    tensor(vec![b, c, frames, h, w], values)
}

/// Every `[h, w]` plane of a 4-D or 5-D latent resized to `w` × `h` (bilinear, centre crop), as
/// `common_upscale` resizes a latent.
fn resize_frames(latent: &Tensor, w: usize, h: usize) -> Result<Tensor, NodeError> {
    let shape = latent.shape();
    let n = shape.len();
    let (lh, lw) = (shape[n - 2], shape[n - 1]);
    let planes = latent.data().len() / (lh * lw).max(1);
    // Each plane as a one-channel image [planes, h, w, 1]: bilinear resizing works plane by plane.
    let images = tensor(vec![planes, lh, lw, 1], latent.data().to_vec())?;
    let resized = resize(&images, w, h, "bilinear", true)?;
    let mut out_shape = shape.to_vec();
    (out_shape[n - 2], out_shape[n - 1]) = (h, w);
    tensor(out_shape, resized.data().to_vec())
}

/// `LatentInterpolate`: each position's channel vector is split into its length and direction; the directions
/// are mixed by `ratio` and renormalised, the lengths mixed alike. The lengths `[B, …]` broadcast against the
/// samples `[B, C, …]` as torch aligns them (from the last dimension: a batch of one, or of as many samples as
/// channels, where sample c's lengths divide channel c).
fn latent_interpolate(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let first = inputs.latent("samples1")?;
    let s1 = &first.samples;
    let s2 = fit_to(&inputs.latent("samples2")?.samples, s1.shape(), true)?;
    let ratio = inputs.float("ratio")? as f32;
    let shape = s1.shape().to_vec();
    let [batch, channels] = [shape[0], shape[1]];
    if batch != 1 && batch != channels {
        return Err(invalid(format!(
            "The size of tensor a ({channels}) must match the size of tensor b ({batch}) at non-singleton \
             dimension 1: LatentInterpolate takes one sample, or as many samples as the latent has channels"
        )));
    }
    let plane: usize = shape[2..].iter().product();
    let norms = |s: &[f32]| -> Vec<f32> {
        (0..batch * plane)
            .map(|i| {
                let (b, p) = (i / plane, i % plane);
                let sum: f32 =
                    (0..channels).map(|c| s[(b * channels + c) * plane + p].powi(2)).sum();
                sum.sqrt()
            })
            .collect()
    };
    // The length that divides value (b, c, p): sample c's with as many samples as channels, else the one sample's.
    let at = |m: &[f32], c: usize, p: usize| m[if batch == 1 { p } else { c * plane + p }];
    let nan_to_num = |v: f32| if v.is_nan() { 0.0 } else { v.clamp(f32::MIN, f32::MAX) };
    let (m1, m2) = (norms(s1.data()), norms(s2.data()));
    let mut t = vec![0.0; s1.data().len()];
    for (i, v) in t.iter_mut().enumerate() {
        let (c, p) = ((i / plane) % channels, i % plane);
        let d1 = nan_to_num(s1.data()[i] / at(&m1, c, p));
        let d2 = nan_to_num(s2.data()[i] / at(&m2, c, p));
        *v = d1 * ratio + d2 * (1.0 - ratio);
    }
    let mt = norms(&t);
    let values = (0..t.len())
        .map(|i| {
            let (c, p) = ((i / plane) % channels, i % plane);
            let st = nan_to_num(t[i] / at(&mt, c, p));
            st * (at(&m1, c, p) * ratio + at(&m2, c, p) * (1.0 - ratio))
        })
        .collect();
    Ok(vec![Value::Latent(first.with_samples(tensor(shape, values)?))])
}

/// `LatentBatch`: `samples2` after `samples1`, as [`batch_latents`].
fn latent_batch(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latents = [inputs.latent("samples1")?, inputs.latent("samples2")?];
    Ok(vec![Value::Latent(batch_latents(&latents)?)])
}

/// `BatchLatentsNode`: the given latents (`latents.latent0`, ...) in one batch, as [`batch_latents`].
fn batch_latents_node(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latents: Vec<&Latent> = (0..50)
        .filter_map(|i| match inputs.get(&format!("latents.latent{i}")) {
            Some(Value::Latent(l)) => Some(l),
            _ => None,
        })
        .collect();
    if latents.is_empty() {
        return Err(invalid("BatchLatentsNode: no latent to batch".to_owned()));
    }
    Ok(vec![Value::Latent(batch_latents(&latents)?)])
}

/// ComfyUI's `batch_latents`: every latent after the first fitted to its size (its batch kept), all in one
/// batch, with each one's batch indices (its own, or 0, 1, … where it has none); the rest rides with the first.
fn batch_latents(latents: &[&Latent]) -> Result<Latent, NodeError> {
    let first = latents[0];
    let shape = first.samples.shape();
    let mut samples = first.samples.clone();
    let mut batch_index = Vec::new();
    for (i, latent) in latents.iter().enumerate() {
        // Only height and width are fitted: `torch.cat` refuses other channels or frames.
        let other = latent.samples.shape();
        let middle = |s: &[usize]| s.get(1..s.len().saturating_sub(2)).map(<[usize]>::to_vec);
        if other.len() != shape.len() || shape.len() < 3 || middle(other) != middle(shape) {
            return Err(invalid(format!(
                "cannot batch a latent of shape {other:?} with one of {shape:?}: their channels and frames must \
                 agree"
            )));
        }
        let fitted = if i == 0 { samples.clone() } else { fit_to(&latent.samples, shape, false)? };
        let n = fitted.shape()[0] as i64;
        batch_index.extend(latent.batch_index.clone().unwrap_or_else(|| (0..n).collect()));
        if i > 0 {
            samples = cat(&samples, &fitted, 0)?;
        }
    }
    Ok(Latent { samples, batch_index: Some(batch_index), ..first.clone() })
}

/// `LatentBatchSeedBehavior`: `random` drops the batch indices (each sample its own noise); `fixed` gives every
/// sample the first's (0 where there are none), so they share its noise.
fn seed_behavior(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latent = inputs.latent("samples")?;
    let mut out = latent.clone();
    match inputs.string("seed_behavior")? {
        "random" => out.batch_index = None,
        "fixed" => {
            let first = latent.batch_index.as_ref().and_then(|i| i.first().copied()).unwrap_or(0);
            out.batch_index = Some(vec![first; latent.samples.shape()[0]]);
        }
        other => return Err(invalid(format!("unknown seed_behavior '{other}' (random or fixed)"))),
    }
    Ok(vec![Value::Latent(out)])
}

/// `ReplaceVideoLatentFrames`: `destination`'s latent frames from `index` on (from the end if negative)
/// replaced by `source`'s. A source that does not fit there leaves the destination unchanged (ComfyUI warns);
/// what rides along is the source's. An image's latent is one frame, and a source of one sample goes into
/// every sample of the destination (torch broadcasts the assignment).
fn replace_video_latent_frames(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let destination = inputs.latent("destination")?;
    let Some(_) = inputs.get("source") else {
        return Ok(vec![Value::Latent(destination.clone())]);
    };
    let source = inputs.latent("source")?;
    let d = &destination.samples;
    let s = &as_frame(&source.samples, d.shape().len())?;
    let s = &repeat_to_batch(s, if s.shape()[0] == 1 { d.shape()[0] } else { s.shape()[0] })?;
    let (ds, ss) = (d.shape(), s.shape());
    if ds.len() != 5 || ss.len() != 5 {
        return Err(invalid(format!(
            "ReplaceVideoLatentFrames takes video latents [B, C, T, H, W], not {ds:?} and {ss:?}"
        )));
    }
    let (dest_frames, source_frames) = (ds[2] as i64, ss[2] as i64);
    let mut index = inputs.int("index")?;
    if index < 0 {
        index += dest_frames;
    }
    if index > dest_frames || index + source_frames > dest_frames {
        tracing::warn!(
            "ReplaceVideoLatentFrames: the source's {source_frames} frames do not fit the destination's \
             {dest_frames} at index {index}; the destination is unchanged"
        );
        return Ok(vec![Value::Latent(destination.clone())]);
    }
    if index < 0 || ds[0] != ss[0] || ds[1] != ss[1] || ds[3..] != ss[3..] {
        return Err(invalid(format!(
            "the source latent {ss:?} cannot replace the frames of the destination {ds:?} at index {}: \
             the index must fall within its frames and the batch, channels and size must be the same",
            inputs.int("index")?
        )));
    }
    let (index, frames) = (index as usize, ss[2]);
    let plane = ds[3] * ds[4];
    let mut values = d.data().to_vec();
    for outer in 0..ds[0] * ds[1] {
        let to = (outer * ds[2] + index) * plane;
        let from = outer * frames * plane;
        values[to..to + frames * plane].copy_from_slice(&s.data()[from..from + frames * plane]);
    }
    Ok(vec![Value::Latent(source.with_samples(tensor(ds.to_vec(), values)?))])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::nodes::Node;

    /// `scripts/reference/latent_ops.py`'s record of ComfyUI's nodes.
    fn fixture() -> BTreeMap<String, Tensor> {
        crate::fixtures::tensors("latent_ops/io.safetensors")
    }

    /// `scripts/reference/batch_nodes.py`'s record of ComfyUI's BatchLatentsNode: latents of other sizes fitted to
    /// the first, their batch indices (given, or counted) joined; video latents frame by frame.
    #[test]
    fn batch_latents_node_is_comfyuis() {
        let io = crate::fixtures::tensors("batch_nodes/io.safetensors");
        let latent = |k: &str, index: Option<Vec<i64>>| {
            Value::Latent(Latent { batch_index: index, ..Latent::new(io[k].clone()) })
        };
        let out = run(
            "BatchLatentsNode",
            vec![
                ("latents.latent0", latent("latent0", None)),
                ("latents.latent1", latent("latent1", Some(vec![5, 7]))),
                ("latents.latent2", latent("latent2", None)),
            ],
        )
        .unwrap();
        assert_eq!(out.samples.shape(), io["latents.out"].shape());
        crate::fixtures::assert_within(
            "latents",
            out.samples.data(),
            io["latents.out"].data(),
            1e-5,
        );
        let want: Vec<i64> = io["latents.index"].data().iter().map(|&v| v as i64).collect();
        assert_eq!(out.batch_index, Some(want));
        let videos = run(
            "BatchLatentsNode",
            vec![
                ("latents.latent0", latent("video0", None)),
                ("latents.latent1", latent("video1", None)),
            ],
        )
        .unwrap();
        crate::fixtures::assert_within(
            "videos",
            videos.samples.data(),
            io["videos.out"].data(),
            1e-5,
        );
        // A clip of other frames cannot join (ComfyUI's `torch.cat` refuses it too).
        let short = Value::Latent(Latent::new(Tensor::full(vec![1, 4, 1, 6, 8], 0.0)));
        let err = run(
            "BatchLatentsNode",
            vec![("latents.latent0", latent("video0", None)), ("latents.latent1", short)],
        )
        .expect_err("1 frame after 2");
        assert!(err.message.contains("frames"), "{}", err.message);
    }

    /// Runs the node `name` on `inputs` and returns its latent.
    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Result<Latent, NodeError> {
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        match crate::fixtures::node_outputs(&node, inputs)?.into_iter().next() {
            Some(Value::Latent(latent)) => Ok(latent),
            other => panic!("{name}: not one latent: {other:?}"),
        }
    }

    fn latent(t: &Tensor) -> Value {
        Value::Latent(Latent::new(t.clone()))
    }

    fn indexed(t: &Tensor, index: &[i64]) -> Value {
        Value::Latent(Latent { batch_index: Some(index.to_vec()), ..Latent::new(t.clone()) })
    }

    fn check(what: &str, got: &Latent, want: &Tensor) {
        assert_eq!(got.samples.shape(), want.shape(), "{what}");
        crate::fixtures::assert_relative(what, got.samples.data(), want.data(), 1e-5);
    }

    fn indices(t: &Tensor) -> Vec<i64> {
        t.data().iter().map(|&v| v as i64).collect()
    }

    #[test]
    fn arithmetic_fits_the_second_latent_and_matches_comfyui() {
        let io = fixture();
        let two =
            |a: &str, b: &str| vec![("samples1", latent(&io[a])), ("samples2", latent(&io[b]))];
        check("add", &run("LatentAdd", two("a", "b")).unwrap(), &io["add"]);
        check("subtract", &run("LatentSubtract", two("a", "b")).unwrap(), &io["subtract"]);
        // [2, 4, 3, 4] resized to 6 × 5 with the centre crop and cut to one sample.
        check("add.small", &run("LatentAdd", two("a", "small")).unwrap(), &io["add.small"]);
        check("add.video", &run("LatentAdd", two("video", "video_b")).unwrap(), &io["add.video"]);
        let scaled = run(
            "LatentMultiply",
            vec![("samples", latent(&io["a"])), ("multiplier", Value::Float(-1.7))],
        );
        check("multiply", &scaled.unwrap(), &io["multiply"]);
        // Only width, height and batch may differ.
        let Err(err) = run("LatentAdd", two("a", "video")) else { panic!("4-D and 5-D") };
        assert!(err.message.contains("cannot be combined"), "{}", err.message);
    }

    #[test]
    fn interpolation_mixes_directions_and_lengths_as_comfyui() {
        let io = fixture();
        let mix = |a: &str, b: &str, ratio: f64| {
            run(
                "LatentInterpolate",
                vec![
                    ("samples1", latent(&io[a])),
                    ("samples2", latent(&io[b])),
                    ("ratio", Value::Float(ratio)),
                ],
            )
        };
        for ratio in [0.0, 0.3, 1.0] {
            let name = format!("interpolate.{ratio:.1}");
            check(&name, &mix("a", "b", ratio).unwrap(), &io[&name]);
        }
        check("small", &mix("a", "small", 0.6).unwrap(), &io["interpolate.small"]);
        // Four samples of four channels: torch divides channel c by sample c's lengths.
        check("batch4", &mix("batch4", "a", 0.25).unwrap(), &io["interpolate.batch4"]);
        // A position of length 0 mixes as a zero direction.
        check("zero", &mix("zero_pixel", "b", 0.4).unwrap(), &io["interpolate.zero"]);
        check("video", &mix("video", "video_b", 0.7).unwrap(), &io["interpolate.video"]);
        // Two samples of four channels cannot broadcast, in torch as here.
        let two = Tensor::full(vec![2, 4, 6, 5], 1.0);
        let Err(err) = run(
            "LatentInterpolate",
            vec![
                ("samples1", latent(&two)),
                ("samples2", latent(&io["a"])),
                ("ratio", Value::Float(0.5)),
            ],
        ) else {
            panic!("a batch of 2 with 4 channels")
        };
        assert!(err.message.contains("LatentInterpolate"), "{}", err.message);
    }

    #[test]
    fn batching_and_seed_behaviour_keep_comfyuis_batch_indices() {
        let io = fixture();
        let batch = run(
            "LatentBatch",
            vec![("samples1", latent(&io["a"])), ("samples2", latent(&io["small"]))],
        )
        .unwrap();
        check("batch", &batch, &io["batch"]);
        assert_eq!(batch.batch_index, Some(indices(&io["batch.index"])));
        let batch = run(
            "LatentBatch",
            vec![
                ("samples1", indexed(&io["a"], &[3])),
                ("samples2", indexed(&io["small"], &[5, 6])),
            ],
        )
        .unwrap();
        check("batch.indexed", &batch, &io["batch.indexed"]);
        assert_eq!(batch.batch_index, Some(indices(&io["batch.indexed.index"])));

        let seeded = |behaviour: &str| {
            run(
                "LatentBatchSeedBehavior",
                vec![
                    ("samples", indexed(&io["small"], &[5, 6])),
                    ("seed_behavior", Value::String(behaviour.into())),
                ],
            )
            .unwrap()
        };
        assert_eq!(seeded("fixed").batch_index, Some(indices(&io["seed.fixed.index"])));
        assert_eq!(seeded("random").batch_index, None);
    }

    #[test]
    fn video_frames_are_replaced_where_the_source_fits_as_comfyui() {
        let io = fixture();
        let replace = |index: i64, source: bool| {
            let mut inputs =
                vec![("destination", latent(&io["video"])), ("index", Value::Int(index))];
            if source {
                inputs.push(("source", latent(&io["clip"])));
            }
            run("ReplaceVideoLatentFrames", inputs)
        };
        for index in [0, 3, -2, 4] {
            let name = format!("replace.{index}");
            check(&name, &replace(index, true).unwrap(), &io[&name]);
        }
        check("no source", &replace(2, false).unwrap(), &io["video"]);
        // An image's latent (4-D here, [1, 16, 1, h, w] in ComfyUI) is one frame, put into every sample of a
        // batch of two as torch broadcasts the assignment.
        let video = Tensor::full(vec![2, 16, 5, 4, 6], 1.0);
        let image = Tensor::full(vec![1, 16, 4, 6], 7.0);
        let out = run(
            "ReplaceVideoLatentFrames",
            vec![
                ("destination", latent(&video)),
                ("index", Value::Int(-1)),
                ("source", latent(&image)),
            ],
        )
        .unwrap();
        assert_eq!(out.samples.shape(), [2, 16, 5, 4, 6]);
        for (i, v) in out.samples.data().iter().enumerate() {
            let frame = (i / 24) % 5;
            assert_eq!(*v, if frame == 4 { 7.0 } else { 1.0 }, "value {i}");
        }
        // And added to a video, it is added to each of its frames.
        let sum =
            run("LatentAdd", vec![("samples1", latent(&video)), ("samples2", latent(&image))]);
        assert!(sum.unwrap().samples.data().iter().all(|&v| v == 8.0));
        // Before the first frame ComfyUI's slice assignment raises; Kiln names the index.
        let Err(err) = replace(-7, true) else { panic!("index -7") };
        assert!(err.message.contains("index -7"), "{}", err.message);
    }
}
