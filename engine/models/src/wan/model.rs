//! [`Wan`]: the Wan DiT's forward pass in ComfyUI's order (models-wan-video.md §3), one block's weights at a time
//! through [`Model::fetch`], a small batch's samples through each block together (each weight read once a pass),
//! a large one's each on its own (so a batch of two 33k-token videos holds one sample's activations at a time).
//!
//! What the blocks read is built once: the patch tokens (the patch embedding in f32, as ComfyUI runs it), the
//! timestep embeddings (one per sample, or one per latent frame for Wan 2.2 TI2V 5B), the text (and CLIP)
//! context and the 3-D RoPE table.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, PadMode, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use crate::error::{Error, Result};
use crate::latent_tokens;
use crate::rope::Rope;
use crate::rope::RopeOptions;

use super::animate2::Animate2Input;
use super::config::{
    CAMERA_UNSHUFFLE, Config, HEAD_DIM, IMAGE_EPS, PATCH, ROPE_THETA, block_shapes,
    camera_adapter_shapes, vace_block_shapes,
};
use super::dancer::DancerInput;
use super::infinite_talk::{InfiniteTalk, TalkInput, speaker_positions};

/// The most token rows a batch's samples have together for them to share each block's pass. Below it a linear
/// multiplies few rows by each weight, so reading (and on the CPU widening) the weight costs about what the
/// product does, and reading it once for all samples saves most of that a second time; above it the products
/// dominate, and one sample at a time holds one sample's activations (a batch of two 33k-token videos).
const JOINT_ROWS: usize = 16_384;

/// Samples that go through the blocks together: one, or every sample of a batch ([`JOINT_ROWS`]).
struct Lane<B: Backend> {
    samples: Range<usize>,
    /// Their tokens `[S, N, D]`.
    x: Tensor<B>,
    /// Their cross-attention context.
    context: Context<B>,
}

/// Rows of a block's feed-forward input run through it at once: its hidden activations (ffn width wide) are
/// the block's largest, so a long video's are made a slice at a time.
const FFN_CHUNK_ROWS: usize = 16_384;

/// A Wan 2.1 / 2.2 DiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct Wan {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// What one call of [`Wan::forward`] takes.
pub struct WanInput<'a, B: Backend> {
    /// `[B, in_channels, T, H, W]`, any float dtype: the noisy latent already concatenated with the conditioning
    /// channels (ComfyUI's `concat_cond`) by the caller.
    pub x: &'a Tensor<B>,
    /// σ·1000, one per sample (`B` values) or one per latent frame (`B·T`, sample-major: Wan 2.2 TI2V 5B with a
    /// noise mask, models-wan-video.md §3.5).
    pub timesteps: &'a [f32],
    /// Text features `[B, L, text_dim]`.
    pub context: &'a Tensor<B>,
    /// CLIP-vision penultimate hidden states `[B or 1, n, clip_dim]` (n = 257, or 514 for a first and a last
    /// frame); models without the CLIP branch ignore them.
    pub clip: Option<&'a Tensor<B>>,
    /// The reference latent of a model with the reference-image convolution (`Wan22FunControlToVideo`'s
    /// `ref_image`, in the model's latent space): `[B or 1, C, T, H, W]` or `[B or 1, C, H, W]`, its first frame
    /// read; models without the convolution ignore it.
    pub reference: Option<&'a Tensor<B>>,
    /// The VACE control contexts of a VACE model, each `[B or 1, vace channels, T, H, W]` (already in the
    /// model's latent space, the mask channels after) with its strength; models without VACE ignore them.
    pub vace: &'a [(Tensor<B>, f32)],
    /// The camera embedding of a Fun Camera model (`WanCameraEmbedding`): `[B or 1, channels, T, 16·rows,
    /// 16·cols]`, Plücker rays at pixel resolution for each latent frame; other models ignore it.
    pub camera: Option<&'a Tensor<B>>,
    /// Bit i set: block i is left out, its input passed on (`SkipLayerGuidanceDiT`'s pass); 0 for a plain call.
    pub skip: u64,
    /// `ScaleROPE`'s scales and shifts of the token positions (the identity for a plain model).
    pub rope: RopeOptions,
    /// In-context latents (`BerniniConditioning`'s source video and references, in the model's latent space),
    /// each `[B or 1, in_channels, T, H, W]` of its own size: their patch tokens follow the video's, each stream
    /// at its own positions turned by its source id (1, 2, …), and their outputs are dropped. VACE and Fun Camera
    /// models ignore them, as ComfyUI's do.
    pub context_latents: &'a [Tensor<B>],
    /// One block of frames of a causal model's autoregressive run (the `ar_video` sampler): `x` holds the
    /// frames from [`CausalStep::start_frame`] on, their RoPE positions start there, and their self-attention
    /// reads the keys and values of the frames before from the cache, to which this call's are added. As
    /// ComfyUI's `CausalWanModel.forward_block`, such a call applies no `ScaleROPE` and reads no in-context
    /// latents. `None`: an ordinary call over the whole video.
    pub causal: Option<CausalStep<'a, B>>,
    /// HuMo's audio embedding `[B', F, 8, 5, C]` (`WanHuMoImageToVideo`'s: a window of Whisper features per
    /// latent frame; sample s reads row s mod B'); other models ignore it. A HuMo model reads
    /// [`WanInput::reference`] as its reference latent `[B', 16, T, H, W]`, whose tokens follow the video's at the
    /// frames after it.
    pub audio: Option<&'a Tensor<B>>,
    /// InfiniteTalk's audio, which every block's audio cross-attention reads after the text's (a Wan 2.1 model
    /// of the patch's width; not with HuMo, VACE, a camera, a reference, in-context latents or a causal run).
    pub talk: Option<TalkInput<'a, B>>,
    /// Wan 2.2 S2V's motion latent `[B or 1, 16, M, H, W]` (the frames before the clip, in the model's space):
    /// packed into tokens after the video's and the reference's; other models ignore it. An S2V model reads
    /// [`WanInput::audio`] as its encoder states `[B or 1, layers, width, frames]` and [`WanInput::reference`] as
    /// its reference latent.
    pub motion: Option<&'a Tensor<B>>,
    /// Wan 2.2 S2V's control video latent `[B or 1, 16, T, H, W]` (in the model's space), added to the patch
    /// tokens through `cond_encoder`; other models ignore it.
    pub control: Option<&'a Tensor<B>>,
    /// Wan Animate 2's pose branch and strengths; other models ignore it.
    pub animate: Option<Animate2Input<'a, B>>,
    /// WanDancer's music, frame rate and reference image; other models ignore it.
    pub dancer: Option<DancerInput<'a, B>>,
}

impl<'a, B: Backend> WanInput<'a, B> {
    /// A plain call: latents `x`, its timesteps and text `context`, nothing else (no CLIP states, reference,
    /// VACE, camera, skipped blocks or in-context latents; the identity RoPE; not causal).
    pub fn new(x: &'a Tensor<B>, timesteps: &'a [f32], context: &'a Tensor<B>) -> Self {
        WanInput {
            x,
            timesteps,
            context,
            clip: None,
            reference: None,
            vace: &[],
            camera: None,
            skip: 0,
            rope: RopeOptions::default(),
            context_latents: &[],
            causal: None,
            audio: None,
            talk: None,
            motion: None,
            control: None,
            animate: None,
            dancer: None,
        }
    }
}

/// One call of a causal Wan model in an autoregressive run: where its frames start and the keys and values of
/// the frames before.
pub struct CausalStep<'a, B: Backend> {
    /// The latent frame the call's first frame is: the call reads the cache's first `start_frame` frames and
    /// replaces what it held from there on (a block run again at the next sigma, as ComfyUI's sampler rewinds
    /// its cache), so it cannot be past the frames held.
    pub start_frame: usize,
    /// The run's cache.
    pub cache: &'a CausalCache<B>,
}

/// The keys and values a causal Wan model's self-attention has seen in an autoregressive run (ComfyUI's
/// `kv_caches` of the `ar_video` sampler): per sample and block, the roped keys and the values of every token
/// so far, as heads `[1, H, N, 128]`, each call's from its [`CausalStep::start_frame`] on.
pub struct CausalCache<B: Backend> {
    state: Mutex<CacheState<B>>,
}

/// One sample's keys and values in one block, `[1, H, N, 128]` each (`None` before the first call).
type KeysValues<B> = Option<(Tensor<B>, Tensor<B>)>;

/// What a [`CausalCache`] holds.
struct CacheState<B: Backend> {
    /// Per sample, per block.
    entries: Vec<Vec<KeysValues<B>>>,
    /// The frames that count; entries beyond were rewound.
    frames: usize,
    /// The tokens of a frame (0 before the first call).
    frame_tokens: usize,
}

impl<B: Backend> Default for CausalCache<B> {
    fn default() -> Self {
        CausalCache {
            state: Mutex::new(CacheState { entries: Vec::new(), frames: 0, frame_tokens: 0 }),
        }
    }
}

impl<B: Backend> CausalCache<B> {
    /// An empty cache.
    pub fn new() -> CausalCache<B> {
        CausalCache::default()
    }

    /// The latent frames held.
    pub fn frames(&self) -> usize {
        self.lock().frames
    }

    fn lock(&self) -> MutexGuard<'_, CacheState<B>> {
        // A panic while held leaves whole tensors behind: the state stays usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One sample's cache slots in one block, and the tokens before this call.
pub(super) struct CausalSlot<'s, B: Backend> {
    entry: &'s mut KeysValues<B>,
    tokens: usize,
}

/// The latent's shape and token grid.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grid {
    pub(super) batch: usize,
    pub(super) frames: usize,
    /// The latent's sides.
    pub(super) h: usize,
    pub(super) w: usize,
    /// Token rows and columns of a frame (the sides padded to even, halved).
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Timestep embeddings per sample: 1, or `frames` for per-frame timesteps.
    pub(super) groups: usize,
}

impl Grid {
    /// Tokens of one sample.
    pub(super) fn tokens(&self) -> usize {
        self.frames * self.rows * self.cols
    }
}

/// The cross-attention context of one sample, or of samples that share a block's pass, in the model's width:
/// the text's tokens `[S, L, D]` and, for a model with the CLIP branch, the image's (ComfyUI's `context_img_len`
/// split).
pub(super) struct Context<B: Backend> {
    text: Tensor<B>,
    /// For each sample, the text rows the others repeat: every row from `text_rows[s] − 1` on equals that row
    /// (see [`Text`]).
    text_rows: Vec<usize>,
    image: Option<Tensor<B>>,
}

impl<B: Backend> Context<B> {
    /// A projection of the text by `project` (a per-row map to heads `[1, H, rows, 128]`), computed on the rows
    /// the others repeat and the last of them repeated to the text's length: the same heads as projecting every
    /// row. The samples' rows go through `project` together, as one sequence, and come back as `[S, H, L, 128]`.
    fn text_heads(
        &self,
        b: &B,
        project: impl Fn(&Tensor<B>) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let len = self.text.dim(1)?;
        if self.text_rows.iter().all(|&rows| rows >= len) {
            return project(&self.text);
        }
        let rows: Vec<Tensor<B>> = (self.text_rows.iter().enumerate())
            .map(|(s, &rows)| Ok(b.slice(&b.slice(&self.text, 0, s, 1)?, 1, 0, rows.min(len))?))
            .collect::<Result<_>>()?;
        let heads = match rows.as_slice() {
            [one] => project(one)?,
            _ => project(&b.concat(&rows.iter().collect::<Vec<_>>(), 1)?)?,
        };
        let mut samples = Vec::with_capacity(rows.len());
        let mut at = 0;
        for &rows in &self.text_rows {
            let rows = rows.min(len);
            let sample =
                if rows == heads.dim(2)? { heads.clone() } else { b.slice(&heads, 2, at, rows)? };
            samples.push(match len - rows {
                0 => sample,
                pad => b.pad(&sample, 2, 0, pad, PadMode::Replicate)?,
            });
            at += rows;
        }
        Ok(match samples.len() {
            1 => samples.remove(0),
            _ => b.concat(&samples.iter().collect::<Vec<_>>(), 0)?,
        })
    }
}

/// The text in the model's width `[B, L, D]`, and for each sample how many of its first rows the rest repeat:
/// ComfyUI pads a Wan prompt's umT5 states to 512 rows with zeros, so every row after the prompt's is the same
/// row, and so is every per-row map of it (the embedding, each block's cross-attention keys and values). Those
/// are computed on a sample's first `distinct` rows and the last of them repeated: the same values, without the
/// padding's work, which at a small size was most of a step (64² on the CPU: 1024 text rows against 16 image
/// rows).
pub(super) struct Text<B: Backend> {
    pub(super) states: Tensor<B>,
    pub(super) distinct: Vec<usize>,
}

impl<B: Backend> Text<B> {
    /// Sample `s` alone.
    pub(super) fn row(&self, b: &B, s: usize) -> Result<Text<B>> {
        let distinct = vec![self.rows(s)?];
        Ok(Text { states: b.slice(&self.states, 0, s, 1)?, distinct })
    }

    /// The states of `samples` `[S, L, D]` with the rows each one's others repeat.
    fn samples(&self, b: &B, samples: Range<usize>) -> Result<(Vec<usize>, Tensor<B>)> {
        let rows = samples.clone().map(|s| self.rows(s)).collect::<Result<_>>()?;
        Ok((rows, b.slice(&self.states, 0, samples.start, samples.len())?))
    }

    /// The rows sample `s`'s others repeat.
    fn rows(&self, s: usize) -> Result<usize> {
        self.distinct.get(s).copied().ok_or_else(|| {
            Error::Invalid(format!("no sample {s} in a text of {} samples", self.distinct.len()))
        })
    }
}

/// For each sample of `context` `[B, L, W]`, the rows every later row repeats, bit for bit: at least 1, L when
/// its last two rows differ.
fn distinct_rows<B: Backend>(b: &B, context: &Tensor<B>) -> Result<Vec<usize>> {
    let &[batch, len, width] = context.shape() else {
        return Err(Error::Invalid(format!(
            "Wan text must be [B, L, W], got {:?}",
            context.shape()
        )));
    };
    if len < 2 || width == 0 {
        return Ok(vec![len; batch]);
    }
    let values = b.to_f32(context)?;
    let same = |a: &[f32], c: &[f32]| a.iter().zip(c).all(|(x, y)| x.to_bits() == y.to_bits());
    Ok(values
        .chunks_exact(len * width)
        .take(batch)
        .map(|sample| {
            let last = &sample[(len - 1) * width..];
            let mut first = len - 1;
            while first > 0 && same(&sample[(first - 1) * width..first * width], last) {
                first -= 1;
            }
            first + 1
        })
        .collect())
}

/// A block's six modulation vectors for its samples, each `[S·groups, D]` (one row per timestep embedding): shift,
/// scale and gate of the self-attention, then of the feed-forward.
pub(super) struct Modulation<B: Backend> {
    shift: [Tensor<B>; 2],
    scale: [Tensor<B>; 2],
    gate: [Tensor<B>; 2],
    /// The tokens each row applies to, in order (S2V's runs of tokens of one timestep); `None`: the tokens split
    /// evenly between the rows.
    pub(super) chunks: Option<Vec<usize>>,
}

/// What a VACE model's blocks read beside the main stream, per sample.
struct VaceStreams<B: Backend> {
    /// Each sample's patch tokens before the blocks `[1, N, D]`.
    patches: Vec<Tensor<B>>,
    /// Each sample's VACE contexts `[1, N, D]` as the VACE blocks have made them so far, with their strengths.
    contexts: Vec<Vec<(Tensor<B>, f32)>>,
}

/// The sound a block attends to after the text, if any.
#[derive(Clone, Copy)]
pub(super) enum BlockAudio<'x, B: Backend> {
    /// None.
    Silent,
    /// HuMo's audio tokens of this sample `[1, F·tokens, audio_dim]`.
    Humo(&'x Tensor<B>),
    /// InfiniteTalk's audio with the patch's weights of this block.
    Talk(&'x TalkInput<'x, B>, &'x BlockWeights<'x, 'x>),
}

/// A block's weights, fetched as one layer, by their names under the block's prefix.
pub(super) struct BlockWeights<'a, 'm> {
    layer: &'a Layer<'m>,
    /// `blocks.{i}`.
    prefix: &'a str,
}

impl<'a, 'm> BlockWeights<'a, 'm> {
    /// The weights of `layer` under `prefix` (`blocks.{i}`).
    pub(super) fn new(layer: &'a Layer<'m>, prefix: &'a str) -> BlockWeights<'a, 'm> {
        BlockWeights { layer, prefix }
    }
}

impl<'a> BlockWeights<'a, '_> {
    /// The weight `{prefix}.{name}`.
    pub(super) fn get(&self, name: &str) -> Result<Weight<'a>> {
        Ok(self.layer.get(&format!("{}.{name}", self.prefix))?)
    }
}

impl Wan {
    /// A model from its config and loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> Wan {
        Wan { config, weights }
    }

    /// ComfyUI's model output for `input`: the flow velocity v = ε − x₀, f32 `[B, out_channels, T, H, W]`.
    /// Computes in `b.compute_dtype()` (the patch embedding in f32); odd H and W are padded circularly and the
    /// output cropped back.
    pub fn forward<B: Backend>(&self, b: &B, input: &WanInput<'_, B>) -> Result<Tensor<B>> {
        let grid = self.check(input)?;
        if let Some(talk) = &input.talk {
            self.check_talk(input, talk, &grid)?;
        }
        if let Some(s2v) = self.config.s2v {
            return self.forward_s2v(b, input, &grid, &s2v);
        }
        if self.config.animate2 {
            return self.forward_animate2(b, input, &grid);
        }
        if let Some(dancer) = self.config.dancer {
            return self.forward_dancer(b, input, &grid, &dancer);
        }
        let mut cache = match &input.causal {
            Some(_) if !self.config.causal => {
                return Err(Error::Invalid(format!(
                    "the ar_video sampler runs a causal Wan model (Causal Forcing, Self-Forcing) a block of \
                     frames at a time; {} is not one: choose another sampler",
                    self.config.variant()
                )));
            }
            Some(step) => {
                let mut state = step.cache.lock();
                let frame_tokens = grid.rows * grid.cols;
                if step.start_frame > state.frames
                    || (step.start_frame > 0
                        && (state.frame_tokens != frame_tokens
                            || state.entries.len() != grid.batch))
                {
                    return Err(Error::Invalid(format!(
                        "a causal Wan block of {} frames at frame {} of {frame_tokens} tokens, batch {}, after a \
                         cache of {} frames of {} tokens, batch {}: blocks follow one another at one size",
                        grid.frames,
                        step.start_frame,
                        grid.batch,
                        state.frames,
                        state.frame_tokens,
                        state.entries.len()
                    )));
                }
                state.frames = step.start_frame;
                state.frame_tokens = frame_tokens;
                state.entries.resize_with(grid.batch, || vec![None; self.config.layers]);
                Some(state)
            }
            None => None,
        };
        let tokens = self.patch_embedding(b, input.x, &grid, "patch_embedding")?;
        let tokens = match self.camera_tokens(b, input.camera, &grid)? {
            Some(camera) => b.binary(&tokens, &camera, BinaryOp::Add)?,
            None => tokens,
        };
        let (e, e0) = self.time_embedding(b, input.timesteps)?;
        let text = self.text_embedding(b, input.context)?;
        let image = self.image_embedding(b, input.clip, grid.batch)?;
        let reference = self.reference_tokens(b, input.reference, &grid)?;
        let humo_reference = self.humo_reference(b, input.reference, &grid)?;
        let after_frames = humo_reference.as_ref().map_or(0, |(_, frames)| *frames);
        let audio = self.humo_audio(b, input.audio, after_frames)?;
        let in_context = match cache {
            Some(_) => Vec::new(),
            None => self.context_tokens(b, input.context_latents, &grid)?,
        };
        // The reference's tokens go first, at the positions of a frame before the video's (ComfyUI encodes
        // the RoPE of one frame more); the in-context streams' follow the video's.
        let extra_frames = usize::from(reference.is_some());
        let streams: Vec<Grid> = in_context.iter().map(|(_, g)| *g).collect();
        let rope = match &cache {
            Some(state) => self.rope(b, &grid, state.frames, 0, 0, &[], &RopeOptions::default())?,
            None => self.rope(b, &grid, 0, extra_frames, after_frames, &streams, &input.rope)?,
        };

        let mut samples = Vec::with_capacity(grid.batch);
        for s in 0..grid.batch {
            let sample = b.slice(&tokens, 0, s, 1)?;
            let mut sample = match &reference {
                Some(r) => b.concat(&[&b.slice(r, 0, s.min(r.dim(0)? - 1), 1)?, &sample], 1)?,
                None => sample,
            };
            for (tokens, _) in &in_context {
                let row = b.slice(tokens, 0, s.min(tokens.dim(0)? - 1), 1)?;
                sample = b.concat(&[&sample, &row], 1)?;
            }
            if let Some((tokens, _)) = &humo_reference {
                // ComfyUI repeats a conditioning's rows to the batch (`repeat_to_batch_size`).
                let row = b.slice(tokens, 0, s % tokens.dim(0)?, 1)?;
                sample = b.concat(&[&sample, &row], 1)?;
            }
            samples.push(sample);
        }
        drop((tokens, reference, in_context, humo_reference));
        let audio = match &audio {
            Some(a) => (0..grid.batch)
                .map(|s| Ok(Some(b.slice(a, 0, s % a.dim(0)?, 1)?)))
                .collect::<Result<Vec<_>>>()?,
            None => vec![None; grid.batch],
        };
        let mut vace = self.vace_streams(b, input.vace, &grid, &samples)?;
        // The samples share the blocks' passes where nothing but their inputs differs by sample (no cache, no
        // audio, no VACE stream) and their rows are few.
        let rows = samples.iter().map(|x| x.dim(1)).sum::<std::result::Result<usize, _>>()?;
        let joint = grid.batch > 1
            && rows <= JOINT_ROWS
            && cache.is_none()
            && input.talk.is_none()
            && vace.is_none()
            && audio.iter().all(Option::is_none);
        let mut lanes = if joint {
            let x = b.concat(&samples.iter().collect::<Vec<_>>(), 0)?;
            let samples = 0..grid.batch;
            vec![Lane {
                context: self.context(b, &text, image.as_ref(), samples.clone())?,
                samples,
                x,
            }]
        } else {
            (samples.into_iter().enumerate())
                .map(|(s, x)| {
                    let context = self.context(b, &text, image.as_ref(), s..s + 1)?;
                    Ok(Lane { samples: s..s + 1, x, context })
                })
                .collect::<Result<Vec<_>>>()?
        };
        drop((text, image));
        let reference_tokens = extra_frames * grid.rows * grid.cols;
        let d = self.config.dim;
        for i in 0..self.config.layers {
            if i >= 64 || input.skip & (1u64 << i) == 0 {
                let layer = self.block_layer(b, i)?;
                let prefix = format!("blocks.{i}");
                let w = BlockWeights { layer: &layer, prefix: &prefix };
                let table = b.weight_to_tensor(&w.get("modulation")?, e0.dtype())?;
                let talk_layer = match &input.talk {
                    Some(talk) => Some(crate::named::fetch(
                        b,
                        &talk.patch.weights,
                        &InfiniteTalk::block_names(i),
                    )?),
                    None => None,
                };
                let talk_weights =
                    talk_layer.as_ref().map(|layer| BlockWeights { layer, prefix: &prefix });
                // A lane is one sample (lane s is sample s) wherever a cache or audio is read.
                for (s, lane) in lanes.iter_mut().enumerate() {
                    let modulation =
                        sample_modulation(b, &e0, &table, lane.samples.clone(), grid.groups, d)?;
                    let slot = cache.as_mut().map(|state| {
                        let tokens = state.frames * state.frame_tokens;
                        CausalSlot { entry: &mut state.entries[s][i], tokens }
                    });
                    let sound = match (&audio[s], &input.talk, &talk_weights) {
                        (Some(audio), _, _) => BlockAudio::Humo(audio),
                        (None, Some(talk), Some(weights)) => BlockAudio::Talk(talk, weights),
                        _ => BlockAudio::Silent,
                    };
                    let x = &lane.x;
                    lane.x =
                        self.block(b, &w, x, &modulation, &lane.context, &rope, slot, sound)?;
                }
            }
            // The VACE block after this one (a skipped block's too, as ComfyUI replaces only the main block).
            let (Some(streams), Some(config)) = (vace.as_mut(), self.config.vace) else { continue };
            let Some(n) = config.block_after(i, self.config.layers) else { continue };
            let names: Vec<String> =
                vace_block_shapes(&self.config, n).into_iter().map(|(name, _)| name).collect();
            let layer = crate::named::fetch(b, &self.weights, &names)?;
            let prefix = format!("vace_blocks.{n}");
            let w = BlockWeights { layer: &layer, prefix: &prefix };
            let table = b.weight_to_tensor(&w.get("modulation")?, e0.dtype())?;
            // With VACE streams, lane s is sample s.
            for (s, lane) in lanes.iter_mut().enumerate() {
                let modulation =
                    sample_modulation(b, &e0, &table, lane.samples.clone(), grid.groups, d)?;
                for (c, strength) in streams.contexts[s].iter_mut() {
                    if n == 0 {
                        let projected = b.linear(
                            c,
                            &w.get("before_proj.weight")?,
                            Some(&w.get("before_proj.bias")?),
                        )?;
                        *c = b.binary(&projected, &streams.patches[s], BinaryOp::Add)?;
                    }
                    *c = self.block(
                        b,
                        &w,
                        c,
                        &modulation,
                        &lane.context,
                        &rope,
                        None,
                        BlockAudio::Silent,
                    )?;
                    let skip = b.linear(
                        c,
                        &w.get("after_proj.weight")?,
                        Some(&w.get("after_proj.bias")?),
                    )?;
                    lane.x = b.binary(&lane.x, &b.affine(&skip, *strength, 0.0)?, BinaryOp::Add)?;
                }
            }
        }
        drop(vace);
        if let Some(state) = cache.as_mut() {
            state.frames += grid.frames;
        }
        drop(cache);

        let mut samples = Vec::with_capacity(grid.batch);
        for lane in lanes {
            match lane.samples.len() {
                1 => samples.push(lane.x),
                n => {
                    for s in 0..n {
                        samples.push(b.slice(&lane.x, 0, s, 1)?);
                    }
                }
            }
        }
        self.sample_heads(b, &self.head_weights(b)?, &e, samples, reference_tokens, &grid)
    }

    /// Each sample's video tokens (`grid.tokens()` of them from token `skip`, where the sample holds other
    /// tokens too) through the head `layer` ([`Wan::head`]) with its rows of `e` (`grid.groups` a sample),
    /// joined on the batch in f32.
    pub(super) fn sample_heads<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        e: &Tensor<B>,
        samples: Vec<Tensor<B>>,
        skip: usize,
        grid: &Grid,
    ) -> Result<Tensor<B>> {
        let mut outs = Vec::with_capacity(samples.len());
        for (s, x) in samples.into_iter().enumerate() {
            let e = b.slice(e, 0, s * grid.groups, grid.groups)?;
            let x = if skip == 0 && x.dim(1)? == grid.tokens() {
                x
            } else {
                b.slice(&x, 1, skip, grid.tokens())?
            };
            outs.push(self.head(b, layer, &e, &x, None, grid)?);
        }
        let outs: Vec<&Tensor<B>> = outs.iter().collect();
        Ok(b.cast(&b.concat(&outs, 0)?, DType::F32)?)
    }

    /// Block `i`'s weights, fetched as one layer.
    pub(super) fn block_layer<B: Backend>(&self, b: &B, i: usize) -> Result<Layer<'_>> {
        let names: Vec<String> =
            block_shapes(&self.config, i).into_iter().map(|(name, _)| name).collect();
        crate::named::fetch(b, &self.weights, &names)
    }

    /// The head's weights: `head.modulation`, `head.head`'s weight and bias.
    pub(super) fn head_weights<'m, B: Backend>(&'m self, b: &B) -> Result<Layer<'m>> {
        self.head_weights_under(b, "head")
    }

    /// A head's weights under `prefix` (`head`, WanDancer's `head_global`): its modulation, its Linear's weight
    /// and bias.
    pub(super) fn head_weights_under<'m, B: Backend>(
        &'m self,
        b: &B,
        prefix: &str,
    ) -> Result<Layer<'m>> {
        let names = ["modulation", "head.weight", "head.bias"].map(|n| format!("{prefix}.{n}"));
        crate::named::fetch(b, &self.weights, &names)
    }

    /// The head (`layer`: [`Wan::head_weights`]) on one sample's video tokens `x` `[1, N, D]`: LayerNorm,
    /// scaled and shifted by `head.modulation` + `e` (`[rows, D]`: ComfyUI's head reads e itself, before the
    /// SiLU; its rows for even groups of the tokens, or for runs of `chunks` tokens), `head.head`, unpatchified
    /// to `[1, out, T, H, W]`.
    pub(super) fn head<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        e: &Tensor<B>,
        x: &Tensor<B>,
        chunks: Option<&[usize]>,
        grid: &Grid,
    ) -> Result<Tensor<B>> {
        let (rows, d) = (e.dim(0)?, self.config.dim);
        let table = b.weight_to_tensor(&layer.weight(0), e.dtype())?;
        let m = b.binary(&e.reshape(&[rows, 1, d])?, &table, BinaryOp::Add)?;
        let shift = b.slice(&m, 1, 0, 1)?.reshape(&[rows, d])?;
        let scale = b.slice(&m, 1, 1, 1)?.reshape(&[rows, d])?;
        let y =
            modulate(b, &b.layer_norm(x, None, None, self.config.eps)?, &scale, &shift, chunks)?;
        let y = b.linear(&y, &layer.weight(1), Some(&layer.weight(2)))?;
        self.unpatchify(b, &y, grid)
    }

    /// Checks the inputs' shapes against the model and each other.
    fn check<B: Backend>(&self, input: &WanInput<'_, B>) -> Result<Grid> {
        let cfg = &self.config;
        let &[batch, channels, frames, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "Wan latents must be [B, {}, T, H, W], got {:?}",
                cfg.in_channels,
                input.x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || frames == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "{} takes non-empty latents of {} channels (the noisy latent's {} and {} of conditioning), \
                 got {:?}",
                cfg.variant(),
                cfg.in_channels,
                cfg.out_channels,
                cfg.concat_channels(),
                input.x.shape()
            )));
        }
        let groups = match input.timesteps.len() {
            n if n == batch => 1,
            n if n == batch * frames => frames,
            n => {
                return Err(Error::Invalid(format!(
                    "{n} timesteps for a batch of {batch} latents of {frames} frames: expected one per \
                     sample ({batch}) or one per frame ({})",
                    batch * frames
                )));
            }
        };
        match input.context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.text_dim => {}
            other => {
                return Err(Error::Invalid(format!(
                    "Wan text conditioning must be [{batch}, N > 0, {}], got {other:?}",
                    cfg.text_dim
                )));
            }
        }
        if let (Some(image), Some(clip)) = (cfg.image, input.clip) {
            match clip.shape() {
                &[cb, n, width] if (cb == 1 || cb == batch) && n > 0 && width == image.clip_dim => {
                }
                other => {
                    return Err(Error::Invalid(format!(
                        "CLIP vision features for {} must be [{batch} or 1, N > 0, {}], got {other:?}",
                        cfg.variant(),
                        image.clip_dim
                    )));
                }
            }
        }
        let (rows, cols) = (h.div_ceil(PATCH), w.div_ceil(PATCH));
        Ok(Grid { batch, frames, h, w, rows, cols, groups })
    }

    /// Checks InfiniteTalk's audio against the model and the call: a plain Wan 2.1 body of the patch's width
    /// and no more blocks than it has, one audio frame per latent frame, speaker masks for two speakers only.
    fn check_talk<B: Backend>(
        &self,
        input: &WanInput<'_, B>,
        talk: &TalkInput<'_, B>,
        grid: &Grid,
    ) -> Result<()> {
        let cfg = &self.config;
        let patch = &talk.patch.config;
        let other = if cfg.humo.is_some() {
            Some("HuMo")
        } else if cfg.s2v.is_some() {
            Some("S2V")
        } else if cfg.dancer.is_some() {
            Some("WanDancer")
        } else if cfg.vace.is_some() {
            Some("VACE")
        } else if cfg.camera.is_some() {
            Some("Fun Camera")
        } else if input.causal.is_some() {
            Some("the ar_video sampler")
        } else if !input.context_latents.is_empty() {
            Some("in-context latents")
        } else if cfg.ref_channels.is_some() && input.reference.is_some() {
            Some("a reference image")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(Error::Invalid(format!(
                "InfiniteTalk patches a plain Wan 2.1 model; it does not run with {other}"
            )));
        }
        if patch.dim != cfg.dim || patch.blocks < cfg.layers {
            return Err(Error::Invalid(format!(
                "the InfiniteTalk patch is for a Wan model {} wide with up to {} blocks; {} is {} wide with {} \
                 blocks (InfiniteTalk patches the Wan 2.1 I2V 14B)",
                patch.dim,
                patch.blocks,
                cfg.variant(),
                cfg.dim,
                cfg.layers
            )));
        }
        let speakers = match *talk.audio.shape() {
            [frames, tokens, width]
                if frames == grid.frames
                    && width == patch.audio_dim
                    && tokens % patch.tokens == 0
                    && (1..=2).contains(&(tokens / patch.tokens)) =>
            {
                tokens / patch.tokens
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "InfiniteTalk's audio must be [{} latent frames, 1 or 2 × {} tokens, {}], got {other:?}: make \
                     the latent with the same WanInfiniteTalkToVideo",
                    grid.frames, patch.tokens, patch.audio_dim
                )));
            }
        };
        if (speakers == 2) != talk.masks.is_some() {
            return Err(Error::Invalid(format!(
                "InfiniteTalk with {speakers} speaker(s) {} speaker masks",
                if speakers == 2 { "needs" } else { "takes no" }
            )));
        }
        if grid.groups != 1 {
            return Err(Error::Invalid(
                "InfiniteTalk takes one timestep per sample, not one per frame".to_owned(),
            ));
        }
        Ok(())
    }

    /// The VACE streams of a VACE model given control contexts: each sample's patch tokens before the blocks
    /// (what VACE block 0 adds to its projected context) and its contexts' tokens with their strengths (the
    /// contexts embedded by `vace_patch_embedding`, batch 1 shared by every sample); `None` for another model
    /// or no context.
    fn vace_streams<B: Backend>(
        &self,
        b: &B,
        contexts: &[(Tensor<B>, f32)],
        grid: &Grid,
        samples: &[Tensor<B>],
    ) -> Result<Option<VaceStreams<B>>> {
        let Some(vace) = self.config.vace else { return Ok(None) };
        if contexts.is_empty() {
            return Ok(None);
        }
        let mut per_sample = vec![Vec::with_capacity(contexts.len()); grid.batch];
        for (context, strength) in contexts {
            match *context.shape() {
                [n, c, t, h, w]
                    if (n == 1 || n == grid.batch)
                        && c == vace.in_channels
                        && (t, h, w) == (grid.frames, grid.h, grid.w) => {}
                ref other => {
                    return Err(Error::Invalid(format!(
                        "{} reads VACE contexts of [{} or 1, {}, {}, {}, {}], got {other:?}",
                        self.config.variant(),
                        grid.batch,
                        vace.in_channels,
                        grid.frames,
                        grid.h,
                        grid.w
                    )));
                }
            }
            let tokens = self.patch_embedding(b, context, grid, "vace_patch_embedding")?;
            for (s, sample) in per_sample.iter_mut().enumerate() {
                let row = s.min(tokens.dim(0)? - 1);
                sample.push((b.slice(&tokens, 0, row, 1)?, *strength));
            }
        }
        Ok(Some(VaceStreams { patches: samples.to_vec(), contexts: per_sample }))
    }

    /// The patch tokens `[B', T·rows·cols, D]` of `x` `[B', C, T, H, W]` (the grid's frames and sides) in the
    /// compute type through the embedding `name` (`patch_embedding`, or VACE's): each frame padded circularly
    /// to even sides and cut into 2×2 patches (features channel-major, as the Conv3d's kernel is laid out),
    /// then the embedding in f32 (ComfyUI keeps those Conv3ds in f32).
    pub(super) fn patch_embedding<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        grid: &Grid,
        name: &str,
    ) -> Result<Tensor<B>> {
        let Grid { frames, h, w, rows, cols, .. } = *grid;
        let (batch, c) = (x.dim(0)?, x.dim(1)?);
        let mut x = b.cast(x, DType::F32)?;
        if rows * PATCH > h {
            x = b.pad(&x, 3, 0, rows * PATCH - h, PadMode::Circular)?;
        }
        if cols * PATCH > w {
            x = b.pad(&x, 4, 0, cols * PATCH - w, PadMode::Circular)?;
        }
        let x = b.permute(&x, &[0, 2, 1, 3, 4])?;
        let x = x.reshape(&[batch * frames, c, rows * PATCH, cols * PATCH])?;
        let patches = latent_tokens::patchify(b, &x, PATCH)?;
        let patches = patches.reshape(&[batch, grid.tokens(), c * PATCH * PATCH])?;
        let layer = crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias(name))?;
        let weight = layer.weight(0).reshape(&[self.config.dim, c * PATCH * PATCH])?;
        let tokens = b.linear(&patches, &weight, Some(&layer.weight(1)))?;
        Ok(b.cast(&tokens, b.compute_dtype())?)
    }

    /// The camera adapter's tokens `[B', T·rows·cols, D]` for a Fun Camera model given a camera embedding
    /// (ComfyUI's `WanCamAdapter`, in the compute type): each frame pixel-unshuffled by 8, a 2×2 stride-2
    /// Conv2d, then a residual block (3×3 conv, ReLU, 3×3 conv, plus its input); `None` otherwise.
    fn camera_tokens<B: Backend>(
        &self,
        b: &B,
        camera: Option<&Tensor<B>>,
        grid: &Grid,
    ) -> Result<Option<Tensor<B>>> {
        let (Some(channels), Some(camera)) = (self.config.camera, camera) else {
            return Ok(None);
        };
        let side = CAMERA_UNSHUFFLE * PATCH;
        let n = match *camera.shape() {
            [n, c, t, h, w]
                if (n == 1 || n == grid.batch)
                    && c == channels
                    && t == grid.frames
                    && (h, w) == (grid.rows * side, grid.cols * side) =>
            {
                n
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "{} reads a camera embedding of [{} or 1, {channels}, {}, {}, {}] (the latent's frames at \
                     8× its even size), got {other:?}",
                    self.config.variant(),
                    grid.batch,
                    grid.frames,
                    grid.rows * side,
                    grid.cols * side
                )));
            }
        };
        let (frames, rows, cols, d) = (grid.frames, grid.rows, grid.cols, self.config.dim);
        let (h, w, r) = (rows * PATCH, cols * PATCH, CAMERA_UNSHUFFLE);
        let x = b.cast(camera, b.compute_dtype())?;
        // [n, c, t, H, W] → frames as the batch [n·t, c, H, W] → pixel unshuffle [n·t, c·r·r, H/r, W/r]
        // (channel c·r² + ry·r + rx, as torch's PixelUnshuffle).
        let x = b.permute(&x, &[0, 2, 1, 3, 4])?;
        let x = x.reshape(&[n * frames * channels, h, r, w, r])?;
        let x = b.permute(&x, &[0, 2, 4, 1, 3])?;
        let x = x.reshape(&[n * frames, channels * r * r, h, w])?;
        let names: Vec<String> = camera_adapter_shapes(d, channels)
            .into_iter()
            .map(|(name, _)| name.to_owned())
            .collect();
        let layer = crate::named::fetch(b, &self.weights, &names)?;
        let w = |i: usize| layer.weight(i);
        let x =
            b.conv2d(&x, &w(0), Some(&w(1)), Conv2dParams { stride: PATCH, padding: [0; 4] })?;
        let hidden =
            b.unary(&b.conv2d(&x, &w(2), Some(&w(3)), Conv2dParams::same(1))?, UnaryOp::Relu)?;
        let x = b.binary(
            &b.conv2d(&hidden, &w(4), Some(&w(5)), Conv2dParams::same(1))?,
            &x,
            BinaryOp::Add,
        )?;
        // [n·t, D, rows, cols] → tokens [n, t·rows·cols, D] (frame-major, as the patch tokens).
        let x = x.reshape(&[n, frames, d, rows * cols])?;
        let x = b.permute(&x, &[0, 1, 3, 2])?;
        Ok(Some(x.reshape(&[n, frames * rows * cols, d])?))
    }

    /// The tokens of the reference latent `[B', rows·cols, D]` (ComfyUI's `ref_conv`: a 2×2 stride-2 Conv2d on
    /// its first frame, in the compute type), for a model with the convolution given one; `None` otherwise.
    fn reference_tokens<B: Backend>(
        &self,
        b: &B,
        reference: Option<&Tensor<B>>,
        grid: &Grid,
    ) -> Result<Option<Tensor<B>>> {
        let (Some(c), Some(reference)) = (self.config.ref_channels, reference) else {
            return Ok(None);
        };
        let (first, [n, rc, h, w]) = match *reference.shape() {
            [n, rc, _, h, w] => {
                (b.slice(reference, 2, 0, 1)?.reshape(&[n, rc, h, w])?, [n, rc, h, w])
            }
            [n, rc, h, w] => (reference.clone(), [n, rc, h, w]),
            ref other => {
                return Err(Error::Invalid(format!(
                    "a Wan reference latent must be [B, C, T, H, W] or [B, C, H, W], got {other:?}"
                )));
            }
        };
        if rc != c
            || (n != 1 && n != grid.batch)
            || (h, w) != (grid.h, grid.w)
            || h % PATCH != 0
            || w % PATCH != 0
        {
            return Err(Error::Invalid(format!(
                "{} reads a reference latent of {c} channels at the latent's even size [{} or 1, {c}, {}, {}], \
                 got {:?}",
                self.config.variant(),
                grid.batch,
                grid.h,
                grid.w,
                reference.shape()
            )));
        }
        if grid.groups != 1 {
            return Err(Error::Invalid(
                "a reference image with per-frame timesteps (a noise mask on a Wan 2.2 Fun 5B latent) is not \
                 supported"
                    .to_owned(),
            ));
        }
        let x = b.cast(&first, b.compute_dtype())?;
        let patches = latent_tokens::patchify(b, &x, PATCH)?;
        let patches = patches.reshape(&[n, grid.rows * grid.cols, c * PATCH * PATCH])?;
        let layer =
            crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias("ref_conv"))?;
        let weight = layer.weight(0).reshape(&[self.config.dim, c * PATCH * PATCH])?;
        Ok(Some(b.linear(&patches, &weight, Some(&layer.weight(1)))?))
    }

    /// The timestep embeddings of `timesteps` (one per sample or per frame): e `[n, D]` and ComfyUI's e0 =
    /// `time_projection(e)` `[n, 6·D]`, in the compute type.
    pub(super) fn time_embedding<B: Backend>(
        &self,
        b: &B,
        timesteps: &[f32],
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let freq = self.config.freq_dim;
        let emb = sinusoid(timesteps, freq / 2);
        let emb = b.from_f32(&[timesteps.len(), freq], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let m = &self.weights;
        let hidden = crate::named::linear(b, m, "time_embedding.0", &emb)?;
        let e = crate::named::linear(b, m, "time_embedding.2", &b.unary(&hidden, UnaryOp::Silu)?)?;
        let e0 = crate::named::linear(b, m, "time_projection.1", &b.unary(&e, UnaryOp::Silu)?)?;
        Ok((e, e0))
    }

    /// The text in the model's width: Linear, GELU (tanh), Linear, computed on the rows the others repeat.
    pub(super) fn text_embedding<B: Backend>(&self, b: &B, context: &Tensor<B>) -> Result<Text<B>> {
        let m = &self.weights;
        let (len, distinct) = (context.dim(1)?, distinct_rows(b, context)?);
        // Sample by sample, each on its own rows: the products a call with that sample alone makes.
        let mut samples = Vec::with_capacity(distinct.len());
        for (s, &rows) in distinct.iter().enumerate() {
            let sample = b.slice(&b.slice(context, 0, s, 1)?, 1, 0, rows)?;
            let hidden = crate::named::linear(
                b,
                m,
                "text_embedding.0",
                &b.cast(&sample, b.compute_dtype())?,
            )?;
            let hidden = b.unary(&hidden, UnaryOp::GeluTanh)?;
            let states = crate::named::linear(b, m, "text_embedding.2", &hidden)?;
            samples.push(match len - rows {
                0 => states,
                more => b.pad(&states, 1, 0, more, PadMode::Replicate)?,
            });
        }
        let states = match &samples[..] {
            [one] => one.clone(),
            many => b.concat(&many.iter().collect::<Vec<_>>(), 0)?,
        };
        Ok(Text { states, distinct })
    }

    /// The CLIP states in the model's width `[B, n', D]` with ComfyUI's `context_img_len` (the CLIP token count
    /// n), for a model with the CLIP branch given them: FLF2V's `emb_pos` added to the first tokens (as many as
    /// both have), then LayerNorm, Linear, GELU, Linear, LayerNorm; batch 1 repeated to the batch.
    pub(super) fn image_embedding<B: Backend>(
        &self,
        b: &B,
        clip: Option<&Tensor<B>>,
        batch: usize,
    ) -> Result<Option<(Tensor<B>, usize)>> {
        let (Some(image), Some(clip)) = (self.config.image, clip) else { return Ok(None) };
        let n = clip.dim(1)?;
        let mut clip = b.cast(clip, b.compute_dtype())?;
        if let Some(pos) = image.pos_tokens {
            let layer = crate::named::fetch(b, &self.weights, &["img_emb.emb_pos".to_owned()])?;
            let table = b.weight_to_tensor(&layer.weight(0), clip.dtype())?;
            let m = n.min(pos);
            clip =
                b.binary(&b.slice(&clip, 1, 0, m)?, &b.slice(&table, 1, 0, m)?, BinaryOp::Add)?;
        }
        Ok(Some((self.clip_projection(b, "img_emb", &clip, batch)?, n)))
    }

    /// CLIP states `[1 or B, n, clip]` in the model's width through the projection under `prefix` (ComfyUI's
    /// `MLPProj`: LayerNorm, Linear, GELU, Linear, LayerNorm), batch 1 repeated to `batch`.
    pub(super) fn clip_projection<B: Backend>(
        &self,
        b: &B,
        prefix: &str,
        clip: &Tensor<B>,
        batch: usize,
    ) -> Result<Tensor<B>> {
        let names: Vec<String> = ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
            .into_iter()
            .chain(["4.weight", "4.bias"])
            .map(|n| format!("{prefix}.proj.{n}"))
            .collect();
        let layer = crate::named::fetch(b, &self.weights, &names)?;
        let w = |i: usize| layer.weight(i);
        let x = b.layer_norm(clip, Some(&w(0)), Some(&w(1)), IMAGE_EPS)?;
        let x = b.unary(&b.linear(&x, &w(2), Some(&w(3)))?, UnaryOp::Gelu)?;
        let x = b.linear(&x, &w(4), Some(&w(5)))?;
        let x = b.layer_norm(&x, Some(&w(6)), Some(&w(7)), IMAGE_EPS)?;
        Ok(if x.dim(0)? < batch {
            let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&x, batch).collect();
            b.concat(&copies, 0)?
        } else {
            x
        })
    }

    /// Sample `s`'s cross-attention context of text alone: the image attention of a model with the CLIP branch
    /// then adds nothing (ComfyUI's `context_img_len` 0, as WanDancer's forward passes it without CLIP states).
    pub(super) fn text_context<B: Backend>(
        &self,
        b: &B,
        text: &Text<B>,
        s: usize,
    ) -> Result<Context<B>> {
        let (text_rows, text) = text.samples(b, s..s + 1)?;
        Ok(Context { text, text_rows, image: None })
    }

    /// The cross-attention context of `samples` (one, or those sharing a block's pass), as ComfyUI's
    /// `WanI2VCrossAttention` splits `[image ; text]` at `context_img_len`: a model with the CLIP branch given no
    /// CLIP states splits nothing off, and its image attention reads the text too.
    pub(super) fn context<B: Backend>(
        &self,
        b: &B,
        text: &Text<B>,
        image: Option<&(Tensor<B>, usize)>,
        samples: Range<usize>,
    ) -> Result<Context<B>> {
        let count = samples.len();
        let (text_rows, text) = text.samples(b, samples.clone())?;
        if self.config.image.is_none() {
            return Ok(Context { text, text_rows, image: None });
        }
        let Some((image, n)) = image else {
            return Ok(Context { image: Some(text.clone()), text, text_rows });
        };
        let image = b.slice(image, 0, samples.start, count)?;
        if image.dim(1)? == *n {
            return Ok(Context { text, text_rows, image: Some(image) });
        }
        // FLF2V's emb_pos covers fewer tokens than were given: the split still counts the tokens given.
        let joint = b.concat(&[&image, &text], 1)?;
        let len = joint.dim(1)?;
        let at = (*n).min(len);
        let text = b.slice(&joint, 1, at, len - at)?;
        // The split moves rows of the image into the text: every row is computed.
        let text_rows = vec![text.dim(1)?; count];
        Ok(Context { image: Some(b.slice(&joint, 1, 0, at)?), text, text_rows })
    }

    /// The RoPE table of a sample's tokens: token (f, i, j) at positions (`first_frame` + f, i, j) on axes of
    /// 44, 42 and 42 of the head's 128 dims (d − 4⌊d/6⌋, 2⌊d/6⌋, 2⌊d/6⌋), interleaved pairs; `extra_frames`
    /// more frames first (a reference image's tokens), then each in-context stream of `streams` at its own
    /// positions from 0, turned by its source id ([`turn_by_source`]). `options` scale and shift the positions of
    /// each axis (`ScaleROPE`), the streams' too. Then `after_frames` frames (HuMo's reference) at the frames
    /// after the video's, unscaled (ComfyUI encodes them without the options).
    #[allow(clippy::too_many_arguments)]
    fn rope<B: Backend>(
        &self,
        b: &B,
        grid: &Grid,
        first_frame: usize,
        extra_frames: usize,
        after_frames: usize,
        streams: &[Grid],
        options: &RopeOptions,
    ) -> Result<Rope<B>> {
        let table_with =
            |options: &RopeOptions, first: usize, frames: usize, rows: usize, cols: usize| {
                rope_tables(&grid_positions(options, first, frames, rows, cols))
            };
        let table = |first: usize, frames: usize, rows: usize, cols: usize| {
            table_with(options, first, frames, rows, cols)
        };
        let (mut cos, mut sin) =
            table(first_frame, grid.frames + extra_frames, grid.rows, grid.cols);
        for (i, stream) in streams.iter().enumerate() {
            let (mut c, mut s) = table(0, stream.frames, stream.rows, stream.cols);
            turn_by_source(&mut c, &mut s, i + 1);
            cos.extend(c);
            sin.extend(s);
        }
        if after_frames > 0 {
            let first = first_frame + grid.frames;
            let identity = RopeOptions::default();
            let (c, s) = table_with(&identity, first, after_frames, grid.rows, grid.cols);
            cos.extend(c);
            sin.extend(s);
        }
        Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)
    }

    /// Each in-context latent's patch tokens `[B or 1, T·rows·cols, D]` (through the video's own patch
    /// embedding) with its token grid; none for a VACE, Fun Camera or HuMo model, whose ComfyUI forward passes
    /// never read them.
    fn context_tokens<B: Backend>(
        &self,
        b: &B,
        latents: &[Tensor<B>],
        grid: &Grid,
    ) -> Result<Vec<(Tensor<B>, Grid)>> {
        if self.config.vace.is_some() || self.config.camera.is_some() || self.config.humo.is_some()
        {
            return Ok(Vec::new());
        }
        let mut streams = Vec::with_capacity(latents.len());
        for latent in latents {
            let stream = match *latent.shape() {
                [n, c, frames, h, w]
                    if (n == 1 || n == grid.batch)
                        && c == self.config.in_channels
                        && frames > 0
                        && h > 0
                        && w > 0 =>
                {
                    let (rows, cols) = (h.div_ceil(PATCH), w.div_ceil(PATCH));
                    Grid { batch: n, frames, h, w, rows, cols, groups: 1 }
                }
                ref other => {
                    return Err(Error::Invalid(format!(
                        "{} reads in-context latents (BerniniConditioning's) of [{} or 1, {}, T, H, W], got \
                         {other:?}",
                        self.config.variant(),
                        grid.batch,
                        self.config.in_channels
                    )));
                }
            };
            streams.push((self.patch_embedding(b, latent, &stream, "patch_embedding")?, stream));
        }
        Ok(streams)
    }

    /// Block `w` on tokens `x` `[S, N, D]` (one sample, or those sharing the pass); with `causal`, its self-attention also reads the keys
    /// and values held for the tokens before and adds this call's to them; with `sound` (HuMo's tokens of this
    /// sample, or InfiniteTalk's audio), its audio cross-attention follows the text's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn block<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        m: &Modulation<B>,
        context: &Context<B>,
        rope: &Rope<B>,
        causal: Option<CausalSlot<'_, B>>,
        sound: BlockAudio<'_, B>,
    ) -> Result<Tensor<B>> {
        let (q, k, v) = self.self_attention_heads(b, w, x, m, rope)?;
        let (k, v) = match causal {
            Some(slot) => with_cached(b, slot, k, v)?,
            None => (k, v),
        };
        let o = self.attend(b, &q, &k, &v)?;
        // Two speakers: where each token looks in the first frame, from this self-attention's queries and keys.
        let positions = match sound {
            BlockAudio::Talk(talk, _) => match talk.masks {
                Some(masks) => {
                    let frame_tokens = q.dim(2)? / talk.audio.dim(0)?.max(1);
                    let map = InfiniteTalk::attention_map(b, &q, &k, masks, frame_tokens)?;
                    Some(speaker_positions(&map))
                }
                None => None,
            },
            _ => None,
        };
        drop((q, k, v));
        self.finish_block(b, w, x, &o, m, context, sound, positions.as_deref())
    }

    /// Block `w`'s self-attention queries, keys (both RMS-normed and rotated by `rope`) and values of tokens `x`
    /// `[S, N, D]` under modulation `m`, as heads `[S, H, N, 128]`.
    pub(super) fn self_attention_heads<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        m: &Modulation<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
        let h = self.self_attention_input(b, x, m)?;
        let q = self.heads(b, &h, w, "self_attn.q", Some("self_attn.norm_q"), Some(rope))?;
        let k = self.heads(b, &h, w, "self_attn.k", Some("self_attn.norm_k"), Some(rope))?;
        let v = self.heads(b, &h, w, "self_attn.v", None, None)?;
        Ok((q, k, v))
    }

    /// What a block's self-attention projects: `x` `[S, N, D]` layer-normed, scaled and shifted by the block's
    /// first modulation.
    pub(super) fn self_attention_input<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        m: &Modulation<B>,
    ) -> Result<Tensor<B>> {
        let chunks = m.chunks.as_deref();
        modulate(
            b,
            &b.layer_norm(x, None, None, self.config.eps)?,
            &m.scale[0],
            &m.shift[0],
            chunks,
        )
    }

    /// The rest of block `w` on tokens `x` once its self-attention has given `o` (`[S, N, D]`, before the output
    /// projection): the projection, gated; the cross-attention on `context`; the audio cross-attention of
    /// `sound` (InfiniteTalk's two speakers at `positions`); the feed-forward, modulated and gated.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_block<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        o: &Tensor<B>,
        m: &Modulation<B>,
        context: &Context<B>,
        sound: BlockAudio<'_, B>,
        positions: Option<&[f32]>,
    ) -> Result<Tensor<B>> {
        let eps = self.config.eps;
        let chunks = m.chunks.as_deref();
        let y = b.linear(o, &w.get("self_attn.o.weight")?, Some(&w.get("self_attn.o.bias")?))?;
        let x = gated_add(b, x, &y, &m.gate[0], chunks)?;
        drop(y);

        // Cross-attention on the text (and the image): no modulation, no gate.
        let h =
            b.layer_norm(&x, Some(&w.get("norm3.weight")?), Some(&w.get("norm3.bias")?), eps)?;
        let q = self.heads(b, &h, w, "cross_attn.q", Some("cross_attn.norm_q"), None)?;
        drop(h);
        let k = context.text_heads(b, |text| {
            self.heads(b, text, w, "cross_attn.k", Some("cross_attn.norm_k"), None)
        })?;
        let v = context.text_heads(b, |text| self.heads(b, text, w, "cross_attn.v", None, None))?;
        let mut o = self.attend(b, &q, &k, &v)?;
        if let Some(image) = &context.image {
            let norm = Some("cross_attn.norm_k_img");
            let k = self.heads(b, image, w, "cross_attn.k_img", norm, None)?;
            let v = self.heads(b, image, w, "cross_attn.v_img", None, None)?;
            o = b.binary(&o, &self.attend(b, &q, &k, &v)?, BinaryOp::Add)?;
        }
        drop((q, k, v));
        let y = b.linear(&o, &w.get("cross_attn.o.weight")?, Some(&w.get("cross_attn.o.bias")?))?;
        let x = b.binary(&x, &y, BinaryOp::Add)?;
        drop((o, y));
        let x = match sound {
            BlockAudio::Silent => x,
            BlockAudio::Humo(audio) => self.audio_attention(b, w, &x, audio)?,
            BlockAudio::Talk(talk, weights) => {
                talk.patch.attention(b, weights, &x, talk, positions)?
            }
        };

        // Feed-forward, modulated and gated.
        let h = modulate(b, &b.layer_norm(&x, None, None, eps)?, &m.scale[1], &m.shift[1], chunks)?;
        let y = self.ffn(b, &h, w)?;
        gated_add(b, &x, &y, &m.gate[1], chunks)
    }

    /// `x` `[S, N, D]` through the Linear `proj` of `w`, RMS-normed across the whole width by `norm` (before the
    /// split into heads, as ComfyUI's `rms_norm_across_heads`), rotated by `rope`, as heads `[S, H, N, 128]`.
    pub(super) fn heads<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        w: &BlockWeights<'_, '_>,
        proj: &str,
        norm: Option<&str>,
        rope: Option<&Rope<B>>,
    ) -> Result<Tensor<B>> {
        let (batch, len) = (x.dim(0)?, x.dim(1)?);
        let weight = w.get(&format!("{proj}.weight"))?;
        let mut t = b.linear(x, &weight, Some(&w.get(&format!("{proj}.bias"))?))?;
        if let Some(norm) = norm {
            t = b.rms_norm(&t, Some(&w.get(&format!("{norm}.weight"))?), self.config.eps)?;
        }
        let mut t = t.reshape(&[batch, len, self.config.heads, HEAD_DIM])?;
        if let Some(rope) = rope {
            t = b.rope(&t, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
        }
        Ok(b.permute(&t, &[0, 2, 1, 3])?)
    }

    /// Unmasked attention of heads `[S, H, N, 128]` over `k`, `v`, back to tokens `[S, N, D]`.
    pub(super) fn attend<B: Backend>(
        &self,
        b: &B,
        q: &Tensor<B>,
        k: &Tensor<B>,
        v: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let o = b.attention(q, k, v, AttentionMask::None, scale)?;
        let (batch, len) = (o.dim(0)?, o.dim(2)?);
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, len, self.config.dim])?)
    }

    /// The feed-forward `Linear(GELU_tanh(Linear(h)))` of `w` on `h` `[S, N, D]`, [`FFN_CHUNK_ROWS`] tokens at
    /// a time.
    fn ffn<B: Backend>(&self, b: &B, h: &Tensor<B>, w: &BlockWeights<'_, '_>) -> Result<Tensor<B>> {
        let [w0, b0, w2, b2] =
            ["ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias"].map(|n| w.get(n));
        let (w0, b0, w2, b2) = (w0?, b0?, w2?, b2?);
        let shape = h.shape().to_vec();
        let rows = h.numel() / self.config.dim;
        let flat = h.reshape(&[rows, self.config.dim])?;
        let mut parts = Vec::with_capacity(rows.div_ceil(FFN_CHUNK_ROWS));
        for start in (0..rows).step_by(FFN_CHUNK_ROWS) {
            let len = FFN_CHUNK_ROWS.min(rows - start);
            let chunk = if len == rows { flat.clone() } else { b.slice(&flat, 0, start, len)? };
            let hidden = b.unary(&b.linear(&chunk, &w0, Some(&b0))?, UnaryOp::GeluTanh)?;
            parts.push(b.linear(&hidden, &w2, Some(&b2))?);
        }
        let y = match parts.len() {
            1 => parts.remove(0),
            _ => b.concat(&parts.iter().collect::<Vec<_>>(), 0)?,
        };
        Ok(y.reshape(&shape)?)
    }

    /// One sample's head output `[1, T·rows·cols, 4·out]` as the latent `[1, out, T, H, W]`: token (f, i, j),
    /// feature (q·2 + r)·out + c → out[c, f, 2i + q, 2j + r], cropped to the unpadded sides.
    pub(super) fn unpatchify<B: Backend>(
        &self,
        b: &B,
        y: &Tensor<B>,
        grid: &Grid,
    ) -> Result<Tensor<B>> {
        let Grid { frames, h, w, rows, cols, .. } = *grid;
        let c = self.config.out_channels;
        let y = y.reshape(&[frames, rows * cols, c * PATCH * PATCH])?;
        let out = b.unpatchify(&y, PATCH, c, rows * PATCH, cols * PATCH)?;
        let out = b.permute(&out, &[1, 0, 2, 3])?;
        let mut out = out.reshape(&[1, c, frames, rows * PATCH, cols * PATCH])?;
        if rows * PATCH > h {
            out = b.slice(&out, 3, 0, h)?;
        }
        if cols * PATCH > w {
            out = b.slice(&out, 4, 0, w)?;
        }
        Ok(out)
    }
}

/// The (frame, row, column) positions of a grid of tokens, frame-major, its frames from `first`, each axis
/// through `options` (`ScaleROPE`'s).
pub(super) fn grid_positions(
    options: &RopeOptions,
    first: usize,
    frames: usize,
    rows: usize,
    cols: usize,
) -> Vec<[f64; 3]> {
    let rows: Vec<f64> = options.positions(1, 0.0, rows).collect();
    let cols: Vec<f64> = options.positions(2, 0.0, cols).collect();
    let mut positions = Vec::with_capacity(frames * rows.len() * cols.len());
    for f in options.positions(0, first as f64, frames) {
        for &i in &rows {
            positions.extend(cols.iter().map(|&j| [f, i, j]));
        }
    }
    positions
}

/// The 3-D RoPE's cosines and sines of `positions` (44 time, 42 row and 42 column features of a head).
pub(super) fn rope_tables(positions: &[[f64; 3]]) -> (Vec<f32>, Vec<f32>) {
    let third = HEAD_DIM / 6;
    crate::rope::tables_at(positions, [HEAD_DIM - 4 * third, 2 * third, 2 * third], ROPE_THETA)
}

/// A causal call's keys and values `[1, H, n, 128]` after the `slot.tokens` held before (ComfyUI writes them
/// into its cache at `end` and attends over `[:end + n]`), kept in the slot for the calls after.
fn with_cached<B: Backend>(
    b: &B,
    slot: CausalSlot<'_, B>,
    k: Tensor<B>,
    v: Tensor<B>,
) -> Result<(Tensor<B>, Tensor<B>)> {
    let joined = match (slot.entry.take(), slot.tokens) {
        (_, 0) => (k, v),
        (Some((held_k, held_v)), tokens) if held_k.dim(2)? >= tokens => {
            let keep = |t: &Tensor<B>| b.slice(t, 2, 0, tokens);
            (b.concat(&[&keep(&held_k)?, &k], 2)?, b.concat(&[&keep(&held_v)?, &v], 2)?)
        }
        (held, tokens) => {
            return Err(Error::Invalid(format!(
                "a causal Wan cache that counts {tokens} tokens holds {} for a block",
                held.map_or(Ok(0), |(k, _)| k.dim(2))?
            )));
        }
    };
    *slot.entry = Some(joined.clone());
    Ok(joined)
}

/// ComfyUI's sinusoidal timestep features `[ts.len(), 2·half]`: cos then sin of t · 10000^(−k/half), k < half,
/// in f32 as ComfyUI computes them (`torch.pow`, not diffusers' `exp`).
fn sinusoid(ts: &[f32], half: usize) -> Vec<f32> {
    let freqs: Vec<f32> = (0..half).map(|k| 10000f32.powf(-(k as f32 / half as f32))).collect();
    let mut out = Vec::with_capacity(ts.len() * 2 * half);
    for &t in ts {
        out.extend(freqs.iter().map(|f| (t * f).cos()));
        out.extend(freqs.iter().map(|f| (t * f).sin()));
    }
    out
}

/// Turns an in-context stream's RoPE table (`[tokens, HEAD_DIM / 2]` cos and sin) by its source id, as ComfyUI's
/// `rope_encode(source_id=…)` composes each pair's rotation with `rope([[id]], HEAD_DIM, θ)`'s: pair p turns
/// id·θ^(−2p / HEAD_DIM) more, over the head's whole width (the time pairs too), the product taken in f32.
fn turn_by_source(cos: &mut [f32], sin: &mut [f32], id: usize) {
    let pairs = HEAD_DIM / 2;
    let turns: Vec<(f32, f32)> = (0..pairs)
        .map(|p| {
            let angle = id as f64 * ROPE_THETA.powf(-2.0 * p as f64 / HEAD_DIM as f64);
            (angle.cos() as f32, angle.sin() as f32)
        })
        .collect();
    for (c_row, s_row) in cos.chunks_exact_mut(pairs).zip(sin.chunks_exact_mut(pairs)) {
        for ((c, s), &(tc, ts)) in c_row.iter_mut().zip(s_row.iter_mut()).zip(&turns) {
            let (c0, s0) = (*c, *s);
            *c = c0 * tc - s0 * ts;
            *s = s0 * tc + c0 * ts;
        }
    }
}

/// The modulation of `samples` (one, or those sharing a block's pass) for a block whose table is `table`: their
/// timestep embeddings' rows of `e0` (`groups` a sample, sample-major) plus the table.
pub(super) fn sample_modulation<B: Backend>(
    b: &B,
    e0: &Tensor<B>,
    table: &Tensor<B>,
    samples: Range<usize>,
    groups: usize,
    d: usize,
) -> Result<Modulation<B>> {
    let rows = samples.len() * groups;
    let e0 = b.slice(e0, 0, samples.start * groups, rows)?.reshape(&[rows, 6, d])?;
    modulation(b, &b.binary(&e0, table, BinaryOp::Add)?, d)
}

/// A block's modulation from `m` = `modulation + e0` `[groups, 6, D]`, in ComfyUI's order: shift, scale, gate of
/// the self-attention, then of the feed-forward.
impl<B: Backend> Modulation<B> {
    /// This modulation with its rows applying to runs of `chunks` tokens.
    pub(super) fn with_chunks(self, chunks: Vec<usize>) -> Modulation<B> {
        Modulation { chunks: Some(chunks), ..self }
    }
}

pub(super) fn modulation<B: Backend>(b: &B, m: &Tensor<B>, d: usize) -> Result<Modulation<B>> {
    let groups = m.dim(0)?;
    let chunk = |k: usize| -> Result<Tensor<B>> { Ok(b.slice(m, 1, k, 1)?.reshape(&[groups, d])?) };
    Ok(Modulation {
        shift: [chunk(0)?, chunk(3)?],
        scale: [chunk(1)?, chunk(4)?],
        gate: [chunk(2)?, chunk(5)?],
        chunks: None,
    })
}

/// `x · (1 + scale) + shift` for tokens `x` `[S, N, D]` and `[S·groups, D]` vectors, each applying to its own
/// N / groups consecutive tokens (its frame's), or with `chunks` (one sample's) to as many as its chunk says.
fn modulate<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    scale: &Tensor<B>,
    shift: &Tensor<B>,
    chunks: Option<&[usize]>,
) -> Result<Tensor<B>> {
    if let Some(chunks) = chunks {
        return by_chunks(b, x, chunks, |part, r| {
            let (scale, shift) = (b.slice(scale, 0, r, 1)?, b.slice(shift, 0, r, 1)?);
            modulate(b, part, &scale, &shift, None)
        });
    }
    let shape = x.shape().to_vec();
    let groups = scale.dim(0)?;
    let d = scale.dim(1)?;
    let grouped = x.reshape(&[groups, x.numel() / (groups * d), d])?;
    Ok(b.modulate(&grouped, scale, Some(shift))?.reshape(&shape)?)
}

/// `x + y · gate` for tokens `[S, N, D]` and a `[S·groups, D]` gate (used as is, no tanh), each row
/// for its own N / groups consecutive tokens, or with `chunks` for as many as its chunk says.
fn gated_add<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    y: &Tensor<B>,
    gate: &Tensor<B>,
    chunks: Option<&[usize]>,
) -> Result<Tensor<B>> {
    if let Some(chunks) = chunks {
        let gated = by_chunks(b, y, chunks, |part, r| {
            Ok(b.binary(part, &b.slice(gate, 0, r, 1)?, BinaryOp::Mul)?)
        })?;
        return Ok(b.binary(x, &gated, BinaryOp::Add)?);
    }
    let (groups, d) = (gate.dim(0)?, gate.dim(1)?);
    let grouped = y.reshape(&[groups, y.numel() / (groups * d), d])?;
    let gated = b.binary(&grouped, &gate.reshape(&[groups, 1, d])?, BinaryOp::Mul)?;
    Ok(b.binary(x, &gated.reshape(x.shape())?, BinaryOp::Add)?)
}

/// `f` applied to consecutive chunks of `x`'s tokens (`[1, N, D]`, chunk r of `chunks[r]` tokens, the chunks
/// covering N), joined back.
fn by_chunks<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    chunks: &[usize],
    f: impl Fn(&Tensor<B>, usize) -> Result<Tensor<B>>,
) -> Result<Tensor<B>> {
    let mut parts = Vec::with_capacity(chunks.len());
    let mut at = 0;
    for (r, &len) in chunks.iter().enumerate().filter(|(_, len)| **len > 0) {
        parts.push(f(&b.slice(x, 1, at, len)?, r)?);
        at += len;
    }
    match parts.len() {
        1 => Ok(parts.remove(0)),
        _ => Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 1)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_is_cos_then_sin_of_powers_of_ten_thousand() {
        let emb = sinusoid(&[2.0], 4);
        let freqs = [1.0f64, 0.1, 0.01, 0.001];
        for (k, f) in freqs.iter().enumerate() {
            assert!((f64::from(emb[k]) - (2.0 * f).cos()).abs() < 1e-6, "cos {k}");
            assert!((f64::from(emb[4 + k]) - (2.0 * f).sin()).abs() < 1e-6, "sin {k}");
        }
    }
}
