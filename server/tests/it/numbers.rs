//! Prompt numbers as ComfyUI gives them (issue 9): every `POST /prompt` whose JSON body has no `number` takes
//! the next number from the counter before it is validated, so rejected prompts use numbers too; `front`
//! negates it; a client `number` takes none. Kiln's counter also continues after a restart.

use serde_json::{Value, json};

use crate::binary::{start, temp_dir};

/// Posts a raw body to `/api/prompt`; the status and the JSON answer.
async fn post(http: &reqwest::Client, addr: &str, body: &str) -> (u16, Value) {
    let response = http
        .post(format!("http://{addr}/api/prompt"))
        .body(body.to_owned())
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn valid(front: bool) -> String {
    json!({
        "prompt": {
            "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        },
        "front": front,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_rejected_prompts_use_numbers_as_in_comfyui() {
    let data_dir = temp_dir("numbers");
    let http = reqwest::Client::new();
    let (server, addr) = start(&data_dir);

    let (status, body) = post(&http, &addr, &valid(false)).await;
    assert_eq!((status, &body["number"]), (200, &json!(0)), "{body}");
    // Rejected by validation: takes 1.
    let unknown = r#"{"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}"#;
    assert_eq!(post(&http, &addr, unknown).await.0, 400);
    // Rejected before validation (a list where the prompt goes; ComfyUI answers 500): takes 2.
    assert_eq!(post(&http, &addr, r#"{"prompt": [1, 2]}"#).await.0, 400);
    // No prompt at all: takes 3.
    assert_eq!(post(&http, &addr, "{}").await.0, 400);
    // A client number takes none, accepted or not; a body that is not JSON takes none.
    let numbered = r#"{"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}, "number": 7}"#;
    assert_eq!(post(&http, &addr, numbered).await.0, 400);
    assert_eq!(post(&http, &addr, "{not json").await.0, 400);
    let mut with_number: Value = serde_json::from_str(&valid(false)).expect("JSON");
    with_number["number"] = json!(42.5);
    let (status, body) = post(&http, &addr, &with_number.to_string()).await;
    assert_eq!((status, &body["number"]), (200, &json!(42.5)), "{body}");

    let (status, body) = post(&http, &addr, &valid(false)).await;
    assert_eq!((status, &body["number"]), (200, &json!(4)), "{body}");
    let (status, body) = post(&http, &addr, &valid(true)).await;
    assert_eq!((status, &body["number"]), (200, &json!(-5)), "front negates the counter: {body}");

    // Kiln keeps the counter across a restart (ComfyUI starts again from 0).
    drop(server);
    let (_server, addr) = start(&data_dir);
    let (status, body) = post(&http, &addr, &valid(false)).await;
    assert_eq!((status, &body["number"]), (200, &json!(6)), "{body}");
    let _ = std::fs::remove_dir_all(&data_dir);
}
