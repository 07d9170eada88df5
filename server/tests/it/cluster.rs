//! A cluster on Postgres (`--role api` and `--role worker`), through the real binary: API nodes and workers as
//! separate processes on one throwaway database (`kiln_tests::postgres`) and either one data directory or, in the
//! first test, a data directory each and one S3 store (`kiln_tests::s3`, `--store`). Every accepted
//! prompt runs once, on some worker; its events reach its owner on whichever API node the owner's socket is
//! connected to, and no one else; its history entry and outputs can be read through every API node. A worker
//! killed mid-prompt loses nothing: its prompt is recorded as interrupted once its lease (`--worker-lease`) runs
//! out or, with `--max-attempts 2`, runs again on another worker; an API node killed under load loses no prompt
//! it accepted; a draining worker hands its prompt back; `/free` reaches the workers; the cloud runtime takes a
//! key on any API node.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kiln_tests::postgres::Postgres;
use kiln_tests::s3::S3Server;
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::binary::{Server, start_cloud_with, start_with, start_with_env, temp_dir};
use crate::operations::get;
use crate::postgres::account_command;

/// The frames only a prompt's owner may receive.
const OWNER_ONLY: [&str; 6] = [
    "execution_start",
    "execution_cached",
    "executing",
    "executed",
    "execution_success",
    "execution_error",
];

/// How long a dead worker's prompt may take to be settled (taken back and recorded, or run again).
const RECOVERY: Duration = Duration::from_secs(30);

/// One process of the cluster: the binary (killed when dropped) and the address of its checking proxy.
struct Node {
    server: Server,
    addr: String,
    name: String,
}

/// Starts `kiln --role ROLE --database-url URL ARGS` on the cluster's data directory; `name` names it in
/// assertion messages.
fn node(name: &str, role: &str, data_dir: &Path, url: &str, args: &[&str]) -> Node {
    let mut all = vec!["--role", role, "--database-url", url];
    all.extend_from_slice(args);
    let all: Vec<&OsStr> = all.iter().map(OsStr::new).collect();
    let (server, addr) = start_with(data_dir, &all);
    Node { server, addr, name: name.to_owned() }
}

/// [`node`] with a data directory of its own (`DATA_DIR/<name>`) and its files in `s3` (`--store`, the
/// credentials in the environment).
fn stored_node(name: &str, role: &str, data_dir: &Path, url: &str, s3: &S3Server) -> Node {
    let store = s3.store_url();
    let all = ["--role", role, "--database-url", url, "--store", &store].map(OsStr::new);
    let (server, addr) = start_with_env(&data_dir.join(name), &all, &s3.credentials());
    Node { server, addr, name: name.to_owned() }
}

/// One API node and two workers started with `worker_flags`, on a new Postgres cluster (kept running while
/// the first value lives) and a new data directory.
fn api_and_two_workers(name: &str, worker_flags: &[&str]) -> (Postgres, PathBuf, Node, [Node; 2]) {
    let postgres = Postgres::start(name);
    let url = postgres.database("kiln");
    let data_dir = temp_dir(name);
    let api = node("api", "api", &data_dir, &url, &[]);
    let workers = [
        node("worker-1", "worker", &data_dir, &url, worker_flags),
        node("worker-2", "worker", &data_dir, &url, worker_flags),
    ];
    (postgres, data_dir, api, workers)
}

/// Kills `node` with SIGKILL (`kill -9`) and waits until it is gone.
fn kill9(node: &mut Node) {
    let status = Command::new("kill")
        .args(["-KILL", &node.server.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "SIGKILL was sent to {}", node.name);
    assert!(node.server.wait_exit(Duration::from_secs(10)).is_some(), "{} did not die", node.name);
}

/// A prompt that saves one 8×8 image; `color` keeps prompts apart (no cache hits), `prefix` names the file.
fn tiny(prefix: &str, color: usize) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    })
}

/// The durability test's slow prompt (a 4096 → 8192 lanczos upscale): tens of seconds in a test build, so it
/// runs until its worker is killed.
fn endless() -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4096, "height": 4096, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "lanczos", "width": 8192, "height": 8192, "crop": "disabled"}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    })
}

/// A prompt that runs for seconds and then saves one image under `prefix`: a 1024 → 3072 lanczos upscale (about
/// 4 s in a test build, on one core), shrunk to 8×8.
fn seconds(prefix: &str) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "lanczos", "width": 3072, "height": 3072, "crop": "disabled"}},
        "3": {"class_type": "ImageScale", "inputs": {"image": ["2", 0], "upscale_method": "nearest-exact", "width": 8, "height": 8, "crop": "disabled"}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": prefix}},
    })
}

/// Submits `prompt` (owned by `client_id`, if any) to `node`; its id. Fails the test unless the node answers 200.
async fn submit(
    http: &reqwest::Client,
    node: &Node,
    prompt: Value,
    client_id: Option<&str>,
) -> String {
    let mut body = json!({"prompt": prompt});
    if let Some(client_id) = client_id {
        body["client_id"] = json!(client_id);
    }
    let response = http
        .post(format!("http://{}/api/prompt", node.addr))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    assert_eq!(status, 200, "{} refused a prompt of {client_id:?}: {text}", node.name);
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    answer["prompt_id"].as_str().expect("an id").to_owned()
}

/// `GET path` on `node`, as JSON.
async fn json(http: &reqwest::Client, node: &Node, path: &str) -> Value {
    let response = get(http, &node.addr, path).await;
    assert_eq!(response.status().as_u16(), 200, "{}: GET {path}", node.name);
    response.json().await.expect("JSON")
}

/// Every history entry `node` has, by prompt id.
async fn history(http: &reqwest::Client, node: &Node) -> Map<String, Value> {
    match json(http, node, "/api/history").await {
        Value::Object(entries) => entries,
        other => panic!("{}: /api/history is not an object: {other}", node.name),
    }
}

/// An entry's `status_str`.
fn outcome(entry: &Value) -> &str {
    entry["status"]["status_str"].as_str().unwrap_or("(none)")
}

/// The names of an entry's status messages, e.g. `execution_start`.
fn messages(entry: &Value) -> Vec<&str> {
    entry["status"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m[0].as_str())
        .collect()
}

/// Waits until `node`'s history has an entry for each of `ids` (whatever its status); the whole history.
async fn settled(
    http: &reqwest::Client,
    node: &Node,
    ids: &[String],
    within: Duration,
) -> Map<String, Value> {
    let deadline = Instant::now() + within;
    loop {
        let entries = history(http, node).await;
        let missing: Vec<&String> = ids.iter().filter(|id| !entries.contains_key(*id)).collect();
        if missing.is_empty() {
            return entries;
        }
        if Instant::now() > deadline {
            let queue = json(http, node, "/api/queue").await;
            panic!(
                "{}: {} of {} prompts have no history entry after {within:?}, e.g. {:?}; /api/queue: {queue}",
                node.name,
                missing.len(),
                ids.len(),
                &missing[..missing.len().min(10)]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `node`'s `/api/queue` lists nothing pending or running (its view follows the database within
/// about a second).
async fn queue_empties(http: &reqwest::Client, node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = json(http, node, "/api/queue").await;
        let empty = |key: &str| queue[key].as_array().is_some_and(Vec::is_empty);
        if empty("queue_running") && empty("queue_pending") {
            return;
        }
        assert!(Instant::now() < deadline, "{}: prompts stay in /api/queue: {queue}", node.name);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `node`'s `/api/queue` lists `id` as running.
async fn until_running(http: &reqwest::Client, node: &Node, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let queue = json(http, node, "/api/queue").await;
        let running =
            queue["queue_running"].as_array().is_some_and(|r| r.iter().any(|e| e[1] == id));
        if running {
            return;
        }
        assert!(Instant::now() < deadline, "{}: prompt {id} never ran: {queue}", node.name);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of `series` (a metric's name and labels as `/metrics` writes them, e.g.
/// `kiln_worker_state{state="running"}`) on `node`; `None` when it has no such line.
async fn metric(http: &reqwest::Client, node: &Node, series: &str) -> Option<f64> {
    let response = get(http, &node.addr, "/metrics").await;
    assert_eq!(response.status().as_u16(), 200, "{}: /metrics", node.name);
    let text = response.text().await.expect("text");
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// How many prompts `worker` ran to success (`kiln_prompts_finished_total{outcome="success"}`).
async fn successes(http: &reqwest::Client, worker: &Node) -> f64 {
    metric(http, worker, r#"kiln_prompts_finished_total{outcome="success"}"#).await.unwrap_or(0.0)
}

/// Waits until `api` shows prompt `id` running, then the index of the one worker whose `/metrics` says it
/// runs a prompt (`kiln_worker_state{state="running"}`): `id` must be the only prompt running in the cluster.
async fn running_worker(http: &reqwest::Client, api: &Node, workers: &[Node], id: &str) -> usize {
    until_running(http, api, id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut states = Vec::new();
        for worker in workers {
            states.push(metric(http, worker, r#"kiln_worker_state{state="running"}"#).await);
        }
        let running: Vec<usize> = (0..workers.len()).filter(|&i| states[i] == Some(1.0)).collect();
        if let [one] = running[..] {
            return one;
        }
        assert!(
            Instant::now() < deadline,
            "no single worker says it runs the prompt: kiln_worker_state{{state=\"running\"}} is {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A websocket to a node itself.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens `/ws?clientId=client_id` on `node` itself (not through its proxy) and waits for its greeting (the
/// socket is registered then); the socket and the greeting's text.
async fn connect(node: &Node, client_id: &str) -> (Socket, String) {
    let url = format!("ws://{}/ws?clientId={client_id}", node.server.direct_addr());
    let (mut socket, _) = tokio_tungstenite::connect_async(url).await.expect("websocket");
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .unwrap_or_else(|_| panic!("{} never greeted {client_id}", node.name))
            .expect("the socket is open")
            .expect("a frame");
        if let Message::Text(text) = message {
            return (socket, text.as_str().to_owned());
        }
    }
}

/// What a client's socket received: every text frame, for each `execution_success` the prompt's history entry
/// as the same API node answered right after sending it, and the prompts whose last frame (`executing` with a
/// null node) arrived.
#[derive(Default)]
struct Heard {
    frames: Vec<String>,
    history_at_success: HashMap<String, Value>,
    done: HashSet<String>,
    /// Why the socket stopped, if it did.
    closed: Option<String>,
}

/// Reads `socket` until it closes, into `heard`; on each `execution_success`, asks `addr` (the node the socket is
/// connected to) for the prompt's history entry.
async fn listen(mut socket: Socket, http: reqwest::Client, addr: String, heard: Arc<Mutex<Heard>>) {
    let why = loop {
        let text = match socket.next().await {
            Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
            Some(Ok(_)) => continue,
            Some(Err(error)) => break format!("the socket failed: {error}"),
            None => break "the node closed the socket".to_owned(),
        };
        let frame: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let prompt = frame["data"]["prompt_id"].as_str().unwrap_or_default();
        if frame["type"] == "execution_success" {
            let response = get(&http, &addr, &format!("/api/history/{prompt}")).await;
            let entries: Value = response.json().await.unwrap_or(Value::Null);
            let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
            heard.history_at_success.entry(prompt.to_owned()).or_insert(entries[prompt].clone());
        }
        let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
        if frame["type"] == "executing" && frame["data"]["node"].is_null() {
            heard.done.insert(prompt.to_owned());
        }
        heard.frames.push(text);
    };
    heard.lock().unwrap_or_else(|p| p.into_inner()).closed = Some(why);
}

/// A websocket client of the first test: its id, the API node it uses, what it heard and what it submitted.
struct Client {
    id: String,
    node: usize,
    heard: Arc<Mutex<Heard>>,
    listener: tokio::task::JoinHandle<()>,
    prompts: Vec<String>,
}

/// Joins a spawned task, failing the test with the task's own panic.
async fn join<T>(task: tokio::task::JoinHandle<T>) -> T {
    match task.await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_two_api_nodes_and_two_workers_runs_every_clients_prompts() {
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 125;
    let postgres = Postgres::start("cluster");
    let url = postgres.database("kiln");
    let s3 = S3Server::start("cluster");
    // Each process has a data directory of its own: files go between them only through the store.
    let data_dir = temp_dir("cluster");
    let http = reqwest::Client::new();
    let apis = Arc::new([
        stored_node("api-a", "api", &data_dir, &url, &s3),
        stored_node("api-b", "api", &data_dir, &url, &s3),
    ]);
    let workers = [
        stored_node("worker-1", "worker", &data_dir, &url, &s3),
        stored_node("worker-2", "worker", &data_dir, &url, &s3),
    ];

    // A worker's port answers the probes and /metrics, and nothing else.
    for worker in &workers {
        assert_eq!(
            get(&http, &worker.addr, "/readyz").await.status().as_u16(),
            200,
            "{}",
            worker.name
        );
        let direct = worker.server.direct_addr();
        let queue = http.get(format!("http://{direct}/api/queue")).send().await.expect("answers");
        assert_eq!(queue.status().as_u16(), 404, "{} serves /api/queue", worker.name);
        let prompt = http
            .post(format!("http://{direct}/api/prompt"))
            .json(&json!({"prompt": tiny("never", 0)}))
            .send()
            .await
            .expect("answers");
        assert_eq!(prompt.status().as_u16(), 404, "{} takes prompts", worker.name);
    }

    // Two clients on each API node, each listening on its socket before it submits.
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let id = format!("cluster-client-{i}");
        let api = &apis[i % 2];
        let (socket, greeting) = connect(api, &id).await;
        let heard = Arc::new(Mutex::new(Heard { frames: vec![greeting], ..Heard::default() }));
        let listener = tokio::spawn(listen(socket, http.clone(), api.addr.clone(), heard.clone()));
        clients.push(Client { id, node: i % 2, heard, listener, prompts: Vec::new() });
    }
    // All four submit at once, each to its own node.
    let submitters: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let (http, apis, id, node) =
                (http.clone(), apis.clone(), client.id.clone(), client.node);
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..PER_CLIENT {
                    let prompt = tiny(&format!("client{i}"), i * PER_CLIENT + n);
                    ids.push(submit(&http, &apis[node], prompt, Some(&id)).await);
                }
                ids
            })
        })
        .collect();
    for (client, submitter) in clients.iter_mut().zip(submitters) {
        client.prompts = join(submitter).await;
    }
    let owner: HashMap<&str, &str> = clients
        .iter()
        .flat_map(|c| c.prompts.iter().map(|p| (p.as_str(), c.id.as_str())))
        .collect();
    assert_eq!(owner.len(), CLIENTS * PER_CLIENT, "every prompt has an id of its own");

    // Each client hears of the success and then the end (`executing {node: null}`, the last frame of a run) of
    // each of its prompts on its own node.
    let deadline = Instant::now() + Duration::from_secs(600);
    for client in &clients {
        loop {
            let missing: Vec<&String> = {
                let heard = client.heard.lock().unwrap_or_else(|p| p.into_inner());
                let heard_all = |p: &&String| {
                    heard.history_at_success.contains_key(*p) && heard.done.contains(*p)
                };
                client.prompts.iter().filter(|p| !heard_all(p)).collect()
            };
            if missing.is_empty() {
                break;
            }
            let closed = client.heard.lock().unwrap_or_else(|p| p.into_inner()).closed.clone();
            assert!(
                Instant::now() < deadline && closed.is_none(),
                "{} on {} did not hear execution_success and the end of {} of its prompts, e.g. {:?} \
                 (socket: {})",
                client.id,
                apis[client.node].name,
                missing.len(),
                &missing[..missing.len().min(10)],
                closed.as_deref().unwrap_or("open")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // What each socket heard: its own prompts' events once each, no other client's, and each entry was readable
    // on its node by the time the node said the prompt succeeded.
    let mut leaks = Vec::new();
    for client in &clients {
        client.listener.abort();
        let api = &apis[client.node];
        let heard = client.heard.lock().unwrap_or_else(|p| p.into_inner());
        let mut successes: HashMap<String, usize> = HashMap::new();
        for text in &heard.frames {
            api.server.contract().check_ws_frame(text);
            let frame: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            let kind = frame["type"].as_str().unwrap_or_default();
            if !OWNER_ONLY.contains(&kind) {
                continue;
            }
            let prompt = frame["data"]["prompt_id"].as_str().unwrap_or_default();
            if owner.get(prompt) != Some(&client.id.as_str()) {
                leaks.push(format!(
                    "{} on {} received `{kind}` of prompt {prompt} (owner: {:?})",
                    client.id,
                    api.name,
                    owner.get(prompt)
                ));
            }
            if kind == "execution_success" {
                *successes.entry(prompt.to_owned()).or_default() += 1;
            }
        }
        for prompt in &client.prompts {
            let count = successes.get(prompt).copied().unwrap_or(0);
            assert_eq!(count, 1, "{} heard execution_success of {prompt} {count} times", client.id);
            let entry = &heard.history_at_success[prompt];
            assert_eq!(
                outcome(entry),
                "success",
                "{}: {prompt}'s history entry when {} sent its execution_success: {entry}",
                client.id,
                api.name
            );
        }
    }
    assert!(
        leaks.is_empty(),
        "{} frames reached a client that does not own them: {:#?}",
        leaks.len(),
        &leaks[..leaks.len().min(20)]
    );

    // Every entry, read through either API node: a success that saved its client's file, each under a name of
    // its own.
    let mut files: HashMap<String, String> = HashMap::new();
    for api in apis.iter() {
        let entries = history(&http, api).await;
        for (i, client) in clients.iter().enumerate() {
            for prompt in &client.prompts {
                let entry = entries.get(prompt).unwrap_or_else(|| {
                    panic!("{}: no history entry for {prompt} of {}", api.name, client.id)
                });
                assert_eq!(outcome(entry), "success", "{} on {}: {entry}", prompt, api.name);
                let image = &entry["outputs"]["2"]["images"][0];
                assert_eq!(image["type"], "output", "{prompt} on {}: {entry}", api.name);
                let name = image["filename"].as_str().expect("a file name").to_owned();
                assert!(name.starts_with(&format!("client{i}_")), "{prompt} saved {name}");
                if let Some(other) = files.insert(name.clone(), prompt.clone())
                    && other != *prompt
                {
                    panic!("{other} and {prompt} both saved {name}");
                }
            }
        }
    }
    assert_eq!(files.len(), CLIENTS * PER_CLIENT, "one file a prompt");
    let stored = |name: &str| s3.object_file(&format!("default/output/{name}"));
    for name in files.keys() {
        assert!(stored(name).is_file(), "{name} is not in the store");
    }

    // A few outputs download through either API node, neither of which ran them.
    for client in &clients {
        for api in apis.iter() {
            for prompt in client.prompts.iter().step_by(40) {
                let name =
                    files.iter().find(|(_, p)| *p == prompt).map(|(n, _)| n).expect("a file");
                let path = format!("/api/view?filename={name}&type=output&subfolder=");
                let response = get(&http, &api.addr, &path).await;
                assert_eq!(response.status().as_u16(), 200, "{}: GET {path}", api.name);
                let bytes = response.bytes().await.expect("bytes");
                let in_store = std::fs::read(stored(name)).expect("the object");
                assert!(bytes[..] == in_store[..], "{}: {name} is not the stored file", api.name);
                assert!(bytes.starts_with(b"\x89PNG"), "{}: {name} is not a PNG", api.name);
            }
        }
    }

    // An image uploaded through one API node is listed by the other and runs there: the prompt that loads it
    // is validated by api-b and run by a worker, neither of which saw the upload.
    let (first, _) = files.iter().next().expect("an output");
    let image = std::fs::read(stored(first)).expect("the object");
    let form = reqwest::multipart::Form::new()
        .part("image", reqwest::multipart::Part::bytes(image.clone()).file_name("cluster-cat.png"));
    let uploaded = http
        .post(format!("http://{}/api/upload/image", apis[0].addr))
        .multipart(form)
        .send()
        .await
        .expect("uploaded");
    assert_eq!(uploaded.status().as_u16(), 200, "api-a: upload");
    let info = json(&http, &apis[1], "/api/object_info/LoadImage").await;
    let listed = &info["LoadImage"]["input"]["required"]["image"][0];
    assert!(
        listed.as_array().is_some_and(|names| names.iter().any(|n| n == "cluster-cat.png")),
        "api-b lists the upload: {listed}"
    );
    let loads = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "cluster-cat.png"}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "loaded"}},
    });
    let id = submit(&http, &apis[1], loads, None).await;
    let entries =
        settled(&http, &apis[0], std::slice::from_ref(&id), Duration::from_secs(60)).await;
    assert_eq!(outcome(&entries[&id]), "success", "{}", entries[&id]);
    let saved = entries[&id]["outputs"]["2"]["images"][0]["filename"].as_str().expect("a file");
    let response =
        get(&http, &apis[0].addr, &format!("/api/view?filename={saved}&type=output")).await;
    assert_eq!(response.status().as_u16(), 200, "api-a: the loaded image's output");

    // Both workers ran prompts, and each prompt ran once; nothing is left in the queue.
    let mut ran = Vec::new();
    for worker in &workers {
        ran.push(successes(&http, worker).await);
    }
    assert!(ran.iter().all(|&n| n > 0.0), "each worker ran prompts: {ran:?}");
    let total: f64 = ran.iter().sum();
    // The clients' prompts and the one that loaded the upload.
    let expected = (CLIENTS * PER_CLIENT + 1) as f64;
    assert_eq!(total, expected, "prompts run to success, by worker: {ran:?}");
    for api in apis.iter() {
        queue_empties(&http, api).await;
    }
    drop(workers);
    drop(apis);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_mid_prompt_loses_nothing_and_records_the_running_prompt() {
    let (_postgres, data_dir, api, mut workers) =
        api_and_two_workers("cluster-kill-worker", &["--worker-lease", "2"]);
    let http = reqwest::Client::new();

    let slow = submit(&http, &api, endless(), None).await;
    let busy = running_worker(&http, &api, &workers, &slow).await;
    let mut tiny_ids = Vec::new();
    for n in 0..20 {
        tiny_ids.push(submit(&http, &api, tiny("before", n), None).await);
    }
    kill9(&mut workers[busy]);
    for n in 0..5 {
        tiny_ids.push(submit(&http, &api, tiny("after", n), None).await);
    }

    let mut all = tiny_ids.clone();
    all.push(slow.clone());
    let entries = settled(&http, &api, &all, RECOVERY).await;
    let entry = &entries[&slow];
    assert_eq!(outcome(entry), "error", "the killed worker's prompt {slow}: {entry}");
    assert!(
        messages(entry).contains(&"execution_interrupted"),
        "the killed worker's prompt {slow} is recorded as interrupted: {entry}"
    );
    let job = json(&http, &api, &format!("/api/jobs/{slow}")).await;
    assert_eq!(job["status"], "cancelled", "{slow}: {job}");
    for id in &tiny_ids {
        assert_eq!(outcome(&entries[id]), "success", "{id}: {}", entries[id]);
    }
    queue_empties(&http, &api).await;
    let survivor = &workers[1 - busy];
    let ran = successes(&http, survivor).await;
    assert_eq!(ran, tiny_ids.len() as f64, "{} ran every tiny prompt", survivor.name);
    drop(workers);
    drop(api);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_attempts_2_a_killed_workers_prompt_runs_again_elsewhere() {
    let (_postgres, data_dir, api, mut workers) =
        api_and_two_workers("cluster-attempts", &["--worker-lease", "2", "--max-attempts", "2"]);
    let http = reqwest::Client::new();

    let id = submit(&http, &api, seconds("again"), None).await;
    let busy = running_worker(&http, &api, &workers, &id).await;
    kill9(&mut workers[busy]);
    let early = json(&http, &api, &format!("/api/history/{id}")).await;
    assert_eq!(early, json!({}), "{id} ended before its worker was killed: make the prompt slower");

    let entries = settled(&http, &api, std::slice::from_ref(&id), RECOVERY).await;
    let entry = &entries[&id];
    assert_eq!(outcome(entry), "success", "{id} ran again after its worker died: {entry}");
    assert_eq!(entries.len(), 1, "one history entry: {entries:?}");
    queue_empties(&http, &api).await;
    let survivor = &workers[1 - busy];
    assert_eq!(successes(&http, survivor).await, 1.0, "{} ran {id}", survivor.name);
    // One run saved its file: the killed one never got that far.
    let saved: Vec<String> = std::fs::read_dir(data_dir.join("output"))
        .expect("the output folder")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("again"))
        .collect();
    let named = entry["outputs"]["4"]["images"][0]["filename"].as_str().unwrap_or_default();
    assert_eq!(saved, [named], "the output folder holds the entry's file alone: {entry}");
    drop(workers);
    drop(api);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_api_node_under_load_loses_no_accepted_prompt() {
    /// Concurrent submitters.
    const FLOODERS: usize = 8;
    /// Prompts node A has accepted when it is killed.
    const BEFORE_KILL: usize = 150;
    /// A bound on the flood, should node A never die.
    const LIMIT: usize = 20_000;
    let postgres = Postgres::start("cluster-kill-api");
    let url = postgres.database("kiln");
    let data_dir = temp_dir("cluster-kill-api");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let mut api_a = node("api-a", "api", &data_dir, &url, &[]);
    let api_b = node("api-b", "api", &data_dir, &url, &[]);
    let worker = node("worker", "worker", &data_dir, &url, &[]);

    // The flood goes to node A itself, not through its proxy: an answer is what the node sent.
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let refused = Arc::new(Mutex::new(Vec::<String>::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|_| {
            let (http, addr) = (http.clone(), api_a.server.direct_addr().to_owned());
            let (accepted, refused, next) = (accepted.clone(), refused.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= LIMIT {
                        return;
                    }
                    let body = json!({"prompt": tiny("flood", n)});
                    let sent = http.post(format!("http://{addr}/api/prompt")).json(&body).send();
                    // Node A is gone: no answer, or half of one.
                    let Ok(response) = sent.await else { return };
                    let status = response.status().as_u16();
                    let Ok(text) = response.text().await else { return };
                    let id = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|answer| Some(answer["prompt_id"].as_str()?.to_owned()));
                    match id {
                        Some(id) if status == 200 => {
                            accepted.lock().unwrap_or_else(|p| p.into_inner()).push(id);
                        }
                        _ => refused
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{status}: {text}")),
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while accepted.lock().unwrap_or_else(|p| p.into_inner()).len() < BEFORE_KILL {
        assert!(
            Instant::now() < deadline,
            "api-a accepted too few prompts to be killed under load"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kill9(&mut api_a);
    for flooder in flooders {
        join(flooder).await;
    }
    let refused = refused.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(refused.is_empty(), "api-a answered prompts with other than 200: {refused:?}");
    let accepted = accepted.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(next.load(Ordering::Relaxed) < LIMIT, "the flood ended before api-a was killed");
    eprintln!("cluster: api-a accepted {} prompts before it was killed", accepted.len());

    // Every prompt node A accepted runs, and node B reads its entry.
    let entries = settled(&http, &api_b, &accepted, Duration::from_secs(300)).await;
    let failed: Vec<String> = accepted
        .iter()
        .filter(|id| outcome(&entries[*id]) != "success")
        .map(|id| format!("{id}: {}", entries[id]))
        .collect();
    assert!(failed.is_empty(), "prompts accepted by api-a did not succeed: {failed:#?}");
    queue_empties(&http, &api_b).await;
    drop(worker);
    drop(api_b);
    drop(api_a);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// The ids in `node`'s `/api/queue`: (running, pending), each in the order shown.
async fn queue_ids(http: &reqwest::Client, node: &Node) -> (Vec<String>, Vec<String>) {
    let queue = json(http, node, "/api/queue").await;
    let ids = |key: &str| -> Vec<String> {
        queue[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item[1].as_str().map(str::to_owned))
            .collect()
    };
    (ids("queue_running"), ids("queue_pending"))
}

/// Polls `node`'s queue until `expected` (running, pending) shows, for up to 10 s.
async fn queue_shows(http: &reqwest::Client, node: &Node, expected: (&[&str], &[&str])) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (running, pending) = queue_ids(http, node).await;
        if running == expected.0 && pending == expected.1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} shows running {running:?} pending {pending:?}, not {expected:?}",
            node.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_node_shows_the_shared_queue_in_comfyuis_order_and_removals_and_free_reach_them_all()
 {
    let postgres = Postgres::start("cluster-queue");
    let url = postgres.database("kiln");
    let data_dir = temp_dir("cluster-queue");
    let a = node("api-a", "api", &data_dir, &url, &[]);
    let b = node("api-b", "api", &data_dir, &url, &[]);
    let http = reqwest::Client::new();

    // No worker: everything stays pending. Numbers come from one counter, whichever node takes them; a
    // client's own number and `front` place a prompt as ComfyUI would.
    let first = submit(&http, &a, tiny("q", 1), None).await;
    let second = submit(&http, &b, tiny("q", 2), None).await;
    let post = |node: &Node, body: Value| {
        let request = http.post(format!("http://{}/api/prompt", node.addr)).json(&body).send();
        async move {
            let answer: Value = request.await.expect("sent").json().await.expect("JSON");
            answer["prompt_id"].as_str().expect("an id").to_owned()
        }
    };
    let urgent = post(&b, json!({"prompt": tiny("q", 3), "front": true})).await;
    let numbered = post(&a, json!({"prompt": tiny("q", 4), "number": 1.5})).await;
    // Numbers: first 0, second 1, urgent -2 (front), numbered 1.5.
    let order = [urgent.as_str(), first.as_str(), second.as_str(), numbered.as_str()];
    queue_shows(&http, &a, (&[], &order)).await;
    queue_shows(&http, &b, (&[], &order)).await;

    // Removed through one node, gone from both.
    let response = http
        .post(format!("http://{}/api/queue", b.addr))
        .json(&json!({"delete": [first.clone()]}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    let left = [urgent.as_str(), second.as_str(), numbered.as_str()];
    queue_shows(&http, &a, (&[], &left)).await;
    let response = http
        .post(format!("http://{}/api/queue", a.addr))
        .json(&json!({"clear": true}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    queue_shows(&http, &b, (&[], &[])).await;

    // A worker started now finds the queue empty; one queued afterwards runs and both nodes see it end.
    let worker = node("worker", "worker", &data_dir, &url, &[]);
    let last = submit(&http, &b, tiny("q", 5), None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcome(&json(&http, &a, &format!("/api/history/{last}")).await[&last]) != "success" {
        assert!(Instant::now() < deadline, "{last} did not run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    queue_shows(&http, &a, (&[], &[])).await;
    assert_eq!(history(&http, &b).await.len(), 1, "only the last prompt ran");

    // `/free` on an API node reaches the worker.
    let response = http
        .post(format!("http://{}/api/free", a.addr))
        .json(&json!({"unload_models": true}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !worker.server.log().iter().any(|line| line.contains("as /free asked")) {
        assert!(
            Instant::now() < deadline,
            "the worker never heard /free: {:?}",
            worker.server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_hands_its_running_prompt_back_to_another_worker() {
    // The running prompt outlasts the drain timeout: handed back (not an attempt), run by the other worker.
    let (_postgres, data_dir, api, mut workers) =
        api_and_two_workers("cluster-drain", &["--drain-timeout", "0.3"]);
    let http = reqwest::Client::new();
    let id = submit(&http, &api, seconds("drained"), None).await;
    let busy = running_worker(&http, &api, &workers, &id).await;
    workers[busy].server.terminate();
    let status = workers[busy].server.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{} exits after its drain", workers[busy].name);
    assert!(
        workers[busy].server.log().iter().any(|line| line.contains("handed back")),
        "{} handed the prompt back: {:?}",
        workers[busy].name,
        workers[busy].server.log()
    );

    let entries = settled(&http, &api, std::slice::from_ref(&id), RECOVERY).await;
    let entry = &entries[&id];
    assert_eq!(outcome(entry), "success", "{id} ran on the other worker: {entry}");
    let survivor = &workers[1 - busy];
    assert_eq!(successes(&http, survivor).await, 1.0, "{} ran {id}", survivor.name);
    queue_empties(&http, &api).await;
    drop(workers);
    drop(api);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_cluster_takes_a_key_on_any_api_node() {
    let postgres = Postgres::start("cluster-cloud");
    let url = postgres.database("kiln");
    account_command(&["workspace", "add", "a"], &url, "");
    let add = ["user", "add", "alice", "--workspace", "a", "--role", "owner"];
    account_command(&add, &url, "correct horse battery\n");
    let key =
        account_command(&["key", "add", "alice", "--workspace", "a", "--name", "t"], &url, "");
    let key = key.trim().to_owned();
    let data_dir = temp_dir("cluster-cloud");
    let cloud = |role: &str| {
        let args = ["--role", role, "--database-url", &url];
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        start_cloud_with(&data_dir, &args)
    };
    let (_a, a) = cloud("api");
    let (_b, b) = cloud("api");
    let (_worker, _) = cloud("worker");
    let http = reqwest::Client::new();

    // Accepted on A with the key, run by the worker in the key's workspace, read on B, its file through A.
    let accepted: Value = http
        .post(format!("http://{a}/api/prompt"))
        .header("x-api-key", &key)
        .json(&json!({"prompt": tiny("cloudy", 1)}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let id = accepted["prompt_id"].as_str().expect("accepted").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let entry = loop {
        let history: Value = http
            .get(format!("http://{b}/api/history/{id}"))
            .header("x-api-key", &key)
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("JSON");
        if outcome(&history[&id]) == "success" {
            break history[&id].clone();
        }
        assert!(Instant::now() < deadline, "{id} did not run: {history}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let file = entry["outputs"]["2"]["images"][0]["filename"].as_str().expect("a file");
    let view = http
        .get(format!("http://{a}/api/view?filename={file}&type=output"))
        .header("x-api-key", &key)
        .send()
        .await
        .expect("sent");
    assert_eq!(view.status().as_u16(), 200, "{file} through node A");
    assert!(view.bytes().await.expect("bytes").starts_with(b"\x89PNG"), "a PNG");
    let _ = std::fs::remove_dir_all(&data_dir);
}
