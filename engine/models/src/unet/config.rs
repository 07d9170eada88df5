//! Detection of an SD-style UNet file (ComfyUI's `openaimodel.UNetModel` in its LDM key layout), its [`Config`]
//! derived from tensor shapes, and the [`load_plan`].
//!
//! The structure is read from the keys as ComfyUI's `detect_unet_config` reads it: `input_blocks.i` is a ResBlock
//! (`.0.in_layers.2`) with an optional SpatialTransformer (`.1.proj_in`), or a stride-2 Downsample (`.0.op`);
//! `output_blocks.j` is a ResBlock, an optional SpatialTransformer and an optional Upsample (`.{1,2}.conv`). Kiln
//! runs the configuration of Lotus depth (ComfyUI's `LotusD`: SD 2's UNet with linear transformer projections
//! and a 4-wide `label_emb`); other SD UNets (SD 1.x, SD 2.x, SDXL) are recognised and refused by name.
//!
//! A file in diffusers' `UNet2DConditionModel` layout (`down_blocks.1.resnets.0.conv1.weight`) is read through
//! [`Names`], which gives each of its tensors its LDM name (ComfyUI's `unet_to_diffusers` map, run backwards), so
//! detection, the load plan and the model see one set of names.

use std::collections::BTreeMap;

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

use super::sdxl::{ADM_EMBED_WIDTH, SDXL_CLIP_G_WIDTH, UnetKind};

/// The width of every attention head (ComfyUI's `num_head_channels` for SD 2 and Lotus).
pub const HEAD_CHANNELS: usize = 64;
/// The `label_emb` input width of Lotus (ComfyUI's `adm_in_channels` for `LotusD`: sin and cos of a 2-wide task
/// switch).
pub const LOTUS_ADM_CHANNELS: usize = 4;

/// One entry of `input_blocks` after the first (the input conv).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputBlock {
    /// A ResBlock from `channels_in` to `channels_out`, then `depth` transformer blocks (0: none).
    Res {
        /// Input channels.
        channels_in: usize,
        /// Output channels.
        channels_out: usize,
        /// Transformer blocks of its SpatialTransformer (0 without one).
        depth: usize,
    },
    /// A stride-2 3×3 conv of `channels` (`.0.op`).
    Down {
        /// Channels in and out.
        channels: usize,
    },
}

/// One entry of `output_blocks`: a ResBlock over the running features joined with a skip, an optional
/// SpatialTransformer, an optional Upsample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBlock {
    /// Input channels (running features plus the skip's).
    pub channels_in: usize,
    /// Output channels.
    pub channels_out: usize,
    /// Transformer blocks of its SpatialTransformer (0 without one).
    pub depth: usize,
    /// The module index of its Upsample (`output_blocks.j.{index}.conv`), if it has one.
    pub upsample: Option<usize>,
}

/// The shape of a UNet, every width derived from its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Latent channels in (`input_blocks.0.0`).
    pub in_channels: usize,
    /// Channels out (`out.2`).
    pub out_channels: usize,
    /// Width of the first level and of the sinusoidal timestep features (320 for SD).
    pub model_channels: usize,
    /// Width of the timestep embedding (4 · model_channels).
    pub time_embed_dim: usize,
    /// Width of `label_emb`'s input (Lotus: 4); `None` without one.
    pub adm_in_channels: Option<usize>,
    /// Width of the cross-attention context (1024 for SD 2 and Lotus).
    pub context_dim: usize,
    /// Width of each attention head ([`HEAD_CHANNELS`]; tests use smaller).
    pub head_channels: usize,
    /// Whether the transformers project in and out with Linear layers (SD 2) rather than 1×1 convs (SD 1).
    pub linear_projection: bool,
    /// `input_blocks.1…`, in order.
    pub input_blocks: Vec<InputBlock>,
    /// Channels of the middle block.
    pub middle_channels: usize,
    /// Transformer blocks of the middle block's SpatialTransformer.
    pub middle_depth: usize,
    /// `output_blocks`, in order.
    pub output_blocks: Vec<OutputBlock>,
}

impl Config {
    /// Whether this is Lotus (a 4-wide `label_emb` the model feeds its task embedding).
    pub fn is_lotus(&self) -> bool {
        self.kind() == Some(UnetKind::Lotus)
    }

    /// Which UNet Kiln runs this is, by its `label_emb` ([`UnetKind::of`]) and, for SDXL's, no attention at its
    /// first level (which tells SDXL's from SD 2.1 unCLIP's, whose vector is as wide); `None` for the others.
    pub fn kind(&self) -> Option<UnetKind> {
        let kind = UnetKind::of(self.adm_in_channels, self.context_dim)?;
        let first_level_attends =
            matches!(self.input_blocks.first(), Some(InputBlock::Res { depth, .. }) if *depth > 0);
        match kind {
            UnetKind::Sdxl | UnetKind::SdxlRefiner if first_level_attends => None,
            kind => Some(kind),
        }
    }
}

/// Whether `h` holds an SD-style UNet, and its config. `Ok(None)`: not a UNet at all. `Err(Unsupported)`: a UNet
/// Kiln does not run (anything but Lotus depth), or one with tensors missing or of the wrong shape.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let Some(names) = Names::of(h) else { return Ok(None) };
    let config = derive(&names)?;
    if names.has("input_blocks.1.0.time_stack.0.in_layers.2.weight")
        || names.has("time_mixer.mix_factor")
    {
        return Err(h.unsupported(
            "a video UNet (Stable Video Diffusion: temporal layers), which Kiln does not run yet",
        ));
    }
    if config.kind().is_none() || !config.linear_projection {
        let what = match config.adm_in_channels {
            Some(_) => "an SD UNet with a class/ADM embedding",
            None if config.context_dim == 768 => "an SD 1.x UNet",
            None => "an SD 2.x UNet",
        };
        return Err(h.unsupported(format!(
            "{what} (context {}, label_emb {:?}); of the SD UNets Kiln runs SDXL's (base, refiner, Turbo) and \
             Lotus depth",
            config.context_dim, config.adm_in_channels
        )));
    }
    if config.kind() != Some(UnetKind::Lotus)
        && (config.in_channels != 4 || config.out_channels != 4)
    {
        return Err(h.unsupported(format!(
            "an SDXL UNet reading {} channels (an inpainting or instruct-pix2pix model), which Kiln does not run \
             yet",
            config.in_channels
        )));
    }
    for (name, shape) in tensors(&config) {
        names.expect_shape(&name, &shape)?;
    }
    Ok(Some(config))
}

/// The weights to load, under their LDM names, from the file's keys in either layout.
pub fn load_plan(h: &Header, config: &Config) -> LoadPlan {
    let names = Names::of(h);
    let slots = expected(config)
        .into_iter()
        .map(|name| {
            let key = match &names {
                Some(names) => h.key(names.file_name(&name)),
                None => h.key(&name),
            };
            SlotPlan::new(name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A UNet file's tensors by LDM name, whichever layout it has.
pub(crate) struct Names<'h, 'f> {
    h: &'h Header<'f>,
    /// For a diffusers-layout file: LDM name → the file's name. `None`: the file has LDM names.
    diffusers: Option<BTreeMap<String, String>>,
}

impl<'h, 'f> Names<'h, 'f> {
    /// The names of `h` if it holds a UNet in either layout.
    pub(crate) fn of(h: &'h Header<'f>) -> Option<Names<'h, 'f>> {
        if h.has("input_blocks.0.0.weight") && h.has("time_embed.0.weight") {
            return Some(Names { h, diffusers: None });
        }
        if !h.has("conv_in.weight") || !h.has("time_embedding.linear_1.weight") {
            return None;
        }
        let res_blocks = h.count_blocks("down_blocks.0.resnets.");
        let map = h
            .names()
            .filter_map(|name| Some((ldm_name(name, res_blocks, h)?, name.to_owned())))
            .collect();
        Some(Names { h, diffusers: Some(map) })
    }

    /// The file's name for the LDM name `ldm`.
    fn file_name<'a>(&'a self, ldm: &'a str) -> &'a str {
        match &self.diffusers {
            Some(map) => map.get(ldm).map_or(ldm, String::as_str),
            None => ldm,
        }
    }

    /// Whether the tensor exists.
    fn has(&self, ldm: &str) -> bool {
        self.shape(ldm).is_some()
    }

    /// A tensor's shape.
    fn shape(&self, ldm: &str) -> Option<&'f [usize]> {
        match &self.diffusers {
            Some(map) => self.h.shape(map.get(ldm)?),
            None => self.h.shape(ldm),
        }
    }

    /// A tensor that must exist with `rank` dimensions: its shape, or [`crate::Error::Unsupported`] naming it.
    fn require(&self, ldm: &str, rank: usize) -> Result<&'f [usize]> {
        let key = || self.h.key(self.file_name(ldm));
        match self.shape(ldm) {
            Some(shape) if shape.len() == rank => Ok(shape),
            Some(shape) => {
                Err(self.h.unsupported(format!("`{}` is {shape:?}, expected rank {rank}", key())))
            }
            None => Err(self.h.unsupported(format!("no tensor `{}`", key()))),
        }
    }

    /// Checks tensor `ldm` has shape `want`.
    fn expect_shape(&self, ldm: &str, want: &[usize]) -> Result<()> {
        self.h.expect_shape(self.file_name(ldm), want, "the UNet")
    }

    /// How many numbered blocks `prefix0.`, `prefix1.`, … there are from 0 without a gap.
    fn count_blocks(&self, prefix: &str) -> usize {
        match &self.diffusers {
            None => self.h.count_blocks(prefix),
            Some(map) => (0..)
                .take_while(|i| {
                    let block = format!("{prefix}{i}.");
                    map.range(block.clone()..).next().is_some_and(|(k, _)| k.starts_with(&block))
                })
                .count(),
        }
    }
}

/// The LDM name of a diffusers `UNet2DConditionModel` tensor, for a UNet of `res_blocks` ResBlocks a level
/// (`None` for a name outside the UNet).
fn ldm_name(name: &str, res_blocks: usize, h: &Header) -> Option<String> {
    let per_level = res_blocks + 1;
    let resnet = |rest: &str| -> String {
        let renames = [
            ("norm1.", "in_layers.0."),
            ("conv1.", "in_layers.2."),
            ("time_emb_proj.", "emb_layers.1."),
            ("norm2.", "out_layers.0."),
            ("conv2.", "out_layers.3."),
            ("conv_shortcut.", "skip_connection."),
        ];
        for (from, to) in renames {
            if let Some(tail) = rest.strip_prefix(from) {
                return format!("{to}{tail}");
            }
        }
        rest.to_owned()
    };
    let fixed = [
        ("conv_in.", "input_blocks.0.0."),
        ("time_embedding.linear_1.", "time_embed.0."),
        ("time_embedding.linear_2.", "time_embed.2."),
        ("class_embedding.linear_1.", "label_emb.0.0."),
        ("class_embedding.linear_2.", "label_emb.0.2."),
        // SDXL's (ComfyUI maps it to the same module), so such a file is refused by its own name.
        ("add_embedding.linear_1.", "label_emb.0.0."),
        ("add_embedding.linear_2.", "label_emb.0.2."),
        ("conv_norm_out.", "out.0."),
        ("conv_out.", "out.2."),
    ];
    for (from, to) in fixed {
        if let Some(tail) = name.strip_prefix(from) {
            return Some(format!("{to}{tail}"));
        }
    }
    let parts: Vec<&str> = name.splitn(5, '.').collect();
    match parts.as_slice() {
        ["mid_block", "resnets", i, rest @ ..] => {
            let block = if *i == "0" { 0 } else { 2 };
            Some(format!("middle_block.{block}.{}", resnet(&rest.join("."))))
        }
        ["mid_block", "attentions", "0", rest @ ..] => {
            Some(format!("middle_block.1.{}", rest.join(".")))
        }
        [side @ ("down_blocks" | "up_blocks"), level, kind, index, rest] => {
            let level: usize = level.parse().ok()?;
            let index: usize = index.parse().ok()?;
            let down = *side == "down_blocks";
            let (blocks, first) = if down { ("input_blocks", 1) } else { ("output_blocks", 0) };
            // A level is res_blocks ResBlocks and a downsample on the way down, res_blocks + 1 ResBlocks on
            // the way up: per_level blocks either way.
            let block = first + level * per_level + index;
            match *kind {
                "resnets" => Some(format!("{blocks}.{block}.0.{}", resnet(rest))),
                "attentions" => Some(format!("{blocks}.{block}.1.{rest}")),
                "downsamplers" => {
                    let rest = rest.strip_prefix("conv.")?;
                    Some(format!("input_blocks.{}.0.op.{rest}", (level + 1) * per_level))
                }
                "upsamplers" => {
                    let last = level * per_level + res_blocks;
                    let attention =
                        h.has(&format!("up_blocks.{level}.attentions.0.proj_in.weight"));
                    Some(format!("output_blocks.{last}.{}.{rest}", if attention { 2 } else { 1 }))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Transformer blocks of the SpatialTransformer `prefix` (0 if it has none).
fn depth(names: &Names, prefix: &str) -> usize {
    if names.has(&format!("{prefix}.proj_in.weight")) {
        names.count_blocks(&format!("{prefix}.transformer_blocks."))
    } else {
        0
    }
}

/// A ResBlock's (input, output) channels, from its first conv.
fn res_channels(names: &Names, prefix: &str) -> Result<(usize, usize)> {
    let conv1 = names.require(&format!("{prefix}.in_layers.2.weight"), 4)?;
    Ok((conv1[1], conv1[0]))
}

/// The widths and structure of a UNet file, from its shapes.
fn derive(names: &Names) -> Result<Config> {
    let h = names.h;
    let conv_in = names.require("input_blocks.0.0.weight", 4)?;
    let (model_channels, in_channels) = (conv_in[0], conv_in[1]);
    let time = names.require("time_embed.0.weight", 2)?;
    let time_embed_dim = time[0];
    if time[1] != model_channels || !model_channels.is_multiple_of(2) {
        return Err(h.unsupported(format!(
            "the time embedding is {time:?}: not the embedding of {model_channels}-wide timestep features"
        )));
    }
    let adm_in_channels = match names.has("label_emb.0.0.weight") {
        true => Some(names.require("label_emb.0.0.weight", 2)?[1]),
        false => None,
    };
    let out_channels = names.require("out.2.weight", 4)?[0];

    let mut input_blocks = Vec::new();
    let mut transformer = None;
    for i in 1..names.count_blocks("input_blocks.") {
        let prefix = format!("input_blocks.{i}");
        let op = format!("{prefix}.0.op.weight");
        if names.has(&op) {
            input_blocks.push(InputBlock::Down { channels: names.require(&op, 4)?[0] });
            continue;
        }
        let (channels_in, channels_out) = res_channels(names, &format!("{prefix}.0"))?;
        let depth = depth(names, &format!("{prefix}.1"));
        if depth > 0 {
            transformer.get_or_insert(format!("{prefix}.1"));
        }
        input_blocks.push(InputBlock::Res { channels_in, channels_out, depth });
    }
    let (middle_channels, _) = res_channels(names, "middle_block.0")?;
    let middle_depth = depth(names, "middle_block.1");

    let mut output_blocks = Vec::new();
    for j in 0..names.count_blocks("output_blocks.") {
        let prefix = format!("output_blocks.{j}");
        let (channels_in, channels_out) = res_channels(names, &format!("{prefix}.0"))?;
        let depth = depth(names, &format!("{prefix}.1"));
        let upsample = [1, 2].into_iter().find(|m| {
            names.has(&format!("{prefix}.{m}.conv.weight"))
                || names.has(&format!("{prefix}.{m}.conv.bias"))
        });
        output_blocks.push(OutputBlock { channels_in, channels_out, depth, upsample });
    }
    let downs = input_blocks.iter().filter(|b| matches!(b, InputBlock::Down { .. })).count();
    let ups = output_blocks.iter().filter(|b| b.upsample.is_some()).count();
    if downs != ups || output_blocks.len() != input_blocks.len() + 1 {
        return Err(h.unsupported(format!(
            "{} input blocks with {downs} downsamples do not mirror {} output blocks with {ups} upsamples",
            input_blocks.len() + 1,
            output_blocks.len()
        )));
    }
    let transformer = transformer.unwrap_or_else(|| "middle_block.1".to_owned());
    let to_k =
        names.require(&format!("{transformer}.transformer_blocks.0.attn2.to_k.weight"), 2)?;
    let proj_in = names.shape(&format!("{transformer}.proj_in.weight")).unwrap_or_default();
    Ok(Config {
        in_channels,
        out_channels,
        model_channels,
        time_embed_dim,
        adm_in_channels,
        context_dim: to_k[1],
        head_channels: HEAD_CHANNELS,
        linear_projection: proj_in.len() == 2,
        input_blocks,
        middle_channels,
        middle_depth,
        output_blocks,
    })
}

/// The widths a UNet is built from, as ComfyUI's `UNetModel` constructor takes them (what
/// [`Config::build`] lays out; detection derives the same [`Config`] from a file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Latent channels in.
    pub in_channels: usize,
    /// Channels out.
    pub out_channels: usize,
    /// Width of the first level (320).
    pub model_channels: usize,
    /// Width of each level as a multiple of `model_channels` ([1, 2, 4, 4]).
    pub channel_mult: Vec<usize>,
    /// ResBlocks per level on the way down (2; one more on the way up).
    pub res_blocks: usize,
    /// Transformer blocks of the SpatialTransformer after each ResBlock of each level (0: none; Lotus
    /// [1, 1, 1, 0], SDXL [0, 2, 10]).
    pub depths: Vec<usize>,
    /// Transformer blocks of the middle block's SpatialTransformer (Lotus 1, SDXL 10).
    pub middle_depth: usize,
    /// Width of the cross-attention context (1024).
    pub context_dim: usize,
    /// Width of each attention head (64).
    pub head_channels: usize,
    /// Width of `label_emb`'s input, if it has one (Lotus: 4).
    pub adm_in_channels: Option<usize>,
}

impl Shape {
    /// The released Lotus depth UNet (SD 2's: 320 wide, [1, 2, 4, 4], attention at the first three levels,
    /// context 1024, heads of 64, a 4-wide `label_emb`).
    pub fn lotus() -> Shape {
        Shape {
            in_channels: 4,
            out_channels: 4,
            model_channels: 320,
            channel_mult: vec![1, 2, 4, 4],
            res_blocks: 2,
            depths: vec![1, 1, 1, 0],
            middle_depth: 1,
            context_dim: 1024,
            head_channels: HEAD_CHANNELS,
            adm_in_channels: Some(LOTUS_ADM_CHANNELS),
        }
    }

    /// SDXL 1.0's base UNet (and SDXL Turbo's): 320 wide, [1, 2, 4], no attention at the first level, 2 and 10
    /// transformer blocks at the others and 10 in the middle, context 2048 (CLIP-L's and CLIP-G's states
    /// joined), a 2816-wide `label_emb` (CLIP-G's pooled vector and six size embeddings).
    pub fn sdxl() -> Shape {
        Shape {
            in_channels: 4,
            out_channels: 4,
            model_channels: 320,
            channel_mult: vec![1, 2, 4],
            res_blocks: 2,
            depths: vec![0, 2, 10],
            middle_depth: 10,
            context_dim: 2048,
            head_channels: HEAD_CHANNELS,
            adm_in_channels: Some(SDXL_CLIP_G_WIDTH + 6 * ADM_EMBED_WIDTH),
        }
    }

    /// SDXL 1.0's refiner UNet: 384 wide, [1, 2, 4, 4], 4 transformer blocks at the middle two levels and in
    /// the middle, context 1280 (CLIP-G's states), a 2560-wide `label_emb` (CLIP-G's pooled vector, four size
    /// embeddings and the aesthetic score's).
    pub fn sdxl_refiner() -> Shape {
        Shape {
            model_channels: 384,
            channel_mult: vec![1, 2, 4, 4],
            depths: vec![0, 4, 4, 0],
            middle_depth: 4,
            context_dim: SDXL_CLIP_G_WIDTH,
            adm_in_channels: Some(SDXL_CLIP_G_WIDTH + 5 * ADM_EMBED_WIDTH),
            ..Shape::sdxl()
        }
    }
}

impl Config {
    /// The structure ComfyUI's `UNetModel` builds for `shape` (linear transformer projections, the time
    /// embedding 4× the first width).
    pub fn build(shape: &Shape) -> Config {
        let mc = shape.model_channels;
        let levels = shape.channel_mult.len();
        let mut input_blocks = Vec::new();
        let mut skips = vec![mc];
        let mut ch = mc;
        for (level, &mult) in shape.channel_mult.iter().enumerate() {
            let depth = shape.depths.get(level).copied().unwrap_or(0);
            for _ in 0..shape.res_blocks {
                input_blocks.push(InputBlock::Res {
                    channels_in: ch,
                    channels_out: mult * mc,
                    depth,
                });
                ch = mult * mc;
                skips.push(ch);
            }
            if level + 1 < levels {
                input_blocks.push(InputBlock::Down { channels: ch });
                skips.push(ch);
            }
        }
        let middle_channels = ch;
        let mut output_blocks = Vec::new();
        for (level, &mult) in shape.channel_mult.iter().enumerate().rev() {
            let depth = shape.depths.get(level).copied().unwrap_or(0);
            for i in 0..=shape.res_blocks {
                let skip = skips.pop().unwrap_or(0);
                let upsample =
                    (level > 0 && i == shape.res_blocks).then_some(1 + usize::from(depth > 0));
                output_blocks.push(OutputBlock {
                    channels_in: ch + skip,
                    channels_out: mult * mc,
                    depth,
                    upsample,
                });
                ch = mult * mc;
            }
        }
        Config {
            in_channels: shape.in_channels,
            out_channels: shape.out_channels,
            model_channels: mc,
            time_embed_dim: 4 * mc,
            adm_in_channels: shape.adm_in_channels,
            context_dim: shape.context_dim,
            head_channels: shape.head_channels,
            linear_projection: true,
            input_blocks,
            middle_channels,
            middle_depth: shape.middle_depth,
            output_blocks,
        }
    }
}

/// Every weight the network reads, by LDM name.
pub(crate) fn expected(config: &Config) -> Vec<String> {
    tensors(config).into_iter().map(|(name, _)| name).collect()
}

/// Every weight the network reads: LDM name and shape, in model order.
pub fn tensors(config: &Config) -> Vec<(String, Vec<usize>)> {
    let ted = config.time_embed_dim;
    let mut t: Vec<(String, Vec<usize>)> = Vec::new();
    let linear = |t: &mut Vec<(String, Vec<usize>)>, name: String, out: usize, inp: usize| {
        t.push((format!("{name}.weight"), vec![out, inp]));
        t.push((format!("{name}.bias"), vec![out]));
    };
    let conv =
        |t: &mut Vec<(String, Vec<usize>)>, name: String, out: usize, inp: usize, k: usize| {
            t.push((format!("{name}.weight"), vec![out, inp, k, k]));
            t.push((format!("{name}.bias"), vec![out]));
        };
    let norm = |t: &mut Vec<(String, Vec<usize>)>, name: String, ch: usize| {
        t.push((format!("{name}.weight"), vec![ch]));
        t.push((format!("{name}.bias"), vec![ch]));
    };
    linear(&mut t, "time_embed.0".into(), ted, config.model_channels);
    linear(&mut t, "time_embed.2".into(), ted, ted);
    if let Some(adm) = config.adm_in_channels {
        linear(&mut t, "label_emb.0.0".into(), ted, adm);
        linear(&mut t, "label_emb.0.2".into(), ted, ted);
    }
    conv(&mut t, "input_blocks.0.0".into(), config.model_channels, config.in_channels, 3);
    let res = |t: &mut Vec<(String, Vec<usize>)>, prefix: String, cin: usize, cout: usize| {
        norm(t, format!("{prefix}.in_layers.0"), cin);
        conv(t, format!("{prefix}.in_layers.2"), cout, cin, 3);
        t.push((format!("{prefix}.emb_layers.1.weight"), vec![cout, ted]));
        t.push((format!("{prefix}.emb_layers.1.bias"), vec![cout]));
        norm(t, format!("{prefix}.out_layers.0"), cout);
        conv(t, format!("{prefix}.out_layers.3"), cout, cout, 3);
        if cin != cout {
            conv(t, format!("{prefix}.skip_connection"), cout, cin, 1);
        }
    };
    let ctx = config.context_dim;
    let transformer =
        |t: &mut Vec<(String, Vec<usize>)>, prefix: String, ch: usize, depth: usize| {
            norm(t, format!("{prefix}.norm"), ch);
            let projection = |t: &mut Vec<(String, Vec<usize>)>, name: String| {
                let shape =
                    if config.linear_projection { vec![ch, ch] } else { vec![ch, ch, 1, 1] };
                t.push((format!("{name}.weight"), shape));
                t.push((format!("{name}.bias"), vec![ch]));
            };
            projection(t, format!("{prefix}.proj_in"));
            for d in 0..depth {
                let block = format!("{prefix}.transformer_blocks.{d}");
                for (attn, kv) in [("attn1", ch), ("attn2", ctx)] {
                    t.push((format!("{block}.{attn}.to_q.weight"), vec![ch, ch]));
                    t.push((format!("{block}.{attn}.to_k.weight"), vec![ch, kv]));
                    t.push((format!("{block}.{attn}.to_v.weight"), vec![ch, kv]));
                    t.push((format!("{block}.{attn}.to_out.0.weight"), vec![ch, ch]));
                    t.push((format!("{block}.{attn}.to_out.0.bias"), vec![ch]));
                }
                t.push((format!("{block}.ff.net.0.proj.weight"), vec![8 * ch, ch]));
                t.push((format!("{block}.ff.net.0.proj.bias"), vec![8 * ch]));
                t.push((format!("{block}.ff.net.2.weight"), vec![ch, 4 * ch]));
                t.push((format!("{block}.ff.net.2.bias"), vec![ch]));
                for n in ["norm1", "norm2", "norm3"] {
                    norm(t, format!("{block}.{n}"), ch);
                }
            }
            projection(t, format!("{prefix}.proj_out"));
        };
    for (i, block) in config.input_blocks.iter().enumerate() {
        let prefix = format!("input_blocks.{}", i + 1);
        match *block {
            InputBlock::Res { channels_in, channels_out, depth } => {
                res(&mut t, format!("{prefix}.0"), channels_in, channels_out);
                if depth > 0 {
                    transformer(&mut t, format!("{prefix}.1"), channels_out, depth);
                }
            }
            InputBlock::Down { channels } => {
                conv(&mut t, format!("{prefix}.0.op"), channels, channels, 3)
            }
        }
    }
    let mid = config.middle_channels;
    res(&mut t, "middle_block.0".into(), mid, mid);
    if config.middle_depth > 0 {
        transformer(&mut t, "middle_block.1".into(), mid, config.middle_depth);
    }
    res(&mut t, "middle_block.2".into(), mid, mid);
    for (j, block) in config.output_blocks.iter().enumerate() {
        let prefix = format!("output_blocks.{j}");
        let cout = block.channels_out;
        res(&mut t, format!("{prefix}.0"), block.channels_in, cout);
        if block.depth > 0 {
            transformer(&mut t, format!("{prefix}.1"), cout, block.depth);
        }
        if let Some(m) = block.upsample {
            conv(&mut t, format!("{prefix}.{m}.conv"), cout, cout, 3);
        }
    }
    norm(&mut t, "out.0".into(), config.model_channels);
    conv(&mut t, "out.2".into(), config.out_channels, config.model_channels, 3);
    t
}
