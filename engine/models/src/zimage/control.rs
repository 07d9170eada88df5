//! The Z-Image Fun ControlNet (`Z-Image-Turbo-Fun-Controlnet-Union`), a model patch (`ModelPatchLoader`,
//! applied by `QwenImageDiffsynthControlnet`; ComfyUI's `ZImage_Control` in `comfy/ldm/lumina/controlnet.py`
//! run by `ZImageControlPatch` in `comfy_extras/nodes_model_patch.py`).
//!
//! The control latent (16 channels in the model's latent space) is patchified as the latents are and embedded
//! by `control_all_x_embedder.2-1`, refined by two plain modulated blocks, then runs through the control layers:
//! the first adds `before_proj` of it to the main layers' input image tokens, each is a modulated NextDiT block
//! over the image positions, and each one's `after_proj` output · strength is added to the image tokens after
//! main layer k · round(30 / layers) (5 for the release's 6 layers). The later releases (2.1: control in the noise
//! refiner, inpainting channels) are refused by name.

use kiln_compute::backend::BinaryOp;
use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::named::linear;
use crate::rope::Rope;

use super::config::{Config, Layout, Variant, axes_dims};
use super::keys::{self, CONTROL_GROUPS};
use super::model::ZImage;

/// The main layers ComfyUI spreads the control layers over (its hard-coded 30).
const SPREAD_OVER: f64 = 30.0;
/// The first release's control layers and refiner blocks, and its control latent's channels.
const RELEASE_LAYERS: usize = 6;
const RELEASE_REFINERS: usize = 2;
const LATENT_CHANNELS: usize = 16;

/// A Fun ControlNet's layout and sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct FunControlConfig {
    /// The widths its blocks use (dim, heads, FFN, adaLN input, norms); the fields of a whole model it has no
    /// part for (caption, t-embedder, block counts) are 0.
    pub body: Config,
    /// How its attention weights are named (the release: diffusers' `to_q`/`to_k`/`to_v`).
    pub layout: Layout,
    /// Control layers (6).
    pub layers: usize,
    /// Plain noise-refiner blocks (2).
    pub refiners: usize,
}

impl FunControlConfig {
    /// The first release's layout (6 control layers, 2 refiner blocks, a 16-channel control latent) at these
    /// widths, its attention named as in `layout`. `head_dim` must divide `dim` in a multiple of 16.
    pub fn release(
        dim: usize,
        head_dim: usize,
        ffn_hidden: usize,
        adaln_dim: usize,
        layout: Layout,
    ) -> FunControlConfig {
        let body = Config {
            variant: Variant::ZImage,
            dim,
            heads: dim / head_dim.max(1),
            kv_heads: dim / head_dim.max(1),
            head_dim,
            layers: 0,
            noise_refiners: 0,
            context_refiners: 0,
            ffn_hidden,
            cap_feat_dim: 0,
            t_freq_dim: 0,
            t_hidden: 0,
            adaln_dim,
            axes_dims: axes_dims(head_dim).unwrap_or([0; 3]),
            rope_theta: 256.0,
            pad_multiple: 1,
            norm_eps: 1e-5,
            qk_norm_eps: f32::EPSILON,
            patch_size: 2,
            in_channels: LATENT_CHANNELS,
            time_scale: 1000.0,
            allow_fp16: false,
        };
        FunControlConfig { body, layout, layers: RELEASE_LAYERS, refiners: RELEASE_REFINERS }
    }

    /// What [`keys`] needs: (control layers, refiner blocks, embedder input width).
    fn sizes(&self) -> (usize, usize, usize) {
        (self.layers, self.refiners, 4 * self.body.in_channels)
    }

    /// The main layer after which control layer `k` adds its output: k · round(30 / layers) (ComfyUI's).
    pub fn main_layer(&self, k: usize) -> usize {
        k * (SPREAD_OVER / self.layers as f64).round_ties_even() as usize
    }
}

/// Recognises a Z-Image Fun ControlNet by `control_all_x_embedder.2-1.weight` (`Ok(None)` otherwise), as
/// ComfyUI's `ModelPatchLoader` does; the 2.1 releases are refused naming what they have.
pub fn detect_fun_control(h: &Header) -> Result<Option<FunControlConfig>> {
    if !h.has("control_all_x_embedder.2-1.weight") {
        return Ok(None);
    }
    if !h.has("control_layers.4.adaLN_modulation.0.weight")
        || h.has("control_layers.14.adaLN_modulation.0.weight")
    {
        return Err(h.unsupported(
            "a later Z-Image Fun ControlNet (2.0's 15 control layers, or 2.1's control in the noise refiner \
             and inpainting channels); Kiln runs the first release (6 control layers)",
        ));
    }
    let layout = if h.has("control_layers.0.attention.qkv.weight") {
        Layout::Comfy
    } else {
        Layout::Diffusers
    };
    let shape = |name: &str| -> Result<Vec<usize>> { Ok(h.require(name)?.shape.clone()) };
    let embedder = shape("control_all_x_embedder.2-1.weight")?;
    let &[dim, in_features] = embedder.as_slice() else {
        return Err(h.unsupported("`control_all_x_embedder.2-1.weight` is not a matrix"));
    };
    if in_features != 4 * LATENT_CHANNELS {
        return Err(h.unsupported(format!(
            "`control_all_x_embedder.2-1.weight` takes {in_features} features (inpainting channels); Kiln runs \
             the first release, whose control latent has 16 channels (64)"
        )));
    }
    let q_norm = match layout {
        Layout::Comfy => "control_layers.0.attention.q_norm.weight",
        Layout::Diffusers => "control_layers.0.attention.norm_q.weight",
    };
    let &[head_dim] = shape(q_norm)?.as_slice() else {
        return Err(h.unsupported(format!("`{q_norm}` is not a vector")));
    };
    if axes_dims(head_dim).is_none() || head_dim == 0 || !dim.is_multiple_of(head_dim) {
        return Err(h.unsupported(format!(
            "head width {head_dim} does not divide dim {dim} or is not a multiple of 16"
        )));
    }
    let &[ffn_hidden, _] = shape("control_layers.0.feed_forward.w1.weight")?.as_slice() else {
        return Err(h.unsupported("`control_layers.0.feed_forward.w1.weight` is not a matrix"));
    };
    let &[_, adaln_dim] = shape("control_layers.0.adaLN_modulation.0.weight")?.as_slice() else {
        return Err(h.unsupported("`control_layers.0.adaLN_modulation.0.weight` is not a matrix"));
    };
    let count = |group: &str| {
        (0..).take_while(|i| h.names().any(|n| n.starts_with(&format!("{group}.{i}.")))).count()
    };
    let (layers, refiners) = (count(CONTROL_GROUPS[0]), count(CONTROL_GROUPS[1]));
    if (layers, refiners) != (RELEASE_LAYERS, RELEASE_REFINERS) {
        return Err(h.unsupported(format!(
            "a Z-Image Fun ControlNet of {layers} control layers and {refiners} refiner blocks; the release \
             Kiln runs has 6 and 2"
        )));
    }
    let config = FunControlConfig::release(dim, head_dim, ffn_hidden, adaln_dim, layout);
    keys::check_control(h, &config.body, layout, config.sizes())?;
    Ok(Some(config))
}

/// The weights to load, under ComfyUI's names (the fused `qkv` from the release's three parts).
pub fn fun_control_load_plan(h: &Header, cfg: &FunControlConfig) -> LoadPlan {
    keys::control_load_plan(h, &cfg.body, cfg.layout, cfg.sizes())
}

/// Every weight of `cfg`'s file with its shape (the file's own names; for synth).
pub(crate) fn fun_control_expected(cfg: &FunControlConfig) -> Vec<(String, Vec<usize>)> {
    keys::control_expected(&cfg.body, cfg.layout, cfg.sizes())
        .into_iter()
        .flat_map(|(parts, shape)| parts.into_iter().map(move |p| (p, shape.clone())))
        .collect()
}

/// A loaded Z-Image Fun ControlNet.
pub struct ZImageFunControl {
    /// Its layout and sizes.
    pub config: FunControlConfig,
    /// Its blocks, run as a NextDiT's over its own weights.
    body: ZImage,
}

/// A Fun ControlNet applied to one model call: its hint and strength.
pub struct FunPatch<'a, B: Backend> {
    /// The network.
    pub net: &'a ZImageFunControl,
    /// The control latent `[1 or B, 16, h, w]` in the model's latent space, at the padded latents' size.
    pub hint: &'a Tensor<B>,
    /// The node's strength.
    pub strength: f32,
}

impl ZImageFunControl {
    /// The network from its config and loaded weights (see [`fun_control_load_plan`]).
    pub fn new(config: FunControlConfig, weights: Model) -> ZImageFunControl {
        let body = ZImage::new(config.body.clone(), weights);
        ZImageFunControl { config, body }
    }

    /// The weights.
    pub fn weights(&self) -> &Model {
        &self.body.weights
    }

    /// Its outputs for the main layers' input image tokens `x` `[B, n, D]` (the real ones, no pad tokens),
    /// their RoPE table `rope` and the adaLN input `c`: each `(main layer, output · strength)`, for the
    /// control layers whose main layer is below `main_layers`.
    pub(super) fn outputs<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        rope: &Rope<B>,
        c: &Tensor<B>,
        patch: &FunPatch<'_, B>,
        main_layers: usize,
    ) -> Result<Vec<(usize, Tensor<B>)>> {
        let cfg = &self.config;
        let (batch, n, dim) = (x.dim(0)?, x.dim(1)?, x.dim(2)?);
        let hint = patch.hint;
        let &[hb, channels, h, w] = hint.shape() else {
            return Err(Error::Invalid(format!(
                "a control latent {:?} is not [B, C, h, w]",
                hint.shape()
            )));
        };
        let p = cfg.body.patch_size;
        if dim != cfg.body.dim
            || channels != cfg.body.in_channels
            || !(hb == 1 || hb == batch)
            || h % p != 0
            || w % p != 0
            || (h / p) * (w / p) != n
        {
            return Err(Error::Invalid(format!(
                "a Z-Image Fun ControlNet of width {} on a control latent {:?}, for {n} image tokens of width \
                 {dim} in a batch of {batch}",
                cfg.body.dim,
                hint.shape()
            )));
        }
        let hint = b.cast(hint, b.compute_dtype())?;
        let hint = if hb == batch {
            hint
        } else {
            b.concat(&std::iter::repeat_n(&hint, batch).collect::<Vec<_>>(), 0)?
        };
        let (body, weights) = (&self.body, self.weights());
        let mut control = linear(b, weights, "control_all_x_embedder.2-1", &b.patchify(&hint, p)?)?;
        let [layers_group, refiner_group] = CONTROL_GROUPS;
        for i in 0..cfg.refiners {
            control = body.block(b, refiner_group, i, &control, rope, Some(c))?;
        }
        let mut outputs = Vec::new();
        for k in (0..cfg.layers).take_while(|&k| cfg.main_layer(k) < main_layers) {
            let prefix = format!("{layers_group}.{k}");
            if k == 0 {
                let projected = linear(b, weights, &format!("{prefix}.before_proj"), &control)?;
                control = b.binary(&projected, x, BinaryOp::Add)?;
            }
            control = body.block(b, layers_group, k, &control, rope, Some(c))?;
            let skip = linear(b, weights, &format!("{prefix}.after_proj"), &control)?;
            outputs.push((cfg.main_layer(k), b.affine(&skip, patch.strength, 0.0)?));
        }
        Ok(outputs)
    }
}
