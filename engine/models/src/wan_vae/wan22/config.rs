//! Detection of a Wan 2.2 VAE file (ComfyUI's layout, the original Wan 2.2 release's, or diffusers'
//! `AutoencoderKLWan` with `is_residual`), its [`Config`] from tensor shapes, and the [`LoadPlan`] that gives
//! every weight its ComfyUI name.
//!
//! ComfyUI builds the released widths (encoder 160, decoder 256, 48 latent channels) whatever the file; Kiln
//! reads both widths and the latent channels from the shapes, so a tiny VAE of the same architecture runs too.
//! The level multipliers `[1, 2, 4, 4]`, the residual blocks per level, the temporal resamples and the 2×2
//! patchify are the architecture's.

use kiln_compute::memory::LoadPlan;

use super::super::config::{
    DIM_MULT, Expected, Halves, Layout, List, RES_BLOCKS, TEMPORAL_DOWNSAMPLE, check_shapes,
    computable, dim, plan,
};
use crate::error::Result;
use crate::header::Header;

/// Side of the square patches folded into channels before the encoder (and unfolded after the decoder).
pub const PATCH: usize = 2;
/// Image channels.
pub const IMAGE_CHANNELS: usize = 3;
/// Latent channels of the released VAE (and of `LatentFormat::WAN22`).
pub const Z_CHANNELS: usize = 48;

/// The shape of a Wan 2.2 VAE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The encoder's base width (160 released; 0 when the file has no encoder).
    pub dim: usize,
    /// The decoder's base width (256 released; 0 when the file has no decoder).
    pub dec_dim: usize,
    /// Latent channels (48).
    pub z_channels: usize,
    /// Whether the file holds the encoder.
    pub has_encoder: bool,
    /// Whether the file holds the decoder.
    pub has_decoder: bool,
}

impl Config {
    /// The released VAE (`wan2.2_vae.safetensors`).
    pub fn released() -> Config {
        Config {
            dim: 160,
            dec_dim: 256,
            z_channels: Z_CHANNELS,
            has_encoder: true,
            has_decoder: true,
        }
    }

    /// Pixels per latent position along each side: 8 from the levels, 2 from the patchify.
    pub fn downscale(&self) -> usize {
        PATCH << (DIM_MULT.len() - 1)
    }

    /// The width of the encoder's level `i` input (`dim · [1, 1, 2, 4]`) and output (`dim · DIM_MULT[i]`).
    pub fn encoder_widths(&self, level: usize) -> (usize, usize) {
        let input = if level == 0 { 1 } else { DIM_MULT[level - 1] };
        (self.dim * input, self.dim * DIM_MULT[level])
    }

    /// The width of the decoder's level `i` (0 = lowest resolution) input and output: `dec_dim · [4, 4, 4, 2,
    /// 1]` pairwise.
    pub fn decoder_widths(&self, level: usize) -> (usize, usize) {
        let n = DIM_MULT.len();
        let mult = |k: usize| if k == 0 { DIM_MULT[n - 1] } else { DIM_MULT[n - k] };
        (self.dec_dim * mult(level), self.dec_dim * mult(level + 1))
    }

    /// Whether the encoder's level `i` halves time (the decoder's level `i` doubles it: the mirror).
    pub fn temporal_down(level: usize) -> bool {
        TEMPORAL_DOWNSAMPLE.get(level).copied().unwrap_or(false)
    }

    /// Whether the decoder's level `i` doubles time.
    pub fn temporal_up(level: usize) -> bool {
        let n = TEMPORAL_DOWNSAMPLE.len();
        level < n && TEMPORAL_DOWNSAMPLE[n - 1 - level]
    }
}

/// ComfyUI's name of the encoder's level `i`, entry `j` (residual blocks, then the resample at `RES_BLOCKS`).
pub(crate) fn encoder_entry(level: usize, j: usize) -> String {
    format!("encoder.downsamples.{level}.downsamples.{j}")
}

/// ComfyUI's name of the decoder's level `i`, entry `j` (residual blocks, then the resample at
/// `RES_BLOCKS + 1`).
pub(crate) fn decoder_entry(level: usize, j: usize) -> String {
    format!("decoder.upsamples.{level}.upsamples.{j}")
}

/// Every weight of `cfg`'s network, encoder first (ComfyUI name, diffusers name, shape).
pub(crate) fn expected(cfg: &Config) -> Vec<Expected> {
    let mut list = List(Vec::new());
    let (n, z, patched) = (DIM_MULT.len(), cfg.z_channels, IMAGE_CHANNELS * PATCH * PATCH);
    if cfg.has_encoder {
        list.conv("encoder.conv1", "encoder.conv_in", vec![cfg.dim, patched, 3, 3, 3]);
        for i in 0..n {
            let (mut cin, cout) = cfg.encoder_widths(i);
            for j in 0..RES_BLOCKS {
                let d = format!("encoder.down_blocks.{i}.resnets.{j}");
                list.residual(&encoder_entry(i, j), &d, cin, cout);
                cin = cout;
            }
            if i + 1 < n {
                let (c, d) =
                    (encoder_entry(i, RES_BLOCKS), format!("encoder.down_blocks.{i}.downsampler"));
                let (c, d) = (c.as_str(), d.as_str());
                list.conv(
                    &format!("{c}.resample.1"),
                    &format!("{d}.resample.1"),
                    vec![cout, cout, 3, 3],
                );
                if Config::temporal_down(i) {
                    let shape = vec![cout, cout, 3, 1, 1];
                    list.conv(&format!("{c}.time_conv"), &format!("{d}.time_conv"), shape);
                }
            }
        }
        let top = cfg.encoder_widths(n - 1).1;
        list.middle("encoder", top);
        list.head("encoder", top, 2 * z);
        list.conv("conv1", "quant_conv", vec![2 * z, 2 * z, 1, 1, 1]);
    }
    if cfg.has_decoder {
        list.conv("conv2", "post_quant_conv", vec![z, z, 1, 1, 1]);
        let top = cfg.decoder_widths(0).0;
        list.conv("decoder.conv1", "decoder.conv_in", vec![top, z, 3, 3, 3]);
        list.middle("decoder", top);
        for i in 0..n {
            let (mut cin, cout) = cfg.decoder_widths(i);
            for j in 0..=RES_BLOCKS {
                let d = format!("decoder.up_blocks.{i}.resnets.{j}");
                list.residual(&decoder_entry(i, j), &d, cin, cout);
                cin = cout;
            }
            if i + 1 < n {
                let (c, d) =
                    (decoder_entry(i, RES_BLOCKS + 1), format!("decoder.up_blocks.{i}.upsampler"));
                let (c, d) = (c.as_str(), d.as_str());
                list.conv(
                    &format!("{c}.resample.1"),
                    &format!("{d}.resample.1"),
                    vec![cout, cout, 3, 3],
                );
                if Config::temporal_up(i) {
                    let shape = vec![2 * cout, cout, 3, 1, 1];
                    list.conv(&format!("{c}.time_conv"), &format!("{d}.time_conv"), shape);
                }
            }
        }
        list.head("decoder", cfg.decoder_widths(n - 1).1, patched);
    }
    list.0
}

/// Whether `h` holds a Wan 2.2 VAE's residual down or up blocks, in either layout.
pub(crate) fn is_wan22(h: &Header) -> bool {
    [
        "decoder.upsamples.0.upsamples.0.residual.2.weight",
        "encoder.downsamples.0.downsamples.0.residual.2.weight",
    ]
    .iter()
    .any(|n| h.has(n))
        || layout_diffusers(h)
}

/// Whether `h` holds diffusers' names of a Wan 2.2 VAE's blocks: an RMS norm's `gamma` in a down block's
/// `resnets` (2.1's down blocks are a flat list; a KL autoencoder's norms have a `weight`), or a decoder block's
/// single `upsampler` (2.1's are `upsamplers.0`).
fn layout_diffusers(h: &Header) -> bool {
    h.has("encoder.down_blocks.0.resnets.0.norm1.gamma")
        || h.has("decoder.up_blocks.0.upsampler.resample.1.weight")
}

/// Recognises a Wan 2.2 VAE in either layout (ComfyUI's check, `decoder.upsamples.0.upsamples.0.residual.2.weight`,
/// or the encoder's first block for an encoder-only file; diffusers' `down_blocks.0.resnets.0.norm1.gamma` or
/// `up_blocks.0.upsampler`).
///
/// `Ok(None)`: not a Wan 2.2 VAE. [`crate::Error::Unsupported`] (naming the file and what was found): an
/// unsupported dtype, a latent of other than 48 channels, or any weight missing or of the wrong shape.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let comfy = [
        "decoder.upsamples.0.upsamples.0.residual.2.weight",
        "encoder.downsamples.0.downsamples.0.residual.2.weight",
    ];
    let layout = if comfy.iter().any(|n| h.has(n)) {
        Layout::Comfy
    } else if layout_diffusers(h) {
        Layout::Diffusers
    } else {
        return Ok(None);
    };
    computable(h)?;
    let Halves { encoder_in, has_decoder, z_channels } = Halves::of(h, layout)?;
    if z_channels != Z_CHANNELS {
        return Err(h.unsupported(format!(
            "a {z_channels}-channel latent: the Wan 2.2 VAE has {Z_CHANNELS}"
        )));
    }
    let cfg = Config {
        dim: match encoder_in {
            Some(encoder_in) => dim(h, encoder_in, 0, 5)?,
            None => 0,
        },
        dec_dim: if has_decoder { Halves::decoder_width(h, layout)? } else { 0 },
        z_channels,
        has_encoder: encoder_in.is_some(),
        has_decoder,
    };
    let what =
        format!("a Wan 2.2 VAE of widths {} (encoder) and {} (decoder)", cfg.dim, cfg.dec_dim);
    check_shapes(h, &expected(&cfg), layout, &what)?;
    Ok(Some((cfg, layout)))
}

/// The weights of `cfg` from `h`'s file, each under its ComfyUI name (no prefix).
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    plan(h, expected(cfg), layout)
}

#[cfg(test)]
mod tests {
    use super::{Config, expected};

    #[test]
    fn the_released_widths_give_196_tensors_and_704_7m_parameters() {
        let all = expected(&Config::released());
        assert_eq!(all.len(), 196);
        let params: usize = all.iter().map(|e| e.shape.iter().product::<usize>()).sum();
        assert_eq!(params, 704_688_668);
        assert_eq!(Config::released().decoder_widths(0), (1024, 1024));
        assert_eq!(Config::released().decoder_widths(2), (1024, 512));
        assert_eq!(Config::released().decoder_widths(3), (512, 256));
        assert_eq!(Config::released().encoder_widths(1), (160, 320));
    }
}
