//! Detection: whether a file's tensors (under the caller's prefix) are an OmniGen2 DiT in ComfyUI's key layout,
//! and its [`Config`], every width derived from tensor shapes.
//!
//! ComfyUI recognises the family by `time_caption_embed.timestep_embedder.linear_1.bias` and hard-codes the
//! released model (hidden 2520, 21 heads of 120 over 7 key/value heads, 32 layers, 2 refiners of each kind, RoPE
//! axes (40, 40, 40), text features 2048, time scale 1000). Kiln reads the shapes instead: the q-norm's width is
//! the head width, `to_q`'s and `to_k`'s rows count the query and key/value heads, and the RoPE axes are the
//! head's three equal thirds (the released 120 → 40 each), so a shrunken model with the same structure loads
//! too. A file of the family with a tensor missing or misshapen is [`crate::Error::Unsupported`] naming it.

use crate::error::Result;
use crate::header::Header;

use super::keys;

/// The tensor ComfyUI's detection keys the family on (Lumina 2's diffusers layout has it too).
const MARKER: &str = "time_caption_embed.timestep_embedder.linear_1.bias";
/// Tensors only OmniGen2 has beside [`MARKER`]: the reference images' embedder and index embedding.
const OWN: [&str; 2] = ["ref_image_patch_embedder.weight", "image_index_embedding"];
/// What detection's messages call the model.
const WHAT: &str = "an OmniGen2 model";

/// An OmniGen2 DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden width D (rows of `x_embedder.weight`; 2520).
    pub hidden: usize,
    /// Attention heads (rows of `to_q` / head width; 21).
    pub heads: usize,
    /// Key/value heads (rows of `to_k` / head width; 7: grouped-query attention).
    pub kv_heads: usize,
    /// Head width (width of the q-norm weight; 120).
    pub head_dim: usize,
    /// Joint blocks over caption, references and image (32).
    pub layers: usize,
    /// Blocks of each refiner: the noise (image) refiner, the reference-image refiner, the context refiner (2).
    pub refiners: usize,
    /// SwiGLU hidden width (rows of `feed_forward.linear_1.weight`; 4·D rounded up to a multiple of 256).
    pub ffn_hidden: usize,
    /// Caption feature width (the text encoder's hidden size; 2048).
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
}

/// RoPE dims per axis for a head width: three equal thirds (the released 120 → (40, 40, 40), ComfyUI's
/// `axes_dim_rope`); `None` when a third would be odd or the width does not split.
pub fn axes_dims(head_dim: usize) -> Option<[usize; 3]> {
    (head_dim > 0 && head_dim.is_multiple_of(6)).then_some([head_dim / 3; 3])
}

/// Whether `h` holds an OmniGen2 DiT, and its config. `Ok(None)`: another family. `Err(Unsupported)`: an
/// OmniGen2-family file Kiln cannot run (Boogu-Image), or one with tensors missing or of the wrong shape.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let own = OWN.iter().any(|name| h.has(name)) || h.count_blocks("ref_image_refiner.") > 0;
    if !h.has(MARKER) || !own {
        return Ok(None);
    }
    if h.names().any(|name| name.starts_with("double_stream_layers.")) {
        return Err(h.unsupported(
            "a Boogu-Image model (an OmniGen2 derivative with `double_stream_layers`), which Kiln does not run",
        ));
    }
    let config = derive(h)?;
    keys::check(h, &config)?;
    Ok(Some(config))
}

/// The widths of an OmniGen2 file from its shapes (before [`keys::check`] checks every tensor against them).
fn derive(h: &Header) -> Result<Config> {
    let patch_size = 2;
    let x_emb = matrix(h, "x_embedder.weight")?;
    let (hidden, patch) = (x_emb[0], x_emb[1]);
    if hidden == 0 || patch == 0 || !patch.is_multiple_of(patch_size * patch_size) {
        return Err(h.unsupported(format!(
            "`{}` is {x_emb:?}, not a {patch_size}×{patch_size}-patch embedder",
            h.key("x_embedder.weight")
        )));
    }
    let (head_dim, heads, kv_heads) = attention_widths(h)?;
    let axes_dims = axes_dims(head_dim).ok_or_else(|| {
        h.unsupported(format!(
            "head width {head_dim} does not split into 3 equal even RoPE axes (a multiple of 6; 120 as released)"
        ))
    })?;
    let t1 = matrix(h, "time_caption_embed.timestep_embedder.linear_1.weight")?;
    let (t_dim, t_freq_dim) = (t1[0], t1[1]);
    if t_freq_dim == 0 || !t_freq_dim.is_multiple_of(2) {
        return Err(h.unsupported(format!("an odd timestep sinusoid width {t_freq_dim}")));
    }
    let text_feat_dim = matrix(h, "time_caption_embed.caption_embedder.1.weight")?[1];
    let ffn_hidden = matrix(h, "layers.0.feed_forward.linear_1.weight")?[0];
    let max_references = matrix(h, "image_index_embedding")?[0];
    let (layers, refiners) = block_counts(h)?;
    Ok(Config {
        hidden,
        heads,
        kv_heads,
        head_dim,
        layers,
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

/// (head width, query heads, key/value heads) from the first joint block's attention.
fn attention_widths(h: &Header) -> Result<(usize, usize, usize)> {
    let a = "layers.0.attn.";
    let norm_q = format!("{a}norm_q.weight");
    let head_dim = h.shape_of_rank(&norm_q, 1, WHAT)?[0];
    let q_rows = matrix(h, &format!("{a}to_q.weight"))?[0];
    let kv_rows = matrix(h, &format!("{a}to_k.weight"))?[0];
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

/// The joint blocks and the blocks of each refiner (ComfyUI builds the three refiners of one count).
fn block_counts(h: &Header) -> Result<(usize, usize)> {
    let [layers, noise, refs, context] = keys::GROUPS.map(|group| {
        h.gapless_blocks(&format!("{group}."), &format!("an OmniGen2 model whose `{group}` blocks"))
    });
    let (layers, noise, refs, context) = (layers?, noise?, refs?, context?);
    if noise != refs || noise != context {
        return Err(h.unsupported(format!(
            "refiners of {noise} (noise), {refs} (reference image) and {context} (context) blocks; OmniGen2's \
             three refiners have one count"
        )));
    }
    Ok((layers, noise))
}

/// The shape of a rank-2 tensor that must exist.
fn matrix(h: &Header, name: &str) -> Result<[usize; 2]> {
    let shape = h.shape_of_rank(name, 2, WHAT)?;
    let shape = h.values_shape(name).unwrap_or(shape);
    match shape[..] {
        [rows, cols] => Ok([rows, cols]),
        _ => Err(h.unsupported(format!("`{}` is {shape:?}, not a matrix", h.key(name)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_thirds_of_the_head() {
        assert_eq!(axes_dims(120), Some([40, 40, 40]));
        assert_eq!(axes_dims(24), Some([8, 8, 8]));
        assert_eq!(axes_dims(16), None);
        assert_eq!(axes_dims(0), None);
    }
}
