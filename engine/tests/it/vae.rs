//! The VAE nodes with each autoencoder family Kiln runs, on tiny random-weight files from `kiln_models::synth`:
//! a file is detected by its tensors whatever its name, and an image goes through `VAEEncode` and `VAEDecode`.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::VaeFamily;
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::json;

use crate::harness::Harness;

#[test]
fn issue_23_every_vae_family_encodes_and_decodes_an_image_through_the_nodes() {
    for family in VaeFamily::ALL {
        let mut h = Harness::new(CachePolicy::Classic);
        let path = h.roots.input.join(format!("models/vae/{}.safetensors", family.synth_name()));
        let set = ZImageTurboSet::tiny();
        synth::write_family(
            &path,
            SynthFamily::Vae(family),
            &set,
            SynthDtype::F32,
            5,
            &mut |_, _| {},
        )
        .expect("a tiny VAE");
        let vae_name = format!("{}.safetensors", family.synth_name());
        let ran = h.run(json!({
            "1": {"class_type": "VAELoader", "inputs": {"vae_name": vae_name}},
            "2": {"class_type": "EmptyImage", "inputs": {"width": 36, "height": 28, "batch_size": 2, "color": 0x336699}},
            "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
            "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
            "5": {"class_type": "SaveImage", "inputs": {"filename_prefix": "vae", "images": ["4", 0]}},
        }));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{family:?}: {:?}", ran.summary.outcome);
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("5")];
        // A video VAE (Wan's, HunyuanVideo 1.5's) encodes the batch as one clip, as ComfyUI does: 2 frames are 1 latent frame.
        let images = match family {
            VaeFamily::Flux | VaeFamily::Flux2 | VaeFamily::MageFlow | VaeFamily::PixelSpace => 2,
            VaeFamily::Wan21
            | VaeFamily::Wan22
            | VaeFamily::HunyuanVideo15
            | VaeFamily::HunyuanVideo => 1,
        };
        assert_eq!(
            ui.images.len(),
            images,
            "{family:?}: one image per input image (per clip frame)"
        );
        let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
        // 36×28 is cropped to multiples of the downscale before encoding (32×24 at 8×, FLUX.2's 32×16 at 16×),
        // then down and up again.
        let down = family.latent().spatial_downscale as u32;
        assert_eq!(
            (image.width(), image.height()),
            (36 / down * down, 28 / down * down),
            "{family:?}"
        );
    }
}

#[test]
fn pixel_space_vae_returns_the_pixels_it_was_given() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": "pixel_space"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 36, "height": 28, "batch_size": 2, "color": 0x336699}},
        "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
        "5": {"class_type": "SaveImage", "inputs": {"filename_prefix": "pixels", "images": ["4", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("5")];
    assert_eq!(ui.images.len(), 2);
    let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG").to_rgb8();
    // No crop (a downscale of 1) and the colour as it went in, up to SaveImage's truncation of 255·v after the
    // round trip through [−1, 1] in f32 (ComfyUI's too).
    assert_eq!(image.dimensions(), (36, 28));
    let near = |p: &image::Rgb<u8>| {
        p.0.iter().zip([0x33u8, 0x66, 0x99]).all(|(&got, want)| got.abs_diff(want) <= 1)
    };
    assert!(image.pixels().all(near), "{:?}", image.get_pixel(0, 0));
}
