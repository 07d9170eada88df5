//! WanDancer's nodes (`comfy_extras.nodes_wandancer`): music to dance.
//!
//! - `WanDancerEncodeAudio`: a song's music features (onset strength, 20 MFCCs, 12 chroma, onset peaks and
//!   beats, 30 frames a second: [`kiln_models::music_features`]) and the frame rate the song plays a clip of
//!   `video_frames` at, 30 / round(feature frames / video frames), which its `fps_string` writes in the prompt's
//!   words.
//! - `WanDancerVideo`: an empty Wan 2.1 latent; the start images (resized bilinearly with a centre crop) in front
//!   of black frames, encoded, as the image latent, with a mask of the latent frames they cover, or the `mask`
//!   input's (pixel frames, 1 where a frame is kept); both CLIP vision states; the music.
//! - `WanDancerPadKeyframes` / `WanDancerPadKeyframesList`: the keyframe images spread over a segment of a song
//!   played at 30 frames a second (the images evenly over all the song's segments), with the mask of where they
//!   went and the segment's audio; the list form emits the first `num_segments` segments.

use std::sync::Arc;

use kiln_models::music_features::{FEATURES, music_features};

use super::audio::audio;
use super::mask::{mask, tensor};
use super::vae::encode_video;
use super::wan::{WAN21_CHANNELS, fit_frames, latent_frames, penultimate, size};
use crate::compute::Compute;
use crate::media::Audio;
use crate::models::{CondExtras, DancerMusic};
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, Output, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// The largest size ComfyUI's inputs take (`nodes.MAX_RESOLUTION`).
const MAX_RESOLUTION: i64 = 16384;
/// The frame rate of the music features and of a segment's keyframes.
const FPS: f64 = 30.0;
/// The song's seconds a last segment needs before it counts (`buffer`).
const SEGMENT_BUFFER_S: f64 = 0.2;
/// Frames per latent frame along time.
const TEMPORAL: usize = super::wan::TEMPORAL;

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// `WanDancerEncodeAudio`.
pub(super) struct WanDancerEncodeAudio {
    spec: Arc<NodeSpec>,
}

impl WanDancerEncodeAudio {
    pub(super) fn new() -> WanDancerEncodeAudio {
        let spec = NodeSpec::new("WanDancerEncodeAudio", "", "model/conditioning/wan/dancer")
            .python_module("comfy_extras.nodes_wandancer")
            .v3()
            .input(InputDef::typed("audio", "AUDIO"))
            .input(InputDef::int("video_frames", 149, 1, MAX_RESOLUTION).option("step", 4))
            .input(
                InputDef::bare("audio_inject_scale", "FLOAT")
                    .tooltip("The scale for the audio features when injected into the video model.")
                    .option("default", 1.0)
                    .option("min", 0.0)
                    .option("max", 10.0)
                    .option("step", 0.01),
            )
            .output(OutputDef::new("AUDIO_ENCODER_OUTPUT").named("audio_encoder_output"))
            .output(OutputDef::new("STRING").named("fps_string").tooltip(
                "The calculated fps based on the audio length and the number of video frames. Used in the prompt.",
            ));
        WanDancerEncodeAudio { spec: Arc::new(spec) }
    }
}

impl Node for WanDancerEncodeAudio {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = audio(inputs, "audio", "WanDancerEncodeAudio")?;
        let video_frames = size(inputs, "video_frames")?.max(1);
        let scale = inputs.float("audio_inject_scale")?;
        let features = music_features(&first_clip_mono(&clip), clip.sample_rate())
            .map_err(|e| invalid(format!("WanDancerEncodeAudio: {e}")))?;
        let (fps, fps_string) = clip_rate(features.frames, video_frames)?;
        let features = tensor(vec![1, features.frames, FEATURES], features.values)?;
        let music = DancerMusic { features, fps, scale };
        Ok(NodeResult::values([Value::DancerMusic(Arc::new(music)), Value::String(fps_string)]))
    }
}

/// The frame rate a song of `feature_frames` (30 a second) plays a clip of `video_frames` at, 30 / ComfyUI's
/// `int(feature_frames / video_frames + 0.5)`, and the words the node writes it in for the prompt.
fn clip_rate(feature_frames: usize, video_frames: usize) -> Result<(f64, String), NodeError> {
    let per_frame = (feature_frames as f64 / video_frames as f64 + 0.5).trunc();
    if per_frame < 1.0 {
        return Err(invalid(format!(
            "WanDancerEncodeAudio: the song's {feature_frames} feature frames ({:.2} s at 30 a second) are fewer \
             than half of the {video_frames} video frames: use a longer song or fewer frames",
            feature_frames as f64 / FPS
        )));
    }
    let fps = FPS / per_frame;
    let words = if (fps + 0.5).trunc() != FPS {
        format!(" 帧率是{fps:.4}")
    } else {
        ", 帧率是30fps。".to_owned()
    };
    Ok((fps, words))
}

/// The first clip of `audio` as one channel: its channels' mean (ComfyUI's `waveform[0].mean(dim=0)`).
fn first_clip_mono(audio: &Audio) -> Vec<f32> {
    let channels = audio.channels();
    if channels == 1 {
        return audio.channel(0, 0).to_vec();
    }
    let mut sum = vec![0.0f32; audio.samples()];
    for c in 0..channels {
        for (s, &v) in sum.iter_mut().zip(audio.channel(0, c)) {
            *s += v;
        }
    }
    sum.iter().map(|s| s / channels as f32).collect()
}

/// `WanDancerVideo`.
pub(super) struct WanDancerVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanDancerVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanDancerVideo {
        let side = |name: &str, default: i64| {
            InputDef::int(name, default, 16, MAX_RESOLUTION).option("step", 16)
        };
        let spec = NodeSpec::new("WanDancerVideo", "", "model/conditioning/wan/dancer")
            .python_module("comfy_extras.nodes_wandancer")
            .v3()
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"))
            .input(side("width", 480))
            .input(side("height", 832))
            .input(
                InputDef::bare("length", "INT")
                    .tooltip("The number of frames in the generated video. Should stay 149 for WanDancer.")
                    .option("default", 149)
                    .option("min", 1)
                    .option("max", MAX_RESOLUTION)
                    .option("step", 4),
            )
            .optional(
                InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT")
                    .tooltip("The CLIP vision embeds for the first frame."),
            )
            .optional(
                InputDef::typed("clip_vision_output_ref", "CLIP_VISION_OUTPUT")
                    .tooltip("The CLIP vision embeds for the reference image."),
            )
            .optional(
                InputDef::typed("start_image", "IMAGE")
                    .tooltip("The initial image(s) to be encoded, can be any number of frames."),
            )
            .optional(InputDef::typed("mask", "MASK").tooltip(
                "Image conditioning mask for the start image(s). White is kept, black is generated. Used for the \
                 local generations.",
            ))
            .optional(InputDef::typed("audio_encoder_output", "AUDIO_ENCODER_OUTPUT"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent").tooltip("Empty latent."));
        WanDancerVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanDancerVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let vae = inputs.vae("vae")?;
        let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
        let length = size(inputs, "length")?;
        let frames = latent_frames(length);
        let latent = Tensor::full(vec![1, WAN21_CHANNELS, frames, height / 8, width / 8], 0.0);
        let concat = match inputs.get("start_image") {
            Some(_) => {
                let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
                let video =
                    super::wan::filled_video(0.0, length, height, width, Some(&start), None)?;
                let encoded = encode_video(&self.compute, vae, &video, ctx)?;
                let concat_mask = match inputs.get("mask") {
                    None => {
                        // ComfyUI's ((n − 1) // 4) + 1: none for an empty batch of start images.
                        let given = start.shape()[0].checked_sub(1).map_or(0, |n| n / TEMPORAL + 1);
                        super::wan::frame_mask(&encoded, frames, |f| f < given)?
                    }
                    Some(_) => {
                        let spatial = super::wan::spatial(&encoded)?;
                        keyframe_mask(&mask(inputs, "mask")?.0, length, spatial)?
                    }
                };
                Some((encoded, concat_mask))
            }
            None => None,
        };
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        // ComfyUI sets the reference's states only beside the first frame's.
        let clip_reference = match clip_vision {
            Some(_) => penultimate(inputs, "clip_vision_output_ref")?,
            None => None,
        };
        let music = match inputs.get("audio_encoder_output") {
            Some(_) => Some(inputs.dancer_music("audio_encoder_output")?.as_ref().clone()),
            None => None,
        };
        let set = |extras: &mut CondExtras| {
            super::wan::set_image(extras, concat.as_ref(), clip_vision.as_ref());
            if clip_vision.is_some() {
                extras.clip_vision_reference = clip_reference.clone();
            }
            if let Some(music) = &music {
                extras.dancer_music = Some(music.clone());
            }
        };
        Ok(NodeResult::values(super::wan::conditioned(inputs, set, latent)?))
    }
}

/// `WanDancerVideo`'s `concat_mask` `[1, 4, latent frames, h, w]` from the `mask` input `[n, H, W]` (1 where a
/// frame is kept), as ComfyUI builds it: 1 − the first `length` frames, resized nearest-exact to `w` rows of `h`
/// columns (ComfyUI passes the latent's height as the width) and read back as `h` × `w`, the first frame
/// repeated to 4, then every 4 pixel frames one latent frame's 4 channels.
fn keyframe_mask(
    mask: &Tensor,
    length: usize,
    (h, w): (usize, usize),
) -> Result<Tensor, NodeError> {
    let &[n, mh, mw] = mask.shape() else {
        return Err(invalid(format!(
            "WanDancerVideo: a MASK is [B, H, W], got {:?}",
            mask.shape()
        )));
    };
    if mh == 0 || mw == 0 || h == 0 || w == 0 {
        return Err(invalid(format!(
            "WanDancerVideo: a mask of {mh} × {mw} pixels cannot be resized to the latent's {h} × {w}"
        )));
    }
    let frames = n.min(length);
    if frames == 0 || !(frames + TEMPORAL - 1).is_multiple_of(TEMPORAL) {
        return Err(invalid(format!(
            "WanDancerVideo: the mask's {frames} frames must be 4k + 1 (the start image's frames and 4 per latent \
             frame after it)"
        )));
    }
    let (rows, cols) = (w, h);
    let nearest = |out: usize, input: usize| -> Vec<usize> {
        let scale = input as f32 / out as f32;
        (0..out).map(|o| (((o as f32 + 0.5) * scale).floor() as usize).min(input - 1)).collect()
    };
    let (ys, xs) = (nearest(rows, mh), nearest(cols, mw));
    let plane = rows * cols;
    let mut kept: Vec<f32> = Vec::with_capacity((frames + TEMPORAL - 1) * plane);
    for f in 0..frames {
        let frame = &mask.data()[f * mh * mw..][..mh * mw];
        let values = ys.iter().flat_map(|&y| xs.iter().map(move |&x| 1.0 - frame[y * mw + x]));
        let values: Vec<f32> = values.collect();
        let copies = if f == 0 { TEMPORAL } else { 1 };
        for _ in 0..copies {
            kept.extend_from_slice(&values);
        }
    }
    // [1, frames', rows·cols] viewed as [1, frames' / 4, 4, h, w], then channels before time.
    let latent = kept.len() / plane / TEMPORAL;
    let mut out = Vec::with_capacity(kept.len());
    for k in 0..TEMPORAL {
        for t in 0..latent {
            out.extend_from_slice(&kept[(t * TEMPORAL + k) * plane..][..plane]);
        }
    }
    tensor(vec![1, TEMPORAL, latent, h, w], out)
}

/// `WanDancerPadKeyframes`'s result for segment `index`: the keyframes `[length, H, W, C]`, their mask
/// `[length, H, W]` and the segment's audio.
fn pad_keyframes(
    images: &Tensor,
    length: usize,
    index: usize,
    song: &Audio,
) -> Result<(Tensor, Tensor, Audio), NodeError> {
    let &[b, h, w, c] = images.shape() else {
        return Err(invalid(format!("an IMAGE is [B, H, W, C], got {:?}", images.shape())));
    };
    let duration = song.samples() as f64 / f64::from(song.sample_rate());
    let segment_duration = length as f64 / FPS;
    let segments = if duration > SEGMENT_BUFFER_S {
        ((duration - SEGMENT_BUFFER_S) / segment_duration).trunc() as usize + 1
    } else {
        0
    };
    let total = segments * length;
    let (mut keyframes, mut mask) =
        (vec![0.0f32; length * h * w * c], vec![0.0f32; length * h * w]);
    if total > 0 && b > 0 {
        let interval = total as f64 / b as f64;
        let last_segment = total.div_ceil(length) - 1;
        // The keyframes a segment places before its last: while cnt·interval < end − interval.
        let count = |end: f64| {
            let mut n = 0usize;
            while (n as f64) * interval < end - interval {
                n += 1;
            }
            n
        };
        let end_of = |segment: usize| -> f64 {
            if segment == last_segment {
                total as f64 - (length * segment) as f64 - 1.0
            } else {
                length as f64 - 1.0
            }
        };
        let before: usize = (0..index).map(|s| count(end_of(s))).sum();
        let end = end_of(index);
        let placed = count(end);
        let mut positions: Vec<(f64, usize)> =
            (0..placed).map(|n| ((interval * n as f64).ceil(), before + n)).collect();
        positions.push((end, before + placed));
        for (position, image) in positions {
            if image >= b || position < 0.0 || position >= length as f64 {
                continue;
            }
            let p = position as usize;
            mask[p * h * w..][..h * w].fill(1.0);
            keyframes[p * h * w * c..][..h * w * c]
                .copy_from_slice(&images.data()[image * h * w * c..][..h * w * c]);
        }
    }
    let rate = f64::from(song.sample_rate());
    let start = index as f64 * segment_duration;
    let end = (start + segment_duration).min(duration);
    let clip = song
        .slice((start * rate).trunc() as usize, (end * rate).trunc().max(0.0) as usize)
        .map_err(|e| NodeError::new(e.to_string()))?;
    Ok((tensor(vec![length, h, w, c], keyframes)?, tensor(vec![length, h, w], mask)?, clip))
}

/// The inputs and outputs both keyframe nodes declare, with the third input `count` (`segment_index` or
/// `num_segments`).
fn keyframe_spec(name: &str, list: bool) -> NodeSpec {
    // ComfyUI's v3 inputs put the tooltip before the range.
    let int = |name: &str, tip: &str, (default, min, max): (i64, i64, i64)| {
        InputDef::bare(name, "INT")
            .tooltip(tip)
            .option("default", default)
            .option("min", min)
            .option("max", max)
    };
    let (count, length_tip, audio_tip) = if list {
        (
            int("num_segments", "How many padded segments to emit as lists.", (1, 1, 100)),
            "Length of each segment (usually 149 frames)",
            "Audio to slice for each emitted segment.",
        )
    } else {
        (
            int(
                "segment_index",
                "Which segment this is (0 for first, 1 for second, etc.)",
                (0, 0, 100),
            ),
            "Length of this segment (usually 149 frames)",
            "Audio to calculate total output frames from and extract segment audio.",
        )
    };
    let out = |ty: &str, name: &str, tip: &str| {
        let o = OutputDef::new(ty).named(name).tooltip(tip);
        if list { o.list() } else { o }
    };
    let (images, masks, audio) = if list {
        (
            "Padded keyframe sequences",
            "Masks indicating valid frames",
            "Audio segment for each video segment",
        )
    } else {
        (
            "Padded keyframe sequence",
            "Mask indicating valid frames",
            "Audio segment for this video segment",
        )
    };
    NodeSpec::new(name, "", "image/video")
        .python_module("comfy_extras.nodes_wandancer")
        .v3()
        .input(InputDef::typed("images", "IMAGE"))
        .input(int("segment_length", length_tip, (149, 1, 10000)))
        .input(count)
        .input(InputDef::typed("audio", "AUDIO").tooltip(audio_tip))
        .output(out("IMAGE", "keyframes_sequence", images))
        .output(out("MASK", "keyframes_mask", masks))
        .output(out("AUDIO", "audio_segment", audio))
}

/// `WanDancerPadKeyframes` (one segment) or `WanDancerPadKeyframesList` (the first `num_segments`, as lists).
pub(super) struct WanDancerPadKeyframes {
    spec: Arc<NodeSpec>,
    list: bool,
}

impl WanDancerPadKeyframes {
    pub(super) fn single() -> WanDancerPadKeyframes {
        WanDancerPadKeyframes {
            spec: Arc::new(keyframe_spec("WanDancerPadKeyframes", false)),
            list: false,
        }
    }

    pub(super) fn list() -> WanDancerPadKeyframes {
        WanDancerPadKeyframes {
            spec: Arc::new(keyframe_spec("WanDancerPadKeyframesList", true)),
            list: true,
        }
    }
}

impl Node for WanDancerPadKeyframes {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let images = inputs.image("images")?;
        let length = size(inputs, "segment_length")?;
        let song = audio(inputs, "audio", self.spec.name.as_str())?;
        let segment = |index: usize| -> Result<[Value; 3], NodeError> {
            let (keyframes, mask, clip) = pad_keyframes(images, length, index, &song)?;
            Ok([Value::Image(keyframes), Value::Mask(mask), Value::Audio(Arc::new(clip))])
        };
        if !self.list {
            return Ok(NodeResult::values(segment(size(inputs, "segment_index")?)?));
        }
        let mut lists: [Vec<Value>; 3] = Default::default();
        for index in 0..size(inputs, "num_segments")? {
            for (list, value) in lists.iter_mut().zip(segment(index)?) {
                list.push(value);
            }
        }
        Ok(NodeResult { outputs: lists.into_iter().map(Output::List).collect(), ui: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wan_dancer.py`'s tiny WanDancer (the tiny Wan's i2v variant with the music parts its fixture holds in the
    /// released form), f32, written under `dir`.
    fn write_dancer_model(dir: &std::path::Path) -> std::path::PathBuf {
        let mut t: std::collections::BTreeMap<_, _> =
            crate::fixtures::model_tensors("wan/weights.safetensors")
                .into_iter()
                .filter(|(name, _)| name != "img_emb.emb_pos")
                .collect();
        for (name, value) in crate::fixtures::model_tensors("wan/dancer.safetensors") {
            if let Some(part) = name.strip_prefix("w.") {
                t.insert(part.to_owned(), value);
            }
        }
        let path = dir.join("dancer.safetensors");
        crate::fixtures::write_f32(&path, &t);
        path
    }

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny WanDancer with WanDancerVideo's conditioning
    /// (image latent and mask, both CLIP states, 40 frames of music at fps 15, scale 0.7), plain and in context
    /// windows of 3 latent frames: every window gets the whole song, which the model stretches over its frames,
    /// as ComfyUI does (`scripts/reference/wan_windows.py`).
    #[test]
    fn the_whole_song_goes_to_every_context_window_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/dancer.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-dancer-windows-{}", std::process::id()));
        let path = write_dancer_model(&dir);
        let music = DancerMusic { features: io["music"].clone(), fps: 15.0, scale: 0.7 };
        let extras = CondExtras {
            concat_latent_image: Some(io["concat_latent_image"].clone()),
            concat_mask: Some(io["concat_mask"].clone()),
            clip_vision: Some(io["clip"].clone()),
            clip_vision_reference: Some(io["clip_ref"].clone()),
            dancer_music: Some(music),
            ..CondExtras::default()
        };
        super::super::windowed::check_wan_windows(&path, &io, &extras);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn song(seconds: f64) -> Audio {
        let rate = 100;
        let samples = (seconds * rate as f64) as usize;
        Audio::new(Tensor::full(vec![1, 1, samples], 0.1), rate).unwrap()
    }

    #[test]
    fn keyframes_spread_over_the_songs_segments_as_comfyui_places_them() {
        // 8 s at 30 fps in segments of 149 frames: (8 − 0.2) / (149 / 30) → 2 segments, 298 frames, 4 images
        // one every 74.5 frames. Each segment places one image while n · 74.5 < 148 − 74.5, then the next at its
        // last frame 148; segment 1 counts on from segment 0's one image before its end.
        let images = Tensor::new(vec![4, 1, 1, 1], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let (keys, mask, clip) = pad_keyframes(&images, 149, 0, &song(8.0)).unwrap();
        let placed: Vec<(usize, f32)> =
            (0..149).filter(|&f| mask.data()[f] == 1.0).map(|f| (f, keys.data()[f])).collect();
        assert_eq!(placed, [(0, 1.0), (148, 2.0)]);
        assert_eq!(clip.samples(), 496);
        let (keys, mask, clip) = pad_keyframes(&images, 149, 1, &song(8.0)).unwrap();
        let placed: Vec<(usize, f32)> =
            (0..149).filter(|&f| mask.data()[f] == 1.0).map(|f| (f, keys.data()[f])).collect();
        assert_eq!(placed, [(0, 2.0), (148, 3.0)]);
        assert_eq!(clip.samples(), 800 - 496);
    }

    #[test]
    fn the_clip_rate_is_30_over_the_songs_frames_per_video_frame() {
        assert_eq!(clip_rate(149, 149).unwrap(), (30.0, ", 帧率是30fps。".to_owned()));
        // 2.13 feature frames a video frame round to 2: the song plays the clip at 15 frames a second.
        assert_eq!(clip_rate(320, 150).unwrap(), (15.0, " 帧率是15.0000".to_owned()));
        assert_eq!(clip_rate(700, 100).unwrap(), (30.0 / 7.0, " 帧率是4.2857".to_owned()));
        let err = clip_rate(70, 149).unwrap_err().message;
        assert!(err.contains("fewer than half of the 149 video frames"), "{err}");
    }

    #[test]
    fn a_mask_becomes_four_channels_per_latent_frame() {
        // 5 frames of 2 × 2: frame f kept (1) only at its pixel f mod 4.
        let values: Vec<f32> =
            (0..5).flat_map(|f| (0..4).map(move |p| if p == f % 4 { 1.0 } else { 0.0 })).collect();
        let mask = Tensor::new(vec![5, 2, 2], values).unwrap();
        let out = keyframe_mask(&mask, 5, (2, 2)).unwrap();
        assert_eq!(out.shape(), &[1, 4, 2, 2, 2]);
        // Latent frame 0 is pixel frame 0 four times; latent frame 1's channel k is pixel frame k + 1.
        for k in 0..4 {
            assert_eq!(&out.data()[(k * 2) * 4..][..4], &[0.0, 1.0, 1.0, 1.0], "channel {k}");
            let mut want = [1.0; 4];
            want[(k + 1) % 4] = 0.0;
            assert_eq!(&out.data()[(k * 2 + 1) * 4..][..4], &want, "channel {k}");
        }
    }
}
