//! Utility nodes templates wire around prompts and latents: `RegexExtract` with Python's `re` semantics,
//! `LatentCut` / `LatentConcat` with ComfyUI's clamping and batch repetition, `CreateList`, `CustomCombo` (which
//! takes the frontend's own options), `JsonExtractString`, and the frontend's `Crop Image`, `Seed` and `Color Picker`.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use serde_json::{Value, json};

use crate::harness::Harness;

/// What `RegexExtract` gives for `string` and `pattern` in `mode` (case-insensitive, group 1).
fn extract(h: &mut Harness, string: &str, pattern: &str, mode: &str, group: i64) -> String {
    let ran = h.run(json!({
        "1": {"class_type": "RegexExtract", "inputs": {"string": string, "regex_pattern": pattern, "mode": mode, "case_insensitive": true, "multiline": false, "dotall": false, "group_index": group}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    ran.text("2").concat()
}

#[test]
fn regex_extract_finds_what_pythons_re_finds() {
    let mut h = Harness::new(CachePolicy::Classic);
    let text = "Seed 42, steps 8; SEED 7";
    assert_eq!(extract(&mut h, text, r"seed (\d+)", "First Match", 1), "Seed 42");
    assert_eq!(extract(&mut h, text, r"seed (\d+)", "First Group", 1), "42");
    // findall with a group gives the group, joined by newlines; case-insensitive by default.
    assert_eq!(extract(&mut h, text, r"seed (\d+)", "All Matches", 1), "42\n7");
    assert_eq!(extract(&mut h, text, r"\d+", "All Matches", 1), "42\n8\n7");
    assert_eq!(extract(&mut h, text, r"(\w+) (\d+)", "All Groups", 2), "42\n8\n7");
    // A group past the pattern's, nothing found, or a pattern Python rejects: empty.
    assert_eq!(extract(&mut h, text, r"seed (\d+)", "First Group", 2), "");
    assert_eq!(extract(&mut h, text, r"cfg (\d+)", "First Match", 1), "");
    assert_eq!(extract(&mut h, text, r"seed (", "First Match", 1), "");
    // Python's syntax: lookbehind and named groups.
    assert_eq!(extract(&mut h, text, r"(?<=steps )(?P<n>\d+)", "First Match", 1), "8");
}

/// The shape `PreviewAny` shows for node `id`'s latent.
fn shape_of(h: &mut Harness, prompt: Value, id: &str) -> String {
    let mut prompt = prompt;
    prompt["99"] = json!({"class_type": "PreviewAny", "inputs": {"source": [id, 0]}});
    let ran = h.run(prompt);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    ran.text("99").concat()
}

#[test]
fn latent_cut_and_concat_follow_comfyuis_clamping_and_batching() {
    let mut h = Harness::new(CachePolicy::Classic);
    let base = json!({
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 32, "batch_size": 2}},
        "2": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 16, "height": 32, "batch_size": 1}},
    });
    let with = |node: Value| {
        let mut prompt = base.clone();
        prompt["3"] = node;
        prompt
    };
    let cut = |dim: &str, index: i64, amount: i64| {
        with(
            json!({"class_type": "LatentCut", "inputs": {"samples": ["1", 0], "dim": dim, "index": index, "amount": amount}}),
        )
    };
    // [2, 4, 4, 8]: x is the last dimension, y the one before, t the one before that.
    assert_eq!(shape_of(&mut h, cut("x", 2, 3), "3"), "tensor[2, 4, 4, 3]");
    assert_eq!(shape_of(&mut h, cut("x", 6, 5), "3"), "tensor[2, 4, 4, 2]", "as many as are left");
    assert_eq!(shape_of(&mut h, cut("y", -3, 5), "3"), "tensor[2, 4, 3, 8]", "from the end");
    assert_eq!(
        shape_of(&mut h, cut("y", -9, 2), "3"),
        "tensor[2, 4, 2, 8]",
        "clamped to the start"
    );
    assert_eq!(shape_of(&mut h, cut("t", 0, 2), "3"), "tensor[2, 2, 4, 8]");
    let concat = |dim: &str| {
        with(
            json!({"class_type": "LatentConcat", "inputs": {"samples1": ["1", 0], "samples2": ["2", 0], "dim": dim}}),
        )
    };
    // The second latent (one of 16 channels, 4 × 2) is repeated to the first's batch of 2.
    let mut mismatch = concat("x");
    mismatch["99"] = json!({"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}});
    let ran = h.run(mismatch);
    assert!(matches!(ran.summary.outcome, Outcome::Failed(_)), "4 and 16 channels do not join");
    let mut same = concat("-x");
    same["2"] = json!({"class_type": "EmptyLatentImage", "inputs": {"width": 16, "height": 32, "batch_size": 1}});
    assert_eq!(shape_of(&mut h, same, "3"), "tensor[2, 4, 4, 10]");
}

#[test]
fn custom_combo_answers_the_frontends_choice_and_index() {
    let mut h = Harness::new(CachePolicy::Classic);
    // The frontend defines the options (widgets the node does not declare) and sends the choice and its index.
    let combo = |inputs: Value| {
        json!({
            "1": {"class_type": "CustomCombo", "inputs": inputs},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}},
        })
    };
    let ran = h.run(combo(
        json!({"choice": "16:9", "index": 1, "option1": "9:16", "option2": "16:9", "option3": ""}),
    ));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(
        (ran.text("2").concat(), ran.text("3").concat()),
        ("16:9".to_owned(), "1".to_owned())
    );
    // Another index with the same choice is another result, not the cached one.
    let ran = h.run(combo(
        json!({"choice": "16:9", "index": 2, "option1": "9:16", "option2": "16:9", "option3": ""}),
    ));
    assert_eq!(ran.text("3").concat(), "2");
    // Without an index: 0.
    let ran = h.run(combo(json!({"choice": "square"})));
    assert_eq!(
        (ran.text("2").concat(), ran.text("3").concat()),
        ("square".to_owned(), "0".to_owned())
    );
    // An index that is not an integer fails the node, naming it.
    let ran = h.run(combo(json!({"choice": "square", "index": "first"})));
    assert!(
        matches!(&ran.summary.outcome, Outcome::Failed(f) if f.message.contains("index")),
        "{:?}",
        ran.summary.outcome
    );
}

#[test]
fn json_extract_string_gives_pythons_str_of_the_value() {
    let mut h = Harness::new(CachePolicy::Classic);
    let mut extract = |json: &str, key: &str| {
        let ran = h.run(json!({
            "1": {"class_type": "JsonExtractString", "inputs": {"json_string": json, "key": key}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
        ran.text("2").concat()
    };
    let doc = r#"{"prompt": "a lighthouse", "seed": 42, "cfg": 1e-05, "ok": true, "none": null,
        "tags": ["dusk", 2.5], "size": {"w": 64, "h": 1.0}}"#;
    assert_eq!(extract(doc, "prompt"), "a lighthouse");
    assert_eq!(extract(doc, "seed"), "42");
    assert_eq!(extract(doc, "cfg"), "1e-05");
    assert_eq!(extract(doc, "ok"), "True");
    assert_eq!(extract(doc, "none"), "");
    assert_eq!(extract(doc, "tags"), "['dusk', 2.5]");
    assert_eq!(extract(doc, "size"), "{'w': 64, 'h': 1.0}");
    // A missing key, a document that is not an object, and text that is not JSON: empty.
    assert_eq!(extract(doc, "steps"), "");
    assert_eq!(extract("[1, 2]", "0"), "");
    assert_eq!(extract("not json", "prompt"), "");
}

#[test]
fn create_list_joins_its_inputs_into_a_list_the_next_node_maps_over() {
    let mut h = Harness::new(CachePolicy::Classic);
    let text = |a: &str, b: &str| json!({"class_type": "StringConcatenate", "inputs": {"string_a": a, "string_b": b, "delimiter": ""}});
    let ran = h.run(json!({
        "1": text("light", "house"),
        "2": text("dusk", ""),
        "3": {"class_type": "CreateList", "inputs": {"inputs.input0": ["1", 0], "inputs.input1": ["2", 0]}},
        "4": {"class_type": "StringConcatenate", "inputs": {"string_a": ["3", 0], "string_b": "!", "delimiter": ""}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    // The node after the list runs once per item, in order.
    assert_eq!(ran.text("5"), ["lighthouse!", "dusk!"]);
}

/// The frontend's `Crop Image` (its crop widget's box, or a `Bounding Box` node's), `Seed` and `Color Picker`
/// (its integer feeding `EmptyImage`'s colour, its alpha and hex text shown).
#[test]
fn crop_image_seed_and_colour_picker_answer_what_comfyui_does() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "ColorToRGBInt", "inputs": {"color": "#336699cc"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": ["1", 0]}},
        "3": {"class_type": "ImageCropV2", "inputs": {"image": ["2", 0], "crop_region": {"x": 60, "y": 5, "width": 20, "height": 100}}},
        "4": {"class_type": "GetImageSize", "inputs": {"image": ["3", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        "7": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}},
        "8": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}},
        "9": {"class_type": "SeedNode", "inputs": {"seed": 9_007_199_254_740_993_u64}},
        "10": {"class_type": "PreviewAny", "inputs": {"source": ["9", 0]}},
        "11": {"class_type": "PrimitiveBoundingBox", "inputs": {"x": 1, "y": 2, "width": 3, "height": 4}},
        "12": {"class_type": "ImageCropV2", "inputs": {"image": ["2", 0], "crop_region": ["11", 0]}},
        "13": {"class_type": "GetImageSize", "inputs": {"image": ["12", 0]}},
        "14": {"class_type": "PreviewAny", "inputs": {"source": ["13", 0]}},
        "15": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "crop"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    // From x 60 of 64 only 4 columns remain; from y 5, 43 rows.
    assert_eq!((ran.text("5").concat(), ran.text("6").concat()), ("4".to_owned(), "43".to_owned()));
    assert_eq!(ran.text("7").concat(), "#336699");
    assert_eq!(ran.text("8").concat(), "0.8");
    assert_eq!(ran.text("10").concat(), "9007199254740993");
    assert_eq!(ran.text("14").concat(), "3");
    let preview = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("3")];
    assert!(preview.images[0].filename.contains("_temp_"), "Crop Image previews what it cut");
    let saved = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("15")].images[0];
    let image = image::open(h.roots.output.join(&saved.filename)).expect("a PNG").to_rgb8();
    assert_eq!(image.get_pixel(0, 0).0, [0x33, 0x66, 0x99], "the picked colour fills the image");

    let ran = h.run(json!({
        "1": {"class_type": "ColorToRGBInt", "inputs": {"color": "336699"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert_eq!(failure.message, "Color must be in format #RRGGBB or #RRGGBBAA");
}

/// `RebatchLatents` regroups a batch of three into a list of two batches, which the next node runs over.
#[test]
fn rebatch_latents_gives_a_list_the_next_node_maps_over() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 32, "batch_size": 3}},
        "2": {"class_type": "RebatchLatents", "inputs": {"latents": ["1", 0], "batch_size": 2}},
        "3": {"class_type": "SaveLatent", "inputs": {"samples": ["2", 0], "filename_prefix": "latents/rebatched"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let saved = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("3")].named[0].1;
    let batches: Vec<usize> = saved
        .iter()
        .map(|file| {
            let bytes =
                std::fs::read(h.roots.output.join("latents").join(&file.filename)).expect("saved");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            st.tensor("latent_tensor").expect("latent_tensor").shape()[0]
        })
        .collect();
    assert_eq!(batches, [2, 1]);
}
