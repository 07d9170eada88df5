//! ComfyUI's official workflow templates, served at `/templates/{file}` for the frontend's template browser as
//! ComfyUI serves them: the pinned `comfyui-workflow-templates` packages (the manifest, the workflows with
//! `index.json`, and the six media bundles with the thumbnails), installed once into `DATA_DIR/templates/`.
//!
//! ComfyUI (`app/frontend_management.py`, `template_asset_handler`) maps every asset the manifest of
//! `comfyui-workflow-templates-core` names to its file: a `.json` in the `-json` package, anything else in the
//! media bundle the asset (or its template) names; `/templates/{file}` answers that file, and any other name
//! 404. Kiln does the same from the unpacked wheels.
//!
//! The packages download in the background (about 530 MB, most of it thumbnails), the manifest and the
//! workflows first, so the API and the frontend are up at once and the template browser fills as packages
//! land; each package is installed by `wheel` (sha256 checked, only ever complete). Offline, one line says so
//! and what is installed is served. `installed_templates_version` is reported once every package is there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower_http::services::ServeFile;

use crate::wheel::{self, Contents, InstallError};

/// The `comfyui-workflow-templates` version Kiln serves and is tested with (the meta package; Kiln installs the
/// packages it pins, listed in `PACKAGES`).
pub const TEMPLATES_VERSION: &str = "0.11.97";

/// Where the pinned wheels are downloaded from by default: PyPI's file host, each wheel under its own path.
const PYPI_FILES: &str = "https://files.pythonhosted.org/packages";

/// One pinned package of the templates.
struct Package {
    /// The distribution name and version, e.g. `comfyui-workflow-templates-json`, `0.1.123`.
    name: &'static str,
    version: &'static str,
    /// The wheel's file name, its path on PyPI's file host, its size in bytes and its sha256 (as PyPI publishes
    /// them).
    file: &'static str,
    pypi_path: &'static str,
    size: u64,
    sha256: &'static str,
    /// What Kiln takes out of the wheel.
    contents: Contents,
    /// What it holds for the asset map.
    role: Role,
}

/// What a package holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `manifest.json`: every template and its assets.
    Manifest,
    /// Every `.json` asset: the workflows, `index.json` and its translations.
    Workflows,
    /// The other assets of the templates of this bundle (named in the manifest): thumbnails and media.
    Media(&'static str),
}

/// The packages `comfyui-workflow-templates` 0.11.97 pulls in that `/templates/` serves, in the order they are
/// installed: the manifest and the workflows first (what the template browser lists), then the media bundles.
const PACKAGES: [Package; 8] = [
    Package {
        name: "comfyui-workflow-templates-core",
        version: "0.3.388",
        file: "comfyui_workflow_templates_core-0.3.388-py3-none-any.whl",
        pypi_path: "0d/29/cbd86e8e5293f7e0ac86a4c6f560d65f5154889207080c0e7911334c5ef9",
        size: 86_412,
        sha256: "dbe40be62475b2c0bfe04ef34a8863bab7f6555b8dd9b73b4bf175e230a0d3f9",
        contents: Contents {
            folder: "comfyui_workflow_templates_core",
            required: Some("manifest.json"),
        },
        role: Role::Manifest,
    },
    Package {
        name: "comfyui-workflow-templates-json",
        version: "0.1.123",
        file: "comfyui_workflow_templates_json-0.1.123-py3-none-any.whl",
        pypi_path: "db/82/2775d5337e7b393fed7aa9bcdfae6ab85776ee886f8bfb798a0fe40800a1",
        size: 4_210_768,
        sha256: "fc321960cfc4f52dddc3ee111f33489b167eb7958028eb5b6a7f3fa8865a385e",
        contents: Contents {
            folder: "comfyui_workflow_templates_json/templates",
            required: Some("index.json"),
        },
        role: Role::Workflows,
    },
    Package {
        name: "comfyui-workflow-templates-media-image",
        version: "0.3.160",
        file: "comfyui_workflow_templates_media_image-0.3.160-py3-none-any.whl",
        pypi_path: "bd/2e/aa57dc75cc2a73921d8472a398678e1ac40c011756ad0ab2dfe41eb0ba15",
        size: 89_401_690,
        sha256: "d4a5c5541c7088f6adb1c7da41f5d7c1c14a037eda6a61cd8b4b76c251faaa93",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_image/templates",
            required: None,
        },
        role: Role::Media("media-image"),
    },
    Package {
        name: "comfyui-workflow-templates-media-video",
        version: "0.3.101",
        file: "comfyui_workflow_templates_media_video-0.3.101-py3-none-any.whl",
        pypi_path: "e5/9e/49e1fbe9f05df7e4410a8d485af2a2d6fe80b247d44b3bfa7166c54012ef",
        size: 104_342_671,
        sha256: "6270fd61c8c3931b6f0031abac7d4c90ced624de6c7918bff85b89e6c3d7493c",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_video/templates",
            required: None,
        },
        role: Role::Media("media-video"),
    },
    Package {
        name: "comfyui-workflow-templates-media-other",
        version: "0.3.229",
        file: "comfyui_workflow_templates_media_other-0.3.229-py3-none-any.whl",
        pypi_path: "a7/46/feed5492a2def46fee71a52fcbb3b7443a048e402c40bedfaaebcc6fa234",
        size: 89_097_925,
        sha256: "ce3d98fa9d84b914c335fe5c9bc903cfefbe1932b1bc3cb6baef7f371b4bd435",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_other/templates",
            required: None,
        },
        role: Role::Media("media-other"),
    },
    Package {
        name: "comfyui-workflow-templates-media-api",
        version: "0.3.84",
        file: "comfyui_workflow_templates_media_api-0.3.84-py3-none-any.whl",
        pypi_path: "35/47/e4c723615b396f75893049af38a4b53bcb0e8944418819bb0e0d72f342e8",
        size: 100_148_800,
        sha256: "c2d6a5999ac39e4f37f47ae231c92557defe5addb2cc6ab5c11410b4d5a2910a",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_api/templates",
            required: None,
        },
        role: Role::Media("media-api"),
    },
    Package {
        name: "comfyui-workflow-templates-media-assets-01",
        version: "0.1.48",
        file: "comfyui_workflow_templates_media_assets_01-0.1.48-py3-none-any.whl",
        pypi_path: "7c/4c/39858b7dd6036fae44e15baf6eb5e55671291d25b9e0931bc0956ce12055",
        size: 94_172_110,
        sha256: "7733ed12867e95e6b8b39be20bcc73579c28e97e5a44086ffb977cc2c1c78c43",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_assets_01/templates",
            required: None,
        },
        role: Role::Media("media-assets-01"),
    },
    Package {
        name: "comfyui-workflow-templates-media-assets-02",
        version: "0.1.24",
        file: "comfyui_workflow_templates_media_assets_02-0.1.24-py3-none-any.whl",
        pypi_path: "20/7b/59339961df40028d0df63d13b589e7dd19346029f3b7fc10f8e60330b536",
        size: 48_237_509,
        sha256: "ddc94f46da4987ec6e9a4ced6007eaaca126899beea6242ece786e49cd14b065",
        contents: Contents {
            folder: "comfyui_workflow_templates_media_assets_02/templates",
            required: None,
        },
        role: Role::Media("media-assets-02"),
    },
];

/// Where the pinned wheels come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatesSource {
    /// PyPI (the default).
    PyPi,
    /// A folder URL holding the wheels under their file names, e.g. a mirror (`--templates-wheels-url`); the
    /// pinned sha256 applies wherever they come from.
    Mirror(String),
}

impl TemplatesSource {
    fn wheel(&self, package: &Package) -> wheel::Wheel {
        let url = match self {
            TemplatesSource::PyPi => format!("{PYPI_FILES}/{}/{}", package.pypi_path, package.file),
            TemplatesSource::Mirror(base) => {
                format!("{}/{}", base.trim_end_matches('/'), package.file)
            }
        };
        wheel::Wheel { url, sha256: package.sha256.to_owned() }
    }
}

/// Why the manifest could not be read.
#[derive(Debug, thiserror::Error)]
enum ManifestError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not JSON", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{} is not the manifest of comfyui-workflow-templates-core", path.display())]
    Shape { path: PathBuf },
}

/// The installed templates and the asset map `/templates/{file}` answers from.
pub(crate) struct Templates {
    dir: PathBuf,
    /// The packages: [`PACKAGES`] (tests use others).
    packages: &'static [Package],
    /// Asset file name → the package (index into `packages`) that holds it; set once the manifest is there.
    assets: OnceLock<HashMap<String, usize>>,
    installed: Vec<AtomicBool>,
}

impl Templates {
    /// The templates under `data_dir` as they are now (nothing is downloaded).
    pub(crate) fn open(data_dir: &Path) -> Templates {
        Templates::of(data_dir, &PACKAGES)
    }

    fn of(data_dir: &Path, packages: &'static [Package]) -> Templates {
        let templates = Templates {
            dir: data_dir.join("templates"),
            packages,
            assets: OnceLock::new(),
            installed: packages.iter().map(|_| AtomicBool::new(false)).collect(),
        };
        for (index, package) in packages.iter().enumerate() {
            if package.contents.installed_in(&templates.package_dir(package)) {
                templates.landed(index);
            }
        }
        templates
    }

    fn package_dir(&self, package: &Package) -> PathBuf {
        self.dir.join(format!("{}-{}", package.name, package.version))
    }

    /// Marks package `index` installed; reads the asset map when it is the manifest.
    fn landed(&self, index: usize) {
        let package = &self.packages[index];
        if package.role == Role::Manifest {
            let dir = self.package_dir(package);
            match read_manifest(&dir.join("manifest.json"), self.packages) {
                Ok(assets) => {
                    let _ = self.assets.set(assets);
                }
                Err(error) => {
                    // Installed from a wheel of the pinned sha256, so only a damaged disk gets here: the folder
                    // goes, and the package is installed again.
                    tracing::warn!("{}; it is downloaded again", wheel::one_line(&error));
                    let _ = std::fs::remove_dir_all(&dir);
                    return;
                }
            }
        }
        self.installed[index].store(true, Ordering::Release);
    }

    /// The `comfyui-workflow-templates` version installed: every package is there.
    pub(crate) fn installed_version(&self) -> Option<&'static str> {
        let all = self.installed.iter().all(|i| i.load(Ordering::Acquire));
        all.then_some(TEMPLATES_VERSION)
    }

    /// The file that `/templates/{name}` answers, when the asset is known and its package installed.
    fn file(&self, name: &str) -> Option<PathBuf> {
        let index = *self.assets.get()?.get(name)?;
        if !self.installed[index].load(Ordering::Acquire) {
            return None;
        }
        // Names come from the manifest of a pinned package (some in a folder: `logo/bfl.png`); still, nothing but
        // a relative path inside the package's folder is served.
        let inside =
            Path::new(name).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        inside.then(|| self.package_dir(&self.packages[index]).join(name))
    }

    /// Installs the packages that are not there yet, from `source`, one after the other (the manifest and the
    /// workflows first), with one progress bar; the first failure ends it with one log line.
    pub(crate) async fn install_missing(self: Arc<Templates>, source: TemplatesSource) {
        let missing: Vec<usize> = (0..self.packages.len())
            .filter(|&i| !self.installed[i].load(Ordering::Acquire))
            .collect();
        if missing.is_empty() {
            tracing::info!(
                "serving the workflow templates (comfyui-workflow-templates {TEMPLATES_VERSION}) from {}",
                self.dir.display()
            );
            self.remove_other_versions();
            return;
        }
        let bytes: u64 = missing.iter().map(|&i| self.packages[i].size).sum();
        tracing::info!(
            "downloading the workflow templates (comfyui-workflow-templates {TEMPLATES_VERSION}: {} packages, \
             {} MB) once, in the background, into {}; the template browser fills as they land",
            missing.len(),
            bytes.div_ceil(1_000_000),
            self.dir.display()
        );
        let bar = wheel::progress_bar("workflow templates", Some(bytes));
        let mut files = 0;
        for index in missing {
            let package = &self.packages[index];
            let wheel = source.wheel(package);
            match wheel::install(&wheel, package.contents, &self.package_dir(package), &bar).await {
                Ok(count) => {
                    files += count;
                    self.landed(index);
                }
                Err(error) => {
                    bar.abandon();
                    tracing::warn!("{}", advice(package, &error));
                    return;
                }
            }
        }
        bar.finish();
        tracing::info!(
            "installed the workflow templates (comfyui-workflow-templates {TEMPLATES_VERSION}, {files} files, \
             sha256 checked) in {}",
            self.dir.display()
        );
        self.remove_other_versions();
    }

    /// Removes the packages of versions Kiln no longer pins (what an earlier Kiln installed), once every pinned
    /// one is in: each is tens of megabytes that nothing serves.
    fn remove_other_versions(&self) {
        let current: Vec<PathBuf> = self.packages.iter().map(|p| self.package_dir(p)).collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let ours = self.packages.iter().any(|p| {
                let name = entry.file_name();
                name.to_string_lossy()
                    .strip_prefix(p.name)
                    .is_some_and(|rest| rest.starts_with('-'))
            });
            if ours && path.is_dir() && !current.contains(&path) {
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => tracing::info!(
                        "removed {}, a templates package Kiln no longer pins",
                        path.display()
                    ),
                    Err(error) => tracing::warn!("cannot remove {}: {error}", path.display()),
                }
            }
        }
    }
}

/// The one line a user reads when a templates package cannot be had.
fn advice(package: &Package, error: &InstallError) -> String {
    format!(
        "cannot download the workflow templates ({} {}: {}): the template browser shows only what is installed; \
         run once with network access or pass --templates-wheels-url URL (a folder holding the pinned wheels); \
         the API and the frontend work without them",
        package.name,
        package.version,
        error.reason()
    )
}

/// The asset map of the manifest at `path`, as ComfyUI's `get_asset_path` resolves it: a `.json` asset is in the
/// workflows package, any other in the media bundle the asset names, or else its template's bundle. Assets of
/// a bundle Kiln does not pin are left out.
fn read_manifest(
    path: &Path,
    packages: &[Package],
) -> Result<HashMap<String, usize>, ManifestError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ManifestError::Read { path: path.to_owned(), source })?;
    let shape = || ManifestError::Shape { path: path.to_owned() };
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .map_err(|source| ManifestError::Parse { path: path.to_owned(), source })?;
    let templates = manifest.get("templates").and_then(|t| t.as_array()).ok_or_else(shape)?;
    let package_of = |role: Role| packages.iter().position(|p| p.role == role);
    let workflows = package_of(Role::Workflows).ok_or_else(shape)?;
    let mut assets = HashMap::new();
    for template in templates {
        let bundle = template.get("bundle").and_then(|b| b.as_str()).ok_or_else(shape)?;
        let files = template.get("assets").and_then(|a| a.as_array()).ok_or_else(shape)?;
        for asset in files {
            let name = asset.get("filename").and_then(|f| f.as_str()).ok_or_else(shape)?;
            let package = if name.ends_with(".json") {
                Some(workflows)
            } else {
                let bundle = asset.get("bundle").and_then(|b| b.as_str()).unwrap_or(bundle);
                packages.iter().position(|p| matches!(p.role, Role::Media(b) if b == bundle))
            };
            if let Some(package) = package {
                assets.insert(name.to_owned(), package);
            }
        }
    }
    Ok(assets)
}

/// Adds `/templates/{file}` to a router.
pub(crate) fn routes(router: Router, templates: Arc<Templates>) -> Router {
    router.route("/templates/{*file}", axum::routing::get(serve_asset).with_state(templates))
}

async fn serve_asset(
    State(templates): State<Arc<Templates>>,
    UrlPath(name): UrlPath<String>,
    request: Request,
) -> Response {
    let Some(file) = templates.file(&name) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match ServeFile::new(file).try_call(request).await {
        Ok(response) => response.into_response(),
        Err(error) => {
            tracing::warn!("cannot read a workflow template file: {error}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt as _;

    use super::*;

    #[test]
    fn the_pins_are_consistent() {
        for package in &PACKAGES {
            let stem = package.name.replace('-', "_");
            assert_eq!(package.file, format!("{stem}-{}-py3-none-any.whl", package.version));
            assert!(package.contents.folder.starts_with(&stem), "{}", package.name);
            assert_eq!(package.sha256.len(), 64);
            if let Role::Media(bundle) = package.role {
                assert_eq!(package.name, format!("comfyui-workflow-templates-{bundle}"));
            }
        }
        let source = TemplatesSource::Mirror("http://127.0.0.1:9/wheels/".to_owned());
        assert_eq!(
            source.wheel(&PACKAGES[1]).url,
            "http://127.0.0.1:9/wheels/comfyui_workflow_templates_json-0.1.123-py3-none-any.whl"
        );
        assert!(TemplatesSource::PyPi.wheel(&PACKAGES[0]).url.starts_with(PYPI_FILES));
    }

    /// The tests serve kiln the wheels `pip download` fetches from tests/templates/requirements.txt; they must be
    /// the ones kiln pins, or kiln would refuse them and the tests would not run the download path.
    #[test]
    fn the_tests_download_the_pinned_wheels() {
        let requirements =
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/templates/requirements.txt");
        let text = std::fs::read_to_string(requirements).expect("requirements.txt");
        let pins: Vec<&str> =
            text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        let pin = |name: &str, version: &str, sha256: &str| {
            format!("{name}=={version} --hash=sha256:{sha256}")
        };
        assert!(pins[0].starts_with(&format!("comfyui-workflow-templates=={TEMPLATES_VERSION} ")));
        let expected: Vec<String> =
            PACKAGES.iter().map(|p| pin(p.name, p.version, p.sha256)).collect();
        assert_eq!(pins[1..], expected);
    }

    #[test]
    fn the_manifest_maps_json_to_the_workflows_and_media_to_their_bundles() {
        let dir = crate::wheel::tests::scratch("templates-manifest");
        let path = dir.join("manifest.json");
        let manifest = serde_json::json!({
            "manifest_version": 1,
            "bundles": {},
            "templates": [
                {"id": "a", "bundle": "media-image", "assets": [
                    {"filename": "a.json", "sha256": "0"},
                    {"filename": "a-1.webp", "sha256": "0"},
                    {"filename": "a-2.webp", "sha256": "0", "bundle": "media-assets-01"},
                ]},
                {"id": "index", "bundle": "media-other", "assets": [{"filename": "index.json", "sha256": "0"}]},
                {"id": "b", "bundle": "somewhere-new", "assets": [{"filename": "b-1.webp", "sha256": "0"}]},
            ],
        });
        std::fs::write(&path, manifest.to_string()).expect("manifest");
        let assets = read_manifest(&path, &PACKAGES).expect("reads");
        let name = |file: &str| assets.get(file).map(|&i| PACKAGES[i].name);
        assert_eq!(name("a.json"), Some("comfyui-workflow-templates-json"));
        assert_eq!(name("index.json"), Some("comfyui-workflow-templates-json"));
        assert_eq!(name("a-1.webp"), Some("comfyui-workflow-templates-media-image"));
        assert_eq!(name("a-2.webp"), Some("comfyui-workflow-templates-media-assets-01"));
        assert_eq!(name("b-1.webp"), None, "a bundle Kiln does not pin");

        std::fs::write(&path, "{\"templates\": 3}").expect("manifest");
        let error = read_manifest(&path, &PACKAGES).expect_err("refused");
        assert!(error.to_string().contains("is not the manifest"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Fake packages shaped like the pinned ones (manifest, workflows, two media bundles), their wheels, and
    /// the name of the one a test can leave off the mirror.
    fn fakes() -> (&'static [Package], Vec<(String, Vec<u8>)>) {
        use crate::wheel::tests::{sha256_hex, wheel_bytes};
        let manifest = serde_json::json!({"templates": [
            {"id": "index", "bundle": "media-other", "assets": [{"filename": "index.json", "sha256": "0"}]},
            {"id": "a", "bundle": "media-image", "assets": [
                {"filename": "a.json", "sha256": "0"},
                {"filename": "a-1.webp", "sha256": "0"},
                {"filename": "a-2.webp", "sha256": "0", "bundle": "media-video"},
                {"filename": "logo/a.png", "sha256": "0"},
            ]},
        ]})
        .to_string();
        let wheels = [
            ("core", vec![("core/manifest.json", manifest.as_bytes()), ("core/loader.py", b"x")]),
            ("json", vec![("json/templates/index.json", b"[]"), ("json/templates/a.json", b"{}")]),
            (
                "image",
                vec![
                    ("image/templates/a-1.webp", b"RIFF-1"),
                    ("image/templates/logo/a.png", b"PNG"),
                ],
            ),
            ("video", vec![("video/templates/a-2.webp", b"RIFF-2")]),
        ]
        .map(|(name, entries)| (format!("{name}-1.0-py3-none-any.whl"), wheel_bytes(&entries)));
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let package = |(file, bytes): &(String, Vec<u8>), folder, required, role| Package {
            name: leak(file.split('-').next().unwrap_or_default().to_owned()),
            version: "1.0",
            file: leak(file.clone()),
            pypi_path: "",
            size: bytes.len() as u64,
            sha256: leak(sha256_hex(bytes)),
            contents: Contents { folder, required },
            role,
        };
        let packages = vec![
            package(&wheels[0], "core", Some("manifest.json"), Role::Manifest),
            package(&wheels[1], "json/templates", Some("index.json"), Role::Workflows),
            package(&wheels[2], "image/templates", None, Role::Media("media-image")),
            package(&wheels[3], "video/templates", None, Role::Media("media-video")),
        ];
        (Box::leak(packages.into_boxed_slice()), wheels.into())
    }

    async fn get(router: &Router, path: &str) -> (StatusCode, Option<String>, Vec<u8>) {
        let request = Request::get(path).body(axum::body::Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("answer");
        let content_type = response
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, content_type, body.to_vec())
    }

    #[tokio::test]
    async fn templates_are_served_as_their_packages_land_and_a_failure_keeps_what_landed() {
        let data_dir = crate::wheel::tests::scratch("templates-install");
        let (packages, mut wheels) = fakes();
        // The mirror lacks the last media bundle: the install stops there, with what landed served.
        let video = wheels.pop().expect("video");
        let (mirror, requests) = kiln_tests::serve_files(wheels.clone()).await;
        let templates = Arc::new(Templates::of(&data_dir, packages));
        let router = routes(Router::new(), templates.clone());
        assert_eq!(get(&router, "/templates/index.json").await.0, StatusCode::NOT_FOUND);

        templates.clone().install_missing(TemplatesSource::Mirror(mirror)).await;
        assert_eq!(requests.load(Ordering::SeqCst), 3);
        assert_eq!(templates.installed_version(), None, "one package is missing");
        let (status, content_type, body) = get(&router, "/templates/index.json").await;
        assert_eq!(
            (status, content_type.as_deref(), &body[..]),
            (StatusCode::OK, Some("application/json"), &b"[]"[..])
        );
        let (status, content_type, body) = get(&router, "/templates/a-1.webp").await;
        assert_eq!(
            (status, content_type.as_deref(), &body[..]),
            (StatusCode::OK, Some("image/webp"), &b"RIFF-1"[..])
        );
        let (status, content_type, body) = get(&router, "/templates/logo/a.png").await;
        let logo = (StatusCode::OK, Some("image/png"), &b"PNG"[..]);
        assert_eq!((status, content_type.as_deref(), &body[..]), logo, "assets in a folder too");
        for missing in
            ["a-2.webp", "loader.py", "manifest.json", "nope.json", "../core/manifest.json"]
        {
            assert_eq!(
                get(&router, &format!("/templates/{missing}")).await.0,
                StatusCode::NOT_FOUND,
                "{missing}"
            );
        }

        // A later start downloads only what is missing.
        wheels.push(video);
        let (mirror, requests) = kiln_tests::serve_files(wheels).await;
        let templates = Arc::new(Templates::of(&data_dir, packages));
        templates.clone().install_missing(TemplatesSource::Mirror(mirror)).await;
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        assert_eq!(templates.installed_version(), Some(TEMPLATES_VERSION));
        let router = routes(Router::new(), templates);
        assert_eq!(get(&router, "/templates/a-2.webp").await.2, b"RIFF-2");

        // A package of a version no longer pinned goes once every pinned one is in; other folders stay.
        let old = data_dir.join("templates/core-0.9");
        std::fs::create_dir_all(&old).expect("old version");
        std::fs::create_dir_all(data_dir.join("templates/unrelated")).expect("other folder");
        let templates = Arc::new(Templates::of(&data_dir, packages));
        templates.install_missing(TemplatesSource::Mirror("http://127.0.0.1:1".to_owned())).await;
        assert!(!old.exists() && data_dir.join("templates/unrelated").exists());
        assert!(data_dir.join("templates/core-1.0/manifest.json").is_file());
        let _ = std::fs::remove_dir_all(&data_dir);
    }
}
