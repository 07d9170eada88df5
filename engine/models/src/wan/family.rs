//! Wan's facts as a family (read through [`crate::family::DiffusionFamily`]; models-wan-video.md §2.1, §7).
//!
//! ComfyUI has two supported-model entries Kiln runs: `WAN21_*` for every Wan DiT but one (2.1 T2V, I2V, FLF2V and
//! the 2.2 A14B experts, in the Wan 2.1 VAE's latent space) and `WAN22_T2V` for Wan 2.2 TI2V 5B (the Wan 2.2
//! VAE's 48-channel space, per-frame timesteps).

use crate::latent::LatentFormat;

/// The `WAN21` family's name in messages.
pub const WAN21_NAME: &str = "Wan 2.1";
/// The `WAN22` family's name in messages.
pub const WAN22_NAME: &str = "Wan 2.2";
/// The name `kiln model synth --family` writes Wan 2.1 T2V 1.3B under.
pub const WAN21_SYNTH_NAME: &str = "wan21-t2v-1.3b";
/// The name `kiln model synth --family` writes Wan 2.2 TI2V 5B under.
pub const WAN22_SYNTH_NAME: &str = "wan22-ti2v-5b";
/// The name `kiln model synth --family` writes a LoRA for Wan 2.1 T2V 1.3B under.
pub const WAN21_SYNTH_LORA_NAME: &str = "wan21-lora";
/// The name `kiln model synth --family` writes a LoRA for Wan 2.2 TI2V 5B under.
pub const WAN22_SYNTH_LORA_NAME: &str = "wan22-lora";
/// The names `kiln model synth --family` writes the other released DiTs under: 2.1 I2V 14B (with the CLIP
/// branch), 2.1 FLF2V 14B (with `emb_pos` for 514 tokens), the 2.2 A14B T2V and I2V experts, and the Fun
/// models: 2.1 Fun Control 1.3B, 2.2 Fun Control A14B and 5B (with the reference-image convolution), 2.2 Fun
/// InP 5B; 2.1 VACE 14B; 2.1 Fun Camera 1.3B (with the CLIP branch) and a 2.2 Fun Camera A14B expert; the
/// causal 2.1 T2V 1.3B of Causal Forcing (marked in its metadata); HuMo 17B; 2.2 S2V 14B; Wan Animate 2 (2.1
/// I2V 14B's structure, marked in its metadata); WanDancer 14B.
pub const SYNTH_NAMES: [&str; 16] = [
    "wan21-i2v-14b",
    "wan21-flf2v-14b",
    "wan22-t2v-a14b",
    "wan22-i2v-a14b",
    "wan21-fun-control-1.3b",
    "wan22-fun-control-a14b",
    "wan22-fun-control-5b",
    "wan22-fun-inpaint-5b",
    "wan21-vace-14b",
    "wan21-fun-camera-1.3b",
    "wan22-fun-camera-a14b",
    "wan21-causal-t2v-1.3b",
    "humo-17b",
    "wan22-s2v-14b",
    "wan21-animate2-14b",
    "wan22-dancer-14b",
];
/// `WAN21` models denoise in the Wan 2.1 VAE's latent space.
pub const WAN21_LATENT: LatentFormat = LatentFormat::WAN21;
/// `WAN22` (TI2V 5B) denoises in the Wan 2.2 VAE's latent space.
pub const WAN22_LATENT: LatentFormat = LatentFormat::WAN22;
/// ComfyUI's `sampling_settings` for every Wan entry but the causal one ([`CAUSAL_SHIFT`]) and Animate 2's
/// ([`ANIMATE2_SHIFT`]):
/// `ModelSamplingDiscreteFlow` with shift 8.0 (the templates' `ModelSamplingSD3` replaces it).
pub const SHIFT: f64 = 8.0;
/// The shift of ComfyUI's causal entry (`WAN21_CausalAR_T2V`, Causal Forcing).
pub const CAUSAL_SHIFT: f64 = 5.0;
/// The shift of ComfyUI's Wan Animate 2 entry (`WAN_Animate2`).
pub const ANIMATE2_SHIFT: f64 = 5.0;
/// The timestep multiplier of every Wan entry: the DiT reads σ·1000.
pub const MULTIPLIER: f64 = 1000.0;
/// Where a combined checkpoint keeps the text encoder (umT5-XXL, ComfyUI's `text_encoders.umt5xxl.transformer.`).
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.umt5xxl.transformer.";
/// Where a combined checkpoint keeps the VAE.
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
