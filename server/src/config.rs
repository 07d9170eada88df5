//! The server's validated configuration, built once from the command line in `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::api::Runtime;
use crate::extra_model_paths::ExtraModelPath;
use crate::model_folders::ModelFolders;
use crate::templates::TemplatesSource;

/// Bytes in one of the "GB" ComfyUI's memory flags take (`--reserve-vram`, `--cache-ram`): it multiplies them
/// by 1024³.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;

/// Which cache keeps node results between prompts (ComfyUI's `--cache-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheMode {
    /// Only the latest prompt's results (`--cache-classic`).
    Classic,
    /// The results of the last prompts while more than N are stored (`--cache-lru N`).
    Lru(usize),
    /// Results until available RAM falls under a threshold (`--cache-ram [ACTIVE [INACTIVE]]`, GB; the default):
    /// after each node older prompts' results go until ACTIVE GB are available, and when a prompt starts until
    /// INACTIVE GB are. `None` takes ComfyUI's default for the machine.
    RamPressure {
        /// ACTIVE, in GB.
        active_gb: Option<f64>,
        /// INACTIVE, in GB.
        inactive_gb: Option<f64>,
    },
    /// Nothing (`--cache-none`).
    None,
}

/// Which ComfyUI frontend `/` serves.
#[derive(Debug, Clone, PartialEq)]
pub enum FrontEnd {
    /// The pinned `comfyui-frontend-package` ([`crate::FRONTEND_VERSION`]), cached under `DATA_DIR/frontend/`
    /// and downloaded from `wheel_url` the first time (the `kiln` default; `--front-end-wheel-url`).
    Pinned {
        /// Where the wheel is downloaded from; it must match the pinned sha256 wherever it comes from.
        wheel_url: String,
    },
    /// A built frontend folder (`--front-end-root`: the `static` folder of `comfyui-frontend-package`).
    Root(PathBuf),
    /// None (`--disable-front-end`): `/` says how to get one.
    Disabled,
}

/// How Kiln computes: ComfyUI's device and memory flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeConfig {
    /// Compute on the CPU even when a GPU is present (`--cpu`).
    pub force_cpu: bool,
    /// The CUDA device to use (`--cuda-device`).
    pub cuda_device: usize,
    /// Device memory left free for other programs, in GB (`--reserve-vram`); the memory manager's budget is
    /// the device's memory minus this. `None`: 256 MiB.
    pub reserve_vram_gb: Option<f64>,
    /// Keep weights in page-locked (pinned) host memory, so they stream at the speed of the PCIe link
    /// (`--disable-pinned-memory` turns it off).
    pub pinned_memory: bool,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        ComputeConfig {
            force_cpu: false,
            cuda_device: 0,
            reserve_vram_gb: None,
            pinned_memory: true,
        }
    }
}

/// What a process does (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcessRole {
    /// Everything in one process, with the database to itself (the default).
    #[default]
    All,
    /// An API node of a cluster on Postgres: serves the clients and runs no prompt.
    Api,
    /// A worker of a cluster on Postgres: runs the prompts it claims from the shared queue; its HTTP port
    /// answers only the probes and `/metrics`.
    Worker,
}

impl ProcessRole {
    /// Whether the process is one of several on a shared database.
    pub fn in_cluster(self) -> bool {
        self != ProcessRole::All
    }
}

/// How a worker of a cluster claims and holds prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims {
    /// How long a claim lasts without a heartbeat (`--worker-lease`): a prompt whose worker died is taken
    /// back after this.
    pub lease: std::time::Duration,
    /// How many times a prompt may be claimed (`--max-attempts`): a prompt whose worker died runs again until
    /// it has had this many, and is then recorded as interrupted.
    pub max_attempts: u32,
    /// How long a prompt may wait while the worker takes later prompts whose model files it holds
    /// (`--affinity-wait`; zero keeps strict order).
    pub affinity_wait: std::time::Duration,
}

impl Default for Claims {
    fn default() -> Claims {
        Claims {
            lease: std::time::Duration::from_secs(10),
            max_attempts: 1,
            affinity_wait: std::time::Duration::from_secs(5),
        }
    }
}

/// Where Kiln keeps its queue, history and prompt counter.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// The embedded SQLite database, `DATA_DIR/kiln.sqlite` (the default).
    Embedded,
    /// A Postgres database (`--database-url postgres://…`).
    Postgres(String),
}

impl Database {
    /// Reads `--database-url`: a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Database, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Database::Postgres(url.to_owned()))
        } else {
            Err(format!(
                "--database-url takes a postgres:// URL, not {:?} (without it, Kiln keeps its state in the \
                 embedded SQLite database DATA_DIR/kiln.sqlite)",
                url.split(':').next().unwrap_or_default()
            ))
        }
    }
}

impl std::fmt::Debug for Database {
    /// Never shows the URL: it may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Embedded => f.write_str("Embedded"),
            Database::Postgres(_) => f.write_str("Postgres(..)"),
        }
    }
}

/// `arg` with the password of a URL in it (`scheme://user:password@host…`) and the values of its query keys
/// that name a secret, a token or a password (`--store s3://…?secret_access_key=…`) replaced by `***`, for the
/// command line Kiln reports.
pub fn hide_password(arg: &str) -> String {
    let arg = hide_query_secrets(arg);
    let Some(scheme_end) = arg.find("://") else { return arg };
    let authority_start = scheme_end + 3;
    let authority_end =
        arg[authority_start..].find('/').map_or(arg.len(), |end| authority_start + end);
    let authority = &arg[authority_start..authority_end];
    let Some(at) = authority.rfind('@') else { return arg };
    let Some(colon) = authority[..at].find(':') else { return arg };
    let password = authority_start + colon + 1..authority_start + at;
    format!("{}***{}", &arg[..password.start], &arg[password.end..])
}

/// A URL's query with the values of keys naming a secret, a token or a password replaced by `***`.
fn hide_query_secrets(arg: &str) -> String {
    let Some((before, query)) = arg.split_once('?').filter(|(before, _)| before.contains("://"))
    else {
        return arg.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _))
                if ["secret", "token", "password"]
                    .iter()
                    .any(|word| key.to_ascii_lowercase().contains(word)) =>
            {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}?{}", pairs.join("&"))
}

/// Everything the server needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// The addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Where Kiln keeps its own state.
    pub data_dir: PathBuf,
    /// The database of the queue, the history and the prompt counter.
    pub database: Database,
    /// The object store of inputs, outputs and temp files (`--store`), beside the local folders.
    pub store: Option<String>,
    /// Input files (uploads, LoadImage).
    pub input_dir: PathBuf,
    /// Output files (SaveImage).
    pub output_dir: PathBuf,
    /// Temporary files (PreviewImage).
    pub temp_dir: PathBuf,
    /// User data and settings.
    pub user_dir: PathBuf,
    /// Model folders (`checkpoints/`, `loras/`, ...).
    pub models_dir: PathBuf,
    /// Directories added to the model folders by `--extra-model-paths-config` files, in the order given.
    pub extra_model_paths: Vec<ExtraModelPath>,
    /// The request body limit in bytes.
    pub max_upload_size: u64,
    /// The node result cache.
    pub cache: CacheMode,
    /// The compute device and its memory.
    pub compute: ComputeConfig,
    /// `--preview-method`: latent previews while sampling, unless a prompt's `extra_data.preview_method` says
    /// otherwise.
    pub preview_method: kiln_engine::nodes::PreviewMethod,
    /// The ComfyUI frontend served at `/`.
    pub front_end: FrontEnd,
    /// The workflow templates served at `/templates/` for the frontend's template browser, downloaded once from
    /// this source into `DATA_DIR/templates/` (in the background); `None`: no templates (`--disable-front-end`).
    pub templates: Option<TemplatesSource>,
    /// `--enable-cors-header`: answer every origin with this `Access-Control-Allow-Origin` instead of refusing
    /// cross-origin requests to a loopback host.
    pub cors_origin: Option<String>,
    /// The API surface to mount.
    pub runtime: Runtime,
    /// The cloud runtime's issuer (`--issuer`): its public URL, without a trailing slash; tokens carry it as
    /// `iss`.
    pub issuer: String,
    /// Test and development only: client metadata documents may be fetched over `http` from loopback hosts
    /// (`--cimd-allow-loopback-http`; refused unless the issuer itself is loopback).
    pub cimd_allow_loopback_http: bool,
    /// The key every API request must carry on the local runtime (`--api-key-file`), as `X-API-Key` or a bearer
    /// token; `None`: anonymous requests, as ComfyUI.
    pub api_key: Option<String>,
    /// What this process does (`--role`).
    pub role: ProcessRole,
    /// How a worker of a cluster claims and holds prompts.
    pub claims: Claims,
    /// The command line, reported by `/api/system_stats`.
    pub argv: Vec<String>,
}

impl Config {
    /// A configuration with every directory under `data_dir` (as `kiln --data-dir` lays them out).
    pub fn under(data_dir: PathBuf, listen: Vec<SocketAddr>, argv: Vec<String>) -> Config {
        Config {
            listen,
            input_dir: data_dir.join("input"),
            output_dir: data_dir.join("output"),
            temp_dir: data_dir.join("temp"),
            user_dir: data_dir.join("user"),
            models_dir: data_dir.join("models"),
            extra_model_paths: Vec::new(),
            data_dir,
            database: Database::Embedded,
            store: None,
            max_upload_size: 100 * 1024 * 1024,
            cache: CacheMode::RamPressure { active_gb: None, inactive_gb: None },
            compute: ComputeConfig::default(),
            preview_method: kiln_engine::nodes::PreviewMethod::None,
            // Not the binary's default (the pinned frontend, downloaded): a `Config` built in code reaches no
            // network unless it asks to.
            front_end: FrontEnd::Disabled,
            templates: None,
            cors_origin: None,
            runtime: Runtime::Local,
            issuer: "http://127.0.0.1:8188".to_owned(),
            cimd_allow_loopback_http: false,
            api_key: None,
            role: ProcessRole::All,
            claims: Claims::default(),
            argv,
        }
    }

    /// The model folders, built as ComfyUI's `main.py` builds them: its folders under `models_dir`
    /// (`custom_nodes` and `datasets` under `data_dir`), then the extra model paths in order, then the output
    /// folders model-saving nodes write to.
    pub(crate) fn model_folders(&self) -> ModelFolders {
        let mut folders = ModelFolders::comfyui(&self.models_dir, &self.data_dir);
        for extra in &self.extra_model_paths {
            folders.add(&extra.folder, extra.path.clone(), extra.is_default);
        }
        for (folder, dir) in [
            ("checkpoints", "checkpoints"),
            ("clip", "clip"),
            ("vae", "vae"),
            ("diffusion_models", "diffusion_models"),
            ("loras", "loras"),
        ] {
            folders.add(folder, self.output_dir.join(dir), false);
        }
        folders
    }
}

/// Checks an issuer URL (`--issuer`): absolute `https` (or `http` on a loopback host, for development and
/// tests), with a host, without user-info, path, query or fragment. Clients compare it byte for byte, so it is used
/// exactly as given.
pub fn check_issuer(issuer: &str) -> Result<(), String> {
    let url =
        url::Url::parse(issuer).map_err(|e| format!("`{issuer}` is not an absolute URL: {e}"))?;
    let host = url.host_str().unwrap_or("");
    if host.is_empty() || !url.username().is_empty() || url.password().is_some() {
        return Err(format!("`{issuer}` must name a host and no user-info"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{issuer}` must not have a query or a fragment"));
    }
    if url.path() != "/" || issuer.ends_with('/') {
        return Err(format!(
            "`{issuer}` must be an origin without a path (https://host[:port]): Kiln serves its OAuth metadata and \
             endpoints at the origin's root"
        ));
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback_host(host) => Ok(()),
        _ => Err(format!(
            "`{issuer}` must be an https URL (plain http is allowed only on a loopback host): OAuth clients \
             send their codes and tokens to it"
        )),
    }
}

/// Whether a URL host is this machine: `localhost`, `[::1]` or 127/8.
fn is_loopback_host(host: &str) -> bool {
    matches!(host, "localhost" | "[::1]")
        || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether an issuer is plain `http` on a loopback host: a development or test server, the only kind that may
/// fetch client metadata documents over loopback `http` (`--cimd-allow-loopback-http`).
pub fn is_loopback_http(issuer: &str) -> bool {
    url::Url::parse(issuer)
        .is_ok_and(|url| url.scheme() == "http" && url.host_str().is_some_and(is_loopback_host))
}

#[cfg(test)]
mod issuer_tests {
    use super::{check_issuer, is_loopback_http};

    #[test]
    fn issuers_are_https_or_loopback_http() {
        for good in [
            "https://kiln.example.com",
            "https://kiln.example.com:8443",
            "http://127.0.0.1:8188",
            "http://localhost:1",
        ] {
            assert_eq!(check_issuer(good), Ok(()), "{good}");
        }
        for bad in [
            "http://kiln.example.com",
            "http://0.0.0.0:8188",
            "https://kiln.example.com?x=1",
            "https://kiln.example.com#f",
            "https://user@kiln.example.com",
            "kiln.example.com",
            "https://kiln.example.com/base",
        ] {
            assert!(check_issuer(bad).is_err(), "{bad}");
        }
        assert!(is_loopback_http("http://127.0.0.1:8188") && is_loopback_http("http://[::1]:1"));
        assert!(
            !is_loopback_http("https://127.0.0.1")
                && !is_loopback_http("http://127.0.0.1.evil.example")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::hide_password;

    #[test]
    fn reported_arguments_hide_passwords_and_secret_query_values() {
        assert_eq!(
            hide_password("postgres://kiln:pw@db:5432/kiln"),
            "postgres://kiln:***@db:5432/kiln"
        );
        assert_eq!(
            hide_password(
                "s3://b?endpoint=http://s3:9000&secret_access_key=abc&aws_session_token=t"
            ),
            "s3://b?endpoint=http://s3:9000&secret_access_key=***&aws_session_token=***"
        );
        assert_eq!(hide_password("--store"), "--store");
        assert_eq!(hide_password("a cat? token=1"), "a cat? token=1", "not a URL");
    }
}
