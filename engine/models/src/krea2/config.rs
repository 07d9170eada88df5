//! Detection of a Krea 2 DiT (ComfyUI's key names) and its [`Config`], every width read from tensor shapes, and
//! the [`LoadPlan`].
//!
//! ComfyUI recognises the file by [`MARKER`] and reads the image side's sizes from shapes, with 128-wide heads
//! ([`HEAD_DIM`]); it leaves the text adapter's heads at its class default (20 of 128 at the released 2560 wide).
//! Kiln reads those from shapes too (`txtdim / 128` heads, key/value heads from `wk`), which gives ComfyUI's
//! values for the released file and lets a shrunken file of the same structure (the test fixture) load.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks a Krea 2 DiT (ComfyUI's detection key).
pub const MARKER: &str = "txtfusion.projector.weight";
/// Patch side (ComfyUI's `patch`, fixed at 2 by its detection).
pub const PATCH: usize = 2;
/// Width of every attention head, the image blocks' and the text adapter's (ComfyUI's detection divides the
/// projections' rows by 128).
pub const HEAD_DIM: usize = 128;
/// ε of every RMSNorm.
pub const EPS: f32 = 1e-5;
/// RoPE's base period (ComfyUI's `theta`, 1e3).
pub const ROPE_THETA: f64 = 1000.0;
/// The text adapter's layer-wise blocks (attention across the tapped layers of one token) and, as many, its
/// refiner blocks (attention across the tokens): fixed by ComfyUI's `TextFusionTransformer`.
pub const TEXT_FUSION_BLOCKS: usize = 2;
/// The reference method whose reference tokens are modulated by the embedding of timestep 0 (ComfyUI's
/// `ref_latents_method` "index_timestep_zero"); every other named method appends them with the latent's
/// modulation.
pub const INDEX_TIMESTEP_ZERO: &str = "index_timestep_zero";

/// A Krea 2 DiT's hyperparameters (the released K2's in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Hidden width of the joint stream (`features`: 6144).
    pub features: usize,
    /// Latent channels in and out (16: the Wan 2.1 VAE's).
    pub channels: usize,
    /// Single-stream blocks (28).
    pub layers: usize,
    /// Query heads of the blocks' attention (48).
    pub heads: usize,
    /// Key/value heads of the blocks' attention (12: grouped-query).
    pub kv_heads: usize,
    /// Width of the blocks' SwiGLU hidden layer (16384).
    pub mlp_dim: usize,
    /// Width of the timestep's sinusoid (`tdim`: 256).
    pub time_dim: usize,
    /// Text encoder layers tapped and joined into each context token (`txtlayers`: 12).
    pub text_layers: usize,
    /// Width of each tapped layer's state (`txtdim`: 2560, Qwen3-VL 4B's).
    pub text_dim: usize,
    /// Query heads of the text adapter's attention (`txtdim / 128`: 20).
    pub text_heads: usize,
    /// Key/value heads of the text adapter's attention (20).
    pub text_kv_heads: usize,
    /// Width of the text adapter's SwiGLU hidden layer (6912).
    pub text_mlp_dim: usize,
    /// RoPE widths of the (reference index, row, column) axes: ComfyUI's split of the head,
    /// `[hd − 12·(hd/16), 6·(hd/16), 6·(hd/16)]` = (32, 48, 48).
    pub axes: [usize; 3],
}

impl Config {
    /// The width of a context token: the tapped layers' states joined (`txtlayers · txtdim`: 30720).
    pub fn context_dim(&self) -> usize {
        self.text_layers * self.text_dim
    }
}

/// ComfyUI's RoPE axes for a head `head_dim` wide.
fn rope_axes(head_dim: usize) -> [usize; 3] {
    let sixteenth = head_dim / 16;
    [head_dim - 12 * sixteenth, 6 * sixteenth, 6 * sixteenth]
}

/// Whether `h` holds a Krea 2 DiT, and its config. `Ok(None)`: not one. `Err(Unsupported)`: tensors missing or
/// misshapen, or widths that are not whole 128-wide heads.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, "a Krea 2 DiT");
    let first = dims("first.weight", 2)?;
    let (features, patch_features) = (first[0], first[1]);
    if !patch_features.is_multiple_of(PATCH * PATCH) || patch_features == 0 {
        return Err(h.unsupported(format!(
            "a Krea 2 DiT whose patch embedding reads {patch_features} features, not {} per channel",
            PATCH * PATCH
        )));
    }
    let heads_of = |name: &str, what: &str| -> Result<usize> {
        let rows = dims(name, 2)?[0];
        if rows == 0 || !rows.is_multiple_of(HEAD_DIM) {
            return Err(h.unsupported(format!(
                "a Krea 2 DiT whose {what} has {rows} rows, not whole {HEAD_DIM}-wide heads"
            )));
        }
        Ok(rows / HEAD_DIM)
    };
    let heads = heads_of("blocks.0.attn.wq.weight", "query projection")?;
    let kv_heads = heads_of("blocks.0.attn.wk.weight", "key projection")?;
    let text_dim = dims("txtfusion.layerwise_blocks.0.prenorm.scale", 1)?[0];
    let text_kv_heads =
        heads_of("txtfusion.layerwise_blocks.0.attn.wk.weight", "text adapter's key projection")?;
    if heads * HEAD_DIM != features || !text_dim.is_multiple_of(HEAD_DIM) || text_dim == 0 {
        return Err(h.unsupported(format!(
            "a Krea 2 DiT {features} wide with {heads} heads and a {text_dim}-wide text adapter (both must be \
             whole {HEAD_DIM}-wide heads)"
        )));
    }
    let text_heads = text_dim / HEAD_DIM;
    if !heads.is_multiple_of(kv_heads) || !text_heads.is_multiple_of(text_kv_heads) {
        return Err(h.unsupported(format!(
            "a Krea 2 DiT with {heads} query heads to {kv_heads} key/value heads (text {text_heads} to \
             {text_kv_heads}): not whole groups"
        )));
    }
    let config = Config {
        features,
        channels: patch_features / (PATCH * PATCH),
        layers: h.gapless_blocks("blocks.", "a Krea 2 DiT whose blocks")?,
        heads,
        kv_heads,
        mlp_dim: dims("blocks.0.mlp.gate.weight", 2)?[0],
        time_dim: dims("tmlp.0.weight", 2)?[1],
        text_layers: dims(MARKER, 2)?[1],
        text_dim,
        text_heads,
        text_kv_heads,
        text_mlp_dim: dims("txtfusion.layerwise_blocks.0.mlp.gate.weight", 2)?[0],
        axes: rope_axes(HEAD_DIM),
    };
    if !config.time_dim.is_multiple_of(2) {
        return Err(h.unsupported(format!(
            "a Krea 2 DiT whose timestep sinusoid is {} wide (odd)",
            config.time_dim
        )));
    }
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the Krea 2 DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (f, d) = (cfg.features, cfg.text_dim);
    let mut all = Shapes::default();
    all.linear("first", f, cfg.channels * PATCH * PATCH);
    all.linear("tmlp.0", f, cfg.time_dim);
    all.linear("tmlp.2", f, f);
    all.linear("tproj.1", 6 * f, f);
    let text = |all: &mut Shapes, p: &str| {
        all.block(p, d, cfg.text_heads, cfg.text_kv_heads, cfg.text_mlp_dim);
    };
    for i in 0..TEXT_FUSION_BLOCKS {
        text(&mut all, &format!("txtfusion.layerwise_blocks.{i}"));
    }
    all.0.push((MARKER.to_owned(), vec![1, cfg.text_layers]));
    for i in 0..TEXT_FUSION_BLOCKS {
        text(&mut all, &format!("txtfusion.refiner_blocks.{i}"));
    }
    all.norm("txtmlp.0", d);
    all.linear("txtmlp.1", f, d);
    all.linear("txtmlp.3", f, f);
    for i in 0..cfg.layers {
        let p = format!("blocks.{i}");
        all.0.push((format!("{p}.mod.lin"), vec![6 * f]));
        all.block(&p, f, cfg.heads, cfg.kv_heads, cfg.mlp_dim);
    }
    all.0.push(("last.modulation.lin".to_owned(), vec![2, f]));
    all.norm("last.norm", f);
    all.linear("last.linear", PATCH * PATCH * cfg.channels, f);
    all.0
}

/// The names a block `p` reads, in the order [`expected`] lists them (after `mod.lin` for an image block).
pub(super) fn block_names(p: &str) -> Vec<String> {
    [
        "prenorm.scale",
        "postnorm.scale",
        "attn.wq.weight",
        "attn.wk.weight",
        "attn.wv.weight",
        "attn.gate.weight",
        "attn.wo.weight",
        "attn.qknorm.qnorm.scale",
        "attn.qknorm.knorm.scale",
        "mlp.gate.weight",
        "mlp.up.weight",
        "mlp.down.weight",
    ]
    .iter()
    .map(|n| format!("{p}.{n}"))
    .collect()
}

/// Weight names with their shapes, gathered module by module.
#[derive(Default)]
struct Shapes(Vec<(String, Vec<usize>)>);

impl Shapes {
    /// A Linear's weight `[out, inp]` and bias.
    fn linear(&mut self, name: &str, out: usize, inp: usize) {
        self.0.push((format!("{name}.weight"), vec![out, inp]));
        self.0.push((format!("{name}.bias"), vec![out]));
    }

    /// An RMSNorm's zero-centred scale.
    fn norm(&mut self, name: &str, width: usize) {
        self.0.push((format!("{name}.scale"), vec![width]));
    }

    /// A block's norms, bias-free gated attention (with per-head q/k norms) and bias-free SwiGLU, in
    /// [`block_names`]' order.
    fn block(&mut self, p: &str, width: usize, heads: usize, kv_heads: usize, mlp: usize) {
        let shapes = [
            vec![width],
            vec![width],
            vec![heads * HEAD_DIM, width],
            vec![kv_heads * HEAD_DIM, width],
            vec![kv_heads * HEAD_DIM, width],
            vec![width, width],
            vec![width, heads * HEAD_DIM],
            vec![HEAD_DIM],
            vec![HEAD_DIM],
            vec![mlp, width],
            vec![mlp, width],
            vec![width, mlp],
        ];
        self.0.extend(block_names(p).into_iter().zip(shapes));
    }
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_axes_are_comfyuis() {
        assert_eq!(rope_axes(128), [32, 48, 48]);
        assert_eq!(rope_axes(64), [16, 24, 24]);
        assert_eq!(rope_axes(128).iter().sum::<usize>(), 128);
    }
}
