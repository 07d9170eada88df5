//! The operations on a workspace's prompts, which both runtimes' handlers call: submit, the queue as the caller
//! sees it, cancel, interrupt, and removing queued prompts or history entries. Each takes the [`Caller`] and
//! answers with a domain result; the handlers (`api.rs`) only turn these into the operations' responses.
//!
//! Invariant: another workspace's prompt is never seen, changed or stopped here; to the caller it does not
//! exist (a cancel answers "not cancelled", an interrupt does nothing), so nothing says it is there.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::graph::{NodeId, Prompt, PromptRejection, validate};
use kiln_engine::queue::{QueueEntry, StoreError};
use kiln_spec::types;
use serde_json::{Map, Value};

use super::worker::{Queued, Service, now_ms};
use crate::config::ProcessRole;
use crate::metrics::Submitted;
use crate::storage::StorageError;
use crate::workspace::Caller;
use crate::ws::Delivery;

/// Prompts with at most this many nodes are validated on the request's own task (about 0.1 ms).
const INLINE_VALIDATION_NODES: usize = 32;

/// Why a prompt was not queued.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The request has no `prompt`.
    #[error("No prompt provided")]
    NoPrompt,
    /// `prompt_id` is not a canonical lowercase UUID.
    #[error("prompt_id must be a valid UUID")]
    InvalidPromptId,
    /// A field does not have the shape the API expects.
    #[error("`{at}` is not what the API expects")]
    Shape {
        /// Where: `prompt`, `extra_data`, or a path inside them.
        at: String,
        /// What is wrong.
        why: String,
    },
    /// The graph does not validate.
    #[error("the prompt does not validate")]
    Rejected(Box<PromptRejection>),
    /// A prompt with this id is queued or running.
    #[error("prompt_id is already queued or running")]
    InUse(String),
    /// Kiln itself failed (validation's task, the queue store).
    #[error("{what} failed")]
    Failed {
        /// What failed.
        what: &'static str,
        /// Why (for the log).
        cause: String,
    },
}

/// A queued prompt, as the answer to a submit reports it.
pub(crate) struct Accepted {
    /// Its id.
    pub(crate) prompt_id: String,
    /// Its number.
    pub(crate) number: f64,
    /// The outputs that did not validate (the others run).
    pub(crate) node_errors: kiln_spec::IndexMap<String, types::NodeValidationError>,
}

/// A canonical lowercase hyphenated UUID (what ComfyUI accepts as a prompt or job id).
pub(crate) fn canonical_uuid(id: &str) -> bool {
    id.parse::<uuid::Uuid>().is_ok_and(|u| u.hyphenated().to_string() == id)
}

/// Checks a request field kept as raw JSON against its schema's typed twin.
fn check_shape<T: serde::de::DeserializeOwned>(
    field: &str,
    value: &Value,
) -> Result<(), SubmitError> {
    let Err(e) = crate::api::strict_from_value::<T>(value) else { return Ok(()) };
    let at = if e.path == "." { field.to_owned() } else { format!("{field}.{}", e.path) };
    Err(SubmitError::Shape { at, why: e.error.to_string() })
}

/// Whether a queued prompt belongs to the caller's workspace.
pub(crate) fn owned(caller: &Caller, entry: &QueueEntry<Queued>) -> bool {
    entry.payload.in_workspace(caller.workspace_id())
}

impl Service {
    /// Validates a prompt in the caller's workspace and queues it durably at `number` (taken by the handler
    /// first, as ComfyUI takes it even for a prompt it then rejects); counted in the metrics.
    pub(crate) async fn submit(
        &self,
        caller: &Caller,
        number: f64,
        request: types::PromptRequest,
        usage_source: Option<String>,
    ) -> Result<Accepted, SubmitError> {
        let started = std::time::Instant::now();
        let result = self.accept(caller, number, request, usage_source).await;
        let submitted = match &result {
            Ok(_) => Submitted::Accepted,
            Err(SubmitError::Failed { .. }) => Submitted::Failed,
            Err(_) => Submitted::Rejected,
        };
        self.metrics.submitted(submitted, started.elapsed());
        result
    }

    /// [`Service::submit`] without the counting.
    async fn accept(
        &self,
        caller: &Caller,
        number: f64,
        request: types::PromptRequest,
        usage_source: Option<String>,
    ) -> Result<Accepted, SubmitError> {
        let prompt = request.prompt.ok_or(SubmitError::NoPrompt)?;
        let prompt_id = match request.prompt_id {
            Some(id) if !canonical_uuid(&id) => return Err(SubmitError::InvalidPromptId),
            Some(id) => id,
            None => uuid::Uuid::new_v4().to_string(),
        };
        // The wire types keep the prompt and extra_data as the client sent them (for the echo); their shapes
        // are checked here against the spec, through their generated typed twins.
        let prompt_json = serde_json::to_value(&prompt).unwrap_or(Value::Null);
        check_shape::<types::PromptShape>("prompt", &prompt_json)?;
        let extra_json = serde_json::to_value(&request.extra_data).unwrap_or(Value::Null);
        if !extra_json.is_null() {
            check_shape::<types::ExtraDataShape>("extra_data", &extra_json)?;
        }
        let parsed = Prompt::from_json(&prompt_json).map_err(|_| SubmitError::Shape {
            at: "prompt".to_owned(),
            why: "the prompt must be an object".to_owned(),
        })?;
        let targets: Option<Vec<NodeId>> =
            request.partial_execution_targets.map(|t| t.into_iter().map(NodeId).collect());
        if let Some(stored) = caller.workspace.stored.clone() {
            // The files the prompt names, uploaded through any node: here before LoadImage checks for them. One
            // that did not come fails validation, naming it (a string that only looks like a file name is no
            // reason to refuse the prompt).
            let named = prompt_json.clone();
            let bring = move || stored.bring_named(&named);
            crate::store::logged("cannot bring in a prompt's files", bring).await;
        }
        let registry = caller.workspace.registry().clone();
        // Validation costs about 3 µs a node: typical prompts are validated in place (a hop to the blocking
        // pool and back costs more than that under load), large ones off the async threads.
        let validated = if parsed.nodes.len() <= INLINE_VALIDATION_NODES {
            validate(&parsed, &registry, targets.as_deref())
        } else {
            tokio::task::spawn_blocking(move || validate(&parsed, &registry, targets.as_deref()))
                .await
                .map_err(|e| SubmitError::Failed { what: "validating", cause: e.to_string() })?
        };
        let validated = validated.map_err(|r| SubmitError::Rejected(Box::new(r)))?;

        let mut extra_data: Map<String, Value> = request.extra_data.unwrap_or_default();
        if let Some(client_id) = &request.client_id {
            extra_data.insert("client_id".to_owned(), Value::from(client_id.clone()));
        }
        if let Some(source) = usage_source {
            extra_data.entry("comfy_usage_source").or_insert(Value::from(source));
        }
        extra_data.insert("create_time".to_owned(), Value::from(now_ms()));
        let client_id = extra_data.get("client_id").and_then(Value::as_str).map(str::to_owned);
        let node_errors = crate::convert::node_errors(&validated.node_errors);
        let outputs = validated.outputs.iter().map(|o| o.0.clone()).collect();
        let queued = Queued {
            workspace: caller.workspace.clone(),
            // Stored, echoed and written into PNG metadata as the client sent it (ComfyUI keeps the dict).
            prompt_json,
            prompt: Arc::new(validated),
            extra_data,
            client_id,
            outputs,
        };
        // Queued means durable: the prompt is stored (with the prompts that arrive with it, in one group
        // commit) before it is admitted and answered. Only taking the place holds the queue.
        let ticket = match self.queue.reserve(prompt_id.clone(), number) {
            Ok(ticket) => ticket,
            Err(e) => return Err(SubmitError::InUse(e.to_string())),
        };
        if let Some(cluster) = &self.cluster {
            // In a cluster the shared table is the queue: the prompt takes its arrival from it.
            let failed = |e: sqlx::Error| SubmitError::Failed {
                what: "the shared queue",
                cause: e.to_string(),
            };
            let seq = cluster.enqueue(&prompt_id, number, &queued).await;
            let seq = match seq.map_err(failed) {
                Ok(Some(seq)) => seq,
                Ok(None) => {
                    self.queue.abandon(&prompt_id);
                    return Err(SubmitError::InUse(format!(
                        "a prompt with id {prompt_id} is already queued or running"
                    )));
                }
                Err(error) => {
                    self.queue.abandon(&prompt_id);
                    return Err(error);
                }
            };
            self.queue.admit_new(kiln_engine::queue::Ticket { seq, ..ticket }.entry(queued));
            return Ok(Accepted { prompt_id, number, node_errors });
        }
        let entry = ticket.entry(queued);
        if let Err(e) = self.storage.insert_queued(&entry).done().await {
            self.storage.forget_queued(&entry.id);
            self.queue.abandon(&entry.id);
            return Err(SubmitError::Failed { what: "the queue store", cause: e.to_string() });
        }
        self.queue.admit(entry);
        Ok(Accepted { prompt_id, number, node_errors })
    }

    /// The caller's workspace's running and pending prompts (whether each runs).
    pub(crate) fn queued(&self, caller: &Caller) -> Vec<(QueueEntry<Queued>, bool)> {
        let mine = |e: &QueueEntry<Queued>| owned(caller, e);
        self.queue
            .running()
            .into_iter()
            .filter(mine)
            .map(|e| (e, true))
            .chain(self.queue.pending().into_iter().filter(mine).map(|e| (e, false)))
            .collect()
    }

    /// Cancels one of the caller's prompts: interrupts it if it runs, dequeues it if pending; `false` if the
    /// caller has no such prompt.
    pub(crate) fn cancel(&self, caller: &Caller, id: &str) -> Result<bool, StoreError> {
        if self.interrupt_running(|r| r.id == id && owned(caller, r)) {
            return Ok(true);
        }
        Ok(!self.queue.delete_where(|e| e.id == id && owned(caller, e))?.is_empty())
    }

    /// Interrupts the caller's running prompt (only `target` if given); whether one was interrupted.
    pub(crate) fn interrupt(&self, caller: &Caller, target: Option<&str>) -> bool {
        let interrupted = self.interrupt_running(|running| {
            owned(caller, running) && target.is_none_or(|target| target == running.id)
        });
        if let (false, Some(target)) = (interrupted, target) {
            tracing::info!(target, "interrupt ignored: that prompt is not running");
        }
        interrupted
    }

    /// Interrupts the running prompt, whoever owns it, to hand it back to the queue (a draining server that
    /// will not wait longer); whether one was running.
    pub(crate) fn hand_back_running(&self) -> bool {
        if self.cluster.as_ref().is_some_and(|c| c.role == ProcessRole::Api) {
            return false;
        }
        self.drain.hand_back();
        self.interrupt_running(|_| true)
    }

    /// Interrupts the running prompt if `chosen` says so; the check and the flag happen under the interrupt
    /// gate, so the flag never outlives the prompt it was meant for.
    fn interrupt_running(&self, chosen: impl Fn(&QueueEntry<Queued>) -> bool) -> bool {
        let _gate = self.interrupt_gate.lock().unwrap_or_else(|p| p.into_inner());
        let hits: Vec<String> =
            self.queue.running().into_iter().filter(|r| chosen(r)).map(|r| r.id).collect();
        match &self.cluster {
            // On an API node the prompt runs on a worker, which reads the flag with its next heartbeat.
            Some(cluster) if cluster.role == ProcessRole::Api => {
                for id in hits.clone() {
                    let cluster = cluster.clone();
                    tokio::spawn(async move {
                        if let Err(error) = cluster.interrupt(&id).await {
                            tracing::error!(%error, prompt = %id, "cannot ask the worker to interrupt");
                        }
                    });
                }
            }
            _ if !hits.is_empty() => self.interrupt.store(true, Ordering::SeqCst),
            _ => {}
        }
        !hits.is_empty()
    }

    /// Removes the caller's pending prompts: all of them with `clear`, and those named in `ids`. Returns the
    /// removed entries (the caller frees them when it suits it: thousands take a while).
    pub(crate) fn remove_queued(
        &self,
        caller: &Caller,
        clear: bool,
        ids: &[String],
    ) -> Result<Vec<QueueEntry<Queued>>, StoreError> {
        let mine = |e: &QueueEntry<Queued>| owned(caller, e);
        let mut removed = if clear { self.queue.delete_where(mine)? } else { Vec::new() };
        let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
        removed.extend(self.queue.delete_where(|e| ids.contains(e.id.as_str()) && mine(e))?);
        Ok(removed)
    }

    /// Makes sure this API node of a cluster holds a prompt's history entry if the database has it (its
    /// events reader may be behind the node the owner heard the prompt end on). Nothing on a single server.
    pub(crate) async fn catch_up_history(&self, caller: &Caller, id: &str) {
        let Some(cluster) = self.cluster.as_ref().filter(|c| c.role == ProcessRole::Api) else {
            return;
        };
        let workspace = caller.workspace_id();
        if !canonical_uuid(id) || self.history().of(workspace).get(id).is_some() {
            return;
        }
        match crate::cluster::load_history(cluster, workspace, id).await {
            Ok(Some(record)) => self.history().insert(record),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, prompt = id, "cannot read a history entry"),
        }
    }

    /// Removes history entries of the caller's workspace: all with `clear`, and those named in `ids`; stored
    /// first, then forgotten.
    pub(crate) async fn remove_history(
        &self,
        caller: &Caller,
        clear: bool,
        ids: &[String],
    ) -> Result<(), StorageError> {
        let workspace = caller.workspace_id();
        if clear {
            self.storage.clear_history(workspace).await?;
        }
        self.storage.delete_history(workspace, ids).await?;
        {
            let mut histories = self.history();
            let history = histories.of_mut(workspace);
            if clear {
                history.clear();
            }
            history.delete(ids);
        }
        if let Some(cluster) = &self.cluster {
            let removed = Delivery::HistoryRemoved {
                workspace: workspace.to_owned(),
                clear,
                ids: ids.to_vec(),
            };
            cluster.announce(&[removed]).await.map_err(StorageError::Database)?;
        }
        Ok(())
    }
}
