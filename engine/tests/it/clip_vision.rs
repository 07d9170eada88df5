//! FLUX.1 Redux (`flux_redux_model_example`): CLIPVisionLoader → CLIPVisionEncode → StyleModelApply into a
//! FLUX.1 sampler, on tiny random-weight files of the families (`kiln_models::synth`) named as the template names
//! them, through the executor on the CPU.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{self, ClipVisionFile, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::{Value, json};

use crate::harness::Harness;

/// Writes the tiny FLUX.1 dev files, both vision towers and Redux under `models`, and two reference images
/// under `input`.
fn write_files(h: &Harness) {
    let models = h.roots.input.join("models");
    let set = ZImageTurboSet::tiny();
    for (family, path, dtype) in [
        (
            SynthFamily::Diffusion(DiffusionFamily::Flux),
            "diffusion_models/flux1-dev.safetensors",
            SynthDtype::Bf16,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::ClipL),
            "text_encoders/clip_l.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl),
            "text_encoders/t5xxl_fp16.safetensors",
            SynthDtype::F16,
        ),
        (SynthFamily::Vae(VaeFamily::Flux), "vae/ae.safetensors", SynthDtype::F32),
        (
            SynthFamily::ClipVision(ClipVisionFile::Siglip384),
            "clip_vision/sigclip_vision_patch14_384.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::ClipVision(ClipVisionFile::H),
            "clip_vision/clip_vision_h.safetensors",
            SynthDtype::F16,
        ),
        (SynthFamily::FluxRedux, "style_models/flux1-redux-dev.safetensors", SynthDtype::Bf16),
    ] {
        synth::write_family(&models.join(path), family, &set, dtype, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
    let gradient = image::RgbImage::from_fn(60, 40, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 6) as u8, ((x * y) % 251) as u8])
    });
    gradient.save(h.roots.input.join("reference_1.png")).expect("a PNG");
    let stripes = image::RgbImage::from_fn(40, 52, |x, y| {
        image::Rgb([if (x / 5) % 2 == 0 { 230 } else { 20 }, (y * 4) as u8, 128])
    });
    stripes.save(h.roots.input.join("reference_2.png")).expect("a PNG");
}

/// The template's graph at a tiny size: the prompt through CLIPTextEncode and FluxGuidance, then (with
/// `redux`: the reference image, crop, strength and strength type) the Redux tokens appended; KSampler, cfg 1.
fn graph(redux: Option<(&str, &str, f64, &str)>) -> Value {
    let mut graph = json!({
        "12": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux1-dev.safetensors", "weight_dtype": "default"}},
        "11": {"class_type": "DualCLIPLoader", "inputs": {"clip_name1": "t5xxl_fp16.safetensors", "clip_name2": "clip_l.safetensors", "type": "flux", "device": "default"}},
        "10": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a girl walking in the wilderness", "clip": ["11", 0]}},
        "26": {"class_type": "FluxGuidance", "inputs": {"conditioning": ["6", 0], "guidance": 3.5}},
        "27": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 48, "height": 32, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["12", 0], "positive": ["26", 0], "negative": ["26", 0], "latent_image": ["27", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["10", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "redux", "images": ["8", 0]}},
    });
    if let Some((image, crop, strength, kind)) = redux {
        graph["38"] = json!({"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "sigclip_vision_patch14_384.safetensors"}});
        graph["40"] = json!({"class_type": "LoadImage", "inputs": {"image": image}});
        graph["39"] = json!({"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["38", 0], "image": ["40", 0], "crop": crop}});
        graph["42"] = json!({"class_type": "StyleModelLoader", "inputs": {"style_model_name": "flux1-redux-dev.safetensors"}});
        graph["41"] = json!({"class_type": "StyleModelApply", "inputs": {"conditioning": ["26", 0], "style_model": ["42", 0], "clip_vision_output": ["39", 0], "strength": strength, "strength_type": kind}});
        graph["3"]["inputs"]["positive"] = json!(["41", 0]);
    }
    graph
}

/// Runs `graph` and returns the saved image's pixels.
fn pixels(h: &mut Harness, graph: Value) -> Vec<u8> {
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("9")];
    let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
    assert_eq!((image.width(), image.height()), (48, 32));
    image.to_rgb8().into_raw()
}

/// The failure message of a graph that must fail.
fn failure(h: &mut Harness, graph: Value) -> String {
    let ran = h.run(graph);
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    format!("{failure:?}")
}

#[test]
fn flux_redux_steers_the_image_with_the_reference() {
    let mut h = Harness::new(CachePolicy::None);
    write_files(&h);
    let plain = pixels(&mut h, graph(None));
    let redux = pixels(&mut h, graph(Some(("reference_1.png", "center", 1.0, "multiply"))));
    assert_ne!(plain, redux, "the Redux tokens reach the DiT");
    let other = pixels(&mut h, graph(Some(("reference_2.png", "center", 1.0, "multiply"))));
    assert_ne!(redux, other, "another reference image, another image");
    let uncropped = pixels(&mut h, graph(Some(("reference_1.png", "none", 1.0, "multiply"))));
    assert_ne!(redux, uncropped, "the crop changes what the tower sees");
    let weaker = pixels(&mut h, graph(Some(("reference_1.png", "center", 0.3, "multiply"))));
    assert_ne!(redux, weaker, "the strength scales the tokens");
    // attn_bias at strength 1 appends the tokens unscaled, as multiply by 1 does.
    let bias = pixels(&mut h, graph(Some(("reference_1.png", "center", 1.0, "attn_bias"))));
    assert_eq!(redux, bias);
}

#[test]
fn what_kiln_cannot_apply_is_refused_naming_it() {
    let mut h = Harness::new(CachePolicy::None);
    write_files(&h);
    // attn_bias at another strength needs an attention mask.
    let message = failure(&mut h, graph(Some(("reference_1.png", "center", 0.5, "attn_bias"))));
    assert!(message.contains("attention mask"), "{message}");
    // A style model is not a vision tower, nor a tower a style model.
    let mut swapped = graph(Some(("reference_1.png", "center", 1.0, "multiply")));
    std::fs::copy(
        h.roots.input.join("models/style_models/flux1-redux-dev.safetensors"),
        h.roots.input.join("models/clip_vision/redux.safetensors"),
    )
    .expect("a copy");
    swapped["38"]["inputs"]["clip_name"] = json!("redux.safetensors");
    let message = failure(&mut h, swapped);
    assert!(message.contains("not a CLIP vision model"), "{message}");
    // ViT-H's output runs through the tiny Redux too (both 64 wide), so the chain itself works with it.
    let mut vit_h = graph(Some(("reference_2.png", "center", 1.0, "multiply")));
    vit_h["38"]["inputs"]["clip_name"] = json!("clip_vision_h.safetensors");
    let _ = pixels(&mut h, vit_h);
}

/// FLUX.1 USO (`flux1_dev_uso_reference_image_gen`): USOStyleReference puts the projector's style tokens, made
/// of SigLIP's hidden states of the style image, before the prompt; another style image gives another image, and
/// a CLIP vision output without SigLIP's layers (ViT-H's) or a patch other than USO's is refused by name.
#[test]
fn flux_uso_steers_the_image_with_the_style_image() {
    let mut h = Harness::new(CachePolicy::None);
    write_files(&h);
    synth::write_family(
        &h.roots.input.join("models/model_patches/uso-flux1-projector-v1.safetensors"),
        SynthFamily::FluxUso,
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny projector");
    let uso = |image: &str, tower: &str| {
        let mut graph = graph(None);
        graph["38"] = json!({"class_type": "CLIPVisionLoader", "inputs": {"clip_name": tower}});
        graph["40"] = json!({"class_type": "LoadImage", "inputs": {"image": image}});
        graph["39"] = json!({"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["38", 0], "image": ["40", 0], "crop": "center"}});
        graph["43"] = json!({"class_type": "ModelPatchLoader", "inputs": {"name": "uso-flux1-projector-v1.safetensors"}});
        graph["44"] = json!({"class_type": "USOStyleReference", "inputs": {"model": ["12", 0], "model_patch": ["43", 0], "clip_vision_output": ["39", 0]}});
        graph["3"]["inputs"]["model"] = json!(["44", 0]);
        graph
    };
    let siglip = "sigclip_vision_patch14_384.safetensors";
    let plain = pixels(&mut h, graph(None));
    let first = pixels(&mut h, uso("reference_1.png", siglip));
    let second = pixels(&mut h, uso("reference_2.png", siglip));
    assert_ne!(plain, first, "the style tokens reach the model");
    assert_ne!(first, second, "the style image's content matters");
    let refused = failure(&mut h, uso("reference_1.png", "clip_vision_h.safetensors"));
    assert!(refused.contains("USO reads a SigLIP tower"), "{refused}");
}
