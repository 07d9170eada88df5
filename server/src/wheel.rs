//! Pinned Python wheels from PyPI, installed once under the data dir: the ComfyUI frontend
//! (`frontend_package`) and the workflow templates (`templates`). Kiln reads a folder out of each wheel; it
//! never runs Python.
//!
//! Invariant: an install folder only ever exists complete. The wheel is downloaded to a temporary file, its
//! sha256 checked against the pin, the folder Kiln needs unpacked (and synced) into a temporary folder, and
//! that folder renamed into place; an interrupted or refused download leaves nothing a later start would use.
//! A folder that is there (with its required file, where one is named) is used as it is, without any request.

use std::io::{BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{CONTENT_LENGTH, LOCATION, USER_AGENT};
use axum::http::uri::InvalidUri;
use axum::http::{HeaderValue, Request, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

/// How long to wait for a connection, and for the next bytes of a download.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A wheel to install: where to fetch it and the sha256 it must have, wherever it comes from.
#[derive(Debug, Clone)]
pub(crate) struct Wheel {
    pub(crate) url: String,
    pub(crate) sha256: String,
}

/// What to take out of a wheel: the files under `folder` (a path inside the wheel), of which `required` (a path
/// inside `folder`), when named, must be one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Contents {
    pub(crate) folder: &'static str,
    pub(crate) required: Option<&'static str>,
}

impl Contents {
    /// Whether `dir` holds a complete install of these contents.
    pub(crate) fn installed_in(&self, dir: &Path) -> bool {
        match self.required {
            Some(file) => dir.join(file).is_file(),
            None => dir.is_dir(),
        }
    }
}

/// Why a wheel could not be installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstallError {
    #[error("{url}")]
    Download {
        url: String,
        #[source]
        source: BoxError,
    },
    #[error("{url} answered {status}")]
    Status { url: String, status: StatusCode },
    #[error("{url} sent nothing for {} s", READ_TIMEOUT.as_secs())]
    Stalled { url: String },
    #[error("{url} has sha256 {found}, not the pinned {expected}")]
    Hash { url: String, found: String, expected: String },
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the wheel is not a readable zip archive")]
    Zip(#[source] zip::result::ZipError),
    #[error("the wheel holds an entry that is not a plain file under its folder: {0}")]
    UnsafeEntry(String),
    #[error("the wheel has no {0}")]
    Missing(String),
    #[error("unpacking stopped unexpectedly")]
    Unpack(#[source] tokio::task::JoinError),
}

impl InstallError {
    /// The error and its causes on one line, for a log line that also says what to do.
    pub(crate) fn reason(&self) -> String {
        one_line(self)
    }
}

/// `error` and its causes on one line (`error: cause: cause`), for a log line.
pub(crate) fn one_line(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line.replace(['\n', '\r'], " ")
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io { what, path, source }
}

/// Installs `contents` of `wheel` as the folder `target` unless it is there already; returns how many files
/// were unpacked (0: the installed copy was there and no request was made). Every byte downloaded advances
/// `bar`. Temporary files live beside `target` and are removed whatever happens; leftovers of a killed
/// install are removed first.
pub(crate) async fn install(
    wheel: &Wheel,
    contents: Contents,
    target: &Path,
    bar: &ProgressBar,
) -> Result<usize, InstallError> {
    if contents.installed_in(target) {
        return Ok(0);
    }
    let parent = target.parent().unwrap_or(Path::new(".")).to_owned();
    tokio::fs::create_dir_all(&parent).await.map_err(io("create", &parent))?;
    remove_leftovers(&parent);
    let scratch = Scratch {
        wheel: parent.join(format!(".partial-{}.whl", std::process::id())),
        dir: parent.join(format!(".partial-{}", std::process::id())),
    };
    let found = download(&wheel.url, &scratch.wheel, bar).await?;
    if !found.eq_ignore_ascii_case(&wheel.sha256) {
        return Err(InstallError::Hash {
            url: wheel.url.clone(),
            found,
            expected: wheel.sha256.clone(),
        });
    }
    let (archive, unpacked) = (scratch.wheel.clone(), scratch.dir.clone());
    let files = tokio::task::spawn_blocking(move || unpack(&archive, contents, &unpacked))
        .await
        .map_err(InstallError::Unpack)??;
    if target.exists() {
        // Not a complete install (its required file is missing): someone else's leftover. Replace it.
        std::fs::remove_dir_all(target).map_err(io("remove the incomplete", target))?;
    }
    std::fs::rename(&scratch.dir, target).map_err(io("move the files into", target))?;
    // Make the rename itself durable, so a crash cannot lose it after we said it is installed.
    if let Ok(dir) = std::fs::File::open(&parent) {
        let _ = dir.sync_all();
    }
    Ok(files)
}

/// The temporary wheel file and folder of one install; removed when the install ends, whatever happened.
struct Scratch {
    wheel: PathBuf,
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.wheel);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes what an install killed part-way (kill -9, power loss) left under `parent`.
fn remove_leftovers(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".partial-") {
            let path = entry.path();
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    }
}

/// Streams `url` into `dest` (following up to five redirects), advancing `bar` (whose length, when it has
/// none, becomes the download's); returns the sha256 of what arrived, in hex.
async fn download(url: &str, dest: &Path, bar: &ProgressBar) -> Result<String, InstallError> {
    let failed = |source: BoxError| InstallError::Download { url: url.to_owned(), source };
    let client = http_client().map_err(|e| failed(e.into()))?;
    let mut uri: Uri = url.parse().map_err(|e: InvalidUri| failed(e.into()))?;
    let mut redirects = 0;
    let response = loop {
        let request = Request::get(&uri)
            .header(USER_AGENT, concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(e.into()))?;
        let response = tokio::time::timeout(READ_TIMEOUT, client.request(request))
            .await
            .map_err(|_| InstallError::Stalled { url: url.to_owned() })?
            .map_err(|e| failed(e.into()))?;
        let status = response.status();
        let next = redirect_target(&uri, response.headers().get(LOCATION));
        if let (true, Some(next)) = (status.is_redirection() && redirects < 5, next) {
            (uri, redirects) = (next, redirects + 1);
            continue;
        }
        if !status.is_success() {
            // The URL that answered: the one asked for, or where it redirected.
            return Err(InstallError::Status { url: uri.to_string(), status });
        }
        break response;
    };
    let length: Option<u64> =
        response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    if let (None, Some(length)) = (bar.length(), length) {
        bar.set_length(length);
    }
    let mut body = response.into_body();
    let mut file = tokio::fs::File::create(dest).await.map_err(io("create", dest))?;
    let mut hasher = Sha256::new();
    loop {
        let frame = tokio::time::timeout(READ_TIMEOUT, body.frame())
            .await
            .map_err(|_| InstallError::Stalled { url: url.to_owned() })?;
        let Some(frame) = frame else { break };
        let Ok(chunk) = frame.map_err(|e| failed(e.into()))?.into_data() else { continue };
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(io("write", dest))?;
        bar.inc(chunk.len() as u64);
    }
    // Completes the writes; no sync: the wheel is read once, below, and removed.
    file.flush().await.map_err(io("write", dest))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An HTTP(S) client: rustls on ring with the system's root certificates, HTTP/1.1.
fn http_client() -> std::io::Result<Client<HttpsConnector<HttpConnector>, Empty<Bytes>>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(Arc::new(rustls::crypto::ring::default_provider()))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// Where a redirect leads: an absolute URL, or a path on the same host.
fn redirect_target(from: &Uri, location: Option<&HeaderValue>) -> Option<Uri> {
    let location = location?.to_str().ok()?;
    let uri: Uri = location.parse().ok()?;
    if uri.scheme().is_some() {
        return Some(uri);
    }
    if !location.starts_with('/') {
        return None;
    }
    let mut parts = from.clone().into_parts();
    parts.path_and_query = Some(location.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// A download progress bar on stderr labelled `what`, of `len` bytes when known, cleared when finished; drawn
/// only when stderr is a terminal.
pub(crate) fn progress_bar(what: &str, len: Option<u64>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr())
        .with_finish(ProgressFinish::AndClear);
    let template = format!("{what} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} {{eta}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Unpacks the wheel's `contents.folder` into `into`, syncing each file; returns how many files it wrote.
fn unpack(wheel: &Path, contents: Contents, into: &Path) -> Result<usize, InstallError> {
    let file = std::fs::File::open(wheel).map_err(io("open", wheel))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(InstallError::Zip)?;
    std::fs::create_dir_all(into).map_err(io("create", into))?;
    let mut written_files = Vec::new();
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(InstallError::Zip)?;
        let name = entry.name().map(|n| n.into_owned()).unwrap_or_default();
        let Some(path) = entry.enclosed_name() else {
            return Err(InstallError::UnsafeEntry(name));
        };
        let Ok(relative) = path.strip_prefix(contents.folder) else { continue };
        if relative.as_os_str().is_empty() {
            continue;
        }
        if !relative.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
            return Err(InstallError::UnsafeEntry(name));
        }
        let out = into.join(relative);
        if entry.is_dir() {
            std::fs::create_dir_all(&out).map_err(io("create", &out))?;
        } else if entry.is_file() && !entry.is_symlink() {
            if let Some(dir) = out.parent() {
                std::fs::create_dir_all(dir).map_err(io("create", dir))?;
            }
            let mut written = std::fs::File::create(&out).map_err(io("create", &out))?;
            // Reading to the end checks the entry's CRC.
            std::io::copy(&mut entry, &mut written).map_err(io("unpack", &out))?;
            written.flush().map_err(io("write", &out))?;
            written_files.push(out);
        } else {
            return Err(InstallError::UnsafeEntry(name));
        }
    }
    let complete = match contents.required {
        Some(file) => into.join(file).is_file(),
        None => !written_files.is_empty(),
    };
    if !complete {
        let what = contents.required.unwrap_or("files");
        return Err(InstallError::Missing(format!("{}/{what}", contents.folder)));
    }
    sync_files(into, &written_files).map_err(io("sync", into))?;
    Ok(written_files.len())
}

/// Makes the unpacked files durable before their folder is renamed into place, so that not even a power cut
/// leaves a folder of empty files: one `syncfs` on Linux.
#[cfg(target_os = "linux")]
fn sync_files(dir: &Path, _files: &[PathBuf]) -> std::io::Result<()> {
    Ok(rustix::fs::syncfs(std::fs::File::open(dir)?)?)
}

/// Makes the unpacked files durable before their folder is renamed into place: each file synced.
#[cfg(not(target_os = "linux"))]
fn sync_files(_dir: &Path, files: &[PathBuf]) -> std::io::Result<()> {
    files.iter().try_for_each(|path| std::fs::File::open(path)?.sync_all())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;

    use super::*;

    /// A wheel holding `entries` (name, contents), deflated.
    pub(crate) fn wheel_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, contents) in entries {
            zip.start_file(*name, options).expect("entry");
            zip.write_all(contents).expect("contents");
        }
        zip.finish().expect("zip").into_inner()
    }

    /// A fresh folder under the temporary directory.
    pub(crate) fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-wheel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    /// The sha256 of `bytes`, in hex.
    pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    const STATIC: Contents = Contents { folder: "pkg/static", required: Some("index.html") };

    #[test]
    fn unpack_takes_only_the_folder() {
        let dir = scratch("unpack");
        let wheel = dir.join("w.whl");
        std::fs::write(
            &wheel,
            wheel_bytes(&[
                ("pkg/__init__.py", b"x"),
                ("pkg/static/index.html", b"<html>"),
                ("pkg/static/assets/app.js", b"app"),
                ("pkg-1.0.dist-info/RECORD", b"r"),
            ]),
        )
        .expect("wheel");
        let into = dir.join("out");
        assert_eq!(unpack(&wheel, STATIC, &into).expect("unpacks"), 2);
        assert_eq!(std::fs::read(into.join("index.html")).expect("index"), b"<html>");
        assert_eq!(std::fs::read(into.join("assets/app.js")).expect("asset"), b"app");
        assert!(!into.join("__init__.py").exists() && !into.join("RECORD").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unpack_refuses_entries_that_escape_and_wheels_without_the_required_file() {
        let dir = scratch("unsafe");
        let wheel = dir.join("w.whl");
        std::fs::write(
            &wheel,
            wheel_bytes(&[
                ("pkg/static/index.html", b"<html>"),
                ("pkg/static/../../../escaped.txt", b"no"),
            ]),
        )
        .expect("wheel");
        let error = unpack(&wheel, STATIC, &dir.join("out")).expect_err("refused");
        assert!(
            matches!(error, InstallError::UnsafeEntry(ref n) if n.contains("escaped")),
            "{error}"
        );
        assert!(!dir.join("escaped.txt").exists());

        let sideways = "pkg/static/../static2/x.txt";
        std::fs::write(
            &wheel,
            wheel_bytes(&[("pkg/static/index.html", b"<html>"), (sideways, b"no")]),
        )
        .expect("wheel");
        // zip resolves it to `pkg/static2/x.txt`: outside `static/`, so not unpacked.
        assert_eq!(unpack(&wheel, STATIC, &dir.join("out1")).expect("unpacks"), 1);
        assert!(!dir.join("static2").exists() && !dir.join("out1/static2").exists());

        std::fs::write(&wheel, wheel_bytes(&[("pkg/__init__.py", b"x")])).expect("wheel");
        let error = unpack(&wheel, STATIC, &dir.join("out2")).expect_err("refused");
        assert!(matches!(error, InstallError::Missing(ref f) if f == "pkg/static/index.html"));
        let any = Contents { folder: "pkg/templates", required: None };
        let error = unpack(&wheel, any, &dir.join("out3")).expect_err("refused");
        assert_eq!(error.to_string(), "the wheel has no pkg/templates/files");

        std::fs::write(&wheel, b"not a zip").expect("wheel");
        let error = unpack(&wheel, STATIC, &dir.join("out4")).expect_err("refused");
        assert!(matches!(error, InstallError::Zip(_)), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn install_unpacks_a_matching_wheel_once_then_uses_the_installed_copy() {
        let dir = scratch("install");
        let bytes = wheel_bytes(&[
            ("pkg/static/index.html", b"<html>pinned</html>"),
            ("pkg/static/assets/app.js", b"app"),
        ]);
        let (url, requests) = kiln_tests::serve_wheel(bytes.clone()).await;
        let wheel = Wheel { url, sha256: sha256_hex(&bytes) };
        let target = dir.join("installs/pkg-1.0");
        let bar = ProgressBar::hidden();

        assert_eq!(install(&wheel, STATIC, &target, &bar).await.expect("installs"), 2);
        assert_eq!(
            std::fs::read(target.join("index.html")).expect("index"),
            b"<html>pinned</html>"
        );
        assert_eq!(bar.position(), bytes.len() as u64, "the bar counts the bytes downloaded");
        let left: Vec<_> = std::fs::read_dir(dir.join("installs"))
            .expect("installs")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["pkg-1.0"], "no temporary file is left");
        assert_eq!(requests.load(Ordering::SeqCst), 1);

        assert_eq!(install(&wheel, STATIC, &target, &bar).await.expect("installed"), 0);
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "the installed copy is used without a request"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_wheel_of_another_hash_is_refused_and_leaves_nothing() {
        let dir = scratch("hash");
        let bytes = wheel_bytes(&[("pkg/static/index.html", b"<html>")]);
        let (url, _) = kiln_tests::serve_wheel(bytes).await;
        let wheel = Wheel { url, sha256: "00".repeat(32) };
        let target = dir.join("installs/pkg-1.0");
        let error =
            install(&wheel, STATIC, &target, &ProgressBar::hidden()).await.expect_err("refused");
        assert!(matches!(error, InstallError::Hash { .. }), "{error}");
        assert_eq!(std::fs::read_dir(dir.join("installs")).expect("installs").count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_leftover_of_a_killed_install_is_removed_and_never_used() {
        let dir = scratch("leftover");
        let bytes = wheel_bytes(&[("pkg/static/index.html", b"<html>")]);
        let (url, _) = kiln_tests::serve_wheel(bytes.clone()).await;
        let wheel = Wheel { url, sha256: sha256_hex(&bytes) };
        // What a kill -9 during unpacking leaves: a partial folder, a partial wheel, and a target folder without
        // its required file (as if someone emptied it by hand).
        let installs = dir.join("installs");
        std::fs::create_dir_all(installs.join(".partial-1/assets")).expect("partial dir");
        std::fs::write(installs.join(".partial-1.whl"), b"half").expect("partial wheel");
        let target = installs.join("pkg-1.0");
        std::fs::create_dir_all(target.join("assets")).expect("target");

        install(&wheel, STATIC, &target, &ProgressBar::hidden()).await.expect("installs");
        assert!(target.join("index.html").is_file());
        assert!(!target.join("assets").exists(), "the incomplete folder was replaced, not merged");
        assert!(!installs.join(".partial-1").exists() && !installs.join(".partial-1.whl").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn redirects_lead_to_absolute_urls_or_paths_on_the_same_host() {
        let from: Uri = "https://mirror.example/simple/x.whl".parse().expect("uri");
        let target = |location: &str| {
            redirect_target(&from, Some(&HeaderValue::from_str(location).expect("header")))
                .map(|u| u.to_string())
        };
        assert_eq!(
            target("https://files.example/a/x.whl").as_deref(),
            Some("https://files.example/a/x.whl")
        );
        assert_eq!(
            target("/files/x.whl?h=1").as_deref(),
            Some("https://mirror.example/files/x.whl?h=1")
        );
        assert_eq!(target("x.whl"), None, "relative paths are not followed");
        assert_eq!(redirect_target(&from, None), None);
    }

    #[test]
    fn the_reason_is_one_line_with_the_causes() {
        let error = InstallError::Io {
            what: "create",
            path: PathBuf::from("/x"),
            source: std::io::Error::other("disk\nfull"),
        };
        assert_eq!(error.reason(), "cannot create /x: disk full");
    }
}
