//! The README's run command, for real: start `kiln` on a free port and ask it for `/api/system_stats`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kiln_spec::types::SystemStats;

use kiln_tests::contract::Contract;
use kiln_tests::proxy::{self, Proxy};

/// The running binary behind its checking proxy. When the test ends, whatever happens, the server is killed
/// (SIGKILL); if the test has not already failed, every answer the proxy saw must have met the spec.
pub(crate) struct Server {
    child: Child,
    proxy: Option<Proxy>,
    contract: Arc<Contract>,
    direct: String,
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// The server's own address, without the proxy (for clients whose pace the proxy would hide).
    pub(crate) fn direct_addr(&self) -> &str {
        &self.direct
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (what an orchestrator sends to stop a server).
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "SIGTERM was sent");
    }

    /// Waits up to `timeout` for the process to exit on its own; its exit status, or `None` if it still runs.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("the process can be waited for") {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The lines the server has logged so far.
    pub(crate) fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The contract the proxy checks answers with, for frames a test receives from [`Server::direct_addr`]
    /// (they are checked when the server is dropped, as the proxy's are).
    pub(crate) fn contract(&self) -> &Contract {
        &self.contract
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.proxy.take());
        eprintln!(
            "contract: {} answers and frames checked against the spec",
            self.contract.checked()
        );
        if !std::thread::panicking() {
            self.contract.assert_clean();
        }
    }
}

pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Starts kiln with `--port 0` and returns it with the address to talk to it at: a [`proxy`] that checks every
/// answer against the spec ([`Contract`]) and forwards it unchanged. Without a frontend: tests never reach PyPI.
pub(crate) fn start(data_dir: &std::path::Path) -> (Server, String) {
    start_with(data_dir, &[])
}

/// [`start`] with more command-line arguments.
pub(crate) fn start_with(
    data_dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
) -> (Server, String) {
    launch(data_dir, args, "local", &[])
}

/// [`start_with`] with environment variables set for the process.
pub(crate) fn start_with_env(
    data_dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> (Server, String) {
    launch(data_dir, args, "local", env)
}

/// [`start`] with `--runtime cloud`: every answer is checked against the cloud runtime's operations. The
/// accounts (`kiln_server::Accounts` on `data_dir`) are made before it starts.
pub(crate) fn start_cloud(data_dir: &std::path::Path) -> (Server, String) {
    start_cloud_with(data_dir, &[])
}

/// [`start_cloud`] with more command-line arguments.
pub(crate) fn start_cloud_with(
    data_dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
) -> (Server, String) {
    let mut all = vec![std::ffi::OsStr::new("--runtime"), std::ffi::OsStr::new("cloud")];
    all.extend_from_slice(args);
    launch(data_dir, &all, "cloud", &[])
}

/// Starts kiln with `args` behind a proxy that checks answers against the operations `runtime` mounts.
fn launch(
    data_dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
    runtime: &str,
    env: &[(&str, &str)],
) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--port", "0", "--disable-front-end", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let contract = Arc::new(Contract::for_runtime(runtime));
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut server = Server {
        child,
        proxy: None,
        contract: contract.clone(),
        direct: String::new(),
        log: log.clone(),
    };
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line =
            lines.next().expect("kiln logged an address before exiting").expect("stderr is UTF-8");
        log.lock().unwrap_or_else(|p| p.into_inner()).push(line.clone());
        // The address ends where the text line does, or at the closing quote of a JSON log line.
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split('"').next().unwrap_or(rest).trim().to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            log.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    server.direct.clone_from(&addr);
    let proxy = proxy::start(&addr, contract);
    let addr = proxy.addr.to_string();
    server.proxy = Some(proxy);
    (server, addr)
}

/// `GET path` on `addr` with reqwest, the body parsed as JSON (object keys in the order they were sent).
pub(crate) async fn get_json(http: &reqwest::Client, addr: &str, path: &str) -> serde_json::Value {
    let text = http
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("kiln answers")
        .text()
        .await
        .expect("a body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
}

/// A minimal HTTP/1.1 GET; returns the status code and the body.
pub(crate) fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout set");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
        .expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers end");
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status line");
    (status, body.to_owned())
}

#[test]
fn kiln_serves_system_stats_on_the_port_it_logs() {
    let data_dir = temp_dir("binary");
    let (_server, addr) = start(&data_dir);
    let (status, body) = http_get(&addr, "/api/system_stats");
    assert_eq!(status, 200, "{body}");
    let stats: SystemStats = serde_json::from_str(&body).expect("body is a SystemStats");
    assert_eq!(stats.devices[0].type_, "cpu");
    assert!(stats.system.argv.iter().any(|a| a == "--port"));
    assert!(data_dir.is_dir(), "the data directory is created");
    // `--disable-front-end` downloads nothing: neither the frontend nor the workflow templates.
    assert_eq!(stats.system.installed_templates_version, None);
    assert_eq!(http_get(&addr, "/templates/index.json").0, 404);
    assert!(!data_dir.join("templates").exists() && !data_dir.join("frontend").exists());
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn kiln_refuses_a_bad_listen_address_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--listen", "not-an-ip", "--port", "0", "--data-dir"])
        .arg(temp_dir("badlisten"))
        .output()
        .expect("kiln runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`not-an-ip` is not an IP address"), "{stderr}");
}

#[test]
fn cache_flags_are_exclusive() {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--cache-lru", "3", "--cache-none", "--port", "0", "--data-dir"])
        .arg(temp_dir("cacheflags"))
        .output()
        .expect("kiln runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn issue_10_memory_flags_set_the_budget_and_a_machine_without_cuda_falls_back_to_the_cpu() {
    let data_dir = temp_dir("memflags");
    let args: Vec<&std::ffi::OsStr> =
        ["--reserve-vram", "1", "--cache-ram", "4", "16", "--disable-pinned-memory"]
            .iter()
            .map(std::ffi::OsStr::new)
            .collect();
    let (server, addr) = start_with(&data_dir, &args);
    let (status, body) = http_get(&addr, "/api/system_stats");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let device = &stats["devices"][0];
    assert_eq!(device["type"], "cpu", "this machine has no CUDA: {body}");
    // The CPU's simulated device holds 2 GiB; --reserve-vram 1 leaves 1 GiB to the memory manager.
    assert_eq!(device["vram_budget"], 1i64 << 30, "{body}");
    // One line says why the CPU computes: this build has CUDA support, this machine no driver.
    let log = server.log().join("\n");
    assert!(log.contains("computing on the CPU"), "{log}");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);

    for (bad, message) in [
        (&["--reserve-vram=-1"][..], "--reserve-vram"),
        (&["--cache-ram", "0"][..], "--cache-ram"),
        (&["--cache-ram", "1", "2", "3"][..], "'3'"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(bad)
            .args(["--port", "0", "--disable-front-end", "--data-dir"])
            .arg(temp_dir("badmemflags"))
            .output()
            .expect("kiln runs");
        assert!(!output.status.success(), "{bad:?} is refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{bad:?}: {stderr}");
    }
}

#[tokio::test]
async fn issue_10_free_with_unload_models_unloads_them_before_the_next_prompt() {
    let data_dir = temp_dir("free");
    let (server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("http://{addr}/api/free"))
        .json(&serde_json::json!({"unload_models": true}))
        .send()
        .await
        .expect("kiln answers");
    assert_eq!(answer.status(), 200);
    let mut unloaded = false;
    for _ in 0..50 {
        if server.log().iter().any(|l| l.contains("unloaded every model")) {
            unloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unloaded, "the worker unloads the models: {:?}", server.log());
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}
