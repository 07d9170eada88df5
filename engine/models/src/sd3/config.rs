//! Detection of an SD3 MMDiT (ComfyUI's key names) and its [`Config`], every width read from tensor shapes as
//! ComfyUI's `detect_unet_config` reads them, and the [`LoadPlan`].

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks an MMDiT (ComfyUI's detection key).
pub const MARKER: &str = "joint_blocks.0.context_block.attn.qkv.weight";
/// Head width: ComfyUI's MMDiT is 64 wide per head, `depth` heads (`hidden_size = 64 · depth`).
pub const HEAD_DIM: usize = 64;
/// Patch side (the patch embedding's kernel and stride).
pub const PATCH: usize = 2;
/// Sinusoid width of the timestep embedding.
pub const T_FREQ_DIM: usize = 256;
/// ε of the blocks' and the final layer's LayerNorms (no affine weights).
pub const LN_EPS: f32 = 1e-6;
/// ε of the per-head q/k RMS norms (`qk_norm="rms"`).
pub const QK_EPS: f32 = 1e-6;

/// An MMDiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Hidden width D (`64 · depth`; 2432 for SD3.5 Large).
    pub dim: usize,
    /// Attention heads (`depth`: 38).
    pub heads: usize,
    /// Joint blocks (38); the last one's context block is `pre_only`.
    pub blocks: usize,
    /// Latent channels in (16).
    pub in_channels: usize,
    /// Channels out (16).
    pub out_channels: usize,
    /// Side of the learned position table in patches (192).
    pub pos_embed_max: usize,
    /// Width of the pooled vector `y` (CLIP-L's + CLIP-G's: 2048).
    pub adm_width: usize,
    /// Width of the text states the context embedder reads (T5-XXL's: 4096).
    pub context_width: usize,
    /// Whether q and k are RMS-normed per head (SD3.5's `qk_norm="rms"`; SD3 Medium has none).
    pub qk_norm: bool,
}

impl Config {
    /// Whether block `i`'s context stream stops after its attention (the last block's).
    pub fn pre_only(&self, i: usize) -> bool {
        i + 1 == self.blocks
    }
}

/// Whether `h` holds an MMDiT, and its config. `Ok(None)`: not one. `Err(Unsupported)`: an MMDiT Kiln does not run
/// (SD3.5 Medium's extra self-attention, a register or a context processor) or one with tensors missing or of the
/// wrong shape.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, "an MMDiT");
    if (0..h.count_blocks("joint_blocks."))
        .any(|i| h.has(&format!("joint_blocks.{i}.x_block.attn2.qkv.weight")))
    {
        return Err(h.unsupported(
            "SD3.5 Medium's MMDiT-X (a second self-attention in its first blocks), which Kiln does not run yet; \
             Kiln runs SD3.5 Large's and SD3 Medium's MMDiT",
        ));
    }
    if h.has("register") || h.has("context_processor.layers.0.attn.qkv.weight") {
        return Err(h.unsupported(
            "an MMDiT with registers or a context processor, which Kiln does not run",
        ));
    }
    let proj = dims("x_embedder.proj.weight", 4)?;
    let (dim, in_channels) = (proj[0], proj[1]);
    if proj[2..] != [PATCH, PATCH] || !dim.is_multiple_of(HEAD_DIM) {
        return Err(h.unsupported(format!(
            "an MMDiT patch embedding {proj:?}: not {PATCH}×{PATCH} patches into {HEAD_DIM}-wide heads"
        )));
    }
    let positions = dims("pos_embed", 3)?[1];
    let pos_embed_max = (positions as f64).sqrt().round() as usize;
    if pos_embed_max * pos_embed_max != positions {
        return Err(h.unsupported(format!("a position table of {positions} patches, not a square")));
    }
    let linear = dims("final_layer.linear.weight", 2)?;
    let config = Config {
        dim,
        heads: dim / HEAD_DIM,
        blocks: h.gapless_blocks("joint_blocks.", "an MMDiT whose joint blocks")?,
        in_channels,
        out_channels: linear[0] / (PATCH * PATCH),
        pos_embed_max,
        adm_width: dims("y_embedder.mlp.0.weight", 2)?[1],
        context_width: dims("context_embedder.weight", 2)?[1],
        qk_norm: h.has("joint_blocks.0.context_block.attn.ln_q.weight"),
    };
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the MMDiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let mut all: Vec<(String, Vec<usize>)> = Vec::new();
    let mut linear = |name: &str, out: usize, inp: usize| {
        all.push((format!("{name}.weight"), vec![out, inp]));
        all.push((format!("{name}.bias"), vec![out]));
    };
    linear("t_embedder.mlp.0", d, T_FREQ_DIM);
    linear("t_embedder.mlp.2", d, d);
    linear("y_embedder.mlp.0", d, cfg.adm_width);
    linear("y_embedder.mlp.2", d, d);
    linear("context_embedder", d, cfg.context_width);
    for i in 0..cfg.blocks {
        for stream in ["context_block", "x_block"] {
            let p = format!("joint_blocks.{i}.{stream}");
            let pre_only = stream == "context_block" && cfg.pre_only(i);
            linear(&format!("{p}.adaLN_modulation.1"), if pre_only { 2 * d } else { 6 * d }, d);
            linear(&format!("{p}.attn.qkv"), 3 * d, d);
            if !pre_only {
                linear(&format!("{p}.attn.proj"), d, d);
                linear(&format!("{p}.mlp.fc1"), 4 * d, d);
                linear(&format!("{p}.mlp.fc2"), d, 4 * d);
            }
        }
    }
    linear("final_layer.adaLN_modulation.1", 2 * d, d);
    linear("final_layer.linear", PATCH * PATCH * cfg.out_channels, d);
    all.push(("x_embedder.proj.weight".to_owned(), vec![d, cfg.in_channels, PATCH, PATCH]));
    all.push(("x_embedder.proj.bias".to_owned(), vec![d]));
    all.push(("pos_embed".to_owned(), vec![1, cfg.pos_embed_max * cfg.pos_embed_max, d]));
    if cfg.qk_norm {
        for i in 0..cfg.blocks {
            for stream in ["context_block", "x_block"] {
                for n in ["ln_q", "ln_k"] {
                    all.push((
                        format!("joint_blocks.{i}.{stream}.attn.{n}.weight"),
                        vec![HEAD_DIM],
                    ));
                }
            }
        }
    }
    all
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}
