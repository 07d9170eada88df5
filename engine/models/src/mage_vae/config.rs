//! Detection of a Mage-VAE file (the released layout: the encoder under `student.dconv_encoder.`, the decoder
//! under `pipeline.`), its [`Config`] derived from tensor shapes, and the [`LoadPlan`] that names every weight
//! as ComfyUI's `MageVAE` does after its renames (`dconv_encoder.…`, `decoder_model.…`).
//!
//! One list, [`expected`], names every weight the network reads with its shape; detection checks the file
//! against it and the load plan is made from it, so the two cannot drift apart.
//!
//! ComfyUI's classes take no configuration: the released widths are their defaults. Here every width and
//! depth is read from the file, so a tiny file runs; what the file cannot say, or what ComfyUI's `VAE`
//! wrapper fixes, is a constant: [`LATENT_CHANNELS`] and [`PATCH`] (the wrapper's 128 channels and 16×, checked
//! against the file), [`WINDOW`] (the CoD attention's windows), [`GROUPS`] (GroupNorm), [`EPS`] (every norm).

use kiln_compute::memory::{LoadPlan, SlotPlan};

use super::family;
use crate::error::Result;
use crate::header::Header;

/// Latent channels: ComfyUI's `MageVAE.latent_channels` and its VAE wrapper's 128, the encoder's `z_ch` and the
/// decoder's `bottleneck_dim` (checked against the file).
pub const LATENT_CHANNELS: usize = 128;
/// The side of a patch, pixels per latent position (ComfyUI's 16× down and up; the kernel of the encoder's
/// `patch_cond_embed` and of the denoiser's `s_embedder.proj1`, checked against the file).
pub const PATCH: usize = 16;
/// The side of the CoD decoder's attention windows, in latent positions (ComfyUI's `AttnBlock(patch_size=32)`;
/// not in the file).
pub const WINDOW: usize = 32;
/// GroupNorm groups of the CoD decoder (ComfyUI's `Normalize`: fixed, so its width is a multiple of it).
pub const GROUPS: usize = 32;
/// ε of every norm: GroupNorm, LayerNorm (the `LayerNorm2d`s and the pixel blocks' `in_ln`) and RMSNorm.
pub const EPS: f32 = 1e-6;

/// The tensor ComfyUI recognises the file by (`comfy/sd.py`).
pub const MARKER: &str = "student.dconv_encoder.proj_out.weight";
/// The encoder's prefix in the file, and ComfyUI's name for it.
const ENCODER: (&str, &str) = ("student.dconv_encoder.", "dconv_encoder.");
/// The decoder's (the one-step denoiser with its CoD decoder) prefix in the file, and ComfyUI's name for it.
const DECODER: (&str, &str) = ("pipeline.", "decoder_model.");

/// The shape of a Mage-VAE, every width and depth derived from its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Image channels the encoder reads and the decoder writes (3).
    pub image_channels: usize,
    /// The encoder (`DConvEncoder`).
    pub encoder: EncoderConfig,
    /// The decoder (`DConvDenoiser` with its CoD decoder).
    pub decoder: DecoderConfig,
}

/// The shape of the encoder: a patch embed and plain DiCo blocks (the head) computing the image's features,
/// fused with the (zero) latent, then DiCo blocks modulated by the (zero) timestep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Width of the head (768 released): `patch_cond_embed`'s output.
    pub head: usize,
    /// Plain DiCo blocks of the head (2).
    pub head_blocks: usize,
    /// Width of the head blocks' feed-forward (3072: `mlp_ratio` 4); 0 without head blocks.
    pub head_ffn: usize,
    /// Width of the modulated blocks (384).
    pub hidden: usize,
    /// Modulated DiCo blocks (21).
    pub blocks: usize,
    /// Width of their feed-forward (1536); 0 without blocks.
    pub ffn: usize,
    /// Sinusoidal features the timestep MLP reads (256).
    pub frequencies: usize,
    /// Channels of `proj_out` (256: the posterior's mean, the first [`LATENT_CHANNELS`], then its log-variance).
    pub out_channels: usize,
}

/// The shape of the decoder: the CoD decoder turns the latent into conditioning features; modulated DiCo
/// blocks mix them with the (zero) noise's patches; a per-pixel MLP (the NeRF-style head) makes each patch's
/// pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Width of the CoD decoder and the DiCo blocks (384), a multiple of [`GROUPS`].
    pub hidden: usize,
    /// The CoD decoder's blocks in order (ResNet, attention, ResNet, attention, ResNet released).
    pub cod: Vec<CodBlock>,
    /// Modulated DiCo blocks (`num_cond_blocks`, 21).
    pub blocks: usize,
    /// Width of their feed-forward (1536); 0 without blocks.
    pub ffn: usize,
    /// Sinusoidal features the timestep MLP reads (256).
    pub frequencies: usize,
    /// Width of the per-pixel head (`hidden_size_x`, 32).
    pub pixel: usize,
    /// Residual blocks of the per-pixel head (`num_blocks − num_cond_blocks`, 3).
    pub pixel_blocks: usize,
    /// DCT frequencies per axis of the pixel positions (`max_freqs`, 8: 64 features).
    pub dct_frequencies: usize,
}

/// One block of the CoD decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodBlock {
    /// A ResNet block (GroupNorm, SiLU, 3×3 conv, twice, and the skip).
    Resnet,
    /// Self-attention within [`WINDOW`]×[`WINDOW`] windows (the edges replicate-padded).
    Attention,
}

impl Config {
    /// Pixels per latent position along each side ([`PATCH`]).
    pub fn downscale(&self) -> usize {
        PATCH
    }

    /// Channels of the latent it encodes to and decodes from ([`LATENT_CHANNELS`]).
    pub fn latent_channels(&self) -> usize {
        LATENT_CHANNELS
    }

    /// ComfyUI's defaults (`MageVAE()`), the released file's shape.
    pub fn released() -> Config {
        use CodBlock::{Attention, Resnet};
        Config {
            image_channels: 3,
            encoder: EncoderConfig {
                head: 768,
                head_blocks: 2,
                head_ffn: 3072,
                hidden: 384,
                blocks: 21,
                ffn: 1536,
                frequencies: 256,
                out_channels: 256,
            },
            decoder: DecoderConfig {
                hidden: 384,
                cod: vec![Resnet, Attention, Resnet, Attention, Resnet],
                blocks: 21,
                ffn: 1536,
                frequencies: 256,
                pixel: 32,
                pixel_blocks: 3,
                dct_frequencies: 8,
            },
        }
    }
}

/// One weight the network reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// Its name in ComfyUI's `MageVAE` (the slot name).
    pub(crate) name: String,
    /// Its shape.
    pub(crate) shape: Vec<usize>,
    /// Whether the network reads it: the denoiser's `s_embedder.proj1` only ever sees the zero noise (a 16×16
    /// convolution without bias: its output is exactly zero), so it is checked but never loaded.
    pub(crate) read: bool,
}

/// Builds the [`Expected`] list, every name under `prefix`.
struct List {
    prefix: &'static str,
    all: Vec<Expected>,
}

impl List {
    fn push(&mut self, name: &str, shape: Vec<usize>) {
        self.all.push(Expected { name: format!("{}{name}", self.prefix), shape, read: true });
    }

    /// A bias `[n]`, or a norm's weight or bias.
    fn vector(&mut self, name: &str, n: usize) {
        self.push(name, vec![n]);
    }

    /// A Linear `out ← cin` with bias.
    fn linear(&mut self, name: &str, out: usize, cin: usize) {
        self.push(&format!("{name}.weight"), vec![out, cin]);
        self.vector(&format!("{name}.bias"), out);
    }

    /// A convolution `out ← cin` of `k`×`k` (1×1 ones are applied as Linears) with bias.
    fn conv(&mut self, name: &str, out: usize, cin: usize, k: usize) {
        self.push(&format!("{name}.weight"), vec![out, cin, k, k]);
        self.vector(&format!("{name}.bias"), out);
    }

    /// A norm's weight and bias.
    fn norm(&mut self, name: &str, c: usize) {
        self.vector(&format!("{name}.weight"), c);
        self.vector(&format!("{name}.bias"), c);
    }

    /// A DiCo block `prefix` of width `c`: the 1×1 `conv1`, the depthwise 3×3 `conv2`, the 1×1 `conv3`, the
    /// channel attention's 1×1 `ca.1`, the feed-forward `conv4`, `conv5`; then either its affine norms (the
    /// encoder's head) or its adaLN modulation (six sets).
    fn dico(&mut self, prefix: &str, c: usize, ffn: usize, modulated: bool) {
        self.conv(&format!("{prefix}.conv1"), c, c, 1);
        self.conv(&format!("{prefix}.conv2"), c, 1, 3);
        self.conv(&format!("{prefix}.conv3"), c, c, 1);
        self.conv(&format!("{prefix}.ca.1"), c, c, 1);
        self.conv(&format!("{prefix}.conv4"), ffn, c, 1);
        self.conv(&format!("{prefix}.conv5"), c, ffn, 1);
        if modulated {
            self.linear(&format!("{prefix}.adaLN_modulation.1"), 6 * c, c);
        } else {
            self.norm(&format!("{prefix}.norm1"), c);
            self.norm(&format!("{prefix}.norm2"), c);
        }
    }

    /// The timestep MLP `prefix` (`mlp.0`, SiLU, `mlp.2`) from `frequencies` features to `c`.
    fn timestep(&mut self, prefix: &str, c: usize, frequencies: usize) {
        self.linear(&format!("{prefix}.mlp.0"), c, frequencies);
        self.linear(&format!("{prefix}.mlp.2"), c, c);
    }
}

/// Every weight of `cfg`'s network under ComfyUI's names, encoder first.
pub(crate) fn expected(cfg: &Config) -> Vec<Expected> {
    let (img, z, p) = (cfg.image_channels, LATENT_CHANNELS, PATCH);
    let e = &cfg.encoder;
    let mut list = List { prefix: ENCODER.1, all: Vec::new() };
    list.conv("patch_cond_embed", e.head, img, p);
    for i in 0..e.head_blocks {
        list.dico(&format!("head_blocks.{i}"), e.head, e.head_ffn, false);
    }
    list.conv("proj_down", e.hidden, e.head, 1);
    list.conv("z_proj", e.hidden, z, 1);
    list.conv("fuse_proj", e.hidden, 2 * e.hidden, 1);
    list.timestep("t_embedder", e.hidden, e.frequencies);
    for i in 0..e.blocks {
        list.dico(&format!("blocks.{i}"), e.hidden, e.ffn, true);
    }
    list.norm("norm_out", e.hidden);
    list.conv("proj_out", e.out_channels, e.hidden, 1);

    let d = &cfg.decoder;
    let (c, x) = (d.hidden, d.pixel);
    let mut decoder = List { prefix: DECODER.1, all: list.all };
    decoder.timestep("t_embedder", c, d.frequencies);
    decoder.conv("y_embedder_x", x * p * p, c, 1);
    decoder.linear("x_embedder.embedder.0", x, img + x + d.dct_frequencies.pow(2));
    decoder.push("s_embedder.proj1.weight", vec![z, img, p, p]);
    if let Some(proj1) = decoder.all.last_mut() {
        proj1.read = false;
    }
    decoder.conv("s_embedder.proj2", c, z + c, 1);
    for i in 0..d.blocks {
        decoder.dico(&format!("blocks.{i}"), c, d.ffn, true);
    }
    decoder.linear("dec_net.cond_embed", p * p * x, c);
    decoder.linear("dec_net.input_proj", x, x);
    for i in 0..d.pixel_blocks {
        let block = format!("dec_net.res_blocks.{i}");
        decoder.norm(&format!("{block}.in_ln"), x);
        decoder.linear(&format!("{block}.mlp.0"), x, x);
        decoder.linear(&format!("{block}.mlp.2"), x, x);
        decoder.linear(&format!("{block}.adaLN_modulation.1"), 3 * x, x);
    }
    decoder.vector("final_layer.norm.weight", x);
    decoder.linear("final_layer.linear", img, x);
    let cod = "y_embedder.decoder";
    decoder.conv(&format!("{cod}.conv_in"), c, z, 3);
    for (i, block) in d.cod.iter().enumerate() {
        let name = format!("{cod}.block.{i}");
        match block {
            CodBlock::Resnet => {
                decoder.norm(&format!("{name}.norm1"), c);
                decoder.conv(&format!("{name}.conv1"), c, c, 3);
                decoder.norm(&format!("{name}.norm2"), c);
                decoder.conv(&format!("{name}.conv2"), c, c, 3);
            }
            CodBlock::Attention => {
                decoder.norm(&format!("{name}.norm"), c);
                for part in ["q", "k", "v", "proj_out"] {
                    decoder.conv(&format!("{name}.{part}"), c, c, 1);
                }
            }
        }
    }
    decoder.norm(&format!("{cod}.norm_out"), c);
    decoder.conv(&format!("{cod}.conv_out"), c, c, 3);
    decoder.all
}

/// Every weight of `cfg` under the released file's names, with its shape (what a synthetic file holds; the
/// anchor encoder ComfyUI drops is left out).
pub(crate) fn file_expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    expected(cfg).into_iter().map(|e| (file_name(&e.name), e.shape)).collect()
}

/// The file's name of ComfyUI's `name` (`dconv_encoder.` → `student.dconv_encoder.`, `decoder_model.` →
/// `pipeline.`: ComfyUI's renames, undone).
fn file_name(name: &str) -> String {
    for (file, comfy) in [ENCODER, DECODER] {
        if let Some(rest) = name.strip_prefix(comfy) {
            return format!("{file}{rest}");
        }
    }
    name.to_string()
}

/// Recognises a Mage-VAE as ComfyUI does: by [`MARKER`] (under the header's prefix).
///
/// `Ok(None)`: no such tensor, so this is not a Mage-VAE (every other VAE). [`crate::Error::Unsupported`]
/// (naming the file and what was found): a latent other than [`LATENT_CHANNELS`] or a patch other than
/// [`PATCH`] (ComfyUI's wrapper fixes both), a denoiser width GroupNorm's [`GROUPS`] do not divide, a CoD block
/// that is neither a ResNet nor an attention block, a type Kiln cannot compute with, or any weight missing or
/// of another shape than the widths read from the file give it. The anchor encoder the checkpoint also carries
/// (`pipeline.y_embedder.encoder.*`, `pipeline.y_embedder.bottleneck.*`), which ComfyUI drops, is never read.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(MARKER) && !h.unsupported_dtypes().any(|(n, _)| n == MARKER) {
        return Ok(None);
    }
    let shape = |name: &str, rank: usize| -> Result<Vec<usize>> {
        let name = file_name(name);
        if let Some((_, dtype)) = h.unsupported_dtypes().find(|&(n, _)| n == name) {
            return Err(h.unsupported(format!(
                "`{}` is {dtype}, a type Kiln cannot compute with",
                h.key(&name)
            )));
        }
        h.shape_of_rank(&name, rank, family::NAME)
    };
    // A stack's depth, and the width of its first block's feed-forward (0 without blocks).
    let stack = |prefix: &str| -> Result<(usize, usize)> {
        let file = file_name(prefix);
        let n = h.gapless_blocks(&file, &format!("{}'s `{file}` blocks", family::NAME))?;
        let ffn = if n > 0 { shape(&format!("{prefix}0.conv4.weight"), 4)?[0] } else { 0 };
        Ok((n, ffn))
    };

    let embed = shape("dconv_encoder.patch_cond_embed.weight", 4)?;
    let (head, image_channels, patch) = (embed[0], embed[1], embed[2]);
    let z = shape("dconv_encoder.z_proj.weight", 4)?[1];
    if z != LATENT_CHANNELS || patch != PATCH {
        return Err(h.unsupported(format!(
            "a latent of {z} channels at {patch}× down (`{}` {:?}, `{}` {embed:?}): ComfyUI's Mage-VAE has \
             {LATENT_CHANNELS} at {PATCH}×",
            h.key(&file_name("dconv_encoder.z_proj.weight")),
            shape("dconv_encoder.z_proj.weight", 4)?,
            h.key(&file_name("dconv_encoder.patch_cond_embed.weight")),
        )));
    }
    let out = shape("dconv_encoder.proj_out.weight", 4)?;
    let (head_blocks, head_ffn) = stack("dconv_encoder.head_blocks.")?;
    let (blocks, ffn) = stack("dconv_encoder.blocks.")?;
    let t = shape("dconv_encoder.t_embedder.mlp.0.weight", 2)?;
    let encoder = EncoderConfig {
        head,
        head_blocks,
        head_ffn,
        hidden: out[1],
        blocks,
        ffn,
        frequencies: t[1],
        out_channels: out[0],
    };
    if encoder.out_channels < LATENT_CHANNELS {
        return Err(h.unsupported(format!(
            "`{}` is {out:?}: fewer channels than the {LATENT_CHANNELS} of the latent's mean",
            h.key(MARKER)
        )));
    }

    let t = shape("decoder_model.t_embedder.mlp.0.weight", 2)?;
    let hidden = t[0];
    if hidden == 0 || !hidden.is_multiple_of(GROUPS) {
        return Err(h.unsupported(format!(
            "a denoiser {hidden} wide (`{}` {t:?}): the CoD decoder's width must be a multiple of \
             GroupNorm's {GROUPS} groups",
            h.key(&file_name("decoder_model.t_embedder.mlp.0.weight"))
        )));
    }
    let pixel = shape("decoder_model.y_embedder_x.weight", 4)?[0] / (PATCH * PATCH);
    let embedder = shape("decoder_model.x_embedder.embedder.0.weight", 2)?;
    let dct = embedder[1].saturating_sub(image_channels + pixel);
    let dct_frequencies = dct.isqrt();
    if dct_frequencies * dct_frequencies != dct || dct == 0 {
        return Err(h.unsupported(format!(
            "`{}` is {embedder:?}: after {image_channels} image and {pixel} pixel features, {dct} position \
             features, not the square of a DCT frequency count",
            h.key(&file_name("decoder_model.x_embedder.embedder.0.weight"))
        )));
    }
    let (cond_blocks, cond_ffn) = stack("decoder_model.blocks.")?;
    let pixel_blocks = h.gapless_blocks(
        &file_name("decoder_model.dec_net.res_blocks."),
        &format!("{}'s pixel blocks", family::NAME),
    )?;
    let cod_prefix = "decoder_model.y_embedder.decoder.block.";
    let mut cod = Vec::new();
    for i in
        0..h.gapless_blocks(&file_name(cod_prefix), &format!("{}'s CoD blocks", family::NAME))?
    {
        let has = |part: &str| h.has(&file_name(&format!("{cod_prefix}{i}.{part}.weight")));
        cod.push(match (has("conv1"), has("q")) {
            (true, false) => CodBlock::Resnet,
            (false, true) => CodBlock::Attention,
            _ => {
                return Err(h.unsupported(format!(
                    "`{}`: a CoD decoder block that is neither a ResNet block (`conv1`) nor an attention \
                     block (`q`)",
                    h.key(&file_name(&format!("{cod_prefix}{i}.")))
                )));
            }
        });
    }
    let decoder = DecoderConfig {
        hidden,
        cod,
        blocks: cond_blocks,
        ffn: cond_ffn,
        frequencies: t[1],
        pixel,
        pixel_blocks,
        dct_frequencies,
    };
    let cfg = Config { image_channels, encoder, decoder };
    for e in expected(&cfg) {
        let name = file_name(&e.name);
        let found = shape(&e.name, e.shape.len())?;
        if found != e.shape {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {:?} for {} of encoder widths {}/{} and denoiser widths {}/{}",
                h.key(&name),
                e.shape,
                family::NAME,
                cfg.encoder.head,
                cfg.encoder.hidden,
                cfg.decoder.hidden,
                cfg.decoder.pixel,
            )));
        }
    }
    Ok(Some(cfg))
}

/// The weights of `cfg` from `h`'s file, each under ComfyUI's name (no prefix), read from the file's name.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slots = expected(cfg)
        .into_iter()
        .filter(|e| e.read)
        .map(|e| {
            let key = h.key(&file_name(&e.name));
            SlotPlan::new(e.name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<'a>(list: &'a [Expected], name: &str) -> &'a [usize] {
        &list.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("no {name}")).shape
    }

    #[test]
    fn released_names_and_shapes() {
        let list = expected(&Config::released());
        assert_eq!(shape(&list, "dconv_encoder.patch_cond_embed.weight"), [768, 3, 16, 16]);
        assert_eq!(shape(&list, "dconv_encoder.head_blocks.1.conv2.weight"), [768, 1, 3, 3]);
        assert_eq!(shape(&list, "dconv_encoder.blocks.20.adaLN_modulation.1.weight"), [2304, 384]);
        assert_eq!(shape(&list, "dconv_encoder.proj_out.weight"), [256, 384, 1, 1]);
        assert_eq!(shape(&list, "decoder_model.y_embedder_x.weight"), [8192, 384, 1, 1]);
        assert_eq!(shape(&list, "decoder_model.x_embedder.embedder.0.weight"), [32, 99]);
        assert_eq!(shape(&list, "decoder_model.s_embedder.proj2.weight"), [384, 512, 1, 1]);
        assert_eq!(shape(&list, "decoder_model.dec_net.cond_embed.weight"), [8192, 384]);
        assert_eq!(
            shape(&list, "decoder_model.y_embedder.decoder.block.3.q.weight"),
            [384, 384, 1, 1]
        );
        assert_eq!(
            shape(&list, "decoder_model.y_embedder.decoder.conv_in.weight"),
            [384, 128, 3, 3]
        );
        let unread: Vec<&str> = list.iter().filter(|e| !e.read).map(|e| e.name.as_str()).collect();
        assert_eq!(unread, ["decoder_model.s_embedder.proj1.weight"]);
        assert_eq!(file_name("dconv_encoder.norm_out.bias"), "student.dconv_encoder.norm_out.bias");
        assert_eq!(
            file_name("decoder_model.blocks.0.conv1.weight"),
            "pipeline.blocks.0.conv1.weight"
        );
    }
}
