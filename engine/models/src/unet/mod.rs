//! The SD-style UNet (ComfyUI's `openaimodel.UNetModel`) in the configurations Kiln runs: SDXL's base (and
//! Turbo's) and refiner UNets, and Lotus depth (`lotus-depth-d-v1-1.safetensors`, ComfyUI's `LotusD`), SD 2's
//! UNet that predicts a depth latent from an image latent in one step.
//!
//! - [`detect`] reads the structure and widths from the LDM keys (diffusers' names mapped onto them), tells the
//!   kinds apart by `label_emb` ([`UnetKind`]) and refuses the other SD UNets by name; [`load_plan`] names every
//!   weight; [`Config::build`] and [`tensors`] lay out a UNet from its widths (the synthetic files, and the
//!   released structure's weight count).
//! - [`Unet::forward`] is ComfyUI's `_forward`: sinusoidal timestep features (cos first) through `time_embed`,
//!   plus `label_emb` of the class vector; the input blocks keep every output as a skip; the middle block;
//!   the output blocks join each skip along the channels, the Upsample going to the next skip's size (so odd
//!   sides round-trip); GroupNorm, SiLU and a conv out.
//! - [`sdxl`]: SDXL's class vector (`encode_adm`): CLIP-G's pooled vector and the size embeddings.
//! - [`family`]: the kinds' facts as families (names, latent formats, checkpoint prefixes, synth names); their
//!   model sampling, ComfyUI's `ModelSamplingDiscrete` with `EPS` (SDXL) or `IMG_TO_IMG` (Lotus), is
//!   [`crate::family::DiffusionFamily::sampling`]'s.
//!
//! Invariant: weights are read only through `Model::fetch`, one layer at a time.

mod blocks;
mod config;
pub mod family;
pub mod sdxl;
pub mod unclip;

pub use sdxl::{AdmSize, UnetKind};

pub use config::{
    Config, HEAD_CHANNELS, InputBlock, LOTUS_ADM_CHANNELS, OutputBlock, Shape, detect, load_plan,
    tensors,
};

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::named::linear;

/// Lotus's class vector: sin and cos of its task switch [1, 0] (depth), `[sin 1, sin 0, cos 1, cos 0]`, as
/// ComfyUI's `Lotus.extra_conds` makes it with torch's f32 `sin` and `cos` (whose cos 1 is 0.54030234, an ulp
/// above the nearest f32).
pub fn lotus_task_embedding() -> [f32; 4] {
    [0.841_470_96, 0.0, 0.540_302_34, 1.0]
}

/// A loaded UNet: its shape and its weights (under LDM names, from [`load_plan`]).
pub struct Unet {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl Unet {
    /// The UNet of `config` with `weights` loaded from [`load_plan`].
    pub fn new(config: Config, weights: Model) -> Unet {
        Unet { config, weights }
    }

    /// The network's output (f32, `[B, out_channels, H, W]`) for latents `x` `[B, in_channels, H, W]`, one
    /// timestep per sample, cross-attention `context` `[B or 1, N, context_dim]` and, for a model with
    /// `label_emb`, the class vectors `y` `[B or 1, adm_in_channels]`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        y: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let m = &self.weights;
        let &[batch, channels, _, _] = x.shape() else {
            return Err(Error::Invalid(format!("UNet input {:?} is not [B, C, H, W]", x.shape())));
        };
        if channels != cfg.in_channels || timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "the UNet takes {} channels and a timestep per sample; got {:?} and {} timesteps",
                cfg.in_channels,
                x.shape(),
                timesteps.len()
            )));
        }
        let dt = b.compute_dtype();
        let context = per_sample(b, &b.cast(context, dt)?, batch, "context")?;
        if context.shape().len() != 3 || context.dim(2)? != cfg.context_dim {
            return Err(Error::Invalid(format!(
                "the UNet's cross-attention takes [B, N, {}] context; got {:?}",
                cfg.context_dim,
                context.shape()
            )));
        }

        let emb_silu = {
            let features =
                crate::timestep::sinusoid(timesteps.iter().copied(), cfg.model_channels / 2, 1.0);
            let t = b.from_f32(&[batch, cfg.model_channels], &features, dt)?;
            let e = linear(b, m, "time_embed.0", &t)?;
            let mut emb = linear(b, m, "time_embed.2", &b.unary(&e, UnaryOp::Silu)?)?;
            match (cfg.adm_in_channels, y) {
                (Some(width), Some(y)) => {
                    let y = per_sample(b, &b.cast(y, dt)?, batch, "class vector")?;
                    if y.shape() != [batch, width] {
                        return Err(Error::Invalid(format!(
                            "the UNet's label_emb takes [B, {width}]; got {:?}",
                            y.shape()
                        )));
                    }
                    let l = linear(b, m, "label_emb.0.0", &y)?;
                    let l = linear(b, m, "label_emb.0.2", &b.unary(&l, UnaryOp::Silu)?)?;
                    emb = b.binary(&emb, &l, BinaryOp::Add)?;
                }
                (Some(width), None) => {
                    return Err(Error::Invalid(format!(
                        "this UNet needs a {width}-wide class vector (label_emb) and got none"
                    )));
                }
                (None, _) => {}
            }
            b.unary(&emb, UnaryOp::Silu)?
        };

        let mut h = blocks::conv3(b, m, "input_blocks.0.0", &b.cast(x, dt)?)?;
        let mut skips = vec![h.clone()];
        for (i, block) in cfg.input_blocks.iter().enumerate() {
            let prefix = format!("input_blocks.{}", i + 1);
            h = match *block {
                InputBlock::Res { depth, .. } => {
                    let r = blocks::res_block(b, m, &format!("{prefix}.0"), &h, &emb_silu)?;
                    self.transformer(b, &format!("{prefix}.1"), r, &context, depth)?
                }
                InputBlock::Down { .. } => blocks::downsample(b, m, &format!("{prefix}.0.op"), &h)?,
            };
            skips.push(h.clone());
        }

        h = blocks::res_block(b, m, "middle_block.0", &h, &emb_silu)?;
        h = self.transformer(b, "middle_block.1", h, &context, cfg.middle_depth)?;
        h = blocks::res_block(b, m, "middle_block.2", &h, &emb_silu)?;

        for (j, block) in cfg.output_blocks.iter().enumerate() {
            let prefix = format!("output_blocks.{j}");
            let skip = skips.pop().ok_or_else(|| {
                Error::Invalid("the UNet has more output blocks than skips".to_owned())
            })?;
            let joined = b.concat(&[&h, &skip], 1)?;
            drop(skip);
            h = blocks::res_block(b, m, &format!("{prefix}.0"), &joined, &emb_silu)?;
            drop(joined);
            h = self.transformer(b, &format!("{prefix}.1"), h, &context, block.depth)?;
            if let Some(module) = block.upsample {
                let next = skips.last().ok_or_else(|| {
                    Error::Invalid("the UNet upsamples after its last skip".to_owned())
                })?;
                let size = [next.dim(2)?, next.dim(3)?];
                h = blocks::upsample(b, m, &format!("{prefix}.{module}.conv"), &h, size)?;
            }
        }
        let out = blocks::head(b, m, &h)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// The SpatialTransformer `prefix` with `depth` blocks on `x`, or `x` itself when `depth` is 0.
    fn transformer<B: Backend>(
        &self,
        b: &B,
        prefix: &str,
        x: Tensor<B>,
        context: &Tensor<B>,
        depth: usize,
    ) -> Result<Tensor<B>> {
        if depth == 0 {
            return Ok(x);
        }
        let heads = self.config.head_channels;
        blocks::spatial_transformer(b, &self.weights, prefix, &x, context, depth, heads)
    }
}

/// `t` `[1 or batch, ..]` as `[batch, ..]` (a single row repeated, as ComfyUI repeats a conditioning over the
/// batch).
fn per_sample<B: Backend>(b: &B, t: &Tensor<B>, batch: usize, what: &str) -> Result<Tensor<B>> {
    match t.shape().first() {
        Some(&n) if n == batch => Ok(t.clone()),
        Some(1) => {
            let rows = vec![t; batch];
            Ok(b.concat(&rows, 0)?)
        }
        _ => Err(Error::Invalid(format!(
            "the UNet's {what} {:?} has neither 1 nor {batch} rows",
            t.shape()
        ))),
    }
}
