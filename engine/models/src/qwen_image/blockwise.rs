//! DiffSynth's block-wise ControlNet for Qwen-Image (`qwen_image_*_diffsynth_controlnet`), a model patch
//! (`ModelPatchLoader`, applied by `QwenImageDiffsynthControlnet`; ComfyUI's `QwenImageBlockWiseControlNet` and
//! `DiffSynthCnetPatch` in `comfy_extras/nodes_model_patch.py`).
//!
//! The control image's latent (its 16 channels in the model's latent space, then any mask channels) is
//! patchified like the latents and embedded by `img_in` once per call; after base block i, the latents' image
//! tokens x get `output_proj(GELU(input_proj(RMSNorm_x(x) + RMSNorm_y(c))))` · strength added, from the
//! network's block i.

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::memory::{LoadPlan, Model, SlotPlan};
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::named::linear;

use super::config::{EPS, LATENT_CHANNELS, PATCH, count_blocks};
use super::model::{padded, patchify};

/// A block-wise ControlNet's widths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockwiseConfig {
    /// The base model's inner width D.
    pub dim: usize,
    /// Input width of `img_in`: 64 (a latent's 2 × 2 patches), more with mask channels (68 for inpainting).
    pub in_features: usize,
    /// Blocks, one per base block (60 released).
    pub blocks: usize,
}

impl BlockwiseConfig {
    /// Channels of the hint it takes: the latent's 16 and the mask's.
    pub fn hint_channels(&self) -> usize {
        self.in_features / (PATCH * PATCH)
    }
}

/// Recognises a block-wise ControlNet by `controlnet_blocks.0.y_rms.weight` (`Ok(None)` otherwise), as
/// ComfyUI's `ModelPatchLoader` does.
pub fn detect_blockwise(h: &Header) -> Result<Option<BlockwiseConfig>> {
    if !h.has("controlnet_blocks.0.y_rms.weight") {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let &[dim, in_features] = h.require("img_in.weight")?.shape.as_slice() else {
        return Err(h.unsupported("`img_in.weight` is not a matrix"));
    };
    let patch = PATCH * PATCH;
    if in_features < LATENT_CHANNELS * patch || in_features % patch != 0 {
        return Err(h.unsupported(format!(
            "`img_in.weight` takes {in_features} features; a block-wise ControlNet takes 64 (a latent's \
             patches) and whole mask channels beyond them"
        )));
    }
    let blocks = count_blocks(h, "controlnet_blocks.");
    let config = BlockwiseConfig { dim, in_features, blocks };
    for (name, want) in expected_blockwise(&config) {
        let found = h.require(&name)?.shape.as_slice();
        if found != want.as_slice() {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for a block-wise ControlNet of width {dim}",
                h.key(&name)
            )));
        }
    }
    Ok(Some(config))
}

/// The names of block `i`'s weights, in the order [`QwenImageBlockwise`] reads them.
fn block_names(i: usize) -> [String; 6] {
    [
        "x_rms.weight",
        "y_rms.weight",
        "input_proj.weight",
        "input_proj.bias",
        "output_proj.weight",
        "output_proj.bias",
    ]
    .map(|t| format!("controlnet_blocks.{i}.{t}"))
}

/// Every weight with its shape.
pub(crate) fn expected_blockwise(cfg: &BlockwiseConfig) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let mut all = vec![
        ("img_in.weight".to_owned(), vec![d, cfg.in_features]),
        ("img_in.bias".to_owned(), vec![d]),
    ];
    for i in 0..cfg.blocks {
        let shapes = [vec![d], vec![d], vec![d, d], vec![d], vec![d, d], vec![d]];
        all.extend(block_names(i).into_iter().zip(shapes));
    }
    all
}

/// Every weight, under its name without the file's prefix.
pub fn blockwise_load_plan(h: &Header, cfg: &BlockwiseConfig) -> LoadPlan {
    let slots = expected_blockwise(cfg)
        .into_iter()
        .map(|(name, _)| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]))
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A loaded block-wise ControlNet.
pub struct QwenImageBlockwise {
    /// Its widths.
    pub config: BlockwiseConfig,
    /// The weights.
    pub weights: Model,
}

/// A block-wise ControlNet applied to one model call: the embedded control tokens and the strength.
pub struct BlockPatch<'a, B: Backend> {
    /// The network.
    pub net: &'a QwenImageBlockwise,
    /// [`QwenImageBlockwise::condition`] of the hint.
    pub condition: Tensor<B>,
    /// The node's strength.
    pub strength: f32,
}

impl QwenImageBlockwise {
    /// The control tokens `[Bh, tokens, D]` of `hint` `[Bh, C, h, w]` (the latent's 16 channels in the model's
    /// latent space, then the mask's; Bh 1 or the model call's `batch`), padded circularly to even sides,
    /// patchified like the latents and through `img_in`.
    pub fn condition<B: Backend>(
        &self,
        b: &B,
        hint: &Tensor<B>,
        batch: usize,
    ) -> Result<Tensor<B>> {
        let want = self.config.hint_channels();
        match hint.shape() {
            &[hb, c, _, _] if c == want && (hb == 1 || hb == batch) => {}
            other => {
                return Err(Error::Invalid(format!(
                    "a block-wise ControlNet takes a hint [1 or {batch}, {want}, h, w] for a batch of {batch}, \
                     got {other:?}"
                )));
            }
        }
        let hint = b.cast(hint, b.compute_dtype())?;
        let (hint, _, _) = padded(b, &hint)?;
        linear(b, &self.weights, "img_in", &patchify(b, &hint)?)
    }

    /// Block `i`'s output for the latents' image tokens `x` `[B, n, D]` and `condition` `[1 or B, n, D]`.
    pub fn block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        condition: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let names = block_names(i);
        let layer = self.weights.fetch(b, &names.each_ref().map(String::as_str))?;
        let w = |k: usize| layer.weight(k);
        let x = b.rms_norm(x, Some(&w(0)), EPS)?;
        let y = b.rms_norm(condition, Some(&w(1)), EPS)?;
        let hidden = b.linear(&b.binary(&x, &y, BinaryOp::Add)?, &w(2), Some(&w(3)))?;
        let hidden = b.unary(&hidden, UnaryOp::Gelu)?;
        Ok(b.linear(&hidden, &w(4), Some(&w(5)))?)
    }
}

/// `img` after base block `i` with each patch's block-`i` output · strength added to its first tokens (the
/// latents'), in order; a patch with fewer blocks adds nothing after them.
pub(super) fn apply_patches<B: Backend>(
    b: &B,
    img: Tensor<B>,
    patches: &[BlockPatch<'_, B>],
    i: usize,
) -> Result<Tensor<B>> {
    let mut img = img;
    for patch in patches.iter().filter(|p| i < p.net.config.blocks) {
        let (tokens, n) = (img.dim(1)?, patch.condition.dim(1)?);
        let head = if n == tokens { img.clone() } else { b.slice(&img, 1, 0, n)? };
        let out = patch.net.block(b, i, &head, &patch.condition)?;
        let head = b.binary(&head, &b.affine(&out, patch.strength, 0.0)?, BinaryOp::Add)?;
        img = if n == tokens {
            head
        } else {
            b.concat(&[&head, &b.slice(&img, 1, n, tokens - n)?], 1)?
        };
    }
    Ok(img)
}
