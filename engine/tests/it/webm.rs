//! `SaveWEBM`: VP9 and AV1 WebM files of every frame at the asked rate, read back by an independent Matroska
//! reader (`matroska-demuxer`); VP9 frames and their alpha decode to the images' levels; the prompt and workflow
//! are the file's tags, named as FFmpeg names them (the frontend reads them back). `LoadVideo` reads a VP9
//! WebM back (frames, rate, a trim window) and names AV1 as the codec it does not decode.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_engine::graph::NodeId;
use kiln_engine::media::{Rational, Video};
use kiln_engine::nodes::FileKind;
use matroska_demuxer::{Frame, MatroskaFile};
use serde_json::json;

use crate::harness::Harness;
use crate::video::{worst_level_difference, worst_sample_difference};

/// Three reddish frames then two bluish ones, 64 × 48, as RGB; with `alpha`, joined with a mask of 0.25
/// (alpha 0.75).
fn prompt(codec: &str, alpha: bool) -> serde_json::Value {
    let mut nodes = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 3, "color": 0xC03020}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 2, "color": 0x2050D0}},
        "3": {"class_type": "ImageBatch", "inputs": {"image1": ["1", 0], "image2": ["2", 0]}},
        "9": {"class_type": "SaveWEBM", "inputs": {
            "images": ["3", 0], "filename_prefix": "clips/kiln", "codec": codec, "fps": 8.0, "crf": 10.0}},
    });
    if alpha {
        nodes["4"] = json!({"class_type": "SolidMask", "inputs": {"value": 0.25, "width": 64, "height": 48}});
        nodes["5"] = json!({"class_type": "JoinImageWithAlpha", "inputs": {"image": ["3", 0], "alpha": ["4", 0]}});
        nodes["9"]["inputs"]["images"] = json!(["5", 0]);
    }
    nodes
}

/// Runs the prompt; the saved file's bytes.
fn save(codec: &str, alpha: bool) -> Vec<u8> {
    let mut h = Harness::new(CachePolicy::None);
    let bytes = save_in(&mut h, codec, alpha);
    assert!(h.roots.output.join("clips/kiln_00001_.webm").exists());
    bytes
}

fn save_in(h: &mut Harness, codec: &str, alpha: bool) -> Vec<u8> {
    let ran =
        h.run_validated(&h.validate(prompt(codec, alpha)), json!({"workflow": {"id": "wf-webm"}}));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let ui = &ran.summary.outputs[&NodeId::from("9")];
    assert_eq!(ui.images.len(), 1);
    let name = &ui.images[0].filename;
    assert!(name.starts_with("kiln_0000") && name.ends_with("_.webm"), "{name}");
    assert_eq!(ui.images[0].subfolder, "clips");
    assert_eq!(ui.images[0].kind, FileKind::Output);
    assert_eq!(ui.animated, [true]);
    std::fs::read(h.roots.output.join("clips").join(name)).expect("the WebM exists")
}

/// The file's frames as the reader gives them.
fn frames(file: &mut MatroskaFile<std::io::Cursor<Vec<u8>>>) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut frame = Frame::default();
    while file.next_frame(&mut frame).expect("frames read") {
        frames.push(frame.clone());
    }
    frames
}

/// BT.601 limited-range luma of an 8-bit colour.
fn luma(rgb: [f64; 3]) -> f64 {
    16.0 + 219.0 / 255.0 * (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
}

/// Every luma sample of each decoded VP9 frame, checked against `expected[i]` within `tolerance`.
fn assert_vp9_luma(packets: &[Vec<u8>], expected: &[f64], tolerance: f64) {
    let mut decoder = rusty_vp9::Vp9Decoder::new();
    let mut decoded = 0;
    for (i, packet) in packets.iter().enumerate() {
        decoder.push(packet, Some(i as i64)).expect("VP9 decodes");
        while let Ok(picture) = decoder.next_frame() {
            assert_eq!((picture.width, picture.height), (64, 48));
            let stride = picture.strides[0];
            for row in 0..48 {
                for &y in &picture.planes[0][row * stride..row * stride + 64] {
                    let want = expected[decoded];
                    assert!(
                        (f64::from(y) - want).abs() <= tolerance,
                        "frame {decoded}: {y} vs {want}"
                    );
                }
            }
            decoded += 1;
        }
    }
    assert_eq!(decoded, expected.len());
}

#[test]
fn vp9_webm_holds_every_frame_at_its_time_and_the_tags() {
    let bytes = save("vp9", false);
    let mut file = MatroskaFile::open(std::io::Cursor::new(bytes)).expect("a Matroska file");
    assert_eq!(file.ebml_header().doc_type(), "webm");
    assert_eq!(file.info().timestamp_scale().get(), 1_000_000);
    assert_eq!(file.info().duration(), Some(625.0));
    let track = &file.tracks()[0];
    assert_eq!(track.codec_id(), "V_VP9");
    let video = track.video().expect("a video track");
    assert_eq!((video.pixel_width().get(), video.pixel_height().get()), (64, 48));
    assert_eq!(video.alpha_mode(), None);
    assert_eq!(track.default_duration().map(|d| d.get()), Some(125_000_000));

    let tags = file.tags().expect("tags");
    let simple: Vec<(String, String)> = tags[0]
        .simple_tags()
        .iter()
        .map(|t| (t.name().to_owned(), t.string().unwrap_or_default().to_owned()))
        .collect();
    let names: Vec<&str> = simple.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["PROMPT", "WORKFLOW"]);
    let prompt: serde_json::Value = serde_json::from_str(&simple[0].1).expect("JSON");
    assert_eq!(prompt["9"]["class_type"], "SaveWEBM");
    assert_eq!(simple[1].1, r#"{"id": "wf-webm"}"#);

    let frames = frames(&mut file);
    let times: Vec<u64> = frames.iter().map(|f| f.timestamp).collect();
    assert_eq!(times, [0, 125, 250, 375, 500]);
    assert_eq!(frames[0].is_keyframe, Some(true));
    let red = luma([192.0, 48.0, 32.0]);
    let blue = luma([32.0, 80.0, 208.0]);
    let packets: Vec<Vec<u8>> = frames.into_iter().map(|f| f.data).collect();
    assert_vp9_luma(&packets, &[red, red, red, blue, blue], 2.0);
}

#[test]
fn av1_webm_holds_its_sequence_header_and_frames_without_delimiters() {
    let bytes = save("av1", false);
    let mut file = MatroskaFile::open(std::io::Cursor::new(bytes)).expect("a Matroska file");
    let track = &file.tracks()[0];
    assert_eq!(track.codec_id(), "V_AV1");
    let private = track.codec_private().expect("an av1C record").to_vec();
    // av1C: marker and version 1, 10-bit 4:2:0 (high_bitdepth set, subsampling x and y set).
    assert_eq!(private[0], 0x81);
    assert_eq!(private[2] & 0b0100_0000, 0b0100_0000);
    assert_eq!(private[2] & 0b0000_1100, 0b0000_1100);
    // Then the sequence header OBU.
    assert_eq!((private[4] >> 3) & 0x0F, 1);
    let frames = frames(&mut file);
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[0].is_keyframe, Some(true));
    for frame in &frames {
        assert_ne!((frame.data[0] >> 3) & 0x0F, 2, "a temporal delimiter was left in a block");
    }
}

/// The payloads of every `BlockAdditional` (a VP9 frame's alpha), walking the file's elements.
fn block_additions(bytes: &[u8]) -> Vec<Vec<u8>> {
    fn vint(b: &[u8], at: usize, keep_marker: bool) -> (usize, usize) {
        let len = b[at].leading_zeros() as usize + 1;
        let mut value = if keep_marker { b[at] as usize } else { (b[at] as usize) & (0xFF >> len) };
        for byte in &b[at + 1..at + len] {
            value = value << 8 | *byte as usize;
        }
        (value, len)
    }
    fn walk(b: &[u8], out: &mut Vec<Vec<u8>>) {
        let mut at = 0;
        while at < b.len() {
            let (id, n) = vint(b, at, true);
            let (size, m) = vint(b, at + n, false);
            let body = &b[at + n + m..at + n + m + size];
            match id {
                0x1853_8067 | 0x1F43_B675 | 0xA0 | 0x75A1 | 0xA6 => walk(body, out),
                0xA5 => out.push(body.to_vec()),
                _ => {}
            }
            at += n + m + size;
        }
    }
    let mut out = Vec::new();
    walk(bytes, &mut out);
    out
}

#[test]
fn rgba_frames_keep_their_alpha_in_vp9_and_lose_it_in_av1() {
    let bytes = save("vp9", true);
    let alpha = block_additions(&bytes);
    let mut file = MatroskaFile::open(std::io::Cursor::new(bytes)).expect("a Matroska file");
    assert_eq!(file.tracks()[0].video().and_then(|v| v.alpha_mode()), Some(1));
    let colour: Vec<Vec<u8>> = frames(&mut file).into_iter().map(|f| f.data).collect();
    let (red, blue) = (luma([192.0, 48.0, 32.0]), luma([32.0, 80.0, 208.0]));
    assert_vp9_luma(&colour, &[red, red, red, blue, blue], 2.0);
    // The alpha stream's luma is the alpha itself: 0.75 · 255, truncated.
    assert_eq!(alpha.len(), 5);
    assert_vp9_luma(&alpha, &[191.0; 5], 2.0);

    let bytes = save("av1", true);
    assert!(block_additions(&bytes).is_empty());
    let file = MatroskaFile::open(std::io::Cursor::new(bytes)).expect("a Matroska file");
    assert_eq!(file.tracks()[0].video().and_then(|v| v.alpha_mode()), None);
}

#[test]
fn load_video_reads_a_vp9_webm_back_and_names_av1_as_unsupported() {
    let mut h = Harness::new(CachePolicy::None);
    let vp9 = save_in(&mut h, "vp9", false);
    std::fs::write(h.roots.input.join("clip.webm"), &vp9).expect("write");
    let ran = h.run(json!({
        "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.webm"}},
        "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "frame"}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["2", 2]}},
        "5": {"class_type": "Video Slice", "inputs": {
            "video": ["1", 0], "start_time": 0.25, "duration": 0.25, "strict_duration": true}},
        "6": {"class_type": "GetVideoComponents", "inputs": {"video": ["5", 0]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "window"}},
        "8": {"class_type": "SaveVideo", "inputs": {
            "video": ["1", 0], "filename_prefix": "video/from_webm", "format": "auto", "codec": "auto"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    // SaveVideo re-encodes the WebM as an H.264 MP4: its five frames at 8 fps.
    let mp4 = h.roots.output.join("video/from_webm_00001_.mp4");
    let converted = Video::from_path(mp4).components().expect("the MP4 decodes");
    assert_eq!(converted.images.shape(), [5, 48, 64, 3]);
    assert_eq!(converted.frame_rate, Rational::new(8, 1).expect("8"));
    assert_eq!(ran.text("4"), ["8.0"]);
    // VP9 at crf 10 of a flat frame.
    crate::video::assert_saved_frames_are_the_colours(
        &h,
        &ran.summary.outputs[&NodeId::from("3")].images,
    );
    // 0.25 s to 0.5 s: the frames at 0.25 and 0.375 s, one reddish and one bluish.
    let window = &ran.summary.outputs[&NodeId::from("7")].images;
    assert_eq!(window.len(), 2);
    let first = |i: usize| {
        let png = image::open(h.roots.output.join(&window[i].filename)).expect("a PNG").to_rgb8();
        png.get_pixel(0, 0).0
    };
    assert!(first(0)[0] > 0xA0 && first(1)[2] > 0xA0, "{:?} {:?}", first(0), first(1));

    let av1 = save_in(&mut h, "av1", false);
    std::fs::write(h.roots.input.join("av1.webm"), &av1).expect("write");
    let ran = h.run(json!({
        "1": {"class_type": "LoadVideo", "inputs": {"file": "av1.webm"}},
        "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("Kiln does not decode AV1: {:?}", ran.summary.outcome);
    };
    assert!(failure.message.contains("`av01`"), "{}", failure.message);
    assert!(failure.message.contains("VP9"), "{}", failure.message);
}

#[test]
fn decodes_ffmpegs_webms_as_ffmpeg_does() {
    // scripts/reference/webm.py: libvpx-vp9 (alt-ref frames: hidden frames in superframes) with Opus, and a live
    // file (a segment of unknown size) with Vorbis, each decoded by FFmpeg.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webm");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("JSON");
    // Opus (rusty-opus) and Vorbis (Symphonia) within 2e-7 of FFmpeg's libopus and Vorbis decoders.
    for (stem, audio_tolerance) in [("libvpx_opus", 1e-5f32), ("live_vorbis", 1e-5)] {
        let want = &expected[stem];
        let video = Video::from_path(dir.join(format!("{stem}.webm")));
        let components = video.components().expect("decodes");
        let (n, h, w) = (12, 32, 48);
        assert_eq!(want["frames"], n);
        assert_eq!(components.images.shape(), [n, h, w, 3]);
        // FFmpeg's average rate for a Matroska track: 10⁹ / its default duration, reduced.
        assert_eq!(components.frame_rate, Rational::new(30000, 1001).expect("rate"), "{stem}");
        assert_eq!(video.dimensions().expect("dims"), (w, h));
        let frames_file = dir.join(format!("{stem}_frames_rgb24.bin"));
        let worst = worst_level_difference(&components.images, &frames_file);
        // The pictures are libvpx's (the decoder is bit-exact); only the RGB conversion differs.
        assert!(worst <= 4, "{stem}: largest difference from FFmpeg's frames: {worst}/255");

        let audio = components.audio.expect("the audio decodes");
        let rate = want["sample_rate"].as_u64().expect("rate") as u32;
        assert_eq!(audio.sample_rate(), rate, "{stem}");
        let samples = want["audio_samples"].as_u64().expect("n") as usize;
        assert_eq!(audio.waveform().shape(), [1, 2, samples], "{stem}");
        let head_file = dir.join(format!("{stem}_audio_head_f32.bin"));
        let worst = worst_sample_difference(&audio, &head_file, false);
        assert!(worst < audio_tolerance, "{stem}: largest difference from FFmpeg {worst}");
    }
}

#[test]
fn a_damaged_or_truncated_webm_is_an_error_or_its_first_frames_never_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webm");
    for stem in ["libvpx_opus", "live_vorbis"] {
        let bytes = std::fs::read(dir.join(format!("{stem}.webm"))).expect("fixture");
        let cuts = [4, 40, 400, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1];
        for cut in cuts {
            let video = Video::from_bytes(bytes[..cut].into());
            if let Ok(components) = video.components() {
                assert!(components.images.dim(0) <= 12, "{stem} cut at {cut}");
            }
        }
        // Every byte flipped in turn: the container is read or refused, never a panic.
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0xFF;
            let _ = Video::from_bytes(damaged.into()).dimensions();
        }
    }
}

#[test]
fn decodes_a_browser_recording_by_its_declared_colour_space() {
    // scripts/reference/mediarecorder.mjs: Chromium's MediaRecorder (VP9 tagged BT.709 full range, Opus,
    // clusters of unknown size, no durations), decoded by FFmpeg in scripts/reference/webm.py.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webm");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("JSON");
    let want = &expected["chromium_mediarecorder"];
    let components =
        Video::from_path(dir.join("chromium_mediarecorder.webm")).components().expect("decodes");
    let (n, h, w) = (50, 64, 96);
    assert_eq!(want["frames"], n);
    assert_eq!(components.images.shape(), [n, h, w, 3]);
    // FFmpeg's first four frames, converted by BT.709 in full range as the stream declares (BT.601 in limited
    // range, FFmpeg's default for untagged video, is 7 levels off on average here).
    let frames_file = dir.join("chromium_mediarecorder_frames_rgb24.bin");
    let worst = worst_level_difference(&components.images, &frames_file);
    assert!(worst <= 2, "largest difference from FFmpeg's frames: {worst}/255");
    // No durations in the file: the rate comes from the frames' times (about 25 fps as recorded).
    let fps = components.frame_rate.to_f64();
    assert!((20.0..30.0).contains(&fps), "{fps} fps");

    let audio = components.audio.expect("the Opus track decodes");
    assert_eq!((audio.sample_rate(), audio.channels()), (48_000, 2));
    assert_eq!(audio.samples(), want["audio_samples"].as_u64().expect("n") as usize);
    // The oscillator peaks at 1.014 once coded: libopus's float decoder leaves that, rusty-opus clamps its
    // output to [-1, 1]; within full scale the two agree.
    let head_file = dir.join("chromium_mediarecorder_audio_head_f32.bin");
    let worst = worst_sample_difference(&audio, &head_file, true);
    assert!(worst < 1e-5, "largest difference from FFmpeg {worst}");
}
