//! Qwen3-VL text encoders reading images against ComfyUI 0f1fa67a's edit nodes (`scripts/reference/
//! qwen3vl_te_images.py`, fixtures in `fixtures/qwen3vl_te_images/`; transformers' `Qwen3VLModel` agrees with
//! ComfyUI there but for Krea 2's tap 2, where ComfyUI adds DeepStack feature 1 first): Krea 2's encoder (type
//! `krea2`) through `TextEncodeQwenImageEditPlus`, Mage-Flow's (type `mage`) through `TextEncodeMageFlowEdit` and
//! Boogu-Image's (type `boogu`) through `TextEncodeBooguEdit`, on one tiny Qwen3-VL file (a 16-head tower 128 wide
//! with DeepStack after both its blocks, a 36-layer language model 16 wide). Kiln is fed the vision copies the
//! nodes made (their resizing is the nodes' business), so what is checked is the encoder: the ids of each node's
//! prompts, the patch grid of each copy, and the conditioning.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_compute::Backend;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    BOOGU_CLIP_TYPE, EditPrompt, KREA2_CLIP_TYPE, MAGE_CLIP_TYPE, PromptTokens,
    TextEncoderDetected, TextEncoderFamily, TextEncoderNet,
};
use kiln_models::qwen_vl::VisionInput;

use crate::common::{assert_close, cpu, fixture, ids, json, tiled_table};

/// The fixture file, its 1000-row token table tiled to the vocabulary, as `CLIPLoader` type `kind` loads it.
fn encoder(kind: &str) -> (Arc<Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(512 << 20);
    let file = tiled_table(
        "qwen3vl_te_images/qwen3vl.safetensors",
        "model.language_model.embed_tokens.weight",
        151_936,
    );
    let file = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect");
    let Some(found @ TextEncoderDetected::Qwen3Vl(_, Some(_), None)) = found else {
        panic!("the Qwen3-VL file detected as {found:?}")
    };
    let found = found.for_clip_type(kind).expect(kind);
    let TextEncoderDetected::Qwen3Vl(config, Some(vision), Some(_)) = &found else {
        panic!("{kind}: {found:?}")
    };
    assert_eq!(
        (config.hidden, config.layers, config.heads, config.kv_heads, config.head_dim),
        (16, 36, 2, 1, 128),
        "{kind}"
    );
    assert_eq!(
        (vision.hidden, vision.depth, vision.heads, vision.intermediate, vision.out_hidden),
        (128, 2, 16, 32, 16),
        "{kind}"
    );
    assert_eq!(
        (vision.patch, vision.temporal_patch, vision.position_side, vision.deepstack.as_slice()),
        (16, 2, 8, [0, 1].as_slice()),
        "{kind}"
    );
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, kind).expect("build");
    let family = match kind {
        KREA2_CLIP_TYPE => TextEncoderFamily::Krea2,
        MAGE_CLIP_TYPE => TextEncoderFamily::MageFlow,
        _ => TextEncoderFamily::Boogu,
    };
    assert_eq!(net.family(), family);
    (b, net)
}

/// `io.safetensors` as f32 by name with its shape: the f32 tensors as they are, the U8 vision copies (256 ×
/// value, exact) divided back.
fn read_io() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let path = fixture("qwen3vl_te_images/io.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("io.safetensors");
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let values = match view.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::U8 => data.iter().map(|&v| f32::from(v) / 256.0).collect(),
                other => panic!("{name} is {other:?}"),
            };
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// The ids Kiln lays out for a recorded case: Krea 2's through `TextEncodeQwenImageEditPlus`'s picture inputs,
/// Mage-Flow's and Boogu's numbered images; a case without images (Boogu's negative) as a plain prompt.
fn kiln_ids(
    net: &TextEncoderNet,
    case: &serde_json::Value,
    prompt: &str,
    images: usize,
) -> Vec<u32> {
    if let Some(pictures) = case["pictures"].as_array() {
        let mut on = [false; 3];
        for (slot, p) in on.iter_mut().zip(pictures) {
            *slot = p.as_bool().expect("picture");
        }
        return net
            .tokenize_edit(prompt, EditPrompt::Plus { pictures: on })
            .expect("tokenize_edit");
    }
    let images = case["images"].as_u64().map_or(images, |n| n as usize);
    if images > 0 {
        return net.tokenize_edit(prompt, EditPrompt::Numbered { images }).expect("tokenize_edit");
    }
    let PromptTokens::Ids(ids) = net.tokenize(prompt).expect("tokenize") else {
        panic!("ids for {prompt:?}")
    };
    ids
}

/// Every recorded node case of `kind` whose name `wanted` accepts: ids, grids and conditioning against ComfyUI's;
/// the largest relative error.
fn check_cases(kind: &str, wanted: fn(&str) -> bool) -> f32 {
    let (b, net) = encoder(kind);
    let cases = json("qwen3vl_te_images/cases.json");
    let io = read_io();
    let mut worst = 0f32;
    let mut count = 0;
    for (name, case) in cases["cases"].as_object().expect("cases") {
        if case["type"] != kind || !wanted(name) {
            continue;
        }
        count += 1;
        // Krea 2's node writes the `Picture i: ` slots into the text it tokenizes; Kiln takes the node's prompt.
        let prompt = if kind == KREA2_CLIP_TYPE { &case["node_prompt"] } else { &case["prompt"] };
        let prompt = prompt.as_str().expect("prompt");
        let copies = case["copies"].as_array().expect("copies");
        let got = kiln_ids(&net, case, prompt, copies.len());
        assert_eq!(got, ids(&case["ids"]), "{name} ids");

        let mut inputs: Vec<VisionInput> = Vec::new();
        for (k, key) in copies.iter().enumerate() {
            let (shape, values) = &io[key.as_str().expect("copy")];
            assert_eq!(
                &shape[1..3],
                ids(&case["copy_sizes"][k]).iter().map(|&v| v as usize).collect::<Vec<_>>()
            );
            let input =
                net.vision_input(values, shape[1], shape[2], shape[3]).expect("vision input");
            let grid = ids(&case["grids"][k]);
            assert_eq!(
                [1, input.grid_h, input.grid_w],
                [grid[0], grid[1], grid[2]].map(|g| g as usize),
                "{name} {k}"
            );
            inputs.push(input);
        }
        let encoded =
            net.encode_with_images(b.as_ref(), &PromptTokens::Ids(got), &inputs).expect("encode");
        let (shape, want) = &io[&format!("{name}.cond")];
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{name}");
        assert!(encoded.pooled.is_none(), "{name}");
        let cond = b.to_f32(&encoded.cond).expect("read");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let error = cond.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        eprintln!("{name}: relative error {error:e}");
        worst = worst.max(error);
        assert_close(name, &cond, want, 1e-4);
    }
    assert!(count >= 1, "{kind}: no cases");
    worst
}

#[test]
fn krea2_edit_plus_matches_comfyui() {
    let worst = check_cases(KREA2_CLIP_TYPE, |_| true);
    eprintln!("krea2: max relative error {worst:e}");
}

#[test]
fn mage_flow_edit_matches_comfyui() {
    let worst = check_cases(MAGE_CLIP_TYPE, |name| name != "mage.endoftext");
    eprintln!("mage: max relative error {worst:e}");
}

/// A written `<|endoftext|>` (the pad) in a prompt with an image: ComfyUI's `process_tokens` masks it and every
/// text token after it (the image's tokens, before it, stay attended), as it does without images.
#[test]
fn endoftext_with_images_is_masked_as_comfyui() {
    let worst = check_cases(MAGE_CLIP_TYPE, |name| name == "mage.endoftext");
    eprintln!("mage endoftext: relative error {worst:e}");
}

#[test]
fn boogu_edit_matches_comfyui() {
    let worst = check_cases(BOOGU_CLIP_TYPE, |_| true);
    eprintln!("boogu: max relative error {worst:e}");
}

/// Kiln's ids for token case `name` and ComfyUI's.
fn token_case(net: &TextEncoderNet, cases: &serde_json::Value, name: &str) -> (Vec<u32>, Vec<u32>) {
    let case = &cases["token_cases"][name];
    let prompt = case["prompt"].as_str().expect("prompt");
    (kiln_ids(net, case, prompt, 0), ids(&case["ids"]))
}

/// The node prompts only tokenized: other picture inputs, no picture, three images, blank prompts with and
/// without an image, Boogu's negatives.
#[test]
fn edit_token_ids_match_comfyui() {
    let cases = json("qwen3vl_te_images/cases.json");
    for kind in [KREA2_CLIP_TYPE, MAGE_CLIP_TYPE, BOOGU_CLIP_TYPE] {
        let (_, net) = encoder(kind);
        for (name, case) in cases["token_cases"].as_object().expect("token cases") {
            if case["type"] != kind || name == "mage.templated" {
                continue;
            }
            let (got, want) = token_case(&net, &cases, name);
            assert_eq!(got, want, "{name}");
        }
    }
}

/// A Mage-Flow prompt already templated, with an image: ComfyUI's `MageFlowTokenizer` puts the `Image j: ` slots
/// into the template, which a prompt starting with `<|im_start|>` skips, so the prompt is tokenized as written
/// (its own `<|image_pad|>` takes the image).
#[test]
fn mage_templated_prompt_with_images_matches_comfyui() {
    let cases = json("qwen3vl_te_images/cases.json");
    let (_, net) = encoder(MAGE_CLIP_TYPE);
    let (got, want) = token_case(&net, &cases, "mage.templated");
    assert_eq!(got, want);
}
