//! The real `kiln` binary replaying ComfyUI's recorded HTTP exchanges (`tests/golden/comfyui`): the same
//! status for every request, and the same body where the body does not depend on the recording machine's
//! state (validation errors, unknown ids, empty error bodies, queue and history of an idle server).

use serde_json::Value;

use crate::binary::{start, temp_dir};

pub(crate) use kiln_tests::golden_dir;

/// One capture, parsed.
pub(crate) fn golden(case: &str) -> Value {
    let path = golden_dir().join(format!("{case}.json"));
    serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("JSON")
}

/// Which part of the answer must equal ComfyUI's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Compare {
    /// The status only (the body depends on the recording's state or machine).
    Status,
    /// The status and the whole body (tracebacks and volatile values aside).
    Body,
    /// The status, `number` and `node_errors` of an accepted prompt (its id is volatile).
    NodeErrors,
    /// The status, `number`, `node_errors` and the client-chosen `prompt_id`.
    IdAndNodeErrors,
}

/// Recorded cases Kiln answers like ComfyUI, in the order they were recorded where order matters.
const CASES: &[(&str, Compare)] = &[
    ("get_queue_idle", Compare::Body),
    ("get_prompt_idle", Compare::Body),
    ("get_history_empty", Compare::Body),
    ("get_api_jobs_empty", Compare::Body),
    ("get_api_prefix_queue", Compare::Body),
    ("get_history_unknown", Compare::Body),
    ("get_api_jobs_unknown", Compare::Body),
    ("get_api_jobs_bad_limit", Compare::Status),
    ("get_models_unknown", Compare::Body),
    ("get_object_info_NoSuchNode", Compare::Body),
    ("get_object_info_EmptyImage", Compare::Body),
    ("get_object_info_ImageInvert", Compare::Body),
    ("get_object_info_ImageScale", Compare::Body),
    ("get_object_info_PreviewImage", Compare::Body),
    ("get_object_info_SaveImage", Compare::Body),
    ("get_object_info_LoadImage", Compare::Body),
    ("get_system_stats_shape", Compare::Status),
    ("get_features", Compare::Status),
    ("get_embeddings", Compare::Body),
    ("get_view_absolute", Compare::Body),
    ("get_view_bad_type", Compare::Body),
    ("get_view_missing", Compare::Body),
    ("get_view_no_filename", Compare::Body),
    ("get_view_traversal", Compare::Body),
    ("get_view_traversal_subfolder", Compare::Body),
    ("post_interrupt_no_body", Compare::Body),
    ("post_interrupt_unknown_prompt", Compare::Body),
    ("post_queue_clear", Compare::Body),
    ("post_queue_delete_unknown", Compare::Body),
    ("post_history_clear_missing", Compare::Body),
    // In the order ComfyUI numbered them: each request without a `number` took the next one, rejected or
    // not (`post_prompt_int_as_string_accepted` got 11, `post_prompt_partial_accept` 20).
    ("post_prompt_no_prompt_key", Compare::Body),
    ("post_prompt_unknown_class_type", Compare::Body),
    ("post_prompt_unknown_class_type_with_title", Compare::Body),
    ("post_prompt_missing_class_type", Compare::Body),
    ("post_prompt_no_output_node", Compare::Body),
    ("post_prompt_empty_prompt", Compare::Body),
    ("post_prompt_required_input_missing", Compare::Body),
    ("post_prompt_required_link_input_missing", Compare::Body),
    ("post_prompt_int_above_max", Compare::Body),
    ("post_prompt_int_below_min", Compare::Body),
    ("post_prompt_int_not_a_number", Compare::Body),
    ("post_prompt_int_as_string_accepted", Compare::NodeErrors),
    ("post_prompt_int_as_float", Compare::NodeErrors),
    ("post_prompt_combo_not_in_list", Compare::Body),
    ("post_prompt_link_to_missing_node", Compare::Body),
    ("post_prompt_link_bad_output_index", Compare::Body),
    ("post_prompt_link_wrong_type", Compare::Body),
    ("post_prompt_cycle", Compare::Body),
    ("post_prompt_loadimage_missing_file", Compare::Body),
    ("post_prompt_bad_prompt_id", Compare::Body),
    ("post_prompt_partial_accept", Compare::NodeErrors),
    ("post_prompt_valid_client_prompt_id", Compare::IdAndNodeErrors),
    ("post_prompt_valid_front", Compare::NodeErrors),
    ("post_prompt_valid_number", Compare::NodeErrors),
    ("get_unknown_route", Compare::Status),
];

/// Tracebacks are Python frames; drop them on both sides.
fn scrub(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("traceback");
            map.values_mut().for_each(scrub);
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kiln_answers_the_recorded_requests_like_comfyui() {
    let data_dir = temp_dir("golden");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let mut failures = Vec::new();
    for (case, compare) in CASES {
        let recorded = golden(case);
        let request = &recorded["request"];
        let url = format!("http://{addr}{}", request["path"].as_str().expect("path"));
        let mut builder = match request["method"].as_str() {
            Some("POST") => http.post(&url),
            _ => http.get(&url),
        };
        if let Some(json) = request.get("json") {
            builder = builder.body(json.to_string());
        }
        let response = builder.send().await.expect("kiln answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let expected_status = recorded["response"]["status"].as_u64().unwrap_or_default() as u16;
        if status != expected_status {
            failures.push(format!("{case}: status {status}, ComfyUI {expected_status}: {text}"));
            continue;
        }
        let body = &recorded["response"]["body"];
        let expected = match body["kind"].as_str() {
            Some("json") => body["json"].clone(),
            _ => Value::String(String::new()),
        };
        let got = if body["kind"] == "json" {
            serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
        } else {
            Value::String(text.clone())
        };
        let (mut got, mut expected) = match compare {
            Compare::Status => continue,
            Compare::Body => (got, expected),
            Compare::NodeErrors => {
                let pick = |v: &Value| serde_json::json!({"number": v["number"], "node_errors": v["node_errors"]});
                (pick(&got), pick(&expected))
            }
            Compare::IdAndNodeErrors => {
                let pick = |v: &Value| serde_json::json!({"prompt_id": v["prompt_id"], "number": v["number"], "node_errors": v["node_errors"]});
                (pick(&got), pick(&expected))
            }
        };
        scrub(&mut got);
        scrub(&mut expected);
        if got != expected {
            failures.push(format!("{case}:\n  kiln:    {got}\n  comfyui: {expected}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} recorded exchanges differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}
