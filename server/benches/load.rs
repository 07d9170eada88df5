//! Load benchmark (not a test): the accept path and the worker under a flood of prompts, measured against a
//! baseline build in the same run. Run with `cargo bench -p kiln-server --bench load`; set
//! `KILN_BASELINE_BIN` to another `kiln` binary (e.g. a release build of the previous commit) to measure it
//! too, alternating with this build, and print the ratios.
//!
//! For each binary, on a fresh data dir (`kiln --cache-classic`), with a trivial `PrimitiveInt → PreviewAny`
//! prompt:
//!
//! 1. **Accept**: [`CONCURRENCY`] closed-loop keep-alive connections post prompts for [`FLOOD`]: accepted
//!    prompts a second, p50 and p99 latency. The worker runs the prompts meanwhile.
//! 2. **Worker under the flood**: its pace during phase 1 (prompts finished a second, from the accepted count
//!    and `queue_remaining` sampled after [`SETTLE`] and at the end; valid while a backlog remains).
//! 3. **Worker idle**: its pace draining the backlog phase 1 left, with nothing arriving (over [`DRAIN`]).
//! 4. **Clear**: on a fresh server, prompts are posted until [`CLEAR_PENDING`] are pending, then
//!    `POST /api/queue {"clear": true}` is timed.
//!
//! With `KILN_BENCH_POSTGRES=1`, this build is also measured on Postgres (`--database-url`, a fresh database of
//! a throwaway cluster for each start, `kiln_tests::postgres`), alternating with the others, and the ratios
//! to the embedded SQLite database are printed.
//!
//! With `KILN_BENCH_CLUSTER=1`, a cluster on Postgres is measured too, for 1, 2 and 4 workers (one API node,
//! `--role worker` processes, a fresh database each): the accept flood against the API node, the workers' pace
//! draining the backlog (prompts finished a second), and the claim latency of an idle cluster (from a
//! prompt's `create_time` to its `execution_start`, one prompt at a time, [`LATENCY_SAMPLES`] of them), the
//! same latency measured on the single server (SQLite) in the same run.
//!
//! Figures depend on the machine (the load generator shares it with kiln): compare builds in one run.

// A benchmark's report is its output.
#![allow(clippy::print_stdout)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kiln_tests::postgres::Postgres;

/// Concurrent closed-loop connections posting prompts.
const CONCURRENCY: usize = 8;
/// How long the accept flood lasts.
const FLOOD: Duration = Duration::from_secs(8);
/// When, into the flood, the worker's pace starts being counted.
const SETTLE: Duration = Duration::from_millis(500);
/// How long the idle worker's pace is measured.
const DRAIN: Duration = Duration::from_secs(3);
/// Pending prompts for the clear.
const CLEAR_PENDING: i64 = 10_000;
/// Prompts submitted one at a time for the claim latency.
const LATENCY_SAMPLES: usize = 40;
/// Measurement rounds (each runs every binary once, alternating); `KILN_BENCH_ROUNDS` overrides it.
const ROUNDS: usize = 3;

const PROMPT: &str = r#"{"prompt": {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}}"#;

/// A running `kiln`, killed and its data dir removed on drop.
struct Kiln {
    child: std::process::Child,
    addr: String,
    data_dir: PathBuf,
}

impl Drop for Kiln {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A fresh database of `postgres`.
fn fresh_database(postgres: &Postgres) -> String {
    static DATABASES: AtomicUsize = AtomicUsize::new(0);
    postgres.database(&format!("load{}", DATABASES.fetch_add(1, Ordering::Relaxed)))
}

/// Starts `binary` on a fresh data dir, and on a fresh database of `postgres` if given.
fn start(binary: &Path, label: &str, postgres: Option<&Postgres>) -> Kiln {
    let database = postgres.map(fresh_database);
    let data_dir = std::env::temp_dir().join(format!("kiln-load-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    spawn(binary, &data_dir, database.as_deref(), &[])
}

/// Starts `binary` on `data_dir` (and `database`) with `args`; the process is killed and `data_dir`
/// removed when the returned `Kiln` drops.
fn spawn(binary: &Path, data_dir: &Path, database: Option<&str>, args: &[&str]) -> Kiln {
    let data_dir = data_dir.to_path_buf();
    let mut command = Command::new(binary);
    command
        .args(["--port", "0", "--cache-classic", "--disable-front-end", "--data-dir"])
        .arg(&data_dir)
        .args(args);
    if let Some(database) = database {
        command.args(["--database-url", database]);
    }
    let mut child = command
        .env("RUST_LOG", "warn,kiln=info,kiln_server=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", binary.display()));
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("kiln logs its address").expect("utf-8");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Kiln { child, addr, data_dir }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A request's JSON answer.
async fn answer(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.expect("answers").json().await.expect("JSON")
}

/// Pending plus running prompts.
async fn remaining(http: &reqwest::Client, addr: &str) -> i64 {
    let info = answer(http.get(format!("http://{addr}/api/prompt"))).await;
    info["exec_info"]["queue_remaining"].as_i64().expect("a count")
}

/// Warms a server up (connections, caches, the database file) with half a second of flood, then waits for
/// its queue to empty.
async fn warm_up(http: &reqwest::Client, addr: &str) {
    let warm = Flood::start(addr);
    tokio::time::sleep(Duration::from_millis(500)).await;
    warm.stop().await;
    while remaining(http, addr).await > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /api/queue {"clear": true}`.
async fn clear(http: &reqwest::Client, addr: &str) {
    let response = http
        .post(format!("http://{addr}/api/queue"))
        .body(r#"{"clear": true}"#)
        .send()
        .await
        .expect("clear answers");
    assert!(response.status().is_success(), "{}", response.status());
}

/// Closed-loop posters: [`CONCURRENCY`] connections post until `stop` is set; `accepted` counts answers.
struct Flood {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
}

impl Flood {
    fn start(addr: &str) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let url = format!("http://{addr}/api/prompt");
        let tasks = (0..CONCURRENCY)
            .map(|_| {
                // One client per task: each keeps its own keep-alive connection.
                let client =
                    reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
                let (stop, accepted, url) = (stop.clone(), accepted.clone(), url.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let response =
                            client.post(&url).body(PROMPT).send().await.expect("kiln answers");
                        assert!(response.status().is_success(), "{}", response.status());
                        let _ = response.bytes().await.expect("body");
                        latencies.push(started.elapsed());
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    latencies
                })
            })
            .collect();
        Flood { stop, accepted, tasks }
    }

    async fn stop(self) -> Vec<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.expect("poster"));
        }
        all.sort();
        all
    }
}

/// One binary's figures.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    accept_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    flood_pace: f64,
    idle_pace: f64,
    clear_pending: i64,
    clear_ms: f64,
}

async fn measure(binary: &Path, label: &str, postgres: Option<&Postgres>) -> Figures {
    let kiln = start(binary, label, postgres);
    let addr = kiln.addr.clone();
    let http = reqwest::Client::new();
    let mut figures = Figures::default();

    warm_up(&http, &addr).await;

    // 1 and 2: the flood, and the worker's pace while it lasts.
    let flood = Flood::start(&addr);
    let started = Instant::now();
    tokio::time::sleep(SETTLE).await;
    let (t1, a1, r1) =
        (started.elapsed(), flood.accepted.load(Ordering::Relaxed), remaining(&http, &addr).await);
    tokio::time::sleep(FLOOD - SETTLE).await;
    let (t2, a2, r2) =
        (started.elapsed(), flood.accepted.load(Ordering::Relaxed), remaining(&http, &addr).await);
    let latencies = flood.stop().await;
    let elapsed = started.elapsed();
    figures.accept_per_s = latencies.len() as f64 / elapsed.as_secs_f64();
    figures.p50_ms = ms(percentile(&latencies, 0.50));
    figures.p99_ms = ms(percentile(&latencies, 0.99));
    figures.flood_pace = ((a2 - a1) as f64 - (r2 - r1) as f64) / (t2 - t1).as_secs_f64();
    if r1 <= 0 || r2 <= 0 {
        println!(
            "  [{label}] the worker kept up with the flood (no backlog): its pace is a lower bound"
        );
    }

    // 3: the idle worker drains the backlog (sampled often: it may last well under a second).
    let (d0, r0) = (Instant::now(), remaining(&http, &addr).await);
    let mut last = (d0, r0);
    while d0.elapsed() < DRAIN {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let r = remaining(&http, &addr).await;
        if r < (r0 / 20).max(50) {
            break;
        }
        last = (Instant::now(), r);
    }
    figures.idle_pace = (r0 - last.1) as f64 / (last.0 - d0).as_secs_f64();
    if last.0 - d0 < Duration::from_millis(300) {
        println!("  [{label}] the backlog lasted under 300 ms: the idle pace is rough");
    }

    // 4: on a fresh server, fill the queue to CLEAR_PENDING and clear it.
    drop(kiln);
    let kiln = start(binary, label, postgres);
    let addr = kiln.addr.clone();
    let fill = Flood::start(&addr);
    while remaining(&http, &addr).await < CLEAR_PENDING {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fill.stop().await;
    let pending = remaining(&http, &addr).await;
    let cleared = Instant::now();
    clear(&http, &addr).await;
    figures.clear_ms = ms(cleared.elapsed());
    figures.clear_pending = pending;
    let after = remaining(&http, &addr).await;
    assert!(after <= 1, "{after} prompts remain after the clear");
    drop(kiln);
    figures
}

/// A cluster's figures.
#[derive(Debug, Default, Clone, Copy)]
struct ClusterFigures {
    accept_per_s: f64,
    p99_ms: f64,
    flood_pace: f64,
    pace: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
}

/// The claim latency of an idle server: `LATENCY_SAMPLES` prompts, one at a time, each from its
/// `create_time` to its `execution_start` (both stamped by Kiln, in milliseconds); sorted.
async fn claim_latencies(http: &reqwest::Client, addr: &str) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for _ in 0..LATENCY_SAMPLES {
        let accepted = answer(http.post(format!("http://{addr}/api/prompt")).body(PROMPT)).await;
        let id = accepted["prompt_id"].as_str().expect("an id").to_owned();
        let entry = loop {
            let history = answer(http.get(format!("http://{addr}/api/history/{id}"))).await;
            if let Some(entry) = history.get(&id) {
                break entry.clone();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let created = entry["prompt"][3]["create_time"].as_i64().expect("create_time");
        let started = entry["status"]["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m[0] == "execution_start")
            .and_then(|m| m[1]["timestamp"].as_i64())
            .expect("execution_start");
        latencies.push(Duration::from_millis((started - created).max(0) as u64));
    }
    latencies.sort();
    latencies
}

/// One API node and `workers` workers of `binary` on a fresh database of `postgres`.
async fn measure_cluster(binary: &Path, postgres: &Postgres, workers: usize) -> ClusterFigures {
    let database = fresh_database(postgres);
    let data_dir =
        std::env::temp_dir().join(format!("kiln-load-cluster{workers}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let api = spawn(binary, &data_dir, Some(&database), &["--role", "api"]);
    let _workers: Vec<Kiln> = (0..workers)
        .map(|_| spawn(binary, &data_dir, Some(&database), &["--role", "worker"]))
        .collect();
    let addr = api.addr.clone();
    let http = reqwest::Client::new();
    let mut figures = ClusterFigures::default();
    warm_up(&http, &addr).await;
    let flood = Flood::start(&addr);
    let started = Instant::now();
    tokio::time::sleep(FLOOD).await;
    let latencies = flood.stop().await;
    let elapsed = started.elapsed();
    figures.accept_per_s = latencies.len() as f64 / elapsed.as_secs_f64();
    figures.p99_ms = ms(percentile(&latencies, 0.99));
    // Finished during the flood: accepted, less what remained at its end.
    figures.flood_pace =
        (latencies.len() as f64 - remaining(&http, &addr).await as f64) / elapsed.as_secs_f64();
    // The workers' pace with nothing arriving: the backlog drained over DRAIN (or to its end).
    let (d0, r0) = (Instant::now(), remaining(&http, &addr).await);
    let mut last = (d0, r0);
    while d0.elapsed() < DRAIN && last.1 > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = (Instant::now(), remaining(&http, &addr).await);
    }
    // Without a backlog (the workers kept up with the flood) there is no idle pace to measure.
    figures.pace =
        if r0 >= 100 { (r0 - last.1) as f64 / (last.0 - d0).as_secs_f64() } else { f64::NAN };
    clear(&http, &addr).await;
    while remaining(&http, &addr).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claims = claim_latencies(&http, &addr).await;
    figures.claim_p50_ms = ms(percentile(&claims, 0.50));
    figures.claim_p99_ms = ms(percentile(&claims, 0.99));
    drop(api);
    let _ = std::fs::remove_dir_all(&data_dir);
    figures
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:>9}: accept {:>5.0}/s p50 {:.2} ms p99 {:.2} ms | worker flood {:>5.0}/s idle {:>5.0}/s ({:.0} %) | clear {} in {:.1} ms",
        f.accept_per_s,
        f.p50_ms,
        f.p99_ms,
        f.flood_pace,
        f.idle_pace,
        100.0 * f.flood_pace / f.idle_pace,
        f.clear_pending,
        f.clear_ms,
    );
}

#[tokio::main]
async fn main() {
    let current = PathBuf::from(env!("CARGO_BIN_EXE_kiln"));
    let baseline = std::env::var_os("KILN_BASELINE_BIN").map(PathBuf::from);
    let postgres = std::env::var_os("KILN_BENCH_POSTGRES").map(|_| Postgres::start("load"));
    println!(
        "closed loop, {CONCURRENCY} connections, {FLOOD:?} flood, idle drain over {DRAIN:?}, clear of {CLEAR_PENDING}; {ROUNDS} rounds"
    );
    let mut runs: Vec<(&str, Figures)> = Vec::new();
    // KILN_BENCH_ROUNDS=0 measures the cluster alone.
    let rounds =
        std::env::var("KILN_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    for round in 1..=rounds {
        if let Some(baseline) = &baseline {
            let f = measure(baseline, "baseline", None).await;
            print(&format!("baseline{round}"), &f);
            runs.push(("baseline", f));
        }
        let f = measure(&current, "current", None).await;
        print(&format!("current{round}"), &f);
        runs.push(("current", f));
        if let Some(postgres) = &postgres {
            let f = measure(&current, "postgres", Some(postgres)).await;
            print(&format!("postgres{round}"), &f);
            runs.push(("postgres", f));
        }
    }
    let median = |label: &str, pick: fn(&Figures) -> f64| {
        let mut values: Vec<f64> =
            runs.iter().filter(|(l, _)| *l == label).map(|(_, f)| pick(f)).collect();
        values.sort_by(f64::total_cmp);
        match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        }
    };
    let compare = |label: &str, base: &str| {
        let ratio = |pick: fn(&Figures) -> f64| median(label, pick) / median(base, pick);
        println!(
            "{label} / {base}: accept {:.2}x, p99 {:.2}x, worker under flood {:.2}x, worker idle {:.2}x, clear time {:.3}x",
            ratio(|f| f.accept_per_s),
            ratio(|f| f.p99_ms),
            ratio(|f| f.flood_pace),
            ratio(|f| f.idle_pace),
            ratio(|f| f.clear_ms),
        );
    };
    if baseline.is_some() && rounds > 0 {
        compare("current", "baseline");
    }
    if postgres.is_some() && rounds > 0 {
        compare("postgres", "current");
    }
    if std::env::var_os("KILN_BENCH_CLUSTER").is_some() {
        cluster(&current).await;
    }
}

/// The cluster's figures for 1, 2 and 4 workers, and the single server's claim latency, in one run.
async fn cluster(binary: &Path) {
    let postgres = Postgres::start("load-cluster");
    let single = start(binary, "single", None);
    let claims = claim_latencies(&reqwest::Client::new(), &single.addr).await;
    drop(single);
    let (single_p50, single_p99) = (ms(percentile(&claims, 0.50)), ms(percentile(&claims, 0.99)));
    println!(
        "single server (SQLite): claim latency p50 {single_p50:.1} ms p99 {single_p99:.1} ms (create_time to execution_start, idle)"
    );
    for workers in [1, 2, 4] {
        let f = measure_cluster(binary, &postgres, workers).await;
        println!(
            "cluster, {workers} worker(s): accept {:>5.0}/s p99 {:.2} ms | workers under the flood {:>5.0}/s, drain {:>5.0}/s (NaN: no backlog) | claim latency p50 {:.1} ms p99 {:.1} ms ({:.2}x the single server's p50)",
            f.accept_per_s,
            f.p99_ms,
            f.flood_pace,
            f.pace,
            f.claim_p50_ms,
            f.claim_p99_ms,
            f.claim_p50_ms / single_p50.max(0.1),
        );
    }
}
