//! [`ControlNetDetected`]: the ControlNets (`CONTROL_NET`) Kiln runs, and [`ControlNetNet`], one loaded; each
//! controls the diffusion models of one [`DiffusionFamily`].

use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, Tensor};

use crate::error::Result;
use crate::header::Header;
use crate::qwen_image::{self, QwenImageControlNet};
use crate::sd3::{self, Sd3ControlNet};

use super::DiffusionFamily;

/// A ControlNet found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlNetDetected {
    /// A Qwen-Image ControlNet (InstantX's or VideoX-Fun's).
    QwenImage(qwen_image::ControlConfig),
    /// An SD3.5 Large ControlNet (blur, canny, depth).
    Sd3(sd3::ControlConfig),
}

impl ControlNetDetected {
    /// The ControlNet in `h`: `Ok(None)` when no family claims it; [`crate::Error::Unsupported`] for a file a
    /// family recognises but cannot run.
    pub fn detect(h: &Header) -> Result<Option<ControlNetDetected>> {
        if let Some(config) = sd3::detect_control(h)? {
            return Ok(Some(ControlNetDetected::Sd3(config)));
        }
        Ok(qwen_image::detect_control(h)?.map(ControlNetDetected::QwenImage))
    }

    /// The family of the models it controls.
    pub fn family(&self) -> DiffusionFamily {
        match self {
            ControlNetDetected::QwenImage(_) => DiffusionFamily::QwenImage,
            ControlNetDetected::Sd3(_) => DiffusionFamily::Sd3,
        }
    }

    /// The weights to load.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            ControlNetDetected::QwenImage(config) => qwen_image::control_load_plan(h, config),
            ControlNetDetected::Sd3(config) => sd3::control_load_plan(h, config),
        }
    }

    /// The network with `weights` loaded from [`ControlNetDetected::load_plan`].
    pub fn build(self, weights: Model) -> ControlNetNet {
        match self {
            ControlNetDetected::QwenImage(config) => {
                ControlNetNet::QwenImage(QwenImageControlNet::new(config, weights))
            }
            ControlNetDetected::Sd3(config) => {
                ControlNetNet::Sd3(Sd3ControlNet::new(config, weights))
            }
        }
    }
}

/// A loaded ControlNet.
pub enum ControlNetNet {
    /// A Qwen-Image ControlNet.
    QwenImage(QwenImageControlNet),
    /// An SD3.5 Large ControlNet.
    Sd3(Sd3ControlNet),
}

impl ControlNetNet {
    /// The family of the models it controls.
    pub fn family(&self) -> DiffusionFamily {
        match self {
            ControlNetNet::QwenImage(_) => DiffusionFamily::QwenImage,
            ControlNetNet::Sd3(_) => DiffusionFamily::Sd3,
        }
    }

    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            ControlNetNet::QwenImage(net) => net.weights(),
            ControlNetNet::Sd3(net) => &net.weights,
        }
    }

    /// Whether its hint carries the inpainting mask as one more channel (ComfyUI's `concat_mask`: without a
    /// mask, the channel is all ones).
    pub fn concat_mask(&self) -> bool {
        match self {
            ControlNetNet::QwenImage(net) => net.concat_mask(),
            ControlNetNet::Sd3(_) => false,
        }
    }

    /// A control image's pixel value (in [0, 1]) as the VAE is given it (ComfyUI's `preprocess_image`: SD3.5's
    /// canny and depth ControlNets rescale or invert it).
    pub fn preprocess_hint(&self, a: f32) -> f32 {
        match self {
            ControlNetNet::QwenImage(_) => a,
            ControlNetNet::Sd3(net) => net.config.control_type.preprocess(a),
        }
    }
}

/// A ControlNet applied to one model call: its hint (the control image in the model's latent space at the
/// latents' size, `[1 or B, C, h, w]`) and strength.
pub struct ControlInput<'a, B: Backend> {
    /// The network.
    pub net: &'a ControlNetNet,
    /// The hint.
    pub hint: &'a Tensor<B>,
    /// The node's strength.
    pub strength: f32,
}
