//! Whisper large-v3's audio encoder as ComfyUI runs it (`AudioEncoderLoader` / `AudioEncoderEncode` with
//! `whisper_large_v3_fp16.safetensors`; `comfy/audio_encoders/whisper.py` and `audio_encoders.py`), for the
//! audio-conditioned video models.
//!
//! - [`detect`] recognises the encoder in the Hugging Face / ComfyUI layout (`model.encoder.*`, beside the
//!   decoder's `model.decoder.*`, which is ignored) or a bare `encoder.*` one, and reads the widths from its
//!   shapes; [`load_plan`] names the weights to load. (ComfyUI builds only large-v3's shapes, and reads a bare
//!   `encoder.*` file as wav2vec2 and fails on it; Kiln runs both, so tiny test models load.)
//! - [`log_mel`]: the feature extractor on the host (channels averaged, 30 s windows, torchaudio's slaney mel
//!   spectrogram, Whisper's log scaling).
//! - [`Whisper::forward`]: the encoder on a backend, giving ComfyUI's last hidden state and its tuple of every
//!   layer's state; [`Whisper::encode_audio`]: ComfyUI's `encode_audio` (resampled to 16 kHz with
//!   [`crate::resample`], then both).

mod config;
mod features;
mod model;

pub use config::{Config, HEADS, Layout, POSITIONS, detect, expected_shapes, load_plan};
pub use features::{FRAMES, HOP, N_FFT, SAMPLE_RATE, WINDOW_SAMPLES, log_mel};
pub use model::Whisper;
