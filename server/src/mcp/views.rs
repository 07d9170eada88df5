//! What the MCP tools answer, built from the runtime's own views: node types from `object_info`, jobs from
//! the jobs API's detail, images read the way `/view` reads them, and a refused prompt as readable text.

use axum::http::request::Parts;
use base64::Engine as _;
use kiln_spec::types;
use rmcp::model::ContentBlock;
use serde_json::{Map, Value, json};

use crate::api::{SharedApi as _, ViewFileQuery, ViewFileResponse};
use crate::service::api::ApiServer;

/// The most image bytes one `get_job` answer attaches (before base64); further images are only listed.
const IMAGE_BUDGET: usize = 16 * 1024 * 1024;

/// One input of a node type as `{type, ...options}` (from its `[type, options]` spec): a combo's choices become
/// `type: "COMBO"` with `options`.
fn input(spec: &Value) -> Value {
    let mut described = Map::new();
    match spec.get(0) {
        Some(Value::Array(choices)) => {
            described.insert("type".to_owned(), json!("COMBO"));
            described.insert("options".to_owned(), Value::Array(choices.clone()));
        }
        Some(kind) => {
            described.insert("type".to_owned(), kind.clone());
        }
        None => {}
    }
    if let Some(Value::Object(options)) = spec.get(1) {
        for (key, value) in options {
            described.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    Value::Object(described)
}

/// A node type's display name (the class name when it has none).
pub(crate) fn display_name<'a>(name: &'a str, definition: &'a types::NodeDefinition) -> &'a str {
    let shown = match definition {
        types::NodeDefinition::Variant0(v3) => v3.display_name.as_deref(),
        types::NodeDefinition::Variant1(v1) => Some(v1.display_name.as_str()),
    };
    shown.filter(|shown| !shown.is_empty()).unwrap_or(name)
}

/// A node type (either `object_info` shape): category, display name, description, inputs (unless left out)
/// and outputs in index order.
pub(crate) fn node_type(
    name: &str,
    definition: &types::NodeDefinition,
    include_inputs: bool,
) -> Value {
    let info = serde_json::to_value(definition).unwrap_or(Value::Null);
    let list = |field: &str| info.get(field).and_then(Value::as_array).cloned().unwrap_or_default();
    let (names, lists) = (list("output_name"), list("output_is_list"));
    let outputs: Vec<Value> = list("output")
        .into_iter()
        .enumerate()
        .map(|(index, kind)| {
            let mut output = json!({"index": index, "name": names.get(index), "type": kind});
            if lists.get(index) == Some(&Value::Bool(true)) {
                output["is_list"] = json!(true);
            }
            output
        })
        .collect();
    let mut described = json!({
        "display_name": display_name(name, definition),
        "category": info.get("category"),
        "outputs": outputs,
    });
    if let Some(description) =
        info.get("description").filter(|d| d.as_str().is_some_and(|d| !d.is_empty()))
    {
        described["description"] = description.clone();
    }
    if info.get("output_node") == Some(&Value::Bool(true)) {
        described["output_node"] = json!(true);
    }
    if include_inputs {
        let inputs = |kind: &str| -> Map<String, Value> {
            let specs = info.get("input").and_then(|i| i.get(kind)).and_then(Value::as_object);
            specs.into_iter().flatten().map(|(name, spec)| (name.clone(), input(spec))).collect()
        };
        described["inputs"] =
            json!({"required": inputs("required"), "optional": inputs("optional")});
    }
    described
}

/// One error of a refused prompt: its message, details and the input it is about.
fn problem(error: &types::PromptError) -> String {
    let mut line = error.message.clone();
    if !error.details.is_empty() && error.details != error.message {
        line.push_str(": ");
        line.push_str(&error.details);
    }
    if let Some(input) = error.extra_info.get("input_name").and_then(Value::as_str) {
        line.push_str(&format!(" (input `{input}`)"));
    }
    line
}

/// A refused prompt as text a model can act on: the error, then every node's errors.
pub(crate) fn refusal(refused: &types::PromptErrorResponse) -> String {
    let mut text = format!("The workflow was not queued: {}", problem(&refused.error));
    if !refused.node_errors.is_empty() {
        text.push_str("\nNode errors:");
    }
    for (node, errors) in &refused.node_errors {
        for error in &errors.errors {
            text.push_str(&format!(
                "\n- node \"{node}\" ({}): {}",
                errors.class_type,
                problem(error)
            ));
        }
    }
    text
}

/// A job's status in the tools' words.
fn status(status: types::JobStatus) -> &'static str {
    match status {
        types::JobStatus::Pending => "pending",
        types::JobStatus::InProgress => "running",
        types::JobStatus::Completed => "success",
        types::JobStatus::Failed => "error",
        types::JobStatus::Cancelled => "interrupted",
    }
}

/// A job as `get_job` answers it: `{prompt_id, status, outputs, messages?, error?}`.
pub(crate) fn job(detail: &types::JobDetail) -> Value {
    let mut job = json!({
        "prompt_id": detail.id.to_string(),
        "status": status(detail.status),
        "outputs": detail.outputs,
    });
    if let Some(execution) = &detail.execution_status {
        job["messages"] = json!(execution.messages);
    }
    if let Some(error) = &detail.execution_error {
        job["error"] = json!(error);
    }
    job
}

/// The job's output images as image content, read through the caller's `/view`, within [`IMAGE_BUDGET`].
pub(crate) async fn images(
    server: &ApiServer,
    parts: &Parts,
    detail: &types::JobDetail,
) -> Vec<ContentBlock> {
    let mut blocks = Vec::new();
    let mut spent = 0;
    let mut left_out = Vec::new();
    for image in detail.outputs.values().flat_map(|output| &output.images) {
        let query = ViewFileQuery {
            filename: Some(image.filename.clone()),
            type_: Some(image.type_),
            subfolder: Some(image.subfolder.clone()),
            ..Default::default()
        };
        let ViewFileResponse::Ok { body, .. } = server.view_file(parts.clone(), query, None).await
        else {
            continue;
        };
        if !body.content_type.starts_with("image/") {
            continue;
        }
        if spent + body.bytes.len() > IMAGE_BUDGET {
            left_out.push(image.filename.clone());
            continue;
        }
        spent += body.bytes.len();
        let data = base64::engine::general_purpose::STANDARD.encode(&body.bytes);
        blocks.push(ContentBlock::image(data, body.content_type));
    }
    if !left_out.is_empty() {
        blocks.push(ContentBlock::text(format!(
            "{} more image(s) not attached (over {} MiB): {}",
            left_out.len(),
            IMAGE_BUDGET / (1024 * 1024),
            left_out.join(", ")
        )));
    }
    blocks
}
