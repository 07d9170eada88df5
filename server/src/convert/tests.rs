//! The conversions against ComfyUI's recorded answers (`tests/golden/comfyui`): object_info of the
//! built-in nodes, and the validation errors of every recorded `POST /prompt` case, through the engine.

use kiln_engine::graph::{Prompt, validate};
use kiln_engine::models::ModelEnv;
use kiln_engine::nodes::builtin_registry;
use kiln_engine::roots::Roots;
use serde_json::Value;

use super::{node_errors, node_info, rejection};

fn golden(case: &str) -> Value {
    kiln_tests::golden(case)
}

/// Replaces values that are volatile or Python-specific (tracebacks) so both sides compare.
fn scrub(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "traceback" {
                    *v = Value::Null;
                } else {
                    scrub(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

fn empty_input_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Every built-in node, its folders one empty directory.
fn registry() -> kiln_engine::nodes::Registry {
    let dir = empty_input_dir();
    let roots = Roots { input: dir.clone(), output: dir.clone(), temp: dir.clone() };
    builtin_registry(&roots, ModelEnv::cpu(dir.join("models")))
}

#[test]
fn object_info_of_built_in_nodes_matches_comfyui() {
    let registry = registry();
    for class in
        ["EmptyImage", "ImageInvert", "ImageScale", "PreviewImage", "SaveImage", "LoadImage"]
    {
        let expected =
            &golden(&format!("get_object_info_{class}"))["response"]["body"]["json"][class];
        let spec = registry.get(class).expect("registered").spec();
        let got: Value =
            serde_json::from_str(&serde_json::to_string(&node_info(&spec)).expect("serializes"))
                .expect("JSON");
        assert_eq!(&got, expected, "object_info of {class}");
        kiln_tests::key_order::assert_same(&got, expected, &format!("object_info of {class}"));
    }
}

#[test]
fn object_info_of_every_built_in_node() {
    let registry = registry();
    let all: serde_json::Map<String, Value> = registry
        .iter()
        .map(|(name, node)| {
            (name.to_owned(), serde_json::to_value(node_info(&node.spec())).expect("serializes"))
        })
        .collect();
    // Objects keep their wire order (serde_json `preserve_order`): classes in registration order, each
    // node's keys and inputs as ComfyUI sends them.
    insta::assert_json_snapshot!("object_info", all);
}

/// The choices of a combo input's `[TYPE, options]`: a legacy combo's list, or a V3 `COMBO`'s `options`.
fn combo_choices(config: &mut Value) -> Option<&mut Vec<Value>> {
    let config = config.as_array_mut()?;
    if config.first().is_some_and(Value::is_array) {
        return config.first_mut()?.as_array_mut();
    }
    if config.first().and_then(Value::as_str) == Some("COMBO") {
        return config.get_mut(1)?.get_mut("options")?.as_array_mut();
    }
    None
}

/// Whether `kiln` lists a subset of `comfy`'s choices in their order.
fn in_order_subset(kiln: &[Value], comfy: &[Value]) -> bool {
    let mut rest = comfy.iter();
    kiln.iter().all(|choice| rest.any(|c| c == choice))
}

#[test]
fn every_built_in_node_answers_comfyuis_object_info() {
    let registry = registry();
    let catalogue = kiln_tests::comfyui_catalogue();
    let mut failures = Vec::new();
    for (class, node) in registry.iter() {
        let Some(expected) = catalogue.get(class) else {
            failures.push(format!("{class}: not a node of ComfyUI's catalogue"));
            continue;
        };
        let mut got = serde_json::to_value(node_info(&node.spec())).expect("serializes");
        let mut expected = expected.clone();
        // A combo may list what Kiln has: a subset of ComfyUI's choices in order, or any files where that
        // install had none. Past that check, both sides compare with ComfyUI's list.
        for part in ["required", "optional"] {
            let Some(inputs) = got["input"].get_mut(part).and_then(Value::as_object_mut) else {
                continue;
            };
            for (name, config) in inputs.iter_mut() {
                let Some(comfy) =
                    expected["input"][part].get_mut(name).and_then(combo_choices).cloned()
                else {
                    continue;
                };
                if let Some(kiln) = combo_choices(config) {
                    if !comfy.is_empty() && !in_order_subset(kiln, &comfy) {
                        failures.push(format!("{class}.{name}: {kiln:?} is not in {comfy:?}"));
                    }
                    *kiln = comfy;
                }
            }
        }
        if got != expected {
            failures.push(format!(
                "{class}:\n  kiln:    {}\n  comfyui: {}",
                serde_json::to_string(&got).expect("JSON"),
                serde_json::to_string(&expected).expect("JSON")
            ));
            continue;
        }
        // Equal values; the wire order of keys must be ComfyUI's too.
        let same_order = std::panic::catch_unwind(|| {
            kiln_tests::key_order::assert_same(&got, &expected, class);
        });
        if same_order.is_err() {
            failures.push(format!("{class}: keys in another order than ComfyUI's"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} nodes differ from ComfyUI's:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every recorded `POST /prompt` whose answer is a validation result (200 with node_errors, or 400).
const PROMPT_CASES: &[&str] = &[
    "post_prompt_bad_prompt_id_SKIP",
    "post_prompt_combo_not_in_list",
    "post_prompt_cycle",
    "post_prompt_empty_prompt",
    "post_prompt_int_above_max",
    "post_prompt_int_as_float",
    "post_prompt_int_as_string_accepted",
    "post_prompt_int_below_min",
    "post_prompt_int_not_a_number",
    "post_prompt_link_bad_output_index",
    "post_prompt_link_to_missing_node",
    "post_prompt_link_wrong_type",
    "post_prompt_loadimage_missing_file",
    "post_prompt_missing_class_type",
    "post_prompt_no_output_node",
    "post_prompt_partial_accept",
    "post_prompt_required_input_missing",
    "post_prompt_required_link_input_missing",
    "post_prompt_unknown_class_type",
    "post_prompt_unknown_class_type_with_title",
    "post_prompt_valid_number",
];

#[test]
fn validation_answers_match_comfyui_for_every_recorded_prompt() {
    let registry = registry();
    for case in PROMPT_CASES.iter().filter(|c| !c.ends_with("_SKIP")) {
        let recorded = golden(case);
        let prompt = Prompt::from_json(&recorded["request"]["json"]["prompt"]).expect("an object");
        let status = recorded["response"]["status"].as_u64().expect("status");
        let mut expected = recorded["response"]["body"]["json"].clone();
        let mut got = match validate(&prompt, &registry, None) {
            Ok(validated) => {
                assert_eq!(status, 200, "{case}: Kiln accepts what ComfyUI rejected");
                serde_json::json!({"node_errors": node_errors(&validated.node_errors)})
            }
            Err(rejected) => {
                assert_eq!(status, 400, "{case}: Kiln rejects what ComfyUI accepted: {rejected:?}");
                serde_json::to_value(rejection(&rejected)).expect("serializes")
            }
        };
        if status == 200 {
            expected = serde_json::json!({"node_errors": expected["node_errors"]});
        }
        scrub(&mut expected);
        scrub(&mut got);
        assert_eq!(got, expected, "{case}");
    }
}

#[test]
fn both_combo_forms_convert() {
    use kiln_engine::nodes::{InputDef, NodeSpec};
    let spec = NodeSpec::new("Combos", "Combos", "testing")
        .input(InputDef::choices("legacy", &["a", "b"]))
        .input(
            InputDef::combo("modern", vec!["x".to_owned(), "y".to_owned()]).option("default", "y"),
        );
    let info = serde_json::to_value(node_info(&spec)).expect("serializes");
    assert_eq!(info["input"]["required"]["legacy"], serde_json::json!([["a", "b"]]));
    assert_eq!(
        info["input"]["required"]["modern"],
        serde_json::json!(["COMBO", {"options": ["x", "y"], "default": "y"}])
    );
}

/// `EmptySD3LatentImage` as `model_specs` declares it (a V3 node of `comfy_extras.nodes_sd3`).
fn empty_sd3_latent_image() -> kiln_engine::nodes::NodeSpec {
    use kiln_engine::nodes::{InputDef, NodeSpec, OutputDef};
    NodeSpec::new("EmptySD3LatentImage", "", "model/latent/stable diffusion")
        .v3()
        .python_module("comfy_extras.nodes_sd3")
        .input(InputDef::int("width", 1024, 16, 16384).option("step", 16))
        .input(InputDef::int("height", 1024, 16, 16384).option("step", 16))
        .input(InputDef::int("batch_size", 1, 1, 4096))
        .output(OutputDef::new("LATENT"))
}

#[test]
fn a_v3_node_serialises_as_comfyuis_dataclass_dump() {
    // ComfyUI serves a V3 class as `asdict(NodeInfoV1)`: every field, in the dataclass's order, nulls included
    // (comfy_api/latest/_io.py `NodeInfoV1`, `Schema.get_v1_info`; no golden capture holds a V3 node).
    let got = serde_json::to_string(&node_info(&empty_sd3_latent_image())).expect("serializes");
    let int = |default: i64, min: i64, max: i64, step: Option<i64>| {
        let mut options = serde_json::json!({"default": default, "min": min, "max": max});
        if let Some(step) = step {
            options["step"] = step.into();
        }
        serde_json::json!(["INT", options])
    };
    let expected = serde_json::json!({
        "input": {"required": {
            "width": int(1024, 16, 16384, Some(16)),
            "height": int(1024, 16, 16384, Some(16)),
            "batch_size": int(1, 1, 4096, None),
        }},
        "input_order": {"required": ["width", "height", "batch_size"]},
        "is_input_list": false,
        "output": ["LATENT"],
        "output_is_list": [false],
        "output_name": ["LATENT"],
        "output_tooltips": [null],
        "output_matchtypes": null,
        "name": "EmptySD3LatentImage",
        "display_name": null,
        "description": "",
        "python_module": "comfy_extras.nodes_sd3",
        "category": "model/latent/stable diffusion",
        "output_node": false,
        "deprecated": false,
        "experimental": false,
        "dev_only": false,
        "api_node": false,
        "price_badge": null,
        "search_aliases": null,
        "essentials_category": null,
        "has_intermediate_output": false,
    });
    // String comparison: same keys, values and key order.
    assert_eq!(got, serde_json::to_string(&expected).expect("serializes"));
    // The wire type reads it back as the V3 shape (the V1 shape would drop the nulls).
    let back: kiln_spec::types::NodeDefinition = serde_json::from_str(&got).expect("parses");
    assert_eq!(serde_json::to_string(&back).expect("serializes"), got);
}

#[test]
fn v3_nodes_keep_empty_options_hidden_lists_and_declared_names() {
    use kiln_engine::nodes::{Hidden, InputDef, NodeSpec, OutputDef};
    let spec = NodeSpec::new("V3Save", "Save It", "testing")
        .v3()
        .input(InputDef::typed("images", "IMAGE"))
        .optional(InputDef::typed("mask", "MASK"))
        .hidden("prompt", Hidden::Prompt)
        .output(OutputDef::new("IMAGE").named("images").tooltip("The images."))
        .output(OutputDef::new("MASK"))
        .aliases(&["save"])
        .output_node();
    let info = serde_json::to_value(node_info(&spec)).expect("serializes");
    assert_eq!(info["display_name"], "Save It");
    assert_eq!(info["input"]["required"]["images"], serde_json::json!(["IMAGE", {}]));
    assert_eq!(info["input"]["optional"]["mask"], serde_json::json!(["MASK", {}]));
    assert_eq!(info["input"]["hidden"]["prompt"], serde_json::json!(["PROMPT"]));
    assert_eq!(
        info["input_order"],
        serde_json::json!({"required": ["images"], "optional": ["mask"], "hidden": ["prompt"]})
    );
    assert_eq!(info["output_tooltips"], serde_json::json!(["The images.", null]));
    assert_eq!(info["search_aliases"], serde_json::json!(["save"]));
    assert_eq!(info["output_node"], true);
}

#[test]
fn a_v1_node_serves_tooltips_past_its_outputs() {
    // ComfyUI's LoraLoaderModelOnly inherits LoraLoader's two output tooltips for its one output.
    use kiln_engine::nodes::{NodeSpec, OutputDef};
    let spec = NodeSpec::new("LoraLoaderModelOnly", "Load LoRA", "model/loaders")
        .output(OutputDef::new("MODEL").tooltip("The modified diffusion model."))
        .extra_output_tooltips(&["The modified CLIP model."]);
    let info = serde_json::to_value(node_info(&spec)).expect("serializes");
    assert_eq!(
        info["output_tooltips"],
        serde_json::json!(["The modified diffusion model.", "The modified CLIP model."])
    );
    assert!(info.get("output_matchtypes").is_none() && info.get("price_badge").is_none());
}
