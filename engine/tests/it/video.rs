//! Video as data: CreateVideo → SaveVideo writes an H.264 MP4 of the right frame count, size and rate with the
//! prompt and workflow as tags, which LoadVideo → GetVideoComponents reads back within codec loss; Trim Video;
//! the animation savers; and a file Kiln cannot decode is an error naming what it is.

use std::sync::Arc;

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_engine::graph::NodeId;
use kiln_engine::media::{self, Audio, Rational, SaveOptions, Video, VideoComponents};
use kiln_engine::nodes::{FileKind, FileRef};
use kiln_engine::tensor::Tensor;
use serde_json::json;

use crate::harness::Harness;

/// Three reddish frames then two bluish ones, 64 × 48.
fn frames() -> serde_json::Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 3, "color": 0xC03020}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 2, "color": 0x2050D0}},
        "3": {"class_type": "ImageBatch", "inputs": {"image1": ["1", 0], "image2": ["2", 0]}},
    })
}

fn with(mut prompt: serde_json::Value, nodes: serde_json::Value) -> serde_json::Value {
    let (Some(prompt_nodes), Some(more)) = (prompt.as_object_mut(), nodes.as_object()) else {
        panic!("prompts are objects");
    };
    prompt_nodes.extend(more.clone());
    prompt
}

#[test]
fn create_save_load_round_trips_frames_rate_and_metadata() {
    let mut h = Harness::new(CachePolicy::Classic);
    let prompt = with(
        frames(),
        json!({
            "4": {"class_type": "CreateVideo", "inputs": {"images": ["3", 0], "fps": 24.0}},
            "5": {"class_type": "SaveVideo", "inputs": {
                "video": ["4", 0], "filename_prefix": "video/kiln", "format": "auto",
                "codec": "h264", "codec.encoding": "re-encode", "codec.encoding.crf": 18.0}},
        }),
    );
    let workflow = json!({"workflow": {"id": "wf-video", "nodes": []}});
    let ran = h.run_validated(&h.validate(prompt), workflow);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let ui = &ran.summary.outputs[&NodeId::from("5")];
    assert_eq!(ui.images.len(), 1);
    assert_eq!(ui.images[0].filename, "kiln_00001_.mp4");
    assert_eq!(ui.images[0].subfolder, "video");
    assert_eq!(ui.images[0].kind, FileKind::Output);
    assert_eq!(ui.animated, [true]);

    let saved = h.roots.output.join("video/kiln_00001_.mp4");
    let bytes = std::fs::read(&saved).expect("the MP4 exists");
    let tags = media::mp4_tags(&bytes).expect("an MP4");
    let keys: Vec<&str> = tags.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["workflow", "prompt"]);
    assert_eq!(tags[0].1, r#"{"id": "wf-video", "nodes": []}"#);
    let prompt_tag: serde_json::Value = serde_json::from_str(&tags[1].1).expect("JSON");
    assert_eq!(prompt_tag["5"]["class_type"], "SaveVideo");

    // The file as a video: 5 frames of 64 × 48 at exactly 24 fps.
    let video = Video::from_path(saved.clone());
    let components = video.components().expect("decodes");
    assert_eq!(components.images.shape(), [5, 48, 64, 3]);
    assert_eq!(components.frame_rate, Rational::new(24, 1).expect("24"));
    assert_eq!(video.dimensions().expect("dims"), (64, 48));
    assert!((video.duration().expect("duration") - 5.0 / 24.0).abs() < 1e-9);

    // Back through the nodes: LoadVideo → GetVideoComponents.
    std::fs::copy(&saved, h.roots.input.join("clip.mp4")).expect("copy");
    let ran = h.run(json!({
        "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
        "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "frame"}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["2", 2]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["2", 3]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    assert_eq!(ran.text("4"), ["24.0"]);
    assert_eq!(ran.text("5"), ["8"]);
    // H.264 at CRF 18 of a flat frame, and BT.601 limited range both ways.
    assert_saved_frames_are_the_colours(&h, &ran.summary.outputs[&NodeId::from("3")].images);
}

/// The saved PNGs are the five 64 × 48 frames of [`frames`]: three reddish, two bluish, each pixel within
/// 4/255 (a codec's loss on a flat frame, and BT.601 limited range both ways).
pub(crate) fn assert_saved_frames_are_the_colours(h: &Harness, images: &[FileRef]) {
    assert_eq!(images.len(), 5);
    for (i, image) in images.iter().enumerate() {
        let png = image::open(h.roots.output.join(&image.filename)).expect("a PNG").to_rgb8();
        assert_eq!((png.width(), png.height()), (64, 48));
        let want: [u8; 3] = if i < 3 { [0xC0, 0x30, 0x20] } else { [0x20, 0x50, 0xD0] };
        for pixel in png.pixels() {
            for (got, want) in pixel.0.iter().zip(want) {
                assert!(got.abs_diff(want) <= 4, "frame {i}: {:?} vs {want:?}", pixel.0);
            }
        }
    }
}

#[test]
fn save_video_defaults_and_counters() {
    let mut h = Harness::new(CachePolicy::None);
    let prompt = with(
        frames(),
        json!({
            "4": {"class_type": "CreateVideo", "inputs": {"images": ["3", 0], "fps": 29.97}},
            "5": {"class_type": "SaveVideo", "inputs": {
                "video": ["4", 0], "filename_prefix": "video/ComfyUI", "format": "mp4", "codec": "auto"}},
        }),
    );
    for n in 1..=2 {
        let ran = h.run(prompt.clone());
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
        assert_eq!(
            ran.summary.outputs[&NodeId::from("5")].images[0].filename,
            format!("ComfyUI_{n:05}_.mp4")
        );
    }
    // 29.97 is stored as the exact thousandths 29970/1000.
    let video = Video::from_path(h.roots.output.join("video/ComfyUI_00002_.mp4"));
    assert_eq!(
        video.components().expect("decodes").frame_rate,
        Rational::new(2997, 100).expect("rate")
    );
}

#[test]
fn odd_sizes_and_ten_bits_are_refused_as_x264_would() {
    let images = Tensor::full(vec![2, 5, 6, 3], 0.5);
    let odd = Video::Components {
        components: VideoComponents { images, audio: None, frame_rate: Rational::ONE },
        bit_depth: 8,
    };
    let err = odd.encode_mp4(&SaveOptions::default()).expect_err("odd height");
    assert_eq!(err.to_string(), "H.264 output requires even dimensions, got 6x5");

    let images = Tensor::full(vec![2, 4, 6, 3], 0.5);
    let ten = Video::Components {
        components: VideoComponents { images, audio: None, frame_rate: Rational::ONE },
        bit_depth: 10,
    };
    let err = ten.encode_mp4(&SaveOptions::default()).expect_err("10-bit");
    assert!(err.to_string().contains("10-bit H.264 is not available"), "{err}");
}

#[test]
fn trim_video_cuts_frames_by_time() {
    let mut h = Harness::new(CachePolicy::None);
    let prompt = with(
        frames(),
        json!({
            "4": {"class_type": "CreateVideo", "inputs": {"images": ["3", 0], "fps": 10.0}},
            "5": {"class_type": "Video Slice", "inputs": {
                "video": ["4", 0], "start_time": 0.1, "duration": 0.3, "strict_duration": false}},
            "6": {"class_type": "GetVideoComponents", "inputs": {"video": ["5", 0]}},
            "7": {"class_type": "PreviewAny", "inputs": {"source": ["6", 2]}},
            "8": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "cut"}},
        }),
    );
    let ran = h.run(prompt);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    // Frames at 0.1, 0.2 and 0.3 s; the 0.4 s one is past the window.
    assert_eq!(ran.summary.outputs[&NodeId::from("8")].images.len(), 3);
    assert_eq!(ran.text("7"), ["10.0"]);

    // Strict: a window longer than the video is refused.
    let strict = with(
        frames(),
        json!({
            "4": {"class_type": "CreateVideo", "inputs": {"images": ["3", 0], "fps": 10.0}},
            "5": {"class_type": "Video Slice", "inputs": {
                "video": ["4", 0], "start_time": 0.0, "duration": 2.0, "strict_duration": true}},
            "6": {"class_type": "SaveVideo", "inputs": {
                "video": ["5", 0], "filename_prefix": "x", "format": "auto", "codec": "auto"}},
        }),
    );
    let ran = h.run(strict);
    assert!(matches!(ran.summary.outcome, Outcome::Failed(_)), "{:?}", ran.summary.outcome);
}

#[test]
fn a_file_kiln_cannot_decode_names_what_it_is() {
    let mut h = Harness::new(CachePolicy::None);
    let fail = |h: &mut Harness, name: &str, bytes: &[u8]| {
        std::fs::write(h.roots.input.join(name), bytes).expect("write");
        let ran = h.run(json!({
            "1": {"class_type": "LoadVideo", "inputs": {"file": name}},
            "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
        }));
        match ran.summary.outcome {
            Outcome::Failed(failure) => failure.message,
            other => panic!("decoding {name} must fail: {other:?}"),
        }
    };
    // An AVI.
    let message = fail(&mut h, "clip.avi", b"RIFF\x10\0\0\0AVI LIST");
    assert!(message.contains("is a RIFF file"), "{message}");
    assert!(message.contains("MP4"), "{message}");
    // A WebM cut short after its EBML header.
    let message = fail(&mut h, "clip.webm", &[0x1a, 0x45, 0xdf, 0xa3, 0, 0, 0, 0x20]);
    assert!(message.contains("Matroska/WebM"), "{message}");
}

#[test]
fn load_video_lists_video_files_only() {
    let h = Harness::new(CachePolicy::None);
    for name in ["b.mp4", "a.webm", "c.png", "d.flac", "e.MOV"] {
        std::fs::write(h.roots.input.join(name), b"").expect("write");
    }
    let spec = h.registry.get("LoadVideo").expect("registered").spec();
    let choices = spec.input_def("file").and_then(|(d, _)| d.choices_list()).expect("a combo");
    assert_eq!(choices, ["a.webm", "b.mp4", "e.MOV"]);
}

#[test]
fn animated_webp_and_png_hold_every_frame_and_the_metadata() {
    let mut h = Harness::new(CachePolicy::None);
    let prompt = with(
        frames(),
        json!({
            "4": {"class_type": "SaveAnimatedWEBP", "inputs": {
                "images": ["3", 0], "filename_prefix": "animw", "fps": 8.0, "lossless": true,
                "quality": 80, "method": "default"}},
            "5": {"class_type": "SaveAnimatedPNG", "inputs": {
                "images": ["3", 0], "filename_prefix": "animp", "fps": 8.0, "compress_level": 4}},
        }),
    );
    let ran = h.run_validated(&h.validate(prompt), json!({"workflow": {"id": "w"}}));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    for node in ["4", "5"] {
        let ui = &ran.summary.outputs[&NodeId::from(node)];
        assert_eq!(ui.animated, [true]);
        assert_eq!(ui.images.len(), 1);
    }
    let webp = std::fs::read(h.roots.output.join("animw_00001_.webp")).expect("webp");
    assert_eq!(&webp[..4], b"RIFF");
    assert_eq!(&webp[8..12], b"WEBP");
    assert_eq!(webp.windows(4).filter(|w| w == b"ANMF").count(), 5);
    let exif = webp.windows(4).position(|w| w == b"EXIF").expect("an EXIF chunk");
    let tail = String::from_utf8_lossy(&webp[exif..]);
    assert!(tail.contains(r#"workflow:{"id": "w"}"#), "{tail}");
    assert!(tail.contains("prompt:{"), "{tail}");
    // The image crate decodes every frame of it.
    let decoder = image::codecs::webp::WebPDecoder::new(std::io::Cursor::new(&webp)).expect("WebP");
    let frames = image::AnimationDecoder::into_frames(decoder).collect_frames().expect("frames");
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[4].buffer().get_pixel(0, 0).0, [0x20, 0x50, 0xD0, 0xff]);
    assert_eq!(frames[0].delay().numer_denom_ms(), (125, 1));

    let png_path = h.roots.output.join("animp_00001_.png");
    let decoder =
        png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png_path).expect("png")));
    let reader = decoder.read_info().expect("PNG");
    let animation = reader.info().animation_control().expect("an APNG");
    assert_eq!(animation.num_frames, 5);
    let bytes = std::fs::read(&png_path).expect("png");
    let comf = bytes.windows(4).position(|w| w == b"comf").expect("comf chunks");
    assert!(String::from_utf8_lossy(&bytes[comf..]).contains("prompt\0{"));
}

#[test]
fn video_values_report_their_type_and_size() {
    let images = Tensor::full(vec![2, 4, 6, 3], 0.25);
    let video = Video::Components {
        components: VideoComponents { images, audio: None, frame_rate: Rational::ONE },
        bit_depth: 8,
    };
    let value = kiln_engine::value::Value::Video(Arc::new(video));
    assert_eq!(value.type_name(), "VIDEO");
    assert_eq!(value.byte_size(), 2 * 4 * 6 * 3 * 4);
}

/// The largest difference, in 8-bit levels, between decoded frames (values in 0..1) and FFmpeg's `rgb24`
/// frames of a fixture (as many as the shorter holds).
pub(crate) fn worst_level_difference(frames: &Tensor, ffmpeg: &std::path::Path) -> i32 {
    let ffmpeg = std::fs::read(ffmpeg).expect("FFmpeg's frames");
    (frames.data().iter().zip(&ffmpeg))
        .map(|(&x, &f)| ((x * 255.0).round() as i32 - i32::from(f)).abs())
        .max()
        .expect("pixels")
}

/// The largest difference over each of two channels' first 4096 samples from FFmpeg's (a fixture of planar
/// little-endian f32), FFmpeg's first clamped to [-1, 1] with `clamp`.
pub(crate) fn worst_sample_difference(audio: &Audio, ffmpeg: &std::path::Path, clamp: bool) -> f32 {
    let head: Vec<f32> = std::fs::read(ffmpeg)
        .expect("FFmpeg's audio")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut worst = 0.0f32;
    for c in 0..2 {
        let ours = &audio.channel(0, c)[..4096];
        for (a, &b) in ours.iter().zip(&head[c * 4096..(c + 1) * 4096]) {
            let b = if clamp { b.clamp(-1.0, 1.0) } else { b };
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

#[test]
fn a_tagged_h264_file_converts_by_its_declared_colour_space() {
    // scripts/reference/video.py: x264 with its SPS declaring BT.709 in full range (as phones tag video);
    // FFmpeg converts by that, and so does Kiln (BT.601 limited, the untagged default, would be far off).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video");
    let components =
        Video::from_path(dir.join("x264_bt709_full.mp4")).components().expect("decodes");
    assert_eq!(components.images.shape(), [4, 32, 48, 3]);
    let worst =
        worst_level_difference(&components.images, &dir.join("x264_bt709_full_frames_rgb24.bin"));
    assert!(worst <= 4, "largest difference from FFmpeg's frames: {worst}/255");
}

#[test]
fn decodes_an_x264_file_as_ffmpeg_does() {
    // scripts/reference/video.py: x264 High profile with B-frames and CABAC, AAC audio, decoded by FFmpeg.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("JSON");
    let video = Video::from_path(dir.join("x264_high_aac.mp4"));
    let components = video.components().expect("decodes");
    let (n, h, w) = (12, 32, 48);
    assert_eq!(expected["frames"], n);
    assert_eq!(components.images.shape(), [n, h, w, 3]);
    assert_eq!(components.frame_rate, Rational::new(30000, 1001).expect("rate"));
    let worst = worst_level_difference(&components.images, &dir.join("frames_rgb24.bin"));
    // The pictures are FFmpeg's; only the chroma upsampling and rounding of the RGB conversion differ.
    assert!(worst <= 4, "largest difference from FFmpeg's frames: {worst}/255");

    let audio = components.audio.expect("the AAC track decodes");
    assert_eq!(audio.sample_rate(), 44100);
    assert_eq!(
        audio.waveform().shape(),
        [1, 2, expected["audio_samples"].as_u64().expect("n") as usize]
    );
    let worst = worst_sample_difference(&audio, &dir.join("audio_head_f32.bin"), false);
    assert!(worst < 1e-3, "largest difference from FFmpeg's AAC decoding {worst}");
    // The tags FFmpeg wrote are read.
    let tags =
        media::mp4_tags(&std::fs::read(dir.join("x264_high_aac.mp4")).expect("mp4")).expect("tags");
    assert!(tags.iter().any(|(k, v)| k == "prompt" && v.contains("class_type")), "{tags:?}");
}
