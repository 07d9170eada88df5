//! [`QwenImage`]: the MMDiT forward pass in ComfyUI's order (models-qwen-image.md §3.3), reading one block's
//! weights at a time through [`Model::fetch`]. Its trunk, [`DoubleStream`] (the blocks, the text, image and
//! timestep inputs, the final layer), is Mage-Flow's too (`crate::mage_flow`); what is Qwen-Image's own (the
//! 2×2 patches, the positions, the reference methods, the sinusoid) stays in [`QwenImage`].

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use crate::error::{Error, Result};
use crate::latent_tokens::{self, PatchOrder, SideBySide};
use crate::rope::Rope;

use super::blockwise::{BlockPatch, apply_patches};
use super::config::{
    ADDITION_T_EMBEDDING, Config, DEFAULT_REFERENCE_METHOD, EPS, INDEX_TIMESTEP_ZERO,
    LATENT_CHANNELS, PATCH, ROPE_THETA, T_FREQ_DIM, block_names, block_prefix,
};
use super::control::{ControlResiduals, add_controls};

/// A Qwen-Image MMDiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct QwenImage {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
    /// The reference method where the conditioning names none (what [`super::detect`] found in the file).
    pub default_method: &'static str,
}

/// What rides along with the text into [`QwenImage::forward_with_extras`].
pub struct Extras<'a, B: Backend> {
    /// Reference latents `[1 or B, 16, h, w]` in model space (Edit).
    pub references: &'a [Tensor<B>],
    /// How the references are placed; `None`: the model's default.
    pub method: Option<&'a str>,
    /// ControlNet outputs, each added after the blocks it names.
    pub controls: &'a [ControlResiduals<B>],
    /// Block-wise ControlNets (DiffSynth's model patches), each run after every block.
    pub patches: &'a [BlockPatch<'a, B>],
    /// Each sample's text rows when the prompts differ in length (see [`Text`]); `None`: the text is
    /// `[B, N, text_dim]`.
    pub text_lens: Option<&'a [usize]>,
}

impl<B: Backend> Default for Extras<'_, B> {
    fn default() -> Self {
        Extras { references: &[], method: None, controls: &[], patches: &[], text_lens: None }
    }
}

/// A call's text features: `[B, N, text_dim]`, or a ragged batch's `[1, ΣNᵢ, text_dim]` (each sample's Nᵢ
/// rows in turn, `lens` giving each Nᵢ): prompts of different lengths in one pass over the weights. ComfyUI
/// runs such prompts as separate calls (its `can_concat`); here every per-row map (the linears, the norms)
/// runs on the samples' rows together and each sample attends over its own joint sequence, so each sample's
/// values are those of its own call (up to rounding: joined rows may take another GEMM kernel than a sample's
/// alone) while each weight is read once.
pub struct Text<'a, B: Backend> {
    /// The features.
    pub features: &'a Tensor<B>,
    /// Each sample's rows in a ragged batch; `None` for `[B, N, text_dim]`.
    pub lens: Option<&'a [usize]>,
}

impl<B: Backend> Clone for Text<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Text<'_, B> {}

impl<'a, B: Backend> Text<'a, B> {
    /// Text `[B, N, text_dim]`, every sample as long.
    pub fn uniform(features: &'a Tensor<B>) -> Self {
        Text { features, lens: None }
    }
}

/// The blocks' inputs: image tokens (the latents', then the references'), text tokens (`[B, N, D]`, or a
/// ragged batch's `[1, ΣNᵢ, D]`), each sample's joint sequence and the timestep.
pub(super) struct Embedded<B: Backend> {
    pub(super) img: Tensor<B>,
    pub(super) txt: Tensor<B>,
    pub(super) seq: Sequence<B>,
    pub(super) timestep: Timestep<B>,
    pub(super) grid: Grid,
}

/// The latents' shape and token grid.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grid {
    pub(super) batch: usize,
    pub(super) frames: usize,
    /// Token rows and columns of a frame (its padded sides / 2).
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// The latents' sides.
    pub(super) h: usize,
    pub(super) w: usize,
    /// 4 for `[B, 16, h, w]`, 5 with frames.
    pub(super) rank: usize,
}

impl Grid {
    /// The latents' own tokens (every frame's).
    pub(super) fn image_len(&self) -> usize {
        self.frames * self.rows * self.cols
    }
}

/// Each sample's joint sequence (its text rows, then the image's): how the text rows split among the samples,
/// and the RoPE tables.
pub(crate) struct Sequence<B: Backend> {
    /// Each sample's text rows in a ragged batch (text `[1, ΣNᵢ, D]`); `None`: text `[B, N, D]`.
    lens: Option<Vec<usize>>,
    /// The table of every sample (`None` lens), or of each sample in turn.
    ropes: Vec<Rope<B>>,
}

impl<B: Backend> Sequence<B> {
    /// Text `[B, N, D]`, every sample's joint sequence at the positions of `rope`.
    pub(crate) fn uniform(rope: Rope<B>) -> Sequence<B> {
        Sequence { lens: None, ropes: vec![rope] }
    }

    /// Each sample's first text row and row count in a ragged batch.
    fn ragged(&self) -> Option<impl Iterator<Item = (usize, usize)> + '_> {
        let lens = self.lens.as_ref()?;
        Some(lens.iter().scan(0, |start, &n| {
            let at = *start;
            *start += n;
            Some((at, n))
        }))
    }
}

/// One stream's modulation from `Linear(SiLU(temb))`: shift, scale `[B, D]` and gate `[B, 1, D]` for the
/// attention (`.0`) and the MLP (`.1`) sub-layers.
struct Modulation<B: Backend> {
    shift: [Tensor<B>; 2],
    scale: [Tensor<B>; 2],
    gate: [Tensor<B>; 2],
}

impl<B: Backend> Modulation<B> {
    /// Sample `i`'s modulation alone (batch 1).
    fn sample(&self, b: &B, i: usize) -> Result<Modulation<B>> {
        let row = |t: &[Tensor<B>; 2]| -> Result<[Tensor<B>; 2]> {
            Ok([b.slice(&t[0], 0, i, 1)?, b.slice(&t[1], 0, i, 1)?])
        };
        Ok(Modulation {
            shift: row(&self.shift)?,
            scale: row(&self.scale)?,
            gate: row(&self.gate)?,
        })
    }
}

/// SiLU(temb) `[B, D]` for every token, and with `index_timestep_zero` the image token index from which
/// SiLU(temb) at t = 0 replaces it (the first reference token; ComfyUI's `timestep_zero_index`).
pub(crate) struct Timestep<B: Backend> {
    silu: Tensor<B>,
    zero: Option<(usize, Tensor<B>)>,
}

impl<B: Backend> Timestep<B> {
    /// SiLU(temb) `[B, D]` for every token.
    pub(crate) fn new(silu: Tensor<B>) -> Timestep<B> {
        Timestep { silu, zero: None }
    }

    /// SiLU(temb) `[B, D]` of the latents' tokens (what the final layer reads).
    pub(crate) fn silu(&self) -> &Tensor<B> {
        &self.silu
    }
}

/// A stream's modulation by token range: each applies from its first token (the first's from token 0) to
/// the next one's. The image's: `[B, D]` for every token, or with `index_timestep_zero` another from the
/// first reference token; a ragged batch's text: each sample's `[1, D]` from its first row.
struct StreamModulation<B: Backend> {
    ranges: Vec<(usize, Modulation<B>)>,
}

impl<B: Backend> StreamModulation<B> {
    /// LayerNorm(x) · (1 + scale) + shift for sub-layer `k` (0: attention, 1: MLP).
    fn modulated(&self, b: &B, x: &Tensor<B>, k: usize) -> Result<Tensor<B>> {
        let n = b.layer_norm(x, None, None, EPS)?;
        self.per_range(b, &n, |n, m| Ok(b.modulate(n, &m.scale[k], Some(&m.shift[k]))?))
    }

    /// x + y · gate for sub-layer `k`.
    fn gated_add(&self, b: &B, x: &Tensor<B>, y: &Tensor<B>, k: usize) -> Result<Tensor<B>> {
        let gated = self.per_range(b, y, |y, m| Ok(b.binary(y, &m.gate[k], BinaryOp::Mul)?))?;
        Ok(b.binary(x, &gated, BinaryOp::Add)?)
    }

    /// `f` on `x` `[B, N, D]` with each token range's modulation, joined along the tokens.
    fn per_range(
        &self,
        b: &B,
        x: &Tensor<B>,
        f: impl Fn(&Tensor<B>, &Modulation<B>) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        if let [(_, only)] = self.ranges.as_slice() {
            return f(x, only);
        }
        let tokens = x.dim(1)?;
        let mut parts = Vec::with_capacity(self.ranges.len());
        for (r, (start, m)) in self.ranges.iter().enumerate() {
            let end = self.ranges.get(r + 1).map_or(tokens, |(next, _)| *next);
            parts.push(f(&b.slice(x, 1, *start, end - start)?, m)?);
        }
        Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 1)?)
    }
}

/// The double-stream trunk Qwen-Image and Mage-Flow share (ComfyUI's `QwenImageTransformerBlock`s, the text
/// input `txt_norm` → `txt_in`, the image input `img_in`, the timestep MLP `time_text_embed.timestep_embedder`
/// and the final layer `norm_out` → `proj_out`), over weights under ComfyUI's names: each family embeds its own
/// latents, positions and timestep sinusoid, and calls these in ComfyUI's order.
#[derive(Clone, Copy)]
pub(crate) struct DoubleStream<'m> {
    /// The weights, ComfyUI's names without the file's prefix.
    pub(crate) weights: &'m Model,
    /// Inner width D.
    pub(crate) dim: usize,
    /// Attention heads.
    pub(crate) heads: usize,
    /// Head width.
    pub(crate) head_dim: usize,
}

impl QwenImage {
    /// The trunk over this model's weights.
    fn trunk(&self) -> DoubleStream<'_> {
        let cfg = &self.config;
        DoubleStream {
            weights: &self.weights,
            dim: cfg.dim,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
        }
    }

    /// A model from its config and loaded weights (see [`super::load_plan`]), with the plain default reference
    /// method ([`DEFAULT_REFERENCE_METHOD`]).
    pub fn new(config: Config, weights: Model) -> QwenImage {
        QwenImage { config, weights, default_method: DEFAULT_REFERENCE_METHOD }
    }

    /// ComfyUI's model output for latents `x` `[B, 16, h, w]` (model space, any float dtype), `sigmas` (one per
    /// sample; the model's timestep is σ) and text features `context` `[B, N, text_dim]`: v = ε − x₀, f32
    /// `[B, 16, h, w]`. Computes in `b.compute_dtype()`; odd `h`/`w` are padded circularly and cropped back.
    /// Latents with frames, `[B, 16, T, h, w]` (Qwen-Image-Layered's layers), take frames 0..T on RoPE's
    /// frame axis and come out in that shape.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_references(b, x, sigmas, context, &[], None)
    }

    /// [`QwenImage::forward`] with reference latents (Edit, the union control LoRA's `ReferenceLatent`): each
    /// `[1 or B, 16, h, w]` in model space, patchified like the latents and appended after their tokens at the
    /// positions `method` gives (`None`: the model's [`QwenImage::default_method`]; `index`: frame i for the
    /// i-th; `negative_index`: frame −i; `offset` and `uxo`: frame 1, side by side as Flux Kontext places them;
    /// `index_timestep_zero`, Edit 2511's: as `index`, with the references' tokens modulated at timestep 0 in
    /// every block). Only the latents' own tokens come out.
    pub fn forward_with_references<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
        references: &[Tensor<B>],
        method: Option<&str>,
    ) -> Result<Tensor<B>> {
        let extras = Extras { references, method, ..Extras::default() };
        self.forward_with_extras(b, x, sigmas, context, &extras)
    }

    /// [`QwenImage::forward_with_references`] with ControlNets too: after each block, every block-wise
    /// ControlNet of `extras.patches` (ComfyUI's `double_block` patches), then each of `extras.controls`
    /// where it names the block (ComfyUI's `control["input"]`), add to the latents' tokens, in order. With
    /// `extras.text_lens`, `context` is a ragged batch's (see [`Text`]).
    pub fn forward_with_extras<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
        extras: &Extras<'_, B>,
    ) -> Result<Tensor<B>> {
        let text = Text { features: context, lens: extras.text_lens };
        let Embedded { mut img, mut txt, seq, timestep, grid } =
            self.embed(b, x, sigmas, text, extras.references, extras.method)?;
        for i in 0..self.config.layers {
            (img, txt) = self.block(b, &block_prefix(i), &img, &txt, &timestep, &seq)?;
            // As ComfyUI: the block patches, then the ControlNets.
            img = apply_patches(b, img, extras.patches, i)?;
            img = add_controls(b, &img, extras.controls, i)?;
        }
        drop(txt);

        let img = if img.dim(1)? == grid.image_len() {
            img
        } else {
            b.slice(&img, 1, 0, grid.image_len())?
        };
        let y = self.trunk().final_layer(b, &timestep.silu, &img)?;
        let Grid { batch, frames, rows, cols, h, w, rank } = grid;
        let mut outs = Vec::with_capacity(frames);
        for t in 0..frames {
            let tokens = b.slice(&y, 1, t * rows * cols, rows * cols)?;
            let mut out = latent_tokens::unpatchify(
                b,
                &tokens,
                LATENT_CHANNELS,
                (rows, cols),
                PATCH,
                PatchOrder::ChannelMajor,
            )?;
            if rows * PATCH > h {
                out = b.slice(&out, 2, 0, h)?;
            }
            if cols * PATCH > w {
                out = b.slice(&out, 3, 0, w)?;
            }
            outs.push(out);
        }
        let out = match rank {
            5 => {
                let framed: Vec<Tensor<B>> = outs
                    .iter()
                    .map(|o| o.reshape(&[batch, LATENT_CHANNELS, 1, h, w]))
                    .collect::<std::result::Result<_, _>>()?;
                b.concat(&framed.iter().collect::<Vec<_>>(), 2)?
            }
            _ => outs.remove(0),
        };
        Ok(b.cast(&out, DType::F32)?)
    }

    /// What the blocks take: the latents' tokens (each frame padded to even sides and patchified, then the
    /// references' as `method` places them) through `img_in`, the text through `txt_norm` and `txt_in`, the
    /// joint sequences' RoPE tables and the timestep embedding.
    pub(super) fn embed<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        text: Text<'_, B>,
        references: &[Tensor<B>],
        method: Option<&str>,
    ) -> Result<Embedded<B>> {
        let (batch, frames, h, w) = self.check_inputs(x, sigmas, text)?;
        let dt = b.compute_dtype();
        let context = b.cast(text.features, dt)?;
        let rank = x.shape().len();
        let x = b.cast(x, dt)?;
        // Each frame [B, 16, h, w], padded to even sides.
        let mut frame_tokens = Vec::with_capacity(frames);
        let (mut rows, mut cols) = (0, 0);
        for t in 0..frames {
            let frame = match rank {
                5 => b.slice(&x, 2, t, 1)?.reshape(&[batch, LATENT_CHANNELS, h, w])?,
                _ => x.clone(),
            };
            let (frame, r, c) = padded(b, &frame)?;
            (rows, cols) = (r, c);
            frame_tokens.push(patchify(b, &frame)?);
        }
        let grid = Grid { batch, frames, rows, cols, h, w, rank };

        let method = method.unwrap_or(self.default_method);
        // Edit 2511's method embeds the timesteps [t, 0] together, as ComfyUI does.
        let timestep_zero = method == INDEX_TIMESTEP_ZERO && !references.is_empty();
        let timesteps =
            if timestep_zero { [sigmas, &vec![0.0; batch]].concat() } else { sigmas.to_vec() };
        let temb = b.unary(&self.time_embedding(b, &timesteps)?, UnaryOp::Silu)?;
        let placed = self.place_references(b, references, method, batch)?;
        let img = {
            let mut tokens = frame_tokens;
            for (reference, _) in &placed {
                tokens.push(patchify(b, reference)?);
            }
            self.trunk().image_in(b, &tokens)?
        };
        let txt = self.trunk().text_in(b, &context)?;
        let extra: Vec<Positions> = placed.iter().map(|(_, p)| *p).collect();
        let text_lens = match text.lens {
            Some(lens) => lens.to_vec(),
            None => vec![txt.dim(1)?],
        };
        let ropes = text_lens
            .iter()
            .map(|&n| self.rope(b, n, frames, rows, cols, &extra))
            .collect::<Result<Vec<_>>>()?;
        let seq = Sequence { lens: text.lens.map(<[usize]>::to_vec), ropes };
        let timestep = if timestep_zero {
            let zero = b.slice(&temb, 0, batch, batch)?;
            Timestep { silu: b.slice(&temb, 0, 0, batch)?, zero: Some((grid.image_len(), zero)) }
        } else {
            Timestep { silu: temb, zero: None }
        };
        Ok(Embedded { img, txt, seq, timestep, grid })
    }

    /// Checks the input shapes: returns (batch, frames, h, w).
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        sigmas: &[f32],
        text: Text<'_, B>,
    ) -> Result<(usize, usize, usize, usize)> {
        let (batch, channels, frames, h, w) = match *x.shape() {
            [batch, channels, h, w] => (batch, channels, 1, h, w),
            [batch, channels, frames, h, w] => (batch, channels, frames, h, w),
            ref other => {
                return Err(Error::Invalid(format!(
                    "Qwen-Image latents must be [B, 16, h, w] or [B, 16, frames, h, w], got {other:?}"
                )));
            }
        };
        if channels != LATENT_CHANNELS || batch == 0 || frames == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "Qwen-Image takes non-empty latents of {LATENT_CHANNELS} channels, got {:?}",
                x.shape()
            )));
        }
        if sigmas.len() != batch {
            return Err(Error::Invalid(format!("{} sigmas for a batch of {batch}", sigmas.len())));
        }
        let text_dim = self.config.text_dim;
        match (text.features.shape(), text.lens) {
            (&[cb, n, width], None) if cb == batch && n > 0 && width == text_dim => {
                Ok((batch, frames, h, w))
            }
            (&[1, n, width], Some(lens))
                if lens.len() == batch
                    && lens.iter().all(|&l| l > 0)
                    && lens.iter().sum::<usize>() == n
                    && width == text_dim =>
            {
                Ok((batch, frames, h, w))
            }
            (other, None) => Err(Error::Invalid(format!(
                "Qwen-Image conditioning must be [{batch}, N > 0, {text_dim}], got {other:?}"
            ))),
            (other, Some(lens)) => Err(Error::Invalid(format!(
                "Qwen-Image conditioning of prompts {lens:?} rows long must be [1, their sum, {text_dim}] for a \
                 batch of {batch}, each prompt at least a row, got {other:?}"
            ))),
        }
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }

    /// temb `[B, D]`: the sinusoid of 1000·σ (f32, cos half first, as diffusers' `Timesteps` computes it),
    /// then Linear → SiLU → Linear in the compute type.
    fn time_embedding<B: Backend>(&self, b: &B, sigmas: &[f32]) -> Result<Tensor<B>> {
        let emb = crate::timestep::sinusoid(sigmas.iter().copied(), T_FREQ_DIM / 2, 1000.0);
        let emb = b.from_f32(&[sigmas.len(), T_FREQ_DIM], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let temb = self.trunk().timestep_mlp(b, &emb)?;
        if !self.config.additional_t_cond {
            return Ok(temb);
        }
        // Layered: ComfyUI adds the table's row 0 (no other row is ever asked for).
        let layer = self.fetch(b, &[ADDITION_T_EMBEDDING])?;
        let rows = b.embedding(&vec![0; sigmas.len()], &layer.weight(0))?;
        Ok(b.binary(&temb, &b.cast(&rows, temb.dtype())?, BinaryOp::Add)?)
    }

    /// The references padded to even sizes and repeated to the batch, each with its token grid's positions,
    /// as ComfyUI's `_forward` places them by `method`.
    fn place_references<B: Backend>(
        &self,
        b: &B,
        references: &[Tensor<B>],
        method: &str,
        batch: usize,
    ) -> Result<Vec<(Tensor<B>, Positions)>> {
        let mut index = 0i64;
        let mut side_by_side = SideBySide::default();
        let mut placed = Vec::with_capacity(references.len());
        for reference in references {
            let (rh, rw) = latent_tokens::reference_sides(reference, batch, LATENT_CHANNELS)?;
            let (mut h_offset, mut w_offset) = (0, 0);
            match method {
                "index" | INDEX_TIMESTEP_ZERO => index += 1,
                "negative_index" => index -= 1,
                _ => {
                    index = 1;
                    (h_offset, w_offset) = side_by_side.place(rh, rw);
                }
            }
            let (reference, rows, cols) =
                latent_tokens::batched_reference(b, reference, batch, PATCH)?;
            let positions = Positions {
                frame: index,
                rows,
                cols,
                row_offset: (h_offset + PATCH / 2) / PATCH,
                col_offset: (w_offset + PATCH / 2) / PATCH,
            };
            placed.push((reference, positions));
        }
        Ok(placed)
    }

    /// The joint sequence's RoPE table: text token j at (s₀ + j) on every axis with s₀ = max(⌊rows/2⌋,
    /// ⌊cols/2⌋) of the latents alone, then the latents' tokens (frame t of `frames` at t), then each
    /// reference's (ComfyUI's centring: −⌊n/2⌋ on each side).
    fn rope<B: Backend>(
        &self,
        b: &B,
        text_len: usize,
        frames: usize,
        rows: usize,
        cols: usize,
        references: &[Positions],
    ) -> Result<Rope<B>> {
        let cfg = &self.config;
        let s0 = (rows / 2).max(cols / 2) as i64;
        let mut positions: Vec<[i64; 3]> = (0..text_len as i64).map(|j| [s0 + j; 3]).collect();
        let latents = (0..frames as i64).map(|frame| Positions {
            frame,
            rows,
            cols,
            row_offset: 0,
            col_offset: 0,
        });
        for grid in latents.chain(references.iter().copied()) {
            grid.extend(&mut positions);
        }
        let (cos, sin) = crate::rope::tables(&positions, cfg.axes_dims, ROPE_THETA);
        let half = cfg.head_dim / 2;
        Rope::upload(b, &cos, &sin, half, DType::F32)
    }

    /// The double-stream block under `prefix` (`transformer_blocks.{i}`) on the image and text tokens (the
    /// ControlNets' blocks too).
    pub(super) fn block<B: Backend>(
        &self,
        b: &B,
        prefix: &str,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        timestep: &Timestep<B>,
        seq: &Sequence<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        self.trunk().block(b, prefix, img, txt, timestep, seq)
    }
}

impl DoubleStream<'_> {
    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }

    /// The image tokens `[B, ΣMᵢ, features]` of `parts` (each `[B, Mᵢ, features]`, joined in order) through
    /// `img_in`: `[B, ΣMᵢ, D]`.
    pub(crate) fn image_in<B: Backend>(&self, b: &B, parts: &[Tensor<B>]) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &["img_in.weight", "img_in.bias"])?;
        let parts: Vec<&Tensor<B>> = parts.iter().collect();
        Ok(b.linear(&b.concat(&parts, 1)?, &layer.weight(0), Some(&layer.weight(1)))?)
    }

    /// Text features `[…, text_dim]` (compute type) through `txt_norm` (RMSNorm) and `txt_in`: `[…, D]`.
    pub(crate) fn text_in<B: Backend>(&self, b: &B, context: &Tensor<B>) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &["txt_norm.weight", "txt_in.weight", "txt_in.bias"])?;
        let normed = b.rms_norm(context, Some(&layer.weight(0)), EPS)?;
        Ok(b.linear(&normed, &layer.weight(1), Some(&layer.weight(2)))?)
    }

    /// temb `[B, D]` of the timestep sinusoid `emb` `[B, 256]` (compute type): Linear → SiLU → Linear
    /// (`time_text_embed.timestep_embedder`, diffusers' and LTX's `TimestepEmbedding`).
    pub(crate) fn timestep_mlp<B: Backend>(&self, b: &B, emb: &Tensor<B>) -> Result<Tensor<B>> {
        let p = "time_text_embed.timestep_embedder";
        let names = ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]
            .map(|n| format!("{p}.{n}"));
        let layer = self.fetch(b, &names.each_ref().map(String::as_str))?;
        let hidden = b.linear(emb, &layer.weight(0), Some(&layer.weight(1)))?;
        let hidden = b.unary(&hidden, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// The final layer on the latents' tokens `img` `[B, M, D]`: adaLN from `silu_temb` with (scale, shift),
    /// scale first (ComfyUI's `LastLayer`), then `proj_out`: `[B, M, features]`.
    pub(crate) fn final_layer<B: Backend>(
        &self,
        b: &B,
        silu_temb: &Tensor<B>,
        img: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let d = self.dim;
        let layer = self.fetch(
            b,
            &["norm_out.linear.weight", "norm_out.linear.bias", "proj_out.weight", "proj_out.bias"],
        )?;
        let emb = b.linear(silu_temb, &layer.weight(0), Some(&layer.weight(1)))?;
        let (scale, shift) = (b.slice(&emb, -1, 0, d)?, b.slice(&emb, -1, d, d)?);
        let y = b.modulate(&b.layer_norm(img, None, None, EPS)?, &scale, Some(&shift))?;
        Ok(b.linear(&y, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// One stream's modulation from `silu_temb` with the `mod.1` weight and bias.
    fn modulation<B: Backend>(
        &self,
        b: &B,
        silu_temb: &Tensor<B>,
        weight: &Weight<'_>,
        bias: &Weight<'_>,
    ) -> Result<Modulation<B>> {
        let d = self.dim;
        let m = b.linear(silu_temb, weight, Some(bias))?;
        let batch = m.dim(0)?;
        let chunk = |k: usize| b.slice(&m, -1, k * d, d);
        let gate = |k: usize| -> Result<Tensor<B>> { Ok(chunk(k)?.reshape(&[batch, 1, d])?) };
        Ok(Modulation {
            shift: [chunk(0)?, chunk(3)?],
            scale: [chunk(1)?, chunk(4)?],
            gate: [gate(2)?, gate(5)?],
        })
    }

    /// The double-stream block under `prefix` (`transformer_blocks.{i}`) on the image and text tokens.
    pub(crate) fn block<B: Backend>(
        &self,
        b: &B,
        prefix: &str,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        timestep: &Timestep<B>,
        seq: &Sequence<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let names = block_names(prefix);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let layer = self.fetch(b, &names)?;
        let w = |k: usize| layer.weight(k);
        let mut img_ranges = vec![(0, self.modulation(b, &timestep.silu, &w(0), &w(1))?)];
        if let Some((at, silu)) = &timestep.zero {
            img_ranges.push((*at, self.modulation(b, silu, &w(0), &w(1))?));
        }
        let img_mod = StreamModulation { ranges: img_ranges };
        let txt_main = self.modulation(b, &timestep.silu, &w(2), &w(3))?;
        let txt_mod = StreamModulation {
            ranges: match seq.ragged() {
                Some(samples) => samples
                    .enumerate()
                    .map(|(i, (at, _))| Ok((at, txt_main.sample(b, i)?)))
                    .collect::<Result<_>>()?,
                None => vec![(0, txt_main)],
            },
        };

        let (img_attn, txt_attn) = {
            let img_n = img_mod.modulated(b, img, 0)?;
            let txt_n = txt_mod.modulated(b, txt, 0)?;
            self.attention(b, &layer, &img_n, &txt_n, seq)?
        };
        let img = img_mod.gated_add(b, img, &img_attn, 0)?;
        let txt = txt_mod.gated_add(b, txt, &txt_attn, 0)?;
        drop((img_attn, txt_attn));

        let mlp = |x: &Tensor<B>, k: usize| -> Result<Tensor<B>> {
            let hidden = b.linear(x, &w(k), Some(&w(k + 1)))?;
            let hidden = b.unary(&hidden, UnaryOp::GeluTanh)?;
            Ok(b.linear(&hidden, &w(k + 2), Some(&w(k + 3)))?)
        };
        let img_out = mlp(&img_mod.modulated(b, &img, 1)?, 24)?;
        let img = img_mod.gated_add(b, &img, &img_out, 1)?;
        let txt_out = mlp(&txt_mod.modulated(b, &txt, 1)?, 28)?;
        let txt = txt_mod.gated_add(b, &txt, &txt_out, 1)?;
        Ok((img, txt))
    }

    /// The joint attention of a block: q, k, v of each stream (with biases), per-head RMS norms of q and k,
    /// each sample's text tokens first, RoPE on its joint sequence, unmasked softmax, then each stream's output
    /// projection. Returns (image, text) outputs.
    fn attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        seq: &Sequence<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let (heads, hd) = (self.heads, self.head_dim);
        let w = |k: usize| layer.weight(k);
        let project = |x: &Tensor<B>, k: usize, norm: Option<usize>| -> Result<Tensor<B>> {
            let (batch, len) = (x.dim(0)?, x.dim(1)?);
            let t = b.linear(x, &w(k), Some(&w(k + 1)))?.reshape(&[batch, len, heads, hd])?;
            Ok(match norm {
                Some(n) => b.rms_norm(&t, Some(&w(n)), EPS)?,
                None => t,
            })
        };
        // Text [b, n, heads, hd] and image [b, m, heads, hd] q, k, v of the same samples → their outputs
        // [b, n, heads·hd] and [b, m, heads·hd].
        let joint = |txt: [Tensor<B>; 3], img: [Tensor<B>; 3], rope: &Rope<B>| {
            let [q, k, v] = [0, 1, 2].map(|i| -> Result<Tensor<B>> {
                let j = b.concat(&[&txt[i], &img[i]], 1)?;
                let j = match i {
                    2 => j,
                    _ => b.rope(&j, &rope.cos, &rope.sin, RopeLayout::Interleaved)?,
                };
                Ok(b.permute(&j, &[0, 2, 1, 3])?)
            });
            let o = b.attention(&q?, &k?, &v?, AttentionMask::None, 1.0 / (hd as f32).sqrt())?;
            let (batch, text_len) = (txt[0].dim(0)?, txt[0].dim(1)?);
            let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, usize::MAX, heads * hd])?;
            Ok::<_, Error>((
                b.slice(&o, 1, 0, text_len)?,
                b.slice(&o, 1, text_len, img[0].dim(1)?)?,
            ))
        };
        let (txt_o, img_o) = {
            let txt_qkv =
                [project(txt, 10, Some(18))?, project(txt, 12, Some(19))?, project(txt, 14, None)?];
            let img_qkv =
                [project(img, 4, Some(16))?, project(img, 6, Some(17))?, project(img, 8, None)?];
            match seq.ragged() {
                None => joint(txt_qkv, img_qkv, &seq.ropes[0])?,
                Some(samples) => {
                    let cut = |qkv: &[Tensor<B>; 3], dim: isize, at: usize, n: usize| {
                        let [q, k, v] = qkv.each_ref().map(|t| b.slice(t, dim, at, n));
                        Ok::<_, Error>([q?, k?, v?])
                    };
                    let (mut txt_os, mut img_os) = (Vec::new(), Vec::new());
                    for ((i, (at, n)), rope) in samples.enumerate().zip(&seq.ropes) {
                        let (t, m) =
                            joint(cut(&txt_qkv, 1, at, n)?, cut(&img_qkv, 0, i, 1)?, rope)?;
                        txt_os.push(t);
                        img_os.push(m);
                    }
                    (
                        b.concat(&txt_os.iter().collect::<Vec<_>>(), 1)?,
                        b.concat(&img_os.iter().collect::<Vec<_>>(), 0)?,
                    )
                }
            }
        };
        let img_o = b.linear(&img_o, &w(20), Some(&w(21)))?;
        let txt_o = b.linear(&txt_o, &w(22), Some(&w(23)))?;
        Ok((img_o, txt_o))
    }
}

/// Where a latent's token grid sits: its frame, its size in tokens and its offset (`offset`/`uxo` methods).
#[derive(Debug, Clone, Copy)]
struct Positions {
    frame: i64,
    rows: usize,
    cols: usize,
    row_offset: usize,
    col_offset: usize,
}

impl Positions {
    /// Appends the grid's positions, row-major: (frame, r + row_offset − ⌊rows/2⌋, s + col_offset − ⌊cols/2⌋).
    fn extend(&self, out: &mut Vec<[i64; 3]>) {
        let (r0, c0) = ((self.rows / 2) as i64, (self.cols / 2) as i64);
        let (ro, co) = (self.row_offset as i64, self.col_offset as i64);
        for r in 0..self.rows as i64 {
            out.extend((0..self.cols as i64).map(|s| [self.frame, r + ro - r0, s + co - c0]));
        }
    }
}

/// `x` `[B, C, h, w]` padded circularly to even sides, and its token grid (rows, cols).
pub(super) fn padded<B: Backend>(b: &B, x: &Tensor<B>) -> Result<(Tensor<B>, usize, usize)> {
    latent_tokens::padded(b, x, PATCH)
}

/// Latents `[B, C, H, W]` (H, W even) → tokens `[B, (H/2)·(W/2), 4C]`, channel-major features.
pub(super) fn patchify<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    latent_tokens::patchify(b, x, PATCH)
}
