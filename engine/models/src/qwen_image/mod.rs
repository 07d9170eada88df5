//! Qwen-Image's MMDiT (`qwen_image_*.safetensors`; ComfyUI's names are diffusers'): 60 double-stream blocks
//! over text and image tokens, per-head q/k RMS norms, a 3-axis RoPE with centred image positions, and
//! adaLN modulation from the timestep (models-qwen-image.md §3).
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`QwenImage::forward`]: ComfyUI's model output v = ε − x₀ for text-to-image (one frame), with ComfyUI's
//!   conventions where diffusers' differ (the centring of odd token grids);
//!   [`QwenImage::forward_with_references`] adds Edit's reference latents by each of ComfyUI's methods,
//!   [`QwenImage::forward_with_extras`] ControlNet outputs too.
//! - [`detect_control`], [`control_load_plan`] and [`QwenImageControlNet`]: the InstantX and Fun ControlNets
//!   (`ControlNetLoader`), whose [`QwenImageControlNet::residuals`] the base model adds after its blocks;
//!   [`detect_blockwise`] and [`QwenImageBlockwise`]: DiffSynth's block-wise ControlNet (`ModelPatchLoader`),
//!   run after every block.
//!
//! Mage-Flow ([`crate::mage_flow`]) is this layout at patch 1; it shares the trunk (`DoubleStream`), the weight
//! list (`expected_of`) and the detection rule that tells the two apart (`is_mage_flow`).

mod blockwise;
mod config;
mod control;
pub mod family;
pub mod lora;
mod model;

pub(crate) use blockwise::expected_blockwise;
pub use blockwise::{
    BlockPatch, BlockwiseConfig, QwenImageBlockwise, blockwise_load_plan, detect_blockwise,
};
pub use config::{
    ADDITION_T_EMBEDDING, Config, DEFAULT_REFERENCE_METHOD, EPS, INDEX_TIMESTEP_ZERO,
    LATENT_CHANNELS, PATCH, ROPE_THETA, T_FREQ_DIM, detect, load_plan,
};
pub(crate) use config::{
    MAGE_FLOW_CHANNELS, block_config, block_prefix, check_shapes, expected, expected_of,
    is_mage_flow,
};
pub(crate) use control::expected_control;
pub use control::{
    BASE_BLOCKS, ControlConfig, ControlKind, ControlResiduals, FUN_INJECTION_BLOCKS,
    QwenImageControlNet, control_load_plan, detect_control,
};
pub(crate) use model::{DoubleStream, Sequence, Timestep};
pub use model::{Extras, QwenImage, Text};
