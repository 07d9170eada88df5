//! Anima's ControlNet-LLLite (ComfyUI's `comfy/ldm/anima/lllite.py`, `ModelPatchLoader` on a file with
//! `lllite_conditioning1.*`, applied by `AnimaLLLiteApply`): a small CNN turns the control image (and, for the
//! inpainting kind, its mask) into one embedding per DiT token; per block, small FiLM-conditioned MLPs add to the
//! inputs of the self-attention's q, k and v projections, the cross-attention's q projection and the MLP.

use kiln_compute::backend::{BinaryOp, Conv2dParams, PadMode, UnaryOp};
use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::tensor::OwnedWeight;
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::named::{conv2d, fetch, linear, weight_and_bias};

/// The weight that marks an Anima LLLite file (ComfyUI's `ModelPatchLoader` key).
pub const LLLITE_MARKER: &str = "lllite_conditioning1.conv1.weight";
/// The conditioning CNN's prefix.
const COND: &str = "lllite_conditioning1";
/// ε of the CNN's GroupNorms and of its output LayerNorm (torch's defaults).
const NORM_EPS: f32 = 1e-5;

/// Where an LLLite module adds to a block (ComfyUI's module name suffixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlliteTarget {
    /// The self-attention's q projection input.
    SelfQ,
    /// The self-attention's k projection input.
    SelfK,
    /// The self-attention's v projection input.
    SelfV,
    /// The cross-attention's q projection input.
    CrossQ,
    /// The MLP's input.
    Mlp,
}

impl LlliteTarget {
    /// Every target, in ComfyUI's name order.
    pub const ALL: [LlliteTarget; 5] = [
        LlliteTarget::SelfQ,
        LlliteTarget::SelfK,
        LlliteTarget::SelfV,
        LlliteTarget::CrossQ,
        LlliteTarget::Mlp,
    ];

    /// The module name's suffix (`self_attn_q_proj`).
    pub fn name(self) -> &'static str {
        match self {
            LlliteTarget::SelfQ => "self_attn_q_proj",
            LlliteTarget::SelfK => "self_attn_k_proj",
            LlliteTarget::SelfV => "self_attn_v_proj",
            LlliteTarget::CrossQ => "cross_attn_q_proj",
            LlliteTarget::Mlp => "mlp_layer1",
        }
    }
}

/// One module: block `block`'s `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlliteModule {
    /// The DiT block.
    pub block: usize,
    /// Where it adds.
    pub target: LlliteTarget,
    /// Its hidden width (`down`'s rows).
    pub mlp_dim: usize,
}

impl LlliteModule {
    /// The module's name in the file (`lllite_dit_blocks_3_self_attn_q_proj`).
    pub fn name(&self) -> String {
        format!("lllite_dit_blocks_{}_{}", self.block, self.target.name())
    }
}

/// An Anima LLLite file's hyperparameters (from shapes and ComfyUI's metadata keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlliteConfig {
    /// Channels of the control input: 3 (an image) or 4 (an image and its mask: the inpainting kind).
    pub cond_in_channels: usize,
    /// The CNN's width.
    pub cond_dim: usize,
    /// The embedding width per token.
    pub cond_emb_dim: usize,
    /// The CNN's residual blocks.
    pub resblocks: usize,
    /// The ASPP's dilations (`lllite.aspp_dilations`); empty without an ASPP.
    pub aspp_dilations: Vec<usize>,
    /// Whether the masked part of the image is blanked before the CNN (`lllite.inpaint_masked_input`).
    pub inpaint_masked_input: bool,
    /// The DiT's width the modules read.
    pub model_dim: usize,
    /// The modules, by block and target.
    pub modules: Vec<LlliteModule>,
}

/// Whether `h` holds an Anima LLLite file, and its config; `Err(Unsupported)` for another version or a file
/// ComfyUI would refuse.
pub fn detect_lllite(h: &Header) -> Result<Option<LlliteConfig>> {
    if !h.has(LLLITE_MARKER) {
        return Ok(None);
    }
    let version = h.metadata("lllite.version").unwrap_or("2");
    if version != "2" {
        return Err(h.unsupported(format!(
            "an Anima LLLite file of version {version:?}; ComfyUI (and Kiln) read version 2's named keys"
        )));
    }
    let what = "an Anima LLLite file";
    let cond_in_channels = h.shape_of_rank(LLLITE_MARKER, 4, what)?[1];
    let cond_dim = h.shape_of_rank(&format!("{COND}.conv3.weight"), 4, what)?[0];
    let cond_emb_dim = h.shape_of_rank(&format!("{COND}.proj.weight"), 4, what)?[0];
    let resblocks = h.count_blocks(&format!("{COND}.resblocks."));
    let aspp_dilations = if h.names().any(|n| n.starts_with(&format!("{COND}.aspp."))) {
        let list = h.metadata("lllite.aspp_dilations").unwrap_or("1,2,4,8");
        list.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<usize>().map_err(|_| h.unsupported(format!("ASPP dilations {list:?}")))
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let inpaint_masked_input =
        h.metadata("lllite.inpaint_masked_input").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let mut modules = Vec::new();
    let mut model_dim = None;
    let mut names: Vec<&str> = h
        .names()
        .filter(|n| n.starts_with("lllite_dit_blocks_"))
        .filter_map(|n| n.split_once('.').map(|(module, _)| module))
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let module = parse_module(name)
            .ok_or_else(|| h.unsupported(format!("an Anima LLLite module named {name:?}")))?;
        let down = h.shape_of_rank(&format!("{name}.down.weight"), 2, what)?;
        let (mlp_dim, in_dim) = (down[0], down[1]);
        if *model_dim.get_or_insert(in_dim) != in_dim {
            return Err(h.unsupported(format!(
                "Anima LLLite modules of widths {model_dim:?} and {in_dim}"
            )));
        }
        modules.push(LlliteModule { mlp_dim, ..module });
    }
    let Some(model_dim) = model_dim else {
        return Err(h.unsupported("an Anima LLLite file without lllite_dit_blocks_* modules"));
    };
    let config = LlliteConfig {
        cond_in_channels,
        cond_dim,
        cond_emb_dim,
        resblocks,
        aspp_dilations,
        inpaint_masked_input,
        model_dim,
        modules,
    };
    for (name, shape) in lllite_expected(&config) {
        h.expect_shape(&name, &shape, "the Anima LLLite file")?;
    }
    Ok(Some(config))
}

/// `lllite_dit_blocks_{i}_{target}` as a module (its width unknown yet).
fn parse_module(name: &str) -> Option<LlliteModule> {
    let rest = name.strip_prefix("lllite_dit_blocks_")?;
    let (block, target) = rest.split_once('_')?;
    let target = LlliteTarget::ALL.into_iter().find(|t| t.name() == target)?;
    Some(LlliteModule { block: block.parse().ok()?, target, mlp_dim: 0 })
}

/// The channels' GroupNorm groups (ComfyUI's `_group_norm`: 8, halved until they divide the channels).
fn groups(channels: usize) -> usize {
    let mut groups = 8;
    while groups > 1 && !channels.is_multiple_of(groups) {
        groups /= 2;
    }
    groups
}

/// Every weight with its shape.
pub fn lllite_expected(cfg: &LlliteConfig) -> Vec<(String, Vec<usize>)> {
    let mut all: Vec<(String, Vec<usize>)> = Vec::new();
    let mut conv = |name: String, out: usize, inp: usize, k: usize| {
        all.push((format!("{name}.weight"), vec![out, inp, k, k]));
        all.push((format!("{name}.bias"), vec![out]));
    };
    let (half, dim, emb) = (cfg.cond_dim / 2, cfg.cond_dim, cfg.cond_emb_dim);
    conv(format!("{COND}.conv1"), half, cfg.cond_in_channels, 4);
    conv(format!("{COND}.conv2"), half, half, 3);
    conv(format!("{COND}.conv3"), dim, half, 4);
    for i in 0..cfg.resblocks {
        conv(format!("{COND}.resblocks.{i}.conv1"), dim, dim, 3);
        conv(format!("{COND}.resblocks.{i}.conv2"), dim, dim, 3);
    }
    for (j, &d) in cfg.aspp_dilations.iter().enumerate() {
        conv(format!("{COND}.aspp.branches.{j}.0"), dim, dim, if d == 1 { 1 } else { 3 });
    }
    if !cfg.aspp_dilations.is_empty() {
        conv(format!("{COND}.aspp.global_conv.0"), dim, dim, 1);
        conv(format!("{COND}.aspp.proj.0"), dim, dim * (cfg.aspp_dilations.len() + 1), 1);
    }
    conv(format!("{COND}.proj"), emb, dim, 1);
    let mut norms = vec![(format!("{COND}.norm1"), half), (format!("{COND}.norm2"), half)];
    norms.push((format!("{COND}.norm3"), dim));
    for i in 0..cfg.resblocks {
        norms.push((format!("{COND}.resblocks.{i}.norm1"), dim));
        norms.push((format!("{COND}.resblocks.{i}.norm2"), dim));
    }
    for j in 0..cfg.aspp_dilations.len() {
        norms.push((format!("{COND}.aspp.branches.{j}.1"), dim));
    }
    if !cfg.aspp_dilations.is_empty() {
        norms.push((format!("{COND}.aspp.global_conv.1"), dim));
        norms.push((format!("{COND}.aspp.proj.1"), dim));
    }
    norms.push((format!("{COND}.out_norm"), emb));
    for (name, width) in norms {
        all.push((format!("{name}.weight"), vec![width]));
        all.push((format!("{name}.bias"), vec![width]));
    }
    for m in &cfg.modules {
        let p = m.name();
        let mut linear = |name: &str, out: usize, inp: usize| {
            all.push((format!("{p}.{name}.weight"), vec![out, inp]));
            all.push((format!("{p}.{name}.bias"), vec![out]));
        };
        linear("down", m.mlp_dim, cfg.model_dim);
        linear("mid", m.mlp_dim, m.mlp_dim + emb);
        linear("cond_to_film", 2 * m.mlp_dim, emb);
        linear("up", cfg.model_dim, m.mlp_dim);
        all.push((format!("{p}.depth_embed"), vec![emb]));
    }
    all
}

/// The weights to load, under the file's names.
pub fn lllite_load_plan(h: &Header, cfg: &LlliteConfig) -> LoadPlan {
    h.plan_by_name(lllite_expected(cfg).into_iter().map(|(name, _)| name))
}

/// A loaded Anima LLLite file.
pub struct AnimaLllite {
    /// The hyperparameters.
    pub config: LlliteConfig,
    /// The weights.
    pub weights: Model,
}

/// One LLLite on a model call: the file, its embedding of the control image (`[1 or B, tokens, cond_emb_dim]`,
/// from [`AnimaLllite::embed`]) and the node's strength.
pub struct LlliteCall<'a, B: Backend> {
    /// The file.
    pub net: &'a AnimaLllite,
    /// The control image's embedding.
    pub cond: Tensor<B>,
    /// How much of the modules' outputs is added.
    pub strength: f32,
}

impl AnimaLllite {
    /// ComfyUI's `AnimaLLLiteConditioning`: the control input `[B, cond_in_channels, H, W]` (the image in [-1, 1],
    /// then for the inpainting kind the mask as ±1) → one embedding per 16×16 pixels `[B, H/16 · W/16, emb]`, in
    /// the compute type.
    pub fn embed<B: Backend>(&self, b: &B, image: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let m = &self.weights;
        let image = b.cast(image, b.compute_dtype())?;
        let strided = Conv2dParams { stride: 4, padding: [0; 4] };
        let conv_norm =
            |x: &Tensor<B>, conv: &str, norm: &str, params: Conv2dParams| -> Result<Tensor<B>> {
                let y = conv2d(b, m, &format!("{COND}.{conv}"), x, params)?;
                group_norm_silu(b, m, &format!("{COND}.{norm}"), &y)
            };
        let mut x = conv_norm(&image, "conv1", "norm1", strided)?;
        x = conv_norm(&x, "conv2", "norm2", Conv2dParams::same(1))?;
        x = conv_norm(&x, "conv3", "norm3", strided)?;
        for i in 0..cfg.resblocks {
            let p = format!("resblocks.{i}");
            let h = group_norm_silu(b, m, &format!("{COND}.{p}.norm1"), &x)?;
            let h = conv2d(b, m, &format!("{COND}.{p}.conv1"), &h, Conv2dParams::same(1))?;
            let h = group_norm_silu(b, m, &format!("{COND}.{p}.norm2"), &h)?;
            let h = conv2d(b, m, &format!("{COND}.{p}.conv2"), &h, Conv2dParams::same(1))?;
            x = b.binary(&x, &h, BinaryOp::Add)?;
        }
        if !cfg.aspp_dilations.is_empty() {
            x = self.aspp(b, &x)?;
        }
        let x = conv2d(b, m, &format!("{COND}.proj"), &x, Conv2dParams::same(0))?;
        let (batch, emb, h, w) = (x.dim(0)?, x.dim(1)?, x.dim(2)?, x.dim(3)?);
        let x = b.permute(&x.reshape(&[batch, emb, h * w])?, &[0, 2, 1])?;
        let norm = fetch(b, m, &weight_and_bias(&format!("{COND}.out_norm")))?;
        Ok(b.layer_norm(&x, Some(&norm.weight(0)), Some(&norm.weight(1)), NORM_EPS)?)
    }

    /// The ASPP (`AnimaLLLiteASPP`): a branch per dilation (1: a 1×1 conv; else a dilated 3×3), a global-pooled
    /// branch spread back over the map, joined on channels and projected; each conv followed by GroupNorm and SiLU.
    fn aspp<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let (batch, c, h, w) = (x.dim(0)?, x.dim(1)?, x.dim(2)?, x.dim(3)?);
        let mut outputs = Vec::new();
        for (j, &d) in self.config.aspp_dilations.iter().enumerate() {
            let p = format!("{COND}.aspp.branches.{j}");
            let y = if d == 1 {
                conv2d(b, m, &format!("{p}.0"), x, Conv2dParams::same(0))?
            } else {
                dilated_conv3(b, m, &format!("{p}.0"), x, d)?
            };
            outputs.push(group_norm_silu(b, m, &format!("{p}.1"), &y)?);
        }
        // AdaptiveAvgPool2d(1), then a bilinear resize of one value: the value everywhere.
        let pooled = {
            let ones = b.full(&[h * w, 1], 1.0 / (h * w) as f32, b.compute_dtype())?;
            let mean = b.matmul(&x.reshape(&[batch * c, h * w])?, &ones, false)?;
            let mean = mean.reshape(&[batch, c, 1, 1])?;
            let y =
                conv2d(b, m, &format!("{COND}.aspp.global_conv.0"), &mean, Conv2dParams::same(0))?;
            let y = group_norm_silu(b, m, &format!("{COND}.aspp.global_conv.1"), &y)?;
            let zeros = b.full(&[batch, c, h, w], 0.0, b.compute_dtype())?;
            b.binary(&zeros, &y, BinaryOp::Add)?
        };
        outputs.push(pooled);
        let joined = b.concat(&outputs.iter().collect::<Vec<_>>(), 1)?;
        let y = conv2d(b, m, &format!("{COND}.aspp.proj.0"), &joined, Conv2dParams::same(0))?;
        group_norm_silu(b, m, &format!("{COND}.aspp.proj.1"), &y)
    }

    /// Whether the file has a module at block `block` for `target`.
    pub fn has(&self, block: usize, target: LlliteTarget) -> bool {
        self.config.modules.iter().any(|m| m.block == block && m.target == target)
    }

    /// `x` `[B, L, model_dim]` with block `block`'s `target` module's output added (`AnimaLLLiteModule`): the
    /// embedding plus `depth_embed` FiLM-conditions an MLP on `x`, whose output, times `strength`, is added; `x`
    /// as it is where the file has no such module.
    pub fn apply<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        cond: &Tensor<B>,
        block: usize,
        target: LlliteTarget,
        strength: f32,
    ) -> Result<Tensor<B>> {
        let Some(module) =
            self.config.modules.iter().find(|m| m.block == block && m.target == target)
        else {
            return Ok(x.clone());
        };
        let (batch, tokens) = (x.dim(0)?, x.dim(1)?);
        if cond.dim(1)? != tokens || batch % cond.dim(0)? != 0 {
            return Err(Error::Invalid(format!(
                "Anima LLLite: the model's input has {batch} samples of {tokens} tokens, the control {:?}",
                cond.shape()
            )));
        }
        let m = &self.weights;
        let p = module.name();
        let cond = crate::latent_tokens::to_batch(b, cond, batch)?;
        let depth = fetch(b, m, &[format!("{p}.depth_embed")])?;
        let depth = b.weight_to_tensor(&depth.weight(0), b.compute_dtype())?;
        let cond =
            b.binary(&cond, &depth.reshape(&[1, 1, self.config.cond_emb_dim])?, BinaryOp::Add)?;
        let hidden = b.unary(&linear(b, m, &format!("{p}.down"), x)?, UnaryOp::Silu)?;
        let film = linear(b, m, &format!("{p}.cond_to_film"), &cond)?;
        let (gamma, beta) = (
            b.slice(&film, -1, 0, module.mlp_dim)?,
            b.slice(&film, -1, module.mlp_dim, module.mlp_dim)?,
        );
        let hidden = linear(b, m, &format!("{p}.mid"), &b.concat(&[&cond, &hidden], 2)?)?;
        let hidden = b.binary(&hidden, &b.affine(&gamma, 1.0, 1.0)?, BinaryOp::Mul)?;
        let hidden = b.unary(&b.binary(&hidden, &beta, BinaryOp::Add)?, UnaryOp::Silu)?;
        let up = b.affine(&linear(b, m, &format!("{p}.up"), &hidden)?, strength, 0.0)?;
        Ok(b.binary(x, &up, BinaryOp::Add)?)
    }
}

/// The GroupNorm `name` (affine, ComfyUI's group count) of `x`, then SiLU.
fn group_norm_silu<B: Backend>(b: &B, m: &Model, name: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
    let norm = fetch(b, m, &weight_and_bias(name))?;
    let y =
        b.group_norm(x, groups(x.dim(1)?), Some(&norm.weight(0)), Some(&norm.weight(1)), NORM_EPS)?;
    Ok(b.unary(&y, UnaryOp::Silu)?)
}

/// The 3×3 convolution `name` with dilation `d` and padding `d` ("same"), as its nine taps: the input padded by
/// `d` with zeros, each tap a 1×1 convolution of the window `d` from the next, summed (nine taps' work, where one
/// `(2d + 1)²` kernel with zeros between them would do up to 32 times as much).
fn dilated_conv3<B: Backend>(
    b: &B,
    m: &Model,
    name: &str,
    x: &Tensor<B>,
    d: usize,
) -> Result<Tensor<B>> {
    let layer = fetch(b, m, &weight_and_bias(name))?;
    let dt = b.compute_dtype();
    let w = b.weight_to_tensor(&layer.weight(0), dt)?;
    let (h, width) = (x.dim(2)?, x.dim(3)?);
    let padded = b.pad(x, 2, d, d, PadMode::Constant(0.0))?;
    let padded = b.pad(&padded, 3, d, d, PadMode::Constant(0.0))?;
    let mut sum: Option<Tensor<B>> = None;
    for i in 0..3 {
        for j in 0..3 {
            let tap = OwnedWeight::from_tensor(b, &b.slice(&b.slice(&w, 2, i, 1)?, 3, j, 1)?, dt)?;
            let window = b.slice(&b.slice(&padded, 2, i * d, h)?, 3, j * d, width)?;
            let bias = (i, j) == (0, 0);
            let bias = bias.then(|| layer.weight(1));
            let y = b.conv2d(&window, &tap.view(), bias.as_ref(), Conv2dParams::same(0))?;
            sum = Some(match sum {
                Some(acc) => b.binary(&acc, &y, BinaryOp::Add)?,
                None => y,
            });
        }
    }
    sum.ok_or_else(|| Error::Invalid("a dilated convolution without taps".to_owned()))
}
