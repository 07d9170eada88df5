//! ComfyUI's wav2vec2 audio encoder (`AudioEncoderLoader` / `AudioEncoderEncode` with
//! `wav2vec2_large_english_fp16.safetensors`, Wan 2.2 S2V's, or `wav2vec2-chinese-base_fp16.safetensors`,
//! InfiniteTalk's; `comfy/audio_encoders/wav2vec2.py` and `audio_encoders.py`), for the audio-driven video
//! models.
//!
//! - [`detect`] recognises the encoder with or without Hugging Face's `wav2vec2.` prefix and with either form
//!   of the positional convolution's weight norm, reads the widths from its shapes and picks ComfyUI's
//!   [`Variant`] for the width; [`load_plan`] names the weights to load.
//! - [`Wav2Vec2::forward`]: the encoder on a 16 kHz waveform batch on a backend, giving ComfyUI's last hidden
//!   state and its tuple of every layer's state; [`Wav2Vec2::encode_audio`]: ComfyUI's `encode_audio`
//!   (resampled to 16 kHz with [`crate::resample`], then the encoder).

mod config;
mod model;

pub use config::{
    CONV_DIM, Config, HEAD_DIM, Layout, POS_CONV_GROUPS, POS_CONV_KERNEL, Prefix, SAMPLE_RATE,
    Variant, WeightNorm, detect, expected_shapes, frames, load_plan,
};
pub use model::Wav2Vec2;
