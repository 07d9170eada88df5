//! Wan's templates on tiny random-weight files of its families (`kiln_models::synth`: the DiTs, umT5 through
//! CLIPLoader type `wan`, the Wan 2.1 and 2.2 VAEs, CLIP vision H), through the executor on the CPU: text to
//! video (2.1), image to video with CLIP vision (2.1 I2V), first and last frame, TI2V 5B with its start frame
//! kept by the noise mask, the A14B pair handing the latent from the high-noise expert to the low-noise one, and
//! Wan 2.2 Fun Control and Wan 2.1 VACE reading their control videos and reference images, Wan 2.2 Fun Camera its
//! camera motion, Causal Forcing's causal model run a block of frames at a time by the `ar_video` sampler, and
//! HuMo 17B following its reference image and the audio Whisper heard, and InfiniteTalk's patch on Wan 2.1 I2V
//! 14B following one or two speakers' audio (wav2vec2) and continuing a clip from its last frames, and Wan 2.2
//! S2V following its reference image and the audio, then extending its clip, and Wan Animate 2 following its
//! reference image and pose video in context windows with its pose-branch cache, then continuing its clip.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_engine::graph::NodeId;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{self, ClipVisionFile, SynthDtype, SynthFamily, WanFile, ZImageTurboSet};
use serde_json::{Value, json};

use crate::harness::Harness;

/// The stock negative prompt of Wan's templates.
const NEGATIVE: &str = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量";

/// Writes tiny Wan files under `models`, named as the templates name them.
fn write_tiny_wan(models: &std::path::Path) {
    let set = ZImageTurboSet::tiny();
    for (family, path, dtype) in [
        (
            SynthFamily::Diffusion(DiffusionFamily::Wan21),
            "diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::Wan(WanFile::I2v14b),
            "diffusion_models/wan2.1_i2v_480p_14B_fp16.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::Wan(WanFile::Flf2v14b),
            "diffusion_models/wan2.1_flf2v_720p_14B_fp16.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::Diffusion(DiffusionFamily::Wan22),
            "diffusion_models/wan2.2_ti2v_5B_fp16.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::Wan(WanFile::T2vA14b),
            "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
            SynthDtype::Fp8Scaled,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::Umt5Xxl),
            "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
            SynthDtype::Fp8Scaled,
        ),
        // Causal Forcing's: 2.1 T2V 1.3B's weights marked causal.
        (
            SynthFamily::Wan(WanFile::CausalT2v13b),
            "diffusion_models/causal_forcing-framewise.safetensors",
            SynthDtype::Bf16,
        ),
        (
            SynthFamily::Wan(WanFile::Humo17b),
            "diffusion_models/humo_17B_fp16.safetensors",
            SynthDtype::F16,
        ),
        (SynthFamily::Whisper, "audio_encoders/whisper_large_v3_fp16.safetensors", SynthDtype::F16),
        (
            SynthFamily::Wav2Vec2(kiln_models::wav2vec2::Variant::Large),
            "audio_encoders/wav2vec2_large_english_fp16.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::Wan(WanFile::S2v14b),
            "diffusion_models/wan2.2_s2v_14B_fp8_scaled.safetensors",
            SynthDtype::Fp8Scaled,
        ),
        (
            SynthFamily::Wav2Vec2(kiln_models::wav2vec2::Variant::Base),
            "audio_encoders/wav2vec2-chinese-base_fp16.safetensors",
            SynthDtype::F16,
        ),
        // Wan Animate 2: 2.1 I2V 14B's structure marked Animate 2, in ComfyUI's int8 with ConvRot as released.
        (
            SynthFamily::Wan(WanFile::Animate2),
            "diffusion_models/wan_animate_2_distill_int8_convrot.safetensors",
            SynthDtype::Int8Convrot,
        ),
        (
            SynthFamily::WanInfiniteTalk,
            "model_patches/wan2.1_infiniteTalk_multi_fp16.safetensors",
            SynthDtype::F16,
        ),
        (SynthFamily::Vae(VaeFamily::Wan21), "vae/wan_2.1_vae.safetensors", SynthDtype::Bf16),
        (SynthFamily::Vae(VaeFamily::Wan22), "vae/wan2.2_vae.safetensors", SynthDtype::Bf16),
        (
            SynthFamily::ClipVision(ClipVisionFile::H),
            "clip_vision/clip_vision_h.safetensors",
            SynthDtype::F16,
        ),
    ] {
        synth::write_family(&models.join(path), family, &set, dtype, 11, &mut |_, _| {})
            .expect("a tiny file");
    }
    // The low-noise expert: another draw of the same structure.
    synth::write_family(
        &models.join("diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"),
        SynthFamily::Wan(WanFile::T2vA14b),
        &set,
        SynthDtype::Fp8Scaled,
        12,
        &mut |_, _| {},
    )
    .expect("a tiny file");
}

/// `text_to_video_wan`'s graph at 32×32, `length` frames, 2 uni_pc steps: the frames saved as images (node 9)
/// and as an MP4 (node 50).
fn text_to_video(unet: &str, vae: &str, length: u64) -> Value {
    json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8.0, "model": ["37", 0]}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox running through snow", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["38", 0]}},
        "40": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 32, "height": 32, "length": length, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 7, "steps": 2, "cfg": 6.0, "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1.0, "model": ["48", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["40", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "wan", "images": ["8", 0]}},
        "49": {"class_type": "CreateVideo", "inputs": {"images": ["8", 0], "fps": 16.0}},
        "50": {"class_type": "SaveVideo", "inputs": {"video": ["49", 0], "filename_prefix": "video/ComfyUI", "format": "auto", "codec": "auto"}},
    })
}

/// Runs `graph`, asserts it succeeded, and returns the saved frames' pixels (node 9's images, in order, 32×32).
fn frames_of(h: &mut Harness, graph: Value) -> Vec<Vec<u8>> {
    frames_of_side(h, graph, 32)
}

/// The largest difference between two clips' pixel values (255 when their frames differ in number or size).
fn max_difference(a: &[Vec<u8>], b: &[Vec<u8>]) -> u8 {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
        return u8::MAX;
    }
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0)
}

/// [`frames_of`] for frames of `side` × `side`.
fn frames_of_side(h: &mut Harness, graph: Value, side: u32) -> Vec<Vec<u8>> {
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let ui = &ran.summary.outputs[&NodeId::from("9")];
    ui.images
        .iter()
        .map(|saved| {
            let image = image::open(h.roots.output.join(&saved.filename)).expect("a PNG");
            assert_eq!((image.width(), image.height()), (side, side));
            image.to_rgb8().into_raw()
        })
        .collect()
}

#[test]
fn issue_24_wan21_text_to_video_makes_a_clip_of_the_frames_asked_for() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let graph = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 9);
    let ran = h.run(graph.clone());
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    // 9 frames → 3 latent frames → 9 frames again.
    assert_eq!(ran.summary.outputs[&NodeId::from("9")].images.len(), 9);
    let video = &ran.summary.outputs[&NodeId::from("50")];
    assert_eq!(video.images.len(), 1);
    assert!(video.images[0].filename.ends_with(".mp4"), "{:?}", video.images[0]);
    assert_eq!(video.animated, [true]);
    let mp4 = std::fs::read(h.roots.output.join("video").join(&video.images[0].filename))
        .expect("the MP4");
    assert!(mp4.len() > 100, "an MP4 with frames");
    // A seed is a clip: the same graph again gives the same frames.
    let first = frames_of(&mut h, graph.clone());
    assert_eq!(frames_of(&mut h, graph.clone()), first);
    // `wanBlockSwap`, which ComfyUI turns into a no-op, passes the model through: the same frames again.
    let mut swapped = graph;
    swapped["60"] = json!({"class_type": "wanBlockSwap", "inputs": {"model": ["37", 0]}});
    swapped["48"]["inputs"]["model"] = json!(["60", 0]);
    assert_eq!(frames_of(&mut h, swapped), first);
}

/// `graph` with WanImageToVideo (or, with `end`, WanFirstLastFrameToVideo) between the prompts and the
/// sampler: a start image (and an end image) of colour `colour`, seen by CLIP vision H.
fn image_to_video(mut graph: Value, unet: &str, colour: u32, end: bool) -> Value {
    graph["37"]["inputs"]["unet_name"] = json!(unet);
    graph["52"] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": colour}});
    graph["53"] = json!({"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "clip_vision_h.safetensors"}});
    graph["51"] = json!({"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["53", 0], "image": ["52", 0], "crop": "none"}});
    graph["54"] = if end {
        json!({"class_type": "WanFirstLastFrameToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 9,
            "batch_size": 1, "clip_vision_start_image": ["51", 0], "clip_vision_end_image": ["51", 0],
            "start_image": ["52", 0], "end_image": ["52", 0]}})
    } else {
        json!({"class_type": "WanImageToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 9,
            "batch_size": 1, "clip_vision_output": ["51", 0], "start_image": ["52", 0]}})
    };
    graph["3"]["inputs"]["positive"] = json!(["54", 0]);
    graph["3"]["inputs"]["negative"] = json!(["54", 1]);
    graph["3"]["inputs"]["latent_image"] = json!(["54", 2]);
    graph
}

#[test]
fn issue_24_wan21_image_to_video_and_first_last_frame_follow_their_images() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let base = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 9);
    for (unet, end) in [
        ("wan2.1_i2v_480p_14B_fp16.safetensors", false),
        ("wan2.1_flf2v_720p_14B_fp16.safetensors", true),
    ] {
        let red = frames_of(&mut h, image_to_video(base.clone(), unet, 0xD02020, end));
        let blue = frames_of(&mut h, image_to_video(base.clone(), unet, 0x2020D0, end));
        assert_eq!((red.len(), blue.len()), (9, 9), "{unet}");
        // The image reaches the model (through the concat channels and CLIP vision): the clips differ.
        assert_ne!(red, blue, "{unet}: the start image changes the clip");
    }
}

#[test]
fn issue_24_wan_phantom_follows_its_subject_images() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let plain = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 9);
    // Phantom's wiring: WanPhantomSubjectToVideo between the prompts and the sampler, its negative_img_text as
    // the sampler's negative; subjects of `colours`, each an image of another aspect than the clip's.
    let phantom = |colours: &[u32]| {
        let mut graph = plain.clone();
        graph["54"] = json!({"class_type": "WanPhantomSubjectToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32,
            "length": 9, "batch_size": 1}});
        let mut images = None;
        for (i, colour) in colours.iter().enumerate() {
            let id = format!("{}", 60 + i);
            graph[&id] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": colour}});
            images = Some(match images {
                None => json!([id, 0]),
                Some(before) => {
                    let batch = format!("{}", 70 + i);
                    graph[&batch] = json!({"class_type": "ImageBatch", "inputs": {"image1": before, "image2": [id, 0]}});
                    json!([batch, 0])
                }
            });
        }
        if let Some(images) = images {
            graph["54"]["inputs"]["images"] = images;
        }
        graph["3"]["inputs"]["positive"] = json!(["54", 0]);
        graph["3"]["inputs"]["negative"] = json!(["54", 2]);
        graph["3"]["inputs"]["latent_image"] = json!(["54", 3]);
        graph
    };
    // Without subjects the node hands the prompts on and an empty latent: text-to-video's frames.
    let none = frames_of(&mut h, phantom(&[]));
    assert_eq!(none, frames_of(&mut h, plain.clone()));
    let red = frames_of(&mut h, phantom(&[0xD02020]));
    assert_eq!(red.len(), 9, "the subject frames are cut off the clip");
    assert_ne!(red, none, "the subject reaches the model");
    let two = frames_of(&mut h, phantom(&[0xD02020, 0x2020D0]));
    assert_eq!(two.len(), 9);
    assert_ne!(two, red, "a second subject reaches the model");
}

#[test]
fn issue_24_regional_prompts_weigh_a_second_prompt_by_its_area_and_mask() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    // 128 × 64 pixels: the area widgets start at 64.
    let mut alone = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 5);
    alone["40"]["inputs"]["width"] = json!(128);
    alone["40"]["inputs"]["height"] = json!(64);
    let frames_of = |h: &mut Harness, graph: Value| -> Vec<Vec<u8>> {
        let ran = h.run(graph);
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
        let ui = &ran.summary.outputs[&NodeId::from("9")];
        let open = |name: &str| image::open(h.roots.output.join(name)).expect("a PNG");
        ui.images.iter().map(|saved| open(&saved.filename).to_rgb8().into_raw()).collect()
    };
    // A second prompt, shaped by `region` (a node taking node 61's prompt, or none), combined with the first.
    let with_second = |region: Option<Value>| {
        let mut graph = alone.clone();
        graph["61"] = json!({"class_type": "CLIPTextEncode", "inputs": {"text": "a red lantern", "clip": ["38", 0]}});
        let second = match region {
            Some(node) => {
                graph["62"] = node;
                json!(["62", 0])
            }
            None => json!(["61", 0]),
        };
        graph["63"] = json!({"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["6", 0], "conditioning_2": second}});
        graph["3"]["inputs"]["positive"] = json!(["63", 0]);
        graph
    };
    let area = |width: u64| json!({"class_type": "ConditioningSetArea", "inputs": {"conditioning": ["61", 0], "width": width, "height": 64, "x": 0, "y": 0, "strength": 1.0}});
    let masked = |value: f64| {
        let node = json!({"class_type": "ConditioningSetMask", "inputs": {"conditioning": ["61", 0], "mask": ["64", 0], "strength": 1.0, "set_cond_area": "default"}});
        (
            node,
            json!({"class_type": "SolidMask", "inputs": {"value": value, "width": 128, "height": 64}}),
        )
    };
    let one = frames_of(&mut h, alone.clone());
    let both = frames_of(&mut h, with_second(None));
    assert_ne!(both, one, "the second prompt reaches the model");
    // An area over the whole latent (which the negative mirrors) weighs as no area at all.
    assert_eq!(frames_of(&mut h, with_second(Some(area(128)))), both);
    // Over the left half, the second prompt runs on that block alone: another clip.
    let left = frames_of(&mut h, with_second(Some(area(64))));
    assert_ne!(left, both);
    assert_ne!(left, one);
    let with_mask = |h: &mut Harness, value: f64| {
        let (node, mask) = masked(value);
        let mut graph = with_second(Some(node));
        graph["64"] = mask;
        frames_of(h, graph)
    };
    // A mask of ones weighs as no mask.
    assert_eq!(with_mask(&mut h, 1.0), both, "a mask of 1");
    // A mask of zeros leaves the prompt out: it still runs, weighed by 0, in a positive batch one row longer than
    // the prompt alone's, and a product over another number of rows may round its last bits differently (the
    // gemm crate's blocking, on CPUs without AVX-512). So the clip is the prompt alone's within a level (an AVX2
    // machine: 1; the two prompts' clip is 8 levels from it there).
    let zero = max_difference(&with_mask(&mut h, 0.0), &one);
    assert!(zero <= 1, "a mask of 0 gives a clip {zero} levels from the prompt alone's");
    let two = max_difference(&both, &one);
    assert!(two >= 4, "the second prompt moves the clip only {two} levels");
}

#[test]
fn issue_24_easycache_and_lazycache_skip_steps_and_name_what_they_cannot_run_with() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let mut plain = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 5);
    plain["3"]["inputs"]["steps"] = json!(10);
    plain["3"]["inputs"]["sampler_name"] = json!("euler");
    let cached = |node: &str, threshold: f64| {
        let mut graph = plain.clone();
        graph["60"] = json!({"class_type": node, "inputs": {"model": ["48", 0], "reuse_threshold": threshold, "start_percent": 0.15, "end_percent": 0.95, "verbose": false}});
        graph["3"]["inputs"]["model"] = json!(["60", 0]);
        graph
    };
    let first = frames_of(&mut h, plain.clone());
    // At threshold 0 nothing is predicted small enough: every step runs, as without the cache.
    assert_eq!(frames_of(&mut h, cached("EasyCache", 0.0)), first);
    assert_eq!(frames_of(&mut h, cached("LazyCache", 0.0)), first);
    // At the largest threshold steps are skipped: another clip.
    assert_ne!(frames_of(&mut h, cached("EasyCache", 3.0)), first);
    assert_ne!(frames_of(&mut h, cached("LazyCache", 3.0)), first);
    // EasyCache's per-call state cannot follow context windows: refused, naming both.
    let mut windowed = cached("EasyCache", 0.2);
    windowed["61"] = json!({"class_type": "ContextWindowsManual", "inputs": {"model": ["60", 0], "context_length": 3, "context_overlap": 1, "context_schedule": "standard_static", "context_stride": 1, "closed_loop": false, "fuse_method": "pyramid", "dim": 2, "freenoise": false, "cond_retain_index_list": "", "split_conds_to_windows": false, "latent_retain_index_list": "", "causal_window_fix": true}});
    windowed["3"]["inputs"]["model"] = json!(["61", 0]);
    let ran = h.run(windowed);
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    let message = format!("{failure:?}");
    assert!(message.contains("EasyCache") && message.contains("context windows"), "{message}");
}

#[test]
fn issue_24_wan_move_reads_tracks_from_coordinates_and_draws_them() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    // `video_wanmove_480p`'s nodes that ship bypassed: tracks from a coordinates string, and the preview of
    // the tracks drawn over the start image; the tracks drive WanMoveTrackToVideo on the I2V model.
    let coords = |dx: f64| {
        let track = |x0: f64, y0: f64| {
            (0..9).map(|t| json!({"x": x0 + dx * t as f64, "y": y0})).collect::<Vec<_>>()
        };
        serde_json::to_string(&json!([track(4.0, 8.0), track(20.0, 24.0)])).expect("JSON")
    };
    let graph = |dx: f64| {
        let mut graph = image_to_video(
            text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 9),
            "wan2.1_i2v_480p_14B_fp16.safetensors",
            0x808080,
            false,
        );
        graph["61"] = json!({"class_type": "PrimitiveString", "inputs": {"value": coords(dx)}});
        graph["62"] =
            json!({"class_type": "WanMoveTracksFromCoords", "inputs": {"track_coords": ["61", 0]}});
        graph["54"] = json!({"class_type": "WanMoveTrackToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "strength": 1.0, "width": 32,
            "height": 32, "length": ["62", 1], "batch_size": 1, "start_image": ["52", 0], "tracks": ["62", 0],
            "clip_vision_output": ["51", 0]}});
        graph["63"] = json!({"class_type": "WanMoveVisualizeTracks", "inputs": {
            "images": ["52", 0], "tracks": ["62", 0], "line_resolution": 24, "circle_size": 3,
            "opacity": 0.75, "line_width": 4}});
        graph["64"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "tracks", "images": ["63", 0]}});
        graph
    };
    let still = frames_of(&mut h, graph(0.0));
    let moving = frames_of(&mut h, graph(2.0));
    assert_eq!((still.len(), moving.len()), (9, 9), "the tracks' length sets the clip's");
    assert_ne!(still, moving, "the tracks reach the model");
    // The preview: the grey start image (48 × 40) repeated to the tracks' 9 frames, the points drawn on it.
    let ran = h.run(graph(2.0));
    let previews = &ran.summary.outputs[&NodeId::from("64")].images;
    assert_eq!(previews.len(), 9);
    let last = image::open(h.roots.output.join(&previews[8].filename)).expect("a PNG").to_rgb8();
    assert_eq!(last.dimensions(), (48, 40));
    // Track 0 ends at (20, 8) in the first colour (102, 153, 255): its circle at alpha 191 over grey 128, then
    // the trail's second stroke (one pixel back, alpha 179) over that.
    assert_eq!(last.get_pixel(20, 8).0, [103, 151, 245]);
    assert_eq!(
        last.get_pixel(40, 35).0,
        [128, 128, 128],
        "far from the tracks the frame is untouched"
    );
}

#[test]
fn issue_24_wan22_ti2v_keeps_its_start_frame_and_runs_from_an_empty_hunyuan_latent() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    // Text to video from EmptyHunyuanLatentVideo: the 16-channel 8× latent becomes the 5B's 48-channel 16× one.
    let t2v = text_to_video("wan2.2_ti2v_5B_fp16.safetensors", "wan2.2_vae.safetensors", 5);
    assert_eq!(frames_of(&mut h, t2v.clone()).len(), 5);
    // Image to video: Wan22ImageToVideoLatent encodes the start frame into the latent and masks it, so the
    // sampled clip's first frame is the start image's decode, untouched by the sampler.
    let mut i2v = t2v;
    i2v["52"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0x30A050}});
    i2v["40"] = json!({"class_type": "Wan22ImageToVideoLatent", "inputs": {"vae": ["39", 0], "width": 32, "height": 32, "length": 5, "batch_size": 1, "start_image": ["52", 0]}});
    i2v["60"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["40", 0], "vae": ["39", 0]}});
    i2v["61"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "start", "images": ["60", 0]}});
    let sampled = frames_of(&mut h, i2v.clone());
    let ran = h.run(i2v);
    let start = &ran.summary.outputs[&NodeId::from("61")].images[0];
    let start =
        image::open(h.roots.output.join(&start.filename)).expect("a PNG").to_rgb8().into_raw();
    // Kept up to the sampler's last step (uni_pc ends at σ 0.001, as ComfyUI's; nothing blends it back after).
    let mean_diff = |a: &[u8], b: &[u8]| {
        a.iter().zip(b).map(|(x, y)| f64::from(x.abs_diff(*y))).sum::<f64>() / a.len() as f64
    };
    let (kept, sampled_later) = (mean_diff(&sampled[0], &start), mean_diff(&sampled[4], &start));
    assert!(kept < 1.0, "the start frame is kept: mean difference {kept}");
    assert!(sampled_later > 10.0 * kept.max(0.1), "later frames are sampled: {sampled_later}");
}

#[test]
fn issue_24_wan22_a14b_experts_hand_the_latent_over_between_two_samplers() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let mut graph = text_to_video(
        "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
        "wan_2.1_vae.safetensors",
        5,
    );
    graph["76"] = json!({"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}});
    graph["86"] =
        json!({"class_type": "ModelSamplingSD3", "inputs": {"shift": 5.0, "model": ["76", 0]}});
    graph["48"]["inputs"]["shift"] = json!(5.0);
    graph["3"] = json!({"class_type": "KSamplerAdvanced", "inputs": {
        "add_noise": "enable", "noise_seed": 3, "steps": 4, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple",
        "start_at_step": 0, "end_at_step": 2, "return_with_leftover_noise": "enable",
        "model": ["48", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["40", 0]}});
    graph["78"] = json!({"class_type": "KSamplerAdvanced", "inputs": {
        "add_noise": "disable", "noise_seed": 0, "steps": 4, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple",
        "start_at_step": 2, "end_at_step": 10000, "return_with_leftover_noise": "disable",
        "model": ["86", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["3", 0]}});
    graph["8"]["inputs"]["samples"] = json!(["78", 0]);
    let both = frames_of(&mut h, graph.clone());
    assert_eq!(both.len(), 5);
    // The low-noise expert runs the second half: the clip is not the high-noise expert's alone.
    graph["78"]["inputs"]["model"] = json!(["48", 0]);
    assert_ne!(frames_of(&mut h, graph), both);
}

#[test]
fn issue_24_skip_layer_guidance_pushes_away_from_a_pass_without_the_blocks_named() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let plain = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 5);
    let with_slg = |scale: f64, layers: &str| {
        let mut graph = plain.clone();
        graph["90"] = json!({"class_type": "SkipLayerGuidanceDiT", "inputs": {
            "model": ["37", 0], "double_layers": layers, "single_layers": "", "scale": scale,
            "start_percent": 0.0, "end_percent": 1.0, "rescaling_scale": 0.0}});
        graph["48"]["inputs"]["model"] = json!(["90", 0]);
        graph
    };
    let reference = frames_of(&mut h, plain.clone());
    // Scale 0 and no layers leave the model as it was.
    assert_eq!(frames_of(&mut h, with_slg(0.0, "1")), reference);
    assert_eq!(frames_of(&mut h, with_slg(3.0, "")), reference);
    // Skipping block 1 in the extra pass changes the clip, and which block is skipped matters.
    let skip_one = frames_of(&mut h, with_slg(3.0, "1"));
    assert_ne!(skip_one, reference);
    assert_ne!(frames_of(&mut h, with_slg(3.0, "0")), skip_one);
    // A block index no model has is an error naming it.
    let ran = h.run(with_slg(3.0, "70"));
    assert!(format!("{:?}", ran.summary.outcome).contains("block 70"), "{:?}", ran.summary.outcome);
}

#[test]
fn issue_24_simple_skip_layer_guidance_makes_the_negative_without_the_blocks_named() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let plain = text_to_video("wan2.1_t2v_1.3B_fp16.safetensors", "wan_2.1_vae.safetensors", 5);
    let with_simple = |layers: &str, start: f64, end: f64, cfg: f64| {
        let mut graph = plain.clone();
        graph["90"] = json!({"class_type": "SkipLayerGuidanceDiTSimple", "inputs": {
            "model": ["37", 0], "double_layers": layers, "single_layers": "",
            "start_percent": start, "end_percent": end}});
        graph["48"]["inputs"]["model"] = json!(["90", 0]);
        graph["3"]["inputs"]["cfg"] = json!(cfg);
        graph
    };
    let reference = frames_of(&mut h, plain.clone());
    // No layers, or a σ range no step is in, leave the model as it was.
    assert_eq!(frames_of(&mut h, with_simple("", 0.0, 1.0, 6.0)), reference);
    assert_eq!(frames_of(&mut h, with_simple("1", 1.0, 1.0, 6.0)), reference);
    // The negative's pass without block 1 changes the clip; which block matters.
    let skip_one = frames_of(&mut h, with_simple("1", 0.0, 1.0, 6.0));
    assert_ne!(skip_one, reference);
    assert_ne!(frames_of(&mut h, with_simple("0", 0.0, 1.0, 6.0)), skip_one);
    // At CFG 1 the negative is not evaluated, so nothing changes (ComfyUI's hook sees no negative).
    let mut cfg_one = plain.clone();
    cfg_one["3"]["inputs"]["cfg"] = json!(1.0);
    assert_eq!(frames_of(&mut h, with_simple("1", 0.0, 1.0, 1.0)), frames_of(&mut h, cfg_one));
}

#[test]
fn issue_24_wan22_fun_control_reads_its_control_video_and_reference_image() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_wan(&models);
    let unet = "wan2.2_fun_control_high_noise_14B_fp8_scaled.safetensors";
    synth::write_family(
        &models.join("diffusion_models").join(unet),
        SynthFamily::Wan(WanFile::FunControlA14b),
        &ZImageTurboSet::tiny(),
        SynthDtype::Fp8Scaled,
        13,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    // `video_wan2_2_14B_fun_control`'s wiring: a control video and a reference image into
    // Wan22FunControlToVideo, its prompts and latent into the sampler.
    let graph = |control: u32, reference: u32| {
        let mut graph = text_to_video(unet, "wan_2.1_vae.safetensors", 9);
        graph["52"] = json!({"class_type": "EmptyImage", "inputs": {"width": 40, "height": 40, "batch_size": 9, "color": control}});
        graph["55"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 48, "batch_size": 1, "color": reference}});
        graph["54"] = json!({"class_type": "Wan22FunControlToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 9,
            "batch_size": 1, "ref_image": ["55", 0], "control_video": ["52", 0]}});
        graph["3"]["inputs"]["positive"] = json!(["54", 0]);
        graph["3"]["inputs"]["negative"] = json!(["54", 1]);
        graph["3"]["inputs"]["latent_image"] = json!(["54", 2]);
        graph
    };
    let base = frames_of(&mut h, graph(0x808080, 0xD02020));
    assert_eq!(base.len(), 9);
    assert_ne!(
        frames_of(&mut h, graph(0x20D020, 0xD02020)),
        base,
        "the control video reaches the model"
    );
    assert_ne!(
        frames_of(&mut h, graph(0x808080, 0x2020D0)),
        base,
        "the reference image reaches the model"
    );
}

#[test]
fn issue_24_wan_fun_camera_follows_its_camera_motion_and_start_image() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_wan(&models);
    let unet = "wan2.2_fun_camera_high_noise_14B_fp8_scaled.safetensors";
    synth::write_family(
        &models.join("diffusion_models").join(unet),
        SynthFamily::Wan(WanFile::FunCameraA14b),
        &ZImageTurboSet::tiny(),
        SynthDtype::Fp8Scaled,
        14,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    // `video_wan2_2_14B_fun_camera`'s wiring: WanCameraEmbedding's embedding and sizes into
    // WanCameraImageToVideo with a start image, its prompts and latent into the sampler.
    let graph = |pose: &str, start: u32| {
        let mut graph = text_to_video(unet, "wan_2.1_vae.safetensors", 9);
        graph["60"] = json!({"class_type": "WanCameraEmbedding", "inputs": {
            "camera_pose": pose, "width": 32, "height": 32, "length": 9, "speed": 1.0}});
        graph["61"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": start}});
        graph["62"] = json!({"class_type": "WanCameraImageToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": ["60", 1], "height": ["60", 2],
            "length": ["60", 3], "batch_size": 1, "start_image": ["61", 0], "camera_conditions": ["60", 0]}});
        graph["3"]["inputs"]["positive"] = json!(["62", 0]);
        graph["3"]["inputs"]["negative"] = json!(["62", 1]);
        graph["3"]["inputs"]["latent_image"] = json!(["62", 2]);
        graph
    };
    let base = frames_of(&mut h, graph("Zoom In", 0xD02020));
    assert_eq!(base.len(), 9);
    assert_ne!(
        frames_of(&mut h, graph("Pan Left", 0xD02020)),
        base,
        "the camera motion reaches the model"
    );
    assert_ne!(
        frames_of(&mut h, graph("Zoom In", 0x2020D0)),
        base,
        "the start image reaches the model"
    );
    // An embedding made for another size than the video's is refused, naming what the model reads.
    let mut other = graph("Zoom In", 0xD02020);
    other["60"]["inputs"]["width"] = json!(64);
    other["62"]["inputs"]["width"] = json!(32);
    let ran = h.run(other);
    assert!(
        format!("{:?}", ran.summary.outcome).contains("camera embedding of"),
        "{:?}",
        ran.summary.outcome
    );
}

#[test]
fn issue_24_wan_vace_follows_its_control_video_and_reference_and_trims_the_reference() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_wan(&models);
    let unet = "wan2.1_vace_14B_fp16.safetensors";
    synth::write_family(
        &models.join("diffusion_models").join(unet),
        SynthFamily::Wan(WanFile::Vace14b),
        &ZImageTurboSet::tiny(),
        SynthDtype::F16,
        14,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    // `video_wan_vace_14B_ref2v`'s wiring: WanVaceToVideo's prompts and latent into the sampler, the sampled
    // latent trimmed of the reference frame before the decode.
    let graph = |control: u32, reference: Option<u32>| {
        let mut graph = text_to_video(unet, "wan_2.1_vae.safetensors", 9);
        graph["52"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 5, "color": control}});
        graph["54"] = json!({"class_type": "WanVaceToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 9,
            "batch_size": 1, "strength": 1.0, "control_video": ["52", 0]}});
        if let Some(colour) = reference {
            graph["55"] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 32, "batch_size": 1, "color": colour}});
            graph["54"]["inputs"]["reference_image"] = json!(["55", 0]);
        }
        graph["3"]["inputs"]["positive"] = json!(["54", 0]);
        graph["3"]["inputs"]["negative"] = json!(["54", 1]);
        graph["3"]["inputs"]["latent_image"] = json!(["54", 2]);
        graph["56"] = json!({"class_type": "TrimVideoLatent", "inputs": {"samples": ["3", 0], "trim_amount": ["54", 3]}});
        graph["8"]["inputs"]["samples"] = json!(["56", 0]);
        graph
    };
    let grey = frames_of(&mut h, graph(0x808080, None));
    assert_eq!(grey.len(), 9);
    assert_ne!(
        frames_of(&mut h, graph(0x20D020, None)),
        grey,
        "the control video reaches the model"
    );
    let red = frames_of(&mut h, graph(0x808080, Some(0xD02020)));
    // The reference frame is sampled with the video and trimmed after: 9 frames still.
    assert_eq!(red.len(), 9);
    assert_ne!(
        red,
        frames_of(&mut h, graph(0x808080, Some(0x2020D0))),
        "the reference reaches the model"
    );
}

/// `video_causal_forcing_i2v`'s graph at 32×32 and 9 frames (3 latent frames), 2 steps: `ARVideoI2V` with a start
/// image of `colour`, the `ar_video` sampler at `frames_per_block` under a CFGGuider at `cfg`, on `unet`.
fn causal_forcing(unet: &str, colour: u32, frames_per_block: u64, cfg: f64) -> Value {
    json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a girl rides a white wolf", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["38", 0]}},
        "52": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": colour}},
        "54": {"class_type": "ARVideoI2V", "inputs": {"model": ["37", 0], "vae": ["39", 0], "start_image": ["52", 0], "width": 32, "height": 32, "length": 9, "batch_size": 1}},
        "60": {"class_type": "SamplerARVideo", "inputs": {"num_frame_per_block": frames_per_block}},
        "61": {"class_type": "RandomNoise", "inputs": {"noise_seed": 5}},
        "62": {"class_type": "BasicScheduler", "inputs": {"model": ["54", 0], "scheduler": "simple", "steps": 2, "denoise": 1.0}},
        "63": {"class_type": "CFGGuider", "inputs": {"model": ["54", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": cfg}},
        "3": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["61", 0], "guider": ["63", 0], "sampler": ["60", 0], "sigmas": ["62", 0], "latent_image": ["54", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "causal", "images": ["8", 0]}},
    })
}

#[test]
fn issue_24_causal_forcing_runs_block_by_block_after_its_start_image() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_wan(&h.roots.input.join("models"));
    let causal = "causal_forcing-framewise.safetensors";
    let red = frames_of(&mut h, causal_forcing(causal, 0xD02020, 1, 1.0));
    assert_eq!(red.len(), 9);
    // The start image is the clip's first latent frame, and every block after attends to it.
    let blue = frames_of(&mut h, causal_forcing(causal, 0x2020D0, 1, 1.0));
    assert_ne!(red[0], blue[0]);
    assert_ne!(red[8], blue[8], "the last block follows the start image");
    // Two frames a block: the start frame is the same (the VAE decodes causally), the frames after are not.
    let chunked = frames_of(&mut h, causal_forcing(causal, 0xD02020, 2, 1.0));
    assert_eq!(chunked[0], red[0]);
    assert_ne!(chunked[8], red[8]);

    // CFG other than 1 and a model that is not causal are refused, naming the problem.
    let error = |graph: Value, h: &mut Harness| format!("{:?}", h.run(graph).summary.outcome);
    let cfg = error(causal_forcing(causal, 0xD02020, 1, 3.0), &mut h);
    assert!(cfg.contains("CFG 1") && cfg.contains("cfg 3"), "{cfg}");
    let plain = error(causal_forcing("wan2.1_t2v_1.3B_fp16.safetensors", 0xD02020, 1, 1.0), &mut h);
    assert!(plain.contains("ar_video") && plain.contains("Wan T2V is not one"), "{plain}");
}

/// `video_humo`'s graph at 32×32, 9 frames, 2 uni_pc steps at CFG `cfg`: a reference image of colour `colour`
/// and `audio` (a WAV in the input folder) heard by Whisper large-v3, through HuMo 17B.
fn humo(colour: u32, audio: &str, cfg: f64) -> Value {
    let mut graph = audio_graph(
        "humo_17B_fp16.safetensors",
        "whisper_large_v3_fp16.safetensors",
        audio,
        colour,
    );
    graph["54"] = json!({"class_type": "WanHuMoImageToVideo", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 9,
        "batch_size": 1, "audio_encoder_output": ["72", 0], "ref_image": ["52", 0]}});
    graph["3"] = json!({"class_type": "KSampler", "inputs": {"seed": 7, "steps": 2, "cfg": cfg, "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1.0, "model": ["48", 0], "positive": ["54", 0], "negative": ["54", 1], "latent_image": ["54", 2]}});
    graph["8"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}});
    graph["9"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "humo", "images": ["8", 0]}});
    graph
}

/// The nodes the audio-driven Wan templates start with: `unet` (shift 8), umT5, the Wan 2.1 VAE, a prompt and the
/// stock negative, an image of colour `colour` (node 52), and `audio` (a WAV in the input folder) through
/// `encoder` (node 72).
fn audio_graph(unet: &str, encoder: &str, audio: &str, colour: u32) -> Value {
    json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8.0, "model": ["37", 0]}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a person talking to the camera", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["38", 0]}},
        "52": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": colour}},
        "70": {"class_type": "LoadAudio", "inputs": {"audio": audio}},
        "71": {"class_type": "AudioEncoderLoader", "inputs": {"audio_encoder_name": encoder}},
        "72": {"class_type": "AudioEncoderEncode", "inputs": {"audio_encoder": ["71", 0], "audio": ["70", 0]}},
    })
}

#[test]
fn issue_24_humo_follows_its_reference_image_and_the_audio_whisper_heard() {
    // The classic cache keeps each clip's Whisper states between the runs.
    let mut h = Harness::new(CachePolicy::Classic);
    write_tiny_wan(&h.roots.input.join("models"));
    // One second of two tones at 24 kHz (resampled to Whisper's 16 kHz).
    let tone = |step: f32| -> Vec<i16> {
        (0..24000).map(|i| ((i as f32 * step).sin() * 12000.0) as i16).collect()
    };
    std::fs::write(h.roots.input.join("low.wav"), crate::audio::wav(&tone(0.05), 24000))
        .expect("write");
    std::fs::write(h.roots.input.join("high.wav"), crate::audio::wav(&tone(0.4), 24000))
        .expect("write");
    let red_low = frames_of(&mut h, humo(0xD02020, "low.wav", 4.0));
    assert_eq!(red_low.len(), 9);
    let blue_low = frames_of(&mut h, humo(0x2020D0, "low.wav", 4.0));
    assert_ne!(red_low, blue_low, "the reference image changes the clip");
    let red_high = frames_of(&mut h, humo(0xD02020, "high.wav", 4.0));
    assert_ne!(red_low, red_high, "the audio changes the clip");
    // At CFG 1 only the positive prompt (with the audio) is evaluated; the clip still follows the audio.
    let once = frames_of(&mut h, humo(0xD02020, "low.wav", 1.0));
    assert_ne!(once, frames_of(&mut h, humo(0xD02020, "high.wav", 1.0)));
}

/// `video_wan2_1_infinitetalk`'s base stage at 32×32, 5 frames, 2 euler steps at CFG 1 (its lightx2v LoRA left
/// out): a start image of colour `colour` and `audio` (a WAV in the input folder) heard by the base wav2vec2,
/// through InfiniteTalk's patch on Wan 2.1 I2V 14B. With `second`, two speakers: that WAV after the first, the
/// first speaker on the left half, the second on the right.
fn infinite_talk(colour: u32, audio: &str, second: Option<&str>) -> Value {
    let unet = "wan2.1_i2v_480p_14B_fp16.safetensors";
    let mut graph = audio_graph(unet, "wav2vec2-chinese-base_fp16.safetensors", audio, colour);
    graph["7"] = json!({"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["6", 0]}});
    graph["73"] = json!({"class_type": "ModelPatchLoader", "inputs": {"name": "wan2.1_infiniteTalk_multi_fp16.safetensors"}});
    graph["54"] = json!({"class_type": "WanInfiniteTalkToVideo", "inputs": {
        "mode": "single_speaker", "model": ["48", 0], "model_patch": ["73", 0], "positive": ["6", 0],
        "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 5,
        "start_image": ["52", 0], "audio_encoder_output_1": ["72", 0], "motion_frame_count": 1,
        "audio_scale": 1.0}});
    graph["3"] = json!({"class_type": "KSampler", "inputs": {"seed": 7, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0, "model": ["54", 0], "positive": ["54", 1], "negative": ["54", 2], "latent_image": ["54", 3]}});
    graph["8"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}});
    graph["9"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "talk", "images": ["8", 0]}});
    if let Some(second) = second {
        graph["80"] = json!({"class_type": "LoadAudio", "inputs": {"audio": second}});
        graph["81"] = json!({"class_type": "AudioEncoderEncode", "inputs": {"audio_encoder": ["71", 0], "audio": ["80", 0]}});
        graph["82"] =
            json!({"class_type": "SolidMask", "inputs": {"value": 0.0, "width": 32, "height": 32}});
        graph["83"] =
            json!({"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 16, "height": 32}});
        graph["84"] = json!({"class_type": "MaskComposite", "inputs": {"destination": ["82", 0], "source": ["83", 0], "x": 0, "y": 0, "operation": "add"}});
        graph["85"] = json!({"class_type": "MaskComposite", "inputs": {"destination": ["82", 0], "source": ["83", 0], "x": 16, "y": 0, "operation": "add"}});
        let talk = graph["54"]["inputs"].as_object_mut().expect("inputs");
        talk.insert("mode".into(), json!("two_speakers"));
        talk.insert("mode.audio_encoder_output_2".into(), json!(["81", 0]));
        talk.insert("mode.mask_1".into(), json!(["84", 0]));
        talk.insert("mode.mask_2".into(), json!(["85", 0]));
    }
    graph
}

#[test]
fn issue_24_infinite_talk_follows_the_speakers_audio_and_continues_a_clip() {
    // The classic cache keeps each clip's wav2vec2 states between the runs.
    let mut h = Harness::new(CachePolicy::Classic);
    write_tiny_wan(&h.roots.input.join("models"));
    write_tones(&h);
    let low = frames_of(&mut h, infinite_talk(0xD02020, "low.wav", None));
    assert_eq!(low.len(), 5);
    assert_ne!(
        low,
        frames_of(&mut h, infinite_talk(0xD02020, "high.wav", None)),
        "the audio moves the clip"
    );
    assert_ne!(
        low,
        frames_of(&mut h, infinite_talk(0x2020D0, "low.wav", None)),
        "so does the start image"
    );
    let two = frames_of(&mut h, infinite_talk(0xD02020, "low.wav", Some("high.wav")));
    assert_eq!(two.len(), 5);
    assert_ne!(two, low, "a second speaker is heard");

    // Continuing: the next clip reads the last frame of this one as its motion frame (and the audio from
    // there), keeps it as its first latent frame, and says how many frames to trim.
    let mut graph = infinite_talk(0xD02020, "low.wav", None);
    graph["55"] = graph["54"].clone();
    graph["55"]["inputs"]["previous_frames"] = json!(["8", 0]);
    graph["55"]["inputs"]["model"] = json!(["48", 0]);
    graph["56"] = json!({"class_type": "KSampler", "inputs": {"seed": 8, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0, "model": ["55", 0], "positive": ["55", 1], "negative": ["55", 2], "latent_image": ["55", 3]}});
    graph["57"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["56", 0], "vae": ["39", 0]}});
    graph["58"] = json!({"class_type": "PreviewAny", "inputs": {"source": ["55", 4]}});
    graph["9"]["inputs"]["images"] = json!(["57", 0]);
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    assert_eq!(ran.summary.outputs[&NodeId::from("58")].text, ["1"]);
    assert_eq!(ran.summary.outputs[&NodeId::from("9")].images.len(), 5);

    // Bad combinations are refused with ComfyUI's messages, or one naming what is missing.
    let error = |graph: Value, h: &mut Harness| format!("{:?}", h.run(graph).summary.outcome);
    let mut no_masks = infinite_talk(0xD02020, "low.wav", Some("high.wav"));
    let talk = no_masks["54"]["inputs"].as_object_mut().expect("inputs");
    talk.remove("mode.mask_1");
    talk.remove("mode.mask_2");
    let err = error(no_masks, &mut h);
    assert!(err.contains("Masks must be provided if two audio encoder outputs are used."), "{err}");
    let mut no_start = infinite_talk(0xD02020, "low.wav", None);
    no_start["54"]["inputs"].as_object_mut().expect("inputs").remove("start_image");
    let err = error(no_start, &mut h);
    assert!(err.contains("start_image") && err.contains("previous_frames"), "{err}");
    let mut too_few = infinite_talk(0xD02020, "low.wav", None);
    too_few["54"]["inputs"]["previous_frames"] = json!(["52", 0]);
    too_few["54"]["inputs"]["motion_frame_count"] = json!(2);
    let err = error(too_few, &mut h);
    assert!(err.contains("Not enough previous frames provided."), "{err}");
}

/// `video_wan2_2_14B_s2v`'s graph at 64×64, 5 frames, 2 uni_pc steps at CFG `cfg`: a reference image of colour
/// `colour` and `audio` (a WAV in the input folder) heard by the large wav2vec2, through Wan 2.2 S2V (fp8 scaled),
/// then one `WanSoundImageToVideoExtend` piece of 5 frames joined after it: 4 latent frames, which node 9 saves
/// decoded as 13 frames.
fn s2v(colour: u32, audio: &str, cfg: f64) -> Value {
    let unet = "wan2.2_s2v_14B_fp8_scaled.safetensors";
    let mut graph = audio_graph(unet, "wav2vec2_large_english_fp16.safetensors", audio, colour);
    let sampler = |seed: u64, conditioning: &str| json!({"class_type": "KSampler", "inputs": {"seed": seed, "steps": 2, "cfg": cfg, "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1.0, "model": ["48", 0], "positive": [conditioning, 0], "negative": [conditioning, 1], "latent_image": [conditioning, 2]}});
    graph["54"] = json!({"class_type": "WanSoundImageToVideo", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 64, "height": 64, "length": 5,
        "batch_size": 1, "audio_encoder_output": ["72", 0], "ref_image": ["52", 0]}});
    graph["3"] = sampler(7, "54");
    graph["76"] = json!({"class_type": "WanSoundImageToVideoExtend", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "length": 5, "video_latent": ["3", 0],
        "audio_encoder_output": ["72", 0], "ref_image": ["52", 0]}});
    graph["77"] = sampler(8, "76");
    graph["78"] = json!({"class_type": "LatentConcat", "inputs": {"samples1": ["3", 0], "samples2": ["77", 0], "dim": "t"}});
    graph["8"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["78", 0], "vae": ["39", 0]}});
    graph["9"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "s2v", "images": ["8", 0]}});
    graph
}

#[test]
fn issue_24_s2v_follows_its_reference_image_and_the_audio_and_extends_its_clip() {
    // The classic cache keeps each clip's wav2vec2 states between the runs.
    let mut h = Harness::new(CachePolicy::Classic);
    write_tiny_wan(&h.roots.input.join("models"));
    write_tones(&h);
    let frames = |h: &mut Harness, graph: Value| frames_of_side(h, graph, 64);
    let red_low = frames(&mut h, s2v(0xD02020, "low.wav", 4.0));
    assert_eq!(red_low.len(), 13, "the clip and its extension");
    assert_ne!(
        red_low,
        frames(&mut h, s2v(0x2020D0, "low.wav", 4.0)),
        "the reference image moves the clip"
    );
    let red_high = frames(&mut h, s2v(0xD02020, "high.wav", 4.0));
    assert_ne!(red_low[..5], red_high[..5], "the audio moves the clip");
    assert_ne!(red_low[9..], red_high[9..], "and its extension");
}

/// `video_wan_animate2_distilled`'s graph at 32×32, 13 frames (a reference slot and 4 latent frames), 2 lcm
/// steps at CFG 1: the model in context windows of 3 latent frames overlapping by 1 (the template's static
/// windows with FreeNoise, the reference retained, the causal fix) with the int8 pose-branch cache; a reference
/// image of colour `reference` and a pose video of 15 frames of colour `pose`, seen by CLIP vision H; the
/// reference slot trimmed before decoding (node 9 saves the frames).
fn animate2(reference: u32, pose: u32) -> Value {
    json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan_animate_2_distill_int8_convrot.safetensors", "weight_dtype": "default"}},
        "40": {"class_type": "ContextWindowsManual", "inputs": {"model": ["37", 0], "context_length": 3, "context_overlap": 1, "context_schedule": "standard_static", "context_stride": 1, "closed_loop": false, "fuse_method": "pyramid", "dim": 2, "freenoise": true, "cond_retain_index_list": "0", "split_conds_to_windows": false, "latent_retain_index_list": "", "causal_window_fix": true}},
        "41": {"class_type": "WanAnimate2Cache", "inputs": {"model": ["40", 0], "device": "gpu", "dtype": "int8"}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 5.0, "model": ["41", 0]}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a toy figure on a rainy street", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["38", 0]}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": "a person dancing", "clip": ["38", 0]}},
        "52": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": reference}},
        "60": {"class_type": "EmptyImage", "inputs": {"width": 40, "height": 40, "batch_size": 15, "color": pose}},
        "53": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "clip_vision_h.safetensors"}},
        "51": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["53", 0], "image": ["52", 0], "crop": "none"}},
        "54": {"class_type": "WanAnimate2ToVideo", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0], "width": 32, "height": 32, "length": 13,
            "batch_size": 1, "reference_image": ["52", 0], "pose_video": ["60", 0], "clip_vision_output": ["51", 0],
            "positive_pose": ["5", 0], "video_frame_offset": 0, "pose_strength": 1.0, "pose_start_percent": 0.0,
            "pose_end_percent": 1.0, "reference_image_strength": 1.0}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 7, "steps": 2, "cfg": 1.0, "sampler_name": "lcm", "scheduler": "simple", "denoise": 1.0, "model": ["48", 0], "positive": ["54", 0], "negative": ["54", 1], "latent_image": ["54", 2]}},
        "10": {"class_type": "TrimVideoLatent", "inputs": {"samples": ["3", 0], "trim_amount": ["54", 3]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["39", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "animate", "images": ["8", 0]}},
    })
}

#[test]
fn issue_24_wan_animate2_follows_its_reference_and_pose_video_in_windows_and_continues() {
    let mut h = Harness::new(CachePolicy::Classic);
    write_tiny_wan(&h.roots.input.join("models"));
    let red = frames_of(&mut h, animate2(0xD02020, 0x20D020));
    assert_eq!(red.len(), 13, "the reference slot trimmed");
    assert_ne!(
        red,
        frames_of(&mut h, animate2(0x2020D0, 0x20D020)),
        "the reference image moves the clip"
    );
    assert_ne!(red, frames_of(&mut h, animate2(0xD02020, 0xF0F0F0)), "so does the pose video");
    let mut unwindowed = animate2(0xD02020, 0x20D020);
    unwindowed["41"]["inputs"]["model"] = json!(["37", 0]);
    assert_ne!(red, frames_of(&mut h, unwindowed), "the windows (and FreeNoise) change the clip");
    // WanContextWindowsManual counts pixel frames: 9 frames overlapping by 4 are the 3 latent frames
    // overlapping by 1 above, the first frame's conditioning retained.
    let mut wan_windows = animate2(0xD02020, 0x20D020);
    wan_windows["40"] = json!({"class_type": "WanContextWindowsManual", "inputs": {"model": ["37", 0], "context_length": 9, "context_overlap": 4, "context_schedule": "standard_static", "context_stride": 1, "closed_loop": false, "fuse_method": "pyramid", "freenoise": true, "retain_first_frame": true, "split_conds_to_windows": false}});
    assert_eq!(red, frames_of(&mut h, wan_windows), "the same windows in pixel frames");

    // Continuing: the next clip starts from the last frame, reads the pose video from where the first left
    // off (less the overlapping frame), and says to trim that frame.
    let mut graph = animate2(0xD02020, 0x20D020);
    graph["55"] = graph["54"].clone();
    graph["55"]["inputs"]["continue_motion"] = json!(["8", 0]);
    graph["55"]["inputs"]["video_frame_offset"] = json!(["54", 5]);
    graph["56"] = json!({"class_type": "KSampler", "inputs": {"seed": 8, "steps": 2, "cfg": 1.0, "sampler_name": "lcm", "scheduler": "simple", "denoise": 1.0, "model": ["48", 0], "positive": ["55", 0], "negative": ["55", 1], "latent_image": ["55", 2]}});
    graph["57"] = json!({"class_type": "TrimVideoLatent", "inputs": {"samples": ["56", 0], "trim_amount": ["55", 3]}});
    graph["58"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["57", 0], "vae": ["39", 0]}});
    graph["9"]["inputs"]["images"] = json!(["58", 0]);
    graph["59"] = json!({"class_type": "PreviewAny", "inputs": {"source": ["55", 4]}});
    graph["61"] = json!({"class_type": "PreviewAny", "inputs": {"source": ["55", 5]}});
    let ran = h.run(graph.clone());
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    assert_eq!(ran.summary.outputs[&NodeId::from("59")].text, ["1"], "trim_image");
    assert_eq!(
        ran.summary.outputs[&NodeId::from("61")].text,
        ["25"],
        "video_frame_offset: 13 − 1 + 13"
    );
    assert_eq!(ran.summary.outputs[&NodeId::from("9")].images.len(), 13);

    // A pose video with nothing left to read is refused with ComfyUI's message.
    graph["55"]["inputs"]["video_frame_offset"] = json!(40);
    graph["55"]["inputs"].as_object_mut().expect("inputs").remove("continue_motion");
    let outcome = format!("{:?}", h.run(graph).summary.outcome);
    assert!(outcome.contains("pose_video has 15 frames but video_frame_offset is 40"), "{outcome}");
}

/// One second of a low and a high tone at 16 kHz in the input folder, `low.wav` and `high.wav`.
fn write_tones(h: &Harness) {
    let tone = |step: f32| -> Vec<i16> {
        (0..16000).map(|i| ((i as f32 * step).sin() * 12000.0) as i16).collect()
    };
    for (name, step) in [("low.wav", 0.05), ("high.wav", 0.4)] {
        std::fs::write(h.roots.input.join(name), crate::audio::wav(&tone(step), 16000))
            .expect("write");
    }
}
