//! The VAE nodes with the Wan VAEs on clips (issue #24), on tiny random-weight files from `kiln_models::synth`:
//! a batch of images encodes as one clip (the batch is time), a latent with frames decodes to its 4T − 3
//! frames, tiled or not, and an image VAE refuses a latent with frames.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::VaeFamily;
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::json;

use crate::harness::Harness;

/// A harness with the tiny VAE of each family in `families` under `models/vae/<synth name>.safetensors`.
fn harness(families: &[VaeFamily]) -> Harness {
    let h = Harness::new(CachePolicy::Classic);
    let set = ZImageTurboSet::tiny();
    for &family in families {
        let path = h.roots.input.join(format!("models/vae/{}.safetensors", family.synth_name()));
        synth::write_family(
            &path,
            SynthFamily::Vae(family),
            &set,
            SynthDtype::F32,
            5,
            &mut |_, _| {},
        )
        .expect("a tiny VAE");
    }
    h
}

#[test]
fn issue_24_wan_vaes_encode_an_image_batch_as_a_clip_and_decode_its_frames() {
    let mut h = harness(&[VaeFamily::Wan21, VaeFamily::Wan22]);
    for (family, (h9, h5, h1)) in [
        (VaeFamily::Wan21, ("[1, 16, 3, 10, 12]", "[1, 16, 2, 10, 12]", "[1, 16, 10, 12]")),
        (VaeFamily::Wan22, ("[1, 48, 3, 5, 6]", "[1, 48, 2, 5, 6]", "[1, 48, 5, 6]")),
    ] {
        let vae = format!("{}.safetensors", family.synth_name());
        let image = |batch: usize| json!({"class_type": "EmptyImage", "inputs": {"width": 100, "height": 84, "batch_size": batch, "color": 0x336699}});
        // Frames of 100×84 are centre-cropped to 96×80; 9 frames are 3 latent frames, 5 are 2. The tiled nodes
        // tile in space (64-pixel tiles) and time (clips of 5 frames, 2 latent frames, overlapping by one).
        let ran = h.run(json!({
            "1": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
            "2": image(9),
            "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
            "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
            "5": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
            "6": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
            "7": {"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "tile_size": 64, "overlap": 32, "temporal_size": 8, "temporal_overlap": 4}},
            "8": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["3", 0], "vae": ["1", 0], "tile_size": 64, "overlap": 32, "temporal_size": 8, "temporal_overlap": 4}},
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["7", 0]}},
            "10": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
            "11": image(5),
            "12": {"class_type": "VAEEncode", "inputs": {"pixels": ["11", 0], "vae": ["1", 0]}},
            "13": {"class_type": "PreviewAny", "inputs": {"source": ["12", 0]}},
            "14": image(1),
            "15": {"class_type": "VAEEncode", "inputs": {"pixels": ["14", 0], "vae": ["1", 0]}},
            "16": {"class_type": "PreviewAny", "inputs": {"source": ["15", 0]}},
            "17": {"class_type": "VAEDecode", "inputs": {"samples": ["12", 0], "vae": ["1", 0]}},
            "18": {"class_type": "SaveImage", "inputs": {"filename_prefix": "clip", "images": ["17", 0]}},
            "19": {"class_type": "RepeatLatentBatch", "inputs": {"samples": ["12", 0], "amount": 2}},
            "20": {"class_type": "VAEDecode", "inputs": {"samples": ["19", 0], "vae": ["1", 0]}},
            "21": {"class_type": "PreviewAny", "inputs": {"source": ["20", 0]}},
        }));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{family:?}: {:?}", ran.summary.outcome);
        let tensor = |shape: &str| vec![format!("tensor{shape}")];
        assert_eq!(
            ran.text("5"),
            tensor(h9),
            "{family:?}: 9 images are one clip of 3 latent frames"
        );
        assert_eq!(
            ran.text("6"),
            tensor("[9, 80, 96, 3]"),
            "{family:?}: 3 latent frames decode to 9"
        );
        assert_eq!(ran.text("9"), tensor(h9), "{family:?}: tiled encode");
        assert_eq!(ran.text("10"), tensor("[9, 80, 96, 3]"), "{family:?}: tiled decode");
        assert_eq!(ran.text("13"), tensor(h5), "{family:?}: 5 images are 2 latent frames");
        assert_eq!(ran.text("16"), tensor(h1), "{family:?}: one image keeps its image latent");
        assert_eq!(
            ran.text("21"),
            tensor("[10, 80, 96, 3]"),
            "{family:?}: 2 clips' frames in order"
        );
        let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("18")];
        assert_eq!(ui.images.len(), 5, "{family:?}: 2 latent frames decode to 5 saved frames");
    }
}

/// A latent with frames, decoded by an image VAE, is refused by name (ComfyUI would decode its first frame).
#[test]
fn issue_24_an_image_vae_refuses_a_latent_with_frames() {
    let mut h = harness(&[VaeFamily::Wan21, VaeFamily::Flux]);
    let ran = h.run(json!({
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": "wan21-vae.safetensors"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "flux-vae.safetensors"}},
        "3": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 9, "color": 0}},
        "4": {"class_type": "VAEEncode", "inputs": {"pixels": ["3", 0], "vae": ["1", 0]}},
        "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["2", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    assert!(failure.message.contains("a latent of 3 frames"), "{}", failure.message);
    assert!(failure.message.contains("the Flux VAE"), "{}", failure.message);
}
