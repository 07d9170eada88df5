//! Qwen-Image's ControlNets, as ComfyUI's `ControlNetLoader` loads them (`comfy/ldm/qwen_image/controlnet.py`,
//! `comfy/controlnet.py`):
//!
//! - InstantX's (`Qwen-Image-InstantX-ControlNet-*`): a few MMDiT blocks of their own on the latents plus
//!   `controlnet_x_embedder` of the hint; each block's image tokens through `controlnet_blocks.{i}` are its
//!   outputs, spread over ComfyUI's fixed 60 base blocks (each repeated ⌈60 / N⌉ times). The inpainting one
//!   takes the mask as a 17th hint channel.
//! - VideoX-Fun's (`Qwen-Image-2512-Fun-Controlnet-Union`): five control blocks on the base model's own
//!   embeddings, the hint through `control_img_in` (its 33 channels' mask and inpaint parts zero), each block's
//!   `after_proj` output added after base blocks 0, 12, 24, 36 and 48; the strength enters as its square root.
//!
//! The hint is the control image VAE-encoded in the model's latent space at the latents' size (the engine
//! prepares it); [`QwenImageControlNet::residuals`] turns it into what the base model adds after its blocks.

use kiln_compute::backend::{BinaryOp, PadMode};
use kiln_compute::memory::{LoadPlan, Model, SlotPlan};
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::named::linear;

use super::config::{
    Config, LATENT_CHANNELS, PATCH, block_config, block_names, block_prefix, block_shapes,
    count_blocks, embedding_shapes, shape,
};
use super::model::{Embedded, QwenImage, Text, padded, patchify};

/// How many base blocks ComfyUI spreads a ControlNet's outputs over (its `main_model_double`).
pub const BASE_BLOCKS: usize = 60;
/// The base blocks after which a Fun ControlNet's outputs are added, in order.
pub const FUN_INJECTION_BLOCKS: [usize; 5] = [0, 12, 24, 36, 48];

/// Which ControlNet a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// InstantX's, whose hint has `hint_channels` channels (16, or 17 with the inpainting mask).
    InstantX {
        /// Latent channels of the hint (`controlnet_x_embedder` input / 4).
        hint_channels: usize,
    },
    /// VideoX-Fun's, whose `control_img_in` takes `in_features` (132: 33 channels in 2 × 2 patches).
    Fun {
        /// Input width of `control_img_in`.
        in_features: usize,
    },
}

/// A Qwen-Image ControlNet's kind and the widths of its blocks (`body.layers` of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Which one.
    pub kind: ControlKind,
    /// Its blocks' widths; InstantX's text and latent widths too.
    pub body: Config,
}

/// Recognises a Qwen-Image ControlNet (`Ok(None)` for any other file): InstantX's by `controlnet_blocks.0.weight`
/// beside MMDiT blocks, Fun's by `control_blocks.0.after_proj.weight` and `control_img_in.weight`, as ComfyUI's
/// `load_controlnet` tells them apart.
pub fn detect_control(h: &Header) -> Result<Option<ControlConfig>> {
    let instantx = h.has("controlnet_blocks.0.weight")
        && h.has("transformer_blocks.0.img_mlp.net.0.proj.weight")
        && h.has("controlnet_x_embedder.weight");
    let fun = h.has("control_blocks.0.after_proj.weight") && h.has("control_img_in.weight");
    if !instantx && !fun {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let config = if instantx { detect_instantx(h)? } else { detect_fun(h)? };
    for (name, want) in expected_control(&config) {
        let found = shape(h, &name)?;
        if found != want.as_slice() {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for this Qwen-Image ControlNet",
                h.key(&name)
            )));
        }
    }
    Ok(Some(config))
}

/// An InstantX ControlNet's config: its MMDiT widths, its block count and its hint channels.
fn detect_instantx(h: &Header) -> Result<ControlConfig> {
    let &[dim, _] = shape(h, "img_in.weight")? else {
        return Err(h.unsupported("`img_in.weight` is not a matrix"));
    };
    let &[text_dim] = shape(h, "txt_norm.weight")? else {
        return Err(h.unsupported("`txt_norm.weight` is not a vector"));
    };
    let &[_, features] = shape(h, "controlnet_x_embedder.weight")? else {
        return Err(h.unsupported("`controlnet_x_embedder.weight` is not a matrix"));
    };
    // ComfyUI takes 64 features (the latent's patches) or 68 (the inpainting one's, with the mask).
    let patch = PATCH * PATCH;
    if features != LATENT_CHANNELS * patch && features != (LATENT_CHANNELS + 1) * patch {
        return Err(h.unsupported(format!(
            "`controlnet_x_embedder.weight` takes {features} features; an InstantX ControlNet takes 64, or 68 \
             for inpainting"
        )));
    }
    let layers = count_blocks(h, "transformer_blocks.");
    let body = block_config(h, &block_prefix(0), dim, text_dim, layers)?;
    Ok(ControlConfig { kind: ControlKind::InstantX { hint_channels: features / patch }, body })
}

/// A Fun ControlNet's config: its blocks' widths (on the base model's text width) and `control_img_in`'s input.
fn detect_fun(h: &Header) -> Result<ControlConfig> {
    let &[dim, in_features] = shape(h, "control_img_in.weight")? else {
        return Err(h.unsupported("`control_img_in.weight` is not a matrix"));
    };
    let blocks = count_blocks(h, "control_blocks.");
    if blocks != FUN_INJECTION_BLOCKS.len() {
        return Err(h.unsupported(format!(
            "a Fun ControlNet has {} control blocks, this file {blocks}",
            FUN_INJECTION_BLOCKS.len()
        )));
    }
    let body = block_config(h, &fun_block_prefix(0), dim, dim, blocks)?;
    Ok(ControlConfig { kind: ControlKind::Fun { in_features }, body })
}

/// Where a Fun ControlNet's control block `k` is.
fn fun_block_prefix(k: usize) -> String {
    format!("control_blocks.{k}")
}

/// Every weight of a ControlNet with its shape.
pub(crate) fn expected_control(cfg: &ControlConfig) -> Vec<(String, Vec<usize>)> {
    let d = cfg.body.dim;
    let linear = |name: String, out: usize, inp: usize| {
        [(format!("{name}.weight"), vec![out, inp]), (format!("{name}.bias"), vec![out])]
    };
    let mut all = Vec::new();
    match cfg.kind {
        ControlKind::InstantX { hint_channels } => {
            all.extend(embedding_shapes(&cfg.body).into_iter().map(|(n, s)| (n.to_owned(), s)));
            for i in 0..cfg.body.layers {
                all.extend(block_names(&block_prefix(i)).into_iter().zip(block_shapes(&cfg.body)));
            }
            for i in 0..cfg.body.layers {
                all.extend(linear(format!("controlnet_blocks.{i}"), d, d));
            }
            all.extend(linear(
                "controlnet_x_embedder".to_owned(),
                d,
                hint_channels * PATCH * PATCH,
            ));
        }
        ControlKind::Fun { in_features } => {
            all.extend(linear("control_img_in".to_owned(), d, in_features));
            for k in 0..cfg.body.layers {
                let prefix = fun_block_prefix(k);
                all.extend(block_names(&prefix).into_iter().zip(block_shapes(&cfg.body)));
                if k == 0 {
                    all.extend(linear(format!("{prefix}.before_proj"), d, d));
                }
                all.extend(linear(format!("{prefix}.after_proj"), d, d));
            }
        }
    }
    all
}

/// Every weight, under its name without the file's prefix.
pub fn control_load_plan(h: &Header, cfg: &ControlConfig) -> LoadPlan {
    let slots = expected_control(cfg)
        .into_iter()
        .map(|(name, _)| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]))
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A ControlNet's outputs for one model call: `outputs[k]` `[B, image tokens, D]` is added to the latents'
/// tokens after each base block `i` with `at_block[i] == Some(k)` (ComfyUI's `control["input"]`).
pub struct ControlResiduals<B: Backend> {
    /// The outputs, the strength applied.
    pub outputs: Vec<Tensor<B>>,
    /// For base block `i`, the output added after it, if any.
    pub at_block: Vec<Option<usize>>,
}

/// A loaded Qwen-Image ControlNet.
pub struct QwenImageControlNet {
    /// Its kind and widths.
    pub config: ControlConfig,
    /// Its blocks (and InstantX's embeddings) run as an MMDiT over its own weights.
    body: QwenImage,
}

impl QwenImageControlNet {
    /// The network from its config and loaded weights (see [`control_load_plan`]).
    pub fn new(config: ControlConfig, weights: Model) -> QwenImageControlNet {
        let body = QwenImage::new(config.body.clone(), weights);
        QwenImageControlNet { config, body }
    }

    /// The weights.
    pub fn weights(&self) -> &Model {
        &self.body.weights
    }

    /// Whether its hint carries the inpainting mask as a 17th channel (ComfyUI's `concat_mask`).
    pub fn concat_mask(&self) -> bool {
        matches!(self.config.kind, ControlKind::InstantX { hint_channels } if hint_channels > LATENT_CHANNELS)
    }

    /// The factor its outputs are scaled by at a node's `strength`: the strength itself, or for a Fun
    /// ControlNet its square root (ComfyUI's `QwenFunControlNet`: gentler above 1, nothing below 0).
    pub fn output_scale(&self, strength: f32) -> f32 {
        match self.config.kind {
            ControlKind::InstantX { .. } => strength,
            ControlKind::Fun { .. } => strength.max(0.0).sqrt(),
        }
    }

    /// The outputs for latents `x` `[B, 16, h, w]` (or one frame of `[B, 16, 1, h, w]`) at `sigmas` with
    /// `text`, as `base` (the model it controls) takes them, for `hint` `[1 or B, C, h, w]` (C: 16, or 17
    /// with the mask), scaled by [`QwenImageControlNet::output_scale`] of `strength`.
    #[allow(clippy::too_many_arguments)]
    pub fn residuals<B: Backend>(
        &self,
        b: &B,
        base: &QwenImage,
        x: &Tensor<B>,
        sigmas: &[f32],
        text: Text<'_, B>,
        hint: &Tensor<B>,
        strength: f32,
    ) -> Result<ControlResiduals<B>> {
        let x = match *x.shape() {
            [batch, c, 1, h, w] => x.reshape(&[batch, c, h, w])?,
            [_, _, _, _] => x.clone(),
            ref other => {
                return Err(Error::Invalid(format!(
                    "a ControlNet takes latents of one frame, got {other:?}"
                )));
            }
        };
        let hint = self.check_hint(b, &x, hint)?;
        let scale = self.output_scale(strength);
        let outputs = match self.config.kind {
            ControlKind::InstantX { .. } => self.instantx(b, &x, sigmas, text, &hint)?,
            ControlKind::Fun { in_features } => {
                self.fun(b, base, &x, sigmas, text, &hint, in_features)?
            }
        };
        let outputs = outputs
            .iter()
            .map(|o| b.affine(o, scale, 0.0))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let at_block = match self.config.kind {
            ControlKind::InstantX { .. } => {
                let repeat = BASE_BLOCKS.div_ceil(outputs.len());
                (0..BASE_BLOCKS).map(|i| Some(i / repeat).filter(|&k| k < outputs.len())).collect()
            }
            ControlKind::Fun { .. } => {
                let mut at = vec![None; BASE_BLOCKS];
                for (k, &i) in FUN_INJECTION_BLOCKS.iter().enumerate() {
                    at[i] = Some(k);
                }
                at
            }
        };
        Ok(ControlResiduals { outputs, at_block })
    }

    /// The hint in the compute type, repeated to the batch; checked against the latents.
    fn check_hint<B: Backend>(&self, b: &B, x: &Tensor<B>, hint: &Tensor<B>) -> Result<Tensor<B>> {
        let want = match self.config.kind {
            ControlKind::InstantX { hint_channels } => hint_channels,
            ControlKind::Fun { .. } => LATENT_CHANNELS,
        };
        let (batch, h, w) = (x.dim(0)?, x.dim(2)?, x.dim(3)?);
        let &[hb, c, hh, hw] = hint.shape() else {
            return Err(Error::Invalid(format!(
                "a ControlNet hint {:?} is not [B, C, h, w]",
                hint.shape()
            )));
        };
        if c != want || (hh, hw) != (h, w) || !(hb == 1 || hb == batch) {
            return Err(Error::Invalid(format!(
                "a ControlNet hint {:?} for latents {:?}: it takes {want} channels at the latents' size, one \
                 sample or one per latent",
                hint.shape(),
                x.shape()
            )));
        }
        let hint = b.cast(hint, b.compute_dtype())?;
        if hb == batch {
            return Ok(hint);
        }
        let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&hint, batch).collect();
        Ok(b.concat(&copies, 0)?)
    }

    /// InstantX: its own embeddings, the hint's added to the image tokens, then each block's image tokens
    /// through `controlnet_blocks.{i}`.
    fn instantx<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        text: Text<'_, B>,
        hint: &Tensor<B>,
    ) -> Result<Vec<Tensor<B>>> {
        let (body, weights) = (&self.body, self.weights());
        let Embedded { mut img, mut txt, seq, timestep, .. } =
            body.embed(b, x, sigmas, text, &[], None)?;
        {
            let (hint, _, _) = padded(b, hint)?;
            let embedded = linear(b, weights, "controlnet_x_embedder", &patchify(b, &hint)?)?;
            img = b.binary(&img, &embedded, BinaryOp::Add)?;
        }
        let mut outputs = Vec::with_capacity(self.config.body.layers);
        for i in 0..self.config.body.layers {
            (img, txt) = body.block(b, &block_prefix(i), &img, &txt, &timestep, &seq)?;
            outputs.push(linear(b, weights, &format!("controlnet_blocks.{i}"), &img)?);
        }
        Ok(outputs)
    }

    /// Fun: the base model's embeddings; the hint's tokens (zero-padded to even sides, features zero-padded
    /// or cut to `in_features`) through `control_img_in`, `before_proj` of them added to the image tokens
    /// into the first control block, each block's output into the next, and each block's `after_proj`
    /// output kept.
    #[allow(clippy::too_many_arguments)]
    fn fun<B: Backend>(
        &self,
        b: &B,
        base: &QwenImage,
        x: &Tensor<B>,
        sigmas: &[f32],
        text: Text<'_, B>,
        hint: &Tensor<B>,
        in_features: usize,
    ) -> Result<Vec<Tensor<B>>> {
        let Embedded { img, mut txt, seq, timestep, .. } =
            base.embed(b, x, sigmas, text, &[], None)?;
        let (body, weights) = (&self.body, self.weights());
        let mut c = {
            let mut hint = hint.clone();
            for dim in [2, 3] {
                if hint.dim(dim)? % PATCH != 0 {
                    hint = b.pad(&hint, dim, 0, 1, PadMode::Constant(0.0))?;
                }
            }
            let tokens = patchify(b, &hint)?;
            let features = tokens.dim(2)?;
            let tokens = if features < in_features {
                b.pad(&tokens, 2, 0, in_features - features, PadMode::Constant(0.0))?
            } else {
                b.slice(&tokens, 2, 0, in_features)?
            };
            linear(b, weights, "control_img_in", &tokens)?
        };
        let mut outputs = Vec::with_capacity(self.config.body.layers);
        for k in 0..self.config.body.layers {
            let prefix = fun_block_prefix(k);
            if k == 0 {
                let projected = linear(b, weights, &format!("{prefix}.before_proj"), &c)?;
                c = b.binary(&projected, &img, BinaryOp::Add)?;
            }
            (c, txt) = body.block(b, &prefix, &c, &txt, &timestep, &seq)?;
            outputs.push(linear(b, weights, &format!("{prefix}.after_proj"), &c)?);
        }
        Ok(outputs)
    }
}

/// `img` with the ControlNet outputs for base block `i` added to its first tokens (the latents'; reference
/// tokens follow them), summed in the order the ControlNets were applied, as ComfyUI merges a chain.
pub(super) fn add_controls<B: Backend>(
    b: &B,
    img: &Tensor<B>,
    controls: &[ControlResiduals<B>],
    i: usize,
) -> Result<Tensor<B>> {
    let mut sum: Option<Tensor<B>> = None;
    for control in controls {
        if let Some(Some(k)) = control.at_block.get(i) {
            let output = &control.outputs[*k];
            sum = Some(match sum {
                None => output.clone(),
                Some(s) => b.binary(&s, output, BinaryOp::Add)?,
            });
        }
    }
    let Some(sum) = sum else {
        return Ok(img.clone());
    };
    let (tokens, n) = (img.dim(1)?, sum.dim(1)?);
    if n == tokens {
        return Ok(b.binary(img, &sum, BinaryOp::Add)?);
    }
    let head = b.binary(&b.slice(img, 1, 0, n)?, &sum, BinaryOp::Add)?;
    let tail = b.slice(img, 1, n, tokens - n)?;
    Ok(b.concat(&[&head, &tail], 1)?)
}
