//! The operations only the local runtime serves (`LocalApi`): memory release, users, the v2 user data
//! listing, model metadata and previews, and the frontend's internal routes.

use std::sync::atomic::Ordering;

use axum::http::request::Parts;
use kiln_spec::types;

use super::api::{ApiServer, error};
use super::models;
use super::userdata::{self, UserDataError};
use crate::api::*;
use crate::convert;

impl LocalApi for ApiServer {
    async fn free_memory(&self, _: Parts, body: types::FreeRequest) -> FreeMemoryResponse {
        // As ComfyUI, the worker acts before it takes the next prompt: `unload_models` unloads every model;
        // `free_memory` also drops the node result cache (and implies `unload_models`). An API node of a
        // cluster passes it on to every worker.
        let (unload, free) = (body.unload_models == Some(true), body.free_memory == Some(true));
        if let Some(cluster) = &self.0.cluster
            && cluster.role == crate::config::ProcessRole::Api
        {
            if let Err(error) = cluster.ask_workers_to_free(unload, free).await {
                tracing::error!(%error, "cannot pass /free on to the workers");
            }
            return FreeMemoryResponse::Ok;
        }
        if body.unload_models == Some(true) {
            self.0.unload_requested.store(true, Ordering::SeqCst);
        }
        if body.free_memory == Some(true) {
            self.0.free_requested.store(true, Ordering::SeqCst);
        }
        FreeMemoryResponse::Ok
    }

    async fn create_user(
        &self,
        parts: Parts,
        body: types::CreateUserRequest,
    ) -> CreateUserResponse {
        let user_dir = self.caller(&parts).user_dir;
        let name = body.username.trim();
        if name.is_empty() {
            return CreateUserResponse::BadRequest(types::SimpleError {
                error: "Username is required.".to_owned(),
                invalid_ids: Vec::new(),
            });
        }
        let path = user_dir.join("users.json");
        let mut users: kiln_spec::IndexMap<String, String> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if users.values().any(|u| u == name) {
            return CreateUserResponse::BadRequest(types::SimpleError {
                error: "Duplicate username.".to_owned(),
                invalid_ids: Vec::new(),
            });
        }
        let sanitized: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let id = format!("{sanitized}_{}", uuid::Uuid::new_v4());
        users.insert(id.clone(), name.to_owned());
        let written = std::fs::create_dir_all(&user_dir).and_then(|()| {
            std::fs::write(&path, serde_json::to_vec_pretty(&users).unwrap_or_default())
        });
        match written {
            Ok(()) => CreateUserResponse::Ok(types::UserId(id)),
            Err(e) => CreateUserResponse::BadRequest(types::SimpleError {
                error: format!("cannot store the user: {e}"),
                invalid_ids: Vec::new(),
            }),
        }
    }

    async fn list_user_data_v2(
        &self,
        parts: Parts,
        query: ListUserDataV2Query,
    ) -> ListUserDataV2Response {
        let user_dir = self.caller(&parts).user_dir;
        match userdata::list_v2(&user_dir, query.path.as_deref().unwrap_or("")) {
            Ok(entries) => ListUserDataV2Response::Ok(types::UserDataEntryList(entries)),
            Err(UserDataError::Forbidden(m)) => ListUserDataV2Response::Forbidden(m),
            Err(UserDataError::NotFound(m)) => ListUserDataV2Response::NotFound(m),
            Err(UserDataError::BadRequest(m)) | Err(UserDataError::Conflict(m)) => {
                ListUserDataV2Response::BadRequest(m)
            }
        }
    }

    async fn get_view_metadata(
        &self,
        _: Parts,
        folder_name: String,
        query: GetViewMetadataQuery,
    ) -> GetViewMetadataResponse {
        let Some(filename) = query.filename else { return GetViewMetadataResponse::NotFound };
        match self.models(move |m| models::metadata(m, &folder_name, &filename)).await.flatten() {
            Some(metadata) => GetViewMetadataResponse::Ok(types::SafetensorsMetadata(
                metadata.into_iter().collect(),
            )),
            None => GetViewMetadataResponse::NotFound,
        }
    }

    async fn get_model_preview(
        &self,
        _: Parts,
        folder: String,
        path_index: i64,
        filename: String,
    ) -> GetModelPreviewResponse {
        let preview =
            self.models(move |m| models::preview(m, &folder, path_index, &filename)).await;
        match preview.unwrap_or(models::Preview::NotFound) {
            models::Preview::Found(bytes) => GetModelPreviewResponse::Ok(Binary {
                content_type: "image/webp".to_owned(),
                bytes: bytes.into(),
            }),
            models::Preview::Forbidden => GetModelPreviewResponse::Forbidden,
            models::Preview::NotFound => GetModelPreviewResponse::NotFound,
        }
    }

    async fn get_directory_files(
        &self,
        parts: Parts,
        directory_type: types::FileType,
    ) -> GetDirectoryFilesResponse {
        let caller = self.caller(&parts);
        let kind = convert::file_kind(directory_type);
        super::api::bring_folder(&caller, kind).await;
        let root = caller.workspace.roots().get(kind).to_path_buf();
        let mut files: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                Some((e.metadata().ok()?.modified().ok()?, e.file_name().into_string().ok()?))
            })
            .collect();
        files.sort_by(|a, b| b.cmp(a));
        if files.is_empty() && !root.exists() {
            return GetDirectoryFilesResponse::BadRequest(error(
                "no_directory",
                format!("{} does not exist", root.display()),
            ));
        }
        GetDirectoryFilesResponse::Ok(types::StringList(
            files.into_iter().map(|(_, name)| name).collect(),
        ))
    }

    async fn get_folder_paths(&self, _: Parts) -> GetFolderPathsResponse {
        GetFolderPathsResponse::Ok(models::folder_paths(&self.0.model_folders))
    }

    async fn get_logs(&self, _: Parts) -> GetLogsResponse {
        let text: String =
            self.0.logs.since(0).iter().map(|e| format!("{} {}\n", e.time, e.message)).collect();
        GetLogsResponse::Ok(text)
    }

    async fn get_raw_logs(&self, _: Parts) -> GetRawLogsResponse {
        let entries = self
            .0
            .logs
            .since(0)
            .into_iter()
            .map(|e| types::LogEntry { m: e.message, t: e.time })
            .collect();
        GetRawLogsResponse::Ok(types::LogsRaw {
            entries,
            size: types::TerminalSize { cols: 80, rows: 24 },
        })
    }

    async fn subscribe_logs(
        &self,
        _: Parts,
        body: types::LogsSubscribeRequest,
    ) -> SubscribeLogsResponse {
        let mut subscribers = self.0.log_subscribers.lock().unwrap_or_else(|p| p.into_inner());
        if body.enabled {
            subscribers.insert(body.client_id);
        } else {
            subscribers.remove(&body.client_id);
        }
        SubscribeLogsResponse::Ok
    }
}
