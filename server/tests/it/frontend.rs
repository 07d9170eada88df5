//! The frontend at `/` (a `--front-end-root`, the pinned one downloaded once and cached, none) and the
//! `--enable-cors-header` mode.

use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kiln_server::{Config, FRONTEND_VERSION, FrontEnd, LogRing, Server};

use crate::binary::http_get;

fn config(name: &str) -> Config {
    let dir = std::env::temp_dir().join(format!("kiln-frontend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Config::under(dir, vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))], vec!["kiln".to_owned()])
}

async fn send(
    server: &Server,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    crate::answer(server, "local", request).await
}

#[tokio::test]
async fn the_frontend_is_served_with_comfyuis_cache_headers() {
    let mut config = config("static");
    let root = config.data_dir.join("frontend");
    std::fs::create_dir_all(root.join("assets")).expect("dirs");
    std::fs::write(root.join("index.html"), "<html>comfy</html>").expect("index");
    std::fs::write(root.join("assets/app.js"), "console.log(1)").expect("asset");
    config.front_end = FrontEnd::Root(root);
    let server = Server::start(&config, LogRing::new()).await.expect("starts");

    let (status, headers, body) =
        send(&server, Request::get("/").body(Body::empty()).expect("request")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"<html>comfy</html>".as_slice()));
    assert_eq!(headers["cache-control"], "no-store, must-revalidate");
    assert_eq!(headers["pragma"], "no-cache");
    let (status, _, body) =
        send(&server, Request::get("/assets/app.js").body(Body::empty()).expect("request")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"console.log(1)".as_slice()));
    let (status, _, _) =
        send(&server, Request::get("/no/such/file").body(Body::empty()).expect("request")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) =
        send(&server, Request::get("/api/queue").body(Body::empty()).expect("request")).await;
    assert_eq!(status, StatusCode::OK, "the API still answers");
}

#[tokio::test]
async fn cors_mode_allows_other_origins_and_answers_preflight() {
    let mut config = config("cors");
    config.cors_origin = Some("https://app.example".to_owned());
    let server = Server::start(&config, LogRing::new()).await.expect("starts");
    let request = Request::get("/api/queue")
        .header("host", "127.0.0.1:8188")
        .header("origin", "https://app.example")
        .body(Body::empty())
        .expect("request");
    let (status, headers, _) = send(&server, request).await;
    assert_eq!(status, StatusCode::OK, "no loopback origin check in CORS mode");
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    let preflight = Request::builder()
        .method("OPTIONS")
        .uri("/api/prompt")
        .body(Body::empty())
        .expect("request");
    let (status, headers, _) = send(&server, preflight).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("access-control-allow-methods"));
}

#[tokio::test]
async fn without_cors_mode_a_foreign_origin_is_refused_on_loopback() {
    let server = Server::start(&config("origin"), LogRing::new()).await.expect("starts");
    let request = Request::get("/api/queue")
        .header("host", "127.0.0.1:8188")
        .header("origin", "http://evil.example")
        .body(Body::empty())
        .expect("request");
    let (status, _, _) = send(&server, request).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).expect("request")
}

/// What is under `DATA_DIR/frontend`, sorted.
fn frontend_entries(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(config.data_dir.join("frontend"))
        .map(|entries| {
            entries.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn the_pinned_frontend_is_served_from_its_cached_copy_without_any_request() {
    let mut config = config("cached");
    let cached =
        config.data_dir.join(format!("frontend/comfyui-frontend-package-{FRONTEND_VERSION}"));
    std::fs::create_dir_all(&cached).expect("dirs");
    std::fs::write(cached.join("index.html"), "<html>cached</html>").expect("index");
    // A listener that would see the download if one were attempted.
    let wheel_host = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    wheel_host.set_nonblocking(true).expect("nonblocking");
    let wheel_url = format!("http://{}/wheel.whl", wheel_host.local_addr().expect("address"));
    config.front_end = FrontEnd::Pinned { wheel_url };
    let server = Server::start(&config, LogRing::new()).await.expect("starts");

    let (status, headers, body) = send(&server, get("/")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"<html>cached</html>".as_slice()));
    assert_eq!(headers["cache-control"], "no-store, must-revalidate");
    let accepted = wheel_host.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "no connection to the wheel's host: {accepted:?}"
    );
    let _ = std::fs::remove_dir_all(&config.data_dir);
}

#[tokio::test]
async fn a_wheel_that_does_not_match_the_pinned_sha256_is_refused_and_nothing_is_installed() {
    let mut config = config("corrupt");
    // A well-formed wheel with an index.html, so only the hash can refuse it.
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("comfyui_frontend_package/static/index.html", options).expect("entry");
    std::io::Write::write_all(&mut zip, b"<html>tampered</html>").expect("contents");
    let wheel = zip.finish().expect("zip").into_inner();
    let (wheel_url, requests) = kiln_tests::serve_wheel(wheel).await;
    config.front_end = FrontEnd::Pinned { wheel_url: wheel_url.clone() };
    let server = Server::start(&config, LogRing::new()).await.expect("starts without a frontend");

    assert_eq!(requests.load(Ordering::SeqCst), 1);
    let (status, _, body) = send(&server, get("/")).await;
    let text = String::from_utf8(body).expect("text");
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.starts_with("cannot download the ComfyUI frontend ("), "{text}");
    assert!(text.contains(&format!("{wheel_url} has sha256 ")), "{text}");
    assert!(text.contains(
        "not the pinned 37912597537a731a8f421179618a736c24184c5bdbfa327f38b2fb7c291852d9"
    ));
    assert!(text.contains("pass --front-end-root DIR or run once with network access"), "{text}");
    assert_eq!(frontend_entries(&config), Vec::<String>::new(), "nothing installed, nothing left");
    let (status, _, _) = send(&server, get("/api/queue")).await;
    assert_eq!(status, StatusCode::OK, "the API still answers");
    let _ = std::fs::remove_dir_all(&config.data_dir);
}

#[tokio::test]
async fn an_interrupted_download_leaves_nothing_a_later_start_would_serve() {
    let mut config = config("interrupted");
    // Promises 30 MB, sends 64 KB, hangs up.
    let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let wheel_url = format!("http://{}/wheel.whl", host.local_addr().expect("address"));
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut socket, _)) = host.accept().await {
            let mut request = [0; 4096];
            let _ = socket.read(&mut request).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-length: 30000000\r\ncontent-type: application/zip\r\n\r\n";
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&[0x50; 65536]).await;
        }
    });
    config.front_end = FrontEnd::Pinned { wheel_url };
    let server = Server::start(&config, LogRing::new()).await.expect("starts without a frontend");

    let (status, _, body) = send(&server, get("/")).await;
    let text = String::from_utf8(body).expect("text");
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.starts_with("cannot download the ComfyUI frontend ("), "{text}");
    assert_eq!(
        frontend_entries(&config),
        Vec::<String>::new(),
        "no partial wheel or folder is left"
    );
    let _ = std::fs::remove_dir_all(&config.data_dir);
}

#[tokio::test]
async fn without_a_frontend_the_root_says_why_and_the_api_answers() {
    let config = config("disabled");
    let server = Server::start(&config, LogRing::new()).await.expect("starts");
    let (status, headers, body) = send(&server, get("/")).await;
    let text = String::from_utf8(body).expect("text");
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert!(
        text.contains("--disable-front-end") && text.contains("--front-end-root DIR"),
        "{text}"
    );
    let (status, _, _) = send(&server, get("/api/queue")).await;
    assert_eq!(status, StatusCode::OK);
    let _ = std::fs::remove_dir_all(&config.data_dir);
}

/// The README's run command without network access: one line says what to do about the frontend, one about the
/// workflow templates (downloaded in the background), and the API is served.
#[test]
fn kiln_offline_says_in_one_line_each_what_to_do_and_serves_the_api() {
    let data_dir = crate::binary::temp_dir("offline");
    // A port nothing listens on: the download is refused at once, as offline.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let wheel_url = format!("http://{}/wheel.whl", closed.local_addr().expect("address"));
    let mirror = format!("http://{}/wheels", closed.local_addr().expect("address"));
    drop(closed);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--port", "0", "--front-end-wheel-url", &wheel_url])
        .args(["--templates-wheels-url", &mirror, "--data-dir"])
        .arg(&data_dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let mut before_listening = Vec::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("kiln exited before listening:\n{}", before_listening.join("\n"));
        };
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_owned();
        }
        before_listening.push(line);
    };
    // The templates are downloaded after the server listens: their warning comes then, within seconds.
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let mut after_listening = Vec::new();
    while !after_listening
        .iter()
        .any(|l: &String| l.contains("cannot download the workflow templates"))
    {
        match received.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(line) => after_listening.push(line),
            Err(_) => break,
        }
    }
    let (api, root) = (http_get(&addr, "/api/system_stats"), http_get(&addr, "/"));
    let template = http_get(&addr, "/templates/index.json");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data_dir);

    let advice: Vec<&String> = before_listening.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(advice.len(), 1, "one warning:\n{}", before_listening.join("\n"));
    assert!(
        advice[0].contains("cannot download the ComfyUI frontend (")
            && advice[0].contains(&wheel_url)
            && advice[0].ends_with(
                "pass --front-end-root DIR or run once with network access; the API works without it"
            ),
        "{}",
        advice[0]
    );
    let templates: Vec<&String> = after_listening.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(templates.len(), 1, "one warning:\n{}", after_listening.join("\n"));
    assert!(
        templates[0]
            .contains("cannot download the workflow templates (comfyui-workflow-templates-core ")
            && templates[0].contains(&mirror)
            && templates[0].ends_with("the API and the frontend work without them"),
        "{}",
        templates[0]
    );
    assert_eq!(api.0, 200, "the API is served: {}", api.1);
    let stats: serde_json::Value = serde_json::from_str(&api.1).expect("JSON");
    assert!(stats["system"]["installed_templates_version"].is_null(), "{}", api.1);
    assert_eq!(template.0, 404, "no templates are served");
    assert_eq!(root.0, 404);
    assert!(root.1.starts_with("cannot download the ComfyUI frontend ("), "{}", root.1);
}

/// The browser test downloads (through pip) and serves to kiln the version pinned in the clients'
/// requirements; it must be the version kiln pins, or kiln would refuse it and the test would not run the path.
#[test]
fn the_pinned_frontend_is_the_version_the_browser_test_installs() {
    let requirements = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/clients/requirements.txt");
    let text = std::fs::read_to_string(requirements).expect("requirements.txt");
    let pinned = text.lines().find_map(|l| l.strip_prefix("comfyui-frontend-package=="));
    assert_eq!(pinned, Some(FRONTEND_VERSION));
    assert!(
        kiln_server::FRONTEND_WHEEL_URL
            .ends_with(&format!("/comfyui_frontend_package-{FRONTEND_VERSION}-py3-none-any.whl"))
    );
}

#[test]
fn front_end_flags_are_checked() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .args(["--port", "0", "--data-dir"])
            .arg(crate::binary::temp_dir("frontflags"))
            .output()
            .expect("kiln runs");
        assert!(!output.status.success(), "{args:?} is refused");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = run(&["--front-end-version", "1.58.1"]);
    assert!(
        stderr.contains("`1.58.1` is not a frontend version string (OWNER/REPO@VERSION"),
        "{stderr}"
    );
    let stderr = run(&["--disable-front-end", "--front-end-root", "web"]);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
