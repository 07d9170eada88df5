//! Every validation error type, in ComfyUI's shape (see also the server's golden comparison).

use kiln_engine::cache::CachePolicy;
use kiln_engine::graph::{NodeId, Prompt, PromptRejection, ValidatedPrompt, validate};
use serde_json::{Value, json};

use crate::harness::Harness;

fn check(prompt: Value) -> Result<ValidatedPrompt, PromptRejection> {
    let h = Harness::new(CachePolicy::None);
    validate(&Prompt::from_json(&prompt).expect("object"), &h.registry, None)
}

fn rejected(prompt: Value) -> PromptRejection {
    check(prompt).expect_err("the prompt is rejected")
}

fn save(input: Value) -> Value {
    json!({"class_type": "SaveImage", "inputs": {"images": input, "filename_prefix": "x"}})
}

fn empty_image(width: Value) -> Value {
    json!({"class_type": "EmptyImage", "inputs": {"width": width, "height": 64, "batch_size": 1, "color": 0}})
}

/// The one node error of a rejection: (node, type, message, details, extra_info).
fn only_error(
    r: &PromptRejection,
) -> (String, String, String, String, serde_json::Map<String, Value>) {
    assert_eq!(r.node_errors.len(), 1, "{:?}", r.node_errors);
    let (node, errors) = r.node_errors.iter().next().expect("one");
    let e = &errors.errors[0];
    (node.0.clone(), e.kind.clone(), e.message.clone(), e.details.clone(), (*e.extra_info).clone())
}

#[test]
fn prompt_level_errors() {
    assert_eq!(rejected(json!({})).error.kind, "prompt_no_outputs");
    let r = rejected(json!({"1": empty_image(json!(64))}));
    assert_eq!((r.error.kind.as_str(), r.node_errors.len()), ("prompt_no_outputs", 0));
    let r = rejected(json!({"1": {"inputs": {}}}));
    assert_eq!(r.error.kind, "missing_node_type");
    assert_eq!(
        r.error.message,
        "Node 'ID #1' has no class_type. The workflow may be corrupted or a custom node is missing."
    );
    assert_eq!(r.error.extra_info["class_type"], Value::Null);
    let r = rejected(
        json!({"1": {"class_type": "NoSuchNode", "inputs": {}, "_meta": {"title": "My Node"}}}),
    );
    assert_eq!(r.error.message, "Node 'My Node' not found. The custom node may not be installed.");
    assert_eq!(r.error.details, "Node ID '#1'");
}

#[test]
fn required_input_missing_upstream_leaves_details_empty() {
    let r = rejected(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": save(json!(["2", 0])),
    }));
    assert_eq!(
        (r.error.kind.as_str(), r.error.details.as_str()),
        ("prompt_outputs_failed_validation", "")
    );
    let (node, kind, _, details, extra) = only_error(&r);
    assert_eq!(
        (node.as_str(), kind.as_str(), details.as_str()),
        ("1", "required_input_missing", "width")
    );
    assert_eq!(extra["input_name"], "width");
    assert_eq!(r.node_errors[&NodeId::from("1")].dependent_outputs, [NodeId::from("3")]);
}

#[test]
fn an_output_nodes_own_error_fills_the_details() {
    let r = rejected(json!({"3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x"}}}));
    assert_eq!(r.error.details, "Required input is missing: images");
}

#[test]
fn value_range_type_and_list_errors() {
    let (_, kind, message, _, extra) =
        only_error(&rejected(json!({"1": empty_image(json!(20000)), "2": save(json!(["1", 0]))})));
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("value_bigger_than_max", "Value 20000 bigger than max of 16384")
    );
    assert_eq!(
        extra["input_config"],
        json!(["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}])
    );
    let (_, kind, message, ..) =
        only_error(&rejected(json!({"1": empty_image(json!(0)), "2": save(json!(["1", 0]))})));
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("value_smaller_than_min", "Value 0 smaller than min of 1")
    );
    let (_, kind, message, details, extra) =
        only_error(&rejected(json!({"1": empty_image(json!("abc")), "2": save(json!(["1", 0]))})));
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("invalid_input_type", "Failed to convert an input value to a INT value")
    );
    assert_eq!(details, "width, abc, invalid literal for int() with base 10: 'abc'");
    assert_eq!(extra["received_value"], "abc");
    let r = rejected(json!({
        "1": empty_image(json!(64)),
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bogus", "width": 32, "height": 32, "crop": "disabled"}},
        "3": save(json!(["2", 0])),
    }));
    let (_, kind, _, details, extra) = only_error(&r);
    assert_eq!(kind, "value_not_in_list");
    assert_eq!(
        details,
        "upscale_method: 'bogus' not in ['nearest-exact', 'bilinear', 'area', 'bicubic', 'lanczos']"
    );
    assert_eq!(
        extra["input_config"],
        json!([["nearest-exact", "bilinear", "area", "bicubic", "lanczos"], {}])
    );
}

#[test]
fn convertible_values_are_accepted_and_normalised() {
    let validated = check(json!({"1": empty_image(json!("64")), "2": save(json!(["1", 0]))}))
        .expect("\"64\" is an INT");
    assert_eq!(
        validated.prompt.nodes[&NodeId::from("1")].inputs["width"],
        kiln_engine::graph::Input::Literal(json!(64))
    );
    check(json!({"1": empty_image(json!(64.7)), "2": save(json!(["1", 0]))}))
        .expect("64.7 is an INT");
}

#[test]
fn link_errors() {
    let (node, kind, _, details, extra) = only_error(&rejected(json!({
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": save(json!(["2", 0])),
    })));
    assert_eq!((node.as_str(), kind.as_str()), ("2", "return_type_mismatch"));
    assert_eq!(details, "image, received_type(LATENT) mismatch input_type(IMAGE)");
    assert_eq!(extra["linked_node"], json!(["1", 0]));

    // A link to a missing node is filed under the node holding it, with its consumer's input (as upstream).
    let (node, kind, _, details, extra) = only_error(&rejected(json!({
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["99", 0]}},
        "3": save(json!(["2", 0])),
    })));
    assert_eq!(
        (node.as_str(), kind.as_str(), details.as_str()),
        ("2", "exception_during_inner_validation", "'99'")
    );
    assert_eq!(
        (extra["input_name"].as_str(), extra["exception_type"].as_str()),
        (Some("images"), Some("KeyError"))
    );
    assert_eq!(extra["linked_node"], json!(["2", 0]));

    let (_, kind, _, details, _) = only_error(&rejected(json!({
        "1": empty_image(json!(64)),
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 5]}},
        "3": save(json!(["2", 0])),
    })));
    assert_eq!(
        (kind.as_str(), details.as_str()),
        ("exception_during_inner_validation", "tuple index out of range")
    );

    // An output node's own broken link is an exception during validation.
    let (node, kind, ..) = only_error(&rejected(json!({"3": save(json!(["99", 0]))})));
    assert_eq!((node.as_str(), kind.as_str()), ("3", "exception_during_validation"));

    let (_, kind, ..) = only_error(&rejected(json!({"3": save(json!(["1", 0, 7]))})));
    assert_eq!(kind, "bad_linked_input");
}

#[test]
fn cycles_are_reported_on_every_node_of_the_cycle() {
    let r = rejected(json!({
        "1": empty_image(json!(64)),
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0]}},
        "3": save(json!(["2", 0])),
    }));
    assert_eq!(
        r.error.details,
        "Dependency cycle detected: 3 (SaveImage) -> 2 (ImageInvert) -> 3 (SaveImage)"
    );
    assert_eq!(r.node_errors.len(), 2);
    for errors in r.node_errors.values() {
        assert_eq!(errors.errors[0].kind, "dependency_cycle");
        assert_eq!(errors.errors[0].extra_info["cycle_nodes"], json!(["3", "2"]));
    }
}

#[test]
fn custom_validation_runs_for_load_image() {
    let (_, kind, message, details, _) = only_error(&rejected(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "missing.png"}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    })));
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("custom_validation_failed", "Custom validation failed for node")
    );
    assert_eq!(details, "image - Invalid image file: missing.png");
    let (_, kind, ..) = only_error(&rejected(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "../../etc/passwd"}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    })));
    assert_eq!(kind, "custom_validation_failed", "a path escape is not a valid image");
}

#[test]
fn a_prompt_with_some_valid_outputs_is_accepted_with_node_errors() {
    let validated = check(json!({
        "1": empty_image(json!(64)),
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": save(json!(["2", 0])),
        "4": empty_image(json!(99999)),
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
    }))
    .expect("output 3 validates");
    assert_eq!(validated.outputs, [NodeId::from("3")]);
    let errors = &validated.node_errors[&NodeId::from("4")];
    assert_eq!(errors.errors[0].kind, "value_bigger_than_max");
    assert_eq!(errors.dependent_outputs, [NodeId::from("5")]);
}
