//! Issue 12's isolation, through the real `kiln --runtime cloud`: Bob (workspace B) can neither see, cancel,
//! interrupt, download nor learn the existence of Alice's (workspace A) prompts, files or events. Every HTTP
//! answer goes through the checking proxy; the websockets talk to kiln directly (the proxy does not pass the
//! `X-API-Key` of an upgrade on), and their frames are checked against the same contract.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kiln_server::{Accounts, Role};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest as _};

use crate::binary::{Server, start_cloud, temp_dir};

/// How long a test waits for a prompt to finish, or a frame to arrive.
const PATIENCE: Duration = Duration::from_secs(60);

/// How long a socket must stay quiet to count as drained.
const QUIET: Duration = Duration::from_millis(400);

/// A canonical UUID that names no prompt: what any unknown id gets.
const STRANGER: &str = "00000000-0000-4000-8000-000000000000";

/// The lanczos resizes of [`slow`]: each takes a few hundred milliseconds, so the prompt runs for seconds and
/// has node boundaries (where an interrupt takes effect) all along.
const SLOW_STEPS: usize = 14;

/// Makes alice (owner of workspace `a`) and bob (owner of workspace `b`) in `data_dir`; their API keys.
pub(crate) async fn accounts(data_dir: &std::path::Path) -> (String, String) {
    std::fs::create_dir_all(data_dir).expect("the data directory");
    let accounts = Accounts::open(data_dir, &kiln_server::Database::Embedded)
        .await
        .expect("the account store opens");
    let mut keys = Vec::new();
    for (user, workspace) in [("alice", "a"), ("bob", "b")] {
        let added = accounts.add_user(user, "correct horse battery").await.expect("user");
        let ws = accounts.add_workspace(workspace).await.expect("workspace");
        accounts.grant(workspace, user, Role::Owner).await.expect("grant");
        let (key, _) = accounts.create_api_key(&added.id, &ws.id, "test").await.expect("key");
        keys.push(key);
    }
    let bob = keys.pop().expect("bob's key");
    let alice = keys.pop().expect("alice's key");
    (alice, bob)
}

/// A cloud kiln with alice and bob; the server, alice and bob (through the proxy) and the data directory.
async fn cloud(name: &str) -> (Server, User, User, std::path::PathBuf) {
    let data_dir = temp_dir(name);
    let (alice, bob) = accounts(&data_dir).await;
    let (server, addr) = start_cloud(&data_dir);
    (server, User::new(&addr, Some(alice)), User::new(&addr, Some(bob)), data_dir)
}

/// Someone talking HTTP to kiln, with an API key or without credentials.
struct User {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl User {
    fn new(addr: &str, key: Option<String>) -> User {
        User { http: reqwest::Client::new(), base: format!("http://{addr}"), key }
    }

    /// The answer's status and body.
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.header("x-api-key", key);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        let answer = request.send().await.expect("kiln answers");
        let status = answer.status().as_u16();
        (status, answer.bytes().await.expect("a body").to_vec())
    }

    /// `GET path`: the status and the body as JSON (`null` if it is not JSON).
    async fn get(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.call("GET", path, None).await;
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `POST path` with a JSON body: the status and the body as JSON (`null` if it is not JSON).
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (status, body) = self.call("POST", path, Some(&body)).await;
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// Queues a prompt; its id.
    async fn submit(&self, prompt: Value, client_id: Option<&str>) -> String {
        let (status, answer) =
            self.post("/api/prompt", json!({"prompt": prompt, "client_id": client_id})).await;
        assert_eq!(status, 200, "the prompt is queued: {answer}");
        answer["prompt_id"].as_str().expect("a prompt id").to_owned()
    }

    /// The history entry of one of the user's prompts, once it has finished.
    async fn finished(&self, id: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, history) = self.get(&format!("/api/history/{id}")).await;
            assert_eq!(status, 200, "{history}");
            if let Some(entry) = history.get(id) {
                return entry.clone();
            }
            assert!(Instant::now() < deadline, "{id} did not finish in {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The ids in the user's queue: running, then pending.
    async fn queue(&self) -> (Vec<String>, Vec<String>) {
        let (status, queue) = self.get("/api/queue").await;
        assert_eq!(status, 200, "{queue}");
        let ids = |list: &Value| -> Vec<String> {
            list.as_array()
                .expect("a list")
                .iter()
                .map(|item| item[1].as_str().expect("an id").to_owned())
                .collect()
        };
        (ids(&queue["queue_running"]), ids(&queue["queue_pending"]))
    }

    /// Waits until `id` runs.
    async fn until_running(&self, id: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.queue().await.0.iter().any(|running| running == id) {
            assert!(Instant::now() < deadline, "{id} did not start in {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A prompt that runs for seconds: a 512×512 image resized [`SLOW_STEPS`] times with lanczos, then saved.
fn slow(color: u32, prefix: &str) -> Value {
    let mut prompt = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 512, "height": 512, "batch_size": 1, "color": color}},
    });
    for step in 0..SLOW_STEPS {
        let scale = if step % 2 == 0 { 1.01 } else { 0.99 };
        prompt[(step + 2).to_string()] = json!({
            "class_type": "ImageScaleBy",
            "inputs": {"image": [(step + 1).to_string(), 0], "upscale_method": "lanczos", "scale_by": scale},
        });
    }
    prompt["save"] = json!({
        "class_type": "SaveImage",
        "inputs": {"images": [(SLOW_STEPS + 1).to_string(), 0], "filename_prefix": prefix},
    });
    prompt
}

/// A prompt that runs at once: an 8×8 image, inverted and saved.
fn quick(color: u32, prefix: &str) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    })
}

/// `prompt` with a `SaveImageWebsocket` of its node `of` (a binary frame per image to the owner, or to every
/// socket of the workspace when the prompt has no client id).
fn with_websocket_image(mut prompt: Value, of: &str) -> Value {
    prompt["ws"] = json!({"class_type": "SaveImageWebsocket", "inputs": {"images": [of, 0]}});
    prompt
}

/// The history entry's status string, and the names of its status messages.
fn outcome(entry: &Value) -> (String, Vec<String>) {
    let status = entry["status"]["status_str"].as_str().unwrap_or_default().to_owned();
    let names = entry["status"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m[0].as_str().map(str::to_owned))
        .collect();
    (status, names)
}

/// The data of the history entry's status message `name`.
fn message<'a>(entry: &'a Value, name: &str) -> Option<&'a Value> {
    entry["status"]["messages"].as_array()?.iter().find(|m| m[0] == name).map(|m| &m[1])
}

/// The first image a finished prompt saved: `(filename, subfolder, type)`.
fn first_image(entry: &Value) -> (String, String, String) {
    let image = entry["outputs"]
        .as_object()
        .into_iter()
        .flat_map(|outputs| outputs.values())
        .find_map(|output| output["images"].get(0))
        .unwrap_or_else(|| panic!("an image among the outputs: {entry}"));
    let text = |key: &str| image[key].as_str().unwrap_or_default().to_owned();
    (text("filename"), text("subfolder"), text("type"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_bob_can_neither_see_nor_touch_alices_prompts_history_jobs_or_images() {
    let (server, alice, bob, data_dir) = cloud("iso-http").await;

    // Alice: a slow prompt runs, two quick ones wait behind it.
    let running = alice.submit(slow(0x101010, "alice"), None).await;
    alice.until_running(&running).await;
    let pending = [
        alice.submit(quick(0x203040, "alice"), None).await,
        alice.submit(quick(0x506070, "alice"), None).await,
    ];
    let alice_ids = [running.clone(), pending[0].clone(), pending[1].clone()];

    // Bob sees none of them.
    assert_eq!(bob.queue().await, (vec![], vec![]));
    let (_, info) = bob.get("/api/prompt").await;
    assert_eq!(info["exec_info"]["queue_remaining"], 0, "bob's queue_remaining counts only his");
    let (_, info) = alice.get("/api/prompt").await;
    assert_eq!(info["exec_info"]["queue_remaining"], 3, "alice's counts hers");
    assert_eq!(bob.get("/api/history").await, (200, json!({})));
    let (_, jobs) = bob.get("/api/jobs").await;
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");
    assert_eq!(jobs["pagination"]["total"], 0, "{jobs}");
    let unknown = bob.call("GET", &format!("/api/jobs/{STRANGER}"), None).await;
    assert_eq!(unknown.0, 404);
    for id in &alice_ids {
        assert_eq!(bob.get(&format!("/api/history/{id}")).await, (200, json!({})));
        let answer = bob.call("GET", &format!("/api/jobs/{id}"), None).await;
        assert_eq!(answer, unknown, "alice's job {id} is unknown to bob, exactly as a random id");
    }

    // Bob can cancel, delete, clear and interrupt none of them.
    for id in &alice_ids {
        let answer = bob.post(&format!("/api/jobs/{id}/cancel"), json!({})).await;
        assert_eq!(answer, (200, json!({"cancelled": false})), "cancelling alice's {id}");
    }
    let answer = bob.post("/api/jobs/cancel", json!({"job_ids": alice_ids})).await;
    assert_eq!(answer, (200, json!({"cancelled": false})));
    assert_eq!(bob.post("/api/queue", json!({"delete": pending})).await.0, 200);
    assert_eq!(bob.post("/api/queue", json!({"clear": true})).await.0, 200);
    assert_eq!(bob.post("/api/interrupt", json!({})).await.0, 200);
    assert_eq!(bob.post("/api/interrupt", json!({"prompt_id": running})).await.0, 200);
    assert_eq!(
        alice.queue().await,
        (vec![running.clone()], pending.to_vec()),
        "alice's slow prompt still runs (if it had finished, SLOW_STEPS is too small for this machine) and \
         her other two still wait"
    );

    // Alice's prompts all finish, none interrupted.
    let mut entries = Vec::new();
    for id in &alice_ids {
        let entry = alice.finished(id).await;
        let (status, names) = outcome(&entry);
        assert_eq!(status, "success", "alice's {id}: {names:?}");
        assert!(!names.iter().any(|n| n == "execution_interrupted"), "alice's {id}: {names:?}");
        let (_, job) = alice.get(&format!("/api/jobs/{id}")).await;
        assert_eq!(job["status"], "completed", "{job}");
        entries.push(entry);
    }

    // Finished, they are still invisible to bob, and his history writes leave alice's alone.
    assert_eq!(bob.get("/api/history").await, (200, json!({})));
    let (_, jobs) = bob.get("/api/jobs").await;
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");
    for id in &alice_ids {
        assert_eq!(bob.get(&format!("/api/history/{id}")).await, (200, json!({})));
        let answer = bob.call("GET", &format!("/api/jobs/{id}"), None).await;
        assert_eq!(answer, unknown, "alice's finished job {id} is unknown to bob");
    }
    assert_eq!(bob.post("/api/history", json!({"delete": alice_ids})).await.0, 200);
    assert_eq!(bob.post("/api/history", json!({"clear": true})).await.0, 200);
    let (_, history) = alice.get("/api/history").await;
    for id in &alice_ids {
        assert!(history.get(id).is_some(), "alice's {id} stays in her history: {history}");
    }

    // Alice's images: she downloads them, bob gets 404.
    for entry in &entries {
        let (filename, subfolder, kind) = first_image(entry);
        let view = format!("/api/view?filename={filename}&subfolder={subfolder}&type={kind}");
        assert_eq!(alice.call("GET", &view, None).await.0, 200, "alice views {view}");
        assert_eq!(bob.call("GET", &view, None).await.0, 404, "bob views {view}");
    }

    // Bob runs the graph alice ran last, with her file prefix: his save is his own (not her cached output)
    // and his file counter has not seen her three files.
    assert_eq!(first_image(&entries[2]).0, "alice_00003_.png", "alice's third save");
    let his = bob.submit(quick(0x506070, "alice"), None).await;
    let entry = bob.finished(&his).await;
    assert_eq!(outcome(&entry).0, "success");
    let (filename, subfolder, kind) = first_image(&entry);
    assert_eq!(filename, "alice_00001_.png", "bob's first file");
    let view = format!("/api/view?filename={filename}&subfolder={subfolder}&type={kind}");
    assert_eq!(bob.call("GET", &view, None).await.0, 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_bob_cannot_tell_from_the_cache_what_alice_ran() {
    let (server, alice, bob, data_dir) = cloud("iso-cache").await;
    let cached = |entry: &Value| message(entry, "execution_cached").map(|d| d["nodes"].clone());
    // Alice runs a graph twice: the second run is served from her cache.
    let first = alice.submit(quick(0x0a0b0c, "alice"), None).await;
    assert_eq!(cached(&alice.finished(&first).await), Some(json!([])));
    let again = alice.submit(quick(0x0a0b0c, "alice"), None).await;
    let nodes = cached(&alice.finished(&again).await);
    assert_eq!(nodes, Some(json!(["1", "2", "3"])), "alice's rerun is served from her cache");
    // Bob's run of the same graph must look like a first run: `execution_cached` naming her nodes would tell
    // him that someone in another workspace ran exactly this graph.
    let his = bob.submit(quick(0x0a0b0c, "bob"), None).await;
    let entry = bob.finished(&his).await;
    assert_eq!(outcome(&entry).0, "success");
    assert_eq!(cached(&entry), Some(json!([])), "bob's run names nodes cached by alice's runs");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A websocket to kiln itself, authenticated with an API key.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What a socket received.
#[derive(Debug)]
enum Frame {
    /// A text frame: the message, and its text.
    Text(Value, String),
    /// A binary frame.
    Binary,
}

impl Frame {
    fn kind(&self) -> &str {
        match self {
            Frame::Text(message, _) => message["type"].as_str().unwrap_or_default(),
            Frame::Binary => "binary",
        }
    }

    fn data(&self) -> &Value {
        static NONE: Value = Value::Null;
        match self {
            Frame::Text(message, _) => &message["data"],
            Frame::Binary => &NONE,
        }
    }

    /// Whether the frame's text mentions `id` anywhere.
    fn mentions(&self, id: &str) -> bool {
        matches!(self, Frame::Text(_, text) if text.contains(id))
    }

    /// `executing {node: null}` for `prompt_id`: the prompt is done.
    fn ends(&self, prompt_id: &str) -> bool {
        self.kind() == "executing"
            && self.data()["node"].is_null()
            && self.data()["prompt_id"] == prompt_id
    }
}

/// Opens `/ws?clientId=client_id` on kiln (not through the proxy) with `key` as `X-API-Key`.
async fn connect(server: &Server, key: Option<&str>, client_id: &str) -> Result<Socket, u16> {
    let url = format!("ws://{}/ws?clientId={client_id}", server.direct_addr());
    let mut request = url.into_client_request().expect("a websocket request");
    if let Some(key) = key {
        request.headers_mut().insert("x-api-key", key.parse().expect("a header value"));
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(refused)) => Err(refused.status().as_u16()),
        Err(error) => panic!("the websocket handshake failed: {error}"),
    }
}

/// The next frame within `within`, its text checked against the spec; `None` when none came in time.
async fn next(socket: &mut Socket, server: &Server, within: Duration) -> Option<Frame> {
    loop {
        let received = tokio::time::timeout(within, socket.next()).await.ok()?;
        match received.expect("the socket stays open").expect("a frame") {
            tungstenite::Message::Text(text) => {
                server.contract().check_ws_frame(text.as_str());
                let message = serde_json::from_str(text.as_str()).expect("a JSON frame");
                return Some(Frame::Text(message, text.as_str().to_owned()));
            }
            tungstenite::Message::Binary(_) => return Some(Frame::Binary),
            _ => continue,
        }
    }
}

/// Frames until one satisfies `last` (included).
async fn until(socket: &mut Socket, server: &Server, last: impl Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut frames = Vec::new();
    loop {
        let frame = next(socket, server, PATIENCE).await.expect("a frame in time");
        let done = last(&frame);
        frames.push(frame);
        if done {
            return frames;
        }
    }
}

/// Frames until the socket has been quiet for [`QUIET`].
async fn drain(socket: &mut Socket, server: &Server) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Some(frame) = next(socket, server, QUIET).await {
        frames.push(frame);
    }
    frames
}

/// The `queue_remaining` of a `status` frame.
fn remaining(frame: &Frame) -> Option<i64> {
    (frame.kind() == "status")
        .then(|| frame.data()["status"]["exec_info"]["queue_remaining"].as_i64())?
}

/// Whether the frames include `kind` for `prompt_id`.
fn has(frames: &[Frame], kind: &str, prompt_id: &str) -> bool {
    frames.iter().any(|f| f.kind() == kind && f.data()["prompt_id"] == prompt_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_alices_events_reach_only_alices_socket_even_under_the_same_client_id() {
    let (server, alice, bob, data_dir) = cloud("iso-ws").await;
    let same = "same-id";
    let mut alice_ws = connect(&server, alice.key.as_deref(), same).await.expect("alice's socket");
    let greeting = next(&mut alice_ws, &server, PATIENCE).await.expect("alice's greeting");
    assert_eq!(remaining(&greeting), Some(0));

    // Alice's prompts: one for her socket, one with no client id (its broadcasts go to all her sockets).
    let last = (SLOW_STEPS + 1).to_string();
    let hers = alice.submit(with_websocket_image(slow(0x123456, "alice"), &last), Some(same)).await;
    let broadcast = alice.submit(with_websocket_image(quick(0x654321, "alice"), "2"), None).await;

    // Once hers runs, bob registers the same client id (the latest registration of an id gets its owner's
    // events, and a reconnecting owner is told the running node).
    let mut seen = until(&mut alice_ws, &server, |f| {
        f.kind() == "executing"
            && f.data()["prompt_id"] == hers.as_str()
            && !f.data()["node"].is_null()
    })
    .await;
    let mut bob_ws = connect(&server, bob.key.as_deref(), same).await.expect("bob's socket");
    let greeting = next(&mut bob_ws, &server, PATIENCE).await.expect("bob's greeting");
    assert_eq!(greeting.kind(), "status");
    assert_eq!(remaining(&greeting), Some(0), "bob's greeting counts only his prompts");
    assert_eq!(greeting.data()["sid"], same);

    // Alice's socket gets all of her prompt's events.
    seen.extend(until(&mut alice_ws, &server, |f| f.ends(&hers)).await);
    assert_eq!(outcome(&alice.finished(&broadcast).await).0, "success");
    seen.extend(drain(&mut alice_ws, &server).await);
    for kind in ["execution_start", "executing", "executed", "execution_success", "progress_state"]
    {
        assert!(has(&seen, kind, &hers), "alice's socket got {kind} of her prompt");
    }
    assert!(
        has(&seen, "progress_state", &broadcast),
        "alice's socket got her broadcast's progress"
    );
    let binary = seen.iter().filter(|f| matches!(f, Frame::Binary)).count();
    assert_eq!(binary, 2, "alice's socket got both of her websocket images");

    // Meanwhile bob's socket heard nothing of them, and no status counted them.
    let during = drain(&mut bob_ws, &server).await;
    for frame in &during {
        assert!(!frame.mentions(&hers) && !frame.mentions(&broadcast), "bob got {frame:?}");
        assert_eq!(frame.kind(), "status", "bob got {frame:?} while only alice worked");
        assert_eq!(remaining(frame), Some(0), "bob's status counts only his prompts: {frame:?}");
    }

    // Bob's own prompt reaches his socket, and not alice's.
    let his = bob.submit(quick(0x777777, "bob"), Some(same)).await;
    let frames = until(&mut bob_ws, &server, |f| f.ends(&his)).await;
    for kind in ["execution_start", "executing", "executed", "execution_success"] {
        assert!(has(&frames, kind, &his), "bob's socket got {kind} of his prompt: {frames:?}");
    }
    for frame in &frames {
        assert!(!frame.mentions(&hers) && !frame.mentions(&broadcast), "bob got {frame:?}");
        assert!(!matches!(frame, Frame::Binary), "bob got a binary frame");
        assert!(remaining(frame).is_none_or(|n| n <= 1), "bob's status counts only his: {frame:?}");
    }
    let after = drain(&mut alice_ws, &server).await;
    for frame in &after {
        assert!(!frame.mentions(&his), "alice got {frame:?}");
        assert_eq!(remaining(frame).unwrap_or(0), 0, "alice's status counts only hers: {frame:?}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_bobs_socket_stays_silent_while_only_alice_works() {
    let (server, alice, bob, data_dir) = cloud("iso-silent").await;
    let mut bob_ws = connect(&server, bob.key.as_deref(), "bob").await.expect("bob's socket");
    let greeting = next(&mut bob_ws, &server, PATIENCE).await.expect("bob's greeting");
    assert_eq!(remaining(&greeting), Some(0));
    for color in 0..3 {
        let id = alice.submit(quick(color, "alice"), None).await;
        alice.finished(&id).await;
    }
    // A `status` per change of alice's queue would tell bob when, and how often, she queues and finishes.
    let heard: Vec<String> =
        drain(&mut bob_ws, &server).await.iter().map(|f| f.kind().to_owned()).collect();
    assert!(heard.is_empty(), "bob's socket heard {heard:?} while only alice worked");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_requests_without_credentials_get_401_on_every_scoped_route() {
    let (server, alice, _, data_dir) = cloud("iso-401").await;
    let anonymous = User::new(alice.base.trim_start_matches("http://"), None);
    let id = STRANGER;
    let routes: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", "/queue".into(), None),
        ("POST", "/queue".into(), Some(json!({"clear": true}))),
        ("GET", "/prompt".into(), None),
        ("POST", "/prompt".into(), Some(json!({"prompt": quick(0, "x")}))),
        ("GET", "/history".into(), None),
        ("GET", format!("/history/{id}"), None),
        ("POST", "/history".into(), Some(json!({"clear": true}))),
        ("GET", "/jobs".into(), None),
        ("GET", format!("/jobs/{id}"), None),
        ("POST", format!("/jobs/{id}/cancel"), Some(json!({}))),
        ("POST", "/jobs/cancel".into(), Some(json!({"job_ids": [id]}))),
        ("POST", "/interrupt".into(), Some(json!({}))),
        ("GET", "/view?filename=alice_00001_.png&type=output".into(), None),
        ("GET", "/settings".into(), None),
        ("GET", "/object_info".into(), None),
    ];
    for (method, path, body) in &routes {
        for prefix in ["/api", ""] {
            let path = format!("{prefix}{path}");
            let (status, answer) = anonymous.call(method, &path, body.as_ref()).await;
            let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            assert_eq!(status, 401, "{method} {path}: {answer}");
            assert_eq!(answer["code"], "unauthenticated", "{method} {path}");
        }
    }
    // The websocket, through the proxy (which checks the refusal too) and directly.
    for path in ["/ws", "/api/ws"] {
        let url =
            format!("ws://{}{path}?clientId=same-id", alice.base.trim_start_matches("http://"));
        let refused = tokio_tungstenite::connect_async(url).await.err();
        let status = match refused {
            Some(tungstenite::Error::Http(response)) => Some(response.status().as_u16()),
            _ => None,
        };
        assert_eq!(status, Some(401), "{path} without credentials");
    }
    assert_eq!(connect(&server, None, "same-id").await.err(), Some(401));
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}
