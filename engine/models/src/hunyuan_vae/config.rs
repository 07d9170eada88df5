//! Detection of a HunyuanVideo 1.5 VAE file (ComfyUI's names, `decoder.conv_in.conv.weight` with 32 input
//! channels), its [`Config`], and the [`LoadPlan`] that reads every weight under its ComfyUI name.
//!
//! As ComfyUI does, the file's latent width decides the claim and everything else is the architecture's (the
//! level widths read from the file, `[128, 256, 512, 1024, 1024]` released), two residual blocks a level in the encoder (three in the
//! decoder), a spatial resample after each of the first four levels, temporal too in the encoder's levels 2
//! and 3 and the decoder's levels 0 and 1. One list, [`expected`], names every weight with its shape; detection
//! checks the file against it, the load plan is made from it, and synth writes it.

use kiln_compute::memory::LoadPlan;

use super::blocks::{Norm, RmsNorm};
use crate::error::Result;
use crate::header::Header;
use crate::wan_vae::computable;

/// Levels of each side (widths in [`Config::widths`]).
pub const LEVELS: usize = 5;
/// Levels followed by a 2× spatial resample (the first four; the last keeps its size).
pub const RESAMPLES: usize = 4;
/// Residual blocks per encoder level (the decoder has one more).
pub const RES_BLOCKS: usize = 2;
/// Image channels the encoder reads and the decoder writes.
pub const IMAGE_CHANNELS: usize = 3;
/// Latent channels of the released VAE (what detection claims).
pub const Z_CHANNELS: usize = 32;
/// The released level widths (ComfyUI's `block_out_channels`).
pub const RELEASED_WIDTHS: [usize; LEVELS] = [128, 256, 512, 1024, 1024];

/// The shape of a HunyuanVideo 1.5 VAE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The width of each encoder level, lowest level first (the decoder's in reverse): ComfyUI's
    /// `block_out_channels`, [`RELEASED_WIDTHS`] released.
    pub widths: [usize; LEVELS],
    /// Latent channels (32).
    pub z_channels: usize,
    /// Whether the file holds the encoder.
    pub has_encoder: bool,
    /// Whether the file holds the decoder.
    pub has_decoder: bool,
}

impl Config {
    /// The released VAE (`hunyuanvideo15_vae_fp16.safetensors`).
    pub fn released() -> Config {
        Config {
            widths: RELEASED_WIDTHS,
            z_channels: Z_CHANNELS,
            has_encoder: true,
            has_decoder: true,
        }
    }

    /// Pixels per latent position along each side (16).
    pub fn downscale(&self) -> usize {
        1 << RESAMPLES
    }

    /// Whether the encoder's level `i` resample halves time as well as space (levels 2 and 3).
    pub fn temporal_down(level: usize) -> bool {
        (2..RESAMPLES).contains(&level)
    }

    /// Whether the decoder's level `i` (0 = lowest resolution) resample doubles time as well as space (levels 0
    /// and 1, the mirror of the encoder's).
    pub fn temporal_up(level: usize) -> bool {
        level < 2
    }

    /// The width of the decoder's level `i` (0 = lowest resolution): the encoder's widths in reverse.
    pub fn decoder_width(&self, level: usize) -> usize {
        self.widths[LEVELS - 1 - level]
    }
}

/// ComfyUI's name of the encoder's level `i`, residual block `j`.
pub(crate) fn encoder_block(level: usize, j: usize) -> String {
    format!("encoder.down.{level}.block.{j}")
}

/// ComfyUI's name of the decoder's level `i`, residual block `j`.
pub(crate) fn decoder_block(level: usize, j: usize) -> String {
    format!("decoder.up.{level}.block.{j}")
}

/// Builds a HunyuanVideo VAE's list of expected weights, (ComfyUI name, shape), its norms `N`'s (this VAE's
/// [`RmsNorm`], the 1.0 VAE's GroupNorm).
pub(crate) struct WeightList<N> {
    norm: N,
    weights: Vec<(String, Vec<usize>)>,
}

impl<N: Norm> WeightList<N> {
    /// An empty list whose norms are `norm`'s.
    pub(crate) fn new(norm: N) -> WeightList<N> {
        WeightList { norm, weights: Vec::new() }
    }

    /// The weights listed, in order.
    pub(crate) fn into_weights(self) -> Vec<(String, Vec<usize>)> {
        self.weights
    }

    /// A convolution `name` with weight `shape` and a bias of `shape[0]`.
    fn conv(&mut self, name: &str, shape: Vec<usize>) {
        let out = shape[0];
        self.weights.push((format!("{name}.weight"), shape));
        self.weights.push((format!("{name}.bias"), vec![out]));
    }

    /// A causal 3³ convolution `name` (`CarriedConv3d`, its weights under `.conv`) of `cin → cout`.
    pub(crate) fn causal(&mut self, name: &str, cin: usize, cout: usize) {
        self.conv(&format!("{name}.conv"), vec![cout, cin, 3, 3, 3]);
    }

    /// A 1³ convolution `name` of `cin → cout`.
    pub(crate) fn pointwise(&mut self, name: &str, cin: usize, cout: usize) {
        self.conv(name, vec![cout, cin, 1, 1, 1]);
    }

    /// A norm `name` of `c` channels.
    pub(crate) fn norm(&mut self, name: &str, c: usize) {
        let weights = self.norm.weights(name, c);
        self.weights.extend(weights);
    }

    /// A residual block `cin → cout`: norm, causal conv, norm, causal conv, and a 1³ shortcut (a
    /// `CarriedConv3d` too: under `nin_shortcut.conv`) when the width changes.
    pub(crate) fn residual(&mut self, prefix: &str, cin: usize, cout: usize) {
        self.norm(&format!("{prefix}.norm1"), cin);
        self.causal(&format!("{prefix}.conv1"), cin, cout);
        self.norm(&format!("{prefix}.norm2"), cout);
        self.causal(&format!("{prefix}.conv2"), cout, cout);
        if cin != cout {
            self.pointwise(&format!("{prefix}.nin_shortcut.conv"), cin, cout);
        }
    }

    /// The middle of `side`: residual block, attention (its q, k, v and out projections plain 1³ `Conv3d`s),
    /// residual block, all `c` wide.
    pub(crate) fn middle(&mut self, side: &str, c: usize) {
        self.residual(&format!("{side}.mid.block_1"), c, c);
        self.norm(&format!("{side}.mid.attn_1.norm"), c);
        for p in ["q", "k", "v", "proj_out"] {
            self.pointwise(&format!("{side}.mid.attn_1.{p}"), c, c);
        }
        self.residual(&format!("{side}.mid.block_2"), c, c);
    }
}

/// The width of a temporal (×8) or spatial (×4) resample's convolution: what space and time fold into or
/// unfold from its channels.
pub(crate) fn resample_factor(temporal: bool) -> usize {
    if temporal { 8 } else { 4 }
}

/// Every weight of `cfg`'s network, encoder first: its ComfyUI name (the slot name) and its shape.
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut list = WeightList::new(RmsNorm);
    let (w, z) = (cfg.widths, cfg.z_channels);
    if cfg.has_encoder {
        list.causal("encoder.conv_in", IMAGE_CHANNELS, w[0]);
        let mut ch = w[0];
        for i in 0..LEVELS {
            for j in 0..RES_BLOCKS {
                list.residual(&encoder_block(i, j), ch, w[i]);
                ch = w[i];
            }
            if i < RESAMPLES {
                let out = w[i + 1] / resample_factor(Config::temporal_down(i));
                list.causal(&format!("encoder.down.{i}.downsample.conv"), ch, out);
                ch = w[i + 1];
            }
        }
        list.middle("encoder", ch);
        list.norm("encoder.norm_out", ch);
        list.causal("encoder.conv_out", ch, 2 * z);
    }
    if cfg.has_decoder {
        let mut ch = cfg.decoder_width(0);
        list.causal("decoder.conv_in", z, ch);
        list.middle("decoder", ch);
        for i in 0..LEVELS {
            let width = cfg.decoder_width(i);
            for j in 0..=RES_BLOCKS {
                list.residual(&decoder_block(i, j), ch, width);
                ch = width;
            }
            if i < RESAMPLES {
                let next = cfg.decoder_width(i + 1);
                let out = next * resample_factor(Config::temporal_up(i));
                list.causal(&format!("decoder.up.{i}.upsample.conv"), ch, out);
                ch = next;
            }
        }
        list.norm("decoder.norm_out", ch);
        list.causal("decoder.conv_out", ch, IMAGE_CHANNELS);
    }
    list.into_weights()
}

/// The decoder's first convolution, whose input width ComfyUI reads the latent width from.
const DECODER_IN: &str = "decoder.conv_in.conv.weight";
/// The encoder's first convolution, present when the file holds the encoder.
const ENCODER_IN: &str = "encoder.conv_in.conv.weight";

/// Recognises a HunyuanVideo 1.5 VAE as ComfyUI does: `decoder.conv_in.conv.weight` of rank 5 with 32 input
/// channels.
///
/// `Ok(None)`: no such tensor (other VAEs with a `decoder.conv_in.conv` have 16-channel latents, and a file
/// without the decoder is not claimed, as in ComfyUI). The level widths are read from the decoder's residual blocks.
/// [`crate::Error::Unsupported`] (naming the file and what was found): an unsupported dtype, widths Kiln cannot
/// run, or any weight of the network of those widths missing or of another shape.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    match h.shape(DECODER_IN) {
        Some(&[_, Z_CHANNELS, _, _, _]) => {}
        _ => return Ok(None),
    }
    computable(h)?;
    let cfg = Config { widths: widths(h)?, has_encoder: h.has(ENCODER_IN), ..Config::released() };
    for (name, shape) in expected(&cfg) {
        h.expect_shape(&name, &shape, "the HunyuanVideo 1.5 VAE")?;
    }
    Ok(Some(cfg))
}

/// Each level's width, read from the decoder's first residual block of the level (its second convolution's
/// rows), as the file has them (the released [`RELEASED_WIDTHS`], or a synthetic file's narrower ones); an
/// [`crate::Error::Unsupported`] for a missing block or widths the resamples cannot fold (each level as wide as
/// the one below or twice as wide, the last a multiple of twice the latent's).
fn widths(h: &Header) -> Result<[usize; LEVELS]> {
    let mut widths = [0; LEVELS];
    for i in 0..LEVELS {
        let name = format!("{}.conv2.conv.weight", decoder_block(i, 0));
        match h.shape(&name) {
            Some(&[rows, ..]) if rows > 0 => widths[LEVELS - 1 - i] = rows,
            _ => {
                return Err(h.unsupported(format!(
                    "`{}` is missing: not the HunyuanVideo 1.5 VAE's decoder",
                    h.key(&name)
                )));
            }
        }
    }
    let folds = widths.windows(2).all(|w| w[1] == w[0] || w[1] == 2 * w[0]);
    if !folds || !widths[LEVELS - 1].is_multiple_of(2 * Z_CHANNELS) || widths[0] % 2 != 0 {
        return Err(h.unsupported(format!(
            "level widths {widths:?}: Kiln runs HunyuanVideo 1.5 VAEs whose levels keep or double the width \
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
        // Encoder: conv_in, 10 blocks × 6, 4 resamples, middle 2 × 6 + 9, norm, conv_out.
        assert_eq!(count("encoder."), 2 + 60 + 8 + 21 + 1 + 2);
        // Decoder: conv_in, middle, 15 blocks × 6, 4 resamples, norm, conv_out.
        assert_eq!(count("decoder."), 2 + 21 + 90 + 8 + 1 + 2);
        let shape = |name: &str| all.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
        assert_eq!(
            shape("encoder.down.2.downsample.conv.conv.weight"),
            Some(vec![128, 512, 3, 3, 3])
        );
        assert_eq!(
            shape("encoder.down.0.downsample.conv.conv.weight"),
            Some(vec![64, 128, 3, 3, 3])
        );
        assert_eq!(
            shape("decoder.up.0.upsample.conv.conv.weight"),
            Some(vec![8192, 1024, 3, 3, 3])
        );
        assert_eq!(shape("decoder.up.3.upsample.conv.conv.weight"), Some(vec![512, 256, 3, 3, 3]));
        assert_eq!(shape("encoder.conv_out.conv.weight"), Some(vec![64, 1024, 3, 3, 3]));
        assert_eq!(shape("decoder.conv_in.conv.weight"), Some(vec![1024, 32, 3, 3, 3]));
        assert_eq!(shape("decoder.mid.attn_1.q.weight"), Some(vec![1024, 1024, 1, 1, 1]));
        // The released widths never change inside a level: no shortcut convolutions.
        assert!(all.iter().all(|(name, _)| !name.contains("nin_shortcut")));
    }
}
