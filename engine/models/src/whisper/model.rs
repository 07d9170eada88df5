//! [`Whisper`]: the encoder over a batch of log-mel features, as ComfyUI's `AudioEncoder` runs it.
//!
//! Two convolutions over time (kernel 3: the first padded to keep the 3000 frames, the second stride 2 to
//! [`POSITIONS`]), each followed by exact GELU, plus the learnt position table, then pre-LayerNorm layers
//! (self-attention in [`HEADS`] heads with a bias-free key projection, an MLP four times wide with exact GELU,
//! each added back) and a final LayerNorm.
//!
//! Invariant: everything runs in f32 whatever the backend's compute type, as ComfyUI runs it (the features are
//! f32 and its manual-cast layers cast the weights to the input's type). The convolutions are the backend's 2-D
//! convolution on a height of 1.

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Config, HEADS, LAYER_NORM_EPS, POSITIONS, layer_names};
use super::features::{FRAMES, SAMPLE_RATE, log_mel};
use crate::audio_encoding::{AudioEncoding, EncoderStates};
use crate::error::{Error, Result};
use crate::resample::resample_clips;

/// A loaded Whisper encoder: its config and its weights (named without the encoder's prefix) under the
/// memory manager.
#[derive(Debug)]
pub struct Whisper {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl Whisper {
    /// The encoder made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> Whisper {
        Whisper { config, weights }
    }

    /// ComfyUI's `encode_audio`: `audio` `[B, C, T]` (row-major) at `sample_rate` resampled to 16 kHz per
    /// channel as torchaudio does, its log-mel features, and the encoder.
    pub fn encode_audio<B: Backend>(
        &self,
        b: &B,
        audio: &[f32],
        shape: [usize; 3],
        sample_rate: u32,
    ) -> Result<AudioEncoding<B>> {
        let [batch, channels, _] = shape;
        let (resampled, resampled_len) = resample_clips(audio, shape, sample_rate, SAMPLE_RATE)?;
        let features = log_mel(&resampled, [batch, channels, resampled_len], self.config.mels)?;
        let mel = b.from_f32(&[batch, self.config.mels, FRAMES], &features, DType::F32)?;
        Ok(AudioEncoding { output: self.forward(b, &mel)?, samples: resampled_len })
    }

    /// The encoder on log-mel features `mel` `[B, mels, FRAMES]` ([`super::log_mel`]).
    pub fn forward<B: Backend>(&self, b: &B, mel: &Tensor<B>) -> Result<EncoderStates<B>> {
        let cfg = &self.config;
        let batch = match *mel.shape() {
            [batch, mels, FRAMES] if batch > 0 && mels == cfg.mels => batch,
            ref other => {
                return Err(Error::Invalid(format!(
                    "the Whisper encoder takes log-mel features [B, {}, {FRAMES}], got {other:?}",
                    cfg.mels
                )));
            }
        };
        let x = b.cast(mel, DType::F32)?.reshape(&[batch, cfg.mels, 1, FRAMES])?;
        let x = b.unary(&self.conv(b, &x, "conv1", 1)?, UnaryOp::Gelu)?;
        let x = b.unary(&self.conv(b, &x, "conv2", 2)?, UnaryOp::Gelu)?;
        let x = b.permute(&x.reshape(&[batch, cfg.width, POSITIONS])?, &[0, 2, 1])?;
        let positions = self.weights.fetch(b, &["embed_positions.weight"])?;
        let mut x =
            b.binary(&x, &b.weight_to_tensor(&positions.weight(0), DType::F32)?, BinaryOp::Add)?;
        drop(positions);
        let mut states = Vec::with_capacity(cfg.layers + 1);
        for i in 0..cfg.layers {
            states.push(x.clone());
            x = self.layer(b, &x, i)?;
        }
        let norm = self.weights.fetch(b, &["layer_norm.weight", "layer_norm.bias"])?;
        let last =
            b.layer_norm(&x, Some(&norm.weight(0)), Some(&norm.weight(1)), LAYER_NORM_EPS)?;
        states.push(last.clone());
        Ok(EncoderStates { last, states })
    }

    /// The convolution `name` (kernel 3, padding 1) with `stride` along time, on x `[B, C, 1, T]`.
    fn conv<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        name: &str,
        stride: usize,
    ) -> Result<Tensor<B>> {
        let layer = crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias(name))?;
        let w = layer.weight(0);
        let &[out, channels, kernel] = w.shape() else {
            return Err(Error::Invalid(format!(
                "`{name}.weight` is {:?}, not [O, C, K]",
                w.shape()
            )));
        };
        let w = w.reshape(&[out, channels, 1, kernel])?;
        let params = Conv2dParams { stride, padding: [0, 0, 1, 1] };
        Ok(b.conv2d(x, &w, Some(&layer.weight(1)), params)?)
    }

    /// Encoder layer `i` on x `[B, N, width]`: pre-LayerNorm self-attention, then the pre-LayerNorm MLP, each
    /// added back to the residual.
    fn layer<B: Backend>(&self, b: &B, x: &Tensor<B>, i: usize) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let names = layer_names(i);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let layer = self.weights.fetch(b, &names)?;
        let w = |j: usize| layer.weight(j);
        let (batch, n) = (x.dim(0)?, x.dim(1)?);

        let h = b.layer_norm(x, Some(&w(0)), Some(&w(1)), LAYER_NORM_EPS)?;
        let heads = |t: Tensor<B>| -> Result<Tensor<B>> {
            Ok(b.permute(&t.reshape(&[batch, n, HEADS, cfg.head_dim()])?, &[0, 2, 1, 3])?)
        };
        let q = heads(b.linear(&h, &w(2), Some(&w(3)))?)?;
        let k = heads(b.linear(&h, &w(4), None)?)?;
        let v = heads(b.linear(&h, &w(5), Some(&w(6)))?)?;
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let a = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
        let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[batch, n, cfg.width])?;
        let x = b.binary(x, &b.linear(&a, &w(7), Some(&w(8)))?, BinaryOp::Add)?;

        let h = b.layer_norm(&x, Some(&w(9)), Some(&w(10)), LAYER_NORM_EPS)?;
        let h = b.unary(&b.linear(&h, &w(11), Some(&w(12)))?, UnaryOp::Gelu)?;
        Ok(b.binary(&x, &b.linear(&h, &w(13), Some(&w(14)))?, BinaryOp::Add)?)
    }
}
