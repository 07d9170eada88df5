//! Qwen3's facts as a text-encoder family (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "Qwen3";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "qwen3";
/// Qwen2.5-VL's language model's name in messages (Qwen-Image's text encoder).
pub const QWEN25VL_NAME: &str = "Qwen2.5-VL";
/// The name `kiln model synth --family` writes Qwen2.5-VL's language model under.
pub const QWEN25VL_SYNTH_NAME: &str = "qwen25vl";
