//! What operators see: the probes (`/healthz`, `/readyz`), `/metrics`, and the drain after SIGTERM, through
//! the real binary.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::binary::{Server, start, start_cloud, start_with, temp_dir};

pub(crate) async fn post(http: &reqwest::Client, addr: &str, prompt: Value) -> reqwest::Response {
    http.post(format!("http://{addr}/api/prompt"))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .expect("sent")
}

async fn queue(http: &reqwest::Client, addr: &str, prompt: Value) -> String {
    let response = post(http, addr, prompt).await;
    assert_eq!(response.status().as_u16(), 200, "the prompt is accepted");
    let body: Value = response.json().await.expect("JSON");
    body["prompt_id"].as_str().expect("an id").to_owned()
}

pub(crate) async fn get(http: &reqwest::Client, addr: &str, path: &str) -> reqwest::Response {
    http.get(format!("http://{addr}{path}")).send().await.expect("kiln answers")
}

async fn history(http: &reqwest::Client, addr: &str) -> Value {
    get(http, addr, "/api/history").await.json().await.expect("JSON")
}

/// Waits until the server has no prompt pending or running.
async fn idle(http: &reqwest::Client, addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let body: Value = get(http, addr, "/api/prompt").await.json().await.expect("JSON");
        if body["exec_info"]["queue_remaining"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the queue did not drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a prompt runs.
async fn running(http: &reqwest::Client, addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body: Value = get(http, addr, "/api/queue").await.json().await.expect("JSON");
        if body["queue_running"].as_array().is_some_and(|r| !r.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "the slow prompt never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metrics(http: &reqwest::Client, addr: &str) -> String {
    let response = get(http, addr, "/metrics").await;
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"].to_str().expect("ASCII").to_owned();
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    response.text().await.expect("text")
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

fn tiny() -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 7}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "ops"}},
    })
}

/// A prompt that runs for seconds (about 2 s an upscale in a test build), in steps: an interruption stops it
/// between two upscales.
fn slow() -> Value {
    let scale = |from: &str, size: u32| json!({"class_type": "ImageScale", "inputs": {"image": [from, 0], "upscale_method": "lanczos", "width": size, "height": size, "crop": "disabled"}});
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": 0}},
        "2": scale("1", 2048),
        "3": scale("2", 1024),
        "4": scale("3", 2048),
        "5": scale("4", 64),
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "slow"}},
    })
}

/// Waits for the server to exit after SIGTERM (it must exit with success) and returns its whole log.
fn exits(server: &mut Server) -> Vec<String> {
    let status =
        server.wait_exit(Duration::from_secs(120)).expect("the server stopped after draining");
    assert!(status.success(), "the server exits cleanly after a drain: {status}");
    // The log arrives through a pipe: its last line says the server stopped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().last().is_some_and(|l| l.contains("stopped")) {
        assert!(Instant::now() < deadline, "the last line says it stopped: {:?}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    server.log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_and_metrics_count_what_happened() {
    let data_dir = temp_dir("operations-metrics");
    let http = reqwest::Client::new();
    let (_server, addr) = start(&data_dir);

    let live = get(&http, &addr, "/healthz").await;
    assert_eq!(live.status().as_u16(), 200);
    assert_eq!(live.text().await.expect("text"), "ok");
    let ready = get(&http, &addr, "/readyz").await;
    assert_eq!(ready.status().as_u16(), 200);
    assert_eq!(ready.text().await.expect("text"), "ready");

    let before = metrics(&http, &addr).await;
    assert!(has_line(&before, r#"kiln_worker_state{state="idle"} 1"#), "{before}");
    assert!(has_line(&before, r#"kiln_queue_prompts{state="pending"} 0"#), "{before}");
    assert!(before.ends_with("# EOF\n"), "{before}");

    let id = queue(&http, &addr, tiny()).await;
    let rejected =
        post(&http, &addr, json!({"1": {"class_type": "NoSuchNode", "inputs": {}}})).await;
    assert_eq!(rejected.status().as_u16(), 400);
    idle(&http, &addr).await;
    assert_eq!(history(&http, &addr).await[&id]["status"]["status_str"], "success");

    let after = metrics(&http, &addr).await;
    for line in [
        r#"kiln_prompts_submitted_total{result="accepted"} 1"#,
        r#"kiln_prompts_submitted_total{result="rejected"} 1"#,
        "kiln_prompt_accept_seconds_count 1",
        r#"kiln_prompts_finished_total{outcome="success"} 1"#,
        "kiln_prompt_run_seconds_count 1",
        r#"kiln_nodes_total{result="executed"} 2"#,
        r#"kiln_queue_prompts{state="running"} 0"#,
        r#"kiln_worker_state{state="idle"} 1"#,
        "kiln_model_loads_total 0",
    ] {
        assert!(has_line(&after, line), "`{line}` is missing from:\n{after}");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_runtime_answers_probes_and_metrics_without_credentials() {
    let data_dir = temp_dir("operations-cloud");
    let http = reqwest::Client::new();
    let (_server, addr) = start_cloud(&data_dir);
    assert_eq!(get(&http, &addr, "/healthz").await.status().as_u16(), 200);
    assert_eq!(get(&http, &addr, "/readyz").await.status().as_u16(), 200);
    let text = metrics(&http, &addr).await;
    assert!(has_line(&text, r#"kiln_worker_state{state="idle"} 1"#), "{text}");
    // Everything else still asks for credentials.
    assert_eq!(get(&http, &addr, "/api/queue").await.status().as_u16(), 401);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_running_prompt_to_its_end_and_keeps_what_arrives_meanwhile() {
    let data_dir = temp_dir("operations-drain");
    let http = reqwest::Client::new();
    let (mut server, addr) = start(&data_dir);
    let slow = queue(&http, &addr, slow()).await;
    running(&http, &addr).await;

    server.terminate();
    // Not ready, still alive, still serving and accepting while the running prompt finishes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refusal = loop {
        let ready = get(&http, &addr, "/readyz").await;
        if ready.status().as_u16() == 503 {
            break ready.json::<Value>().await.expect("JSON");
        }
        assert!(Instant::now() < deadline, "/readyz never said the server drains");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(refusal["code"], "draining");
    assert_eq!(get(&http, &addr, "/healthz").await.status().as_u16(), 200);
    let during = metrics(&http, &addr).await;
    assert!(has_line(&during, r#"kiln_worker_state{state="draining"} 1"#), "{during}");
    let later = queue(&http, &addr, tiny()).await;
    let queued: Value = get(&http, &addr, "/api/queue").await.json().await.expect("JSON");
    assert_eq!(queued["queue_running"][0][1], slow.as_str(), "the slow prompt still runs");
    assert_eq!(queued["queue_pending"][0][1], later.as_str(), "the new prompt waits");
    let log = exits(&mut server);
    assert!(!log.iter().any(|l| l.contains("handed back")), "nothing was handed back: {log:?}");
    drop(server);

    let (_server, addr) = start(&data_dir);
    idle(&http, &addr).await;
    let history = history(&http, &addr).await;
    assert_eq!(history[&slow]["status"]["status_str"], "success", "the drain let it finish");
    assert_eq!(
        history[&later]["status"]["status_str"], "success",
        "accepted during the drain, run after"
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_hands_the_running_prompt_back_to_run_again() {
    let data_dir = temp_dir("operations-hand-back");
    let http = reqwest::Client::new();
    let timeout = [std::ffi::OsStr::new("--drain-timeout"), std::ffi::OsStr::new("0")];
    let (mut server, addr) = start_with(&data_dir, &timeout);
    let slow = queue(&http, &addr, slow()).await;
    running(&http, &addr).await;

    server.terminate();
    let log = exits(&mut server);
    assert!(
        log.iter().any(|l| l.contains("handed back to the queue")),
        "the log says the prompt went back: {log:?}"
    );
    drop(server);

    let (_server, addr) = start(&data_dir);
    idle(&http, &addr).await;
    let entry = &history(&http, &addr).await[&slow];
    assert_eq!(
        entry["status"]["status_str"], "success",
        "it ran again, not recorded as interrupted"
    );
    let text = metrics(&http, &addr).await;
    assert!(has_line(&text, r#"kiln_prompts_finished_total{outcome="success"} 1"#), "{text}");
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line_with_the_prompt_id() {
    let data_dir = temp_dir("operations-json-logs");
    let http = reqwest::Client::new();
    let json_logs = [std::ffi::OsStr::new("--log-format"), std::ffi::OsStr::new("json")];
    let (server, addr) = start_with(&data_dir, &json_logs);
    let id = queue(&http, &addr, tiny()).await;
    idle(&http, &addr).await;
    // The log arrives through a pipe: wait for the run's line.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().iter().any(|l| l.contains("prompt executed")) {
        assert!(Instant::now() < deadline, "the run is logged: {:?}", server.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines: Vec<Value> = server
        .log()
        .iter()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("`{line}` is not JSON: {e}"))
        })
        .collect();
    let executed = lines
        .iter()
        .find(|l| l["fields"]["message"] == "prompt executed")
        .unwrap_or_else(|| panic!("the run is logged: {lines:?}"));
    assert_eq!(executed["level"], "INFO");
    assert_eq!(executed["span"]["name"], "prompt");
    assert_eq!(executed["span"]["id"], id.as_str(), "the line names its prompt");
    assert_eq!(executed["span"]["workspace"], "default");
    let _ = std::fs::remove_dir_all(&data_dir);
}
