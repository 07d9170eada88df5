//! InfiniteTalk (`wan2.1_infiniteTalk_single_fp16`, `…_multi_fp16`: a `MODEL_PATCH` for the Wan 2.1 I2V 14B;
//! ComfyUI's `MultiTalkModelPatch` in `comfy_extras/nodes_model_patch.py` and `comfy/ldm/wan/model_multitalk.py`):
//! talking video driven by one or two speakers' wav2vec2 features.
//!
//! - [`audio_windows`] and [`InfiniteTalk::project`]: each video frame reads the features of the 5 audio frames
//!   around it (25 per second, clamped to the clip, a clip too short padded with its first frame); the first
//!   latent frame's window (5 rows) and every later latent frame's 8 rows of its 4 video frames go through
//!   `audio_proj` (ReLU layers, then `tokens` tokens, layer-normed), each speaker's tokens of a latent frame
//!   after the other's.
//! - `InfiniteTalk::attention`: every block, after the text cross-attention, adds `scale` times an attention of
//!   each latent frame's (normed) tokens on its frame's audio tokens. With two speakers, each token's query is
//!   turned by a 1-D RoPE at a position saying which speaker's region it looks at most ([`speaker_positions`]
//!   of the map [`InfiniteTalk::attention_map`] makes from the block's self-attention), the first speaker's
//!   keys at 2 and the second's at 22.
//!
//! ComfyUI fixes 40 blocks, 40 heads and 12 × 768 features a frame; Kiln reads them from the file (heads as the
//! model's width / 128), so a shrunken patch (the tests') runs.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::HEAD_DIM;
use super::model::BlockWeights;
use crate::error::{Error, Result};
use crate::header::Header;

/// Audio frames a video frame reads: itself and two either side (ComfyUI's `audio_window`).
pub const WINDOW: usize = 5;
/// Rows a later latent frame reads of its four video frames' windows: the first frame's first three, the
/// middle two frames' centre rows, the last frame's last three.
pub const LATER_ROWS: usize = 8;
/// Video frames per later latent frame (the Wan 2.1 VAE's temporal stride).
const FRAMES_PER_LATENT: usize = 4;
/// LayerNorm ε of `audio_proj.norm` and the blocks' `norm_x` (torch's default).
const NORM_EPS: f32 = 1e-5;
/// The RoPE positions of a two-speaker attention: the first speaker's range, the second's (ComfyUI's
/// `class_range` 24 in intervals of 4). Keys sit at each range's centre.
const SPEAKER_RANGES: [(f32, f32); 2] = [(0.0, 4.0), (20.0, 24.0)];
/// The RoPE base of the two-speaker attention.
const SPEAKER_ROPE_BASE: f32 = 10_000.0;

/// The patch's widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TalkConfig {
    /// The Wan model's width it patches (5120).
    pub dim: usize,
    /// Width of `audio_proj`'s hidden layers (512).
    pub hidden: usize,
    /// Width of one audio frame's features: the encoder's layers after the first state times its width
    /// (12 × 768).
    pub features: usize,
    /// Audio tokens per latent frame and speaker (32).
    pub tokens: usize,
    /// Width of an audio token (768).
    pub audio_dim: usize,
    /// Blocks (40: one per Wan block).
    pub blocks: usize,
}

/// Every tensor of a patch of `cfg`: name and shape.
pub fn talk_expected(cfg: &TalkConfig) -> Vec<(String, Vec<usize>)> {
    let (d, hidden, a) = (cfg.dim, cfg.hidden, cfg.audio_dim);
    let mut out = Vec::with_capacity(10 + 8 * cfg.blocks);
    let mut linear = |name: String, rows: usize, cols: usize| {
        out.push((format!("{name}.weight"), vec![rows, cols]));
        out.push((format!("{name}.bias"), vec![rows]));
    };
    linear("audio_proj.proj1".to_owned(), hidden, WINDOW * cfg.features);
    linear("audio_proj.proj1_vf".to_owned(), hidden, LATER_ROWS * cfg.features);
    linear("audio_proj.proj2".to_owned(), hidden, hidden);
    linear("audio_proj.proj3".to_owned(), cfg.tokens * a, hidden);
    for i in 0..cfg.blocks {
        linear(format!("blocks.{i}.audio_cross_attn.q_linear"), d, d);
        linear(format!("blocks.{i}.audio_cross_attn.kv_linear"), 2 * d, a);
        linear(format!("blocks.{i}.audio_cross_attn.proj"), d, d);
    }
    out.push(("audio_proj.norm.weight".to_owned(), vec![a]));
    out.push(("audio_proj.norm.bias".to_owned(), vec![a]));
    for i in 0..cfg.blocks {
        out.push((format!("blocks.{i}.norm_x.weight"), vec![d]));
        out.push((format!("blocks.{i}.norm_x.bias"), vec![d]));
    }
    out
}

/// Recognises an InfiniteTalk patch (`audio_proj.proj1.weight`, as ComfyUI's `ModelPatchLoader` does): its
/// widths from the shapes, every tensor checked against them. `Ok(None)` for another file.
pub fn detect_infinite_talk(h: &Header) -> Result<Option<TalkConfig>> {
    if !h.has("audio_proj.proj1.weight") {
        return Ok(None);
    }
    let matrix = |name: &str| -> Result<(usize, usize)> {
        match h.values_shape(name).as_deref() {
            Some(&[rows, cols]) => Ok((rows, cols)),
            other => Err(h.unsupported(format!(
                "InfiniteTalk: `{}` is {other:?}, not a matrix",
                h.key(name)
            ))),
        }
    };
    let (hidden, first) = matrix("audio_proj.proj1.weight")?;
    let (projected, _) = matrix("audio_proj.proj3.weight")?;
    let audio_dim = match h.values_shape("audio_proj.norm.weight").as_deref() {
        Some(&[a]) if a > 0 && projected % a == 0 => a,
        other => {
            return Err(h.unsupported(format!(
                "InfiniteTalk: `{}` is {other:?}, not a width dividing proj3's {projected} rows",
                h.key("audio_proj.norm.weight")
            )));
        }
    };
    let (dim, _) = matrix("blocks.0.audio_cross_attn.proj.weight")?;
    if first % WINDOW != 0 || dim % HEAD_DIM != 0 {
        return Err(h.unsupported(format!(
            "InfiniteTalk: proj1 reads {first} values (not {WINDOW} audio frames) or the blocks are {dim} wide \
             (not heads of {HEAD_DIM})"
        )));
    }
    let blocks = h.gapless_blocks("blocks.", "InfiniteTalk's blocks")?;
    let cfg = TalkConfig {
        dim,
        hidden,
        features: first / WINDOW,
        tokens: projected / audio_dim,
        audio_dim,
        blocks,
    };
    for (name, shape) in talk_expected(&cfg) {
        if h.values_shape(&name).as_deref() != Some(shape.as_slice()) {
            return Err(h.unsupported(format!(
                "InfiniteTalk: `{}` is {:?}, expected {shape:?}",
                h.key(&name),
                h.values_shape(&name)
            )));
        }
    }
    Ok(Some(cfg))
}

/// The weights to load, by their names in the file.
pub fn infinite_talk_load_plan(h: &Header, cfg: &TalkConfig) -> LoadPlan {
    h.plan_by_name(talk_expected(cfg).into_iter().map(|(name, _)| name))
}

/// One speaker's features, `[frames, features]` row-major (25 frames a second).
pub struct SpeakerFeatures<'a> {
    /// The values.
    pub values: &'a [f32],
    /// Frames.
    pub frames: usize,
}

/// What `audio_proj` reads for video frames `start..end` (ComfyUI's `get_audio_embeds` and the row selection of
/// `project_audio_features`), per speaker: the first latent frame's window `[WINDOW · features]`, then each later
/// latent frame's `[LATER_ROWS · features]`. Video frame f reads the audio frames f − 2 … f + 2, clamped to the
/// clip, which, when shorter than `end`, is first padded with copies of its first frame.
#[derive(Debug)]
pub struct AudioWindows {
    /// Speakers.
    pub speakers: usize,
    /// Latent frames: 1 + (end − start − 1) / 4.
    pub latent_frames: usize,
    /// `[speakers, WINDOW · features]`.
    pub first: Vec<f32>,
    /// `[speakers, latent_frames − 1, LATER_ROWS · features]`.
    pub later: Vec<f32>,
}

/// [`AudioWindows`] of `speakers` (each `features` wide) for video frames `start..end`; `end − start` must be
/// 4k + 1 (a Wan video's length).
pub fn audio_windows(
    speakers: &[SpeakerFeatures<'_>],
    features: usize,
    start: usize,
    end: usize,
) -> Result<AudioWindows> {
    let length = end.saturating_sub(start);
    if length == 0 || !(length - 1).is_multiple_of(FRAMES_PER_LATENT) {
        return Err(Error::Invalid(format!(
            "InfiniteTalk reads audio for 4k + 1 video frames, not {length}"
        )));
    }
    let latent_frames = 1 + (length - 1) / FRAMES_PER_LATENT;
    let mut first = Vec::with_capacity(speakers.len() * WINDOW * features);
    let mut later =
        Vec::with_capacity(speakers.len() * (latent_frames - 1) * LATER_ROWS * features);
    for speaker in speakers {
        if speaker.frames == 0 || speaker.values.len() != speaker.frames * features {
            return Err(Error::Invalid(format!(
                "InfiniteTalk reads audio features of {features} values a frame, got {} values for {} frames",
                speaker.values.len(),
                speaker.frames
            )));
        }
        // The padded clip's frame i: past the end, the first frame again.
        let padded = speaker.frames.max(end);
        let frame = |i: usize| {
            let i = if i < speaker.frames { i } else { 0 };
            &speaker.values[i * features..][..features]
        };
        // Row r (0..5) of video frame f's window: audio frame f + r − 2, clamped to the padded clip.
        let row = |f: usize, r: usize| frame((f + r).saturating_sub(2).min(padded - 1));
        for r in 0..WINDOW {
            first.extend_from_slice(row(start, r));
        }
        for t in 0..latent_frames - 1 {
            let video = start + 1 + t * FRAMES_PER_LATENT;
            let rows = (0..3)
                .map(|r| (video, r))
                .chain([(video + 1, 2), (video + 2, 2)])
                .chain((2..WINDOW).map(|r| (video + 3, r)));
            for (f, r) in rows {
                later.extend_from_slice(row(f, r));
            }
        }
    }
    Ok(AudioWindows { speakers: speakers.len(), latent_frames, first, later })
}

/// A loaded InfiniteTalk patch.
pub struct InfiniteTalk {
    /// Its widths.
    pub config: TalkConfig,
    /// Its weights.
    pub weights: Model,
}

/// InfiniteTalk's part of one Wan call.
pub struct TalkInput<'a, B: Backend> {
    /// The patch.
    pub patch: &'a InfiniteTalk,
    /// The projected audio `[latent frames, speakers · tokens, audio_dim]` ([`InfiniteTalk::project`]'s,
    /// without its batch dimension): every sample of the batch reads it, as ComfyUI hands the same
    /// `audio_embeds` to every call.
    pub audio: &'a Tensor<B>,
    /// `WanInfiniteTalkToVideo`'s `audio_scale`.
    pub scale: f32,
    /// Two speakers' token masks `[2, rows · cols]` (1 where a token of the first latent frame is the speaker's),
    /// for a two-speaker patch; `None` with one speaker.
    pub masks: Option<&'a [f32]>,
}

impl InfiniteTalk {
    /// The audio tokens `[1, latent frames, speakers · tokens, audio_dim]` of `windows`, in the compute type
    /// (ComfyUI's `audio_proj` and the speakers' tokens joined per frame).
    pub fn project<B: Backend>(&self, b: &B, windows: &AudioWindows) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (s, n) = (windows.speakers, windows.latent_frames);
        if windows.first.len() != s * WINDOW * cfg.features
            || windows.later.len() != s * (n - 1) * LATER_ROWS * cfg.features
        {
            return Err(Error::Invalid(format!(
                "InfiniteTalk's projection reads audio features {} values a frame",
                cfg.features
            )));
        }
        let dtype = b.compute_dtype();
        let layer = |name: &str| {
            crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias(name))
        };
        let relu_linear = |x: &Tensor<B>, name: &str| -> Result<Tensor<B>> {
            let layer = layer(name)?;
            Ok(b.unary(&b.linear(x, &layer.weight(0), Some(&layer.weight(1)))?, UnaryOp::Relu)?)
        };
        let first = b.from_f32(&[s, 1, WINDOW * cfg.features], &windows.first, dtype)?;
        let mut x = relu_linear(&first, "audio_proj.proj1")?;
        if n > 1 {
            let later =
                b.from_f32(&[s, n - 1, LATER_ROWS * cfg.features], &windows.later, dtype)?;
            x = b.concat(&[&x, &relu_linear(&later, "audio_proj.proj1_vf")?], 1)?;
        }
        let x = relu_linear(&x, "audio_proj.proj2")?;
        let proj3 = layer("audio_proj.proj3")?;
        let x = b.linear(&x, &proj3.weight(0), Some(&proj3.weight(1)))?;
        let x = x.reshape(&[s, n, cfg.tokens, cfg.audio_dim])?;
        let norm = layer("audio_proj.norm")?;
        let x = b.layer_norm(&x, Some(&norm.weight(0)), Some(&norm.weight(1)), NORM_EPS)?;
        // [S, N_t, tokens, A] → [N_t, S, tokens, A]: each frame's speakers one after the other.
        let x = b.permute(&x, &[1, 0, 2, 3])?;
        Ok(x.reshape(&[1, n, s * cfg.tokens, cfg.audio_dim])?)
    }

    /// The names of block `i`'s weights.
    pub(super) fn block_names(i: usize) -> Vec<String> {
        [
            "norm_x",
            "audio_cross_attn.q_linear",
            "audio_cross_attn.kv_linear",
            "audio_cross_attn.proj",
        ]
        .iter()
        .flat_map(|name| crate::named::weight_and_bias(&format!("blocks.{i}.{name}")))
        .collect()
    }

    /// How much each token of a sample looks at each speaker (ComfyUI's `get_attn_map_with_target`): for roped
    /// self-attention queries `q` and keys `k` `[1, H, N, 128]`, the attention of every token on the first
    /// latent frame's `frame_tokens` tokens, summed over each speaker's masked tokens and divided by their
    /// count, averaged over the heads: `[2][N]` f32.
    pub fn attention_map<B: Backend>(
        b: &B,
        q: &Tensor<B>,
        k: &Tensor<B>,
        masks: &[f32],
        frame_tokens: usize,
    ) -> Result<[Vec<f32>; 2]> {
        let heads = q.dim(1)?;
        let tokens = q.dim(2)?;
        if masks.len() != 2 * frame_tokens {
            return Err(Error::Invalid(format!(
                "InfiniteTalk's speaker masks cover {} tokens a frame, the video has {frame_tokens}",
                masks.len() / 2
            )));
        }
        let first = b.slice(k, 2, 0, frame_tokens)?;
        // The masks as values [1, H, n, 2]: the attention's output is each token's mass on each mask.
        let mut values = Vec::with_capacity(heads * frame_tokens * 2);
        for _ in 0..heads {
            for j in 0..frame_tokens {
                values.extend([masks[j], masks[frame_tokens + j]]);
            }
        }
        let v = b.from_f32(&[1, heads, frame_tokens, 2], &values, q.dtype())?;
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let o = b.attention(q, &first, &v, AttentionMask::None, scale)?;
        // Summed over the heads on the device (a row of ones times [H, N·2]), so only [N, 2] comes back.
        let ones = b.full(&[1, 1, heads], 1.0, o.dtype())?;
        let summed = b.matmul(&ones, &o.reshape(&[1, heads, tokens * 2])?, false)?;
        let summed = b.to_f32(&b.cast(&summed, DType::F32)?)?;
        let counts: [f32; 2] =
            std::array::from_fn(|c| masks[c * frame_tokens..][..frame_tokens].iter().sum());
        Ok(std::array::from_fn(|c| {
            (0..tokens).map(|n| summed[n * 2 + c] / heads as f32 / (counts[c] + 1e-8)).collect()
        }))
    }

    /// Block `w`'s audio cross-attention on one sample's tokens `x` `[1, N, D]` of `frames` latent frames:
    /// `x + scale · proj(attention(q_linear(norm_x(x)), kv_linear(audio)))`, each frame's tokens attending to
    /// that frame's audio tokens; with `positions` (two speakers: each token's, [`speaker_positions`]), the
    /// queries and keys turned by the speakers' 1-D RoPE.
    pub(super) fn attention<B: Backend>(
        &self,
        b: &B,
        w: &BlockWeights<'_, '_>,
        x: &Tensor<B>,
        talk: &TalkInput<'_, B>,
        positions: Option<&[f32]>,
    ) -> Result<Tensor<B>> {
        let d = self.config.dim;
        let heads = d / HEAD_DIM;
        let tokens = x.dim(1)?;
        let [frames, audio_tokens, _] = talk.audio.shape()[..] else {
            return Err(Error::Invalid(
                "InfiniteTalk's audio must be [frames, tokens, width]".into(),
            ));
        };
        let linear = |t: &Tensor<B>, name: &str| -> Result<Tensor<B>> {
            Ok(b.linear(
                t,
                &w.get(&format!("audio_cross_attn.{name}.weight"))?,
                Some(&w.get(&format!("audio_cross_attn.{name}.bias"))?),
            )?)
        };
        let h = b.layer_norm(
            x,
            Some(&w.get("norm_x.weight")?),
            Some(&w.get("norm_x.bias")?),
            NORM_EPS,
        )?;
        let q = linear(&h, "q_linear")?.reshape(&[1, tokens, heads, HEAD_DIM])?;
        drop(h);
        let kv = linear(talk.audio, "kv_linear")?.reshape(&[
            frames,
            audio_tokens,
            2,
            heads,
            HEAD_DIM,
        ])?;
        let k = b.slice(&kv, 2, 0, 1)?.reshape(&[frames, audio_tokens, heads, HEAD_DIM])?;
        let v = b.slice(&kv, 2, 1, 1)?.reshape(&[frames, audio_tokens, heads, HEAD_DIM])?;
        drop(kv);
        let (q, k) = match positions {
            Some(positions) => {
                let (cos, sin) = rope_table(positions);
                let table = |values: Vec<f32>| {
                    b.from_f32(&[positions.len(), HEAD_DIM / 2], &values, DType::F32)
                };
                let q = b.rope(&q, &table(cos)?, &table(sin)?, RopeLayout::Interleaved)?;
                let keys = key_positions(audio_tokens);
                let (cos, sin) = rope_table(&keys);
                let table =
                    |values: Vec<f32>| b.from_f32(&[keys.len(), HEAD_DIM / 2], &values, DType::F32);
                let k = b.rope(&k, &table(cos)?, &table(sin)?, RopeLayout::Interleaved)?;
                (q, k)
            }
            None => (q, k),
        };
        // [1, N, H, 128] → [frames, H, N / frames, 128]: frame f's tokens against its audio tokens.
        let q =
            b.permute(&q.reshape(&[frames, tokens / frames, heads, HEAD_DIM])?, &[0, 2, 1, 3])?;
        let k = b.permute(&k, &[0, 2, 1, 3])?;
        let v = b.permute(&v, &[0, 2, 1, 3])?;
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
        drop((q, k, v));
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[1, tokens, d])?;
        let y = linear(&o, "proj")?;
        Ok(b.binary(x, &b.affine(&y, talk.scale, 0.0)?, BinaryOp::Add)?)
    }
}

/// Each token's RoPE position in a two-speaker attention (ComfyUI's `SingleStreamMultiAttention`): each
/// speaker's map row min-max normalised into its range (0–4 for the first, 20–24 for the second), and each token takes the position
/// of the speaker it looks at more (the first on a tie), in f32 as ComfyUI computes it.
pub fn speaker_positions(map: &[Vec<f32>; 2]) -> Vec<f32> {
    let scaled: Vec<Vec<f32>> = map
        .iter()
        .zip(SPEAKER_RANGES)
        .map(|(row, (low, high))| {
            let min = row.iter().copied().fold(f32::INFINITY, f32::min);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter().map(|v| (v - min) / (max - min + 1e-8) * (high - low) + low).collect()
        })
        .collect();
    (0..map[0].len())
        .map(|n| if map[1][n] > map[0][n] { scaled[1][n] } else { scaled[0][n] })
        .collect()
}

/// The positions of a frame's audio keys in a two-speaker attention: the first speaker's tokens (the first
/// half) at the centre of its range, the second's at the centre of the second's.
fn key_positions(tokens: usize) -> Vec<f32> {
    let centre = |(low, high): (f32, f32)| (low + high) / 2.0;
    (0..tokens).map(|j| centre(SPEAKER_RANGES[usize::from(j >= tokens / 2)])).collect()
}

/// The cosines and sines `[positions, 64]` of the speakers' 1-D RoPE over a head (pair p turned by
/// position · base^(−2p / 128)), in f32 as ComfyUI's `RotaryPositionalEmbedding1D`.
fn rope_table(positions: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let freqs: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|p| 1.0 / SPEAKER_ROPE_BASE.powf((2 * p) as f32 / HEAD_DIM as f32))
        .collect();
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for &position in positions {
        for f in &freqs {
            let angle = position * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_latent_frame_reads_three_two_three_rows_of_its_four_frames() {
        // Feature value = frame index, one value a frame; 9 frames, window 0..9.
        let values: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let speaker = [SpeakerFeatures { values: &values, frames: 9 }];
        let w = audio_windows(&speaker, 1, 0, 9).unwrap();
        assert_eq!(w.latent_frames, 3);
        assert_eq!(w.first, [0.0, 0.0, 0.0, 1.0, 2.0]);
        // Video frames 1..=4: frame 1's rows 0..3 (−1, 0, 1 → 0, 0, 1), frames 2 and 3 centres, frame 4's
        // rows 2..5 (4, 5, 6).
        assert_eq!(&w.later[..8], [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // Frames 5..=8: 8's window runs to 10, past the clip: clamped to its last frame.
        assert_eq!(&w.later[8..], [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 8.0, 8.0]);
    }

    #[test]
    fn a_short_clip_is_padded_with_its_first_frame() {
        let values = [7.0, 1.0, 2.0];
        let speaker = [SpeakerFeatures { values: &values, frames: 3 }];
        let w = audio_windows(&speaker, 1, 0, 5).unwrap();
        assert_eq!(w.first, [7.0, 7.0, 7.0, 1.0, 2.0]);
        assert_eq!(w.later, [7.0, 7.0, 1.0, 2.0, 7.0, 7.0, 7.0, 7.0]);
        let err = audio_windows(&speaker, 1, 0, 4).unwrap_err().to_string();
        assert!(err.contains("4k + 1"), "{err}");
    }

    #[test]
    fn each_token_takes_the_position_of_the_speaker_it_looks_at_more() {
        let map = [vec![0.1, 0.5, 0.3], vec![0.2, 0.1, 0.3]];
        let got = speaker_positions(&map);
        // Row 0 spans 0.1..0.5 → 0..4; row 1 spans 0.1..0.3 → 20..24; a tie takes the first speaker.
        let want = [22.0, 4.0, 2.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?}");
        }
        assert_eq!(key_positions(4), [2.0, 2.0, 22.0, 22.0]);
    }
}
