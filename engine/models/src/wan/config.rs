//! Detection of a Wan 2.1 / 2.2 DiT in either key layout (ComfyUI's, which is the original Wan release's, and
//! diffusers' `WanTransformer3DModel`), its [`Config`] derived from shapes, and the [`LoadPlan`] naming every
//! weight by its ComfyUI name (models-wan-video.md §2.1–§2.3).
//!
//! ComfyUI recognises Wan by `head.modulation` and reads the widths from the shapes but for three it fixes: the
//! head width (128), the text width (4096) and the CLIP width (1280). Kiln reads those from the shapes too
//! (`text_embedding.0.weight`, `img_emb.proj.0.weight`), so a shrunken model of the released structure (the test
//! fixtures) loads. diffusers' names map one to one onto ComfyUI's, but for the two LayerNorms without weights,
//! whose names the layouts swap: ComfyUI's affine cross-attention norm `norm3` is diffusers' `norm2`.
//!
//! Of the Wan-derived models ComfyUI tells apart by an extra tensor, VACE, Fun Camera, HuMo and S2V run;
//! Animate, SCAIL and WanDancer are refused naming what they are. Two are I2V or T2V files marked in their
//! metadata, as ComfyUI reads them: Wan Animate 2 and the causal T2V of Causal Forcing.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use super::s2v::{S2v, s2v_config, s2v_shapes};
use crate::error::Result;
use crate::header::Header;

/// Head width (ComfyUI derives the head count as dim / 128).
pub const HEAD_DIM: usize = 128;
/// LayerNorm and RMSNorm ε of the blocks and the head.
pub const EPS: f32 = 1e-6;
/// LayerNorm ε of the CLIP projection (`img_emb`: torch's default).
pub const IMAGE_EPS: f32 = 1e-5;
/// Patch side in space (ComfyUI's patch size (1, 2, 2): one frame deep).
pub const PATCH: usize = 2;
/// RoPE base θ.
pub const ROPE_THETA: f64 = 10_000.0;

/// A Wan DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Inner width D (last dim of `head.modulation`; 1536, 3072 or 5120).
    pub dim: usize,
    /// Feed-forward width (rows of `blocks.0.ffn.0.weight`).
    pub ffn_dim: usize,
    /// Attention heads (D / [`HEAD_DIM`]).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// Channels the patch embedding reads (the latent's, then the concatenated conditioning's: 16, 36, 48).
    pub in_channels: usize,
    /// Channels the model predicts (rows of `head.head.weight` / 4: 16, or 48 for Wan 2.2 TI2V 5B).
    pub out_channels: usize,
    /// Text feature width (columns of `text_embedding.0.weight`: umT5-XXL's 4096).
    pub text_dim: usize,
    /// Sinusoid width of the timestep embedding (columns of `time_embedding.0.weight`: 256).
    pub freq_dim: usize,
    /// The blocks' norm ε ([`EPS`]).
    pub eps: f32,
    /// The CLIP-vision branch of I2V and FLF2V models (`img_emb`).
    pub image: Option<ImageEmbed>,
    /// The channels of the reference-image convolution of the Fun 1.1 and Wan 2.2 Fun models (`ref_conv`, a
    /// 2×2 stride-2 Conv2d over the reference latent's first frame, whose tokens go before the video's).
    pub ref_channels: Option<usize>,
    /// The VACE branch (video control and editing: `vace_patch_embedding`, `vace_blocks`).
    pub vace: Option<Vace>,
    /// The channels of the camera embedding a Fun Camera model reads (`control_adapter`: 24, Plücker rays of
    /// four frames): each frame pixel-unshuffled by [`CAMERA_UNSHUFFLE`], a 2×2 stride-2 Conv2d and a residual
    /// block, added to the patch tokens.
    pub camera: Option<usize>,
    /// A causal (autoregressive) Wan 2.1 T2V of Causal Forcing or Self-Forcing (ComfyUI's `WAN21_CausalAR_T2V`):
    /// the weights of a T2V model, marked by the file's metadata (`config` → `transformer.causal_ar`). The
    /// `ar_video` sampler runs it a block of frames at a time on its keys and values of the frames before
    /// ([`super::CausalStep`]); any other sampler runs it as a plain T2V model, as ComfyUI does.
    pub causal: bool,
    /// HuMo's audio branch (`audio_proj`, and an audio cross-attention in every block): a Wan 2.1 T2V body
    /// (1.7B, 16 channels in) or one reading 20 more channels (17B), with its reference latent's tokens after
    /// the video's.
    pub humo: Option<Humo>,
    /// Wan 2.2 S2V's parts (speech to video: `casual_audio_encoder`, the audio injectors, the frame packer of
    /// the motion latent, `cond_encoder` of the control video) on a Wan 2.1 T2V body.
    pub s2v: Option<S2v>,
    /// Wan Animate 2 (ComfyUI's `WAN_Animate2`): the weights of a Wan 2.1 I2V model, marked by the file's
    /// metadata (`config` → `transformer.model_type` `animate2`), run with a pose branch over the driving
    /// video's latents that feeds every block's self-attention its keys and values ([`super::animate2`]).
    pub animate2: bool,
    /// WanDancer's parts (ComfyUI's `WAN22_WanDancer`, marked by `patch_embedding_global`) on a Wan 2.1 I2V
    /// body: the music encoder and injectors, a second patch embedding and head for music at another frame
    /// rate, and a second CLIP projection for the reference image ([`super::dancer`]).
    pub dancer: Option<Dancer>,
}

/// WanDancer's music branch, from its weights' shapes: `music_projection` turns each frame's music features
/// into `width`-wide tokens, `layers` encoder layers (4 heads, RoPE over the frames) run over them, and
/// `injectors` cross-attentions add them to the video tokens after blocks 0, 4, 8, 12, 16, 20, 24 and 27.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dancer {
    /// Music features per frame (35: onset, 20 MFCCs, 12 chroma, peak, beat).
    pub features: usize,
    /// Width of the music encoder (256).
    pub width: usize,
    /// Feed-forward width of its layers (1024).
    pub ffn: usize,
    /// Its layers (2).
    pub layers: usize,
    /// Music injectors (8).
    pub injectors: usize,
    /// CLIP feature width of the reference image's projection (`img_emb_refimage`: 1280).
    pub clip_dim: usize,
}

impl Dancer {
    /// The music encoder's heads (ComfyUI builds it with 4; the weights do not say).
    pub const HEADS: usize = 4;
    /// The blocks after which the injectors run, in order (ComfyUI's `audio_inject_layers`).
    pub const INJECTED_BLOCKS: [usize; 8] = [0, 4, 8, 12, 16, 20, 24, 27];
}

/// HuMo's audio branch: `audio_proj` turns each latent frame's window of Whisper features (8 feature frames of
/// 5 layer groups, `channels` wide) into `tokens` audio tokens `audio_dim` wide, which every block's
/// `audio_cross_attn_wrapper` reads, each latent frame's video tokens attending to that frame's audio tokens
/// only (ComfyUI's `HumoWanModel`, `AudioProjModel`, `WanT2VCrossAttentionGather`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Humo {
    /// Width of one feature (Whisper large-v3's 1280).
    pub channels: usize,
    /// Width of the projection's hidden layers (512).
    pub hidden: usize,
    /// Width of an audio token (1536).
    pub audio_dim: usize,
    /// Audio tokens per latent frame (16).
    pub tokens: usize,
}

impl Humo {
    /// Feature frames in one latent frame's window (ComfyUI's `seq_len`).
    pub const WINDOW: usize = 8;
    /// Layer groups of a feature (ComfyUI's `blocks`: four means of 8 Whisper layers and the last state).
    pub const GROUPS: usize = 5;

    /// The width `audio_proj` reads per latent frame.
    pub fn input_width(&self) -> usize {
        Self::WINDOW * Self::GROUPS * self.channels
    }
}

/// The pixel-unshuffle factor of the camera adapter (the camera embedding is at pixel resolution, the latent
/// at 1/8).
pub const CAMERA_UNSHUFFLE: usize = 8;

/// The VACE branch of a Wan VACE model: its control context is patch-embedded, then run through its own blocks
/// beside every `layers / blocks`-th main block, each adding its output (after `after_proj`, times the
/// context's strength) to the main stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vace {
    /// Channels of the control context (96: inactive and reactive latents, 16 each, and 64 mask channels).
    pub in_channels: usize,
    /// VACE blocks.
    pub blocks: usize,
}

impl Vace {
    /// The VACE block that runs after main block `i` of a model of `layers` blocks (ComfyUI's
    /// `vace_layers_mapping`: every `layers / blocks`-th block from the first).
    pub fn block_after(&self, i: usize, layers: usize) -> Option<usize> {
        let step = (layers / self.blocks.max(1)).max(1);
        (i.is_multiple_of(step) && i / step < self.blocks).then_some(i / step)
    }
}

/// The CLIP-vision branch of an I2V or FLF2V model: `img_emb`, and `k_img`/`v_img` in every block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageEmbed {
    /// CLIP feature width (of `img_emb.proj.0.weight`: CLIP-ViT-H's 1280).
    pub clip_dim: usize,
    /// The tokens of `img_emb.emb_pos` (FLF2V's 514: two images' 257), if the model has it.
    pub pos_tokens: Option<usize>,
}

impl Config {
    /// Whether this is ComfyUI's `WAN22_T2V` entry (Wan 2.2 TI2V 5B: no CLIP branch, 48 channels out), which
    /// denoises in the Wan 2.2 VAE's latent space with per-frame timesteps; every other Wan file is a `WAN21`
    /// model in the Wan 2.1 VAE's space (the 2.2 A14B experts included).
    pub fn is_wan22(&self) -> bool {
        self.image.is_none() && self.out_channels == WAN22_CHANNELS
    }

    /// Whether this is a Wan 2.1 image-to-video model (ComfyUI's `model_type` `i2v`): the CLIP branch without
    /// FLF2V's position table, 36 channels in, no other branch.
    pub fn is_wan21_i2v(&self) -> bool {
        matches!(self.image, Some(ImageEmbed { pos_tokens: None, .. }))
            && self.in_channels == I2V_CHANNELS
            && self.out_channels != WAN22_CHANNELS
            && self.vace.is_none()
            && self.camera.is_none()
            && self.ref_channels.is_none()
            && self.humo.is_none()
            && self.s2v.is_none()
            && self.dancer.is_none()
    }

    /// Whether this is a plain text-to-video `WAN21` model (ComfyUI's `model_type` `t2v` outside Wan 2.2 TI2V
    /// 5B): no CLIP branch, no conditioning channels, no VACE, camera or reference convolution.
    pub fn is_wan21_t2v(&self) -> bool {
        !self.is_wan22()
            && self.image.is_none()
            && self.in_channels == self.out_channels
            && self.vace.is_none()
            && self.camera.is_none()
            && self.ref_channels.is_none()
            && self.humo.is_none()
            && self.s2v.is_none()
            && self.dancer.is_none()
    }

    /// The channels the model reads beside the noisy latent (ComfyUI's `concat_cond`): mask and image latent,
    /// 20 for I2V, FLF2V and the 2.2 I2V experts; 0 for T2V and TI2V 5B.
    pub fn concat_channels(&self) -> usize {
        self.in_channels.saturating_sub(self.out_channels)
    }

    /// Whether ComfyUI builds the model with `image_to_video` (how `concat_cond` treats a conditioning without
    /// the 4 mask channels): the 2.1 I2V/FLF2V models (CLIP branch, 36 channels in) and TI2V 5B.
    pub fn image_to_video(&self) -> bool {
        self.is_wan22() || (self.image.is_some() && self.in_channels == I2V_CHANNELS)
    }

    /// The released variant this config is, in words (`Wan 2.1 T2V`, `Wan 2.2 TI2V 5B`, ...).
    pub fn variant(&self) -> &'static str {
        match (self.image, self.in_channels) {
            _ if self.dancer.is_some() => "WanDancer",
            (None, _) if self.s2v.is_some() => "Wan 2.2 S2V",
            (Some(_), _) if self.animate2 => "Wan Animate 2",
            (None, I2V_CHANNELS) if self.humo.is_some() => "HuMo 17B",
            (None, _) if self.humo.is_some() => "HuMo 1.7B",
            (Some(_), _) if self.camera.is_some() => "Wan 2.1 Fun Camera",
            (None, _) if self.camera.is_some() => "Wan 2.2 Fun Camera",
            (Some(ImageEmbed { pos_tokens: Some(_), .. }), _) => "Wan 2.1 FLF2V",
            (Some(_), I2V_CHANNELS) => "Wan 2.1 I2V",
            (Some(_), _) => "Wan 2.1 Fun",
            (None, _) if self.vace.is_some() => "Wan 2.1 VACE",
            (None, _) if self.is_wan22() && self.in_channels > WAN22_CHANNELS => "Wan 2.2 Fun 5B",
            (None, _) if self.is_wan22() => "Wan 2.2 TI2V 5B",
            (None, _) if self.ref_channels.is_some() => "Wan 2.2 Fun",
            (None, _) if self.causal => "Wan 2.1 causal T2V",
            (None, I2V_CHANNELS) => "Wan 2.2 I2V",
            (None, _) => "Wan T2V",
        }
    }
}

/// The output channels of Wan 2.2 TI2V 5B (the Wan 2.2 VAE's latent).
const WAN22_CHANNELS: usize = 48;
/// The input channels of an I2V model: latent 16, mask 4, image latent 16.
const I2V_CHANNELS: usize = 36;

/// The key layout of a Wan file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's and the original Wan release's (`blocks.0.self_attn.q`, `head.modulation`).
    Comfy,
    /// diffusers' `WanTransformer3DModel` (`blocks.0.attn1.to_q`, `scale_shift_table`).
    Diffusers,
}

impl Layout {
    /// The layout's name in messages.
    fn name(self) -> &'static str {
        match self {
            Layout::Comfy => "ComfyUI's",
            Layout::Diffusers => "diffusers'",
        }
    }
}

/// The weights outside the blocks, by ComfyUI name, with their shapes for `cfg`.
fn global_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let mut out: Vec<(&str, Vec<usize>)> = vec![
        ("patch_embedding.weight", vec![d, cfg.in_channels, 1, PATCH, PATCH]),
        ("patch_embedding.bias", vec![d]),
        ("text_embedding.0.weight", vec![d, cfg.text_dim]),
        ("text_embedding.0.bias", vec![d]),
        ("text_embedding.2.weight", vec![d, d]),
        ("text_embedding.2.bias", vec![d]),
        ("time_embedding.0.weight", vec![d, cfg.freq_dim]),
        ("time_embedding.0.bias", vec![d]),
        ("time_embedding.2.weight", vec![d, d]),
        ("time_embedding.2.bias", vec![d]),
        ("time_projection.1.weight", vec![6 * d, d]),
        ("time_projection.1.bias", vec![6 * d]),
        ("head.modulation", vec![1, 2, d]),
        ("head.head.weight", vec![PATCH * PATCH * cfg.out_channels, d]),
        ("head.head.bias", vec![PATCH * PATCH * cfg.out_channels]),
    ];
    if let Some(ImageEmbed { clip_dim: c, pos_tokens: Some(tokens) }) = cfg.image {
        out.push(("img_emb.emb_pos", vec![1, tokens, c]));
    }
    if let Some(c) = cfg.ref_channels {
        out.extend([("ref_conv.weight", vec![d, c, PATCH, PATCH]), ("ref_conv.bias", vec![d])]);
    }
    if let Some(vace) = cfg.vace {
        out.extend([
            ("vace_patch_embedding.weight", vec![d, vace.in_channels, 1, PATCH, PATCH]),
            ("vace_patch_embedding.bias", vec![d]),
        ]);
    }
    if let Some(c) = cfg.camera {
        out.extend(camera_adapter_shapes(d, c));
    }
    if let Some(h) = cfg.humo {
        out.extend([
            ("audio_proj.audio_proj_glob_1.layer.weight", vec![h.hidden, h.input_width()]),
            ("audio_proj.audio_proj_glob_1.layer.bias", vec![h.hidden]),
            ("audio_proj.audio_proj_glob_2.layer.weight", vec![h.hidden, h.hidden]),
            ("audio_proj.audio_proj_glob_2.layer.bias", vec![h.hidden]),
            ("audio_proj.audio_proj_glob_3.layer.weight", vec![h.tokens * h.audio_dim, h.hidden]),
            ("audio_proj.audio_proj_glob_3.layer.bias", vec![h.tokens * h.audio_dim]),
            ("audio_proj.audio_proj_glob_norm.layer.weight", vec![h.audio_dim]),
            ("audio_proj.audio_proj_glob_norm.layer.bias", vec![h.audio_dim]),
        ]);
    }
    let mut out: Vec<(String, Vec<usize>)> =
        out.into_iter().map(|(name, shape)| (name.to_owned(), shape)).collect();
    if let Some(image) = cfg.image {
        out.extend(clip_projection_shapes("img_emb", image.clip_dim, d));
    }
    if let Some(s2v) = cfg.s2v {
        out.extend(s2v_shapes(d, &s2v));
    }
    if let Some(dancer) = cfg.dancer {
        out.extend(dancer_shapes(cfg, &dancer));
    }
    out
}

/// The CLIP projection (ComfyUI's `MLPProj`: LayerNorm, Linear, GELU, Linear, LayerNorm) under `prefix`, from
/// `clip` features to the model's width `d`, in the order the model reads them.
fn clip_projection_shapes(prefix: &str, clip: usize, d: usize) -> Vec<(String, Vec<usize>)> {
    [
        ("0.weight", vec![clip]),
        ("0.bias", vec![clip]),
        ("1.weight", vec![clip, clip]),
        ("1.bias", vec![clip]),
        ("3.weight", vec![d, clip]),
        ("3.bias", vec![d]),
        ("4.weight", vec![d]),
        ("4.bias", vec![d]),
    ]
    .into_iter()
    .map(|(name, shape)| (format!("{prefix}.proj.{name}"), shape))
    .collect()
}

/// WanDancer's weights outside the blocks, by ComfyUI name (the released files' `in_proj` of each music
/// encoder layer, which ComfyUI splits into q, k and v at load), with their shapes.
fn dancer_shapes(cfg: &Config, dancer: &Dancer) -> Vec<(String, Vec<usize>)> {
    let (d, w) = (cfg.dim, dancer.width);
    let mut out = vec![
        ("patch_embedding_global.weight".to_owned(), vec![d, cfg.in_channels, 1, PATCH, PATCH]),
        ("patch_embedding_global.bias".to_owned(), vec![d]),
        ("head_global.modulation".to_owned(), vec![1, 2, d]),
        ("head_global.head.weight".to_owned(), vec![PATCH * PATCH * cfg.out_channels, d]),
        ("head_global.head.bias".to_owned(), vec![PATCH * PATCH * cfg.out_channels]),
        ("music_projection.weight".to_owned(), vec![w, dancer.features]),
        ("music_projection.bias".to_owned(), vec![w]),
    ];
    out.extend(clip_projection_shapes("img_emb_refimage", dancer.clip_dim, d));
    for l in 0..dancer.layers {
        let layer = |name: &str| format!("music_encoder.{l}.{name}");
        out.extend([
            (layer("self_attn.in_proj_weight"), vec![3 * w, w]),
            (layer("self_attn.in_proj_bias"), vec![3 * w]),
            (layer("self_attn.out_proj.weight"), vec![w, w]),
            (layer("self_attn.out_proj.bias"), vec![w]),
            (layer("linear1.weight"), vec![dancer.ffn, w]),
            (layer("linear1.bias"), vec![dancer.ffn]),
            (layer("linear2.weight"), vec![w, dancer.ffn]),
            (layer("linear2.bias"), vec![w]),
            (layer("norm1.weight"), vec![w]),
            (layer("norm1.bias"), vec![w]),
            (layer("norm2.weight"), vec![w]),
            (layer("norm2.bias"), vec![w]),
        ]);
    }
    for j in 0..dancer.injectors {
        let injector = |name: &str| format!("music_injector.injector.{j}.{name}");
        for p in ["q", "k", "v", "o"] {
            out.push((injector(&format!("{p}.weight")), vec![d, d]));
            out.push((injector(&format!("{p}.bias")), vec![d]));
        }
        out.push((injector("norm_q.weight"), vec![d]));
        out.push((injector("norm_k.weight"), vec![d]));
    }
    out
}

/// WanDancer's music branch from the shapes (`patch_embedding_global` marks it, as in ComfyUI's detection),
/// `None` for a model without it.
fn dancer_config(h: &Header) -> Result<Option<Dancer>> {
    const PROJECTION: &str = "music_projection.weight";
    const LINEAR1: &str = "music_encoder.0.linear1.weight";
    const REFERENCE: &str = "img_emb_refimage.proj.0.weight";
    if !h.has("patch_embedding_global.weight") {
        return Ok(None);
    }
    let (layers, injectors) =
        (h.count_blocks("music_encoder."), h.count_blocks("music_injector.injector."));
    match (h.shape(PROJECTION), h.shape(LINEAR1), h.shape(REFERENCE)) {
        (Some(&[width, features]), Some(&[ffn, _]), Some(&[clip_dim]))
            if width > 0
                && width.is_multiple_of(2 * Dancer::HEADS)
                && layers > 0
                && injectors <= Dancer::INJECTED_BLOCKS.len() =>
        {
            Ok(Some(Dancer { features, width, ffn, layers, injectors, clip_dim }))
        }
        (projection, linear1, reference) => Err(h.unsupported(format!(
            "a WanDancer model whose `{PROJECTION}` is {projection:?}, `{LINEAR1}` {linear1:?} and \
             `{REFERENCE}` {reference:?}, with {layers} music encoder layers and {injectors} injectors: \
             expected [width, features] with the width a multiple of {}, [ffn, width], [clip width], at least \
             one layer and at most {} injectors",
            2 * Dancer::HEADS,
            Dancer::INJECTED_BLOCKS.len()
        ))),
    }
}

/// The camera adapter's weights (ComfyUI's `WanCamAdapter` with one residual block), in the order the model
/// reads them.
pub(crate) fn camera_adapter_shapes(d: usize, channels: usize) -> [(&'static str, Vec<usize>); 6] {
    let unshuffled = channels * CAMERA_UNSHUFFLE * CAMERA_UNSHUFFLE;
    [
        ("control_adapter.conv.weight", vec![d, unshuffled, PATCH, PATCH]),
        ("control_adapter.conv.bias", vec![d]),
        ("control_adapter.residual_blocks.0.conv1.weight", vec![d, d, 3, 3]),
        ("control_adapter.residual_blocks.0.conv1.bias", vec![d]),
        ("control_adapter.residual_blocks.0.conv2.weight", vec![d, d, 3, 3]),
        ("control_adapter.residual_blocks.0.conv2.bias", vec![d]),
    ]
}

/// The weights of block `i`, by ComfyUI name, with their shapes for `cfg`, in the order the model reads them
/// ([`super::model`] indexes them by position).
pub(crate) fn block_shapes(cfg: &Config, i: usize) -> Vec<(String, Vec<usize>)> {
    let prefix = format!("blocks.{i}");
    let mut out = block_shapes_under(cfg, &prefix, cfg.image.is_some());
    if let Some(humo) = cfg.humo {
        out.extend(audio_attention_shapes(cfg.dim, humo.audio_dim, &prefix));
    }
    out
}

/// Where a HuMo block keeps its audio cross-attention.
pub(crate) const AUDIO_ATTENTION: &str = "audio_cross_attn_wrapper";

/// A HuMo block's audio cross-attention under `prefix`, in the order the model reads them: the LayerNorm
/// before it, then q, k, v, o and the q/k RMSNorms.
fn audio_attention_shapes(d: usize, audio_dim: usize, prefix: &str) -> Vec<(String, Vec<usize>)> {
    let attn = format!("{prefix}.{AUDIO_ATTENTION}.audio_cross_attn");
    let mut out = vec![
        (format!("{prefix}.{AUDIO_ATTENTION}.norm1_audio.weight"), vec![d]),
        (format!("{prefix}.{AUDIO_ATTENTION}.norm1_audio.bias"), vec![d]),
    ];
    for (p, cols) in [("q", d), ("k", audio_dim), ("v", audio_dim), ("o", d)] {
        out.push((format!("{attn}.{p}.weight"), vec![d, cols]));
        out.push((format!("{attn}.{p}.bias"), vec![d]));
    }
    out.push((format!("{attn}.norm_q.weight"), vec![d]));
    out.push((format!("{attn}.norm_k.weight"), vec![d]));
    out
}

/// The weights of VACE block `n`, by ComfyUI name, with their shapes for `cfg`: a main block's without the
/// image attention, then `before_proj` (block 0 only) and `after_proj`, in the order the model reads them.
pub(crate) fn vace_block_shapes(cfg: &Config, n: usize) -> Vec<(String, Vec<usize>)> {
    let prefix = format!("vace_blocks.{n}");
    let mut out = block_shapes_under(cfg, &prefix, false);
    let d = cfg.dim;
    let projections: &[&str] =
        if n == 0 { &["before_proj", "after_proj"] } else { &["after_proj"] };
    for proj in projections {
        out.push((format!("{prefix}.{proj}.weight"), vec![d, d]));
        out.push((format!("{prefix}.{proj}.bias"), vec![d]));
    }
    out
}

/// A block's weights under `prefix`, with the image attention when `image`.
fn block_shapes_under(cfg: &Config, prefix: &str, image: bool) -> Vec<(String, Vec<usize>)> {
    let (d, f) = (cfg.dim, cfg.ffn_dim);
    let mut out: Vec<(String, Vec<usize>)> = vec![("modulation".to_owned(), vec![1, 6, d])];
    let mut linear = |name: &str, rows: usize, cols: usize| {
        out.push((format!("{name}.weight"), vec![rows, cols]));
        out.push((format!("{name}.bias"), vec![rows]));
    };
    for attn in ["self_attn", "cross_attn"] {
        for p in ["q", "k", "v", "o"] {
            linear(&format!("{attn}.{p}"), d, d);
        }
    }
    if image {
        linear("cross_attn.k_img", d, d);
        linear("cross_attn.v_img", d, d);
    }
    linear("ffn.0", f, d);
    linear("ffn.2", d, f);
    for norm in ["self_attn.norm_q", "self_attn.norm_k", "cross_attn.norm_q", "cross_attn.norm_k"] {
        out.push((format!("{norm}.weight"), vec![d]));
    }
    if image {
        out.push(("cross_attn.norm_k_img.weight".to_owned(), vec![d]));
    }
    out.push(("norm3.weight".to_owned(), vec![d]));
    out.push(("norm3.bias".to_owned(), vec![d]));
    out.into_iter().map(|(name, shape)| (format!("{prefix}.{name}"), shape)).collect()
}

/// Every weight of `cfg` by its ComfyUI name with its shape: the globals, then each block's (what a loaded model
/// has, and what `kiln model synth` writes).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut all = global_shapes(cfg);
    for i in 0..cfg.layers {
        all.extend(block_shapes(cfg, i));
    }
    for n in 0..cfg.vace.map_or(0, |v| v.blocks) {
        all.extend(vace_block_shapes(cfg, n));
    }
    all
}

/// The diffusers name of the ComfyUI weight `name` (models-wan-video.md §2.3).
fn diffusers_name(name: &str) -> String {
    const GLOBALS: [(&str, &str); 12] = [
        ("patch_embedding.", "patch_embedding."),
        ("text_embedding.0.", "condition_embedder.text_embedder.linear_1."),
        ("text_embedding.2.", "condition_embedder.text_embedder.linear_2."),
        ("time_embedding.0.", "condition_embedder.time_embedder.linear_1."),
        ("time_embedding.2.", "condition_embedder.time_embedder.linear_2."),
        ("time_projection.1.", "condition_embedder.time_proj."),
        ("head.head.", "proj_out."),
        ("head.modulation", "scale_shift_table"),
        ("img_emb.proj.0.", "condition_embedder.image_embedder.norm1."),
        ("img_emb.proj.1.", "condition_embedder.image_embedder.ff.net.0.proj."),
        ("img_emb.proj.3.", "condition_embedder.image_embedder.ff.net.2."),
        ("img_emb.proj.4.", "condition_embedder.image_embedder.norm2."),
    ];
    const BLOCK: [(&str, &str); 19] = [
        ("modulation", "scale_shift_table"),
        ("self_attn.q.", "attn1.to_q."),
        ("self_attn.k.", "attn1.to_k."),
        ("self_attn.v.", "attn1.to_v."),
        ("self_attn.o.", "attn1.to_out.0."),
        ("self_attn.norm_q.", "attn1.norm_q."),
        ("self_attn.norm_k.", "attn1.norm_k."),
        ("cross_attn.q.", "attn2.to_q."),
        ("cross_attn.k.", "attn2.to_k."),
        ("cross_attn.v.", "attn2.to_v."),
        ("cross_attn.o.", "attn2.to_out.0."),
        ("cross_attn.norm_q.", "attn2.norm_q."),
        ("cross_attn.norm_k.", "attn2.norm_k."),
        ("cross_attn.k_img.", "attn2.add_k_proj."),
        ("cross_attn.v_img.", "attn2.add_v_proj."),
        ("cross_attn.norm_k_img.", "attn2.norm_added_k."),
        ("norm3.", "norm2."),
        ("ffn.0.", "ffn.net.0.proj."),
        ("ffn.2.", "ffn.net.2."),
    ];
    if name == "img_emb.emb_pos" {
        return "condition_embedder.image_embedder.pos_embed".to_owned();
    }
    let renamed = |rest: &str, table: &[(&str, &str)]| {
        table
            .iter()
            .find_map(|(comfy, diff)| rest.strip_prefix(comfy).map(|tail| format!("{diff}{tail}")))
    };
    if let Some(rest) = name.strip_prefix("blocks.")
        && let Some((i, rest)) = rest.split_once('.')
    {
        let tail = renamed(rest, &BLOCK).unwrap_or_else(|| rest.to_owned());
        return format!("blocks.{i}.{tail}");
    }
    renamed(name, &GLOBALS).unwrap_or_else(|| name.to_owned())
}

/// The name of the ComfyUI weight `name` in a file of `layout`.
fn file_name(name: &str, layout: Layout) -> String {
    match layout {
        Layout::Comfy => name.to_owned(),
        Layout::Diffusers => diffusers_name(name),
    }
}

/// The Wan-derived models ComfyUI detects by a tensor of their own, which Kiln does not run: (tensor, what).
const DERIVED: [(&str, &str); 3] = [
    ("face_adapter.fuser_blocks.0.k_norm.weight", "a Wan 2.2 Animate model"),
    ("patch_embedding_mask.weight", "a SCAIL-2 model"),
    ("patch_embedding_pose.weight", "a SCAIL model"),
];

/// The layout of a Wan DiT in `h`, if it is one.
fn layout_of(h: &Header) -> Option<Layout> {
    if h.has("head.modulation") {
        Some(Layout::Comfy)
    } else if h.has("scale_shift_table")
        && h.has("condition_embedder.time_proj.weight")
        && h.has("blocks.0.attn1.to_q.weight")
    {
        Some(Layout::Diffusers)
    } else {
        None
    }
}

/// A tensor's shape, which must exist.
fn shape<'h>(h: &'h Header, name: &str) -> Result<&'h [usize]> {
    Ok(h.require(name)?.shape.as_slice())
}

/// Recognises a Wan 2.1 / 2.2 DiT (`Ok(None)` for a file of another family): its config and key layout. A
/// Wan-derived model Kiln does not run (S2V, Animate, ...) is [`crate::Error::Unsupported`] naming it.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let Some(layout) = layout_of(h) else { return Ok(None) };
    for (tensor, what) in DERIVED {
        if h.has(tensor) {
            return Err(h.unsupported(format!(
                "{what} (it has `{}`), which Kiln does not run yet",
                h.key(tensor)
            )));
        }
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let name = |comfy: &str| file_name(comfy, layout);
    let matrix = |comfy: &str| -> Result<(usize, usize)> {
        let file = name(comfy);
        match h.values_shape(&file).as_deref() {
            Some(&[rows, cols]) => Ok((rows, cols)),
            Some(other) => {
                Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(&file))))
            }
            None => Err(h.unsupported(format!("no tensor `{}`", h.key(&file)))),
        }
    };
    let dim = match *shape(h, &name("head.modulation"))? {
        [1, 2, dim] => dim,
        ref other => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, expected [1, 2, dim]",
                h.key(&name("head.modulation"))
            )));
        }
    };
    let in_channels = match *shape(h, &name("patch_embedding.weight"))? {
        [_, c, 1, PATCH, PATCH] => c,
        ref other => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, expected [dim, channels, 1, 2, 2]",
                h.key(&name("patch_embedding.weight"))
            )));
        }
    };
    let (head_rows, _) = matrix("head.head.weight")?;
    let (ffn_dim, _) = matrix("blocks.0.ffn.0.weight")?;
    let (_, text_dim) = matrix("text_embedding.0.weight")?;
    let (_, freq_dim) = matrix("time_embedding.0.weight")?;
    let layers = h.count_blocks("blocks.");
    let image = if h.has(&name("img_emb.proj.0.weight")) {
        let clip_dim = match *shape(h, &name("img_emb.proj.0.weight"))? {
            [c] => c,
            ref other => {
                return Err(h.unsupported(format!(
                    "`{}` is {other:?}, not a vector",
                    h.key(&name("img_emb.proj.0.weight"))
                )));
            }
        };
        let pos_tokens = match h.shape(&name("img_emb.emb_pos")) {
            None => None,
            Some(&[1, tokens, _]) => Some(tokens),
            Some(other) => {
                return Err(h.unsupported(format!(
                    "`{}` is {other:?}, expected [1, tokens, {clip_dim}]",
                    h.key(&name("img_emb.emb_pos"))
                )));
            }
        };
        Some(ImageEmbed { clip_dim, pos_tokens })
    } else {
        None
    };
    if dim == 0
        || !dim.is_multiple_of(HEAD_DIM)
        || layers == 0
        || !head_rows.is_multiple_of(PATCH * PATCH)
        || freq_dim == 0
        || !freq_dim.is_multiple_of(2)
    {
        return Err(h.unsupported(format!(
            "a Wan layout with width {dim}, {layers} blocks, {head_rows} head outputs and a {freq_dim}-wide \
             timestep sinusoid: the width must be a multiple of {HEAD_DIM}, the head outputs of {}, the \
             sinusoid even",
            PATCH * PATCH
        )));
    }
    let ref_channels = match h.shape(&name("ref_conv.weight")) {
        None => None,
        Some(&[_, c, PATCH, PATCH]) => Some(c),
        Some(other) => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, expected [dim, channels, 2, 2]",
                h.key(&name("ref_conv.weight"))
            )));
        }
    };
    let unshuffle = CAMERA_UNSHUFFLE * CAMERA_UNSHUFFLE;
    let camera = match h.shape(&name("control_adapter.conv.weight")) {
        None => None,
        Some(&[_, c, PATCH, PATCH]) if c % unshuffle == 0 => Some(c / unshuffle),
        Some(other) => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, expected [dim, channels × {unshuffle}, 2, 2]",
                h.key(&name("control_adapter.conv.weight"))
            )));
        }
    };
    let vace = match h.shape(&name("vace_patch_embedding.weight")) {
        None => None,
        Some(&[_, c, 1, PATCH, PATCH]) => {
            Some(Vace { in_channels: c, blocks: h.count_blocks("vace_blocks.") })
        }
        Some(other) => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, expected [dim, channels, 1, 2, 2]",
                h.key(&name("vace_patch_embedding.weight"))
            )));
        }
    };
    let humo = humo_config(h)?;
    let s2v = s2v_config(h, dim)?;
    let dancer = dancer_config(h)?;
    if vace.is_some_and(|v| v.blocks == 0 || v.blocks > layers) {
        return Err(h.unsupported(format!(
            "a Wan VACE model with {} VACE blocks for {layers} blocks",
            vace.map_or(0, |v| v.blocks)
        )));
    }
    let cfg = Config {
        dim,
        ffn_dim,
        heads: dim / HEAD_DIM,
        layers,
        in_channels,
        out_channels: head_rows / (PATCH * PATCH),
        text_dim,
        freq_dim,
        eps: EPS,
        image,
        ref_channels,
        vace,
        camera,
        causal: false,
        humo,
        s2v,
        animate2: false,
        dancer,
    };
    // ComfyUI's causal entry is a Wan 2.1 `t2v` model: a mark on any other keeps it what it is.
    let cfg = Config { causal: causal_marked(h) && cfg.is_wan21_t2v(), ..cfg };
    // ComfyUI's Animate 2 entry builds an I2V model: a mark on any other keeps it what it is.
    let cfg = Config { animate2: animate2_marked(h) && cfg.is_wan21_i2v(), ..cfg };
    if cfg.image.is_some() && !matches!((in_channels, camera), (36 | 48, _) | (32, Some(_))) {
        return Err(h.unsupported(format!(
            "a Wan model with a CLIP branch and {in_channels} input channels (ComfyUI runs 36, I2V, 48, Fun \
             Control, and 32, Fun Camera)"
        )));
    }
    for (comfy, want) in expected_shapes(&cfg) {
        let file = name(&comfy);
        let found = match split_in_proj(h, &comfy) {
            Some(parts) => joined_shape(h, &parts),
            None => h.values_shape(&file),
        };
        let Some(found) = found else {
            return Err(h.unsupported(format!(
                "no tensor `{}` (a {} in {} layout has it)",
                h.key(&file),
                cfg.variant(),
                layout.name()
            )));
        };
        if found != want {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for a {} of width {dim}",
                h.key(&file),
                cfg.variant()
            )));
        }
    }
    Ok(Some((cfg, layout)))
}

/// HuMo's audio branch from the shapes of `audio_proj` (ComfyUI's detection key: `audio_proj_glob_1`'s bias),
/// `None` for a model without it.
fn humo_config(h: &Header) -> Result<Option<Humo>> {
    const FIRST: &str = "audio_proj.audio_proj_glob_1.layer.weight";
    const LAST: &str = "audio_proj.audio_proj_glob_3.layer.weight";
    const NORM: &str = "audio_proj.audio_proj_glob_norm.layer.weight";
    if !h.has("audio_proj.audio_proj_glob_1.layer.bias") {
        return Ok(None);
    }
    let window = Humo::WINDOW * Humo::GROUPS;
    match (h.shape(FIRST), h.shape(LAST), h.shape(NORM)) {
        (Some(&[hidden, input]), Some(&[out, _]), Some(&[audio_dim]))
            if input % window == 0 && audio_dim > 0 && out % audio_dim == 0 =>
        {
            Ok(Some(Humo { channels: input / window, hidden, audio_dim, tokens: out / audio_dim }))
        }
        (first, last, norm) => Err(h.unsupported(format!(
            "a HuMo audio projection of `{FIRST}` {first:?}, `{LAST}` {last:?} and `{NORM}` {norm:?}: expected \
             [hidden, {window}·channels], [tokens·width, hidden] and [width]"
        ))),
    }
}

/// The metadata key whose JSON's `transformer` object ComfyUI merges into a Wan file's detected config.
const METADATA_CONFIG: &str = "config";

/// The metadata entry that marks a causal model, as the Causal Forcing files carry it (what `kiln model synth`
/// writes for one).
pub fn causal_metadata() -> (String, String) {
    let config = serde_json::json!({"transformer": {"causal_ar": true}});
    (METADATA_CONFIG.to_owned(), config.to_string())
}

/// The metadata entry that marks a Wan Animate 2 model, as its released files carry it (what `kiln model synth`
/// writes for one).
pub fn animate2_metadata() -> (String, String) {
    let config = serde_json::json!({"transformer": {"model_type": "animate2"}});
    (METADATA_CONFIG.to_owned(), config.to_string())
}

/// Whether the file's metadata marks a Wan Animate 2 model: `config` → `transformer.model_type` `animate2`.
fn animate2_marked(h: &Header) -> bool {
    metadata_config(h)
        .and_then(|config| {
            config.pointer("/transformer/model_type").and_then(|v| v.as_str().map(str::to_owned))
        })
        .is_some_and(|t| t == "animate2")
}

/// The JSON of the file's `config` metadata, if it has one that parses.
fn metadata_config(h: &Header) -> Option<serde_json::Value> {
    h.metadata(METADATA_CONFIG)
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
}

/// Whether the file's metadata marks a causal (autoregressive) model: `config` → `transformer.causal_ar` true, as
/// the Causal Forcing files ComfyUI runs carry it.
fn causal_marked(h: &Header) -> bool {
    metadata_config(h)
        .and_then(|config| config.pointer("/transformer/causal_ar").and_then(|v| v.as_bool()))
        .unwrap_or(false)
}

/// Every weight by its ComfyUI name, read from the file's tensor of that weight in `layout` (a WanDancer music
/// layer's `in_proj` from its q, k and v, joined, where the file holds them apart).
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = expected_shapes(cfg)
        .into_iter()
        .map(|(name, _)| {
            let parts = match split_in_proj(h, &name) {
                Some(parts) => parts.iter().map(|part| (0, h.key(part))).collect(),
                None => vec![(0, h.key(&file_name(&name, layout)))],
            };
            SlotPlan::new(name, parts)
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The q, k and v tensors a WanDancer music layer's `self_attn.in_proj_weight` / `in_proj_bias` `name` is made of
/// in a file that holds them apart (as ComfyUI saves the model: its `process_unet_state_dict` splits a released
/// file's `in_proj`); `None` for any other weight, or a file that holds `in_proj` itself.
fn split_in_proj(h: &Header, name: &str) -> Option<[String; 3]> {
    let (layer, suffix) = name.strip_prefix("music_encoder.")?.split_once(".self_attn.in_proj_")?;
    if h.has(name) {
        return None;
    }
    let parts =
        ["q", "k", "v"].map(|p| format!("music_encoder.{layer}.self_attn.{p}_proj.{suffix}"));
    parts.iter().all(|part| h.has(part)).then_some(parts)
}

/// The shape of `parts` joined along their first dimension, if each exists and the rest of their shapes agree.
fn joined_shape(h: &Header, parts: &[String]) -> Option<Vec<usize>> {
    let shapes: Vec<&[usize]> = parts.iter().map(|p| h.shape(p)).collect::<Option<_>>()?;
    let (first, rest) = shapes.split_first()?;
    let tail = first.get(1..)?;
    if rest.iter().any(|s| s.get(1..) != Some(tail)) {
        return None;
    }
    let rows = shapes.iter().map(|s| s.first().copied()).sum::<Option<usize>>()?;
    Some([&[rows][..], tail].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_names_swap_the_norms_and_rename_the_rest() {
        for (comfy, diffusers) in [
            ("blocks.3.norm3.weight", "blocks.3.norm2.weight"),
            ("blocks.0.ffn.2.bias", "blocks.0.ffn.net.2.bias"),
            ("blocks.0.ffn.0.weight", "blocks.0.ffn.net.0.proj.weight"),
            ("blocks.1.cross_attn.norm_k_img.weight", "blocks.1.attn2.norm_added_k.weight"),
            ("blocks.1.self_attn.o.weight", "blocks.1.attn1.to_out.0.weight"),
            ("blocks.12.modulation", "blocks.12.scale_shift_table"),
            ("head.modulation", "scale_shift_table"),
            ("head.head.bias", "proj_out.bias"),
            ("img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"),
            ("img_emb.proj.3.weight", "condition_embedder.image_embedder.ff.net.2.weight"),
            ("time_projection.1.weight", "condition_embedder.time_proj.weight"),
        ] {
            assert_eq!(diffusers_name(comfy), diffusers, "{comfy}");
        }
    }
}
