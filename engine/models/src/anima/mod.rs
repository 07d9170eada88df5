//! Anima (`anima-*.safetensors`; ComfyUI's `Anima`, `comfy/ldm/anima/model.py`): NVIDIA Cosmos Predict2's
//! `MiniTrainDIT` (`comfy/ldm/cosmos/predict2.py`) conditioned through an LLM adapter, which reads Qwen3 0.6B's
//! states and the prompt's T5 token ids and gives the DiT its cross-attention context.
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`Anima::adapt`]: ComfyUI's `preprocess_text_embeds` (run once per prompt as a sampling run starts, as
//!   ComfyUI's `extra_conds` runs it): the T5 ids' embeddings through self-attention and cross-attention to the
//!   Qwen3 states, weighted per token, padded to 512 rows.
//! - [`Anima::forward`]: `MiniTrainDIT._forward` on a latent with one frame or more: a zero padding-mask channel
//!   joined, 2×2 patches, blocks of self-attention (3-D RoPE, rotate-half), cross-attention and a GELU MLP, each
//!   modulated by the timestep through adaLN-LoRA; channels-last unpatchify; ControlNet-LLLites
//!   ([`AnimaLllite`]) add to the blocks' inputs.

mod adapter;
mod config;
pub mod family;
mod lllite;
pub mod lora;
mod model;

pub use config::{AdapterConfig, Config, MARKER, TEXT_ROWS, detect, expected, load_plan};
pub use lllite::{
    AnimaLllite, LLLITE_MARKER, LlliteCall, LlliteConfig, LlliteModule, LlliteTarget,
    detect_lllite, lllite_expected, lllite_load_plan,
};
pub use model::{Anima, AnimaInput, rope_angles};
