//! Random-weight Z-Image-Turbo files at any configuration: the library behind `kiln model synth`, and the tiny
//! files the end-to-end, browser and template tests save under the real names (one file of a [`SynthFamily`]
//! under any name, for the templates).
//!
//! Each file has exactly the keys, shapes (scaled by the configuration) and dtypes of the released one — the
//! DiT `z_image_turbo_bf16.safetensors` (ComfyUI layout, no prefix), the text encoder `qwen_3_4b.safetensors`
//! (Hugging Face names, no `lm_head`) and the Flux VAE `ae.safetensors` (LDM names, f32) — so detection and
//! loading take the same paths as for the real files; only the values differ. Values are deterministic in
//! the seed and sane enough that a forward pass stays finite: weights and biases uniform in ±1/√fan_in
//! (torch's default), norm weights 1 and biases 0, embeddings uniform in ±1, pad tokens uniform in ±0.02.
//! With an fp8 dtype every tensor is fp8, norms and embeddings included, as in some released fp8 files.
//!
//! Files are written tensor by tensor, a few MiB at a time, through `<name>.part` renamed when complete: the
//! real DiT (11.5 GiB) never sits in memory.

mod layout;
mod writer;

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;

use kiln_compute::DType;

pub use layout::{Qwen3Shape, VaeShape, ZImageShape};

use crate::error::{Error, Result};
use crate::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use crate::qwen_vl::VisionConfig;
use crate::{
    clip_text, clip_vision, esrgan, flux, hidream, qwen_image, qwen3, t5, wan, wan_vae, wav2vec2,
    whisper, zimage,
};
use layout::{Init, Spec, qwen3_specs, vae_specs, zimage_lora_specs, zimage_specs};
use writer::{Entry, Plan, stream_id};

/// The DiT's path under a models folder, as the frontend's default workflow names it.
pub const DIFFUSION_MODEL_FILE: &str = "diffusion_models/z_image_turbo_bf16.safetensors";
/// The text encoder's path under a models folder.
pub const TEXT_ENCODER_FILE: &str = "text_encoders/qwen_3_4b.safetensors";
/// The VAE's path under a models folder.
pub const VAE_FILE: &str = "vae/ae.safetensors";

/// Key prefix of the DiT in a checkpoint (`CheckpointLoaderSimple`).
pub const CHECKPOINT_DIFFUSION_PREFIX: &str = "model.diffusion_model.";
/// Key prefix of the text encoder in a Z-Image checkpoint (the family's description).
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = zimage::family::CHECKPOINT_TEXT_ENCODER_PREFIX;
/// Key prefix of the VAE in a Z-Image checkpoint (the family's description).
pub const CHECKPOINT_VAE_PREFIX: &str = zimage::family::CHECKPOINT_VAE_PREFIX;

/// Streams of random values, one per network kind: a tensor's values depend on the seed, this and its name.
const ZIMAGE: &str = "zimage";
const QWEN3: &str = "qwen3";
const VAE: &str = "vae";
const FLUX2_VAE: &str = "flux2-vae";
const ZIMAGE_LORA: &str = "zimage-lora";
const WAN_VAE: &str = "wan21-vae";
const WAN22_VAE: &str = "wan22-vae";
const QWEN_IMAGE: &str = "qwen-image";
const QWEN_IMAGE_LORA: &str = "qwen-image-lora";
const QWEN_IMAGE_CONTROLNET: &str = "qwen-image-controlnet";
const ZIMAGE_CONTROLNET: &str = "zimage-controlnet";
const QWEN25VL: &str = "qwen25vl";
const MISTRAL3: &str = "mistral3";
const ERNIE: &str = "ernie-image";
const PIXELDIT: &str = "pixeldit";
const FLUX: &str = "flux1";
const FLUX_LORA: &str = "flux1-lora";
const FLUX2: &str = "flux2";
const CLIP_L: &str = "clip-l";
const T5XXL: &str = "t5xxl";
const CLIP_G: &str = "clip-g";
/// HunyuanVideo 1.5's ByT5 encoder's synth name.
const BYT5: &str = "byt5-small-glyph";
/// The released ByT5 glyph encoder's vocabulary (its embedding's rows: bytes, specials and glyph tokens).
const BYT5_VOCAB: usize = 1510;
const LLAMA3: &str = "llama3";
const HIDREAM: &str = "hidream";
const HIDREAM_LORA: &str = "hidream-lora";
const CLIP_VISION: &str = "clip-vision";
const FLUX_REDUX: &str = "flux1-redux";
const FLUX_USO: &str = "uso-flux1-projector";
const UMT5: &str = "umt5-xxl";
const WAN: &str = "wan";
const WAN_LORA: &str = "wan-lora";
const ESRGAN: &str = "esrgan";
const UNET: &str = "unet";
const SD3: &str = "sd3";
const KANDINSKY5: &str = "kandinsky5";
const HUNYUAN_VIDEO: &str = "hunyuan_video";
const KREA2: &str = "krea2";
const KREA2_LORA: &str = "krea2-lora";
const MAGE_FLOW: &str = "mage-flow";
const MAGE_VAE: &str = "mage-flow-vae";
const JOYIMAGE: &str = "joyimage";
const CHROMA_RADIANCE: &str = "chroma-radiance";
const ANIMA: &str = "anima";
const ANIMA_LORA: &str = "anima-lora";
const ANIMA_LLLITE: &str = "anima-lllite";
const LUMINA2: &str = "lumina2";
const GEMMA2: &str = "gemma2";
const OMNIGEN2: &str = "omnigen2";
/// SD's latent channels.
const SD_VAE_Z: usize = 4;
const SD_VAE: &str = "sd-vae";
const WHISPER: &str = "whisper";
const WAV2VEC2: &str = "wav2vec2";
const WAN_INFINITE_TALK: &str = "wan21-infinitetalk";

/// The kind of file `kiln model synth --family` writes: one network of a family Kiln runs, or a LoRA for a
/// diffusion family. Named by the families' own descriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthFamily {
    /// A diffusion model (`UNETLoader`), in the family's (ComfyUI's) layout.
    Diffusion(DiffusionFamily),
    /// A text encoder (`CLIPLoader`), in its released layout.
    TextEncoder(TextEncoderFamily),
    /// An autoencoder (`VAELoader`), in its released layout.
    Vae(VaeFamily),
    /// A LoRA for a diffusion model (`LoraLoaderModelOnly`), diffusers' names under `diffusion_model.`.
    Lora(DiffusionFamily),
    /// One of Qwen-Image-Layered's own files.
    QwenImageLayered(LayeredFile),
    /// A Qwen-Image ControlNet (`ControlNetLoader`), ComfyUI's names.
    QwenImageControlNet(ControlNetFile),
    /// An SD3.5 Large ControlNet of the given type (`sd3.5-controlnet-{blur,canny,depth}`), one block at the
    /// SD3.5 checkpoint's widths.
    Sd3ControlNet(crate::sd3::ControlType),
    /// DiffSynth's block-wise ControlNet for Qwen-Image (`ModelPatchLoader`), one block per base block.
    QwenImageBlockwise,
    /// The Z-Image Fun ControlNet (`ModelPatchLoader`), the release's layout: 6 control layers, 2 refiner
    /// blocks, diffusers' attention names.
    ZImageFunControlNet,
    /// An Anima ControlNet-LLLite (`ModelPatchLoader`): a control image's (`anima-lllite`) or, with `true`, the
    /// inpainting kind reading its mask too (`anima-lllite-inpaint`); every block's five modules.
    AnimaLllite(bool),
    /// A FLUX.1 variant other than dev (`--family flux1`), ComfyUI's names.
    Flux(FluxFile),
    /// Qwen2.5-VL as LongCat-Image's text encoder (`qwen25vl-longcat`): at LongCat-Image's text width.
    LongCatTextEncoder,
    /// Qwen2.5-VL 3B, OmniGen2's text encoder (`qwen25vl-3b`): two key/value heads of 128, which make it the 3B
    /// (and so OmniGen2's) whatever `CLIPLoader`'s type.
    OmniGen2TextEncoder,
    /// CLIP-G's text tower (`clip-g`, HiDream's second CLIP), the Hugging Face layout with its projection.
    ClipG,
    /// A FLUX.2 DiT other than Klein 4B (`--family flux2`), ComfyUI's names.
    Flux2(Flux2File),
    /// A vision tower (`CLIPVisionLoader`), the Hugging Face `vision_model.*` layout.
    ClipVision(ClipVisionFile),
    /// FLUX.1 Redux (`StyleModelLoader`), the release's names.
    FluxRedux,
    /// USO's style projector for FLUX.1 (`ModelPatchLoader`, `uso-flux1-projector`), the release's names.
    FluxUso,
    /// A Wan DiT other than 2.1 T2V 1.3B and 2.2 TI2V 5B (`--family wan21-t2v-1.3b`, `wan22-ti2v-5b`), ComfyUI's
    /// names.
    Wan(WanFile),
    /// An ESRGAN ×4 upscale model (`UpscaleModelLoader`, `esrgan-x4`), Real-ESRGAN's names.
    Esrgan,
    /// The Whisper large-v3 encoder (`AudioEncoderLoader`, `whisper-large-v3`), the released file's
    /// `model.encoder.*` names.
    Whisper,
    /// A wav2vec2 encoder (`AudioEncoderLoader`): the large English one of Wan 2.2 S2V
    /// (`wav2vec2-large-english`) or the Chinese base one of InfiniteTalk (`wav2vec2-chinese-base`), the released
    /// files' `wav2vec2.*` names.
    Wav2Vec2(wav2vec2::Variant),
    /// InfiniteTalk's patch for Wan 2.1 I2V 14B (`ModelPatchLoader`, `wan21-infinitetalk`), the release's
    /// names.
    WanInfiniteTalk,
    /// HunyuanVideo 1.5's ByT5 small glyph encoder (`DualCLIPLoader` type `hunyuan_video_15`'s second file,
    /// `byt5-small-glyph`), T5's names.
    ByT5,
    /// SD's KL autoencoder (`VAELoader`, `sd-vae`: `vae-ft-mse-840000-ema-pruned`): the Flux VAE's network with
    /// z 4 and both 1×1 quant convs, LDM names.
    SdVae,
}

/// The channels of the camera embedding the released Fun Camera models read (six Plücker components of four
/// frames).
const CAMERA_CHANNELS: usize = 24;

/// The released Wan DiTs beside 2.1 T2V 1.3B and 2.2 TI2V 5B, each at the 14B widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WanFile {
    /// Wan 2.1 I2V 14B (`wan21-i2v-14b`): 36 channels in, the CLIP branch.
    I2v14b,
    /// Wan 2.1 FLF2V 14B (`wan21-flf2v-14b`): as I2V, with `emb_pos` for two images' 514 CLIP tokens.
    Flf2v14b,
    /// A Wan 2.2 T2V A14B expert (`wan22-t2v-a14b`; high and low noise share the structure).
    T2vA14b,
    /// A Wan 2.2 I2V A14B expert (`wan22-i2v-a14b`): 36 channels in, no CLIP branch.
    I2vA14b,
    /// Wan 2.1 Fun Control 1.3B (`wan21-fun-control-1.3b`): the 1.3B widths, the CLIP branch, 48 channels in
    /// (latent, control latent, start image latent).
    FunControl13b,
    /// A Wan 2.2 Fun Control A14B expert (`wan22-fun-control-a14b`): 52 channels in (latent, control latent,
    /// 4 mask channels, start image latent) and the reference-image convolution.
    FunControlA14b,
    /// Wan 2.2 Fun Control 5B (`wan22-fun-control-5b`): the TI2V 5B widths, 148 channels in (as A14B's in the
    /// Wan 2.2 VAE's 48 channels) and the reference-image convolution.
    FunControl5b,
    /// Wan 2.2 Fun InP 5B (`wan22-fun-inpaint-5b`): the TI2V 5B widths, 100 channels in (latent, 4 mask
    /// channels, image latent).
    FunInpaint5b,
    /// Wan 2.1 VACE 14B (`wan21-vace-14b`): the 14B T2V widths and the VACE branch (96-channel contexts, one
    /// VACE block per 5 blocks; one per 2 in the tiny set).
    Vace14b,
    /// Wan 2.1 Fun Camera 1.3B (`wan21-fun-camera-1.3b`): the 1.3B widths, the CLIP branch, 32 channels in
    /// (latent, start image latent) and the camera adapter (24-channel embeddings).
    FunCamera13b,
    /// A Wan 2.2 Fun Camera A14B expert (`wan22-fun-camera-a14b`): 36 channels in (latent, 4 mask channels,
    /// start image latent) and the camera adapter.
    FunCameraA14b,
    /// The causal Wan 2.1 T2V 1.3B of Causal Forcing (`wan21-causal-t2v-1.3b`): 2.1 T2V 1.3B's weights, its
    /// metadata marking it causal as ComfyUI reads it.
    CausalT2v13b,
    /// HuMo 17B (`humo-17b`): the 14B widths, 36 channels in, HuMo's audio branch reading the set's Whisper
    /// features.
    Humo17b,
    /// Wan 2.2 S2V 14B (`wan22-s2v-14b`): the 14B T2V widths with S2V's audio encoder and injectors (reading
    /// the set's large wav2vec2), frame packer and control encoder.
    S2v14b,
    /// Wan Animate 2 (`wan21-animate2-14b`): Wan 2.1 I2V 14B's structure, its metadata marking it Animate 2 as
    /// ComfyUI reads it.
    Animate2,
    /// WanDancer (`wan22-dancer-14b`, its global and local files alike): Wan 2.1 I2V 14B's structure with the
    /// reference-image convolution and the music branch.
    Dancer14b,
}

impl WanFile {
    /// Every file.
    pub const ALL: [WanFile; 16] = [
        WanFile::I2v14b,
        WanFile::Flf2v14b,
        WanFile::T2vA14b,
        WanFile::I2vA14b,
        WanFile::FunControl13b,
        WanFile::FunControlA14b,
        WanFile::FunControl5b,
        WanFile::FunInpaint5b,
        WanFile::Vace14b,
        WanFile::FunCamera13b,
        WanFile::FunCameraA14b,
        WanFile::CausalT2v13b,
        WanFile::Humo17b,
        WanFile::S2v14b,
        WanFile::Animate2,
        WanFile::Dancer14b,
    ];

    /// The name it is spelled with on the command line.
    pub fn name(self) -> &'static str {
        let [
            i2v,
            flf2v,
            t2v,
            i2v_a14b,
            control_13b,
            control_a14b,
            control_5b,
            inpaint_5b,
            vace,
            camera_13b,
            camera_a14b,
            causal,
            humo,
            s2v,
            animate2,
            dancer,
        ] = wan::family::SYNTH_NAMES;
        match self {
            WanFile::I2v14b => i2v,
            WanFile::Flf2v14b => flf2v,
            WanFile::T2vA14b => t2v,
            WanFile::I2vA14b => i2v_a14b,
            WanFile::FunControl13b => control_13b,
            WanFile::FunControlA14b => control_a14b,
            WanFile::FunControl5b => control_5b,
            WanFile::FunInpaint5b => inpaint_5b,
            WanFile::Vace14b => vace,
            WanFile::FunCamera13b => camera_13b,
            WanFile::FunCameraA14b => camera_a14b,
            WanFile::CausalT2v13b => causal,
            WanFile::Humo17b => humo,
            WanFile::S2v14b => s2v,
            WanFile::Animate2 => animate2,
            WanFile::Dancer14b => dancer,
        }
    }

    /// Its config in `set` (from the widths of the 14B, 1.3B or 5B release it is built on).
    pub fn config(self, set: &ZImageTurboSet) -> wan::Config {
        let clip = wan::ImageEmbed { clip_dim: set.wan_clip_dim, pos_tokens: None };
        let base = set.wan_14b.clone();
        match self {
            WanFile::FunControl13b => {
                wan::Config { in_channels: 48, image: Some(clip), ..set.wan21.clone() }
            }
            WanFile::FunControlA14b => {
                wan::Config { in_channels: 52, ref_channels: Some(16), ..base }
            }
            WanFile::FunControl5b => {
                wan::Config { in_channels: 148, ref_channels: Some(48), ..set.wan22.clone() }
            }
            WanFile::FunInpaint5b => wan::Config { in_channels: 100, ..set.wan22.clone() },
            WanFile::Vace14b => {
                let blocks = (base.layers / 5).max(1);
                wan::Config { vace: Some(wan::Vace { in_channels: 96, blocks }), ..base }
            }
            WanFile::FunCamera13b => wan::Config {
                in_channels: 32,
                image: Some(clip),
                camera: Some(CAMERA_CHANNELS),
                ..set.wan21.clone()
            },
            WanFile::FunCameraA14b => {
                wan::Config { in_channels: 36, camera: Some(CAMERA_CHANNELS), ..base }
            }
            WanFile::I2v14b => wan::Config { in_channels: 36, image: Some(clip), ..base },
            WanFile::Flf2v14b => {
                let image = wan::ImageEmbed { pos_tokens: Some(514), ..clip };
                wan::Config { in_channels: 36, image: Some(image), ..base }
            }
            WanFile::T2vA14b => base,
            WanFile::I2vA14b => wan::Config { in_channels: 36, ..base },
            WanFile::CausalT2v13b => wan::Config { causal: true, ..set.wan21.clone() },
            WanFile::Humo17b => wan::Config { in_channels: 36, humo: Some(set.humo), ..base },
            WanFile::S2v14b => wan::Config { s2v: Some(set.s2v), ..base },
            WanFile::Animate2 => {
                wan::Config { in_channels: 36, image: Some(clip), animate2: true, ..base }
            }
            WanFile::Dancer14b => wan::Config {
                in_channels: 36,
                image: Some(clip),
                ref_channels: Some(16),
                dancer: Some(wan::Dancer { clip_dim: set.wan_clip_dim, ..set.dancer }),
                ..base
            },
        }
    }
}

/// The vision towers the templates name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClipVisionFile {
    /// OpenCLIP ViT-H/14 (`clip_vision_h`, `clip-vision-h`).
    H,
    /// OpenCLIP ViT-bigG/14 (`clip_vision_g`, `clip-vision-g`: SDXL's unCLIP "revision" images).
    G,
    /// SigLIP so400m patch14 384 (`sigclip_vision_patch14_384`, `siglip-384`).
    Siglip384,
}

impl ClipVisionFile {
    /// Its config in `set`.
    pub fn config(self, set: &ZImageTurboSet) -> clip_vision::Config {
        match self {
            ClipVisionFile::H => set.clip_vision_h,
            ClipVisionFile::G => set.clip_vision_g,
            ClipVisionFile::Siglip384 => set.siglip,
        }
    }
}

/// The FLUX.2 DiTs beside Klein 4B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flux2File {
    /// Klein 9B (`flux2-klein-9b`): wider and deeper, on Qwen3-8B's three hidden states.
    Klein9b,
    /// FLUX.2 dev (`flux2-dev`): 32 B parameters with a guidance embedding, on Mistral Small's hidden states.
    Dev,
}

impl Flux2File {
    /// Its config in `set` (the tiny set's are Klein 4B's widths, dev with its guidance embedding).
    pub fn config(self, set: &ZImageTurboSet) -> flux::Config {
        match self {
            Flux2File::Klein9b => set.flux2_klein_9b.clone(),
            Flux2File::Dev => set.flux2_dev.clone(),
        }
    }
}

/// The FLUX.1 variants beside dev, each at dev's widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FluxFile {
    /// schnell: no guidance embedding (`flux1-schnell`).
    Schnell,
    /// Fill: 96 input channels (`flux1-fill`).
    Fill,
    /// Canny and Depth: 32 input channels (`flux1-canny`).
    Canny,
    /// schnell's all-in-one checkpoint (`flux1-schnell-checkpoint`, `CheckpointLoaderSimple`): the DiT, CLIP-L,
    /// T5-XXL and the Flux VAE under ComfyUI's prefixes.
    SchnellCheckpoint,
    /// dev's all-in-one checkpoint (`flux1-dev-checkpoint`, as `flux1-dev-fp8.safetensors` in `checkpoints/`).
    DevCheckpoint,
}

impl FluxFile {
    /// Whether it is an all-in-one checkpoint.
    fn is_checkpoint(self) -> bool {
        matches!(self, FluxFile::SchnellCheckpoint | FluxFile::DevCheckpoint)
    }
}

impl FluxFile {
    /// Its config at `dev`'s widths.
    pub fn config(self, dev: &flux::Config) -> flux::Config {
        match self {
            FluxFile::Schnell => flux::Config { guidance: false, ..dev.clone() },
            FluxFile::Fill => flux::Config { in_channels: 96, ..dev.clone() },
            FluxFile::Canny => flux::Config { in_channels: 32, ..dev.clone() },
            FluxFile::SchnellCheckpoint => flux::Config { guidance: false, ..dev.clone() },
            FluxFile::DevCheckpoint => dev.clone(),
        }
    }
}

/// The Qwen-Image ControlNets, each with the base model's widths and 5 blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlNetFile {
    /// InstantX's (`qwen-image-controlnet-instantx`).
    InstantX,
    /// InstantX's inpainting one, whose hint has the mask (`qwen-image-controlnet-inpaint`).
    InstantXInpaint,
    /// VideoX-Fun's union one (`qwen-image-controlnet-fun`).
    Fun,
}

impl ControlNetFile {
    /// Its config for a base model of `base`'s widths.
    pub fn config(self, base: &qwen_image::Config) -> qwen_image::ControlConfig {
        let kind = match self {
            ControlNetFile::InstantX => qwen_image::ControlKind::InstantX { hint_channels: 16 },
            ControlNetFile::InstantXInpaint => {
                qwen_image::ControlKind::InstantX { hint_channels: 17 }
            }
            ControlNetFile::Fun => qwen_image::ControlKind::Fun { in_features: 132 },
        };
        let text_dim = match self {
            ControlNetFile::Fun => base.dim,
            _ => base.text_dim,
        };
        let body = qwen_image::Config {
            layers: qwen_image::FUN_INJECTION_BLOCKS.len(),
            text_dim,
            additional_t_cond: false,
            ..base.clone()
        };
        qwen_image::ControlConfig { kind, body }
    }
}

/// Qwen-Image-Layered's files that differ from Qwen-Image's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayeredFile {
    /// The MMDiT with `addition_t_embedding` (`qwen-image-layered`).
    Dit,
    /// The Wan 2.1 VAE of RGBA images (`qwen-image-layered-vae`).
    Vae,
}

impl SynthFamily {
    /// Every kind of every family: the diffusion models, text encoders, autoencoders, then the LoRAs.
    pub fn all() -> Vec<SynthFamily> {
        let mut all: Vec<SynthFamily> =
            DiffusionFamily::ALL.into_iter().map(SynthFamily::Diffusion).collect();
        all.extend(TextEncoderFamily::ALL.into_iter().map(SynthFamily::TextEncoder));
        all.extend(VaeFamily::ALL.into_iter().map(SynthFamily::Vae));
        // Kiln applies no LoRA to a UNet, SD3's MMDiT, Ovis-Image, Kandinsky 5, Lumina 2, OmniGen2 or Boogu-Image,
        // so these have no synthetic one.
        let unets = [
            DiffusionFamily::Lumina2,
            DiffusionFamily::OmniGen2,
            DiffusionFamily::Boogu,
            DiffusionFamily::Lotus,
            DiffusionFamily::Sdxl,
            DiffusionFamily::SdxlRefiner,
            DiffusionFamily::Sd3,
            DiffusionFamily::OvisImage,
            DiffusionFamily::Kandinsky5,
            DiffusionFamily::Kandinsky5Video,
            DiffusionFamily::HunyuanVideo,
            DiffusionFamily::HunyuanVideo15,
            DiffusionFamily::MageFlow,
            DiffusionFamily::JoyImage,
            DiffusionFamily::ChromaRadiance,
            DiffusionFamily::Ernie,
            DiffusionFamily::PixelDit,
        ];
        all.extend(
            DiffusionFamily::ALL.into_iter().filter(|f| !unets.contains(f)).map(SynthFamily::Lora),
        );
        all.extend([LayeredFile::Dit, LayeredFile::Vae].map(SynthFamily::QwenImageLayered));
        all.extend(
            [ControlNetFile::InstantX, ControlNetFile::InstantXInpaint, ControlNetFile::Fun]
                .map(SynthFamily::QwenImageControlNet),
        );
        all.extend(
            [
                crate::sd3::ControlType::Blur,
                crate::sd3::ControlType::Canny,
                crate::sd3::ControlType::Depth,
            ]
            .map(SynthFamily::Sd3ControlNet),
        );
        all.push(SynthFamily::QwenImageBlockwise);
        all.push(SynthFamily::ZImageFunControlNet);
        all.extend([false, true].map(SynthFamily::AnimaLllite));
        all.extend(
            [
                FluxFile::Schnell,
                FluxFile::Fill,
                FluxFile::Canny,
                FluxFile::SchnellCheckpoint,
                FluxFile::DevCheckpoint,
            ]
            .map(SynthFamily::Flux),
        );
        all.extend([Flux2File::Klein9b, Flux2File::Dev].map(SynthFamily::Flux2));
        all.extend(
            [ClipVisionFile::H, ClipVisionFile::G, ClipVisionFile::Siglip384]
                .map(SynthFamily::ClipVision),
        );
        all.push(SynthFamily::LongCatTextEncoder);
        all.push(SynthFamily::OmniGen2TextEncoder);
        all.push(SynthFamily::TextEncoder(TextEncoderFamily::Anima));
        all.push(SynthFamily::TextEncoder(TextEncoderFamily::Ernie));
        all.push(SynthFamily::ClipG);
        all.push(SynthFamily::FluxRedux);
        all.push(SynthFamily::FluxUso);
        all.extend(WanFile::ALL.map(SynthFamily::Wan));
        all.push(SynthFamily::Esrgan);
        all.push(SynthFamily::Whisper);
        all.push(SynthFamily::Wav2Vec2(wav2vec2::Variant::Large));
        all.push(SynthFamily::Wav2Vec2(wav2vec2::Variant::Base));
        all.push(SynthFamily::WanInfiniteTalk);
        all.push(SynthFamily::SdVae);
        all.push(SynthFamily::ByT5);
        all
    }

    /// The name it is spelled with on the command line (`z-image`, `qwen3`, `flux-vae`, `z-image-lora`).
    pub fn name(self) -> &'static str {
        match self {
            SynthFamily::Diffusion(family) => family.synth_name(),
            SynthFamily::TextEncoder(family) => family.synth_name(),
            SynthFamily::Vae(family) => family.synth_name(),
            SynthFamily::Lora(family) => family.synth_lora_name(),
            SynthFamily::QwenImageLayered(LayeredFile::Dit) => "qwen-image-layered",
            SynthFamily::QwenImageLayered(LayeredFile::Vae) => "qwen-image-layered-vae",
            SynthFamily::QwenImageControlNet(ControlNetFile::InstantX) => {
                "qwen-image-controlnet-instantx"
            }
            SynthFamily::QwenImageControlNet(ControlNetFile::InstantXInpaint) => {
                "qwen-image-controlnet-inpaint"
            }
            SynthFamily::QwenImageControlNet(ControlNetFile::Fun) => "qwen-image-controlnet-fun",
            SynthFamily::Sd3ControlNet(crate::sd3::ControlType::Blur) => "sd3.5-controlnet-blur",
            SynthFamily::Sd3ControlNet(crate::sd3::ControlType::Canny) => "sd3.5-controlnet-canny",
            SynthFamily::Sd3ControlNet(crate::sd3::ControlType::Depth) => "sd3.5-controlnet-depth",
            SynthFamily::Sd3ControlNet(crate::sd3::ControlType::Other) => "sd3.5-controlnet",
            SynthFamily::QwenImageBlockwise => "qwen-image-diffsynth-controlnet",
            SynthFamily::ZImageFunControlNet => "z-image-fun-controlnet",
            SynthFamily::AnimaLllite(false) => "anima-lllite",
            SynthFamily::AnimaLllite(true) => "anima-lllite-inpaint",
            SynthFamily::Flux(FluxFile::Schnell) => "flux1-schnell",
            SynthFamily::Flux(FluxFile::Fill) => "flux1-fill",
            SynthFamily::Flux(FluxFile::Canny) => "flux1-canny",
            SynthFamily::Flux(FluxFile::SchnellCheckpoint) => "flux1-schnell-checkpoint",
            SynthFamily::Flux(FluxFile::DevCheckpoint) => "flux1-dev-checkpoint",
            SynthFamily::Flux2(Flux2File::Klein9b) => "flux2-klein-9b",
            SynthFamily::Flux2(Flux2File::Dev) => "flux2-dev",
            SynthFamily::ClipVision(ClipVisionFile::H) => "clip-vision-h",
            SynthFamily::ClipVision(ClipVisionFile::G) => "clip-vision-g",
            SynthFamily::ClipVision(ClipVisionFile::Siglip384) => "siglip-384",
            SynthFamily::LongCatTextEncoder => "qwen25vl-longcat",
            SynthFamily::OmniGen2TextEncoder => "qwen25vl-3b",
            SynthFamily::ClipG => CLIP_G,
            SynthFamily::FluxRedux => "flux1-redux",
            SynthFamily::FluxUso => "uso-flux1-projector",
            SynthFamily::Wan(file) => file.name(),
            SynthFamily::Esrgan => "esrgan-x4",
            SynthFamily::Whisper => "whisper-large-v3",
            SynthFamily::Wav2Vec2(wav2vec2::Variant::Large) => "wav2vec2-large-english",
            SynthFamily::Wav2Vec2(wav2vec2::Variant::Base) => "wav2vec2-chinese-base",
            SynthFamily::WanInfiniteTalk => WAN_INFINITE_TALK,
            SynthFamily::SdVae => "sd-vae",
            SynthFamily::ByT5 => BYT5,
        }
    }
}

impl std::fmt::Display for SynthFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthFamily {
    type Err = Error;

    /// Parses [`SynthFamily::name`]'s spelling.
    fn from_str(s: &str) -> Result<SynthFamily> {
        by_name(&SynthFamily::all(), SynthFamily::name, s, "family")
    }
}

/// The one of `all` whose `name` is `s`; an [`Error::Invalid`] listing the names (`what` says what they name)
/// otherwise.
fn by_name<T: Copy>(all: &[T], name: fn(T) -> &'static str, s: &str, what: &str) -> Result<T> {
    all.iter().copied().find(|&t| name(t) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&t| name(t)).collect();
        Error::Invalid(format!("unknown {what} `{s}`; expected one of {}", names.join(", ")))
    })
}

/// The element type a synthetic DiT or text encoder is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthDtype {
    /// bfloat16, as released.
    Bf16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
    /// fp8 e4m3fn (every tensor).
    Fp8E4m3fn,
    /// fp8 e5m2 (every tensor).
    Fp8E5m2,
    /// ComfyUI's legacy scaled fp8 (`*_fp8_scaled` files): every Linear weight e4m3fn with its per-tensor
    /// `<layer>.scale_weight`, the `scaled_fp8` marker, everything else bf16.
    Fp8Scaled,
    /// ComfyUI's mixed quantization (`*_fp8mixed` files): every Linear weight e4m3fn with its
    /// `<layer>.weight_scale`, listed in the header's `_quantization_metadata`, everything else bf16.
    Fp8Mixed,
    /// ComfyUI's int8 with ConvRot (`*_int8_convrot` files): every Linear weight whose input width a ConvRot
    /// group (256, 64 or 16) divides is int8 with per-row `<layer>.weight_scale`, listed in
    /// `_quantization_metadata` with its group; everything else bf16.
    Int8Convrot,
    /// ComfyUI's MXFP8 (`*_mxfp8` files): every Linear weight whose sides are multiples of 32 is e4m3fn with
    /// an e8m0 exponent per block of 32 (`<layer>.weight_scale`, U8, swizzled), listed in
    /// `_quantization_metadata`; everything else bf16.
    Mxfp8,
    /// ComfyUI's NVFP4 (`*_nvfp4` files): every Linear weight whose sides are multiples of 16 is packed E2M1
    /// codes with an e4m3 scale per block of 16 (`<layer>.weight_scale`, swizzled) and a global
    /// `<layer>.weight_scale_2`, listed in `_quantization_metadata`; everything else bf16.
    Nvfp4,
}

impl SynthDtype {
    /// Every dtype, in the order of [`SynthDtype::name`]'s list.
    pub const ALL: [SynthDtype; 10] = [
        SynthDtype::Bf16,
        SynthDtype::F16,
        SynthDtype::F32,
        SynthDtype::Fp8E4m3fn,
        SynthDtype::Fp8E5m2,
        SynthDtype::Fp8Scaled,
        SynthDtype::Fp8Mixed,
        SynthDtype::Int8Convrot,
        SynthDtype::Mxfp8,
        SynthDtype::Nvfp4,
    ];

    /// The name it is spelled with on the command line: `bf16`, `f16`, `f32`, `fp8_e4m3fn`, `fp8_e5m2`,
    /// `fp8_scaled`, `fp8_mixed`, `int8_convrot`, `mxfp8`, `nvfp4`.
    pub fn name(self) -> &'static str {
        match self {
            SynthDtype::Bf16 => "bf16",
            SynthDtype::F16 => "f16",
            SynthDtype::F32 => "f32",
            SynthDtype::Fp8E4m3fn => "fp8_e4m3fn",
            SynthDtype::Fp8E5m2 => "fp8_e5m2",
            SynthDtype::Fp8Scaled => "fp8_scaled",
            SynthDtype::Fp8Mixed => "fp8_mixed",
            SynthDtype::Int8Convrot => "int8_convrot",
            SynthDtype::Mxfp8 => "mxfp8",
            SynthDtype::Nvfp4 => "nvfp4",
        }
    }

    /// The stored element type of the weights (of the quantized ones, for the scaled formats).
    pub fn dtype(self) -> DType {
        match self {
            SynthDtype::Bf16 => DType::BF16,
            SynthDtype::F16 => DType::F16,
            SynthDtype::F32 => DType::F32,
            SynthDtype::Fp8E4m3fn
            | SynthDtype::Fp8Scaled
            | SynthDtype::Fp8Mixed
            | SynthDtype::Mxfp8 => DType::F8E4M3,
            SynthDtype::Fp8E5m2 => DType::F8E5M2,
            SynthDtype::Int8Convrot => DType::I8,
            SynthDtype::Nvfp4 => DType::U8,
        }
    }

    /// Whether only the Linear weights have [`SynthDtype::dtype`], with per-tensor scales (the others bf16).
    pub fn is_scaled(self) -> bool {
        match self {
            SynthDtype::Fp8Scaled
            | SynthDtype::Fp8Mixed
            | SynthDtype::Int8Convrot
            | SynthDtype::Mxfp8
            | SynthDtype::Nvfp4 => true,
            SynthDtype::Bf16
            | SynthDtype::F16
            | SynthDtype::F32
            | SynthDtype::Fp8E4m3fn
            | SynthDtype::Fp8E5m2 => false,
        }
    }

    /// The dtype a VAE beside a model of this dtype is stored in: the same for f32, f16 and bf16, bf16 for fp8
    /// (VAEs are not shipped in fp8).
    pub fn for_vae(self) -> SynthDtype {
        match self {
            SynthDtype::Bf16
            | SynthDtype::Fp8E4m3fn
            | SynthDtype::Fp8E5m2
            | SynthDtype::Fp8Scaled
            | SynthDtype::Fp8Mixed
            | SynthDtype::Int8Convrot
            | SynthDtype::Mxfp8
            | SynthDtype::Nvfp4 => SynthDtype::Bf16,
            SynthDtype::F16 => SynthDtype::F16,
            SynthDtype::F32 => SynthDtype::F32,
        }
    }
}

impl std::fmt::Display for SynthDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthDtype {
    type Err = Error;

    /// Parses [`SynthDtype::name`]'s spelling.
    fn from_str(s: &str) -> Result<SynthDtype> {
        by_name(&SynthDtype::ALL, SynthDtype::name, s, "dtype")
    }
}

/// The three files' configurations together, and the other families' networks at the same size.
#[derive(Debug, Clone, PartialEq)]
pub struct ZImageTurboSet {
    /// The DiT.
    pub zimage: ZImageShape,
    /// The text encoder (its `hidden` should equal the DiT's `cap_feat_dim`).
    pub qwen3: Qwen3Shape,
    /// Qwen3-VL 4B's language model (`--family qwen3vl-4b`; Krea 2's and Mage-Flow's text width) ...
    pub qwen3vl_4b: Qwen3Shape,
    /// ... and its vision tower (its `out_hidden` should be `qwen3vl_4b.hidden`).
    pub qwen3vl_vision: crate::qwen3vl_vision::Config,
    /// The VAE.
    pub vae: VaeShape,
    /// The Wan 2.1 VAE (not part of Z-Image-Turbo; `--family wan21-vae`).
    pub wan_vae: wan_vae::Config,
    /// The Wan 2.2 VAE (`--family wan22-vae`).
    pub wan22_vae: wan_vae::wan22::Config,
    /// Qwen-Image's MMDiT (`--family qwen-image`; its `text_dim` should equal `qwen25vl.hidden`).
    pub qwen_image: qwen_image::Config,
    /// Qwen2.5-VL's language model (`--family qwen25vl`).
    pub qwen25vl: qwen3::Config,
    /// FLUX.2 dev's Mistral Small 3.x (`--family mistral3`; three times its hidden width should be FLUX.2
    /// dev's `text_dim`).
    pub mistral3: qwen3::Config,
    /// ERNIE-Image's Ministral 3 3B (`--family ministral3-3b`; its hidden width should be ERNIE-Image's
    /// `text_dim`).
    pub ministral: qwen3::Config,
    /// Qwen2.5-VL's vision tower, written in the same file (its `out_hidden` should equal `qwen25vl.hidden`).
    pub qwen25vl_vision: VisionConfig,
    /// FLUX.1 dev's DiT (`--family flux1`; schnell and Fill at its widths; its `text_dim` should equal
    /// `t5.d_model`, its `vec_dim` `clip_l.hidden`).
    pub flux: flux::Config,
    /// LongCat-Image's DiT (`--family longcat-image`; its `text_dim` is `longcat_qwen25vl.hidden`).
    pub longcat: flux::Config,
    /// Chroma's DiT (`--family chroma`; FLUX.1 dev's widths on T5-XXL's text, its guidance MLP as released at
    /// the real widths, 32 wide and 2 layers deep in the tiny set).
    pub chroma: flux::Config,
    /// The Qwen2.5-VL LongCat-Image conditions on (`--family qwen25vl-longcat`, with `qwen25vl_vision`'s tower
    /// at its width): 3584 wide, as ComfyUI tells LongCat-Image's DiT by that width.
    pub longcat_qwen25vl: qwen3::Config,
    /// FLUX.2 Klein 4B's DiT (`--family flux2`; its `text_dim` should be three times the Qwen3 encoder's
    /// hidden width, Klein taking three of its hidden states).
    pub flux2: flux::Config,
    /// FLUX.2 Klein 9B's DiT (`--family flux2-klein-9b`; `text_dim` three times Qwen3-8B's hidden width).
    pub flux2_klein_9b: flux::Config,
    /// FLUX.2 dev's DiT (`--family flux2-dev`; `text_dim` three times Mistral Small's hidden width).
    pub flux2_dev: flux::Config,
    /// CLIP-L's text tower (`--family clip-l`).
    pub clip_l: clip_text::Config,
    /// T5-XXL's encoder (`--family t5xxl`).
    pub t5: t5::Config,
    /// HunyuanVideo 1.5's ByT5 small glyph encoder (`--family byt5-small-glyph`; its `d_model` should be the
    /// HunyuanVideo 1.5 DiT's ByT5 width, its vocabulary the released 1510).
    pub byt5: t5::Config,
    /// Wan's umT5-XXL encoder (`--family umt5-xxl`; its `d_model` should be the Wan DiTs' `text_dim`, its
    /// vocabulary at least the synthetic tokenizer's [`t5::SYNTH_PIECES`]).
    pub umt5: t5::Config,
    /// OpenCLIP ViT-H/14's vision tower (`--family clip-vision-h`).
    pub clip_vision_h: clip_vision::Config,
    /// OpenCLIP ViT-bigG/14's vision tower (`--family clip-vision-g`; its projection should be CLIP-G's pooled
    /// width, which SDXL's unCLIP images stand in for).
    pub clip_vision_g: clip_vision::Config,
    /// SigLIP so400m's vision tower (`--family siglip-384`; its width should be `redux.input`).
    pub siglip: clip_vision::Config,
    /// FLUX.1 Redux (`--family flux1-redux`; its `output` should be the FLUX.1 DiT's `text_dim`).
    pub redux: clip_vision::ReduxConfig,
    /// USO's style projector (`--family uso-flux1-projector`; its SigLIP widths should be `siglip`'s tokens and
    /// width, its `hidden` the FLUX.1 DiT's).
    pub uso: flux::UsoConfig,
    /// Wan 2.1 T2V 1.3B (`--family wan21-t2v-1.3b`; its `text_dim` should be umT5-XXL's width).
    pub wan21: wan::Config,
    /// Wan 2.2 TI2V 5B (`--family wan22-ti2v-5b`).
    pub wan22: wan::Config,
    /// The Wan 14B DiTs' T2V widths (`--family wan22-t2v-a14b`; the other [`WanFile`]s from it).
    pub wan_14b: wan::Config,
    /// The CLIP vision width the Wan I2V and FLF2V DiTs read (CLIP-ViT-H's 1280).
    pub wan_clip_dim: usize,
    /// The ESRGAN ×4 upscale model (`--family esrgan-x4`: Real-ESRGAN x4plus).
    pub esrgan: esrgan::Config,
    /// The Whisper encoder (`--family whisper-large-v3`); its width is the features HuMo reads.
    pub whisper: whisper::Config,
    /// HuMo's audio branch (`--family humo-17b`), reading the Whisper encoder's width.
    pub humo: wan::Humo,
    /// The wav2vec2 encoders (`--family wav2vec2-large-english`, `wav2vec2-chinese-base`), large then base.
    pub wav2vec2: [wav2vec2::Config; 2],
    /// Wan 2.2 S2V's parts (`--family wan22-s2v-14b`), reading the large wav2vec2's states.
    pub s2v: wan::s2v::S2v,
    /// InfiniteTalk's patch (`--family wan21-infinitetalk`): the 14B DiTs' width, reading the base wav2vec2's
    /// states after the first.
    pub infinite_talk: wan::infinite_talk::TalkConfig,
    /// WanDancer's music branch (`--family wan22-dancer-14b`), its reference projection reading the CLIP
    /// width the Wan I2V DiTs read.
    pub dancer: wan::Dancer,
    /// CLIP-G's text tower (`--family clip-g`: more than 30 layers, as ComfyUI tells it from CLIP-L).
    pub clip_g: clip_text::Config,
    /// Llama 3.1 8B Instruct (`--family llama3`), HiDream's fourth encoder.
    pub llama3: qwen3::Config,
    /// HiDream-I1's DiT (`--family hidream`; its text widths are `t5.d_model` and `llama3.hidden`, its pooled
    /// width `clip_l.hidden + clip_g.hidden`).
    pub hidream: hidream::Config,
    /// Lotus depth's UNet (`--family lotus-depth`), its context as wide as `LotusConditioning`'s (1024).
    pub lotus: crate::unet::Shape,
    /// SDXL's UNet (`--family sdxl`, a checkpoint with `clip_l`, `clip_g` and `sd_vae`; its context and
    /// `label_emb` widths follow the two CLIPs').
    pub sdxl: crate::unet::Shape,
    /// SDXL's refiner's UNet (`--family sdxl-refiner`, a checkpoint with `clip_g` and `sd_vae`).
    pub sdxl_refiner: crate::unet::Shape,
    /// SD3.5's MMDiT (`--family sd3.5`, a checkpoint with `clip_l`, `clip_g`, `t5` and `vae`; its pooled width
    /// follows the CLIPs', its text width T5's, which is widened to at least the CLIPs' together).
    pub sd3: crate::sd3::Config,
    /// SD's KL autoencoder (`--family sd-vae`; z is always 4).
    pub sd_vae: VaeShape,
    /// Kandinsky 5 Lite's image DiT (`--family kandinsky5-image`; its text width should be `qwen25vl.hidden`, its
    /// pooled width `clip_l.hidden`).
    pub kandinsky5: crate::kandinsky5::Config,
    /// Kandinsky 5 Lite's video DiT (`--family kandinsky5-video`; the text and pooled widths as `kandinsky5`'s).
    pub kandinsky5_video: crate::kandinsky5::Config,
    /// Anima's DiT and LLM adapter (`--family anima`; the adapter's source width should be `qwen3_06b.hidden`).
    pub anima: crate::anima::Config,
    /// Qwen3 0.6B (`--family qwen3-0.6b`, Anima's text encoder: ComfyUI tells it by its width, so even the tiny
    /// one is 1024 wide).
    pub qwen3_06b: Qwen3Shape,
    /// Lumina 2's NextDiT (`--family lumina2`, an all-in-one checkpoint with `gemma2` and `vae`; its caption
    /// width should be `gemma2.hidden`).
    pub lumina2: zimage::Config,
    /// Gemma 2 2B (`--family gemma2-2b`, Lumina 2's text encoder; heads 256 wide, as detection assumes).
    pub gemma2: qwen3::Config,
    /// OmniGen2's DiT (`--family omnigen2`; its text width should be `omnigen2_qwen25vl.hidden`).
    pub omnigen2: crate::omnigen2::Config,
    /// Qwen2.5-VL 3B (`--family qwen25vl-3b`), OmniGen2's encoder, with `qwen25vl_vision`'s tower.
    pub omnigen2_qwen25vl: qwen3::Config,
    /// Boogu-Image's DiT (`--family boogu`; its instruction width is Qwen3-VL 8B's, 4096, and the tiny one's the
    /// tiny `qwen3vl_4b`'s, whose file stands in for Qwen3-VL 8B's).
    pub boogu: crate::omnigen2::Config,
    /// HunyuanVideo 1.0's DiT (`--family hunyuan-video`; its text width should be `llama3.hidden`, its pooled
    /// width `clip_l.hidden`).
    pub hunyuan_video: crate::hunyuan_video::Config,
    /// HunyuanVideo 1.5's DiT (`--family hunyuan-video15`; its text width should be `qwen25vl.hidden`, its ByT5
    /// width `byt5.d_model`, its vision width `siglip.hidden`).
    pub hunyuan_video15: crate::hunyuan_video::Config,
    /// The HunyuanVideo 1.0 VAE (`--family hunyuan-video-vae`).
    pub kl_video_vae: crate::kl_video_vae::Config,
    /// The HunyuanVideo 1.5 VAE (`--family hunyuan-video15-vae`).
    pub hunyuan_vae: crate::hunyuan_vae::Config,
    /// Krea 2's DiT (`--family krea2`; its text width should be `qwen3vl_4b.hidden`, over 12 tapped layers).
    pub krea2: crate::krea2::Config,
    /// Mage-Flow's DiT (`--family mage-flow`; its text width should be `qwen3vl_4b.hidden`).
    pub mage_flow: crate::mage_flow::Config,
    /// Mage-Flow's VAE (`--family mage-flow-vae`).
    pub mage_vae: crate::mage_vae::Config,
    /// Chroma Radiance's NeRF head (`--family chroma-radiance`, on `chroma`'s trunk): hidden width, MLP ratio,
    /// blocks.
    pub chroma_radiance_nerf: (usize, usize, usize),
    /// JoyAI Image Edit's DiT (`--family joyimage`; its text width should be Qwen3-VL 8B's, or in the tiny set
    /// the Qwen3-VL 4B's that stands in for it).
    pub joyimage: crate::joyimage::Config,
    /// ERNIE-Image's DiT (`--family ernie-image`; its text width should be `ministral`'s hidden width).
    pub ernie: crate::ernie::Config,
    /// PixelDiT's DiT (`--family pixeldit`; its text width should be `gemma2`'s hidden width).
    pub pixeldit: crate::pixeldit::Config,
}

impl ZImageTurboSet {
    /// The released models.
    pub fn real() -> ZImageTurboSet {
        let flux = flux::Config {
            generation: flux::Generation::One,
            dim: 3072,
            heads: 24,
            double_blocks: 19,
            single_blocks: 38,
            mlp_hidden: 12288,
            in_channels: 16,
            text_dim: 4096,
            vec_dim: Some(768),
            guidance: true,
            longcat: false,
            approximator: None,
            ovis: false,
        };
        ZImageTurboSet {
            longcat: longcat_config(&flux),
            // The guidance MLP as released: 5120 wide, 5 layers.
            chroma: chroma_config(&flux, flux::Approximator { hidden: 5120, layers: 5 }),
            zimage: ZImageShape::real(),
            qwen3: Qwen3Shape::real(),
            // Qwen3-VL 4B's language model has Qwen3-4B's shapes.
            qwen3vl_4b: Qwen3Shape::real(),
            qwen3vl_vision: crate::qwen3vl_vision::Config {
                hidden: 1024,
                depth: 24,
                heads: crate::qwen3vl_vision::HEADS,
                intermediate: 4096,
                out_hidden: 2560,
                patch: 16,
                temporal_patch: 2,
                position_side: 48,
                deepstack: vec![5, 11, 17],
            },
            vae: VaeShape::real(),
            wan_vae: wan_vae_config(96),
            wan22_vae: wan_vae::wan22::Config::released(),
            qwen_image: qwen_image::Config {
                dim: 3072,
                heads: 24,
                head_dim: 128,
                layers: 60,
                mlp_hidden: 12288,
                text_dim: 3584,
                axes_dims: [16, 56, 56],
                additional_t_cond: false,
            },
            qwen25vl: decoder_config(qwen3::Variant::Qwen25Vl, 152_064, 3584, 28, (28, 4), 18944),
            mistral3: decoder_config(qwen3::Variant::Mistral3, 131_072, 5120, 40, (32, 8), 32768),
            ministral: decoder_config(qwen3::Variant::Mistral3, 131_072, 3072, 26, (32, 8), 9216),
            clip_g: clip_g_config(1280, 32, 5120),
            llama3: decoder_config(qwen3::Variant::Llama3, 128_256, 4096, 32, (32, 8), 14336),
            // HiDream-I1 as released (ComfyUI's detection constants; the SwiGLU widths round 2/3 of 4·D and
            // 2·D up to 256).
            hidream: hidream::Config {
                dim: 2560,
                heads: 20,
                double_blocks: 16,
                single_blocks: 32,
                experts: 4,
                t5_width: 4096,
                llama_width: 4096,
                pooled_width: 768 + 1280,
                expert_hidden: 6912,
                shared_hidden: 3584,
                text_hidden: 6912,
            },
            qwen25vl_vision: VisionConfig {
                hidden: 1280,
                depth: 32,
                intermediate: 3420,
                out_hidden: 3584,
                patch: 14,
                temporal_patch: 2,
            },
            flux,
            longcat_qwen25vl: decoder_config(
                qwen3::Variant::Qwen25Vl,
                152_064,
                3584,
                28,
                (28, 4),
                18944,
            ),
            flux2: flux2_config(3072, (5, 20), 3 * 2560, false),
            flux2_klein_9b: flux2_config(4096, (8, 24), 3 * 4096, false),
            flux2_dev: flux2_config(6144, (8, 48), 3 * 5120, true),
            clip_l: clip_l_config(768, 12, 3072),
            t5: t5_config(4096, 24, 64, 64, 10240),
            umt5: t5::Config { vocab: t5::UMT5_VOCAB, ..t5_config(4096, 24, 64, 64, 10240) },
            byt5: t5::Config { vocab: BYT5_VOCAB, ..t5_config(1472, 12, 6, 64, 3584) },
            clip_vision_h: vision_config(clip_vision::Variant::H, 1280, 32, 5120, 224, Some(1024)),
            clip_vision_g: vision_config(clip_vision::Variant::G, 1664, 48, 8192, 224, Some(1280)),
            siglip: vision_config(clip_vision::Variant::Siglip, 1152, 27, 4304, 384, None),
            redux: clip_vision::ReduxConfig { input: 1152, hidden: 3 * 4096, output: 4096 },
            uso: flux::UsoConfig {
                siglip_tokens: 729,
                style_tokens: 64,
                siglip_dim: 1152,
                hidden: 3072,
            },
            wan21: wan_config(1536, 8960, 30, (16, 16)),
            wan22: wan_config(3072, 14336, 30, (48, 48)),
            wan_14b: wan_config(5120, 13824, 40, (16, 16)),
            wan_clip_dim: 1280,
            esrgan: esrgan::Config::x4plus(),
            lotus: crate::unet::Shape::lotus(),
            sdxl: crate::unet::Shape::sdxl(),
            sdxl_refiner: crate::unet::Shape::sdxl_refiner(),
            // SD3.5 Large: 38 blocks of 38 heads, a 192² position table.
            sd3: crate::sd3::Config {
                dim: 2432,
                heads: 38,
                blocks: 38,
                in_channels: 16,
                out_channels: 16,
                pos_embed_max: 192,
                adm_width: 2048,
                context_width: 4096,
                qk_norm: true,
            },
            sd_vae: VaeShape { z: SD_VAE_Z, ..VaeShape::real() },
            // Kandinsky 5.0 T2I Lite: 2 text blocks, 50 visual blocks of 20 heads.
            kandinsky5: crate::kandinsky5::Config {
                dim: 2560,
                time_dim: 512,
                ff_dim: 10240,
                text_dim: 3584,
                pooled_dim: 768,
                channels: 16,
                text_blocks: 2,
                visual_blocks: 50,
                head_dim: 128,
                axes: [32, 48, 48],
                rope_scale: [1.0; 3],
                video: false,
            },
            // Kandinsky 5.0 T2V / I2V Lite: 32 visual blocks of 28 heads of 64.
            kandinsky5_video: crate::kandinsky5::Config {
                dim: 1792,
                time_dim: 512,
                ff_dim: 7168,
                text_dim: 3584,
                pooled_dim: 768,
                channels: 16,
                text_blocks: 2,
                visual_blocks: 32,
                head_dim: 64,
                axes: [16, 24, 24],
                rope_scale: [1.0, 2.0, 2.0],
                video: true,
            },
            // Lumina Image 2.0 (NetaYume Lumina): 26 blocks of 24 heads, 8 key/value heads.
            lumina2: lumina2_config(2304, 24, 8, 26, 2, 2304),
            // Gemma 2 2B.
            gemma2: decoder_config(qwen3::Variant::Gemma2, 256_000, 2304, 26, (8, 4), 9216),
            // OmniGen2: 32 blocks of 21 heads of 120, 7 key/value heads, on Qwen2.5-VL 3B's 2048-wide states.
            omnigen2: omnigen2_config(2520, 21, 7, 32, 2, 2048),
            // Boogu-Image: 8 double-stream and 32 single-stream blocks of 28 heads of 120, 7 key/value heads.
            boogu: boogu_config(omnigen2_config(3360, 28, 7, 32, 2, 4096), 8),
            // HunyuanVideo 1.5 720p: 54 double-stream blocks of 16 heads, no single-stream ones.
            hunyuan_video15: hunyuan_video15_config(2048, 54, 0, (3584, 1472, 1152)),
            // HunyuanVideo 1.0 720p: 20 double-stream and 40 single-stream blocks of 24 heads.
            hunyuan_video: hunyuan_video1_config(3072, (20, 40), (4096, 768)),
            hunyuan_vae: crate::hunyuan_vae::Config::released(),
            kl_video_vae: crate::kl_video_vae::Config::released(),
            // Krea 2: 28 blocks of 48 heads of 128 over 12 key/value heads, on Qwen3-VL 4B's 12 taps.
            krea2: crate::krea2::Config {
                features: 6144,
                channels: 16,
                layers: 28,
                heads: 48,
                kv_heads: 12,
                mlp_dim: 16384,
                time_dim: 256,
                text_layers: 12,
                text_dim: 2560,
                text_heads: 20,
                text_kv_heads: 20,
                text_mlp_dim: 6912,
                axes: [32, 48, 48],
            },
            // Mage-Flow: 12 double-stream blocks of 24 heads of 128 on Qwen3-VL 4B's width.
            mage_flow: crate::mage_flow::Config {
                dim: 3072,
                heads: 24,
                head_dim: 128,
                layers: 12,
                mlp_hidden: 12288,
                text_dim: 2560,
                axes_dims: [16, 56, 56],
            },
            mage_vae: crate::mage_vae::Config::released(),
            // Chroma1-Radiance: 64 wide, ratio 4, 4 blocks (ComfyUI's detection fixes these).
            chroma_radiance_nerf: (64, 4, 4),
            // PixelDiT 1300M (ComfyUI's defaults): 14 patch blocks of 24 heads of 64 over 16-pixel patches, two
            // pixel blocks 16 wide attending in 16 heads of 72, on Gemma 2 2B's 2304-wide states.
            pixeldit: crate::pixeldit::Config {
                layout: crate::pixeldit::Layout::Released,
                hidden: 1536,
                heads: 24,
                head_dim: 64,
                ffn_dim: 4096,
                patch_depth: 14,
                pixel_depth: 2,
                patch: 16,
                pixel_dim: 16,
                pixel_mlp: 64,
                attn_dim: 1152,
                attn_heads: 16,
                attn_head_dim: 72,
                text_dim: 2304,
                text_max: 300,
            },
            // ERNIE-Image (ComfyUI's defaults): 36 blocks of 32 heads of 128, FLUX.2's 128 channels, Ministral 3
            // 3B's 3072-wide states projected.
            ernie: crate::ernie::Config {
                hidden: 4096,
                channels: 128,
                layers: 36,
                heads: 32,
                head_dim: 128,
                ffn_dim: 12288,
                text_dim: 3072,
                text_proj: true,
                axes: [32, 48, 48],
            },
            // JoyAI Image Edit: 40 double-stream blocks of 32 heads of 128 on Qwen3-VL 8B's width.
            joyimage: crate::joyimage::Config {
                hidden: 4096,
                channels: 16,
                layers: 40,
                heads: 32,
                head_dim: 128,
                mlp_dim: 16384,
                text_dim: 4096,
                patch: [1, 2, 2],
                axes: [16, 56, 56],
            },
            // Qwen2.5-VL 3B: 36 layers of 16 heads, 2 key/value heads.
            omnigen2_qwen25vl: decoder_config(
                qwen3::Variant::Qwen25Vl,
                151_936,
                2048,
                36,
                (16, 2),
                11008,
            ),
            // Anima (Cosmos Predict2 2B): 28 blocks of 16 heads, the adapter's 6 blocks of 16.
            anima: crate::anima::Config {
                dim: 2048,
                head_dim: 128,
                blocks: 28,
                channels: 16,
                context_dim: 1024,
                adaln_lora_dim: 256,
                mlp_dim: 8192,
                rope_extrapolation: [1.0, 4.0, 4.0],
                adapter: crate::anima::AdapterConfig {
                    vocab: 32128,
                    target_dim: 1024,
                    model_dim: 1024,
                    source_dim: 1024,
                    layers: 6,
                    head_dim: 64,
                },
            },
            qwen3_06b: Qwen3Shape {
                vocab: 151936,
                hidden: 1024,
                layers: 28,
                heads: 16,
                kv_heads: 8,
                head_dim: 128,
                intermediate: 3072,
            },
            whisper: whisper::Config::large_v3(),
            humo: wan::Humo { channels: 1280, hidden: 512, audio_dim: 1536, tokens: 16 },
            wav2vec2: [wav2vec2::Config::large(), wav2vec2::Config::base()],
            s2v: wan::s2v::S2v {
                audio_dim: 1024,
                audio_layers: 25,
                audio_tokens: 4,
                injectors: 12,
                cond_channels: 16,
            },
            infinite_talk: wan::infinite_talk::TalkConfig {
                dim: 5120,
                hidden: 512,
                features: 12 * 768,
                tokens: 32,
                audio_dim: 768,
                blocks: 40,
            },
            dancer: wan::Dancer {
                features: 35,
                width: 256,
                ffn: 1024,
                layers: 2,
                injectors: 8,
                clip_dim: 1280,
            },
        }
    }

    /// The tiny models of the tests.
    pub fn tiny() -> ZImageTurboSet {
        // One head of the released width (the RoPE axes fix it at 128).
        let flux = flux::Config {
            generation: flux::Generation::One,
            dim: 128,
            heads: 1,
            double_blocks: 1,
            single_blocks: 2,
            mlp_hidden: 256,
            in_channels: 16,
            text_dim: 32,
            vec_dim: Some(64),
            guidance: true,
            longcat: false,
            approximator: None,
            ovis: false,
        };
        ZImageTurboSet {
            longcat: longcat_config(&flux),
            chroma: chroma_config(&flux, flux::Approximator { hidden: 32, layers: 2 }),
            zimage: ZImageShape::tiny(),
            qwen3: Qwen3Shape::tiny(),
            // 36 layers for Krea 2's taps (up to 35); 128 wide, whole 128-wide text heads for Krea 2's DiT.
            qwen3vl_4b: Qwen3Shape {
                vocab: 151936,
                hidden: 128,
                layers: 36,
                heads: 2,
                kv_heads: 1,
                head_dim: 64,
                intermediate: 128,
            },
            // Two blocks of ComfyUI's 16 heads, 8 wide; DeepStack after both; an 8 × 8 position table.
            qwen3vl_vision: crate::qwen3vl_vision::Config {
                hidden: 128,
                depth: 2,
                heads: crate::qwen3vl_vision::HEADS,
                intermediate: 128,
                out_hidden: 128,
                patch: 16,
                temporal_patch: 2,
                position_side: 8,
                deepstack: vec![0, 1],
            },
            vae: VaeShape::tiny(),
            wan_vae: wan_vae_config(8),
            wan22_vae: wan_vae::wan22::Config {
                dim: 4,
                dec_dim: 8,
                ..wan_vae::wan22::Config::released()
            },
            qwen_image: qwen_image::Config {
                dim: 64,
                heads: 2,
                head_dim: 32,
                layers: 2,
                mlp_hidden: 256,
                text_dim: 32,
                axes_dims: [4, 14, 14],
                additional_t_cond: false,
            },
            // The real vocabulary, so the real tokenizer's ids are valid; one head of the released width.
            qwen25vl: decoder_config(qwen3::Variant::Qwen25Vl, 152_064, 32, 2, (1, 1), 64),
            // The synthetic tekken vocabulary's 1256 ids; 30 layers (the pruned file), one head of the released
            // width; 32 wide, so its three taps are the tiny FLUX.2 dev's context.
            mistral3: decoder_config(qwen3::Variant::Mistral3, 1256, 32, 30, (1, 1), 64),
            // The same vocabulary; 4 layers, too shallow for FLUX.2's taps, which makes it Ministral's.
            ministral: decoder_config(qwen3::Variant::Mistral3, 1256, 32, 4, (1, 1), 64),
            // 16 heads of 4, as the released tower has 16; 8 blocks, so the eighth attends to the whole image.
            qwen25vl_vision: VisionConfig {
                hidden: 64,
                depth: 8,
                intermediate: 64,
                out_hidden: 32,
                patch: 14,
                temporal_patch: 2,
            },
            flux,
            // Qwen2.5-VL at the width LongCat-Image reads, otherwise as small as it goes: one layer, one head of
            // the released width. The real vocabulary makes its token table the bulk of the file (0.5 G values).
            longcat_qwen25vl: decoder_config(
                qwen3::Variant::Qwen25Vl,
                152_064,
                3584,
                1,
                (1, 1),
                64,
            ),
            flux2: flux2_config(128, (1, 2), 3 * 32, false),
            // Klein 9B and dev at Klein 4B's tiny widths (every tiny encoder is 32 wide).
            flux2_klein_9b: flux2_config(128, (1, 2), 3 * 32, false),
            flux2_dev: flux2_config(128, (1, 2), 3 * 32, true),
            // The real vocabularies, so the real tokenizers' ids are valid; CLIP's heads are 64 wide and its
            // detection reads layer 1.
            clip_l: clip_l_config(64, 2, 128),
            t5: t5_config(32, 2, 2, 16, 64),
            // CLIP-G must be more than 30 layers deep to be told from CLIP-L.
            clip_g: clip_g_config(64, 31, 128),
            // One head of Llama's width, the real vocabulary (its token table is most of the file).
            llama3: decoder_config(qwen3::Variant::Llama3, 128_256, 32, 2, (1, 1), 64),
            // One head of the released width, one double and two single blocks, four small experts, on the tiny
            // T5-XXL's and Llama's widths and the tiny CLIPs' pooled vectors.
            hidream: hidream::Config {
                dim: 128,
                heads: 1,
                double_blocks: 1,
                single_blocks: 2,
                experts: 4,
                t5_width: 32,
                llama_width: 32,
                pooled_width: 64 + 64,
                expert_hidden: 64,
                shared_hidden: 32,
                text_hidden: 64,
            },
            // The Wan DiTs' 4096-wide text (ComfyUI fixes it), two blocks (so block 1 has its own position bias),
            // two heads of the released width, and the synthetic tokenizer's vocabulary rounded up to 128 rows.
            umt5: t5::Config { vocab: 384, ..t5_config(4096, 2, 2, 64, 64) },
            // The released vocabulary (every byte and special token), tiny widths.
            byt5: t5::Config { vocab: BYT5_VOCAB, ..t5_config(32, 2, 2, 16, 64) },
            // 16 heads of 4 (every released tower has 16), 2 × 2 patches of 14.
            clip_vision_h: vision_config(clip_vision::Variant::H, 64, 2, 128, 28, Some(32)),
            // ViT-bigG is told by its 48 layers; its projection is the tiny CLIP-G's pooled width.
            clip_vision_g: vision_config(clip_vision::Variant::G, 64, 48, 128, 28, Some(64)),
            // 20 layers: USO reads SigLIP's hidden states 20 and 11 from the end.
            siglip: vision_config(clip_vision::Variant::Siglip, 64, 20, 128, 28, None),
            // SigLIP's tiny width in, the tiny FLUX.1 DiT's text width out.
            redux: clip_vision::ReduxConfig { input: 64, hidden: 3 * 32, output: 32 },
            uso: flux::UsoConfig { siglip_tokens: 4, style_tokens: 4, siglip_dim: 64, hidden: 128 },
            // Two heads of the released width (so the q/k norms span heads), the released text width, and the
            // tiny CLIP vision H's width, so the tiny files run together as the templates wire them.
            wan21: wan_config(256, 512, 2, (16, 16)),
            wan22: wan_config(256, 512, 2, (48, 48)),
            wan_14b: wan_config(256, 512, 2, (16, 16)),
            wan_clip_dim: 64,
            esrgan: esrgan::Config { filters: 8, blocks: 1, ..esrgan::Config::x4plus() },
            // Heads of 64 (detection's width), so the narrowest level is 64 wide.
            lotus: crate::unet::Shape {
                model_channels: 64,
                channel_mult: vec![1, 2],
                res_blocks: 1,
                depths: vec![1, 1],
                ..crate::unet::Shape::lotus()
            },
            // Heads of 64; attention at the second level and in the middle, as SDXL's first level has none.
            sdxl: crate::unet::Shape {
                model_channels: 64,
                channel_mult: vec![1, 2],
                res_blocks: 1,
                depths: vec![0, 1],
                middle_depth: 1,
                ..crate::unet::Shape::sdxl()
            },
            sdxl_refiner: crate::unet::Shape {
                model_channels: 64,
                channel_mult: vec![1, 2],
                res_blocks: 1,
                depths: vec![0, 1],
                middle_depth: 1,
                ..crate::unet::Shape::sdxl_refiner()
            },
            // Three heads of the released width (wider than the pooled vector: a square pooled embedding marks
            // the 8B ControlNets'); a 16² table (images up to 256 pixels a side).
            sd3: crate::sd3::Config {
                dim: 192,
                heads: 3,
                blocks: 2,
                in_channels: 16,
                out_channels: 16,
                pos_embed_max: 16,
                adm_width: 128,
                context_width: 128,
                qk_norm: true,
            },
            sd_vae: VaeShape { z: SD_VAE_Z, ..VaeShape::tiny() },
            // One head of the released width (detection keys the RoPE axes on it), on the tiny Qwen2.5-VL's and
            // CLIP-L's widths.
            kandinsky5: crate::kandinsky5::Config {
                dim: 128,
                time_dim: 64,
                ff_dim: 256,
                text_dim: 32,
                pooled_dim: 64,
                channels: 16,
                text_blocks: 1,
                visual_blocks: 2,
                head_dim: 128,
                axes: [32, 48, 48],
                rope_scale: [1.0; 3],
                video: false,
            },
            // Two heads of the video models' width (detection keys the RoPE axes on it), on the same encoders.
            kandinsky5_video: crate::kandinsky5::Config {
                dim: 128,
                time_dim: 64,
                ff_dim: 256,
                text_dim: 32,
                pooled_dim: 64,
                channels: 16,
                text_blocks: 1,
                visual_blocks: 2,
                head_dim: 64,
                axes: [16, 24, 24],
                rope_scale: [1.0, 2.0, 2.0],
                video: true,
            },
            // Two heads of 48 sharing one key/value head, on the tiny Gemma 2's width.
            lumina2: lumina2_config(96, 2, 1, 2, 1, 64),
            // One head of the released width (detection assumes it); room for the synthetic tokenizer's pieces.
            gemma2: decoder_config(qwen3::Variant::Gemma2, 512, 64, 2, (1, 1), 128),
            // Two heads of 48 sharing one key/value head, on the tiny Qwen2.5-VL's width.
            omnigen2: omnigen2_config(96, 2, 1, 2, 1, 32),
            // One double-stream block before the OmniGen2 widths, on the tiny Qwen3-VL's width.
            boogu: boogu_config(omnigen2_config(96, 2, 1, 2, 1, 128), 1),
            // Two heads of the released width (detection assumes it), on the tiny Qwen2.5-VL's, ByT5's and
            // SigLIP's widths.
            hunyuan_video15: hunyuan_video15_config(256, 2, 1, (32, 32, 64)),
            // Two heads of the released width, on the tiny Llama's and CLIP-L's widths.
            hunyuan_video: hunyuan_video1_config(256, (1, 1), (32, 64)),
            // Two heads of the released width (detection assumes it) over one key/value head, on the tiny
            // Qwen3-VL 4B's 12 taps.
            krea2: crate::krea2::Config {
                features: 256,
                channels: 16,
                layers: 2,
                heads: 2,
                kv_heads: 1,
                mlp_dim: 256,
                time_dim: 64,
                text_layers: 12,
                text_dim: 128,
                text_heads: 1,
                text_kv_heads: 1,
                text_mlp_dim: 128,
                axes: [32, 48, 48],
            },
            // Two blocks of two heads of 32 on the tiny Qwen3-VL 4B's width.
            mage_flow: crate::mage_flow::Config {
                dim: 64,
                heads: 2,
                head_dim: 32,
                layers: 2,
                mlp_hidden: 256,
                text_dim: 128,
                axes_dims: [4, 14, 14],
            },
            // Two patch blocks of two heads of 32 and one pixel block at the released patch and pixel widths, on
            // the tiny Gemma 2's 64-wide states.
            pixeldit: crate::pixeldit::Config {
                layout: crate::pixeldit::Layout::Released,
                hidden: 64,
                heads: 2,
                head_dim: 32,
                ffn_dim: 128,
                patch_depth: 2,
                pixel_depth: 1,
                patch: 16,
                pixel_dim: 16,
                pixel_mlp: 32,
                attn_dim: 64,
                attn_heads: 2,
                attn_head_dim: 32,
                text_dim: 64,
                text_max: 300,
            },
            // Two blocks of two heads of 64 at FLUX.2's 128 channels, the tiny Ministral's 32-wide states
            // projected.
            ernie: crate::ernie::Config {
                hidden: 128,
                channels: 128,
                layers: 2,
                heads: 2,
                head_dim: 64,
                ffn_dim: 64,
                text_dim: 32,
                text_proj: true,
                axes: [16, 24, 24],
            },
            // Two blocks of two heads of 64 (the frame axis keeps its released 16 of RoPE) on the tiny Qwen3-VL
            // 4B's width, which stands in for the 8B.
            joyimage: crate::joyimage::Config {
                hidden: 128,
                channels: 16,
                layers: 2,
                heads: 2,
                head_dim: 64,
                mlp_dim: 256,
                text_dim: 128,
                patch: [1, 2, 2],
                axes: [16, 24, 24],
            },
            chroma_radiance_nerf: (32, 1, 2),
            // One block a stage, at the released latent (128) and patch (16), one GroupNorm group of 32 wide.
            mage_vae: crate::mage_vae::Config {
                image_channels: 3,
                encoder: crate::mage_vae::EncoderConfig {
                    head: 32,
                    head_blocks: 1,
                    head_ffn: 64,
                    hidden: 32,
                    blocks: 1,
                    ffn: 64,
                    frequencies: 32,
                    out_channels: 256,
                },
                decoder: crate::mage_vae::DecoderConfig {
                    hidden: 32,
                    cod: vec![
                        crate::mage_vae::CodBlock::Resnet,
                        crate::mage_vae::CodBlock::Attention,
                    ],
                    blocks: 1,
                    ffn: 64,
                    frequencies: 32,
                    pixel: 8,
                    pixel_blocks: 1,
                    dct_frequencies: 8,
                },
            },
            // The released 16 latent channels under levels of one or two GroupNorms' 32 groups.
            kl_video_vae: crate::kl_video_vae::Config {
                widths: [32, 32, 64, 64],
                ..crate::kl_video_vae::Config::released()
            },
            // The released 32 latent channels (detection keys on them) under narrow levels.
            hunyuan_vae: crate::hunyuan_vae::Config {
                widths: [8, 16, 32, 64, 64],
                ..crate::hunyuan_vae::Config::released()
            },
            // The 3B's two key/value heads (detection tells the 3B by them), narrow.
            omnigen2_qwen25vl: decoder_config(qwen3::Variant::Qwen25Vl, 152_064, 32, 2, (2, 2), 64),
            // Two heads of the released width; the adapter reads the 0.6B's 1024-wide states.
            anima: crate::anima::Config {
                dim: 256,
                head_dim: 128,
                blocks: 2,
                channels: 16,
                context_dim: 64,
                adaln_lora_dim: 32,
                mlp_dim: 1024,
                rope_extrapolation: [1.0, 4.0, 4.0],
                adapter: crate::anima::AdapterConfig {
                    vocab: 32128,
                    target_dim: 64,
                    model_dim: 64,
                    source_dim: 1024,
                    layers: 2,
                    head_dim: 32,
                },
            },
            // Qwen3 0.6B's width (ComfyUI tells Anima's encoder by it) over one layer.
            qwen3_06b: Qwen3Shape {
                vocab: 151936,
                hidden: 1024,
                layers: 1,
                heads: 2,
                kv_heads: 1,
                head_dim: 64,
                intermediate: 64,
            },
            // 32 layers: HuMo reads 33 states; 20 heads of 2.
            whisper: whisper::Config { mels: 128, width: 40, layers: 32 },
            humo: wan::Humo { channels: 40, hidden: 32, audio_dim: 64, tokens: 16 },
            wav2vec2: [wav2vec2::Variant::Large, wav2vec2::Variant::Base]
                .map(|variant| wav2vec2::Config { width: 64, conv_dim: 32, layers: 2, variant }),
            // The tiny large wav2vec2's 3 states of 64; one injector (the tiny 14B has 2 blocks).
            s2v: wan::s2v::S2v {
                audio_dim: 64,
                audio_layers: 3,
                audio_tokens: 4,
                injectors: 1,
                cond_channels: 16,
            },
            // The tiny 14B width; the tiny base wav2vec2's 2 layers of 64.
            infinite_talk: wan::infinite_talk::TalkConfig {
                dim: 256,
                hidden: 16,
                features: 2 * 64,
                tokens: 4,
                audio_dim: 16,
                blocks: 2,
            },
            // Four heads of 8; one injector (the tiny 14B has 2 blocks, and ComfyUI's injectors start at block 0).
            dancer: wan::Dancer {
                features: 35,
                width: 32,
                ffn: 64,
                layers: 2,
                injectors: 1,
                clip_dim: 64,
            },
        }
    }

    fn validate(&self) -> Result<()> {
        if self.qwen3.hidden != self.zimage.cap_feat_dim {
            return Err(Error::Invalid(format!(
                "the text encoder's hidden width {} is not the DiT's caption width {}",
                self.qwen3.hidden, self.zimage.cap_feat_dim
            )));
        }
        if self.anima.adapter.source_dim != self.qwen3_06b.hidden {
            return Err(Error::Invalid(format!(
                "Anima's adapter reads {}-wide states, not Qwen3 0.6B's {}",
                self.anima.adapter.source_dim, self.qwen3_06b.hidden
            )));
        }
        if self.lumina2.cap_feat_dim != self.gemma2.hidden {
            return Err(Error::Invalid(format!(
                "Lumina 2's caption width {} is not Gemma 2's {}",
                self.lumina2.cap_feat_dim, self.gemma2.hidden
            )));
        }
        if self.gemma2.vocab < t5::SYNTH_BPE_PIECES {
            return Err(Error::Invalid(format!(
                "a Gemma 2 vocabulary of {} rows is smaller than the synthetic tokenizer's {} pieces",
                self.gemma2.vocab,
                t5::SYNTH_BPE_PIECES
            )));
        }
        if self.boogu.text_feat_dim != self.qwen3vl_4b.hidden && self.boogu.text_feat_dim != 4096 {
            return Err(Error::Invalid(format!(
                "Boogu-Image's instruction width {} is not the tiny Qwen3-VL's {} (nor Qwen3-VL 8B's 4096)",
                self.boogu.text_feat_dim, self.qwen3vl_4b.hidden
            )));
        }
        if self.omnigen2.text_feat_dim != self.omnigen2_qwen25vl.hidden {
            return Err(Error::Invalid(format!(
                "OmniGen2's text width {} is not Qwen2.5-VL 3B's {}",
                self.omnigen2.text_feat_dim, self.omnigen2_qwen25vl.hidden
            )));
        }
        let hv = &self.hunyuan_video15;
        let hv_widths = (hv.context_dim, hv.byt5.map(|w| w.in_dim), hv.vision_dim);
        if hv_widths != (self.qwen25vl.hidden, Some(self.byt5.d_model), Some(self.siglip.hidden)) {
            return Err(Error::Invalid(format!(
                "HunyuanVideo 1.5's text, ByT5 and vision widths {hv_widths:?} are not Qwen2.5-VL's {}, ByT5's {} \
                 and SigLIP's {}",
                self.qwen25vl.hidden, self.byt5.d_model, self.siglip.hidden
            )));
        }
        let v1 = &self.hunyuan_video;
        if (v1.context_dim, v1.vec_dim) != (self.llama3.hidden, Some(self.clip_l.hidden)) {
            return Err(Error::Invalid(format!(
                "HunyuanVideo 1.0's text and pooled widths {} and {:?} are not Llama 3's {} and CLIP-L's {}",
                v1.context_dim, v1.vec_dim, self.llama3.hidden, self.clip_l.hidden
            )));
        }
        let k5v = &self.kandinsky5_video;
        if (k5v.text_dim, k5v.pooled_dim) != (self.qwen25vl.hidden, self.clip_l.hidden) {
            return Err(Error::Invalid(format!(
                "Kandinsky 5 video's text and pooled widths {} and {} are not Qwen2.5-VL's {} and CLIP-L's {}",
                k5v.text_dim, k5v.pooled_dim, self.qwen25vl.hidden, self.clip_l.hidden
            )));
        }
        let k5 = &self.kandinsky5;
        if (k5.text_dim, k5.pooled_dim) != (self.qwen25vl.hidden, self.clip_l.hidden) {
            return Err(Error::Invalid(format!(
                "Kandinsky 5's text and pooled widths {} and {} are not Qwen2.5-VL's {} and CLIP-L's {}",
                k5.text_dim, k5.pooled_dim, self.qwen25vl.hidden, self.clip_l.hidden
            )));
        }
        let taps = crate::qwen3::family::KREA2_TAPS.len();
        if (self.krea2.text_dim, self.krea2.text_layers) != (self.qwen3vl_4b.hidden, taps) {
            return Err(Error::Invalid(format!(
                "Krea 2's text adapter reads {} states {} wide, not Qwen3-VL 4B's {taps} of {}",
                self.krea2.text_layers, self.krea2.text_dim, self.qwen3vl_4b.hidden
            )));
        }
        if self.joyimage.axes
            != crate::joyimage::rope_axes(self.joyimage.head_dim).unwrap_or_default()
        {
            return Err(Error::Invalid(format!(
                "JoyAI Image Edit's RoPE widths {:?} are not the split of its {}-wide heads",
                self.joyimage.axes, self.joyimage.head_dim
            )));
        }
        if self.pixeldit.text_dim != self.gemma2.hidden {
            return Err(Error::Invalid(format!(
                "PixelDiT's text width {} is not Gemma 2's {}",
                self.pixeldit.text_dim, self.gemma2.hidden
            )));
        }
        if self.ernie.text_dim != self.ministral.hidden
            || Some(self.ernie.axes) != crate::ernie::rope_axes(self.ernie.head_dim)
        {
            return Err(Error::Invalid(format!(
                "ERNIE-Image's text width {} is not Ministral 3 3B's {}, or its RoPE widths {:?} are not the \
                 split of its {}-wide heads",
                self.ernie.text_dim, self.ministral.hidden, self.ernie.axes, self.ernie.head_dim
            )));
        }
        if self.mage_flow.text_dim != self.qwen3vl_4b.hidden {
            return Err(Error::Invalid(format!(
                "Mage-Flow's text width {} is not Qwen3-VL 4B's {}",
                self.mage_flow.text_dim, self.qwen3vl_4b.hidden
            )));
        }
        Ok(())
    }
}

/// The DiT's tensors at `shape`: names (ComfyUI layout, no prefix) and shapes, in model order.
pub fn zimage_tensors(shape: &ZImageShape) -> Result<Vec<(String, Vec<usize>)>> {
    Ok(names_and_shapes(zimage_specs(shape)?))
}

/// The text encoder's tensors at `shape`: names (Hugging Face layout) and shapes, in model order.
pub fn qwen3_tensors(shape: &Qwen3Shape) -> Result<Vec<(String, Vec<usize>)>> {
    Ok(names_and_shapes(qwen3_specs(shape)?))
}

/// The VAE's tensors at `shape`: names (LDM layout, `encoder.*` then `decoder.*`) and shapes.
pub fn flux_vae_tensors(shape: &VaeShape) -> Result<Vec<(String, Vec<usize>)>> {
    Ok(names_and_shapes(vae_specs(shape)?))
}

/// Writes a random-weight DiT to `path`, every tensor in `dtype`; `progress(bytes written, file size)`.
pub fn write_zimage(
    path: &Path,
    shape: &ZImageShape,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    write_one(path, &zimage_specs(shape)?, ZIMAGE, "Z-Image DiT", dtype, seed, progress)
}

/// Writes a random-weight Qwen3 text encoder to `path`, every tensor in `dtype`; `progress(bytes written, file
/// size)`.
pub fn write_qwen3(
    path: &Path,
    shape: &Qwen3Shape,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    write_one(path, &qwen3_specs(shape)?, QWEN3, "Qwen3 text encoder", dtype, seed, progress)
}

/// Writes a random-weight Qwen3-VL (language model `shape` and vision tower `vision`) to `path` in transformers'
/// layout, as `qwen3vl_4b_bf16.safetensors` keeps them (`model.language_model.*`, `model.visual.*`), every tensor
/// in `dtype`; `progress(bytes written, file size)`.
pub fn write_qwen3vl(
    path: &Path,
    shape: &Qwen3Shape,
    vision: &crate::qwen3vl_vision::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut specs = qwen3_specs(shape)?;
    specs.extend(specs_of(vision.expected()));
    for spec in &mut specs {
        if let Some(rest) = spec.name.strip_prefix("model.") {
            spec.name = format!("{}{rest}", crate::header::NESTED_LANGUAGE_MODEL);
        } else if spec.name.starts_with("visual.") {
            spec.name = format!("model.{}", spec.name);
        }
    }
    write_one(path, &specs, QWEN3, "Qwen3-VL", dtype, seed, progress)
}

/// Writes a random-weight Flux VAE to `path` in `dtype` (f32 as released, bf16 or f16; fp8 is an
/// [`Error::Invalid`]); `progress(bytes written, file size)`.
pub fn write_flux_vae(
    path: &Path,
    shape: &VaeShape,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check_vae_dtype(dtype)?;
    write_one(path, &vae_specs(shape)?, VAE, "Flux VAE", dtype, seed, progress)
}

/// Writes a random-weight FLUX.2 VAE at `shape`'s widths (z 32; see the layout's `flux2_vae_specs`) to
/// `path` in the released layout, every tensor in `dtype` (f32, bf16 or f16); `progress(bytes written, file
/// size)`.
pub fn write_flux2_vae(
    path: &Path,
    shape: &VaeShape,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check_vae_dtype(dtype)?;
    let specs = layout::flux2_vae_specs(shape)?;
    write_one(path, &specs, FLUX2_VAE, "FLUX.2 VAE", dtype, seed, progress)
}

/// Writes a random-weight LoRA for the DiT at `shape` to `path` (see the layout's `zimage_lora_specs`: every
/// attention and SwiGLU weight adapted, diffusers' names), every tensor in `dtype`; `progress(bytes written,
/// file size)`.
pub fn write_zimage_lora(
    path: &Path,
    shape: &ZImageShape,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    write_one(path, &zimage_lora_specs(shape)?, ZIMAGE_LORA, "Z-Image LoRA", dtype, seed, progress)
}

/// Writes one random-weight file of `family` at `set`'s configuration to `path`, creating its folder: the
/// network in `dtype` (a VAE only in f32, bf16 or f16). Any name will do: the templates name their files in
/// many ways, and detection reads the tensors, never the name. `progress(bytes written, file size)`.
pub fn write_family(
    path: &Path,
    family: SynthFamily,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    set.validate()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Invalid(format!("creating {}: {e}", dir.display())))?;
    }
    match family {
        SynthFamily::Diffusion(DiffusionFamily::ZImage) => {
            write_zimage(path, &set.zimage, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Boogu) => {
            let specs = specs_of(crate::omnigen2::expected(&set.boogu));
            write_one(path, &specs, OMNIGEN2, "Boogu-Image DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::OmniGen2) => {
            let specs = specs_of(crate::omnigen2::expected(&set.omnigen2));
            write_one(path, &specs, OMNIGEN2, "OmniGen2 DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Lumina2) => {
            write_lumina2_checkpoint(path, set, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Gemma2) => {
            let specs = gemma2_specs(&set.gemma2);
            write_one(path, &specs, GEMMA2, "Gemma 2 text encoder", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Qwen3) => {
            write_qwen3(path, &set.qwen3, dtype, seed, progress)
        }
        // Klein's encoder is a Qwen3 file (CLIPLoader's type makes it Klein's) deep enough for its taps: the
        // real Qwen3-4B, or the tiny widths over 28 layers.
        SynthFamily::TextEncoder(TextEncoderFamily::Flux2Klein) => {
            let deepest = crate::qwen3::KLEIN_TAPS[crate::qwen3::KLEIN_TAPS.len() - 1];
            let shape = Qwen3Shape { layers: set.qwen3.layers.max(deepest + 1), ..set.qwen3 };
            write_qwen3(path, &shape, dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::Flux) => write_flux_vae(path, &set.vae, dtype, seed, progress),
        SynthFamily::Vae(VaeFamily::Flux2) => {
            write_flux2_vae(path, &set.vae, dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::Wan21) => {
            write_wan_vae(path, &set.wan_vae, dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::Wan22) => {
            write_wan22_vae(path, &set.wan22_vae, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::QwenImage) => {
            write_qwen_image(path, &set.qwen_image, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Qwen25Vl) => {
            write_qwen25vl(path, &set.qwen25vl, &set.qwen25vl_vision, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Mistral3) => {
            write_mistral3(path, &set.mistral3, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Ernie) => {
            write_mistral3(path, &set.ministral, dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::QwenImage) => {
            write_qwen_image_lora(path, &set.qwen_image, dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::ZImage) => {
            write_zimage_lora(path, &set.zimage, dtype, seed, progress)
        }
        SynthFamily::QwenImageLayered(LayeredFile::Dit) => {
            let config = qwen_image::Config { additional_t_cond: true, ..set.qwen_image.clone() };
            write_qwen_image(path, &config, dtype, seed, progress)
        }
        SynthFamily::QwenImageLayered(LayeredFile::Vae) => {
            let config = wan_vae::Config { in_channels: 4, out_channels: 4, ..set.wan_vae.clone() };
            write_wan_vae(path, &config, dtype, seed, progress)
        }
        SynthFamily::QwenImageControlNet(file) => {
            let specs = specs_of(qwen_image::expected_control(&file.config(&set.qwen_image)));
            write_one(
                path,
                &specs,
                QWEN_IMAGE_CONTROLNET,
                "Qwen-Image ControlNet",
                dtype,
                seed,
                progress,
            )
        }
        SynthFamily::QwenImageBlockwise => {
            let config = blockwise_config(&set.qwen_image);
            let specs = specs_of(qwen_image::expected_blockwise(&config));
            let what = "Qwen-Image DiffSynth ControlNet";
            write_one(path, &specs, QWEN_IMAGE_CONTROLNET, what, dtype, seed, progress)
        }
        SynthFamily::AnimaLllite(inpaint) => {
            let config = lllite_config(&set.anima, inpaint);
            let specs = specs_of(crate::anima::lllite_expected(&config));
            let (entries, layers) = entries(&specs, ANIMA_LLLITE, "", dtype);
            let mut meta = metadata("Anima ControlNet-LLLite", seed, layers);
            meta.push(("lllite.version".to_owned(), "2".to_owned()));
            meta.push(("lllite.aspp_dilations".to_owned(), "1,2,4,8".to_owned()));
            meta.push(("lllite.inpaint_masked_input".to_owned(), inpaint.to_string()));
            Plan::new(path, entries, &meta).write(seed, progress)
        }
        SynthFamily::ZImageFunControlNet => {
            let specs = specs_of(zimage::fun_control_expected(&fun_control_config(&set.zimage)));
            let what = "Z-Image Fun ControlNet";
            write_one(path, &specs, ZIMAGE_CONTROLNET, what, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Flux) => {
            let specs = specs_of(flux::expected(&set.flux));
            write_one(path, &specs, FLUX, "FLUX.1 DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::LongCatImage) => {
            let specs = specs_of(flux::expected(&set.longcat));
            write_one(path, &specs, FLUX, "LongCat-Image DiT", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::LongCatImage) => {
            write_flux_lora(path, &set.longcat, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Chroma) => {
            let specs = specs_of(flux::expected(&set.chroma));
            write_one(path, &specs, FLUX, "Chroma DiT", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Chroma) => {
            write_flux_lora(path, &set.chroma, dtype, seed, progress)
        }
        SynthFamily::OmniGen2TextEncoder => {
            let config = &set.omnigen2_qwen25vl;
            let vision = VisionConfig { out_hidden: config.hidden, ..set.qwen25vl_vision };
            write_qwen25vl(path, config, &vision, dtype, seed, progress)
        }
        SynthFamily::LongCatTextEncoder => {
            let vision =
                VisionConfig { out_hidden: set.longcat_qwen25vl.hidden, ..set.qwen25vl_vision };
            write_qwen25vl(path, &set.longcat_qwen25vl, &vision, dtype, seed, progress)
        }
        SynthFamily::Flux(file) if file.is_checkpoint() => {
            write_flux_checkpoint(path, file, set, dtype, seed, progress)
        }
        SynthFamily::Flux(file) => {
            let specs = specs_of(flux::expected(&file.config(&set.flux)));
            write_one(path, &specs, FLUX, "FLUX.1 DiT", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::ClipL) => {
            let specs = specs_of(set.clip_l.expected());
            write_one(path, &specs, CLIP_L, "CLIP-L text encoder", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Umt5Xxl) => {
            write_umt5(path, &set.umt5, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl) => {
            let specs = specs_of(set.t5.expected());
            write_one(path, &specs, T5XXL, "T5-XXL text encoder", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Flux) => Err(Error::Invalid(
            "FLUX.1's text encoder is two files: write `clip-l` and `t5xxl`".to_owned(),
        )),
        SynthFamily::TextEncoder(TextEncoderFamily::HiDream) => Err(Error::Invalid(
            "HiDream's text encoder is four files: write `clip-l`, `clip-g`, `t5xxl` and `llama3`"
                .to_owned(),
        )),
        SynthFamily::ByT5 => {
            let specs = specs_of(set.byt5.expected());
            write_one(path, &specs, BYT5, "ByT5 text encoder", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::HunyuanVideo) => Err(Error::Invalid(
            "HunyuanVideo's text encoders are two files: a CLIP-L (--family clip-l) and a Llama 3 (--family \
             llama3), loaded together with DualCLIPLoader type hunyuan_video"
                .to_owned(),
        )),
        SynthFamily::TextEncoder(TextEncoderFamily::HunyuanVideo15) => Err(Error::Invalid(
            "HunyuanVideo 1.5's text encoders are two files: a Qwen2.5-VL (--family qwen25vl) and a ByT5 (--family \
             byt5-small-glyph), loaded together with DualCLIPLoader type hunyuan_video_15"
                .to_owned(),
        )),
        SynthFamily::ClipG => {
            let specs = specs_of(set.clip_g.expected());
            write_one(path, &specs, CLIP_G, "CLIP-G text encoder", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Llama3) => {
            let specs = specs_of(llama3_expected(&set.llama3));
            write_one(path, &specs, LLAMA3, "Llama 3.1 text encoder", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::HiDream) => {
            let specs = specs_of(hidream::expected(&set.hidream));
            write_one(path, &specs, HIDREAM, "HiDream DiT", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::HiDream) => {
            write_hidream_lora(path, &set.hidream, dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Flux) => {
            write_flux_lora(path, &set.flux, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Flux2) => {
            let specs = specs_of(flux::expected(&set.flux2));
            write_one(path, &specs, FLUX2, "FLUX.2 DiT", dtype, seed, progress)
        }
        SynthFamily::Flux2(file) => {
            let specs = specs_of(flux::expected(&file.config(set)));
            write_one(path, &specs, FLUX2, "FLUX.2 DiT", dtype, seed, progress)
        }
        SynthFamily::ClipVision(file) => {
            let specs = specs_of(file.config(set).expected());
            write_one(path, &specs, CLIP_VISION, "CLIP vision tower", dtype, seed, progress)
        }
        SynthFamily::FluxRedux => {
            let specs = specs_of(set.redux.expected());
            write_one(path, &specs, FLUX_REDUX, "FLUX.1 Redux", dtype, seed, progress)
        }
        SynthFamily::FluxUso => {
            let named = flux::uso_expected(&set.uso)
                .into_iter()
                .map(|(name, shape)| (format!("{}{name}", flux::USO_PREFIX), shape));
            let specs = specs_of(named.collect());
            write_one(path, &specs, FLUX_USO, "USO style projector", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Flux2) => {
            write_flux_lora(path, &set.flux2, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Wan21) => {
            write_wan(path, &set.wan21, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Wan22) => {
            write_wan(path, &set.wan22, dtype, seed, progress)
        }
        SynthFamily::Wan(file) => write_wan(path, &file.config(set), dtype, seed, progress),
        SynthFamily::WanInfiniteTalk => {
            let specs = specs_of(wan::infinite_talk::talk_expected(&set.infinite_talk));
            write_one(path, &specs, WAN_INFINITE_TALK, "InfiniteTalk patch", dtype, seed, progress)
        }
        SynthFamily::Whisper => {
            let specs = specs_of(whisper::expected_shapes(&set.whisper));
            write_one(path, &specs, WHISPER, "Whisper encoder", dtype, seed, progress)
        }
        SynthFamily::Wav2Vec2(variant) => {
            let config = match variant {
                wav2vec2::Variant::Large => &set.wav2vec2[0],
                wav2vec2::Variant::Base => &set.wav2vec2[1],
            };
            let specs = specs_of(wav2vec2::expected_shapes(config));
            write_one(path, &specs, WAV2VEC2, "wav2vec2 encoder", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Lotus) => {
            let specs = specs_of(crate::unet::tensors(&crate::unet::Config::build(&set.lotus)));
            write_one(path, &specs, UNET, "Lotus depth UNet", dtype, seed, progress)
        }
        SynthFamily::Lora(
            family @ (DiffusionFamily::Lotus
            | DiffusionFamily::Sdxl
            | DiffusionFamily::SdxlRefiner
            | DiffusionFamily::Sd3
            | DiffusionFamily::OvisImage
            | DiffusionFamily::Kandinsky5
            | DiffusionFamily::Kandinsky5Video
            | DiffusionFamily::Lumina2
            | DiffusionFamily::OmniGen2
            | DiffusionFamily::Boogu
            | DiffusionFamily::HunyuanVideo
            | DiffusionFamily::HunyuanVideo15
            | DiffusionFamily::MageFlow
            | DiffusionFamily::JoyImage
            | DiffusionFamily::ChromaRadiance
            | DiffusionFamily::Ernie
            | DiffusionFamily::PixelDit),
        ) => Err(Error::Invalid(format!("Kiln has no {} LoRA to write", family.name()))),
        SynthFamily::Diffusion(DiffusionFamily::OvisImage) => {
            let specs = specs_of(flux::expected(&ovis_config(set)));
            write_one(path, &specs, FLUX, "Ovis-Image DiT", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::PixelDit) => Err(Error::Invalid(
            "PixelDiT's text encoder is a Gemma 2 file (--family gemma2-2b, loaded with CLIPLoader type pixeldit)"
                .to_owned(),
        )),
        SynthFamily::TextEncoder(TextEncoderFamily::Ovis) => Err(Error::Invalid(
            "Ovis-Image's text encoder is a Qwen3 file (--family qwen3, loaded with CLIPLoader type ovis)"
                .to_owned(),
        )),
        SynthFamily::TextEncoder(TextEncoderFamily::Qwen3Vl) => {
            write_qwen3vl(path, &set.qwen3vl_4b, &set.qwen3vl_vision, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Krea2 | TextEncoderFamily::MageFlow) => {
            Err(Error::Invalid(
                "Krea 2's and Mage-Flow's text encoder is a Qwen3-VL 4B file (--family qwen3vl-4b, loaded with \
                 CLIPLoader type krea2 or mage)"
                    .to_owned(),
            ))
        }
        SynthFamily::TextEncoder(TextEncoderFamily::JoyImage) => Err(Error::Invalid(
            "JoyAI Image Edit's text encoder is a Qwen3-VL file (--family qwen3vl-4b stands in, loaded with \
             CLIPLoader type joyimage)"
                .to_owned(),
        )),
        SynthFamily::TextEncoder(TextEncoderFamily::Boogu) => Err(Error::Invalid(
            "Boogu-Image's text encoder is a Qwen3-VL file (--family qwen3vl-4b stands in, loaded with CLIPLoader \
             type boogu)"
                .to_owned(),
        )),
        SynthFamily::Diffusion(DiffusionFamily::Sd3) => {
            write_sd3_checkpoint(path, set, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Anima) => {
            let specs = specs_of(crate::anima::expected(&set.anima));
            write_one(path, &specs, ANIMA, "Anima DiT", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Anima) => {
            write_anima_lora(path, &set.anima, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Anima) => {
            write_qwen3(path, &set.qwen3_06b, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::HunyuanVideo) => {
            let specs = specs_of(crate::hunyuan_video::expected(&set.hunyuan_video));
            write_one(path, &specs, HUNYUAN_VIDEO, "HunyuanVideo DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::HunyuanVideo15) => {
            let specs = specs_of(crate::hunyuan_video::expected(&set.hunyuan_video15));
            write_one(path, &specs, HUNYUAN_VIDEO, "HunyuanVideo 1.5 DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Krea2) => {
            let specs = specs_of(crate::krea2::expected(&set.krea2));
            write_one(path, &specs, KREA2, "Krea 2 DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::ChromaRadiance) => {
            let config = chroma_radiance_config(&set.chroma, set.chroma_radiance_nerf);
            let specs = specs_of(crate::chroma_radiance::expected(&config));
            write_one(path, &specs, CHROMA_RADIANCE, "Chroma Radiance DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::PixelDit) => {
            let specs = specs_of(crate::pixeldit::expected(&set.pixeldit));
            write_one(path, &specs, PIXELDIT, "PixelDiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Ernie) => {
            let specs = specs_of(crate::ernie::expected(&set.ernie));
            write_one(path, &specs, ERNIE, "ERNIE-Image DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::JoyImage) => {
            let specs = specs_of(crate::joyimage::expected(&set.joyimage));
            write_one(path, &specs, JOYIMAGE, "JoyAI Image Edit DiT", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Krea2) => {
            write_krea2_lora(path, &set.krea2, dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::PixelSpace) => Err(Error::Invalid(
            "the pixel-space VAE has no file: VAELoader lists `pixel_space` beside the vae folder's files".to_owned(),
        )),
        SynthFamily::Vae(VaeFamily::MageFlow) => {
            check_vae_dtype(dtype)?;
            let specs = specs_of(crate::mage_vae::file_expected(&set.mage_vae));
            write_one(path, &specs, MAGE_VAE, "Mage-Flow VAE", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::MageFlow) => {
            let specs = specs_of(set.mage_flow.expected());
            write_one(path, &specs, MAGE_FLOW, "Mage-Flow DiT", dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::HunyuanVideo) => {
            let specs = specs_of(crate::kl_video_vae::expected(&set.kl_video_vae));
            write_one(path, &specs, HUNYUAN_VIDEO, "HunyuanVideo VAE", dtype, seed, progress)
        }
        SynthFamily::Vae(VaeFamily::HunyuanVideo15) => {
            let specs = specs_of(crate::hunyuan_vae::expected(&set.hunyuan_vae));
            write_one(path, &specs, HUNYUAN_VIDEO, "HunyuanVideo 1.5 VAE", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Kandinsky5Video) => {
            let specs = specs_of(crate::kandinsky5::expected(&set.kandinsky5_video));
            write_one(path, &specs, KANDINSKY5, "Kandinsky 5 video DiT", dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::Kandinsky5) => {
            let specs = specs_of(crate::kandinsky5::expected(&set.kandinsky5));
            write_one(path, &specs, KANDINSKY5, "Kandinsky 5 DiT", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Kandinsky5) => Err(Error::Invalid(
            "Kandinsky 5's text encoders are two files: a Qwen2.5-VL (--family qwen25vl) and a CLIP-L (--family \
             clip-l), loaded together with DualCLIPLoader type kandinsky5_image"
                .to_owned(),
        )),
        SynthFamily::Sd3ControlNet(control_type) => {
            let config = sd3_control_config(set, control_type);
            let mut specs = specs_of(crate::sd3::control_file_tensors(&config));
            for spec in &mut specs {
                if spec.name == "control_type" {
                    spec.init = Init::Fill(control_type.value());
                }
            }
            write_one(path, &specs, SD3, "SD3.5 ControlNet", dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Sd3) => Err(Error::Invalid(
            "SD3's text encoders are written inside its checkpoints (--family sd3.5)".to_owned(),
        )),
        SynthFamily::Diffusion(DiffusionFamily::Sdxl) => {
            write_sdxl_checkpoint(path, set, false, dtype, seed, progress)
        }
        SynthFamily::Diffusion(DiffusionFamily::SdxlRefiner) => {
            write_sdxl_checkpoint(path, set, true, dtype, seed, progress)
        }
        SynthFamily::TextEncoder(TextEncoderFamily::Sdxl) => Err(Error::Invalid(
            "SDXL's text encoders are written inside its checkpoints (--family sdxl, sdxl-refiner)"
                .to_owned(),
        )),
        SynthFamily::SdVae => {
            check_vae_dtype(dtype)?;
            let specs = layout::sd_vae_specs(&set.sd_vae)?;
            write_one(path, &specs, SD_VAE, "SD VAE", dtype, seed, progress)
        }
        SynthFamily::Esrgan => {
            let specs = specs_of(esrgan::expected_shapes(&set.esrgan));
            write_one(path, &specs, ESRGAN, "ESRGAN upscale model", dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Wan21) => {
            write_wan_lora(path, &set.wan21, dtype, seed, progress)
        }
        SynthFamily::Lora(DiffusionFamily::Wan22) => {
            write_wan_lora(path, &set.wan22, dtype, seed, progress)
        }
    }
}

/// The Z-Image Fun ControlNet for a NextDiT of `base`'s widths, as released: 6 control layers and 2 refiner
/// blocks, diffusers' attention names, a 16-channel control latent.
pub fn fun_control_config(base: &ZImageShape) -> zimage::FunControlConfig {
    let head_dim = base.dim / base.heads;
    let layout = zimage::Layout::Diffusers;
    zimage::FunControlConfig::release(base.dim, head_dim, base.ffn_hidden, base.adaln, layout)
}

/// DiffSynth's block-wise ControlNet for a base model of `base`'s widths: a latent's 64 features in, one block
/// per base block.
pub fn blockwise_config(base: &qwen_image::Config) -> qwen_image::BlockwiseConfig {
    qwen_image::BlockwiseConfig { dim: base.dim, in_features: 64, blocks: base.layers }
}

/// Writes one checkpoint holding all three models under ComfyUI's prefixes ([`CHECKPOINT_DIFFUSION_PREFIX`],
/// [`CHECKPOINT_TEXT_ENCODER_PREFIX`], [`CHECKPOINT_VAE_PREFIX`]) for `CheckpointLoaderSimple`: the DiT and the
/// text encoder in `dtype`, the VAE in [`SynthDtype::for_vae`]. Each part's values equal the standalone file's
/// for the same seed.
pub fn write_checkpoint(
    path: &Path,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    set.validate()?;
    let (zimage, qwen3, vae) =
        (zimage_specs(&set.zimage)?, qwen3_specs(&set.qwen3)?, vae_specs(&set.vae)?);
    let (mut all, mut layers) = entries(&zimage, ZIMAGE, CHECKPOINT_DIFFUSION_PREFIX, dtype);
    for (more, more_layers) in [
        entries(&qwen3, QWEN3, CHECKPOINT_TEXT_ENCODER_PREFIX, dtype),
        entries(&vae, VAE, CHECKPOINT_VAE_PREFIX, dtype.for_vae()),
    ] {
        all.extend(more);
        layers.extend(more_layers);
    }
    let metadata = metadata("Z-Image-Turbo checkpoint", seed, layers);
    Plan::new(path, all, &metadata).write(seed, progress)
}

/// The config of a Lumina 2 NextDiT of width `dim` (`heads` of `dim / heads`, `kv_heads` key/value heads),
/// `layers` main blocks and `refiners` of each refiner, on `cap_feat_dim`-wide captions: ComfyUI's Lumina 2
/// settings (FFN 4·dim rounded up to 256, a t-embedding of min(dim, 1024), three equal RoPE axes, θ 10000).
fn lumina2_config(
    dim: usize,
    heads: usize,
    kv_heads: usize,
    layers: usize,
    refiners: usize,
    cap_feat_dim: usize,
) -> zimage::Config {
    let head_dim = dim / heads;
    let t_hidden = dim.min(1024);
    zimage::Config {
        variant: zimage::Variant::Lumina2,
        dim,
        heads,
        kv_heads,
        head_dim,
        layers,
        noise_refiners: refiners,
        context_refiners: refiners,
        ffn_hidden: (4 * dim).div_ceil(256) * 256,
        cap_feat_dim,
        t_freq_dim: 256,
        t_hidden,
        adaln_dim: t_hidden,
        axes_dims: [head_dim / 3; 3],
        rope_theta: 10_000.0,
        pad_multiple: 1,
        norm_eps: 1e-5,
        qk_norm_eps: f32::EPSILON,
        patch_size: 2,
        in_channels: 16,
        time_scale: 1.0,
        allow_fp16: false,
    }
}

/// The config of an OmniGen2 DiT of width `hidden` (`heads` of `hidden / heads`, `kv_heads` key/value heads),
/// `layers` joint blocks and `refiners` of each refiner, on `text_feat_dim`-wide states: ComfyUI's settings (FFN
/// 4·hidden rounded up to 256, a t-embedding of min(hidden, 1024), three equal RoPE axes, timestep scale 1000,
/// five reference slots).
fn omnigen2_config(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    layers: usize,
    refiners: usize,
    text_feat_dim: usize,
) -> crate::omnigen2::Config {
    let head_dim = hidden / heads;
    crate::omnigen2::Config {
        variant: crate::omnigen2::Variant::OmniGen2,
        double_stream_layers: 0,
        hidden,
        heads,
        kv_heads,
        head_dim,
        layers,
        refiners,
        ffn_hidden: (4 * hidden).div_ceil(256) * 256,
        text_feat_dim,
        t_freq_dim: 256,
        t_dim: hidden.min(1024),
        axes_dims: [head_dim / 3; 3],
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        patch_size: 2,
        in_channels: 16,
        timestep_scale: 1000.0,
        max_references: 5,
    }
}

/// A HunyuanVideo 1.5 DiT `hidden` wide (heads of the released 128), with `double` and `single` blocks, reading
/// `(text, byt5, vision)`-wide states: the 720p models' other settings (65 channels in, 32 out, 1×1 patches, the
/// ByT5 mapper 2048 wide at the released width, else `hidden`).
fn hunyuan_video15_config(
    hidden: usize,
    double: usize,
    single: usize,
    (text, byt5, vision): (usize, usize, usize),
) -> crate::hunyuan_video::Config {
    let mapper = if hidden == 2048 { 2048 } else { hidden };
    crate::hunyuan_video::Config {
        hidden,
        heads: hidden / crate::hunyuan_video::HEAD_DIM,
        double_blocks: double,
        single_blocks: single,
        refiner_blocks: 2,
        in_channels: 32 + crate::hunyuan_video::family::CONCAT_CHANNELS,
        out_channels: 32,
        patch: 1,
        context_dim: text,
        axes_dims: crate::hunyuan_video::AXES_DIMS,
        rope_theta: crate::hunyuan_video::ROPE_THETA,
        vec_dim: None,
        guidance: false,
        meanflow: false,
        byt5: Some(crate::hunyuan_video::ByT5Widths { in_dim: byt5, hidden: mapper, out: mapper }),
        vision_dim: Some(vision),
        cond_type_embedding: true,
    }
}

/// A HunyuanVideo 1.0 DiT `hidden` wide (heads of the released 128) with `(double, single)` blocks, reading
/// `(text, pooled)`-wide inputs: the 720p text-to-video model's other settings (16 channels in and out, 1×2×2
/// patches, a distilled guidance embedding).
fn hunyuan_video1_config(
    hidden: usize,
    (double, single): (usize, usize),
    (text, pooled): (usize, usize),
) -> crate::hunyuan_video::Config {
    crate::hunyuan_video::Config {
        in_channels: 16,
        out_channels: 16,
        patch: 2,
        context_dim: text,
        vec_dim: Some(pooled),
        guidance: true,
        byt5: None,
        vision_dim: None,
        cond_type_embedding: false,
        ..hunyuan_video15_config(hidden, double, single, (text, 0, 0))
    }
}

/// `config` (an OmniGen2 DiT's widths) as Boogu-Image's, with `double_stream_layers` double-stream blocks before
/// its single-stream ones.
fn boogu_config(
    config: crate::omnigen2::Config,
    double_stream_layers: usize,
) -> crate::omnigen2::Config {
    crate::omnigen2::Config {
        variant: crate::omnigen2::Variant::Boogu,
        double_stream_layers,
        ..config
    }
}

/// A decoder of `config` under the released names (`model.embed_tokens`, every layer, `model.norm`), without the
/// tokenizer its file carries.
fn decoder_weights(config: &qwen3::Config) -> Vec<Spec> {
    let mut tensors =
        vec![("model.embed_tokens.weight".to_owned(), vec![config.vocab, config.hidden])];
    for i in 0..config.layers {
        tensors.extend(config.layer_names(i).into_iter().zip(config.layer_shapes()));
    }
    tensors.push(("model.norm.weight".to_owned(), vec![config.hidden]));
    specs_of(tensors)
}

/// The synthetic SentencePiece model as the `spiece_model` tensor `name`.
fn spiece_spec(name: &str) -> Spec {
    let model = t5::synth_bpe_model();
    Spec { name: name.to_owned(), shape: vec![model.len()], init: Init::Bytes(model) }
}

/// A Gemma 2 file of `config` (`gemma_2_2b_fp16.safetensors`): its weights and a `spiece_model` tensor holding
/// the synthetic SentencePiece BPE model [`t5::synth_bpe_model`] (Gemma's special ids, byte fallback).
fn gemma2_specs(config: &qwen3::Config) -> Vec<Spec> {
    let mut specs = decoder_weights(config);
    specs.push(spiece_spec(t5::SPIECE_MODEL));
    specs
}

/// Writes Lumina 2's all-in-one checkpoint (`NetaYumev35_pretrained_all_in_one.safetensors`) as ComfyUI saves one:
/// the NextDiT under [`CHECKPOINT_DIFFUSION_PREFIX`], Gemma 2 under `text_encoders.gemma2_2b.transformer.` with
/// the SentencePiece model at `text_encoders.spiece_model` (all in `dtype`), the Flux VAE under `vae.` (in
/// [`SynthDtype::for_vae`]).
fn write_lumina2_checkpoint(
    path: &Path,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    use crate::zimage::family as names;
    let (dit, gemma, vae) = (
        specs_of(zimage::expected(&set.lumina2)),
        decoder_weights(&set.gemma2),
        vae_specs(&set.vae)?,
    );
    let spiece = [spiece_spec(crate::gemma2::CHECKPOINT_SPIECE_MODEL)];
    let (mut all, mut layers) = entries(&dit, LUMINA2, CHECKPOINT_DIFFUSION_PREFIX, dtype);
    for (more, more_layers) in [
        entries(&gemma, GEMMA2, names::LUMINA2_CHECKPOINT_TEXT_ENCODER_PREFIX, dtype),
        entries(&spiece, GEMMA2, "", dtype),
        entries(&vae, VAE, names::CHECKPOINT_VAE_PREFIX, dtype.for_vae()),
    ] {
        all.extend(more);
        layers.extend(more_layers);
    }
    Plan::new(path, all, &metadata("Lumina 2 checkpoint", seed, layers)).write(seed, progress)
}

/// Writes FLUX.1 schnell's all-in-one checkpoint (`flux1-schnell-fp8.safetensors`): the DiT under
/// [`CHECKPOINT_DIFFUSION_PREFIX`], CLIP-L and T5-XXL under ComfyUI's `text_encoders.` prefixes (all three in
/// `dtype`) and the Flux VAE under `vae.` (in [`SynthDtype::for_vae`]).
fn write_flux_checkpoint(
    path: &Path,
    file: FluxFile,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let dit = specs_of(flux::expected(&file.config(&set.flux)));
    let (clip_l, t5, vae) =
        (specs_of(set.clip_l.expected()), specs_of(set.t5.expected()), vae_specs(&set.vae)?);
    let (mut all, mut layers) = entries(&dit, FLUX, CHECKPOINT_DIFFUSION_PREFIX, dtype);
    for (more, more_layers) in [
        entries(&clip_l, CLIP_L, flux::family::CHECKPOINT_CLIP_L_PREFIX, dtype),
        entries(&t5, T5XXL, flux::family::CHECKPOINT_T5_PREFIX, dtype),
        entries(&vae, VAE, flux::family::CHECKPOINT_VAE_PREFIX, dtype.for_vae()),
    ] {
        all.extend(more);
        layers.extend(more_layers);
    }
    let what = match file {
        FluxFile::DevCheckpoint => "FLUX.1 dev checkpoint",
        _ => "FLUX.1 schnell checkpoint",
    };
    let metadata = metadata(what, seed, layers);
    Plan::new(path, all, &metadata).write(seed, progress)
}

/// Writes SDXL's all-in-one checkpoint (`sd_xl_base_1.0.safetensors`), or with `refiner` its refiner's
/// (`sd_xl_refiner_1.0.safetensors`), in the released layout: the UNet under `model.diffusion_model.`, CLIP-L in
/// transformers' layout under `conditioner.embedders.0.transformer.` and CLIP-G in OpenCLIP's under
/// `conditioner.embedders.1.model.` (the refiner: CLIP-G alone, under `conditioner.embedders.0.model.`), SD's
/// autoencoder under `first_stage_model.` (in [`SynthDtype::for_vae`]). The UNet's context and `label_emb`
/// widths follow the CLIPs'.
fn write_sdxl_checkpoint(
    path: &Path,
    set: &ZImageTurboSet,
    refiner: bool,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    use crate::unet::{self, family as names};
    let clip_g = clip_text::Config { layout: clip_text::Layout::OpenClip, ..set.clip_g };
    let g = clip_g.hidden;
    let (shape, what) = match refiner {
        false => (
            unet::Shape {
                context_dim: set.clip_l.hidden + g,
                adm_in_channels: Some(g + 6 * unet::sdxl::ADM_EMBED_WIDTH),
                ..set.sdxl.clone()
            },
            "SDXL checkpoint",
        ),
        true => (
            unet::Shape {
                context_dim: g,
                adm_in_channels: Some(g + 5 * unet::sdxl::ADM_EMBED_WIDTH),
                ..set.sdxl_refiner.clone()
            },
            "SDXL refiner checkpoint",
        ),
    };
    let unet_specs = specs_of(unet::tensors(&unet::Config::build(&shape)));
    let (clip_l, clip_g, vae) = (
        specs_of(set.clip_l.expected()),
        specs_of(clip_g.expected()),
        layout::sd_vae_specs(&set.sd_vae)?,
    );
    let (mut all, mut layers) = entries(&unet_specs, UNET, CHECKPOINT_DIFFUSION_PREFIX, dtype);
    let mut parts = Vec::new();
    if refiner {
        parts.push(entries(&clip_g, CLIP_G, names::REFINER_CHECKPOINT_CLIP_G_PREFIX, dtype));
    } else {
        parts.push(entries(&clip_l, CLIP_L, names::SDXL_CHECKPOINT_CLIP_L_PREFIX, dtype));
        parts.push(entries(&clip_g, CLIP_G, names::SDXL_CHECKPOINT_CLIP_G_PREFIX, dtype));
    }
    parts.push(entries(&vae, SD_VAE, names::CHECKPOINT_VAE_PREFIX, dtype.for_vae()));
    for (more, more_layers) in parts {
        all.extend(more);
        layers.extend(more_layers);
    }
    Plan::new(path, all, &metadata(what, seed, layers)).write(seed, progress)
}

/// Writes SD3.5's all-in-one checkpoint (`sd3.5_large_fp8_scaled.safetensors`) in ComfyUI's layout: the MMDiT
/// under `model.diffusion_model.`, CLIP-L, CLIP-G and T5-XXL in transformers' layouts under
/// `text_encoders.{clip_l,clip_g,t5xxl}.transformer.`, the 16-channel VAE under `first_stage_model.` (in
/// [`SynthDtype::for_vae`]). The MMDiT's pooled width is the CLIPs' together, its text width T5's (widened to at
/// least the CLIPs' together, which ComfyUI pads to it).
fn write_sd3_checkpoint(
    path: &Path,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    use crate::sd3::family as names;
    let clip_width = set.clip_l.hidden + set.clip_g.hidden;
    let t5 = t5::Config { d_model: set.t5.d_model.max(clip_width), ..set.t5 };
    let config =
        crate::sd3::Config { adm_width: clip_width, context_width: t5.d_model, ..set.sd3.clone() };
    let (mmdit, clip_l, clip_g, t5, vae) = (
        specs_of(crate::sd3::expected(&config)),
        specs_of(set.clip_l.expected()),
        specs_of(set.clip_g.expected()),
        specs_of(t5.expected()),
        vae_specs(&set.vae)?,
    );
    let (mut all, mut layers) = entries(&mmdit, SD3, CHECKPOINT_DIFFUSION_PREFIX, dtype);
    for (more, more_layers) in [
        entries(&clip_l, CLIP_L, names::CHECKPOINT_CLIP_L_PREFIX, dtype),
        entries(&clip_g, CLIP_G, names::CHECKPOINT_CLIP_G_PREFIX, dtype),
        entries(&t5, T5XXL, names::CHECKPOINT_T5_PREFIX, dtype),
        entries(&vae, VAE, names::CHECKPOINT_VAE_PREFIX, dtype.for_vae()),
    ] {
        all.extend(more);
        layers.extend(more_layers);
    }
    Plan::new(path, all, &metadata("SD3.5 checkpoint", seed, layers)).write(seed, progress)
}

/// The synthetic Ovis-Image DiT: the tiny FLUX.1's widths with Ovis-Image's SwiGLU MLPs and text norm, no
/// pooled vector or guidance, on the synthetic Qwen3's states (Ovis 2.5's stand-in).
pub fn ovis_config(set: &ZImageTurboSet) -> flux::Config {
    flux::Config {
        text_dim: set.qwen3.hidden,
        vec_dim: None,
        guidance: false,
        longcat: false,
        approximator: None,
        ovis: true,
        ..set.flux.clone()
    }
}

/// The config of a synthetic SD3.5 ControlNet of `control_type` for the synthetic SD3.5 checkpoint's MMDiT: its width
/// and heads, one block, the CLIPs' pooled width.
pub fn sd3_control_config(
    set: &ZImageTurboSet,
    control_type: crate::sd3::ControlType,
) -> crate::sd3::ControlConfig {
    crate::sd3::ControlConfig {
        dim: set.sd3.dim,
        heads: set.sd3.heads,
        blocks: 1,
        adm_width: set.clip_l.hidden + set.clip_g.hidden,
        hint_channels: set.sd3.in_channels,
        control_type,
    }
}

/// Writes the three files under `models_dir` at their real paths ([`DIFFUSION_MODEL_FILE`],
/// [`TEXT_ENCODER_FILE`], [`VAE_FILE`]), creating the folders: the DiT and the text encoder in `dtype`, the VAE
/// in f32 as released. `progress(bytes written, total of the three files)`.
pub fn write_models_dir(
    models_dir: &Path,
    set: &ZImageTurboSet,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    set.validate()?;
    let (zimage, qwen3, vae) =
        (zimage_specs(&set.zimage)?, qwen3_specs(&set.qwen3)?, vae_specs(&set.vae)?);
    let plans = [
        (DIFFUSION_MODEL_FILE, entries(&zimage, ZIMAGE, "", dtype), "Z-Image DiT"),
        (TEXT_ENCODER_FILE, entries(&qwen3, QWEN3, "", dtype), "Qwen3 text encoder"),
        (VAE_FILE, entries(&vae, VAE, "", SynthDtype::F32), "Flux VAE"),
    ]
    .map(|(file, (entries, layers), what)| {
        Plan::new(&models_dir.join(file), entries, &metadata(what, seed, layers))
    });
    let total: u64 = plans.iter().map(Plan::total).sum();
    let mut before = 0;
    for (plan, file) in plans.iter().zip([DIFFUSION_MODEL_FILE, TEXT_ENCODER_FILE, VAE_FILE]) {
        let dir = models_dir.join(file);
        if let Some(dir) = dir.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Invalid(format!("creating {}: {e}", dir.display())))?;
        }
        plan.write(seed, &mut |done, _| progress(before + done, total))?;
        before += plan.total();
    }
    Ok(())
}

/// Writes one file of `specs`, every tensor in `dtype`, its values drawn from `family`'s streams.
fn write_one(
    path: &Path,
    specs: &[Spec],
    family: &str,
    what: &str,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let (entries, layers) = entries(specs, family, "", dtype);
    Plan::new(path, entries, &metadata(what, seed, layers)).write(seed, progress)
}

/// A FLUX.2 DiT of hidden width `dim` (heads of 128, a SwiGLU of 3 × `dim`, the VAE's 128 channels) with
/// `(double, single)` blocks, reading text of width `text_dim`, with or without the guidance embedding.
fn flux2_config(
    dim: usize,
    (double_blocks, single_blocks): (usize, usize),
    text_dim: usize,
    guidance: bool,
) -> flux::Config {
    flux::Config {
        generation: flux::Generation::Two,
        dim,
        heads: dim / flux::HEAD_DIM,
        double_blocks,
        single_blocks,
        mlp_hidden: 3 * dim,
        in_channels: flux::Generation::Two.latent_channels(),
        text_dim,
        vec_dim: None,
        guidance,
        longcat: false,
        approximator: None,
        ovis: false,
    }
}

/// LongCat-Image's DiT at FLUX.1 dev's widths `flux`: the 3584-wide text that makes a FLUX.1 LongCat-Image's, no
/// pooled vector, no guidance embedding.
fn longcat_config(flux: &flux::Config) -> flux::Config {
    flux::Config {
        text_dim: flux::LONGCAT_TEXT_DIM,
        vec_dim: None,
        guidance: false,
        longcat: true,
        ..flux.clone()
    }
}

/// Chroma's DiT at FLUX.1 dev's widths `flux` with the guidance MLP `approximator`: its text, no pooled vector,
/// guidance or modulation weights.
/// Chroma Radiance on Chroma's trunk `chroma` with a NeRF head `(hidden, mlp ratio, depth)`: 16-pixel patches,
/// 8 DCT frequencies and the convolutional head of the released x0 model (its `__x0__` marker is not written,
/// so the file predicts velocity as the first releases did).
fn chroma_radiance_config(
    chroma: &flux::Config,
    (nerf_hidden, nerf_mlp_ratio, nerf_depth): (usize, usize, usize),
) -> crate::chroma_radiance::Config {
    crate::chroma_radiance::Config {
        trunk: flux::Config { in_channels: crate::chroma_radiance::CHANNELS, ..chroma.clone() },
        patch: 16,
        nerf_hidden,
        nerf_mlp_ratio,
        nerf_depth,
        nerf_max_freqs: 8,
        head: crate::chroma_radiance::FinalHead::Conv,
        x0: false,
        sequential_txt_ids: false,
    }
}

fn chroma_config(flux: &flux::Config, approximator: flux::Approximator) -> flux::Config {
    flux::Config {
        vec_dim: None,
        guidance: false,
        approximator: Some(approximator),
        in_channels: flux::LATENT_CHANNELS,
        ..flux.clone()
    }
}

/// A decoder language model of `variant` at these widths, with the rest as released: Qwen2.5-VL's (head width
/// 128), Mistral Small 3.x's, Llama 3's or Gemma 2's (their head widths, RMS ε and RoPE θ).
fn decoder_config(
    variant: qwen3::Variant,
    vocab: usize,
    hidden: usize,
    layers: usize,
    (heads, kv_heads): (usize, usize),
    intermediate: usize,
) -> qwen3::Config {
    let (head_dim, rms_eps, rope_theta) = match variant {
        qwen3::Variant::Mistral3 => {
            (crate::mistral3::HEAD_DIM, crate::mistral3::RMS_EPS, crate::mistral3::ROPE_THETA)
        }
        qwen3::Variant::Llama3 => {
            (crate::llama3::HEAD_DIM, crate::llama3::RMS_EPS, crate::llama3::ROPE_THETA)
        }
        qwen3::Variant::Gemma2 => {
            (crate::gemma2::HEAD_DIM, crate::gemma2::RMS_EPS, crate::gemma2::ROPE_THETA)
        }
        _ => (qwen3::QWEN25_HEAD_DIM, qwen3::RMS_EPS, qwen3::ROPE_THETA),
    };
    qwen3::Config {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        rms_eps,
        rope_theta,
        variant,
    }
}

/// Whether `name` is a lookup table rather than a Linear weight (token and position embeddings, T5's shared
/// table and its relative position bias): drawn in ±1 and never quantized.
fn is_embedding(name: &str) -> bool {
    name.contains("embed_tokens")
        || name.contains("embedding.weight")
        || name == "shared.weight"
        || name.contains("relative_attention_bias")
}

/// CLIP-G's text tower `hidden` wide (heads of 64), `layers` deep, with an MLP of `intermediate`: the real
/// vocabulary, 77 positions, exact GELU.
fn clip_g_config(hidden: usize, layers: usize, intermediate: usize) -> clip_text::Config {
    clip_text::Config {
        variant: clip_text::Variant::G,
        activation: clip_text::Variant::G.activation(),
        ..clip_l_config(hidden, layers, intermediate)
    }
}

/// A CLIP-L text tower `hidden` wide (heads of 64), `layers` deep, with an MLP of `intermediate`: the real
/// vocabulary and 77 positions.
fn clip_l_config(hidden: usize, layers: usize, intermediate: usize) -> clip_text::Config {
    clip_text::Config {
        variant: clip_text::Variant::L,
        layout: clip_text::Layout::Transformers,
        vocab: 49_408,
        hidden,
        layers,
        heads: hidden / clip_text::HEAD_DIM,
        head_dim: clip_text::HEAD_DIM,
        intermediate,
        positions: 77,
        activation: clip_text::Activation::QuickGelu,
        eps: clip_text::LAYER_NORM_EPS,
        eos: clip_text::EOS,
    }
}

/// A vision tower of `variant`, `hidden` wide in 16 heads, `layers` deep, with an MLP of `intermediate`, patches
/// of 14 over `image_size` pixels and a projection to `projection`.
fn vision_config(
    variant: clip_vision::Variant,
    hidden: usize,
    layers: usize,
    intermediate: usize,
    image_size: usize,
    projection: Option<usize>,
) -> clip_vision::Config {
    clip_vision::Config {
        variant,
        hidden,
        layers,
        heads: clip_vision::HEADS,
        intermediate,
        patch: 14,
        image_size,
        projection,
        eps: clip_vision::LAYER_NORM_EPS,
    }
}

/// A T5 v1.1 encoder of `d_model`, `blocks`, `heads` × `d_kv` and a feed-forward of `d_ff`: the real
/// vocabulary and 32 buckets.
fn t5_config(d_model: usize, blocks: usize, heads: usize, d_kv: usize, d_ff: usize) -> t5::Config {
    t5::Config {
        vocab: 32_128,
        d_model,
        blocks,
        heads,
        d_kv,
        d_ff,
        buckets: 32,
        max_distance: t5::MAX_DISTANCE,
        rms_eps: t5::RMS_EPS,
    }
}

/// Specs from a family's list of (name, shape): norm weights (1-D, or RMS-norm `.gamma`s of any rank) 1,
/// biases 0, embeddings and weights uniform in ±1/√fan-in (±1 for an embedding table, as torch's N(0, 1) in
/// order of magnitude).
fn specs_of(tensors: Vec<(String, Vec<usize>)>) -> Vec<Spec> {
    tensors
        .into_iter()
        .map(|(name, shape)| {
            let init = if name.ends_with(".bias") {
                Init::Zeros
            } else if shape.len() == 1 || name.ends_with(".gamma") {
                Init::Ones
            } else if is_embedding(&name) {
                Init::Uniform(1.0)
            } else {
                Init::Uniform(layout::uniform_bound(shape[1..].iter().product()))
            };
            Spec { name, shape, init }
        })
        .collect()
}

/// Writes a random-weight Qwen-Image MMDiT of `config` to `path` in ComfyUI's layout, the tensors detection
/// expects.
pub fn write_qwen_image(
    path: &Path,
    config: &qwen_image::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let specs = specs_of(qwen_image::expected(config));
    write_one(path, &specs, QWEN_IMAGE, "Qwen-Image MMDiT", dtype, seed, progress)
}

/// Writes a random-weight LoRA for the MMDiT of `config`: every block's attention projections adapted at rank
/// 4, diffusers' names under `diffusion_model.`.
pub fn write_qwen_image_lora(
    path: &Path,
    config: &qwen_image::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.dim;
    let mut specs = Vec::new();
    for i in 0..config.layers {
        for part in ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj"] {
            let name = format!("diffusion_model.transformer_blocks.{i}.attn.{part}");
            specs.extend(layout::lora_pair(&name, d, d, RANK));
        }
    }
    write_one(path, &specs, QWEN_IMAGE_LORA, "Qwen-Image LoRA", dtype, seed, progress)
}

/// Writes a random-weight LoRA for a FLUX.1 or FLUX.2 DiT of `config` to `path`, in diffusers' names as ai-toolkit
/// writes them (`transformer.` prefix): every double block's image and text q, k, v (row blocks of the fused
/// qkv) and every single block's q, k, v and MLP input (row blocks of linear1), rank 4.
pub fn write_flux_lora(
    path: &Path,
    config: &flux::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.dim;
    let mut layers = Vec::new();
    for i in 0..config.double_blocks {
        for part in ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"] {
            layers.push((format!("transformer.transformer_blocks.{i}.attn.{part}"), d));
        }
    }
    for i in 0..config.single_blocks {
        let parts = match config.generation {
            flux::Generation::One => vec![
                ("attn.to_q", d),
                ("attn.to_k", d),
                ("attn.to_v", d),
                ("proj_mlp", config.mlp_hidden),
            ],
            flux::Generation::Two => vec![("attn.to_qkv_mlp_proj", 3 * d + 2 * config.mlp_hidden)],
        };
        for (part, rows) in parts {
            layers.push((format!("transformer.single_transformer_blocks.{i}.{part}"), rows));
        }
    }
    let specs: Vec<Spec> = layers
        .into_iter()
        .flat_map(|(name, rows)| layout::lora_pair(&name, rows, d, RANK))
        .collect();
    let what = match config.generation {
        flux::Generation::One => "FLUX.1 LoRA",
        flux::Generation::Two => "FLUX.2 LoRA",
    };
    write_one(path, &specs, FLUX_LORA, what, dtype, seed, progress)
}

/// Writes a random-weight Qwen2.5-VL of `config` with the vision tower `vision` to `path` (ComfyUI's names).
pub fn write_qwen25vl(
    path: &Path,
    config: &qwen3::Config,
    vision: &VisionConfig,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut tensors =
        vec![("model.embed_tokens.weight".to_owned(), vec![config.vocab, config.hidden])];
    for i in 0..config.layers {
        tensors.extend(config.layer_names(i).into_iter().zip(config.layer_shapes()));
    }
    tensors.push(("model.norm.weight".to_owned(), vec![config.hidden]));
    tensors.extend(vision.expected());
    write_one(
        path,
        &specs_of(tensors),
        QWEN25VL,
        "Qwen2.5-VL language model",
        dtype,
        seed,
        progress,
    )
}

/// Writes a random-weight umT5-XXL encoder of `config` to `path` under ComfyUI's names (a position bias table in
/// every block), with a `spiece_model` tensor: the synthetic SentencePiece model [`t5::synth_model`] (umT5's
/// special ids, byte fallback), so any prompt tokenises within `config.vocab` (at least [`t5::SYNTH_PIECES`]).
pub fn write_umt5(
    path: &Path,
    config: &t5::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    if config.vocab < t5::SYNTH_PIECES {
        return Err(Error::Invalid(format!(
            "a umT5 vocabulary of {} rows is smaller than the synthetic tokenizer's {} pieces",
            config.vocab,
            t5::SYNTH_PIECES
        )));
    }
    let mut specs = specs_of(config.umt5_expected());
    let model = t5::synth_model();
    specs.push(Spec {
        name: t5::SPIECE_MODEL.to_owned(),
        shape: vec![model.len()],
        init: Init::Bytes(model),
    });
    write_one(path, &specs, UMT5, "umT5-XXL text encoder", dtype, seed, progress)
}

/// Writes a random-weight Mistral Small 3.x (or Ministral 3 3B) of `config` to `path` under the released names,
/// with a `tekken_model` tensor: a tekken JSON of the same schema whose vocabulary is the 256 bytes (ids
/// 1000-1255) and whose 1000 special tokens are Mistral's, so any prompt tokenises within `config.vocab` (at
/// least 1256).
pub fn write_mistral3(
    path: &Path,
    config: &qwen3::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut specs = decoder_weights(config);
    let json = crate::mistral3::synth_tekken_json();
    specs.push(Spec {
        name: crate::mistral3::TEKKEN.to_owned(),
        shape: vec![json.len()],
        init: Init::Bytes(json),
    });
    write_one(path, &specs, MISTRAL3, "Mistral text encoder", dtype, seed, progress)
}

/// A Wan DiT of width `dim` (heads of 128), feed-forward `ffn_dim`, `layers` blocks and `(in, out)` channels,
/// on umT5-XXL's 4096-wide text, without the CLIP branch.
fn wan_config(
    dim: usize,
    ffn_dim: usize,
    layers: usize,
    (inp, out): (usize, usize),
) -> wan::Config {
    wan::Config {
        dim,
        ffn_dim,
        heads: dim / wan::HEAD_DIM,
        layers,
        in_channels: inp,
        out_channels: out,
        text_dim: 4096,
        freq_dim: 256,
        eps: wan::EPS,
        image: None,
        ref_channels: None,
        vace: None,
        camera: None,
        causal: false,
        humo: None,
        s2v: None,
        animate2: false,
        dancer: None,
    }
}

/// Writes a random-weight Wan DiT of `config` to `path` in ComfyUI's layout, the tensors detection expects (the
/// patch embedding drawn like a Linear of its fan-in, not like an embedding table).
pub fn write_wan(
    path: &Path,
    config: &wan::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut specs = specs_of(wan::expected_shapes(config));
    for spec in specs.iter_mut().filter(|s| s.name == "patch_embedding.weight") {
        spec.init = Init::Uniform(layout::uniform_bound(spec.shape[1..].iter().product()));
    }
    let (entries, layers) = entries(&specs, WAN, "", dtype);
    let mut metadata = metadata("Wan DiT", seed, layers);
    if config.causal {
        metadata.push(wan::causal_metadata());
    }
    if config.animate2 {
        metadata.push(wan::animate2_metadata());
    }
    Plan::new(path, entries, &metadata).write(seed, progress)
}

/// Writes a random-weight LoRA for the Wan DiT of `config`: every block's self- and cross-attention q, k, v
/// and o adapted at rank 4, ComfyUI's names under `diffusion_model.` (`lora_A`/`lora_B`).
pub fn write_wan_lora(
    path: &Path,
    config: &wan::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.dim;
    let mut specs = Vec::new();
    for i in 0..config.layers {
        for attn in ["self_attn", "cross_attn"] {
            for p in ["q", "k", "v", "o"] {
                let name = format!("diffusion_model.blocks.{i}.{attn}.{p}");
                specs.extend(layout::lora_pair(&name, d, d, RANK));
            }
        }
    }
    write_one(path, &specs, WAN_LORA, "Wan LoRA", dtype, seed, progress)
}

/// Writes a random-weight LoRA for a HiDream DiT of `config` to `path`, ComfyUI's names under `diffusion_model.`:
/// every block's image q, k, v and output projections, rank 4.
pub fn write_hidream_lora(
    path: &Path,
    config: &hidream::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.dim;
    let mut specs = Vec::new();
    for i in 0..config.double_blocks {
        for p in ["to_q", "to_k", "to_v", "to_out"] {
            let name = format!("diffusion_model.double_stream_blocks.{i}.block.attn1.{p}");
            specs.extend(layout::lora_pair(&name, d, d, RANK));
        }
    }
    for i in 0..config.single_blocks {
        for p in ["to_q", "to_k", "to_v", "to_out"] {
            let name = format!("diffusion_model.single_stream_blocks.{i}.block.attn1.{p}");
            specs.extend(layout::lora_pair(&name, d, d, RANK));
        }
    }
    write_one(path, &specs, HIDREAM_LORA, "HiDream LoRA", dtype, seed, progress)
}

/// Writes a random-weight LoRA for a Krea 2 DiT of `config` to `path`, ComfyUI's names under `diffusion_model.`:
/// every block's attention q, k, v and output projections, rank 4.
pub fn write_krea2_lora(
    path: &Path,
    config: &crate::krea2::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.features;
    let kv = config.kv_heads * crate::krea2::HEAD_DIM;
    let mut specs = Vec::new();
    for i in 0..config.layers {
        for (p, out) in [("wq", d), ("wk", kv), ("wv", kv), ("wo", d)] {
            let name = format!("diffusion_model.blocks.{i}.attn.{p}");
            specs.extend(layout::lora_pair(&name, out, d, RANK));
        }
    }
    write_one(path, &specs, KREA2_LORA, "Krea 2 LoRA", dtype, seed, progress)
}

/// The config of a synthetic Anima ControlNet-LLLite for the DiT `anima`: the released kinds' structure (an ASPP
/// on the control image's, none on the inpainting one's, which reads the mask too) at small widths, a module for
/// every block and target.
pub fn lllite_config(anima: &crate::anima::Config, inpaint: bool) -> crate::anima::LlliteConfig {
    use crate::anima::{LlliteModule, LlliteTarget};
    let modules = (0..anima.blocks)
        .flat_map(|block| {
            LlliteTarget::ALL.map(|target| LlliteModule { block, target, mlp_dim: 16 })
        })
        .collect();
    crate::anima::LlliteConfig {
        cond_in_channels: if inpaint { 4 } else { 3 },
        cond_dim: 32,
        cond_emb_dim: 32,
        resblocks: 1,
        aspp_dilations: if inpaint { Vec::new() } else { vec![1, 2, 4, 8] },
        inpaint_masked_input: inpaint,
        model_dim: anima.dim,
        modules,
    }
}

/// Writes a random-weight LoRA for an Anima DiT of `config` to `path`, in ComfyUI's names (`diffusion_model.`
/// prefix, as the Anima turbo LoRA names them): every block's self-attention q, k, v and output, rank 4.
pub fn write_anima_lora(
    path: &Path,
    config: &crate::anima::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    const RANK: usize = 4;
    let d = config.dim;
    let mut specs = Vec::new();
    for i in 0..config.blocks {
        for p in ["q_proj", "k_proj", "v_proj", "output_proj"] {
            let name = format!("diffusion_model.blocks.{i}.self_attn.{p}");
            specs.extend(layout::lora_pair(&name, d, d, RANK));
        }
    }
    write_one(path, &specs, ANIMA_LORA, "Anima LoRA", dtype, seed, progress)
}

/// A Llama 3 decoder's tensors: the embedding table, every layer, the final norm (no output head).
fn llama3_expected(config: &qwen3::Config) -> Vec<(String, Vec<usize>)> {
    let mut all = vec![("model.embed_tokens.weight".to_owned(), vec![config.vocab, config.hidden])];
    for i in 0..config.layers {
        all.extend(config.layer_names(i).into_iter().zip(config.layer_shapes()));
    }
    all.push((crate::llama3::NORM.to_owned(), vec![config.hidden]));
    all
}

/// The Wan 2.1 VAE of base width `dim` (96 released), both halves, RGB in and out.
fn wan_vae_config(dim: usize) -> wan_vae::Config {
    wan_vae::Config {
        dim,
        z_channels: 16,
        in_channels: 3,
        out_channels: 3,
        has_encoder: true,
        has_decoder: true,
    }
}

/// Writes a random-weight Wan 2.1 VAE of `config` to `path` in ComfyUI's layout, its tensors the ones
/// detection expects: RMS gammas 1, biases 0, weights uniform in ±1/√fan-in.
pub fn write_wan_vae(
    path: &Path,
    config: &wan_vae::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check_vae_dtype(dtype)?;
    let specs =
        specs_of(wan_vae::expected(config).into_iter().map(|e| (e.comfy, e.shape)).collect());
    write_one(path, &specs, WAN_VAE, "Wan 2.1 VAE", dtype, seed, progress)
}

/// Writes a random-weight Wan 2.2 VAE of `config` to `path` in ComfyUI's layout (RMS gammas 1, biases 0,
/// weights uniform in ±1/√fan-in).
pub fn write_wan22_vae(
    path: &Path,
    config: &wan_vae::wan22::Config,
    dtype: SynthDtype,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check_vae_dtype(dtype)?;
    let specs = specs_of(
        wan_vae::wan22::expected(config).into_iter().map(|e| (e.comfy, e.shape)).collect(),
    );
    write_one(path, &specs, WAN22_VAE, "Wan 2.2 VAE", dtype, seed, progress)
}

fn check_vae_dtype(dtype: SynthDtype) -> Result<()> {
    match dtype {
        SynthDtype::F32 | SynthDtype::Bf16 | SynthDtype::F16 => Ok(()),
        SynthDtype::Fp8E4m3fn
        | SynthDtype::Fp8E5m2
        | SynthDtype::Fp8Scaled
        | SynthDtype::Fp8Mixed
        | SynthDtype::Int8Convrot
        | SynthDtype::Mxfp8
        | SynthDtype::Nvfp4 => Err(Error::Invalid(format!(
            "a VAE is written in f32, bf16 or f16, not {dtype} (use SynthDtype::for_vae)"
        ))),
    }
}

/// Quantized layers by key, as `_quantization_metadata` lists them.
type Layers = serde_json::Map<String, serde_json::Value>;

/// One file's tensors in `dtype` under `prefix`, and the layers the header's quantization map lists (those of
/// [`SynthDtype::Fp8Mixed`]).
fn entries<'s>(
    specs: &'s [Spec],
    family: &str,
    prefix: &str,
    dtype: SynthDtype,
) -> (Vec<Entry<'s>>, Layers) {
    let plain = |spec: &'s Spec, dtype: DType| Entry {
        key: format!("{prefix}{}", spec.name),
        spec: Cow::Borrowed(spec),
        dtype,
        stream: stream_id(family, &spec.name),
        quantized: None,
    };
    // A tensor of the quantization's own (a scale, the marker), not of the layout.
    let owned = |spec: Spec, dtype: DType| Entry {
        key: format!("{prefix}{}", spec.name),
        stream: stream_id(family, &spec.name),
        spec: Cow::Owned(spec),
        dtype,
        quantized: None,
    };
    let stored = |spec: &Spec| match spec.init {
        Init::Bytes(_) => DType::U8,
        Init::Ones | Init::Zeros | Init::Uniform(_) | Init::Fill(_) => dtype.dtype(),
    };
    if !dtype.is_scaled() {
        return (specs.iter().map(|spec| plain(spec, stored(spec))).collect(), Layers::new());
    }
    let mut entries = Vec::with_capacity(specs.len() * 2);
    let mut layers = serde_json::Map::new();
    for spec in specs {
        // A Linear weight (2-D, drawn uniformly; the embedding table stays as it is) is quantized with the scale its
        // bound gives: every value fits e4m3fn's ±448.
        let bound = match spec.init {
            Init::Uniform(bound) if spec.shape.len() == 2 && !is_embedding(&spec.name) => bound,
            Init::Uniform(_) | Init::Ones | Init::Zeros | Init::Fill(_) => {
                entries.push(plain(spec, DType::BF16));
                continue;
            }
            Init::Bytes(_) => {
                entries.push(plain(spec, DType::U8));
                continue;
            }
        };
        let Some(layer) = spec.name.strip_suffix(".weight") else {
            entries.push(plain(spec, DType::BF16));
            continue;
        };
        let (rows, cols) = (spec.shape[0], spec.shape[1]);
        let scale_name = match dtype {
            SynthDtype::Fp8Scaled => format!("{layer}.scale_weight"),
            _ => format!("{layer}.weight_scale"),
        };
        let (stored, scale, table, config) = match dtype {
            SynthDtype::Int8Convrot => {
                // Random int8 values are some weight rotated by ConvRot (the rotation keeps its scale); one
                // scale per row, from the bound.
                let Some(group) = [256, 64, 16].into_iter().find(|g| cols.is_multiple_of(*g))
                else {
                    entries.push(plain(spec, DType::BF16));
                    continue;
                };
                let scale = bound / 127.0;
                let table =
                    Spec { name: scale_name, shape: vec![rows, 1], init: Init::Fill(scale) };
                let config = serde_json::json!({
                    "format": "int8_tensorwise", "convrot": true, "convrot_groupsize": group
                });
                (DType::I8, scale, (table, DType::F32), config)
            }
            SynthDtype::Nvfp4 => {
                if !rows.is_multiple_of(16) || !cols.is_multiple_of(16) {
                    entries.push(plain(spec, DType::BF16));
                    continue;
                }
                // Random bytes are random pairs of E2M1 codes (±6 at most); every block scale 1.0 and the global
                // scale bound / 6 give values within the bound.
                let codes =
                    Spec { name: spec.name.clone(), shape: vec![rows, cols / 2], init: spec.init };
                entries.push(Entry {
                    quantized: Some((bound / 127.5, 127.5)),
                    ..owned(codes, DType::U8)
                });
                let table = Spec {
                    name: scale_name,
                    shape: vec![
                        rows.div_ceil(128) * 128,
                        kiln_compute::quant::swizzled_cols(cols / 16),
                    ],
                    init: Init::Fill(1.0),
                };
                entries.push(owned(table, DType::F8E4M3));
                let global = Spec {
                    name: format!("{layer}.weight_scale_2"),
                    shape: Vec::new(),
                    init: Init::Fill(bound / 6.0),
                };
                entries.push(owned(global, DType::F32));
                layers.insert(format!("{prefix}{layer}"), serde_json::json!({"format": "nvfp4"}));
                continue;
            }
            SynthDtype::Mxfp8 => {
                if !rows.is_multiple_of(32) || !cols.is_multiple_of(32) {
                    entries.push(plain(spec, DType::BF16));
                    continue;
                }
                // One exponent for every block: the power of two that brings the bound within e4m3fn's ±448.
                let exponent = (bound / 448.0).log2().ceil() as i32;
                let table = Spec {
                    name: scale_name,
                    shape: vec![
                        rows.div_ceil(128) * 128,
                        kiln_compute::quant::swizzled_cols(cols / 32),
                    ],
                    init: Init::Fill((127 + exponent) as f32),
                };
                let config = serde_json::json!({"format": "mxfp8"});
                (DType::F8E4M3, 2f32.powi(exponent), (table, DType::U8), config)
            }
            _ => {
                let scale = bound / 448.0;
                let table = Spec { name: scale_name, shape: Vec::new(), init: Init::Fill(scale) };
                (
                    DType::F8E4M3,
                    scale,
                    (table, DType::F32),
                    serde_json::json!({"format": "float8_e4m3fn"}),
                )
            }
        };
        entries.push(Entry { quantized: Some((scale, 0.0)), ..plain(spec, stored) });
        entries.push(owned(table.0, table.1));
        layers.insert(format!("{prefix}{layer}"), config);
    }
    if dtype == SynthDtype::Fp8Scaled {
        // The legacy encoding: the marker says so, and the scales' names say which layers.
        let marker = Spec { name: "scaled_fp8".into(), shape: vec![0], init: Init::Zeros };
        entries.push(owned(marker, DType::F8E4M3));
        layers.clear();
    }
    (entries, layers)
}

fn names_and_shapes(specs: Vec<Spec>) -> Vec<(String, Vec<usize>)> {
    specs.into_iter().map(|s| (s.name, s.shape)).collect()
}

/// The header metadata of a synthetic file: what it is, and ComfyUI's quantization map when `layers` has any.
fn metadata(what: &str, seed: u64, layers: Layers) -> Vec<(String, String)> {
    let mut all = vec![(
        "kiln.synth".to_owned(),
        format!("random-weight {what} written by kiln (seed {seed}); not a trained model"),
    )];
    if !layers.is_empty() {
        let map = serde_json::json!({"format_version": "1.0", "layers": layers});
        all.push(("_quantization_metadata".to_owned(), map.to_string()));
    }
    all
}
