//! A websocket client that stops reading, against the real binary: the server drops it once its backlog passes
//! the bound (`MAX_QUEUED_BYTES`, 64 MiB, in `server/src/ws/outbox.rs`) instead of holding every frame it is
//! sent, while the other clients keep receiving and the server keeps answering.
//!
//! The sockets connect to the server directly: the contract proxy reads whatever the server sends, so behind
//! it no client would ever look slow to the server. They are plain websocket clients that count bytes, so the
//! reader keeps up with a debug build of the server.

use std::time::Duration;

use futures::StreamExt as _;
use kiln_client::{Client, types};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::binary::{start, temp_dir};

/// The server's bound on one socket's backlog.
const MAX_QUEUED_BYTES: usize = 64 << 20;
/// Nodes in the flooding prompt. Each `progress_state` lists every node so far, and two go out per node to
/// every socket, so the prompt broadcasts about 190 × NODES² bytes: over 300 MB.
const NODES: usize = 1300;

fn client(addr: &str) -> Client {
    Client::with_timeout(&format!("http://{addr}"), Duration::from_secs(60)).expect("client")
}

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A prompt of `NODES` nodes (pairs of an int and a preview of it), owned by the reader.
fn flood() -> types::PromptRequest {
    let mut prompt = serde_json::Map::new();
    for pair in 0..NODES / 2 {
        let (int, preview) = (format!("{}", 2 * pair + 1), format!("{}", 2 * pair + 2));
        prompt
            .insert(int.clone(), json!({"class_type": "PrimitiveInt", "inputs": {"value": pair}}));
        prompt.insert(preview, json!({"class_type": "PreviewAny", "inputs": {"source": [int, 0]}}));
    }
    serde_json::from_value(json!({"prompt": prompt, "client_id": "reader"})).expect("a request")
}

/// A socket straight to the server.
async fn socket(
    addr: &str,
    client_id: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let url = format!("ws://{addr}/ws?clientId={client_id}");
    tokio_tungstenite::connect_async(url).await.expect("websocket").0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_disconnected_and_the_others_keep_receiving() {
    let data_dir = temp_dir("slow-client");
    let (server, addr) = start(&data_dir);
    let kiln = client(&addr);

    // The stalled client opens its socket and never reads it; the reader counts the bytes it gets and tells
    // when its prompt is over (`executing` with a null node).
    let mut stalled = socket(server.direct_addr(), "stalled-client").await;
    let mut reading = socket(server.direct_addr(), "reader").await;
    let (bytes_tx, mut bytes_rx) = tokio::sync::watch::channel((0usize, false));
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = reading.next().await {
            let Message::Text(text) = message else { continue };
            let over = text.len() < 512
                && serde_json::from_str::<Value>(text.as_str())
                    .is_ok_and(|m| m["type"] == "executing" && m["data"]["node"].is_null());
            bytes_tx.send_modify(|(bytes, done)| {
                *bytes += text.len();
                *done |= over;
            });
        }
    });

    let before = rss(server.pid());
    kiln.execute_prompt(None, &flood()).await.expect("accepted");
    let finished = tokio::time::timeout(Duration::from_secs(300), bytes_rx.wait_for(|s| s.1))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(finished, "the reader saw its prompt end");
    let after = rss(server.pid());
    let published = bytes_rx.borrow().0;
    assert!(published > 4 * MAX_QUEUED_BYTES, "the prompt sent {} MiB", published >> 20);

    eprintln!(
        "slow client: {} MiB sent to each client, the server grew by {} MiB",
        published >> 20,
        after.saturating_sub(before) >> 20
    );

    // The server said, in one line, which client it dropped.
    let log = server.log();
    let dropped = log.iter().filter(|l| l.contains("stopped reading")).collect::<Vec<_>>();
    assert!(
        dropped.len() == 1 && dropped[0].contains("stalled-client"),
        "one line naming the client: {log:#?}"
    );
    // It held a bounded backlog, not everything it was sent.
    let grown = after.saturating_sub(before);
    assert!(
        grown < 2 * MAX_QUEUED_BYTES,
        "the server grew by {} MiB while it sent every client {} MiB",
        grown >> 20,
        published >> 20
    );

    // What the stalled client finds when it reads again: what was already on the wire, then the end.
    let mut received = 0;
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(message)) = stalled.next().await {
            received += message.len();
        }
    })
    .await;
    assert!(ended.is_ok(), "the stalled socket was closed (it got {received} bytes)");
    eprintln!("slow client: {} KiB reached the stalled client", received >> 10);
    assert!(received < MAX_QUEUED_BYTES, "{received} bytes reached it");

    // The server still answers, and the client id can connect again.
    let queue = kiln.get_queue().await.expect("the queue").into_inner();
    assert!(queue.queue_pending.is_empty() && queue.queue_running.is_empty());
    let mut again = socket(server.direct_addr(), "stalled-client").await;
    let greeting = tokio::time::timeout(Duration::from_secs(10), again.next()).await;
    assert!(matches!(greeting, Ok(Some(Ok(Message::Text(_))))), "{greeting:?}");
    reader.abort();
    let _ = std::fs::remove_dir_all(&data_dir);
}
