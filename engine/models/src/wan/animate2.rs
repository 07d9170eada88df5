//! Wan Animate 2 (ComfyUI's `WanAnimate2Model`, `comfy/ldm/wan/model_animate2.py`): Wan 2.1 I2V 14B weights
//! driven by a video. A pose branch runs the same blocks over the driving video's latents in lockstep with the
//! generation and hands each block's self-attention its keys and values: frame j of the generation (frame 0 is
//! the reference image's slot) attends to every generated token and to pose frame j − 1's tokens.
//!
//! The pose branch reads its latents twice with a mask of ones between (`[pose | 1₄ | pose]`, the I2V model's 36
//! channels), timestep 1, its own text and CLIP states (the call's by default), and RoPE positions from frame 1
//! and from column `cols` on (its own strip of positions; `ScaleROPE` does not apply to it). `pose_strength`
//! scales its values; `reference_strength` scales the values of frame 0's tokens. [`super::PoseCache`] keeps the
//! branch's block inputs across a run's steps.

use kiln_compute::{Backend, DType, Tensor};

use super::config::HEAD_DIM;
use super::model::{BlockAudio, BlockWeights, Context, Grid, grid_positions, rope_tables};
use super::pose_cache::PoseCache;
use crate::error::{Error, Result};
use crate::rope::Rope;
use crate::rope::RopeOptions;
use crate::wan::Wan;

/// The latent channels of the pose video (the Wan 2.1 VAE's).
const POSE_CHANNELS: usize = 16;
/// The mask channels between the two copies of the pose latents.
const MASK_CHANNELS: usize = 4;

/// What a Wan Animate 2 call reads beyond an I2V call's inputs (`WAN_Animate2.extra_conds`).
pub struct Animate2Input<'a, B: Backend> {
    /// The driving video's latents `[B or 1, 16, T − 1, H, W]` in the model's space (one frame fewer than the
    /// latent: its first frame is the reference slot); `None` outside the pose window, where the blocks run
    /// plain self-attention.
    pub pose: Option<&'a Tensor<B>>,
    /// The pose branch's text `[B or 1, L, text_dim]` (`None`: the call's context).
    pub context: Option<&'a Tensor<B>>,
    /// The pose branch's CLIP states `[B or 1, n, clip_dim]` (`None`: the call's).
    pub clip: Option<&'a Tensor<B>>,
    /// Scales the pose branch's values (1: as trained).
    pub pose_strength: f32,
    /// Scales the values of the reference frame's tokens (1: as trained).
    pub reference_strength: f32,
    /// The run's pose-branch cache (`WanAnimate2Cache`), when the model has one.
    pub cache: Option<CacheCall<'a, B>>,
}

/// A call's use of the run's [`PoseCache`].
pub struct CacheCall<'a, B: Backend> {
    /// The cache.
    pub cache: &'a PoseCache<B>,
    /// The pose latents' first sample, as the cache knows the sequence ([`super::pose_key`]).
    pub key: &'a (Vec<usize>, Vec<f32>),
    /// The call is one context window's: an empty slot is filled by running the pose branch alone first, and
    /// the call then reads the cache (ComfyUI's pre-pass under context windows).
    pub windowed: bool,
}

/// The pose branch of one call: the streams of tokens it runs (one per distinct sample, or the cache's), the
/// modulation input, contexts and RoPE.
struct PoseBranch<B: Backend> {
    /// Each stream's block input `[1, N', D]`; empty when every block reads the cache.
    streams: Vec<Tensor<B>>,
    /// Each stream's cross-attention context.
    contexts: Vec<Context<B>>,
    /// The timestep-1 embedding's projection `[1, 6·D]`.
    e0: Tensor<B>,
    rope: Rope<B>,
}

impl Wan {
    /// ComfyUI's model output of a Wan Animate 2 model for `input` (see the module docs), f32
    /// `[B, out_channels, T, H, W]`.
    pub(super) fn forward_animate2<B: Backend>(
        &self,
        b: &B,
        input: &super::WanInput<'_, B>,
        grid: &Grid,
    ) -> Result<Tensor<B>> {
        if input.causal.is_some() || grid.groups != 1 {
            return Err(Error::Invalid(
                "Wan Animate 2 runs with one timestep per sample, not block by block or per frame"
                    .to_owned(),
            ));
        }
        let plain = Animate2Input {
            pose: None,
            context: None,
            clip: None,
            pose_strength: 1.0,
            reference_strength: 1.0,
            cache: None,
        };
        let animate = input.animate.as_ref().unwrap_or(&plain);
        let d = self.config.dim;
        let frame_tokens = grid.rows * grid.cols;

        let tokens = self.patch_embedding(b, input.x, grid, "patch_embedding")?;
        let (e, e0) = self.time_embedding(b, input.timesteps)?;
        let text = self.text_embedding(b, input.context)?;
        let image = self.image_embedding(b, input.clip, grid.batch)?;
        let (cos, sin) =
            rope_tables(&grid_positions(&input.rope, 0, grid.frames, grid.rows, grid.cols));
        let rope = Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)?;
        let mut samples = Vec::with_capacity(grid.batch);
        let mut contexts = Vec::with_capacity(grid.batch);
        for s in 0..grid.batch {
            samples.push(b.slice(&tokens, 0, s, 1)?);
            contexts.push(self.context(b, &text, image.as_ref(), s..s + 1)?);
        }
        drop((tokens, text, image));

        let mut pose = match animate.pose {
            Some(pose) => Some(self.pose_branch(b, input, animate, pose, grid)?),
            None => None,
        };
        // Under context windows the cache is filled by the pose branch alone before the call reads it.
        if let (Some(branch), Some(call)) = (pose.as_mut(), &animate.cache)
            && call.windowed
            && !branch.streams.is_empty()
        {
            let mut x = branch.streams.swap_remove(0);
            branch.streams.clear();
            for i in 0..self.config.layers {
                let layer = self.block_layer(b, i)?;
                let prefix = format!("blocks.{i}");
                let w = BlockWeights::new(&layer, &prefix);
                let m = self.block_modulation(b, &w, &branch.e0)?;
                call.cache.put(b, call.key, i, &x)?;
                x = self.pose_block(b, &w, &x, &m, &branch.contexts[0], &branch.rope)?.0;
            }
        }

        let reference_strength = animate.reference_strength;
        for i in 0..self.config.layers {
            if i < 64 && input.skip & (1u64 << i) != 0 {
                // A skipped block's pose state still reaches the next block, as ComfyUI runs it under a replace.
                if let Some(branch) = pose.as_mut().filter(|p| !p.streams.is_empty()) {
                    self.advance_pose(b, i, branch, animate)?;
                }
                continue;
            }
            let layer = self.block_layer(b, i)?;
            let prefix = format!("blocks.{i}");
            let w = BlockWeights::new(&layer, &prefix);
            let table = b.weight_to_tensor(&w.get("modulation")?, e0.dtype())?;
            let pose_kv = match pose.as_mut() {
                Some(branch) => Some(self.pose_keys_values(b, &w, i, branch, animate)?),
                None => None,
            };
            for (s, x) in samples.iter_mut().enumerate() {
                let m = super::model::sample_modulation(b, &e0, &table, s..s + 1, 1, d)?;
                let (q, k, mut v) = self.self_attention_heads(b, &w, x, &m, &rope)?;
                if reference_strength != 1.0 {
                    v = scale_leading_tokens(b, &v, frame_tokens, reference_strength)?;
                }
                let o = match &pose_kv {
                    None => self.attend(b, &q, &k, &v)?,
                    Some(kv) => {
                        let (k_pose, v_pose) = &kv[s % kv.len()];
                        self.attend_by_frame(
                            b,
                            &q,
                            &k,
                            &v,
                            k_pose,
                            v_pose,
                            grid.frames,
                            frame_tokens,
                        )?
                    }
                };
                drop((q, k, v));
                *x = self.finish_block(b, &w, x, &o, &m, &contexts[s], BlockAudio::Silent, None)?;
            }
        }
        drop((contexts, pose));

        // One timestep per sample (checked above), so `grid.groups` is 1.
        self.sample_heads(b, &self.head_weights(b)?, &e, samples, 0, grid)
    }

    /// The pose branch of a call with pose latents `pose`: its token streams (one per sample whose pose inputs
    /// differ; none when the cache holds every block), contexts, timestep-1 modulation input and RoPE.
    fn pose_branch<B: Backend>(
        &self,
        b: &B,
        input: &super::WanInput<'_, B>,
        animate: &Animate2Input<'_, B>,
        pose: &Tensor<B>,
        grid: &Grid,
    ) -> Result<PoseBranch<B>> {
        let frames = grid.frames.saturating_sub(1);
        let rows = match *pose.shape() {
            [n, POSE_CHANNELS, f, h, w]
                if (n == 1 || n == grid.batch) && f == frames && h == grid.h && w == grid.w =>
            {
                n
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "the pose branch has latents of {other:?}; expected [{} or 1, {POSE_CHANNELS}, {frames}, {}, {}] \
                     (the generation's frames minus the reference image's slot)",
                    grid.batch, grid.h, grid.w
                )));
            }
        };
        let context = animate.context.unwrap_or(input.context);
        let clip = animate.clip.or(input.clip);
        let (_, e0) = self.time_embedding(b, &[1.0])?;
        let positions = {
            let shifted =
                RopeOptions { shift: [0.0, 0.0, grid.cols as f64], ..RopeOptions::default() };
            grid_positions(&shifted, 1, frames, grid.rows, grid.cols)
        };
        let (cos, sin) = rope_tables(&positions);
        let rope = Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)?;
        // The samples share one stream when their pose latents, text and CLIP states are one row each; a
        // cache keeps the first sample's alone (ComfyUI's `take` repeats it to the batch).
        let shared =
            [Some(pose), Some(context), clip].into_iter().flatten().all(|t| t.shape()[0] == 1);
        let count = if shared || animate.cache.is_some() { 1 } else { grid.batch };
        let text = self.text_embedding(b, context)?;
        let image = self.image_embedding(b, clip, 1)?;
        let mut contexts = Vec::with_capacity(count);
        for s in 0..count {
            let text_row = text.row(b, s % text.states.dim(0)?)?;
            let image_row = match &image {
                Some((states, n)) => Some((b.slice(states, 0, s % states.dim(0)?, 1)?, *n)),
                None => None,
            };
            contexts.push(self.context(b, &text_row, image_row.as_ref(), 0..1)?);
        }
        let filled =
            animate.cache.as_ref().is_some_and(|c| c.cache.filled(c.key) == self.config.layers);
        let mut streams = Vec::new();
        if !filled {
            let ones = b.full(&[rows, MASK_CHANNELS, frames, grid.h, grid.w], 1.0, pose.dtype())?;
            let input = b.concat(&[pose, &ones, pose], 1)?;
            let pose_grid = Grid { batch: rows, frames, groups: 1, ..*grid };
            let tokens = self.patch_embedding(b, &input, &pose_grid, "patch_embedding")?;
            for s in 0..count {
                streams.push(b.slice(&tokens, 0, s % rows, 1)?);
            }
        }
        Ok(PoseBranch { streams, contexts, e0, rope })
    }

    /// Block `w`'s (`i`-th) pose keys and values `[1, H, N', 128]` for each stream: from the cache's input, or
    /// by running the block on each stream (its input kept in the cache first, when there is one); the values
    /// scaled by `pose_strength`.
    fn pose_keys_values<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        i: usize,
        branch: &mut PoseBranch<B>,
        animate: &Animate2Input<'_, B>,
    ) -> Result<Vec<(Tensor<B>, Tensor<B>)>> {
        let m = self.block_modulation(b, w, &branch.e0)?;
        let mut out = Vec::with_capacity(branch.streams.len().max(1));
        if branch.streams.is_empty() {
            let call = animate.cache.as_ref().ok_or_else(|| {
                Error::Invalid("the Wan Animate 2 pose branch has no input".to_owned())
            })?;
            let x = call.cache.take(b, call.key, i)?;
            let h = self.self_attention_input(b, &x, &m)?;
            let k =
                self.heads(b, &h, w, "self_attn.k", Some("self_attn.norm_k"), Some(&branch.rope))?;
            let v = self.heads(b, &h, w, "self_attn.v", None, None)?;
            out.push((k, v));
        } else {
            for (s, x) in branch.streams.iter_mut().enumerate() {
                if let (0, Some(call)) = (s, &animate.cache) {
                    call.cache.put(b, call.key, i, x)?;
                }
                let (next, k, v) =
                    self.pose_block(b, w, x, &m, &branch.contexts[s], &branch.rope)?;
                *x = next;
                out.push((k, v));
            }
        }
        if animate.pose_strength != 1.0 {
            for (_, v) in out.iter_mut() {
                *v = b.affine(v, animate.pose_strength, 0.0)?;
            }
        }
        Ok(out)
    }

    /// The pose streams through block `i` without using its keys and values (a block the generation skips).
    fn advance_pose<B: Backend>(
        &self,
        b: &B,
        i: usize,
        branch: &mut PoseBranch<B>,
        animate: &Animate2Input<'_, B>,
    ) -> Result<()> {
        let layer = self.block_layer(b, i)?;
        let prefix = format!("blocks.{i}");
        let w = BlockWeights::new(&layer, &prefix);
        self.pose_keys_values(b, &w, i, branch, animate).map(drop)
    }

    /// One pose stream `x` `[1, N', D]` through block `w` (ComfyUI's `forward_pose`): the block's output and
    /// its self-attention's roped keys and its values, as heads.
    fn pose_block<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        m: &super::model::Modulation<B>,
        context: &Context<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
        let (q, k, v) = self.self_attention_heads(b, w, x, m, rope)?;
        let o = self.attend(b, &q, &k, &v)?;
        drop(q);
        let x = self.finish_block(b, w, x, &o, m, context, BlockAudio::Silent, None)?;
        Ok((x, k, v))
    }

    /// The generation's self-attention by frame (ComfyUI's `forward_gen`): frame 0's queries attend to every
    /// token; frame j's to every token and pose frame j − 1's. Heads in, tokens `[1, N, D]` out.
    #[allow(clippy::too_many_arguments)]
    fn attend_by_frame<B: Backend>(
        &self,
        b: &B,
        q: &Tensor<B>,
        k: &Tensor<B>,
        v: &Tensor<B>,
        k_pose: &Tensor<B>,
        v_pose: &Tensor<B>,
        frames: usize,
        frame_tokens: usize,
    ) -> Result<Tensor<B>> {
        let mut parts = Vec::with_capacity(frames);
        for j in 0..frames {
            let q_j = b.slice(q, 2, j * frame_tokens, frame_tokens)?;
            let o = if j == 0 {
                self.attend(b, &q_j, k, v)?
            } else {
                let at = (j - 1) * frame_tokens;
                let k_j = b.concat(&[k, &b.slice(k_pose, 2, at, frame_tokens)?], 2)?;
                let v_j = b.concat(&[v, &b.slice(v_pose, 2, at, frame_tokens)?], 2)?;
                self.attend(b, &q_j, &k_j, &v_j)?
            };
            parts.push(o);
        }
        Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 1)?)
    }

    /// Block `w`'s modulation for the one-row embedding projection `e0` `[1, 6·D]`.
    fn block_modulation<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        e0: &Tensor<B>,
    ) -> Result<super::model::Modulation<B>> {
        let table = b.weight_to_tensor(&w.get("modulation")?, e0.dtype())?;
        super::model::sample_modulation(b, e0, &table, 0..1, 1, self.config.dim)
    }
}

/// Values `v` `[1, H, N, 128]` with their first `tokens` tokens scaled by `scale`.
fn scale_leading_tokens<B: Backend>(
    b: &B,
    v: &Tensor<B>,
    tokens: usize,
    scale: f32,
) -> Result<Tensor<B>> {
    let n = v.dim(2)?;
    let head = b.affine(&b.slice(v, 2, 0, tokens)?, scale, 0.0)?;
    if tokens >= n {
        return Ok(head);
    }
    Ok(b.concat(&[&head, &b.slice(v, 2, tokens, n - tokens)?], 2)?)
}
