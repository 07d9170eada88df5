//! Qwen-Image's nodes on tiny random-weight files of its three families (`kiln_models::synth`), through the
//! executor on the CPU.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{
    self, ControlNetFile, LayeredFile, SynthDtype, SynthFamily, ZImageTurboSet,
};
use serde_json::json;

use crate::harness::Harness;

/// Qwen-Image's text-to-image graph as its template wires it, on tiny files of the three families: the
/// Qwen2.5-VL encoder (any `CLIPLoader` type), the MMDiT under `ModelSamplingAuraFlow`, CFG with a negative
/// prompt of another length (both prompts in one call), and the Wan 2.1 VAE; one latent and a batch of two.
#[test]
fn issue_23_qwen_image_text_to_image_runs_on_tiny_files() {
    let mut h = Harness::new(CachePolicy::Classic);
    write_tiny_qwen_image(&h.roots.input.join("models"));
    for batch in [1, 2] {
        let ran = h.run(json!({
            "37": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
            "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
            "39": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
            "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk", "clip": ["38", 0]}},
            "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["38", 0]}},
            "58": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 40, "height": 24, "batch_size": batch}},
            "66": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3.1, "model": ["37", 0]}},
            "3": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["66", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["58", 0]}},
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
            "60": {"class_type": "SaveImage", "inputs": {"filename_prefix": "qwen", "images": ["8", 0]}},
        }));
        assert_eq!(
            ran.summary.outcome,
            Outcome::Success,
            "batch {batch}: {:?}",
            ran.summary.outcome
        );
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("60")];
        assert_eq!(ui.images.len(), batch, "batch {batch}");
        for saved in &ui.images {
            let image = image::open(h.roots.output.join(&saved.filename)).expect("a PNG");
            assert_eq!((image.width(), image.height()), (40, 24));
            let pixels = image.to_rgb8().into_raw();
            assert!(pixels.iter().any(|&p| p != pixels[0]), "the image is not one flat colour");
        }
    }
}

/// Writes the tiny Qwen-Image files (MMDiT, Qwen2.5-VL with its vision tower, Wan 2.1 VAE) under `models`,
/// named as the templates name them.
fn write_tiny_qwen_image(models: &std::path::Path) {
    let set = ZImageTurboSet::tiny();
    for (family, path) in [
        (
            SynthFamily::Diffusion(DiffusionFamily::QwenImage),
            "diffusion_models/qwen_image_fp8_e4m3fn.safetensors",
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::Qwen25Vl),
            "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
        ),
        (SynthFamily::Vae(VaeFamily::Wan21), "vae/qwen_image_vae.safetensors"),
    ] {
        let dtype =
            if matches!(family, SynthFamily::Vae(_)) { SynthDtype::F32 } else { SynthDtype::Bf16 };
        synth::write_family(&models.join(path), family, &set, dtype, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
}

/// Qwen-Image Edit Plus as its templates wire it: two pictures (of other sizes than the output) go to the
/// encoder's vision tower and, VAE-encoded, to the MMDiT as reference latents; the negative prompt has none.
/// The pictures steer the result: another second picture gives another image.
#[test]
fn issue_23_qwen_image_edit_plus_reads_its_pictures() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_qwen_image(&h.roots.input.join("models"));
    let mut run = |second_colour: i64| {
        let ran = h.run(json!({
            "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
            "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
            "3": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
            "4": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 32, "batch_size": 1, "color": 0x3366cc}},
            "5": {"class_type": "EmptyImage", "inputs": {"width": 24, "height": 40, "batch_size": 1, "color": second_colour}},
            "6": {"class_type": "TextEncodeQwenImageEditPlus", "inputs": {"clip": ["2", 0], "prompt": "put the blue one on the left", "vae": ["3", 0], "image1": ["4", 0], "image2": ["5", 0]}},
            "7": {"class_type": "TextEncodeQwenImageEditPlus", "inputs": {"clip": ["2", 0], "prompt": ""}},
            "8": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 24, "batch_size": 1}},
            "9": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["1", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["8", 0]}},
            "10": {"class_type": "VAEDecode", "inputs": {"samples": ["9", 0], "vae": ["3", 0]}},
            "11": {"class_type": "SaveImage", "inputs": {"filename_prefix": "edit", "images": ["10", 0]}},
        }));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("11")];
        let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
        assert_eq!((image.width(), image.height()), (32, 24));
        image.to_rgb8().into_raw()
    };
    assert_ne!(run(0xcc3333), run(0x33cc33), "the second picture changes the result");
}

/// `TextEncodeQwenImageEdit` with Z-Image's Qwen3 encoder fails naming what it needs, before any sampling.
#[test]
fn issue_23_qwen_image_edit_refuses_an_encoder_without_vision() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    let set = ZImageTurboSet::tiny();
    synth::write_family(
        &models.join("text_encoders/qwen_3_4b.safetensors"),
        SynthFamily::TextEncoder(TextEncoderFamily::Qwen3),
        &set,
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let ran = h.run(json!({
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2", "device": "default"}},
        "4": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 32, "batch_size": 1, "color": 0}},
        "6": {"class_type": "TextEncodeQwenImageEdit", "inputs": {"clip": ["2", 0], "prompt": "make it red", "image": ["4", 0]}},
        "7": {"class_type": "PreviewAny", "inputs": {"source": ["6", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    assert_eq!(failure.class_type, "TextEncodeQwenImageEdit");
    assert!(failure.message.contains("Qwen2.5-VL"), "{}", failure.message);
}

/// `VAEEncodeTiled` and `VAEDecodeTiled` on both VAE families (Qwen-Image's Wan 2.1, Z-Image's Flux): with a
/// tile larger than the image they give the plain nodes' result; with small overlapping tiles an image of the
/// same size. (The tiling itself is checked against ComfyUI's in the engine's unit tests.)
#[test]
fn issue_23_tiled_vae_nodes_match_the_plain_ones_on_one_tile() {
    let mut h = Harness::new(CachePolicy::Classic);
    let models = h.roots.input.join("models");
    let set = ZImageTurboSet::tiny();
    for (family, path) in [
        (SynthFamily::Vae(VaeFamily::Wan21), "vae/qwen_image_vae.safetensors"),
        (SynthFamily::Vae(VaeFamily::Flux), "vae/ae.safetensors"),
    ] {
        synth::write_family(&models.join(path), family, &set, SynthDtype::F32, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
    let gradient = image::RgbImage::from_fn(80, 56, |x, y| {
        image::Rgb([(x * 3) as u8, (y * 4) as u8, ((x * y) % 251) as u8])
    });
    gradient.save(h.roots.input.join("gradient.png")).expect("a PNG");
    for vae in ["qwen_image_vae.safetensors", "ae.safetensors"] {
        let ran = h.run(json!({
            "1": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
            "2": {"class_type": "LoadImage", "inputs": {"image": "gradient.png"}},
            "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
            "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
            "5": {"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "tile_size": 512, "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
            "6": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["5", 0], "vae": ["1", 0], "tile_size": 512, "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
            "7": {"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "tile_size": 128, "overlap": 32, "temporal_size": 64, "temporal_overlap": 8}},
            "8": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["7", 0], "vae": ["1", 0], "tile_size": 64, "overlap": 32, "temporal_size": 64, "temporal_overlap": 8}},
            "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "plain", "images": ["4", 0]}},
            "10": {"class_type": "SaveImage", "inputs": {"filename_prefix": "one_tile", "images": ["6", 0]}},
            "11": {"class_type": "SaveImage", "inputs": {"filename_prefix": "tiled", "images": ["8", 0]}},
        }));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{vae}: {:?}", ran.summary.outcome);
        let saved = |id: &str| {
            let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from(id)];
            image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG").to_rgb8()
        };
        let (plain, one_tile, tiled) = (saved("9"), saved("10"), saved("11"));
        assert_eq!(plain.dimensions(), (80, 56), "{vae}");
        assert_eq!(tiled.dimensions(), plain.dimensions(), "{vae}");
        // Three single-tile passes averaged (Flux) may differ from one pass in the last bit.
        let worst = plain.iter().zip(one_tile.iter()).map(|(a, b)| a.abs_diff(*b)).max();
        assert!(worst <= Some(1), "{vae}: one tile differs from the plain pass by {worst:?}");
    }
    // Tiles no larger than their overlap (Flux's encode halves a 64-pixel tile to 32) are refused by name.
    let ran = h.run(json!({
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "gradient.png"}},
        "3": {"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "tile_size": 64, "overlap": 32, "temporal_size": 64, "temporal_overlap": 8}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    assert!(failure.message.contains("raise tile_size"), "{}", failure.message);
}

/// Qwen-Image-Layered's image-to-layers graph as its template wires it, on tiny files: an RGB picture
/// encoded by the RGBA VAE (alpha padded opaque) as the reference, an empty latent of 2 layers + the
/// composite as frames, sampled by the layered MMDiT, the composite cut off, the layers moved to the batch and
/// decoded to RGBA images.
#[test]
fn issue_23_qwen_image_layered_decomposes_a_picture_into_rgba_layers() {
    let mut h = Harness::new(CachePolicy::Classic);
    let models = h.roots.input.join("models");
    write_tiny_qwen_image(&models);
    let set = ZImageTurboSet::tiny();
    for (family, path) in [
        (
            SynthFamily::QwenImageLayered(LayeredFile::Dit),
            "diffusion_models/qwen_image_layered_bf16.safetensors",
        ),
        (SynthFamily::QwenImageLayered(LayeredFile::Vae), "vae/qwen_image_layered_vae.safetensors"),
    ] {
        let dtype = match family {
            SynthFamily::QwenImageLayered(LayeredFile::Vae) => SynthDtype::F32,
            _ => SynthDtype::Bf16,
        };
        synth::write_family(&models.join(path), family, &set, dtype, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
    let picture =
        image::RgbImage::from_fn(40, 32, |x, y| image::Rgb([(x * 6) as u8, (y * 7) as u8, 90]));
    picture.save(h.roots.input.join("picture.png")).expect("a PNG");
    let ran = h.run(json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_layered_bf16.safetensors", "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_layered_vae.safetensors"}},
        "74": {"class_type": "LoadImage", "inputs": {"image": "picture.png"}},
        "71": {"class_type": "VAEEncode", "inputs": {"pixels": ["74", 0], "vae": ["39", 0]}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a picture", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["38", 0]}},
        "69": {"class_type": "ReferenceLatent", "inputs": {"conditioning": ["6", 0], "latent": ["71", 0]}},
        "70": {"class_type": "ReferenceLatent", "inputs": {"conditioning": ["7", 0], "latent": ["71", 0]}},
        "118": {"class_type": "EmptyQwenImageLayeredLatentImage", "inputs": {"width": 40, "height": 32, "layers": 2, "batch_size": 1}},
        "66": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 1, "model": ["37", 0]}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 3, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["66", 0], "positive": ["69", 0], "negative": ["70", 0], "latent_image": ["118", 0]}},
        "140": {"class_type": "LatentCut", "inputs": {"samples": ["3", 0], "dim": "t", "index": 1, "amount": 16384}},
        "76": {"class_type": "LatentCutToBatch", "inputs": {"samples": ["140", 0], "dim": "t", "slice_size": 1}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["76", 0], "vae": ["39", 0]}},
        "60": {"class_type": "SaveImage", "inputs": {"filename_prefix": "layers", "images": ["8", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("60")];
    assert_eq!(ui.images.len(), 2, "one image per layer");
    for saved in &ui.images {
        let layer = image::open(h.roots.output.join(&saved.filename)).expect("a PNG");
        assert_eq!(layer.color(), image::ColorType::Rgba8);
        assert_eq!((layer.width(), layer.height()), (40, 32));
    }
}

/// The ControlNet nodes as the Qwen-Image ControlNet templates wire them, on tiny files of each ControlNet
/// (InstantX's, its inpainting one, VideoX-Fun's): the control image steers the result; strength 0, or a range
/// no step falls in, gives the image without it; without a VAE the sampler fails with ComfyUI's message.
#[test]
fn issue_23_qwen_image_controlnets_steer_sampling() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_qwen_image(&models);
    let set = ZImageTurboSet::tiny();
    for (file, name) in [
        (ControlNetFile::InstantX, "instantx.safetensors"),
        (ControlNetFile::InstantXInpaint, "inpainting.safetensors"),
        (ControlNetFile::Fun, "fun.safetensors"),
    ] {
        let path = models.join("controlnet").join(name);
        let family = SynthFamily::QwenImageControlNet(file);
        synth::write_family(&path, family, &set, SynthDtype::Bf16, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
    // Text-to-image, with `apply` (a ControlNet node on ControlNet `net`) between the prompts and the sampler.
    let mut run = |net: &str, apply: Option<serde_json::Value>| -> Result<Vec<u8>, String> {
        let mut graph = json!({
            "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
            "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
            "3": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
            "4": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0x3366cc}},
            "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["2", 0]}},
            "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
            "8": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 24, "batch_size": 1}},
            "9": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["1", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["8", 0]}},
            "10": {"class_type": "VAEDecode", "inputs": {"samples": ["9", 0], "vae": ["3", 0]}},
            "11": {"class_type": "SaveImage", "inputs": {"filename_prefix": "control", "images": ["10", 0]}},
            "12": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 64, "height": 48}},
            "13": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": net}},
        });
        if let Some(apply) = apply {
            graph["20"] = apply;
            graph["9"]["inputs"]["positive"] = json!(["20", 0]);
            graph["9"]["inputs"]["negative"] = json!(["20", 1]);
        }
        let ran = h.run(graph);
        match &ran.summary.outcome {
            Outcome::Success => {}
            Outcome::Failed(f) => return Err(format!("{}: {}", f.class_type, f.message)),
            other => return Err(format!("{other:?}")),
        }
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("11")];
        let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
        Ok(image.to_rgb8().into_raw())
    };
    let advanced = |strength: f64, range: (f64, f64), vae: bool| {
        let mut inputs = json!({"positive": ["6", 0], "negative": ["7", 0], "control_net": ["13", 0], "image": ["4", 0], "strength": strength, "start_percent": range.0, "end_percent": range.1});
        if vae {
            inputs["vae"] = json!(["3", 0]);
        }
        Some(json!({"class_type": "ControlNetApplyAdvanced", "inputs": inputs}))
    };
    let plain = run("instantx.safetensors", None).expect("runs without a ControlNet");
    for net in ["instantx.safetensors", "inpainting.safetensors", "fun.safetensors"] {
        let controlled = run(net, advanced(1.0, (0.0, 1.0), true)).expect(net);
        assert_ne!(controlled, plain, "{net} steers the result");
        assert_eq!(
            run(net, advanced(0.0, (0.0, 1.0), true)).expect(net),
            plain,
            "{net} at strength 0"
        );
        // Two steps at sigmas 1 and ~0.76: a range of 0.9..1 holds neither.
        assert_eq!(
            run(net, advanced(1.0, (0.9, 1.0), true)).expect(net),
            plain,
            "{net} out of range"
        );
    }
    // Steps at σ 1 and ~0.76 with a range ending at σ ~0.88 (30 %): the first step only.
    let first = run("instantx.safetensors", advanced(1.0, (0.0, 0.3), true)).unwrap();
    let whole = run("instantx.safetensors", advanced(1.0, (0.0, 1.0), true)).unwrap();
    assert!(first != plain && first != whole, "a range covering one of two steps");
    // A ControlNet without a VAE fails only when a step is in its range, as in ComfyUI.
    assert_eq!(run("instantx.safetensors", advanced(1.0, (0.9, 1.0), false)).unwrap(), plain);
    let err = run("instantx.safetensors", advanced(1.0, (0.0, 1.0), false)).unwrap_err();
    assert!(err.starts_with("KSampler: This Controlnet needs a VAE"), "{err}");

    // The inpainting node: the image with the masked area black, and the mask, go to the inpainting
    // ControlNet (the whole image masked here), which sees something else than through the plain node.
    let inputs = json!({"positive": ["6", 0], "negative": ["7", 0], "control_net": ["13", 0], "vae": ["3", 0], "image": ["4", 0], "mask": ["12", 0], "strength": 1.0, "start_percent": 0.0, "end_percent": 1.0});
    let inpainting =
        Some(json!({"class_type": "ControlNetInpaintingAliMamaApply", "inputs": inputs}));
    let masked = run("inpainting.safetensors", inpainting).expect("the inpainting node runs");
    assert_ne!(masked, plain);
    assert_ne!(masked, run("inpainting.safetensors", advanced(1.0, (0.0, 1.0), true)).unwrap());
}

/// DiffSynth's block-wise ControlNet as `image_qwen_image_controlnet_patch` wires it (`ModelPatchLoader`,
/// `QwenImageDiffsynthControlnet` on the model), on a tiny file: the control image steers the result, strength
/// 0 gives the image without it, and a model patch without a control image (USO's projector) is refused naming
/// the node that applies it.
#[test]
fn issue_23_qwen_image_diffsynth_controlnet_patches_the_model() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_qwen_image(&models);
    let set = ZImageTurboSet::tiny();
    let path = models.join("model_patches/qwen_image_canny_diffsynth_controlnet.safetensors");
    synth::write_family(
        &path,
        SynthFamily::QwenImageBlockwise,
        &set,
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    // USO's style projector: a model patch, but not one with a control image.
    let uso = models.join("model_patches/uso-flux1-projector-v1.safetensors");
    synth::write_family(&uso, SynthFamily::FluxUso, &set, SynthDtype::Bf16, 9, &mut |_, _| {})
        .expect("a tiny projector");

    let mut run = |patch: &str, colour: i64, strength: f64| -> Result<Vec<u8>, String> {
        let ran = h.run(json!({
            "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
            "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
            "3": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
            "4": {"class_type": "EmptyImage", "inputs": {"width": 80, "height": 40, "batch_size": 1, "color": colour}},
            "5": {"class_type": "ModelPatchLoader", "inputs": {"name": patch}},
            "6": {"class_type": "QwenImageDiffsynthControlnet", "inputs": {"model": ["1", 0], "model_patch": ["5", 0], "vae": ["3", 0], "image": ["4", 0], "strength": strength}},
            "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["2", 0]}},
            "8": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
            "9": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 24, "batch_size": 1}},
            "10": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["6", 0], "positive": ["7", 0], "negative": ["8", 0], "latent_image": ["9", 0]}},
            "11": {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["3", 0]}},
            "12": {"class_type": "SaveImage", "inputs": {"filename_prefix": "patch", "images": ["11", 0]}},
        }));
        match &ran.summary.outcome {
            Outcome::Success => {}
            Outcome::Failed(f) => return Err(format!("{}: {}", f.class_type, f.message)),
            other => return Err(format!("{other:?}")),
        }
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("12")];
        let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
        Ok(image.to_rgb8().into_raw())
    };
    let patch = "qwen_image_canny_diffsynth_controlnet.safetensors";
    let (blue, red) = (run(patch, 0x3366cc, 1.0).unwrap(), run(patch, 0xcc3333, 1.0).unwrap());
    assert_ne!(blue, red, "the control image steers the result");
    assert_ne!(run(patch, 0x3366cc, 0.0).unwrap(), blue, "strength matters");
    assert_eq!(
        run(patch, 0x3366cc, 0.0).unwrap(),
        run(patch, 0xcc3333, 0.0).unwrap(),
        "at 0 no image counts"
    );
    let err = run("uso-flux1-projector-v1.safetensors", 0, 1.0).unwrap_err();
    assert!(
        err.starts_with("QwenImageDiffsynthControlnet: ")
            && err.contains("USO's style projector")
            && err.contains("USOStyleReference"),
        "{err}"
    );
}

/// A Qwen-Image latent saved by `SaveLatent` loads back with `LoadLatent` and decodes to the same picture; so
/// does the same latent in ComfyUI's own layout (a video VAE's image latent with its one frame, `[B, 16, 1,
/// h, w]`), which also samples further (img2img at denoise 0.5).
#[test]
fn issue_23_saved_latents_load_back_in_kiln_and_comfyui_layouts() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_qwen_image(&h.roots.input.join("models"));
    let loaders = json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk", "clip": ["38", 0]}},
    });
    let mut make = loaders.clone();
    make["58"] = json!({"class_type": "EmptySD3LatentImage", "inputs": {"width": 40, "height": 24, "batch_size": 1}});
    make["3"] = json!({"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["37", 0], "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["58", 0]}});
    make["70"] = json!({"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "latents/qwen"}});
    make["8"] =
        json!({"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["39", 0]}});
    make["60"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "made", "images": ["8", 0]}});
    let ran = h.run(make);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let saved = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("70")].named;
    assert_eq!(saved[0].0, "latents");
    let file = h.roots.output.join("latents").join(&saved[0].1[0].filename);
    let pixels = |h: &Harness, ran: &kiln_engine::exec::RunSummary| {
        let ui = &ran.outputs[&kiln_engine::graph::NodeId::from("60")];
        image::open(h.roots.output.join(&ui.images[0].filename))
            .expect("a PNG")
            .to_rgb8()
            .into_raw()
    };
    let made = pixels(&h, &ran.summary);

    // The file in the input folder, as is and rewritten with the frame axis ComfyUI's VAE gives an image.
    std::fs::copy(&file, h.roots.input.join("kiln.latent")).expect("copy");
    let bytes = std::fs::read(&file).expect("the latent file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let tensor = st.tensor("latent_tensor").expect("latent_tensor");
    let shape = tensor.shape().to_vec();
    assert_eq!(shape.len(), 4, "Kiln saves an image latent as [B, C, h, w]");
    let five = vec![shape[0], shape[1], 1, shape[2], shape[3]];
    let empty =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![0], &[]).unwrap();
    let data = tensor.data().to_vec();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, five, &data).unwrap();
    safetensors::serialize_to_file(
        [("latent_format_version_0", empty), ("latent_tensor", view)],
        None,
        &h.roots.input.join("comfyui.latent"),
    )
    .expect("write");
    for name in ["kiln.latent", "comfyui.latent"] {
        let mut load = loaders.clone();
        load["71"] = json!({"class_type": "LoadLatent", "inputs": {"latent": name}});
        load["8"] =
            json!({"class_type": "VAEDecode", "inputs": {"samples": ["71", 0], "vae": ["39", 0]}});
        load["60"] = json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "loaded", "images": ["8", 0]}});
        let ran = h.run(load.clone());
        assert_eq!(ran.summary.outcome, Outcome::Success, "{name}: {:?}", ran.summary.outcome);
        assert_eq!(
            pixels(&h, &ran.summary),
            made,
            "{name} decodes to the picture it was saved from"
        );
        // And samples further.
        load["3"] = json!({"class_type": "KSampler", "inputs": {"seed": 6, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 0.5, "model": ["37", 0], "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["71", 0]}});
        load["8"]["inputs"]["samples"] = json!(["3", 0]);
        let ran = h.run(load);
        assert_eq!(
            ran.summary.outcome,
            Outcome::Success,
            "{name} img2img: {:?}",
            ran.summary.outcome
        );
    }
}
