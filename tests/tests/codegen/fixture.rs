//! An in-test implementation of the generated `Api` trait, served by the generated router on two loopback
//! listeners (local and cloud runtime). Each method records that it ran and answers a fixed, valid response,
//! echoing its typed inputs where that lets the test check they arrived intact.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message, WebSocket};
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use kiln_server::api::*;
use kiln_spec::types;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// Builds a wire type from JSON (the fixture's answers are written as JSON for brevity).
pub(crate) fn j<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("fixture JSON matches the generated type")
}

/// A raw operation's answer: its method and body echoed back as JSON, so the test sees the whole request
/// arrived.
async fn raw_answer(request: axum::extract::Request) -> Response {
    use axum::response::IntoResponse as _;
    let method = request.method().to_string();
    let body = axum::body::to_bytes(request.into_body(), 1 << 20).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    axum::Json(json!({"jsonrpc": "2.0", "method": method, "echo": body})).into_response()
}

/// The prompt id the fixture assigns.
pub(crate) const PROMPT_ID: &str = "11111111-2222-4333-8444-555555555555";

/// The in-test implementation.
pub(crate) struct Fixture {
    calls: Mutex<BTreeSet<&'static str>>,
    events: broadcast::Sender<String>,
}

impl Fixture {
    fn record(&self, operation: &'static str) {
        self.calls.lock().expect("calls lock").insert(operation);
    }

    /// The operationIds that have run so far.
    pub(crate) fn calls(&self) -> BTreeSet<&'static str> {
        self.calls.lock().expect("calls lock").clone()
    }

    fn emit(&self, message: Value) {
        // No socket listening is fine: the event is dropped, as the server would drop it.
        let _ = self.events.send(message.to_string());
    }
}

/// The two servers and the implementation behind both.
pub(crate) struct Servers {
    /// Base URL of the local-runtime server.
    pub(crate) local: String,
    /// Base URL of the cloud-runtime server.
    pub(crate) cloud: String,
    /// The implementation, to read what ran.
    pub(crate) fixture: Arc<Fixture>,
}

/// Starts a server for `runtime` on 127.0.0.1:0 and returns its base URL.
pub(crate) async fn serve(runtime: Runtime, fixture: Arc<Fixture>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(listener, router(runtime, fixture)).await.expect("serve");
    });
    format!("http://{addr}")
}

impl Fixture {
    /// A fixture that has seen no call.
    pub(crate) fn new() -> Arc<Fixture> {
        let (events, _) = broadcast::channel(64);
        Arc::new(Fixture { calls: Mutex::new(BTreeSet::new()), events })
    }
}

/// Starts both servers over one fixture.
pub(crate) async fn start() -> Servers {
    let fixture = Fixture::new();
    let local = serve(Runtime::Local, fixture.clone()).await;
    let cloud = serve(Runtime::Cloud, fixture.clone()).await;
    Servers { local, cloud, fixture }
}

/// A client with a short timeout for tests.
pub(crate) fn client(base: &str) -> kiln_client::Client {
    kiln_client::Client::with_timeout(base, std::time::Duration::from_secs(20))
        .expect("client builds")
}

async fn socket_session(
    mut socket: WebSocket,
    sid: String,
    mut events: broadcast::Receiver<String>,
) {
    let hello = json!({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": sid}});
    if socket.send(Message::Text(hello.to_string().into())).await.is_err() {
        return;
    }
    while let Ok(event) = events.recv().await {
        if socket.send(Message::Text(event.into())).await.is_err() {
            return;
        }
    }
}

fn history_entry() -> types::HistoryEntry {
    j(json!({
        "prompt": [1, PROMPT_ID, {"1": {"class_type": "EmptyImage", "inputs": {}}}, {}, ["1"]],
        "outputs": {"1": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}},
        "status": {"status_str": "success", "completed": true, "messages": []},
        "meta": {}
    }))
}

impl SharedApi for Fixture {
    async fn mcp_post(&self, request: axum::extract::Request) -> Response {
        self.record("mcpPost");
        raw_answer(request).await
    }
    async fn mcp_get(&self, request: axum::extract::Request) -> Response {
        self.record("mcpGet");
        raw_answer(request).await
    }
    async fn mcp_delete(&self, request: axum::extract::Request) -> Response {
        self.record("mcpDelete");
        raw_answer(request).await
    }
    async fn get_embeddings(&self, _: Parts) -> GetEmbeddingsResponse {
        self.record("getEmbeddings");
        GetEmbeddingsResponse::Ok(j(json!(["easynegative"])))
    }
    async fn get_model_folder_paths(&self, _: Parts) -> GetModelFolderPathsResponse {
        self.record("getModelFolderPaths");
        GetModelFolderPathsResponse::Ok(j(
            json!([{"name": "loras", "folders": ["/m/loras"], "extensions": [".safetensors"]}]),
        ))
    }
    async fn get_model_file_details(
        &self,
        _: Parts,
        folder: String,
    ) -> GetModelFileDetailsResponse {
        self.record("getModelFileDetails");
        GetModelFileDetailsResponse::Ok(j(
            json!([{"name": format!("{folder}.safetensors"), "pathIndex": 0, "size": 3}]),
        ))
    }
    async fn get_extensions(&self, _: Parts) -> GetExtensionsResponse {
        self.record("getExtensions");
        GetExtensionsResponse::Ok(j(json!(["/extensions/core/a.js"])))
    }
    async fn get_open_api_document(&self, _: Parts) -> GetOpenApiDocumentResponse {
        self.record("getOpenApiDocument");
        GetOpenApiDocumentResponse::Ok(document(Runtime::Local).expect("the spec reduces"))
    }
    async fn get_liveness(&self, _: Parts) -> GetLivenessResponse {
        self.record("getLiveness");
        GetLivenessResponse::Ok("ok".to_owned())
    }
    async fn get_readiness(&self, _: Parts) -> GetReadinessResponse {
        self.record("getReadiness");
        GetReadinessResponse::ServiceUnavailable(j(
            json!({"code": "draining", "message": "the server is stopping"}),
        ))
    }
    async fn get_metrics(&self, _: Parts) -> GetMetricsResponse {
        self.record("getMetrics");
        GetMetricsResponse::Ok(Binary {
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8".to_owned(),
            bytes: Bytes::from_static(b"# TYPE kiln_websockets gauge\nkiln_websockets 0\n# EOF\n"),
        })
    }
    async fn get_features(&self, _: Parts) -> GetFeaturesResponse {
        self.record("getFeatures");
        GetFeaturesResponse::Ok(j(
            json!({"supports_preview_metadata": true, "supports_model_type_tags": false, "max_upload_size": 104857600,
                   "extension": {"manager": {"supports_v4": false}}, "node_replacements": true, "assets": false}),
        ))
    }
    async fn get_global_subgraphs(&self, _: Parts) -> GetGlobalSubgraphsResponse {
        self.record("getGlobalSubgraphs");
        GetGlobalSubgraphsResponse::Ok(j(
            json!({"abc": {"source": "custom_node", "name": "Blur", "info": {"node_pack": "p"}}}),
        ))
    }
    async fn get_global_subgraph(&self, _: Parts, id: String) -> GetGlobalSubgraphResponse {
        self.record("getGlobalSubgraph");
        if id == "abc" {
            GetGlobalSubgraphResponse::Ok(j(
                json!({"source": "custom_node", "name": "Blur", "info": {"node_pack": "p"}, "data": "{}"}),
            ))
        } else {
            GetGlobalSubgraphResponse::Ok(j(Value::Null))
        }
    }
    async fn get_history(&self, _: Parts, query: GetHistoryQuery) -> GetHistoryResponse {
        self.record("getHistory");
        let mut entries = serde_json::Map::new();
        if query.max_items == Some(1) && query.offset.is_none() {
            entries.insert(
                PROMPT_ID.to_owned(),
                serde_json::to_value(history_entry()).expect("serializes"),
            );
        }
        GetHistoryResponse::Ok(j(Value::Object(entries)))
    }
    async fn manage_history(
        &self,
        _: Parts,
        body: types::HistoryManageRequest,
    ) -> ManageHistoryResponse {
        self.record("manageHistory");
        if body.clear == Some(true) {
            ManageHistoryResponse::Ok
        } else {
            ManageHistoryResponse::BadRequest(j(
                json!({"code": "test", "message": "clear expected"}),
            ))
        }
    }
    async fn get_history_for_prompt(
        &self,
        _: Parts,
        prompt_id: String,
    ) -> GetHistoryForPromptResponse {
        self.record("getHistoryForPrompt");
        let mut entries = serde_json::Map::new();
        if prompt_id == PROMPT_ID {
            entries.insert(prompt_id, serde_json::to_value(history_entry()).expect("serializes"));
        }
        GetHistoryForPromptResponse::Ok(j(Value::Object(entries)))
    }
    async fn get_i18n(&self, _: Parts) -> GetI18nResponse {
        self.record("getI18n");
        GetI18nResponse::Ok(j(json!({"en": {"nodeDefs": {}}})))
    }
    async fn interrupt(
        &self,
        _: Parts,
        _body: Option<types::InterruptRequest>,
    ) -> InterruptResponse {
        self.record("interrupt");
        InterruptResponse::Ok
    }
    async fn list_jobs(&self, _: Parts, query: ListJobsQuery) -> ListJobsResponse {
        self.record("listJobs");
        ListJobsResponse::Ok(j(json!({
            "jobs": [{"id": PROMPT_ID, "status": "completed", "priority": 1, "create_time": 5}],
            "pagination": {"offset": query.offset.unwrap_or(0), "limit": query.limit, "total": 1, "has_more": false}
        })))
    }
    async fn cancel_jobs(&self, _: Parts, body: types::JobsCancelRequest) -> CancelJobsResponse {
        self.record("cancelJobs");
        CancelJobsResponse::Ok(j(
            json!({"cancelled": body.job_ids.iter().any(|id| id == PROMPT_ID)}),
        ))
    }
    async fn get_job(&self, _: Parts, job_id: String) -> GetJobResponse {
        self.record("getJob");
        if job_id == PROMPT_ID {
            GetJobResponse::Ok(j(
                json!({"id": PROMPT_ID, "status": "pending", "priority": 1.5, "create_time": 5}),
            ))
        } else {
            GetJobResponse::NotFound(j(json!({"error": "Job not found"})))
        }
    }
    async fn cancel_job(&self, _: Parts, job_id: String) -> CancelJobResponse {
        self.record("cancelJob");
        CancelJobResponse::Ok(j(json!({"cancelled": job_id == PROMPT_ID})))
    }
    async fn get_model_folders(&self, _: Parts) -> GetModelFoldersResponse {
        self.record("getModelFolders");
        GetModelFoldersResponse::Ok(j(json!(["checkpoints", "loras"])))
    }
    async fn get_model_files(&self, _: Parts, folder: String) -> GetModelFilesResponse {
        self.record("getModelFiles");
        if folder == "checkpoints" {
            GetModelFilesResponse::Ok(j(json!(["sd.safetensors"])))
        } else {
            GetModelFilesResponse::NotFound
        }
    }
    async fn get_node_replacements(&self, _: Parts) -> GetNodeReplacementsResponse {
        self.record("getNodeReplacements");
        GetNodeReplacementsResponse::Ok(j(
            json!({"Old": [{"new_node_id": "New", "old_node_id": "Old"}]}),
        ))
    }
    async fn get_object_info(&self, _: Parts) -> GetObjectInfoResponse {
        self.record("getObjectInfo");
        GetObjectInfoResponse::Ok(j(json!({"ImageInvert": image_invert()})))
    }
    async fn get_node_info(&self, _: Parts, node_class: String) -> GetNodeInfoResponse {
        self.record("getNodeInfo");
        let body = if node_class == "ImageInvert" {
            json!({"ImageInvert": image_invert()})
        } else {
            json!({})
        };
        GetNodeInfoResponse::Ok(j(body))
    }
    async fn get_prompt_info(&self, _: Parts) -> GetPromptInfoResponse {
        self.record("getPromptInfo");
        GetPromptInfoResponse::Ok(j(json!({"exec_info": {"queue_remaining": 2}})))
    }
    async fn execute_prompt(
        &self,
        _: Parts,
        comfy_usage_source: Option<String>,
        body: types::PromptRequest,
    ) -> ExecutePromptResponse {
        self.record("executePrompt");
        let Some(prompt) = body.prompt else {
            return ExecutePromptResponse::BadRequest(j(json!({
                "error": {"type": "no_prompt", "message": "No prompt provided", "details": "No prompt provided", "extra_info": {}},
                "node_errors": {}
            })));
        };
        let number = if comfy_usage_source.is_some() { 7.0 } else { 1.0 };
        if body.client_id.is_some() {
            let nodes: Vec<String> = prompt.keys().cloned().collect();
            self.emit(json!({"type": "execution_start", "data": {"prompt_id": PROMPT_ID, "timestamp": 1}}));
            self.emit(json!({"type": "execution_cached", "data": {"nodes": [], "prompt_id": PROMPT_ID, "timestamp": 1}}));
            for node in &nodes {
                self.emit(json!({"type": "executing", "data": {"node": node, "display_node": node, "prompt_id": PROMPT_ID}}));
            }
            self.emit(json!({"type": "my_pack.custom_event", "data": {}}));
            self.emit(json!({"type": "execution_success", "data": {"prompt_id": PROMPT_ID, "timestamp": 2}}));
            self.emit(json!({"type": "executing", "data": {"node": null, "prompt_id": PROMPT_ID}}));
        }
        ExecutePromptResponse::Ok(j(
            json!({"prompt_id": PROMPT_ID, "number": number, "node_errors": {}}),
        ))
    }
    async fn get_queue(&self, _: Parts) -> GetQueueResponse {
        self.record("getQueue");
        GetQueueResponse::Ok(j(
            json!({"queue_running": [], "queue_pending": [[2, PROMPT_ID, {}, {}, ["9"]]]}),
        ))
    }
    async fn manage_queue(&self, _: Parts, body: types::QueueManageRequest) -> ManageQueueResponse {
        self.record("manageQueue");
        if body.delete.len() == 1 {
            ManageQueueResponse::Ok
        } else {
            ManageQueueResponse::BadRequest(j(
                json!({"code": "test", "message": "one id expected"}),
            ))
        }
    }
    async fn get_settings(&self, _: Parts) -> GetSettingsResponse {
        self.record("getSettings");
        GetSettingsResponse::Ok(j(json!({"Comfy.Locale": "en"})))
    }
    async fn post_settings(&self, _: Parts, body: types::Settings) -> PostSettingsResponse {
        self.record("postSettings");
        if body.contains_key("Comfy.Locale") {
            PostSettingsResponse::Ok
        } else {
            PostSettingsResponse::BadRequest(j(
                json!({"code": "test", "message": "locale expected"}),
            ))
        }
    }
    async fn get_setting(&self, _: Parts, id: String) -> GetSettingResponse {
        self.record("getSetting");
        GetSettingResponse::Ok(j(if id == "Comfy.Locale" { json!("en") } else { Value::Null }))
    }
    async fn post_setting(
        &self,
        _: Parts,
        id: String,
        body: types::SettingValue,
    ) -> PostSettingResponse {
        self.record("postSetting");
        if id == "Comfy.Locale" && body.0 == json!("fr") {
            PostSettingResponse::Ok
        } else {
            PostSettingResponse::BadRequest(j(json!({"code": "test", "message": "fr expected"})))
        }
    }
    async fn get_system_stats(&self, _: Parts) -> GetSystemStatsResponse {
        self.record("getSystemStats");
        GetSystemStatsResponse::Ok(j(json!({
            "system": {"os": "linux", "ram_total": 8, "ram_free": 4, "comfyui_version": "0.1.0",
                       "required_frontend_version": "1.58.1", "installed_templates_version": null,
                       "required_templates_version": null,
                       "comfy_package_versions": [{"name": "comfyui-frontend-package", "installed": "1.58.1", "required": "1.58.1"}],
                       "python_version": "rust", "pytorch_version": "kiln", "embedded_python": false,
                       "deploy_environment": "kiln", "argv": ["kiln"]},
            "devices": [{"name": "cpu", "type": "cpu", "index": null, "vram_total": 8, "vram_free": 4, "torch_vram_total": 8, "torch_vram_free": 4}]
        })))
    }
    async fn upload_image(&self, _: Parts, body: axum::extract::Multipart) -> UploadImageResponse {
        self.record("uploadImage");
        match read_form(body).await {
            Ok(form) => UploadImageResponse::Ok(j(json!({
                "name": form.filename, "subfolder": form.subfolder, "type": form.type_.unwrap_or_else(|| "input".to_owned())
            }))),
            Err(message) => UploadImageResponse::BadRequest(j(
                json!({"code": "invalid_upload", "message": message}),
            )),
        }
    }
    async fn upload_mask(&self, _: Parts, body: axum::extract::Multipart) -> UploadMaskResponse {
        self.record("uploadMask");
        match read_form(body).await {
            Ok(form) if form.original_ref.is_some() => UploadMaskResponse::Ok(j(json!({
                "name": form.filename, "subfolder": form.subfolder, "type": form.type_.unwrap_or_else(|| "input".to_owned())
            }))),
            Ok(_) => UploadMaskResponse::BadRequest(j(
                json!({"code": "invalid_upload", "message": "original_ref is required"}),
            )),
            Err(message) => UploadMaskResponse::BadRequest(j(
                json!({"code": "invalid_upload", "message": message}),
            )),
        }
    }
    async fn list_user_data(&self, _: Parts, query: ListUserDataQuery) -> ListUserDataResponse {
        self.record("listUserData");
        if query.dir != "workflows" {
            return ListUserDataResponse::NotFound("no such directory".to_owned());
        }
        ListUserDataResponse::Ok(j(if query.full_info.as_deref() == Some("true") {
            json!([{"path": "a.json", "size": 2, "modified": 1.0}])
        } else {
            json!(["a.json"])
        }))
    }
    async fn get_user_data(&self, _: Parts, file: String) -> GetUserDataResponse {
        self.record("getUserData");
        GetUserDataResponse::Ok(Binary {
            content_type: "application/octet-stream".to_owned(),
            bytes: Bytes::from(file),
        })
    }
    async fn post_user_data(
        &self,
        _: Parts,
        file: String,
        query: PostUserDataQuery,
        body: Bytes,
    ) -> PostUserDataResponse {
        self.record("postUserData");
        if query.overwrite.as_deref() == Some("false") {
            return PostUserDataResponse::Conflict("File already exists".to_owned());
        }
        PostUserDataResponse::Ok(j(json!({"path": file, "size": body.len(), "modified": 1.0})))
    }
    async fn delete_user_data(&self, _: Parts, file: String) -> DeleteUserDataResponse {
        self.record("deleteUserData");
        if file == "workflows/a.json" {
            DeleteUserDataResponse::NoContent
        } else {
            DeleteUserDataResponse::NotFound("no such file".to_owned())
        }
    }
    async fn move_user_data(
        &self,
        _: Parts,
        _file: String,
        dest: String,
        _query: MoveUserDataQuery,
    ) -> MoveUserDataResponse {
        self.record("moveUserData");
        MoveUserDataResponse::Ok(j(json!(dest)))
    }
    async fn get_users(&self, _: Parts) -> GetUsersResponse {
        self.record("getUsers");
        GetUsersResponse::Ok(j(json!({"storage": "server", "migrated": true})))
    }
    async fn view_file(
        &self,
        _: Parts,
        query: ViewFileQuery,
        _: Option<String>,
    ) -> ViewFileResponse {
        self.record("viewFile");
        match query.filename.as_deref() {
            None => ViewFileResponse::NotFound,
            Some(name) if name.contains("..") => ViewFileResponse::BadRequest,
            Some(name) => ViewFileResponse::Ok {
                body: Binary {
                    content_type: "image/png".to_owned(),
                    bytes: Bytes::from(format!("{name}:{:?}", query.type_)),
                },
                accept_ranges: Some("bytes".to_owned()),
                content_disposition: Some(format!("filename=\"{name}\"")),
                x_content_type_options: Some("nosniff".to_owned()),
            },
        }
    }
    async fn get_workflow_templates(&self, _: Parts) -> GetWorkflowTemplatesResponse {
        self.record("getWorkflowTemplates");
        GetWorkflowTemplatesResponse::Ok(j(json!({"pack": ["example"]})))
    }
    async fn get_workflow_template(
        &self,
        _: Parts,
        module_name: String,
        filename: String,
    ) -> GetWorkflowTemplateResponse {
        self.record("getWorkflowTemplate");
        GetWorkflowTemplateResponse::Ok(j(json!({"module": module_name, "file": filename})))
    }
    async fn web_socket_connect(
        &self,
        _: Parts,
        query: WebSocketConnectQuery,
        upgrade: axum::extract::ws::WebSocketUpgrade,
    ) -> Response {
        self.record("webSocketConnect");
        let sid = query.client_id.unwrap_or_else(|| "generated".to_owned());
        let events = self.events.subscribe();
        upgrade.on_upgrade(move |socket| socket_session(socket, sid, events))
    }
}

impl LocalApi for Fixture {
    async fn get_model_preview(
        &self,
        _: Parts,
        folder: String,
        path_index: i64,
        filename: String,
    ) -> GetModelPreviewResponse {
        self.record("getModelPreview");
        GetModelPreviewResponse::Ok(Binary {
            content_type: "image/webp".to_owned(),
            bytes: Bytes::from(format!("{folder}/{path_index}/{filename}")),
        })
    }
    async fn free_memory(&self, _: Parts, body: types::FreeRequest) -> FreeMemoryResponse {
        self.record("freeMemory");
        match body.unload_models {
            Some(true) => FreeMemoryResponse::Ok,
            _ => FreeMemoryResponse::BadRequest(j(
                json!({"code": "test", "message": "unload_models expected"}),
            )),
        }
    }
    async fn create_user(&self, _: Parts, body: types::CreateUserRequest) -> CreateUserResponse {
        self.record("createUser");
        if body.username == "taken" {
            CreateUserResponse::BadRequest(j(json!({"error": "Duplicate username."})))
        } else {
            CreateUserResponse::Ok(j(json!(format!("{}_1", body.username))))
        }
    }
    async fn list_user_data_v2(
        &self,
        _: Parts,
        query: ListUserDataV2Query,
    ) -> ListUserDataV2Response {
        self.record("listUserDataV2");
        ListUserDataV2Response::Ok(j(
            json!([{"name": "a.json", "path": query.path.unwrap_or_default(), "type": "file"}]),
        ))
    }
    async fn get_view_metadata(
        &self,
        _: Parts,
        folder_name: String,
        query: GetViewMetadataQuery,
    ) -> GetViewMetadataResponse {
        self.record("getViewMetadata");
        match query.filename {
            Some(filename) => {
                GetViewMetadataResponse::Ok(j(json!({"folder": folder_name, "file": filename})))
            }
            None => GetViewMetadataResponse::NotFound,
        }
    }
    async fn get_directory_files(
        &self,
        _: Parts,
        directory_type: types::FileType,
    ) -> GetDirectoryFilesResponse {
        self.record("getDirectoryFiles");
        GetDirectoryFilesResponse::Ok(j(json!([format!("{directory_type}.png")])))
    }
    async fn get_folder_paths(&self, _: Parts) -> GetFolderPathsResponse {
        self.record("getFolderPaths");
        GetFolderPathsResponse::Ok(j(json!({"checkpoints": ["/m/checkpoints"]})))
    }
    async fn get_logs(&self, _: Parts) -> GetLogsResponse {
        self.record("getLogs");
        GetLogsResponse::Ok("started\n".to_owned())
    }
    async fn get_raw_logs(&self, _: Parts) -> GetRawLogsResponse {
        self.record("getRawLogs");
        GetRawLogsResponse::Ok(j(
            json!({"entries": [{"t": "now", "m": "started"}], "size": {"cols": 80, "rows": 24}}),
        ))
    }
    async fn subscribe_logs(
        &self,
        _: Parts,
        body: types::LogsSubscribeRequest,
    ) -> SubscribeLogsResponse {
        self.record("subscribeLogs");
        if body.enabled {
            SubscribeLogsResponse::Ok
        } else {
            SubscribeLogsResponse::BadRequest(j(
                json!({"code": "test", "message": "enabled expected"}),
            ))
        }
    }
}

impl CloudApi for Fixture {
    async fn get_jwks(&self, _: Parts) -> GetJwksResponse {
        self.record("getJwks");
        GetJwksResponse::Ok(j(
            json!({"keys": [{"kty": "EC", "crv": "P-256", "x": "x", "y": "y", "kid": "k1"}]}),
        ))
    }
    async fn get_oauth_authorization_server_metadata(
        &self,
        _: Parts,
    ) -> GetOauthAuthorizationServerMetadataResponse {
        self.record("getOauthAuthorizationServerMetadata");
        GetOauthAuthorizationServerMetadataResponse::Ok(j(json!({
            "issuer": "https://kiln.test", "authorization_endpoint": "https://kiln.test/oauth/authorize",
            "token_endpoint": "https://kiln.test/oauth/token", "jwks_uri": "https://kiln.test/.well-known/jwks.json",
            "response_types_supported": ["code"], "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"], "token_endpoint_auth_methods_supported": ["none"]
        })))
    }
    async fn get_oauth_protected_resource_metadata(
        &self,
        _: Parts,
    ) -> GetOauthProtectedResourceMetadataResponse {
        self.record("getOauthProtectedResourceMetadata");
        GetOauthProtectedResourceMetadataResponse::Ok(protected_resource())
    }
    async fn get_oauth_protected_resource_metadata_for_mcp(
        &self,
        _: Parts,
    ) -> GetOauthProtectedResourceMetadataForMcpResponse {
        self.record("getOauthProtectedResourceMetadataForMcp");
        GetOauthProtectedResourceMetadataForMcpResponse::Ok(protected_resource())
    }
    async fn get_session(&self, _: Parts) -> GetSessionResponse {
        self.record("getSession");
        GetSessionResponse::Unauthorized(j(json!({"code": "no_session", "message": "no session"})))
    }
    async fn create_session(
        &self,
        _: Parts,
        body: types::CreateSessionRequest,
    ) -> CreateSessionResponse {
        self.record("createSession");
        if body.password != "pw" {
            return CreateSessionResponse::Unauthorized(j(
                json!({"code": "invalid_credentials", "message": "unknown user or wrong password"}),
            ));
        }
        CreateSessionResponse::Ok {
            body: j(
                json!({"user_id": "u1", "username": body.username, "csrf_token": "c", "expires_at": "2026-12-01T00:00:00Z"}),
            ),
            set_cookie: Some(
                "__Host-comfy_session=s; Secure; HttpOnly; SameSite=Lax; Path=/".to_owned(),
            ),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn delete_session(
        &self,
        _: Parts,
        x_csrf_token: Option<String>,
    ) -> DeleteSessionResponse {
        self.record("deleteSession");
        match x_csrf_token.as_deref() {
            Some("c") => DeleteSessionResponse::Ok {
                body: j(json!({"success": true})),
                set_cookie: Some(
                    "__Host-comfy_session=; Path=/; Secure; HttpOnly; Max-Age=0".to_owned(),
                ),
                cache_control: Some("no-store".to_owned()),
            },
            _ => DeleteSessionResponse::Forbidden(j(
                json!({"code": "csrf_invalid", "message": "bad CSRF token"}),
            )),
        }
    }
    async fn exchange_token(
        &self,
        _: Parts,
        body: Option<types::ExchangeTokenRequest>,
    ) -> ExchangeTokenResponse {
        self.record("exchangeToken");
        let workspace = body.and_then(|b| b.workspace_id).unwrap_or_else(|| "personal".to_owned());
        ExchangeTokenResponse::Ok(j(
            json!({"token": "jwt", "token_type": "Bearer", "expires_in": 900, "workspace_id": workspace}),
        ))
    }
    async fn list_api_keys(&self, _: Parts) -> ListApiKeysResponse {
        self.record("listApiKeys");
        ListApiKeysResponse::Ok(j(json!({"keys": [{
            "id": "k1", "name": "ci", "workspace_id": "w", "hint": "abcd",
            "created_at": "2026-11-30T00:00:00Z", "revoked": false
        }]})))
    }
    async fn create_api_key(
        &self,
        _: Parts,
        body: types::CreateApiKeyRequest,
    ) -> CreateApiKeyResponse {
        self.record("createApiKey");
        CreateApiKeyResponse::Created {
            body: j(json!({"key": "comfyui-secret", "api_key": {
                "id": "k2", "name": body.name, "workspace_id": "w", "hint": "cret",
                "created_at": "2026-11-30T00:00:00Z", "revoked": false
            }})),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn revoke_api_key(&self, _: Parts, key_id: String) -> RevokeApiKeyResponse {
        self.record("revokeApiKey");
        match key_id.as_str() {
            "k1" => RevokeApiKeyResponse::NoContent,
            _ => RevokeApiKeyResponse::NotFound(j(
                json!({"code": "not_found", "message": "no such key"}),
            )),
        }
    }
    async fn oauth_authorize(
        &self,
        _: Parts,
        query: OauthAuthorizeQuery,
    ) -> OauthAuthorizeResponse {
        self.record("oauthAuthorize");
        match query.oauth_request_id {
            Some(id) => OauthAuthorizeResponse::Ok {
                body: j(json!({
                    "oauth_request_id": id, "csrf_token": "c", "client_display_name": "Test", "redirect_uri": "http://127.0.0.1/cb",
                    "resource_display_name": "Kiln", "scopes": ["mcp"], "workspaces": [{"id": "w", "name": "Mine", "role": "owner", "type": "personal"}]
                })),
                cache_control: Some("no-store".to_owned()),
            },
            None => OauthAuthorizeResponse::SeeOther {
                location: Some("/oauth/consent?oauth_request_id=x".to_owned()),
            },
        }
    }
    async fn oauth_authorize_decision(
        &self,
        _: Parts,
        body: types::OAuthConsentDecision,
    ) -> OauthAuthorizeDecisionResponse {
        self.record("oauthAuthorizeDecision");
        let url = format!("http://127.0.0.1/cb?decision={}", body.decision);
        OauthAuthorizeDecisionResponse::Ok {
            body: j(json!({"redirect_to": url})),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn oauth_token(&self, _: Parts, body: types::OAuthTokenRequest) -> OauthTokenResponse {
        self.record("oauthToken");
        if body.grant_type != "authorization_code" {
            return OauthTokenResponse::BadRequest(j(json!({"error": "unsupported_grant_type"})));
        }
        OauthTokenResponse::Ok {
            body: j(
                json!({"access_token": body.code.unwrap_or_default(), "token_type": "Bearer", "expires_in": 900, "scope": "mcp"}),
            ),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn oauth_register(
        &self,
        _: Parts,
        body: types::OAuthRegisterRequest,
    ) -> OauthRegisterResponse {
        self.record("oauthRegister");
        if body.redirect_uris.is_empty() {
            return OauthRegisterResponse::BadRequest(j(json!({"error": "invalid_redirect_uri"})));
        }
        OauthRegisterResponse::Created {
            body: j(json!({
                "client_id": "c1", "client_id_issued_at": 1, "redirect_uris": body.redirect_uris, "grant_types": ["authorization_code"],
                "response_types": ["code"], "token_endpoint_auth_method": "none", "application_type": "native",
                "registration_client_uri": "https://kiln.test/oauth/register/c1"
            })),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn get_oauth_client(&self, _: Parts, client_id: String) -> GetOauthClientResponse {
        self.record("getOauthClient");
        GetOauthClientResponse::Ok {
            body: j(json!({
                "client_id": client_id, "client_id_issued_at": 1, "redirect_uris": ["http://127.0.0.1:9/cb"],
                "grant_types": ["authorization_code"], "response_types": ["code"],
                "token_endpoint_auth_method": "none", "application_type": "native",
                "registration_client_uri": "https://kiln.test/oauth/register/c1"
            })),
            cache_control: Some("no-store".to_owned()),
        }
    }
    async fn oauth_consent_page(
        &self,
        _: Parts,
        query: OauthConsentPageQuery,
    ) -> OauthConsentPageResponse {
        self.record("oauthConsentPage");
        let page = format!("<!doctype html><p>{}</p>", query.oauth_request_id.unwrap_or_default());
        OauthConsentPageResponse::Ok(Binary {
            content_type: "text/html; charset=utf-8".to_owned(),
            bytes: Bytes::from(page),
        })
    }
}

fn protected_resource() -> types::OAuthProtectedResourceMetadata {
    j(
        json!({"resource": "https://kiln.test/mcp", "authorization_servers": ["https://kiln.test"], "scopes_supported": ["mcp"]}),
    )
}

fn image_invert() -> Value {
    json!({
        "input": {"required": {"image": ["IMAGE"]}}, "input_order": {"required": ["image"]}, "is_input_list": false,
        "output": ["IMAGE"], "output_is_list": [false], "output_name": ["IMAGE"], "name": "ImageInvert",
        "display_name": "Invert Image", "description": "", "python_module": "nodes", "category": "image",
        "output_node": false, "has_intermediate_output": false, "search_aliases": []
    })
}

/// The fields of an upload form.
struct UploadForm {
    filename: String,
    subfolder: String,
    type_: Option<String>,
    original_ref: Option<String>,
}

async fn read_form(mut form: axum::extract::Multipart) -> Result<UploadForm, String> {
    let mut upload = UploadForm {
        filename: String::new(),
        subfolder: String::new(),
        type_: None,
        original_ref: None,
    };
    while let Some(field) = form.next_field().await.map_err(|e| e.to_string())? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "image" => {
                upload.filename = field.file_name().unwrap_or_default().to_owned();
                let bytes = field.bytes().await.map_err(|e| e.to_string())?;
                if bytes.is_empty() {
                    return Err("empty file".to_owned());
                }
            }
            "subfolder" => upload.subfolder = field.text().await.map_err(|e| e.to_string())?,
            "type" => upload.type_ = Some(field.text().await.map_err(|e| e.to_string())?),
            "original_ref" => {
                upload.original_ref = Some(field.text().await.map_err(|e| e.to_string())?)
            }
            _ => {}
        }
    }
    if upload.filename.is_empty() { Err("no image part".to_owned()) } else { Ok(upload) }
}
