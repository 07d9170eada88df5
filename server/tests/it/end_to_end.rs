//! The real `kiln` binary driven by the Rust SDK: a workflow of built-in nodes runs, its events arrive on the
//! websocket, its history and job are recorded, and its image is served by `/view`.

use kiln_client::{Client, UploadOptions, types};
use serde_json::json;

use crate::binary::{start, temp_dir};
use crate::golden::golden;

fn client(addr: &str) -> Client {
    Client::with_timeout(&format!("http://{addr}"), std::time::Duration::from_secs(60))
        .expect("client")
}

fn request(prompt: serde_json::Value) -> types::PromptRequest {
    serde_json::from_value(json!({"prompt": prompt})).expect("a prompt request")
}

async fn bytes(stream: progenitor_client::ByteStream) -> Vec<u8> {
    use futures::TryStreamExt as _;
    stream.into_inner().try_collect::<Vec<_>>().await.expect("body").concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_end_to_end_against_the_binary() {
    let data_dir = temp_dir("e2e");
    let (_server, addr) = start(&data_dir);
    let kiln = client(&addr);

    // Run EmptyImage -> ImageInvert -> SaveImage and follow it on the websocket to the end.
    let run = kiln
        .run_prompt(request(json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x102030}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "e2e"}},
        })))
        .await
        .expect("the prompt runs");
    assert_eq!(run.history.status.status_str, types::HistoryStatusStr::Success);
    let image = &run.history.outputs["3"].images[0];
    assert_eq!((image.filename.as_str(), image.type_), ("e2e_00001_.png", types::FileType::Output));
    let names: Vec<&str> =
        run.history.status.messages.iter().filter_map(|m| m.0[0].0.as_str()).collect();
    assert_eq!(names, ["execution_start", "execution_cached", "execution_success"]);

    // The image is served by /view, inverted.
    let png = bytes(
        kiln.view_file(
            None,
            Some("e2e_00001_.png"),
            None,
            None,
            Some(types::FileType::Output),
            None,
        )
        .await
        .expect("view")
        .into_inner(),
    )
    .await;
    let decoded = image::load_from_memory(&png).expect("a PNG").to_rgb8();
    let expect = |v: u8| ((1.0f32 - f32::from(v) / 255.0) * 255.0) as u8;
    assert_eq!(decoded.get_pixel(0, 0).0, [expect(0x10), expect(0x20), expect(0x30)]);

    // History, jobs and the queue agree.
    let id = run.prompt_id.to_string();
    assert!(kiln.get_history(Some(1), None).await.expect("history").contains_key(&id));
    let job = kiln.get_job(&id).await.expect("job").into_inner();
    assert_eq!(job.status, types::JobStatus::Completed);
    assert_eq!(job.preview_output.expect("a preview").filename.as_deref(), Some("e2e_00001_.png"));
    let queue = kiln.get_queue().await.expect("queue").into_inner();
    assert!(queue.queue_pending.is_empty() && queue.queue_running.is_empty());

    // A second identical run is served from the cache.
    let again = kiln
        .run_prompt(request(json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x102030}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "e2e"}},
        })))
        .await
        .expect("runs again");
    let cached = &again.history.status.messages[1].0[1].0["nodes"];
    assert_eq!(
        cached.as_array().map(Vec::len),
        Some(3),
        "every node came from the cache: {cached}"
    );

    // Upload an image and load it.
    let stored = kiln
        .upload_image("in.png", png.clone(), &UploadOptions::default())
        .await
        .expect("upload")
        .into_inner();
    assert_eq!((stored.name.as_str(), stored.type_), ("in.png", types::FileType::Input));
    let info = kiln.get_node_info("LoadImage").await.expect("object_info").into_inner();
    assert!(
        serde_json::to_string(&info).expect("json").contains("in.png"),
        "LoadImage lists the upload"
    );
    let loaded = kiln
        .run_prompt(request(json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "in.png"}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        })))
        .await
        .expect("LoadImage runs");
    assert_eq!(loaded.history.outputs["2"].images[0].type_, types::FileType::Temp);

    // A prompt that fails validation is refused with ComfyUI's error shape.
    match kiln
        .execute_prompt(None, &request(json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 99999, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}},
        })))
        .await
    {
        Err(progenitor_client::Error::ErrorResponse(e)) => {
            assert_eq!(e.status().as_u16(), 400);
            assert_eq!(e.error.type_, "prompt_outputs_failed_validation");
            assert_eq!(e.node_errors["1"].errors[0].type_, "value_bigger_than_max");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// The golden capture's frame sequence: type, plus the node of `executing`/`executed` and the node states of
/// `progress_state` (binary frames are described by the caller: event type and image format).
fn describe(message: &serde_json::Value) -> String {
    let kind = message["type"].as_str().unwrap_or_default();
    let data = &message["data"];
    match kind {
        "executing" | "executed" => match data["node"].as_str() {
            Some(node) => format!("{kind}({node})"),
            None => kind.to_owned(),
        },
        "progress_state" => {
            let mut nodes: Vec<String> = data["nodes"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(id, n)| format!("{id}:{}", n["state"].as_str().unwrap_or_default()))
                .collect();
            nodes.sort();
            format!("{kind}({})", nodes.join(","))
        }
        other => other.to_owned(),
    }
}

/// Posts a captured prompt with a client id and returns the frames its socket received, described.
async fn frames_for(kiln: &Client, case: &serde_json::Value, client_id: &str) -> Vec<String> {
    use futures::StreamExt as _;
    let mut events = kiln.events(client_id).await.expect("websocket");
    let mut body: types::PromptRequest =
        serde_json::from_value(case["post_body"].clone()).expect("a prompt request");
    body.client_id = Some(client_id.to_owned());
    let mut seen = Vec::new();
    // The greeting arrives before the prompt is posted.
    let greeting = events.next().await.expect("greeting").expect("event");
    seen.push(greeting);
    kiln.execute_prompt(None, &body).await.expect("accepted");
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        let done = matches!(&event, kiln_client::Event::Message(m) if matches!(&**m, types::WsMessage::ExecutingMessage(e) if e.data.node.is_none()));
        seen.push(event);
        if done {
            break;
        }
    }
    seen.iter()
        .map(|event| match event {
            kiln_client::Event::Message(m) => describe(&serde_json::to_value(m).expect("json")),
            kiln_client::Event::Other(v) => describe(v),
            kiln_client::Event::Binary { event_type, payload } => {
                // Type 1: `[u32 format][image]`; the image must really be one of that format.
                let format = u32::from_be_bytes(payload[..4].try_into().expect("a format"));
                assert!(payload[4..].starts_with(b"\x89PNG"), "a PNG preview");
                format!("binary({event_type},{format})")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_frames_come_in_comfyuis_order() {
    let data_dir = temp_dir("ws-order");
    let (_server, addr) = start(&data_dir);
    let kiln = client(&addr);
    // ws_execution_error loads a file that is not an image.
    std::fs::write(data_dir.join("input/bad.png"), b"not an image").expect("bad input");
    let cases =
        ["ws_success", "ws_cached_rerun", "ws_execution_error", "ws_binary_save_image_websocket"];
    for (case, client_id) in cases.map(|c| (c, "0123456789abcdef0123456789abcdef")) {
        let recorded = golden(case);
        let expected: Vec<String> = recorded["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| match m["frame"].as_str() {
                Some("binary") => format!("binary({},{})", m["event_type"], m["image_type"]),
                _ => describe(&m["message"]),
            })
            .collect();
        let ours = frames_for(&kiln, &recorded, client_id).await;
        assert_eq!(ours, expected, "{case}");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}
