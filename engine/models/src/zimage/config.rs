//! Detection: whether a file's tensors (under the caller's prefix) are a NextDiT of the Lumina 2 family Kiln runs
//! (Z-Image, or the original Lumina Image 2.0 and its fine-tunes such as NetaYume), in which key [`Layout`], and
//! its [`Config`], every width derived from tensor shapes (models.md §2.2).
//!
//! ComfyUI recognises Z-Image at dim 3840 and Lumina 2 at dim 2304 and hard-codes the rest; Kiln reads the shapes
//! instead (the blocks' adaLN tells the two apart: Lumina 2 has a SiLU before it), so a shrunken model with the
//! same structure (the test fixtures) loads too. What Kiln cannot run is refused with
//! [`crate::Error::Unsupported`] naming the file and what was found: the omni variant (a SigLIP embedder), the
//! pixel-space variant (a decoder net) and NewBie (a pooled CLIP projection).

use std::collections::BTreeSet;

use crate::error::Result;
use crate::header::Header;

use super::keys;

/// The two key layouts a Z-Image file comes in (models.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's (the published `z_image_turbo_bf16.safetensors`): fused `attention.qkv`, `x_embedder`,
    /// `final_layer`.
    Comfy,
    /// diffusers' `ZImageTransformer2DModel`: `attention.to_q/to_k/to_v`, `all_x_embedder.2-1`,
    /// `all_final_layer.2-1`.
    Diffusers,
}

/// Which NextDiT of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Z-Image: the blocks' adaLN a plain Linear from a 256-wide t-embedding (`z_image_modulation`), time scale
    /// 1000, RoPE θ 256, learned pad tokens.
    ZImage,
    /// The original Lumina Image 2.0 (and NetaYume Lumina): SiLU then Linear from a 1024-wide t-embedding
    /// (`adaLN_modulation.1`), time scale 1, RoPE θ 10000 over three equal axes, grouped-query attention, no pad
    /// tokens.
    Lumina2,
}

impl Variant {
    /// The index of the blocks' adaLN Linear in `adaLN_modulation` (Lumina 2's follows a SiLU).
    pub(crate) fn adaln_index(self) -> usize {
        match self {
            Variant::ZImage => 0,
            Variant::Lumina2 => 1,
        }
    }

    /// RoPE dims per axis for a head width: Z-Image's [32, 48, 48] at 128 (the same proportions elsewhere),
    /// Lumina 2's three equal thirds ([32, 32, 32] at 96); `None` when an axis would be odd.
    pub fn axes_dims(self, head_dim: usize) -> Option<[usize; 3]> {
        match self {
            Variant::ZImage => axes_dims(head_dim),
            Variant::Lumina2 => crate::rope::equal_thirds(head_dim),
        }
    }
}

/// A NextDiT's hyperparameters (Z-Image's or Lumina 2's).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Which NextDiT.
    pub variant: Variant,
    /// Hidden width D (rows of `cap_embedder.1.weight`; 3840 for Turbo).
    pub dim: usize,
    /// Attention heads (D / head_dim).
    pub heads: usize,
    /// Key/value heads (Z-Image: as many as query heads; Lumina 2: 8 for 24, grouped-query attention).
    pub kv_heads: usize,
    /// Head width (width of the q-norm weight; 128).
    pub head_dim: usize,
    /// Main (joint) blocks (30).
    pub layers: usize,
    /// Noise-refiner blocks (modulated, image tokens only; 2).
    pub noise_refiners: usize,
    /// Context-refiner blocks (unmodulated, caption tokens only; 2).
    pub context_refiners: usize,
    /// SwiGLU hidden width (rows of `feed_forward.w1.weight`; 10240).
    pub ffn_hidden: usize,
    /// Caption feature width (the text encoder's hidden size; 2560).
    pub cap_feat_dim: usize,
    /// Sinusoid width of the timestep embedding (columns of `t_embedder.mlp.0.weight`; 256).
    pub t_freq_dim: usize,
    /// Hidden width of the t-embedder MLP (rows of `t_embedder.mlp.0.weight`; 1024).
    pub t_hidden: usize,
    /// Width of the t-embedder's output, the adaLN input (rows of `t_embedder.mlp.2.weight`; 256).
    pub adaln_dim: usize,
    /// RoPE dims per axis (caption/time, row, column), summing to `head_dim` ([`Variant::axes_dims`]).
    pub axes_dims: [usize; 3],
    /// RoPE base θ (Z-Image 256, Lumina 2 10000).
    pub rope_theta: f64,
    /// Caption and image token runs are each padded to a multiple of this with the learned pad tokens: 32 when
    /// the file has `cap_pad_token`, 1 (no padding) otherwise.
    pub pad_multiple: usize,
    /// ε of the blocks' and the caption embedder's RMSNorms (1e-5).
    pub norm_eps: f32,
    /// ε of the per-head q/k RMSNorms: f32 machine epsilon as ComfyUI (which passes none); diffusers and the
    /// original code use 1e-5.
    pub qk_norm_eps: f32,
    /// Spatial patch size (2).
    pub patch_size: usize,
    /// Latent channels in and out (16).
    pub in_channels: usize,
    /// Timestep scale: the t-embedder sees `time_scale · (1 − σ)` (Z-Image 1000, Lumina 2 1).
    pub time_scale: f32,
    /// ComfyUI's `allow_fp16`: the weights of the second-to-last block's `ffn_norm1` spread little enough
    /// (population standard deviation, in their stored type, under 0.42) for the model to compute
    /// in f16, which a mostly-f16 file then does on a GPU. Never for Lumina 2 (ComfyUI's bf16/f32 list).
    pub allow_fp16: bool,
}

impl Config {
    /// Rows of the fused qkv weight: query heads, then key and value heads.
    pub fn qkv_rows(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// The spread of `layers[n − 2].ffn_norm1`'s weights under which ComfyUI lets Z-Image compute in f16.
const FP16_SPREAD: f64 = 0.42;

/// Whether `h` holds a Z-Image NextDiT, in which layout, and its config. `Ok(None)`: not a Lumina 2-family DiT
/// at all (another family). `Err(Unsupported)`: a Lumina 2-family file Kiln cannot run, or one with tensors
/// missing or of the wrong shape.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let layout = if !h.has("cap_embedder.1.weight") {
        return Ok(None);
    } else if h.has("noise_refiner.0.attention.k_norm.weight") {
        Layout::Comfy
    } else if h.has("noise_refiner.0.attention.norm_k.weight") {
        Layout::Diffusers
    } else {
        return Ok(None);
    };
    if h.has("siglip_embedder.0.weight") {
        return Err(h.unsupported(
            "a Z-Image omni model (it has `siglip_embedder.0.weight`); Kiln runs text-to-image Z-Image only",
        ));
    }
    if h.has("dec_net.cond_embed.weight") {
        return Err(h.unsupported(
            "a pixel-space Lumina 2 model (it has `dec_net.cond_embed.weight`); Kiln runs the latent Z-Image and \
             Lumina 2 models only",
        ));
    }
    if h.has("clip_text_pooled_proj.0.weight") {
        return Err(h.unsupported(
            "a NewBie image model (it has `clip_text_pooled_proj.0.weight`: a Jina CLIP pooled vector beside Gemma \
             3's states), which Kiln does not run",
        ));
    }
    let variant = if h.has("layers.0.adaLN_modulation.1.weight") {
        Variant::Lumina2
    } else {
        Variant::ZImage
    };
    if variant == Variant::Lumina2 && layout == Layout::Diffusers {
        return Err(h.unsupported(
            "an original Lumina 2 model in diffusers' layout; Kiln reads Lumina 2 in ComfyUI's (fused `qkv`)",
        ));
    }
    let config = derive(h, layout, variant)?;
    keys::check(h, &config, layout)?;
    Ok(Some((config, layout)))
}

/// The widths of a Lumina 2-family file whose layout is known, from its shapes.
fn derive(h: &Header, layout: Layout, variant: Variant) -> Result<Config> {
    let cap = matrix(h, "cap_embedder.1.weight")?;
    let (dim, cap_feat_dim) = (cap[0], cap[1]);
    let l0 = "layers.0.attention.";
    let (q_norm, k_rows) = match layout {
        Layout::Comfy => (format!("{l0}q_norm.weight"), None),
        Layout::Diffusers => {
            (format!("{l0}norm_q.weight"), Some(matrix(h, &format!("{l0}to_k.weight"))?[0]))
        }
    };
    let head_dim = vector(h, &q_norm)?;
    if head_dim == 0 || !dim.is_multiple_of(head_dim) {
        return Err(
            h.unsupported(format!("head width {head_dim} (`{q_norm}`) does not divide dim {dim}"))
        );
    }
    let heads = dim / head_dim;
    let kv_rows = match (layout, k_rows) {
        (_, Some(rows)) => rows,
        _ => {
            let qkv = matrix(h, &format!("{l0}qkv.weight"))?;
            // q rows are D; k and v share the rest.
            qkv[0].saturating_sub(dim) / 2
        }
    };
    let kv_heads = kv_rows / head_dim;
    if kv_rows == 0 || !kv_rows.is_multiple_of(head_dim) || !heads.is_multiple_of(kv_heads) {
        return Err(h.unsupported(format!(
            "key/value projections of {kv_rows} rows are not whole {head_dim}-wide heads dividing the {heads} \
             query heads"
        )));
    }
    if variant == Variant::ZImage && kv_heads != heads {
        return Err(h.unsupported(format!(
            "a Z-Image model with grouped-query attention ({heads} heads, {kv_heads} kv heads), which no release has"
        )));
    }
    let axes_dims = variant.axes_dims(head_dim).ok_or_else(|| {
        h.unsupported(format!(
            "head width {head_dim} does not split into the model's 3 even RoPE axes (Z-Image: a multiple of 16, \
             Lumina 2: of 6)"
        ))
    })?;
    let t0 = matrix(h, "t_embedder.mlp.0.weight")?;
    let t2 = matrix(h, "t_embedder.mlp.2.weight")?;
    let (t_hidden, t_freq_dim, adaln_dim) = (t0[0], t0[1], t2[0]);
    if t2[1] != t_hidden || !t_freq_dim.is_multiple_of(2) {
        return Err(h.unsupported(format!(
            "t-embedder shapes {t0:?} and {t2:?} do not chain (or an odd sinusoid width)"
        )));
    }
    let ffn_hidden = matrix(h, "layers.0.feed_forward.w1.weight")?[0];
    let (x_name, final_name) = match layout {
        Layout::Comfy => ("x_embedder.weight", "final_layer.linear.weight"),
        Layout::Diffusers => ("all_x_embedder.2-1.weight", "all_final_layer.2-1.linear.weight"),
    };
    let x_emb = matrix(h, x_name)?;
    let out = matrix(h, final_name)?;
    let patch_size = 2;
    let patch_area = patch_size * patch_size;
    if x_emb[0] != dim || !x_emb[1].is_multiple_of(patch_area) || out[0] != x_emb[1] {
        return Err(h.unsupported(format!(
            "patch embedder {x_emb:?} and output {out:?} are not a 2×2-patch model of dim {dim}"
        )));
    }
    let blocks = block_counts(h);
    let lumina2 = variant == Variant::Lumina2;
    Ok(Config {
        variant,
        dim,
        heads,
        kv_heads,
        head_dim,
        layers: blocks[0],
        noise_refiners: blocks[1],
        context_refiners: blocks[2],
        ffn_hidden,
        cap_feat_dim,
        t_freq_dim,
        t_hidden,
        adaln_dim,
        axes_dims,
        rope_theta: if lumina2 { 10_000.0 } else { 256.0 },
        // ComfyUI's Lumina 2 settings never pad, whatever the file holds.
        pad_multiple: if h.has("cap_pad_token") && !lumina2 { 32 } else { 1 },
        norm_eps: 1e-5,
        qk_norm_eps: f32::EPSILON,
        patch_size,
        in_channels: x_emb[1] / patch_area,
        time_scale: if lumina2 { 1.0 } else { 1000.0 },
        allow_fp16: !lumina2 && allows_fp16(h, blocks[0]),
    })
}

/// ComfyUI's `allow_fp16` test (`model_detection.py`): the population standard deviation of block
/// `layers − 2`'s `ffn_norm1` weights, as torch computes it in their type, under [`FP16_SPREAD`]; false when
/// the tensor cannot be read (ComfyUI's `except: pass`).
fn allows_fp16(h: &Header, layers: usize) -> bool {
    let Some(block) = layers.checked_sub(2) else { return false };
    let Some((dtype, values)) = h.float_values(&format!("layers.{block}.ffn_norm1.weight")) else {
        return false;
    };
    if values.is_empty() {
        return false;
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let variance = values.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
    // torch answers in the tensor's type: the spread rounded to it.
    let std = variance.sqrt() as f32;
    let std = kiln_compute::dtype::round_to(dtype, std);
    f64::from(std) < FP16_SPREAD
}

/// RoPE dims per axis for a head width: Z-Image's [32, 48, 48] at 128, the same proportions elsewhere.
pub fn axes_dims(head_dim: usize) -> Option<[usize; 3]> {
    head_dim.is_multiple_of(16).then(|| [head_dim / 4, head_dim * 3 / 8, head_dim * 3 / 8])
}

/// Consecutive indices from 0 of `layers.{i}.`, `noise_refiner.{i}.`, `context_refiner.{i}.` (until a gap).
fn block_counts(h: &Header) -> [usize; 3] {
    let mut seen: [BTreeSet<usize>; 3] = Default::default();
    for name in h.names() {
        for (set, group) in seen.iter_mut().zip(keys::GROUPS) {
            let index = name
                .strip_prefix(group)
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok());
            if let Some(i) = index {
                set.insert(i);
            }
        }
    }
    seen.map(|set| (0..).take_while(|i| set.contains(i)).count())
}

/// The shape of a rank-2 tensor that must exist.
fn matrix(h: &Header, name: &str) -> Result<[usize; 2]> {
    h.require(name)?;
    let shape = h.values_shape(name).unwrap_or_default();
    match shape[..] {
        [rows, cols] => Ok([rows, cols]),
        _ => Err(h.unsupported(format!("`{}` is {shape:?}, not a matrix", h.key(name)))),
    }
}

/// The length of a rank-1 tensor that must exist.
fn vector(h: &Header, name: &str) -> Result<usize> {
    let t = h.require(name)?;
    match t.shape[..] {
        [len] => Ok(len),
        _ => Err(h.unsupported(format!("`{}` is {:?}, not a vector", h.key(name), t.shape))),
    }
}
