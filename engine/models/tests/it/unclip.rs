//! SDXL's unCLIP pooled vector against ComfyUI 0f1fa67a's `model_base.sdxl_pooled` (`scripts/reference/unclip.py`,
//! fixtures in `fixtures/unclip/`): one image embedding at level 0 and noised, a seed under 10 (torch's negative
//! seed), two `unCLIPConditioning`s merged, a batch of two images with a negative strength, half the levels.

use kiln_models::unet::unclip::{UnclipImage, sdxl_pooled};

use crate::common::{assert_close, json, read_tensors};

#[test]
fn unclip_pooled_vectors_are_comfyuis() {
    let io = read_tensors("unclip/io.safetensors");
    let cases = json("unclip/cases.json");
    let cases = cases.as_object().expect("cases");
    assert_eq!(cases.len(), 6);
    for (name, case) in cases {
        let seed = case["seed"].as_u64().expect("seed");
        let mut images = Vec::new();
        for cond in case["conds"].as_array().expect("conds") {
            let (shape, embeds) = &io[&format!("embeds.{}", cond[0])];
            for row in embeds.chunks_exact(shape[1]) {
                images.push(UnclipImage {
                    embeds: row,
                    strength: cond[1].as_f64().expect("strength") as f32,
                    noise_augmentation: cond[2].as_f64().expect("augmentation"),
                });
            }
        }
        let got = sdxl_pooled(&images, 1280, seed).expect(name);
        assert_close(name, &got, &io[&format!("{name}.pooled")].1, 1e-5);
    }
}

#[test]
fn unclip_refuses_embeddings_of_another_width() {
    let embeds = vec![0.5f32; 1024];
    let image = UnclipImage { embeds: &embeds, strength: 1.0, noise_augmentation: 0.0 };
    let err = sdxl_pooled(&[image], 1280, 1).expect_err("a ViT-H embedding").to_string();
    assert!(err.contains("clip_vision_g"), "{err}");
}
