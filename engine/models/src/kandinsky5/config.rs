//! Detection of a Kandinsky 5 DiT (ComfyUI's key names) and its [`Config`], every width read from tensor shapes as
//! ComfyUI's `detect_unet_config` reads them, and the [`LoadPlan`].

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks a Kandinsky 5 DiT (ComfyUI's detection key).
pub const MARKER: &str = "visual_transformer_blocks.0.cross_attention.key_norm.weight";
/// Patch side on rows and columns (ComfyUI's `patch_size` (1, 2, 2): one frame deep, image and video models).
pub const PATCH: usize = 2;
/// ε of every LayerNorm (torch's default).
pub const LN_EPS: f32 = 1e-5;

/// A Kandinsky 5 DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden width (`model_dim`: 2560 for Lite image, 1792 for Lite video).
    pub dim: usize,
    /// Width of the timestep embedding that modulates every block (`time_dim`: 512).
    pub time_dim: usize,
    /// Width of the feed-forwards' hidden layer (`ff_dim`: 10240 for Lite image, 7168 for Lite video).
    pub ff_dim: usize,
    /// Width of the text states read (`in_text_dim`: Qwen2.5-VL 7B's 3584).
    pub text_dim: usize,
    /// Width of the pooled vector read (`in_text_dim2`: CLIP-L's 768).
    pub pooled_dim: usize,
    /// Latent channels out, and in before [`Config::concat_channels`] (16).
    pub channels: usize,
    /// Text self-attention blocks (2).
    pub text_blocks: usize,
    /// Visual blocks (50 for Lite image, 32 for Lite video).
    pub visual_blocks: usize,
    /// Head width (`sum(axes_dims)`: 128 for Lite image, 64 for Lite video).
    pub head_dim: usize,
    /// RoPE widths of the frame, row and column axes (`axes_dims`: (32, 48, 48) for a 128-wide head).
    pub axes: [usize; 3],
    /// How far apart consecutive patches sit on each axis, inverted (`rope_scale_factor`: position i is
    /// i / factor; (1, 1, 1) for the Lite image model, (1, 2, 2) for the video models).
    pub rope_scale: [f64; 3],
    /// Whether this is a video model (ComfyUI's `Kandinsky5` rather than `Kandinsky5Image`): its patch embedding
    /// reads the latent joined with [`Config::concat_channels`] more channels (a zero image latent and a mask),
    /// and it denoises HunyuanVideo latents ([`super::family::VIDEO_LATENT`]).
    pub video: bool,
}

/// ComfyUI's model_dim of the Pro video model, whose RoPE scale grows at high resolutions.
const PRO_DIM: usize = 4096;
/// The latent area (h·w) from which the Pro video model spreads rows and columns by 3.16 instead of 2.
const PRO_WIDE_AREA: usize = 14080;
/// The Lite image model's width: with channels joined it is the image editing model, not a video model.
const LITE_IMAGE_DIM: usize = 2560;

impl Config {
    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.dim / self.head_dim
    }

    /// Whether this is a video model (see [`Config::video`]).
    pub fn is_video(&self) -> bool {
        self.video
    }

    /// The channels ComfyUI's `Kandinsky5.concat_cond` joins after the latent, which the DiT's input must carry:
    /// 0 for the image model; for the video models `channels + 1`: `channels` zeros (the image latent, always
    /// zeros in ComfyUI) then one mask channel (1 − `concat_mask`, or zeros without one).
    pub fn concat_channels(&self) -> usize {
        if self.video { self.channels + 1 } else { 0 }
    }

    /// The channels the DiT's input carries: the latent's and [`Config::concat_channels`].
    pub fn in_channels(&self) -> usize {
        self.channels + self.concat_channels()
    }

    /// The RoPE scale ComfyUI's `rope_encode_3d` uses for a latent of `h × w` (unpadded): [`Config::rope_scale`],
    /// except that a 4096-wide model (Pro video) spreads rows and columns by 3.16 from h·w = 14080 up.
    pub fn rope_scale_at(&self, h: usize, w: usize) -> [f64; 3] {
        if self.dim == PRO_DIM && h * w >= PRO_WIDE_AREA {
            [self.rope_scale[0], 3.16, 3.16]
        } else {
            self.rope_scale
        }
    }
}

/// Whether `h` holds a Kandinsky 5 DiT, and its config. `Ok(None)`: not one. `Err(Unsupported)`: the image
/// editing model, a patch embedding of another width, a head width without ComfyUI's RoPE axes, or tensors missing
/// or misshapen.
///
/// ComfyUI keys the RoPE axes and scales on `model_dim` (2560 and 4096: axes (32, 48, 48); 1792 and the rest:
/// (16, 24, 24); 2560 alone: scale (1, 1, 1), the rest (1, 2, 2)) and takes a file for the image model only when
/// it is 2560 wide with a 64-feature patch embedding. Kiln reads the head width the axes add up to from the q/k
/// norms, and image or video from the patch embedding's width: the latent's channels alone (the image model), or
/// joined with as many zero channels and a mask (`2·channels + 1`, the video models: scale (1, 2, 2)); which give
/// ComfyUI's settings for every released file. A 2560-wide model with joined channels (the image editing model,
/// which ComfyUI would take for a video model) is refused.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, "a Kandinsky 5 DiT");
    let visual_in = dims("visual_embeddings.in_layer.weight", 2)?;
    let (dim, visual_embed) = (visual_in[0], visual_in[1]);
    let out = dims("out_layer.out_layer.weight", 2)?;
    let channels = out[0] / (PATCH * PATCH);
    let patch = PATCH * PATCH;
    let video = if visual_embed == channels * patch {
        false
    } else if visual_embed == (2 * channels + 1) * patch {
        if dim == LITE_IMAGE_DIM {
            return Err(h.unsupported(format!(
                "Kandinsky 5's image editing model ({dim} wide, {visual_embed} features a patch: an image \
                 latent and a mask joined to the latent); Kiln runs Kandinsky 5 Lite's text-to-image and video \
                 models"
            )));
        }
        true
    } else {
        return Err(h.unsupported(format!(
            "a Kandinsky 5 DiT reading {visual_embed} features a patch: neither the image model's {} (the \
             latent's {channels} channels) nor the video models' {} (joined with {channels} more and a mask)",
            channels * patch,
            (2 * channels + 1) * patch
        )));
    };
    let head_dim = dims(MARKER, 1)?[0];
    let axes = match head_dim {
        128 => [32, 48, 48],
        64 => [16, 24, 24],
        other => {
            return Err(h.unsupported(format!(
                "a Kandinsky 5 DiT with {other}-wide heads (ComfyUI's RoPE axes fit 64 or 128)"
            )));
        }
    };
    if !dim.is_multiple_of(head_dim) {
        return Err(h.unsupported(format!(
            "a Kandinsky 5 DiT {dim} wide, not a whole number of {head_dim}-wide heads"
        )));
    }
    let config = Config {
        dim,
        time_dim: dims("time_embeddings.in_layer.bias", 1)?[0],
        ff_dim: dims("visual_transformer_blocks.0.feed_forward.in_layer.weight", 2)?[0],
        text_dim: dims("text_embeddings.in_layer.weight", 2)?[1],
        pooled_dim: dims("pooled_text_embeddings.in_layer.weight", 2)?[1],
        channels,
        text_blocks: h
            .gapless_blocks("text_transformer_blocks.", "a Kandinsky 5 DiT whose text blocks")?,
        visual_blocks: h.gapless_blocks(
            "visual_transformer_blocks.",
            "a Kandinsky 5 DiT whose visual blocks",
        )?,
        head_dim,
        axes,
        rope_scale: if video { [1.0, 2.0, 2.0] } else { [1.0; 3] },
        video,
    };
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the Kandinsky 5 DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, t) = (cfg.dim, cfg.time_dim);
    let mut all = Shapes::default();
    all.linear("time_embeddings.in_layer", t, d);
    all.linear("time_embeddings.out_layer", t, t);
    all.linear("pooled_text_embeddings.in_layer", t, cfg.pooled_dim);
    all.norm("pooled_text_embeddings.norm", t);
    all.linear("text_embeddings.in_layer", d, cfg.text_dim);
    all.norm("text_embeddings.norm", d);
    for i in 0..cfg.text_blocks {
        let p = format!("text_transformer_blocks.{i}");
        all.linear(&format!("{p}.text_modulation.out_layer"), 6 * d, t);
        all.attention(&format!("{p}.self_attention"), d, cfg.head_dim);
        all.feed_forward(&p, d, cfg.ff_dim);
    }
    all.linear("visual_embeddings.in_layer", d, cfg.in_channels() * PATCH * PATCH);
    for i in 0..cfg.visual_blocks {
        let p = format!("visual_transformer_blocks.{i}");
        all.linear(&format!("{p}.visual_modulation.out_layer"), 9 * d, t);
        all.attention(&format!("{p}.self_attention"), d, cfg.head_dim);
        all.attention(&format!("{p}.cross_attention"), d, cfg.head_dim);
        all.feed_forward(&p, d, cfg.ff_dim);
    }
    all.linear("out_layer.modulation.out_layer", 2 * d, t);
    all.linear("out_layer.out_layer", PATCH * PATCH * cfg.channels, d);
    all.0
}

/// Weight names with their shapes, gathered module by module.
#[derive(Default)]
struct Shapes(Vec<(String, Vec<usize>)>);

impl Shapes {
    /// A Linear's weight `[out, inp]` and bias.
    fn linear(&mut self, name: &str, out: usize, inp: usize) {
        self.0.push((format!("{name}.weight"), vec![out, inp]));
        self.0.push((format!("{name}.bias"), vec![out]));
    }

    /// An affine LayerNorm's weight and bias.
    fn norm(&mut self, name: &str, width: usize) {
        self.0.push((format!("{name}.weight"), vec![width]));
        self.0.push((format!("{name}.bias"), vec![width]));
    }

    /// An attention's projections and per-head q/k RMS norms.
    fn attention(&mut self, p: &str, d: usize, head_dim: usize) {
        for part in ["to_query", "to_key", "to_value", "out_layer"] {
            self.linear(&format!("{p}.{part}"), d, d);
        }
        self.0.push((format!("{p}.query_norm.weight"), vec![head_dim]));
        self.0.push((format!("{p}.key_norm.weight"), vec![head_dim]));
    }

    /// A block's bias-free feed-forward.
    fn feed_forward(&mut self, p: &str, d: usize, ff_dim: usize) {
        self.0.push((format!("{p}.feed_forward.in_layer.weight"), vec![ff_dim, d]));
        self.0.push((format!("{p}.feed_forward.out_layer.weight"), vec![d, ff_dim]));
    }
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}
