//! Detection of a Kandinsky 5 DiT (ComfyUI's key names) and its [`Config`], every width read from tensor shapes as
//! ComfyUI's `detect_unet_config` reads them, and the [`LoadPlan`].

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks a Kandinsky 5 DiT (ComfyUI's detection key).
pub const MARKER: &str = "visual_transformer_blocks.0.cross_attention.key_norm.weight";
/// Patch side on rows and columns (ComfyUI's `patch_size` (1, 2, 2): one frame deep).
pub const PATCH: usize = 2;
/// ε of every LayerNorm (torch's default).
pub const LN_EPS: f32 = 1e-5;

/// A Kandinsky 5 DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden width (`model_dim`: 2560 for Lite image).
    pub dim: usize,
    /// Width of the timestep embedding that modulates every block (`time_dim`: 512).
    pub time_dim: usize,
    /// Width of the feed-forwards' hidden layer (`ff_dim`: 10240).
    pub ff_dim: usize,
    /// Width of the text states read (`in_text_dim`: Qwen2.5-VL 7B's 3584).
    pub text_dim: usize,
    /// Width of the pooled vector read (`in_text_dim2`: CLIP-L's 768).
    pub pooled_dim: usize,
    /// Latent channels in and out (16).
    pub channels: usize,
    /// Text self-attention blocks (2).
    pub text_blocks: usize,
    /// Visual blocks (50 for Lite image).
    pub visual_blocks: usize,
    /// Head width (`sum(axes_dims)`: 128).
    pub head_dim: usize,
    /// RoPE widths of the frame, row and column axes (`axes_dims`: (32, 48, 48) for a 128-wide head).
    pub axes: [usize; 3],
    /// How far apart consecutive patches sit on each axis, inverted (`rope_scale_factor`: position i is
    /// i / factor; (1, 1, 1) for the Lite image model).
    pub rope_scale: [f64; 3],
}

impl Config {
    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.dim / self.head_dim
    }
}

/// Whether `h` holds a Kandinsky 5 DiT, and its config. `Ok(None)`: not one. `Err(Unsupported)`: a video model
/// (Kiln runs the Lite image model), a head width without ComfyUI's RoPE axes, or tensors missing or misshapen.
///
/// ComfyUI keys the RoPE axes and scales on `model_dim` (2560 and 4096: axes (32, 48, 48); 1792 and the rest:
/// (16, 24, 24); 2560 alone: scale (1, 1, 1)); Kiln reads the head width they add up to from the q/k norms, and
/// the image model from its patch embedding's width (no channels joined to the latent), which give the same for
/// every released file.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, "a Kandinsky 5 DiT");
    let visual_in = dims("visual_embeddings.in_layer.weight", 2)?;
    let (dim, visual_embed) = (visual_in[0], visual_in[1]);
    let out = dims("out_layer.out_layer.weight", 2)?;
    let channels = out[0] / (PATCH * PATCH);
    if visual_embed != channels * PATCH * PATCH {
        return Err(h.unsupported(format!(
            "a Kandinsky 5 model that joins an image latent and a mask to its latent (the video and editing \
             models: {visual_embed} features a patch, not {}); Kiln runs Kandinsky 5 Lite's text-to-image model",
            channels * PATCH * PATCH
        )));
    }
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
        rope_scale: [1.0; 3],
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
    all.linear("visual_embeddings.in_layer", d, cfg.channels * PATCH * PATCH);
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
