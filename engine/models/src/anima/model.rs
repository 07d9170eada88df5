//! [`Anima`]: the Cosmos Predict2 DiT's forward pass (ComfyUI's `MiniTrainDIT._forward` and `Block.forward`).

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, RopeLayout, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Config, PATCH};
use super::lllite::{LlliteCall, LlliteTarget};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::to_batch;
use crate::named::fetch;
use crate::rope::Rope;

/// ε of the blocks' LayerNorms (no affine weights) and of every RMS norm.
const EPS: f32 = 1e-6;
/// RoPE's base period before the NTK stretch.
const ROPE_THETA: f64 = 10000.0;

/// A loaded Anima DiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct Anima {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// One call's inputs.
pub struct AnimaInput<'a, B: Backend> {
    /// Latents `[B, C, h, w]` or `[B, C, T, h, w]`.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ).
    pub timesteps: &'a [f32],
    /// The adapter's output per prompt `[B or 1, N, context_dim]` ([`Anima::adapt`]).
    pub context: &'a Tensor<B>,
    /// ControlNet-LLLites on this call, in the order they were applied.
    pub lllite: &'a [LlliteCall<'a, B>],
}

/// What the timestep gives every modulation: `SiLU` of its RMS-normed sinusoid `[B, dim]`, and the adaLN-LoRA
/// term added to each modulation `[B, 3·dim]`.
struct Time<B: Backend> {
    silu: Tensor<B>,
    lora: Tensor<B>,
}

/// What every block reads beside its tokens: the context, the timestep's terms, the RoPE and the LLLites.
struct Shared<'a, B: Backend> {
    context: &'a Tensor<B>,
    time: &'a Time<B>,
    rope: &'a Rope<B>,
    lllite: &'a [LlliteCall<'a, B>],
}

impl Anima {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> Anima {
        Anima { config, weights }
    }

    /// ComfyUI's model output for `input`, f32 of the latent's shape, computed in `b.compute_dtype()`.
    pub fn forward<B: Backend>(&self, b: &B, input: &AnimaInput<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let shape = input.x.shape().to_vec();
        let (batch, channels, frames, h, w) = match shape[..] {
            [batch, c, h, w] => (batch, c, 1, h, w),
            [batch, c, t, h, w] => (batch, c, t, h, w),
            _ => {
                return Err(Error::Invalid(format!(
                    "Anima's input {shape:?} is not [B, C, h, w] or [B, C, T, h, w]"
                )));
            }
        };
        if channels != cfg.channels || input.timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "the Anima DiT takes {} channels and a timestep per sample; got {shape:?} and {} timesteps",
                cfg.channels,
                input.timesteps.len()
            )));
        }
        let dt = b.compute_dtype();
        let (rows, cols) = (h.div_ceil(PATCH), w.div_ceil(PATCH));
        let mut x = self.embed_patches(b, &b.cast(input.x, dt)?, (batch, frames, h, w))?;
        let rope = self.rope(b, frames, rows, cols)?;

        // The timestep's sinusoid is both the modulations' input (RMS-normed) and the adaLN-LoRA's.
        let d = cfg.dim;
        let time = {
            let t = crate::timestep::sinusoid(input.timesteps.iter().copied(), d / 2, 1.0);
            let t = b.cast(&b.from_f32(&[batch, d], &t, DType::F32)?, dt)?;
            let h = self.no_bias(b, "t_embedder.1.linear_1", &t)?;
            let lora = self.no_bias(b, "t_embedder.1.linear_2", &b.unary(&h, UnaryOp::Silu)?)?;
            let emb = self.norm(b, "t_embedding_norm.weight", &t, EPS)?;
            Time { silu: b.unary(&emb, UnaryOp::Silu)?, lora }
        };
        let context = b.cast(&to_batch(b, input.context, batch)?, dt)?;
        for i in 0..cfg.blocks {
            let shared =
                Shared { context: &context, time: &time, rope: &rope, lllite: input.lllite };
            x = self.block(b, i, &x, &shared)?;
        }

        let out = {
            let m = self.adaln(b, "final_layer.adaln_modulation", &time.silu)?;
            let m = b.binary(&m, &b.slice(&time.lora, -1, 0, 2 * d)?, BinaryOp::Add)?;
            let (shift, scale) = (b.slice(&m, -1, 0, d)?, b.slice(&m, -1, d, d)?);
            let x = b.modulate(&b.layer_norm(&x, None, None, EPS)?, &scale, Some(&shift))?;
            self.no_bias(b, "final_layer.linear", &x)?
        };
        // Features (row in patch, column in patch, channel): channels last.
        let out = out.reshape(&[batch, frames, rows, cols, PATCH, PATCH, cfg.channels])?;
        let out = b.permute(&out, &[0, 6, 1, 2, 4, 3, 5])?;
        let out = out.reshape(&[batch, cfg.channels, frames, rows * PATCH, cols * PATCH])?;
        let out = match (rows * PATCH == h, cols * PATCH == w) {
            (true, true) => out,
            _ => b.slice(&b.slice(&out, 3, 0, h)?, 4, 0, w)?,
        };
        let out = out.reshape(&shape)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// The latent `[B, C, (T,) h, w]` padded circularly to the patch, joined with a zero padding-mask channel and
    /// cut into 2×2 patches (features channel-major, `c·4 + py·2 + px`) through `x_embedder` →
    /// `[B, T·rows·cols, dim]`, tokens frame-major then row-major.
    fn embed_patches<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        (batch, frames, h, w): (usize, usize, usize, usize),
    ) -> Result<Tensor<B>> {
        let c = self.config.channels;
        let mut x = x.reshape(&[batch, c * frames, h, w])?;
        let (hp, wp) = (h.div_ceil(PATCH) * PATCH, w.div_ceil(PATCH) * PATCH);
        if hp > h {
            x = b.pad(&x, 2, 0, hp - h, PadMode::Circular)?;
        }
        if wp > w {
            x = b.pad(&x, 3, 0, wp - w, PadMode::Circular)?;
        }
        let x = x.reshape(&[batch, c, frames * hp * wp])?;
        let x = b.pad(&x, 1, 0, 1, PadMode::Constant(0.0))?;
        let (rows, cols) = (hp / PATCH, wp / PATCH);
        let x = x.reshape(&[batch, c + 1, frames, rows, PATCH, cols, PATCH])?;
        let x = b.permute(&x, &[0, 2, 3, 5, 1, 4, 6])?;
        let x = x.reshape(&[batch, frames * rows * cols, (c + 1) * PATCH * PATCH])?;
        self.no_bias(b, "x_embedder.proj.1", &x)
    }

    /// Block `i` (`Block.forward`): self-attention with the RoPE, cross-attention to `context`, the MLP, each
    /// after its modulated LayerNorm and gated into the residual; `lllite` add to the inputs of the q, k, v and
    /// MLP projections (ComfyUI's `attn1_patch`, `attn2_patch` and `mlp_patch`).
    fn block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        shared: &Shared<'_, B>,
    ) -> Result<Tensor<B>> {
        let Shared { context, time, rope, lllite } = *shared;
        let p = format!("blocks.{i}");
        let modulation = |part: &str| -> Result<Modulation<B>> {
            let m = self.adaln(b, &format!("{p}.adaln_modulation_{part}"), &time.silu)?;
            let m = b.binary(&m, &time.lora, BinaryOp::Add)?;
            let mut sets = Modulation::sets(b, &m, self.config.dim, 1)?;
            sets.pop()
                .ok_or_else(|| Error::Invalid("an Anima block without its modulation".to_owned()))
        };
        // Each LLLite in turn adds its module's output to the input it patches.
        let patched = |input: &Tensor<B>, target: LlliteTarget| -> Result<Tensor<B>> {
            let mut input = input.clone();
            for call in lllite {
                input = call.net.apply(b, &input, &call.cond, i, target, call.strength)?;
            }
            Ok(input)
        };
        let attn = modulation("self_attn")?;
        let normed = attn.modulated(b, x, EPS)?;
        let inputs = [LlliteTarget::SelfQ, LlliteTarget::SelfK, LlliteTarget::SelfV]
            .map(|target| patched(&normed, target));
        let [q_in, k_in, v_in] = inputs;
        let out =
            self.attention(b, &format!("{p}.self_attn"), [&q_in?, &k_in?, &v_in?], Some(rope))?;
        let x = attn.gated_add(b, x, &out)?;
        let cross = modulation("cross_attn")?;
        let q_in = patched(&cross.modulated(b, &x, EPS)?, LlliteTarget::CrossQ)?;
        let out = self.attention(b, &format!("{p}.cross_attn"), [&q_in, context, context], None)?;
        let x = cross.gated_add(b, &x, &out)?;
        let mlp = modulation("mlp")?;
        let normed = patched(&mlp.modulated(b, &x, EPS)?, LlliteTarget::Mlp)?;
        let h = self.no_bias(b, &format!("{p}.mlp.layer1"), &normed)?;
        let out = self.no_bias(b, &format!("{p}.mlp.layer2"), &b.unary(&h, UnaryOp::Gelu)?)?;
        mlp.gated_add(b, &x, &out)
    }

    /// The DiT's attention `p` on the inputs of its q, k and v projections (self-attention: the block's
    /// normalised tokens; cross-attention: those and the context twice); q and k RMS-normed per head, then
    /// rotated by `rope` when given (self-attention only).
    fn attention<B: Backend>(
        &self,
        b: &B,
        p: &str,
        [q_in, k_in, v_in]: [&Tensor<B>; 3],
        rope: Option<&Rope<B>>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (heads, head_dim) = (cfg.heads(), cfg.head_dim);
        let split = |t: Tensor<B>| -> Result<Tensor<B>> {
            let (batch, n) = (t.dim(0)?, t.dim(1)?);
            Ok(t.reshape(&[batch, n, heads, head_dim])?)
        };
        let q = split(self.no_bias(b, &format!("{p}.q_proj"), q_in)?)?;
        let k = split(self.no_bias(b, &format!("{p}.k_proj"), k_in)?)?;
        let v = split(self.no_bias(b, &format!("{p}.v_proj"), v_in)?)?;
        let norms =
            fetch(b, &self.weights, &[format!("{p}.q_norm.weight"), format!("{p}.k_norm.weight")])?;
        let mut q = b.rms_norm(&q, Some(&norms.weight(0)), EPS)?;
        let mut k = b.rms_norm(&k, Some(&norms.weight(1)), EPS)?;
        drop(norms);
        if let Some(rope) = rope {
            q = b.rope(&q, &rope.cos, &rope.sin, RopeLayout::Half)?;
            k = b.rope(&k, &rope.cos, &rope.sin, RopeLayout::Half)?;
        }
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (head_dim as f32).sqrt())?;
        let (batch, n) = (o.dim(0)?, o.dim(2)?);
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, cfg.dim])?;
        self.no_bias(b, &format!("{p}.output_proj"), &o)
    }

    /// An adaLN-LoRA modulation `stem` (`Sequential(SiLU, Linear, Linear)`, no biases) of `SiLU(emb)`.
    fn adaln<B: Backend>(&self, b: &B, stem: &str, silu_emb: &Tensor<B>) -> Result<Tensor<B>> {
        let h = self.no_bias(b, &format!("{stem}.1"), silu_emb)?;
        self.no_bias(b, &format!("{stem}.2"), &h)
    }

    /// The bias-free Linear `name` of the weights.
    pub(super) fn no_bias<B: Backend>(
        &self,
        b: &B,
        name: &str,
        x: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let layer = fetch(b, &self.weights, &[format!("{name}.weight")])?;
        Ok(b.linear(x, &layer.weight(0), None)?)
    }

    /// `x` RMS-normed with the gain `weight`.
    pub(super) fn norm<B: Backend>(
        &self,
        b: &B,
        weight: &str,
        x: &Tensor<B>,
        eps: f32,
    ) -> Result<Tensor<B>> {
        let layer = fetch(b, &self.weights, &[weight.to_owned()])?;
        Ok(b.rms_norm(x, Some(&layer.weight(0)), eps)?)
    }

    /// The DiT's 3-D RoPE over `frames × rows × cols` tokens ([`rope_angles`]).
    fn rope<B: Backend>(&self, b: &B, frames: usize, rows: usize, cols: usize) -> Result<Rope<B>> {
        let (head_dim, extrapolation) = (self.config.head_dim, self.config.rope_extrapolation);
        let angles = rope_angles(head_dim, extrapolation, (frames, rows, cols));
        Rope::of_angles(b, &angles, head_dim / 2, DType::F32)
    }
}

/// The rotation angles of Anima's 3-D RoPE `[frames·rows·cols, head_dim / 2]` (ComfyUI's `VideoRopePosition3DEmb`
/// for an image batch: integer positions, no frame-rate scaling), tokens frame-major then row-major: the head's
/// rotation pairs split frame, row, column as `head_dim − 2·dim_h`, `dim_h`, `dim_h` (`dim_h = head_dim / 6 · 2`),
/// each axis' θ = 10⁴ stretched by NTK as `ratio^(d / (d − 2))` for its `extrapolation` ratio (frame, row, column);
/// in f32, as ComfyUI computes them.
pub fn rope_angles(
    head_dim: usize,
    extrapolation: [f64; 3],
    (frames, rows, cols): (usize, usize, usize),
) -> Vec<f32> {
    let dim_h = head_dim / 6 * 2;
    let dim_t = head_dim - 2 * dim_h;
    let [ratio_t, ratio_h, ratio_w] = extrapolation;
    let freqs = |d: usize, ratio: f64| -> Vec<f32> {
        let theta = (ROPE_THETA * ratio.powf(d as f64 / (d as f64 - 2.0))) as f32;
        (0..d / 2).map(|k| 1.0 / theta.powf((2 * k) as f32 / d as f32)).collect()
    };
    let (ft, fh, fw) = (freqs(dim_t, ratio_t), freqs(dim_h, ratio_h), freqs(dim_h, ratio_w));
    let mut angles = Vec::with_capacity(frames * rows * cols * head_dim / 2);
    for t in 0..frames {
        for y in 0..rows {
            for x in 0..cols {
                angles.extend(ft.iter().map(|f| t as f32 * f));
                angles.extend(fh.iter().map(|f| y as f32 * f));
                angles.extend(fw.iter().map(|f| x as f32 * f));
            }
        }
    }
    angles
}
