//! Kiln on Postgres (`--database-url`), through the real binary, each test on a throwaway cluster of its own
//! (`kiln_tests::postgres`): the queue, the history and the prompt numbers live in the database, not in the
//! data directory; a killed server loses nothing accepted; `/readyz` follows the database's availability and
//! the server recovers when it comes back; a bad URL is refused at startup, and the password is never shown.

use std::ffi::OsStr;
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_tests::postgres::Postgres;
use serde_json::{Value, json};

use crate::binary::{start_with, temp_dir};
use crate::durability::killed_server_keeps_its_queue;
use crate::operations::{get, post};

async fn json(http: &reqwest::Client, addr: &str, path: &str) -> Value {
    get(http, addr, path).await.json().await.expect("JSON")
}

/// A prompt that saves one tiny image.
fn tiny(prefix: &str) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 7}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    })
}

/// Queues `prompt`; its id and number.
async fn queue(http: &reqwest::Client, addr: &str, prompt: Value) -> (String, i64) {
    let response = post(http, addr, prompt).await;
    assert_eq!(response.status().as_u16(), 200, "the prompt is accepted");
    let body: Value = response.json().await.expect("JSON");
    (
        body["prompt_id"].as_str().expect("an id").to_owned(),
        body["number"].as_i64().expect("a number"),
    )
}

/// Waits until the history says the prompt succeeded.
async fn succeeded(http: &reqwest::Client, addr: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let history = json(http, addr, &format!("/api/history/{id}")).await;
        if history[id]["status"]["status_str"] == "success" {
            return;
        }
        assert!(Instant::now() < deadline, "prompt {id} did not succeed: {history}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn database_url(url: &str) -> [&OsStr; 2] {
    [OsStr::new("--database-url"), OsStr::new(url)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_killed_server_keeps_its_queue_and_records_the_running_prompt_as_interrupted()
{
    let postgres = Postgres::start("durability");
    let url = postgres.database("kiln");
    let data_dir = temp_dir("postgres-durability");
    killed_server_keeps_its_queue(&data_dir, &database_url(&url)).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_the_history_and_the_prompt_numbers_live_in_the_database() {
    let postgres = Postgres::start("state");
    // Trust authentication takes any password: this one is only there to be hidden.
    let url = postgres.database("kiln").replace("postgres@", "postgres:hunter2-secret@");
    let http = reqwest::Client::new();
    let dirs =
        [temp_dir("postgres-state-a"), temp_dir("postgres-state-b"), temp_dir("postgres-state-c")];

    let (server, addr) = start_with(&dirs[0], &database_url(&url));
    let stats = json(&http, &addr, "/api/system_stats").await;
    let argv = stats["system"]["argv"].to_string();
    assert!(!argv.contains("hunter2"), "the password is shown: {argv}");
    assert!(argv.contains("postgres://postgres:***@127.0.0.1:"), "{argv}");
    let (first, number) = queue(&http, &addr, tiny("first")).await;
    succeeded(&http, &addr, &first).await;
    drop(server);

    // Another data directory, the same database: the history and the numbers carry on.
    let (server, addr) = start_with(&dirs[1], &database_url(&url));
    let history = json(&http, &addr, "/api/history").await;
    assert_eq!(history[&first]["status"]["status_str"], "success", "{history}");
    let (second, next) = queue(&http, &addr, tiny("second")).await;
    assert_eq!(next, number + 1, "numbers keep growing across servers");
    succeeded(&http, &addr, &second).await;
    let deleted = http
        .post(format!("http://{addr}/api/history"))
        .json(&json!({"delete": [first]}))
        .send()
        .await
        .expect("sent");
    assert_eq!(deleted.status().as_u16(), 200);
    drop(server);

    let (_server, addr) = start_with(&dirs[2], &database_url(&url));
    let history = json(&http, &addr, "/api/history").await;
    let ids: Vec<&String> = history.as_object().expect("an object").keys().collect();
    assert_eq!(ids, [&second], "the deletion is in the database");
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_database_and_the_server_recovers_when_postgres_comes_back() {
    let postgres = Postgres::start("readyz");
    let url = postgres.database("kiln");
    let data_dir = temp_dir("postgres-readyz");
    let http = reqwest::Client::new();
    let (_server, addr) = start_with(&data_dir, &database_url(&url));
    assert_eq!(get(&http, &addr, "/readyz").await.status().as_u16(), 200);
    let (before, _) = queue(&http, &addr, tiny("before")).await;
    succeeded(&http, &addr, &before).await;

    postgres.stop();
    let ready = get(&http, &addr, "/readyz").await;
    assert_eq!(ready.status().as_u16(), 503);
    let refusal: Value = ready.json().await.expect("JSON");
    assert_eq!(refusal["code"], "database_unavailable", "{refusal}");
    assert_eq!(get(&http, &addr, "/healthz").await.status().as_u16(), 200, "the process is alive");
    // A prompt that cannot be stored is refused, not half accepted.
    let refused = post(&http, &addr, tiny("refused")).await;
    assert_eq!(refused.status().as_u16(), 500);
    let body: Value = refused.json().await.expect("JSON");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("queue store")), "{body}");
    assert_eq!(json(&http, &addr, "/api/queue").await["queue_pending"], json!([]));

    postgres.start_again();
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&http, &addr, "/readyz").await.status().as_u16() != 200 {
        assert!(Instant::now() < deadline, "/readyz did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first write after the restart goes through: the writer connects again by itself.
    let (after, _) = queue(&http, &addr, tiny("after")).await;
    succeeded(&http, &addr, &after).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn a_database_url_kiln_cannot_use_is_refused_at_startup_with_a_clear_message() {
    let refusal = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["--port", "0", "--disable-front-end", "--data-dir"])
            .arg(temp_dir("postgres-refusals"))
            .args(args)
            .output()
            .expect("kiln runs");
        assert!(!output.status.success(), "kiln started with {args:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = refusal(&["--database-url", "mysql://kiln@db/kiln"]);
    assert!(stderr.contains("--database-url takes a postgres:// URL, not \"mysql\""), "{stderr}");
    // Nothing listens on port 1; the message names the database without its password.
    let stderr = refusal(&["--database-url", "postgres://kiln:hunter2@127.0.0.1:1/queue"]);
    assert!(
        stderr.contains("cannot connect to the database postgres://127.0.0.1:1/queue"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// Runs `kiln ARGS --database-url URL` (an account command), `stdin` on its standard input; its stdout.
pub(crate) fn account_command(args: &[&str], url: &str, stdin: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .args(["--data-dir"])
        .arg(temp_dir("postgres-accounts-cli"))
        .env("KILN_DATABASE_URL", url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kiln runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("written");
    let output = child.wait_with_output().expect("kiln exits");
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_runtime_keeps_its_accounts_and_each_workspaces_state_in_postgres() {
    let postgres = Postgres::start("cloud");
    let url = postgres.database("kiln");
    // The operator's commands, against the database (KILN_DATABASE_URL), not a data directory.
    account_command(&["workspace", "add", "a"], &url, "");
    account_command(&["workspace", "add", "b"], &url, "");
    let mut keys = Vec::new();
    for (user, workspace) in [("alice", "a"), ("bob", "b")] {
        let add = ["user", "add", user, "--workspace", workspace, "--role", "owner"];
        account_command(&add, &url, "correct horse battery\n");
        let out = account_command(
            &["key", "add", user, "--workspace", workspace, "--name", "test"],
            &url,
            "",
        );
        keys.push(out.trim().to_owned());
    }
    let users = account_command(&["user", "list"], &url, "");
    assert!(users.contains("alice") && users.contains("bob"), "{users}");

    let http = reqwest::Client::new();
    let call = |addr: &str, key: &str, path: &str| {
        http.get(format!("http://{addr}{path}")).header("x-api-key", key).send()
    };
    let dirs = [temp_dir("postgres-cloud-a"), temp_dir("postgres-cloud-b")];
    let (server, addr) = crate::binary::start_cloud_with(&dirs[0], &database_url(&url));
    let submitted: Value = http
        .post(format!("http://{addr}/api/prompt"))
        .header("x-api-key", &keys[0])
        .json(&json!({"prompt": tiny("alice")}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let id = submitted["prompt_id"].as_str().expect("alice's prompt is accepted").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let history: Value = call(&addr, &keys[0], &format!("/api/history/{id}"))
            .await
            .expect("answers")
            .json()
            .await
            .expect("JSON");
        if history[&id]["status"]["status_str"] == "success" {
            break;
        }
        assert!(Instant::now() < deadline, "alice's prompt did not succeed: {history}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(server);

    // Another data directory, the same database: the keys still work, each workspace sees its own history.
    let (_server, addr) = crate::binary::start_cloud_with(&dirs[1], &database_url(&url));
    let history = |key: usize| {
        let request = call(&addr, &keys[key], "/api/history");
        async move { request.await.expect("answers").json::<Value>().await.expect("JSON") }
    };
    assert_eq!(history(0).await[&id]["status"]["status_str"], "success");
    assert_eq!(history(1).await, json!({}), "bob sees none of alice's history");
    let refused = call(&addr, "comfyui-not-a-key", "/api/history").await.expect("answers");
    assert_eq!(refused.status().as_u16(), 401);
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_database_is_refused_while_the_first_runs() {
    let postgres = Postgres::start("one-server");
    let url = postgres.database("kiln");
    let dirs = [temp_dir("postgres-one-a"), temp_dir("postgres-one-b")];
    let (first, _) = start_with(&dirs[0], &database_url(&url));
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--port", "0", "--disable-front-end", "--data-dir"])
        .arg(&dirs[1])
        .args(database_url(&url))
        .output()
        .expect("kiln runs");
    assert!(!output.status.success(), "a second server started on the same database");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another kiln server is using the database postgres://127.0.0.1:"),
        "{stderr}"
    );
    // Once the first is gone (killed: Postgres ends its session), the next one starts.
    drop(first);
    let (_second, addr) = start_with(&dirs[1], &database_url(&url));
    let http = reqwest::Client::new();
    assert_eq!(get(&http, &addr, "/readyz").await.status().as_u16(), 200);
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}
