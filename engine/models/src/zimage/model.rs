//! [`ZImage`]: the NextDiT forward pass in ComfyUI's order (models.md §3.3), reading one block's weights at a
//! time through [`Model::fetch`].

use std::sync::Arc;

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, MemoryManager, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use crate::adaln::ScaleGates;
use crate::error::{Error, Result};
use crate::fp16::finite_in_f16;
use crate::header::Header;
use crate::latent_tokens::padded;
use crate::rope::Rope;

use super::config::{Config, Variant, detect};
use super::control::FunPatch;
use super::keys::{GROUPS, load_plan, modulated};
use super::rope;

/// A Z-Image NextDiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct ZImage {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl ZImage {
    /// A model from its config and loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> ZImage {
        ZImage { config, weights }
    }

    /// Detects the model in `h` and loads it: [`crate::Error::Unsupported`] if `h` is no Z-Image NextDiT.
    pub fn load(
        manager: &Arc<MemoryManager>,
        h: &Header,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ZImage> {
        let (config, layout) = detect(h)?.ok_or_else(|| {
            h.unsupported(
                "not a Z-Image diffusion model (no `cap_embedder.1.weight` with refiner q/k norms)",
            )
        })?;
        let weights = manager.load(&load_plan(h, &config, layout), progress)?;
        Ok(ZImage::new(config, weights))
    }

    /// ComfyUI's model output for latents `x` `[B, C, h, w]` (any float dtype), model timesteps `sigmas` (one per
    /// sample: σ·multiplier of the model sampling, σ itself under Z-Image's own; the network sees t = 1 − it, as
    /// ComfyUI's whatever the multiplier) and caption features `context` `[B, N, cap_feat_dim]`: −v_net, f32
    /// `[B, C, h, w]`. Computes in `b.compute_dtype()`; odd `h`/`w` are padded circularly and cropped back.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_patches(b, x, sigmas, context, &[])
    }

    /// [`ZImage::forward`] with Fun ControlNets (`patches`, in the order they were applied): each adds its
    /// control layers' outputs to the image tokens after the main layers they belong to.
    pub fn forward_with_patches<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
        patches: &[FunPatch<'_, B>],
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, h, w) = self.check_inputs(x, sigmas, context)?;
        let dt = b.compute_dtype();
        let x = b.cast(x, dt)?;
        let context = b.cast(context, dt)?;

        let c = self.time_embedding(b, sigmas)?;

        let p = cfg.patch_size;
        let (x, rows, cols) = padded(b, &x, p)?;
        let (hp, wp) = (rows * p, cols * p);

        let mut cap = self.caption(b, &context)?;
        let caption_len = cap.dim(1)?;
        let (mut img, image_len) = self.image(b, &x)?;
        let image_pads = img.dim(1)? - image_len;

        let mut positions = rope::caption_positions(caption_len);
        positions.extend(rope::image_positions(caption_len, rows, cols, image_pads));
        let (cos, sin) = rope::tables(&positions, cfg.axes_dims, cfg.rope_theta);
        let half = cfg.head_dim / 2;
        let joint = Rope::upload(b, &cos, &sin, half, DType::F32)?;
        let part = |start, len| joint.rows(b, start, len);
        let cap_rope = part(0, caption_len)?;
        let img_rope = part(caption_len, positions.len() - caption_len)?;

        let [main, noise, context_refiner] = GROUPS;
        for i in 0..cfg.context_refiners {
            cap = self.block(b, context_refiner, i, &cap, &cap_rope, None)?;
        }
        for i in 0..cfg.noise_refiners {
            img = self.block(b, noise, i, &img, &img_rope, Some(&c))?;
        }
        // The Fun ControlNets' outputs, from the main layers' input image tokens (ComfyUI's `img_input`).
        let mut controls = Vec::with_capacity(patches.len());
        if !patches.is_empty() {
            let x_input = b.slice(&img, 1, 0, image_len)?;
            let rope = part(caption_len, image_len)?;
            for patch in patches {
                controls.extend(patch.net.outputs(b, &x_input, &rope, &c, patch, cfg.layers)?);
            }
        }
        let mut joint_x = b.concat(&[&cap, &img], 1)?;
        drop((cap, img));
        for i in 0..cfg.layers {
            joint_x = self.block(b, main, i, &joint_x, &joint, Some(&c))?;
            for (_, output) in controls.iter().filter(|(at, _)| *at == i) {
                joint_x = add_at(b, &joint_x, output, caption_len)?;
            }
        }

        // The final layer is per token: only the real image tokens are needed.
        let tokens = b.slice(&joint_x, 1, caption_len, image_len)?;
        let y = self.final_layer(b, &tokens, &c)?;
        let mut out = b.unpatchify(&y, p, cfg.in_channels, hp, wp)?;
        if hp > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if wp > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        debug_assert_eq!(out.shape(), [batch, cfg.in_channels, h, w]);
        let out = b.unary(&out, UnaryOp::Neg)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the input shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<(usize, usize, usize)> {
        let cfg = &self.config;
        let &[batch, channels, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "Z-Image latents must be [B, C, h, w], got {:?}",
                x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "Z-Image takes non-empty latents of {} channels, got {:?}",
                cfg.in_channels,
                x.shape()
            )));
        }
        if sigmas.len() != batch {
            return Err(Error::Invalid(format!("{} sigmas for a batch of {batch}", sigmas.len())));
        }
        match context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.cap_feat_dim => {
                Ok((batch, h, w))
            }
            other => Err(Error::Invalid(format!(
                "Z-Image conditioning must be [{batch}, N > 0, {}], got {other:?}",
                cfg.cap_feat_dim
            ))),
        }
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[String]) -> Result<Layer<'_>> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self.weights.fetch(b, &names)?)
    }

    /// The adaLN input c `[B, adaln_dim]`: sinusoid of `time_scale · (1 − σ)` (f32, cos half first), then
    /// Linear → SiLU → Linear in the compute type.
    fn time_embedding<B: Backend>(&self, b: &B, sigmas: &[f32]) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let ts = sigmas.iter().map(|&sigma| (1.0 - sigma) * cfg.time_scale);
        let emb = crate::timestep::sinusoid(ts, cfg.t_freq_dim / 2, 1.0);
        let emb = b.from_f32(&[sigmas.len(), cfg.t_freq_dim], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let names =
            ["0.weight", "0.bias", "2.weight", "2.bias"].map(|n| format!("t_embedder.mlp.{n}"));
        let layer = self.fetch(b, &names)?;
        let hidden = b.linear(&emb, &layer.weight(0), Some(&layer.weight(1)))?;
        let hidden = b.unary(&hidden, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// Caption tokens `[B, Nc, D]`: Linear(RMSNorm(context)), padded with `cap_pad_token`.
    fn caption<B: Backend>(&self, b: &B, context: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut names: Vec<String> =
            ["cap_embedder.0.weight", "cap_embedder.1.weight", "cap_embedder.1.bias"]
                .map(String::from)
                .to_vec();
        if cfg.pad_multiple > 1 {
            names.push("cap_pad_token".into());
        }
        let layer = self.fetch(b, &names)?;
        let y = b.rms_norm(context, Some(&layer.weight(0)), cfg.norm_eps)?;
        let y = b.linear(&y, &layer.weight(1), Some(&layer.weight(2)))?;
        let pad = (cfg.pad_multiple > 1).then(|| layer.weight(3));
        self.pad_run(b, y, pad.as_ref())
    }

    /// Image tokens `[B, Ni + pads, D]` from the (even-sized) latents, padded with `x_pad_token`, and Ni.
    fn image<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<(Tensor<B>, usize)> {
        let cfg = &self.config;
        let mut names: Vec<String> =
            ["x_embedder.weight", "x_embedder.bias"].map(String::from).to_vec();
        if cfg.pad_multiple > 1 {
            names.push("x_pad_token".into());
        }
        let layer = self.fetch(b, &names)?;
        let patches = b.patchify(x, cfg.patch_size)?;
        let len = patches.dim(1)?;
        let y = b.linear(&patches, &layer.weight(0), Some(&layer.weight(1)))?;
        let pad = (cfg.pad_multiple > 1).then(|| layer.weight(2));
        Ok((self.pad_run(b, y, pad.as_ref())?, len))
    }

    /// Appends copies of `token` `[1, D]` to the tokens `x` `[B, n, D]` up to a multiple of `pad_multiple`.
    fn pad_run<B: Backend>(
        &self,
        b: &B,
        x: Tensor<B>,
        token: Option<&Weight<'_>>,
    ) -> Result<Tensor<B>> {
        let (Some(token), &[batch, n, d]) = (token, x.shape()) else {
            return Ok(x);
        };
        let multiple = self.config.pad_multiple;
        let pads = (multiple - n % multiple) % multiple;
        if pads == 0 {
            return Ok(x);
        }
        let token = b.weight_to_tensor(token, x.dtype())?.reshape(&[1, 1, d])?;
        let fill = b.binary(&b.full(&[batch, pads, d], 0.0, x.dtype())?, &token, BinaryOp::Add)?;
        Ok(b.concat(&[&x, &fill], 1)?)
    }

    /// One transformer block (`{group}.{i}`), modulated by `c` when given (models.md §3.3).
    pub(super) fn block<B: Backend>(
        &self,
        b: &B,
        group: &str,
        i: usize,
        x: &Tensor<B>,
        rope: &Rope<B>,
        c: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let p = format!("{group}.{i}");
        let mut names: Vec<String> = [
            "attention.qkv.weight",
            "attention.out.weight",
            "attention.q_norm.weight",
            "attention.k_norm.weight",
            "attention_norm1.weight",
            "attention_norm2.weight",
            "ffn_norm1.weight",
            "ffn_norm2.weight",
            "feed_forward.w1.weight",
            "feed_forward.w2.weight",
            "feed_forward.w3.weight",
        ]
        .iter()
        .map(|n| format!("{p}.{n}"))
        .collect();
        let c = c.filter(|_| modulated(group));
        let adaln = format!("adaLN_modulation.{}", cfg.variant.adaln_index());
        if c.is_some() {
            names.push(format!("{p}.{adaln}.weight"));
            names.push(format!("{p}.{adaln}.bias"));
        }
        let layer = self.fetch(b, &names)?;
        let w = |name: &str| layer.get(&format!("{p}.{name}"));
        let modulation = match c {
            Some(c) => Some(self.modulation(
                b,
                c,
                &w(&format!("{adaln}.weight"))?,
                &w(&format!("{adaln}.bias"))?,
            )?),
            None => None,
        };
        let eps = cfg.norm_eps;

        let h = b.rms_norm(x, Some(&w("attention_norm1.weight")?), eps)?;
        let h = match &modulation {
            Some(m) => b.modulate(&h, &m.attn_scale, None)?,
            None => h,
        };
        // ComfyUI's `clamp_fp16` on the attention's output, on the SwiGLU's gated product, and on a modulated
        // block's feed-forward output (an f16 model's; Lumina 2's `JointTransformerBlock`).
        let a = finite_in_f16(b, self.attention(b, &layer, &p, &h, rope)?)?;
        let a = b.rms_norm(&a, Some(&w("attention_norm2.weight")?), eps)?;
        let a = match &modulation {
            Some(m) => b.binary(&a, &m.attn_gate, BinaryOp::Mul)?,
            None => a,
        };
        let x = b.binary(x, &a, BinaryOp::Add)?;

        let h = b.rms_norm(&x, Some(&w("ffn_norm1.weight")?), eps)?;
        let h = match &modulation {
            Some(m) => b.modulate(&h, &m.ffn_scale, None)?,
            None => h,
        };
        let gate = b.linear(&h, &w("feed_forward.w1.weight")?, None)?;
        let up = b.linear(&h, &w("feed_forward.w3.weight")?, None)?;
        let gated = finite_in_f16(b, b.gated(&gate, &up, UnaryOp::Silu)?)?;
        let f = b.linear(&gated, &w("feed_forward.w2.weight")?, None)?;
        let f = if modulation.is_some() { finite_in_f16(b, f)? } else { f };
        let f = b.rms_norm(&f, Some(&w("ffn_norm2.weight")?), eps)?;
        let f = match &modulation {
            Some(m) => b.binary(&f, &m.ffn_gate, BinaryOp::Mul)?,
            None => f,
        };
        Ok(b.binary(&x, &f, BinaryOp::Add)?)
    }

    /// A block's `(scale, tanh gate)` pairs from `W·c + b` (Lumina 2's `W·SiLU(c) + b`), split in four.
    fn modulation<B: Backend>(
        &self,
        b: &B,
        c: &Tensor<B>,
        weight: &Weight<'_>,
        bias: &Weight<'_>,
    ) -> Result<ScaleGates<B>> {
        let d = self.config.dim;
        let m = match self.config.variant {
            Variant::ZImage => b.linear(c, weight, Some(bias))?,
            Variant::Lumina2 => b.linear(&b.unary(c, UnaryOp::Silu)?, weight, Some(bias))?,
        };
        ScaleGates::of(b, &m, d)
    }

    /// Self-attention of block `p` over `h` `[B, L, D]`: fused qkv split by rows (query heads, then key and value
    /// heads), per-head q/k RMSNorm, interleaved RoPE, unmasked softmax attention (grouped-query when there are
    /// fewer key/value heads), output projection.
    fn attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        p: &str,
        h: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (d, heads, hd) = (cfg.dim, cfg.heads, cfg.head_dim);
        let &[batch, len, _] = h.shape() else {
            return Err(Error::Invalid(format!(
                "attention input {:?} is not [B, L, D]",
                h.shape()
            )));
        };
        let qkv = layer.get(&format!("{p}.attention.qkv.weight"))?;
        let (q_rows, kv_rows) = (heads * hd, cfg.kv_heads * hd);
        let project = |start: usize, count: usize| -> Result<Tensor<B>> {
            let rows = qkv.rows(start, count * hd)?;
            Ok(b.linear(h, &rows, None)?.reshape(&[batch, len, count, hd])?)
        };
        let rotate = |x: Tensor<B>, norm: &str| -> Result<Tensor<B>> {
            let norm = layer.get(&format!("{p}.attention.{norm}.weight"))?;
            let x = b.rms_norm(&x, Some(&norm), cfg.qk_norm_eps)?;
            let x = b.rope(&x, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
            Ok(b.permute(&x, &[0, 2, 1, 3])?)
        };
        let q = rotate(project(0, heads)?, "q_norm")?;
        let k = rotate(project(q_rows, cfg.kv_heads)?, "k_norm")?;
        let v = b.permute(&project(q_rows + kv_rows, cfg.kv_heads)?, &[0, 2, 1, 3])?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (hd as f32).sqrt())?;
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, len, d])?;
        Ok(b.linear(&o, &layer.get(&format!("{p}.attention.out.weight"))?, None)?)
    }

    /// The final layer on tokens `[B, n, D]`: Linear(LayerNorm(x) · (1 + Linear(SiLU(c)))) → `[B, n, p²·C]`.
    fn final_layer<B: Backend>(&self, b: &B, x: &Tensor<B>, c: &Tensor<B>) -> Result<Tensor<B>> {
        let names = [
            "linear.weight",
            "linear.bias",
            "adaLN_modulation.1.weight",
            "adaLN_modulation.1.bias",
        ]
        .map(|n| format!("final_layer.{n}"));
        let layer = self.fetch(b, &names)?;
        let scale =
            b.linear(&b.unary(c, UnaryOp::Silu)?, &layer.weight(2), Some(&layer.weight(3)))?;
        let y = b.layer_norm(x, None, None, 1e-6)?;
        let y = b.modulate(&y, &scale, None)?;
        Ok(b.linear(&y, &layer.weight(0), Some(&layer.weight(1)))?)
    }
}

/// `joint` `[B, L, D]` with `output` `[B, n, D]` added to its n tokens from `at`.
fn add_at<B: Backend>(
    b: &B,
    joint: &Tensor<B>,
    output: &Tensor<B>,
    at: usize,
) -> Result<Tensor<B>> {
    let (len, n) = (joint.dim(1)?, output.dim(1)?);
    let head = b.slice(joint, 1, 0, at)?;
    let middle = b.binary(&b.slice(joint, 1, at, n)?, output, BinaryOp::Add)?;
    let tail = b.slice(joint, 1, at + n, len - at - n)?;
    Ok(b.concat(&[&head, &middle, &tail], 1)?)
}
