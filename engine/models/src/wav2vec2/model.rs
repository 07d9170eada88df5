//! [`Wav2Vec2`]: the encoder over a batch of 16 kHz waveforms, as ComfyUI's `Wav2Vec2Model` runs it.
//!
//! The channels are averaged; the large model normalises the result over the whole batch at once (one mean
//! and one unbiased variance for every sample of every item, `(x − mean) / sqrt(var + 1e-7)`). Seven
//! convolutions over time (320 samples a frame), each followed by exact GELU after its norm (the large model:
//! a LayerNorm over the channels after each; the base one: a per-channel GroupNorm after the first), a
//! LayerNorm and a projection to the width, then the positional convolution (kernel 128 in 16 groups, its
//! weight `g · v / ‖v‖` with the norm over everything but the kernel tap, its last output dropped, exact
//! GELU) added on, and the transformer layers: pre-LayerNorm with a final LayerNorm (large), or a LayerNorm
//! first and post-LayerNorm layers (base).
//!
//! Invariant: everything runs in f32 whatever the backend's compute type, as ComfyUI runs it (the waveform is
//! f32, its manual-cast layers cast the weights to the input's type, and the positional convolution is a
//! plain f32 torch module). The convolutions are the backend's 2-D convolution on a height of 1; the grouped
//! positional one is one convolution per group.

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, OwnedWeight, Tensor};

use super::config::{
    CONV_LAYERS, Config, HEAD_DIM, NORM_EPS, NORMALIZE_EPS, POS_CONV_G, POS_CONV_GROUPS,
    POS_CONV_KERNEL, POS_CONV_V, SAMPLE_RATE, Variant, conv_names, frames, layer_names,
};
use crate::audio_encoding::{AudioEncoding, EncoderStates};
use crate::error::{Error, Result};
use crate::resample::resample_clips;

/// A loaded wav2vec2 encoder: its config and its weights (named as in ComfyUI's model, the weight norm's by
/// its legacy names) under the memory manager.
#[derive(Debug)]
pub struct Wav2Vec2 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl Wav2Vec2 {
    /// The encoder made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> Wav2Vec2 {
        Wav2Vec2 { config, weights }
    }

    /// ComfyUI's `encode_audio`: `audio` `[B, C, T]` (row-major) at `sample_rate` resampled to 16 kHz per
    /// channel as torchaudio does, then [`Wav2Vec2::forward`].
    pub fn encode_audio<B: Backend>(
        &self,
        b: &B,
        audio: &[f32],
        shape: [usize; 3],
        sample_rate: u32,
    ) -> Result<AudioEncoding<B>> {
        let [batch, channels, _] = shape;
        let (resampled, resampled_len) = resample_clips(audio, shape, sample_rate, SAMPLE_RATE)?;
        let x = b.from_f32(&[batch, channels, resampled_len], &resampled, DType::F32)?;
        Ok(AudioEncoding { output: self.forward(b, &x)?, samples: resampled_len })
    }

    /// The encoder on `audio` `[B, C, T]` at 16 kHz (ComfyUI's `Wav2Vec2Model.forward`): the channels
    /// averaged, then [`frames`](super::frames)`(T)` frames per item. Fewer than 400 samples is
    /// [`Error::Invalid`].
    pub fn forward<B: Backend>(&self, b: &B, audio: &Tensor<B>) -> Result<EncoderStates<B>> {
        let cfg = &self.config;
        let (batch, channels, samples) = match *audio.shape() {
            [batch, channels, samples] if batch > 0 && channels > 0 => (batch, channels, samples),
            ref other => {
                return Err(Error::Invalid(format!(
                    "the wav2vec2 encoder takes audio [B, C, T], got {other:?}"
                )));
            }
        };
        let n = frames(samples);
        if n == 0 {
            return Err(Error::Invalid(format!(
                "the wav2vec2 encoder needs at least 400 samples (25 ms at 16 kHz), got {samples}"
            )));
        }
        let x = b.cast(audio, DType::F32)?;
        // torch.mean over the channels: their sum divided by their count.
        let mut x = if channels == 1 {
            x.reshape(&[batch, samples])?
        } else {
            let mut sum = b.slice(&x, 1, 0, 1)?;
            for c in 1..channels {
                sum = b.binary(&sum, &b.slice(&x, 1, c, 1)?, BinaryOp::Add)?;
            }
            let count = b.full(&[1], channels as f32, DType::F32)?;
            b.binary(&sum, &count, BinaryOp::Div)?.reshape(&[batch, samples])?
        };
        match cfg.variant {
            Variant::Large => x = normalize(b, &x)?,
            Variant::Base => {}
        }
        let mut x = x.reshape(&[batch, 1, 1, samples])?;
        for i in 0..CONV_LAYERS.len() {
            x = self.conv_layer(b, &x, i)?;
        }
        // [B, C, 1, frames] → [B, frames, C].
        let x = b.permute(&x.reshape(&[batch, cfg.conv_dim, n])?, &[0, 2, 1])?;
        let projection = crate::named::fetch(
            b,
            &self.weights,
            &[
                "feature_projection.layer_norm.weight",
                "feature_projection.layer_norm.bias",
                "feature_projection.projection.weight",
                "feature_projection.projection.bias",
            ]
            .map(String::from),
        )?;
        let p = |j: usize| projection.weight(j);
        let x = b.layer_norm(&x, Some(&p(0)), Some(&p(1)), NORM_EPS)?;
        let x = b.linear(&x, &p(2), Some(&p(3)))?;
        drop(projection);

        let mut x = b.binary(&x, &self.positions(b, &x)?, BinaryOp::Add)?;
        // The encoder's LayerNorm: before the post-LayerNorm layers, after the pre-LayerNorm ones.
        match cfg.variant {
            Variant::Large => {}
            Variant::Base => x = self.encoder_norm(b, &x)?,
        }
        let mut states = Vec::with_capacity(cfg.layers + 1);
        for i in 0..cfg.layers {
            states.push(x.clone());
            x = self.layer(b, &x, i)?;
        }
        let last = match cfg.variant {
            Variant::Large => self.encoder_norm(b, &x)?,
            Variant::Base => x,
        };
        states.push(last.clone());
        Ok(EncoderStates { last, states })
    }

    /// The encoder's LayerNorm on x `[B, N, width]`.
    fn encoder_norm<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let names = crate::named::weight_and_bias("encoder.layer_norm");
        let norm = crate::named::fetch(b, &self.weights, &names)?;
        Ok(b.layer_norm(x, Some(&norm.weight(0)), Some(&norm.weight(1)), NORM_EPS)?)
    }

    /// Convolution `i` of the feature extractor with its norm and GELU, on x `[B, C, 1, T]`.
    fn conv_layer<B: Backend>(&self, b: &B, x: &Tensor<B>, i: usize) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (kernel, stride) = CONV_LAYERS[i];
        let layer = crate::named::fetch(b, &self.weights, &conv_names(cfg.variant, i))?;
        let w = layer.weight(0);
        let &[out, input, k] = w.shape() else {
            return Err(Error::Invalid(format!(
                "`feature_extractor.conv_layers.{i}.conv.weight` is {:?}, not [O, C, K]",
                w.shape()
            )));
        };
        if (out, k) != (cfg.conv_dim, kernel) {
            return Err(Error::Invalid(format!(
                "`feature_extractor.conv_layers.{i}.conv.weight` is {:?}, not [{}, C, {kernel}]",
                w.shape(),
                cfg.conv_dim
            )));
        }
        let w = w.reshape(&[out, input, 1, kernel])?;
        let params = Conv2dParams { stride, padding: [0; 4] };
        Ok(match cfg.variant {
            Variant::Large => {
                let y = b.conv2d(x, &w, Some(&layer.weight(1)), params)?;
                let (batch, len) = (y.dim(0)?, y.dim(3)?);
                // LayerNorm over the channels: [B, C, 1, L] → [B, L, C] and back.
                let y = b.permute(&y.reshape(&[batch, cfg.conv_dim, len])?, &[0, 2, 1])?;
                let y =
                    b.layer_norm(&y, Some(&layer.weight(2)), Some(&layer.weight(3)), NORM_EPS)?;
                let y = b.unary(&y, UnaryOp::Gelu)?;
                b.permute(&y, &[0, 2, 1])?.reshape(&[batch, cfg.conv_dim, 1, len])?
            }
            Variant::Base => {
                let y = b.conv2d(x, &w, None, params)?;
                let y = if i == 0 {
                    let (gain, bias) = (layer.weight(1), layer.weight(2));
                    b.group_norm(&y, cfg.conv_dim, Some(&gain), Some(&bias), NORM_EPS)?
                } else {
                    y
                };
                b.unary(&y, UnaryOp::Gelu)?
            }
        })
    }

    /// The positional convolution on x `[B, N, width]`: `[B, N, width]` to add to it.
    fn positions<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let width = self.config.width;
        let (batch, n) = (x.dim(0)?, x.dim(1)?);
        let per = width / POS_CONV_GROUPS;
        let layer = crate::named::fetch(
            b,
            &self.weights,
            &[POS_CONV_G, POS_CONV_V, "encoder.pos_conv_embed.conv.bias"].map(String::from),
        )?;
        // torch's weight norm over dim 2: every kernel tap's [width, per] slice of v scaled to norm g[tap].
        // rms_norm gives v / sqrt(mean(v²)) over a tap's values, so the tap is then scaled by g / sqrt(count).
        let count = width * per;
        let v = b.weight_to_tensor(&layer.weight(1), DType::F32)?;
        let v = b.permute(&v.reshape(&[count, POS_CONV_KERNEL])?, &[1, 0])?;
        let v = b.rms_norm(&v, None, 0.0)?;
        let g = b.weight_to_tensor(&layer.weight(0), DType::F32)?.reshape(&[POS_CONV_KERNEL, 1])?;
        let g = b.affine(&g, (1.0 / (count as f64).sqrt()) as f32, 0.0)?;
        let w = b.binary(&v, &g, BinaryOp::Mul)?;
        let w = b.permute(&w, &[1, 0])?.reshape(&[width, per, 1, POS_CONV_KERNEL])?;
        let w = OwnedWeight::from_tensor(b, &w, DType::F32)?;
        let (w, bias) = (w.view(), layer.weight(2));

        let x = b.permute(x, &[0, 2, 1])?.reshape(&[batch, width, 1, n])?;
        let pad = POS_CONV_KERNEL / 2;
        let params = Conv2dParams { stride: 1, padding: [0, 0, pad, pad] };
        let groups = (0..POS_CONV_GROUPS)
            .map(|g| {
                let xs = b.slice(&x, 1, g * per, per)?;
                Ok(b.conv2d(&xs, &w.rows(g * per, per)?, Some(&bias.rows(g * per, per)?), params)?)
            })
            .collect::<Result<Vec<_>>>()?;
        let y = b.concat(&groups.iter().collect::<Vec<_>>(), 1)?;
        // The even kernel gives N + 1 outputs; ComfyUI drops the last.
        let y = b.slice(&y.reshape(&[batch, width, n + 1])?, 2, 0, n)?;
        let y = b.unary(&y, UnaryOp::Gelu)?;
        Ok(b.permute(&y, &[0, 2, 1])?)
    }

    /// Transformer layer `i` on x `[B, N, width]`.
    fn layer<B: Backend>(&self, b: &B, x: &Tensor<B>, i: usize) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let names = layer_names(i);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let layer = self.weights.fetch(b, &names)?;
        let w = |j: usize| layer.weight(j);
        let (batch, n) = (x.dim(0)?, x.dim(1)?);
        let attention = |h: &Tensor<B>| -> Result<Tensor<B>> {
            let heads = |t: Tensor<B>| -> Result<Tensor<B>> {
                Ok(b.permute(&t.reshape(&[batch, n, cfg.heads(), HEAD_DIM])?, &[0, 2, 1, 3])?)
            };
            let q = heads(b.linear(h, &w(0), Some(&w(1)))?)?;
            let k = heads(b.linear(h, &w(2), Some(&w(3)))?)?;
            let v = heads(b.linear(h, &w(4), Some(&w(5)))?)?;
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            let a = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
            let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[batch, n, cfg.width])?;
            Ok(b.linear(&a, &w(6), Some(&w(7)))?)
        };
        let feed_forward = |h: &Tensor<B>| -> Result<Tensor<B>> {
            let h = b.unary(&b.linear(h, &w(10), Some(&w(11)))?, UnaryOp::Gelu)?;
            Ok(b.linear(&h, &w(12), Some(&w(13)))?)
        };
        match cfg.variant {
            Variant::Large => {
                let h = b.layer_norm(x, Some(&w(8)), Some(&w(9)), NORM_EPS)?;
                let x = b.binary(x, &attention(&h)?, BinaryOp::Add)?;
                let h = b.layer_norm(&x, Some(&w(14)), Some(&w(15)), NORM_EPS)?;
                Ok(b.binary(&x, &feed_forward(&h)?, BinaryOp::Add)?)
            }
            Variant::Base => {
                let x = b.binary(x, &attention(x)?, BinaryOp::Add)?;
                let x = b.layer_norm(&x, Some(&w(8)), Some(&w(9)), NORM_EPS)?;
                let x = b.binary(&x, &feed_forward(&x)?, BinaryOp::Add)?;
                Ok(b.layer_norm(&x, Some(&w(14)), Some(&w(15)), NORM_EPS)?)
            }
        }
    }
}

/// The large model's input normalisation of x `[B, T]`, over every value at once:
/// `(x − mean) / sqrt(var + 1e-7)` with torch's unbiased variance. A LayerNorm over the `N` values gives
/// `(x − mean) / sqrt(var_biased + ε')`; with `ε' = 1e-7 · (N − 1) / N` that is the same ratio times
/// `sqrt(N / (N − 1))`, which is then taken back out.
fn normalize<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let count = x.numel();
    let flat = x.reshape(&[1, count])?;
    let ratio = (count as f64 - 1.0) / count as f64;
    let y = b.layer_norm(&flat, None, None, (NORMALIZE_EPS * ratio) as f32)?;
    Ok(b.affine(&y, ratio.sqrt() as f32, 0.0)?.reshape(x.shape())?)
}
