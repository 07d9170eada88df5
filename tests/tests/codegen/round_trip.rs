//! Every operation, called once (or more) through the generated client against the generated router.

use futures::{StreamExt as _, TryStreamExt as _};
use kiln_client::{Event, UploadOptions, types};
use kiln_server::api::OPERATIONS;
use progenitor_client::{ByteStream, Error};
use serde_json::json;

use crate::fixture::{PROMPT_ID, client, j, start};

async fn bytes(stream: ByteStream) -> Vec<u8> {
    stream.into_inner().try_collect::<Vec<_>>().await.expect("body streams").concat()
}

#[tokio::test]
async fn every_operation_round_trips_through_the_generated_client() {
    let servers = start().await;
    let local = client(&servers.local);
    let cloud = client(&servers.cloud);

    // Prompt and queue.
    let request: types::PromptRequest =
        j(json!({"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8}}}}));
    let accepted = local
        .execute_prompt(Some("test-suite"), &request)
        .await
        .expect("prompt accepted")
        .into_inner();
    assert_eq!((accepted.prompt_id.to_string().as_str(), accepted.number), (PROMPT_ID, 7.0));
    match local.execute_prompt(None, &j(json!({}))).await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!(e.status().as_u16(), 400);
            assert_eq!(e.error.type_, "no_prompt");
        }
        other => panic!("expected a no_prompt error, got {other:?}"),
    }
    assert_eq!(local.get_prompt_info().await.expect("prompt info").exec_info.queue_remaining, 2);
    assert_eq!(local.get_queue().await.expect("queue").queue_pending.len(), 1);
    local.manage_queue(&j(json!({"delete": [PROMPT_ID]}))).await.expect("queue delete");
    local.interrupt(&j(json!({"prompt_id": PROMPT_ID}))).await.expect("interrupt");
    local.free_memory(&j(json!({"unload_models": true}))).await.expect("free");

    // History and jobs.
    assert!(local.get_history(Some(1), None).await.expect("history").contains_key(PROMPT_ID));
    assert!(local.get_history(None, Some(3)).await.expect("history").is_empty());
    assert!(
        local
            .get_history_for_prompt(PROMPT_ID)
            .await
            .expect("history entry")
            .contains_key(PROMPT_ID)
    );
    local.manage_history(&j(json!({"clear": true}))).await.expect("history clear");
    let jobs = local
        .list_jobs(Some(std::num::NonZeroU64::new(5).expect("5")), Some(2), None, None, None, None)
        .await
        .expect("jobs");
    assert_eq!((jobs.pagination.limit, jobs.pagination.offset), (Some(5), 2));
    assert_eq!(local.get_job(PROMPT_ID).await.expect("job").status, types::JobStatus::Pending);
    match local.get_job("00000000-0000-4000-8000-000000000000").await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.error.as_str()), (404, "Job not found"))
        }
        other => panic!("expected 404, got {other:?}"),
    }
    assert!(local.cancel_job(PROMPT_ID).await.expect("cancel").cancelled);
    assert!(
        local
            .cancel_jobs(&j(json!({"job_ids": [PROMPT_ID]})))
            .await
            .expect("cancel many")
            .cancelled
    );

    // Nodes, models, system.
    assert!(local.get_object_info().await.expect("object_info").contains_key("ImageInvert"));
    assert!(
        local.get_node_info("ImageInvert").await.expect("one node").contains_key("ImageInvert")
    );
    assert!(local.get_node_info("NoSuchNode").await.expect("unknown node").is_empty());
    assert_eq!(local.get_embeddings().await.expect("embeddings").0, ["easynegative"]);
    assert_eq!(local.get_model_folders().await.expect("folders").len(), 2);
    assert_eq!(local.get_model_files("checkpoints").await.expect("files").0, ["sd.safetensors"]);
    match local.get_model_files("nope").await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.status().as_u16(), 404),
        other => panic!("expected 404, got {other:?}"),
    }
    assert_eq!(local.get_model_folder_paths().await.expect("folder paths")[0].name, "loras");
    assert_eq!(local.get_model_file_details("loras").await.expect("details")[0].path_index, 0);
    let preview =
        local.get_model_preview("loras", 3, "a b.safetensors").await.expect("preview").into_inner();
    assert_eq!(bytes(preview).await, b"loras/3/a b.safetensors");
    let metadata = local.get_view_metadata("loras", Some("x.safetensors")).await.expect("metadata");
    assert_eq!(metadata.get("file").map(String::as_str), Some("x.safetensors"));
    assert_eq!(local.get_extensions().await.expect("extensions").len(), 1);
    let document = local.get_open_api_document().await.expect("document").into_inner();
    assert_eq!(document.openapi, "3.0.3");
    assert!(document.paths.contains_key("/api/openapi.json"));
    assert_eq!(local.get_features().await.expect("features").max_upload_size, 104_857_600);
    assert_eq!(local.get_system_stats().await.expect("stats").devices[0].index, None);
    assert!(local.get_i18n().await.expect("i18n").contains_key("en"));
    assert!(local.get_workflow_templates().await.expect("templates").contains_key("pack"));
    let template = local.get_workflow_template("pack", "example.json").await.expect("template");
    assert_eq!(template.get("file"), Some(&json!("example.json")));
    assert_eq!(local.get_global_subgraphs().await.expect("subgraphs").len(), 1);
    assert!(local.get_global_subgraph("abc").await.expect("subgraph").is_some());
    assert!(local.get_global_subgraph("zzz").await.expect("unknown subgraph").is_none());
    assert!(local.get_node_replacements().await.expect("replacements").contains_key("Old"));

    // Files.
    let view = local
        .view_file(None, Some("a.png"), None, None, Some(types::FileType::Input), None)
        .await
        .expect("view");
    assert_eq!(
        view.headers().get("x-content-type-options").and_then(|v| v.to_str().ok()),
        Some("nosniff")
    );
    assert_eq!(bytes(view.into_inner()).await, b"a.png:Some(Input)");
    match local.view_file(None, Some("../x"), None, None, None, None).await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.status().as_u16(), 400),
        Err(other) => panic!("expected an empty 400, got {other}"),
        Ok(_) => panic!("expected an empty 400, got a file"),
    }
    // The query parameter `type` with an unknown value is rejected by the generated handler with the
    // operation's declared 400 (no body).
    let raw = reqwest::get(format!("{}/api/view?filename=a.png&type=bogus", servers.local))
        .await
        .expect("raw request");
    assert_eq!(raw.status().as_u16(), 400);
    assert!(raw.bytes().await.expect("body").is_empty());
    let uploaded = local
        .upload_image(
            "tiny.png",
            vec![1u8, 2, 3],
            &UploadOptions { subfolder: Some("sub".to_owned()), ..Default::default() },
        )
        .await
        .expect("upload")
        .into_inner();
    assert_eq!(
        (uploaded.name.as_str(), uploaded.subfolder.as_str(), uploaded.type_),
        ("tiny.png", "sub", types::FileType::Input)
    );
    let original: types::FileRef =
        j(json!({"filename": "tiny.png", "subfolder": "", "type": "input"}));
    let mask = local
        .upload_mask(
            "mask.png",
            vec![4u8],
            &original,
            &UploadOptions { type_: Some(types::FileType::Temp), ..Default::default() },
        )
        .await
        .expect("mask upload")
        .into_inner();
    assert_eq!((mask.name.as_str(), mask.type_), ("mask.png", types::FileType::Temp));
    match local.upload_image("empty.png", Vec::<u8>::new(), &UploadOptions::default()).await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.code.as_str()), (400, "invalid_upload"))
        }
        other => panic!("expected 400, got {other:?}"),
    }
    assert_eq!(
        local.get_directory_files(types::FileType::Output).await.expect("files").0,
        ["output.png"]
    );

    // Users, settings, user data.
    assert_eq!(local.get_users().await.expect("users").storage, "server");
    assert_eq!(local.create_user(&j(json!({"username": "ann"}))).await.expect("user").0, "ann_1");
    match local.create_user(&j(json!({"username": "taken"}))).await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.error, "Duplicate username."),
        other => panic!("expected 400, got {other:?}"),
    }
    assert_eq!(
        local.get_settings().await.expect("settings").get("Comfy.Locale"),
        Some(&json!("en"))
    );
    local.post_settings(&j(json!({"Comfy.Locale": "de"}))).await.expect("post settings");
    assert_eq!(local.get_setting("Comfy.Locale").await.expect("setting").0, json!("en"));
    assert_eq!(
        local.get_setting("Unset.Key").await.expect("unset setting").0,
        serde_json::Value::Null
    );
    local.post_setting("Comfy.Locale", &j(json!("fr"))).await.expect("post setting");
    match local
        .list_user_data("workflows", Some("true"), None, None)
        .await
        .expect("listing")
        .into_inner()
    {
        types::UserDataListing::Variant1(files) => assert_eq!(files[0].path, "a.json"),
        other => panic!("expected files with details, got {other:?}"),
    }
    match local.list_user_data("nope", None, None, None).await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.status().as_u16(), 404),
        other => panic!("expected 404, got {other:?}"),
    }
    assert_eq!(
        local.list_user_data_v2(Some("workflows")).await.expect("v2 listing")[0].path,
        "workflows"
    );
    // `/` in a path parameter travels percent-encoded and arrives decoded.
    let read = local.get_user_data("workflows/a.json").await.expect("read").into_inner();
    assert_eq!(bytes(read).await, b"workflows/a.json");
    match local
        .post_user_data("workflows/b.json", None, None, b"{}".to_vec())
        .await
        .expect("write")
        .into_inner()
    {
        types::UserDataWriteResult::UserDataFileInfo(info) => {
            assert_eq!((info.path.as_str(), info.size), ("workflows/b.json", 2))
        }
        other => panic!("expected file info, got {other:?}"),
    }
    match local.post_user_data("workflows/b.json", None, Some("false"), b"{}".to_vec()).await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.status().as_u16(), 409),
        other => panic!("expected 409, got {other:?}"),
    }
    local.delete_user_data("workflows/a.json").await.expect("delete");
    match local
        .move_user_data("workflows/b.json", "workflows/c.json", None, None)
        .await
        .expect("move")
        .into_inner()
    {
        types::UserDataWriteResult::String(path) => assert_eq!(path, "workflows/c.json"),
        other => panic!("expected a path, got {other:?}"),
    }

    // Operators' routes.
    assert_eq!(bytes(local.get_liveness().await.expect("liveness").into_inner()).await, b"ok");
    match local.get_readiness().await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.code.as_str()), (503, "draining"))
        }
        Err(other) => panic!("expected 503, got {other:?}"),
        Ok(_) => panic!("expected 503, got 200"),
    }
    let metrics = bytes(local.get_metrics().await.expect("metrics").into_inner()).await;
    assert!(metrics.ends_with(b"# EOF\n"));

    // Internal routes.
    assert_eq!(bytes(local.get_logs().await.expect("logs").into_inner()).await, b"started\n");
    assert_eq!(local.get_raw_logs().await.expect("raw logs").size.cols, 80);
    local.subscribe_logs(&j(json!({"clientId": "c", "enabled": true}))).await.expect("subscribe");
    assert!(local.get_folder_paths().await.expect("folder paths").contains_key("checkpoints"));

    // The websocket: the first event is `status` with the client id as sid.
    let mut events = local.events("sock-1").await.expect("websocket opens");
    let Event::Message(first) = events.next().await.expect("an event").expect("a valid event")
    else {
        panic!("expected a known text frame first");
    };
    match *first {
        types::WsMessage::StatusMessage(m) => assert_eq!(m.data.sid.as_deref(), Some("sock-1")),
        other => panic!("expected status, got {other:?}"),
    }
    drop(events);

    // run_prompt: submit, follow the events to `executing {node: null}`, fetch the history entry.
    let run = local.run_prompt(request.clone()).await.expect("prompt runs");
    assert_eq!(run.prompt_id.to_string(), PROMPT_ID);
    assert!(run.history.outputs.contains_key("1"));

    // Cloud-only operations, on the cloud-runtime server.
    assert_eq!(cloud.get_jwks().await.expect("jwks").keys[0].kid, "k1");
    assert_eq!(
        cloud.get_oauth_authorization_server_metadata().await.expect("AS metadata").issuer,
        "https://kiln.test"
    );
    assert_eq!(
        cloud.get_oauth_protected_resource_metadata().await.expect("PRM").resource,
        "https://kiln.test/mcp"
    );
    assert_eq!(
        cloud.get_oauth_protected_resource_metadata_for_mcp().await.expect("PRM /mcp").resource,
        "https://kiln.test/mcp"
    );
    match cloud.create_session(&j(json!({"username": "ann", "password": "wrong"}))).await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.code.as_str()), (401, "invalid_credentials"))
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let session = cloud
        .create_session(&j(json!({"username": "ann", "password": "pw"})))
        .await
        .expect("session");
    assert_eq!(session.username.as_deref(), Some("ann"));
    assert!(
        session
            .headers()
            .get("set-cookie")
            .is_some_and(|c| c.to_str().is_ok_and(|c| c.starts_with("__Host-comfy_session=")))
    );
    match cloud.get_session().await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.code.as_str()), (401, "no_session"))
        }
        other => panic!("expected 401, got {other:?}"),
    }
    assert!(cloud.delete_session(Some("c")).await.expect("logout").success);
    match cloud.delete_session(None).await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.code, "csrf_invalid"),
        other => panic!("expected 403, got {other:?}"),
    }
    assert_eq!(
        cloud.exchange_token(&j(json!({"workspace_id": "w9"}))).await.expect("token").workspace_id,
        "w9"
    );
    assert_eq!(cloud.list_api_keys().await.expect("keys").keys[0].hint, "abcd");
    let created = cloud.create_api_key(&j(json!({"name": "ci"}))).await.expect("created");
    assert_eq!((created.key.as_str(), created.api_key.name.as_str()), ("comfyui-secret", "ci"));
    cloud.revoke_api_key("k1").await.expect("revoked");
    match cloud.revoke_api_key("k9").await {
        Err(Error::ErrorResponse(e)) => assert_eq!(e.status().as_u16(), 404),
        other => panic!("expected 404, got {other:?}"),
    }
    let challenge = cloud
        .oauth_authorize(None, None, None, Some(&uuid::Uuid::nil()), None, None, None, None, None)
        .await
        .expect("consent challenge");
    assert_eq!(challenge.workspaces[0].role, types::OAuthWorkspaceRole::Owner);
    let decision: types::OAuthConsentDecision =
        j(json!({"oauth_request_id": uuid::Uuid::nil(), "csrf_token": "c", "decision": "deny"}));
    assert!(
        cloud
            .oauth_authorize_decision(&decision)
            .await
            .expect("decision")
            .redirect_to
            .ends_with("decision=deny")
    );
    let token = cloud
        .oauth_token(&j(
            json!({"grant_type": "authorization_code", "code": "the-code", "client_id": "c1"}),
        ))
        .await
        .expect("token");
    assert_eq!(
        token.headers().get("cache-control").and_then(|v| v.to_str().ok()),
        Some("no-store")
    );
    assert_eq!(token.access_token, "the-code");
    match cloud.oauth_token(&j(json!({"grant_type": "password"}))).await {
        Err(Error::ErrorResponse(e)) => {
            assert_eq!(e.error, types::OAuthTokenErrorCode::UnsupportedGrantType)
        }
        other => panic!("expected an OAuth error, got {other:?}"),
    }
    let registered = cloud
        .oauth_register(&j(json!({"redirect_uris": ["http://127.0.0.1:9/cb"]})))
        .await
        .expect("register");
    assert_eq!(registered.status().as_u16(), 201);
    assert_eq!(registered.redirect_uris, ["http://127.0.0.1:9/cb"]);

    let read = cloud.get_oauth_client("c1").await.expect("registration read");
    assert_eq!(read.client_id, "c1");
    let page = cloud.oauth_consent_page(Some("r1")).await.expect("consent page");
    assert!(String::from_utf8_lossy(&bytes(page.into_inner()).await).contains("r1"));

    // The raw operations (MCP) take the whole request: not in the generated client, called over HTTP.
    let http = reqwest::Client::new();
    for base in [&servers.local, &servers.cloud] {
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
        let posted =
            http.post(format!("{base}/mcp")).json(&message).send().await.expect("POST /mcp");
        let posted: serde_json::Value = posted.json().await.expect("JSON");
        assert_eq!((posted["method"].clone(), posted["echo"].clone()), ("POST".into(), message));
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let answer =
                http.request(method.clone(), format!("{base}/mcp")).send().await.expect("/mcp");
            let answer: serde_json::Value = answer.json().await.expect("JSON");
            assert_eq!(answer["method"], method.as_str());
        }
    }

    // Every operation of the spec ran at least once.
    let ran = servers.fixture.calls();
    let missing: Vec<_> =
        OPERATIONS.iter().map(|op| op.id).filter(|id| !ran.contains(id)).collect();
    assert!(missing.is_empty(), "operations never exercised: {missing:?}");
}
