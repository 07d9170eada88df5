//! The local runtime's implementation of the generated `SharedApi` and `LocalApi` traits. Each method parses
//! its input, asks the engine, the queue, the history or the file layer, and maps the answer to the
//! operation's response; it makes no other decisions.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use kiln_engine::nodes::FileKind;
use kiln_engine::queue::Placement;
use kiln_engine::roots::Roots;
use kiln_spec::types;
use serde_json::{Map, Value};

use super::history::queue_item;
use super::jobs::{self, Filter, Queued as QueuedJob, Source};
use super::models;
use super::numbering;
use super::prompts::{self, SubmitError};
use super::userdata::{self, UserDataError};
use super::worker::{Queued, Service};
use crate::api::*;
use crate::convert;
use crate::files::{self, Extent, Upload, UploadError, ViewError, ViewRequest};
use crate::workspace::Caller;
use crate::ws::Frame;

/// The service behind the generated router: the shared and local operations of both runtimes (the cloud
/// runtime's own are `cloud::api`).
#[derive(Clone)]
pub(crate) struct ApiServer(pub(crate) Arc<Service>);

/// An `ErrorResponse` with a code and a message.
pub(crate) fn error(code: &str, message: impl Into<String>) -> types::ErrorResponse {
    types::ErrorResponse { code: code.to_owned(), details: None, message: message.into() }
}

fn simple(message: impl Into<String>) -> types::SimpleError {
    types::SimpleError { error: message.into(), invalid_ids: Vec::new() }
}

fn prompt_error(kind: &str, message: &str, details: &str) -> types::PromptErrorResponse {
    types::PromptErrorResponse {
        error: types::PromptError {
            details: details.to_owned(),
            extra_info: Map::new(),
            message: message.to_owned(),
            type_: kind.to_owned(),
        },
        node_errors: Default::default(),
    }
}

/// A queue store failure, in the jobs routes' error shape (logged once).
fn store_failed(cause: String) -> types::SimpleError {
    simple(internal("the queue store", cause).message)
}

fn is_true(flag: Option<&str>) -> bool {
    matches!(flag, Some("true") | Some("1"))
}

/// Why an upload was refused: the error body, by the status it is answered with.
#[derive(Debug)]
enum Refusal {
    /// 400: the form, a name or an image is not usable.
    BadRequest(types::ErrorResponse),
    /// 403: the mask's original lies outside its root.
    Forbidden(types::ErrorResponse),
    /// 404: the mask's original does not exist.
    NotFound(types::ErrorResponse),
    /// 500: Kiln could not write the file (logged).
    Failed(types::ErrorResponse),
}

impl From<types::ErrorResponse> for Refusal {
    fn from(body: types::ErrorResponse) -> Refusal {
        Refusal::BadRequest(body)
    }
}

/// The fields of an upload form.
#[derive(Default)]
struct UploadForm {
    filename: Option<String>,
    bytes: Bytes,
    kind: Option<String>,
    subfolder: String,
    overwrite: bool,
    original_ref: Option<String>,
}

async fn read_upload(
    mut form: axum::extract::Multipart,
) -> Result<UploadForm, types::ErrorResponse> {
    let mut upload = UploadForm::default();
    let bad =
        |e: axum::extract::multipart::MultipartError| error("invalid_multipart", e.body_text());
    while let Some(field) = form.next_field().await.map_err(bad)? {
        match field.name().unwrap_or_default() {
            "image" => {
                upload.filename = Some(field.file_name().unwrap_or_default().to_owned());
                upload.bytes = field.bytes().await.map_err(bad)?;
            }
            "type" => upload.kind = Some(field.text().await.map_err(bad)?),
            "subfolder" => upload.subfolder = field.text().await.map_err(bad)?,
            "overwrite" => {
                upload.overwrite = is_true(Some(field.text().await.map_err(bad)?.as_str()))
            }
            "original_ref" => upload.original_ref = Some(field.text().await.map_err(bad)?),
            _ => {}
        }
    }
    Ok(upload)
}

impl ApiServer {
    /// Who is asking: the caller the authentication layer put into the request, else the runtime's fallback
    /// (the local caller; on the cloud runtime, one that sees nothing).
    /// Answers a request to `/mcp` with the runtime's MCP endpoint.
    async fn mcp(&self, request: axum::extract::Request) -> axum::response::Response {
        self.0.mcp.serve(request).await
    }

    pub(crate) fn caller(&self, parts: &Parts) -> Caller {
        parts.extensions.get::<Caller>().cloned().unwrap_or_else(|| self.0.fallback.clone())
    }

    /// Runs `f` over the model folders on a blocking thread (listings walk directories, maybe on slow disks);
    /// `None` if it panicked.
    pub(super) async fn models<T: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::model_folders::ModelFolders) -> T + Send + 'static,
    ) -> Option<T> {
        let folders = self.0.model_folders.clone();
        tokio::task::spawn_blocking(move || f(&folders)).await.ok()
    }

    fn jobs_sources<'a>(
        history: &'a super::history::History,
        queued: &'a [(kiln_engine::queue::QueueEntry<Queued>, bool)],
    ) -> Vec<Source<'a>> {
        let mut sources: Vec<Source<'a>> = queued
            .iter()
            .map(|(e, running)| {
                Source::Queue(QueuedJob {
                    prompt_id: &e.id,
                    number: e.number,
                    prompt: &e.payload.prompt_json,
                    extra_data: &e.payload.extra_data,
                    running: *running,
                })
            })
            .collect();
        sources.extend(history.all().map(Source::Done));
        sources
    }

    /// Cancels jobs of the caller's workspace off the async threads (dequeuing writes the store); whether each
    /// was cancelled.
    async fn cancel_all(&self, caller: Caller, ids: Vec<String>) -> Result<Vec<bool>, String> {
        let runtime = self.0.clone();
        let cancelled = tokio::task::spawn_blocking(move || {
            ids.iter().map(|id| runtime.cancel(&caller, id)).collect::<Result<Vec<bool>, _>>()
        });
        cancelled.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    }

    async fn store_upload(
        &self,
        caller: &Caller,
        body: axum::extract::Multipart,
        mask: bool,
    ) -> Result<types::UploadImageResponse, Refusal> {
        let form = read_upload(body).await?;
        let filename =
            form.filename.ok_or_else(|| error("no_file", "the form has no `image` file part"))?;
        let kind = match form.kind.as_deref() {
            None | Some("input") => FileKind::Input,
            Some("output") => FileKind::Output,
            Some("temp") => FileKind::Temp,
            Some(other) => {
                return Err(Refusal::BadRequest(error(
                    "invalid_type",
                    format!("unknown type `{other}`; use input, output or temp"),
                )));
            }
        };
        let roots = caller.workspace.roots().clone();
        let stored = caller.workspace.stored.clone();
        let subfolder = form.subfolder;
        let overwrite = form.overwrite;
        let original = if mask {
            let reference = form
                .original_ref
                .ok_or_else(|| error("no_original_ref", "the form has no `original_ref`"))?;
            Some(reference)
        } else {
            None
        };
        let stored = tokio::task::spawn_blocking(move || {
            let bytes = match original {
                Some(reference) => apply_mask(&roots, stored.as_deref(), &reference, &form.bytes)?,
                None => form.bytes.to_vec(),
            };
            let upload = Upload {
                filename: &filename,
                bytes: &bytes,
                kind,
                subfolder: &subfolder,
                overwrite,
            };
            files::store_upload(&roots, &upload, stored.as_deref()).map_err(|e| match e {
                UploadError::EmptyName => {
                    Refusal::BadRequest(error("empty_filename", e.to_string()))
                }
                UploadError::OutsideRoot(..) => {
                    Refusal::BadRequest(error("path_escape", e.to_string()))
                }
                UploadError::Io(_) => Refusal::Failed(internal("writing the upload", e)),
            })
        })
        .await
        .map_err(|e| Refusal::Failed(internal("storing the upload", e)))??;
        Ok(types::UploadImageResponse {
            name: stored.name,
            subfolder: stored.subfolder,
            type_: convert::file_type(stored.kind),
        })
    }
}

/// Brings in the top level of the caller's `kind` folder from the object store (when there is one), so that
/// its listings show the files uploaded through other nodes; a failing store leaves the local listing, with one
/// log line.
pub(crate) async fn bring_folder(caller: &Caller, kind: FileKind) {
    let Some(stored) = caller.workspace.stored.clone() else { return };
    crate::store::logged("cannot list the object store", move || stored.bring_folder(kind)).await;
}

/// Copies the alpha channel of `mask` onto the image `original_ref` names (ComfyUI's `/upload/mask`).
fn apply_mask(
    roots: &Roots,
    stored: Option<&crate::store::WorkspaceFiles>,
    reference: &str,
    mask: &[u8],
) -> Result<Vec<u8>, Refusal> {
    let shape = "original_ref must be JSON of the form {\"filename\", \"subfolder\"?, \"type\"?}";
    let original: types::MaskOriginal = serde_json::from_str(reference)
        .map_err(|e| e.to_string())
        .and_then(|value| crate::api::strict_from_value(&value).map_err(|e| e.error.to_string()))
        .map_err(|why| error("invalid_original_ref", format!("{shape}: {why}")))?;
    let request = ViewRequest {
        filename: Some(original.filename),
        // The original is in the output directory unless said otherwise.
        kind: Some(original.type_.map_or(FileKind::Output, convert::file_kind)),
        subfolder: original.subfolder,
        ..Default::default()
    };
    let source = files::view_stored(roots, stored, &request).map_err(|e| {
        let refused =
            |message: &str| error("invalid_original_ref", format!("original_ref: {message}"));
        match e {
            ViewError::BadName => {
                Refusal::BadRequest(refused("the file name is empty, absolute or contains `..`"))
            }
            ViewError::OutsideRoot => Refusal::Forbidden(refused("the subfolder escapes its root")),
            ViewError::NotFound => Refusal::NotFound(error(
                "original_not_found",
                "original_ref names no existing image",
            )),
            ViewError::Unreadable(why) => Refusal::BadRequest(error(
                "invalid_image",
                format!("cannot read the original: {why}"),
            )),
            // No range is asked for here.
            ViewError::RangeNotSatisfiable { .. } => Refusal::BadRequest(error(
                "invalid_image",
                "cannot read the original: the byte range is not satisfiable",
            )),
        }
    })?;
    let mut image = image::load_from_memory(&source.bytes)
        .map_err(|e| error("invalid_image", e.to_string()))?
        .to_rgba8();
    let alpha = image::load_from_memory(mask)
        .map_err(|e| error("invalid_image", e.to_string()))?
        .to_rgba8();
    let alpha = image::imageops::resize(
        &alpha,
        image.width(),
        image.height(),
        image::imageops::FilterType::Triangle,
    );
    for (pixel, mask) in image.pixels_mut().zip(alpha.pixels()) {
        pixel.0[3] = mask.0[3];
    }
    let mut out = std::io::Cursor::new(Vec::new());
    image
        .write_to(&mut out, image::ImageFormat::Png)
        .map_err(|e| error("invalid_image", e.to_string()))?;
    Ok(out.into_inner())
}

fn user_data_error<T>(
    e: UserDataError,
    bad: fn(String) -> T,
    forbidden: fn(String) -> T,
    not_found: fn(String) -> T,
) -> T {
    match e {
        UserDataError::BadRequest(m) => bad(m),
        UserDataError::Forbidden(m) => forbidden(m),
        UserDataError::NotFound(m) | UserDataError::Conflict(m) => not_found(m),
    }
}

/// Moves a hub connection's frames into the socket and the client's messages into the hub, until the client
/// closes, a send fails, or the hub drops the socket because its client stopped reading (then the socket is
/// closed at once, even with a send blocked on the full connection, and the frames still queued are freed).
async fn pump(socket: WebSocket, runtime: Arc<Service>, connection: crate::ws::Connection) {
    let crate::ws::Connection { id, sid, mut frames } = connection;
    let (mut sender, mut receiver) = socket.split();
    tracing::debug!(%sid, "websocket connected");
    let dropped = frames.dropped();
    let outgoing = async move {
        while let Some(frame) = frames.recv().await {
            let message = match frame {
                Frame::Text(text) => Message::Text(text.into()),
                Frame::Binary(bytes) => Message::Binary(bytes),
            };
            if sender.send(message).await.is_err() {
                break;
            }
        }
    };
    let incoming = async {
        while let Some(Ok(message)) = receiver.next().await {
            match message {
                Message::Text(text) => {
                    runtime.hub.client_text(id, text.as_str(), &runtime.features)
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    tokio::select! {
        () = outgoing => {}
        () = incoming => {}
        () = dropped => {}
    }
    runtime.hub.disconnect(id);
}

impl SharedApi for ApiServer {
    async fn mcp_post(&self, request: axum::extract::Request) -> axum::response::Response {
        self.mcp(request).await
    }

    async fn mcp_get(&self, request: axum::extract::Request) -> axum::response::Response {
        self.mcp(request).await
    }

    async fn mcp_delete(&self, request: axum::extract::Request) -> axum::response::Response {
        self.mcp(request).await
    }

    async fn get_embeddings(&self, _: Parts) -> GetEmbeddingsResponse {
        let names = self.models(models::embeddings).await.unwrap_or_default();
        GetEmbeddingsResponse::Ok(types::StringList(names))
    }

    async fn get_model_folder_paths(&self, _: Parts) -> GetModelFolderPathsResponse {
        let folders = models::folder_list(&self.0.model_folders);
        GetModelFolderPathsResponse::Ok(types::ModelFolderList(folders))
    }

    async fn get_model_file_details(
        &self,
        _: Parts,
        folder: String,
    ) -> GetModelFileDetailsResponse {
        match self.models(move |m| models::details(m, &folder)).await.flatten() {
            Some(files) => GetModelFileDetailsResponse::Ok(types::ModelFileList(files)),
            None => GetModelFileDetailsResponse::NotFound,
        }
    }

    async fn get_extensions(&self, _: Parts) -> GetExtensionsResponse {
        // Kiln ships no frontend extensions.
        GetExtensionsResponse::Ok(types::StringList(Vec::new()))
    }

    async fn get_open_api_document(&self, _: Parts) -> GetOpenApiDocumentResponse {
        GetOpenApiDocumentResponse::Ok(self.0.openapi.clone())
    }

    async fn get_liveness(&self, _: Parts) -> GetLivenessResponse {
        GetLivenessResponse::Ok("ok".to_owned())
    }

    async fn get_readiness(&self, _: Parts) -> GetReadinessResponse {
        let not_ready =
            |code, message| GetReadinessResponse::ServiceUnavailable(error(code, message));
        if self.0.drain.is_draining() {
            return not_ready(
                "draining",
                "the server is stopping: it runs no new prompt (prompts accepted now run at the next start)",
            );
        }
        if !self.0.storage.is_writable().await {
            return not_ready(
                "database_unavailable",
                "the database takes no writes (its writer stopped, or it cannot be reached): no prompt can be accepted",
            );
        }
        GetReadinessResponse::Ok("ready".to_owned())
    }

    async fn get_metrics(&self, _: Parts) -> GetMetricsResponse {
        let text = self.0.metrics.encode(&self.0.snapshot());
        GetMetricsResponse::Ok(Binary {
            content_type: crate::metrics::CONTENT_TYPE.to_owned(),
            bytes: text.into(),
        })
    }

    async fn get_features(&self, _: Parts) -> GetFeaturesResponse {
        GetFeaturesResponse::Ok(self.0.features.clone())
    }

    async fn get_global_subgraphs(&self, _: Parts) -> GetGlobalSubgraphsResponse {
        // No node packs ship subgraph blueprints in Kiln yet.
        GetGlobalSubgraphsResponse::Ok(types::GlobalSubgraphs(Default::default()))
    }

    async fn get_global_subgraph(&self, _: Parts, _id: String) -> GetGlobalSubgraphResponse {
        GetGlobalSubgraphResponse::Ok(types::GlobalSubgraphData(None))
    }

    async fn get_history(&self, parts: Parts, query: GetHistoryQuery) -> GetHistoryResponse {
        let caller = self.caller(&parts);
        let histories = self.0.history();
        let page = histories.of(caller.workspace_id()).page(query.max_items, query.offset);
        GetHistoryResponse::Ok(types::HistoryResponse(
            page.into_iter().map(|r| (r.prompt_id.clone(), r.entry())).collect(),
        ))
    }

    async fn manage_history(
        &self,
        parts: Parts,
        body: types::HistoryManageRequest,
    ) -> ManageHistoryResponse {
        let caller = self.caller(&parts);
        let clear = body.clear == Some(true);
        match self.0.remove_history(&caller, clear, &body.delete).await {
            Ok(()) => ManageHistoryResponse::Ok,
            Err(e) => ManageHistoryResponse::InternalServerError(internal("the history store", e)),
        }
    }

    async fn get_history_for_prompt(
        &self,
        parts: Parts,
        prompt_id: String,
    ) -> GetHistoryForPromptResponse {
        let caller = self.caller(&parts);
        self.0.catch_up_history(&caller, &prompt_id).await;
        let histories = self.0.history();
        let history = histories.of(caller.workspace_id());
        let entries =
            history.get(&prompt_id).map(|r| (prompt_id.clone(), r.entry())).into_iter().collect();
        GetHistoryForPromptResponse::Ok(types::HistoryResponse(entries))
    }

    async fn get_i18n(&self, _: Parts) -> GetI18nResponse {
        // Translations come from node packs; Kiln's built-in nodes have none beyond their English names.
        GetI18nResponse::Ok(types::I18nResponse(Default::default()))
    }

    async fn interrupt(
        &self,
        parts: Parts,
        body: Option<types::InterruptRequest>,
    ) -> InterruptResponse {
        let target = body.and_then(|b| b.prompt_id);
        self.0.interrupt(&self.caller(&parts), target.as_deref());
        InterruptResponse::Ok
    }

    async fn list_jobs(&self, parts: Parts, query: ListJobsQuery) -> ListJobsResponse {
        let caller = self.caller(&parts);
        if query.limit.is_some_and(|l| l < 1) {
            return ListJobsResponse::BadRequest(simple("limit must be a positive integer"));
        }
        let filter = Filter {
            statuses: query.status.map(|s| {
                s.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect()
            }),
            workflow_id: query.workflow_id,
            by_duration: query.sort_by == Some(types::JobSortBy::ExecutionDuration),
            ascending: query.sort_order == Some(types::SortOrder::Asc),
            limit: query.limit,
            offset: query.offset.unwrap_or(0),
        };
        let queued = self.0.queued(&caller);
        let histories = self.0.history();
        let sources = Self::jobs_sources(histories.of(caller.workspace_id()), &queued);
        ListJobsResponse::Ok(jobs::list(&sources, &filter))
    }

    async fn cancel_jobs(
        &self,
        parts: Parts,
        body: types::JobsCancelRequest,
    ) -> CancelJobsResponse {
        let invalid: Vec<String> =
            body.job_ids.iter().filter(|id| !prompts::canonical_uuid(id)).cloned().collect();
        if !invalid.is_empty() {
            return CancelJobsResponse::BadRequest(types::SimpleError {
                error: "Invalid job ids".to_owned(),
                invalid_ids: invalid,
            });
        }
        // Every id is cancelled (no short circuit); the answer says whether any of them was.
        match self.cancel_all(self.caller(&parts), body.job_ids).await {
            Ok(cancelled) => CancelJobsResponse::Ok(types::JobCancelResponse {
                cancelled: cancelled.contains(&true),
            }),
            Err(e) => CancelJobsResponse::InternalServerError(store_failed(e)),
        }
    }

    async fn get_job(&self, parts: Parts, job_id: String) -> GetJobResponse {
        if !prompts::canonical_uuid(&job_id) {
            return GetJobResponse::BadRequest(simple("Invalid job id"));
        }
        let caller = self.caller(&parts);
        self.0.catch_up_history(&caller, &job_id).await;
        let queued = self.0.queued(&caller);
        let histories = self.0.history();
        let sources = Self::jobs_sources(histories.of(caller.workspace_id()), &queued);
        let found = sources.iter().find(|s| {
            matches!(s, Source::Queue(q) if q.prompt_id == job_id)
                || matches!(s, Source::Done(r) if r.prompt_id == job_id)
        });
        match found.and_then(jobs::detail) {
            Some(detail) => GetJobResponse::Ok(detail),
            None => GetJobResponse::NotFound(simple("Job not found")),
        }
    }

    async fn cancel_job(&self, parts: Parts, job_id: String) -> CancelJobResponse {
        if !prompts::canonical_uuid(&job_id) {
            return CancelJobResponse::BadRequest(simple("Invalid job id"));
        }
        match self.cancel_all(self.caller(&parts), vec![job_id]).await {
            Ok(cancelled) => CancelJobResponse::Ok(types::JobCancelResponse {
                cancelled: cancelled.contains(&true),
            }),
            Err(e) => CancelJobResponse::InternalServerError(store_failed(e)),
        }
    }

    async fn get_model_folders(&self, _: Parts) -> GetModelFoldersResponse {
        GetModelFoldersResponse::Ok(types::StringList(models::names(&self.0.model_folders)))
    }

    async fn get_model_files(&self, _: Parts, folder: String) -> GetModelFilesResponse {
        match self.models(move |m| models::files(m, &folder)).await.flatten() {
            Some(files) => GetModelFilesResponse::Ok(types::StringList(files)),
            None => GetModelFilesResponse::NotFound,
        }
    }

    async fn get_node_replacements(&self, _: Parts) -> GetNodeReplacementsResponse {
        GetNodeReplacementsResponse::Ok(types::NodeReplacements(Default::default()))
    }

    async fn get_object_info(&self, parts: Parts) -> GetObjectInfoResponse {
        let caller = self.caller(&parts);
        bring_folder(&caller, FileKind::Input).await;
        let all = caller
            .workspace
            .registry()
            .iter()
            .map(|(name, node)| (name.to_owned(), convert::node_info(&node.spec())))
            .collect();
        GetObjectInfoResponse::Ok(types::ObjectInfoResponse(all))
    }

    async fn get_node_info(&self, parts: Parts, node_class: String) -> GetNodeInfoResponse {
        let caller = self.caller(&parts);
        bring_folder(&caller, FileKind::Input).await;
        let one = caller
            .workspace
            .registry()
            .get(&node_class)
            .map(|node| (node_class.clone(), convert::node_info(&node.spec())))
            .into_iter()
            .collect();
        GetNodeInfoResponse::Ok(types::ObjectInfoResponse(one))
    }

    async fn get_prompt_info(&self, parts: Parts) -> GetPromptInfoResponse {
        let queue_remaining = self.0.remaining(self.caller(&parts).workspace_id());
        GetPromptInfoResponse::Ok(types::PromptInfo {
            exec_info: types::ExecInfo { queue_remaining },
        })
    }

    async fn execute_prompt(
        &self,
        parts: Parts,
        comfy_usage_source: Option<String>,
        body: types::PromptRequest,
    ) -> ExecutePromptResponse {
        // As ComfyUI: the number is taken first, so a prompt rejected below still uses one. With several
        // tenants on one queue, prompts run in arrival order: none can jump ahead of another workspace's.
        let placement = match (body.number, body.front, self.0.cloud.is_some()) {
            (_, _, true) => Placement::Back,
            (Some(number), _, false) => Placement::Number(number),
            (None, Some(true), false) => Placement::Front,
            (None, _, false) => Placement::Back,
        };
        let number = match numbering::take(&self.0, &parts, placement).await {
            Ok(number) => number,
            Err(error) => {
                let failed =
                    SubmitError::Failed { what: "the shared counter", cause: error.to_string() };
                return failed.into();
            }
        };
        match self.0.submit(&self.caller(&parts), number, body, comfy_usage_source).await {
            Ok(accepted) => ExecutePromptResponse::Ok(types::PromptResponse {
                node_errors: accepted.node_errors,
                number: accepted.number,
                prompt_id: accepted.prompt_id.parse().unwrap_or_default(),
            }),
            Err(e) => e.into(),
        }
    }

    async fn get_queue(&self, parts: Parts) -> GetQueueResponse {
        let caller = self.caller(&parts);
        let item = |e: &kiln_engine::queue::QueueEntry<Queued>| {
            queue_item(
                e.number,
                &e.id,
                &e.payload.prompt_json,
                &e.payload.extra_data,
                &e.payload.outputs,
            )
        };
        let (running, pending): (Vec<_>, Vec<_>) =
            self.0.queued(&caller).into_iter().partition(|(_, running)| *running);
        GetQueueResponse::Ok(types::QueueResponse {
            queue_pending: pending.iter().map(|(e, _)| item(e)).collect(),
            queue_running: running.iter().map(|(e, _)| item(e)).collect(),
        })
    }

    async fn manage_queue(
        &self,
        parts: Parts,
        body: types::QueueManageRequest,
    ) -> ManageQueueResponse {
        let caller = self.caller(&parts);
        let runtime = self.0.clone();
        let removed = tokio::task::spawn_blocking(move || {
            runtime.remove_queued(&caller, body.clear == Some(true), &body.delete)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        match removed {
            Ok(removed) => {
                // Thousands of removed prompts take a while to free: not on the answer's time.
                if !removed.is_empty() {
                    tokio::task::spawn_blocking(move || drop(removed));
                }
                ManageQueueResponse::Ok
            }
            Err(e) => ManageQueueResponse::InternalServerError(internal("the queue store", e)),
        }
    }

    async fn get_settings(&self, parts: Parts) -> GetSettingsResponse {
        let caller = self.caller(&parts);
        GetSettingsResponse::Ok(types::Settings(userdata::settings(&caller.user_dir)))
    }

    async fn post_settings(&self, parts: Parts, body: types::Settings) -> PostSettingsResponse {
        let caller = self.caller(&parts);
        match userdata::update_settings(&caller.user_dir, |settings| settings.extend(body.0)) {
            Ok(()) => PostSettingsResponse::Ok,
            Err(e) => {
                PostSettingsResponse::InternalServerError(internal("writing the settings", e))
            }
        }
    }

    async fn get_setting(&self, parts: Parts, id: String) -> GetSettingResponse {
        let caller = self.caller(&parts);
        GetSettingResponse::Ok(types::SettingValue(
            userdata::settings(&caller.user_dir).remove(&id).unwrap_or(Value::Null),
        ))
    }

    async fn post_setting(
        &self,
        parts: Parts,
        id: String,
        body: types::SettingValue,
    ) -> PostSettingResponse {
        let caller = self.caller(&parts);
        match userdata::update_settings(&caller.user_dir, |settings| {
            settings.insert(id, body.0);
        }) {
            Ok(()) => PostSettingResponse::Ok,
            Err(e) => PostSettingResponse::InternalServerError(internal("writing the settings", e)),
        }
    }

    async fn get_system_stats(&self, _: Parts) -> GetSystemStatsResponse {
        let stats = crate::system::system_stats(
            &self.0.argv,
            &self.0.compute.report(),
            crate::system::Memory::read(),
            self.0.frontend_version.get().copied(),
            self.0.templates.as_ref().and_then(|t| t.installed_version()),
        );
        GetSystemStatsResponse::Ok(stats)
    }

    async fn upload_image(
        &self,
        parts: Parts,
        body: axum::extract::Multipart,
    ) -> UploadImageResponse {
        match self.store_upload(&self.caller(&parts), body, false).await {
            Ok(stored) => UploadImageResponse::Ok(stored),
            // Without an original, only the form itself can be refused.
            Err(Refusal::BadRequest(e) | Refusal::Forbidden(e) | Refusal::NotFound(e)) => {
                UploadImageResponse::BadRequest(e)
            }
            Err(Refusal::Failed(e)) => UploadImageResponse::InternalServerError(e),
        }
    }

    async fn upload_mask(
        &self,
        parts: Parts,
        body: axum::extract::Multipart,
    ) -> UploadMaskResponse {
        match self.store_upload(&self.caller(&parts), body, true).await {
            Ok(stored) => UploadMaskResponse::Ok(stored),
            Err(Refusal::BadRequest(e)) => UploadMaskResponse::BadRequest(e),
            Err(Refusal::Forbidden(e)) => UploadMaskResponse::Forbidden(e),
            Err(Refusal::NotFound(e)) => UploadMaskResponse::NotFound(e),
            Err(Refusal::Failed(e)) => UploadMaskResponse::InternalServerError(e),
        }
    }

    async fn list_user_data(&self, parts: Parts, query: ListUserDataQuery) -> ListUserDataResponse {
        let caller = self.caller(&parts);
        let listing = userdata::list(
            &caller.user_dir,
            &query.dir,
            is_true(query.recurse.as_deref()),
            is_true(query.full_info.as_deref()),
            is_true(query.split.as_deref()),
        );
        match listing {
            Ok(listing) => ListUserDataResponse::Ok(listing),
            Err(e) => user_data_error(
                e,
                ListUserDataResponse::BadRequest,
                ListUserDataResponse::Forbidden,
                ListUserDataResponse::NotFound,
            ),
        }
    }

    async fn get_user_data(&self, parts: Parts, file: String) -> GetUserDataResponse {
        match userdata::read(&self.caller(&parts).user_dir, &file) {
            Ok(bytes) => {
                let content_type = if file.ends_with("user.css") {
                    "text/css"
                } else {
                    "application/octet-stream"
                };
                GetUserDataResponse::Ok(Binary {
                    content_type: content_type.to_owned(),
                    bytes: bytes.into(),
                })
            }
            Err(e) => user_data_error(
                e,
                GetUserDataResponse::BadRequest,
                GetUserDataResponse::Forbidden,
                GetUserDataResponse::NotFound,
            ),
        }
    }

    async fn post_user_data(
        &self,
        parts: Parts,
        file: String,
        query: PostUserDataQuery,
        body: Bytes,
    ) -> PostUserDataResponse {
        let overwrite = query.overwrite.as_deref() != Some("false");
        match userdata::write(
            &self.caller(&parts).user_dir,
            &file,
            &body,
            overwrite,
            is_true(query.full_info.as_deref()),
        ) {
            Ok(result) => PostUserDataResponse::Ok(result),
            Err(UserDataError::Conflict(m)) => PostUserDataResponse::Conflict(m),
            Err(UserDataError::BadRequest(m)) | Err(UserDataError::NotFound(m)) => {
                PostUserDataResponse::BadRequest(m)
            }
            Err(UserDataError::Forbidden(m)) => PostUserDataResponse::Forbidden(m),
        }
    }

    async fn delete_user_data(&self, parts: Parts, file: String) -> DeleteUserDataResponse {
        match userdata::delete(&self.caller(&parts).user_dir, &file) {
            Ok(()) => DeleteUserDataResponse::NoContent,
            Err(UserDataError::Forbidden(m)) => DeleteUserDataResponse::Forbidden(m),
            Err(UserDataError::NotFound(m))
            | Err(UserDataError::BadRequest(m))
            | Err(UserDataError::Conflict(m)) => DeleteUserDataResponse::NotFound(m),
        }
    }

    async fn move_user_data(
        &self,
        parts: Parts,
        file: String,
        dest: String,
        query: MoveUserDataQuery,
    ) -> MoveUserDataResponse {
        let overwrite = query.overwrite.as_deref() != Some("false");
        match userdata::rename(
            &self.caller(&parts).user_dir,
            &file,
            &dest,
            overwrite,
            is_true(query.full_info.as_deref()),
        ) {
            Ok(result) => MoveUserDataResponse::Ok(result),
            Err(UserDataError::BadRequest(m)) => MoveUserDataResponse::BadRequest(m),
            Err(UserDataError::Forbidden(m)) => MoveUserDataResponse::Forbidden(m),
            Err(UserDataError::NotFound(m)) => MoveUserDataResponse::NotFound(m),
            Err(UserDataError::Conflict(m)) => MoveUserDataResponse::Conflict(m),
        }
    }

    async fn get_users(&self, _: Parts) -> GetUsersResponse {
        GetUsersResponse::Ok(types::UsersResponse {
            migrated: Some(true),
            storage: "server".to_owned(),
            users: Default::default(),
        })
    }

    async fn view_file(
        &self,
        parts: Parts,
        query: ViewFileQuery,
        range: Option<String>,
    ) -> ViewFileResponse {
        let request = ViewRequest {
            filename: query.filename,
            kind: query.type_.map(convert::file_kind),
            subfolder: query.subfolder,
            preview: query.preview,
            channel: query.channel.map(|c| c.to_string()),
            range,
        };
        let workspace = self.caller(&parts).workspace;
        let read =
            move || files::view_stored(workspace.roots(), workspace.stored.as_deref(), &request);
        match tokio::task::spawn_blocking(read).await {
            Ok(Ok(file)) => {
                let body = Binary { content_type: file.content_type, bytes: file.bytes.into() };
                let nosniff = Some("nosniff".to_owned());
                let bytes_unit = Some("bytes".to_owned());
                match file.extent {
                    Extent::Range { .. } => ViewFileResponse::Status206 {
                        body,
                        accept_ranges: bytes_unit,
                        content_range: file.extent.content_range(),
                        content_disposition: Some(file.content_disposition),
                        x_content_type_options: nosniff,
                    },
                    Extent::Whole | Extent::Derived => ViewFileResponse::Ok {
                        body,
                        accept_ranges: if file.extent == Extent::Whole { bytes_unit } else { None },
                        content_disposition: Some(file.content_disposition),
                        x_content_type_options: nosniff,
                    },
                }
            }
            Ok(Err(ViewError::BadName)) | Ok(Err(ViewError::Unreadable(_))) | Err(_) => {
                ViewFileResponse::BadRequest
            }
            Ok(Err(ViewError::OutsideRoot)) => ViewFileResponse::Forbidden,
            Ok(Err(ViewError::NotFound)) => ViewFileResponse::NotFound,
            Ok(Err(ViewError::RangeNotSatisfiable { size })) => {
                ViewFileResponse::Status416 { content_range: Some(format!("bytes */{size}")) }
            }
        }
    }

    async fn get_workflow_templates(&self, _: Parts) -> GetWorkflowTemplatesResponse {
        GetWorkflowTemplatesResponse::Ok(types::WorkflowTemplates(Default::default()))
    }

    async fn get_workflow_template(
        &self,
        _: Parts,
        _module: String,
        _filename: String,
    ) -> GetWorkflowTemplateResponse {
        // Templates come from node packs, and Kiln has none installed.
        GetWorkflowTemplateResponse::NotFound
    }

    async fn web_socket_connect(
        &self,
        parts: Parts,
        query: WebSocketConnectQuery,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        let runtime = self.0.clone();
        let workspace = self.caller(&parts).workspace.id.clone();
        upgrade.on_upgrade(move |socket| async move {
            let remaining = runtime.remaining(&workspace);
            let connection = runtime.hub.connect(&workspace, query.client_id.as_deref(), remaining);
            pump(socket, runtime, connection).await;
        })
    }
}

/// A refused or failed submit as `POST /api/prompt`'s answer.
impl From<SubmitError> for ExecutePromptResponse {
    fn from(error: SubmitError) -> ExecutePromptResponse {
        let refused = |kind: &str, details: &str| {
            ExecutePromptResponse::BadRequest(prompt_error(kind, &error.to_string(), details))
        };
        match &error {
            SubmitError::NoPrompt => refused("no_prompt", "No prompt provided"),
            SubmitError::InvalidPromptId => refused(
                "invalid_prompt_id",
                "prompt_id must be a UUID string in canonical lowercase hyphenated form; omit it to let the \
                 server generate one",
            ),
            SubmitError::Shape { why, .. } => refused("invalid_prompt", why),
            SubmitError::Rejected(rejection) => {
                ExecutePromptResponse::BadRequest(convert::rejection(rejection))
            }
            SubmitError::InUse(why) => refused("prompt_id_in_use", why),
            SubmitError::Failed { what, cause } => {
                ExecutePromptResponse::InternalServerError(internal_prompt_error(what, cause))
            }
        }
    }
}
