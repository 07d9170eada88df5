//! WanDancer (ComfyUI's `WAN22_WanDancer`, `comfy/ldm/wan/model_wandancer.py`): a Wan 2.1 I2V 14B body that
//! dances to music. Beside an I2V call's inputs it reads:
//!
//! - the music features of `WanDancerEncodeAudio` (`[1, frames, 35]`, 30 frames a second of the music's own
//!   clock): `music_projection`, then the music encoder's layers (pre-norm self-attention with 4 heads and a 1-D
//!   RoPE over the frames, a GELU feed-forward), then stretched bilinearly to 8 rows per latent frame and to the
//!   model's width. After blocks 0, 4, 8, 12, 16, 20, 24 and 27, injector j adds `o(v(row))` of each row, times
//!   `audio_inject_scale`, to its eighth of a latent frame's tokens: ComfyUI runs it as a cross-attention of the
//!   tokens on that single row, whose softmax is exactly 1, so the queries and keys drop out;
//! - the frame rate the music was measured at (`fps`): at 30 the plain patch embedding and head run; at any other
//!   (a song longer than the clip: 30 / k) the `_global` ones, and latent frame f sits at time position
//!   f · 30 / fps (the last at ⌊30 / fps · T + ½⌋ − 1);
//! - the reference image's CLIP states (`clip_vision_output_ref`), through their own projection
//!   (`img_emb_refimage`), before the first frame's in the image part of the cross-attention context.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::dtype::round_to;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Dancer, HEAD_DIM};
use super::model::{BlockAudio, BlockWeights, Grid, grid_positions, rope_tables};
use crate::error::{Error, Result};
use crate::rope::Rope;
use crate::rope::RopeOptions;
use crate::wan::Wan;

/// The frame rate of the plain patch embedding, head and RoPE (the music features' own).
const BASE_FPS: f64 = 30.0;
/// Music rows per latent frame after the stretch (ComfyUI's `latent_frames * 8`).
const ROWS_PER_FRAME: usize = 8;
/// The music encoder's LayerNorm ε (torch's default).
const MUSIC_EPS: f32 = 1e-5;
/// The music encoder's RoPE base θ.
const MUSIC_THETA: f64 = 10_000.0;

/// What a WanDancer call reads beyond an I2V call's inputs (`WAN22_WanDancer.extra_conds`).
pub struct DancerInput<'a, B: Backend> {
    /// The music features `[B or 1, frames, features]` (`audio_embed`); `None`: no music is injected.
    pub music: Option<&'a Tensor<B>>,
    /// The frame rate the music was measured at (`fps`; 30 when the conditioning has none).
    pub fps: f64,
    /// Scales the injected music (`audio_inject_scale`; 1 as trained).
    pub scale: f32,
    /// The reference image's CLIP penultimate states `[B or 1, n, clip]` (`clip_vision_output_ref`).
    pub clip_reference: Option<&'a Tensor<B>>,
}

impl<B: Backend> Default for DancerInput<'_, B> {
    fn default() -> Self {
        DancerInput { music: None, fps: BASE_FPS, scale: 1.0, clip_reference: None }
    }
}

impl<B: Backend> DancerInput<'_, B> {
    /// Whether the call runs the `_global` patch embedding, head and stretched RoPE: ComfyUI's
    /// `int(fps + 0.5) != 30`.
    fn global(&self) -> bool {
        (self.fps + 0.5).trunc() != BASE_FPS
    }
}

impl Wan {
    /// ComfyUI's `WanDancerModel` output for `input` (see the module's doc), f32 `[B, 16, T, H, W]`.
    pub(super) fn forward_dancer<B: Backend>(
        &self,
        b: &B,
        input: &super::WanInput<'_, B>,
        grid: &Grid,
        dancer: &Dancer,
    ) -> Result<Tensor<B>> {
        if input.causal.is_some() {
            return Err(Error::Invalid(
                "WanDancer runs whole clips, not block by block: choose another sampler".to_owned(),
            ));
        }
        if input.reference.is_some() {
            // ComfyUI's WanDancerModel encodes RoPE for the video's tokens only, so a reference latent's
            // tokens before them cannot run there either.
            return Err(Error::Invalid(
                "WanDancer does not read a reference latent (ReferenceLatent): remove it"
                    .to_owned(),
            ));
        }
        let plain = DancerInput::default();
        let call = input.dancer.as_ref().unwrap_or(&plain);
        let suffix = if call.global() { "_global" } else { "" };
        let d = self.config.dim;

        let tokens = self.patch_embedding(b, input.x, grid, &format!("patch_embedding{suffix}"))?;
        let (e, e0) = self.time_embedding(b, input.timesteps)?;
        let text = self.text_embedding(b, input.context)?;
        let music = match call.music {
            Some(music) => Some(self.music_rows(b, dancer, music, grid)?),
            None => None,
        };
        let image = self.image_embedding(b, input.clip, grid.batch)?;
        let reference = match call.clip_reference {
            Some(clip) => {
                let n = match *clip.shape() {
                    [cb, n, width]
                        if (cb == 1 || cb == grid.batch) && n > 0 && width == dancer.clip_dim =>
                    {
                        n
                    }
                    ref other => {
                        return Err(Error::Invalid(format!(
                            "WanDancer's reference CLIP vision states must be [{} or 1, N > 0, {}] (a CLIP \
                             vision model such as clip_vision_h), got {other:?}",
                            grid.batch, dancer.clip_dim
                        )));
                    }
                };
                let clip = b.cast(clip, b.compute_dtype())?;
                Some((self.clip_projection(b, "img_emb_refimage", &clip, grid.batch)?, n))
            }
            None => None,
        };
        // ComfyUI's context: [reference image ; first frame ; text], the image part both CLIP projections'.
        let image = match (reference, image) {
            (Some((r, nr)), Some((c, nc))) => Some((b.concat(&[&r, &c], 1)?, nr + nc)),
            (one, None) | (None, one) => one,
        };
        let positions = dancer_positions(&input.rope, call, grid);
        let (cos, sin) = rope_tables(&positions);
        let rope = Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)?;

        let mut samples = Vec::with_capacity(grid.batch);
        let mut contexts = Vec::with_capacity(grid.batch);
        let mut rows = Vec::with_capacity(grid.batch);
        for s in 0..grid.batch {
            samples.push(b.slice(&tokens, 0, s, 1)?);
            // Without either CLIP input ComfyUI's dancer passes `context_img_len` 0: the image attention reads
            // no tokens (a plain Wan I2V call reads the text there instead).
            contexts.push(match &image {
                Some(_) => self.context(b, &text, image.as_ref(), s..s + 1)?,
                None => self.text_context(b, &text, s)?,
            });
            if let Some(music) = &music {
                rows.push(b.slice(music, 0, s % music.dim(0)?, 1)?);
            }
        }
        drop((tokens, text, image, music));

        for i in 0..self.config.layers {
            // A skipped block (SkipLayerGuidanceDiT) passes its input on; the injector after it still runs.
            if i >= 64 || input.skip & (1u64 << i) == 0 {
                let layer = self.block_layer(b, i)?;
                let prefix = format!("blocks.{i}");
                let w = BlockWeights::new(&layer, &prefix);
                let table = b.weight_to_tensor(&w.get("modulation")?, e0.dtype())?;
                for (s, x) in samples.iter_mut().enumerate() {
                    let m =
                        super::model::sample_modulation(b, &e0, &table, s..s + 1, grid.groups, d)?;
                    *x = self.block(b, &w, x, &m, &contexts[s], &rope, None, BlockAudio::Silent)?;
                }
            }
            let injector = Dancer::INJECTED_BLOCKS[..dancer.injectors].iter().position(|&l| l == i);
            if let (Some(j), false) = (injector, rows.is_empty()) {
                for (x, rows) in samples.iter_mut().zip(&rows) {
                    *x = self.inject_music(b, j, x, rows, call.scale)?;
                }
            }
        }
        drop((contexts, rows));

        let head = self.head_weights_under(b, &format!("head{suffix}"))?;
        self.sample_heads(b, &head, &e, samples, 0, grid)
    }

    /// The music features `[n, frames, features]` through the projection and the music encoder, stretched to
    /// `[n, 8·T, D]` (ComfyUI's bilinear `interpolate` over frames and width, corners not aligned).
    fn music_rows<B: Backend>(
        &self,
        b: &B,
        dancer: &Dancer,
        music: &Tensor<B>,
        grid: &Grid,
    ) -> Result<Tensor<B>> {
        let (n, frames) = match *music.shape() {
            [n, frames, f] if (n == 1 || n == grid.batch) && frames > 0 && f == dancer.features => {
                (n, frames)
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "WanDancer reads music features of [{} or 1, frames > 0, {}] (WanDancerEncodeAudio's), got \
                     {other:?}",
                    grid.batch, dancer.features
                )));
            }
        };
        let tokens = grid.rows * grid.cols;
        if !tokens.is_multiple_of(ROWS_PER_FRAME) {
            return Err(Error::Invalid(format!(
                "WanDancer injects the music into eighths of a latent frame's {tokens} tokens ({} × {} patches): \
                 choose a size whose latent has a multiple of 8 patches a frame (e.g. width and height multiples \
                 of 32 and 64)",
                grid.rows, grid.cols
            )));
        }
        let m = &self.weights;
        let width = dancer.width;
        let head_dim = width / Dancer::HEADS;
        let x = b.cast(music, b.compute_dtype())?;
        let mut x = crate::named::linear(b, m, "music_projection", &x)?;
        // ComfyUI makes the positions in the features' type (the compute type): past 2048 in f16 (256 in bf16)
        // they round.
        let dtype = b.compute_dtype();
        let ids: Vec<[f64; 1]> =
            (0..frames).map(|p| [f64::from(round_to(dtype, p as f32))]).collect();
        let (cos, sin) = crate::rope::tables_at(&ids, [head_dim], MUSIC_THETA);
        let cos = b.from_f32(&[frames, head_dim / 2], &cos, DType::F32)?;
        let sin = b.from_f32(&[frames, head_dim / 2], &sin, DType::F32)?;
        for l in 0..dancer.layers {
            let at = |name: &str| format!("music_encoder.{l}.{name}");
            let names = [
                "norm1.weight",
                "norm1.bias",
                "self_attn.in_proj_weight",
                "self_attn.in_proj_bias",
                "self_attn.out_proj.weight",
                "self_attn.out_proj.bias",
                "norm2.weight",
                "norm2.bias",
                "linear1.weight",
                "linear1.bias",
                "linear2.weight",
                "linear2.bias",
            ]
            .map(at);
            let layer = crate::named::fetch(b, m, &names)?;
            let w = |i: usize| layer.weight(i);
            let h = b.layer_norm(&x, Some(&w(0)), Some(&w(1)), MUSIC_EPS)?;
            let qkv = b.linear(&h, &w(2), Some(&w(3)))?;
            let heads = |k: usize, rotate: bool| -> Result<Tensor<B>> {
                let t = b.slice(&qkv, 2, k * width, width)?.reshape(&[
                    n,
                    frames,
                    Dancer::HEADS,
                    head_dim,
                ])?;
                let t = if rotate { b.rope(&t, &cos, &sin, RopeLayout::Interleaved)? } else { t };
                Ok(b.permute(&t, &[0, 2, 1, 3])?)
            };
            let (q, k, v) = (heads(0, true)?, heads(1, true)?, heads(2, false)?);
            let scale = 1.0 / (head_dim as f32).sqrt();
            let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
            let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[n, frames, width])?;
            x = b.binary(&x, &b.linear(&o, &w(4), Some(&w(5)))?, BinaryOp::Add)?;
            let h = b.layer_norm(&x, Some(&w(6)), Some(&w(7)), MUSIC_EPS)?;
            let h = b.unary(&b.linear(&h, &w(8), Some(&w(9)))?, UnaryOp::Gelu)?;
            x = b.binary(&x, &b.linear(&h, &w(10), Some(&w(11)))?, BinaryOp::Add)?;
        }
        let host = b.to_f32(&b.cast(&x, DType::F32)?)?;
        let rows = ROWS_PER_FRAME * grid.frames;
        let d = self.config.dim;
        let mut stretched = Vec::with_capacity(n * rows * d);
        for sample in host.chunks_exact(frames * width) {
            stretched.extend(crate::interpolate::bilinear(sample, [frames, width], [rows, d]));
        }
        Ok(b.from_f32(&[n, rows, d], &stretched, b.compute_dtype())?)
    }

    /// Injector `j` on one sample's tokens `x` `[1, N, D]`: `o(v(row))` of each of `rows` `[1, 8·T, D]`, times
    /// `scale`, added to its run of N / (8·T) tokens.
    fn inject_music<B: Backend>(
        &self,
        b: &B,
        j: usize,
        x: &Tensor<B>,
        rows: &Tensor<B>,
        scale: f32,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let prefix = format!("music_injector.injector.{j}");
        let v = crate::named::linear(b, m, &format!("{prefix}.v"), rows)?;
        let out = crate::named::linear(b, m, &format!("{prefix}.o"), &v)?;
        let out = if scale == 1.0 { out } else { b.affine(&out, scale, 0.0)? };
        let (count, tokens, d) = (rows.dim(1)?, x.dim(1)?, self.config.dim);
        let runs = x.reshape(&[count, tokens / count, d])?;
        let added = b.binary(&runs, &out.reshape(&[count, 1, d])?, BinaryOp::Add)?;
        Ok(added.reshape(&[1, tokens, d])?)
    }
}

/// The positions of a WanDancer call's tokens: the plain grid's at 30 frames a second; otherwise latent frame f
/// at f · 30 / fps after `ScaleROPE`'s time shift (computed in float32 as ComfyUI's `arange · time_scale`), the
/// last at ⌊30 / fps · T + ½⌋ − 1 after the shift, rows and columns as the plain grid's.
fn dancer_positions<B: Backend>(
    options: &RopeOptions,
    call: &DancerInput<'_, B>,
    grid: &Grid,
) -> Vec<[f64; 3]> {
    let plain = grid_positions(options, 0, grid.frames, grid.rows, grid.cols);
    if !call.global() {
        return plain;
    }
    let time_scale = BASE_FPS / call.fps;
    let start = options.shift[0] as f32;
    let mut times: Vec<f32> =
        (0..grid.frames).map(|f| f as f32 * time_scale as f32 + start).collect();
    let total = (time_scale * grid.frames as f64 + 0.5).trunc();
    if let Some(last) = times.last_mut() {
        *last = (options.shift[0] + total - 1.0) as f32;
    }
    let per_frame = grid.rows * grid.cols;
    plain
        .into_iter()
        .enumerate()
        .map(|(k, [_, i, j])| [f64::from(times[k / per_frame]), i, j])
        .collect()
}
