//! [`ClipVisionDetected`]: the vision towers (`CLIP_VISION`, `CLIPVisionLoader`) Kiln runs, and
//! [`ClipVisionNet`], one loaded; [`StyleModelDetected`] and [`StyleModelNet`]: the style models
//! (`STYLE_MODEL`, `StyleModelLoader`) that turn a vision tower's output into prompt tokens.

use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, Tensor};

use crate::clip_vision::{self, ClipVision, Redux, ReduxConfig, VisionOutput};
use crate::error::Result;
use crate::header::Header;

/// A vision tower found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum ClipVisionDetected {
    /// A CLIP or SigLIP ViT in the Hugging Face `vision_model.*` layout.
    Vit(clip_vision::Config),
}

impl ClipVisionDetected {
    /// The vision tower in `h`: `Ok(None)` when the file is none; [`crate::Error::Unsupported`] for one Kiln
    /// recognises but cannot run.
    pub fn detect(h: &Header) -> Result<Option<ClipVisionDetected>> {
        Ok(clip_vision::detect(h)?.map(ClipVisionDetected::Vit))
    }

    /// The weights to load.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            ClipVisionDetected::Vit(config) => clip_vision::load_plan(h, config),
        }
    }

    /// The network with `weights` loaded from [`ClipVisionDetected::load_plan`].
    pub fn build(self, weights: Model) -> ClipVisionNet {
        match self {
            ClipVisionDetected::Vit(config) => ClipVisionNet::Vit(ClipVision::new(config, weights)),
        }
    }
}

/// A loaded vision tower.
#[derive(Debug)]
pub enum ClipVisionNet {
    /// A CLIP or SigLIP ViT.
    Vit(ClipVision),
}

impl ClipVisionNet {
    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            ClipVisionNet::Vit(net) => &net.weights,
        }
    }

    /// The tower's name in messages (`SigLIP vision`).
    pub fn name(&self) -> &'static str {
        match self {
            ClipVisionNet::Vit(net) => net.config.variant.name(),
        }
    }

    /// `CLIPVisionEncode`: `image` `[B, H, W, C]` in 0..=1 preprocessed as ComfyUI does (`crop`: "center")
    /// and run through the tower.
    pub fn encode<B: Backend>(
        &self,
        b: &B,
        image: &[f32],
        shape: [usize; 4],
        crop: bool,
    ) -> Result<VisionOutput<B>> {
        match self {
            ClipVisionNet::Vit(net) => {
                let pixels = net.preprocess(image, shape, crop)?;
                net.encode(b, &pixels, shape[0])
            }
        }
    }
}

/// A style model found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum StyleModelDetected {
    /// FLUX.1 Redux.
    FluxRedux(ReduxConfig),
}

impl StyleModelDetected {
    /// The style model in `h`: `Ok(None)` when Kiln knows no style model like it; [`crate::Error::Unsupported`]
    /// for one it recognises but cannot run (the SD1.x T2I style adapter).
    pub fn detect(h: &Header) -> Result<Option<StyleModelDetected>> {
        Ok(clip_vision::detect_redux(h)?.map(StyleModelDetected::FluxRedux))
    }

    /// The weights to load.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            StyleModelDetected::FluxRedux(config) => clip_vision::redux_load_plan(h, config),
        }
    }

    /// The network with `weights` loaded from [`StyleModelDetected::load_plan`].
    pub fn build(self, weights: Model) -> StyleModelNet {
        match self {
            StyleModelDetected::FluxRedux(config) => {
                StyleModelNet::FluxRedux(Redux::new(config, weights))
            }
        }
    }
}

/// A loaded style model.
#[derive(Debug)]
pub enum StyleModelNet {
    /// FLUX.1 Redux.
    FluxRedux(Redux),
}

impl StyleModelNet {
    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            StyleModelNet::FluxRedux(net) => &net.weights,
        }
    }

    /// ComfyUI's `StyleModel.get_cond`: the tokens for a vision output's `last_hidden_state` `[B, N, width]`
    /// → `[B, N, text width]`, f32.
    pub fn tokens<B: Backend>(&self, b: &B, last_hidden_state: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            StyleModelNet::FluxRedux(net) => net.encode(b, last_hidden_state),
        }
    }
}
