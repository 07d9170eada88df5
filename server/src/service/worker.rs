//! The service's shared state ([`Service`]) and its worker thread, which runs queued prompts one at a time.
//!
//! Order of a run's last frames, as ComfyUI's (comfy-api.md §8.2): `execution_success` (or `execution_error`,
//! `execution_interrupted`), then `status` to everyone, then `executing {node: null}` to the owner.
//!
//! Invariant: store first, then announce. The run's terminal event is held back until its history entry is
//! stored (committed, and in the in-memory history), so a client that fetches `/history/{id}` on
//! `execution_success` (or any later frame) finds the entry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kiln_engine::cache::Cache;
use kiln_engine::exec::{Event, EventSink, Executor, HistoryRecorder, Outcome, Run};
use kiln_engine::nodes::PreviewMethod;
use kiln_engine::queue::{PromptQueue, QueueEntry};
use kiln_spec::types;
use serde_json::{Map, Value};

use super::history::{Histories, Record};
pub(crate) use super::queued::Queued;
use crate::config::ProcessRole;
use crate::metrics::{Finished, Snapshot, WorkerState};
use crate::workspace::Workspaces;
use crate::ws::{Audience, Delivery, Hub, ProgressState, message, node_output, preview_frames};

/// The prompt's `extra_data.preview_method` when it names a method (the frontend sends it unless its setting
/// is "default"), else the server's `--preview-method`.
fn preview_method(extra_data: &Map<String, Value>, server: PreviewMethod) -> PreviewMethod {
    extra_data
        .get("preview_method")
        .and_then(Value::as_str)
        .and_then(PreviewMethod::from_name)
        .unwrap_or(server)
}

/// Everything the handlers of both runtimes and the worker share.
pub(crate) struct Service {
    /// The workspaces (one on the local runtime): registries, file roots, user directories.
    pub(crate) workspaces: Arc<Workspaces>,
    /// The caller of a request without one ([`crate::workspace::Workspaces::fallback_caller`]).
    pub(crate) fallback: crate::workspace::Caller,
    /// `--preview-method`: previews unless a prompt's `extra_data` says otherwise.
    pub(crate) preview_method: PreviewMethod,
    pub(crate) queue: PromptQueue<Queued>,
    pub(crate) history: Mutex<Histories>,
    pub(crate) hub: Hub,
    pub(crate) model_folders: Arc<crate::model_folders::ModelFolders>,
    pub(crate) features: types::FeatureFlags,
    /// The version of the frontend served at `/`, when known (`system_stats`' installed frontend package): set
    /// once the pinned package is installed; unset for a `--front-end-root` or no frontend.
    pub(crate) frontend_version: std::sync::OnceLock<&'static str>,
    /// The workflow templates served at `/templates/`, when they are (not with `--disable-front-end`).
    pub(crate) templates: Option<Arc<crate::templates::Templates>>,
    /// The OpenAPI document this runtime serves (`GET /api/openapi.json`).
    pub(crate) openapi: types::OpenApiDocument,
    pub(crate) argv: Vec<String>,
    pub(crate) interrupt: Arc<AtomicBool>,
    /// Held while an interrupt checks whose prompt runs and sets the flag, and while the worker clears the
    /// flag for the prompt it just took: a flag meant for one prompt never stops the next one, whoever owns it.
    pub(crate) interrupt_gate: Mutex<()>,
    /// The device and its memory manager.
    pub(crate) compute: Arc<kiln_engine::compute::Compute>,
    /// `/free` asked to unload every model before the next prompt.
    pub(crate) unload_requested: AtomicBool,
    /// `/free` asked to free memory: unload the models and drop the node result cache.
    pub(crate) free_requested: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// The drain after SIGTERM or SIGINT (the worker takes no new prompt; `/readyz` answers 503).
    pub(crate) drain: crate::drain::Drain,
    /// What `/metrics` counts.
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) logs: crate::logs::LogRing,
    pub(crate) storage: crate::storage::Storage,
    pub(crate) log_subscribers: Mutex<std::collections::HashSet<String>>,
    /// Accounts, keys and tokens, on the cloud runtime.
    pub(crate) cloud: Option<Arc<crate::cloud::Cloud>>,
    /// The MCP endpoint (`/mcp`; its tools hold the runtime weakly).
    pub(crate) mcp: crate::mcp::McpEndpoint,
    /// This process's part in a cluster (`--role api|worker`); `None` for a single server.
    pub(crate) cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl Service {
    /// Every workspace's history, locked.
    pub(crate) fn history(&self) -> MutexGuard<'_, Histories> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `/metrics` reports as held now: the queue, the worker, sockets and memory.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let (pending, running) = self.queue.counts();
        let worker = match (self.drain.is_draining(), running) {
            (true, _) => WorkerState::Draining,
            (false, 0) => WorkerState::Idle,
            (false, _) => WorkerState::Running,
        };
        let memory = self.compute.manager().stats();
        let host = crate::system::Memory::read();
        let bytes = |b: i64| u64::try_from(b).unwrap_or(0);
        Snapshot {
            pending,
            running,
            worker,
            websockets: self.hub.len(),
            device_used: memory.usage,
            device_budget: memory.budget,
            device_capacity: memory.capacity,
            device_weights: memory.resident_weights,
            host_weights: memory.host_bytes,
            pinned_weights: memory.registered_bytes,
            pageable_copies: memory.pageable_copies,
            models: memory.models as u64,
            model_loads: memory.loads,
            host_total: bytes(host.total),
            host_available: bytes(host.available),
        }
    }

    /// Hands a run's delivery to the sockets: this server's own, or, on a worker of a cluster, every API
    /// node's through the database.
    pub(crate) fn deliver(&self, delivery: Delivery) {
        match &self.cluster {
            Some(cluster) if cluster.role == ProcessRole::Worker => cluster.deliver(delivery),
            _ => self.hub.deliver(&delivery),
        }
    }

    /// A workspace's pending plus running prompts, as its `queue_remaining`.
    pub(crate) fn remaining(&self, workspace: &str) -> i64 {
        self.queue.remaining_where(|q| q.in_workspace(workspace)) as i64
    }
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Sends a run's events to the hub: `progress_state` to everyone, the rest by ComfyUI's addressing. The
/// terminal event (`execution_success`, `execution_error`, `execution_interrupted`) is held until
/// [`HubSink::release`], once the history entry is stored.
struct HubSink {
    runtime: Arc<Service>,
    workspace: Arc<str>,
    client_id: Option<String>,
    prompt_id: uuid::Uuid,
    progress: Mutex<ProgressState>,
    terminal: Mutex<Option<(Event, i64)>>,
}

impl HubSink {
    /// The held terminal event, if any, with the time it happened.
    fn terminal(&self) -> Option<Delivery> {
        let (event, timestamp) = self.terminal.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let (message, audience) = message(self.prompt_id, &event, timestamp)?;
        Delivery::message(&self.workspace, self.client_id.as_deref(), &message, audience)
    }

    fn publish(&self, client_id: Option<&str>, message: &types::WsMessage, audience: Audience) {
        if let Some(delivery) = Delivery::message(&self.workspace, client_id, message, audience) {
            self.runtime.deliver(delivery);
        }
    }
}

impl EventSink for HubSink {
    fn emit(&self, prompt_id: &str, event: Event) {
        if let Some(state) =
            self.progress.lock().unwrap_or_else(|p| p.into_inner()).update(self.prompt_id, &event)
        {
            self.publish(None, &state, Audience::All);
        }
        let client_id = self.client_id.as_deref();
        if let Event::Executing { node } = &event {
            let running =
                Delivery::running(&self.workspace, prompt_id, client_id, Some(&node.0), true);
            self.runtime.deliver(running);
        }
        if let Event::Preview { node, preview } = &event {
            let (plain, with_metadata) = preview_frames(self.prompt_id, node, preview);
            self.runtime.deliver(Delivery::Preview {
                workspace: self.workspace.to_string(),
                client_id: self.client_id.clone(),
                plain,
                with_metadata,
            });
        }
        if matches!(
            event,
            Event::ExecutionSuccess | Event::ExecutionError(_) | Event::ExecutionInterrupted { .. }
        ) {
            *self.terminal.lock().unwrap_or_else(|p| p.into_inner()) = Some((event, now_ms()));
            return;
        }
        if let Some((message, audience)) = message(self.prompt_id, &event, now_ms()) {
            self.publish(client_id, &message, audience);
        }
    }
}

/// Starts the worker thread; it runs until `runtime.stop` is set.
pub(crate) fn start_worker(
    runtime: Arc<Service>,
    executor: Executor,
) -> std::thread::JoinHandle<()> {
    // The thread runs no async task, but it starts some (a claim's heartbeat) and owns connections that
    // need the runtime when they close.
    let handle = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("kiln-worker".to_owned())
        .spawn(move || {
            let _runtime = handle.enter();
            worker(runtime, executor)
        })
        .unwrap_or_else(|e| panic!("cannot start the worker thread: {e}"))
}

/// Where the worker takes its prompts: this server's queue, or, on a worker of a cluster, the shared one.
enum Source {
    Queue,
    Cluster(Arc<crate::cluster::Cluster>, Option<sqlx::postgres::PgListener>),
}

/// A prompt the worker took, and in a cluster its claim's attempt number.
struct Taken {
    entry: QueueEntry<Queued>,
    attempt: Option<i32>,
}

fn worker(runtime: Arc<Service>, mut executor: Executor) {
    let mut source = match &runtime.cluster {
        Some(cluster) if cluster.role == ProcessRole::Worker => {
            Source::Cluster(cluster.clone(), None)
        }
        _ => Source::Queue,
    };
    while !runtime.stop.load(Ordering::SeqCst) {
        if runtime.drain.is_draining() {
            // Between prompts: nothing runs, and nothing more is taken.
            runtime.drain.note_worker_stopped();
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if let Source::Cluster(cluster, _) = &source {
            // `/free` on an API node reaches the workers through the database.
            let (unload, free) = cluster.take_free_request();
            runtime.unload_requested.fetch_or(unload, Ordering::SeqCst);
            runtime.free_requested.fetch_or(free, Ordering::SeqCst);
        }
        let free = runtime.free_requested.swap(false, Ordering::SeqCst);
        if runtime.unload_requested.swap(false, Ordering::SeqCst) || free {
            tracing::info!(free, "unloading every model, as /free asked");
            runtime.compute.unload_models();
        }
        if free {
            executor.cache_mut().clear();
        }
        let Some(taken) = take(&runtime, &mut source) else { continue };
        let handing_back = {
            let _gate = runtime.interrupt_gate.lock().unwrap_or_else(|p| p.into_inner());
            runtime.interrupt.store(false, Ordering::SeqCst);
            // Read under the gate: a hand-back that comes after this finds the prompt running and interrupts it.
            runtime.drain.is_handing_back()
        };
        if handing_back {
            hand_back(&runtime, &taken.entry.id, &taken.entry.payload.workspace.id, taken.attempt);
            continue;
        }
        run_one(&runtime, &mut executor, taken);
    }
}

/// The next prompt, waiting a little for one; `None` if none came (or taking failed, logged).
fn take(runtime: &Arc<Service>, source: &mut Source) -> Option<Taken> {
    let (cluster, listener) = match source {
        Source::Queue => {
            return match runtime.queue.pop(Duration::from_millis(200)) {
                Ok(entry) => entry.map(|entry| Taken { entry, attempt: None }),
                Err(error) => {
                    tracing::error!(%error, "cannot take the next prompt");
                    std::thread::sleep(Duration::from_secs(1));
                    None
                }
            };
        }
        Source::Cluster(cluster, listener) => (cluster, listener),
    };
    let claim = cluster.claim(&runtime.workspaces, listener, Duration::from_millis(200));
    let claimed = match runtime.storage.block_on(claim) {
        Ok(claimed) => claimed?,
        Err(error) => {
            tracing::error!(%error, "cannot claim the next prompt");
            std::thread::sleep(Duration::from_secs(1));
            return None;
        }
    };
    match claimed.prompt {
        Ok(entry) => {
            // This worker's own queue holds the prompt it runs (for `/metrics` and the drain).
            runtime.queue.admit(entry);
            let entry = runtime.queue.pop(Duration::ZERO).ok().flatten()?;
            Some(Taken { entry, attempt: Some(claimed.attempt) })
        }
        Err(unrunnable) => {
            record_unrunnable(runtime, cluster, &claimed.id, claimed.attempt, unrunnable);
            None
        }
    }
}

/// Records as failed a claimed prompt this worker cannot run, and tells its owner.
fn record_unrunnable(
    runtime: &Service,
    cluster: &crate::cluster::Cluster,
    id: &str,
    attempt: i32,
    unrunnable: crate::cluster::Unrunnable,
) {
    tracing::warn!(prompt = %id, why = %unrunnable.why, "a claimed prompt cannot run here; recorded as failed");
    let prompt_id = id.parse::<uuid::Uuid>().unwrap_or_default();
    let failure = kiln_engine::exec::NodeFailure {
        node: kiln_engine::graph::NodeId(String::new()),
        class_type: String::new(),
        executed: Vec::new(),
        message: format!("this worker cannot run the prompt: {}", unrunnable.why),
        kind: kiln_engine::nodes::ErrorKind::Failed,
        current_inputs: Default::default(),
        current_outputs: Vec::new(),
    };
    let timestamp = now_ms();
    let error = Event::ExecutionError(Box::new(failure));
    let client_id = unrunnable.stored.client_id.clone();
    let mut closing: Vec<Delivery> = message(prompt_id, &error, timestamp)
        .and_then(|(m, audience)| {
            Delivery::message(&unrunnable.workspace, client_id.as_deref(), &m, audience)
        })
        .into_iter()
        .collect();
    closing.extend(Delivery::ended(&unrunnable.workspace, id, client_id.as_deref()));
    let messages = message(prompt_id, &error, timestamp)
        .and_then(|(wire, _)| serde_json::to_value(wire).ok())
        .map(|v| vec![("execution_error".to_owned(), v["data"].clone())])
        .unwrap_or_default();
    let record = Record {
        workspace: unrunnable.workspace.as_str().into(),
        prompt_id: id.to_owned(),
        number: unrunnable.number,
        prompt: unrunnable.stored.prompt,
        extra_data: unrunnable.stored.extra_data,
        outputs_to_execute: unrunnable.stored.outputs,
        outputs: Default::default(),
        success: false,
        messages,
    };
    if let Err(error) = runtime.storage.block_on(cluster.finish(attempt, &record, &closing)) {
        tracing::error!(%error, "cannot record the prompt as failed");
    }
}

fn run_one(runtime: &Arc<Service>, executor: &mut Executor, taken: Taken) {
    let Taken { entry, attempt } = taken;
    let queued = entry.payload;
    let prompt_id = entry.id.parse::<uuid::Uuid>().unwrap_or_default();
    let client_id = queued.client_id.clone();
    let workspace = queued.workspace.id.clone();
    runtime.deliver(Delivery::running(&workspace, &entry.id, client_id.as_deref(), None, true));
    let heartbeat = match (&runtime.cluster, attempt) {
        (Some(cluster), Some(attempt)) => {
            let runtime = Arc::downgrade(runtime);
            Some(cluster.heartbeat(&entry.id, attempt, move |quiet| {
                let Some(runtime) = runtime.upgrade() else { return };
                let _gate = runtime.interrupt_gate.lock().unwrap_or_else(|p| p.into_inner());
                if !quiet.load(Ordering::SeqCst) {
                    runtime.interrupt.store(true, Ordering::SeqCst);
                }
            }))
        }
        _ => None,
    };
    let sink = Arc::new(HubSink {
        runtime: runtime.clone(),
        workspace: workspace.clone(),
        client_id: client_id.clone(),
        prompt_id,
        progress: Mutex::new(ProgressState::default()),
        terminal: Mutex::new(None),
    });
    let recorder = Arc::new(HistoryRecorder::new(sink.clone()));
    let extra_pnginfo =
        Arc::new(queued.extra_data.get("extra_pnginfo").cloned().unwrap_or(Value::Null));
    let prompt_json = Arc::new(queued.prompt_json);
    let run = Run {
        prompt_id: &entry.id,
        prompt: &queued.prompt,
        prompt_json: prompt_json.clone(),
        extra_pnginfo,
        preview_method: preview_method(&queued.extra_data, runtime.preview_method),
        scope: Some(&queued.workspace.scope),
    };
    let _span = tracing::info_span!("prompt", id = %entry.id, %workspace).entered();
    let started = std::time::Instant::now();
    let summary = executor.run(&run, recorder.clone());
    // The run's share of the prompt JSON goes, so the history record takes it without a copy.
    drop(run);
    if let Some(heartbeat) = &heartbeat {
        let _gate = runtime.interrupt_gate.lock().unwrap_or_else(|p| p.into_inner());
        heartbeat.quiet();
    }
    let lost = heartbeat.as_ref().is_some_and(|h| h.lost());
    let finished = match &summary.outcome {
        _ if lost => Finished::HandedBack,
        Outcome::Success => Finished::Success,
        Outcome::Failed(_) => Finished::Error,
        Outcome::Interrupted { .. } if runtime.drain.is_handing_back() => Finished::HandedBack,
        Outcome::Interrupted { .. } => Finished::Interrupted,
    };
    runtime.metrics.finished(
        finished,
        started.elapsed(),
        summary.executed.len(),
        summary.cached.len(),
    );
    if lost {
        // Another worker has the prompt now, or the sweeper recorded it: nothing of this run is kept.
        runtime.queue.retire(&entry.id);
        return;
    }
    if finished == Finished::HandedBack {
        hand_back(runtime, &entry.id, &workspace, attempt);
        return;
    }
    match &summary.outcome {
        Outcome::Success => tracing::info!(
            executed = summary.executed.len(),
            cached = summary.cached.len(),
            "prompt executed"
        ),
        Outcome::Failed(f) => {
            tracing::warn!(node = %f.node, class = %f.class_type, error = %f.message, "prompt failed")
        }
        Outcome::Interrupted { node, .. } => tracing::info!(%node, "prompt interrupted"),
    }

    let messages = recorder
        .take()
        .into_iter()
        .filter_map(|m| {
            let (wire, _) = message(prompt_id, &m.event, m.timestamp_ms as i64)?;
            let value = serde_json::to_value(wire).ok()?;
            Some((value["type"].as_str()?.to_owned(), value["data"].clone()))
        })
        .collect();
    let record = Record {
        workspace: workspace.clone(),
        prompt_id: entry.id.clone(),
        number: entry.number,
        prompt: Arc::unwrap_or_clone(prompt_json),
        extra_data: queued.extra_data,
        outputs_to_execute: queued.outputs,
        outputs: summary
            .outputs
            .iter()
            .map(|(node, ui)| (node.0.clone(), node_output(ui)))
            .collect(),
        success: summary.outcome == Outcome::Success,
        messages,
    };
    let terminal = sink.terminal();
    let last = Delivery::ended(&workspace, &entry.id, client_id.as_deref());
    // Store first (the history entry and the removal of the queue row, in one transaction), then announce.
    if let (Some(cluster), Some(attempt)) = (&runtime.cluster, attempt) {
        let mut closing: Vec<Delivery> = terminal.into_iter().collect();
        closing.extend(last);
        match runtime.storage.block_on(cluster.finish(attempt, &record, &closing)) {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "the claim was taken back as the prompt ended; its result is dropped"
            ),
            Err(error) => tracing::error!(%error, "cannot store the history entry"),
        }
        runtime.queue.retire(&entry.id);
        return;
    }
    if let Err(error) = runtime.storage.insert_history(&record).wait() {
        tracing::error!(error = %error, "cannot store the history entry");
    }
    runtime.history().insert(record);
    if let Some(terminal) = terminal {
        runtime.deliver(terminal);
    }
    runtime.queue.retire(&entry.id);
    for delivery in last {
        runtime.deliver(delivery);
    }
}

/// Puts a prompt a draining server interrupted back in the queue: pending again on disk (it runs again at the
/// next start, or on another worker of a cluster), no history entry, and its held terminal event never sent.
fn hand_back(runtime: &Service, id: &str, workspace: &str, attempt: Option<i32>) {
    let handed = match (&runtime.cluster, attempt) {
        (Some(cluster), Some(attempt)) => runtime
            .storage
            .block_on(cluster.hand_back(id, workspace, attempt))
            .map_err(|e| e.to_string()),
        _ => runtime.storage.hand_back(id).wait().map_err(|e| e.to_string()),
    };
    match handed {
        Ok(()) => tracing::info!("prompt handed back to the queue"),
        Err(error) => tracing::error!(%error, "cannot hand the prompt back to the queue"),
    }
    runtime.queue.retire(id);
    if attempt.is_none() {
        runtime.deliver(Delivery::running(workspace, id, None, None, false));
    }
}

/// The worker's cache for a mode: RAM pressure reads the machine's RAM (cgroup limits included) and uses
/// upstream's thresholds unless GB figures are given; the memory manager's arbitration shares both.
pub(crate) fn cache(mode: crate::config::CacheMode) -> Cache {
    use kiln_engine::cache::{CachePolicy, RamPressure};
    let policy = match mode {
        crate::config::CacheMode::Classic => CachePolicy::Classic,
        crate::config::CacheMode::Lru(n) => CachePolicy::Lru(n),
        crate::config::CacheMode::None => CachePolicy::None,
        crate::config::CacheMode::RamPressure { active_gb, inactive_gb } => {
            let mut pressure = RamPressure::system();
            pressure.thresholds = pressure.thresholds.with_cache_ram(active_gb, inactive_gb);
            CachePolicy::RamPressure(pressure)
        }
    };
    Cache::new(policy)
}
