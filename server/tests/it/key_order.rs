//! Issue #9, item 1: JSON objects go out in ComfyUI's order, read from the bytes Kiln sends (serde_json keeps
//! insertion order here), not only the structure.
//!
//! ComfyUI's objects are Python dicts, so clients see insertion order and some rely on it: a client that turns
//! `/object_info` into typed node classes binds positional arguments by the order of `input.required`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::binary::{get_json as get, start, temp_dir};

/// The keys of a JSON object, in the order they were sent.
fn keys(value: &Value) -> Vec<&str> {
    value.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default()
}

/// Posts a prompt given as JSON text (so its key order is exactly the text's) and returns its id.
async fn post(http: &reqwest::Client, addr: &str, body: &str) -> String {
    let answer: Value = http
        .post(format!("http://{addr}/prompt"))
        .body(body.to_owned())
        .send()
        .await
        .expect("kiln answers")
        .json()
        .await
        .expect("JSON");
    answer["prompt_id"].as_str().unwrap_or_else(|| panic!("accepted: {answer}")).to_owned()
}

/// Waits until `/history/<id>` has the prompt and returns its entry.
async fn finished(http: &reqwest::Client, addr: &str, id: &str) -> Value {
    for _ in 0..300 {
        let history = get(http, addr, &format!("/history/{id}")).await;
        if let Some(entry) = history.get(id) {
            return entry.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("prompt {id} did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_object_info_lists_nodes_and_inputs_in_declaration_order() {
    let data_dir = temp_dir("order-object-info");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let info = get(&http, &addr, "/api/object_info").await;

    let roots = kiln_engine::roots::Roots {
        input: data_dir.join("input"),
        output: data_dir.join("output"),
        temp: data_dir.join("temp"),
    };
    let registered: Vec<String> = kiln_engine::nodes::builtin_registry(
        &roots,
        kiln_engine::models::ModelEnv::cpu(data_dir.join("models")),
    )
    .iter()
    .map(|(n, _)| n.to_owned())
    .collect();
    assert_eq!(keys(&info), registered, "classes in registration order");
    for (class, node) in info.as_object().expect("an object") {
        for kind in ["required", "optional", "hidden"] {
            let declared = node["input_order"][kind].as_array().cloned().unwrap_or_default();
            let declared: Vec<&str> = declared.iter().filter_map(Value::as_str).collect();
            assert_eq!(
                keys(&node["input"][kind]),
                declared,
                "{class}: input.{kind} as input_order says"
            );
        }
    }

    // What a typed client does with it: bind `SaveImage(image, "prefix")` by position, as in
    // `dict(zip(input.required, args))`, and submit. Alphabetical order would put the image in filename_prefix.
    let positional = [json!(["1", 0]), json!("positional")];
    let inputs: serde_json::Map<String, Value> = keys(&info["SaveImage"]["input"]["required"])
        .into_iter()
        .map(str::to_owned)
        .zip(positional)
        .collect();
    let prompt = json!({"prompt": {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": inputs},
    }});
    let id = post(&http, &addr, &prompt.to_string()).await;
    let entry = finished(&http, &addr, &id).await;
    assert_eq!(entry["outputs"]["2"]["images"][0]["filename"], "positional_00001_.png");
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Node ids, node keys and inputs deliberately out of alphabetical order, as the frontend sends them
/// (`inputs` before `class_type`).
const UNSORTED_PROMPT: &str = r#"{"prompt": {
    "10": {"inputs": {"width": 8, "height": 8, "color": 255, "batch_size": 1}, "class_type": "EmptyImage", "_meta": {"title": "Source"}},
    "9": {"inputs": {"image": ["10", 0]}, "class_type": "ImageInvert"},
    "2": {"inputs": {"filename_prefix": "order", "images": ["9", 0]}, "class_type": "SaveImage"}
}, "extra_data": {"zeta": 1, "extra_pnginfo": {"workflow": {"b": 1, "a": 2}}, "alpha": 2}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_the_prompt_is_echoed_in_the_order_the_client_sent_it() {
    let data_dir = temp_dir("order-echo");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let sent: Value = serde_json::from_str(UNSORTED_PROMPT).expect("JSON");
    let id = post(&http, &addr, UNSORTED_PROMPT).await;
    let entry = finished(&http, &addr, &id).await;

    let echoed = &entry["prompt"][2];
    assert_eq!(
        echoed.to_string(),
        sent["prompt"].to_string(),
        "history echoes the prompt byte for byte"
    );
    assert_eq!(keys(&entry["prompt"][3]), ["zeta", "extra_pnginfo", "alpha", "create_time"]);
    let job = get(&http, &addr, &format!("/api/jobs/{id}")).await;
    assert_eq!(
        job["workflow"]["prompt"].to_string(),
        sent["prompt"].to_string(),
        "and so does the job"
    );

    // The PNG's `prompt` text chunk is the prompt as sent; `workflow` from extra_pnginfo keeps its order too.
    let filename = entry["outputs"]["2"]["images"][0]["filename"].as_str().expect("a saved image");
    let png = std::fs::read(data_dir.join("output").join(filename))
        .expect("the PNG is in the output dir");
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let reader = decoder.read_info().expect("a PNG");
    let text = |key: &str| {
        reader
            .info()
            .uncompressed_latin1_text
            .iter()
            .find(|t| t.keyword == key)
            .map(|t| t.text.clone())
    };
    assert_eq!(text("prompt").as_deref(), Some(sent["prompt"].to_string().as_str()));
    assert_eq!(text("workflow").as_deref(), Some(r#"{"b":1,"a":2}"#));
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// The text frames a socket receives until `executing {node: null}`, parsed in order.
async fn frames_until_done(
    socket: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> Vec<Value> {
    use futures::StreamExt as _;
    let mut frames = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .expect("a frame");
        let Ok(text) = message.to_text() else { continue };
        let frame: Value = serde_json::from_str(text).expect("a JSON frame");
        let done = frame["type"] == "executing" && frame["data"]["node"].is_null();
        frames.push(frame);
        if done {
            return frames;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_history_is_oldest_first_and_outputs_in_execution_order() {
    let data_dir = temp_dir("order-history");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let client_id = "0123456789abcdef0123456789abcdef";
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/ws?clientId={client_id}"))
            .await
            .expect("websocket");
    // Outputs and intermediate nodes whose ids sort differently from the order they run in.
    let prompt = |n: u32| {
        json!({"client_id": client_id, "prompt": {
            "30": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": n}},
            "4": {"class_type": "ImageInvert", "inputs": {"image": ["30", 0]}},
            "10": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "ten"}},
            "9": {"class_type": "PreviewImage", "inputs": {"images": ["30", 0]}},
        }})
        .to_string()
    };
    let mut ids = Vec::new();
    let mut runs = Vec::new();
    for n in 0..4 {
        let id = post(&http, &addr, &prompt(n)).await;
        runs.push(frames_until_done(&mut socket).await);
        ids.push(id);
    }
    let history = get(&http, &addr, "/history").await;
    assert_eq!(keys(&history), ids.iter().map(String::as_str).collect::<Vec<_>>(), "oldest first");
    let last_two = get(&http, &addr, "/history?max_items=2").await;
    assert_eq!(
        keys(&last_two),
        [ids[2].as_str(), ids[3].as_str()],
        "max_items: the newest, oldest first"
    );

    // The first run executed every node: history lists outputs in the order `executed` announced them, and
    // `progress_state` lists nodes in the order they started.
    let frames = &runs[0];
    let executed: Vec<&str> = frames
        .iter()
        .filter(|f| f["type"] == "executed")
        .filter_map(|f| f["data"]["node"].as_str())
        .collect();
    let started: Vec<&str> = frames
        .iter()
        .filter(|f| f["type"] == "executing")
        .filter_map(|f| f["data"]["node"].as_str())
        .collect();
    assert_eq!(executed.len(), 2, "two outputs: {executed:?}");
    let entry = &history[&ids[0]];
    assert_eq!(keys(&entry["outputs"]), executed, "outputs in execution order");
    assert_eq!(keys(&entry["meta"]), executed);
    let last_state =
        frames.iter().rev().find(|f| f["type"] == "progress_state").expect("progress_state");
    assert_eq!(
        keys(&last_state["data"]["nodes"]),
        started,
        "progress_state: nodes in the order they started"
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}
