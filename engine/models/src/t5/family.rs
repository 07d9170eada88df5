//! T5-XXL's facts as a text-encoder family (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "T5-XXL";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "t5xxl";
