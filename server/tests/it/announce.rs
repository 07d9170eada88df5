//! Store first, then announce (issue 9): a client that fetches `/history/<id>` as soon as `execution_success`
//! arrives always finds the entry, and the run's last frames keep ComfyUI's order (`execution_success`, then
//! `status`, then `executing {node: null}`).
//!
//! The client talks to kiln directly: through the checking proxy it would react too late to see the race.

use futures::StreamExt as _;
use kiln_client::{Client, Event, types};
use serde_json::{Value, json};

use crate::binary::{get_json, start, temp_dir};

/// How many prompts race their history entry (before the fix, 3 to 19 of them lost it in five runs).
const PROMPTS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_history_is_stored_before_execution_success_is_sent() {
    let data_dir = temp_dir("announce");
    let (server, _) = start(&data_dir);
    let addr = server.direct_addr().to_owned();
    let kiln = Client::with_timeout(&format!("http://{addr}"), std::time::Duration::from_secs(60))
        .expect("client");
    let http = reqwest::Client::new();
    let client_id = "0123456789abcdef0123456789abcdef";
    let mut events = kiln.events(client_id).await.expect("websocket");
    // The greeting `status` means the socket is registered.
    events.next().await.expect("a frame").expect("the greeting");
    let mut next_frame = async || {
        let Some(Ok(Event::Message(message))) =
            tokio::time::timeout(std::time::Duration::from_secs(60), events.next())
                .await
                .expect("a frame in time")
        else {
            return None;
        };
        Some(*message)
    };

    let mut missing = Vec::new();
    for i in 0..PROMPTS {
        let body = json!({
            "prompt": {
                "1": {"class_type": "PrimitiveInt", "inputs": {"value": i}},
                "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            },
            "client_id": client_id,
        });
        let answer: Value = http
            .post(format!("http://{addr}/api/prompt"))
            .body(body.to_string())
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("JSON");
        let id = answer["prompt_id"].as_str().expect("an id").to_owned();
        // Fetch the entry the moment execution_success arrives.
        loop {
            match next_frame().await {
                Some(types::WsMessage::ExecutionSuccessMessage(m))
                    if m.data.prompt_id.to_string() == id =>
                {
                    break;
                }
                _ => continue,
            }
        }
        let history = get_json(&http, &addr, &format!("/api/history/{id}")).await;
        if history.get(&id).is_none() {
            missing.push(id.clone());
        }
        // Then the run ends as ComfyUI's does: status, then executing {node: null}.
        let mut frames = Vec::new();
        loop {
            match next_frame().await {
                Some(types::WsMessage::StatusMessage(_)) => frames.push("status"),
                Some(types::WsMessage::ExecutingMessage(m)) if m.data.node.is_none() => {
                    assert_eq!(m.data.prompt_id.map(|p| p.to_string()), Some(id.clone()));
                    break;
                }
                Some(other) => panic!("after execution_success of {id}: {other:?}"),
                None => {}
            }
        }
        assert_eq!(frames, ["status"], "between execution_success and executing null of {id}");
    }
    assert!(
        missing.is_empty(),
        "{} of {PROMPTS} prompts had no history entry when execution_success arrived: {missing:?}",
        missing.len()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}
