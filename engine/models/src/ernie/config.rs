//! Detection of an ERNIE-Image DiT (ComfyUI's key names) and its [`Config`], every width read from tensor
//! shapes, and the [`LoadPlan`].
//!
//! ComfyUI recognises the file by [`MARKER`] alone and builds `ErnieImageModel` with its class defaults (hidden
//! 4096, 32 heads, 36 layers, MLP 12288, 128 channels in and out, patch 1, text 3072, RoPE axes (32, 48, 48)),
//! reading nothing from the file. Kiln reads every width from shapes: the hidden width and channels from the
//! patch embedding, the head width from the q norm (heads = hidden / head width), the layers by counting, the
//! MLP width from `gate_proj`, the text width from `text_proj` (absent: the text is already `hidden` wide, as the
//! class builds no projection then), and splits a head into RoPE axes as [`rope_axes`] says. That gives ComfyUI's
//! values for the released file and lets a shrunken file of the same structure (the test fixtures) load.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks an ERNIE-Image DiT (ComfyUI's detection key).
pub const MARKER: &str = "layers.0.mlp.linear_fc2.weight";
/// The patch embedding, a Conv2d whose kernel is the patch (1 × 1: ComfyUI builds no other).
const X_EMBEDDER: &str = "x_embedder.proj.weight";
/// The text projection, a bias-free Linear; absent when the text is as wide as the hidden state.
const TEXT_PROJ: &str = "text_proj.weight";
/// The q norm of the first layer, whose length is the head width.
const NORM_Q: &str = "layers.0.self_attention.norm_q.weight";
/// ε of every RMSNorm and of the last LayerNorm.
pub const EPS: f32 = 1e-6;
/// RoPE's base period (ComfyUI's `rope_theta`, 256).
pub const ROPE_THETA: f64 = 256.0;
/// What the errors call the network.
const WHAT: &str = "an ERNIE-Image DiT";

/// An ERNIE-Image DiT's hyperparameters (the released model's in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Hidden width (`hidden_size`: 4096).
    pub hidden: usize,
    /// Latent channels in and out (128: the FLUX.2 VAE's).
    pub channels: usize,
    /// Layers (36).
    pub layers: usize,
    /// Attention heads (32).
    pub heads: usize,
    /// Width of a head (128).
    pub head_dim: usize,
    /// Width of the MLP's hidden layer (`ffn_hidden_size`: 12288).
    pub ffn_dim: usize,
    /// Width of a text token (`text_in_dim`: 3072, Ministral 3 3B's hidden state).
    pub text_dim: usize,
    /// Whether the text goes through `text_proj` (true: the file has it; ComfyUI builds it whenever the text
    /// width differs from the hidden one).
    pub text_proj: bool,
    /// RoPE widths of the (text index, row, column) axes: (32, 48, 48).
    pub axes: [usize; 3],
}

/// The RoPE axes of a head `head_dim` wide: `(hd/4, 3·hd/8, 3·hd/8)`, ComfyUI's (32, 48, 48) at the released
/// 128 (its class fixes them there; the same proportions for another width, which ComfyUI's detection never
/// builds); `None` unless every axis is even and non-empty (`hd` a multiple of 16).
pub fn rope_axes(head_dim: usize) -> Option<[usize; 3]> {
    (head_dim > 0 && head_dim.is_multiple_of(16)).then_some([
        head_dim / 4,
        3 * head_dim / 8,
        3 * head_dim / 8,
    ])
}

/// Whether `h` holds an ERNIE-Image DiT, and its config. `Ok(None)`: not one (ComfyUI's test: [`MARKER`]).
/// `Err(Unsupported)`: tensors missing or misshapen, a patch other than 1 × 1, or widths that do not split into
/// heads and RoPE axes.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, WHAT);
    let x_embedder = dims(X_EMBEDDER, 4)?;
    let (hidden, channels) = (x_embedder[0], x_embedder[1]);
    if x_embedder[2..] != [1, 1] {
        return Err(h.unsupported(format!(
            "{WHAT} whose patch embedding is {}×{}: ComfyUI builds ERNIE-Image with 1×1 patches only",
            x_embedder[2], x_embedder[3]
        )));
    }
    let head_dim = dims(NORM_Q, 1)?[0];
    if hidden == 0 || channels == 0 || head_dim == 0 || !hidden.is_multiple_of(head_dim) {
        return Err(h.unsupported(format!(
            "{WHAT} {hidden} wide with {channels} channels and {head_dim}-wide q norms (not whole heads)"
        )));
    }
    let Some(axes) = rope_axes(head_dim) else {
        return Err(h.unsupported(format!(
            "{WHAT} with {head_dim}-wide heads: its RoPE splits a head as (hd/4, 3·hd/8, 3·hd/8), so the width \
             must be a multiple of 16"
        )));
    };
    let text_proj = h.has(TEXT_PROJ);
    let config = Config {
        hidden,
        channels,
        layers: h.gapless_blocks("layers.", &format!("{WHAT} whose layers"))?,
        heads: hidden / head_dim,
        head_dim,
        ffn_dim: dims("layers.0.mlp.gate_proj.weight", 2)?[0],
        text_dim: if text_proj { dims(TEXT_PROJ, 2)?[1] } else { hidden },
        text_proj,
        axes,
    };
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the ERNIE-Image DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.hidden;
    let mut all = vec![
        (X_EMBEDDER.to_owned(), vec![d, cfg.channels, 1, 1]),
        ("x_embedder.proj.bias".to_owned(), vec![d]),
    ];
    if cfg.text_proj {
        all.push((TEXT_PROJ.to_owned(), vec![d, cfg.text_dim]));
    }
    let linear = |all: &mut Vec<_>, name: &str, out: usize, inp: usize| {
        all.push((format!("{name}.weight"), vec![out, inp]));
        all.push((format!("{name}.bias"), vec![out]));
    };
    linear(&mut all, "time_embedding.linear_1", d, d);
    linear(&mut all, "time_embedding.linear_2", d, d);
    linear(&mut all, "adaLN_modulation.1", 6 * d, d);
    for i in 0..cfg.layers {
        all.extend(layer_names(i).into_iter().zip(layer_shapes(cfg)));
    }
    linear(&mut all, "final_norm.linear", 2 * d, d);
    linear(&mut all, "final_linear", cfg.channels, d);
    all
}

/// The weights of a layer, in [`layer_names`]' order (after `layers.{i}.`).
const LAYER: [&str; LAYER_WEIGHTS] = [
    "adaLN_sa_ln.weight",
    "self_attention.to_q.weight",
    "self_attention.to_k.weight",
    "self_attention.to_v.weight",
    "self_attention.norm_q.weight",
    "self_attention.norm_k.weight",
    "self_attention.to_out.0.weight",
    "adaLN_mlp_ln.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.linear_fc2.weight",
];

/// How many weights a layer reads.
const LAYER_WEIGHTS: usize = 11;

/// The names layer `i` reads, in [`LAYER`]'s order.
pub(super) fn layer_names(i: usize) -> Vec<String> {
    LAYER.iter().map(|n| format!("layers.{i}.{n}")).collect()
}

/// The shapes of [`layer_names`].
fn layer_shapes(cfg: &Config) -> [Vec<usize>; LAYER_WEIGHTS] {
    let (d, f, hd) = (cfg.hidden, cfg.ffn_dim, cfg.head_dim);
    [
        vec![d],
        vec![d, d],
        vec![d, d],
        vec![d, d],
        vec![hd],
        vec![hd],
        vec![d, d],
        vec![d],
        vec![f, d],
        vec![f, d],
        vec![d, f],
    ]
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_axes_are_comfyuis_at_128() {
        assert_eq!(rope_axes(128), Some([32, 48, 48]));
        assert_eq!(rope_axes(64), Some([16, 24, 24]));
        assert_eq!(rope_axes(48), Some([12, 18, 18]));
        assert_eq!(rope_axes(40), None);
        assert_eq!(rope_axes(0), None);
    }

    #[test]
    fn layers_read_their_eleven_weights() {
        let names = layer_names(3);
        assert_eq!(names.len(), LAYER_WEIGHTS);
        assert_eq!(names[4], "layers.3.self_attention.norm_q.weight");
        assert_eq!(names[LAYER_WEIGHTS - 1], format!("layers.3.{}", &MARKER["layers.0.".len()..]));
    }
}
