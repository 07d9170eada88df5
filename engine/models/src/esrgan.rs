//! ESRGAN upscale models (`UpscaleModelLoader`, `ImageUpscaleWithModel`): the RRDBNet of ESRGAN, Real-ESRGAN
//! and BSRGAN, as spandrel (ComfyUI's loader) runs it.
//!
//! A 3×3 convolution to `filters` channels, a trunk of RRDB blocks (three residual dense blocks each, five
//! convolutions that read everything before them, growth 32, LeakyReLU 0.2, residuals scaled by 0.2) closed by a
//! convolution and added back, then per ×2 a nearest-neighbour upsampling and a convolution, and two last
//! convolutions. The three key layouts spandrel reads name the same weights: Real-ESRGAN's (`conv_first`,
//! `body.N.rdbR.convC`, `conv_up1`), BSRGAN's (`RRDB_trunk`, `trunk_conv`, `upconv1`, `HRconv`) and the original
//! ESRGAN's (`model.0`, `model.1.sub.N.RDBR.convC.0`, `model.3`); Kiln names them by Real-ESRGAN's. Real-ESRGAN's
//! ×1 and ×2 models (pixel-unshuffled input) and ESRGAN+ are refused, naming what they are.

use kiln_compute::backend::{BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::{LoadPlan, Model, SlotPlan};
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;

/// The residual dense blocks' growth: the channels each of their first four convolutions adds (spandrel's
/// fixed 32).
pub const GROWTH: usize = 32;
/// The LeakyReLU slope.
const SLOPE: f32 = 0.2;
/// The scale of every residual branch.
const RESIDUAL: f32 = 0.2;

/// An RRDBNet's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Image channels in (3).
    pub in_channels: usize,
    /// Image channels out (3).
    pub out_channels: usize,
    /// Trunk width (64 in the released models).
    pub filters: usize,
    /// RRDB blocks (23 in the released models).
    pub blocks: usize,
    /// ×2 upsampling stages: the scale is 2^`upsamplings` (2 for ×4).
    pub upsamplings: usize,
}

impl Config {
    /// How many times larger the output is than the input.
    pub fn scale(&self) -> usize {
        1 << self.upsamplings
    }

    /// Real-ESRGAN x4plus: 64 filters, 23 blocks, ×4.
    pub fn x4plus() -> Config {
        Config { in_channels: 3, out_channels: 3, filters: 64, blocks: 23, upsamplings: 2 }
    }
}

/// The key layout of an ESRGAN file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Real-ESRGAN's (BasicSR's `RRDBNet`): `conv_first`, `body.N.rdbR.convC`, `conv_body`, `conv_upK`,
    /// `conv_hr`, `conv_last`.
    RealEsrgan,
    /// BSRGAN's and RealSR's: `conv_first`, `RRDB_trunk.N.RDBR.convC`, `trunk_conv`, `upconvK`, `HRconv`,
    /// `conv_last`.
    Bsrgan,
    /// The original ESRGAN's: `model.0`, `model.1.sub.N.RDBR.convC.0`, `model.1.sub.{blocks}`, `model.{3K}`,
    /// `model.{3·ups + 2}`, `model.{3·ups + 4}`.
    Esrgan,
}

/// The convolutions of `cfg` by Real-ESRGAN's names, with their `[out, in]` channels (every kernel is 3×3).
pub fn convolutions(cfg: &Config) -> Vec<(String, [usize; 2])> {
    let f = cfg.filters;
    let mut out = vec![("conv_first".to_owned(), [f, cfg.in_channels])];
    for n in 0..cfg.blocks {
        for r in 1..=3 {
            for c in 1..=5 {
                let width = if c == 5 { f } else { GROWTH };
                out.push((format!("body.{n}.rdb{r}.conv{c}"), [width, f + (c - 1) * GROWTH]));
            }
        }
    }
    out.push(("conv_body".to_owned(), [f, f]));
    for k in 1..=cfg.upsamplings {
        out.push((format!("conv_up{k}"), [f, f]));
    }
    out.push(("conv_hr".to_owned(), [f, f]));
    out.push(("conv_last".to_owned(), [cfg.out_channels, f]));
    out
}

/// Every weight of `cfg` by Real-ESRGAN's name with its shape (what a loaded model has and what `kiln model
/// synth` writes).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    convolutions(cfg)
        .into_iter()
        .flat_map(|(name, [o, i])| {
            [(format!("{name}.weight"), vec![o, i, 3, 3]), (format!("{name}.bias"), vec![o])]
        })
        .collect()
}

/// The name in a file of `layout` of the convolution Real-ESRGAN calls `name`, in a model of `cfg`.
fn file_name(name: &str, layout: Layout, cfg: &Config) -> String {
    let ups = cfg.upsamplings;
    match layout {
        Layout::RealEsrgan => name.to_owned(),
        Layout::Bsrgan => match name {
            "conv_body" => "trunk_conv".to_owned(),
            "conv_hr" => "HRconv".to_owned(),
            _ => match name.strip_prefix("conv_up") {
                Some(k) => format!("upconv{k}"),
                None => match block_part(name) {
                    Some((n, r, c)) => format!("RRDB_trunk.{n}.RDB{r}.conv{c}"),
                    None => name.to_owned(),
                },
            },
        },
        Layout::Esrgan => match name {
            "conv_first" => "model.0".to_owned(),
            "conv_body" => format!("model.1.sub.{}", cfg.blocks),
            "conv_hr" => format!("model.{}", 3 * ups + 2),
            "conv_last" => format!("model.{}", 3 * ups + 4),
            _ => match name.strip_prefix("conv_up").and_then(|k| k.parse::<usize>().ok()) {
                Some(k) => format!("model.{}", 3 * k),
                None => match block_part(name) {
                    Some((n, r, c)) => format!("model.1.sub.{n}.RDB{r}.conv{c}.0"),
                    None => name.to_owned(),
                },
            },
        },
    }
}

/// `body.{n}.rdb{r}.conv{c}` → (n, r, c).
fn block_part(name: &str) -> Option<(&str, &str, &str)> {
    let rest = name.strip_prefix("body.")?;
    let (n, rest) = rest.split_once(".rdb")?;
    let (r, c) = rest.split_once(".conv")?;
    Some((n, r, c))
}

/// The layout of an ESRGAN file, if `h` is one.
fn layout_of(h: &Header) -> Option<Layout> {
    if h.has("conv_first.weight") && h.has("body.0.rdb1.conv1.weight") {
        Some(Layout::RealEsrgan)
    } else if h.has("conv_first.weight") && h.has("RRDB_trunk.0.RDB1.conv1.weight") {
        Some(Layout::Bsrgan)
    } else if h.has("model.0.weight")
        && (h.has("model.1.sub.0.RDB1.conv1.0.weight")
            || h.has("model.1.sub.0.RDB1.conv1x1.weight"))
    {
        Some(Layout::Esrgan)
    } else {
        None
    }
}

/// A 3×3 convolution's `[out, in]` channels in `h`, which must exist.
fn conv_shape(h: &Header, name: &str) -> Result<[usize; 2]> {
    match h.shape(name) {
        Some(&[o, i, 3, 3]) => Ok([o, i]),
        Some(other) => {
            Err(h.unsupported(format!("`{}` is {other:?}, not a 3×3 convolution", h.key(name))))
        }
        None => Err(h.unsupported(format!("no tensor `{}`", h.key(name)))),
    }
}

/// Recognises an ESRGAN upscale model (`Ok(None)` for another file): its config from the shapes and its key
/// layout.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let Some(layout) = layout_of(h) else { return Ok(None) };
    if h.has("model.1.sub.0.RDB1.conv1x1.weight") {
        return Err(h.unsupported(
            "an ESRGAN+ model (its dense blocks have 1×1 convolutions), which Kiln does not run yet",
        ));
    }
    let blocks = match layout {
        Layout::RealEsrgan => h.count_blocks("body."),
        Layout::Bsrgan => h.count_blocks("RRDB_trunk."),
        Layout::Esrgan => h.count_blocks("model.1.sub.").saturating_sub(1),
    };
    let upsamplings = match layout {
        Layout::RealEsrgan => (1..).take_while(|k| h.has(&format!("conv_up{k}.weight"))).count(),
        Layout::Bsrgan => (1..).take_while(|k| h.has(&format!("upconv{k}.weight"))).count(),
        Layout::Esrgan => (1..).take_while(|k| h.has(&format!("model.{}.weight", 3 * k))).count(),
    };
    let probe = Config { in_channels: 0, out_channels: 0, filters: 0, blocks, upsamplings };
    let weight = |name: &str| format!("{}.weight", file_name(name, layout, &probe));
    let [filters, in_channels] = conv_shape(h, &weight("conv_first"))?;
    let [out_channels, _] = conv_shape(h, &weight("conv_last"))?;
    if in_channels != out_channels {
        return Err(h.unsupported(format!(
            "an ESRGAN model that reads {in_channels} channels and writes {out_channels} (Real-ESRGAN's ×1 and ×2 \
             models read pixel-unshuffled images), which Kiln does not run yet"
        )));
    }
    if blocks == 0 || upsamplings == 0 || upsamplings > 3 {
        return Err(h.unsupported(format!(
            "an ESRGAN layout with {blocks} RRDB blocks and {upsamplings} ×2 upsamplings (Kiln runs ×2, ×4 and \
             ×8 models with at least one block)"
        )));
    }
    let cfg = Config { in_channels, out_channels, filters, blocks, upsamplings };
    let what = format!("an RRDBNet of {filters} filters");
    for (name, [o, i]) in convolutions(&cfg) {
        let file = file_name(&name, layout, &cfg);
        for (part, want) in [("weight", vec![o, i, 3, 3]), ("bias", vec![o])] {
            h.expect_shape(&format!("{file}.{part}"), &want, &what)?;
        }
    }
    Ok(Some((cfg, layout)))
}

/// Every weight by its Real-ESRGAN name, read from the file's tensor of that weight in `layout`.
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = convolutions(cfg)
        .into_iter()
        .flat_map(|(name, _)| {
            let file = file_name(&name, layout, cfg);
            ["weight", "bias"].map(|part| {
                SlotPlan::new(format!("{name}.{part}"), vec![(0, h.key(&format!("{file}.{part}")))])
            })
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A loaded ESRGAN upscale model: its config and weights (Real-ESRGAN's names) under the memory manager.
#[derive(Debug)]
pub struct Esrgan {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl Esrgan {
    /// The network from its config and loaded weights (see [`load_plan`]).
    pub fn new(config: Config, weights: Model) -> Esrgan {
        Esrgan { config, weights }
    }

    /// The model's output for images `x` `[B, C, H, W]` (0..=1): `[B, C, s·H, s·W]`, f32, unclamped; computes
    /// in f32, as ComfyUI runs upscale models (`a.float()`).
    pub fn forward<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        match *x.shape() {
            [_, c, h, w] if c == self.config.in_channels && h > 0 && w > 0 => {}
            ref other => {
                return Err(Error::Invalid(format!(
                    "an ESRGAN model takes images [B, {}, H, W], got {other:?}",
                    self.config.in_channels
                )));
            }
        }
        let x = b.cast(x, DType::F32)?;
        let first = self.conv(b, &x, "conv_first")?;
        let mut trunk = first.clone();
        for n in 0..self.config.blocks {
            trunk = self.rrdb(b, &trunk, n)?;
        }
        let trunk = self.conv(b, &trunk, "conv_body")?;
        let mut x = b.binary(&first, &trunk, BinaryOp::Add)?;
        drop((first, trunk));
        for k in 1..=self.config.upsamplings {
            x = leaky_relu(b, &self.conv(b, &b.upsample_nearest2x(&x)?, &format!("conv_up{k}"))?)?;
        }
        let x = leaky_relu(b, &self.conv(b, &x, "conv_hr")?)?;
        self.conv(b, &x, "conv_last")
    }

    /// RRDB block `n`: three residual dense blocks, their result scaled by 0.2 and added to the input.
    fn rrdb<B: Backend>(&self, b: &B, x: &Tensor<B>, n: usize) -> Result<Tensor<B>> {
        let mut y = x.clone();
        for r in 1..=3 {
            y = self.dense(b, &y, &format!("body.{n}.rdb{r}"))?;
        }
        residual(b, &y, x)
    }

    /// A residual dense block: each of its five convolutions reads the input and every output before it
    /// (LeakyReLU after all but the last), the last's output scaled by 0.2 and added to the input.
    fn dense<B: Backend>(&self, b: &B, x: &Tensor<B>, prefix: &str) -> Result<Tensor<B>> {
        let mut features = vec![x.clone()];
        for c in 1..=4 {
            let input = b.concat(&features.iter().collect::<Vec<_>>(), 1)?;
            features.push(leaky_relu(b, &self.conv(b, &input, &format!("{prefix}.conv{c}"))?)?);
        }
        let input = b.concat(&features.iter().collect::<Vec<_>>(), 1)?;
        let y = self.conv(b, &input, &format!("{prefix}.conv5"))?;
        residual(b, &y, x)
    }

    /// The 3×3 "same" convolution `name`.
    fn conv<B: Backend>(&self, b: &B, x: &Tensor<B>, name: &str) -> Result<Tensor<B>> {
        let layer = crate::named::fetch(b, &self.weights, &crate::named::weight_and_bias(name))?;
        Ok(b.conv2d(x, &layer.weight(0), Some(&layer.weight(1)), Conv2dParams::same(1))?)
    }
}

/// `y · 0.2 + x`, as torch rounds the product, then the sum.
fn residual<B: Backend>(b: &B, y: &Tensor<B>, x: &Tensor<B>) -> Result<Tensor<B>> {
    Ok(b.binary(&b.affine(y, RESIDUAL, 0.0)?, x, BinaryOp::Add)?)
}

/// LeakyReLU with slope 0.2: x where x > 0, else 0.2·x (max(x, 0) − 0.2·max(−x, 0): the same values, each
/// product and sum exact but the one rounding of 0.2·x).
fn leaky_relu<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let positive = b.unary(x, UnaryOp::Relu)?;
    let negative = b.unary(&b.unary(x, UnaryOp::Neg)?, UnaryOp::Relu)?;
    Ok(b.binary(&positive, &b.affine(&negative, -SLOPE, 0.0)?, BinaryOp::Add)?)
}
