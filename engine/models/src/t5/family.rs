//! T5-XXL's and umT5-XXL's facts as text-encoder families (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "T5-XXL";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "t5xxl";
/// umT5-XXL's name in messages.
pub const UMT5_NAME: &str = "umT5-XXL";
/// The name `kiln model synth --family` writes umT5-XXL under.
pub const UMT5_SYNTH_NAME: &str = "umt5-xxl";
/// The `CLIPLoader` type that makes a umT5 file Wan's text encoder.
pub const WAN_CLIP_TYPE: &str = "wan";
