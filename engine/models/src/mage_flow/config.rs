//! Detection of a Mage-Flow DiT (ComfyUI's names, with or without the checkpoint prefix the caller strips) and
//! its [`Config`], every width derived from tensor shapes, and the [`LoadPlan`].
//!
//! The file is Qwen-Image's layout at patch 1: the same block, embedding and final-layer weights, but
//! `img_in` and `proj_out` are 128 latent channels wide. ComfyUI recognises it by `txt_norm.weight` of width
//! 2560 with 128 rows of `proj_out.weight` and hard-codes the rest (24 heads of 128, RoPE axes (16, 56, 56));
//! Kiln tells it from Qwen-Image by `proj_out`'s 128 rows and `img_in`'s 128 columns (the rule that also holds
//! for shrunken files, see `qwen_image::is_mage_flow`), reads the head width from `attn.norm_q.weight`, and
//! scales the axes to it as for Qwen-Image: (hd/8, 7hd/16, 7hd/16), which is (16, 56, 56) at 128.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;
use crate::qwen_image::{self, MAGE_FLOW_CHANNELS};

/// Latent channels in and out (the FLUX.2 VAE's), one token a latent pixel.
pub const LATENT_CHANNELS: usize = MAGE_FLOW_CHANNELS;
/// Sinusoid width of the timestep embedding (128 frequencies, cos then sin).
pub const T_FREQ_DIM: usize = 256;

/// A Mage-Flow DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Inner width D (rows of `img_in.weight`; 3072).
    pub dim: usize,
    /// Attention heads (D / head width; 24).
    pub heads: usize,
    /// Head width (of `attn.norm_q.weight`; 128).
    pub head_dim: usize,
    /// Double-stream blocks (12).
    pub layers: usize,
    /// MLP hidden width (rows of `img_mlp.net.0.proj.weight`; 12288).
    pub mlp_hidden: usize,
    /// Text feature width (of `txt_norm.weight`: Qwen3-VL 4B's hidden size, 2560).
    pub text_dim: usize,
    /// RoPE dims per axis (frame, row, column) summing to the head width: (16, 56, 56) at 128, the same
    /// proportions (hd/8, 7hd/16, 7hd/16) at other widths.
    pub axes_dims: [usize; 3],
}

impl Config {
    /// The same network as a Qwen-Image layout (for the shared weight list and trunk).
    pub(super) fn layout(&self) -> qwen_image::Config {
        qwen_image::Config {
            dim: self.dim,
            heads: self.heads,
            head_dim: self.head_dim,
            layers: self.layers,
            mlp_hidden: self.mlp_hidden,
            text_dim: self.text_dim,
            axes_dims: self.axes_dims,
            additional_t_cond: false,
        }
    }

    /// Every weight with its shape: the globals, then each block's.
    pub(crate) fn expected(&self) -> Vec<(String, Vec<usize>)> {
        qwen_image::expected_of(&self.layout(), LATENT_CHANNELS)
    }
}

/// Recognises a Mage-Flow DiT: `Ok(None)` without `txt_norm.weight`, or unless `proj_out.weight` has 128 rows
/// and `img_in.weight` 128 columns (a Qwen-Image file has 64 of each, and [`qwen_image::detect`] takes it);
/// [`crate::Error::Unsupported`] for such a file with a weight missing or misshapen.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has("txt_norm.weight") || !qwen_image::is_mage_flow(h) {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let what = "a Mage-Flow DiT";
    let dim = h.shape_of_rank("img_in.weight", 2, what)?[0];
    let text_dim = h.shape_of_rank("txt_norm.weight", 1, what)?[0];
    let layers = h.count_blocks("transformer_blocks.");
    let layout = qwen_image::block_config(h, &qwen_image::block_prefix(0), dim, text_dim, layers)?;
    let cfg = Config {
        dim: layout.dim,
        heads: layout.heads,
        head_dim: layout.head_dim,
        layers: layout.layers,
        mlp_hidden: layout.mlp_hidden,
        text_dim: layout.text_dim,
        axes_dims: layout.axes_dims,
    };
    qwen_image::check_shapes(h, &cfg.expected(), &format!("{what} of width {dim}"))?;
    Ok(Some(cfg))
}

/// Every weight, under its name without the file's prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(cfg.expected().into_iter().map(|(name, _)| name))
}
