//! Load benchmark (not a test): starts `kiln` and drives `POST /api/prompt` (a trivial workflow) and
//! `GET /api/queue` from this process over keep-alive connections at a fixed rate, then prints req/s and the
//! p50/p99 latency of each. Run with `cargo bench -p kiln-server --bench load` (release build of kiln).
//!
//! Figures depend on the machine; compare runs of this command on the same machine.

// A benchmark's report is its output.
#![allow(clippy::print_stdout)]

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RATE_PER_SECOND: u64 = 1000;
const SECONDS: u64 = 5;
const CONNECTIONS: u64 = 4;

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn drive(client: reqwest::Client, url: String, body: Option<String>) -> Vec<Duration> {
    let interval = Duration::from_micros(1_000_000 * CONNECTIONS / RATE_PER_SECOND);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let count = RATE_PER_SECOND * SECONDS / CONNECTIONS;
    let mut latencies = Vec::with_capacity(count as usize);
    for _ in 0..count {
        tick.tick().await;
        let start = Instant::now();
        let request = match &body {
            Some(body) => client.post(&url).body(body.clone()),
            None => client.get(&url),
        };
        let response = request.send().await.expect("kiln answers");
        assert!(response.status().is_success(), "{}", response.status());
        let _ = response.bytes().await.expect("body");
        latencies.push(start.elapsed());
    }
    latencies
}

async fn measure(name: &str, url: String, body: Option<String>) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        // One client per task: each keeps its own keep-alive connection.
        let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
        tasks.push(tokio::spawn(drive(client, url.clone(), body.clone())));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("driver"));
    }
    let elapsed = started.elapsed();
    all.sort();
    println!(
        "{name}: {} requests in {:.2} s = {:.0} req/s; p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        all.len(),
        elapsed.as_secs_f64(),
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.50).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
        all.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

#[tokio::main]
async fn main() {
    let data_dir = std::env::temp_dir().join(format!("kiln-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--port", "0", "--cache-classic", "--disable-front-end", "--data-dir"])
        .arg(&data_dir)
        .env("RUST_LOG", "warn,kiln=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln starts");
    let stderr = child.stderr.take().expect("stderr");
    let _kill = Kill(child);
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("kiln logs its address").expect("utf-8");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let prompt = r#"{"prompt": {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}}"#;
    println!(
        "kiln at {addr}; {RATE_PER_SECOND} req/s target over {CONNECTIONS} keep-alive connections for {SECONDS} s each"
    );
    measure("POST /api/prompt", format!("http://{addr}/api/prompt"), Some(prompt.to_owned())).await;
    // Let the worker drain what the first phase queued, so the queue reads an ordinary (short) queue.
    let client = reqwest::Client::new();
    loop {
        let info: serde_json::Value = client
            .get(format!("http://{addr}/api/prompt"))
            .send()
            .await
            .expect("answers")
            .json()
            .await
            .expect("JSON");
        if info["exec_info"]["queue_remaining"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    measure("GET /api/queue", format!("http://{addr}/api/queue"), None).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}
