//! The server's metrics, served at `GET /metrics` in the OpenMetrics text format that Prometheus scrapes.
//!
//! What happens (prompts submitted, finished, their latencies, nodes run or served from the cache) is counted
//! as it happens in [`Metrics`]; what the server holds (queue depth, the worker's state, memory, sockets) is
//! read at each scrape into a [`Snapshot`]. No metric is labelled by workspace, user or prompt: the series
//! stay few however many tenants there are.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The media type of the answer (OpenMetrics 1.0 text).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One label, e.g. `outcome="success"`.
type Label = [(&'static str, &'static str); 1];

/// How a submitted prompt was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// Queued.
    Accepted,
    /// Refused for what the client sent (no prompt, bad shape, a graph that does not validate, an id in use).
    Rejected,
    /// Kiln itself failed (the queue store, validation's task).
    Failed,
}

impl Submitted {
    fn label(self) -> &'static str {
        match self {
            Submitted::Accepted => "accepted",
            Submitted::Rejected => "rejected",
            Submitted::Failed => "failed",
        }
    }
}

/// How a prompt that ran ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// Every output ran.
    Success,
    /// A node failed.
    Error,
    /// Interrupted (by a client, or a server that stopped).
    Interrupted,
    /// Interrupted by a draining server and put back in the queue, to run again.
    HandedBack,
}

impl Finished {
    fn label(self) -> &'static str {
        match self {
            Finished::Success => "success",
            Finished::Error => "error",
            Finished::Interrupted => "interrupted",
            Finished::HandedBack => "handed_back",
        }
    }
}

/// What the worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerState {
    /// Waiting for a prompt.
    Idle,
    /// Running a prompt.
    Running,
    /// The server drains: the worker takes no new prompt (it may still finish the one it runs).
    Draining,
}

impl WorkerState {
    const ALL: [WorkerState; 3] = [WorkerState::Idle, WorkerState::Running, WorkerState::Draining];

    fn label(self) -> &'static str {
        match self {
            WorkerState::Idle => "idle",
            WorkerState::Running => "running",
            WorkerState::Draining => "draining",
        }
    }
}

/// What the server holds at a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Prompts waiting in the queue (every workspace).
    pub(crate) pending: usize,
    /// Prompts running.
    pub(crate) running: usize,
    /// The worker's state.
    pub(crate) worker: WorkerState,
    /// Open websockets.
    pub(crate) websockets: usize,
    /// Device bytes the memory manager's budget counts (weights, scratch, activations).
    pub(crate) device_used: u64,
    /// The device budget (device memory minus the headroom).
    pub(crate) device_budget: u64,
    /// Device memory.
    pub(crate) device_capacity: u64,
    /// Weight bytes resident on the device.
    pub(crate) device_weights: u64,
    /// Host bytes holding weights.
    pub(crate) host_weights: u64,
    /// Of those, pinned (page-locked, registered with the device).
    pub(crate) pinned_weights: u64,
    /// Copies that could not use pinned memory.
    pub(crate) pageable_copies: u64,
    /// Models the memory manager holds.
    pub(crate) models: u64,
    /// Models loaded since the server started.
    pub(crate) model_loads: u64,
    /// The host's memory.
    pub(crate) host_total: u64,
    /// The host's available memory.
    pub(crate) host_available: u64,
}

/// The counters and histograms, updated as things happen (cheap to share: each is an `Arc` inside).
#[derive(Debug)]
pub(crate) struct Metrics {
    submitted: Family<Label, Counter>,
    accept_seconds: Histogram,
    finished: Family<Label, Counter>,
    run_seconds: Histogram,
    nodes: Family<Label, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            submitted: Family::default(),
            // 0.25 ms to 4 s.
            accept_seconds: Histogram::new(exponential_buckets(0.000_25, 2.0, 15)),
            finished: Family::default(),
            // 50 ms to 27 min.
            run_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
            nodes: Family::default(),
        }
    }
}

impl Metrics {
    /// A prompt was submitted (HTTP or MCP) and answered after `took`.
    pub(crate) fn submitted(&self, result: Submitted, took: Duration) {
        self.submitted.get_or_create(&[("result", result.label())]).inc();
        if result == Submitted::Accepted {
            self.accept_seconds.observe(took.as_secs_f64());
        }
    }

    /// A prompt ran for `took`, executing `executed` nodes and taking `cached` from the cache.
    pub(crate) fn finished(
        &self,
        outcome: Finished,
        took: Duration,
        executed: usize,
        cached: usize,
    ) {
        self.finished.get_or_create(&[("outcome", outcome.label())]).inc();
        self.run_seconds.observe(took.as_secs_f64());
        self.nodes.get_or_create(&[("result", "executed")]).inc_by(executed as u64);
        self.nodes.get_or_create(&[("result", "cached")]).inc_by(cached as u64);
    }

    /// Every metric in the OpenMetrics text format, with the held state of `now`.
    pub(crate) fn encode(&self, now: &Snapshot) -> String {
        let mut registry = Registry::with_prefix("kiln");
        registry.register(
            "prompts_submitted",
            "Prompts submitted, by how they were answered (accepted, rejected, failed)",
            self.submitted.clone(),
        );
        registry.register_with_unit(
            "prompt_accept",
            "Time from a submitted prompt's arrival to its durable acceptance",
            Unit::Seconds,
            self.accept_seconds.clone(),
        );
        registry.register(
            "prompts_finished",
            "Prompts that ran, by outcome (success, error, interrupted, handed_back)",
            self.finished.clone(),
        );
        registry.register_with_unit(
            "prompt_run",
            "Time a prompt ran, from the worker taking it to its history entry",
            Unit::Seconds,
            self.run_seconds.clone(),
        );
        registry.register(
            "nodes",
            "Nodes of finished prompts, executed or served from the node cache (cache hits)",
            self.nodes.clone(),
        );
        let queue =
            [("pending", gauge(now.pending as u64)), ("running", gauge(now.running as u64))];
        registry.register(
            "queue_prompts",
            "Prompts in the queue, pending or running",
            labelled("state", queue),
        );
        let worker = WorkerState::ALL.map(|state| (state.label(), i64::from(now.worker == state)));
        registry.register(
            "worker_state",
            "The worker's state (1 for the current one)",
            labelled("state", worker),
        );
        registry.register(
            "websockets",
            "Open event websockets",
            ConstGauge::new(gauge(now.websockets as u64)),
        );
        let device = [
            ("used", now.device_used),
            ("budget", now.device_budget),
            ("capacity", now.device_capacity),
            ("weights", now.device_weights),
        ];
        registry.register_with_unit(
            "device_memory",
            "The memory manager's device memory: used (what the budget counts), the budget, the device's \
             capacity, and the weights resident",
            Unit::Bytes,
            labelled("kind", device.map(|(kind, bytes)| (kind, gauge(bytes)))),
        );
        let host = [
            ("weights", now.host_weights),
            ("pinned", now.pinned_weights),
            ("total", now.host_total),
            ("available", now.host_available),
        ];
        registry.register_with_unit(
            "host_memory",
            "Host memory: weights held, of those pinned (page-locked), the host's total and available",
            Unit::Bytes,
            labelled("kind", host.map(|(kind, bytes)| (kind, gauge(bytes)))),
        );
        registry.register(
            "pageable_copies",
            "Weight copies that could not use pinned memory",
            ConstCounter::new(now.pageable_copies),
        );
        registry.register(
            "models",
            "Models the memory manager holds",
            ConstGauge::new(gauge(now.models)),
        );
        registry.register(
            "model_loads",
            "Models loaded since the server started (a reload counts again)",
            ConstCounter::new(now.model_loads),
        );
        let mut text = String::new();
        // Writing into a String cannot fail; the registry's own names are valid.
        if let Err(error) = encode(&mut text, &registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }
}

/// A gauge family of one label `key`, a series per `(value, reading)`.
fn labelled<const N: usize>(
    key: &'static str,
    series: [(&'static str, i64); N],
) -> Family<Label, Gauge> {
    let family: Family<Label, Gauge> = Family::default();
    for (value, reading) in series {
        family.get_or_create(&[(key, value)]).set(reading);
    }
    family
}

/// A byte count or count as a gauge's value.
fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
