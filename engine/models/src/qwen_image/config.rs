//! Detection of a Qwen-Image MMDiT (ComfyUI's names, which are diffusers' too) and its [`Config`], every width
//! derived from tensor shapes, and the [`LoadPlan`] (models-qwen-image.md §2.2, §3.1, §3.2).
//!
//! ComfyUI recognises Qwen-Image by `txt_norm.weight` and hard-codes the rest (24 heads of 128, RoPE axes
//! (16, 56, 56)); Kiln reads the shapes and scales the axes to the head width, so a shrunken model with the
//! same structure (the test fixtures) loads too. An Edit 2511 file (marked by `__index_timestep_zero__`) takes
//! [`INDEX_TIMESTEP_ZERO`] as its default reference method; a Layered file has [`ADDITION_T_EMBEDDING`].

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// LayerNorm and RMSNorm ε of every norm.
pub const EPS: f32 = 1e-6;
/// RoPE base θ.
pub const ROPE_THETA: f64 = 10_000.0;
/// Latent channels.
pub const LATENT_CHANNELS: usize = 16;
/// Patch side.
pub const PATCH: usize = 2;
/// Sinusoid width of the timestep embedding.
pub const T_FREQ_DIM: usize = 256;
/// The reference method of a model whose file marks none (ComfyUI's `default_ref_method`).
pub const DEFAULT_REFERENCE_METHOD: &str = "index";
/// Edit 2511's reference method, its file's default: placed as `index`, the references' tokens modulated at
/// timestep 0.
pub const INDEX_TIMESTEP_ZERO: &str = "index_timestep_zero";

/// A Qwen-Image MMDiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Inner width D (rows of `img_in.weight`; 3072).
    pub dim: usize,
    /// Attention heads (D / head width; 24).
    pub heads: usize,
    /// Head width (of `attn.norm_q.weight`; 128).
    pub head_dim: usize,
    /// Double-stream blocks (60).
    pub layers: usize,
    /// MLP hidden width (rows of `img_mlp.net.0.proj.weight`; 12288).
    pub mlp_hidden: usize,
    /// Text feature width (of `txt_norm.weight`: the text encoder's hidden size, 3584).
    pub text_dim: usize,
    /// RoPE dims per axis (frame, row, column) summing to the head width: (16, 56, 56) at 128, the same
    /// proportions (hd/8, 7hd/16, 7hd/16) at other widths.
    pub axes_dims: [usize; 3],
    /// Whether the file has [`ADDITION_T_EMBEDDING`] (Qwen-Image-Layered): its row 0 joins the timestep
    /// embedding, as ComfyUI adds it when no other row is asked for.
    pub additional_t_cond: bool,
}

/// Qwen-Image-Layered's extra timestep embedding table `[2, D]`.
pub const ADDITION_T_EMBEDDING: &str = "time_text_embed.addition_t_embedding.weight";

/// The names of a block's weights under `prefix` (`transformer_blocks.{i}`; a ControlNet's blocks have other
/// prefixes), in the order [`super::QwenImage`] reads them.
pub(crate) fn block_names(prefix: &str) -> Vec<String> {
    const TENSORS: [&str; 32] = [
        "img_mod.1.weight",
        "img_mod.1.bias",
        "txt_mod.1.weight",
        "txt_mod.1.bias",
        "attn.to_q.weight",
        "attn.to_q.bias",
        "attn.to_k.weight",
        "attn.to_k.bias",
        "attn.to_v.weight",
        "attn.to_v.bias",
        "attn.add_q_proj.weight",
        "attn.add_q_proj.bias",
        "attn.add_k_proj.weight",
        "attn.add_k_proj.bias",
        "attn.add_v_proj.weight",
        "attn.add_v_proj.bias",
        "attn.norm_q.weight",
        "attn.norm_k.weight",
        "attn.norm_added_q.weight",
        "attn.norm_added_k.weight",
        "attn.to_out.0.weight",
        "attn.to_out.0.bias",
        "attn.to_add_out.weight",
        "attn.to_add_out.bias",
        "img_mlp.net.0.proj.weight",
        "img_mlp.net.0.proj.bias",
        "img_mlp.net.2.weight",
        "img_mlp.net.2.bias",
        "txt_mlp.net.0.proj.weight",
        "txt_mlp.net.0.proj.bias",
        "txt_mlp.net.2.weight",
        "txt_mlp.net.2.bias",
    ];
    TENSORS.iter().map(|t| format!("{prefix}.{t}")).collect()
}

/// Where double-stream block `i`'s weights are.
pub(crate) fn block_prefix(i: usize) -> String {
    format!("transformer_blocks.{i}")
}

/// A token's latent features: 16 channels of a 2×2 patch.
const PATCH_FEATURES: usize = LATENT_CHANNELS * PATCH * PATCH;

/// The weights that embed the inputs (latent patches, text, timestep) with their shapes for `cfg`: the
/// MMDiT's, and an InstantX ControlNet's.
pub(crate) fn embedding_shapes(cfg: &Config) -> Vec<(&'static str, Vec<usize>)> {
    embedding_shapes_of(cfg, PATCH_FEATURES)
}

/// [`embedding_shapes`] for tokens of `features` latent features.
fn embedding_shapes_of(cfg: &Config, features: usize) -> Vec<(&'static str, Vec<usize>)> {
    let d = cfg.dim;
    vec![
        ("img_in.weight", vec![d, features]),
        ("img_in.bias", vec![d]),
        ("txt_norm.weight", vec![cfg.text_dim]),
        ("txt_in.weight", vec![d, cfg.text_dim]),
        ("txt_in.bias", vec![d]),
        ("time_text_embed.timestep_embedder.linear_1.weight", vec![d, T_FREQ_DIM]),
        ("time_text_embed.timestep_embedder.linear_1.bias", vec![d]),
        ("time_text_embed.timestep_embedder.linear_2.weight", vec![d, d]),
        ("time_text_embed.timestep_embedder.linear_2.bias", vec![d]),
    ]
}

/// The weights outside the blocks, with their shapes for `cfg` and tokens of `features` latent features.
fn global_shapes(cfg: &Config, features: usize) -> Vec<(&'static str, Vec<usize>)> {
    let d = cfg.dim;
    embedding_shapes_of(cfg, features)
        .into_iter()
        .chain([
            ("norm_out.linear.weight", vec![2 * d, d]),
            ("norm_out.linear.bias", vec![2 * d]),
            ("proj_out.weight", vec![features, d]),
            ("proj_out.bias", vec![features]),
        ])
        .chain(cfg.additional_t_cond.then(|| (ADDITION_T_EMBEDDING, vec![2, d])))
        .collect()
}

/// The shapes of a block's weights, in [`block_names`] order.
pub(crate) fn block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, hd, f) = (cfg.dim, cfg.head_dim, cfg.mlp_hidden);
    let linear = |out: usize, inp: usize| [vec![out, inp], vec![out]];
    let mut shapes = Vec::new();
    shapes.extend(linear(6 * d, d));
    shapes.extend(linear(6 * d, d));
    for _ in 0..6 {
        shapes.extend(linear(d, d));
    }
    shapes.extend([vec![hd], vec![hd], vec![hd], vec![hd]]);
    shapes.extend(linear(d, d));
    shapes.extend(linear(d, d));
    for _ in 0..2 {
        shapes.extend(linear(f, d));
        shapes.extend(linear(d, f));
    }
    shapes
}

/// Every weight of `cfg`'s network with its shape: the globals, then each block's.
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    expected_of(cfg, PATCH_FEATURES)
}

/// [`expected`] for a network whose tokens have `features` latent features in and out (Mage-Flow's 128
/// channels of one latent pixel).
pub(crate) fn expected_of(cfg: &Config, features: usize) -> Vec<(String, Vec<usize>)> {
    let mut all: Vec<(String, Vec<usize>)> =
        global_shapes(cfg, features).into_iter().map(|(n, s)| (n.to_owned(), s)).collect();
    for i in 0..cfg.layers {
        all.extend(block_names(&block_prefix(i)).into_iter().zip(block_shapes(cfg)));
    }
    all
}

/// The shape of `name`, which must exist.
pub(crate) fn shape<'h>(h: &'h Header, name: &str) -> Result<&'h [usize]> {
    Ok(h.require(name)?.shape.as_slice())
}

/// How many consecutive blocks `prefix0.`, `prefix1.`, ... the header has (`prefix` ends in a dot).
pub(crate) fn count_blocks(h: &Header, prefix: &str) -> usize {
    h.count_blocks(prefix)
}

/// The config of `layers` MMDiT blocks of inner width `dim` on text of width `text_dim`, the head and MLP widths
/// read from the block under `prefix` (`transformer_blocks.0`); the RoPE axes scale with the head.
pub(crate) fn block_config(
    h: &Header,
    prefix: &str,
    dim: usize,
    text_dim: usize,
    layers: usize,
) -> Result<Config> {
    let &[head_dim] = shape(h, &format!("{prefix}.attn.norm_q.weight"))? else {
        return Err(h.unsupported(format!("`{prefix}.attn.norm_q.weight` is not a vector")));
    };
    let &[mlp_hidden, _] = shape(h, &format!("{prefix}.img_mlp.net.0.proj.weight"))? else {
        return Err(h.unsupported(format!("`{prefix}.img_mlp.net.0.proj.weight` is not a matrix")));
    };
    if head_dim == 0 || head_dim % 16 != 0 || !dim.is_multiple_of(head_dim) || layers == 0 {
        return Err(h.unsupported(format!(
            "a Qwen-Image layout with inner width {dim}, head width {head_dim} and {layers} blocks: the \
             head width must divide the inner width and be a multiple of 16 (for the RoPE axes)"
        )));
    }
    Ok(Config {
        dim,
        heads: dim / head_dim,
        head_dim,
        layers,
        mlp_hidden,
        text_dim,
        axes_dims: [head_dim / 8, 7 * head_dim / 16, 7 * head_dim / 16],
        additional_t_cond: false,
    })
}

/// Recognises a Qwen-Image MMDiT (`Ok(None)` without `txt_norm.weight` and `img_in.weight`): its config and
/// the reference method it takes when the conditioning names none ([`INDEX_TIMESTEP_ZERO`] where the file has
/// `__index_timestep_zero__`, as ComfyUI's detection reads it; else [`DEFAULT_REFERENCE_METHOD`]).
/// A Mage-Flow file (128 rows of `proj_out.weight` and 128 columns of `img_in.weight`) is not one:
/// [`crate::mage_flow::detect`] reads it.
pub fn detect(h: &Header) -> Result<Option<(Config, &'static str)>> {
    if !h.has("txt_norm.weight") || !h.has("img_in.weight") || is_mage_flow(h) {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let &[dim, _] = shape(h, "img_in.weight")? else {
        return Err(h.unsupported("`img_in.weight` is not a matrix"));
    };
    let &[text_dim] = shape(h, "txt_norm.weight")? else {
        return Err(h.unsupported("`txt_norm.weight` is not a vector"));
    };
    let layers = count_blocks(h, "transformer_blocks.");
    let cfg = Config {
        additional_t_cond: h.has(ADDITION_T_EMBEDDING),
        ..block_config(h, &block_prefix(0), dim, text_dim, layers)?
    };
    check_shapes(h, &expected(&cfg), &format!("a Qwen-Image MMDiT of width {dim}"))?;
    let method = if h.has("__index_timestep_zero__") {
        INDEX_TIMESTEP_ZERO
    } else {
        DEFAULT_REFERENCE_METHOD
    };
    Ok(Some((cfg, method)))
}

/// Every weight, under its name without the file's prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}

/// Checks that every weight of `expected` is in `h` with its shape (`what` names the network in the error).
pub(crate) fn check_shapes(
    h: &Header,
    expected: &[(String, Vec<usize>)],
    what: &str,
) -> Result<()> {
    for (name, want) in expected {
        let found = shape(h, name)?;
        if found != want.as_slice() {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for {what}",
                h.key(name)
            )));
        }
    }
    Ok(())
}

/// The latent channels of Mage-Flow, this layout at patch 1 (a token is one latent pixel of the FLUX.2 VAE's
/// 128 channels).
pub(crate) const MAGE_FLOW_CHANNELS: usize = 128;

/// Whether `h` holds Mage-Flow's variant of the layout, which [`detect`] leaves to `crate::mage_flow`: 128
/// rows of `proj_out.weight` and 128 columns of `img_in.weight` (a latent pixel's 128 channels in and out),
/// where Qwen-Image's packed 2×2 patches of 16 channels have 64 of each. ComfyUI tells them apart by
/// `proj_out`'s rows and `txt_norm`'s width (Mage-Flow's text encoder, Qwen3-VL 4B, is 2560 wide); the
/// widths alone keep that rule for shrunken files too.
pub(crate) fn is_mage_flow(h: &Header) -> bool {
    let rows = h.shape("proj_out.weight").and_then(|s| s.first().copied());
    let cols = h.shape("img_in.weight").and_then(|s| s.get(1).copied());
    rows == Some(MAGE_FLOW_CHANNELS) && cols == Some(MAGE_FLOW_CHANNELS)
}
