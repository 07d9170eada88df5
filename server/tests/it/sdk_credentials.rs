//! The Rust SDK against servers that ask for credentials: `run_prompt` (HTTP and the event websocket) on the
//! cloud runtime with an API key, and on a local runtime started with `--api-key-file` with a bearer token.

use std::time::Duration;

use kiln_client::{Client, Credentials, EventsError, RunError, types};
use serde_json::json;
use tokio_tungstenite::tungstenite;

use crate::binary::{start_cloud, start_with, temp_dir};

fn request() -> types::PromptRequest {
    serde_json::from_value(json!({"prompt": {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 3}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "sdk"}},
    }}))
    .expect("a prompt request")
}

fn client(addr: &str, credentials: Credentials) -> Client {
    Client::with_credentials(&format!("http://{addr}"), credentials, Duration::from_secs(60))
        .expect("client")
}

/// The websocket handshake was refused with 401.
fn refused(result: Result<kiln_client::PromptRun, RunError>) -> bool {
    matches!(
        result,
        Err(RunError::Events(EventsError::WebSocket(tungstenite::Error::Http(response))))
            if response.status().as_u16() == 401
    )
}

async fn runs(kiln: &Client) {
    let run = kiln.run_prompt(request()).await.expect("the prompt runs");
    assert!(run.history.status.completed, "the prompt ran to the end");
    assert_eq!(run.history.outputs["2"].images.len(), 1, "the image is saved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_runs_a_prompt_on_the_cloud_runtime_with_an_api_key() {
    let data_dir = temp_dir("sdk-cloud");
    let (alice, _) = crate::cloud_isolation::accounts(&data_dir).await;
    let (_server, addr) = start_cloud(&data_dir);

    runs(&client(&addr, Credentials::ApiKey(alice.clone()))).await;
    let queue = client(&addr, Credentials::ApiKey(alice)).get_queue().await.expect("queue");
    assert!(queue.queue_running.is_empty() && queue.queue_pending.is_empty());

    assert!(refused(client(&addr, Credentials::None).run_prompt(request()).await));
    let wrong = Credentials::ApiKey("comfyui-not-a-key".to_owned());
    assert!(refused(client(&addr, wrong).run_prompt(request()).await));
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_sends_a_bearer_token_to_a_local_runtime_with_an_api_key_file() {
    let data_dir = temp_dir("sdk-key-file");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let key_file = data_dir.join("key.txt");
    std::fs::write(&key_file, "0123456789abcdef-sdk\n").expect("key file");
    let (_server, addr) =
        start_with(&data_dir, &[std::ffi::OsStr::new("--api-key-file"), key_file.as_os_str()]);

    runs(&client(&addr, Credentials::Bearer("0123456789abcdef-sdk".to_owned()))).await;
    assert!(refused(client(&addr, Credentials::None).run_prompt(request()).await));
    let _ = std::fs::remove_dir_all(&data_dir);
}
