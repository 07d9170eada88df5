//! Kiln's MCP tools: the rmcp [`ServerHandler`] that lists them and dispatches their calls onto the runtime's
//! own operations ([`SharedApi`] on [`ApiServer`]), so a tool sees exactly what the matching HTTP route of
//! the caller would.
//!
//! Invariant: the caller (workspace, user) comes from the HTTP request of each call (the [`Parts`] rmcp puts
//! into the request context, whose extensions hold the gate's `Caller`), never from the MCP session.

use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use axum::http::request::Parts;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};

use super::views;
use crate::api::{ExecutePromptResponse, GetModelFilesResponse, SharedApi as _};
use crate::service::api::ApiServer;
use crate::service::worker::Service;

/// The longest `queue_prompt` may wait for its job.
const MAX_WAIT_SECONDS: f64 = 600.0;

/// How often a waiting `queue_prompt` looks whether its job ended.
const POLL: Duration = Duration::from_millis(100);

/// Why a tool call failed in a way the model should read (answered as a tool result with `isError`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    /// The arguments do not fit the tool's input schema.
    #[error("invalid arguments for {tool}: {why}")]
    Arguments {
        /// The tool.
        tool: &'static str,
        /// What is wrong.
        why: String,
    },
    /// `list_models` named a folder that does not exist.
    #[error("unknown model folder `{folder}`; the folders are: {known}")]
    UnknownFolder {
        /// The folder asked for.
        folder: String,
        /// The folders there are, comma-separated.
        known: String,
    },
    /// The workflow was not queued (it does not validate, or Kiln failed); the text names every node error.
    #[error("{0}")]
    NotQueued(String),
    /// No job with this id in the caller's workspace.
    #[error("no such job: {0}")]
    NoSuchJob(String),
}

impl ToolError {
    /// The tool result a model reads.
    fn result(&self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(self.to_string())])
    }
}

/// The arguments of `list_node_types`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListNodeTypes {
    filter: Option<String>,
    #[serde(default = "yes")]
    include_inputs: bool,
}

/// The arguments of `list_models`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListModels {
    folder: Option<String>,
}

/// The arguments of `queue_prompt`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueuePrompt {
    prompt: kiln_spec::IndexMap<String, serde_json::Map<String, Value>>,
    #[serde(default)]
    wait_seconds: f64,
}

/// The arguments of `get_job`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetJob {
    prompt_id: String,
    #[serde(default = "yes")]
    include_images: bool,
}

fn yes() -> bool {
    true
}

/// A tool's arguments, read against its struct.
fn arguments<T: serde::de::DeserializeOwned>(
    tool: &'static str,
    arguments: Option<JsonObject>,
) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| ToolError::Arguments { tool, why: e.to_string() })
}

/// A JSON Schema object from a `json!` literal.
fn schema(value: Value) -> Arc<JsonObject> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

/// The tools, as `tools/list` shows them.
static TOOLS: LazyLock<Vec<Tool>> = LazyLock::new(|| {
    let read_only = || ToolAnnotations::new().read_only(true).destructive(false);
    vec![
        Tool::new(
            "list_node_types",
            "Lists the node types a ComfyUI API-format workflow can use on this server, with each type's \
             category, display name, inputs and outputs. Each input is {type, ...options}: `type` is a data \
             type such as MODEL, LATENT, IMAGE, INT, FLOAT, STRING or BOOLEAN (connect those from another \
             node's output of that type, or give a literal for INT/FLOAT/STRING/BOOLEAN), or COMBO with its \
             allowed `options`; `default`, `min`, `max` and `step` say which literals are valid. Outputs are \
             listed in index order: a link to output i of node n is written [\"n\", i]. Use `filter` to \
             narrow the list (e.g. \"sampler\", \"image\", \"loader\").",
            schema(json!({
                "type": "object",
                "properties": {
                    "filter": {
                        "type": "string",
                        "description": "Only node types whose class name or display name contains this text \
                                        (case-insensitive). Omit to list every node type."
                    },
                    "include_inputs": {
                        "type": "boolean",
                        "default": true,
                        "description": "Include each node type's inputs (false: only names, categories and \
                                        outputs, for a quick overview)."
                    }
                },
                "additionalProperties": false
            })),
        )
        .with_title("List node types")
        .with_annotations(read_only()),
        Tool::new(
            "list_models",
            "Lists the model files installed on this server, by model folder (checkpoints, loras, vae, \
             text_encoders, diffusion_models, upscale_models, ...), as {folder: [file names]}. A loader \
             node's file input takes one of these names exactly as listed.",
            schema(json!({
                "type": "object",
                "properties": {
                    "folder": {
                        "type": "string",
                        "description": "One model folder, e.g. \"checkpoints\". Omit to list every folder."
                    }
                },
                "additionalProperties": false
            })),
        )
        .with_title("List models")
        .with_annotations(read_only()),
        Tool::new(
            "queue_prompt",
            "Queues a workflow to run. `prompt` is a ComfyUI API-format workflow: an object keyed by node \
             id (\"1\", \"2\", ...), each {\"class_type\": <node type from list_node_types>, \"inputs\": \
             {<input name>: <literal value> or [<source node id>, <output index>]}}. It needs at least one \
             output node (e.g. SaveImage). Answers {prompt_id, number}; with `wait_seconds` > 0 it waits up \
             to that long for the job to finish and answers like get_job (status, outputs, images). A \
             workflow that does not validate is not queued: the error names each node's problems, so fix \
             the graph and call again.",
            schema(json!({
                "type": "object",
                "properties": {
                    "prompt": {
                        "type": "object",
                        "description": "The workflow in ComfyUI API format, keyed by node id.",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "class_type": {"type": "string"},
                                "inputs": {"type": "object"}
                            },
                            "required": ["class_type", "inputs"]
                        }
                    },
                    "wait_seconds": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": MAX_WAIT_SECONDS,
                        "default": 0,
                        "description": "Seconds to wait for the job to end before answering (0: answer as \
                                        soon as it is queued)."
                    }
                },
                "required": ["prompt"],
                "additionalProperties": false
            })),
        )
        .with_title("Queue a workflow")
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        Tool::new(
            "get_job",
            "Reports a queued workflow's job: {prompt_id, status (pending, running, success, error or \
             interrupted), outputs (per output node: images, text, ...), messages, error} and, unless \
             include_images is false, each output image as an image content block. Call it again while the \
             status is pending or running.",
            schema(json!({
                "type": "object",
                "properties": {
                    "prompt_id": {
                        "type": "string",
                        "description": "The prompt_id queue_prompt answered."
                    },
                    "include_images": {
                        "type": "boolean",
                        "default": true,
                        "description": "Attach the output images (PNG, base64)."
                    }
                },
                "required": ["prompt_id"],
                "additionalProperties": false
            })),
        )
        .with_title("Get a job")
        .with_annotations(read_only()),
    ]
});

/// The MCP server behind `/mcp`: the tools over the runtime. It holds the runtime weakly: the runtime keeps
/// the endpoint, and a strong reference back would keep both alive forever.
#[derive(Clone)]
pub(crate) struct KilnTools {
    runtime: Weak<Service>,
}

impl KilnTools {
    /// The tools over `runtime`.
    pub(crate) fn new(runtime: Weak<Service>) -> KilnTools {
        KilnTools { runtime }
    }
}

/// The tools during one call, over the live runtime.
struct Tools {
    server: ApiServer,
}

impl Tools {
    async fn list_node_types(&self, parts: Parts, args: ListNodeTypes) -> CallToolResult {
        let crate::api::GetObjectInfoResponse::Ok(all) = self.server.get_object_info(parts).await;
        let needle = args.filter.map(|f| f.to_lowercase());
        let listed: serde_json::Map<String, Value> = all
            .0
            .iter()
            .filter(|(name, definition)| {
                needle.as_ref().is_none_or(|n| {
                    name.to_lowercase().contains(n)
                        || views::display_name(name, definition).to_lowercase().contains(n)
                })
            })
            .map(|(name, definition)| {
                (name.clone(), views::node_type(name, definition, args.include_inputs))
            })
            .collect();
        text(&Value::Object(listed))
    }

    async fn list_models(
        &self,
        parts: Parts,
        args: ListModels,
    ) -> Result<CallToolResult, ToolError> {
        let crate::api::GetModelFoldersResponse::Ok(folders) =
            self.server.get_model_folders(parts.clone()).await;
        let folders = folders.0;
        let wanted = match args.folder {
            Some(folder) if !folders.contains(&folder) => {
                return Err(ToolError::UnknownFolder { folder, known: folders.join(", ") });
            }
            Some(folder) => vec![folder],
            None => folders,
        };
        let mut listed = serde_json::Map::new();
        for folder in wanted {
            let files = match self.server.get_model_files(parts.clone(), folder.clone()).await {
                GetModelFilesResponse::Ok(files) => files.0,
                GetModelFilesResponse::NotFound => Vec::new(),
            };
            listed.insert(folder, json!(files));
        }
        Ok(text(&Value::Object(listed)))
    }

    async fn queue_prompt(
        &self,
        parts: Parts,
        args: QueuePrompt,
        cancelled: impl Future<Output = ()> + Send,
    ) -> Result<CallToolResult, ToolError> {
        if !(0.0..=MAX_WAIT_SECONDS).contains(&args.wait_seconds) {
            return Err(ToolError::Arguments {
                tool: "queue_prompt",
                why: format!("wait_seconds must be between 0 and {MAX_WAIT_SECONDS}"),
            });
        }
        let request =
            kiln_spec::types::PromptRequest { prompt: Some(args.prompt), ..Default::default() };
        let accepted = match self.server.execute_prompt(parts.clone(), None, request).await {
            ExecutePromptResponse::Ok(accepted) => accepted,
            ExecutePromptResponse::BadRequest(refused)
            | ExecutePromptResponse::InternalServerError(refused) => {
                return Err(ToolError::NotQueued(views::refusal(&refused)));
            }
        };
        let prompt_id = accepted.prompt_id.to_string();
        if args.wait_seconds == 0.0 {
            let mut answer = json!({"prompt_id": prompt_id, "number": accepted.number});
            if !accepted.node_errors.is_empty() {
                answer["node_errors"] = json!(accepted.node_errors);
            }
            return Ok(text(&answer));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.wait_seconds);
        tokio::pin!(cancelled);
        while !self.ended(&parts, &prompt_id) && tokio::time::Instant::now() < deadline {
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = &mut cancelled => break,
            }
        }
        self.get_job(parts, GetJob { prompt_id, include_images: true }).await
    }

    /// Whether the caller's prompt `id` has ended (its history entry is stored).
    fn ended(&self, parts: &Parts, id: &str) -> bool {
        let caller = self.server.caller(parts);
        self.server.0.history().of(caller.workspace_id()).get(id).is_some()
    }

    async fn get_job(&self, parts: Parts, args: GetJob) -> Result<CallToolResult, ToolError> {
        let detail = match self.server.get_job(parts.clone(), args.prompt_id.clone()).await {
            crate::api::GetJobResponse::Ok(detail) => detail,
            crate::api::GetJobResponse::BadRequest(_) | crate::api::GetJobResponse::NotFound(_) => {
                return Err(ToolError::NoSuchJob(args.prompt_id));
            }
        };
        let mut content = vec![ContentBlock::text(views::job(&detail).to_string())];
        if args.include_images {
            content.extend(views::images(&self.server, &parts, &detail).await);
        }
        Ok(CallToolResult::success(content))
    }
}

/// A JSON value as a tool's text result.
fn text(value: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(value.to_string())])
}

impl ServerHandler for KilnTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kiln", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Kiln runs ComfyUI workflows. Find node types with list_node_types and model files with \
                 list_models, queue an API-format workflow with queue_prompt (wait_seconds to wait for it), \
                 and read its status, outputs and images with get_job.",
            )
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(TOOLS.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        TOOLS.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Always there over HTTP; without it the runtime's fallback caller applies (the local caller, or on
        // the cloud runtime one that sees nothing).
        let parts = context
            .extensions
            .get::<Parts>()
            .cloned()
            .unwrap_or_else(|| axum::http::Request::new(()).into_parts().0);
        let name = request.name.as_ref();
        if self.get_tool(name).is_none() {
            return Err(ErrorData::invalid_params(format!("unknown tool `{name}`"), None));
        }
        let Some(runtime) = self.runtime.upgrade() else {
            return Err(ErrorData::internal_error("the server is shutting down", None));
        };
        let tools = Tools { server: ApiServer(runtime) };
        let args = request.arguments;
        let result = async {
            match name {
                "list_node_types" => {
                    Ok(tools.list_node_types(parts, arguments("list_node_types", args)?).await)
                }
                "list_models" => tools.list_models(parts, arguments("list_models", args)?).await,
                "queue_prompt" => {
                    let args = arguments("queue_prompt", args)?;
                    tools.queue_prompt(parts, args, context.ct.cancelled_owned()).await
                }
                _ => tools.get_job(parts, arguments("get_job", args)?).await,
            }
        }
        .await;
        Ok(result.unwrap_or_else(|e| e.result()).into())
    }
}
