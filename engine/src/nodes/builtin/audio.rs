//! The audio nodes of `comfy_extras.nodes_audio` that load, save, trim and join clips: `LoadAudio`,
//! `RecordAudio`, `SaveAudio` (FLAC), `SaveAudioMP3`, `SaveAudioOpus`, `SaveAudioAdvanced` (FLAC, MP3 or Opus),
//! `PreviewAudio`, `TrimAudioDuration` and `AudioConcat` (the nodes that mix and filter are in `audio_mix`).
//!
//! Invariant: saved audio is one file per clip of the batch, named `<prefix>_<counter:05>.<format>` (no
//! trailing underscore, `%batch_num%` replaced), and listed under `audio` in the UI.

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use super::audio_mix::{Pair, clip, match_rates};
use super::files::{input_files, save_target};
use super::video::{MediaNode, VIDEO_EXTENSIONS, audio_input, input_path, media_error, tags};
use crate::media::{self, Audio};
use crate::nodes::{
    Context, DynamicOption, ErrorKind, FileKind, FileRef, Fingerprint, Hidden, InputDef, Inputs,
    Node, NodeError, NodeResult, NodeSpec, Output, OutputDef, UiOutput,
};
use crate::roots;
use crate::value::Value;

/// Extensions whose MIME type is `audio/*` (with the video ones, what `LoadAudio` lists).
const AUDIO_EXTENSIONS: [&str; 16] = [
    "wav", "flac", "mp3", "ogg", "oga", "opus", "m4a", "aac", "aif", "aiff", "aifc", "au", "snd",
    "mp2", "wma", "3gp",
];

/// An `AUDIO` input that must be there (ComfyUI raises on `None`, e.g. a video without sound).
pub(super) fn audio(inputs: &Inputs, name: &str, node: &str) -> Result<Arc<Audio>, NodeError> {
    audio_input(inputs, name)?.cloned().ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("{node}: input audio is None (source video may have no audio track)."),
        )
    })
}

/// `LoadAudio`: an audio (or video) file of the input folder, decoded.
pub(super) struct LoadAudio {
    input_dir: PathBuf,
}

impl LoadAudio {
    pub(super) fn new(input_dir: PathBuf) -> LoadAudio {
        LoadAudio { input_dir }
    }
}

impl Node for LoadAudio {
    fn spec(&self) -> Arc<NodeSpec> {
        let extensions: Vec<&str> =
            AUDIO_EXTENSIONS.iter().chain(&VIDEO_EXTENSIONS).copied().collect();
        let file = InputDef::bare("audio", "COMBO")
            .option("multiselect", false)
            .option("options", input_files(&self.input_dir, &extensions))
            .option("audio_upload", true);
        Arc::new(
            NodeSpec::new("LoadAudio", "Load Audio", "audio")
                .python_module("comfy_extras.nodes_audio")
                .v3()
                .input(file)
                .output(OutputDef::new("AUDIO"))
                .validates(&["audio"])
                .aliases(&["import audio", "open audio", "audio file"])
                .essentials("Audio"),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        let name = inputs.string("audio").map_err(|e| e.message)?;
        input_path(&self.input_dir, name)
            .map(|_| ())
            .ok_or_else(|| format!("Invalid audio file: {name}"))
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        let Some(bytes) = inputs
            .string("audio")
            .ok()
            .and_then(|n| input_path(&self.input_dir, n))
            .and_then(|p| fs::read(p).ok())
        else {
            return Fingerprint::Always;
        };
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        Fingerprint::Value(format!("{:016x}{}", hasher.finish(), bytes.len()))
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let name = inputs.string("audio")?;
        let path = input_path(&self.input_dir, name).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::FileNotFound, format!("Invalid audio file: {name}"))
        })?;
        let audio = media::load_audio(&path).map_err(media_error)?;
        Ok(NodeResult::values([Value::Audio(Arc::new(audio))]))
    }
}

/// `RecordAudio`: the clip the frontend's recorder uploaded (a WAV in the temp folder, named
/// `audio/recording-<ms>.wav [temp]`; any annotated name of the input, output or temp folder), decoded.
pub(super) fn record_audio() -> MediaNode {
    let spec = NodeSpec::new("RecordAudio", "Record Audio", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .input(InputDef::typed("audio", "AUDIO_RECORD").with_options())
        .output(OutputDef::new("AUDIO"))
        .aliases(&["microphone input", "audio capture", "voice input"]);
    MediaNode::new(spec, |inputs, ctx| {
        let name = inputs.widget_text("audio");
        let (output, temp) = (Some(ctx.output_dir.as_path()), Some(ctx.temp_dir.as_path()));
        let path = roots::annotated(name, &ctx.input_dir, output, temp).ok_or_else(|| {
            NodeError::of_kind(
                ErrorKind::FileNotFound,
                format!("RecordAudio: no recording `{name}` (record a clip first)"),
            )
        })?;
        let audio = media::load_audio(&path).map_err(media_error)?;
        Ok(NodeResult::values([Value::Audio(Arc::new(audio))]))
    })
}

/// A format audio is saved in, with its quality.
#[derive(Debug, Clone, Copy)]
enum AudioFormat {
    Flac,
    Mp3(media::Mp3Quality),
    /// Opus at this many bits a second.
    Opus(u32),
}

impl AudioFormat {
    /// The format of a `format` (and, for MP3 and Opus, `quality`) choice, as ComfyUI's `save_audio` takes them.
    fn of(format: &str, quality: Option<&str>) -> Result<AudioFormat, NodeError> {
        let invalid = |message: String| NodeError::of_kind(ErrorKind::InvalidValue, message);
        let quality = || quality.ok_or_else(|| invalid(format!("{format} needs a quality")));
        match format {
            "flac" => Ok(AudioFormat::Flac),
            "mp3" => {
                let name = quality()?;
                media::Mp3Quality::from_name(name).map(AudioFormat::Mp3).ok_or_else(|| {
                    invalid(format!("unknown MP3 quality '{name}' (V0, 128k or 320k)"))
                })
            }
            "opus" => {
                let name = quality()?;
                match name {
                    "64k" | "96k" | "128k" | "192k" | "320k" => {
                        let kbps: u32 = name.trim_end_matches('k').parse().unwrap_or(128);
                        Ok(AudioFormat::Opus(kbps * 1000))
                    }
                    _ => Err(invalid(format!(
                        "unknown Opus quality '{name}' (64k, 96k, 128k, 192k or 320k)"
                    ))),
                }
            }
            other => Err(invalid(format!("Unsupported audio format: '{other}'"))),
        }
    }

    fn extension(self) -> &'static str {
        match self {
            AudioFormat::Flac => "flac",
            AudioFormat::Mp3(_) => "mp3",
            AudioFormat::Opus(_) => "opus",
        }
    }

    fn encode(
        self,
        audio: &Audio,
        item: usize,
        tags: &[(String, String)],
    ) -> Result<Vec<u8>, NodeError> {
        match self {
            AudioFormat::Flac => media::flac_file(audio, item, tags),
            AudioFormat::Mp3(quality) => media::mp3_file(audio, item, quality, tags),
            AudioFormat::Opus(bitrate) => media::opus_file(audio, item, bitrate, tags),
        }
        .map_err(media_error)
    }
}

/// Writes each clip as `<prefix>_<counter>.<format>` in the directory of `kind` and lists the files.
fn save_clips(
    audio: &Audio,
    prefix: &str,
    format: AudioFormat,
    kind: FileKind,
    ctx: &Context,
) -> Result<UiOutput, NodeError> {
    let target = save_target(prefix, ctx, kind, (0, 0))?;
    let tags = tags(ctx);
    let extension = format.extension();
    let mut files = Vec::new();
    let mut next = target.counter;
    for item in 0..audio.batch() {
        ctx.check_interrupt()?;
        let name = target.name.replace("%batch_num%", &item.to_string());
        let bytes = format.encode(audio, item, &tags)?;
        let claimed = target.claim(next, |counter| format!("{name}_{counter:05}.{extension}"))?;
        next = claimed.counter + 1;
        let filename = claimed.fill(|path, mut file| {
            file.write_all(&bytes).map_err(|e| {
                NodeError::of_kind(ErrorKind::Io, format!("cannot write {}: {e}", path.display()))
            })
        })?;
        files.push(FileRef { filename, subfolder: target.subfolder.clone(), kind });
    }
    Ok(UiOutput { named: vec![("audio".to_owned(), files)], ..UiOutput::default() })
}

fn prefix_input(tooltip: Option<&str>) -> InputDef {
    let input = InputDef::bare("filename_prefix", "STRING");
    let input = match tooltip {
        Some(text) => input.tooltip(text),
        None => input,
    };
    input.option("default", "audio/ComfyUI").option("multiline", false)
}

fn passes_through(audio: Arc<Audio>, ui: UiOutput) -> NodeResult {
    NodeResult { outputs: vec![Output::One(Value::Audio(audio))], ui: Some(ui) }
}

/// `SaveAudio` (deprecated): FLAC files in the output folder.
pub(super) fn save_audio() -> MediaNode {
    let spec = NodeSpec::new("SaveAudio", "Save Audio (FLAC) (DEPRECATED)", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .deprecated()
        .input(InputDef::typed("audio", "AUDIO").with_options())
        .input(prefix_input(None))
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("AUDIO").named("audio"))
        .output_node()
        .aliases(&["export flac"])
        .essentials("Audio");
    MediaNode::new(spec, |inputs, ctx| {
        let audio = audio(inputs, "audio", "SaveAudio")?;
        let prefix = inputs.string("filename_prefix")?;
        let ui = save_clips(&audio, prefix, AudioFormat::Flac, FileKind::Output, ctx)?;
        Ok(passes_through(audio, ui))
    })
}

/// The deprecated single-format savers with a quality: `SaveAudioMP3` and `SaveAudioOpus`.
fn save_audio_with_quality(
    name: &'static str,
    display: &str,
    format: &'static str,
    (choices, default): (&[&str], &str),
) -> NodeSpec {
    let spec = NodeSpec::new(name, display, "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .deprecated()
        .input(InputDef::typed("audio", "AUDIO").with_options())
        .input(prefix_input(None))
        .input(
            InputDef::bare("quality", "COMBO")
                .option("default", default)
                .option("multiselect", false)
                .option("options", choices.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>()),
        )
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("AUDIO").named("audio"))
        .output_node();
    match format {
        "mp3" => spec.aliases(&["export mp3"]).essentials("Audio"),
        _ => spec.aliases(&["export opus"]),
    }
}

/// `SaveAudioMP3` (deprecated): MP3 files in the output folder.
pub(super) fn save_audio_mp3() -> MediaNode {
    let qualities: (&[&str], &str) = (&["V0", "128k", "320k"], "V0");
    let spec =
        save_audio_with_quality("SaveAudioMP3", "Save Audio (MP3) (DEPRECATED)", "mp3", qualities);
    MediaNode::new(spec, |inputs, ctx| {
        let audio = audio(inputs, "audio", "SaveAudioMP3")?;
        let format = AudioFormat::of("mp3", Some(inputs.string("quality")?))?;
        let ui =
            save_clips(&audio, inputs.string("filename_prefix")?, format, FileKind::Output, ctx)?;
        Ok(passes_through(audio, ui))
    })
}

/// `SaveAudioOpus` (deprecated): Ogg Opus files in the output folder.
pub(super) fn save_audio_opus() -> MediaNode {
    let qualities: (&[&str], &str) = (&["64k", "96k", "128k", "192k", "320k"], "128k");
    let spec = save_audio_with_quality(
        "SaveAudioOpus",
        "Save Audio (Opus) (DEPRECATED)",
        "opus",
        qualities,
    );
    MediaNode::new(spec, |inputs, ctx| {
        let audio = audio(inputs, "audio", "SaveAudioOpus")?;
        let format = AudioFormat::of("opus", Some(inputs.string("quality")?))?;
        let ui =
            save_clips(&audio, inputs.string("filename_prefix")?, format, FileKind::Output, ctx)?;
        Ok(passes_through(audio, ui))
    })
}

/// `SaveAudioAdvanced`: FLAC, MP3 (V0, 128k, 320k) or Opus (64k to 320k).
pub(super) fn save_audio_advanced() -> MediaNode {
    let quality = |choices: &[&str], default: &str| {
        InputDef::bare("quality", "COMBO")
            .option("default", default)
            .option("multiselect", false)
            .option("options", choices.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
    };
    let option = |key, required| DynamicOption { key, required, optional: Vec::new() };
    let spec = NodeSpec::new("SaveAudioAdvanced", "Save Audio (Advanced)", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .description("Saves the input audio to your ComfyUI output directory.")
        .input(InputDef::typed("audio", "AUDIO").tooltip("The audio to save."))
        .input(prefix_input(Some(
            "The prefix for the file to save. May include formatting tokens such as %date:yyyy-MM-dd%.",
        )))
        .dynamic_combo_of(
            InputDef::bare("format", crate::nodes::DYNAMIC_COMBO)
                .tooltip("The file format in which to save the audio."),
            &[
                option("flac", Vec::new()),
                option("mp3", vec![quality(&["V0", "128k", "320k"], "V0")]),
                option("opus", vec![quality(&["64k", "96k", "128k", "192k", "320k"], "128k")]),
            ],
        )
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("AUDIO").named("audio"))
        .output_node()
        .aliases(&["save audio", "export audio", "output audio", "write audio", "flac", "mp3", "opus"]);
    MediaNode::new(spec, |inputs, ctx| {
        let audio = audio(inputs, "audio", "SaveAudioAdvanced")?;
        let format = inputs.string("format")?;
        let quality = match format {
            "mp3" | "opus" => Some(inputs.string("format.quality")?),
            _ => None,
        };
        let format = AudioFormat::of(format, quality)?;
        let ui =
            save_clips(&audio, inputs.string("filename_prefix")?, format, FileKind::Output, ctx)?;
        Ok(passes_through(audio, ui))
    })
}

/// `PreviewAudio`: a FLAC file in the temp folder for the UI's player.
pub(super) fn preview_audio() -> MediaNode {
    let spec = NodeSpec::new("PreviewAudio", "Preview Audio", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .description("Preview the audio without saving it to the ComfyUI output directory.")
        .input(InputDef::typed("audio", "AUDIO").with_options())
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("AUDIO").named("audio"))
        .output_node()
        .aliases(&["play audio"]);
    MediaNode::new(spec, |inputs, ctx| {
        let audio = audio(inputs, "audio", "PreviewAudio")?;
        let mut bits = RandomState::new().hash_one(&ctx.node);
        let suffix: String = (0..5)
            .map(|_| {
                let c = (b'a' + (bits % 26) as u8) as char;
                bits /= 26;
                c
            })
            .collect();
        let prefix = format!("ComfyUI_temp_{suffix}");
        let ui = save_clips(&audio, &prefix, AudioFormat::Flac, FileKind::Temp, ctx)?;
        Ok(passes_through(audio, ui))
    })
}

/// `TrimAudioDuration`: samples from `start_index` seconds (negative: from the end) for `duration` seconds.
pub(super) fn trim_audio_duration() -> MediaNode {
    let spec = NodeSpec::new("TrimAudioDuration", "Trim Audio Duration", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .description("Trim audio tensor into chosen time range.")
        .input(InputDef::typed("audio", "AUDIO").with_options())
        .input(
            InputDef::bare("start_index", "FLOAT")
                .tooltip("Start time in seconds, can be negative to count from the end (supports sub-seconds).")
                .option("default", 0.0)
                .option("min", -(u64::MAX as f64))
                .option("max", u64::MAX)
                .option("step", 0.01),
        )
        .input(
            InputDef::bare("duration", "FLOAT")
                .tooltip("Duration in seconds")
                .option("default", 60.0)
                .option("min", 0.0)
                .option("step", 0.01),
        )
        .output(OutputDef::new("AUDIO"))
        .aliases(&["cut audio", "audio clip", "shorten audio"]);
    MediaNode::new(spec, |inputs, _| {
        let audio = audio(inputs, "audio", "TrimAudioDuration")?;
        let length = audio.samples() as i64;
        if length == 0 {
            return Ok(NodeResult::values([Value::Audio(audio)]));
        }
        let rate = f64::from(audio.sample_rate());
        let (start, duration) = (inputs.float("start_index")?, inputs.float("duration")?);
        let offset = (start * rate).round() as i64;
        let first = if start < 0.0 { length + offset } else { offset }.clamp(0, length);
        let end = (first + (duration * rate).round() as i64).clamp(0, length);
        if first >= end {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                "TrimAudioDuration: Start time must be less than end time and be within the audio length.",
            ));
        }
        let trimmed = audio.slice(first as usize, end as usize).map_err(media_error)?;
        Ok(NodeResult::values([Value::Audio(Arc::new(trimmed))]))
    })
}

/// `AudioConcat`: `audio2` after or before `audio1` (mono made stereo first).
pub(super) fn audio_concat() -> MediaNode {
    let spec = NodeSpec::new("AudioConcat", "Concatenate Audio", "audio")
        .python_module("comfy_extras.nodes_audio")
        .v3()
        .description("Concatenates the audio1 to audio2 in the specified direction.")
        .input(InputDef::typed("audio1", "AUDIO").with_options())
        .input(InputDef::typed("audio2", "AUDIO").with_options())
        .input(
            InputDef::bare("direction", "COMBO")
                .tooltip("Whether to append audio2 after or before audio1.")
                .option("default", "after")
                .option("multiselect", false)
                .option("options", vec!["after", "before"]),
        )
        .output(OutputDef::new("AUDIO"))
        .aliases(&["join audio", "combine audio", "append audio"]);
    MediaNode::new(spec, |inputs, _| {
        let (first, second) = match Pair::of(inputs, "audio1", "audio2")? {
            Pair::Both(a, b) => (a, b),
            Pair::Passed(passed) => return Ok(NodeResult::values([passed])),
        };
        let joined = concat(&first, &second, inputs.string("direction")? == "before")?;
        Ok(NodeResult::values([Value::Audio(Arc::new(joined))]))
    })
}

/// `second` after `first` (before it when `before`), both made stereo when mono and brought to the higher rate.
fn concat(first: &Audio, second: &Audio, before: bool) -> Result<Audio, NodeError> {
    let (first, second) = match_rates(&stereo(first)?, &stereo(second)?)?;
    let (a, b) = if before { (&second, &first) } else { (&first, &second) };
    if (a.batch(), a.channels()) != (b.batch(), b.channels()) {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "AudioConcat: cannot join {} clips of {} channels with {} clips of {} channels",
                a.batch(),
                a.channels(),
                b.batch(),
                b.channels()
            ),
        ));
    }
    let mut data = Vec::with_capacity(a.waveform().data().len() + b.waveform().data().len());
    for item in 0..a.batch() {
        for c in 0..a.channels() {
            data.extend_from_slice(a.channel(item, c));
            data.extend_from_slice(b.channel(item, c));
        }
    }
    clip(vec![a.batch(), a.channels(), a.samples() + b.samples()], data, a.sample_rate())
}

/// Mono audio with its channel doubled (ComfyUI's `repeat(1, 2, 1)`); other audio as it is.
fn stereo(audio: &Audio) -> Result<Audio, NodeError> {
    if audio.channels() != 1 {
        return Ok(audio.clone());
    }
    let mut data = Vec::with_capacity(audio.waveform().data().len() * 2);
    for item in 0..audio.batch() {
        data.extend_from_slice(audio.channel(item, 0));
        data.extend_from_slice(audio.channel(item, 0));
    }
    clip(vec![audio.batch(), 2, audio.samples()], data, audio.sample_rate())
}

#[cfg(test)]
mod tests {
    use super::super::audio_mix::tests::assert_close;
    use super::*;

    #[test]
    fn concat_makes_mono_stereo_and_meets_at_the_higher_rate_as_comfyui() {
        let io = crate::fixtures::tensors("audio_nodes/io.safetensors");
        let clip = |name: &str, rate| Audio::new(io[name].clone(), rate).expect("audio");
        let (a, b) = (clip("concat.a", 16000), clip("concat.b", 22050));
        let got = concat(&a, &b, false).expect("joined");
        assert_close(&got, &clip("concat.out", 22050), "concat");
        // Before: audio2 first, the same samples.
        let before = concat(&a, &b, true).expect("joined");
        assert_eq!(before.channel(0, 1)[..300], *b.channel(0, 1));
    }
}
