//! Detection of a HiDream-I1 / E1 DiT (ComfyUI's names, `comfy/ldm/hidream/model.py`, which are diffusers'
//! too) and its [`Config`], every width read from tensor shapes, and the [`LoadPlan`].
//!
//! ComfyUI recognises HiDream by `caption_projection.0.linear.weight` and hard-codes the released model's
//! widths (20 heads of 128, 16 double and 32 single blocks, 4 routed experts of which 2 are active, T5-XXL and
//! Llama states 4096 wide, a 2048-wide pooled vector). Kiln keeps the head width (128) and the number of active
//! experts, which no shape tells, and reads the rest, so a shrunken model of the same structure (the test
//! fixtures, the template suite's) loads too.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks a HiDream DiT (ComfyUI's detection key).
pub const MARKER: &str = "caption_projection.0.linear.weight";
/// Head width (ComfyUI's `attention_head_dim`).
pub const HEAD_DIM: usize = 128;
/// RoPE dims per axis (index, row, column), summing to the head width; θ = 10000.
pub const AXES_DIMS: [usize; 3] = [64, 32, 32];
/// RoPE base θ.
pub const ROPE_THETA: f64 = 10_000.0;
/// Latent channels (the FLUX.1 VAE's).
pub const LATENT_CHANNELS: usize = 16;
/// Patch side.
pub const PATCH: usize = 2;
/// Sinusoid width of the timestep embedding.
pub const T_FREQ_DIM: usize = 256;
/// ε of the blocks' LayerNorms (no affine weights).
pub const LN_EPS: f32 = 1e-6;
/// ε of the q/k RMS norms (`HiDreamAttention`'s default).
pub const QK_EPS: f32 = 1e-5;
/// Experts each token is routed to (ComfyUI's `num_activated_experts`, which no shape tells).
pub const ACTIVE_EXPERTS: usize = 2;

/// A HiDream DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Inner width D (rows of `x_embedder.proj.weight`; 2560).
    pub dim: usize,
    /// Attention heads (D / [`HEAD_DIM`]; 20).
    pub heads: usize,
    /// Double-stream blocks (16).
    pub double_blocks: usize,
    /// Single-stream blocks (32).
    pub single_blocks: usize,
    /// Routed experts of every image-stream feed-forward (4); 0 where the blocks have a plain SwiGLU.
    pub experts: usize,
    /// T5-XXL's width (of the last caption projection; 4096).
    pub t5_width: usize,
    /// The Llama states' width (of the other caption projections; 4096).
    pub llama_width: usize,
    /// The pooled vector's width (CLIP-L's 768 + CLIP-G's 1280).
    pub pooled_width: usize,
    /// Hidden width of a routed expert's SwiGLU (6912).
    pub expert_hidden: usize,
    /// Hidden width of the shared expert's SwiGLU, or of the plain one without experts (3584).
    pub shared_hidden: usize,
    /// Hidden width of the double blocks' text-stream SwiGLU (6912).
    pub text_hidden: usize,
}

impl Config {
    /// Blocks of both kinds; each reads its own caption projection of a Llama state.
    pub fn blocks(&self) -> usize {
        self.double_blocks + self.single_blocks
    }

    /// The Llama state block `k` reads when `states` are given: ComfyUI's `llama_layers` (0, 1, …, 31, then
    /// 31 for every later block) for the released 32 states, the same rule for any other count.
    pub fn llama_state(&self, k: usize, states: usize) -> usize {
        k.min(states.saturating_sub(1))
    }
}

/// Where block `k` (double blocks first) keeps its weights.
pub(crate) fn block_prefix(cfg: &Config, k: usize) -> String {
    if k < cfg.double_blocks {
        format!("double_stream_blocks.{k}.block")
    } else {
        format!("single_stream_blocks.{}.block", k - cfg.double_blocks)
    }
}

/// A SwiGLU's three weights under `stem` with their shapes.
fn swiglu(stem: &str, d: usize, hidden: usize) -> Vec<(String, Vec<usize>)> {
    vec![
        (format!("{stem}.w1.weight"), vec![hidden, d]),
        (format!("{stem}.w2.weight"), vec![d, hidden]),
        (format!("{stem}.w3.weight"), vec![hidden, d]),
    ]
}

/// The weights of block `k` with their shapes, in the order the model reads them.
pub(crate) fn block_shapes(cfg: &Config, k: usize) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let p = block_prefix(cfg, k);
    let double = k < cfg.double_blocks;
    let sets = if double { 12 } else { 6 };
    let mut out = vec![
        (format!("{p}.adaLN_modulation.1.weight"), vec![sets * d, d]),
        (format!("{p}.adaLN_modulation.1.bias"), vec![sets * d]),
    ];
    let streams: &[&str] = if double { &["", "_t"] } else { &[""] };
    for s in streams {
        for proj in ["to_q", "to_k", "to_v", "to_out"] {
            out.push((format!("{p}.attn1.{proj}{s}.weight"), vec![d, d]));
            out.push((format!("{p}.attn1.{proj}{s}.bias"), vec![d]));
        }
        out.push((format!("{p}.attn1.q_rms_norm{s}.weight"), vec![d]));
        out.push((format!("{p}.attn1.k_rms_norm{s}.weight"), vec![d]));
    }
    if cfg.experts > 0 {
        out.push((format!("{p}.ff_i.gate.weight"), vec![cfg.experts, d]));
        out.extend(swiglu(&format!("{p}.ff_i.shared_experts"), d, cfg.shared_hidden));
        for e in 0..cfg.experts {
            out.extend(swiglu(&format!("{p}.ff_i.experts.{e}"), d, cfg.expert_hidden));
        }
    } else {
        out.extend(swiglu(&format!("{p}.ff_i"), d, cfg.shared_hidden));
    }
    if double {
        out.extend(swiglu(&format!("{p}.ff_t"), d, cfg.text_hidden));
    }
    out
}

/// The weights outside the blocks with their shapes.
fn global_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let patch_features = LATENT_CHANNELS * PATCH * PATCH;
    let mut out: Vec<(String, Vec<usize>)> = [
        ("t_embedder.timestep_embedder.linear_1.weight", vec![d, T_FREQ_DIM]),
        ("t_embedder.timestep_embedder.linear_1.bias", vec![d]),
        ("t_embedder.timestep_embedder.linear_2.weight", vec![d, d]),
        ("t_embedder.timestep_embedder.linear_2.bias", vec![d]),
        ("p_embedder.pooled_embedder.linear_1.weight", vec![d, cfg.pooled_width]),
        ("p_embedder.pooled_embedder.linear_1.bias", vec![d]),
        ("p_embedder.pooled_embedder.linear_2.weight", vec![d, d]),
        ("p_embedder.pooled_embedder.linear_2.bias", vec![d]),
        ("x_embedder.proj.weight", vec![d, patch_features]),
        ("x_embedder.proj.bias", vec![d]),
        ("final_layer.adaLN_modulation.1.weight", vec![2 * d, d]),
        ("final_layer.adaLN_modulation.1.bias", vec![2 * d]),
        ("final_layer.linear.weight", vec![patch_features, d]),
        ("final_layer.linear.bias", vec![patch_features]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    for k in 0..cfg.blocks() {
        out.push((caption_projection(k), vec![d, cfg.llama_width]));
    }
    out.push((caption_projection(cfg.blocks()), vec![d, cfg.t5_width]));
    out
}

/// The caption projection `k` (block k's Llama state; the last one, after every block's, T5-XXL's).
pub(crate) fn caption_projection(k: usize) -> String {
    format!("caption_projection.{k}.linear.weight")
}

/// Every weight of `cfg`'s network with its shape: the globals, then each block's.
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut all = global_shapes(cfg);
    for k in 0..cfg.blocks() {
        all.extend(block_shapes(cfg, k));
    }
    all
}

/// The rows of a matrix `name`, which must exist.
fn rows(h: &Header, name: &str) -> Result<(usize, usize)> {
    match h.require(name)?.shape.as_slice() {
        &[r, c] => Ok((r, c)),
        other => Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(name)))),
    }
}

/// Recognises a HiDream DiT and reads its [`Config`]; `Ok(None)` for another file, [`crate::Error::Unsupported`]
/// for a HiDream file Kiln cannot run (naming the weight at fault).
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) || !h.has("x_embedder.proj.weight") {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let (dim, _) = rows(h, "x_embedder.proj.weight")?;
    if dim == 0 || !dim.is_multiple_of(HEAD_DIM) {
        return Err(h.unsupported(format!(
            "a HiDream DiT of inner width {dim}: it must be a multiple of the head width {HEAD_DIM}"
        )));
    }
    let double_blocks =
        h.gapless_blocks("double_stream_blocks.", "a HiDream DiT whose double blocks")?;
    let single_blocks =
        h.gapless_blocks("single_stream_blocks.", "a HiDream DiT whose single blocks")?;
    let first = if double_blocks > 0 {
        "double_stream_blocks.0.block"
    } else {
        "single_stream_blocks.0.block"
    };
    let experts = h.count_blocks(&format!("{first}.ff_i.experts."));
    let (expert_hidden, shared_hidden) = if experts > 0 {
        let (e, _) = rows(h, &format!("{first}.ff_i.experts.0.w1.weight"))?;
        let (s, _) = rows(h, &format!("{first}.ff_i.shared_experts.w1.weight"))?;
        (e, s)
    } else {
        (0, rows(h, &format!("{first}.ff_i.w1.weight"))?.0)
    };
    let text_hidden = if double_blocks > 0 {
        rows(h, "double_stream_blocks.0.block.ff_t.w1.weight")?.0
    } else {
        0
    };
    let blocks = double_blocks + single_blocks;
    let (_, t5_width) = rows(h, &caption_projection(blocks))?;
    let (_, llama_width) = rows(h, &caption_projection(0))?;
    let (_, pooled_width) = rows(h, "p_embedder.pooled_embedder.linear_1.weight")?;
    let cfg = Config {
        dim,
        heads: dim / HEAD_DIM,
        double_blocks,
        single_blocks,
        experts,
        t5_width,
        llama_width,
        pooled_width,
        expert_hidden,
        shared_hidden,
        text_hidden,
    };
    if blocks == 0 {
        return Err(h.unsupported("a HiDream DiT without blocks"));
    }
    for (name, want) in expected(&cfg) {
        let found = h.require(&name)?.shape.as_slice();
        if found != want.as_slice() {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for a HiDream DiT of width {dim}",
                h.key(&name)
            )));
        }
    }
    Ok(Some(cfg))
}

/// Every weight, under its name without the file's prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}
