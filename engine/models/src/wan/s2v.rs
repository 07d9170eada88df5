//! Wan 2.2 S2V (speech to video; ComfyUI's `WanModel_S2V`, `WAN22_S2V`): a Wan 2.1 T2V body that also reads
//! wav2vec2's states, a reference latent, the latent of the frames before the clip and a control video.
//!
//! - The video's patch tokens get `cond_encoder` of the control video and `trainable_cond_mask` row 0; the
//!   reference's tokens (row 1) follow at the frames from max(30, T + 9); the motion latent's last 19 frames
//!   (zeros in front of a shorter one) are packed by `frame_packer` into 1 frame of 2×2 patches, 2 frames of
//!   4×4 and 16 of 8×8 (row 2), at frames −1, −3 and −19…−16, their rows and columns spread over the
//!   video's.
//! - Timesteps: the sample's for each video frame, 0 for each reference frame; with a motion latent each of
//!   those twice, then 3 zeros; the tokens share them out as ComfyUI's `repeat_e` does (a timestep's tokens
//!   need not be a frame's), so a block's modulation applies in runs of tokens.
//! - Audio: the encoder states weighed by `softmax`-like SiLU weights into one, then causal 1-D convolutions
//!   (4 audio frames per latent frame) give each latent frame 4 tokens and a padding token, and one global
//!   vector. After the blocks of [`INJECTED_BLOCKS`], each latent frame's video tokens, layer-normed and
//!   scaled and shifted by the global vector (AdaLN), attend to that frame's audio tokens, and the result is
//!   added to them.
//!
//! ComfyUI fixes the encoder's 25 states, 4 tokens and the injected blocks' list; Kiln reads the counts from
//! the file and takes injector i to the list's i-th block.

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, UnaryOp};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{HEAD_DIM, PATCH};
use super::model::{
    BlockAudio, BlockWeights, Grid, Wan, WanInput, grid_positions, modulation, rope_tables,
};
use crate::error::{Error, Result};
use crate::header::Header;
use crate::latent_tokens;
use crate::rope::Rope;
use crate::rope::RopeOptions;

/// The blocks whose output the audio injectors change, injector i after block `INJECTED_BLOCKS[i]`
/// (ComfyUI's `audio_inject_layers`).
pub const INJECTED_BLOCKS: [usize; 12] = [0, 4, 8, 12, 16, 20, 24, 27, 30, 33, 36, 39];
/// The motion latent's frames the packer reads (the last ones), and how it groups them, farthest first: 16
/// frames in 4 × 8 × 8 patches, 2 in 2 × 4 × 4, the nearest in 1 × 2 × 2.
const PACKED_FRAMES: usize = 19;
const PACKS: [(&str, usize, usize, usize, isize); 3] = [
    // (weight, frames, frames a patch, side of a patch, first RoPE frame)
    ("frame_packer.proj_4x", 16, 4, 8, -19),
    ("frame_packer.proj_2x", 2, 2, 4, -3),
    ("frame_packer.proj", 1, 1, 2, -1),
];
/// Timesteps the packed motion adds after the doubled ones.
const PACKED_TIMESTEPS: usize = 3;
/// Audio frames per latent frame the audio encoder reads.
const AUDIO_FRAMES_PER_LATENT: usize = 4;
/// The reference's first RoPE frame is at least this (ComfyUI's `max(30, time + 9)`).
const REFERENCE_FRAME: usize = 30;
/// LayerNorm ε of the audio encoder's norms, and of the injectors' AdaLN.
const ENCODER_EPS: f32 = 1e-6;
const ADAIN_EPS: f32 = 1e-5;

/// S2V's widths beside the Wan body's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S2v {
    /// Width of the audio encoder's states (wav2vec2 large's 1024).
    pub audio_dim: usize,
    /// Encoder states it weighs together (25: wav2vec2 large's layers and its input).
    pub audio_layers: usize,
    /// Audio tokens per latent frame before the padding token (4).
    pub audio_tokens: usize,
    /// Audio injectors (12).
    pub injectors: usize,
    /// Channels of the control video latent `cond_encoder` reads (16).
    pub cond_channels: usize,
}

const ENCODER: &str = "casual_audio_encoder";

/// S2V's parts from the shapes (`casual_audio_encoder.encoder.final_linear.weight` marks it, as in ComfyUI's
/// detection), `None` for a model without them.
pub(super) fn s2v_config(h: &Header, dim: usize) -> Result<Option<S2v>> {
    if !h.has(&format!("{ENCODER}.encoder.final_linear.weight")) {
        return Ok(None);
    }
    let weights = format!("{ENCODER}.weights");
    let local = format!("{ENCODER}.encoder.conv1_local.conv.weight");
    let cond = "cond_encoder.weight";
    let config = match (h.shape(&weights), h.shape(&local), h.shape(cond)) {
        (Some(&[1, layers, 1, 1]), Some(&[rows, audio_dim, 3]), Some(&[_, c, 1, PATCH, PATCH]))
            if dim >= 4 && dim.is_multiple_of(4) && rows.is_multiple_of(dim / 4) =>
        {
            S2v {
                audio_dim,
                audio_layers: layers,
                audio_tokens: rows / (dim / 4),
                injectors: h.count_blocks("audio_injector.injector."),
                cond_channels: c,
            }
        }
        (w, l, c) => {
            return Err(h.unsupported(format!(
                "a Wan 2.2 S2V model whose `{weights}` is {w:?}, `{local}` {l:?} and `{cond}` {c:?}: expected \
                 [1, layers, 1, 1], [dim / 4 · tokens, width, 3] and [dim, channels, 1, 2, 2]"
            )));
        }
    };
    if config.injectors == 0 || config.injectors > INJECTED_BLOCKS.len() {
        return Err(h.unsupported(format!(
            "a Wan 2.2 S2V model with {} audio injectors (ComfyUI places at most {})",
            config.injectors,
            INJECTED_BLOCKS.len()
        )));
    }
    Ok(Some(config))
}

/// S2V's weights outside the blocks, by ComfyUI name, with their shapes.
pub(super) fn s2v_shapes(d: usize, s2v: &S2v) -> Vec<(String, Vec<usize>)> {
    let (a, quarter, half) = (s2v.audio_dim, d / 4, d / 2);
    let mut out = vec![
        ("trainable_cond_mask.weight".to_owned(), vec![3, d]),
        (format!("{ENCODER}.weights"), vec![1, s2v.audio_layers, 1, 1]),
        (format!("{ENCODER}.encoder.padding_tokens"), vec![1, 1, 1, d]),
    ];
    let mut with_bias = |name: String, shape: Vec<usize>| {
        out.push((format!("{name}.bias"), vec![shape[0]]));
        out.push((format!("{name}.weight"), shape));
    };
    let conv = |name: &str| format!("{ENCODER}.encoder.{name}.conv");
    with_bias(conv("conv1_local"), vec![quarter * s2v.audio_tokens, a, 3]);
    with_bias(conv("conv1_global"), vec![quarter, a, 3]);
    with_bias(conv("conv2"), vec![half, quarter, 3]);
    with_bias(conv("conv3"), vec![d, half, 3]);
    with_bias(format!("{ENCODER}.encoder.final_linear"), vec![d, d]);
    with_bias("cond_encoder".to_owned(), vec![d, s2v.cond_channels, 1, PATCH, PATCH]);
    for (name, _, depth, side, _) in PACKS {
        with_bias(name.to_owned(), vec![d, LATENT_CHANNELS, depth, side, side]);
    }
    for j in 0..s2v.injectors {
        for p in ["q", "k", "v", "o"] {
            with_bias(format!("audio_injector.injector.{j}.{p}"), vec![d, d]);
        }
        with_bias(format!("audio_injector.injector_adain_layers.{j}.linear"), vec![2 * d, d]);
    }
    for j in 0..s2v.injectors {
        out.push((format!("audio_injector.injector.{j}.norm_q.weight"), vec![d]));
        out.push((format!("audio_injector.injector.{j}.norm_k.weight"), vec![d]));
    }
    out
}

/// The channels of the latents S2V packs (the Wan 2.1 VAE's).
const LATENT_CHANNELS: usize = 16;

/// What an S2V model's tokens are, per sample: the video's, then the reference's and the packed motion's.
struct Stream<B: Backend> {
    /// `[1, N, D]`.
    tokens: Tensor<B>,
    /// The reference's latent frames (0 without one).
    reference_frames: usize,
    /// Whether the motion latent was packed after them.
    motion: bool,
}

impl Wan {
    /// ComfyUI's `WanModel_S2V` output for `input` (see the module's doc), f32 `[B, 16, T, H, W]`.
    pub(super) fn forward_s2v<B: Backend>(
        &self,
        b: &B,
        input: &WanInput<'_, B>,
        grid: &Grid,
        s2v: &S2v,
    ) -> Result<Tensor<B>> {
        if input.causal.is_some() || grid.groups != 1 {
            return Err(Error::Invalid(
                "Wan 2.2 S2V runs with one timestep per sample, not block by block or per frame"
                    .to_owned(),
            ));
        }
        let cfg = &self.config;
        let d = cfg.dim;
        let row =
            |t: &Tensor<B>, s: usize| -> Result<Tensor<B>> { Ok(b.slice(t, 0, s % t.dim(0)?, 1)?) };
        let mask = {
            let layer =
                crate::named::fetch(b, &self.weights, &["trainable_cond_mask.weight".to_owned()])?;
            b.weight_to_tensor(&layer.weight(0), b.compute_dtype())?
        };
        let mask_row =
            |i: usize| -> Result<Tensor<B>> { Ok(b.slice(&mask, 0, i, 1)?.reshape(&[1, 1, d])?) };
        let video = self.patch_embedding(b, input.x, grid, "patch_embedding")?;
        let video = b.binary(&video, &mask_row(0)?, BinaryOp::Add)?;
        // Sample s reads row s mod n of a conditioning latent of n rows (ComfyUI repeats a conditioning to the
        // batch, which holds both prompts when they run together).
        let control = match input.control {
            Some(control) => {
                check_latent(control, grid, grid.frames, s2v.cond_channels, "control video")?;
                let control_grid = Grid { batch: control.dim(0)?, ..*grid };
                Some(self.patch_embedding(b, control, &control_grid, "cond_encoder")?)
            }
            None => None,
        };
        let reference = match input.reference {
            Some(r) => {
                let [_, _, frames, _, _] =
                    check_latent(r, grid, 0, LATENT_CHANNELS, "reference latent")?;
                let ref_grid = Grid { frames, batch: r.dim(0)?, ..*grid };
                let tokens = self.patch_embedding(b, r, &ref_grid, "patch_embedding")?;
                Some((b.binary(&tokens, &mask_row(1)?, BinaryOp::Add)?, frames))
            }
            None => None,
        };
        let motion = match input.motion {
            Some(m) => {
                check_latent(m, grid, 0, LATENT_CHANNELS, "motion latent")?;
                Some(b.binary(&self.pack_motion(b, m)?, &mask_row(2)?, BinaryOp::Add)?)
            }
            None => None,
        };
        let audio = match input.audio {
            Some(audio) => Some(self.s2v_audio(b, audio, grid.frames, s2v)?),
            None => None,
        };

        // The RoPE positions: the video's (ScaleROPE's options apply to them only), the reference's, the
        // packed motion's.
        let mut positions = grid_positions(&input.rope, 0, grid.frames, grid.rows, grid.cols);
        if let Some((_, frames)) = &reference {
            let first = REFERENCE_FRAME.max(grid.frames + 9);
            positions.extend(grid_positions(
                &RopeOptions::default(),
                first,
                *frames,
                grid.rows,
                grid.cols,
            ));
        }
        if motion.is_some() {
            positions.extend(packed_positions(grid.h, grid.w));
        }
        let (cos, sin) = rope_tables(&positions);
        let rope = Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)?;

        let text = self.text_embedding(b, input.context)?;
        let video_tokens = grid.tokens();
        let mut samples = Vec::with_capacity(grid.batch);
        let mut contexts = Vec::with_capacity(grid.batch);
        let mut embeddings = Vec::with_capacity(grid.batch);
        for s in 0..grid.batch {
            let mut parts = vec![match &control {
                Some(control) => {
                    b.binary(&b.slice(&video, 0, s, 1)?, &row(control, s)?, BinaryOp::Add)?
                }
                None => b.slice(&video, 0, s, 1)?,
            }];
            if let Some((tokens, _)) = &reference {
                parts.push(row(tokens, s)?);
            }
            if let Some(tokens) = &motion {
                parts.push(row(tokens, s)?);
            }
            let tokens = b.concat(&parts.iter().collect::<Vec<_>>(), 1)?;
            let stream = Stream {
                tokens,
                reference_frames: reference.as_ref().map_or(0, |(_, f)| *f),
                motion: motion.is_some(),
            };
            let runs = timestep_runs(input.timesteps[s], grid.frames, &stream)?;
            let values: Vec<f32> = runs.iter().map(|&(t, _)| t).collect();
            let (e, e0) = self.time_embedding(b, &values)?;
            embeddings.push((e, e0, runs.iter().map(|&(_, n)| n).collect::<Vec<_>>()));
            samples.push(stream.tokens);
            contexts.push(self.context(b, &text, None, s..s + 1)?);
        }
        drop((video, control, reference, motion, text));

        for i in 0..cfg.layers {
            let injector = INJECTED_BLOCKS[..s2v.injectors].iter().position(|&block| block == i);
            if i >= 64 || input.skip & (1u64 << i) == 0 {
                let layer = self.block_layer(b, i)?;
                let prefix = format!("blocks.{i}");
                let w = BlockWeights::new(&layer, &prefix);
                let table = b.weight_to_tensor(&w.get("modulation")?, b.compute_dtype())?;
                for (s, x) in samples.iter_mut().enumerate() {
                    let (_, e0, chunks) = &embeddings[s];
                    let rows = e0.dim(0)?;
                    let m = b.binary(&e0.reshape(&[rows, 6, d])?, &table, BinaryOp::Add)?;
                    let m = modulation(b, &m, d)?.with_chunks(chunks.clone());
                    *x = self.block(b, &w, x, &m, &contexts[s], &rope, None, BlockAudio::Silent)?;
                }
            }
            // The injector after a block left out runs too (ComfyUI replaces only the block).
            for (s, x) in samples.iter_mut().enumerate() {
                if let (Some(j), Some((local, global))) = (injector, &audio) {
                    let (local, global) = (row(local, s)?, row(global, s)?);
                    *x = self.inject_audio(b, j, x, &local, &global, video_tokens)?;
                }
            }
        }

        let head = self.head_weights(b)?;
        let mut outs = Vec::with_capacity(grid.batch);
        for (s, x) in samples.into_iter().enumerate() {
            // The head runs on the video's tokens, its modulation by their runs of timesteps.
            let (e, _, chunks) = &embeddings[s];
            let x = b.slice(&x, 1, 0, video_tokens)?;
            let kept = first_tokens(chunks, video_tokens);
            outs.push(self.head(b, &head, e, &x, Some(&kept), grid)?);
        }
        let outs: Vec<&Tensor<B>> = outs.iter().collect();
        Ok(b.cast(&b.concat(&outs, 0)?, DType::F32)?)
    }

    /// The motion latent `[B', 16, M, H, W]` packed into tokens `[B', n, D]` (ComfyUI's `FramePackMotioner`,
    /// zero-padding mode): its last 19 frames (zeros in front of fewer), the nearest frame in 2×2 patches, the
    /// next two in 2×4×4, the sixteen before in 4×8×8, nearest first.
    fn pack_motion<B: Backend>(&self, b: &B, motion: &Tensor<B>) -> Result<Tensor<B>> {
        let [n, c, frames, h, w] = motion.shape()[..] else {
            return Err(Error::Invalid("a motion latent is [B, C, T, H, W]".to_owned()));
        };
        let motion = b.cast(motion, DType::F32)?;
        let kept = frames.min(PACKED_FRAMES);
        let recent = b.slice(&motion, 2, frames - kept, kept)?;
        let padded = match PACKED_FRAMES - kept {
            0 => recent,
            missing => {
                b.concat(&[&b.full(&[n, c, missing, h, w], 0.0, DType::F32)?, &recent], 2)?
            }
        };
        let mut parts = Vec::with_capacity(PACKS.len());
        let mut at = PACKED_FRAMES;
        for (name, frames, depth, side, _) in PACKS.iter().rev() {
            at -= frames;
            let clip = b.slice(&padded, 2, at, *frames)?;
            parts.push(self.conv_patches(b, &clip, name, *depth, *side)?);
        }
        Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 1)?)
    }

    /// A Conv3d whose kernel is its stride (`depth` frames × `side` × `side`) on `x` `[B, C, T, H, W]`, as tokens
    /// `[B, (T / depth)·(H / side)·(W / side), D]` (frame-major; sides past a whole patch dropped, as the
    /// convolution drops them).
    fn conv_patches<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        name: &str,
        depth: usize,
        side: usize,
    ) -> Result<Tensor<B>> {
        let [n, c, t, h, w] = x.shape()[..] else {
            return Err(Error::Invalid("a latent is [B, C, T, H, W]".to_owned()));
        };
        let (groups, rows, cols) = (t / depth, h / side, w / side);
        let x = b.slice(&b.slice(x, 3, 0, rows * side)?, 4, 0, cols * side)?;
        // [n, c, groups, depth, H, W] → [n, groups, c, depth, H, W] → [n·groups, c·depth, H, W].
        let x = x.reshape(&[n, c, groups, depth, rows * side, cols * side])?;
        let x = b.permute(&x, &[0, 2, 1, 3, 4, 5])?;
        let x = x.reshape(&[n * groups, c * depth, rows * side, cols * side])?;
        let patches = latent_tokens::patchify(b, &x, side)?;
        let width = c * depth * side * side;
        let patches = patches.reshape(&[n, groups * rows * cols, width])?;
        let layer = crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias(name))?;
        let weight = layer.weight(0).reshape(&[self.config.dim, width])?;
        let tokens = b.linear(&patches, &weight, Some(&layer.weight(1)))?;
        Ok(b.cast(&tokens, b.compute_dtype())?)
    }

    /// The audio tokens `[B', T, tokens + 1, D]` and global vectors `[B', T, 1, D]` of the encoder states
    /// `[B', layers, width, frames]` for `frames` latent frames (ComfyUI's `CausalAudioEncoder`: the first
    /// 4·`frames` audio frames, the states weighed by SiLU(weights) / their sum, then `MotionEncoder_tc`).
    fn s2v_audio<B: Backend>(
        &self,
        b: &B,
        audio: &Tensor<B>,
        frames: usize,
        s2v: &S2v,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let wanted = AUDIO_FRAMES_PER_LATENT * frames;
        let (n, layers) = match *audio.shape() {
            [n, layers, width, f]
                if n > 0 && layers == s2v.audio_layers && width == s2v.audio_dim && f >= wanted =>
            {
                (n, layers)
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "Wan 2.2 S2V reads audio states [B, {}, {}, at least {wanted}] (WanSoundImageToVideo's, \
                     from wav2vec2 large), got {other:?}: make the latent with the same node",
                    s2v.audio_layers, s2v.audio_dim
                )));
            }
        };
        let layer = crate::named::fetch(b, &self.weights, &[format!("{ENCODER}.weights")])?;
        let weights = b.to_f32(&b.weight_to_tensor(&layer.weight(0), DType::F32)?)?;
        let weights: Vec<f32> = weights.iter().map(|&w| w / (1.0 + (-w).exp())).collect();
        let sum: f32 = weights.iter().sum();
        // Mixed in f32 (ComfyUI weighs and sums the states in one reduction), then in the compute type.
        let audio = b.cast(&b.slice(audio, 3, 0, wanted)?, DType::F32)?;
        let mut mixed: Option<Tensor<B>> = None;
        for (l, weight) in weights.iter().enumerate().take(layers) {
            let part = b.affine(&b.slice(&audio, 1, l, 1)?, weight / sum, 0.0)?;
            mixed = Some(match mixed {
                Some(m) => b.binary(&m, &part, BinaryOp::Add)?,
                None => part,
            });
        }
        let x = mixed.ok_or_else(|| Error::Invalid("S2V's audio has no states".to_owned()))?;
        let x = b.cast(&x, b.compute_dtype())?.reshape(&[n, s2v.audio_dim, wanted])?;
        let d = self.config.dim;
        let k = s2v.audio_tokens;
        let names: Vec<String> = ["conv1_local", "conv1_global", "conv2", "conv3"]
            .iter()
            .flat_map(|c| crate::named::weight_and_bias(&format!("{ENCODER}.encoder.{c}.conv")))
            .chain(crate::named::weight_and_bias(&format!("{ENCODER}.encoder.final_linear")))
            .chain([format!("{ENCODER}.encoder.padding_tokens")])
            .collect();
        let layer = crate::named::fetch(b, &self.weights, &names)?;
        let conv = |x: &Tensor<B>, i: usize, stride: usize| -> Result<Tensor<B>> {
            causal_conv(b, x, &layer.weight(2 * i), &layer.weight(2 * i + 1), stride)
        };
        // [b, c, t] → [b, t, c], LayerNorm (no affine), SiLU, back.
        let norm_silu = |x: &Tensor<B>| -> Result<Tensor<B>> {
            let y = b.permute(x, &[0, 2, 1])?;
            let y = b.unary(&b.layer_norm(&y, None, None, ENCODER_EPS)?, UnaryOp::Silu)?;
            Ok(b.permute(&y, &[0, 2, 1])?)
        };
        let downsample = |x: &Tensor<B>| -> Result<Tensor<B>> {
            let x = norm_silu(&conv(x, 2, 2)?)?;
            conv(&x, 3, 2)
        };
        // The local tokens: k heads of d / 4 channels each, through conv2 and conv3 on their own.
        let local = conv(&x, 0, 1)?.reshape(&[n * k, d / 4, wanted])?;
        let local = norm_silu(&downsample(&norm_silu(&local)?)?)?; // [n·k, d, T]
        let local = b.permute(&local.reshape(&[n, k, d, frames])?, &[0, 3, 1, 2])?; // [n, T, k, d]
        let pad = b.weight_to_tensor(&layer.weight(10), local.dtype())?;
        let pad =
            b.binary(&b.full(&[n, frames, 1, d], 0.0, local.dtype())?, &pad, BinaryOp::Add)?;
        let local = b.concat(&[&local, &pad], 2)?;
        let global = norm_silu(&downsample(&norm_silu(&conv(&x, 1, 1)?)?)?)?; // [n, d, T]
        let global = b.permute(&global, &[0, 2, 1])?;
        let global = b.linear(&global, &layer.weight(8), Some(&layer.weight(9)))?;
        Ok((local, global.reshape(&[n, frames, 1, d])?))
    }

    /// Audio injector `j` on one sample's tokens `x` `[1, N, D]`, whose first `video` tokens are the video's:
    /// each latent frame's, layer-normed and modulated by its global audio vector (AdaLN), attend to its audio
    /// tokens; the result is added to them.
    fn inject_audio<B: Backend>(
        &self,
        b: &B,
        j: usize,
        x: &Tensor<B>,
        local: &Tensor<B>,
        global: &Tensor<B>,
        video: usize,
    ) -> Result<Tensor<B>> {
        let (d, heads) = (self.config.dim, self.config.heads);
        let frames = local.dim(1)?;
        let per = video / frames;
        let at = |name: &str| format!("audio_injector.{name}");
        let names: Vec<String> = ["q", "k", "v", "o"]
            .iter()
            .flat_map(|p| crate::named::weight_and_bias(&at(&format!("injector.{j}.{p}"))))
            .chain(crate::named::weight_and_bias(&at(&format!("injector_adain_layers.{j}.linear"))))
            .chain([
                at(&format!("injector.{j}.norm_q.weight")),
                at(&format!("injector.{j}.norm_k.weight")),
            ])
            .collect();
        let layer = crate::named::fetch(b, &self.weights, &names)?;
        let w = |i: usize| layer.weight(i);
        let eps = self.config.eps;
        let tokens = b.slice(x, 1, 0, video)?.reshape(&[frames, per, d])?;
        let temb = global.reshape(&[frames, d])?;
        let ada = b.linear(&b.unary(&temb, UnaryOp::Silu)?, &w(8), Some(&w(9)))?;
        let (shift, scale) = (b.slice(&ada, 1, 0, d)?, b.slice(&ada, 1, d, d)?);
        let h = b.modulate(&b.layer_norm(&tokens, None, None, ADAIN_EPS)?, &scale, Some(&shift))?;
        let audio = local.reshape(&[frames, local.dim(2)?, d])?;
        let heads_of = |t: Tensor<B>| -> Result<Tensor<B>> {
            let len = t.dim(1)?;
            Ok(b.permute(&t.reshape(&[frames, len, heads, HEAD_DIM])?, &[0, 2, 1, 3])?)
        };
        let q = heads_of(b.rms_norm(&b.linear(&h, &w(0), Some(&w(1)))?, Some(&w(10)), eps)?)?;
        let k = heads_of(b.rms_norm(&b.linear(&audio, &w(2), Some(&w(3)))?, Some(&w(11)), eps)?)?;
        let v = heads_of(b.linear(&audio, &w(4), Some(&w(5)))?)?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[frames, per, d])?;
        let y = b.linear(&o, &w(6), Some(&w(7)))?;
        let changed = b.binary(&tokens, &y, BinaryOp::Add)?.reshape(&[1, video, d])?;
        let total = x.dim(1)?;
        if total == video {
            return Ok(changed);
        }
        Ok(b.concat(&[&changed, &b.slice(x, 1, video, total - video)?], 1)?)
    }
}

/// A causal 1-D convolution of `x` `[B, C, L]` by `weight` `[O, C, 3]` (the input padded in front with 2 copies
/// of its first value, ComfyUI's `CausalConv1d`), `[B, O, ⌈L / stride⌉]`.
fn causal_conv<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    weight: &kiln_compute::Weight<'_>,
    bias: &kiln_compute::Weight<'_>,
    stride: usize,
) -> Result<Tensor<B>> {
    let [n, c, len] = x.shape()[..] else {
        return Err(Error::Invalid("a causal convolution reads [B, C, L]".to_owned()));
    };
    let [out, _, kernel] = weight.shape()[..] else {
        return Err(Error::Invalid("a causal convolution's weight is [O, C, K]".to_owned()));
    };
    let x = b.pad(&x.reshape(&[n, c, 1, len])?, 3, kernel - 1, 0, PadMode::Replicate)?;
    let params = kiln_compute::backend::Conv2dParams { stride, padding: [0; 4] };
    let y = b.conv2d(&x, &weight.reshape(&[out, c, 1, kernel])?, Some(bias), params)?;
    let len = y.dim(3)?;
    Ok(y.reshape(&[n, out, len])?)
}

/// Checks a latent S2V reads beside the video: `[n, channels, T, H, W]` at the video's size (sample s reads row
/// s mod n), with `frames` frames unless 0.
fn check_latent<B: Backend>(
    t: &Tensor<B>,
    grid: &Grid,
    frames: usize,
    channels: usize,
    what: &str,
) -> Result<[usize; 5]> {
    match *t.shape() {
        [n, c, f, h, w]
            if n > 0
                && c == channels
                && f > 0
                && (frames == 0 || f == frames)
                && (h, w) == (grid.h, grid.w) =>
        {
            Ok([n, c, f, h, w])
        }
        ref other => Err(Error::Invalid(format!(
            "Wan 2.2 S2V's {what} must be [B, {channels}, {}, {}, {}], got {other:?}: make it with \
             WanSoundImageToVideo for this latent",
            if frames == 0 { "T".to_owned() } else { frames.to_string() },
            grid.h,
            grid.w
        ))),
    }
}

/// The RoPE positions of the packed motion's tokens for a latent of `h × w` (ComfyUI's `rope_encode` calls in
/// `FramePackMotioner`): each pack's frames from its first frame, its rows and columns spread evenly over the
/// video's token rows and columns (`linspace`).
fn packed_positions(h: usize, w: usize) -> Vec<[f64; 3]> {
    let (rows, cols) = (h.div_ceil(PATCH), w.div_ceil(PATCH));
    let spread = |len: usize, steps: usize| -> Vec<f64> {
        match steps {
            0 => Vec::new(),
            1 => vec![0.0],
            _ => (0..steps).map(|i| i as f64 * (len as f64 - 1.0) / (steps as f64 - 1.0)).collect(),
        }
    };
    let mut out = Vec::new();
    for (_, frames, depth, side, first) in PACKS.iter().rev() {
        let (ys, xs) = (spread(rows, h / side), spread(cols, w / side));
        for f in 0..frames / depth {
            for &y in &ys {
                out.extend(xs.iter().map(|&x| [(*first + f as isize) as f64, y, x]));
            }
        }
    }
    out
}

/// The timesteps of one sample's tokens in runs `(timestep, tokens)` (ComfyUI's S2V timesteps through
/// `repeat_e`): `t` for each video frame and 0 for each reference frame, each twice and 3 zeros after with a
/// motion latent; the N tokens take them `N / G` each in order (`N / G + 1` each, the last cut short, when they
/// do not divide evenly).
fn timestep_runs<B: Backend>(
    t: f32,
    frames: usize,
    stream: &Stream<B>,
) -> Result<Vec<(f32, usize)>> {
    let mut groups: Vec<f32> = std::iter::repeat_n(t, frames)
        .chain(std::iter::repeat_n(0.0, stream.reference_frames))
        .collect();
    if stream.motion {
        groups = groups.iter().flat_map(|&g| [g, g]).collect();
        groups.extend([0.0; PACKED_TIMESTEPS]);
    }
    let tokens = stream.tokens.dim(1)?;
    let g = groups.len();
    let per = match (g, tokens / g) {
        (1, _) => tokens,
        (_, per) if per * g == tokens => per,
        (_, 1) => {
            // ComfyUI's `repeat_e` leaves the timesteps as they are, which its modulation cannot apply.
            return Err(Error::Invalid(format!(
                "Wan 2.2 S2V cannot spread {g} timesteps over {tokens} tokens (ComfyUI's model fails there \
                 too): make the video larger"
            )));
        }
        (_, per) => per + 1,
    };
    let mut runs: Vec<(f32, usize)> = Vec::new();
    let mut left = tokens;
    for value in groups {
        let n = per.min(left);
        left -= n;
        match runs.last_mut() {
            Some((last, len)) if *last == value => *len += n,
            _ if n > 0 => runs.push((value, n)),
            _ => {}
        }
    }
    Ok(runs)
}

/// The runs `chunks` cut to their first `tokens` tokens.
fn first_tokens(chunks: &[usize], tokens: usize) -> Vec<usize> {
    let mut left = tokens;
    chunks
        .iter()
        .map(|&n| {
            let kept = n.min(left);
            left -= kept;
            kept
        })
        .collect()
}
