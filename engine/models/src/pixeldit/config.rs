//! Detection of a PixelDiT text-to-image DiT and its [`Config`], every width read from tensor shapes, and the
//! [`LoadPlan`].
//!
//! ComfyUI recognises the file by [`MARKER`] alone (after PiD, whose `lq_proj` branch it checks first) and builds
//! `PixDiT_T2I` with its class defaults (hidden 1536 in 24 heads, 14 patch blocks, 2 pixel blocks, patch 16, pixel
//! width 16, pixel attention 1152 wide in 16 heads, text 2304 wide, at most 300 text tokens), reading nothing from
//! the file. Kiln reads every width from shapes: the hidden width and patch from `s_embedder`, the head widths
//! from the q norms (heads = width / head width), the blocks by counting, the MLP widths from their first
//! layers, the pixel width from `pixel_embedder`, the pixel attention's from `compress_to_attn`, the text's from
//! `y_embedder` and its longest length from `y_pos_embedding`. That gives ComfyUI's values for the released file
//! and lets a shrunken file of the same structure (the test fixtures) load. The text RoPE is always on (the class
//! default; nothing in the file says otherwise).
//!
//! Two layouts load ([`Layout`]): the released file's (every key under `core.`, each pixel block's modulation one
//! `adaLN_modulation.0` Linear) and the one ComfyUI's `process_unet_state_dict` turns it into (no prefix, the
//! modulation split per pixel into `adaLN_modulation_msa` and `adaLN_modulation_mlp`), which ComfyUI's own
//! detection does not recognise but its model holds.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks a PixelDiT DiT (ComfyUI's detection key).
pub const MARKER: &str = "core.pixel_embedder.proj.weight";
/// The marker of a file in ComfyUI's processed layout ([`Layout::Comfy`]), beside [`COMFY_SPLIT_MARKER`].
const COMFY_MARKER: &str = "pixel_embedder.proj.weight";
/// The split pixel-block modulation only the processed layout has.
const COMFY_SPLIT_MARKER: &str = "pixel_blocks.0.adaLN_modulation_msa.weight";
/// PiD's LQ branch (ComfyUI checks it before PixelDiT): a file with it is PiD, not this model.
const PID_MARKERS: [&str; 2] =
    ["lq_proj.latent_proj.0.weight", "core.lq_proj.latent_proj.0.weight"];
/// The RGB channels in and out.
pub const CHANNELS: usize = 3;
/// ε of every RMSNorm.
pub const EPS: f32 = 1e-6;
/// RoPE's base period, of the image grid's 2-D RoPE and of the text's 1-D one.
pub const ROPE_THETA: f64 = 10000.0;
/// The span of the 2-D RoPE's positions: a side of n patches sits at `linspace(0, 16, n)`.
pub const ROPE_SPAN: f64 = 16.0;
/// Width of the timestep sinusoid (`TimestepEmbedder`'s `frequency_embedding_size`).
pub const TIME_FREQS: usize = 256;
/// The timestep sinusoid's longest period (`TimestepEmbedder(max_period=10)`).
pub const TIME_MAX_PERIOD: f64 = 10.0;
/// What the errors call the network.
const WHAT: &str = "a PixelDiT DiT";

/// Which key layout a file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The released file's: every key under `core.`, a pixel block's modulation one Linear
    /// (`adaLN_modulation.0`) whose rows are, per pixel of the patch, the six chunks (shift, scale, gate of the
    /// attention, then of the MLP).
    Released,
    /// ComfyUI's model after `process_unet_state_dict`: no prefix, the modulation split into
    /// `adaLN_modulation_msa` (each pixel's first three chunks) and `adaLN_modulation_mlp` (its last three).
    Comfy,
}

/// A PixelDiT DiT's hyperparameters (the released model's in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file's key layout.
    pub layout: Layout,
    /// Width of the patch tokens (`hidden_size`: 1536).
    pub hidden: usize,
    /// Attention heads of the patch blocks (`num_groups`: 24).
    pub heads: usize,
    /// Width of a patch-block head (64).
    pub head_dim: usize,
    /// Width of the patch blocks' SwiGLU hidden layer (4096).
    pub ffn_dim: usize,
    /// Patch blocks (`patch_depth`: 14).
    pub patch_depth: usize,
    /// Pixel blocks (`pixel_depth`: 2).
    pub pixel_depth: usize,
    /// Side of a patch in pixels (`patch_size`: 16).
    pub patch: usize,
    /// Width of a pixel token (`pixel_hidden_size`: 16).
    pub pixel_dim: usize,
    /// Width of the pixel blocks' MLP hidden layer (64).
    pub pixel_mlp: usize,
    /// Width of the pixel blocks' attention tokens, one a patch (`pixel_attn_hidden_size`: 1152).
    pub attn_dim: usize,
    /// Heads of the pixel blocks' attention (`pixel_num_groups`: 16).
    pub attn_heads: usize,
    /// Width of a pixel-attention head (72).
    pub attn_head_dim: usize,
    /// Width of a text token (`txt_embed_dim`: 2304, Gemma 2 2B's hidden state).
    pub text_dim: usize,
    /// Most text tokens read; later ones are dropped (`txt_max_length`: 300).
    pub text_max: usize,
}

impl Config {
    /// The file's name of weight `name` (ComfyUI's processed name): under `core.` in the released layout.
    pub fn key(&self, name: &str) -> String {
        key(self.layout, name)
    }
}

/// `name` in `layout`.
fn key(layout: Layout, name: &str) -> String {
    match layout {
        Layout::Released => format!("core.{name}"),
        Layout::Comfy => name.to_owned(),
    }
}

/// Whether `h` holds a PixelDiT DiT, and its config. `Ok(None)`: not one (ComfyUI's test: [`MARKER`], and not
/// PiD; or the processed layout's pixel embedder beside a split pixel-block modulation). `Err(Unsupported)`:
/// tensors missing or misshapen, no blocks, or widths that do not split into heads and RoPE pairs.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if PID_MARKERS.iter().any(|m| h.has(m)) {
        return Ok(None);
    }
    let layout = if h.has(MARKER) {
        Layout::Released
    } else if h.has(COMFY_MARKER) && h.has(COMFY_SPLIT_MARKER) {
        Layout::Comfy
    } else {
        return Ok(None);
    };
    let name = |n: &str| key(layout, n);
    let dims = |n: &str, rank: usize| h.shape_of_rank(&name(n), rank, WHAT);
    let pixel_embedder = dims("pixel_embedder.proj.weight", 2)?;
    let (pixel_dim, channels) = (pixel_embedder[0], pixel_embedder[1]);
    if channels != CHANNELS {
        return Err(h.unsupported(format!(
            "{WHAT} of {channels} channels: ComfyUI builds PixelDiT on RGB pixels (3)"
        )));
    }
    let s_embedder = dims("s_embedder.proj.weight", 2)?;
    let hidden = s_embedder[0];
    let patch = ((s_embedder[1] / CHANNELS) as f64).sqrt().round() as usize;
    if patch == 0 || CHANNELS * patch * patch != s_embedder[1] {
        return Err(h.unsupported(format!(
            "{WHAT} whose patch embedding reads {} features, not 3 · p² for a whole patch side p",
            s_embedder[1]
        )));
    }
    let patch_depth =
        h.gapless_blocks(&name("patch_blocks."), &format!("{WHAT} whose patch blocks"))?;
    let pixel_depth =
        h.gapless_blocks(&name("pixel_blocks."), &format!("{WHAT} whose pixel blocks"))?;
    if patch_depth == 0 || pixel_depth == 0 {
        return Err(h.unsupported(format!(
            "{WHAT} with {patch_depth} patch blocks and {pixel_depth} pixel blocks (it needs both)"
        )));
    }
    let head_dim = dims("patch_blocks.0.attn.q_norm_x.weight", 1)?[0];
    let attn_dim = dims("pixel_blocks.0.compress_to_attn.weight", 2)?[0];
    let attn_head_dim = dims("pixel_blocks.0.attn.q_norm.weight", 1)?[0];
    // The 2-D RoPE gives each axis a quarter of a head's features in pairs; the pixel embedder's sin/cos table a
    // quarter of the pixel width to each of sin and cos of each axis.
    let whole = |width: usize, part: usize| {
        part > 0 && part.is_multiple_of(4) && width.is_multiple_of(part)
    };
    if !whole(hidden, head_dim) || !whole(attn_dim, attn_head_dim) || !whole(pixel_dim, 4) {
        return Err(h.unsupported(format!(
            "{WHAT} {hidden} wide in {head_dim}-wide heads, its pixel attention {attn_dim} wide in \
             {attn_head_dim}-wide heads, pixels {pixel_dim} wide: heads must divide the widths, and head and pixel \
             widths be multiples of 4 (the 2-D RoPE and sin/cos tables)"
        )));
    }
    let text = dims("y_embedder.proj.weight", 2)?;
    let config = Config {
        layout,
        hidden,
        heads: hidden / head_dim,
        head_dim,
        ffn_dim: dims("patch_blocks.0.mlp_x.w1.weight", 2)?[0],
        patch_depth,
        pixel_depth,
        patch,
        pixel_dim,
        pixel_mlp: dims("pixel_blocks.0.mlp.fc1.weight", 2)?[0],
        attn_dim,
        attn_heads: attn_dim / attn_head_dim,
        attn_head_dim,
        text_dim: text[1],
        text_max: dims("y_pos_embedding", 3)?[1],
    };
    if config.text_max == 0 {
        return Err(h.unsupported(format!("{WHAT} whose y_pos_embedding holds no text positions")));
    }
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the PixelDiT DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape (under the file's names, [`Config::key`]), in the order the model reads them.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.hidden;
    let mut all = Vec::new();
    let linear = |all: &mut Vec<_>, name: &str, out: usize, inp: usize| {
        all.push((cfg.key(&format!("{name}.weight")), vec![out, inp]));
        all.push((cfg.key(&format!("{name}.bias")), vec![out]));
    };
    linear(&mut all, "t_embedder.mlp.0", d, TIME_FREQS);
    linear(&mut all, "t_embedder.mlp.2", d, d);
    linear(&mut all, "y_embedder.proj", d, cfg.text_dim);
    all.push((cfg.key("y_embedder.norm.weight"), vec![d]));
    all.push((cfg.key("y_pos_embedding"), vec![1, cfg.text_max, d]));
    linear(&mut all, "s_embedder.proj", d, CHANNELS * cfg.patch * cfg.patch);
    for i in 0..cfg.patch_depth {
        all.extend(patch_block_names(cfg, i).into_iter().zip(patch_block_shapes(cfg)));
    }
    linear(&mut all, "pixel_embedder.proj", cfg.pixel_dim, CHANNELS);
    for i in 0..cfg.pixel_depth {
        all.extend(pixel_block_names(cfg, i).into_iter().zip(pixel_block_shapes(cfg)));
    }
    all.push((cfg.key("final_layer.norm.weight"), vec![cfg.pixel_dim]));
    linear(&mut all, "final_layer.linear", CHANNELS, cfg.pixel_dim);
    all
}

/// A patch block's weights of one stream, `{s}` the stream (`x` image, `y` text) and `{m}` its modulation's
/// (`img`, `txt`), in the order of [`patch_slot`]'s constants.
const STREAM: [&str; STREAM_WEIGHTS] = [
    "norm_{s}1.weight",
    "attn.qkv_{s}.weight",
    "attn.q_norm_{s}.weight",
    "attn.k_norm_{s}.weight",
    "attn.proj_{s}.weight",
    "attn.proj_{s}.bias",
    "norm_{s}2.weight",
    "mlp_{s}.w1.weight",
    "mlp_{s}.w2.weight",
    "mlp_{s}.w3.weight",
    "adaLN_modulation_{m}.0.weight",
    "adaLN_modulation_{m}.0.bias",
];

/// How many weights a patch block reads of each stream.
pub(super) const STREAM_WEIGHTS: usize = 12;

/// Where a weight sits among a stream's in a patch block's fetch: the image stream's first, then the text's at
/// [`STREAM_WEIGHTS`] on.
pub(super) mod patch_slot {
    pub(crate) const NORM1: usize = 0;
    pub(crate) const QKV: usize = 1;
    pub(crate) const Q_NORM: usize = 2;
    pub(crate) const K_NORM: usize = 3;
    pub(crate) const PROJ: usize = 4;
    pub(crate) const PROJ_BIAS: usize = 5;
    pub(crate) const NORM2: usize = 6;
    pub(crate) const W1: usize = 7;
    pub(crate) const W2: usize = 8;
    pub(crate) const W3: usize = 9;
    pub(crate) const ADA: usize = 10;
    pub(crate) const ADA_BIAS: usize = 11;
}

/// The names patch block `i` reads: the image stream's [`STREAM`] weights, then the text stream's.
pub(super) fn patch_block_names(cfg: &Config, i: usize) -> Vec<String> {
    [("x", "img"), ("y", "txt")]
        .iter()
        .flat_map(|&(s, m)| {
            STREAM.iter().map(move |n| {
                cfg.key(&format!("patch_blocks.{i}.{}", n.replace("{s}", s).replace("{m}", m)))
            })
        })
        .collect()
}

/// The shapes of [`patch_block_names`].
fn patch_block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, f, hd) = (cfg.hidden, cfg.ffn_dim, cfg.head_dim);
    let stream = [
        vec![d],
        vec![3 * d, d],
        vec![hd],
        vec![hd],
        vec![d, d],
        vec![d],
        vec![d],
        vec![f, d],
        vec![d, f],
        vec![f, d],
        vec![6 * d, d],
        vec![6 * d],
    ];
    stream.iter().chain(&stream).cloned().collect()
}

/// A pixel block's weights before its modulation, in the order of [`pixel_slot`]'s constants.
const PIXEL: [&str; 15] = [
    "norm1.weight",
    "compress_to_attn.weight",
    "compress_to_attn.bias",
    "attn.qkv.weight",
    "attn.q_norm.weight",
    "attn.k_norm.weight",
    "attn.proj.weight",
    "attn.proj.bias",
    "expand_from_attn.weight",
    "expand_from_attn.bias",
    "norm2.weight",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
];

/// Where a weight sits in a pixel block's fetch; the modulation last: the released layout's one Linear
/// (`ADA`, `ADA + 1`: weight, bias), or the processed layout's attention half then MLP half (`ADA` to `ADA + 3`).
pub(super) mod pixel_slot {
    pub(crate) const NORM1: usize = 0;
    pub(crate) const COMPRESS: usize = 1;
    pub(crate) const COMPRESS_BIAS: usize = 2;
    pub(crate) const QKV: usize = 3;
    pub(crate) const Q_NORM: usize = 4;
    pub(crate) const K_NORM: usize = 5;
    pub(crate) const PROJ: usize = 6;
    pub(crate) const PROJ_BIAS: usize = 7;
    pub(crate) const EXPAND: usize = 8;
    pub(crate) const EXPAND_BIAS: usize = 9;
    pub(crate) const NORM2: usize = 10;
    pub(crate) const FC1: usize = 11;
    pub(crate) const FC1_BIAS: usize = 12;
    pub(crate) const FC2: usize = 13;
    pub(crate) const FC2_BIAS: usize = 14;
    pub(crate) const ADA: usize = 15;
}

/// The names pixel block `i` reads: [`PIXEL`], then its modulation as the layout stores it.
pub(super) fn pixel_block_names(cfg: &Config, i: usize) -> Vec<String> {
    let modulation: &[&str] = match cfg.layout {
        Layout::Released => &["adaLN_modulation.0.weight", "adaLN_modulation.0.bias"],
        Layout::Comfy => &[
            "adaLN_modulation_msa.weight",
            "adaLN_modulation_msa.bias",
            "adaLN_modulation_mlp.weight",
            "adaLN_modulation_mlp.bias",
        ],
    };
    PIXEL.iter().chain(modulation).map(|n| cfg.key(&format!("pixel_blocks.{i}.{n}"))).collect()
}

/// The shapes of [`pixel_block_names`].
fn pixel_block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, pd, a, ad, m) =
        (cfg.hidden, cfg.pixel_dim, cfg.attn_dim, cfg.attn_head_dim, cfg.pixel_mlp);
    let per_patch = cfg.patch * cfg.patch * pd;
    let mut all = vec![
        vec![pd],
        vec![a, per_patch],
        vec![a],
        vec![3 * a, a],
        vec![ad],
        vec![ad],
        vec![a, a],
        vec![a],
        vec![per_patch, a],
        vec![per_patch],
        vec![pd],
        vec![m, pd],
        vec![m],
        vec![pd, m],
        vec![pd],
    ];
    match cfg.layout {
        Layout::Released => all.extend([vec![6 * per_patch, d], vec![6 * per_patch]]),
        Layout::Comfy => all.extend([
            vec![3 * per_patch, d],
            vec![3 * per_patch],
            vec![3 * per_patch, d],
            vec![3 * per_patch],
        ]),
    }
    all
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released() -> Config {
        Config {
            layout: Layout::Released,
            hidden: 1536,
            heads: 24,
            head_dim: 64,
            ffn_dim: 4096,
            patch_depth: 14,
            pixel_depth: 2,
            patch: 16,
            pixel_dim: 16,
            pixel_mlp: 64,
            attn_dim: 1152,
            attn_heads: 16,
            attn_head_dim: 72,
            text_dim: 2304,
            text_max: 300,
        }
    }

    #[test]
    fn blocks_name_their_weights_in_slot_order() {
        let cfg = released();
        let names = patch_block_names(&cfg, 3);
        assert_eq!(names.len(), 2 * STREAM_WEIGHTS);
        assert_eq!(names[patch_slot::QKV], "core.patch_blocks.3.attn.qkv_x.weight");
        assert_eq!(
            names[STREAM_WEIGHTS + patch_slot::ADA],
            "core.patch_blocks.3.adaLN_modulation_txt.0.weight"
        );
        let names = pixel_block_names(&cfg, 1);
        assert_eq!(names[pixel_slot::ADA], "core.pixel_blocks.1.adaLN_modulation.0.weight");
        assert_eq!(names[pixel_slot::FC2_BIAS], "core.pixel_blocks.1.mlp.fc2.bias");
        let comfy = Config { layout: Layout::Comfy, ..cfg };
        let names = pixel_block_names(&comfy, 0);
        assert_eq!(names[pixel_slot::ADA + 2], "pixel_blocks.0.adaLN_modulation_mlp.weight");
    }
}
