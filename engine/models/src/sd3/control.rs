//! SD3.5 Large's ControlNets (`sd3.5_large_controlnet_{blur,canny,depth}.safetensors`; ComfyUI's
//! `load_controlnet_sd35` and `comfy/cldm/dit_embedder.py` `ControlNetEmbedder`): the main model's patch
//! embedding of the latent plus a computed 2-D sine-cosine position table plus the hint's own patch embedding, then
//! plain self-attention blocks modulated by the control's timestep and pooled-vector embeddings; after each, a
//! Linear gives what the main model adds to its image tokens, each output repeated over consecutive main blocks.

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::memory::{LoadPlan, Model, SlotPlan};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{HEAD_DIM, PATCH, T_FREQ_DIM};
use super::model::{Sd3, Sd3Input, Stream, mlp, patch_embed};
use crate::error::{Error, Result};
use crate::header::Header;
use crate::latent_tokens::to_batch;
use crate::named::linear;

/// What the control image is before the VAE encodes it (the file's `control_type`, ComfyUI's `preprocess_image`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlType {
    /// 0: the image as it is.
    Blur,
    /// 1: `a·255·0.5 + 0.5`.
    Canny,
    /// 2: `1 − a`.
    Depth,
    /// Any other value (or none): the image as it is.
    Other,
}

impl ControlType {
    /// A pixel value in [0, 1] as the VAE is given it.
    pub fn preprocess(self, a: f32) -> f32 {
        match self {
            ControlType::Canny => a * 255.0 * 0.5 + 0.5,
            ControlType::Depth => 1.0 - a,
            ControlType::Blur | ControlType::Other => a,
        }
    }
}

/// An SD3.5 ControlNet's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlConfig {
    /// Hidden width (the main model's: 64 per head).
    pub dim: usize,
    /// Heads of 64.
    pub heads: usize,
    /// Self-attention blocks.
    pub blocks: usize,
    /// The pooled vector's width.
    pub adm_width: usize,
    /// Latent channels of the hint (16).
    pub hint_channels: usize,
    /// How the control image is prepared.
    pub control_type: ControlType,
}

/// The names Kiln fetches (ComfyUI's after `MMDIT_MAP_BASIC`) and the file's alternative (diffusers') names.
const RENAMES: [(&str, &str); 8] = [
    ("t_embedder.mlp.0.weight", "time_text_embed.timestep_embedder.linear_1.weight"),
    ("t_embedder.mlp.0.bias", "time_text_embed.timestep_embedder.linear_1.bias"),
    ("t_embedder.mlp.2.weight", "time_text_embed.timestep_embedder.linear_2.weight"),
    ("t_embedder.mlp.2.bias", "time_text_embed.timestep_embedder.linear_2.bias"),
    ("y_embedder.mlp.0.weight", "time_text_embed.text_embedder.linear_1.weight"),
    ("y_embedder.mlp.0.bias", "time_text_embed.text_embedder.linear_1.bias"),
    ("y_embedder.mlp.2.weight", "time_text_embed.text_embedder.linear_2.weight"),
    ("y_embedder.mlp.2.bias", "time_text_embed.text_embedder.linear_2.bias"),
];

/// The file's key for the weight Kiln names `name`.
fn file_name<'a>(h: &Header, name: &'a str) -> &'a str {
    match RENAMES.iter().find(|(ours, _)| *ours == name) {
        Some((ours, theirs)) if !h.has(ours) => theirs,
        _ => name,
    }
}

/// Whether `h` holds an SD3.5 ControlNet (ComfyUI's keys: `pos_embed_input.proj.weight` and
/// `transformer_blocks.0.adaLN_modulation.1.bias`), and its config.
pub fn detect_control(h: &Header) -> Result<Option<ControlConfig>> {
    if !h.has("pos_embed_input.proj.weight")
        || !h.has("transformer_blocks.0.adaLN_modulation.1.bias")
    {
        return Ok(None);
    }
    let shape = |name: &str| -> Result<Vec<usize>> {
        let key = file_name(h, name);
        h.shape(key)
            .map(<[usize]>::to_vec)
            .ok_or_else(|| h.unsupported(format!("an SD3.5 ControlNet without `{}`", h.key(key))))
    };
    let y = shape("y_embedder.mlp.0.weight")?;
    if y.len() != 2 || y[0] == y[1] {
        return Err(h.unsupported(format!(
            "an SD3.5 ControlNet whose pooled-vector embedding is {y:?}: the 8B ControlNets' second embedding \
             (`double_y_emb`) is not run by Kiln yet"
        )));
    }
    let hint = shape("pos_embed_input.proj.weight")?;
    let control_type = match h.float_values("control_type").and_then(|(_, v)| v.first().copied()) {
        Some(v) if v.round() == 0.0 => ControlType::Blur,
        Some(v) if v.round() == 1.0 => ControlType::Canny,
        Some(v) if v.round() == 2.0 => ControlType::Depth,
        _ => ControlType::Other,
    };
    let dim = y[0];
    let config = ControlConfig {
        dim,
        heads: dim / HEAD_DIM,
        blocks: h.gapless_blocks("transformer_blocks.", "an SD3.5 ControlNet whose blocks")?,
        adm_width: y[1],
        hint_channels: hint.get(1).copied().unwrap_or(0),
        control_type,
    };
    for (name, want) in control_expected(&config) {
        h.expect_shape(file_name(h, &name), &want, "the SD3.5 ControlNet")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, under Kiln's names.
fn control_expected(cfg: &ControlConfig) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let mut all = Vec::new();
    let mut linear = |name: String, out: usize, inp: usize| {
        all.push((format!("{name}.weight"), vec![out, inp]));
        all.push((format!("{name}.bias"), vec![out]));
    };
    linear("t_embedder.mlp.0".into(), d, T_FREQ_DIM);
    linear("t_embedder.mlp.2".into(), d, d);
    linear("y_embedder.mlp.0".into(), d, cfg.adm_width);
    linear("y_embedder.mlp.2".into(), d, d);
    for i in 0..cfg.blocks {
        let p = format!("transformer_blocks.{i}");
        linear(format!("{p}.adaLN_modulation.1"), 6 * d, d);
        linear(format!("{p}.attn.qkv"), 3 * d, d);
        linear(format!("{p}.attn.proj"), d, d);
        linear(format!("{p}.mlp.fc1"), 4 * d, d);
        linear(format!("{p}.mlp.fc2"), d, 4 * d);
        linear(format!("controlnet_blocks.{i}"), d, d);
    }
    all.push(("pos_embed_input.proj.weight".to_owned(), vec![d, cfg.hint_channels, PATCH, PATCH]));
    all.push(("pos_embed_input.proj.bias".to_owned(), vec![d]));
    all
}

/// Every tensor of a released file of `cfg` (`kiln model synth`): the weights under the names Stability's files
/// use (diffusers' for the embedders), and `control_type`.
pub fn control_file_tensors(cfg: &ControlConfig) -> Vec<(String, Vec<usize>)> {
    let mut all: Vec<(String, Vec<usize>)> = control_expected(cfg)
        .into_iter()
        .map(|(name, shape)| match RENAMES.iter().find(|(ours, _)| *ours == name) {
            Some((_, theirs)) => ((*theirs).to_owned(), shape),
            None => (name, shape),
        })
        .collect();
    all.push(("control_type".to_owned(), vec![1]));
    all
}

impl ControlType {
    /// The file's `control_type` value for this type.
    pub fn value(self) -> f32 {
        match self {
            ControlType::Blur => 0.0,
            ControlType::Canny => 1.0,
            ControlType::Depth => 2.0,
            ControlType::Other => -1.0,
        }
    }
}

/// The weights to load, under Kiln's names from the file's.
pub fn control_load_plan(h: &Header, cfg: &ControlConfig) -> LoadPlan {
    let slots = control_expected(cfg)
        .into_iter()
        .map(|(name, _)| {
            let key = h.key(file_name(h, &name));
            SlotPlan::new(name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A loaded SD3.5 ControlNet.
pub struct Sd3ControlNet {
    /// The hyperparameters.
    pub config: ControlConfig,
    /// The weights.
    pub weights: Model,
}

impl Sd3ControlNet {
    /// The ControlNet of `config` with `weights` from [`control_load_plan`].
    pub fn new(config: ControlConfig, weights: Model) -> Sd3ControlNet {
        Sd3ControlNet { config, weights }
    }

    /// What it adds to `base`'s image tokens after each of its blocks (`base.config.blocks` entries, each
    /// `[B, N, D]`, already times `strength`), for the call's latents, timesteps and pooled vector (`input`; its
    /// context is not read) and the `hint` (the control image in the model's latent space).
    pub fn residuals<B: Backend>(
        &self,
        b: &B,
        base: &Sd3,
        input: &Sd3Input<'_, B>,
        hint: &Tensor<B>,
        strength: f32,
    ) -> Result<Vec<Tensor<B>>> {
        let (x, timesteps, pooled) = (input.x, input.timesteps, input.pooled);
        let cfg = &self.config;
        if cfg.dim != base.config.dim {
            return Err(Error::Invalid(format!(
                "this SD3.5 ControlNet is {} wide and the model {}: a ControlNet for another SD3 model",
                cfg.dim, base.config.dim
            )));
        }
        let dt = b.compute_dtype();
        let batch = x.dim(0)?;
        let (tokens, rows, cols) = base.patch_embed(b, &b.cast(x, dt)?)?;
        let hint = b.cast(&to_batch(b, hint, batch)?, dt)?;
        let (hint_tokens, hr, hc) =
            patch_embed(b, &self.weights, "pos_embed_input.proj", &hint, cfg.dim)?;
        if (hr, hc) != (rows, cols) {
            return Err(Error::Invalid(format!(
                "the ControlNet's hint is {hr}×{hc} patches and the latent {rows}×{cols}"
            )));
        }
        let position = sincos_positions(b, cfg.dim, rows, cols, dt)?;
        let mut h = b.binary(&tokens, &to_batch(b, &position, batch)?, BinaryOp::Add)?;
        h = b.binary(&h, &hint_tokens, BinaryOp::Add)?;
        drop((tokens, hint_tokens, position));

        let m = &self.weights;
        let silu_c = {
            let t = crate::timestep::sinusoid(timesteps.iter().copied(), T_FREQ_DIM / 2, 1.0);
            let t = b.cast(&b.from_f32(&[batch, T_FREQ_DIM], &t, DType::F32)?, dt)?;
            let mut c = mlp(b, m, "t_embedder.mlp", &t)?;
            if let Some(pooled) = pooled {
                let y = b.cast(&to_batch(b, pooled, batch)?, dt)?;
                c = b.binary(&c, &mlp(b, m, "y_embedder.mlp", &y)?, BinaryOp::Add)?;
            }
            b.unary(&c, UnaryOp::Silu)?
        };
        let repeat = base.config.heads.div_ceil(cfg.blocks.max(1));
        let mut outputs = Vec::with_capacity(base.config.blocks);
        for i in 0..cfg.blocks {
            let stream = Stream {
                weights: m,
                prefix: format!("transformer_blocks.{i}"),
                dim: cfg.dim,
                heads: cfg.heads,
                qk_norm: false,
            };
            h = stream.self_block(b, &h, &silu_c)?;
            let out = linear(b, m, &format!("controlnet_blocks.{i}"), &h)?;
            let out = b.affine(&out, strength, 0.0)?;
            for _ in 0..repeat {
                outputs.push(out.clone());
            }
        }
        Ok(outputs)
    }
}

/// ComfyUI's `get_2d_sincos_pos_embed_torch(dim, cols, rows)` `[1, rows·cols, dim]`: each token's width
/// position's sines and cosines, then its height position's, the positions spread over ±7.5 about 7.5 along the
/// shorter side (the longer side in proportion), frequencies 10000^(−k/(dim/4)).
fn sincos_positions<B: Backend>(
    b: &B,
    dim: usize,
    rows: usize,
    cols: usize,
    dt: DType,
) -> Result<Tensor<B>> {
    const CENTER: f32 = 7.5;
    const MAGNITUDE: f32 = 7.5;
    // Python floats: the ends are computed in f64 and rounded once, as torch takes them.
    let small = rows.min(cols) as f64;
    let grid = |n: usize| -> Vec<f32> {
        let v = n as f64 / small * f64::from(MAGNITUDE);
        let center = f64::from(CENTER);
        crate::rope::linspace((-v + center) as f32, (v + center) as f32, n).collect()
    };
    let (grid_h, grid_w) = (grid(rows), grid(cols));
    let half = dim / 2;
    let quarter = half / 2;
    let omega: Vec<f32> =
        (0..quarter).map(|k| 1.0 / 10000f32.powf(k as f32 / (half as f32 / 2.0))).collect();
    let one_d = |pos: f32, out: &mut Vec<f32>| {
        out.extend(omega.iter().map(|w| (pos * w).sin()));
        out.extend(omega.iter().map(|w| (pos * w).cos()));
    };
    let mut values = Vec::with_capacity(rows * cols * dim);
    for &ph in &grid_h {
        for &pw in &grid_w {
            one_d(pw, &mut values);
            one_d(ph, &mut values);
        }
    }
    Ok(b.cast(&b.from_f32(&[1, rows * cols, dim], &values, DType::F32)?, dt)?)
}
