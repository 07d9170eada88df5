//! [`DiffusionFamily`]: the diffusion networks (`MODEL`) Kiln runs, and [`DiffusionNet`], one loaded.

use kiln_compute::backend::BinaryOp;
use kiln_compute::memory::{LoadPlan, Model, SafetensorsFile};
use kiln_compute::{Backend, DType, Tensor};

use crate::anima::{self, Anima, AnimaInput};
use crate::chroma_radiance::{self, ChromaRadiance};
use crate::ernie::{self, ErnieImage};
use crate::error::Result;
use crate::flux::{self, Flux, FluxInput};
use crate::header::Header;
use crate::hidream::{self, HiDream, HiDreamInput};
use crate::hunyuan_video::{self, HunyuanVideo, HunyuanVideoInput};
use crate::joyimage::{self, JoyImage};
use crate::kandinsky5::{self, Kandinsky5, Kandinsky5Input};
use crate::krea2::{self, Krea2};
use crate::latent::LatentFormat;
use crate::lora::LoraPatches;
use crate::mage_flow::{self, MageFlow};
use crate::omnigen2::{self, OmniGen2};
use crate::pixeldit::{self, PixelDit};
use crate::qwen_image::{self, QwenImage};
use crate::rope::RopeOptions;
use crate::sampling::{DiscreteSampling, FlowSampling, ModelSampling, Prediction};
use crate::sd3::{self, Sd3, Sd3Input};
use crate::unet::{self, Unet};
use crate::wan::{self, Wan, WanInput};
use crate::zimage::{self, ZImage};
use crate::zimage_lora;

use super::{ControlInput, ControlNetNet, ModelPatchNet, PatchInput, VaeFamily};

/// A family of diffusion networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiffusionFamily {
    /// FLUX.1 (dev, schnell, Kontext, Fill): Black Forest Labs' DiT on T5-XXL and CLIP-L in the Flux VAE's
    /// latent space.
    Flux,
    /// FLUX.2 (dev, Klein 4B/9B): the second-generation DiT on three hidden states of a language model
    /// (Mistral Small for dev, Qwen3 for Klein) in the FLUX.2 VAE's 128-channel latent space.
    Flux2,
    /// Z-Image (Turbo): the Lumina 2 NextDiT on Qwen3 captions in the Flux VAE's latent space.
    ZImage,
    /// Lumina Image 2.0 (and NetaYume Lumina): the original NextDiT on Gemma 2 2B's states in the Flux VAE's
    /// latent space.
    Lumina2,
    /// LongCat-Image (and its Edit model): a FLUX.1 DiT on Qwen2.5-VL's hidden states, without pooled vector or
    /// guidance, its text and image positioned apart, in the Flux VAE's latent space.
    LongCatImage,
    /// Chroma (Chroma1-HD and its kin): a FLUX.1 DiT on T5-XXL alone whose every modulation comes from one MLP
    /// over the timestep, the guidance and the block's index, in the Flux VAE's latent space.
    Chroma,
    /// Qwen-Image: an MMDiT on Qwen2.5-VL's hidden states in the Wan 2.1 VAE's latent space.
    QwenImage,
    /// Wan 2.1 (ComfyUI's `WAN21` entries: T2V 1.3B/14B, I2V and FLF2V 14B, and the Wan 2.2 A14B experts): the
    /// Wan video DiT on umT5-XXL's text (and CLIP-ViT-H's image states) in the Wan 2.1 VAE's latent space.
    Wan21,
    /// Wan 2.2 TI2V 5B (ComfyUI's `WAN22_T2V`): the Wan video DiT in the Wan 2.2 VAE's 48-channel latent space,
    /// with a timestep per latent frame when a noise mask keeps frames.
    Wan22,
    /// Lotus depth (ComfyUI's `LotusD`): SD 2's UNet predicting a depth latent from an image latent, in SD's
    /// latent space, with discrete-time sampling.
    Lotus,
    /// HiDream-I1 and E1: a DiT with mixture-of-experts feed-forwards on T5-XXL's states, one Llama 3.1 state
    /// per block and CLIP-L's and CLIP-G's pooled vectors, in the Flux VAE's latent space.
    HiDream,
    /// SDXL 1.0 (and SDXL Turbo): the SD UNet on CLIP-L's and CLIP-G's penultimate states, conditioned on
    /// CLIP-G's pooled vector and the image size, in SDXL's latent space, with discrete-time `EPS` sampling.
    Sdxl,
    /// SDXL 1.0's refiner: the SD UNet on CLIP-G's penultimate states, conditioned on its pooled vector, the
    /// image size and an aesthetic score, in SDXL's latent space.
    SdxlRefiner,
    /// Stable Diffusion 3 / 3.5 (Large): the MMDiT on CLIP-L's, CLIP-G's and T5-XXL's states and the CLIPs'
    /// pooled vectors, in SD3's latent space, with flow sampling (shift 3).
    Sd3,
    /// Ovis-Image: a FLUX.1 DiT with SwiGLU MLPs and a text RMS norm on Ovis 2.5's (a Qwen3 2B's) states, in
    /// the Flux VAE's latent space.
    OvisImage,
    /// Kandinsky 5 Lite's image model: a DiT on Qwen2.5-VL's states (through its own text blocks, then
    /// cross-attention), modulated by the timestep and CLIP-L's pooled vector, in the Flux VAE's latent space.
    Kandinsky5,
    /// Kandinsky 5 Lite's video models (text and image to video): the Kandinsky 5 DiT reading a zero image latent
    /// and a mask beside the latent, its start frames replaced by an encoded image, in the HunyuanVideo 1.0 VAE's
    /// latent space.
    Kandinsky5Video,
    /// Anima: Cosmos Predict2's DiT on Qwen3 0.6B's states, read through the model's own LLM adapter with the
    /// prompt's T5 tokens, in the Wan 2.1 VAE's latent space.
    Anima,
    /// OmniGen2: a Lumina-style DiT on Qwen2.5-VL 3B's states that attends to reference latents (editing), in the
    /// Flux VAE's latent space.
    OmniGen2,
    /// Boogu-Image: OmniGen2's DiT with double-stream blocks before its single-stream ones, on Qwen3-VL 8B's
    /// states, in the Flux VAE's latent space.
    Boogu,
    /// HunyuanVideo 1.0 (720p text to video): the HunyuanVideo DiT with CLIP-L's pooled vector and a distilled
    /// guidance embedding, over LLaVA-Llama 3's states, in the HunyuanVideo 1.0 VAE's latent space (16 channels,
    /// 8× down).
    HunyuanVideo,
    /// HunyuanVideo 1.5 (and Capybara, its shape): FLUX.1-style double-stream blocks over Qwen2.5-VL 7B's
    /// states with ByT5's glyph tokens and SigLIP's image states beside them, in the HunyuanVideo 1.5 VAE's
    /// latent space (32 channels, 16× down), the image-to-video conditioning as 33 more channels.
    HunyuanVideo15,
    /// Krea 2: a single-stream DiT over twelve of Qwen3-VL 4B's hidden states (its own text adapter), in the Wan
    /// 2.1 VAE's latent space.
    Krea2,
    /// Mage-Flow: Qwen-Image's double-stream blocks over latent pixels of the Mage VAE (FLUX.2's latent space,
    /// 128 channels, 16× down), on Qwen3-VL 4B's last states.
    MageFlow,
    /// JoyAI Image Edit: double-stream blocks (image tokens rotated by a 3-D RoPE, text not) over Qwen3-VL 8B's
    /// last states, in the Wan 2.1 VAE's latent space, reference latents as further frames.
    JoyImage,
    /// Chroma Radiance: Chroma's trunk over 16×16 pixel patches, a NeRF head making each patch's pixels from its
    /// token (no VAE: it denoises RGB pixels), on T5-XXL alone.
    ChromaRadiance,
    /// ERNIE-Image (and Turbo): a single-stream DiT with one shared modulation, image and text tokens joined, over
    /// Ministral 3 3B's states, in FLUX.2's latent space.
    Ernie,
    /// PixelDiT: joint-attention blocks over pixel patches and Gemma 2 2B's states, then per-pixel blocks
    /// modulated by their patch's token; it denoises RGB pixels (no VAE).
    PixelDit,
}

impl DiffusionFamily {
    /// Every family, in the order detection tries them.
    pub const ALL: [DiffusionFamily; 28] = [
        DiffusionFamily::ZImage,
        DiffusionFamily::Lumina2,
        // Before FLUX.1, whose detection refuses Radiance's files.
        DiffusionFamily::ChromaRadiance,
        DiffusionFamily::Flux,
        DiffusionFamily::LongCatImage,
        DiffusionFamily::Chroma,
        // Before Qwen-Image, whose detection claims a DiT with `txt_norm` (Ovis-Image has one too).
        DiffusionFamily::OvisImage,
        DiffusionFamily::Flux2,
        DiffusionFamily::QwenImage,
        DiffusionFamily::Wan21,
        DiffusionFamily::Wan22,
        DiffusionFamily::Lotus,
        DiffusionFamily::HiDream,
        DiffusionFamily::Sdxl,
        DiffusionFamily::SdxlRefiner,
        DiffusionFamily::Sd3,
        DiffusionFamily::Kandinsky5,
        DiffusionFamily::Kandinsky5Video,
        DiffusionFamily::Anima,
        DiffusionFamily::OmniGen2,
        DiffusionFamily::Boogu,
        DiffusionFamily::HunyuanVideo,
        DiffusionFamily::HunyuanVideo15,
        DiffusionFamily::Krea2,
        // Qwen-Image's detection leaves its 128-channel files alone.
        DiffusionFamily::MageFlow,
        DiffusionFamily::JoyImage,
        DiffusionFamily::Ernie,
        DiffusionFamily::PixelDit,
    ];

    /// The family's name in messages (`Z-Image`).
    pub fn name(self) -> &'static str {
        match self {
            DiffusionFamily::Flux => flux::family::NAME,
            DiffusionFamily::LongCatImage => flux::family::LONGCAT_NAME,
            DiffusionFamily::OvisImage => flux::family::OVIS_NAME,
            DiffusionFamily::Chroma => flux::family::CHROMA_NAME,
            DiffusionFamily::Flux2 => flux::family::FLUX2_NAME,
            DiffusionFamily::ZImage => zimage::family::NAME,
            DiffusionFamily::Lumina2 => zimage::family::LUMINA2_NAME,
            DiffusionFamily::QwenImage => qwen_image::family::NAME,
            DiffusionFamily::Wan21 => wan::family::WAN21_NAME,
            DiffusionFamily::Wan22 => wan::family::WAN22_NAME,
            DiffusionFamily::Lotus => unet::family::NAME,
            DiffusionFamily::HiDream => hidream::family::NAME,
            DiffusionFamily::Sd3 => sd3::family::NAME,
            DiffusionFamily::Kandinsky5 => kandinsky5::family::NAME,
            DiffusionFamily::Kandinsky5Video => kandinsky5::family::VIDEO_NAME,
            DiffusionFamily::Anima => anima::family::NAME,
            DiffusionFamily::OmniGen2 => omnigen2::family::NAME,
            DiffusionFamily::Boogu => omnigen2::family::BOOGU_NAME,
            DiffusionFamily::HunyuanVideo => hunyuan_video::family::V1_NAME,
            DiffusionFamily::HunyuanVideo15 => hunyuan_video::family::NAME,
            DiffusionFamily::Krea2 => krea2::family::NAME,
            DiffusionFamily::JoyImage => joyimage::family::NAME,
            DiffusionFamily::Ernie => ernie::family::NAME,
            DiffusionFamily::PixelDit => pixeldit::family::NAME,
            DiffusionFamily::ChromaRadiance => chroma_radiance::family::NAME,
            DiffusionFamily::MageFlow => mage_flow::family::NAME,
            DiffusionFamily::Sdxl => unet::family::SDXL_NAME,
            DiffusionFamily::SdxlRefiner => unet::family::SDXL_REFINER_NAME,
        }
    }

    /// The latent space it denoises in.
    pub fn latent(self) -> LatentFormat {
        match self {
            DiffusionFamily::Flux
            | DiffusionFamily::LongCatImage
            | DiffusionFamily::Chroma
            | DiffusionFamily::OvisImage => flux::family::LATENT,
            DiffusionFamily::Flux2 => flux::family::FLUX2_LATENT,
            DiffusionFamily::ZImage | DiffusionFamily::Lumina2 => zimage::family::LATENT,
            DiffusionFamily::QwenImage => qwen_image::family::LATENT,
            DiffusionFamily::Wan21 => wan::family::WAN21_LATENT,
            DiffusionFamily::Wan22 => wan::family::WAN22_LATENT,
            DiffusionFamily::Lotus => unet::family::LATENT,
            DiffusionFamily::HiDream => hidream::family::LATENT,
            DiffusionFamily::Sd3 => sd3::family::LATENT,
            DiffusionFamily::Kandinsky5 => kandinsky5::family::LATENT,
            DiffusionFamily::Kandinsky5Video => kandinsky5::family::VIDEO_LATENT,
            DiffusionFamily::Anima => anima::family::LATENT,
            DiffusionFamily::OmniGen2 | DiffusionFamily::Boogu => omnigen2::family::LATENT,
            DiffusionFamily::HunyuanVideo => hunyuan_video::family::V1_LATENT,
            DiffusionFamily::HunyuanVideo15 => hunyuan_video::family::LATENT,
            DiffusionFamily::Krea2 => krea2::family::LATENT,
            DiffusionFamily::JoyImage => joyimage::family::LATENT,
            DiffusionFamily::Ernie => ernie::family::LATENT,
            DiffusionFamily::PixelDit => pixeldit::family::LATENT,
            DiffusionFamily::ChromaRadiance => chroma_radiance::family::LATENT,
            DiffusionFamily::MageFlow => mage_flow::family::LATENT,
            DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner => unet::family::SDXL_LATENT,
        }
    }

    /// The model sampling a loaded model of the family starts with (ComfyUI's `sampling_settings`; for FLUX.1
    /// the guidance-distilled models', schnell's is [`DiffusionDetected::sampling`]'s); nodes like
    /// `ModelSamplingAuraFlow` replace it.
    pub fn sampling(self) -> ModelSampling {
        match self {
            // LongCat-Image has no sampling settings of its own, and Chroma's set only the multiplier, which
            // ModelSamplingFlux does not read: ComfyUI's FLUX default.
            DiffusionFamily::Flux | DiffusionFamily::LongCatImage | DiffusionFamily::Chroma => {
                FlowSampling::flux(flux::family::FLUX_SHIFT).into()
            }
            // ComfyUI's `FluxSchnell` config (a FLUX.1 without guidance): shift 1, multiplier 1.
            DiffusionFamily::OvisImage => {
                FlowSampling::new(flux::family::SCHNELL_SHIFT, flux::family::SCHNELL_MULTIPLIER)
                    .into()
            }
            DiffusionFamily::Flux2 => FlowSampling::flux(flux::family::FLUX2_SHIFT).into(),
            DiffusionFamily::ZImage => {
                FlowSampling::new(zimage::family::SHIFT, zimage::family::MULTIPLIER).into()
            }
            DiffusionFamily::Lumina2 => {
                FlowSampling::new(zimage::family::LUMINA2_SHIFT, zimage::family::LUMINA2_MULTIPLIER)
                    .into()
            }
            DiffusionFamily::QwenImage => FlowSampling::flux(qwen_image::family::FLUX_SHIFT).into(),
            DiffusionFamily::Wan21 | DiffusionFamily::Wan22 => {
                FlowSampling::new(wan::family::SHIFT, wan::family::MULTIPLIER).into()
            }
            DiffusionFamily::Lotus => DiscreteSampling::new(Prediction::ImageToImage).into(),
            DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner => {
                DiscreteSampling::new(Prediction::Eps).into()
            }
            DiffusionFamily::HiDream => {
                FlowSampling::new(hidream::family::SHIFT, hidream::family::MULTIPLIER).into()
            }
            DiffusionFamily::Sd3 => {
                FlowSampling::new(sd3::family::SHIFT, sd3::family::MULTIPLIER).into()
            }
            DiffusionFamily::Kandinsky5 => {
                FlowSampling::new(kandinsky5::family::SHIFT, kandinsky5::family::MULTIPLIER).into()
            }
            DiffusionFamily::Kandinsky5Video => {
                FlowSampling::new(kandinsky5::family::VIDEO_SHIFT, kandinsky5::family::MULTIPLIER)
                    .into()
            }
            DiffusionFamily::Anima => {
                FlowSampling::new(anima::family::SHIFT, anima::family::MULTIPLIER).into()
            }
            DiffusionFamily::OmniGen2 => {
                FlowSampling::new(omnigen2::family::SHIFT, omnigen2::family::MULTIPLIER).into()
            }
            DiffusionFamily::Boogu => {
                FlowSampling::new(omnigen2::family::BOOGU_SHIFT, omnigen2::family::MULTIPLIER)
                    .into()
            }
            // ComfyUI's `HunyuanVideo` and `HunyuanVideo15` both shift by 7.
            DiffusionFamily::HunyuanVideo | DiffusionFamily::HunyuanVideo15 => {
                FlowSampling::new(hunyuan_video::family::SHIFT, hunyuan_video::family::MULTIPLIER)
                    .into()
            }
            // ComfyUI's `Krea2` is `ModelType.FLUX`: `ModelSamplingFlux` at μ 1.15.
            DiffusionFamily::Krea2 => FlowSampling::flux(krea2::family::SHIFT).into(),
            DiffusionFamily::MageFlow => {
                FlowSampling::new(mage_flow::family::SHIFT, mage_flow::family::MULTIPLIER).into()
            }
            DiffusionFamily::JoyImage => {
                FlowSampling::new(joyimage::family::SHIFT, joyimage::family::MULTIPLIER).into()
            }
            DiffusionFamily::Ernie => {
                FlowSampling::new(ernie::family::SHIFT, ernie::family::MULTIPLIER).into()
            }
            DiffusionFamily::PixelDit => {
                FlowSampling::new(pixeldit::family::SHIFT, pixeldit::family::MULTIPLIER).into()
            }
            // Chroma's settings: ModelSamplingFlux at ComfyUI's default μ.
            DiffusionFamily::ChromaRadiance => {
                FlowSampling::flux(chroma_radiance::family::SHIFT).into()
            }
        }
    }

    /// Where a combined checkpoint of the family keeps its text encoder's files: one prefix, or FLUX.1's two
    /// (CLIP-L's, T5-XXL's), which [`TextEncoderNet::combine`](super::TextEncoderNet::combine) pairs by
    /// [`DiffusionFamily::checkpoint_text_encoder_kind`].
    pub fn checkpoint_text_encoders(self) -> &'static [&'static str] {
        match self {
            DiffusionFamily::Flux => {
                &[flux::family::CHECKPOINT_CLIP_L_PREFIX, flux::family::CHECKPOINT_T5_PREFIX]
            }
            DiffusionFamily::Flux2 => &[flux::family::CHECKPOINT_QWEN3_4B_PREFIX],
            DiffusionFamily::LongCatImage => &[flux::family::CHECKPOINT_QWEN25_7B_PREFIX],
            DiffusionFamily::Chroma | DiffusionFamily::ChromaRadiance => {
                &[flux::family::CHECKPOINT_T5_PREFIX]
            }
            DiffusionFamily::ZImage => &[zimage::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::Lumina2 => &[zimage::family::LUMINA2_CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::QwenImage => &[qwen_image::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::Wan21 | DiffusionFamily::Wan22 => {
                &[wan::family::CHECKPOINT_TEXT_ENCODER_PREFIX]
            }
            DiffusionFamily::Sdxl => &[
                unet::family::SDXL_CHECKPOINT_CLIP_L_PREFIX,
                unet::family::SDXL_CHECKPOINT_CLIP_G_PREFIX,
            ],
            DiffusionFamily::SdxlRefiner => &[unet::family::REFINER_CHECKPOINT_CLIP_G_PREFIX],
            DiffusionFamily::OmniGen2 => &[omnigen2::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::Boogu => &[omnigen2::family::BOOGU_CHECKPOINT_TEXT_ENCODER_PREFIX],
            // ComfyUI's Krea 2 and Mage-Flow configs read Qwen3-VL 4B there (no such checkpoint is released).
            DiffusionFamily::Krea2 | DiffusionFamily::MageFlow => {
                &[mage_flow::family::CHECKPOINT_TEXT_ENCODER_PREFIX]
            }
            DiffusionFamily::JoyImage => &[joyimage::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::Ernie => &[ernie::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::PixelDit => &[pixeldit::family::CHECKPOINT_TEXT_ENCODER_PREFIX],
            DiffusionFamily::Sd3 => &[
                sd3::family::CHECKPOINT_CLIP_L_PREFIX,
                sd3::family::CHECKPOINT_CLIP_G_PREFIX,
                sd3::family::CHECKPOINT_T5_PREFIX,
            ],
            // ComfyUI's HiDream config names no text encoder a checkpoint would hold (`clip_target` is None), nor
            // are Ovis-Image and Kandinsky 5 released as one.
            DiffusionFamily::Lotus
            | DiffusionFamily::HiDream
            | DiffusionFamily::OvisImage
            | DiffusionFamily::Kandinsky5
            | DiffusionFamily::Kandinsky5Video
            | DiffusionFamily::Anima
            | DiffusionFamily::HunyuanVideo
            | DiffusionFamily::HunyuanVideo15 => &[],
        }
    }

    /// How a checkpoint's text encoder files combine or what one file is (`DualCLIPLoader`'s or `CLIPLoader`'s type
    /// for them; empty: the file as detected).
    pub fn checkpoint_text_encoder_kind(self) -> &'static str {
        match self {
            DiffusionFamily::Flux => "flux",
            DiffusionFamily::Flux2 => "flux2",
            DiffusionFamily::LongCatImage => crate::family::LONGCAT_CLIP_TYPE,
            DiffusionFamily::Chroma | DiffusionFamily::ChromaRadiance => {
                crate::family::CHROMA_CLIP_TYPE
            }
            DiffusionFamily::Sdxl => crate::family::SDXL_CLIP_TYPE,
            DiffusionFamily::SdxlRefiner => crate::family::SDXL_REFINER_CLIP_KIND,
            DiffusionFamily::Sd3 => crate::family::SD3_CLIP_TYPE,
            DiffusionFamily::OvisImage => crate::family::OVIS_CLIP_TYPE,
            DiffusionFamily::Kandinsky5 => crate::family::KANDINSKY5_IMAGE_CLIP_TYPE,
            DiffusionFamily::Kandinsky5Video => crate::family::KANDINSKY5_CLIP_TYPE,
            DiffusionFamily::OmniGen2 => crate::family::OMNIGEN2_CLIP_TYPE,
            DiffusionFamily::Boogu => crate::family::BOOGU_CLIP_TYPE,
            DiffusionFamily::Krea2 => crate::family::KREA2_CLIP_TYPE,
            DiffusionFamily::MageFlow => crate::family::MAGE_CLIP_TYPE,
            DiffusionFamily::JoyImage => crate::family::JOYIMAGE_CLIP_TYPE,
            DiffusionFamily::PixelDit => crate::family::PIXELDIT_CLIP_TYPE,
            // Ministral 3 3B is ERNIE-Image's encoder whatever the type.
            DiffusionFamily::Ernie
            | DiffusionFamily::ZImage
            | DiffusionFamily::Lumina2
            | DiffusionFamily::QwenImage
            | DiffusionFamily::Wan21
            | DiffusionFamily::Wan22
            | DiffusionFamily::Lotus
            | DiffusionFamily::HiDream
            | DiffusionFamily::Anima
            | DiffusionFamily::HunyuanVideo
            | DiffusionFamily::HunyuanVideo15 => "",
        }
    }

    /// The autoencoder a combined checkpoint of the family holds, and its key prefix there.
    pub fn checkpoint_vae(self) -> (VaeFamily, &'static str) {
        match self {
            DiffusionFamily::Flux
            | DiffusionFamily::LongCatImage
            | DiffusionFamily::Chroma
            | DiffusionFamily::OvisImage => (VaeFamily::Flux, flux::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Flux2 => (VaeFamily::Flux2, flux::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::ZImage | DiffusionFamily::Lumina2 => {
                (VaeFamily::Flux, zimage::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::QwenImage => {
                (VaeFamily::Wan21, qwen_image::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::Wan21 => (VaeFamily::Wan21, wan::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Wan22 => (VaeFamily::Wan22, wan::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Lotus | DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner => {
                (VaeFamily::Flux, unet::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::HiDream => (VaeFamily::Flux, flux::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Sd3 => (VaeFamily::Flux, sd3::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Kandinsky5 => (VaeFamily::Flux, flux::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::Kandinsky5Video => {
                (VaeFamily::HunyuanVideo, hunyuan_video::family::CHECKPOINT_VAE_PREFIX)
            }
            // ComfyUI's Anima config keeps the default prefixes.
            DiffusionFamily::Anima => (VaeFamily::Wan21, unet::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::OmniGen2 | DiffusionFamily::Boogu => {
                (VaeFamily::Flux, omnigen2::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::HunyuanVideo => {
                (VaeFamily::HunyuanVideo, hunyuan_video::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::HunyuanVideo15 => {
                (VaeFamily::HunyuanVideo15, hunyuan_video::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::Krea2 => (VaeFamily::Wan21, mage_flow::family::CHECKPOINT_VAE_PREFIX),
            DiffusionFamily::MageFlow => {
                (VaeFamily::MageFlow, mage_flow::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::JoyImage => {
                (VaeFamily::Wan21, joyimage::family::CHECKPOINT_VAE_PREFIX)
            }
            DiffusionFamily::Ernie => (VaeFamily::Flux2, ernie::family::CHECKPOINT_VAE_PREFIX),
            // A checkpoint would hold no VAE (`pixel_space`); the prefix is where one would be.
            DiffusionFamily::PixelDit => (VaeFamily::Flux, pixeldit::family::CHECKPOINT_VAE_PREFIX),
            // A checkpoint would hold no VAE (`pixel_space`); Chroma's prefix is where one would be.
            DiffusionFamily::ChromaRadiance => {
                (VaeFamily::Flux, flux::family::CHECKPOINT_VAE_PREFIX)
            }
        }
    }

    /// The name `kiln model synth --family` writes the network under (`z-image`).
    pub fn synth_name(self) -> &'static str {
        match self {
            DiffusionFamily::Flux => flux::family::SYNTH_NAME,
            DiffusionFamily::LongCatImage => flux::family::LONGCAT_SYNTH_NAME,
            DiffusionFamily::OvisImage => flux::family::OVIS_SYNTH_NAME,
            DiffusionFamily::Chroma => flux::family::CHROMA_SYNTH_NAME,
            DiffusionFamily::Flux2 => flux::family::FLUX2_SYNTH_NAME,
            DiffusionFamily::ZImage => zimage::family::SYNTH_NAME,
            DiffusionFamily::Lumina2 => zimage::family::LUMINA2_SYNTH_NAME,
            DiffusionFamily::QwenImage => qwen_image::family::SYNTH_NAME,
            DiffusionFamily::Wan21 => wan::family::WAN21_SYNTH_NAME,
            DiffusionFamily::Wan22 => wan::family::WAN22_SYNTH_NAME,
            DiffusionFamily::Lotus => unet::family::SYNTH_NAME,
            DiffusionFamily::HiDream => hidream::family::SYNTH_NAME,
            DiffusionFamily::Sd3 => sd3::family::SYNTH_NAME,
            DiffusionFamily::Kandinsky5 => kandinsky5::family::SYNTH_NAME,
            DiffusionFamily::Kandinsky5Video => kandinsky5::family::VIDEO_SYNTH_NAME,
            DiffusionFamily::Anima => anima::family::SYNTH_NAME,
            DiffusionFamily::OmniGen2 => omnigen2::family::SYNTH_NAME,
            DiffusionFamily::Boogu => omnigen2::family::BOOGU_SYNTH_NAME,
            DiffusionFamily::HunyuanVideo => hunyuan_video::family::V1_SYNTH_NAME,
            DiffusionFamily::HunyuanVideo15 => hunyuan_video::family::SYNTH_NAME,
            DiffusionFamily::Krea2 => krea2::family::SYNTH_NAME,
            DiffusionFamily::MageFlow => mage_flow::family::SYNTH_NAME,
            DiffusionFamily::JoyImage => joyimage::family::SYNTH_NAME,
            DiffusionFamily::Ernie => ernie::family::SYNTH_NAME,
            DiffusionFamily::PixelDit => pixeldit::family::SYNTH_NAME,
            DiffusionFamily::ChromaRadiance => chroma_radiance::family::SYNTH_NAME,
            DiffusionFamily::Sdxl => unet::family::SDXL_SYNTH_NAME,
            DiffusionFamily::SdxlRefiner => unet::family::SDXL_REFINER_SYNTH_NAME,
        }
    }

    /// The name `kiln model synth --family` writes a LoRA for the network under (`z-image-lora`).
    pub fn synth_lora_name(self) -> &'static str {
        match self {
            DiffusionFamily::Flux => flux::family::SYNTH_LORA_NAME,
            DiffusionFamily::LongCatImage => flux::family::LONGCAT_SYNTH_LORA_NAME,
            DiffusionFamily::OvisImage => flux::family::OVIS_SYNTH_LORA_NAME,
            DiffusionFamily::Chroma => flux::family::CHROMA_SYNTH_LORA_NAME,
            DiffusionFamily::Flux2 => flux::family::FLUX2_SYNTH_LORA_NAME,
            DiffusionFamily::ZImage => zimage::family::SYNTH_LORA_NAME,
            DiffusionFamily::Lumina2 => zimage::family::LUMINA2_SYNTH_LORA_NAME,
            DiffusionFamily::QwenImage => qwen_image::family::SYNTH_LORA_NAME,
            DiffusionFamily::Wan21 => wan::family::WAN21_SYNTH_LORA_NAME,
            DiffusionFamily::Wan22 => wan::family::WAN22_SYNTH_LORA_NAME,
            DiffusionFamily::Lotus => unet::family::SYNTH_LORA_NAME,
            DiffusionFamily::HiDream => hidream::family::SYNTH_LORA_NAME,
            DiffusionFamily::Sd3 => sd3::family::SYNTH_LORA_NAME,
            DiffusionFamily::Kandinsky5 => kandinsky5::family::SYNTH_LORA_NAME,
            DiffusionFamily::Kandinsky5Video => kandinsky5::family::VIDEO_SYNTH_LORA_NAME,
            DiffusionFamily::Anima => anima::family::SYNTH_LORA_NAME,
            DiffusionFamily::OmniGen2 => omnigen2::family::SYNTH_LORA_NAME,
            DiffusionFamily::Boogu => omnigen2::family::BOOGU_SYNTH_LORA_NAME,
            DiffusionFamily::HunyuanVideo => hunyuan_video::family::V1_SYNTH_LORA_NAME,
            DiffusionFamily::HunyuanVideo15 => hunyuan_video::family::SYNTH_LORA_NAME,
            DiffusionFamily::Krea2 => krea2::family::SYNTH_LORA_NAME,
            DiffusionFamily::MageFlow => mage_flow::family::SYNTH_LORA_NAME,
            DiffusionFamily::JoyImage => joyimage::family::SYNTH_LORA_NAME,
            DiffusionFamily::Ernie => ernie::family::SYNTH_LORA_NAME,
            DiffusionFamily::PixelDit => pixeldit::family::SYNTH_LORA_NAME,
            DiffusionFamily::ChromaRadiance => chroma_radiance::family::SYNTH_LORA_NAME,
            DiffusionFamily::Sdxl => unet::family::SDXL_SYNTH_LORA_NAME,
            DiffusionFamily::SdxlRefiner => unet::family::SDXL_REFINER_SYNTH_LORA_NAME,
        }
    }

    /// This family's detection of `h`.
    fn detect(self, h: &Header) -> Result<Option<DiffusionDetected>> {
        Ok(match self {
            DiffusionFamily::Flux
            | DiffusionFamily::LongCatImage
            | DiffusionFamily::Chroma
            | DiffusionFamily::OvisImage => flux::detect(h)?
                .filter(|(config, _)| {
                    config.generation == flux::Generation::One && flux_family(config) == self
                })
                .map(|(config, layout)| DiffusionDetected::Flux(config, layout)),
            DiffusionFamily::Flux2 => flux::detect(h)?
                .filter(|(config, _)| config.generation == flux::Generation::Two)
                .map(|(config, layout)| DiffusionDetected::Flux2(config, layout)),
            DiffusionFamily::ZImage | DiffusionFamily::Lumina2 => zimage::detect(h)?
                .filter(|(config, _)| nextdit_family(config) == self)
                .map(|(config, layout)| DiffusionDetected::ZImage(config, layout)),
            DiffusionFamily::QwenImage => qwen_image::detect(h)?
                .map(|(config, method)| DiffusionDetected::QwenImage(config, method)),
            DiffusionFamily::Wan21 | DiffusionFamily::Wan22 => wan::detect(h)?
                .filter(|(config, _)| wan_family(config) == self)
                .map(|(config, layout)| DiffusionDetected::Wan(config, layout)),
            DiffusionFamily::Lotus | DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner => {
                unet::detect(h)?.filter(|c| unet_family(c) == self).map(DiffusionDetected::Unet)
            }
            DiffusionFamily::HiDream => hidream::detect(h)?.map(DiffusionDetected::HiDream),
            DiffusionFamily::Sd3 => sd3::detect(h)?.map(DiffusionDetected::Sd3),
            DiffusionFamily::Kandinsky5 | DiffusionFamily::Kandinsky5Video => {
                kandinsky5::detect(h)?
                    .filter(|config| kandinsky5_family(config) == self)
                    .map(DiffusionDetected::Kandinsky5)
            }
            DiffusionFamily::Anima => anima::detect(h)?.map(DiffusionDetected::Anima),
            DiffusionFamily::OmniGen2 | DiffusionFamily::Boogu => omnigen2::detect(h)?
                .filter(|config| omnigen2_family(config) == self)
                .map(DiffusionDetected::OmniGen2),
            DiffusionFamily::HunyuanVideo | DiffusionFamily::HunyuanVideo15 => {
                match hunyuan_video::detect(h)? {
                    Some(config) if hunyuan_family(&config) == self => {
                        refuse_hunyuan_video(h, &config)?;
                        Some(DiffusionDetected::HunyuanVideo(config))
                    }
                    _ => None,
                }
            }
            DiffusionFamily::Krea2 => krea2::detect(h)?.map(DiffusionDetected::Krea2),
            DiffusionFamily::MageFlow => mage_flow::detect(h)?.map(DiffusionDetected::MageFlow),
            DiffusionFamily::JoyImage => joyimage::detect(h)?.map(DiffusionDetected::JoyImage),
            DiffusionFamily::Ernie => ernie::detect(h)?.map(DiffusionDetected::Ernie),
            DiffusionFamily::PixelDit => pixeldit::detect(h)?.map(DiffusionDetected::PixelDit),
            DiffusionFamily::ChromaRadiance => {
                chroma_radiance::detect(h)?.map(DiffusionDetected::ChromaRadiance)
            }
        })
    }
}

/// The family of a HunyuanVideo DiT: 1.5's when it has the vision projection (`vision_in`), else 1.0's.
fn hunyuan_family(config: &hunyuan_video::Config) -> DiffusionFamily {
    if config.vision_dim.is_some() {
        DiffusionFamily::HunyuanVideo15
    } else {
        DiffusionFamily::HunyuanVideo
    }
}

/// The HunyuanVideo DiTs Kiln cannot run yet, refused by name: 1.0's image-to-video models (channels beside the
/// latent), 1.5's super-resolution model (its latent, image and mask channels beside the noise) and the
/// step-distilled ("meanflow") models, which read the sampler's next σ.
fn refuse_hunyuan_video(h: &Header, config: &hunyuan_video::Config) -> Result<()> {
    let v1 = config.vision_dim.is_none();
    let why = if v1 && config.in_channels != config.out_channels {
        "a HunyuanVideo 1.0 image-to-video model (channels beside the latent); Kiln runs its text-to-video model"
    } else if !v1
        && config.in_channels != config.out_channels + hunyuan_video::family::CONCAT_CHANNELS
    {
        "HunyuanVideo 1.5's super-resolution model (HunyuanVideo15SuperResolution); Kiln runs its text and image \
         to video models"
    } else if config.meanflow {
        "a step-distilled (meanflow) HunyuanVideo 1.5 model, which reads the sampler's next σ; Kiln runs the \
         720p and 480p text and image to video models"
    } else {
        return Ok(());
    };
    Err(h.unsupported(format!("{why}: not supported yet")))
}

/// The family of a Kandinsky 5 DiT: the video models' when it reads channels beside the latent.
fn kandinsky5_family(config: &kandinsky5::Config) -> DiffusionFamily {
    if config.is_video() { DiffusionFamily::Kandinsky5Video } else { DiffusionFamily::Kandinsky5 }
}

/// The family of an OmniGen2-shaped DiT: Boogu-Image's when it has double-stream blocks.
fn omnigen2_family(config: &omnigen2::Config) -> DiffusionFamily {
    if config.is_boogu() { DiffusionFamily::Boogu } else { DiffusionFamily::OmniGen2 }
}

/// The family of a NextDiT: Lumina 2's or Z-Image's.
fn nextdit_family(config: &zimage::Config) -> DiffusionFamily {
    match config.variant {
        zimage::Variant::ZImage => DiffusionFamily::ZImage,
        zimage::Variant::Lumina2 => DiffusionFamily::Lumina2,
    }
}

/// The family a FLUX.1-shaped `config` belongs to: LongCat-Image's or Chroma's where it is theirs.
fn flux_family(config: &flux::Config) -> DiffusionFamily {
    if config.longcat {
        DiffusionFamily::LongCatImage
    } else if config.ovis {
        DiffusionFamily::OvisImage
    } else if config.approximator.is_some() {
        DiffusionFamily::Chroma
    } else {
        DiffusionFamily::Flux
    }
}

/// A diffusion network found in a header: its family, config and key layout, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum DiffusionDetected {
    /// FLUX.1.
    Flux(flux::Config, flux::Layout),
    /// FLUX.2.
    Flux2(flux::Config, flux::Layout),
    /// Z-Image or Lumina 2 (the config's variant says which).
    ZImage(zimage::Config, zimage::Layout),
    /// Qwen-Image, with its default reference method (`index_timestep_zero` for Edit 2511).
    QwenImage(qwen_image::Config, &'static str),
    /// Wan 2.1 or 2.2 (the config says which: [`wan::Config::is_wan22`]).
    Wan(wan::Config, wan::Layout),
    /// Lotus depth's UNet.
    Unet(unet::Config),
    /// HiDream-I1 or E1.
    HiDream(hidream::Config),
    /// SD3's MMDiT.
    Sd3(sd3::Config),
    /// Kandinsky 5's DiT.
    Kandinsky5(kandinsky5::Config),
    /// Anima's DiT and LLM adapter.
    Anima(anima::Config),
    /// OmniGen2's or Boogu-Image's DiT (the config says which).
    OmniGen2(omnigen2::Config),
    /// HunyuanVideo 1.5's DiT.
    HunyuanVideo(hunyuan_video::Config),
    /// Krea 2's DiT.
    Krea2(krea2::Config),
    /// Mage-Flow's DiT.
    MageFlow(mage_flow::Config),
    /// JoyAI Image Edit's DiT.
    JoyImage(joyimage::Config),
    /// ERNIE-Image's DiT.
    Ernie(ernie::Config),
    /// PixelDiT's DiT.
    PixelDit(pixeldit::Config),
    /// Chroma Radiance's DiT.
    ChromaRadiance(chroma_radiance::Config),
}

/// The family of a UNet of a kind Kiln runs (detection refuses the others).
fn unet_family(config: &unet::Config) -> DiffusionFamily {
    match config.kind() {
        Some(unet::UnetKind::Sdxl) => DiffusionFamily::Sdxl,
        Some(unet::UnetKind::SdxlRefiner) => DiffusionFamily::SdxlRefiner,
        Some(unet::UnetKind::Lotus) | None => DiffusionFamily::Lotus,
    }
}

/// The family of a Wan DiT: ComfyUI's `WAN22_T2V` entry for TI2V 5B, its `WAN21` ones for the others.
fn wan_family(config: &wan::Config) -> DiffusionFamily {
    if config.is_wan22() { DiffusionFamily::Wan22 } else { DiffusionFamily::Wan21 }
}

impl DiffusionDetected {
    /// The network in `h` (the caller applied ComfyUI's prefix rule, [`crate::header::diffusion_prefix`]):
    /// `Ok(None)` when no family claims it; [`crate::Error::Unsupported`] for a file a family recognises but
    /// cannot run.
    pub fn detect(h: &Header) -> Result<Option<DiffusionDetected>> {
        super::first_detected(&DiffusionFamily::ALL, h, DiffusionFamily::detect)
    }

    /// The family.
    pub fn family(&self) -> DiffusionFamily {
        match self {
            DiffusionDetected::Flux(config, _) => flux_family(config),
            DiffusionDetected::Flux2(..) => DiffusionFamily::Flux2,
            DiffusionDetected::ZImage(config, _) => nextdit_family(config),
            DiffusionDetected::QwenImage(..) => DiffusionFamily::QwenImage,
            DiffusionDetected::Wan(config, _) => wan_family(config),
            DiffusionDetected::Unet(config) => unet_family(config),
            DiffusionDetected::HiDream(_) => DiffusionFamily::HiDream,
            DiffusionDetected::Sd3(_) => DiffusionFamily::Sd3,
            DiffusionDetected::Kandinsky5(config) => kandinsky5_family(config),
            DiffusionDetected::Anima(_) => DiffusionFamily::Anima,
            DiffusionDetected::OmniGen2(config) => omnigen2_family(config),
            DiffusionDetected::HunyuanVideo(config) => hunyuan_family(config),
            DiffusionDetected::Krea2(_) => DiffusionFamily::Krea2,
            DiffusionDetected::MageFlow(_) => DiffusionFamily::MageFlow,
            DiffusionDetected::JoyImage(_) => DiffusionFamily::JoyImage,
            DiffusionDetected::Ernie(_) => DiffusionFamily::Ernie,
            DiffusionDetected::PixelDit(_) => DiffusionFamily::PixelDit,
            DiffusionDetected::ChromaRadiance(_) => DiffusionFamily::ChromaRadiance,
        }
    }

    /// The model sampling the loaded model starts with: the family's, except schnell's
    /// (`ModelSamplingDiscreteFlow`, shift 1: σ(t) = t), a causal Wan's and Wan Animate 2's (shift 5).
    pub fn sampling(&self) -> ModelSampling {
        match self {
            DiffusionDetected::Flux(config, _)
                if !config.guidance && flux_family(config) == DiffusionFamily::Flux =>
            {
                FlowSampling::new(flux::family::SCHNELL_SHIFT, flux::family::SCHNELL_MULTIPLIER)
                    .into()
            }
            DiffusionDetected::Wan(config, _) if config.causal => {
                FlowSampling::new(wan::family::CAUSAL_SHIFT, wan::family::MULTIPLIER).into()
            }
            DiffusionDetected::Wan(config, _) if config.animate2 => {
                FlowSampling::new(wan::family::ANIMATE2_SHIFT, wan::family::MULTIPLIER).into()
            }
            _ => self.family().sampling(),
        }
    }

    /// The types ComfyUI lets this network compute in, in its order of preference (its model config's
    /// `supported_inference_dtypes`): Wan's start with f16; FLUX.1 Fill's and Qwen-Image's have none, nor
    /// Z-Image's unless its norms spread little ([`zimage::Config::allow_fp16`]: then f16 after bf16).
    pub fn inference_dtypes(&self) -> &'static [DType] {
        const BF16_FIRST: &[DType] = &[DType::BF16, DType::F16, DType::F32];
        const NO_F16: &[DType] = &[DType::BF16, DType::F32];
        match self {
            DiffusionDetected::Flux(config, _) if config.is_fill() => NO_F16,
            DiffusionDetected::Flux(..) | DiffusionDetected::Flux2(..) => BF16_FIRST,
            DiffusionDetected::ZImage(config, _) if config.allow_fp16 => BF16_FIRST,
            DiffusionDetected::ZImage(..)
            | DiffusionDetected::QwenImage(..)
            | DiffusionDetected::HiDream(_)
            | DiffusionDetected::Kandinsky5(_) => NO_F16,
            // ComfyUI's SD3 config keeps the default list: f16 first.
            DiffusionDetected::Sd3(_) => &[DType::F16, DType::BF16, DType::F32],
            // ComfyUI's Anima config allows f16 too, keeping the residual stream in f32 then; Kiln computes an
            // f16 file in bf16 instead, so the large residuals cannot overflow.
            DiffusionDetected::Anima(_) => NO_F16,
            DiffusionDetected::Wan(..) => &[DType::F16, DType::BF16, DType::F32],
            // ComfyUI's OmniGen2 config puts f16 first on torch 2.7 and later (`extended_fp16_support`).
            DiffusionDetected::OmniGen2(_) => &[DType::F16, DType::BF16, DType::F32],
            // `SD20`'s: f16 first.
            DiffusionDetected::Unet(_) => &[DType::F16, DType::BF16, DType::F32],
            DiffusionDetected::HunyuanVideo(config)
                if hunyuan_family(config) == DiffusionFamily::HunyuanVideo15 =>
            {
                &[DType::F16, DType::BF16, DType::F32]
            }
            DiffusionDetected::HunyuanVideo(_) => NO_F16,
            DiffusionDetected::Krea2(_) => BF16_FIRST,
            DiffusionDetected::MageFlow(_) => NO_F16,
            // ComfyUI's `JoyImage`: bf16 or f32.
            DiffusionDetected::JoyImage(_) => NO_F16,
            // ComfyUI's `ErnieImage`: bf16 or f32.
            DiffusionDetected::Ernie(_) => NO_F16,
            // ComfyUI's `PixelDiTT2I`: bf16 or f32.
            DiffusionDetected::PixelDit(_) => NO_F16,
            // Chroma's (FLUX.1's) dtypes.
            DiffusionDetected::ChromaRadiance(_) => BF16_FIRST,
        }
    }

    /// The type ComfyUI computes this network in (`unet_dtype`, then `unet_manual_cast`), for a file holding most
    /// of its elements as `weights` (ComfyUI's `weight_dtype`; the cast UNETLoader asks for, when it asks for one),
    /// on a device that computes in 16-bit types (`half`: CUDA) or not (the CPU, where it is f32): f16 for a
    /// mostly-f16 file when the family allows f16, else the first 16-bit type the family allows.
    pub fn compute_dtype(&self, weights: Option<DType>, half: bool) -> DType {
        if !half {
            return DType::F32;
        }
        let supported = self.inference_dtypes();
        if weights == Some(DType::F16) && supported.contains(&DType::F16) {
            return DType::F16;
        }
        let half_types = [DType::F16, DType::BF16];
        supported.iter().copied().find(|dt| half_types.contains(dt)).unwrap_or(DType::F32)
    }

    /// The weights to load, named in the family's layout whatever the file's.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            DiffusionDetected::Flux(config, layout) | DiffusionDetected::Flux2(config, layout) => {
                flux::load_plan(h, config, *layout)
            }
            DiffusionDetected::ZImage(config, layout) => zimage::load_plan(h, config, *layout),
            DiffusionDetected::QwenImage(config, _) => qwen_image::load_plan(h, config),
            DiffusionDetected::Wan(config, layout) => wan::load_plan(h, config, *layout),
            DiffusionDetected::Unet(config) => unet::load_plan(h, config),
            DiffusionDetected::HiDream(config) => hidream::load_plan(h, config),
            DiffusionDetected::Sd3(config) => sd3::load_plan(h, config),
            DiffusionDetected::Kandinsky5(config) => kandinsky5::load_plan(h, config),
            DiffusionDetected::Anima(config) => anima::load_plan(h, config),
            DiffusionDetected::OmniGen2(config) => omnigen2::load_plan(h, config),
            DiffusionDetected::HunyuanVideo(config) => hunyuan_video::load_plan(h, config),
            DiffusionDetected::Krea2(config) => krea2::load_plan(h, config),
            DiffusionDetected::MageFlow(config) => mage_flow::load_plan(h, config),
            DiffusionDetected::JoyImage(config) => joyimage::load_plan(h, config),
            DiffusionDetected::Ernie(config) => ernie::load_plan(h, config),
            DiffusionDetected::PixelDit(config) => pixeldit::load_plan(h, config),
            DiffusionDetected::ChromaRadiance(config) => chroma_radiance::load_plan(h, config),
        }
    }

    /// The network with `weights` loaded from [`DiffusionDetected::load_plan`].
    pub fn build(self, weights: Model) -> DiffusionNet {
        match self {
            DiffusionDetected::Flux(config, layout) => {
                DiffusionNet::Flux(Flux::new(config, layout, weights))
            }
            DiffusionDetected::Flux2(config, layout) => {
                DiffusionNet::Flux2(Flux::new(config, layout, weights))
            }
            DiffusionDetected::ZImage(config, _) => {
                DiffusionNet::ZImage(ZImage::new(config, weights))
            }
            DiffusionDetected::QwenImage(config, default_method) => {
                DiffusionNet::QwenImage(QwenImage { config, weights, default_method })
            }
            DiffusionDetected::Wan(config, _) => DiffusionNet::Wan(Wan::new(config, weights)),
            DiffusionDetected::Unet(config) => DiffusionNet::Unet(Unet::new(config, weights)),
            DiffusionDetected::HiDream(config) => {
                DiffusionNet::HiDream(HiDream::new(config, weights))
            }
            DiffusionDetected::Sd3(config) => DiffusionNet::Sd3(Sd3::new(config, weights)),
            DiffusionDetected::Kandinsky5(config) => {
                DiffusionNet::Kandinsky5(Kandinsky5::new(config, weights))
            }
            DiffusionDetected::Anima(config) => DiffusionNet::Anima(Anima::new(config, weights)),
            DiffusionDetected::OmniGen2(config) => {
                DiffusionNet::OmniGen2(OmniGen2::new(config, weights))
            }
            DiffusionDetected::HunyuanVideo(config) => {
                DiffusionNet::HunyuanVideo(HunyuanVideo::new(config, weights))
            }
            DiffusionDetected::Krea2(config) => DiffusionNet::Krea2(Krea2::new(config, weights)),
            DiffusionDetected::JoyImage(config) => {
                DiffusionNet::JoyImage(JoyImage::new(config, weights))
            }
            DiffusionDetected::Ernie(config) => {
                DiffusionNet::Ernie(ErnieImage::new(config, weights))
            }
            DiffusionDetected::PixelDit(config) => {
                DiffusionNet::PixelDit(PixelDit::new(config, weights))
            }
            DiffusionDetected::ChromaRadiance(config) => {
                DiffusionNet::ChromaRadiance(ChromaRadiance::new(config, weights))
            }
            DiffusionDetected::MageFlow(config) => {
                DiffusionNet::MageFlow(MageFlow::new(config, weights))
            }
        }
    }
}

/// What one diffusion model call takes: the latents in model space, one timestep per sample, and the
/// conditioning.
pub struct DiffusionInput<'a, B: Backend> {
    /// Latents `[B, C, h, w]` (Wan: `[B, C, T, h, w]` with the conditioning channels concatenated), any float
    /// dtype.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample: what the model sampling makes of σ (`FlowSampling::timestep`, σ·multiplier),
    /// as ComfyUI hands the network `model_sampling.timestep(σ)`.
    pub timesteps: &'a [f32],
    /// Text features `[B, N, D]`, or with `text_lens` `[1, ΣNᵢ, D]`.
    pub context: &'a Tensor<B>,
    /// Each sample's rows of `context` when the prompts differ in length (one pass over the weights for prompts
    /// ComfyUI would run as separate calls; see [`DiffusionNet::takes_ragged_text`]). `None`: `[B, N, D]`.
    pub text_lens: Option<&'a [usize]>,
    /// The pooled text vector `[B, D]` of families that take one (FLUX.1: CLIP-L's); `None` where the
    /// conditioning has none.
    pub pooled: Option<&'a Tensor<B>>,
    /// The distilled guidance (`FluxGuidance`, `FluxDisableGuidance`). Families without a guidance embedding
    /// ignore it.
    pub guidance: DistilledGuidance<'a>,
    /// Latents an edit model attends to (`ReferenceLatent`), in order, in model space, `[1 or B, C, h, w]`
    /// each; families without reference inputs ignore them, as ComfyUI's do.
    pub references: &'a [Tensor<B>],
    /// How the references are positioned (`FluxKontextMultiReferenceLatentMethod`); `None` for the
    /// model's default (the family's, or what its file marks: Qwen-Image-Edit 2511's `index_timestep_zero`).
    pub reference_method: Option<&'a str>,
    /// `FluxKVCache`'s store for this sampling run (FLUX.2's reference keys and values); other families ignore
    /// it.
    pub kv_cache: Option<&'a flux::KvCache<B>>,
    /// Tokens in the model's hidden space put before the text's (USO's style tokens, FLUX only)
    /// `[1 or B, n, hidden]`; other families refuse them.
    pub text_prefix: Option<&'a Tensor<B>>,
    /// ControlNets in the order they were applied (`ControlNetApplyAdvanced`), each of this family.
    pub controls: &'a [ControlInput<'a, B>],
    /// Model patches in the order they were applied (`QwenImageDiffsynthControlnet`), each of this family.
    pub patches: &'a [PatchInput<'a, B>],
    /// CLIP-vision penultimate hidden states `[1 or B, n, D]` (`CLIPVisionEncode`'s, through the Wan image
    /// nodes' `clip_vision_output`); families without a CLIP branch ignore them.
    pub clip_vision: Option<&'a Tensor<B>>,
    /// The model's timesteps per latent frame, `B·T` sample-major, replacing `timesteps` (Wan 2.2 TI2V 5B with a
    /// noise mask, ComfyUI's `WAN22.process_timestep`); other families ignore them.
    pub frame_timesteps: Option<&'a [f32]>,
    /// Blocks this call leaves out (`SkipLayerGuidanceDiT`'s extra pass); none for a plain call.
    pub skipped_blocks: SkippedBlocks,
    /// A Wan VACE model's control contexts with their strengths (`WanVaceToVideo`; see
    /// [`DiffusionNet::vace_channels`]); other models ignore them.
    pub vace: &'a [(Tensor<B>, f32)],
    /// A Wan Fun Camera model's camera embedding (`WanCameraImageToVideo`'s `camera_conditions`); other models
    /// ignore it.
    pub camera: Option<&'a Tensor<B>>,
    /// `ScaleROPE`'s scales and shifts of the token positions: Wan applies them; Qwen-Image ignores them, as
    /// ComfyUI's does; FLUX and Z-Image refuse any but the identity (ComfyUI applies them there; Kiln not yet).
    pub rope: RopeOptions,
    /// In-context latents in model space (`BerniniConditioning`'s `context_latents`), each `[1 or B, C, T, h,
    /// w]`: Wan reads them (see [`crate::wan::WanInput::context_latents`]); other families ignore them, as
    /// ComfyUI's do.
    pub context_latents: &'a [Tensor<B>],
    /// One block of frames of a causal Wan model's autoregressive run (the `ar_video` sampler; see
    /// [`crate::wan::WanInput::causal`]); other families refuse it.
    pub causal: Option<wan::CausalStep<'a, B>>,
    /// HuMo's audio embedding (`WanHuMoImageToVideo`'s, `[B or 1, F, 8, 5, C]`); other models ignore it.
    pub audio: Option<&'a Tensor<B>>,
    /// InfiniteTalk's audio (`WanInfiniteTalkToVideo`; see [`crate::wan::WanInput::talk`]); other families refuse
    /// it.
    pub talk: Option<wan::infinite_talk::TalkInput<'a, B>>,
    /// Wan 2.2 S2V's motion latent (`reference_motion`, in the model's space; see
    /// [`crate::wan::WanInput::motion`]); other models ignore it.
    pub motion: Option<&'a Tensor<B>>,
    /// Wan 2.2 S2V's control video latent (`control_video`, in the model's space); other models ignore it.
    pub control: Option<&'a Tensor<B>>,
    /// Wan Animate 2's pose branch and strengths; other models ignore it.
    pub animate: Option<wan::animate2::Animate2Input<'a, B>>,
    /// WanDancer's music, frame rate and reference image; other models ignore it.
    pub dancer: Option<wan::dancer::DancerInput<'a, B>>,
    /// Phantom's subject frames in model space (`WanPhantomSubjectToVideo`'s `time_dim_concat`, `[1 or B, C, K,
    /// h, w]`): a Wan model runs them after the video's frames (see [`wan::phantom`]); other families refuse
    /// them.
    pub time_concat: Option<&'a Tensor<B>>,
    /// HiDream's Llama states `[B, L, N, D]` (the conditioning's `conditioning_llama3`: one per decoder layer on
    /// dim 1); HiDream needs them, other families ignore them.
    pub llama: Option<&'a Tensor<B>>,
    /// An image latent in model space joined to the latents along the width (HiDream E1's `image_cond`, from
    /// `InstructPixToPixConditioning`), `[1 or B, C, h, w']`; other families take theirs as channels.
    pub width_concat: Option<&'a Tensor<B>>,
    /// HunyuanVideo 1.5's ByT5 states of the prompt's quoted passages `[B, M, D]` (the conditioning's
    /// `conditioning_byt5small`); other families ignore them.
    pub byt5: Option<&'a Tensor<B>>,
    /// Kandinsky 5's start frames in model space (`time_dim_replace`), `[1 or B, C, F, h, w]`, which replace the
    /// first frames of its video model's input (the output is left alone); other families ignore them.
    pub time_dim_replace: Option<&'a Tensor<B>>,
    /// `ChromaRadianceOptions`' overrides for this call (Chroma Radiance reads them; other families ignore
    /// them, as ComfyUI's do).
    pub radiance: Option<crate::chroma_radiance::RadianceOptions>,
}

impl<'a, B: Backend> DiffusionInput<'a, B> {
    /// A plain call: latents `x`, one timestep per sample, text `context`, and nothing else (no guidance set,
    /// references, controls, patches, skipped blocks or in-context latents; the identity RoPE).
    pub fn new(x: &'a Tensor<B>, timesteps: &'a [f32], context: &'a Tensor<B>) -> Self {
        DiffusionInput {
            x,
            timesteps,
            context,
            text_lens: None,
            pooled: None,
            guidance: DistilledGuidance::Unset,
            references: &[],
            reference_method: None,
            kv_cache: None,
            text_prefix: None,
            controls: &[],
            patches: &[],
            clip_vision: None,
            frame_timesteps: None,
            skipped_blocks: SkippedBlocks::default(),
            vace: &[],
            camera: None,
            rope: RopeOptions::default(),
            context_latents: &[],
            causal: None,
            audio: None,
            talk: None,
            motion: None,
            control: None,
            animate: None,
            dancer: None,
            time_concat: None,
            llama: None,
            width_concat: None,
            byt5: None,
            time_dim_replace: None,
            radiance: None,
        }
    }
}

/// The blocks a call leaves out, as ComfyUI's `patches_replace["dit"]` entries that return their input: bit i
/// of `double` for `("double_block", i)`, of `single` for `("single_block", i)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkippedBlocks {
    /// Double-stream blocks (Wan's blocks).
    pub double: u64,
    /// Single-stream blocks (Wan has none: ignored there, as in ComfyUI).
    pub single: u64,
}

impl SkippedBlocks {
    /// Whether nothing is skipped.
    pub fn is_empty(&self) -> bool {
        self.double == 0 && self.single == 0
    }
}

/// What the conditioning says of a guidance-distilled model's guidance embedding.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DistilledGuidance<'a> {
    /// Nothing: the model's default (FLUX.1: ComfyUI's 3.5).
    #[default]
    Unset,
    /// One value per sample (`FluxGuidance`, `CLIPTextEncodeFlux`).
    Set(&'a [f32]),
    /// No guidance term at all (`FluxDisableGuidance`).
    Disabled,
}

/// Refuses ControlNets and model patches of another family than `family`.
fn refuse_controls<B: Backend>(
    family: DiffusionFamily,
    controls: &[ControlInput<'_, B>],
    patches: &[PatchInput<'_, B>],
) -> Result<()> {
    let other = controls
        .iter()
        .map(|c| (c.net.family(), "ControlNet"))
        .chain(patches.iter().map(|p| (p.net.family(), "model patch")))
        .find(|(f, _)| *f != family);
    match other {
        Some((other, what)) => Err(crate::Error::Invalid(format!(
            "a {} {what} cannot control a {} model",
            other.name(),
            family.name()
        ))),
        None => Ok(()),
    }
}

/// A loaded diffusion network.
pub enum DiffusionNet {
    /// FLUX.1.
    Flux(Flux),
    /// FLUX.2.
    Flux2(Flux),
    /// Z-Image or Lumina 2.
    ZImage(ZImage),
    /// Qwen-Image.
    QwenImage(QwenImage),
    /// Wan 2.1 or 2.2.
    Wan(Wan),
    /// Lotus depth's UNet.
    Unet(Unet),
    /// HiDream-I1 or E1.
    HiDream(HiDream),
    /// SD3's MMDiT.
    Sd3(Sd3),
    /// Kandinsky 5's DiT.
    Kandinsky5(Kandinsky5),
    /// Anima's DiT and LLM adapter.
    Anima(Anima),
    /// OmniGen2's or Boogu-Image's DiT.
    OmniGen2(OmniGen2),
    /// HunyuanVideo 1.5's DiT.
    HunyuanVideo(HunyuanVideo),
    /// Krea 2's DiT.
    Krea2(Krea2),
    /// Mage-Flow's DiT.
    MageFlow(MageFlow),
    /// JoyAI Image Edit's DiT.
    JoyImage(JoyImage),
    /// ERNIE-Image's DiT.
    Ernie(ErnieImage),
    /// PixelDiT's DiT.
    PixelDit(PixelDit),
    /// Chroma Radiance's DiT.
    ChromaRadiance(ChromaRadiance),
}

impl DiffusionNet {
    /// The family.
    pub fn family(&self) -> DiffusionFamily {
        match self {
            DiffusionNet::Flux(net) => flux_family(&net.config),
            DiffusionNet::Flux2(_) => DiffusionFamily::Flux2,
            DiffusionNet::ZImage(net) => nextdit_family(&net.config),
            DiffusionNet::QwenImage(_) => DiffusionFamily::QwenImage,
            DiffusionNet::Wan(net) => wan_family(&net.config),
            DiffusionNet::Unet(net) => unet_family(&net.config),
            DiffusionNet::HiDream(_) => DiffusionFamily::HiDream,
            DiffusionNet::Sd3(_) => DiffusionFamily::Sd3,
            DiffusionNet::Kandinsky5(net) => kandinsky5_family(&net.config),
            DiffusionNet::Anima(_) => DiffusionFamily::Anima,
            DiffusionNet::OmniGen2(net) => omnigen2_family(&net.config),
            DiffusionNet::HunyuanVideo(net) => hunyuan_family(&net.config),
            DiffusionNet::Krea2(_) => DiffusionFamily::Krea2,
            DiffusionNet::MageFlow(_) => DiffusionFamily::MageFlow,
            DiffusionNet::JoyImage(_) => DiffusionFamily::JoyImage,
            DiffusionNet::Ernie(_) => DiffusionFamily::Ernie,
            DiffusionNet::PixelDit(_) => DiffusionFamily::PixelDit,
            DiffusionNet::ChromaRadiance(_) => DiffusionFamily::ChromaRadiance,
        }
    }

    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            DiffusionNet::Flux(net) | DiffusionNet::Flux2(net) => &net.weights,
            DiffusionNet::ZImage(net) => &net.weights,
            DiffusionNet::QwenImage(net) => &net.weights,
            DiffusionNet::Wan(net) => &net.weights,
            DiffusionNet::Unet(net) => &net.weights,
            DiffusionNet::HiDream(net) => &net.weights,
            DiffusionNet::Sd3(net) => &net.weights,
            DiffusionNet::Kandinsky5(net) => &net.weights,
            DiffusionNet::Anima(net) => &net.weights,
            DiffusionNet::OmniGen2(net) => &net.weights,
            DiffusionNet::HunyuanVideo(net) => &net.weights,
            DiffusionNet::Krea2(net) => &net.weights,
            DiffusionNet::MageFlow(net) => &net.weights,
            DiffusionNet::JoyImage(net) => &net.weights,
            DiffusionNet::Ernie(net) => &net.weights,
            DiffusionNet::PixelDit(net) => &net.weights,
            DiffusionNet::ChromaRadiance(net) => net.weights(),
        }
    }

    /// The patches a LoRA file makes at `strength` for this network, whose weights are `slots` (`(name,
    /// shape)` in the family's layout), with the file's keys that adapt none of them.
    pub fn lora(
        &self,
        file: &SafetensorsFile,
        slots: &[(&str, &[usize])],
        strength: f32,
    ) -> Result<LoraPatches> {
        match self {
            DiffusionNet::Flux(net) | DiffusionNet::Flux2(net) => {
                flux::lora::patches(file, &net.config, slots, strength)
            }
            DiffusionNet::ZImage(_) => zimage_lora::patches(file, slots, strength),
            DiffusionNet::QwenImage(_) => qwen_image::lora::patches(file, slots, strength),
            DiffusionNet::Wan(_) => wan::lora::patches(file, slots, strength),
            DiffusionNet::Unet(_) => Err(crate::Error::Invalid(format!(
                "Kiln applies no LoRA to {}'s UNet yet",
                self.family().name()
            ))),
            DiffusionNet::HiDream(_) => hidream::lora::patches(file, slots, strength),
            DiffusionNet::Anima(_) => anima::lora::patches(file, slots, strength),
            DiffusionNet::Krea2(_) => krea2::lora::patches(file, slots, strength),
            // Mage-Flow's blocks are Qwen-Image's, under the same names.
            DiffusionNet::MageFlow(_) => qwen_image::lora::patches(file, slots, strength),
            DiffusionNet::Sd3(_)
            | DiffusionNet::Kandinsky5(_)
            | DiffusionNet::OmniGen2(_)
            | DiffusionNet::JoyImage(_)
            | DiffusionNet::Ernie(_)
            | DiffusionNet::PixelDit(_)
            | DiffusionNet::ChromaRadiance(_)
            | DiffusionNet::HunyuanVideo(_) => Err(crate::Error::Invalid(format!(
                "Kiln applies no LoRA to {} yet",
                self.family().name()
            ))),
        }
    }

    /// How many channels the network reads beside the latents (ComfyUI's `concat_cond`): FLUX.1 Fill's 80
    /// (image latent and folded mask), Canny's and Depth's 16 (image latent), Wan's in − out channels (20 for
    /// I2V, FLF2V and the 2.2 I2V experts: mask 4, image latent 16); 0 for the others.
    pub fn concat_channels(&self) -> usize {
        match self {
            DiffusionNet::Flux(net) => net.config.in_channels.saturating_sub(flux::LATENT_CHANNELS),
            DiffusionNet::Wan(net) => net.config.concat_channels(),
            DiffusionNet::HunyuanVideo(net) => {
                net.config.in_channels.saturating_sub(net.config.out_channels)
            }
            DiffusionNet::Kandinsky5(net) => net.config.concat_channels(),
            DiffusionNet::Flux2(_)
            | DiffusionNet::ZImage(_)
            | DiffusionNet::QwenImage(_)
            | DiffusionNet::Unet(_)
            | DiffusionNet::HiDream(_)
            | DiffusionNet::Sd3(_)
            | DiffusionNet::Anima(_)
            | DiffusionNet::OmniGen2(_)
            | DiffusionNet::Krea2(_)
            | DiffusionNet::JoyImage(_)
            | DiffusionNet::Ernie(_)
            | DiffusionNet::PixelDit(_)
            | DiffusionNet::ChromaRadiance(_)
            | DiffusionNet::MageFlow(_) => 0,
        }
    }

    /// The channels of a Wan VACE model's control context (96: two 16-channel latents and 64 mask channels);
    /// `None` for a model without VACE.
    pub fn vace_channels(&self) -> Option<usize> {
        match self {
            DiffusionNet::Wan(net) => net.config.vace.map(|v| v.in_channels),
            DiffusionNet::Flux(_)
            | DiffusionNet::Flux2(_)
            | DiffusionNet::ZImage(_)
            | DiffusionNet::QwenImage(_)
            | DiffusionNet::Unet(_)
            | DiffusionNet::HiDream(_)
            | DiffusionNet::Sd3(_)
            | DiffusionNet::Kandinsky5(_)
            | DiffusionNet::Anima(_)
            | DiffusionNet::OmniGen2(_)
            | DiffusionNet::HunyuanVideo(_)
            | DiffusionNet::Krea2(_)
            | DiffusionNet::JoyImage(_)
            | DiffusionNet::Ernie(_)
            | DiffusionNet::PixelDit(_)
            | DiffusionNet::ChromaRadiance(_)
            | DiffusionNet::MageFlow(_) => None,
        }
    }

    /// For a Wan model, whether ComfyUI builds it with `image_to_video` (how its `concat_cond` treats a
    /// conditioning without the 4 mask channels: [`wan::Config::image_to_video`]); `None` for other families.
    pub fn wan_image_to_video(&self) -> Option<bool> {
        match self {
            DiffusionNet::Wan(net) => Some(net.config.image_to_video()),
            DiffusionNet::Flux(_)
            | DiffusionNet::Flux2(_)
            | DiffusionNet::ZImage(_)
            | DiffusionNet::QwenImage(_)
            | DiffusionNet::Unet(_)
            | DiffusionNet::HiDream(_)
            | DiffusionNet::Sd3(_)
            | DiffusionNet::Kandinsky5(_)
            | DiffusionNet::Anima(_)
            | DiffusionNet::OmniGen2(_)
            | DiffusionNet::HunyuanVideo(_)
            | DiffusionNet::Krea2(_)
            | DiffusionNet::JoyImage(_)
            | DiffusionNet::Ernie(_)
            | DiffusionNet::PixelDit(_)
            | DiffusionNet::ChromaRadiance(_)
            | DiffusionNet::MageFlow(_) => None,
        }
    }

    /// For an SDXL UNet, its kind and the width of the pooled vector its class vector starts with
    /// ([`unet::sdxl::adm`]); `None` for the other networks.
    pub fn sdxl_adm(&self) -> Option<(unet::UnetKind, usize)> {
        let DiffusionNet::Unet(net) = self else { return None };
        let kind = net.config.kind().filter(|k| *k != unet::UnetKind::Lotus)?;
        Some((kind, kind.pooled_width(net.config.adm_in_channels?)))
    }

    /// Whether this is a HuMo model (a Wan DiT with HuMo's audio branch), whose 17B variant reads fixed
    /// conditioning channels ([`wan::humo::concat_channels`]).
    pub fn is_humo(&self) -> bool {
        matches!(self, DiffusionNet::Wan(net) if net.config.humo.is_some())
    }

    /// Whether the network reads a prompt through its own adapter first ([`DiffusionNet::adapt_text`]): Anima.
    pub fn adapts_text(&self) -> bool {
        matches!(self, DiffusionNet::Anima(_))
    }

    /// A prompt's context as the network reads it, from the text encoder's `states` `[1, N, D]` and the T5
    /// `tokens` riding along (Anima's LLM adapter, which ComfyUI runs once per prompt as sampling starts); an
    /// error for a network without an adapter.
    pub fn adapt_text<B: Backend>(
        &self,
        b: &B,
        states: &Tensor<B>,
        tokens: &[crate::prompt_weights::Weighted],
    ) -> Result<Tensor<B>> {
        let DiffusionNet::Anima(net) = self else {
            return Err(crate::Error::Invalid(format!(
                "a {} model reads its prompts as they are encoded",
                self.family().name()
            )));
        };
        let ids: Vec<u32> = tokens.iter().map(|&(id, _)| id).collect();
        let weights: Vec<f32> = tokens.iter().map(|&(_, w)| w).collect();
        net.adapt(b, states, &ids, &weights)
    }

    /// Whether one call takes prompts of different lengths ([`DiffusionInput::text_lens`]): Qwen-Image, whose
    /// samples share nothing but the weights, so the positive and negative prompts of CFG read each weight once
    /// a step where ComfyUI's two calls read it twice.
    pub fn takes_ragged_text(&self) -> bool {
        matches!(self, DiffusionNet::QwenImage(_))
    }

    /// ComfyUI's model output for `input` (what `calculate_denoised` turns into x̂₀), f32 `[B, C, h, w]` (Wan:
    /// `[B, C, T, h, w]`).
    pub fn forward<B: Backend>(&self, b: &B, input: DiffusionInput<'_, B>) -> Result<Tensor<B>> {
        if input.text_lens.is_some() && !self.takes_ragged_text() {
            return Err(crate::Error::Invalid(format!(
                "prompts of different lengths run in one call only on Qwen-Image; a {} model takes them as \
                 separate calls",
                self.family().name()
            )));
        }
        if !input.skipped_blocks.is_empty() && !matches!(self, DiffusionNet::Wan(_)) {
            return Err(crate::Error::Invalid(format!(
                "SkipLayerGuidanceDiT's pass leaves blocks out of Wan models; Kiln does not skip the blocks of a \
                 {} model yet",
                self.family().name()
            )));
        }
        let honours_rope = matches!(
            self,
            DiffusionNet::Wan(_)
                | DiffusionNet::QwenImage(_)
                | DiffusionNet::Ernie(_)
                | DiffusionNet::PixelDit(_)
        );
        if !input.rope.is_identity() && !honours_rope {
            return Err(crate::Error::Invalid(format!(
                "ScaleROPE's scales and shifts are applied to Wan, Qwen-Image, ERNIE-Image and PixelDiT models; \
                 Kiln does not apply them to a {} model yet",
                self.family().name()
            )));
        }
        if input.causal.is_some() && !matches!(self, DiffusionNet::Wan(_)) {
            return Err(crate::Error::Invalid(format!(
                "the ar_video sampler runs a causal Wan model (Causal Forcing) a block of frames at a time; a {} \
                 model is not one: choose another sampler",
                self.family().name()
            )));
        }
        if input.text_prefix.is_some() && !matches!(self, DiffusionNet::Flux(_)) {
            return Err(crate::Error::Invalid(format!(
                "USO's style tokens (USOStyleReference) are for FLUX.1; a {} model takes none",
                self.family().name()
            )));
        }
        if input.time_concat.is_some() && !matches!(self, DiffusionNet::Wan(_)) {
            return Err(crate::Error::Invalid(format!(
                "Phantom's subject frames (WanPhantomSubjectToVideo) are for Wan 2.1; a {} model takes none",
                self.family().name()
            )));
        }
        if input.talk.is_some() && !matches!(self, DiffusionNet::Wan(_)) {
            return Err(crate::Error::Invalid(format!(
                "InfiniteTalk's audio (WanInfiniteTalkToVideo) is for Wan 2.1; a {} model takes none",
                self.family().name()
            )));
        }
        match self {
            DiffusionNet::Flux(net) | DiffusionNet::Flux2(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                // Chroma's conditioning carries guidance 0 where none is set (`model_base.Chroma`).
                let default = match net.config.approximator {
                    Some(_) => flux::family::CHROMA_DEFAULT_GUIDANCE,
                    None => flux::family::DEFAULT_GUIDANCE,
                };
                let default_guidance = vec![default; input.x.dim(0)?];
                let guidance = match input.guidance {
                    DistilledGuidance::Unset => Some(default_guidance.as_slice()),
                    DistilledGuidance::Set(values) => Some(values),
                    DistilledGuidance::Disabled => None,
                };
                net.forward(
                    b,
                    &FluxInput {
                        x: input.x,
                        timesteps: input.timesteps,
                        context: input.context,
                        pooled: input.pooled,
                        guidance,
                        references: input.references,
                        method: input.reference_method,
                        kv_cache: input.kv_cache,
                        text_prefix: input.text_prefix,
                    },
                )
            }
            DiffusionNet::ZImage(net) => {
                refuse_controls(nextdit_family(&net.config), input.controls, input.patches)?;
                let mut patches = Vec::with_capacity(input.patches.len());
                for patch in input.patches {
                    if let ModelPatchNet::ZImageFun(control) = patch.net {
                        let (hint, strength) = (patch.hint, patch.strength);
                        patches.push(zimage::FunPatch { net: control, hint, strength });
                    }
                }
                net.forward_with_patches(b, input.x, input.timesteps, input.context, &patches)
            }
            DiffusionNet::QwenImage(net) => {
                let mut controls = Vec::with_capacity(input.controls.len());
                for control in input.controls {
                    let ControlNetNet::QwenImage(control_net) = control.net else {
                        return Err(crate::Error::Invalid(format!(
                            "a {} ControlNet on a Qwen-Image model",
                            control.net.family().name()
                        )));
                    };
                    controls.push(control_net.residuals(
                        b,
                        net,
                        input.x,
                        input.timesteps,
                        qwen_image::Text { features: input.context, lens: input.text_lens },
                        control.hint,
                        control.strength,
                    )?);
                }
                refuse_controls(DiffusionFamily::QwenImage, &[], input.patches)?;
                let mut patches = Vec::with_capacity(input.patches.len());
                for patch in input.patches {
                    if let ModelPatchNet::QwenImageBlockwise(net) = patch.net {
                        let condition = net.condition(b, patch.hint, input.x.dim(0)?)?;
                        let strength = patch.strength;
                        patches.push(qwen_image::BlockPatch { net, condition, strength });
                    }
                }
                let extras = qwen_image::Extras {
                    references: input.references,
                    method: input.reference_method,
                    controls: &controls,
                    patches: &patches,
                    text_lens: input.text_lens,
                };
                net.forward_with_extras(b, input.x, input.timesteps, input.context, &extras)
            }
            DiffusionNet::Wan(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                // Phantom's subject frames run after the video's; the output is the video's frames.
                let joined = match input.time_concat {
                    Some(_) if input.causal.is_some() || input.frame_timesteps.is_some() => {
                        return Err(crate::Error::Invalid(
                            "Phantom's subject frames (WanPhantomSubjectToVideo) go with a whole-video call at \
                             one timestep a sample; not with the ar_video sampler or Wan 2.2's per-frame \
                             timesteps"
                                .to_owned(),
                        ));
                    }
                    Some(frames) => Some(wan::phantom::join_frames(b, input.x, frames)?),
                    None => None,
                };
                let wan_input = WanInput {
                    x: joined.as_ref().unwrap_or(input.x),
                    timesteps: input.frame_timesteps.unwrap_or(input.timesteps),
                    context: input.context,
                    clip: input.clip_vision,
                    // ComfyUI's `reference_latent`: the last reference latent.
                    reference: input.references.last(),
                    vace: input.vace,
                    camera: input.camera,
                    skip: input.skipped_blocks.double,
                    rope: input.rope,
                    context_latents: input.context_latents,
                    causal: input.causal,
                    audio: input.audio,
                    talk: input.talk,
                    motion: input.motion,
                    control: input.control,
                    animate: input.animate,
                    dancer: input.dancer,
                };
                let out = net.forward(b, &wan_input)?;
                match joined {
                    Some(_) => Ok(b.slice(&out, 2, 0, input.x.dim(2)?)?),
                    None => Ok(out),
                }
            }
            DiffusionNet::Sd3(net) => {
                refuse_controls(DiffusionFamily::Sd3, &[], input.patches)?;
                let mut call = Sd3Input {
                    x: input.x,
                    timesteps: input.timesteps,
                    context: input.context,
                    pooled: input.pooled,
                    controls: &[],
                };
                // Every ControlNet's outputs, summed per block (ComfyUI chains them with `previous_controlnet`).
                let mut controls: Vec<Option<Tensor<B>>> = Vec::new();
                for control in input.controls {
                    let ControlNetNet::Sd3(control_net) = control.net else {
                        return Err(crate::Error::Invalid(format!(
                            "a {} ControlNet on an SD3 model",
                            control.net.family().name()
                        )));
                    };
                    let outputs =
                        control_net.residuals(b, net, &call, control.hint, control.strength)?;
                    for (i, out) in outputs.into_iter().enumerate() {
                        match controls.get_mut(i) {
                            Some(Some(sum)) => *sum = b.binary(sum, &out, BinaryOp::Add)?,
                            Some(slot) => *slot = Some(out),
                            None => controls.push(Some(out)),
                        }
                    }
                }
                call.controls = &controls;
                net.forward(b, &call)
            }
            DiffusionNet::Anima(net) => {
                refuse_controls(DiffusionFamily::Anima, input.controls, input.patches)?;
                // Each LLLite's embedding of its control image, as ComfyUI's `post_input` patch makes it per call.
                let mut lllite = Vec::with_capacity(input.patches.len());
                for patch in input.patches {
                    if let ModelPatchNet::AnimaLllite(net) = patch.net {
                        let cond = net.embed(b, patch.hint)?;
                        lllite.push(anima::LlliteCall { net, cond, strength: patch.strength });
                    }
                }
                let call = AnimaInput {
                    x: input.x,
                    timesteps: input.timesteps,
                    context: input.context,
                    lllite: &lllite,
                };
                net.forward(b, &call)
            }
            DiffusionNet::OmniGen2(net) => {
                refuse_controls(omnigen2_family(&net.config), input.controls, input.patches)?;
                net.forward(b, input.x, input.timesteps, input.context, input.references)
            }
            DiffusionNet::HunyuanVideo(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                // 1.0's conditioning carries guidance 6 where none is set (`HunyuanVideo.extra_conds`); 1.5's
                // model has no guidance embedding and ignores it.
                let default_guidance =
                    vec![hunyuan_video::family::DEFAULT_GUIDANCE; input.x.dim(0)?];
                let guidance = match input.guidance {
                    DistilledGuidance::Unset => Some(default_guidance.as_slice()),
                    DistilledGuidance::Set(values) => Some(values),
                    DistilledGuidance::Disabled => None,
                };
                let call = HunyuanVideoInput {
                    byt5: input.byt5,
                    clip_fea: input.clip_vision,
                    pooled: input.pooled,
                    guidance,
                    ..HunyuanVideoInput::new(input.x, input.timesteps, input.context)
                };
                net.forward(b, &call)
            }
            DiffusionNet::Krea2(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                net.forward_with_references(
                    b,
                    input.x,
                    input.timesteps,
                    input.context,
                    input.references,
                    input.reference_method,
                )
            }
            DiffusionNet::ChromaRadiance(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                // Chroma's conditioning carries guidance 0 where none is set (`model_base.Chroma`).
                let default_guidance =
                    vec![chroma_radiance::family::DEFAULT_GUIDANCE; input.x.dim(0)?];
                let guidance = match input.guidance {
                    DistilledGuidance::Unset => Some(default_guidance.as_slice()),
                    DistilledGuidance::Set(values) => Some(values),
                    DistilledGuidance::Disabled => None,
                };
                let options = input.radiance.unwrap_or_default();
                net.forward(b, input.x, input.timesteps, input.context, guidance, &options)
            }
            // PixelDiT reads no reference latents and ignores the text mask (ComfyUI's forward passes None).
            DiffusionNet::PixelDit(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                net.forward_with_rope(b, input.x, input.timesteps, input.context, &input.rope)
            }
            // ERNIE-Image reads no reference latents (ComfyUI's forward takes none).
            DiffusionNet::Ernie(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                net.forward_with_rope(b, input.x, input.timesteps, input.context, &input.rope)
            }
            // JoyImage places every reference latent as further frames whatever the method (its forward reads none).
            DiffusionNet::JoyImage(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                net.forward(b, input.x, input.timesteps, input.context, input.references)
            }
            // Mage-Flow appends every reference latent whatever the method (ComfyUI's forward reads none).
            DiffusionNet::MageFlow(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                net.forward_with_references(
                    b,
                    input.x,
                    input.timesteps,
                    input.context,
                    input.references,
                )
            }
            DiffusionNet::Kandinsky5(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                let pooled = input.pooled.ok_or_else(|| {
                    crate::Error::Invalid(
                        "Kandinsky 5 conditions on CLIP-L's pooled vector beside Qwen2.5-VL's states: encode the \
                         prompt with its two text encoders (DualCLIPLoader, type kandinsky5_image: \
                         qwen_2.5_vl_7b and clip_l)"
                            .to_owned(),
                    )
                })?;
                net.forward(
                    b,
                    &Kandinsky5Input {
                        x: input.x,
                        timesteps: input.timesteps,
                        context: input.context,
                        pooled,
                        time_dim_replace: input.time_dim_replace,
                    },
                )
            }
            DiffusionNet::HiDream(net) => {
                refuse_controls(DiffusionFamily::HiDream, input.controls, input.patches)?;
                let llama = input.llama.ok_or_else(|| {
                    crate::Error::Invalid(
                        "HiDream conditions on Llama 3.1's states beside T5-XXL's: encode the prompt with \
                         HiDream's four text encoders (QuadrupleCLIPLoader: CLIP-L, CLIP-G, T5-XXL, Llama 3.1 8B)"
                            .to_owned(),
                    )
                })?;
                net.forward(
                    b,
                    &HiDreamInput {
                        x: input.x,
                        timesteps: input.timesteps,
                        context: input.context,
                        llama,
                        pooled: input.pooled,
                        image_cond: input.width_concat,
                    },
                )
            }
            DiffusionNet::Unet(net) => {
                refuse_controls(self.family(), input.controls, input.patches)?;
                match net.config.kind() {
                    Some(unet::UnetKind::Lotus) => {
                        let task = unet::lotus_task_embedding();
                        let y = b.from_f32(&[1, task.len()], &task, DType::F32)?;
                        net.forward(b, input.x, input.timesteps, input.context, Some(&y))
                    }
                    // SDXL's class vector, made from the pooled vector as the run started (`encode_adm`).
                    _ => {
                        let y = input.pooled.ok_or_else(|| {
                            crate::Error::Invalid(format!(
                                "{} conditions on CLIP-G's pooled vector: encode the prompt with SDXL's text \
                                 encoders (its checkpoint's CLIP, or DualCLIPLoader type sdxl)",
                                self.family().name()
                            ))
                        })?;
                        net.forward(b, input.x, input.timesteps, input.context, Some(y))
                    }
                }
            }
        }
    }
}
