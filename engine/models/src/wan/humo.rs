//! HuMo's parts of the Wan forward pass (ComfyUI's `HumoWanModel`, `WAN21_HuMo`): the audio projection, the
//! reference latent's tokens after the video's, each block's audio cross-attention, and the conditioning
//! channels the 17B model reads beside the noisy latent.
//!
//! The audio embedding `[B, F, 8, 5, C]` (one window of Whisper features per latent frame, from
//! `WanHuMoImageToVideo`) is padded with zero windows for the reference's frames, then `audio_proj` makes 16
//! tokens of each frame's window (two ReLU layers, a linear one, a LayerNorm). In every block, after the text
//! cross-attention, each latent frame's tokens attend to their frame's 16 audio tokens only (ComfyUI's gather
//! attention reshapes the sequence into as many equal groups as the audio has frames).

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::{Backend, Tensor};

use super::config::{AUDIO_ATTENTION, HEAD_DIM, Humo};
use super::model::{BlockWeights, Grid, Wan};
use crate::error::{Error, Result};

/// LayerNorm ε of `audio_proj`'s norm (torch's default).
const PROJECTION_EPS: f32 = 1e-5;

/// The 16 latent channels HuMo 17B reads beside the noisy latent and the 4 zero mask channels, per frame: the
/// first frame's, the second's, then every later frame's (ComfyUI's `zero_vae_values_first`, `_second` and
/// `zero_vae_values`: the Wan 2.1 VAE's latents of an empty video, in the model's space).
const ZERO_VIDEO: [[f32; LATENT_CHANNELS]; 3] = [
    [
        0.8660, -0.4326, -0.0017, -0.4884, -0.5283, 0.9207, -0.9896, 0.4433, -0.5543, -0.0113,
        0.5753, -0.6000, -0.8346, -0.3497, -0.1926, -0.6938,
    ],
    [
        1.0869, -1.2370, 0.0206, -0.4357, -0.6411, 2.0307, -1.5972, 1.2659, -0.8595, -0.4654,
        0.9638, -1.6330, -1.4310, -0.1098, -0.3856, -1.4583,
    ],
    [
        0.8642, -1.8583, 0.1577, 0.1350, -0.3641, 2.5863, -1.9670, 1.6065, -1.0475, -0.8678,
        1.1734, -1.8138, -1.5933, -0.7721, -0.3289, -1.3745,
    ],
];

/// Mask channels before [`ZERO_VIDEO`]'s (zeros).
const MASK_CHANNELS: usize = 4;
/// The Wan 2.1 latent's channels.
const LATENT_CHANNELS: usize = 16;

/// The channels beside the noisy latent of HuMo 17B for latents `[batch, _, frames, h, w]`, as ComfyUI's
/// `WAN21_HuMo.extra_conds` replaces `c_concat`: 4 zero channels, then the empty video's 16 per frame
/// (`ZERO_VIDEO`); values `[batch, 20, frames, h, w]`.
pub fn concat_channels(batch: usize, frames: usize, h: usize, w: usize) -> Vec<f32> {
    let plane = h * w;
    let mut one = vec![0.0f32; MASK_CHANNELS * frames * plane];
    for c in 0..LATENT_CHANNELS {
        for per_frame in (0..frames).map(|f| &ZERO_VIDEO[f.min(2)]) {
            one.extend(std::iter::repeat_n(per_frame[c], plane));
        }
    }
    one.repeat(batch)
}

/// The conditioning channels [`concat_channels`] makes.
pub const CONCAT_CHANNELS: usize = MASK_CHANNELS + LATENT_CHANNELS;

impl Wan {
    /// HuMo's reference latent as tokens `[B', T·rows·cols, D]` with its frames T, for a HuMo model given one:
    /// `[B', 16, T, H, W]` in the model's space at the latent's size (sample s reads row s mod B'); the 17B
    /// model reads it as 36 channels (16 zeros, 4 ones, then the latent), as ComfyUI's `WAN21_HuMo` builds them.
    pub(super) fn humo_reference<B: Backend>(
        &self,
        b: &B,
        reference: Option<&Tensor<B>>,
        grid: &Grid,
    ) -> Result<Option<(Tensor<B>, usize)>> {
        let (Some(_), Some(reference)) = (self.config.humo, reference) else {
            return Ok(None);
        };
        let latent = self.config.out_channels;
        let (n, frames) = match *reference.shape() {
            [n, c, t, h, w] if n > 0 && c == latent && t > 0 && (h, w) == (grid.h, grid.w) => {
                (n, t)
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "{} reads a reference latent of [B, {latent}, T, {}, {}] (WanHuMoImageToVideo's), got \
                     {other:?}",
                    self.config.variant(),
                    grid.h,
                    grid.w
                )));
            }
        };
        if grid.groups != 1 {
            return Err(Error::Invalid(
                "HuMo takes one timestep per sample, not one per frame".to_owned(),
            ));
        }
        let x = match self.config.in_channels - latent {
            0 => reference.clone(),
            extra if extra == MASK_CHANNELS + latent => {
                let (h, w, dtype) = (grid.h, grid.w, reference.dtype());
                let zeros = b.full(&[n, latent, frames, h, w], 0.0, dtype)?;
                let ones = b.full(&[n, MASK_CHANNELS, frames, h, w], 1.0, dtype)?;
                b.concat(&[&zeros, &ones, reference], 1)?
            }
            extra => {
                return Err(Error::Invalid(format!(
                    "{} reads {extra} channels beside the latent; HuMo's reference fills 0 or {}",
                    self.config.variant(),
                    MASK_CHANNELS + latent
                )));
            }
        };
        let ref_grid = Grid { batch: n, frames, ..*grid };
        Ok(Some((self.patch_embedding(b, &x, &ref_grid, "patch_embedding")?, frames)))
    }

    /// HuMo's audio tokens `[B', F·tokens, audio_dim]` of the audio embedding `[B', F, 8, 5, C]` (F latent
    /// frames; sample s reads row s mod B', as ComfyUI repeats a conditioning to the batch), its windows first
    /// padded with `extra_frames` zero windows (the reference's frames), through `audio_proj`; `None` for a
    /// model without the branch or no audio.
    pub(super) fn humo_audio<B: Backend>(
        &self,
        b: &B,
        audio: Option<&Tensor<B>>,
        extra_frames: usize,
    ) -> Result<Option<Tensor<B>>> {
        let (Some(humo), Some(audio)) = (self.config.humo, audio) else { return Ok(None) };
        let (n, frames) = match *audio.shape() {
            [n, f, window, groups, c]
                if n > 0 && f > 0 && window * groups * c == humo.input_width() =>
            {
                (n, f)
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "{} reads an audio embedding of [B, frames, {}, {}, {}] (WanHuMoImageToVideo's), got \
                     {other:?}",
                    self.config.variant(),
                    Humo::WINDOW,
                    Humo::GROUPS,
                    humo.channels
                )));
            }
        };
        let width = humo.input_width();
        let x = b.cast(audio, b.compute_dtype())?.reshape(&[n, frames, width])?;
        let x = match extra_frames {
            0 => x,
            extra => {
                let zeros = b.full(&[n, extra, width], 0.0, x.dtype())?;
                b.concat(&[&x, &zeros], 1)?
            }
        };
        let frames = frames + extra_frames;
        let names: Vec<String> = ["1", "2", "3", "norm"]
            .iter()
            .flat_map(|i| {
                crate::named::weight_and_bias(&format!("audio_proj.audio_proj_glob_{i}.layer"))
            })
            .collect();
        let layer = crate::named::fetch(b, &self.weights, &names)?;
        let w = |i: usize| layer.weight(i);
        let x = b.unary(&b.linear(&x, &w(0), Some(&w(1)))?, UnaryOp::Relu)?;
        let x = b.unary(&b.linear(&x, &w(2), Some(&w(3)))?, UnaryOp::Relu)?;
        let x = b.linear(&x, &w(4), Some(&w(5)))?;
        let x = x.reshape(&[n, frames * humo.tokens, humo.audio_dim])?;
        Ok(Some(b.layer_norm(&x, Some(&w(6)), Some(&w(7)), PROJECTION_EPS)?))
    }

    /// A HuMo block's audio cross-attention on one sample's tokens `x` `[1, N, D]` with its audio tokens
    /// `audio` `[1, F·tokens, audio_dim]`: x + o(attention of each of F equal groups of the normed tokens to
    /// its frame's audio tokens).
    pub(super) fn audio_attention<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        audio: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let Some(humo) = self.config.humo else { return Ok(x.clone()) };
        let (heads, d) = (self.config.heads, self.config.dim);
        let tokens = x.dim(1)?;
        let frames = audio.dim(1)? / humo.tokens;
        if frames == 0 || !tokens.is_multiple_of(frames) {
            return Err(Error::Invalid(format!(
                "HuMo's audio embedding covers {frames} latent frames (the reference's included), which do not \
                 split the {tokens} tokens of the video and its reference evenly, as ComfyUI's HuMo needs: \
                 WanHuMoImageToVideo without audio makes one frame more than the video has (as ComfyUI's \
                 does), so connect its audio_encoder_output; otherwise make the latent with the same \
                 WanHuMoImageToVideo"
            )));
        }
        let wrapper = |name: &str| w.get(&format!("{AUDIO_ATTENTION}.{name}"));
        let attn = |name: &str| wrapper(&format!("audio_cross_attn.{name}"));
        let h = b.layer_norm(
            x,
            Some(&wrapper("norm1_audio.weight")?),
            Some(&wrapper("norm1_audio.bias")?),
            self.config.eps,
        )?;
        let project = |t: &Tensor<B>, p: &str, norm: bool| -> Result<Tensor<B>> {
            let mut t =
                b.linear(t, &attn(&format!("{p}.weight"))?, Some(&attn(&format!("{p}.bias"))?))?;
            if norm {
                t = b.rms_norm(&t, Some(&attn(&format!("norm_{p}.weight"))?), self.config.eps)?;
            }
            Ok(t)
        };
        // [1, N, D] → [F, N / F, H, 128] → [F, H, N / F, 128]: frame f's tokens, and its audio tokens alike.
        let grouped = |t: Tensor<B>, per: usize| -> Result<Tensor<B>> {
            let t = t.reshape(&[frames, per, heads, HEAD_DIM])?;
            Ok(b.permute(&t, &[0, 2, 1, 3])?)
        };
        let q = grouped(project(&h, "q", true)?, tokens / frames)?;
        drop(h);
        let k = grouped(project(audio, "k", true)?, humo.tokens)?;
        let v = grouped(project(audio, "v", false)?, humo.tokens)?;
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let o = b.attention(&q, &k, &v, kiln_compute::backend::AttentionMask::None, scale)?;
        drop((q, k, v));
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[1, tokens, d])?;
        let y = b.linear(&o, &attn("o.weight")?, Some(&attn("o.bias")?))?;
        Ok(b.binary(x, &y, BinaryOp::Add)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_17b_conditioning_is_zero_mask_then_each_frames_empty_video_latent() {
        let (frames, plane) = (4, 2);
        let values = concat_channels(2, frames, 1, plane);
        assert_eq!(values.len(), 2 * CONCAT_CHANNELS * frames * plane);
        let at =
            |s: usize, c: usize, f: usize| values[((s * CONCAT_CHANNELS + c) * frames + f) * plane];
        assert_eq!(at(0, 3, 2), 0.0);
        assert_eq!(at(1, 4, 0), 0.8660);
        assert_eq!(at(1, 4, 1), 1.0869);
        assert_eq!(at(0, 4, 2), 0.8642);
        assert_eq!(at(0, 19, 3), -1.3745);
    }
}
