//! [`Flux`]: the FLUX.1 and FLUX.2 DiT forward pass in ComfyUI's order (models-flux.md §4.2), reading one
//! block's weights at a time through [`Model::fetch`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{
    Approximator, CHROMA_IN_DIM, CHROMA_MOD_ROWS, CHROMA_PREFIX, Config, EPS, Generation, HEAD_DIM,
    Layout, T_FREQ_DIM,
};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::fp16::finite_in_f16;
use crate::latent_tokens::{
    PatchOrder, SideBySide, batched_reference, padded, patchify, reference_sides, to_batch,
    unpatchify,
};
use crate::rope::Rope;

/// The q/k RMS norms' ε: ComfyUI's `RMSNorm` has none, so torch takes f32's machine epsilon (also for
/// bf16 and f16 inputs, whose norm computes in f32).
const QK_EPS: f32 = f32::EPSILON;

/// The text length FLUX.2 sees: shorter conditionings are left-padded with zero rows (ComfyUI's
/// `Flux2.extra_conds`).
const FLUX2_TEXT_LEN: usize = 512;

/// A FLUX DiT: its config, the layout its file was in, and its weights (ComfyUI names, no prefix) under the
/// memory manager.
pub struct Flux {
    /// The hyperparameters.
    pub config: Config,
    /// The file's key layout (diffusers' final modulation is (scale, shift)).
    pub layout: Layout,
    /// The weights.
    pub weights: Model,
}

/// What one model call takes besides the latents.
pub struct FluxInput<'a, B: Backend> {
    /// Latents `[B, in_channels, h, w]` in model space (Fill's and the control models' extra channels already
    /// joined), any float dtype.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ: the FLUX model samplings hand the net σ).
    pub timesteps: &'a [f32],
    /// The text features `[B, N, text_dim]` (FLUX.1: T5-XXL's; FLUX.2: the encoder's three hidden states).
    pub context: &'a Tensor<B>,
    /// CLIP-L's pooled vector `[B, ≥ vec_dim]` (`None`: zeros, as ComfyUI feeds a conditioning without one);
    /// FLUX.2 has no pooled input and ignores it.
    pub pooled: Option<&'a Tensor<B>>,
    /// The distilled guidance per sample; `None` leaves the guidance embedding out (`FluxDisableGuidance`).
    /// Models without `guidance_in` (schnell, Klein) ignore it.
    pub guidance: Option<&'a [f32]>,
    /// Reference latents `[1 or B, C, h, w]` in model space (Kontext, FLUX.2 edits), placed after the image's
    /// tokens.
    pub references: &'a [Tensor<B>],
    /// How the references are placed (`offset`, Kontext's default; `index`, FLUX.2's; `uxo`;
    /// `index_timestep_zero`, FLUX.2 only: as `index`, the references modulated at timestep 0).
    pub method: Option<&'a str>,
    /// `FluxKVCache`'s store for this sampling run: the first call with references fills it with their keys
    /// and values in every block; later calls leave the reference tokens out and attend to the stored ones.
    pub kv_cache: Option<&'a KvCache<B>>,
    /// Tokens `[1 or B, n, dim]` already in the model's hidden space put before the text's after `txt_in`, at
    /// position zero (USO's style tokens, which ComfyUI's `USOStyleReference` adds by a `post_input` patch).
    pub text_prefix: Option<&'a Tensor<B>>,
}

/// `FluxKVCache`'s keys and values of the reference tokens, per block (`double_i`, `single_i`), as the first
/// model call of a sampling run computed them: after the q/k norms, before RoPE, `[B, ref tokens, H, 128]`.
pub struct KvCache<B: Backend> {
    blocks: Mutex<KvBlocks<B>>,
}

/// Each block's stored (keys, values).
type KvBlocks<B> = BTreeMap<String, (Tensor<B>, Tensor<B>)>;

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        KvCache { blocks: Mutex::new(BTreeMap::new()) }
    }
}

impl<B: Backend> KvCache<B> {
    /// An empty store (the next call with references fills it).
    pub fn new() -> KvCache<B> {
        KvCache::default()
    }

    /// Whether a call has filled it.
    pub fn is_filled(&self) -> bool {
        self.lock().map(|blocks| !blocks.is_empty()).unwrap_or(false)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, KvBlocks<B>>> {
        self.blocks
            .lock()
            .map_err(|_| Error::Invalid("a FLUX KV cache was poisoned by a failed call".to_owned()))
    }
}

/// What a block's attention does with the KV cache this call.
enum KvMode<'a, B: Backend> {
    /// No cache, or no references: plain attention.
    Off,
    /// Store the last `ref_tokens` keys and values of each block.
    Record { cache: &'a KvCache<B>, ref_tokens: usize },
    /// The reference tokens are left out: append each block's stored keys and values.
    Replay { cache: &'a KvCache<B> },
}

impl<B: Backend> Clone for KvMode<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for KvMode<'_, B> {}

/// What a block of one call reads besides its input: SiLU(vec) (FLUX.1 and FLUX.2, not Chroma), the modulations
/// given to it (FLUX.2's shared ones, Chroma's own; FLUX.1's blocks compute theirs from SiLU(vec)), the RoPE
/// table and the KV cache's mode.
struct Block<'a, B: Backend> {
    silu_vec: Option<&'a Tensor<B>>,
    /// A double block's (image, text) modulations.
    double: Option<DoublePair<'a, B>>,
    /// A single block's modulation.
    single: Option<&'a TokenModulation<B>>,
    rope: &'a Rope<B>,
    kv: KvMode<'a, B>,
}

/// A double block's image and text streams' modulations (attention, MLP).
type DoublePair<'a, B> = (&'a [TokenModulation<B>; 2], &'a [TokenModulation<B>; 2]);

/// A double block's image and text streams' own modulations (attention, MLP).
type StreamPair<B> = ([TokenModulation<B>; 2], [TokenModulation<B>; 2]);

/// Chroma's modulations of one call, every block's from its distilled guidance MLP.
struct ChromaModulation<B: Backend> {
    /// Each double block's (image, text) stream modulations.
    double: Vec<StreamPair<B>>,
    /// Each single block's.
    single: Vec<TokenModulation<B>>,
    /// The final layer's (shift, scale), `[B, D]`.
    last: (Tensor<B>, Tensor<B>),
}

/// The modulation of a run of tokens: one for all of them, or (`index_timestep_zero`) one for the first `at`
/// tokens and another, at timestep 0, for the reference tokens after them.
enum TokenModulation<B: Backend> {
    /// Every token alike.
    Uniform(Modulation<B>),
    /// Tokens before `at` by `before`, the rest by `after`.
    Split { at: usize, before: Modulation<B>, after: Modulation<B> },
}

impl<B: Backend> TokenModulation<B> {
    /// `f(modulation, tokens)` for each run of `x` `[B, L, D]`, joined back along the tokens.
    fn by_run(
        &self,
        b: &B,
        x: &Tensor<B>,
        f: impl Fn(&Modulation<B>, &Tensor<B>) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        match self {
            TokenModulation::Uniform(m) => f(m, x),
            TokenModulation::Split { at, before, after } => {
                let len = x.dim(1)?;
                if *at >= len {
                    return f(before, x);
                }
                let first = f(before, &b.slice(x, 1, 0, *at)?)?;
                let rest = f(after, &b.slice(x, 1, *at, len - at)?)?;
                Ok(b.concat(&[&first, &rest], 1)?)
            }
        }
    }

    /// LayerNorm(x) · (1 + scale) + shift, run by run.
    fn modulated(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        self.by_run(b, x, |m, t| m.modulated(b, t, EPS))
    }

    /// x + y · gate, the gate run by run.
    fn gated_add(&self, b: &B, x: &Tensor<B>, y: &Tensor<B>) -> Result<Tensor<B>> {
        let gated = self.by_run(b, y, |m, t| m.gated(b, t))?;
        Ok(b.binary(x, &gated, BinaryOp::Add)?)
    }
}

/// Where the blocks of one call take their modulations from: FLUX.2's shared ones, Chroma's table, or (FLUX.1)
/// SiLU(vec), from which each block computes its own.
struct Modulations<'a, B: Backend> {
    shared: Option<&'a SharedModulation<B>>,
    chroma: Option<&'a ChromaModulation<B>>,
    silu_vec: Option<&'a Tensor<B>>,
}

impl<B: Backend> Clone for Modulations<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Modulations<'_, B> {}

/// FLUX.2's three modulations, computed once per call and shared by every block.
struct SharedModulation<B: Backend> {
    /// The double blocks' image stream (attention, MLP).
    img: [TokenModulation<B>; 2],
    /// The double blocks' text stream.
    txt: [TokenModulation<B>; 2],
    /// The single blocks.
    single: TokenModulation<B>,
}

/// References ready for patchifying, each with its placement.
type Placed<B> = Vec<(Tensor<B>, Placement)>;

/// Where a latent's token grid sits on the RoPE axes.
#[derive(Debug, Clone, Copy)]
struct Placement {
    index: i64,
    rows: usize,
    cols: usize,
    row_offset: usize,
    col_offset: usize,
}

impl Placement {
    /// Appends the grid's positions, row-major: (index, r + row_offset, s + col_offset, 0).
    fn extend(&self, out: &mut Vec<[i64; 4]>) {
        let (ro, co) = (self.row_offset as i64, self.col_offset as i64);
        for r in 0..self.rows as i64 {
            out.extend((0..self.cols as i64).map(|s| [self.index, r + ro, s + co, 0]));
        }
    }
}

/// A linear layer's weight and bias (FLUX.2 has none) by their places in a fetched [`Layer`].
#[derive(Debug, Clone, Copy)]
struct Linear {
    weight: usize,
    bias: Option<usize>,
}

/// The names a block fetches, built with the places of its layers in the fetched [`Layer`].
struct Names {
    names: Vec<String>,
    biases: bool,
}

impl Names {
    fn new(generation: Generation) -> Names {
        Names { names: Vec::with_capacity(32), biases: generation.biases() }
    }

    /// One tensor.
    fn one(&mut self, name: String) -> usize {
        self.names.push(name);
        self.names.len() - 1
    }

    /// A linear layer `stem` (`.weight`, and `.bias` where the generation has biases).
    fn linear(&mut self, stem: &str) -> Linear {
        let weight = self.one(format!("{stem}.weight"));
        let bias = self.biases.then(|| self.one(format!("{stem}.bias")));
        Linear { weight, bias }
    }

    /// The names as the fetch takes them.
    fn as_strs(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }
}

/// `layer`'s linear `lin` of `x`.
fn apply<B: Backend>(b: &B, layer: &Layer<'_>, lin: Linear, x: &Tensor<B>) -> Result<Tensor<B>> {
    let bias = lin.bias.map(|i| layer.weight(i));
    Ok(b.linear(x, &layer.weight(lin.weight), bias.as_ref())?)
}

/// The weights of one stream of a double block.
#[derive(Clone, Copy)]
struct StreamWeights {
    /// FLUX.1's own modulation (FLUX.2 shares one).
    modulation: Option<Linear>,
    qkv: Linear,
    proj: Linear,
    mlp_in: Linear,
    mlp_out: Linear,
    q_norm: usize,
    k_norm: usize,
}

impl Flux {
    /// A model from its config, its file's layout and its loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, layout: Layout, weights: Model) -> Flux {
        Flux { config, layout, weights }
    }

    /// ComfyUI's model output v = ε − x₀ (no sign flip) for `input`, f32 `[B, C, h, w]` (16 channels for
    /// FLUX.1, 128 for FLUX.2). Computes in `b.compute_dtype()`; odd `h`/`w` are padded circularly and cropped
    /// back.
    pub fn forward<B: Backend>(&self, b: &B, input: &FluxInput<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let generation = cfg.generation;
        let patch = generation.patch();
        let (batch, h, w) = self.check_inputs(input)?;
        let dt = b.compute_dtype();
        let (x, rows, cols) = padded(b, &b.cast(input.x, dt)?, patch)?;
        let image_len = rows * cols;
        let context = self.text_input(b, input.context)?;
        let prefix_len = match input.text_prefix {
            Some(prefix) => prefix.dim(1)?,
            None => 0,
        };
        let text_len = prefix_len + context.dim(1)?;
        let mut tokens = vec![patchify(b, &x, patch)?];
        let mut positions: Vec<[i64; 4]> = vec![[0; 4]; prefix_len];
        let context_len = text_len - prefix_len;
        match generation {
            // LongCat-Image's and Ovis-Image's text counts along rows and columns (ComfyUI's `txt_ids_dims`
            // [1, 2]).
            Generation::One if cfg.longcat || cfg.ovis => {
                positions.extend((0..context_len as i64).map(|l| [0, l, l, 0]))
            }
            Generation::One => positions.resize(text_len, [0; 4]),
            Generation::Two => positions.extend((0..context_len as i64).map(|l| [0, 0, 0, l])),
        }
        // LongCat-Image moves every latent past the text: 1 on the index axis, the text's length on the rows and
        // columns (`model_base.LongCatImage`'s `rope_options`).
        let shift = |place: Placement| match cfg.longcat {
            true => Placement {
                index: place.index + 1,
                row_offset: place.row_offset + context_len,
                col_offset: place.col_offset + context_len,
                ..place
            },
            false => place,
        };
        let image = shift(Placement { index: 0, rows, cols, row_offset: 0, col_offset: 0 });
        image.extend(&mut positions);
        // ComfyUI's Chroma takes no reference latents: it leaves them out.
        let (mut references, timestep_zero) = match cfg.approximator {
            Some(_) => (Vec::new(), false),
            None => self.place_references(b, input, batch, (rows, cols))?,
        };
        for (_, place) in &mut references {
            *place = shift(*place);
        }
        let kv = match input.kv_cache {
            Some(cache) if !references.is_empty() && cache.is_filled() => KvMode::Replay { cache },
            Some(cache) if !references.is_empty() => KvMode::Record {
                cache,
                ref_tokens: references.iter().map(|(_, p)| p.rows * p.cols).sum(),
            },
            _ => KvMode::Off,
        };
        for (reference, place) in references {
            place.extend(&mut positions);
            // ComfyUI's `post_input` patch drops the references' tokens once their keys and values are stored;
            // their positions stay in the RoPE table, whose rows past the sequence belong to the stored keys.
            if !matches!(kv, KvMode::Replay { .. }) {
                tokens.push(patchify(b, &reference, patch)?);
            }
        }
        let rope = rope_table(b, &positions, generation)?;

        let chroma = match cfg.approximator {
            Some(approximator) => Some(self.chroma_modulation(
                b,
                (input.timesteps, input.guidance),
                batch,
                approximator,
            )?),
            None => None,
        };
        let silu_vec = match chroma {
            Some(_) => None,
            None => {
                let vec = self.vector(b, input, input.timesteps, batch)?;
                Some(b.unary(&vec, UnaryOp::Silu)?)
            }
        };
        // FLUX.2's references under `index_timestep_zero` are modulated at timestep 0.
        let silu_vec_zero = if timestep_zero {
            let zeros = vec![0.0; batch];
            Some(b.unary(&self.vector(b, input, &zeros, batch)?, UnaryOp::Silu)?)
        } else {
            None
        };
        let shared = match (generation, &silu_vec) {
            (Generation::Two, Some(silu_vec)) => Some(self.shared_modulation(
                b,
                silu_vec,
                silu_vec_zero.as_ref(),
                (text_len, image_len),
            )?),
            _ => None,
        };
        let img = {
            let mut names = Names::new(generation);
            let lin = names.linear("img_in");
            let layer = self.fetch(b, &names.as_strs())?;
            let tokens: Vec<&Tensor<B>> = tokens.iter().collect();
            apply(b, &layer, lin, &b.concat(&tokens, 1)?)?
        };
        drop(tokens);
        let txt = {
            let mut names = Names::new(generation);
            let lin = names.linear("txt_in");
            let layer = self.fetch(b, &names.as_strs())?;
            let txt = apply(b, &layer, lin, &context)?;
            match input.text_prefix {
                Some(prefix) => {
                    let prefix = to_batch(b, &b.cast(prefix, dt)?, batch)?;
                    b.concat(&[&prefix, &txt], 1)?
                }
                None => txt,
            }
        };
        drop(context);
        let modulations = Modulations {
            shared: shared.as_ref(),
            chroma: chroma.as_ref(),
            silu_vec: silu_vec.as_ref(),
        };
        let joint = self.blocks(b, img, txt, &modulations, &rope, kv)?;
        let img = b.slice(&joint, 1, text_len, image_len)?;
        drop(joint);

        // Final layer: adaLN (shift, scale) in ComfyUI's files (Chroma's from its MLP), then the projection to
        // patches.
        let mut names = Names::new(generation);
        let ada = silu_vec.as_ref().map(|_| names.linear("final_layer.adaLN_modulation.1"));
        let proj = names.linear("final_layer.linear");
        let layer = self.fetch(b, &names.as_strs())?;
        let (shift, scale) = match (&chroma, ada, &silu_vec) {
            (Some(c), _, _) => c.last.clone(),
            (None, Some(ada), Some(silu_vec)) => {
                let emb = apply(b, &layer, ada, silu_vec)?;
                let (first, second) =
                    (b.slice(&emb, -1, 0, cfg.dim)?, b.slice(&emb, -1, cfg.dim, cfg.dim)?);
                if self.layout.final_scale_first() { (second, first) } else { (first, second) }
            }
            _ => return Err(sets_error()),
        };
        let y = b.modulate(&b.layer_norm(&img, None, None, EPS)?, &scale, Some(&shift))?;
        let y = apply(b, &layer, proj, &y)?;
        let mut out = unpatchify(
            b,
            &y,
            generation.latent_channels(),
            (rows, cols),
            patch,
            PatchOrder::ChannelMajor,
        )?;
        if rows * patch > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * patch > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        Ok(b.cast(&out, DType::F32)?)
    }

    /// The double blocks over the image tokens `img` and the text tokens `txt` (both `[B, ·, D]`), then the single
    /// blocks over the joint sequence (text first): that sequence after the last block.
    fn blocks<B: Backend>(
        &self,
        b: &B,
        mut img: Tensor<B>,
        mut txt: Tensor<B>,
        modulations: &Modulations<'_, B>,
        rope: &Rope<B>,
        kv: KvMode<'_, B>,
    ) -> Result<Tensor<B>> {
        let Modulations { shared, chroma, silu_vec } = *modulations;
        for i in 0..self.config.double_blocks {
            let double = match (shared, chroma) {
                (Some(s), _) => Some((&s.img, &s.txt)),
                (None, Some(c)) => c.double.get(i).map(|(img, txt)| (img, txt)),
                (None, None) => None,
            };
            let block = Block { silu_vec, double, single: None, rope, kv };
            (img, txt) = self.double_block(b, i, &img, &txt, &block)?;
        }
        // ComfyUI's FLUX guards the image stream here; its Chroma does not.
        let img = if chroma.is_some() { img } else { finite_in_f16(b, img)? };
        let mut joint = b.concat(&[&txt, &img], 1)?;
        drop((img, txt));
        for i in 0..self.config.single_blocks {
            let single = match (shared, chroma) {
                (Some(s), _) => Some(&s.single),
                (None, Some(c)) => c.single.get(i),
                (None, None) => None,
            };
            let block = Block { silu_vec, double: None, single, rope, kv };
            joint = self.single_block(b, i, &joint, &block)?;
        }
        Ok(joint)
    }

    /// Chroma's trunk without its input and output layers (what Chroma Radiance builds on, ComfyUI's
    /// `Chroma.forward_orig` without `final_layer`): `img` `[B, L, D]` is the image's tokens already in the hidden
    /// width, `context` `[B, N, text_dim]` the text features (through `txt_in` here), `positions` the RoPE
    /// positions of the N text tokens then the L image tokens; every block is modulated by the guidance MLP at
    /// `timesteps` and `guidance` (0 where `None`). Returns the image's tokens `[B, L, D]` after the last single
    /// block, in the compute type.
    pub(crate) fn chroma_trunk<B: Backend>(
        &self,
        b: &B,
        img: Tensor<B>,
        context: &Tensor<B>,
        positions: &[[i64; 4]],
        (timesteps, guidance): (&[f32], Option<&[f32]>),
    ) -> Result<Tensor<B>> {
        let approximator = self.config.approximator.ok_or_else(|| {
            Error::Invalid(format!("{} has no Chroma guidance MLP", self.config.variant()))
        })?;
        let (batch, image_len) = (img.dim(0)?, img.dim(1)?);
        let txt = {
            let mut names = Names::new(Generation::One);
            let lin = names.linear("txt_in");
            let layer = self.fetch(b, &names.as_strs())?;
            apply(b, &layer, lin, &self.text_input(b, context)?)?
        };
        let text_len = txt.dim(1)?;
        let rope = rope_table(b, positions, Generation::One)?;
        let chroma = self.chroma_modulation(b, (timesteps, guidance), batch, approximator)?;
        let modulations = Modulations { shared: None, chroma: Some(&chroma), silu_vec: None };
        let joint = self.blocks(b, img, txt, &modulations, &rope, KvMode::Off)?;
        Ok(b.slice(&joint, 1, text_len, image_len)?)
    }

    /// The text features in the compute type; FLUX.2's left-padded with zero rows to 512 tokens, as ComfyUI's
    /// `Flux2.extra_conds` pads a shorter conditioning.
    fn text_input<B: Backend>(&self, b: &B, context: &Tensor<B>) -> Result<Tensor<B>> {
        let context = b.cast(context, b.compute_dtype())?;
        let len = context.dim(1)?;
        if self.config.generation == Generation::Two && len < FLUX2_TEXT_LEN {
            return Ok(b.pad(&context, 1, FLUX2_TEXT_LEN - len, 0, PadMode::Constant(0.0))?);
        }
        if self.config.ovis {
            // Ovis-Image's `txt_norm` before `txt_in`: torch's `RMSNorm` without an ε, which takes f32's machine
            // epsilon for every floating type (ATen's `rms_norm` computes 16-bit types in f32 and takes its ε).
            let layer = self.fetch(b, &["txt_norm.weight"])?;
            return Ok(b.rms_norm(&context, Some(&layer.weight(0)), f32::EPSILON)?);
        }
        Ok(context)
    }

    /// Checks the inputs' shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(&self, input: &FluxInput<'_, B>) -> Result<(usize, usize, usize)> {
        let cfg = &self.config;
        let &[batch, channels, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "{} latents must be [B, {}, h, w], got {:?}",
                cfg.variant(),
                cfg.in_channels,
                input.x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "{} takes non-empty latents of {} channels, got {:?}",
                cfg.variant(),
                cfg.in_channels,
                input.x.shape()
            )));
        }
        if input.timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a batch of {batch}",
                input.timesteps.len()
            )));
        }
        if let Some(g) = input.guidance
            && g.len() != batch
        {
            return Err(Error::Invalid(format!(
                "{} guidance values for a batch of {batch}",
                g.len()
            )));
        }
        match input.context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.text_dim => {}
            other => {
                return Err(Error::Invalid(format!(
                    "{} conditioning must be [{batch}, N > 0, {}] ({}), got {other:?}",
                    cfg.variant(),
                    cfg.text_dim,
                    cfg.text_encoder()
                )));
            }
        }
        if let Some(prefix) = input.text_prefix {
            match prefix.shape() {
                &[pb, _, width] if (pb == 1 || pb == batch) && width == cfg.dim => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "{} takes text-prefix tokens [1 or {batch}, n, {}] (its hidden width), got {other:?}",
                        cfg.variant(),
                        cfg.dim
                    )));
                }
            }
        }
        if let (Some(pooled), Some(vec_dim)) = (input.pooled, cfg.vec_dim) {
            match pooled.shape() {
                &[pb, width] if pb == batch && width >= vec_dim => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "{}'s pooled vector must be [{batch}, {vec_dim}] (CLIP-L's), got {other:?}",
                        cfg.variant()
                    )));
                }
            }
        }
        Ok((batch, h, w))
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }

    /// vec `[B, D]` at `timesteps`: time_in(E(t)), plus guidance_in(E(g)) where the model and the input have
    /// guidance, plus vector_in(pooled) where the model has `vector_in` (zeros without a pooled vector).
    fn vector<B: Backend>(
        &self,
        b: &B,
        input: &FluxInput<'_, B>,
        timesteps: &[f32],
        batch: usize,
    ) -> Result<Tensor<B>> {
        let mut vec = self.embedder(b, "time_in", &sinusoid(b, timesteps)?)?;
        if self.config.guidance
            && let Some(g) = input.guidance
        {
            let guidance = self.embedder(b, "guidance_in", &sinusoid(b, g)?)?;
            vec = b.binary(&vec, &guidance, BinaryOp::Add)?;
        }
        if let Some(vec_dim) = self.config.vec_dim {
            let y = match input.pooled {
                Some(pooled) => b.cast(&b.slice(pooled, 1, 0, vec_dim)?, b.compute_dtype())?,
                None => b.full(&[batch, vec_dim], 0.0, b.compute_dtype())?,
            };
            let pooled = self.embedder(b, "vector_in", &y)?;
            vec = b.binary(&vec, &pooled, BinaryOp::Add)?;
        }
        Ok(vec)
    }

    /// Chroma's modulations for one call (ComfyUI's `Chroma.forward_orig` and `get_modulations`): the guidance
    /// MLP of [`CHROMA_IN_DIM`] features per row — the timestep's and the guidance's sinusoids (16 each; a
    /// conditioning without guidance has 0) and the row index's (32) — then each single block's (shift, scale,
    /// gate) from rows 3i…, each double block's image and text streams' two sets from rows 3·singles + 6i… and
    /// 3·singles + 6·doubles + 6i…, and the final layer's (shift, scale) from the table's last two rows. Only
    /// those rows are computed (the MLP works row by row).
    fn chroma_modulation<B: Backend>(
        &self,
        b: &B,
        (timesteps, guidance): (&[f32], Option<&[f32]>),
        batch: usize,
        approximator: Approximator,
    ) -> Result<ChromaModulation<B>> {
        let cfg = &self.config;
        let (singles, doubles, d) = (cfg.single_blocks, cfg.double_blocks, cfg.dim);
        let blocks = 3 * singles + 12 * doubles;
        let table: Vec<usize> = (0..blocks).chain(CHROMA_MOD_ROWS - 2..CHROMA_MOD_ROWS).collect();
        let rows = table.len();
        let guidance = guidance.map_or_else(|| vec![0.0; batch], <[f32]>::to_vec);
        let t = crate::timestep::sinusoid(timesteps.iter().map(|t| 1000.0 * t), 8, 1.0);
        let g = crate::timestep::sinusoid(guidance.iter().map(|g| 1000.0 * g), 8, 1.0);
        let index = crate::timestep::sinusoid(table.iter().map(|&i| 1000.0 * i as f32), 16, 1.0);
        let mut features = Vec::with_capacity(batch * rows * CHROMA_IN_DIM);
        for s in 0..batch {
            for r in 0..rows {
                features.extend_from_slice(&t[16 * s..16 * (s + 1)]);
                features.extend_from_slice(&g[16 * s..16 * (s + 1)]);
                features.extend_from_slice(&index[32 * r..32 * (r + 1)]);
            }
        }
        let x = b.from_f32(&[batch, rows, CHROMA_IN_DIM], &features, DType::F32)?;
        let mut x = b.cast(&x, b.compute_dtype())?;
        let mut names = Names::new(Generation::One);
        let p = CHROMA_PREFIX;
        let in_proj = names.linear(&format!("{p}.in_proj"));
        let layers: Vec<(Linear, Linear, usize)> = (0..approximator.layers)
            .map(|l| {
                let inner = names.linear(&format!("{p}.layers.{l}.in_layer"));
                let outer = names.linear(&format!("{p}.layers.{l}.out_layer"));
                (inner, outer, names.one(format!("{p}.norms.{l}.weight")))
            })
            .collect();
        let out_proj = names.linear(&format!("{p}.out_proj"));
        let layer = self.fetch(b, &names.as_strs())?;
        x = apply(b, &layer, in_proj, &x)?;
        for (inner, outer, norm) in layers {
            let n = b.rms_norm(&x, Some(&layer.weight(norm)), QK_EPS)?;
            let h = b.unary(&apply(b, &layer, inner, &n)?, UnaryOp::Silu)?;
            x = b.binary(&x, &apply(b, &layer, outer, &h)?, BinaryOp::Add)?;
        }
        let table = apply(b, &layer, out_proj, &x)?;
        drop(layer);
        let row =
            |r: usize| -> Result<Tensor<B>> { Ok(b.slice(&table, 1, r, 1)?.reshape(&[batch, d])?) };
        let set = |r: usize| -> Result<TokenModulation<B>> {
            Ok(TokenModulation::Uniform(Modulation {
                shift: row(r)?,
                scale: row(r + 1)?,
                gate: row(r + 2)?.reshape(&[batch, 1, d])?,
            }))
        };
        let pair = |r: usize| -> Result<[TokenModulation<B>; 2]> { Ok([set(r)?, set(r + 3)?]) };
        let single = (0..singles).map(|i| set(3 * i)).collect::<Result<Vec<_>>>()?;
        let double = (0..doubles)
            .map(|i| {
                let img = 3 * singles + 6 * i;
                Ok((pair(img)?, pair(img + 6 * doubles)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ChromaModulation { double, single, last: (row(rows - 2)?, row(rows - 1)?) })
    }

    /// An `MLPEmbedder` under `name`: out_layer(SiLU(in_layer(x))).
    fn embedder<B: Backend>(&self, b: &B, name: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let mut names = Names::new(self.config.generation);
        let inner = names.linear(&format!("{name}.in_layer"));
        let outer = names.linear(&format!("{name}.out_layer"));
        let layer = self.fetch(b, &names.as_strs())?;
        let hidden = b.unary(&apply(b, &layer, inner, x)?, UnaryOp::Silu)?;
        apply(b, &layer, outer, &hidden)
    }

    /// FLUX.2's shared modulations of `silu_vec`; with `silu_vec_zero` (`index_timestep_zero`) the reference
    /// tokens (after the image's in the image stream, after text and image in the single blocks) take theirs
    /// from it.
    fn shared_modulation<B: Backend>(
        &self,
        b: &B,
        silu_vec: &Tensor<B>,
        silu_vec_zero: Option<&Tensor<B>>,
        (text_len, image_len): (usize, usize),
    ) -> Result<SharedModulation<B>> {
        let mut names = Names::new(Generation::Two);
        let img = names.linear("double_stream_modulation_img.lin");
        let txt = names.linear("double_stream_modulation_txt.lin");
        let single = names.linear("single_stream_modulation.lin");
        let layer = self.fetch(b, &names.as_strs())?;
        let sets = |lin: Linear, v: &Tensor<B>, k: usize| -> Result<Vec<Modulation<B>>> {
            Modulation::sets(b, &apply(b, &layer, lin, v)?, self.config.dim, k)
        };
        let by_token = |lin: Linear, k: usize, at: usize| -> Result<Vec<TokenModulation<B>>> {
            let main = sets(lin, silu_vec, k)?;
            Ok(match silu_vec_zero {
                None => main.into_iter().map(TokenModulation::Uniform).collect(),
                Some(zero) => main
                    .into_iter()
                    .zip(sets(lin, zero, k)?)
                    .map(|(before, after)| TokenModulation::Split { at, before, after })
                    .collect(),
            })
        };
        let [img_attn, img_mlp]: [TokenModulation<B>; 2] =
            by_token(img, 2, image_len)?.try_into().map_err(|_| sets_error())?;
        let [txt_attn, txt_mlp]: [TokenModulation<B>; 2] = sets(txt, silu_vec, 2)?
            .into_iter()
            .map(TokenModulation::Uniform)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| sets_error())?;
        let single = by_token(single, 1, text_len + image_len)?.remove(0);
        Ok(SharedModulation { img: [img_attn, img_mlp], txt: [txt_attn, txt_mlp], single })
    }

    /// The references in the compute type, padded to the patch size and repeated to the batch, each with its
    /// placement as ComfyUI's `_forward` gives it for the method (the generation's default unless named:
    /// `offset`; `index`: index k·scale for the k-th; `uxo`: index 0, diagonally beyond the image and the
    /// references before it), and whether they are modulated at timestep 0 (`index_timestep_zero`).
    fn place_references<B: Backend>(
        &self,
        b: &B,
        input: &FluxInput<'_, B>,
        batch: usize,
        (rows, cols): (usize, usize),
    ) -> Result<(Placed<B>, bool)> {
        let generation = self.config.generation;
        let patch = generation.patch();
        let method = input.method.unwrap_or(generation.default_reference_method());
        let timestep_zero = method == "index_timestep_zero" && !input.references.is_empty();
        if timestep_zero && generation == Generation::One {
            return Err(Error::Invalid(format!(
                "reference method `index_timestep_zero` is for FLUX.2 and Qwen-Image Edit; {} places \
                 references by `offset`, `index` or `uxo`",
                self.config.variant()
            )));
        }
        let (mut index, mut h, mut w) = (0i64, 0usize, 0usize);
        let mut side_by_side = SideBySide::default();
        let mut placed = Vec::with_capacity(input.references.len());
        for reference in input.references {
            let (rh, rw) = reference_sides(
                reference,
                batch,
                self.config.in_channels.min(generation.latent_channels()),
            )?;
            let (mut h_offset, mut w_offset) = (0, 0);
            match method {
                "index" | "index_timestep_zero" => index += generation.reference_index_scale(),
                "uxo" => {
                    index = 0;
                    h_offset = rows * patch + h;
                    w_offset = cols * patch + w;
                    h += rh;
                    w += rw;
                }
                _ => {
                    index = 1;
                    (h_offset, w_offset) = side_by_side.place(rh, rw);
                }
            }
            let (reference, ref_rows, ref_cols) = batched_reference(b, reference, batch, patch)?;
            let place = Placement {
                index,
                rows: ref_rows,
                cols: ref_cols,
                row_offset: (h_offset + patch / 2) / patch,
                col_offset: (w_offset + patch / 2) / patch,
            };
            placed.push((reference, place));
        }
        Ok((placed, timestep_zero))
    }

    /// q, k, v `[B, L, H, 128]` from a fused qkv projection's output `[B, L, 3·D]`, q and k RMS-normed per
    /// head with the gains `q_norm`, `k_norm`.
    fn split_qkv<B: Backend>(
        &self,
        b: &B,
        qkv: &Tensor<B>,
        q_norm: &Weight<'_>,
        k_norm: &Weight<'_>,
    ) -> Result<[Tensor<B>; 3]> {
        let (d, heads) = (self.config.dim, self.config.heads);
        let (batch, len) = (qkv.dim(0)?, qkv.dim(1)?);
        let part = |k: usize| -> Result<Tensor<B>> {
            Ok(b.slice(qkv, -1, k * d, d)?.reshape(&[batch, len, heads, HEAD_DIM])?)
        };
        let q = b.rms_norm(&part(0)?, Some(q_norm), QK_EPS)?;
        let k = b.rms_norm(&part(1)?, Some(k_norm), QK_EPS)?;
        Ok([q, k, part(2)?])
    }

    /// Unmasked attention over a joint sequence: RoPE on q and k `[B, N, H, 128]`, then softmax(q·kᵀ/√128)·v,
    /// back to `[B, N, D]`. The KV cache's block `key` stores the reference tokens' keys and values (the last
    /// ones) or adds the stored ones after the sequence's, whose RoPE rows follow the sequence's in the table.
    fn attention<B: Backend>(
        &self,
        b: &B,
        [q, k, v]: [Tensor<B>; 3],
        block: &Block<'_, B>,
        key: &str,
    ) -> Result<Tensor<B>> {
        let (k, v) = match block.kv {
            KvMode::Off => (k, v),
            KvMode::Record { cache, ref_tokens } => {
                let len = k.dim(1)?;
                let start = len.checked_sub(ref_tokens).ok_or_else(|| {
                    Error::Invalid(format!("{ref_tokens} reference tokens in a sequence of {len}"))
                })?;
                let stored =
                    (b.slice(&k, 1, start, ref_tokens)?, b.slice(&v, 1, start, ref_tokens)?);
                cache.lock()?.insert(key.to_owned(), stored);
                (k, v)
            }
            KvMode::Replay { cache } => {
                let batch = k.dim(0)?;
                let (ck, cv) = cache.lock()?.get(key).cloned().ok_or_else(|| {
                    Error::Invalid(format!("the FLUX KV cache holds nothing for block `{key}`"))
                })?;
                let (ck, cv) = (to_batch(b, &ck, batch)?, to_batch(b, &cv, batch)?);
                (b.concat(&[&k, &ck], 1)?, b.concat(&[&v, &cv], 1)?)
            }
        };
        let rope = block.rope;
        let rows = |t: &Tensor<B>, n: usize| -> Result<Tensor<B>> {
            if t.dim(0)? == n { Ok(t.clone()) } else { Ok(b.slice(t, 0, 0, n)?) }
        };
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q_len, k_len) = (q.dim(1)?, k.dim(1)?);
        let (q_cos, q_sin) = (rows(&rope.cos, q_len)?, rows(&rope.sin, q_len)?);
        let (k_cos, k_sin) = (rows(&rope.cos, k_len)?, rows(&rope.sin, k_len)?);
        let q = heads_first(&b.rope(&q, &q_cos, &q_sin, RopeLayout::Interleaved)?)?;
        let k = heads_first(&b.rope(&k, &k_cos, &k_sin, RopeLayout::Interleaved)?)?;
        let v = heads_first(&v)?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
        let batch = o.dim(0)?;
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, usize::MAX, self.config.dim])?)
    }

    /// The MLP's activation: FLUX.1's GELU (tanh), FLUX.2's and Ovis-Image's SwiGLU (SiLU of the first half
    /// times the second; Ovis-Image's single blocks: SiLU of the second half times the first).
    fn activation<B: Backend>(&self, b: &B, hidden: &Tensor<B>, single: bool) -> Result<Tensor<B>> {
        let swiglu = |gate_at: usize, value_at: usize| -> Result<Tensor<B>> {
            let f = self.config.mlp_hidden;
            let gate = b.unary(&b.slice(hidden, -1, gate_at, f)?, UnaryOp::Silu)?;
            Ok(b.binary(&gate, &b.slice(hidden, -1, value_at, f)?, BinaryOp::Mul)?)
        };
        match self.config.generation {
            Generation::One if self.config.ovis && single => swiglu(self.config.mlp_hidden, 0),
            Generation::One if self.config.ovis => swiglu(0, self.config.mlp_hidden),
            Generation::One => Ok(b.unary(hidden, UnaryOp::GeluTanh)?),
            Generation::Two => swiglu(0, self.config.mlp_hidden),
        }
    }

    /// Double-stream block `i` on the image and text tokens.
    fn double_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        block: &Block<'_, B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let given = block.double;
        let mut names = Names::new(self.config.generation);
        let [img_w, txt_w] = ["img", "txt"].map(|stream| {
            let p = format!("double_blocks.{i}.{stream}");
            StreamWeights {
                modulation: given.is_none().then(|| names.linear(&format!("{p}_mod.lin"))),
                qkv: names.linear(&format!("{p}_attn.qkv")),
                proj: names.linear(&format!("{p}_attn.proj")),
                mlp_in: names.linear(&format!("{p}_mlp.0")),
                mlp_out: names.linear(&format!("{p}_mlp.2")),
                q_norm: names.one(format!("{p}_attn.norm.query_norm.weight")),
                k_norm: names.one(format!("{p}_attn.norm.key_norm.weight")),
            }
        });
        let layer = self.fetch(b, &names.as_strs())?;
        let own = |sw: &StreamWeights| -> Result<Option<[TokenModulation<B>; 2]>> {
            let Some(lin) = sw.modulation else { return Ok(None) };
            let silu_vec = block.silu_vec.ok_or_else(sets_error)?;
            let m = apply(b, &layer, lin, silu_vec)?;
            let mut sets = Modulation::sets(b, &m, self.config.dim, 2)?
                .into_iter()
                .map(TokenModulation::Uniform);
            match (sets.next(), sets.next()) {
                (Some(attn), Some(mlp)) => Ok(Some([attn, mlp])),
                _ => Err(sets_error()),
            }
        };
        let (img_own, txt_own) = (own(&img_w)?, own(&txt_w)?);
        let (img_mod, txt_mod) = match (given, &img_own, &txt_own) {
            (Some(pair), _, _) => pair,
            (None, Some(i), Some(t)) => (i, t),
            _ => return Err(sets_error()),
        };
        let qkv_of = |x: &Tensor<B>, m: &TokenModulation<B>, sw: &StreamWeights| {
            let qkv = apply(b, &layer, sw.qkv, &m.modulated(b, x)?)?;
            self.split_qkv(b, &qkv, &layer.weight(sw.q_norm), &layer.weight(sw.k_norm))
        };
        let [iq, ik, iv] = qkv_of(img, &img_mod[0], &img_w)?;
        let [tq, tk, tv] = qkv_of(txt, &txt_mod[0], &txt_w)?;
        let joint = |t: &Tensor<B>, i: &Tensor<B>| b.concat(&[t, i], 1);
        let qkv = [joint(&tq, &iq)?, joint(&tk, &ik)?, joint(&tv, &iv)?];
        let attn = self.attention(b, qkv, block, &format!("double_{i}"))?;
        drop((iq, ik, iv, tq, tk, tv));
        let text_len = txt.dim(1)?;
        let txt_attn = b.slice(&attn, 1, 0, text_len)?;
        let img_attn = b.slice(&attn, 1, text_len, img.dim(1)?)?;
        drop(attn);

        let stream = |x: &Tensor<B>,
                      a: &Tensor<B>,
                      m: &[TokenModulation<B>; 2],
                      sw: &StreamWeights|
         -> Result<Tensor<B>> {
            let x = m[0].gated_add(b, x, &apply(b, &layer, sw.proj, a)?)?;
            let hidden = apply(b, &layer, sw.mlp_in, &m[1].modulated(b, &x)?)?;
            let out = apply(b, &layer, sw.mlp_out, &self.activation(b, &hidden, false)?)?;
            m[1].gated_add(b, &x, &out)
        };
        let img = stream(img, &img_attn, img_mod, &img_w)?;
        let txt = finite_in_f16(b, stream(txt, &txt_attn, txt_mod, &txt_w)?)?;
        Ok((img, txt))
    }

    /// Single-stream block `i` on the joint sequence (text, then image).
    fn single_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        block: &Block<'_, B>,
    ) -> Result<Tensor<B>> {
        let given = block.single;
        let p = format!("single_blocks.{i}");
        let mut names = Names::new(self.config.generation);
        let modulation = given.is_none().then(|| names.linear(&format!("{p}.modulation.lin")));
        let linear1 = names.linear(&format!("{p}.linear1"));
        let linear2 = names.linear(&format!("{p}.linear2"));
        let q_norm = names.one(format!("{p}.norm.query_norm.weight"));
        let k_norm = names.one(format!("{p}.norm.key_norm.weight"));
        let layer = self.fetch(b, &names.as_strs())?;
        let own = match modulation {
            Some(lin) => {
                let silu_vec = block.silu_vec.ok_or_else(sets_error)?;
                let m = apply(b, &layer, lin, silu_vec)?;
                let set = Modulation::sets(b, &m, self.config.dim, 1)?.into_iter().next();
                Some(TokenModulation::Uniform(set.ok_or_else(sets_error)?))
            }
            None => None,
        };
        let m = match (given, &own) {
            (Some(m), _) => m,
            (None, Some(own)) => own,
            (None, None) => return Err(sets_error()),
        };
        let d = self.config.dim;
        let mlp_in = match self.config.generation {
            Generation::One if self.config.ovis => 2 * self.config.mlp_hidden,
            Generation::One => self.config.mlp_hidden,
            Generation::Two => 2 * self.config.mlp_hidden,
        };
        let hidden = apply(b, &layer, linear1, &m.modulated(b, x)?)?;
        let qkv = b.slice(&hidden, -1, 0, 3 * d)?;
        let mlp = b.slice(&hidden, -1, 3 * d, mlp_in)?;
        drop(hidden);
        let qkv = self.split_qkv(b, &qkv, &layer.weight(q_norm), &layer.weight(k_norm))?;
        let attn = self.attention(b, qkv, block, &format!("single_{i}"))?;
        let mlp = self.activation(b, &mlp, true)?;
        let out = apply(b, &layer, linear2, &b.concat(&[&attn, &mlp], 2)?)?;
        finite_in_f16(b, m.gated_add(b, x, &out)?)
    }
}

/// A modulation with the wrong number of sets: a bug, not an input error.
fn sets_error() -> Error {
    Error::Invalid("internal: a FLUX modulation produced the wrong number of sets".to_owned())
}

/// `[ts.len(), 256]` in the compute type: ComfyUI's `timestep_embedding` of 1000·t (the product rounded to f32
/// first, then by each frequency), cos half first.
fn sinusoid<B: Backend>(b: &B, ts: &[f32]) -> Result<Tensor<B>> {
    let emb = crate::timestep::sinusoid(ts.iter().map(|t| 1000.0 * t), T_FREQ_DIM / 2, 1.0);
    let emb = b.from_f32(&[ts.len(), T_FREQ_DIM], &emb, DType::F32)?;
    Ok(b.cast(&emb, b.compute_dtype())?)
}

/// The RoPE table of `positions` (adjacent feature pairs, the generation's axes' angles in order).
fn rope_table<B: Backend>(
    b: &B,
    positions: &[[i64; 4]],
    generation: Generation,
) -> Result<Rope<B>> {
    let (cos, sin) =
        crate::rope::tables(positions, generation.axes_dims(), generation.rope_theta());
    let half = HEAD_DIM / 2;
    Rope::upload(b, &cos, &sin, half, DType::F32)
}
