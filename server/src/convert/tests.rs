//! The conversions against ComfyUI's recorded answers (`tests/golden/comfyui`): object_info of the
//! built-in nodes, and the validation errors of every recorded `POST /prompt` case, through the engine.

use kiln_engine::graph::{Prompt, validate};
use kiln_engine::nodes::builtin_registry;
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

#[test]
fn object_info_of_built_in_nodes_matches_comfyui() {
    let registry = builtin_registry(empty_input_dir());
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
    let registry = builtin_registry(empty_input_dir());
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
    let registry = builtin_registry(empty_input_dir());
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
