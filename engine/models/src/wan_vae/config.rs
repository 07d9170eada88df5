//! Detection of a Wan 2.1 VAE file (ComfyUI's layout, the original Wan release's, or diffusers'
//! `AutoencoderKLWan` / `AutoencoderKLQwenImage`), its [`Config`], and the [`LoadPlan`] that gives every weight
//! its ComfyUI name.
//!
//! As ComfyUI does, only the base width, the latent channels and the image channels come from the file; the
//! level multipliers `[1, 2, 4, 4]`, two residual blocks a level and the temporal downsampling of levels 1 and 2
//! are the architecture's. One list, [`expected`], names every weight (ComfyUI name, diffusers name, shape);
//! detection checks the file against it and the load plan is made from it.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// Width multipliers of the four levels.
pub const DIM_MULT: [usize; 4] = [1, 2, 4, 4];
/// Residual blocks per encoder level (the decoder has one more).
pub const RES_BLOCKS: usize = 2;
/// Which encoder levels halve time as well as space (the decoder doubles time in the mirror ones).
pub const TEMPORAL_DOWNSAMPLE: [bool; 3] = [false, true, true];

/// The key layout of a Wan VAE file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's, which is the original Wan release's (`decoder.upsamples.0.residual.2.weight`).
    Comfy,
    /// diffusers' `AutoencoderKLWan` and `AutoencoderKLQwenImage` (`decoder.up_blocks.0.resnets.0.conv1.weight`).
    Diffusers,
}

impl Layout {
    /// The name of this layout of the two.
    pub(crate) fn pick(self, comfy: &'static str, diffusers: &'static str) -> &'static str {
        match self {
            Layout::Comfy => comfy,
            Layout::Diffusers => diffusers,
        }
    }
}

/// Which halves a Wan VAE file holds and its latent width, read the same way for both versions.
pub(crate) struct Halves {
    /// The encoder's first convolution, when the file has the encoder.
    pub encoder_in: Option<&'static str>,
    /// Whether the file has the decoder.
    pub has_decoder: bool,
    /// Latent channels: the decoder's input, or half the encoder's output (mean and log-variance).
    pub z_channels: usize,
}

impl Halves {
    /// The halves of `h` in `layout`.
    pub(crate) fn of(h: &Header, layout: Layout) -> Result<Halves> {
        let encoder_in = layout.pick("encoder.conv1.weight", "encoder.conv_in.weight");
        let decoder_in = layout.pick("decoder.conv1.weight", "decoder.conv_in.weight");
        let has_decoder = h.has(decoder_in);
        let z_channels = if has_decoder {
            dim(h, decoder_in, 1, 5)?
        } else {
            dim(h, layout.pick("encoder.head.2.weight", "encoder.conv_out.weight"), 0, 5)? / 2
        };
        Ok(Halves { encoder_in: h.has(encoder_in).then_some(encoder_in), has_decoder, z_channels })
    }

    /// The width of the decoder's output norm (its base width).
    pub(crate) fn decoder_width(h: &Header, layout: Layout) -> Result<usize> {
        dim(h, layout.pick("decoder.head.0.gamma", "decoder.norm_out.gamma"), 0, 4)
    }
}

/// The shape of a Wan 2.1 VAE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Base width (96 released).
    pub dim: usize,
    /// Latent channels (16).
    pub z_channels: usize,
    /// Image channels the encoder takes (3; 4 for Qwen-Image Layered).
    pub in_channels: usize,
    /// Image channels the decoder gives (3; 4 for Layered).
    pub out_channels: usize,
    /// Whether the file holds the encoder.
    pub has_encoder: bool,
    /// Whether the file holds the decoder.
    pub has_decoder: bool,
}

impl Config {
    /// Pixels per latent position along each side.
    pub fn downscale(&self) -> usize {
        1 << (DIM_MULT.len() - 1)
    }

    /// Width of the encoder's level `i` output (`dim · DIM_MULT[i]`).
    pub fn width(&self, level: usize) -> usize {
        self.dim * DIM_MULT[level]
    }

    /// The decoder's level `i` (0 = lowest resolution): its input and output widths. The levels after the
    /// first take half the width the previous level's upsample was given (2.1's upsample halves channels).
    pub fn decoder_widths(&self, level: usize) -> (usize, usize) {
        let n = DIM_MULT.len();
        let widths: Vec<usize> =
            std::iter::once(DIM_MULT[n - 1]).chain(DIM_MULT.iter().rev().copied()).collect();
        let input = self.dim * widths[level] / if level > 0 { 2 } else { 1 };
        (input, self.dim * widths[level + 1])
    }
}

/// Index of the encoder's entry `j` of level `i` in `encoder.downsamples` (residual blocks, then the resample).
pub(crate) fn encoder_index(level: usize, j: usize) -> usize {
    level * (RES_BLOCKS + 1) + j
}

/// Index of the decoder's entry `j` of level `i` in `decoder.upsamples` (residual blocks, then the resample).
pub(crate) fn decoder_index(level: usize, j: usize) -> usize {
    level * (RES_BLOCKS + 2) + j
}

/// One weight the network reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// Its ComfyUI name (the slot name).
    pub(crate) comfy: String,
    /// Its diffusers name.
    pub(crate) diffusers: String,
    /// Its shape.
    pub(crate) shape: Vec<usize>,
}

impl Expected {
    /// Its name in `layout`.
    pub(crate) fn name(&self, layout: Layout) -> &str {
        match layout {
            Layout::Comfy => &self.comfy,
            Layout::Diffusers => &self.diffusers,
        }
    }
}

/// Builds an [`Expected`] list (the Wan 2.2 VAE's too: the same blocks under other names).
pub(crate) struct List(pub(crate) Vec<Expected>);

impl List {
    fn push(&mut self, comfy: String, diffusers: String, shape: Vec<usize>) {
        self.0.push(Expected { comfy, diffusers, shape });
    }

    /// A convolution `comfy`/`diffusers` with weight `shape` and a bias of `shape[0]`.
    pub(crate) fn conv(&mut self, comfy: &str, diffusers: &str, shape: Vec<usize>) {
        let out = shape[0];
        self.push(format!("{comfy}.weight"), format!("{diffusers}.weight"), shape);
        self.push(format!("{comfy}.bias"), format!("{diffusers}.bias"), vec![out]);
    }

    /// A residual block `cin → cout`: RMS, causal 3³ conv, RMS, causal 3³ conv, and a 1³ shortcut when the
    /// width changes.
    pub(crate) fn residual(&mut self, comfy: &str, diffusers: &str, cin: usize, cout: usize) {
        let gamma = |c: usize| vec![c, 1, 1, 1];
        self.push(
            format!("{comfy}.residual.0.gamma"),
            format!("{diffusers}.norm1.gamma"),
            gamma(cin),
        );
        let (c, d) = (format!("{comfy}.residual.2"), format!("{diffusers}.conv1"));
        self.conv(&c, &d, vec![cout, cin, 3, 3, 3]);
        self.push(
            format!("{comfy}.residual.3.gamma"),
            format!("{diffusers}.norm2.gamma"),
            gamma(cout),
        );
        let (c, d) = (format!("{comfy}.residual.6"), format!("{diffusers}.conv2"));
        self.conv(&c, &d, vec![cout, cout, 3, 3, 3]);
        if cin != cout {
            let (c, d) = (format!("{comfy}.shortcut"), format!("{diffusers}.conv_shortcut"));
            self.conv(&c, &d, vec![cout, cin, 1, 1, 1]);
        }
    }

    /// The middle: residual block, attention, residual block, all `c` wide.
    pub(crate) fn middle(&mut self, side: &str, c: usize) {
        self.residual(&format!("{side}.middle.0"), &format!("{side}.mid_block.resnets.0"), c, c);
        let (a, d) = (format!("{side}.middle.1"), format!("{side}.mid_block.attentions.0"));
        self.push(format!("{a}.norm.gamma"), format!("{d}.norm.gamma"), vec![c, 1, 1]);
        self.conv(&format!("{a}.to_qkv"), &format!("{d}.to_qkv"), vec![3 * c, c, 1, 1]);
        self.conv(&format!("{a}.proj"), &format!("{d}.proj"), vec![c, c, 1, 1]);
        self.residual(&format!("{side}.middle.2"), &format!("{side}.mid_block.resnets.1"), c, c);
    }

    /// The closing RMS norm and causal 3³ conv of a side.
    pub(crate) fn head(&mut self, side: &str, cin: usize, cout: usize) {
        self.push(
            format!("{side}.head.0.gamma"),
            format!("{side}.norm_out.gamma"),
            vec![cin, 1, 1, 1],
        );
        self.conv(&format!("{side}.head.2"), &format!("{side}.conv_out"), vec![cout, cin, 3, 3, 3]);
    }
}

/// Every weight of `cfg`'s network, encoder first.
pub(crate) fn expected(cfg: &Config) -> Vec<Expected> {
    let mut list = List(Vec::new());
    let (n, z) = (DIM_MULT.len(), cfg.z_channels);
    if cfg.has_encoder {
        list.conv("encoder.conv1", "encoder.conv_in", vec![cfg.dim, cfg.in_channels, 3, 3, 3]);
        let mut cin = cfg.dim;
        for i in 0..n {
            let cout = cfg.width(i);
            for j in 0..RES_BLOCKS {
                let k = encoder_index(i, j);
                let (c, d) =
                    (format!("encoder.downsamples.{k}"), format!("encoder.down_blocks.{k}"));
                list.residual(&c, &d, cin, cout);
                cin = cout;
            }
            // Every level but the last ends with a resample, temporal too where the architecture says.
            if let Some(&temporal) = TEMPORAL_DOWNSAMPLE.get(i) {
                let k = encoder_index(i, RES_BLOCKS);
                let (c, d) =
                    (format!("encoder.downsamples.{k}"), format!("encoder.down_blocks.{k}"));
                list.conv(
                    &format!("{c}.resample.1"),
                    &format!("{d}.resample.1"),
                    vec![cin, cin, 3, 3],
                );
                if temporal {
                    list.conv(
                        &format!("{c}.time_conv"),
                        &format!("{d}.time_conv"),
                        vec![cin, cin, 3, 1, 1],
                    );
                }
            }
        }
        list.middle("encoder", cin);
        list.head("encoder", cin, 2 * z);
        list.conv("conv1", "quant_conv", vec![2 * z, 2 * z, 1, 1, 1]);
    }
    if cfg.has_decoder {
        list.conv("conv2", "post_quant_conv", vec![z, z, 1, 1, 1]);
        let top = cfg.decoder_widths(0).0;
        list.conv("decoder.conv1", "decoder.conv_in", vec![top, z, 3, 3, 3]);
        list.middle("decoder", top);
        let mut cout = top;
        for i in 0..n {
            let (mut cin, out) = cfg.decoder_widths(i);
            cout = out;
            for j in 0..=RES_BLOCKS {
                let c = format!("decoder.upsamples.{}", decoder_index(i, j));
                list.residual(&c, &format!("decoder.up_blocks.{i}.resnets.{j}"), cin, cout);
                cin = cout;
            }
            if i + 1 < n {
                let c = format!("decoder.upsamples.{}", decoder_index(i, RES_BLOCKS + 1));
                let d = format!("decoder.up_blocks.{i}.upsamplers.0");
                list.conv(
                    &format!("{c}.resample.1"),
                    &format!("{d}.resample.1"),
                    vec![cout / 2, cout, 3, 3],
                );
                if TEMPORAL_DOWNSAMPLE[n - 2 - i] {
                    list.conv(
                        &format!("{c}.time_conv"),
                        &format!("{d}.time_conv"),
                        vec![2 * cout, cout, 3, 1, 1],
                    );
                }
            }
        }
        list.head("decoder", cout, cfg.out_channels);
    }
    list.0
}

/// Dimension `d` of a tensor that must have rank `rank`.
pub(crate) fn dim(h: &Header, name: &str, d: usize, rank: usize) -> Result<usize> {
    let shape = h.require(name)?.shape.as_slice();
    if shape.len() != rank {
        return Err(h.unsupported(format!("`{}` is {shape:?}, expected rank {rank}", h.key(name))));
    }
    Ok(shape[d])
}

/// Recognises a Wan 2.1 VAE (Qwen-Image's too) in either layout.
///
/// `Ok(None)`: no RMS-norm `gamma` of a Wan VAE's middle block, or the Wan 2.2 VAE's residual blocks
/// ([`super::wan22::detect`] claims those). [`crate::Error::Unsupported`] (naming the file and what was found):
/// a 48-channel latent without the Wan 2.2 VAE's blocks, an unsupported dtype, or any weight missing or of the
/// wrong shape.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let comfy = ["decoder.middle.0.residual.0.gamma", "encoder.middle.0.residual.0.gamma"];
    let diffusers =
        ["decoder.mid_block.resnets.0.norm1.gamma", "encoder.mid_block.resnets.0.norm1.gamma"];
    if super::wan22::is_wan22(h) {
        return Ok(None);
    }
    let layout = if comfy.iter().any(|n| h.has(n)) {
        Layout::Comfy
    } else if diffusers.iter().any(|n| h.has(n)) {
        Layout::Diffusers
    } else {
        return Ok(None);
    };
    computable(h)?;
    let Halves { encoder_in, has_decoder, z_channels } = Halves::of(h, layout)?;
    if z_channels != 16 {
        return Err(h.unsupported(format!(
            "a {z_channels}-channel latent: the Wan 2.1 VAE has 16 (the Wan 2.2 VAE's 48 come with \
             residual blocks this file lacks)"
        )));
    }
    let cfg = Config {
        dim: match encoder_in {
            Some(encoder_in) => dim(h, encoder_in, 0, 5)?,
            None => Halves::decoder_width(h, layout)?,
        },
        z_channels,
        in_channels: match encoder_in {
            Some(encoder_in) => dim(h, encoder_in, 1, 5)?,
            None => 3,
        },
        out_channels: if has_decoder {
            dim(h, layout.pick("decoder.head.2.weight", "decoder.conv_out.weight"), 0, 5)?
        } else {
            3
        },
        has_encoder: encoder_in.is_some(),
        has_decoder,
    };
    check_shapes(h, &expected(&cfg), layout, &format!("a Wan 2.1 VAE of base width {}", cfg.dim))?;
    Ok(Some((cfg, layout)))
}

/// [`crate::Error::Unsupported`] naming the first tensor of `h` of a type Kiln cannot compute with.
pub(crate) fn computable(h: &Header) -> Result<()> {
    match h.unsupported_dtypes().next() {
        Some((name, dtype)) => Err(
            h.unsupported(format!("`{}` is {dtype}, a type Kiln cannot compute with", h.key(name)))
        ),
        None => Ok(()),
    }
}

/// [`crate::Error::Unsupported`] naming the first weight of `expected` missing from `h` (in `layout`) or of
/// another shape than `what` has.
pub(crate) fn check_shapes(
    h: &Header,
    expected: &[Expected],
    layout: Layout,
    what: &str,
) -> Result<()> {
    for e in expected {
        let name = e.name(layout);
        let found = h.require(name)?.shape.as_slice();
        if found != e.shape.as_slice() {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {:?} for {what}",
                h.key(name),
                e.shape
            )));
        }
    }
    Ok(())
}

/// The weights of `cfg` from `h`'s file, each under its ComfyUI name (no prefix).
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    plan(h, expected(cfg), layout)
}

/// The load plan of `expected` from `h`'s file in `layout`, each weight under its ComfyUI name.
pub(crate) fn plan(h: &Header, expected: Vec<Expected>, layout: Layout) -> LoadPlan {
    let slots = expected
        .into_iter()
        .map(|e| {
            let key = h.key(e.name(layout));
            SlotPlan::new(e.comfy, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
