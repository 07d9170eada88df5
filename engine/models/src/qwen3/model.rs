//! [`Qwen3`]: the decoder run up to the hidden state ComfyUI conditions Z-Image on (models.md §4.1, §4.2), up to
//! the hidden states FLUX.2 Klein conditions on (models-flux.md §5.3), and run whole to generate text
//! (`TextGenerate`); with images in the prompt for Qwen2.5-VL and Qwen3-VL ([`ImageTokens`]).
//!
//! Invariant: an image's tokens take the place of its `<|image_pad|>` and its DeepStack features (Qwen3-VL's)
//! are added at exactly those tokens after layers `0..features`; text rows are never touched by them.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Config, EMBED, LM_HEAD, NORM, Variant};
use crate::error::{Error, Result};

/// A Qwen3 text encoder: its config and its weights under the memory manager (loaded from
/// [`super::load_plan`]).
#[derive(Debug)]
pub struct Qwen3 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights, by the file's names without prefix.
    pub weights: Model,
}

impl Qwen3 {
    /// The encoder made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> Qwen3 {
        Qwen3 { config, weights }
    }

    /// The hidden state of `ids` `[1, N, hidden]` (f32) that ComfyUI conditions on: for Qwen3 the output of
    /// decoder layer `layers − 2` (transformers' `hidden_states[-2]`, ComfyUI's `layer_idx=-2`), without the
    /// final norm; for Qwen2.5-VL and Qwen3-VL the last layer's output through the final norm
    /// (`hidden_states[-1]`, `layer="last"`; Qwen3-VL's `layer_idx=-1` with the final norm, Mage-Flow's and
    /// Boogu's). Causal attention over positions 0..N−1, no padding. One layer's weights are on the device at a
    /// time.
    pub fn hidden_state<B: Backend>(&self, b: &B, ids: &[u32]) -> Result<Tensor<B>> {
        self.hidden_state_with_images(b, ids, &[])
    }

    /// [`Qwen3::hidden_state`] with images in the prompt (Qwen2.5-VL, Qwen3-VL): the first `images.len()`
    /// `<|image_pad|>` tokens of `ids` are each replaced by an image's tokens (so the output is longer than
    /// `ids`), positioned by M-RoPE as ComfyUI's `Qwen25_7BVLI` and `qwen2vl_mrope_position_ids` do: an image's
    /// tokens share the temporal position where it starts and count rows and columns from there; the text after
    /// it continues past its larger side. Qwen3-VL's images' DeepStack features are added at their tokens after
    /// the first layers.
    pub fn hidden_state_with_images<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
    ) -> Result<Tensor<B>> {
        self.last_hidden_state(b, ids, images, None, true)
    }

    /// Qwen2.5-VL's last decoder layer's output for `ids` `[1, N, hidden]` (f32) *without* the final norm
    /// (ComfyUI's `layer="hidden", layer_idx=-1` with `layer_norm_hidden_state=False`: Kandinsky 5's
    /// conditioning). Causal attention, no padding.
    pub fn last_layer_output<B: Backend>(&self, b: &B, ids: &[u32]) -> Result<Tensor<B>> {
        if self.config.variant != Variant::Qwen25Vl {
            return Err(Error::Invalid(
                "the last layer's output without the final norm is taken of Qwen2.5-VL".into(),
            ));
        }
        self.last_hidden_state(b, ids, &[], None, false)
    }

    /// [`Qwen3::hidden_state_with_images`] under ComfyUI's padding mask: only the first `attended` of `ids`
    /// (an image counting as its one `<|image_pad|>`) are attended to as keys; every position from there on
    /// attends to those alone. With images in the prompt, ComfyUI's `Qwen25_7BVLI` places the masked tokens
    /// after an image at position 1 on all three axes (it numbers only the attended ones); without, every token
    /// sits at its index. Every row is computed and returned, the masked ones too (LongCat-Image keeps them).
    ///
    /// With `attended` 0 (a prompt of pads alone, as ComfyUI's empty prompt for weighting is where there is no
    /// start token) every key is masked: ComfyUI's additive mask (`finfo.min / 4`) then swamps every score in
    /// f32, so each row weighs its causal keys equally.
    pub fn masked_hidden_state_with_images<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
        attended: usize,
    ) -> Result<Tensor<B>> {
        if attended > ids.len() || (attended == 0 && (!images.is_empty() || ids.is_empty())) {
            return Err(Error::Invalid(format!(
                "{attended} attended keys for {} tokens and {} images: at most all (none only for text)",
                ids.len(),
                images.len()
            )));
        }
        self.last_hidden_state(b, ids, images, Some(attended), true)
    }

    /// The last hidden state of `ids` with `images` in place, causal, under the padding mask from `attended`
    /// (ids' coordinates) when given; Qwen2.5-VL's through the final norm when `final_norm` says so.
    fn last_hidden_state<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
        attended: Option<usize>,
        final_norm: bool,
    ) -> Result<Tensor<B>> {
        // ComfyUI runs its text encoders in f32 on every device (`SDClipModel` embeds with
        // `out_dtype=torch.float32` and each layer's weights are cast to the activations' type).
        let b = &b.with_compute_dtype(DType::F32)?;
        let cfg = &self.config;
        if matches!(cfg.variant, Variant::Mistral3 | Variant::Llama3) {
            return Err(Error::Invalid(
                "Mistral Small's and Llama's conditionings are tapped hidden states, not one hidden state"
                    .into(),
            ));
        }
        let pieces = self.pieces(ids, images)?;
        let mut x = self.embed_prompt(b, &pieces)?;
        let mut positions = Piece::positions(&pieces);
        // Only Qwen2.5-VL's ComfyUI moves the masked tokens after an image (`Qwen25_7BVLI`); Qwen3-VL's
        // `qwen2vl_mrope_position_ids` leaves every position as it counts.
        let move_masked = cfg.variant == Variant::Qwen25Vl;
        let attended =
            attended.map(|a| Piece::masked_from(&pieces, a, &mut positions, move_masked));
        let (cos, sin) = rope_tables(b, cfg, &positions)?;
        let (layers, normed) = match cfg.variant {
            Variant::Qwen3 | Variant::Mistral3 | Variant::Llama3 | Variant::Gemma2 => {
                (cfg.layers.saturating_sub(1), false)
            }
            Variant::Qwen25Vl | Variant::Qwen3Vl => (cfg.layers, final_norm),
        };
        for i in 0..layers {
            let keys = match attended {
                Some(n) => Keys::Before(n),
                None => Keys::Causal,
            };
            x = self.layer(b, i, &x, &cos, &sin, keys)?;
            if let Some(features) = deepstack(b, cfg, &pieces, i)? {
                x = b.binary(&x, &features, BinaryOp::Add)?;
            }
        }
        if normed {
            let norm = self.weights.fetch(b, &[NORM])?;
            x = self.norm(b, &x, &norm.weight(0))?;
        }
        Ok(b.cast(&x, DType::F32)?)
    }

    /// The hidden states ComfyUI's FLUX.2 Klein encoder concatenates (`Flux2TEModel`): for each of `taps` in
    /// Hugging Face's numbering (0 the embeddings, `t` the output of layer `t − 1`; no final norm, but for the
    /// last layer's output, which ComfyUI and transformers both give through `model.norm` when the file has it),
    /// the states of `ids` `[1, N, hidden]`, joined per token in the order of `taps` →
    /// `[1, N, taps.len() · hidden]` f32.
    ///
    /// Only keys before `attended` are attended to, as ComfyUI's padding mask (added to the causal one) gives:
    /// positions before `attended` attend causally; every position from `attended` on (the pads) attends to
    /// keys `0..attended`, not to itself. Those rows are computed and returned too: ComfyUI passes them on.
    pub fn tapped_hidden_states<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        attended: usize,
        taps: &[usize],
    ) -> Result<Tensor<B>> {
        let n = ids.len();
        if attended == 0 || attended > n {
            self.check_ids(ids)?;
            return Err(Error::Invalid(format!(
                "{attended} attended keys for {n} tokens: at least one, at most all"
            )));
        }
        self.tapped(b, ids, &[], Some(attended), taps, true)
    }

    /// [`Qwen3::tapped_hidden_states`] with images in the prompt (Qwen3-VL, Qwen2.5-VL), attending causally to
    /// every token, or with `attended` to the keys before the `attended`-th id (an image counting as its one
    /// `<|image_pad|>` and attended as a whole: ComfyUI's padding mask, see
    /// [`Qwen3::masked_hidden_state_with_images`]): the first `images.len()` `<|image_pad|>` tokens of `ids` are
    /// each replaced by an image's tokens,
    /// at the M-RoPE positions [`Qwen3::hidden_state_with_images`] gives them, Qwen3-VL's DeepStack feature `k`
    /// added at them after layer `k` (so tap `k + 1` holds it, as ComfyUI's `Llama2_` collects the input of the
    /// next layer) → `[1, N', taps.len() · hidden]` f32, N' the prompt's length with the images in place. Taps in
    /// Hugging Face's numbering, the last layer's output through the final norm (Krea 2's twelve taps, none
    /// normed; Mage-Flow's and Boogu's the last, normed).
    pub fn tapped_hidden_states_with_images<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
        attended: Option<usize>,
        taps: &[usize],
    ) -> Result<Tensor<B>> {
        if let Some(n) = attended.filter(|&n| n == 0 || n > ids.len()) {
            return Err(Error::Invalid(format!(
                "{n} attended keys for {} tokens: at least one, at most all",
                ids.len()
            )));
        }
        self.tapped(b, ids, images, attended, taps, true)
    }

    /// The last layer's output before the final norm `[1, N', hidden]` (f32) of `ids` with `images` in place,
    /// attending as [`Qwen3::tapped_hidden_states_with_images`] does: ComfyUI's `layer="hidden"`,
    /// `layer_idx=-1` with `layer_norm_hidden_state=False` (its generic Qwen3-VL encoder's and JoyImage's).
    pub fn last_hidden_state_unnormed_with_images<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
        attended: Option<usize>,
    ) -> Result<Tensor<B>> {
        if let Some(n) = attended.filter(|&n| n == 0 || n > ids.len()) {
            return Err(Error::Invalid(format!(
                "{n} attended keys for {} tokens: at least one, at most all",
                ids.len()
            )));
        }
        self.tapped(b, ids, images, attended, &[self.config.layers], false)
    }

    /// The hidden states `taps` of `ids` with `images` in place, attending to the keys before `attended` (ids'
    /// coordinates) or causally to all; the last layer's output through the final norm where the variant's is
    /// and `final_norm` asks.
    fn tapped<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[ImageTokens<B>],
        attended: Option<usize>,
        taps: &[usize],
        final_norm: bool,
    ) -> Result<Tensor<B>> {
        // In f32 on every device, as ComfyUI runs its text encoders (see `hidden_state_with_images`).
        let b = &b.with_compute_dtype(DType::F32)?;
        let cfg = &self.config;
        let pieces = self.pieces(ids, images)?;
        let deepest = taps.iter().copied().max().ok_or_else(|| {
            Error::Invalid("tapped hidden states need at least one tap".to_owned())
        })?;
        // Qwen2.5-VL's last layer's output is taken through the final norm by [`Qwen3::hidden_state`], not here.
        if cfg.variant == Variant::Qwen25Vl && deepest >= cfg.layers {
            return Err(Error::Invalid(format!(
                "Qwen2.5-VL's tapped hidden states are its inner layers' outputs (below {}), not {deepest}",
                cfg.layers
            )));
        }
        if deepest > cfg.layers {
            return Err(Error::Invalid(format!(
                "hidden state {deepest} of an encoder with {} layers (0 to {} exist)",
                cfg.layers, cfg.layers
            )));
        }
        let mut x = self.embed_prompt(b, &pieces)?;
        // Text alone sits at its index on all three M-RoPE axes, which for every variant is plain RoPE.
        let mut positions = Piece::positions(&pieces);
        // The mask in the sequence's coordinates; Qwen2.5-VL's masked tokens after an image move to position 1,
        // Qwen3-VL's stay where they are.
        let move_masked = cfg.variant == Variant::Qwen25Vl;
        let attended =
            attended.map(|n| Piece::masked_from(&pieces, n, &mut positions, move_masked));
        let (cos, sin) = rope_tables(b, cfg, &positions)?;
        let mut states: Vec<Option<Tensor<B>>> = vec![None; taps.len()];
        for i in 0..=deepest {
            // Mistral's taps never are (ComfyUI's pruned file has no final norm; the full one taps layer 30 of 40).
            let normed_last = match cfg.variant {
                Variant::Qwen3 | Variant::Llama3 | Variant::Qwen3Vl | Variant::Gemma2 => true,
                Variant::Qwen25Vl | Variant::Mistral3 => false,
            };
            if i == cfg.layers && normed_last && final_norm && self.weights.info(NORM).is_some() {
                let norm = self.weights.fetch(b, &[NORM])?;
                x = self.norm(b, &x, &norm.weight(0))?;
            }
            for (state, _) in states.iter_mut().zip(taps).filter(|&(_, &t)| t == i) {
                *state = Some(b.cast(&x, DType::F32)?);
            }
            if i < deepest {
                let keys = match attended {
                    Some(n) => Keys::Before(n),
                    None => Keys::Causal,
                };
                x = self.layer(b, i, &x, &cos, &sin, keys)?;
                if let Some(features) = deepstack(b, cfg, &pieces, i)? {
                    x = b.binary(&x, &features, BinaryOp::Add)?;
                }
            }
        }
        let states: Vec<Tensor<B>> = states.into_iter().flatten().collect();
        match states.as_slice() {
            [one] => Ok(one.clone()),
            many => Ok(b.concat(&many.iter().collect::<Vec<_>>(), 2)?),
        }
    }

    /// `ids` cut into text and `images` ([`Piece::split`]), checked: images only for a variant that reads them,
    /// each image's tokens and DeepStack features `[rows · cols, hidden]`, the same number of features for
    /// every image (none for Qwen2.5-VL), every text id inside the vocabulary.
    fn pieces<'a, B: Backend>(
        &self,
        ids: &'a [u32],
        images: &'a [ImageTokens<B>],
    ) -> Result<Vec<Piece<'a, B>>> {
        let cfg = &self.config;
        let deepstack = match cfg.variant {
            Variant::Qwen3Vl => true,
            Variant::Qwen25Vl => false,
            Variant::Qwen3 | Variant::Mistral3 | Variant::Llama3 | Variant::Gemma2 => {
                if !images.is_empty() {
                    return Err(Error::Invalid(format!(
                        "a {:?} text encoder reads no images",
                        cfg.variant
                    )));
                }
                false
            }
        };
        let features = images.first().map_or(0, |image| image.deepstack.len());
        for image in images {
            let want = [image.rows * image.cols, cfg.hidden];
            let shapes_fit = std::iter::once(&image.embeds)
                .chain(&image.deepstack)
                .all(|t| t.shape() == want.as_slice());
            if !shapes_fit || image.deepstack.len() != features || (features > 0 && !deepstack) {
                return Err(Error::Invalid(format!(
                    "image tokens {:?} with DeepStack features {:?} for a {}×{} grid of {}-wide tokens \
                     ({} features per image{})",
                    image.embeds.shape(),
                    image.deepstack.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>(),
                    image.cols,
                    image.rows,
                    cfg.hidden,
                    features,
                    if deepstack { "" } else { "; Qwen2.5-VL takes none" }
                )));
            }
        }
        let pieces = Piece::split(ids, images)?;
        if pieces.is_empty() {
            self.check_ids(ids)?;
        }
        for piece in &pieces {
            if let Piece::Text(ids) = piece {
                self.check_ids(ids)?;
            }
        }
        Ok(pieces)
    }

    /// The embeddings of `pieces` `[1, N', hidden]`: text from the token table, images' tokens as given.
    fn embed_prompt<B: Backend>(&self, b: &B, pieces: &[Piece<'_, B>]) -> Result<Tensor<B>> {
        let layer = self.weights.fetch(b, &[EMBED])?;
        let mut parts = Vec::with_capacity(pieces.len());
        for piece in pieces {
            parts.push(match piece {
                Piece::Text(ids) => self.embed(b, ids, &layer.weight(0))?,
                Piece::Image(image) => b.cast(&image.embeds, b.compute_dtype())?,
            });
        }
        let x = if parts.len() == 1 {
            parts.remove(0)
        } else {
            b.concat(&parts.iter().collect::<Vec<_>>(), 0)?
        };
        let n = x.dim(0)?;
        Ok(x.reshape(&[1, n, self.config.hidden])?)
    }

    /// Generates text after `prompt` as ComfyUI's `BaseGenerate.generate` does: the prompt runs through every
    /// layer and the final norm, the output head (`lm_head.weight` when loaded, else the tied embedding) gives
    /// the last position's logits (f32 `[vocab]`), `pick`
    /// chooses the next token, which runs alone at the next position against the cached keys and values.
    /// Stops after `max_new` tokens or after one in `stop`; returns the tokens, the stop token included.
    /// `on_token` hears of each token (for progress and interruption; an error from it ends the run).
    pub fn generate<B: Backend>(
        &self,
        b: &B,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        pick: &mut dyn FnMut(Vec<f32>) -> u32,
        on_token: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<u32>> {
        self.generate_with_images(b, prompt, &[], ImageLayout::Grid, max_new, stop, pick, on_token)
    }

    /// [`Qwen3::generate`] with `images` in the prompt's first `<|image_pad|>` tokens (Qwen3-VL, Qwen2.5-VL),
    /// as ComfyUI's `BaseGenerate.generate` with image embeds, the images laid out as `layout` says; each
    /// generated token at the position after the prompt's last (its largest axis), counting up.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_with_images<B: Backend>(
        &self,
        b: &B,
        prompt: &[u32],
        images: &[ImageTokens<B>],
        layout: ImageLayout,
        max_new: usize,
        stop: &[u32],
        pick: &mut dyn FnMut(Vec<f32>) -> u32,
        on_token: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<u32>> {
        // In f32 on every device, as ComfyUI runs its text encoders (see `hidden_state_with_images`).
        let b = &b.with_compute_dtype(DType::F32)?;
        let cfg = &self.config;
        self.check_ids(prompt)?;
        let pieces = self.pieces(prompt, images)?;
        let mut positions = match layout {
            ImageLayout::Grid => Piece::positions(&pieces),
            ImageLayout::Inline => {
                let n = pieces.iter().map(Piece::len).sum::<usize>();
                (0..n).map(|p| [p as f32; 3]).collect()
            }
        };
        let next = positions.last().map_or(0.0, |p| p[0].max(p[1]).max(p[2]) + 1.0);
        positions.extend((0..max_new).map(|k| [next + k as f32; 3]));
        let (cos, sin) = rope_tables(b, cfg, &positions)?;
        let mut cache: Vec<Option<KvCache<B>>> = (0..cfg.layers).map(|_| None).collect();
        let mut generated: Vec<u32> = Vec::new();
        let mut position = 0;
        while generated.len() < max_new {
            let first = generated.is_empty();
            let mut x = match generated.last() {
                None => self.embed_prompt(b, &pieces)?,
                Some(&token) => {
                    let layer = self.weights.fetch(b, &[EMBED])?;
                    self.embed(b, &[token], &layer.weight(0))?.reshape(&[1, 1, cfg.hidden])?
                }
            };
            let n = x.dim(1)?;
            let cos = b.slice(&cos, 0, position, n)?;
            let sin = b.slice(&sin, 0, position, n)?;
            for (i, entry) in cache.iter_mut().enumerate() {
                x = self.layer(b, i, &x, &cos, &sin, Keys::Cached(entry))?;
                if first
                    && layout == ImageLayout::Grid
                    && let Some(features) = deepstack(b, cfg, &pieces, i)?
                {
                    x = b.binary(&x, &features, BinaryOp::Add)?;
                }
            }
            let last = b.slice(&x, 1, n - 1, 1)?;
            let logits = {
                let norm = self.weights.fetch(b, &[NORM])?;
                let last = self.norm(b, &last, &norm.weight(0))?;
                let head = if self.weights.info(LM_HEAD).is_some() { LM_HEAD } else { EMBED };
                let head = self.weights.fetch(b, &[head])?;
                let logits = b.linear(&last, &head.weight(0), None)?;
                b.to_f32(&b.cast(&logits, DType::F32)?)?
            };
            let token = pick(logits);
            generated.push(token);
            on_token(generated.len())?;
            if stop.contains(&token) {
                break;
            }
            self.check_ids(&[token])?;
            position += n;
        }
        Ok(generated)
    }

    /// An error for an empty input or an id outside the vocabulary.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Invalid("the Qwen3 encoder needs at least one token".into()));
        }
        match ids.iter().find(|&&id| id as usize >= self.config.vocab) {
            Some(id) => Err(Error::Invalid(format!(
                "token id {id} is outside the encoder's vocabulary of {}",
                self.config.vocab
            ))),
            None => Ok(()),
        }
    }

    /// Decoder layer `i` on x `[1, N, hidden]` at the positions of `cos`/`sin`, attending to the keys `keys`
    /// says.
    fn layer<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        cos: &Tensor<B>,
        sin: &Tensor<B>,
        keys: Keys<'_, B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let n = x.dim(1)?;
        let names = cfg.layer_names(i);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let w = self.weights.fetch(b, &names)?;
        let weights: Vec<Weight<'_>> = (0..names.len()).map(|j| w.weight(j)).collect();
        let p = Projections::of(cfg.variant, &weights)?;

        // Attention: Qwen3's per-head RMSNorm of q and k, then RoPE (rotate-half), GQA, causal.
        let h = self.norm(b, x, p.in_norm)?;
        let (hd, eps, rope) = (cfg.head_dim, cfg.rms_eps, Some((cos, sin)));
        let q_norm = p.q_norm.map(|w| (w, eps));
        let q = heads(b, &h, p.q, q_norm, rope, cfg.heads, hd)?;
        let k_norm = p.k_norm.map(|w| (w, eps));
        let mut k = heads(b, &h, p.k, k_norm, rope, cfg.kv_heads, hd)?;
        let mut v = heads(b, &h, p.v, None, None, cfg.kv_heads, hd)?;
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let a = match keys {
            Keys::Causal => b.attention(&q, &k, &v, AttentionMask::Causal, scale)?,
            Keys::Cached(cache) => {
                if let Some(past) = cache.take() {
                    k = b.concat(&[&past.keys, &k], 2)?;
                    v = b.concat(&[&past.values, &v], 2)?;
                }
                *cache = Some(KvCache { keys: k.clone(), values: v.clone() });
                b.attention(&q, &k, &v, AttentionMask::Causal, scale)?
            }
            // Every key masked: the mask swamps the scores, leaving equal weights over the causal keys.
            Keys::Before(0) => b.attention(&q, &k, &v, AttentionMask::Causal, 0.0)?,
            Keys::Before(attended) if attended < n => {
                // Rows before `attended` see a causal triangle of attended keys; the later rows see every
                // attended key (all are earlier) and none of their own: ComfyUI's causal + padding mask.
                let (k, v) = (b.slice(&k, 2, 0, attended)?, b.slice(&v, 2, 0, attended)?);
                let head = b.slice(&q, 2, 0, attended)?;
                let tail = b.slice(&q, 2, attended, n - attended)?;
                let head = b.attention(&head, &k, &v, AttentionMask::Causal, scale)?;
                let tail = b.attention(&tail, &k, &v, AttentionMask::None, scale)?;
                b.concat(&[&head, &tail], 2)?
            }
            Keys::Before(_) => b.attention(&q, &k, &v, AttentionMask::Causal, scale)?,
        };
        let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[1, n, cfg.heads * cfg.head_dim])?;
        let mut a = b.linear(&a, p.o, None)?;
        if let Some(norm) = p.post_attn_norm {
            a = self.norm(b, &a, norm)?;
        }
        let x = b.binary(x, &a, BinaryOp::Add)?;

        // SwiGLU MLP (Gemma 2's: GeGLU with tanh GELU, its output normalised).
        let g = self.norm(b, &x, p.post_norm)?;
        let act = match cfg.variant {
            Variant::Gemma2 => UnaryOp::GeluTanh,
            _ => UnaryOp::Silu,
        };
        let act = b.gated(&b.linear(&g, p.gate, None)?, &b.linear(&g, p.up, None)?, act)?;
        let mut f = b.linear(&act, p.down, None)?;
        if let Some(norm) = p.post_ffn_norm {
            f = self.norm(b, &f, norm)?;
        }
        Ok(b.binary(&x, &f, BinaryOp::Add)?)
    }

    /// The embeddings of `ids` from `table`, scaled by √hidden for Gemma 2 (ComfyUI's `ScaledEmbedding`: the
    /// f32 embeddings times the scale as an f32).
    fn embed<B: Backend>(&self, b: &B, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<B>> {
        let x = b.embedding(ids, table)?;
        match self.config.variant {
            Variant::Gemma2 => {
                let scale = (self.config.hidden as f64).sqrt() as f32;
                Ok(b.affine(&x, scale, 0.0)?)
            }
            _ => Ok(x),
        }
    }

    /// RMSNorm of `x` with the weight `w`: Gemma 2's scales by `1 + w`, the sum rounded to the weight's type
    /// when it is 16-bit (ComfyUI adds 1 to the parameter as it is stored, then casts it to the activations').
    fn norm<B: Backend>(&self, b: &B, x: &Tensor<B>, w: &Weight<'_>) -> Result<Tensor<B>> {
        let eps = self.config.rms_eps;
        if self.config.variant != Variant::Gemma2 {
            return Ok(b.rms_norm(x, Some(w), eps)?);
        }
        let stored = match w.dtype() {
            DType::F16 | DType::BF16 => w.dtype(),
            _ => DType::F32,
        };
        // `modulate` scales by 1 + s: s is the rounded 1 + w less 1 (exact in f32).
        let one_plus = b.affine(&b.weight_to_tensor(w, stored)?, 1.0, 1.0)?;
        let s = b.affine(&b.cast(&one_plus, x.dtype())?, 1.0, -1.0)?;
        let d = s.numel();
        Ok(b.modulate(&b.rms_norm(x, None, eps)?, &s.reshape(&[1, d])?, None)?)
    }
}

/// One layer's weights by role, from a fetch of [`Config::layer_names`].
struct Projections<'a, 'w> {
    in_norm: &'a Weight<'w>,
    q: (&'a Weight<'w>, Option<&'a Weight<'w>>),
    k: (&'a Weight<'w>, Option<&'a Weight<'w>>),
    v: (&'a Weight<'w>, Option<&'a Weight<'w>>),
    o: &'a Weight<'w>,
    q_norm: Option<&'a Weight<'w>>,
    k_norm: Option<&'a Weight<'w>>,
    /// Gemma 2's norm of the attention's output.
    post_attn_norm: Option<&'a Weight<'w>>,
    /// The norm before the MLP (`post_attention_layernorm` but in Gemma 2, `pre_feedforward_layernorm` there).
    post_norm: &'a Weight<'w>,
    /// Gemma 2's norm of the MLP's output.
    post_ffn_norm: Option<&'a Weight<'w>>,
    gate: &'a Weight<'w>,
    up: &'a Weight<'w>,
    down: &'a Weight<'w>,
}

impl<'a, 'w> Projections<'a, 'w> {
    /// The roles of `w`, in `variant`'s layer order.
    fn of(variant: Variant, w: &'a [Weight<'w>]) -> Result<Projections<'a, 'w>> {
        match (variant, w) {
            (
                Variant::Qwen3 | Variant::Qwen3Vl,
                [in_norm, q, k, v, o, q_norm, k_norm, post_norm, gate, up, down],
            ) => Ok(Projections {
                in_norm,
                q: (q, None),
                k: (k, None),
                v: (v, None),
                o,
                q_norm: Some(q_norm),
                k_norm: Some(k_norm),
                post_attn_norm: None,
                post_norm,
                post_ffn_norm: None,
                gate,
                up,
                down,
            }),
            (
                Variant::Qwen25Vl,
                [in_norm, q, q_bias, k, k_bias, v, v_bias, o, post_norm, gate, up, down],
            ) => Ok(Projections {
                in_norm,
                q: (q, Some(q_bias)),
                k: (k, Some(k_bias)),
                v: (v, Some(v_bias)),
                o,
                q_norm: None,
                k_norm: None,
                post_attn_norm: None,
                post_norm,
                post_ffn_norm: None,
                gate,
                up,
                down,
            }),
            (
                Variant::Mistral3 | Variant::Llama3,
                [in_norm, q, k, v, o, post_norm, gate, up, down],
            ) => Ok(Projections {
                in_norm,
                q: (q, None),
                k: (k, None),
                v: (v, None),
                o,
                q_norm: None,
                k_norm: None,
                post_attn_norm: None,
                post_norm,
                post_ffn_norm: None,
                gate,
                up,
                down,
            }),
            (
                Variant::Gemma2,
                [in_norm, q, k, v, o, post_attn, pre_ffn, post_ffn, gate, up, down],
            ) => Ok(Projections {
                in_norm,
                q: (q, None),
                k: (k, None),
                v: (v, None),
                o,
                q_norm: None,
                k_norm: None,
                post_attn_norm: Some(post_attn),
                post_norm: pre_ffn,
                post_ffn_norm: Some(post_ffn),
                gate,
                up,
                down,
            }),
            _ => Err(Error::Invalid(format!("{} weights for a {variant:?} layer", w.len()))),
        }
    }
}

/// The keys a layer's queries attend to.
enum Keys<'c, B: Backend> {
    /// Their own positions' and earlier ones (no padding).
    Causal,
    /// [`Keys::Causal`] after the cached keys of earlier calls, this call's appended to the cache.
    Cached(&'c mut Option<KvCache<B>>),
    /// Only the first `n` positions' keys, causally (ComfyUI's padding mask from position `n` on).
    Before(usize),
}

/// A layer's keys and values `[1, kv_heads, positions, head_dim]` so far (keys normalised and rotated).
struct KvCache<B: Backend> {
    keys: Tensor<B>,
    values: Tensor<B>,
}

/// `h` `[1, N, hidden]` projected by `proj` (weight and optional bias) into `count` heads
/// `[1, count, N, head_dim]`, each head RMS-normalised when `norm` (weight, ε) is given, then rotated
/// (rotate-half RoPE) when `rope` (cos, sin) is.
fn heads<B: Backend>(
    b: &B,
    h: &Tensor<B>,
    (proj, bias): (&Weight<'_>, Option<&Weight<'_>>),
    norm: Option<(&Weight<'_>, f32)>,
    rope: Option<(&Tensor<B>, &Tensor<B>)>,
    count: usize,
    head_dim: usize,
) -> Result<Tensor<B>> {
    let n = h.dim(1)?;
    let mut t = b.linear(h, proj, bias)?.reshape(&[1, n, count, head_dim])?;
    if let Some((w, eps)) = norm {
        t = b.rms_norm(&t, Some(w), eps)?;
    }
    if let Some((cos, sin)) = rope {
        t = b.rope(&t, cos, sin, RopeLayout::Half)?;
    }
    Ok(b.permute(&t, &[0, 2, 1, 3])?)
}

/// `<|image_pad|>`: where an image's tokens go.
pub const IMAGE_PAD: u32 = 151_655;

/// M-RoPE's split of a Qwen2.5-VL head's frequencies: the first 16 turn with the temporal position, the next
/// 24 with the row, the last 24 with the column (ComfyUI's `rope_dims`, transformers' `mrope_section`).
const MROPE_SECTIONS: [usize; 3] = [16, 24, 24];

/// Qwen3-VL's interleaved M-RoPE sections (ComfyUI's `rope_dims` with `interleaved_mrope`): frequency j turns
/// with the row when j ≡ 1 (mod 3) and j < 3 · 20, with the column when j ≡ 2 (mod 3) and j < 3 · 20, else with
/// the temporal position (24 of a 128-wide head's 64).
const INTERLEAVED_MROPE_SECTIONS: [usize; 3] = [24, 20, 20];

/// An image's tokens for the language model.
#[derive(Debug)]
pub struct ImageTokens<B: Backend> {
    /// The vision tower's output `[rows · cols, hidden]`, row by row.
    pub embeds: Tensor<B>,
    /// Qwen3-VL's DeepStack features, each `[rows · cols, hidden]`: feature `k` is added at the image's tokens
    /// after language-model layer `k` (ComfyUI's `deepstack_embeds`). Empty for Qwen2.5-VL.
    pub deepstack: Vec<Tensor<B>>,
    /// Rows of merged patches.
    pub rows: usize,
    /// Columns of merged patches.
    pub cols: usize,
}

// By hand: a derive would ask the backend itself to be `Clone`; the tensors are shared handles.
impl<B: Backend> Clone for ImageTokens<B> {
    fn clone(&self) -> ImageTokens<B> {
        ImageTokens {
            embeds: self.embeds.clone(),
            deepstack: self.deepstack.clone(),
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// How [`Qwen3::generate_with_images`] lays a prompt's images out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageLayout {
    /// Each image's tokens at their M-RoPE grid positions (see [`Qwen3::hidden_state_with_images`]), with
    /// Qwen3-VL's DeepStack features added in the first pass: ComfyUI's generic `Qwen3VLClipModel.generate`.
    Grid,
    /// The image tokens at running positions as text would be, no DeepStack features: ComfyUI's
    /// `SDClipModel.generate`, which JoyImage's encoder generates through.
    Inline,
}

/// A run of the prompt: text tokens, or an image where its `<|image_pad|>` was.
enum Piece<'a, B: Backend> {
    Text(&'a [u32]),
    Image(&'a ImageTokens<B>),
}

impl<'a, B: Backend> Piece<'a, B> {
    /// `ids` cut at its first `images.len()` `<|image_pad|>` tokens, each replaced by its image; an error when
    /// there are fewer such tokens than images or an image's tokens do not match its grid.
    fn split(ids: &'a [u32], images: &'a [ImageTokens<B>]) -> Result<Vec<Piece<'a, B>>> {
        let mut pieces = Vec::new();
        let mut rest = ids;
        for image in images {
            let Some(at) = rest.iter().position(|&id| id == IMAGE_PAD) else {
                return Err(Error::Invalid(format!(
                    "{} images for a prompt with fewer `<|image_pad|>` tokens",
                    images.len()
                )));
            };
            if image.embeds.shape().first() != Some(&(image.rows * image.cols)) {
                return Err(Error::Invalid(format!(
                    "image tokens {:?} for a {}×{} grid",
                    image.embeds.shape(),
                    image.cols,
                    image.rows
                )));
            }
            if at > 0 {
                pieces.push(Piece::Text(&rest[..at]));
            }
            pieces.push(Piece::Image(image));
            rest = &rest[at + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest));
        }
        Ok(pieces)
    }

    /// The tokens it puts in the sequence: its ids, or its image's tokens.
    fn len(&self) -> usize {
        match self {
            Piece::Text(ids) => ids.len(),
            Piece::Image(image) => image.rows * image.cols,
        }
    }

    /// Where ComfyUI's padding mask from the `attended`-th id starts in the sequence `pieces` make (an image's
    /// tokens in place of its id), with `positions` moved, when `move_masked` says so, as ComfyUI's
    /// `Qwen25_7BVLI` moves the masked tokens that follow an image: to 1 on every axis.
    fn masked_from(
        pieces: &[Piece<'_, B>],
        attended: usize,
        positions: &mut [[f32; 3]],
        move_masked: bool,
    ) -> usize {
        let (mut id, mut at, mut first_image_end) = (0usize, 0usize, None);
        let mut masked_from = None;
        for piece in pieces {
            let (ids, tokens) = match piece {
                Piece::Text(ids) => (ids.len(), ids.len()),
                Piece::Image(_) => (1, piece.len()),
            };
            if masked_from.is_none() && id + ids >= attended {
                // A mask never starts inside an image: its tokens are attended as a whole. (ComfyUI attends to
                // an image's tokens even after a pad; Kiln's mask covers everything from the first pad on, which
                // only a prompt writing `<|endoftext|>` before an image slot could tell apart.)
                masked_from = Some(match piece {
                    Piece::Text(_) => at + (attended - id),
                    Piece::Image(_) => at + tokens,
                });
            }
            id += ids;
            at += tokens;
            if matches!(piece, Piece::Image(_)) && first_image_end.is_none() {
                first_image_end = Some(at);
            }
        }
        let masked_from = masked_from.unwrap_or(at);
        if let Some(end) = first_image_end.filter(|_| move_masked) {
            for position in positions.iter_mut().skip(masked_from.max(end)) {
                *position = [1.0; 3];
            }
        }
        masked_from
    }

    /// Each token's (temporal, row, column) position: text counts up on all three; an image's tokens all sit
    /// at the temporal position where it starts, rows and columns counting from there, and the text after it
    /// resumes at that start plus the image's larger side.
    fn positions(pieces: &[Piece<'_, B>]) -> Vec<[f32; 3]> {
        let mut positions = Vec::new();
        let mut next = 0usize;
        for piece in pieces {
            match piece {
                Piece::Text(ids) => {
                    positions.extend((next..next + ids.len()).map(|p| [p as f32; 3]));
                    next += ids.len();
                }
                Piece::Image(image) => {
                    for row in 0..image.rows {
                        for col in 0..image.cols {
                            positions.push([next as f32, (next + row) as f32, (next + col) as f32]);
                        }
                    }
                    next += image.rows.max(image.cols);
                }
            }
        }
        positions
    }
}

/// RoPE's cosines and sines `[n, head_dim / 2]` (f32) at `positions`, computed as transformers and ComfyUI
/// do, in f32: inv_freq_j = 1 / θ^(2j / head_dim), angle = position · inv_freq_j, the position being the
/// temporal one for Qwen3 and the one of frequency j's M-RoPE section for Qwen2.5-VL (contiguous sections) and
/// Qwen3-VL (interleaved).
fn rope_tables<B: Backend>(
    b: &B,
    cfg: &Config,
    positions: &[[f32; 3]],
) -> Result<(Tensor<B>, Tensor<B>)> {
    let half = cfg.head_dim / 2;
    let theta = cfg.rope_theta as f32;
    let inv_freq: Vec<f32> =
        (0..half).map(|j| 1.0 / theta.powf((2 * j) as f32 / cfg.head_dim as f32)).collect();
    let axis = |j: usize| match cfg.variant {
        Variant::Qwen3 | Variant::Mistral3 | Variant::Llama3 | Variant::Gemma2 => 0,
        Variant::Qwen25Vl => {
            let [t, h, _] = MROPE_SECTIONS;
            usize::from(j >= t) + usize::from(j >= t + h)
        }
        Variant::Qwen3Vl => {
            let [_, h, w] = INTERLEAVED_MROPE_SECTIONS;
            match j % 3 {
                1 if j < 3 * h => 1,
                2 if j < 3 * w => 2,
                _ => 0,
            }
        }
    };
    let angles: Vec<f32> = positions
        .iter()
        .flat_map(|p| inv_freq.iter().enumerate().map(move |(j, &f)| p[axis(j)] * f))
        .collect();
    let n = positions.len();
    let cos: Vec<f32> = angles.iter().map(|&a| f64::from(a).cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|&a| f64::from(a).sin() as f32).collect();
    Ok((b.from_f32(&[n, half], &cos, DType::F32)?, b.from_f32(&[n, half], &sin, DType::F32)?))
}

/// The DeepStack features added after layer `layer` `[1, N', hidden]` (zero at text, an image's feature
/// `layer` at its tokens), or `None` when no image has one for that layer.
fn deepstack<B: Backend>(
    b: &B,
    cfg: &Config,
    pieces: &[Piece<'_, B>],
    layer: usize,
) -> Result<Option<Tensor<B>>> {
    let has = |piece: &Piece<'_, B>| matches!(piece, Piece::Image(image) if image.deepstack.len() > layer);
    if !pieces.iter().any(has) {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(pieces.len());
    for piece in pieces {
        parts.push(match piece {
            Piece::Image(image) if image.deepstack.len() > layer => {
                b.cast(&image.deepstack[layer], b.compute_dtype())?
            }
            Piece::Image(image) => {
                b.full(&[image.rows * image.cols, cfg.hidden], 0.0, b.compute_dtype())?
            }
            Piece::Text(ids) => b.full(&[ids.len(), cfg.hidden], 0.0, b.compute_dtype())?,
        });
    }
    let x = b.concat(&parts.iter().collect::<Vec<_>>(), 0)?;
    let n = x.dim(0)?;
    Ok(Some(x.reshape(&[1, n, cfg.hidden])?))
}
