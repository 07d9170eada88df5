//! Values that flow along links between nodes, and the literal values a prompt can hold.

use std::sync::Arc;

use kiln_models::sampling::SamplerChoice;
use kiln_models::sampling::latent_operation::LatentOperation;

use crate::media::{Audio, Video};
use crate::models::{
    AudioEncoder, AudioEncoderOutput, ClipVision, ClipVisionOutput, Conditioning, ControlNet,
    DancerMusic, DiffusionModel, Guider, ModelPatch, Noise, StyleModel, TextEncoder, UpscaleModel,
    Vae,
};
use crate::tensor::Tensor;

/// `LATENT`: ComfyUI's latent dict. Nodes that change the samples keep the rest, as ComfyUI's copy the dict.
#[derive(Debug, Clone, PartialEq)]
pub struct Latent {
    /// `[B, C, H, W]`, in the VAE's space.
    pub samples: Tensor,
    /// Where sampling may change the latent (`SetLatentNoiseMask`): `[B or 1, 1, H', W']` in 0..=1, at any
    /// resolution (resized to the latent's when sampling); 0 keeps the input.
    pub noise_mask: Option<Tensor>,
    /// Which samples of a larger batch these are (`LatentFromBatch`): the starting noise is drawn for the
    /// whole batch and these taken, so a sample keeps its noise.
    pub batch_index: Option<Vec<i64>>,
    /// Pixels per latent position the node that made this empty latent assumed (ComfyUI's
    /// `downscale_ratio_spacial`: 8 from `EmptyLatentImage` and `EmptySD3LatentImage`): a sampler whose model's
    /// latent space is coarser resizes the empty latent to it, and drops the key from what it returns.
    pub downscale_ratio_spacial: Option<usize>,
}

impl Latent {
    /// Samples with nothing riding along.
    pub fn new(samples: Tensor) -> Latent {
        Latent { samples, noise_mask: None, batch_index: None, downscale_ratio_spacial: None }
    }

    /// The same latent with other samples (ComfyUI's `s = samples.copy(); s["samples"] = ...`).
    pub fn with_samples(&self, samples: Tensor) -> Latent {
        Latent { samples, ..self.clone() }
    }
}

/// A value on a link or a node input.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `INT`. One above i64::MAX (a 64-bit seed) is held as its two's-complement bits: read it with `as u64`.
    Int(i64),
    /// `FLOAT`.
    Float(f64),
    /// `STRING` (and combo choices).
    String(String),
    /// `BOOLEAN`.
    Bool(bool),
    /// `IMAGE`: `[B, H, W, C]` in `0..=1`.
    Image(Tensor),
    /// `MASK`: `[B, H, W]` in `0..=1`.
    Mask(Tensor),
    /// `LATENT`: ComfyUI's latent dict (`samples` and what rides along).
    Latent(Latent),
    /// Any other JSON value a widget accepts.
    Json(Arc<serde_json::Value>),
    /// `MODEL`: a diffusion model with its sampling settings (and patches).
    Model(Arc<DiffusionModel>),
    /// `CLIP`: a text encoder with its tokenizer.
    Clip(Arc<TextEncoder>),
    /// `VAE`: an autoencoder between images and latents.
    Vae(Arc<Vae>),
    /// `CONTROL_NET`: a ControlNet (`ControlNetLoader`).
    ControlNet(Arc<ControlNet>),
    /// `MODEL_PATCH`: a model patch (`ModelPatchLoader`).
    ModelPatch(Arc<ModelPatch>),
    /// `CONDITIONING`: encoded prompts.
    Conditioning(Arc<Conditioning>),
    /// `CLIP_VISION`: a vision tower (`CLIPVisionLoader`).
    ClipVision(Arc<ClipVision>),
    /// `CLIP_VISION_OUTPUT`: an image through a vision tower (`CLIPVisionEncode`).
    ClipVisionOutput(Arc<ClipVisionOutput>),
    /// `STYLE_MODEL`: a style model (`StyleModelLoader`).
    StyleModel(Arc<StyleModel>),
    /// `UPSCALE_MODEL`: an image upscale model (`UpscaleModelLoader`).
    UpscaleModel(Arc<UpscaleModel>),
    /// `AUDIO_ENCODER`: an audio encoder (`AudioEncoderLoader`: Whisper large-v3 or wav2vec2).
    AudioEncoder(Arc<AudioEncoder>),
    /// `AUDIO_ENCODER_OUTPUT`: a clip through an audio encoder (`AudioEncoderEncode`).
    AudioEncoderOutput(Arc<AudioEncoderOutput>),
    /// `AUDIO_ENCODER_OUTPUT` of `WanDancerEncodeAudio`: a song's music features, which only `WanDancerVideo`
    /// reads.
    DancerMusic(Arc<DancerMusic>),
    /// `SAMPLER`: a sampling method (`KSamplerSelect`).
    Sampler(SamplerChoice),
    /// `SIGMAS`: the noise levels a sampler steps through, descending.
    Sigmas(Arc<[f32]>),
    /// `NOISE`: where the starting noise comes from.
    Noise(Noise),
    /// `GUIDER`: the model, conditioning and CFG a sampler denoises with.
    Guider(Arc<Guider>),
    /// `VIDEO`: frames with audio and a frame rate, or a video file (`CreateVideo`, `LoadVideo`).
    Video(Arc<Video>),
    /// `AUDIO`: a waveform batch and its sample rate.
    Audio(Arc<Audio>),
    /// `WAN_CAMERA_EMBEDDING`: a Wan Fun Camera model's camera trajectory as Plücker rays
    /// (`WanCameraEmbedding`), `[1, 24, latent frames, height, width]`.
    WanCameraEmbedding(Tensor),
    /// `TRACKS`: point tracks over a clip's frames (`GenerateTracks`, for Wan Move).
    Tracks(Arc<Tracks>),
    /// `LATENT_OPERATION`: a function of a latent (`LatentOperationTonemapReinhard`, `LatentOperationSharpen`).
    LatentOperation(LatentOperation),
}

/// `TRACKS`: where each of `count` points is on each of `frames` frames, in pixels, and whether it is
/// visible there (ComfyUI's `{"track_path": [T, N, 2], "track_visibility": [T, N]}`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tracks {
    /// Frames.
    pub frames: usize,
    /// Points (tracks).
    pub count: usize,
    /// `(x, y)` of point n on frame t at `t · count + n`.
    pub path: Vec<[f32; 2]>,
    /// Whether point n is visible on frame t, at `t · count + n`.
    pub visible: Vec<bool>,
}

impl Value {
    /// The type name as object_info spells it (`INT`, `IMAGE`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Int(_) => "INT",
            Value::Float(_) => "FLOAT",
            Value::String(_) => "STRING",
            Value::Bool(_) => "BOOLEAN",
            Value::Image(_) => "IMAGE",
            Value::Mask(_) => "MASK",
            Value::Latent(_) => "LATENT",
            Value::Json(_) => "*",
            Value::Model(_) => "MODEL",
            Value::Clip(_) => "CLIP",
            Value::Vae(_) => "VAE",
            Value::ControlNet(_) => "CONTROL_NET",
            Value::ModelPatch(_) => "MODEL_PATCH",
            Value::Conditioning(_) => "CONDITIONING",
            Value::ClipVision(_) => "CLIP_VISION",
            Value::ClipVisionOutput(_) => "CLIP_VISION_OUTPUT",
            Value::StyleModel(_) => "STYLE_MODEL",
            Value::UpscaleModel(_) => "UPSCALE_MODEL",
            Value::AudioEncoder(_) => "AUDIO_ENCODER",
            Value::AudioEncoderOutput(_) | Value::DancerMusic(_) => "AUDIO_ENCODER_OUTPUT",
            Value::Sampler(_) => "SAMPLER",
            Value::Sigmas(_) => "SIGMAS",
            Value::Noise(_) => "NOISE",
            Value::Guider(_) => "GUIDER",
            Value::Video(_) => "VIDEO",
            Value::Audio(_) => "AUDIO",
            Value::WanCameraEmbedding(_) => "WAN_CAMERA_EMBEDDING",
            Value::Tracks(_) => "TRACKS",
            Value::LatentOperation(_) => "LATENT_OPERATION",
        }
    }

    /// Python's `None` as a node gives it (a silent video's audio, a missing clip passed on).
    pub fn none() -> Value {
        Value::Json(Arc::new(serde_json::Value::Null))
    }

    /// Bytes held by tensors (what RAM-pressure eviction counts).
    pub fn byte_size(&self) -> usize {
        match self {
            Value::Image(t) | Value::Mask(t) | Value::WanCameraEmbedding(t) => t.byte_size(),
            Value::Latent(l) => {
                l.samples.byte_size() + l.noise_mask.as_ref().map_or(0, Tensor::byte_size)
            }
            Value::Int(_)
            | Value::Float(_)
            | Value::Bool(_)
            | Value::String(_)
            | Value::Json(_)
            | Value::Sampler(_)
            | Value::Noise(_)
            | Value::LatentOperation(_) => 0,
            Value::Sigmas(s) => std::mem::size_of_val(&**s),
            // The guider's conditioning is held by the node that made it, whose output the cache counts.
            Value::Guider(_) => 0,
            // Weights live in the memory manager, which accounts for them; a cached model costs the cache
            // nothing of its own.
            Value::Model(_)
            | Value::Clip(_)
            | Value::Vae(_)
            | Value::ControlNet(_)
            | Value::ModelPatch(_)
            | Value::ClipVision(_)
            | Value::StyleModel(_)
            | Value::UpscaleModel(_)
            | Value::AudioEncoder(_) => 0,
            Value::AudioEncoderOutput(o) => o.byte_size(),
            Value::DancerMusic(m) => m.features.byte_size(),
            Value::Conditioning(c) => c.byte_size(),
            Value::ClipVisionOutput(o) => o.byte_size(),
            Value::Video(v) => v.byte_size(),
            Value::Audio(a) => a.waveform().byte_size(),
            Value::Tracks(t) => t.path.len() * 8 + t.visible.len(),
        }
    }

    /// A short representation for error reports (`current_inputs` of `execution_error`).
    pub fn repr(&self) -> String {
        match self {
            Value::Int(v) => v.to_string(),
            Value::Float(v) => python_float(*v),
            Value::String(v) => v.clone(),
            Value::Bool(v) => if *v { "True" } else { "False" }.to_owned(),
            Value::Image(t) | Value::Mask(t) | Value::WanCameraEmbedding(t) => {
                format!("tensor{:?}", t.shape())
            }
            Value::Latent(l) => format!("tensor{:?}", l.samples.shape()),
            Value::Json(v) => v.to_string(),
            Value::Sigmas(s) => format!("tensor{s:?}"),
            Value::Model(_)
            | Value::Clip(_)
            | Value::Vae(_)
            | Value::ControlNet(_)
            | Value::ModelPatch(_)
            | Value::Conditioning(_)
            | Value::ClipVision(_)
            | Value::ClipVisionOutput(_)
            | Value::StyleModel(_)
            | Value::UpscaleModel(_)
            | Value::AudioEncoder(_)
            | Value::AudioEncoderOutput(_)
            | Value::DancerMusic(_)
            | Value::Sampler(_)
            | Value::Noise(_)
            | Value::Guider(_)
            | Value::Video(_)
            | Value::Audio(_)
            | Value::Tracks(_)
            | Value::LatentOperation(_) => format!("<{}>", self.type_name()),
        }
    }

    /// The value as JSON, for values that have a JSON form (used by `PreviewAny` and cache keys).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(v) => (*v).into(),
            Value::Float(v) => {
                serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into)
            }
            Value::String(v) => v.clone().into(),
            Value::Bool(v) => (*v).into(),
            Value::Image(t) | Value::Mask(t) | Value::WanCameraEmbedding(t) => {
                serde_json::json!({"tensor": t.shape()})
            }
            Value::Latent(l) => serde_json::json!({"tensor": l.samples.shape()}),
            Value::Json(v) => (**v).clone(),
            Value::Sigmas(s) => {
                serde_json::json!(s.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())
            }
            Value::Model(_)
            | Value::Clip(_)
            | Value::Vae(_)
            | Value::ControlNet(_)
            | Value::ModelPatch(_)
            | Value::Conditioning(_)
            | Value::ClipVision(_)
            | Value::ClipVisionOutput(_)
            | Value::StyleModel(_)
            | Value::UpscaleModel(_)
            | Value::AudioEncoder(_)
            | Value::AudioEncoderOutput(_)
            | Value::DancerMusic(_)
            | Value::Sampler(_)
            | Value::Noise(_)
            | Value::Guider(_)
            | Value::Video(_)
            | Value::Audio(_)
            | Value::Tracks(_)
            | Value::LatentOperation(_) => {
                serde_json::Value::String(format!("<{}>", self.type_name()))
            }
        }
    }
}

/// A float as Python's `str` writes it: the shortest round-trip digits, `.0` on integral values, exponent
/// notation (`1e+16`, `1e-05`) outside 1e-4 ≤ |v| < 1e16, `inf` and `nan`.
pub fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // `{:e}` gives the shortest round-trip digits as `d.ddde±x`.
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let fixed = format!("{v}");
        if fixed.contains('.') { fixed } else { format!("{fixed}.0") }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::python_float;

    #[test]
    fn floats_print_as_python_prints_them() {
        let cases = [
            (250.0, "250.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (f64::INFINITY, "inf"),
        ];
        for (v, want) in cases {
            assert_eq!(python_float(v), want, "{v}");
        }
    }
}
