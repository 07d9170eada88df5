//! [`ModelPatchDetected`]: the model patches (`MODEL_PATCH`, `ModelPatchLoader`) Kiln runs, and
//! [`ModelPatchNet`], one loaded; each patches the diffusion models of one [`DiffusionFamily`].

use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, Tensor};

use crate::anima::{self, AnimaLllite, LlliteConfig};
use crate::error::Result;
use crate::flux::{self, UsoConfig, UsoProjector};
use crate::header::Header;
use crate::qwen_image::{self, BlockwiseConfig, QwenImageBlockwise};
use crate::wan::infinite_talk::{self, InfiniteTalk, TalkConfig};
use crate::zimage::{self, FunControlConfig, ZImageFunControl};

use super::DiffusionFamily;

/// A model patch found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelPatchDetected {
    /// DiffSynth's block-wise ControlNet for Qwen-Image.
    QwenImageBlockwise(BlockwiseConfig),
    /// The Z-Image Fun ControlNet.
    ZImageFun(FunControlConfig),
    /// USO's style projector for FLUX.1.
    Uso(UsoConfig),
    /// InfiniteTalk's audio projection and audio cross-attention for Wan 2.1.
    InfiniteTalk(TalkConfig),
    /// A ControlNet-LLLite for Anima.
    AnimaLllite(LlliteConfig),
}

impl ModelPatchDetected {
    /// The model patch in `h`: `Ok(None)` when Kiln knows no patch like it.
    pub fn detect(h: &Header) -> Result<Option<ModelPatchDetected>> {
        if let Some(config) = qwen_image::detect_blockwise(h)? {
            return Ok(Some(ModelPatchDetected::QwenImageBlockwise(config)));
        }
        if let Some(config) = flux::detect_uso(h)? {
            return Ok(Some(ModelPatchDetected::Uso(config)));
        }
        if let Some(config) = anima::detect_lllite(h)? {
            return Ok(Some(ModelPatchDetected::AnimaLllite(config)));
        }
        if let Some(config) = infinite_talk::detect_infinite_talk(h)? {
            return Ok(Some(ModelPatchDetected::InfiniteTalk(config)));
        }
        Ok(zimage::detect_fun_control(h)?.map(ModelPatchDetected::ZImageFun))
    }

    /// The weights to load.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            ModelPatchDetected::QwenImageBlockwise(config) => {
                qwen_image::blockwise_load_plan(h, config)
            }
            ModelPatchDetected::ZImageFun(config) => zimage::fun_control_load_plan(h, config),
            ModelPatchDetected::Uso(config) => flux::uso_load_plan(h, config),
            ModelPatchDetected::InfiniteTalk(config) => {
                infinite_talk::infinite_talk_load_plan(h, config)
            }
            ModelPatchDetected::AnimaLllite(config) => anima::lllite_load_plan(h, config),
        }
    }

    /// The network with `weights` loaded from [`ModelPatchDetected::load_plan`].
    pub fn build(self, weights: Model) -> ModelPatchNet {
        match self {
            ModelPatchDetected::QwenImageBlockwise(config) => {
                ModelPatchNet::QwenImageBlockwise(QwenImageBlockwise { config, weights })
            }
            ModelPatchDetected::ZImageFun(config) => {
                ModelPatchNet::ZImageFun(Box::new(ZImageFunControl::new(config, weights)))
            }
            ModelPatchDetected::Uso(config) => ModelPatchNet::Uso(UsoProjector { config, weights }),
            ModelPatchDetected::InfiniteTalk(config) => {
                ModelPatchNet::InfiniteTalk(InfiniteTalk { config, weights })
            }
            ModelPatchDetected::AnimaLllite(config) => {
                ModelPatchNet::AnimaLllite(AnimaLllite { config, weights })
            }
        }
    }
}

/// A loaded model patch.
pub enum ModelPatchNet {
    /// DiffSynth's block-wise ControlNet for Qwen-Image.
    QwenImageBlockwise(QwenImageBlockwise),
    /// The Z-Image Fun ControlNet (boxed: its config is a whole NextDiT's).
    ZImageFun(Box<ZImageFunControl>),
    /// USO's style projector: CLIP-vision (SigLIP) states to FLUX.1 text-prefix tokens, not an image hint.
    Uso(UsoProjector),
    /// InfiniteTalk: audio to the tokens a Wan 2.1 model's blocks attend to (`WanInfiniteTalkToVideo`), not an
    /// image hint.
    InfiniteTalk(InfiniteTalk),
    /// A ControlNet-LLLite for Anima: its hint is the control image in pixels (and its mask), not a latent.
    AnimaLllite(AnimaLllite),
}

impl ModelPatchNet {
    /// The family of the models it patches.
    pub fn family(&self) -> DiffusionFamily {
        match self {
            ModelPatchNet::QwenImageBlockwise(_) => DiffusionFamily::QwenImage,
            ModelPatchNet::ZImageFun(_) => DiffusionFamily::ZImage,
            ModelPatchNet::Uso(_) => DiffusionFamily::Flux,
            ModelPatchNet::InfiniteTalk(_) => DiffusionFamily::Wan21,
            ModelPatchNet::AnimaLllite(_) => DiffusionFamily::Anima,
        }
    }

    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            ModelPatchNet::QwenImageBlockwise(net) => &net.weights,
            ModelPatchNet::ZImageFun(net) => net.weights(),
            ModelPatchNet::Uso(net) => &net.weights,
            ModelPatchNet::InfiniteTalk(net) => &net.weights,
            ModelPatchNet::AnimaLllite(net) => &net.weights,
        }
    }

    /// The channels of the control hint it takes beyond the latent's (a block-wise ControlNet's mask
    /// channels).
    pub fn mask_channels(&self) -> usize {
        match self {
            ModelPatchNet::QwenImageBlockwise(net) => {
                net.config.hint_channels() - qwen_image::LATENT_CHANNELS
            }
            ModelPatchNet::ZImageFun(_)
            | ModelPatchNet::Uso(_)
            | ModelPatchNet::InfiniteTalk(_)
            | ModelPatchNet::AnimaLllite(_) => 0,
        }
    }

    /// The size `(h, w)` of the control latent it takes for latents of `h × w`: theirs, or for the Z-Image Fun
    /// ControlNet theirs padded to the patch size, as ComfyUI encodes the image at the padded latents' size.
    pub fn hint_size(&self, h: usize, w: usize) -> (usize, usize) {
        match self {
            ModelPatchNet::QwenImageBlockwise(_)
            | ModelPatchNet::Uso(_)
            | ModelPatchNet::InfiniteTalk(_)
            | ModelPatchNet::AnimaLllite(_) => (h, w),
            ModelPatchNet::ZImageFun(net) => {
                let p = net.config.body.patch_size;
                (h.div_ceil(p) * p, w.div_ceil(p) * p)
            }
        }
    }
}

/// A model patch with its control hint (the control image in the model's latent space at the latents' size,
/// then its mask channels, `[1 or B, C, h, w]`) and strength, for one model call.
pub struct PatchInput<'a, B: Backend> {
    /// The patch.
    pub net: &'a ModelPatchNet,
    /// The hint.
    pub hint: &'a Tensor<B>,
    /// The node's strength.
    pub strength: f32,
}
