//! [`ClipVision`]: a CLIP or SigLIP vision tower run over a batch of preprocessed images, giving ComfyUI's
//! `CLIP_VISION_OUTPUT` (`last_hidden_state`, `penultimate_hidden_states`, `image_embeds`;
//! `comfy/clip_model.py`'s `CLIPVision` and `CLIPVisionModelProjection`).
//!
//! Invariant: everything runs in f32 whatever the backend's compute type, as ComfyUI runs its vision towers
//! (f32 pixel values through manual-cast layers, which cast the weights to the input's type).

use kiln_compute::backend::{AttentionMask, BinaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Config, POST_NORM_BIAS, POST_NORM_WEIGHT, PROJECTION, Variant};
use super::preprocess;
use crate::clip_text::{LayerShape, encoder_layer};
use crate::error::{Error, Result};

/// A vision tower: its config and its weights under the memory manager (loaded from [`super::load_plan`]).
#[derive(Debug)]
pub struct ClipVision {
    /// The hyperparameters.
    pub config: Config,
    /// The weights, by the file's names without prefix.
    pub weights: Model,
}

/// What [`ClipVision::encode`] gives, all f32 (ComfyUI's `CLIP_VISION_OUTPUT`).
#[derive(Clone)]
pub struct VisionOutput<B: Backend> {
    /// `last_hidden_state` `[B, tokens, hidden]`: CLIP's last layer's output (not normed, class token first);
    /// SigLIP's through the final LayerNorm.
    pub last: Tensor<B>,
    /// `penultimate_hidden_states` `[B, tokens, hidden]`: the output of the layer before the last, not normed
    /// (`None` for a one-layer tower).
    pub penultimate: Option<Tensor<B>>,
    /// `image_embeds`: CLIP's class token through the final LayerNorm and the projection `[B, projection]`
    /// (`[B, hidden]` without one); SigLIP's is `last` itself `[B, tokens, hidden]`.
    pub embeds: Tensor<B>,
    /// `all_hidden_states`: every layer's output `[B, tokens, hidden]`, not normed, in order — SigLIP's only,
    /// as ComfyUI keeps them for SigLIP alone (USO reads layers −20 and −11); empty for CLIP.
    pub all: Vec<Tensor<B>>,
}

impl<B: Backend> std::fmt::Debug for VisionOutput<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionOutput")
            .field("last", &self.last.shape())
            .field("penultimate", &self.penultimate.as_ref().map(Tensor::shape))
            .field("embeds", &self.embeds.shape())
            .field("all", &self.all.len())
            .finish()
    }
}

impl ClipVision {
    /// The tower made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> ClipVision {
        ClipVision { config, weights }
    }

    /// ComfyUI's `clip_preprocess` of `image` `[B, H, W, C]` in 0..=1 for this tower (its size, mean and
    /// deviation; `crop` is `CLIPVisionEncode`'s "center"): pixel values `[B, 3, size, size]`.
    pub fn preprocess(&self, image: &[f32], shape: [usize; 4], crop: bool) -> Result<Vec<f32>> {
        let (mean, std) = self.config.variant.normalisation();
        preprocess::preprocess(image, shape, self.config.image_size, mean, std, crop)
    }

    /// Runs `batch` images' pixel values `[B, 3, size, size]` ([`ClipVision::preprocess`]) through the tower.
    pub fn encode<B: Backend>(
        &self,
        b: &B,
        pixels: &[f32],
        batch: usize,
    ) -> Result<VisionOutput<B>> {
        let cfg = &self.config;
        let size = cfg.image_size;
        if batch == 0 || pixels.len() != batch * 3 * size * size {
            return Err(Error::Invalid(format!(
                "the {} tower takes pixel values [B, 3, {size}, {size}], not {} values for {batch} images",
                cfg.variant.name(),
                pixels.len()
            )));
        }
        let mut x = self.embed(b, pixels, batch)?;
        let shape = LayerShape {
            hidden: cfg.hidden,
            heads: cfg.heads,
            head_dim: cfg.head_dim(),
            activation: cfg.variant.activation(),
            eps: cfg.eps,
        };
        let mut penultimate = None;
        let mut all = Vec::new();
        for i in 0..cfg.layers {
            let names = cfg.layer_names(i);
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let w = self.weights.fetch(b, &names)?;
            let weights: Vec<Weight<'_>> = (0..names.len()).map(|j| w.weight(j)).collect();
            x = encoder_layer(b, &weights, &x, &shape, AttentionMask::None)?;
            if i + 2 == cfg.layers {
                penultimate = Some(x.clone());
            }
            if cfg.variant == Variant::Siglip {
                all.push(b.cast(&x, DType::F32)?);
            }
        }
        let norm = self.weights.fetch(b, &[POST_NORM_WEIGHT, POST_NORM_BIAS])?;
        let post_norm = |t: &Tensor<B>| -> Result<Tensor<B>> {
            Ok(b.layer_norm(t, Some(&norm.weight(0)), Some(&norm.weight(1)), cfg.eps)?)
        };
        match cfg.variant {
            Variant::Siglip => {
                let last = post_norm(&x)?;
                Ok(VisionOutput { embeds: last.clone(), last, penultimate, all })
            }
            Variant::L | Variant::H | Variant::G => {
                let class = b.slice(&x, 1, 0, 1)?.reshape(&[batch, cfg.hidden])?;
                let pooled = post_norm(&class)?;
                let embeds = match cfg.projection {
                    Some(_) => {
                        let w = self.weights.fetch(b, &[PROJECTION])?;
                        b.linear(&pooled, &w.weight(0), None)?
                    }
                    None => pooled,
                };
                Ok(VisionOutput { last: x, penultimate, embeds, all })
            }
        }
    }

    /// The tokens before the encoder `[B, tokens, hidden]`: the patches through the patch embedding (one
    /// matrix product with the convolution's weight), CLIP's class token first, the positions added, and
    /// CLIP's LayerNorm before the encoder.
    fn embed<B: Backend>(&self, b: &B, pixels: &[f32], batch: usize) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (d, p) = (cfg.hidden, cfg.patch);
        let n = cfg.grid() * cfg.grid();
        let patches = preprocess::patches(pixels, batch, cfg.image_size, p);
        let patches = b.from_f32(&[batch, n, 3 * p * p], &patches, DType::F32)?;
        let names = cfg.embedding_names();
        let w = self.weights.fetch(b, &names)?;
        if cfg.variant.has_class_token() {
            // class token, patch embedding, positions, pre-LayerNorm.
            let proj = w.weight(1).reshape(&[d, 3 * p * p])?;
            let tokens = b.linear(&patches, &proj, None)?;
            let class = b.weight_to_tensor(&w.weight(0), DType::F32)?.reshape(&[1, 1, d])?;
            let classes: Vec<&Tensor<B>> = (0..batch).map(|_| &class).collect();
            let x = b.concat(&[&b.concat(&classes, 0)?, &tokens], 1)?;
            let positions = b.weight_to_tensor(&w.weight(2), DType::F32)?;
            let x = b.binary(&x, &positions, BinaryOp::Add)?;
            Ok(b.layer_norm(&x, Some(&w.weight(3)), Some(&w.weight(4)), cfg.eps)?)
        } else {
            // patch embedding with its bias, positions.
            let proj = w.weight(0).reshape(&[d, 3 * p * p])?;
            let tokens = b.linear(&patches, &proj, Some(&w.weight(1)))?;
            let positions = b.weight_to_tensor(&w.weight(2), DType::F32)?;
            Ok(b.binary(&tokens, &positions, BinaryOp::Add)?)
        }
    }
}
