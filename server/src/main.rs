//! The `kiln` binary: parses the command line, sets up logging and serves until SIGTERM or Ctrl-C, then drains.

use std::io::IsTerminal as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kiln_engine::nodes::PreviewMethod;
use kiln_server::{
    CacheMode, ComputeConfig, Config, Database, FRONTEND_VERSION, FRONTEND_WHEEL_URL, FrontEnd,
    FrontEndVersion, LogRing, ProcessRole, Runtime, Server, TemplatesSource,
};
use tracing::info;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

mod account_command;
mod model_command;

/// A ComfyUI-compatible workflow server.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, args_conflicts_with_subcommands = true)]
struct Args {
    /// A tool to run instead of the server.
    #[command(subcommand)]
    command: Option<Command>,
    /// Addresses to listen on, comma-separated. Without a value: 0.0.0.0 (all IPv4 interfaces).
    #[arg(long, num_args = 0..=1, default_value = "127.0.0.1", default_missing_value = "0.0.0.0")]
    listen: String,
    /// The port to listen on (0 picks a free one; the log says which).
    #[arg(long, default_value_t = 8188)]
    port: u16,
    /// Where Kiln keeps its state; the other directories default to folders inside it.
    #[arg(long, default_value = "kiln-data")]
    data_dir: PathBuf,
    /// The input directory (uploads, LoadImage). Default: DATA_DIR/input.
    #[arg(long)]
    input_directory: Option<PathBuf>,
    /// The output directory (SaveImage). Default: DATA_DIR/output.
    #[arg(long)]
    output_directory: Option<PathBuf>,
    /// The temp directory (PreviewImage). Default: DATA_DIR/temp.
    #[arg(long)]
    temp_directory: Option<PathBuf>,
    /// The user directory (settings, user data). Default: DATA_DIR/user.
    #[arg(long)]
    user_directory: Option<PathBuf>,
    /// Serve the ComfyUI frontend from this folder (the `static` folder of `comfyui-frontend-package`) instead
    /// of the pinned one Kiln downloads once into DATA_DIR/frontend.
    #[arg(long)]
    front_end_root: Option<PathBuf>,
    /// ComfyUI's frontend version string (OWNER/REPO@VERSION). Kiln serves the comfyui-frontend-package it is
    /// tested with; another version is reported and the pinned one served.
    #[arg(long, default_value = "comfyanonymous/ComfyUI@latest", value_parser = FrontEndVersion::parse)]
    front_end_version: FrontEndVersion,
    /// Where to download the pinned frontend wheel from (e.g. a PyPI mirror); it must match the pinned sha256.
    #[arg(long, value_name = "URL", default_value = FRONTEND_WHEEL_URL)]
    front_end_wheel_url: String,
    /// Serve no frontend: download nothing (neither the frontend nor the workflow templates), serve only the API.
    #[arg(long, conflicts_with = "front_end_root")]
    disable_front_end: bool,
    /// Where to download the pinned workflow-template wheels from: a folder URL holding them under their file
    /// names (e.g. a PyPI mirror); they must match the pinned sha256. Default: PyPI.
    #[arg(long, value_name = "URL")]
    templates_wheels_url: Option<String>,
    /// Allow cross-origin requests from ORIGIN (`*` when given without a value) instead of refusing
    /// cross-origin requests to a loopback host.
    #[arg(long, num_args = 0..=1, default_missing_value = "*")]
    enable_cors_header: Option<String>,
    /// Keep only the latest prompt's node results.
    #[arg(long, group = "cache_mode")]
    cache_classic: bool,
    /// Keep the node results of the last prompts while more than N are stored.
    #[arg(long, value_name = "N", group = "cache_mode")]
    cache_lru: Option<usize>,
    /// Keep node results while RAM is available: after each node, older prompts' results go until ACTIVE GB
    /// are available (default: 10% of RAM, 2 to 10 GB); when a prompt starts, until INACTIVE GB are (default:
    /// RAM, at most 128 GB).
    #[arg(long, value_names = ["ACTIVE", "INACTIVE"], num_args = 0..=2, group = "cache_mode")]
    cache_ram: Option<Vec<f64>>,
    /// Keep no node results: every prompt runs every node.
    #[arg(long, group = "cache_mode")]
    cache_none: bool,
    /// The largest request body in MB.
    #[arg(long, default_value_t = 100.0)]
    max_upload_size: f64,
    /// Also search the model folders of a ComfyUI `extra_model_paths.yaml` (repeatable; several files may
    /// follow one flag).
    #[arg(long, value_name = "PATH", num_args = 1.., action = clap::ArgAction::Append)]
    extra_model_paths_config: Vec<PathBuf>,
    /// Compute on the CPU even when a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// The CUDA device to compute on.
    #[arg(long, value_name = "N", default_value_t = 0)]
    cuda_device: usize,
    /// Device memory, in GB, to leave free for other programs (default 0.25); the memory manager keeps weights
    /// and activations within the rest.
    #[arg(long, value_name = "GB")]
    reserve_vram: Option<f64>,
    /// Stream weights from pageable host memory instead of page-locked (pinned) memory: slower copies, but no
    /// locked RAM.
    #[arg(long)]
    disable_pinned_memory: bool,
    /// Latent previews while sampling: none (ComfyUI's default), or a cheap latent-to-RGB projection (auto,
    /// latent2rgb; taesd too, as ComfyUI falls back to it without TAESD files). A prompt's
    /// `extra_data.preview_method` overrides it.
    #[arg(long, value_enum, default_value_t = PreviewArg::None)]
    preview_method: PreviewArg,
    /// Which API surface to serve.
    #[arg(long, value_enum, default_value_t = RuntimeArg::Local)]
    runtime: RuntimeArg,
    /// The cloud runtime's public URL (no trailing slash), named as the issuer of its tokens. Default:
    /// `http://<first --listen address>:<port>`.
    #[arg(long, value_name = "URL")]
    issuer: Option<String>,
    /// Cloud runtime, tests and development only: fetch OAuth client metadata documents over plain http from
    /// loopback hosts. Refused unless the issuer itself is a loopback URL.
    #[arg(long)]
    cimd_allow_loopback_http: bool,
    /// Local runtime: require the key in this file (its first line) on every API request, as `X-API-Key` or
    /// `Authorization: Bearer`, for a server reachable from a network.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Keep the queue, the history, the prompt counter and the cloud runtime's accounts and OAuth grants in this
    /// Postgres database (postgres://USER:PASSWORD@HOST:PORT/DATABASE) instead of the embedded SQLite database
    /// DATA_DIR/kiln.sqlite. Its password is never reported (`/api/system_stats` shows the command line with it
    /// hidden).
    #[arg(long, value_name = "URL", env = "KILN_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Keep inputs, outputs and temp files in this object store as well as in the local folders, which become
    /// its working copy: file:///ABSOLUTE/PATH (a folder, perhaps on a shared file system) or
    /// s3://BUCKET/PREFIX?endpoint=URL&region=R (prefix and query optional; the query takes the object_store
    /// crate's S3 settings; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). The nodes of a
    /// cluster share files through it.
    #[arg(long, value_name = "URL", env = "KILN_STORE", hide_env_values = true)]
    store: Option<String>,
    /// What this process does: all (one server with the database to itself), or, in a cluster sharing one
    /// Postgres database (--database-url) and its files (one --store, or one --data-dir), api (serves the clients, runs nothing) or worker
    /// (runs the prompts it claims from the shared queue; serves only /healthz, /readyz and /metrics).
    #[arg(long, value_enum, default_value_t = RoleArg::All)]
    role: RoleArg,
    /// Worker: how long a claimed prompt stays this worker's without a heartbeat (renewed every half second
    /// while it runs); a prompt whose worker died is taken back after this.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    worker_lease: f64,
    /// Worker: how many times a prompt may be claimed. A prompt whose worker died runs again on another
    /// worker until it has had this many attempts, and is then recorded as interrupted.
    #[arg(long, value_name = "N", default_value_t = 1)]
    max_attempts: u32,
    /// Worker: model affinity. The worker first takes the prompts whose model files it holds (those of the
    /// prompt it ran last), in order; an earlier prompt that needs other files waits at most this long before
    /// it comes first again. 0 keeps ComfyUI's strict order.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    affinity_wait: f64,
    /// After SIGTERM or SIGINT, how long the running prompt may take to finish before it is interrupted and
    /// handed back to the queue (it runs again at the next start). A second signal hands it back at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    drain_timeout: f64,
    /// How the log is written to stderr: text for people, or JSON lines (one object per event, with the
    /// request's span and the prompt id) for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// The log's format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// ComfyUI's `--preview-method` names.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum PreviewArg {
    /// No previews.
    None,
    /// The best method available: latent2rgb.
    Auto,
    /// A linear projection of the latent to RGB.
    Latent2rgb,
    /// TAESD decoders (Kiln has none: latent2rgb).
    Taesd,
}

/// `--role`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    /// Everything in one process.
    All,
    /// An API node of a cluster.
    Api,
    /// A worker of a cluster.
    Worker,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RuntimeArg {
    /// The single-user local server (ComfyUI's API).
    Local,
    /// The multi-user cloud server.
    Cloud,
}

impl Args {
    fn into_config(self) -> anyhow::Result<Config> {
        let mut listen = Vec::new();
        for part in self.listen.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ip: IpAddr =
                part.parse().with_context(|| format!("--listen: `{part}` is not an IP address"))?;
            listen.push(SocketAddr::new(ip, self.port));
        }
        if listen.is_empty() {
            bail!("--listen: no address given");
        }
        if !(self.max_upload_size.is_finite() && self.max_upload_size > 0.0) {
            bail!("--max-upload-size: must be a positive number of MB");
        }
        let argv = std::env::args().map(|arg| kiln_server::hide_password(&arg)).collect();
        let mut config = Config::under(self.data_dir, listen, argv);
        if let Some(url) = &self.database_url {
            config.database = Database::from_url(url).map_err(anyhow::Error::msg)?;
        }
        config.store = self.store;
        config.role = match self.role {
            RoleArg::All => ProcessRole::All,
            RoleArg::Api => ProcessRole::Api,
            RoleArg::Worker => ProcessRole::Worker,
        };
        if config.role.in_cluster() && config.database == Database::Embedded {
            bail!(
                "--role {:?}: the API nodes and workers of a cluster share a Postgres database; add \
                 --database-url postgres://…",
                self.role
            );
        }
        config.claims.lease = std::time::Duration::try_from_secs_f64(self.worker_lease)
            .ok()
            .filter(|lease| *lease >= std::time::Duration::from_millis(500))
            .context("--worker-lease must be a number of seconds, 0.5 or more")?;
        if self.max_attempts == 0 {
            bail!("--max-attempts must be 1 or more");
        }
        config.claims.max_attempts = self.max_attempts;
        config.claims.affinity_wait = std::time::Duration::try_from_secs_f64(self.affinity_wait)
            .context("--affinity-wait must be a number of seconds, 0 or more")?;
        config.runtime = match self.runtime {
            RuntimeArg::Local => Runtime::Local,
            RuntimeArg::Cloud => Runtime::Cloud,
        };
        config.issuer = match self.issuer {
            Some(issuer) => issuer.trim_end_matches('/').to_owned(),
            None => format!("http://{}", config.listen[0]),
        };
        if config.runtime == Runtime::Cloud
            && let Err(problem) = kiln_server::check_issuer(&config.issuer)
        {
            bail!("--issuer: {problem}");
        }
        if self.cimd_allow_loopback_http {
            if !kiln_server::is_loopback_http(&config.issuer) {
                bail!(
                    "--cimd-allow-loopback-http is for tests: the issuer must be a loopback http URL"
                );
            }
            config.cimd_allow_loopback_http = true;
        }
        if let Some(file) = &self.api_key_file {
            if config.runtime == Runtime::Cloud {
                bail!(
                    "--api-key-file is for the local runtime; the cloud runtime has accounts and API keys"
                );
            }
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--api-key-file: cannot read {}", file.display()))?;
            let key = text.lines().next().unwrap_or("").trim().to_owned();
            if key.len() < 16 {
                bail!(
                    "--api-key-file: {} must start with a key of at least 16 characters",
                    file.display()
                );
            }
            config.api_key = Some(key);
        }
        config.input_dir = self.input_directory.unwrap_or(config.input_dir);
        config.output_dir = self.output_directory.unwrap_or(config.output_dir);
        config.temp_dir = self.temp_directory.unwrap_or(config.temp_dir);
        config.user_dir = self.user_directory.unwrap_or(config.user_dir);
        config.max_upload_size = (self.max_upload_size * 1024.0 * 1024.0) as u64;
        config.templates = match (self.disable_front_end, self.templates_wheels_url) {
            (true, _) => None,
            (false, None) => Some(TemplatesSource::PyPi),
            (false, Some(url)) => Some(TemplatesSource::Mirror(url)),
        };
        config.front_end = match (self.disable_front_end, self.front_end_root) {
            (true, _) => FrontEnd::Disabled,
            (false, Some(root)) => FrontEnd::Root(root),
            (false, None) => FrontEnd::Pinned { wheel_url: self.front_end_wheel_url },
        };
        let pinned = matches!(config.front_end, FrontEnd::Pinned { .. });
        if let (true, FrontEndVersion::Other(version)) = (pinned, self.front_end_version) {
            tracing::warn!(
                "--front-end-version {version}: Kiln serves the ComfyUI frontend it is tested with \
                 (comfyui-frontend-package {FRONTEND_VERSION}); pass --front-end-root DIR to serve another build"
            );
        }
        config.cache = match (self.cache_classic, self.cache_lru, self.cache_ram, self.cache_none) {
            (true, ..) => CacheMode::Classic,
            (_, Some(n), ..) => CacheMode::Lru(n),
            (_, _, _, true) => CacheMode::None,
            (_, _, Some(gb), _) => {
                if let Some(bad) = gb.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                    bail!("--cache-ram: {bad} is not a positive number of GB");
                }
                CacheMode::RamPressure {
                    active_gb: gb.first().copied(),
                    inactive_gb: gb.get(1).copied(),
                }
            }
            _ => CacheMode::RamPressure { active_gb: None, inactive_gb: None },
        };
        if let Some(gb) = self.reserve_vram
            && !(gb.is_finite() && gb >= 0.0)
        {
            bail!("--reserve-vram: {gb} is not a number of GB (0 or more)");
        }
        config.preview_method = match self.preview_method {
            PreviewArg::None => PreviewMethod::None,
            PreviewArg::Auto | PreviewArg::Latent2rgb | PreviewArg::Taesd => {
                PreviewMethod::Latent2Rgb
            }
        };
        config.compute = ComputeConfig {
            force_cpu: self.cpu,
            cuda_device: self.cuda_device,
            reserve_vram_gb: self.reserve_vram,
            pinned_memory: !self.disable_pinned_memory,
        };
        config.cors_origin = self.enable_cors_header;
        for file in &self.extra_model_paths_config {
            config.extra_model_paths.extend(kiln_server::read_extra_model_paths(file)?);
        }
        Ok(config)
    }
}

/// Tools run instead of the server.
#[derive(Debug, Subcommand)]
enum Command {
    /// Model-file tools.
    #[command(subcommand)]
    Model(model_command::ModelCommand),
    // `kiln user …`, `kiln workspace …`, `kiln key …` (cloud runtime accounts).
    #[command(flatten)]
    Account(account_command::AccountCommand),
    /// Token signing keys (cloud runtime).
    #[command(subcommand)]
    Keys(KeysCommand),
}

/// `kiln keys …`.
#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Make a new current signing key; the previous one keeps verifying until the next rotation.
    Rotate {
        /// The data directory of the server whose keys to rotate.
        #[arg(long, default_value = "kiln-data")]
        data_dir: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let logs = LogRing::new();
    let json = args.log_format == LogFormat::Json;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with((!json).then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
        }))
        .with(json.then(|| {
            tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .with_writer(std::io::stderr)
        }))
        .with(logs.layer())
        .init();
    match args.command.take() {
        Some(Command::Model(command)) => {
            return tokio::task::spawn_blocking(move || model_command::run(command))
                .await
                .context("the model command panicked")?;
        }
        Some(Command::Account(command)) => return account_command::run(command).await,
        Some(Command::Keys(KeysCommand::Rotate { data_dir })) => {
            return kiln_server::rotate_signing_keys(&data_dir).map_err(anyhow::Error::msg);
        }
        None => {}
    }
    let drain_timeout = std::time::Duration::try_from_secs_f64(args.drain_timeout)
        .context("--drain-timeout must be a number of seconds, 0 or more")?;
    let config = args.into_config()?;
    std::fs::create_dir_all(&config.data_dir).with_context(|| {
        format!("cannot create the data directory {}", config.data_dir.display())
    })?;
    let server = Server::start(&config, logs).await.context("cannot start the server")?;

    let mut signals = Signals::new()?;
    // Tells the listeners to stop, once the drain is over.
    let (stop_serving, serving) = tokio::sync::watch::channel(false);
    let mut listeners = tokio::task::JoinSet::new();
    for addr in &config.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        info!("listening on http://{}", listener.local_addr()?);
        let app = server.router();
        let mut serving = serving.clone();
        listeners.spawn(async move {
            // The peer address: the cloud runtime limits client registrations per address.
            let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
            let stopped = async move {
                let _ = serving.wait_for(|stop| *stop).await;
            };
            axum::serve(listener, app).with_graceful_shutdown(stopped).await
        });
    }
    server.install_templates();
    let serve = async {
        while let Some(result) = listeners.join_next().await {
            result.context("a listener task panicked")?.context("serving failed")?;
        }
        anyhow::Ok(())
    };
    tokio::pin!(serve);
    tokio::select! {
        () = server.forward_logs() => {}
        result = &mut serve => result?,
        () = signals.next() => {
            // The routes keep serving while the server drains: clients follow the running prompt to its end.
            server.drain(drain_timeout, signals.next()).await;
            let _ = stop_serving.send(true);
            serve.await?;
        }
    }
    server.shutdown();
    info!("stopped");
    Ok(())
}

/// SIGTERM and SIGINT (Ctrl-C), either of which starts the drain; the second one ends it.
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                terminate: signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
                interrupt: signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Resolves at the next signal.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            let name = tokio::select! {
                _ = self.terminate.recv() => "SIGTERM",
                _ = self.interrupt.recv() => "SIGINT",
            };
            info!(signal = name, "stopping");
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
