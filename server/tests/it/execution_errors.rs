//! Execution errors through the real binary, against ComfyUI's `ws_execution_error` capture: the
//! `execution_error` message and the history's copy of it have ComfyUI's fields, exception name, message form
//! and `current_outputs` (every node of the prompt: ComfyUI's output cache's `all_node_ids()`).

use futures::StreamExt as _;
use kiln_client::{Client, types};
use serde_json::{Value, json};

use crate::binary::{start, temp_dir};
use crate::golden::golden;

const CLIENT_ID: &str = "0123456789abcdef0123456789abcdef";

/// Posts `body` as `CLIENT_ID` and returns its `execution_error` data and every frame's type, in order, up to
/// the final `executing {node: null}`.
async fn run_failing(kiln: &Client, body: &Value) -> (uuid::Uuid, Value, Vec<String>) {
    let mut events = kiln.events(CLIENT_ID).await.expect("websocket");
    let _greeting = events.next().await.expect("greeting").expect("event");
    let mut body: types::PromptRequest = serde_json::from_value(body.clone()).expect("a request");
    body.client_id = Some(CLIENT_ID.to_owned());
    let accepted = kiln.execute_prompt(None, &body).await.expect("accepted").into_inner();
    let (mut error, mut seen) = (None, Vec::new());
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        let kiln_client::Event::Message(message) = event else { continue };
        let message = serde_json::to_value(&*message).expect("JSON");
        let kind = message["type"].as_str().unwrap_or_default().to_owned();
        if kind == "executed" {
            seen.push(format!("executed({})", message["data"]["node"].as_str().unwrap_or("?")));
        } else {
            seen.push(kind.clone());
        }
        if kind == "execution_error" {
            error = Some(message["data"].clone());
        }
        if kind == "executing" && message["data"]["node"].is_null() {
            break;
        }
    }
    (accepted.prompt_id, error.expect("an execution_error"), seen)
}

/// The history entry's status messages, by name.
async fn status_messages(kiln: &Client, prompt_id: uuid::Uuid) -> (Value, Vec<(String, Value)>) {
    let history = kiln.get_history_for_prompt(&prompt_id.to_string()).await.expect("history");
    let entry =
        serde_json::to_value(history.into_inner()).expect("JSON")[prompt_id.to_string()].clone();
    let messages = entry["status"]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| (m[0].as_str().expect("a name").to_owned(), m[1].clone()))
        .collect();
    (entry, messages)
}

fn sorted(ids: &Value) -> Vec<String> {
    let mut ids: Vec<String> = serde_json::from_value(ids.clone()).expect("a list of ids");
    ids.sort();
    ids
}

fn keys(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().expect("an object").keys().cloned().collect();
    keys.sort();
    keys
}

/// The same data but for the timestamp, which ComfyUI also takes separately for the socket and the history.
fn without_timestamp(data: &Value) -> Value {
    let mut data = data.clone();
    data.as_object_mut().expect("an object").remove("timestamp");
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_errors_have_comfyuis_fields_names_and_current_outputs() {
    let data_dir = temp_dir("exec-errors");
    let (_server, addr) = start(&data_dir);
    let kiln = Client::with_timeout(&format!("http://{addr}"), std::time::Duration::from_secs(60))
        .expect("client");
    std::fs::write(data_dir.join("input/bad.png"), b"not an image").expect("bad input");

    // The recorded case: LoadImage of a file that is not an image.
    let recorded = golden("ws_execution_error");
    let theirs = recorded["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["message"]["type"] == "execution_error")
        .map(|m| m["message"]["data"].clone())
        .expect("a recorded execution_error");
    let (prompt_id, ours, _) = run_failing(&kiln, &recorded["post_body"]).await;
    assert_eq!(keys(&ours), keys(&theirs), "the same fields");
    for field in ["node_id", "node_type", "executed", "exception_type", "current_inputs"] {
        assert_eq!(ours[field], theirs[field], "{field}");
    }
    assert_eq!(ours["exception_type"], "PIL.UnidentifiedImageError");
    // ComfyUI sends a Python set here, so its order varies from run to run: compare the nodes.
    assert_eq!(sorted(&ours["current_outputs"]), sorted(&theirs["current_outputs"]));
    let message = ours["exception_message"].as_str().expect("a message");
    assert!(
        message.starts_with("cannot identify image file '") && message.ends_with('\n'),
        "ComfyUI's form (`{}`), got {message:?}",
        theirs["exception_message"]
    );
    assert!(ours["traceback"].as_array().is_some_and(|t| !t.is_empty()), "a traceback");

    // The history keeps the same message.
    let (entry, messages) = status_messages(&kiln, prompt_id).await;
    let their_entry =
        recorded["history_after"].as_object().and_then(|m| m.values().next()).cloned();
    let their_entry = their_entry.expect("a recorded entry");
    assert_eq!(entry["status"]["status_str"], their_entry["status"]["status_str"]);
    assert_eq!(entry["status"]["completed"], their_entry["status"]["completed"]);
    let names: Vec<&str> = messages.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["execution_start", "execution_cached", "execution_error"]);
    assert_eq!(without_timestamp(&messages[2].1), without_timestamp(&ours));

    // A prompt that fails after another branch has produced its output: that branch ran and is reported,
    // as is every node of the prompt.
    let (prompt_id, error, seen) = run_failing(
        &kiln,
        &json!({"prompt": {
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
            "3": {"class_type": "LoadImage", "inputs": {"image": "bad.png"}},
            "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
        }}),
    )
    .await;
    let executed_at =
        seen.iter().position(|s| s == "executed(2)").expect("node 2 showed its image");
    let failed_at = seen.iter().position(|s| s == "execution_error").expect("an error");
    assert!(executed_at < failed_at, "{seen:?}");
    assert_eq!(error["node_id"], "3");
    assert_eq!(sorted(&error["executed"]), ["1", "2"]);
    assert_eq!(sorted(&error["current_outputs"]), ["1", "2", "3", "4"]);
    let (entry, messages) = status_messages(&kiln, prompt_id).await;
    let (name, stored) = messages.last().expect("messages");
    assert_eq!(name, "execution_error");
    assert_eq!(without_timestamp(stored), without_timestamp(&error));
    assert!(entry["outputs"]["2"]["images"].as_array().is_some_and(|i| i.len() == 1), "{entry}");
    let _ = std::fs::remove_dir_all(&data_dir);
}
