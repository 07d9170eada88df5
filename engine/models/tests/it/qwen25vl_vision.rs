//! Qwen2.5-VL's vision tower and its language model with images in the prompt (Qwen-Image Edit's text
//! encoder) against `scripts/reference/qwen25vl_vision.py`'s fixtures: ComfyUI's preprocessing of an image
//! into patches, transformers' tower output (equal to ComfyUI's), and the language model's hidden state with
//! the image tokens placed and positioned by M-RoPE.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::qwen_vl::{self, VisionConfig, VisionInput};
use kiln_models::qwen3::{self, IMAGE_PAD, ImageTokens, Qwen3};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "qwen25vl_vision/weights.safetensors";

/// The tiny reference tower (16 heads of 4, as ComfyUI fixes 16 heads).
const TINY: VisionConfig = VisionConfig {
    hidden: 64,
    depth: 8,
    intermediate: 64,
    out_hidden: 256,
    patch: 14,
    temporal_patch: 2,
};

/// The fixture's images: `[H, W, 3]` values with height and width.
fn image(io: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, case: &str) -> VisionInput {
    let (shape, values) = &io[&format!("image.{case}")];
    VisionInput::of_image(&TINY, values, shape[1], shape[2], shape[3]).unwrap()
}

#[test]
fn detects_the_tower_and_reads_its_widths() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    assert_eq!(qwen_vl::detect(&Header::new(&file, "")).unwrap(), Some(TINY));
    let text_only = SafetensorsFile::open(fixture("qwen25vl/weights.safetensors")).unwrap();
    assert_eq!(qwen_vl::detect(&Header::new(&text_only, "")).unwrap(), None);
}

#[test]
fn images_become_comfyui_patches_and_transformers_tokens() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = qwen3::detect_qwen25vl(&header).unwrap().unwrap();
    let mut plan = qwen3::load_plan(&header, &config);
    let tower = TINY.weight_names();
    plan.slots.extend(
        tower.iter().map(|n| kiln_compute::memory::SlotPlan::new(n.clone(), vec![(0, n.clone())])),
    );
    let weights = manager.load(&plan, &mut |_, _| {}).unwrap();
    let io = read_tensors("qwen25vl_vision/io.safetensors");
    for case in ["wide", "small", "square"] {
        let input = image(&io, case);
        let (_, grid) = &io[&format!("grid.{case}")];
        assert_eq!(
            [1, input.grid_h, input.grid_w],
            [grid[0], grid[1], grid[2]].map(|g| g as usize)
        );
        let (_, patches) = &io[&format!("patches.{case}")];
        assert_close(&format!("patches.{case}"), &input.patches, patches, 1e-5);
        let (shape, want) = &io[&format!("vision.{case}")];
        let got = qwen_vl::embed_image(&*b, &weights, &TINY, &input).unwrap();
        assert_eq!(got.shape(), shape.as_slice(), "{case}");
        assert_close(&format!("vision.{case}"), &b.to_f32(&got).unwrap(), want, 1e-4);
        // The tower computes in f32 on every device, as ComfyUI's does: a bf16 backend gives the same tokens.
        let bf16 = b.with_compute_dtype(DType::BF16).unwrap();
        let again = qwen_vl::embed_image(&bf16, &weights, &TINY, &input).unwrap();
        assert_eq!(b.to_f32(&again).unwrap(), b.to_f32(&got).unwrap(), "{case} on bf16");
    }

    let model = Qwen3::new(config, weights);
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen25vl_vision/cases.json")).unwrap(),
    )
    .unwrap();
    for (name, pieces) in cases.as_object().unwrap() {
        let mut ids = Vec::new();
        let mut images = Vec::new();
        for piece in pieces.as_array().unwrap() {
            match piece.get("image") {
                Some(case) => {
                    let input = image(&io, case.as_str().unwrap());
                    let embeds = qwen_vl::embed_image(&*b, &model.weights, &TINY, &input).unwrap();
                    images.push(ImageTokens {
                        embeds,
                        deepstack: Vec::new(),
                        rows: input.grid_h / 2,
                        cols: input.grid_w / 2,
                    });
                    ids.push(IMAGE_PAD);
                }
                None => {
                    ids.extend(piece.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32))
                }
            }
        }
        let (shape, want) = &io[&format!("hidden.{name}")];
        let got = model.hidden_state_with_images(&*b, &ids, &images).unwrap();
        assert_eq!(got.shape(), shape.as_slice(), "{name}");
        assert_close(name, &b.to_f32(&got).unwrap(), want, 1e-4);
        // One image short of the placeholders: the extra `<|image_pad|>` is text, outside this vocabulary.
        let fewer = model.hidden_state_with_images(&*b, &ids, &images[1..]);
        assert!(matches!(fewer, Err(Error::Invalid(m)) if m.contains("151655")), "{name}");
    }
}

/// The Edit nodes' prompts tokenise to the ids ComfyUI's nodes encode (its Qwen-Image tokenizer run through
/// `comfy_extras.nodes_qwen`): both templates, the picture slots numbered by input, the pre-templated prompt.
#[test]
fn edit_prompts_tokenise_as_comfyui_nodes_do() {
    let tokenizer = qwen3::Tokenizer::bundled().unwrap();
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen25vl_vision/edit_prompts.json")).unwrap(),
    )
    .unwrap();
    for (name, case) in cases.as_object().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let images: Vec<&str> =
            case["images"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let ids = match case["node"].as_str().unwrap() {
            "TextEncodeQwenImageEdit" => {
                tokenizer.qwen_image_edit_prompt(prompt, !images.is_empty())
            }
            _ => {
                let pictures: Vec<usize> =
                    images.iter().map(|i| i.trim_start_matches("image").parse().unwrap()).collect();
                tokenizer.qwen_image_edit_plus_prompt(prompt, &pictures)
            }
        }
        .unwrap();
        let want: Vec<u32> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, want, "{name}");
    }
}
