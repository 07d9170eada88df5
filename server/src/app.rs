//! The running server: the local runtime's state and worker, behind the generated router, with ComfyUI's
//! request rules (body size limit, the loopback origin check).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use kiln_engine::compute::{Compute, ComputeOptions};
use kiln_engine::exec::Executor;
use kiln_engine::models::ModelEnv;
use kiln_engine::queue::{MemoryStore, PromptQueue, QueueStore};
use kiln_engine::roots::Roots;
use kiln_spec::types;

use crate::api::{cloud_router, local_router};
use crate::cluster::{
    Cluster, MirrorStore, TableFeed, follow_events, follow_queue, latest_event, sweep_forever,
};
use crate::config::GIB;
use crate::config::{Config, Database, ProcessRole};
use crate::logs::LogRing;
use crate::service::api::ApiServer;
use crate::service::history::{Histories, Record};
use crate::service::worker::{Queued, Service, cache, start_worker};
use crate::storage::Storage;
use crate::workspace::{DEFAULT_WORKSPACE, Workspaces};
use crate::ws::{Audience, Hub};

/// How long a drain waits for an interrupted prompt to stop before it says so in the log.
const HAND_BACK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A started server: its routes, and the worker that runs prompts.
pub struct Server {
    router: Router,
    runtime: Arc<Service>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// Where the runtime's workflow templates are installed from, once the server listens.
    templates_source: Option<crate::templates::TemplatesSource>,
}

impl Server {
    /// Creates the directories, opens the database, restores the queue and history, starts the worker
    /// thread and builds the routes for a configuration.
    pub async fn start(config: &Config, logs: LogRing) -> std::io::Result<Server> {
        let dirs = [
            &config.data_dir,
            &config.input_dir,
            &config.output_dir,
            &config.temp_dir,
            &config.user_dir,
            &config.models_dir,
        ];
        for dir in dirs {
            std::fs::create_dir_all(dir)?;
        }
        let model_folders = Arc::new(config.model_folders());
        for extra in &config.extra_model_paths {
            if extra.path.is_dir() {
                tracing::info!(folder = %extra.folder, path = %extra.path.display(), "extra model path");
            } else {
                let (folder, path) = (&extra.folder, extra.path.display());
                tracing::warn!(%folder, %path, "extra model path is not a directory (yet)");
            }
        }
        let storage = Storage::open(&config.data_dir, &config.database, config.role.in_cluster())
            .await
            .map_err(std::io::Error::other)?;
        let cluster = match (config.role, &config.database) {
            (ProcessRole::All, _) => None,
            (role, Database::Postgres(url)) => Some(
                Cluster::open(url, role, &config.claims).await.map_err(std::io::Error::other)?,
            ),
            (_, Database::Embedded) => {
                return Err(std::io::Error::other(
                    "--role api and --role worker share a Postgres database: add --database-url",
                ));
            }
        };
        let roots = Roots {
            input: config.input_dir.clone(),
            output: config.output_dir.clone(),
            temp: config.temp_dir.clone(),
        };
        let cache = cache(config.cache);
        // Pins leave half the RAM-pressure cache's active threshold available (none in the other modes).
        let ram_cache_headroom = match cache.policy() {
            kiln_engine::cache::CachePolicy::RamPressure(pressure) => pressure.thresholds.active,
            _ => 0,
        };
        let compute = Arc::new(Compute::start(ComputeOptions {
            // An API node runs nothing: it leaves the device to the workers.
            force_cpu: config.compute.force_cpu || config.role == ProcessRole::Api,
            cuda_device: config.compute.cuda_device,
            reserve: config.compute.reserve_vram_gb.map(|gb| (gb * GIB) as u64),
            pinned_memory: config.compute.pinned_memory,
            ram_cache_headroom,
            kernel_cache: Some(config.data_dir.join("cuda-kernels")),
        }));
        let models = ModelEnv { files: model_folders.clone(), compute: compute.clone() };
        let files = match &config.store {
            Some(url) => {
                let store = crate::store::Store::open(url).await.map_err(std::io::Error::other)?;
                tracing::info!(
                    store = store.shown(),
                    "inputs, outputs and temp files in the object store"
                );
                Some(store)
            }
            None => None,
        };
        let workspaces = Arc::new(match config.runtime {
            crate::api::Runtime::Local => {
                Workspaces::local(roots.clone(), config.user_dir.clone(), models, files)
            }
            crate::api::Runtime::Cloud => Workspaces::cloud(config.data_dir.clone(), models, files),
        });
        let fallback = workspaces.fallback_caller()?;
        let cloud = match config.runtime {
            crate::api::Runtime::Local => None,
            crate::api::Runtime::Cloud => Some(Arc::new(
                crate::cloud::Cloud::open(
                    &config.data_dir,
                    &config.database,
                    &config.issuer,
                    config.cimd_allow_loopback_http,
                )
                .await?,
            )),
        };
        let executor = Executor::new(
            fallback.workspace.registry().clone(),
            cache,
            fallback.workspace.roots().clone(),
        );
        // Restoring reads the store synchronously: off the async threads. An API node's queue mirrors the
        // shared table (filled by its first sync); a worker's holds the prompt it runs.
        let store: Box<dyn QueueStore<Queued>> = match (&cluster, config.role) {
            (Some(cluster), ProcessRole::Api) => Box::new(MirrorStore::new(cluster.clone())),
            (Some(_), _) => Box::new(MemoryStore::default()),
            (None, _) => Box::new(storage.queue_store(workspaces.clone())),
        };
        let (queue, interrupted) = tokio::task::spawn_blocking(move || PromptQueue::restore(store))
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        // An API node delivers the events after the newest one now: whatever a worker stores while the
        // history loads arrives through them.
        let events_cursor = match &cluster {
            Some(cluster) if config.role == ProcessRole::Api => {
                Some(latest_event(cluster).await.map_err(std::io::Error::other)?)
            }
            _ => None,
        };
        let mut history = Histories::default();
        if config.role != ProcessRole::Worker {
            for record in storage.load_history().await.map_err(std::io::Error::other)? {
                history.insert(record);
            }
        }
        // Prompts that were running when the previous process stopped did not finish: record them as interrupted,
        // then let go of their queue rows (a crash before that records them again, under the same id).
        for entry in &interrupted {
            let queued = &entry.payload;
            let record = Record::interrupted(
                &queued.workspace.id,
                &entry.id,
                entry.number,
                queued.prompt_json.clone(),
                queued.extra_data.clone(),
                queued.outputs.clone(),
            );
            tracing::warn!(prompt = %entry.id, "a prompt was running when kiln stopped; recorded as interrupted");
            storage.insert_history(&record).done().await.map_err(std::io::Error::other)?;
            history.insert(record);
        }
        let queue = tokio::task::spawn_blocking(move || queue.settle(&interrupted).map(|()| queue))
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        let features = crate::system::features(config.max_upload_size as i64);
        // The worker runs nodes under the device's memory manager: its reset after every node, and its RAM
        // arbitration between the output cache and the weight pins.
        let executor = executor.with_memory(compute.manager().clone());
        let openapi = crate::api::document(config.runtime).map_err(std::io::Error::other)?;
        let mcp_config = mcp_config(config, cloud.as_deref());
        let templates = config
            .templates
            .as_ref()
            .map(|_| Arc::new(crate::templates::Templates::open(&config.data_dir)));
        // The MCP endpoint's tools hold the runtime weakly (the runtime holds the endpoint).
        let runtime = Arc::new_cyclic(|runtime| Service {
            workspaces,
            fallback,
            preview_method: config.preview_method,
            queue,
            history: Mutex::new(history),
            hub: Hub::default(),
            model_folders,
            features,
            frontend_version: std::sync::OnceLock::new(),
            templates,
            openapi,
            argv: config.argv.clone(),
            interrupt: executor.interrupt_flag(),
            interrupt_gate: Mutex::new(()),
            compute,
            unload_requested: AtomicBool::new(false),
            free_requested: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            drain: crate::drain::Drain::default(),
            metrics: crate::metrics::Metrics::default(),
            logs,
            log_subscribers: Mutex::new(Default::default()),
            storage,
            cloud,
            mcp: crate::mcp::McpEndpoint::new(runtime.clone(), mcp_config),
            cluster: cluster.clone(),
        });
        // Every queue change is announced to every socket, with its own workspace's counter, in the order of
        // the changes.
        let announcer = Arc::downgrade(&runtime);
        let tenants = runtime.cloud.is_some();
        runtime.queue.on_change(Box::new(move |queue| {
            if let Some(runtime) = announcer.upgrade() {
                let remaining =
                    |workspace: &str| queue.remaining_where(|q| q.in_workspace(workspace)) as i64;
                runtime.hub.broadcast_status(remaining, tenants);
            }
        }));
        let worker = match config.role {
            ProcessRole::Api => {
                // Nothing runs here: a drain has no prompt to wait for.
                runtime.drain.note_worker_stopped();
                None
            }
            ProcessRole::All | ProcessRole::Worker => Some(start_worker(runtime.clone(), executor)),
        };
        if let Some(cluster) = &cluster {
            if let Some(cursor) = events_cursor {
                crate::cluster::sync_queue(&runtime, cluster)
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(follow_queue(runtime.clone(), cluster.clone()));
                let feed = Box::new(TableFeed::open(cluster, cursor).await);
                tokio::spawn(follow_events(runtime.clone(), cluster.clone(), feed));
            }
            tokio::spawn(sweep_forever(runtime.clone(), cluster.clone()));
            tracing::info!(role = ?config.role, node = %cluster.node, "in a cluster on the shared database");
        }
        let api = Arc::new(ApiServer(runtime.clone()));
        let mut router = match &runtime.cloud {
            None => local_router(api),
            Some(_) => cloud_router(api)
                .merge(crate::cloud::signin::routes())
                .merge(crate::oauth::consent_page::routes()),
        };
        if let Some(templates) = &runtime.templates {
            router = crate::templates::routes(router, templates.clone());
        }
        let (mounted, frontend_version) = crate::frontend::mount(router, config).await;
        router = match runtime.cloud {
            Some(_) => mounted.layer(middleware::from_fn(crate::cloud::signin::with_csrf_shim)),
            None => mounted,
        };
        if let Some(version) = frontend_version {
            let _ = runtime.frontend_version.set(version);
        }
        // Numbers for the prompt requests rejected before their handler, under the body limit.
        let router = router
            .layer(middleware::from_fn_with_state(
                runtime.clone(),
                crate::service::numbering::count_rejected,
            ))
            .layer(DefaultBodyLimit::max(config.max_upload_size as usize));
        let router = match (&runtime.cloud, config.cors_origin.clone()) {
            (Some(cloud), _) => {
                let gate = Arc::new(crate::cloud::gate::Gate {
                    cloud: cloud.clone(),
                    workspaces: runtime.workspaces.clone(),
                });
                router.layer(middleware::from_fn_with_state(gate, crate::cloud::gate::authenticate))
            }
            (None, Some(origin)) => router.layer(middleware::from_fn(move |request, next| {
                crate::frontend::cors(origin.clone(), request, next)
            })),
            (None, None) => router.layer(middleware::from_fn(origin_check)),
        };
        // Every request runs in a span naming its method and the route it matched (the spec path, not the
        // client's), so a line logged while handling it says which operation it was.
        // 500 to 502 are logged as failures; 503 is what `/readyz` answers by design while the server drains,
        // and a probe every few seconds must not fill the log with errors.
        let failures = tower_http::classify::StatusInRangeAsFailures::new(500..=502);
        let router = router.layer(
            tower_http::trace::TraceLayer::new(failures.into_make_classifier()).make_span_with(
                |request: &Request| {
                    let route = request
                        .extensions()
                        .get::<axum::extract::MatchedPath>()
                        .map_or("(no route)", |path| path.as_str());
                    tracing::info_span!("request", method = %request.method(), %route)
                },
            ),
        );
        let router = match &config.api_key {
            Some(key) => {
                let key = Arc::new(key.clone());
                router.layer(middleware::from_fn(move |request, next| {
                    crate::service::api_key::require(key.clone(), request, next)
                }))
            }
            None => router,
        };
        let templates_source = config.templates.clone();
        let router = match config.role {
            ProcessRole::Worker => router.layer(middleware::from_fn(worker_routes)),
            ProcessRole::All | ProcessRole::Api => router,
        };
        Ok(Server { router, runtime, worker, templates_source })
    }

    /// Starts installing the workflow templates that are not there yet, in the background (one log line when it
    /// ends; `/templates/` serves each package as it lands). Called once the server listens, so the download
    /// competes with nothing at startup; nothing happens without templates (`--disable-front-end`).
    pub fn install_templates(&self) {
        if let (Some(templates), Some(source)) = (&self.runtime.templates, &self.templates_source) {
            tokio::spawn(templates.clone().install_missing(source.clone()));
        }
    }

    /// The routes.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The runtime, for the crate's own tests.
    #[cfg(test)]
    pub(crate) fn runtime(&self) -> &Arc<Service> {
        &self.runtime
    }

    /// Sends new log entries to the sockets subscribed through `/internal/logs/subscribe`, until the server stops.
    pub async fn forward_logs(&self) {
        let runtime = self.runtime.clone();
        let mut last = runtime.logs.since(0).last().map_or(0, |e| e.seq);
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        while !runtime.stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let subscribers: Vec<String> = runtime
                .log_subscribers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect();
            let entries = runtime.logs.since(last);
            let Some(newest) = entries.last() else { continue };
            last = newest.seq;
            if subscribers.is_empty() {
                continue;
            }
            let message = types::WsMessage::LogsMessage(types::WsLogsMessage {
                data: types::LogsRaw {
                    entries: entries
                        .into_iter()
                        .map(|e| types::LogEntry { m: e.message, t: e.time })
                        .collect(),
                    size: types::TerminalSize { cols: 80, rows: 24 },
                },
                type_: types::WsLogsMessageType::Logs,
            });
            for client in &subscribers {
                runtime.hub.publish(DEFAULT_WORKSPACE, Some(client), &message, Audience::Owner);
            }
        }
    }

    /// Drains (see `drain.rs`): the worker takes no new prompt and `/readyz` answers 503, while the routes keep
    /// serving. Returns once nothing runs: the running prompt finished, or, after `timeout` or once `stop_now`
    /// resolves (a second signal), was interrupted and handed back to the queue.
    pub async fn drain(&self, timeout: std::time::Duration, stop_now: impl Future<Output = ()>) {
        let runtime = &self.runtime;
        runtime.drain.start();
        if self.worker.is_none() {
            // An API node runs nothing: the prompts running on the workers are theirs to finish.
            return;
        }
        let worker_stopped = async {
            while !runtime.drain.worker_stopped() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::pin!(worker_stopped);
        if self.worker.is_some() && !runtime.queue.running().is_empty() {
            tracing::info!(
                timeout_s = timeout.as_secs_f64(),
                "draining: waiting for the running prompt to finish (a second signal hands it back to the queue)"
            );
        }
        tokio::select! {
            () = &mut worker_stopped => return,
            () = tokio::time::sleep(timeout) => tracing::info!("drain timeout: handing the running prompt back"),
            () = stop_now => tracing::info!("second signal: handing the running prompt back"),
        }
        runtime.hand_back_running();
        // A node stops at its next interruption point. (A process killed before that records the prompt as
        // interrupted at the next start, as after any crash.)
        if tokio::time::timeout(HAND_BACK_WAIT, &mut worker_stopped).await.is_err() {
            tracing::warn!(
                "the running prompt has not stopped yet (a node between interruption points); waiting"
            );
            worker_stopped.await;
        }
    }

    /// Stops the worker after the running prompt and waits for it.
    pub fn shutdown(mut self) {
        self.runtime.stop.store(true, Ordering::SeqCst);
        self.runtime.interrupt.store(true, Ordering::SeqCst);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// A worker of a cluster serves the probes and `/metrics` only: clients talk to the API nodes.
async fn worker_routes(request: Request, next: Next) -> Response {
    match request.uri().path() {
        "/healthz" | "/readyz" | "/metrics" => next.run(request).await,
        path => crate::api::refuse(
            StatusCode::NOT_FOUND,
            "worker_node",
            &format!(
                "{path}: this is a worker of a Kiln cluster (--role worker), which serves only /healthz, \
                 /readyz and /metrics; send API requests to an API node"
            ),
        ),
    }
}

fn host_part(value: &str) -> &str {
    value
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or("")
}

fn is_loopback(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) { name } else { host }
    });
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// ComfyUI's anti-CSRF rule for a local server: a request to a loopback host whose `Origin` names another
/// host is refused with 403.
pub(crate) fn origin_allowed(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(host), Some(origin)) = (header("host"), header("origin")) else { return true };
    !is_loopback(host) || host_part(origin) == host
}

async fn origin_check(request: Request, next: Next) -> Response {
    if origin_allowed(request.headers()) {
        next.run(request).await
    } else {
        tracing::warn!(origin = ?request.headers().get("origin"), "refused a cross-origin request to a loopback host");
        crate::api::refuse(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "a cross-origin request to a server on a loopback address is refused; start kiln with \
             --enable-cors-header to allow it",
        )
    }
}

/// How `/mcp` is exposed. Cloud: the issuer's host and origin only, OAuth challenges, a principal required.
/// Local: the server's own origins; the `Host` check (against DNS rebinding) when it listens on loopback only.
fn mcp_config(config: &Config, cloud: Option<&crate::cloud::Cloud>) -> crate::mcp::McpConfig {
    match cloud {
        Some(cloud) => {
            let origin = crate::cloud::gate::issuer_origin(&cloud.issuer);
            let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
            crate::mcp::McpConfig {
                allowed_hosts: vec![authority.to_owned()],
                allowed_origins: vec![origin.to_owned()],
                resource_metadata: Some(cloud.oauth.resource_metadata_url()),
                require_principal: true,
            }
        }
        None => {
            let loopback_only = config.listen.iter().all(|addr| addr.ip().is_loopback());
            let mut origins: Vec<String> = Vec::new();
            for addr in &config.listen {
                origins.push(format!("http://{addr}"));
                if addr.ip().is_loopback() {
                    origins.push(format!("http://localhost:{}", addr.port()));
                }
            }
            if let Some(origin) = config.cors_origin.as_ref().filter(|o| *o != "*") {
                origins.push(origin.clone());
            }
            let hosts = if loopback_only {
                ["localhost", "127.0.0.1", "::1", "[::1]"].map(str::to_owned).to_vec()
            } else {
                Vec::new()
            };
            crate::mcp::McpConfig {
                allowed_hosts: hosts,
                allowed_origins: origins,
                resource_metadata: None,
                require_principal: false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::origin_allowed;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("host", host.parse().expect("header"));
        if let Some(origin) = origin {
            h.insert("origin", origin.parse().expect("header"));
        }
        h
    }

    #[test]
    fn cross_origin_requests_to_loopback_are_refused() {
        assert!(origin_allowed(&headers("127.0.0.1:8188", None)));
        assert!(origin_allowed(&headers("127.0.0.1:8188", Some("http://127.0.0.1:8188"))));
        assert!(!origin_allowed(&headers("127.0.0.1:8188", Some("http://evil.example"))));
        assert!(!origin_allowed(&headers("localhost:8188", Some("http://localhost:9999"))));
        assert!(
            origin_allowed(&headers("kiln.example:8188", Some("http://other.example"))),
            "only loopback hosts are guarded"
        );
    }
}
