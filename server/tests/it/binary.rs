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
    /// Kiln's own address, without the proxy: for a test that must see answers sooner than the proxy, which
    /// checks each one, passes them on.
    pub(crate) direct: String,
    child: Child,
    proxy: Option<Proxy>,
    contract: Arc<Contract>,
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
/// answer against the spec ([`Contract`]) and forwards it unchanged.
pub(crate) fn start(data_dir: &std::path::Path) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--port", "0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let contract = Arc::new(Contract::from_spec());
    let mut server =
        Server { direct: String::new(), child, proxy: None, contract: contract.clone() };
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line =
            lines.next().expect("kiln logged an address before exiting").expect("stderr is UTF-8");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    server.direct = addr.clone();
    let proxy = proxy::start(&addr, contract);
    let addr = proxy.addr.to_string();
    server.proxy = Some(proxy);
    (server, addr)
}

/// A minimal HTTP/1.1 GET; returns the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
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
