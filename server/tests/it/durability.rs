//! Durability: kill `kiln` with SIGKILL while a prompt runs and 100 are queued; after a restart the queued
//! ones run, the running one is recorded as interrupted, and nothing is lost (ComfyUI loses its queue).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::binary::{start_with, temp_dir};

async fn post(http: &reqwest::Client, addr: &str, prompt: Value) -> String {
    let response = http
        .post(format!("http://{addr}/api/prompt"))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.expect("JSON");
    body["prompt_id"].as_str().expect("an id").to_owned()
}

async fn get(http: &reqwest::Client, addr: &str, path: &str) -> Value {
    http.get(format!("http://{addr}{path}")).send().await.expect("sent").json().await.expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_keeps_its_queue_and_records_the_running_prompt_as_interrupted() {
    let data_dir = temp_dir("durability");
    killed_server_keeps_its_queue(&data_dir, &[]).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// The scenario of the test above, with `args` on both starts (the database to use).
pub(crate) async fn killed_server_keeps_its_queue(
    data_dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
) {
    let http = reqwest::Client::new();
    let (server, addr) = start_with(data_dir, args);

    // A slow prompt: a large lanczos upscale.
    let slow = post(&http, &addr, json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4096, "height": 4096, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "lanczos", "width": 8192, "height": 8192, "crop": "disabled"}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }))
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&http, &addr, "/api/queue").await["queue_running"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < deadline, "the slow prompt never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut queued = Vec::new();
    for i in 0..100 {
        queued.push(
            post(&http, &addr, json!({
                "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": i}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": format!("q{i}")}},
            }))
            .await,
        );
    }
    let queue = get(&http, &addr, "/api/queue").await;
    assert_eq!(queue["queue_running"][0][1], slow.as_str(), "the slow prompt still runs");
    drop(server); // SIGKILL

    let (_server, addr) = start_with(data_dir, args);
    let deadline = Instant::now() + Duration::from_secs(120);
    while get(&http, &addr, "/api/prompt").await["exec_info"]["queue_remaining"] != 0 {
        assert!(Instant::now() < deadline, "the restored queue did not drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let history = get(&http, &addr, "/api/history").await;
    for id in &queued {
        assert_eq!(
            history[id]["status"]["status_str"], "success",
            "queued prompt {id} ran after the restart"
        );
    }
    let interrupted = &history[&slow];
    assert_eq!(interrupted["status"]["status_str"], "error");
    assert_eq!(interrupted["status"]["messages"][0][0], "execution_interrupted");
    let job = get(&http, &addr, &format!("/api/jobs/{slow}")).await;
    assert_eq!(job["status"], "cancelled");
}
