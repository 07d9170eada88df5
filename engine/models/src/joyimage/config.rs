//! Detection of a JoyAI Image Edit DiT (ComfyUI's key names) and its [`Config`], every width read from tensor
//! shapes, and the [`LoadPlan`].
//!
//! ComfyUI recognises the file by [`MARKERS`] and a 5-D `img_in.weight`, and reads the input channels, width,
//! patch and layer count from shapes, the heads from the q-norm's width; it fixes the text width at 4096 and
//! the RoPE axes at (16, 56, 56) (`supported_models.JoyImage`). Kiln reads the text width from the text
//! embedder's weight and splits any head as [`rope_axes`] says, which gives ComfyUI's values for the released
//! file and lets a shrunken file of the same structure (the test fixture) load.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weights whose presence (with a 5-D [`IMG_IN`]) marks a JoyAI Image Edit DiT (ComfyUI's detection keys).
pub const MARKERS: [&str; 3] = [
    "double_blocks.0.attn.img_attn_qkv.weight",
    "double_blocks.0.attn.img_attn_q_norm.weight",
    "condition_embedder.time_embedder.linear_1.weight",
];
/// The patch embedding, a Conv3d whose kernel is the patch.
pub const IMG_IN: &str = "img_in.weight";
/// The text embedder's first Linear, whose columns are the text width.
const TEXT_IN: &str = "condition_embedder.text_embedder.linear_1.weight";
/// Width of the timestep's sinusoid (ComfyUI's `time_freq_dim`, fixed at 256).
pub const TIME_DIM: usize = 256;
/// ε of every LayerNorm and RMSNorm.
pub const EPS: f32 = 1e-6;
/// RoPE's base period (`supported_models.JoyImage`'s `theta`, 10000; the class default, 256, is not used).
pub const ROPE_THETA: f32 = 10000.0;
/// The frame axis's share of a head's RoPE width (ComfyUI's `rope_dim_list[0]`).
pub const ROPE_FRAME_DIM: usize = 16;
/// What the errors call the network.
const WHAT: &str = "a JoyAI Image Edit DiT";

/// A JoyAI Image Edit DiT's hyperparameters (the released model's in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Hidden width of both streams (`hidden_size`: 4096).
    pub hidden: usize,
    /// Latent channels in and out (16: the Wan 2.1 VAE's).
    pub channels: usize,
    /// Double-stream blocks (40).
    pub layers: usize,
    /// Attention heads (32).
    pub heads: usize,
    /// Width of a head (128).
    pub head_dim: usize,
    /// Width of the MLPs' hidden layer (`hidden · mlp_width_ratio`: 16384).
    pub mlp_dim: usize,
    /// Width of a text token (4096: Qwen3-VL 8B's hidden state).
    pub text_dim: usize,
    /// The patch (frames, rows, columns): [1, 2, 2].
    pub patch: [usize; 3],
    /// RoPE widths of the (frame, row, column) axes: (16, 56, 56).
    pub axes: [usize; 3],
}

impl Config {
    /// The features of one patch, `channels · pt · ph · pw` (img_in's inputs, proj_out's outputs).
    pub fn patch_features(&self) -> usize {
        self.channels * self.patch.iter().product::<usize>()
    }
}

/// The RoPE axes of a head `head_dim` wide: [`ROPE_FRAME_DIM`] for the frames, the rest halved between rows and
/// columns — ComfyUI's (16, 56, 56) at 128; `None` when a share would be empty or odd.
pub fn rope_axes(head_dim: usize) -> Option<[usize; 3]> {
    let rest = head_dim.checked_sub(ROPE_FRAME_DIM)?;
    (rest > 0 && rest.is_multiple_of(4)).then_some([ROPE_FRAME_DIM, rest / 2, rest / 2])
}

/// Whether `h` holds a JoyAI Image Edit DiT, and its config. `Ok(None)`: not one (ComfyUI's test: the
/// [`MARKERS`] and a 5-D [`IMG_IN`]). `Err(Unsupported)`: tensors missing or misshapen, or widths that do not
/// split into heads.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !MARKERS.iter().all(|m| h.has(m)) || h.shape(IMG_IN).is_none_or(|s| s.len() != 5) {
        return Ok(None);
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, WHAT);
    let img_in = dims(IMG_IN, 5)?;
    let (hidden, channels) = (img_in[0], img_in[1]);
    let patch = [img_in[2], img_in[3], img_in[4]];
    let head_dim = dims(MARKERS[1], 1)?[0];
    if head_dim == 0 || !hidden.is_multiple_of(head_dim) || hidden == 0 || channels == 0 {
        return Err(h.unsupported(format!(
            "{WHAT} {hidden} wide with {channels} channels and {head_dim}-wide q norms (not whole heads)"
        )));
    }
    let Some(axes) = rope_axes(head_dim) else {
        return Err(h.unsupported(format!(
            "{WHAT} with {head_dim}-wide heads: its RoPE splits a head as {ROPE_FRAME_DIM} + two even halves"
        )));
    };
    if patch.contains(&0) {
        return Err(h.unsupported(format!("{WHAT} with an empty patch {patch:?}")));
    }
    let config = Config {
        hidden,
        channels,
        layers: h.gapless_blocks("double_blocks.", &format!("{WHAT} whose blocks"))?,
        heads: hidden / head_dim,
        head_dim,
        mlp_dim: dims("double_blocks.0.img_mlp.net.0.proj.weight", 2)?[0],
        text_dim: dims(TEXT_IN, 2)?[1],
        patch,
        axes,
    };
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the JoyAI Image Edit DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.hidden;
    let mut all = vec![
        (IMG_IN.to_owned(), vec![d, cfg.channels, cfg.patch[0], cfg.patch[1], cfg.patch[2]]),
        ("img_in.bias".to_owned(), vec![d]),
    ];
    let linear = |all: &mut Vec<_>, name: &str, out: usize, inp: usize| {
        all.push((format!("{name}.weight"), vec![out, inp]));
        all.push((format!("{name}.bias"), vec![out]));
    };
    linear(&mut all, "condition_embedder.time_embedder.linear_1", d, TIME_DIM);
    linear(&mut all, "condition_embedder.time_embedder.linear_2", d, d);
    linear(&mut all, "condition_embedder.time_proj", 6 * d, d);
    linear(&mut all, TEXT_IN.trim_end_matches(".weight"), d, cfg.text_dim);
    linear(&mut all, "condition_embedder.text_embedder.linear_2", d, d);
    for i in 0..cfg.layers {
        all.extend(block_names(&format!("double_blocks.{i}")).into_iter().zip(block_shapes(cfg)));
    }
    linear(&mut all, "proj_out", cfg.patch_features(), d);
    all
}

/// The weights of one stream (`img` or `txt`) of a block, in [`block_names`]' order.
const STREAM: [&str; STREAM_WEIGHTS] = [
    "{s}_mod.modulate_table",
    "{s}_mlp.net.0.proj.weight",
    "{s}_mlp.net.0.proj.bias",
    "{s}_mlp.net.2.weight",
    "{s}_mlp.net.2.bias",
    "attn.{s}_attn_qkv.weight",
    "attn.{s}_attn_qkv.bias",
    "attn.{s}_attn_q_norm.weight",
    "attn.{s}_attn_k_norm.weight",
    "attn.{s}_attn_proj.weight",
    "attn.{s}_attn_proj.bias",
];

/// How many weights one stream of a block reads.
pub(super) const STREAM_WEIGHTS: usize = 11;

/// The names block `p` reads: the image stream's [`STREAM_WEIGHTS`], then the text stream's.
pub(super) fn block_names(p: &str) -> Vec<String> {
    ["img", "txt"]
        .iter()
        .flat_map(|s| STREAM.iter().map(move |n| format!("{p}.{}", n.replace("{s}", s))))
        .collect()
}

/// The shapes of [`block_names`].
fn block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, m, hd) = (cfg.hidden, cfg.mlp_dim, cfg.head_dim);
    let stream = [
        vec![1, 6, d],
        vec![m, d],
        vec![m],
        vec![d, m],
        vec![d],
        vec![3 * d, d],
        vec![3 * d],
        vec![hd],
        vec![hd],
        vec![d, d],
        vec![d],
    ];
    stream.iter().chain(stream.iter()).cloned().collect()
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
        assert_eq!(rope_axes(128), Some([16, 56, 56]));
        assert_eq!(rope_axes(64), Some([16, 24, 24]));
        assert_eq!(rope_axes(16), None);
        assert_eq!(rope_axes(18), None);
    }

    #[test]
    fn blocks_read_both_streams() {
        let names = block_names("double_blocks.3");
        assert_eq!(names.len(), 2 * STREAM_WEIGHTS);
        assert_eq!(names[0], "double_blocks.3.img_mod.modulate_table");
        assert_eq!(names[STREAM_WEIGHTS + 5], "double_blocks.3.attn.txt_attn_qkv.weight");
    }
}
