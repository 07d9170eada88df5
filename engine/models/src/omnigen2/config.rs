//! Detection: whether a file's tensors (under the caller's prefix) are an OmniGen2 or Boogu-Image DiT in ComfyUI's
//! key layout, and its [`Config`], every width derived from tensor shapes.
//!
//! ComfyUI recognises OmniGen2 by `time_caption_embed.timestep_embedder.linear_1.bias` and hard-codes the
//! released model (hidden 2520, 21 heads of 120 over 7 key/value heads, 32 layers, 2 refiners of each kind, RoPE
//! axes (40, 40, 40), text features 2048, time scale 1000). It recognises Boogu-Image (checked first) by
//! `double_stream_layers.0.img_instruct_attn.processor.img_to_q.weight` and reads the hidden width, the block
//! counts and the instruction width from the file, the rest being `BooguTransformer2DModel`'s defaults (28 heads
//! of 120 over 7 key/value heads, axes (40, 40, 40), θ 10000, time scale 1000). Kiln reads the shapes instead:
//! the q-norm's width is the head width, `to_q`'s and `to_k`'s rows count the query and key/value heads, and the
//! RoPE axes are the head's three equal thirds (the released 120 → 40 each), so a shrunken model with the same
//! structure loads too; θ and the time scale are ComfyUI's constants. A file of either family with a tensor
//! missing or misshapen is [`crate::Error::Unsupported`] naming it.

use crate::error::Result;
use crate::header::Header;

use super::keys;

/// The tensor ComfyUI's detection keys the family on (Lumina 2's diffusers layout has it too).
const MARKER: &str = "time_caption_embed.timestep_embedder.linear_1.bias";
/// Tensors only OmniGen2 has beside [`MARKER`]: the reference images' embedder and index embedding.
const OWN: [&str; 2] = ["ref_image_patch_embedder.weight", "image_index_embedding"];
/// The tensor ComfyUI's detection keys Boogu-Image on (before OmniGen2's [`MARKER`]).
const BOOGU_MARKER: &str = "double_stream_layers.0.img_instruct_attn.processor.img_to_q.weight";

/// Which of the two DiTs a [`Config`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// OmniGen2 (`OmniGen2Transformer2DModel`): refiners, then the joint blocks `layers.*`.
    OmniGen2,
    /// Boogu-Image (`BooguTransformer2DModel`): refiners, then [`Config::double_stream_layers`] double-stream
    /// blocks `double_stream_layers.*`, then the joint blocks `single_stream_layers.*`.
    Boogu,
}

impl Variant {
    /// The key prefix of the joint (single-stream) blocks, without the dot: `layers` or `single_stream_layers`.
    pub fn layers_group(self) -> &'static str {
        match self {
            Variant::OmniGen2 => "layers",
            Variant::Boogu => "single_stream_layers",
        }
    }

    /// What messages call the model: "an OmniGen2 model" or "a Boogu-Image model".
    pub(crate) fn what(self) -> &'static str {
        match self {
            Variant::OmniGen2 => "an OmniGen2 model",
            Variant::Boogu => "a Boogu-Image model",
        }
    }
}

/// An OmniGen2 or Boogu-Image DiT's hyperparameters (the released Boogu-Image's values in the field docs as
/// "Boogu …").
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// OmniGen2 or Boogu-Image (which also names the joint blocks' keys: [`Variant::layers_group`]).
    pub variant: Variant,
    /// Hidden width D (rows of `x_embedder.weight`; 2520, Boogu 3360).
    pub hidden: usize,
    /// Attention heads (rows of `to_q` / head width; 21, Boogu 28).
    pub heads: usize,
    /// Key/value heads (rows of `to_k` / head width; 7: grouped-query attention).
    pub kv_heads: usize,
    /// Head width (width of the q-norm weight; 120).
    pub head_dim: usize,
    /// Joint blocks over caption, references and image (32; `layers.*`, Boogu's `single_stream_layers.*`).
    pub layers: usize,
    /// Boogu-Image's double-stream blocks, run between the refiners and the joint blocks (0 for OmniGen2; Boogu
    /// 8).
    pub double_stream_layers: usize,
    /// Blocks of each refiner: the noise (image) refiner, the reference-image refiner, the context refiner (2).
    pub refiners: usize,
    /// SwiGLU hidden width (rows of `feed_forward.linear_1.weight`; 4·D rounded up to a multiple of 256), the
    /// double-stream blocks' two FFNs' too.
    pub ffn_hidden: usize,
    /// Caption feature width (the text encoder's hidden size; 2048; Boogu's `instruction_feat_dim`, 4096).
    pub text_feat_dim: usize,
    /// Sinusoid width of the timestep embedding (columns of `timestep_embedder.linear_1.weight`; 256).
    pub t_freq_dim: usize,
    /// Width of the t-embedding, the modulations' input (rows of `timestep_embedder.linear_1.weight`:
    /// min(D, 1024)).
    pub t_dim: usize,
    /// RoPE dims per axis (caption/time, row, column), summing to `head_dim` ([`axes_dims`]).
    pub axes_dims: [usize; 3],
    /// RoPE base θ (10000).
    pub rope_theta: f64,
    /// ε of the blocks' and the caption embedder's RMSNorms (1e-5).
    pub norm_eps: f32,
    /// Spatial patch size (2).
    pub patch_size: usize,
    /// Latent channels in and out (16).
    pub in_channels: usize,
    /// Scale of the timestep sinusoid: the embedder sees `timestep_scale · (1 − t)` (1000).
    pub timestep_scale: f32,
    /// Reference images the model can tell apart (rows of `image_index_embedding`; 5).
    pub max_references: usize,
}

impl Config {
    /// Features of one patch token: p²·C.
    pub fn patch_features(&self) -> usize {
        self.patch_size * self.patch_size * self.in_channels
    }

    /// Whether this is Boogu-Image (`BooguTransformer2DModel`) rather than OmniGen2.
    pub fn is_boogu(&self) -> bool {
        self.variant == Variant::Boogu
    }
}

/// RoPE dims per axis for a head width: three equal thirds (the released 120 → (40, 40, 40), ComfyUI's
/// `axes_dim_rope`); `None` when a third would be odd or the width does not split.
pub use crate::rope::equal_thirds as axes_dims;

/// Whether `h` holds an OmniGen2 or a Boogu-Image DiT, and its config ([`Config::is_boogu`] tells which).
/// `Ok(None)`: another family. `Err(Unsupported)`: a file of either with tensors missing or of the wrong shape,
/// or with widths Kiln cannot run.
///
/// Boogu-Image is ComfyUI's marker tensor, or an OmniGen2-looking file with `double_stream_layers.*` (a Boogu
/// file short of that tensor, refused naming it).
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let own = OWN.iter().any(|name| h.has(name)) || h.count_blocks("ref_image_refiner.") > 0;
    let omnigen2 = h.has(MARKER) && own;
    let variant = if h.has(BOOGU_MARKER)
        || (omnigen2 && h.names().any(|name| name.starts_with("double_stream_layers.")))
    {
        Variant::Boogu
    } else if omnigen2 {
        Variant::OmniGen2
    } else {
        return Ok(None);
    };
    let config = derive(h, variant)?;
    keys::check(h, &config)?;
    Ok(Some(config))
}

/// The widths of an OmniGen2 or Boogu-Image file from its shapes (before [`keys::check`] checks every tensor
/// against them).
fn derive(h: &Header, variant: Variant) -> Result<Config> {
    let what = variant.what();
    let patch_size = 2;
    let x_emb = matrix(h, "x_embedder.weight", what)?;
    let (hidden, patch) = (x_emb[0], x_emb[1]);
    if hidden == 0 || patch == 0 || !patch.is_multiple_of(patch_size * patch_size) {
        return Err(h.unsupported(format!(
            "`{}` is {x_emb:?}, not a {patch_size}×{patch_size}-patch embedder",
            h.key("x_embedder.weight")
        )));
    }
    let main = variant.layers_group();
    let (head_dim, heads, kv_heads) = attention_widths(h, &format!("{main}.0.attn."), what)?;
    let axes_dims = axes_dims(head_dim).ok_or_else(|| {
        h.unsupported(format!(
            "head width {head_dim} does not split into 3 equal even RoPE axes (a multiple of 6; 120 as released)"
        ))
    })?;
    let t1 = matrix(h, "time_caption_embed.timestep_embedder.linear_1.weight", what)?;
    let (t_dim, t_freq_dim) = (t1[0], t1[1]);
    if t_freq_dim == 0 || !t_freq_dim.is_multiple_of(2) {
        return Err(h.unsupported(format!("an odd timestep sinusoid width {t_freq_dim}")));
    }
    let text_feat_dim = matrix(h, "time_caption_embed.caption_embedder.1.weight", what)?[1];
    let ffn_hidden = matrix(h, &format!("{main}.0.feed_forward.linear_1.weight"), what)?[0];
    let max_references = matrix(h, "image_index_embedding", what)?[0];
    let (layers, double_stream_layers, refiners) = block_counts(h, variant)?;
    Ok(Config {
        variant,
        hidden,
        heads,
        kv_heads,
        head_dim,
        layers,
        double_stream_layers,
        refiners,
        ffn_hidden,
        text_feat_dim,
        t_freq_dim,
        t_dim,
        axes_dims,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        patch_size,
        in_channels: patch / (patch_size * patch_size),
        timestep_scale: 1000.0,
        max_references,
    })
}

/// (head width, query heads, key/value heads) from the attention `a` (`layers.0.attn.`, with the dot).
fn attention_widths(h: &Header, a: &str, what: &str) -> Result<(usize, usize, usize)> {
    let norm_q = format!("{a}norm_q.weight");
    let head_dim = h.shape_of_rank(&norm_q, 1, what)?[0];
    let q_rows = matrix(h, &format!("{a}to_q.weight"), what)?[0];
    let kv_rows = matrix(h, &format!("{a}to_k.weight"), what)?[0];
    let whole = |rows: usize| head_dim > 0 && rows > 0 && rows.is_multiple_of(head_dim);
    if !whole(q_rows) || !whole(kv_rows) {
        return Err(h.unsupported(format!(
            "query ({q_rows} rows) and key ({kv_rows} rows) projections are not whole heads of the width of \
             `{}` ({head_dim})",
            h.key(&norm_q)
        )));
    }
    let (heads, kv_heads) = (q_rows / head_dim, kv_rows / head_dim);
    if !heads.is_multiple_of(kv_heads) {
        return Err(h.unsupported(format!(
            "{kv_heads} key/value heads do not divide the {heads} query heads"
        )));
    }
    Ok((head_dim, heads, kv_heads))
}

/// The joint blocks, the double-stream blocks (none for OmniGen2) and the blocks of each refiner (ComfyUI
/// builds the three refiners of one count).
fn block_counts(h: &Header, variant: Variant) -> Result<(usize, usize, usize)> {
    let what = variant.what();
    let count = |group: &str| {
        h.gapless_blocks(&format!("{group}."), &format!("{what} whose `{group}` blocks"))
    };
    let layers = count(variant.layers_group())?;
    let double = match variant {
        Variant::OmniGen2 => 0,
        Variant::Boogu => count(keys::DOUBLE_STREAM)?,
    };
    let [noise, refs, context] = keys::REFINERS.map(count);
    let (noise, refs, context) = (noise?, refs?, context?);
    if noise != refs || noise != context {
        return Err(h.unsupported(format!(
            "refiners of {noise} (noise), {refs} (reference image) and {context} (context) blocks; the three \
             refiners have one count"
        )));
    }
    Ok((layers, double, noise))
}

/// The shape of a rank-2 tensor that must exist.
fn matrix(h: &Header, name: &str, what: &str) -> Result<[usize; 2]> {
    let shape = h.shape_of_rank(name, 2, what)?;
    let shape = h.values_shape(name).unwrap_or(shape);
    match shape[..] {
        [rows, cols] => Ok([rows, cols]),
        _ => Err(h.unsupported(format!("`{}` is {shape:?}, not a matrix", h.key(name)))),
    }
}
