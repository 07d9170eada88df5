//! The ComfyUI frontend Kiln serves by default: the pinned `comfyui-frontend-package` wheel, downloaded once
//! into `DATA_DIR/frontend/` and checked against its pinned sha256.
//!
//! Invariant: `DATA_DIR/frontend/comfyui-frontend-package-<version>/` only ever exists complete. The wheel is
//! downloaded to a temporary file, its sha256 checked, its `static/` folder unpacked (and synced) into a
//! temporary folder, and that folder renamed into place; an interrupted or refused download leaves nothing a
//! later start would serve. A folder that is there is used as it is, without any request.

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

/// The `comfyui-frontend-package` version Kiln serves by default and is tested with.
pub const FRONTEND_VERSION: &str = "1.58.1";

/// Where the pinned wheel is downloaded from by default (PyPI).
pub const FRONTEND_WHEEL_URL: &str = "https://files.pythonhosted.org/packages/1d/7b/\
    dc5fda81cef8d299ab3ff4d3dc34e0c08bf72af546d5815ee7b9f08174f9/\
    comfyui_frontend_package-1.58.1-py3-none-any.whl";

/// The pinned wheel's sha256, as PyPI publishes it; a download that does not match is refused.
const FRONTEND_WHEEL_SHA256: &str =
    "37912597537a731a8f421179618a736c24184c5bdbfa327f38b2fb7c291852d9";

/// ComfyUI's default `--front-end-version`: the frontend that comes with the server.
const COMFYUI_DEFAULT_VERSION: &str = "comfyanonymous/ComfyUI@latest";

/// Where the frontend's files sit inside the wheel.
const STATIC_IN_WHEEL: &str = "comfyui_frontend_package/static";

/// How long to wait for a connection, and for the next bytes of the download.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A frontend wheel to install: the URL to fetch it from, the version it is, and the sha256 it must have.
#[derive(Debug, Clone)]
pub(crate) struct Wheel {
    pub(crate) url: String,
    pub(crate) version: String,
    pub(crate) sha256: String,
}

impl Wheel {
    /// The pinned wheel, fetched from `url` (PyPI or a mirror); the pinned sha256 applies wherever it comes from.
    pub(crate) fn pinned(url: &str) -> Wheel {
        Wheel {
            url: url.to_owned(),
            version: FRONTEND_VERSION.to_owned(),
            sha256: FRONTEND_WHEEL_SHA256.to_owned(),
        }
    }
}

/// Why the pinned frontend could not be installed.
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
    #[error("the wheel has no {STATIC_IN_WHEEL}/index.html")]
    NoIndex,
    #[error("unpacking stopped unexpectedly")]
    Unpack(#[source] tokio::task::JoinError),
}

impl InstallError {
    /// The one line a user reads: what failed, with its causes, and what to do about it.
    pub(crate) fn advice(&self) -> String {
        let mut reason = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            reason.push_str(": ");
            reason.push_str(&cause.to_string());
            source = cause.source();
        }
        let reason = reason.replace(['\n', '\r'], " ");
        format!(
            "cannot download the ComfyUI frontend ({reason}): pass --front-end-root DIR or run once with network \
             access; the API works without it"
        )
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io { what, path, source }
}

/// The folder that holds (or will hold) `wheel`'s frontend under `data_dir`.
pub(crate) fn install_dir(data_dir: &Path, wheel: &Wheel) -> PathBuf {
    data_dir.join("frontend").join(format!("comfyui-frontend-package-{}", wheel.version))
}

/// The installed frontend's folder: the cached copy when there is one (no request is made), otherwise the wheel
/// downloaded, checked and unpacked into place. Runs once at startup, before anything is served, so its few
/// directory operations are made in place; the unpacking runs on a blocking thread.
pub(crate) async fn ensure(data_dir: &Path, wheel: &Wheel) -> Result<PathBuf, InstallError> {
    let target = install_dir(data_dir, wheel);
    if target.join("index.html").is_file() {
        tracing::info!("serving the ComfyUI frontend {} from {}", wheel.version, target.display());
        return Ok(target);
    }
    let parent = target.parent().unwrap_or(data_dir).to_owned();
    std::fs::create_dir_all(&parent).map_err(io("create", &parent))?;
    remove_leftovers(&parent);
    let scratch = Scratch {
        wheel: parent.join(format!(".partial-{}.whl", std::process::id())),
        dir: parent.join(format!(".partial-{}", std::process::id())),
    };
    tracing::info!(
        "downloading the ComfyUI frontend (comfyui-frontend-package {}) once, from {} into {}",
        wheel.version,
        wheel.url,
        parent.display()
    );
    let found = download(&wheel.url, &scratch.wheel).await?;
    if !found.eq_ignore_ascii_case(&wheel.sha256) {
        return Err(InstallError::Hash {
            url: wheel.url.clone(),
            found,
            expected: wheel.sha256.clone(),
        });
    }
    let (archive, unpacked) = (scratch.wheel.clone(), scratch.dir.clone());
    let files = tokio::task::spawn_blocking(move || unpack(&archive, &unpacked))
        .await
        .map_err(InstallError::Unpack)??;
    if target.exists() {
        // Not a complete frontend (no index.html): someone else's leftover. Replace it.
        std::fs::remove_dir_all(&target).map_err(io("remove the incomplete", &target))?;
    }
    std::fs::rename(&scratch.dir, &target).map_err(io("move the frontend into", &target))?;
    // Make the rename itself durable, so a crash cannot lose it after we said it is installed.
    if let Ok(dir) = std::fs::File::open(&parent) {
        let _ = dir.sync_all();
    }
    tracing::info!(
        "installed the ComfyUI frontend {} ({files} files, sha256 checked) in {}",
        wheel.version,
        target.display()
    );
    Ok(target)
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

/// Streams `url` into `dest` (following up to five redirects) with a progress bar on a terminal; returns the
/// sha256 of what arrived, in hex.
async fn download(url: &str, dest: &Path) -> Result<String, InstallError> {
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
            return Err(InstallError::Status { url: url.to_owned(), status });
        }
        break response;
    };
    let length = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    let bar = progress_bar(length);
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

/// A download progress bar on stderr, cleared when dropped; drawn only when stderr is a terminal.
fn progress_bar(len: Option<u64>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr())
        .with_finish(ProgressFinish::AndClear);
    let template = "ComfyUI frontend {bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// Unpacks the wheel's `static/` folder into `into`, syncing each file; returns how many files it wrote.
fn unpack(wheel: &Path, into: &Path) -> Result<usize, InstallError> {
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
        let Ok(relative) = path.strip_prefix(STATIC_IN_WHEEL) else { continue };
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
    if !into.join("index.html").is_file() {
        return Err(InstallError::NoIndex);
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

/// What ComfyUI's `--front-end-version OWNER/REPO@VERSION` asks of Kiln.
#[derive(Debug, Clone, PartialEq)]
pub enum FrontEndVersion {
    /// ComfyUI's default (`comfyanonymous/ComfyUI@latest`) or the pinned version itself: the pinned frontend.
    Pinned,
    /// Another version: Kiln serves only the frontend it is tested with, so the pinned one is served instead
    /// (as ComfyUI falls back to its default frontend when a version cannot be had).
    Other(String),
}

impl FrontEndVersion {
    /// Parses ComfyUI's version string; anything not shaped `OWNER/REPO@VERSION` is refused, as ComfyUI does.
    pub fn parse(value: &str) -> Result<FrontEndVersion, String> {
        let invalid = || {
            format!(
                "`{value}` is not a frontend version string (OWNER/REPO@VERSION, e.g. \
                 Comfy-Org/ComfyUI_frontend@{FRONTEND_VERSION})"
            )
        };
        let (repo, version) = value.split_once('@').ok_or_else(invalid)?;
        let (owner, name) = repo.split_once('/').ok_or_else(invalid)?;
        let word = |s: &str, extra: &str| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        // `X.Y.Z`, with an optional `v` before and a suffix of word characters after (`1.2.3-rc1`).
        let semver = |v: &str| {
            let mut rest = v.strip_prefix('v').unwrap_or(v);
            for part in 0..3 {
                let digits =
                    rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                if digits == 0 {
                    return false;
                }
                rest = &rest[digits..];
                if part < 2 {
                    let Some(after) = rest.strip_prefix('.') else { return false };
                    rest = after;
                }
            }
            rest.is_empty() || word(rest, "-._")
        };
        if !(word(owner, "-")
            && word(name, "_.-")
            && (semver(version) || version == "latest" || version == "prerelease"))
        {
            return Err(invalid());
        }
        let pinned_version = version.strip_prefix('v').unwrap_or(version) == FRONTEND_VERSION;
        if value == COMFYUI_DEFAULT_VERSION
            || (repo.eq_ignore_ascii_case("Comfy-Org/ComfyUI_frontend") && pinned_version)
        {
            Ok(FrontEndVersion::Pinned)
        } else {
            Ok(FrontEndVersion::Other(value.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;

    use super::*;

    /// A wheel holding `entries` (name, contents), deflated.
    fn wheel_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, contents) in entries {
            zip.start_file(*name, options).expect("entry");
            zip.write_all(contents).expect("contents");
        }
        zip.finish().expect("zip").into_inner()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("kiln-frontend-package-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn unpack_takes_only_the_static_folder() {
        let dir = scratch("unpack");
        let wheel = dir.join("w.whl");
        std::fs::write(
            &wheel,
            wheel_bytes(&[
                ("comfyui_frontend_package/__init__.py", b"x"),
                ("comfyui_frontend_package/static/index.html", b"<html>"),
                ("comfyui_frontend_package/static/assets/app.js", b"app"),
                ("comfyui_frontend_package-1.58.1.dist-info/RECORD", b"r"),
            ]),
        )
        .expect("wheel");
        let into = dir.join("out");
        assert_eq!(unpack(&wheel, &into).expect("unpacks"), 2);
        assert_eq!(std::fs::read(into.join("index.html")).expect("index"), b"<html>");
        assert_eq!(std::fs::read(into.join("assets/app.js")).expect("asset"), b"app");
        assert!(!into.join("__init__.py").exists() && !into.join("RECORD").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unpack_refuses_entries_that_escape_and_wheels_without_an_index() {
        let dir = scratch("unsafe");
        let wheel = dir.join("w.whl");
        std::fs::write(
            &wheel,
            wheel_bytes(&[
                ("comfyui_frontend_package/static/index.html", b"<html>"),
                ("comfyui_frontend_package/static/../../../escaped.txt", b"no"),
            ]),
        )
        .expect("wheel");
        let error = unpack(&wheel, &dir.join("out")).expect_err("refused");
        assert!(
            matches!(error, InstallError::UnsafeEntry(ref n) if n.contains("escaped")),
            "{error}"
        );
        assert!(!dir.join("escaped.txt").exists());

        let sideways = "comfyui_frontend_package/static/../static2/x.txt";
        std::fs::write(
            &wheel,
            wheel_bytes(&[
                ("comfyui_frontend_package/static/index.html", b"<html>"),
                (sideways, b"no"),
            ]),
        )
        .expect("wheel");
        // zip resolves it to `comfyui_frontend_package/static2/x.txt`: outside `static/`, so not unpacked.
        assert_eq!(unpack(&wheel, &dir.join("out1")).expect("unpacks"), 1);
        assert!(!dir.join("static2").exists() && !dir.join("out1/static2").exists());

        std::fs::write(&wheel, wheel_bytes(&[("comfyui_frontend_package/__init__.py", b"x")]))
            .expect("wheel");
        let error = unpack(&wheel, &dir.join("out2")).expect_err("refused");
        assert!(matches!(error, InstallError::NoIndex), "{error}");

        std::fs::write(&wheel, b"not a zip").expect("wheel");
        let error = unpack(&wheel, &dir.join("out3")).expect_err("refused");
        assert!(matches!(error, InstallError::Zip(_)), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[tokio::test]
    async fn ensure_installs_a_matching_wheel_once_then_uses_the_cached_copy() {
        let data_dir = scratch("ensure");
        let bytes = wheel_bytes(&[
            ("comfyui_frontend_package/static/index.html", b"<html>pinned</html>"),
            ("comfyui_frontend_package/static/assets/app.js", b"app"),
        ]);
        let (url, requests) = kiln_tests::serve_wheel(bytes.clone()).await;
        let wheel = Wheel { url, version: "0.0.1-test".to_owned(), sha256: sha256_hex(&bytes) };

        let root = ensure(&data_dir, &wheel).await.expect("installs");
        assert_eq!(root, data_dir.join("frontend/comfyui-frontend-package-0.0.1-test"));
        assert_eq!(std::fs::read(root.join("index.html")).expect("index"), b"<html>pinned</html>");
        assert_eq!(std::fs::read(root.join("assets/app.js")).expect("asset"), b"app");
        let mut left: Vec<_> = std::fs::read_dir(data_dir.join("frontend"))
            .expect("frontend dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["comfyui-frontend-package-0.0.1-test"], "no temporary file is left");
        assert_eq!(requests.load(Ordering::SeqCst), 1);

        assert_eq!(ensure(&data_dir, &wheel).await.expect("cached"), root);
        assert_eq!(requests.load(Ordering::SeqCst), 1, "the cached copy is used without a request");
        let _ = std::fs::remove_dir_all(&data_dir);
    }

    #[tokio::test]
    async fn a_leftover_of_a_killed_install_is_removed_and_never_served() {
        let data_dir = scratch("leftover");
        let bytes = wheel_bytes(&[("comfyui_frontend_package/static/index.html", b"<html>")]);
        let (url, _) = kiln_tests::serve_wheel(bytes.clone()).await;
        let wheel = Wheel { url, version: "0.0.2-test".to_owned(), sha256: sha256_hex(&bytes) };
        // What a kill -9 during unpacking leaves: a partial folder, a partial wheel, and a target folder without
        // index.html (as if someone emptied it by hand).
        let frontend = data_dir.join("frontend");
        std::fs::create_dir_all(frontend.join(".partial-1/assets")).expect("partial dir");
        std::fs::write(frontend.join(".partial-1.whl"), b"half").expect("partial wheel");
        std::fs::create_dir_all(install_dir(&data_dir, &wheel).join("assets")).expect("target");

        let root = ensure(&data_dir, &wheel).await.expect("installs");
        assert!(root.join("index.html").is_file());
        assert!(!root.join("assets").exists(), "the incomplete folder was replaced, not merged");
        assert!(!frontend.join(".partial-1").exists() && !frontend.join(".partial-1.whl").exists());
        let _ = std::fs::remove_dir_all(&data_dir);
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
    fn the_advice_is_one_line_with_the_causes_and_what_to_do() {
        let error = InstallError::Io {
            what: "create",
            path: PathBuf::from("/x"),
            source: std::io::Error::other("disk\nfull"),
        };
        let advice = error.advice();
        assert_eq!(
            advice,
            "cannot download the ComfyUI frontend (cannot create /x: disk full): pass --front-end-root DIR or \
             run once with network access; the API works without it"
        );
    }

    #[test]
    fn front_end_versions_follow_comfyuis_syntax() {
        use FrontEndVersion::{Other, Pinned};
        let parse = FrontEndVersion::parse;
        assert_eq!(parse("comfyanonymous/ComfyUI@latest"), Ok(Pinned));
        assert_eq!(parse("Comfy-Org/ComfyUI_frontend@1.58.1"), Ok(Pinned));
        assert_eq!(parse("comfy-org/comfyui_frontend@v1.58.1"), Ok(Pinned));
        assert_eq!(
            parse("Comfy-Org/ComfyUI_frontend@latest"),
            Ok(Other("Comfy-Org/ComfyUI_frontend@latest".into()))
        );
        assert_eq!(
            parse("Comfy-Org/ComfyUI_frontend@1.2.3-rc1"),
            Ok(Other("Comfy-Org/ComfyUI_frontend@1.2.3-rc1".into()))
        );
        assert_eq!(parse("someone/fork@1.58.1"), Ok(Other("someone/fork@1.58.1".into())));
        for bad in [
            "1.58.1",
            "Comfy-Org@1.58.1",
            "Comfy-Org/ComfyUI_frontend@newest",
            "a/b@1.2",
            "/x@1.2.3",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains("not a frontend version string"), "{error}");
        }
    }
}
