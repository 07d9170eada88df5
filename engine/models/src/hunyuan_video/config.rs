//! Detection: whether a file's tensors (under the caller's prefix) are a HunyuanVideo DiT in ComfyUI's key
//! layout, and its [`Config`], every width but the head's derived from tensor shapes.
//!
//! ComfyUI recognises the family by `txt_in.individual_token_refiner.blocks.0.norm1.weight`
//! (`model_detection.py`) and reads the hidden width and input channels from `img_in.proj.weight` (a Conv3d
//! `[D, C, pt, ph, pw]`), the output channels from `final_layer.linear.weight`, the text width from
//! `txt_in.input_embedder.weight`, the block counts, and which optional parts the file has: `vector_in`
//! (HunyuanVideo 1.0's CLIP-L pooled vector, 768 wide), `guidance_in` (1.0's distilled guidance), `time_r_in`
//! (a step-distilled "meanflow" model), `byt5_in` (1.5's glyph text), `vision_in` (1.5's SigLIP image states;
//! it also makes a meanflow model sum its two time embeddings) and `cond_type_embedding` (1.5). The heads are
//! 128 wide, the RoPE axes (16, 56, 56) with θ 256, the MLPs 4× the hidden width, as ComfyUI hard-codes them;
//! Kiln reads the byT5 mapper's widths from shapes too (ComfyUI hard-codes 1472 → 2048 → 2048 → D). A
//! HunyuanVideo file with a tensor missing or misshapen is [`crate::Error::Unsupported`] naming it.

use crate::error::Result;
use crate::header::Header;

use super::keys;

/// The tensor ComfyUI's detection keys the family on.
const MARKER: &str = "txt_in.individual_token_refiner.blocks.0.norm1.weight";
/// The patch embedding (a Conv3d for video, a Conv2d for HunyuanImage 2.1).
const IMG_IN: &str = "img_in.proj.weight";
/// What messages call the model.
pub(crate) const WHAT: &str = "a HunyuanVideo model";

/// The head width ComfyUI's detection assumes (`num_heads = hidden / 128`).
pub const HEAD_DIM: usize = 128;
/// The RoPE axes (frame, row, column) ComfyUI's detection gives a 3-D patch embedding.
pub const AXES_DIMS: [usize; 3] = [16, 56, 56];
/// The RoPE base θ ComfyUI's detection sets.
pub const ROPE_THETA: f64 = 256.0;

/// The byT5 mapper's widths (`byt5_in`, ComfyUI's `ByT5Mapper`: LayerNorm, fc1, GELU, fc2, GELU, fc3; 1.5's
/// 1472 → 2048 → 2048 → D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByT5Widths {
    /// The glyph encoder's feature width (columns of `fc1`; 1472).
    pub in_dim: usize,
    /// `fc1`'s output width (2048).
    pub hidden: usize,
    /// `fc2`'s output width, `fc3`'s input (2048).
    pub out: usize,
}

/// A HunyuanVideo DiT's hyperparameters (HunyuanVideo 1.5 720p's values in the field docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden width D (rows of `img_in.proj.weight`; 2048).
    pub hidden: usize,
    /// Attention heads (D / 128 in a detected file; 16).
    pub heads: usize,
    /// Double-stream blocks (`double_blocks.*`; 54).
    pub double_blocks: usize,
    /// Single-stream blocks (`single_blocks.*`; 0).
    pub single_blocks: usize,
    /// The token refiner's blocks (`txt_in.individual_token_refiner.blocks.*`; 2).
    pub refiner_blocks: usize,
    /// Latent channels in, the conditioning's included (columns of `img_in.proj.weight`; 65: 32 noise, 32
    /// image, 1 mask).
    pub in_channels: usize,
    /// Latent channels out (32).
    pub out_channels: usize,
    /// The spatial patch side p: patches are 1 frame × p × p (1; HunyuanVideo 1.0: 2).
    pub patch: usize,
    /// Text feature width (columns of `txt_in.input_embedder.weight`; 3584, Qwen2.5-VL 7B's).
    pub context_dim: usize,
    /// RoPE dims per axis (frame, row, column), summing to the head width ((16, 56, 56)).
    pub axes_dims: [usize; 3],
    /// RoPE base θ (256).
    pub rope_theta: f64,
    /// The pooled vector's width where the model has `vector_in` (HunyuanVideo 1.0: 768, CLIP-L's; 1.5: none).
    pub vec_dim: Option<usize>,
    /// Whether the model has `guidance_in`, a distilled guidance embedding (1.0; 1.5: no).
    pub guidance: bool,
    /// Whether the model has `time_r_in`: a step-distilled ("meanflow") model that also embeds the schedule's
    /// next σ (1.5 720p: no).
    pub meanflow: bool,
    /// The byT5 mapper's widths where the model has `byt5_in` (1.5: 1472 → 2048 → 2048).
    pub byt5: Option<ByT5Widths>,
    /// The vision states' width where the model has `vision_in` (1.5: 1152, SigLIP's).
    pub vision_dim: Option<usize>,
    /// Whether the model has `cond_type_embedding`, one row per kind of text-side token (1.5: yes).
    pub cond_type_embedding: bool,
}

impl Config {
    /// The head width: D / heads (128).
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// The MLPs' hidden width: 4·D (ComfyUI's `mlp_ratio` 4, the refiner's fixed 4×).
    pub fn mlp_hidden(&self) -> usize {
        4 * self.hidden
    }

    /// Features of one patch of the input: C·p².
    pub fn patch_features(&self) -> usize {
        self.in_channels * self.patch * self.patch
    }

    /// Whether a meanflow model adds its two time embeddings rather than averaging them (ComfyUI's
    /// `meanflow_sum`, set for the models with `vision_in`: 1.5's).
    pub fn meanflow_sum(&self) -> bool {
        self.vision_dim.is_some()
    }
}

/// Whether `h` holds a HunyuanVideo DiT, and its config. `Ok(None)`: another family (no ComfyUI marker, or
/// HunyuanImage 2.1's 2-D patch embedding under it). `Err(Unsupported)`: a HunyuanVideo file with tensors
/// missing or of the wrong shape, or with widths Kiln cannot run.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) || h.shape(IMG_IN).is_some_and(|s| s.len() == 4) {
        return Ok(None);
    }
    let config = derive(h)?;
    keys::check(h, &config)?;
    Ok(Some(config))
}

/// The widths of a HunyuanVideo file from its shapes (before [`keys::check`] checks every tensor against them).
fn derive(h: &Header) -> Result<Config> {
    let img_in = h.shape_of_rank(IMG_IN, 5, WHAT)?;
    let &[hidden, in_channels, pt, ph, pw] = img_in.as_slice() else {
        return Err(h.unsupported(format!("`{}` is {img_in:?}, not a Conv3d", h.key(IMG_IN))));
    };
    if pt != 1 || ph != pw || ph == 0 || in_channels == 0 {
        return Err(h.unsupported(format!(
            "`{}` is {img_in:?}: Kiln runs patches of 1 frame × p × p (ComfyUI's final layer is p × p)",
            h.key(IMG_IN)
        )));
    }
    if hidden == 0 || !hidden.is_multiple_of(HEAD_DIM) {
        return Err(h.unsupported(format!(
            "a hidden width of {hidden} (`{}`) is not whole {HEAD_DIM}-wide heads",
            h.key(IMG_IN)
        )));
    }
    let patch = ph;
    let final_rows = matrix(h, "final_layer.linear.weight")?[0];
    if !final_rows.is_multiple_of(patch * patch) {
        return Err(h.unsupported(format!(
            "`{}` has {final_rows} rows, not whole {patch}×{patch} patches",
            h.key("final_layer.linear.weight")
        )));
    }
    let has_any = |group: &str| h.names().any(|name| name.starts_with(group));
    let vec_dim = match has_any("vector_in.") {
        true => Some(matrix(h, "vector_in.in_layer.weight")?[1]),
        false => None,
    };
    let vision_dim = match h.has("vision_in.proj.0.weight") {
        true => Some(h.shape_of_rank("vision_in.proj.0.weight", 1, WHAT)?[0]),
        false => None,
    };
    let count = |group: &str| h.gapless_blocks(group, &format!("{WHAT} whose `{group}` blocks"));
    Ok(Config {
        hidden,
        heads: hidden / HEAD_DIM,
        double_blocks: count("double_blocks.")?,
        single_blocks: count("single_blocks.")?,
        refiner_blocks: count(keys::REFINER_BLOCKS)?,
        in_channels,
        out_channels: final_rows / (patch * patch),
        patch,
        context_dim: matrix(h, "txt_in.input_embedder.weight")?[1],
        axes_dims: AXES_DIMS,
        rope_theta: ROPE_THETA,
        vec_dim,
        guidance: has_any("guidance_in."),
        meanflow: has_any("time_r_in."),
        byt5: byt5_widths(h)?,
        vision_dim,
        cond_type_embedding: h.has("cond_type_embedding.weight"),
    })
}

/// The byT5 mapper's widths where the file has `byt5_in.fc1.weight` (ComfyUI's test for the mapper).
fn byt5_widths(h: &Header) -> Result<Option<ByT5Widths>> {
    if !h.has("byt5_in.fc1.weight") {
        return Ok(None);
    }
    let [hidden, in_dim] = matrix(h, "byt5_in.fc1.weight")?;
    let out = matrix(h, "byt5_in.fc2.weight")?[0];
    Ok(Some(ByT5Widths { in_dim, hidden, out }))
}

/// The shape of a rank-2 tensor that must exist.
fn matrix(h: &Header, name: &str) -> Result<[usize; 2]> {
    h.shape_of_rank(name, 2, WHAT)?;
    match h.values_shape(name).as_deref() {
        Some(&[rows, cols]) => Ok([rows, cols]),
        other => Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(name)))),
    }
}
