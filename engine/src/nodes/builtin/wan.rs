//! The Wan video nodes: `EmptyHunyuanLatentVideo` (the empty video latent every Wan 2.1 and A14B template
//! starts from), `WanImageToVideo`, `WanFirstLastFrameToVideo` and `WanFunInpaintToVideo` (a conditioning
//! video of the given frames, grey elsewhere, VAE-encoded, with the mask of which frames were given and the CLIP
//! vision states, set on both prompts; `comfy_extras.nodes_wan`), `Wan22ImageToVideoLatent` (Wan 2.2 TI2V 5B:
//! the given frames encoded into the latent itself, kept by a noise mask) and `TrimVideoLatent`.

use std::sync::Arc;

use super::clip_vision::vision_output;
use super::pure::Pure;
use super::resize::resize;
use super::vae::encode_video;
use crate::compute::Compute;
use crate::models::{CondExtras, LatentFormat, Vae};
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;
/// Frames per latent frame along time (the Wan VAEs').
pub(super) const TEMPORAL: usize = 4;
/// Channels of the Wan 2.1 latent the 2.1 nodes make.
pub(super) const WAN21_CHANNELS: usize = 16;
/// Channels and pixels per latent position of the Wan 2.2 VAE's latent.
const WAN22_CHANNELS: usize = 48;
const WAN22_DOWNSCALE: usize = 16;

/// Latent frames of a clip of `length` frames: ⌊(length − 1) / 4⌋ + 1.
pub(super) fn latent_frames(length: usize) -> usize {
    (length.saturating_sub(1)) / TEMPORAL + 1
}

/// A non-negative size input.
pub(super) fn size(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    usize::try_from(inputs.int(name)?)
        .map_err(|_| NodeError::new(format!("`{name}` must be 0 or more")))
}

/// What every Wan conditioning node reads first: its VAE and the video's size.
pub(super) struct VideoRequest<'a> {
    pub(super) vae: &'a Arc<Vae>,
    pub(super) width: usize,
    pub(super) height: usize,
    /// Frames.
    pub(super) length: usize,
    pub(super) batch: usize,
}

impl<'a> VideoRequest<'a> {
    /// The `vae`, `width`, `height`, `length` and `batch_size` inputs.
    pub(super) fn read(inputs: &'a Inputs) -> Result<VideoRequest<'a>, NodeError> {
        Ok(VideoRequest {
            vae: inputs.vae("vae")?,
            width: size(inputs, "width")?,
            height: size(inputs, "height")?,
            length: size(inputs, "length")?,
            batch: size(inputs, "batch_size")?,
        })
    }
}

/// The outputs every Wan conditioning node starts with: both prompts with `set` applied to their extras
/// (ComfyUI's `conditioning_set_values` on each), then the latent.
pub(super) fn conditioned(
    inputs: &Inputs,
    set: impl Fn(&mut CondExtras),
    latent: Tensor,
) -> Result<[Value; 3], NodeError> {
    let positive = inputs.conditioning("positive")?.with_extras(&set);
    let negative = inputs.conditioning("negative")?.with_extras(&set);
    Ok([
        Value::Conditioning(Arc::new(positive)),
        Value::Conditioning(Arc::new(negative)),
        Value::Latent(Latent::new(latent)),
    ])
}

/// [`conditioned`] with what the image-to-video nodes set: the conditioning latent and its mask (ComfyUI's
/// `concat_latent_image` and `concat_mask`) and the CLIP vision states, each where given.
pub(super) fn image_conditioned(
    inputs: &Inputs,
    concat: Option<(Tensor, Tensor)>,
    clip_vision: Option<Tensor>,
    latent: Tensor,
) -> Result<[Value; 3], NodeError> {
    conditioned(inputs, |extras| set_image(extras, concat.as_ref(), clip_vision.as_ref()), latent)
}

/// What the image-to-video nodes set on a prompt: the conditioning latent and its mask and the CLIP vision
/// states, each where given.
pub(super) fn set_image(
    extras: &mut CondExtras,
    concat: Option<&(Tensor, Tensor)>,
    clip_vision: Option<&Tensor>,
) {
    if let Some((image, mask)) = concat {
        extras.concat_latent_image = Some(image.clone());
        extras.concat_mask = Some(mask.clone());
    }
    if let Some(states) = clip_vision {
        extras.clip_vision = Some(states.clone());
    }
}

/// The width, height, length and batch inputs every node here declares, with `width`/`height` defaults,
/// minimum and step, and `length`'s default.
pub(super) fn video_inputs(
    spec: NodeSpec,
    (width, height): (i64, i64),
    min_step: (i64, i64),
    length: i64,
) -> NodeSpec {
    let (min, step) = min_step;
    spec.input(InputDef::int("width", width, min, MAX_RESOLUTION).option("step", step))
        .input(InputDef::int("height", height, min, MAX_RESOLUTION).option("step", step))
        .input(InputDef::int("length", length, 1, MAX_RESOLUTION).option("step", 4))
        .input(InputDef::int("batch_size", 1, 1, 4096))
}

/// `EmptyHunyuanLatentVideo` ("Empty HunyuanVideo 1.0 Latent"): zeros `[batch, 16, ⌊(length − 1)/4⌋ + 1,
/// height / 8, width / 8]`, marked as made for an 8× VAE so Wan 2.2 5B's sampler refits it to its own space.
pub(super) fn empty_hunyuan_latent_video() -> Pure {
    let spec = NodeSpec::new(
        "EmptyHunyuanLatentVideo",
        "Empty HunyuanVideo 1.0 Latent",
        "model/latent/hunyuan video",
    )
    .python_module("comfy_extras.nodes_hunyuan")
    .v3();
    let spec = video_inputs(spec, (848, 480), (16, 16), 25).output(OutputDef::new("LATENT"));
    Pure::new(spec, |inputs| {
        let shape = vec![
            size(inputs, "batch_size")?,
            WAN21_CHANNELS,
            latent_frames(size(inputs, "length")?),
            size(inputs, "height")? / 8,
            size(inputs, "width")? / 8,
        ];
        let latent =
            Latent { downscale_ratio_spacial: Some(8), ..Latent::new(Tensor::full(shape, 0.0)) };
        Ok(vec![Value::Latent(latent)])
    })
}

/// Which of the two conditioning nodes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `WanImageToVideo`: an optional start image and CLIP vision output.
    Start,
    /// `WanFirstLastFrameToVideo`: optional start and end images, each with its CLIP vision output.
    FirstLast,
    /// `WanFunInpaintToVideo`: `WanFirstLastFrameToVideo` with one CLIP vision output, the start image's.
    FunInpaint,
}

/// `WanImageToVideo` or `WanFirstLastFrameToVideo`.
pub(super) struct WanImageToVideo {
    spec: Arc<NodeSpec>,
    kind: Kind,
    compute: Arc<Compute>,
}

impl WanImageToVideo {
    /// `WanImageToVideo`.
    pub(super) fn start(compute: Arc<Compute>) -> WanImageToVideo {
        let optional = ["clip_vision_output", "start_image"];
        let spec = conditioning_spec("WanImageToVideo", "model/conditioning/wan", &optional);
        WanImageToVideo { spec: Arc::new(spec), kind: Kind::Start, compute }
    }

    /// `WanFirstLastFrameToVideo`.
    pub(super) fn first_last(compute: Arc<Compute>) -> WanImageToVideo {
        let optional =
            ["clip_vision_start_image", "clip_vision_end_image", "start_image", "end_image"];
        let spec =
            conditioning_spec("WanFirstLastFrameToVideo", "model/conditioning/wan", &optional);
        WanImageToVideo { spec: Arc::new(spec), kind: Kind::FirstLast, compute }
    }

    /// `WanFunInpaintToVideo`.
    pub(super) fn fun_inpaint(compute: Arc<Compute>) -> WanImageToVideo {
        let optional = ["clip_vision_output", "start_image", "end_image"];
        let category = "model/conditioning/wan/fun inpaint";
        let spec = conditioning_spec("WanFunInpaintToVideo", category, &optional);
        WanImageToVideo { spec: Arc::new(spec), kind: Kind::FunInpaint, compute }
    }
}

/// The conditioning nodes' declaration: the prompts, the VAE, the sizes, then `optional` (CLIP vision
/// outputs, then images, by their names).
pub(super) fn conditioning_spec(name: &str, category: &str, optional: &[&str]) -> NodeSpec {
    let spec = NodeSpec::new(name, "", category)
        .python_module("comfy_extras.nodes_wan")
        .v3()
        .input(InputDef::typed("positive", "CONDITIONING"))
        .input(InputDef::typed("negative", "CONDITIONING"))
        .input(InputDef::typed("vae", "VAE"));
    let mut spec = video_inputs(spec, (832, 480), (16, 16), 81);
    for input in optional {
        let ty = if input.starts_with("clip_vision") { "CLIP_VISION_OUTPUT" } else { "IMAGE" };
        spec = spec.optional(InputDef::typed(input, ty));
    }
    spec.output(OutputDef::new("CONDITIONING").named("positive"))
        .output(OutputDef::new("CONDITIONING").named("negative"))
        .output(OutputDef::new("LATENT").named("latent"))
}

impl Node for WanImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let frames = latent_frames(length);
        let image = |name: &str| -> Result<Option<Tensor>, NodeError> {
            match inputs.get(name) {
                Some(_) => Ok(Some(inputs.image(name)?.clone())),
                None => Ok(None),
            }
        };
        let (start, end) = (image("start_image")?, image("end_image")?);
        let start = start.map(|s| fit_frames(&s, ..length, width, height)).transpose()?;
        let end = end.map(|e| fit_frames(&e, length.., width, height)).transpose()?;
        let clip_vision = match self.kind {
            Kind::Start => penultimate(inputs, "clip_vision_output")?,
            Kind::FirstLast => {
                let first = penultimate(inputs, "clip_vision_start_image")?;
                let last = penultimate(inputs, "clip_vision_end_image")?;
                match (first, last) {
                    (Some(first), Some(last)) => Some(join_tokens(&first, &last)?),
                    (first, last) => first.or(last),
                }
            }
            Kind::FunInpaint => penultimate(inputs, "clip_vision_output")?,
        };
        let (channels, scale) = match self.kind {
            Kind::Start => (WAN21_CHANNELS, 8),
            Kind::FirstLast | Kind::FunInpaint => {
                (vae.net.family().latent().channels, vae.net.downscale())
            }
        };
        let latent =
            Tensor::full(vec![batch, channels, frames, height / scale, width / scale], 0.0);
        // The conditioning video: grey (0 in the VAE's [-1, 1]) with the given frames in place, encoded, and
        // which latent frames the model is given.
        let concat = match (self.kind, &start, &end) {
            (Kind::Start, None, _) => None,
            (Kind::Start, Some(start), _) => {
                Some(start_clip(&self.compute, vae, start, [length, height, width], ctx)?)
            }
            (Kind::FirstLast | Kind::FunInpaint, start, end) => {
                let video = grey_video(length, height, width, start.as_ref(), end.as_ref())?;
                let encoded = encode_video(&self.compute, vae, &video, ctx)?;
                let mask =
                    first_last_mask(spatial(&encoded)?, frames, start.as_ref(), end.as_ref())?;
                Some((encoded, mask))
            }
        };
        Ok(NodeResult::values(image_conditioned(inputs, concat, clip_vision, latent)?))
    }
}

/// `WanImageToVideo`'s conditioning for a start image already fitted to the clip (`fit_frames`): a grey clip
/// of `length` frames of `height` × `width` with the start's frames in front, encoded, and the mask
/// `[1, 1, latent frames, h, w]` that is 0 on the latent frames the start covers.
pub(super) fn start_clip(
    compute: &Compute,
    vae: &Vae,
    start: &Tensor,
    [length, height, width]: [usize; 3],
    ctx: &Context,
) -> Result<(Tensor, Tensor), NodeError> {
    let video = grey_video(length, height, width, Some(start), None)?;
    let encoded = encode_video(compute, vae, &video, ctx)?;
    let given = latent_frames(start.shape()[0]);
    let mask = frame_mask(&encoded, latent_frames(length), |f| f < given)?;
    Ok((encoded, mask))
}

/// `image`'s frames in `range` (clamped to the batch; `length..` means the last `length`) resized bilinearly
/// with a centre crop to `width` × `height`, as the nodes' `common_upscale(image[:length])` /
/// `image[-length:]`.
pub(super) fn fit_frames(
    image: &Tensor,
    range: impl std::ops::RangeBounds<usize>,
    width: usize,
    height: usize,
) -> Result<Tensor, NodeError> {
    resize(&frame_range(image, range)?, width, height, "bilinear", true)
}

/// `image`'s frames in `range`, clamped to the batch: `..length` the first `length`, `length..` the last
/// `length`, `a..b` frames a to b.
pub(super) fn frame_range(
    image: &Tensor,
    range: impl std::ops::RangeBounds<usize>,
) -> Result<Tensor, NodeError> {
    let &[n, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    let (from, to) = match (range.start_bound(), range.end_bound()) {
        // `..length`: the first frames.
        (std::ops::Bound::Unbounded, std::ops::Bound::Excluded(&end)) => (0, end.min(n)),
        // `length..`: the last frames.
        (std::ops::Bound::Included(&last), std::ops::Bound::Unbounded) => {
            (n.saturating_sub(last), n)
        }
        // `a..b`: those frames.
        (std::ops::Bound::Included(&a), std::ops::Bound::Excluded(&b)) => {
            (a.min(n), b.min(n).max(a.min(n)))
        }
        _ => (0, n),
    };
    let per = h * w * c;
    Tensor::new(vec![to - from, h, w, c], image.data()[from * per..to * per].to_vec())
        .map_err(|e| NodeError::new(e.to_string()))
}

/// `length` grey frames (0.5) `[length, height, width, 3]` with `start`'s frames at the front and `end`'s at
/// the back (RGB only).
pub(super) fn grey_video(
    length: usize,
    height: usize,
    width: usize,
    start: Option<&Tensor>,
    end: Option<&Tensor>,
) -> Result<Tensor, NodeError> {
    filled_video(0.5, length, height, width, start, end)
}

/// [`grey_video`] with frames of `fill` (WanDancer's are black, 0).
pub(super) fn filled_video(
    fill: f32,
    length: usize,
    height: usize,
    width: usize,
    start: Option<&Tensor>,
    end: Option<&Tensor>,
) -> Result<Tensor, NodeError> {
    let frame = height * width * 3;
    let mut video = vec![fill; length * frame];
    let mut put = |image: &Tensor, at_end: bool| {
        let n = image.shape()[0].min(length);
        let c = image.shape()[3];
        let first = if at_end { length - n } else { 0 };
        for i in 0..n {
            let src = &image.data()[i * height * width * c..][..height * width * c];
            let dst = &mut video[(first + i) * frame..][..frame];
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(c)) {
                d.copy_from_slice(&s[..3.min(c)]);
            }
        }
    };
    if let Some(start) = start {
        put(start, false);
    }
    if let Some(end) = end {
        put(end, true);
    }
    Tensor::new(vec![length, height, width, 3], video).map_err(|e| NodeError::new(e.to_string()))
}

/// `[1, 1, frames, h, w]` (h, w of `encoded` `[1, C, T, h, w]`): 0 on the latent frames `given` says were
/// given, 1 elsewhere.
pub(super) fn frame_mask(
    encoded: &Tensor,
    frames: usize,
    given: impl Fn(usize) -> bool,
) -> Result<Tensor, NodeError> {
    let (h, w) = spatial(encoded)?;
    let values = (0..frames)
        .flat_map(|f| std::iter::repeat_n(if given(f) { 0.0 } else { 1.0 }, h * w))
        .collect();
    Tensor::new(vec![1, 1, frames, h, w], values).map_err(|e| NodeError::new(e.to_string()))
}

/// `WanFirstLastFrameToVideo`'s mask `[1, 4, frames, h, w]` at latent sides `h` × `w`: one value per pixel frame (4 per latent frame),
/// 0 on the start image's frames and the 3 after them and on the end image's frames, 1 elsewhere; pixel frame
/// 4t + k is channel k of latent frame t.
pub(super) fn first_last_mask(
    (h, w): (usize, usize),
    frames: usize,
    start: Option<&Tensor>,
    end: Option<&Tensor>,
) -> Result<Tensor, NodeError> {
    let pixel_frames = frames * TEMPORAL;
    let mut given = vec![false; pixel_frames];
    if let Some(start) = start {
        given.iter_mut().take(start.shape()[0] + 3).for_each(|g| *g = true);
    }
    if let Some(end) = end {
        given.iter_mut().rev().take(end.shape()[0]).for_each(|g| *g = true);
    }
    let mut values = Vec::with_capacity(pixel_frames * h * w);
    for k in 0..TEMPORAL {
        for t in 0..frames {
            let v = if given[t * TEMPORAL + k] { 0.0 } else { 1.0 };
            values.extend(std::iter::repeat_n(v, h * w));
        }
    }
    Tensor::new(vec![1, TEMPORAL, frames, h, w], values).map_err(|e| NodeError::new(e.to_string()))
}

/// The height and width of a `[B, C, T, h, w]` latent.
pub(super) fn spatial(latent: &Tensor) -> Result<(usize, usize), NodeError> {
    match *latent.shape() {
        [_, _, _, h, w] => Ok((h, w)),
        ref other => {
            Err(NodeError::new(format!("expected a video latent [B, C, T, h, w], got {other:?}")))
        }
    }
}

/// The penultimate hidden states, which Wan attends to, of the optional CLIP vision output input `name`;
/// `None` when it is not connected.
pub(super) fn penultimate(inputs: &Inputs, name: &str) -> Result<Option<Tensor>, NodeError> {
    if inputs.get(name).is_none() {
        return Ok(None);
    }
    let output = vision_output(inputs, name)?;
    output.penultimate_hidden_states.clone().map(Some).ok_or_else(|| {
            NodeError::new(
                "this CLIP vision output has no penultimate hidden states (a one-layer tower); Wan needs \
                 a CLIP vision model such as clip_vision_h",
        )
    })
}

/// `a` `[B, n, D]` and `b` `[B, m, D]` joined on the tokens.
fn join_tokens(a: &Tensor, b: &Tensor) -> Result<Tensor, NodeError> {
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() != 3 || sb.len() != 3 || sa[0] != sb[0] || sa[2] != sb[2] {
        return Err(NodeError::new(format!(
            "the start and end images' CLIP vision states {sa:?} and {sb:?} cannot be joined"
        )));
    }
    let (pa, pb) = (sa[1] * sa[2], sb[1] * sb[2]);
    let mut out = Vec::with_capacity(a.data().len() + b.data().len());
    for i in 0..sa[0] {
        out.extend_from_slice(&a.data()[i * pa..][..pa]);
        out.extend_from_slice(&b.data()[i * pb..][..pb]);
    }
    Tensor::new(vec![sa[0], sa[1] + sb[1], sa[2]], out).map_err(|e| NodeError::new(e.to_string()))
}

/// `Wan22ImageToVideoLatent`: Wan 2.2 TI2V 5B's latent `[1, 48, ⌊(length − 1)/4⌋ + 1, height / 16, width /
/// 16]`. Without an image, zeros. With one, its frames encoded into the first latent frames, the rest the
/// latent space's zero (each channel's mean, in VAE space), repeated to the batch, with a noise mask of 0 on
/// the given frames so sampling keeps them.
pub(super) struct Wan22ImageToVideoLatent {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl Wan22ImageToVideoLatent {
    pub(super) fn new(compute: Arc<Compute>) -> Wan22ImageToVideoLatent {
        let spec = NodeSpec::new("Wan22ImageToVideoLatent", "", "model/conditioning/wan")
            .python_module("comfy_extras.nodes_wan")
            .v3()
            .input(InputDef::typed("vae", "VAE"));
        let spec = video_inputs(spec, (1280, 704), (32, 32), 49)
            .optional(InputDef::typed("start_image", "IMAGE"))
            .output(OutputDef::new("LATENT"));
        Wan22ImageToVideoLatent { spec: Arc::new(spec), compute }
    }
}

impl Node for Wan22ImageToVideoLatent {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let (frames, h, w) =
            (latent_frames(length), height / WAN22_DOWNSCALE, width / WAN22_DOWNSCALE);
        let shape = vec![1, WAN22_CHANNELS, frames, h, w];
        if inputs.get("start_image").is_none() {
            return Ok(NodeResult::values([Value::Latent(Latent::new(Tensor::full(shape, 0.0)))]));
        }
        let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
        let encoded = encode_video(&self.compute, vae, &start, ctx)?;
        let es = encoded.shape().to_vec();
        if es.len() != 5 || es[1] != WAN22_CHANNELS || es[3] != h || es[4] != w {
            return Err(NodeError::new(format!(
                "Wan22ImageToVideoLatent needs the Wan 2.2 VAE (48 channels, 16× down); this VAE made a latent \
                 of shape {es:?} for a {width}×{height} image"
            )));
        }
        let given = es[2].min(frames);
        let plane = h * w;
        let samples = encoded_then_zero(&encoded, &vae.net.family().latent(), frames)?;
        let mask: Vec<f32> = (0..frames)
            .flat_map(|f| std::iter::repeat_n(if f < given { 0.0 } else { 1.0 }, plane))
            .collect();
        let repeat = |values: &[f32]| values.repeat(batch);
        let to_tensor = |shape: Vec<usize>, values: Vec<f32>| {
            Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
        };
        let latent = Latent {
            noise_mask: Some(to_tensor(vec![batch, 1, frames, h, w], repeat(&mask))?),
            ..Latent::new(to_tensor(vec![batch, WAN22_CHANNELS, frames, h, w], repeat(&samples))?)
        };
        Ok(NodeResult::values([Value::Latent(latent)]))
    }
}

/// The `[C, frames, h, w]` values of a latent whose first frames are `encoded`'s (`[1, C, n, h, w]`, as many
/// as fit) and the rest `format`'s zero in VAE space (each channel's mean: what `process_out` makes of zeros).
pub(super) fn encoded_then_zero(
    encoded: &Tensor,
    format: &LatentFormat,
    frames: usize,
) -> Result<Vec<f32>, NodeError> {
    let &[1, channels, n, h, w] = encoded.shape() else {
        return Err(NodeError::new(format!(
            "expected an encoded video [1, C, T, h, w], got {:?}",
            encoded.shape()
        )));
    };
    let plane = h * w;
    let given = n.min(frames);
    let zero = format.process_out(&vec![0.0; channels], &[1, channels]);
    let mut values = Vec::with_capacity(channels * frames * plane);
    for (c, &zero) in zero.iter().enumerate() {
        values.extend_from_slice(&encoded.data()[c * n * plane..][..given * plane]);
        values.extend(std::iter::repeat_n(zero, (frames - given) * plane));
    }
    Ok(values)
}

/// `TrimVideoLatent` ("Trim Video Latent"): the latent without its first `trim_amount` frames (the rest of the
/// latent dict unchanged).
pub(super) fn trim_video_latent() -> Pure {
    let spec = NodeSpec::new("TrimVideoLatent", "Trim Video Latent", "model/latent")
        .python_module("comfy_extras.nodes_wan")
        .v3()
        .input(InputDef::typed("samples", "LATENT"))
        .input(InputDef::int("trim_amount", 0, 0, 99999))
        .output(OutputDef::new("LATENT"));
    Pure::new(spec, |inputs| {
        let latent = inputs.latent("samples")?;
        let trim = size(inputs, "trim_amount")?;
        let s = latent.samples.shape();
        let &[_, _, frames, _, _] = s else {
            return Err(NodeError::new(format!(
                "TrimVideoLatent takes a video latent [B, C, T, h, w], got {s:?}"
            )));
        };
        let samples = latent_frame_range(&latent.samples, trim..frames)?;
        Ok(vec![Value::Latent(latent.with_samples(samples))])
    })
}

/// A video latent `[B, C, T, h, w]`'s frames in `range` (clamped to its T frames).
pub(super) fn latent_frame_range(
    latent: &Tensor,
    range: std::ops::Range<usize>,
) -> Result<Tensor, NodeError> {
    let &[b, c, t, h, w] = latent.shape() else {
        return Err(NodeError::new(format!("expected a video latent, got {:?}", latent.shape())));
    };
    let (from, to) = (range.start.min(t), range.end.clamp(range.start.min(t), t));
    let plane = h * w;
    let mut values = Vec::with_capacity(b * c * (to - from) * plane);
    for series in latent.data().chunks_exact(t * plane) {
        values.extend_from_slice(&series[from * plane..to * plane]);
    }
    Tensor::new(vec![b, c, to - from, h, w], values).map_err(|e| NodeError::new(e.to_string()))
}

/// `latent` `[B, C, T, h, w]` with its first m frames replaced by `frames` `[1, C, m, h, w]` in every sample
/// (`what` names the frames in the error when they do not fit).
pub(super) fn with_leading_frames(
    latent: &Tensor,
    frames: &Tensor,
    what: &str,
) -> Result<Tensor, NodeError> {
    let (ls, fs) = (latent.shape(), frames.shape());
    let fits = matches!(
        (ls, fs),
        (&[_, c, t, h, w], &[1, fc, m, fh, fw]) if (fc, fh, fw) == (c, h, w) && m <= t
    );
    if !fits {
        return Err(NodeError::new(format!("{what} {fs:?} does not fit the latent {ls:?}")));
    }
    let (channels, per_channel) = (ls[1], ls[2] * ls[3] * ls[4]);
    let mut values = latent.data().to_vec();
    let n = frames.data().len() / channels;
    overwrite_leading_frames(&mut values, channels, per_channel, frames.data(), n);
    Tensor::new(ls.to_vec(), values).map_err(|e| NodeError::new(e.to_string()))
}

/// Puts `leading` (`[C, n]`: each channel's first n values) over the start of each channel's `per_channel`
/// values in every sample of `values` (`[B, C, per_channel]`).
pub(super) fn overwrite_leading_frames(
    values: &mut [f32],
    channels: usize,
    per_channel: usize,
    leading: &[f32],
    n: usize,
) {
    for sample in values.chunks_exact_mut(channels * per_channel) {
        for (c, series) in sample.chunks_exact_mut(per_channel).enumerate() {
            series[..n].copy_from_slice(&leading[c * n..][..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clip_of_length_frames_has_a_latent_frame_per_four_plus_one() {
        assert_eq!([1, 4, 5, 33, 81, 121].map(latent_frames), [1, 1, 2, 9, 21, 31]);
    }

    #[test]
    fn first_last_masks_the_start_and_three_after_it_and_the_end() {
        let start = Tensor::full(vec![1, 2, 2, 3], 0.0);
        let end = Tensor::full(vec![1, 2, 2, 3], 0.0);
        let mask = first_last_mask((1, 1), 3, Some(&start), Some(&end)).unwrap();
        assert_eq!(mask.shape(), &[1, 4, 3, 1, 1]);
        // Pixel frames 0..4 given (start + 3), 11 (end); channel k, latent frame t = pixel frame 4t + k.
        let at = |k: usize, t: usize| mask.data()[k * 3 + t];
        assert_eq!([at(0, 0), at(1, 0), at(2, 0), at(3, 0)], [0.0; 4]);
        assert_eq!([at(0, 1), at(3, 1), at(0, 2), at(2, 2), at(3, 2)], [1.0, 1.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn the_grey_video_holds_the_start_in_front_and_the_end_at_the_back() {
        let start = Tensor::full(vec![1, 1, 1, 4], 1.0);
        let end = Tensor::full(vec![1, 1, 1, 3], 0.0);
        let video = grey_video(3, 1, 1, Some(&start), Some(&end)).unwrap();
        assert_eq!(video.data(), &[1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0]);
    }
}
