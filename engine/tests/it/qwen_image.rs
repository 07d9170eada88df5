//! Qwen-Image's nodes on tiny random-weight files of its three families (`kiln_models::synth`), through the
//! executor on the CPU.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::json;

use crate::harness::Harness;

/// Qwen-Image's text-to-image graph as its template wires it, on tiny files of the three families: the
/// Qwen2.5-VL encoder (any `CLIPLoader` type), the MMDiT under `ModelSamplingAuraFlow`, CFG with a negative
/// prompt of another length, and the Wan 2.1 VAE.
#[test]
fn issue_23_qwen_image_text_to_image_runs_on_tiny_files() {
    let mut h = Harness::new(CachePolicy::Classic);
    let models = h.roots.input.join("models");
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
    let ran = h.run(json!({
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["38", 0]}},
        "58": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 40, "height": 24, "batch_size": 1}},
        "66": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3.1, "model": ["37", 0]}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 2, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["66", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["58", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
        "60": {"class_type": "SaveImage", "inputs": {"filename_prefix": "qwen", "images": ["8", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("60")];
    let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
    assert_eq!((image.width(), image.height()), (40, 24));
    let pixels = image.to_rgb8().into_raw();
    assert!(pixels.iter().any(|&p| p != pixels[0]), "the image is not one flat colour");
}
