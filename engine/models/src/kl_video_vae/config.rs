//! Detection of a HunyuanVideo 1.0 VAE file (ComfyUI's names: `decoder.conv_in.conv.weight`, 5-D, with a latent
//! other than the 1.5 VAE's 32 channels), its [`Config`], and the [`LoadPlan`] that reads every weight under its
//! ComfyUI name.
//!
//! As ComfyUI does (`comfy/sd.py`), the file decides only the latent width; the rest is the architecture's: four
//! levels (the widths read from the file here, `[128, 256, 512, 512]` released, each a multiple of GroupNorm's 32
//! groups), two residual blocks a level in the encoder (three in the decoder), a downsample after each of the
//! encoder's first three levels (in time too after levels 1 and 2) and an upsample before each of the decoder's
//! last three (in time too at its levels 2 and 1), 1×1×1 `quant_conv` and `post_quant_conv` around the latent.
//! One list, [`expected`], names every weight with its shape; detection checks the file against it, the load plan is
//! made from it, and synth writes it.

use kiln_compute::memory::LoadPlan;

use super::blocks::GroupNorm;
use super::family;
use crate::error::Result;
use crate::header::Header;
use crate::hunyuan_vae::config::WeightList;
pub(crate) use crate::hunyuan_vae::config::{decoder_block, encoder_block};
use crate::wan_vae::computable;

/// Levels of each side (widths in [`Config::widths`]).
pub const LEVELS: usize = 4;
/// Residual blocks per encoder level (the decoder has one more).
pub const RES_BLOCKS: usize = 2;
/// Image channels the encoder reads and the decoder writes.
pub const IMAGE_CHANNELS: usize = 3;
/// GroupNorm groups of every norm (ComfyUI's `Normalize`: fixed, so every width is a multiple of it).
pub const GROUPS: usize = 32;
/// Latent channels of the released VAE.
pub const Z_CHANNELS: usize = 16;
/// The released level widths (ComfyUI's `ch · ch_mult`: 128 · `[1, 2, 4, 4]`).
pub const RELEASED_WIDTHS: [usize; LEVELS] = [128, 256, 512, 512];

/// The shape of a HunyuanVideo 1.0 VAE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The width of each level, full resolution first (the encoder's `down.i` and the decoder's `up.i`):
    /// [`RELEASED_WIDTHS`] released.
    pub widths: [usize; LEVELS],
    /// Latent channels (16): the decoder's input, half the encoder's output (its mean and log-variance), and
    /// both sides of the square 1×1×1 `quant_conv` and `post_quant_conv`.
    pub z_channels: usize,
    /// Whether the file holds the encoder (and `quant_conv`); the decoder is always there.
    pub has_encoder: bool,
}

impl Config {
    /// The released VAE (`hunyuan_video_vae_bf16.safetensors`).
    pub fn released() -> Config {
        Config { widths: RELEASED_WIDTHS, z_channels: Z_CHANNELS, has_encoder: true }
    }

    /// Pixels per latent position along each side (8).
    pub fn downscale(&self) -> usize {
        1 << (LEVELS - 1)
    }

    /// Whether the encoder's downsample after level `i` halves time as well as space (levels 1 and 2: ComfyUI's
    /// stride 2 where `levels − 1 − i ≤ log2 4`; level 0's is `(1, 2, 2)`).
    pub fn temporal_down(level: usize) -> bool {
        (1..LEVELS - 1).contains(&level)
    }

    /// Whether the decoder's upsample of level `i` (`decoder.up.i.upsample`, i ≥ 1; level 0 is full resolution)
    /// doubles time as well as space (levels 2 and 1, the mirror of the encoder's; level 3's is `(1, 2, 2)`).
    pub fn temporal_up(level: usize) -> bool {
        (1..LEVELS - 1).contains(&level)
    }
}

/// Every weight of `cfg`'s network, in the order of ComfyUI's state dict (encoder, decoder, `quant_conv`,
/// `post_quant_conv`): its ComfyUI name (the slot name) and its shape.
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut list = WeightList::new(GroupNorm);
    let (w, z) = (cfg.widths, cfg.z_channels);
    let top = w[LEVELS - 1];
    if cfg.has_encoder {
        list.causal("encoder.conv_in", IMAGE_CHANNELS, w[0]);
        let mut ch = w[0];
        for (i, &width) in w.iter().enumerate() {
            for j in 0..RES_BLOCKS {
                list.residual(&encoder_block(i, j), ch, width);
                ch = width;
            }
            if i + 1 < LEVELS {
                list.causal(&format!("encoder.down.{i}.downsample.conv"), ch, ch);
            }
        }
        list.middle("encoder", top);
        list.norm("encoder.norm_out", top);
        list.causal("encoder.conv_out", top, 2 * z);
    }
    list.causal("decoder.conv_in", z, top);
    list.middle("decoder", top);
    let mut ch = top;
    for i in (0..LEVELS).rev() {
        for j in 0..=RES_BLOCKS {
            list.residual(&decoder_block(i, j), ch, w[i]);
            ch = w[i];
        }
        if i > 0 {
            list.causal(&format!("decoder.up.{i}.upsample.conv"), ch, ch);
        }
    }
    list.norm("decoder.norm_out", ch);
    list.causal("decoder.conv_out", ch, IMAGE_CHANNELS);
    if cfg.has_encoder {
        list.pointwise("quant_conv", 2 * z, 2 * z);
    }
    list.pointwise("post_quant_conv", z, z);
    list.into_weights()
}

/// The decoder's first convolution, whose input width ComfyUI reads the latent width from.
const DECODER_IN: &str = "decoder.conv_in.conv.weight";
/// The encoder's first convolution, present when the file holds the encoder.
const ENCODER_IN: &str = "encoder.conv_in.conv.weight";
/// The HunyuanVideo 1.5 VAE's latent width, which ComfyUI gives that VAE ([`crate::hunyuan_vae`]).
const HUNYUAN15_Z: usize = 32;
/// Tensors of the files ComfyUI's `VAE` gives to another network before it reaches this one (`comfy/sd.py`'s
/// checks in order: SeedVR2's, the Mochi VAE's four, LTX-Video's, CogVideoX's); any one of them and the file is not
/// claimed, whatever `decoder.conv_in.conv.weight` it holds.
const CLAIMED_BEFORE: [&str; 7] = [
    "decoder.up_blocks.2.upsamplers.0.upscale_conv.weight",
    "blocks.2.blocks.3.stack.5.weight",
    "decoder.blocks.2.blocks.3.stack.5.weight",
    "layers.4.layers.1.attn_block.attn.qkv.weight",
    "encoder.layers.4.layers.1.attn_block.attn.qkv.weight",
    "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight",
    "decoder.mid_block.resnets.0.norm1.norm_layer.weight",
];
/// The HunyuanVideo 1.5 VAE's upsample at its full-resolution level, which this VAE never has (its `decoder.up.0`
/// is full resolution without one): a 1.5 file of any latent width (a synthetic one's) is not claimed either.
const HUNYUAN15_MARKER: &str = "decoder.up.0.upsample.conv.conv.weight";
/// A tensor of diffusers' layout of this VAE (`AutoencoderKLHunyuanVideo`), which Kiln does not read.
const DIFFUSERS_MARKER: &str = "decoder.up_blocks.0.resnets.0.norm1.weight";

/// Recognises a HunyuanVideo 1.0 VAE as ComfyUI does: `decoder.conv_in.conv.weight` of rank 5 whose input width
/// (the latent's) is not the 1.5 VAE's 32, in a file none of ComfyUI's earlier checks takes.
///
/// `Ok(None)`: no such tensor (the Wan VAEs' and the 2-D KL autoencoders' files), the 1.5 VAE's file (by its
/// latent width, or at any width by its `decoder.up.0.upsample`), or a file of another network that has one and
/// that ComfyUI gives to that network first (CogVideoX's, LTX-Video's, SeedVR2's, the Mochi VAE's). The level
/// widths are read from the decoder's residual blocks. [`crate::Error::Unsupported`] (naming the file and what was
/// found): diffusers' layout, an unsupported dtype, widths GroupNorm's 32 groups do not divide, or any weight of
/// the network of those widths missing or of another shape.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if CLAIMED_BEFORE.iter().any(|name| h.has(name)) || h.has(HUNYUAN15_MARKER) {
        return Ok(None);
    }
    let z = match h.shape(DECODER_IN) {
        Some(&[_, z, _, _, _]) if z != HUNYUAN15_Z => z,
        _ => return Ok(None),
    };
    if h.has(DIFFUSERS_MARKER) {
        return Err(h.unsupported(format!(
            "`{}`: {} in diffusers' layout (AutoencoderKLHunyuanVideo); Kiln reads ComfyUI's file \
             (`hunyuan_video_vae_bf16.safetensors`)",
            h.key(DIFFUSERS_MARKER),
            family::NAME
        )));
    }
    computable(h)?;
    if z == 0 {
        return Err(h.unsupported(format!("`{}` reads a latent of no channels", h.key(DECODER_IN))));
    }
    let cfg = Config { widths: widths(h)?, z_channels: z, has_encoder: h.has(ENCODER_IN) };
    for (name, shape) in expected(&cfg) {
        h.expect_shape(&name, &shape, family::NAME)?;
    }
    Ok(Some(cfg))
}

/// Each level's width, read from the decoder's first residual block of the level (its second convolution's rows),
/// as the file has them (the released [`RELEASED_WIDTHS`], or a synthetic file's narrower ones); an
/// [`crate::Error::Unsupported`] for a missing block or a width that GroupNorm's 32 groups do not divide.
fn widths(h: &Header) -> Result<[usize; LEVELS]> {
    let mut widths = [0; LEVELS];
    for (i, width) in widths.iter_mut().enumerate() {
        let name = format!("{}.conv2.conv.weight", decoder_block(i, 0));
        match h.shape(&name) {
            Some(&[rows, ..]) if rows > 0 => *width = rows,
            _ => {
                return Err(h.unsupported(format!(
                    "`{}` is missing: not {}'s decoder",
                    h.key(&name),
                    family::NAME
                )));
            }
        }
    }
    if widths.iter().any(|w| !w.is_multiple_of(GROUPS)) {
        return Err(h.unsupported(format!(
            "level widths {widths:?}: every width must be a multiple of GroupNorm's {GROUPS} groups \
             (released: {RELEASED_WIDTHS:?})"
        )));
    }
    Ok(widths)
}

/// The weights of `cfg` from `h`'s file, each under its ComfyUI name (no prefix).
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}

#[cfg(test)]
mod tests {
    use super::{Config, expected};

    #[test]
    fn the_released_widths_give_the_released_tensors() {
        let all = expected(&Config::released());
        let count = |side: &str| all.iter().filter(|(name, _)| name.starts_with(side)).count();
        // Encoder: conv_in, 8 blocks × 8 (+ 2 shortcuts × 2), 3 downsamples, middle 2 × 8 + 10, norm, conv_out.
        assert_eq!(count("encoder."), 2 + 64 + 4 + 6 + 26 + 2 + 2);
        // Decoder: conv_in, middle, 12 blocks × 8 (+ 2 shortcuts × 2), 3 upsamples, norm, conv_out.
        assert_eq!(count("decoder."), 2 + 26 + 96 + 4 + 6 + 2 + 2);
        assert_eq!(all.len(), count("encoder.") + count("decoder.") + 4);
        let shape = |name: &str| all.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
        assert_eq!(shape("decoder.conv_in.conv.weight"), Some(vec![512, 16, 3, 3, 3]));
        assert_eq!(shape("encoder.conv_out.conv.weight"), Some(vec![32, 512, 3, 3, 3]));
        assert_eq!(shape("quant_conv.weight"), Some(vec![32, 32, 1, 1, 1]));
        assert_eq!(shape("post_quant_conv.weight"), Some(vec![16, 16, 1, 1, 1]));
        assert_eq!(
            shape("encoder.down.1.block.0.nin_shortcut.conv.weight"),
            Some(vec![256, 128, 1, 1, 1])
        );
        assert_eq!(
            shape("decoder.up.1.block.0.nin_shortcut.conv.weight"),
            Some(vec![256, 512, 1, 1, 1])
        );
        assert_eq!(
            shape("encoder.down.2.downsample.conv.conv.weight"),
            Some(vec![512, 512, 3, 3, 3])
        );
        assert_eq!(shape("decoder.up.3.upsample.conv.conv.weight"), Some(vec![512, 512, 3, 3, 3]));
        assert_eq!(shape("decoder.mid.attn_1.q.weight"), Some(vec![512, 512, 1, 1, 1]));
        assert_eq!(shape("decoder.norm_out.weight"), Some(vec![128]));
        assert!(shape("decoder.up.0.upsample.conv.conv.weight").is_none());
        assert!(shape("encoder.down.3.downsample.conv.conv.weight").is_none());
    }

    #[test]
    fn time_is_resampled_at_the_middle_levels() {
        assert_eq!([0, 1, 2].map(Config::temporal_down), [false, true, true]);
        assert_eq!([1, 2, 3].map(Config::temporal_up), [true, true, false]);
        assert_eq!(Config::released().downscale(), 8);
    }
}
