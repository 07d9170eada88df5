//! Detection of a KL autoencoder file (ComfyUI's LDM layout or diffusers'), its [`Config`] derived from tensor
//! shapes, and the [`LoadPlan`] that gives every weight its LDM name.
//!
//! One list, [`expected`], names every weight the network reads (LDM name, diffusers name, shape) for a config;
//! detection checks the file against it and the load plan is made from it, so the two cannot drift apart.
//!
//! The FLUX.2 VAE is this autoencoder with z 32, both quant convs and the latent BatchNorm's running statistics
//! (`bn.running_mean`, `bn.running_var`, 4·z each): their presence is what sets [`Config::latent_bn`], as in
//! ComfyUI's `VAE` (`batch_norm_latent`). Its released file names the quant convs as BFL does
//! (`encoder.quant_conv.*`, `decoder.post_quant_conv.*`); ComfyUI renames those to `quant_conv.*` /
//! `post_quant_conv.*`, and both spellings are read here. Each side's widths come from its own tensors, so a
//! decoder narrower than the encoder (`full_encoder_small_decoder.safetensors`) loads.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// GroupNorm groups of every norm (ComfyUI's and diffusers' VAEs both use 32).
const GROUPS: usize = 32;

/// The key layout of a VAE file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's (the original LDM/BFL names: `decoder.up.3.block.0.conv1.weight`), as in `ae.safetensors`.
    Ldm,
    /// diffusers' `AutoencoderKL` (`decoder.up_blocks.0.resnets.0.conv1.weight`).
    Diffusers,
}

/// The shape of a KL autoencoder, every width derived from its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Width of the encoder's first level (its `conv_in` output; 128 for Flux); in a file without an encoder,
    /// the decoder's.
    pub ch: usize,
    /// Width of the decoder's first level (its `conv_out` input): `ch` but in a file whose decoder is narrower
    /// (FLUX.2's small-decoder file); in a file without a decoder, the encoder's.
    pub decoder_ch: usize,
    /// Width of each level as a multiple of `ch` (`[1, 2, 4, 4]` for Flux); its length is the number of
    /// levels, so the spatial ratio is 2^(levels − 1).
    pub ch_mult: Vec<usize>,
    /// Resnet blocks per encoder level (the decoder has one more per level).
    pub num_res_blocks: usize,
    /// Latent channels (16 for Flux).
    pub z_channels: usize,
    /// Image channels the encoder takes (3).
    pub in_channels: usize,
    /// Image channels the decoder gives (3).
    pub out_channels: usize,
    /// GroupNorm groups (32).
    pub groups: usize,
    /// Whether the file holds the encoder.
    pub has_encoder: bool,
    /// Whether the file holds the decoder.
    pub has_decoder: bool,
    /// Whether a 1×1 `quant_conv` follows the encoder (SD VAEs; not Flux).
    pub quant_conv: bool,
    /// Whether a 1×1 `post_quant_conv` precedes the decoder (SD VAEs; not Flux).
    pub post_quant_conv: bool,
    /// The FLUX.2 latent: the encoder's mean 2×2-patchified to 4·z channels (channel `c·4 + py·2 + px` at
    /// (r, s) is z[c, 2r + py, 2s + px]) and normalised by the BatchNorm statistics `bn.running_mean` and
    /// `bn.running_var` (no affine, ε 1e-4); decoding undoes both first.
    pub latent_bn: bool,
}

impl Config {
    /// The width of the encoder's level `i` (`ch · ch_mult[i]`).
    pub fn width(&self, level: usize) -> usize {
        self.ch * self.ch_mult[level]
    }

    /// The width of the decoder's level `i` (`decoder_ch · ch_mult[i]`).
    pub fn decoder_width(&self, level: usize) -> usize {
        self.decoder_ch * self.ch_mult[level]
    }

    /// The number of levels.
    pub fn levels(&self) -> usize {
        self.ch_mult.len()
    }

    /// Pixels per latent position along each side: 8 for Flux, 16 for FLUX.2 (the patchify halves the
    /// latent again).
    pub fn downscale(&self) -> usize {
        (1 << (self.levels() - 1)) * if self.latent_bn { PATCH } else { 1 }
    }

    /// Channels of the latent the VAE encodes to and decodes from: z, or 4·z for FLUX.2's patchified latent.
    pub fn latent_channels(&self) -> usize {
        self.z_channels * if self.latent_bn { PATCH * PATCH } else { 1 }
    }
}

/// The side of the FLUX.2 latent's patches.
pub(crate) const PATCH: usize = 2;
/// The latent BatchNorm's running mean, `[4·z]`.
pub(crate) const BN_MEAN: &str = "bn.running_mean";
/// The latent BatchNorm's running variance, `[4·z]`.
pub(crate) const BN_VAR: &str = "bn.running_var";
/// The BatchNorm's step counter (an int64 torch saves beside the statistics); never read.
const BN_STEPS: &str = "bn.num_batches_tracked";

/// One weight the network reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// Its name in ComfyUI's layout (the slot name).
    pub(crate) ldm: String,
    /// Its name in diffusers' layout.
    pub(crate) diffusers: String,
    /// Its shape (the 1×1 conv form for the mid-attention projections).
    pub(crate) shape: Vec<usize>,
    /// A mid-attention projection: stored `[C, C, 1, 1]` (LDM) or `[C, C]` (diffusers' Linear, and some LDM
    /// conversions); either is accepted in either layout.
    pub(crate) projection: bool,
    /// Another name the file may give it (BFL's `encoder.quant_conv.*` and `decoder.post_quant_conv.*`, as
    /// the FLUX.2 VAE is released), read when the first is absent.
    pub(crate) alias: Option<String>,
}

impl Expected {
    /// Its name in `layout`.
    pub(crate) fn name(&self, layout: Layout) -> &str {
        match layout {
            Layout::Ldm => &self.ldm,
            Layout::Diffusers => &self.diffusers,
        }
    }

    /// Its name in `h`'s file of `layout`: [`Expected::name`], or the alias when only that is present.
    fn name_in<'a>(&'a self, h: &Header, layout: Layout) -> &'a str {
        let name = self.name(layout);
        match &self.alias {
            Some(alias) if !h.has(name) && h.has(alias) => alias,
            _ => name,
        }
    }

    /// Whether a tensor of shape `found` can be this weight.
    fn fits(&self, found: &[usize]) -> bool {
        found == self.shape.as_slice() || (self.projection && found == &self.shape[..2])
    }
}

/// Builds the [`Expected`] list.
struct List(Vec<Expected>);

impl List {
    fn push(&mut self, ldm: String, diffusers: String, shape: Vec<usize>, projection: bool) {
        self.0.push(Expected { ldm, diffusers, shape, projection, alias: None });
    }

    /// A 1×1 quant conv `name` (the same in both layouts) `out ← cin`, also read as BFL's `{side}.{name}`.
    fn quant(&mut self, name: &str, side: &str, out: usize, cin: usize) {
        self.conv(name, name, out, cin, 1);
        let n = self.0.len();
        for (e, suffix) in self.0[n - 2..].iter_mut().zip(["weight", "bias"]) {
            e.alias = Some(format!("{side}.{name}.{suffix}"));
        }
    }

    /// A 1-D statistic `name` of `c` values, the same in both layouts.
    fn stat(&mut self, name: &str, c: usize) {
        self.push(name.into(), name.into(), vec![c], false);
    }

    /// A conv's weight `[out, cin, k, k]` and bias.
    fn conv(&mut self, ldm: &str, diffusers: &str, out: usize, cin: usize, k: usize) {
        self.push(
            format!("{ldm}.weight"),
            format!("{diffusers}.weight"),
            vec![out, cin, k, k],
            false,
        );
        self.push(format!("{ldm}.bias"), format!("{diffusers}.bias"), vec![out], false);
    }

    /// A GroupNorm's weight and bias.
    fn norm(&mut self, ldm: &str, diffusers: &str, c: usize) {
        self.push(format!("{ldm}.weight"), format!("{diffusers}.weight"), vec![c], false);
        self.push(format!("{ldm}.bias"), format!("{diffusers}.bias"), vec![c], false);
    }

    /// A ResnetBlock `cin → cout`: norm1, conv1, norm2, conv2, then the 1×1 shortcut when the width changes.
    fn resnet(&mut self, ldm: &str, diffusers: &str, cin: usize, cout: usize) {
        self.norm(&format!("{ldm}.norm1"), &format!("{diffusers}.norm1"), cin);
        self.conv(&format!("{ldm}.conv1"), &format!("{diffusers}.conv1"), cout, cin, 3);
        self.norm(&format!("{ldm}.norm2"), &format!("{diffusers}.norm2"), cout);
        self.conv(&format!("{ldm}.conv2"), &format!("{diffusers}.conv2"), cout, cout, 3);
        if cin != cout {
            let (l, d) = (format!("{ldm}.nin_shortcut"), format!("{diffusers}.conv_shortcut"));
            self.conv(&l, &d, cout, cin, 1);
        }
    }

    /// The mid block: resnet, attention, resnet, all `c` wide.
    fn mid(&mut self, side: &str, c: usize) {
        self.resnet(&format!("{side}.mid.block_1"), &format!("{side}.mid_block.resnets.0"), c, c);
        let (l, d) = (format!("{side}.mid.attn_1"), format!("{side}.mid_block.attentions.0"));
        self.norm(&format!("{l}.norm"), &format!("{d}.group_norm"), c);
        for (lp, dp) in [("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("proj_out", "to_out.0")] {
            self.push(
                format!("{l}.{lp}.weight"),
                format!("{d}.{dp}.weight"),
                vec![c, c, 1, 1],
                true,
            );
            self.push(format!("{l}.{lp}.bias"), format!("{d}.{dp}.bias"), vec![c], false);
        }
        self.resnet(&format!("{side}.mid.block_2"), &format!("{side}.mid_block.resnets.1"), c, c);
    }
}

/// Every weight of `cfg`'s network, encoder first.
pub(crate) fn expected(cfg: &Config) -> Vec<Expected> {
    let mut list = List(Vec::new());
    let n = cfg.levels();
    let z = cfg.z_channels;
    if cfg.has_encoder {
        list.conv("encoder.conv_in", "encoder.conv_in", cfg.ch, cfg.in_channels, 3);
        let mut cin = cfg.ch;
        for i in 0..n {
            let cout = cfg.width(i);
            for j in 0..cfg.num_res_blocks {
                let (l, d) = (
                    format!("encoder.down.{i}.block.{j}"),
                    format!("encoder.down_blocks.{i}.resnets.{j}"),
                );
                list.resnet(&l, &d, cin, cout);
                cin = cout;
            }
            if i + 1 < n {
                let (l, d) = (
                    format!("encoder.down.{i}.downsample.conv"),
                    format!("encoder.down_blocks.{i}.downsamplers.0.conv"),
                );
                list.conv(&l, &d, cin, cin, 3);
            }
        }
        list.mid("encoder", cin);
        list.norm("encoder.norm_out", "encoder.conv_norm_out", cin);
        list.conv("encoder.conv_out", "encoder.conv_out", 2 * z, cin, 3);
        if cfg.quant_conv {
            list.quant("quant_conv", "encoder", 2 * z, 2 * z);
        }
    }
    if cfg.has_decoder {
        if cfg.post_quant_conv {
            list.quant("post_quant_conv", "decoder", z, z);
        }
        let mut cin = cfg.decoder_width(n - 1);
        list.conv("decoder.conv_in", "decoder.conv_in", cin, z, 3);
        list.mid("decoder", cin);
        for i in (0..n).rev() {
            let cout = cfg.decoder_width(i);
            let k = n - 1 - i;
            for j in 0..=cfg.num_res_blocks {
                let (l, d) = (
                    format!("decoder.up.{i}.block.{j}"),
                    format!("decoder.up_blocks.{k}.resnets.{j}"),
                );
                list.resnet(&l, &d, cin, cout);
                cin = cout;
            }
            if i > 0 {
                let (l, d) = (
                    format!("decoder.up.{i}.upsample.conv"),
                    format!("decoder.up_blocks.{k}.upsamplers.0.conv"),
                );
                list.conv(&l, &d, cin, cin, 3);
            }
        }
        list.norm("decoder.norm_out", "decoder.conv_norm_out", cin);
        list.conv("decoder.conv_out", "decoder.conv_out", cfg.out_channels, cin, 3);
    }
    if cfg.latent_bn {
        list.stat(BN_MEAN, cfg.latent_channels());
        list.stat(BN_VAR, cfg.latent_channels());
    }
    list.0
}

/// Recognises a KL autoencoder (the Flux VAE, the FLUX.2 VAE, and SD's with their quant convs) in either
/// layout.
///
/// `Ok(None)`: nothing under the header's prefix is named `encoder.*` or `decoder.*`, so this is not a VAE.
/// [`crate::Error::Unsupported`] (naming the file and what was found): a VAE Kiln cannot run — 5-D conv weights
/// (video VAEs), a 64-channel latent (the 32×-downscale VAEs), a file with neither a classic encoder nor
/// decoder (TAESD-like or other non-KL layouts), attention outside the mid block, widths 32 groups do not
/// divide, an encoder and decoder whose levels are not the same multiples of their first widths, or any
/// weight missing or of the wrong shape.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let vae_like = |n: &str| n.starts_with("encoder.") || n.starts_with("decoder.");
    if !h.names().any(vae_like) && !h.unsupported_dtypes().any(|(n, _)| vae_like(n)) {
        return Ok(None);
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().find(|&(n, _)| n != BN_STEPS) {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    if let Some(name) = h.names().find(|n| h.shape(n).is_some_and(|s| s.len() == 5)) {
        return Err(h.unsupported(format!(
            "`{}` is a 5-D (video) convolution weight {:?}: video VAEs are not supported",
            h.key(name),
            h.shape(name).unwrap_or_default()
        )));
    }
    let layout = if h.has("decoder.up_blocks.0.resnets.0.norm1.weight")
        || h.has("encoder.down_blocks.0.resnets.0.norm1.weight")
    {
        Layout::Diffusers
    } else {
        Layout::Ldm
    };
    let has_encoder = h.has("encoder.conv_in.weight");
    let has_decoder = h.has("decoder.conv_in.weight");
    if !has_encoder && !has_decoder {
        let found: Vec<&str> = h.names().take(4).collect();
        return Err(h.unsupported(format!(
            "neither a KL encoder nor decoder (no `{}` or `{}`; found {found:?}, ...): not a classic KL \
             autoencoder",
            h.key("encoder.conv_in.weight"),
            h.key("decoder.conv_in.weight")
        )));
    }
    if let Some(name) = h.names().find(|n| {
        (n.starts_with("decoder.up.") || n.starts_with("encoder.down.")) && n.contains(".attn.")
            || (n.starts_with("decoder.up_blocks.") || n.starts_with("encoder.down_blocks."))
                && n.contains(".attentions.")
    }) {
        return Err(h.unsupported(format!(
            "`{}`: attention outside the mid block is not supported",
            h.key(name)
        )));
    }
    let z_channels = if has_decoder {
        dim(h, "decoder.conv_in.weight", 1, 4)?
    } else {
        let out = dim(h, "encoder.conv_out.weight", 0, 4)?;
        if out % 2 != 0 {
            return Err(h.unsupported(format!(
                "`{}` gives {out} channels, not a mean and a log-variance",
                h.key("encoder.conv_out.weight")
            )));
        }
        out / 2
    };
    if z_channels == 64 {
        return Err(h.unsupported(format!(
            "a 64-channel latent (`{}` {:?}): a 32×-downscale VAE, not the classic KL autoencoder",
            h.key("decoder.conv_in.weight"),
            h.shape("decoder.conv_in.weight").unwrap_or_default()
        )));
    }
    let encoder = if has_encoder { Some(levels(h, layout, Side::Encoder)?) } else { None };
    let decoder = if has_decoder { Some(levels(h, layout, Side::Decoder)?) } else { None };
    // Each side's first width and its levels as multiples of it.
    let multiples = |widths: &[usize]| -> Result<(usize, Vec<usize>)> {
        let ch = widths[0];
        if let Some(w) = widths.iter().find(|&&w| w == 0 || w % ch != 0 || w % GROUPS != 0) {
            return Err(h.unsupported(format!(
                "level widths {widths:?}: {w} is not a multiple of the first width and of {GROUPS} GroupNorm \
                 groups"
            )));
        }
        Ok((ch, widths.iter().map(|w| w / ch).collect()))
    };
    let (ch, decoder_ch, ch_mult, num_res_blocks) = match (&encoder, &decoder) {
        (Some(e), Some(d)) => {
            let ((ch, e_mult), (decoder_ch, d_mult)) = (multiples(&e.0)?, multiples(&d.0)?);
            if e_mult != d_mult || e.1 != d.1 {
                return Err(h.unsupported(format!(
                    "encoder (widths {:?}, {} resnets per level) and decoder (widths {:?}, {} + 1) disagree: \
                     their levels must be the same multiples of their first widths",
                    e.0, e.1, d.0, d.1
                )));
            }
            (ch, decoder_ch, e_mult, e.1)
        }
        (Some(s), None) | (None, Some(s)) => {
            let (ch, mult) = multiples(&s.0)?;
            (ch, ch, mult, s.1)
        }
        (None, None) => return Err(h.unsupported("neither a KL encoder nor decoder")),
    };
    let either = |name: &str, side: &str| h.has(name) || h.has(&format!("{side}.{name}"));
    let cfg = Config {
        ch,
        decoder_ch,
        ch_mult,
        num_res_blocks,
        z_channels,
        in_channels: if has_encoder { dim(h, "encoder.conv_in.weight", 1, 4)? } else { 3 },
        out_channels: if has_decoder { dim(h, "decoder.conv_out.weight", 0, 4)? } else { 3 },
        groups: GROUPS,
        has_encoder,
        has_decoder,
        quant_conv: has_encoder && either("quant_conv.weight", "encoder"),
        post_quant_conv: has_decoder && either("post_quant_conv.weight", "decoder"),
        latent_bn: h.has(BN_MEAN),
    };
    for e in expected(&cfg) {
        let name = e.name_in(h, layout);
        let found = h.require(name)?.shape.as_slice();
        if !e.fits(found) {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {:?} for a KL autoencoder of widths {:?} (decoder {:?})",
                h.key(name),
                e.shape,
                (0..cfg.levels()).map(|i| cfg.width(i)).collect::<Vec<_>>(),
                (0..cfg.levels()).map(|i| cfg.decoder_width(i)).collect::<Vec<_>>(),
            )));
        }
    }
    Ok(Some((cfg, layout)))
}

/// The weights of `cfg` from `h`'s file, each under its LDM name (no prefix); diffusers' names are mapped here,
/// and its `[C, C]` attention projections keep that shape (the model reads them as `[C, C]` either way).
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = expected(cfg)
        .into_iter()
        .map(|e| {
            let key = h.key(e.name_in(h, layout));
            SlotPlan::new(e.ldm, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// Which half of the autoencoder.
#[derive(Debug, Clone, Copy)]
enum Side {
    Encoder,
    Decoder,
}

/// Dimension `d` of a tensor that must have rank `rank`.
fn dim(h: &Header, name: &str, d: usize, rank: usize) -> Result<usize> {
    let shape = h.require(name)?.shape.as_slice();
    if shape.len() != rank {
        return Err(h.unsupported(format!("`{}` is {shape:?}, expected rank {rank}", h.key(name))));
    }
    Ok(shape[d])
}

/// The widths of one side's levels, in level order (the encoder's `down.i`, the decoder's `up.i`), and its
/// resnets per level (for the decoder, one less than it has: the encoder's count).
fn levels(h: &Header, layout: Layout, side: Side) -> Result<(Vec<usize>, usize)> {
    let block = |level: usize, j: usize| match (side, layout) {
        (Side::Encoder, Layout::Ldm) => format!("encoder.down.{level}.block.{j}.conv1.weight"),
        (Side::Encoder, Layout::Diffusers) => {
            format!("encoder.down_blocks.{level}.resnets.{j}.conv1.weight")
        }
        (Side::Decoder, Layout::Ldm) => format!("decoder.up.{level}.block.{j}.conv1.weight"),
        (Side::Decoder, Layout::Diffusers) => {
            format!("decoder.up_blocks.{level}.resnets.{j}.conv1.weight")
        }
    };
    let n = (0..).take_while(|&i| h.has(&block(i, 0))).count();
    if n < 2 {
        return Err(h.unsupported(format!(
            "no resnet levels: `{}` and `{}` missing",
            h.key(&block(0, 0)),
            h.key(&block(1, 0))
        )));
    }
    let blocks = (0..).take_while(|&j| h.has(&block(0, j))).count();
    let mut widths = Vec::with_capacity(n);
    for i in 0..n {
        widths.push(dim(h, &block(i, 0), 0, 4)?);
    }
    let num_res_blocks = match side {
        Side::Encoder => blocks,
        Side::Decoder => {
            // diffusers lists the decoder's levels deepest first.
            if let Layout::Diffusers = layout {
                widths.reverse();
            }
            if blocks < 2 {
                return Err(h.unsupported(format!(
                    "`{}` has {blocks} resnet block(s); a KL decoder level has at least two",
                    h.key(&block(0, 0))
                )));
            }
            blocks - 1
        }
    };
    Ok((widths, num_res_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flux() -> Config {
        Config {
            ch: 128,
            decoder_ch: 128,
            ch_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            z_channels: 16,
            in_channels: 3,
            out_channels: 3,
            groups: 32,
            has_encoder: true,
            has_decoder: true,
            quant_conv: false,
            post_quant_conv: false,
            latent_bn: false,
        }
    }

    fn shape<'a>(list: &'a [Expected], ldm: &str) -> &'a [usize] {
        &list.iter().find(|e| e.ldm == ldm).unwrap_or_else(|| panic!("no {ldm}")).shape
    }

    /// The keys and shapes models.md §5.1 lists for `ae.safetensors`.
    #[test]
    fn flux_keys_and_shapes() {
        let list = expected(&flux());
        assert_eq!(shape(&list, "decoder.conv_in.weight"), [512, 16, 3, 3]);
        assert_eq!(shape(&list, "decoder.mid.block_1.norm1.weight"), [512]);
        assert_eq!(shape(&list, "decoder.mid.attn_1.q.weight"), [512, 512, 1, 1]);
        assert_eq!(shape(&list, "decoder.up.3.block.0.conv1.weight"), [512, 512, 3, 3]);
        assert_eq!(shape(&list, "decoder.up.1.block.0.nin_shortcut.weight"), [256, 512, 1, 1]);
        assert_eq!(shape(&list, "decoder.up.0.block.0.nin_shortcut.weight"), [128, 256, 1, 1]);
        assert_eq!(shape(&list, "decoder.up.0.block.2.conv2.weight"), [128, 128, 3, 3]);
        assert_eq!(shape(&list, "decoder.norm_out.weight"), [128]);
        assert_eq!(shape(&list, "decoder.conv_out.weight"), [3, 128, 3, 3]);
        assert_eq!(shape(&list, "encoder.conv_out.weight"), [32, 512, 3, 3]);
        for i in 1..4 {
            assert!(list.iter().any(|e| e.ldm == format!("decoder.up.{i}.upsample.conv.weight")));
        }
        for i in 0..3 {
            assert!(
                list.iter().any(|e| e.ldm == format!("encoder.down.{i}.downsample.conv.weight"))
            );
        }
        assert!(
            !list
                .iter()
                .any(|e| e.ldm.contains("up.0.upsample") || e.ldm.contains("down.3.downsample"))
        );
        // 2 × (encoder) and 3 × (decoder) resnets per level, the mid blocks, convs and norms.
        let diffusers = list
            .iter()
            .find(|e| e.ldm == "decoder.up.3.block.2.conv1.weight")
            .map(|e| &e.diffusers);
        assert_eq!(
            diffusers.map(String::as_str),
            Some("decoder.up_blocks.0.resnets.2.conv1.weight")
        );
        let attn = list
            .iter()
            .find(|e| e.ldm == "decoder.mid.attn_1.proj_out.weight")
            .map(|e| &e.diffusers);
        assert_eq!(
            attn.map(String::as_str),
            Some("decoder.mid_block.attentions.0.to_out.0.weight")
        );
        assert_eq!(list.len(), 244);
    }

    /// FLUX.2: z 32, both quant convs (read under BFL's nested names too), the BatchNorm statistics of the
    /// 128-channel latent; a narrower decoder changes only the decoder's shapes.
    #[test]
    fn flux2_keys_and_shapes() {
        let cfg = Config {
            z_channels: 32,
            quant_conv: true,
            post_quant_conv: true,
            latent_bn: true,
            ..flux()
        };
        assert_eq!((cfg.downscale(), cfg.latent_channels()), (16, 128));
        let list = expected(&cfg);
        assert_eq!(list.len(), 244 + 4 + 2);
        assert_eq!(shape(&list, "quant_conv.weight"), [64, 64, 1, 1]);
        assert_eq!(shape(&list, "post_quant_conv.weight"), [32, 32, 1, 1]);
        assert_eq!(shape(&list, "decoder.conv_in.weight"), [512, 32, 3, 3]);
        assert_eq!(shape(&list, "encoder.conv_out.weight"), [64, 512, 3, 3]);
        assert_eq!(shape(&list, BN_MEAN), [128]);
        assert_eq!(shape(&list, BN_VAR), [128]);
        let alias = |ldm: &str| list.iter().find(|e| e.ldm == ldm).and_then(|e| e.alias.clone());
        assert_eq!(alias("quant_conv.bias").as_deref(), Some("encoder.quant_conv.bias"));
        assert_eq!(
            alias("post_quant_conv.weight").as_deref(),
            Some("decoder.post_quant_conv.weight")
        );
        assert_eq!(alias("decoder.conv_in.weight"), None);

        let small = Config { decoder_ch: 64, ..cfg.clone() };
        let narrow = expected(&small);
        assert_eq!(shape(&narrow, "decoder.conv_in.weight"), [256, 32, 3, 3]);
        assert_eq!(shape(&narrow, "decoder.conv_out.weight"), [3, 64, 3, 3]);
        assert_eq!(shape(&narrow, "encoder.conv_out.weight"), [64, 512, 3, 3]);
        assert_eq!(narrow.len(), list.len());
    }
}
