//! An API node's queue: a mirror of the queue table, so `/queue`, `/api/jobs`, cancel, interrupt and the
//! `status` counters read memory as on a single server. It follows the table on every `kiln_queue`
//! notification and every [`POLL`](super::POLL); a prompt this node accepts is in it at once (its own submits
//! and deletions change it directly, through [`MirrorStore`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kiln_engine::queue::{QueueEntry, QueueStore, StoreError, SyncRow};

use super::{Cluster, POLL, QUEUE_CHANNEL, listener, wait_for};
use crate::service::queued::Queued;
use crate::service::worker::Service;

/// The queue store of an API node: removals go to the shared table; it runs nothing, and its mirror starts
/// empty (the first sync fills it).
pub(crate) struct MirrorStore {
    cluster: Arc<Cluster>,
    handle: tokio::runtime::Handle,
}

impl MirrorStore {
    /// The store over the cluster's database; called on the async runtime the store will block on.
    pub(crate) fn new(cluster: Arc<Cluster>) -> MirrorStore {
        MirrorStore { cluster, handle: tokio::runtime::Handle::current() }
    }
}

fn failed(error: sqlx::Error) -> StoreError {
    StoreError(error.to_string())
}

impl QueueStore<Queued> for MirrorStore {
    fn insert(&self, entry: &QueueEntry<Queued>) -> Result<(), StoreError> {
        let queued =
            self.handle.block_on(self.cluster.enqueue(&entry.id, entry.number, &entry.payload));
        match queued.map_err(failed)? {
            Some(_) => Ok(()),
            None => Err(StoreError(format!("a prompt with id {} is already queued", entry.id))),
        }
    }

    fn mark_running(&self, _: &str) -> Result<(), StoreError> {
        Ok(())
    }

    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        self.handle.block_on(self.cluster.dequeue(ids)).map_err(failed)
    }

    fn load(&self) -> Result<Vec<(QueueEntry<Queued>, bool)>, StoreError> {
        Ok(Vec::new())
    }
}

/// A queue row without its payload.
#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    number: f64,
    seq: i64,
    running: bool,
}

/// Brings the runtime's queue up to the table once: the rows' places and states, the payloads of the prompts
/// new to this node (validated in their workspace off the async threads).
pub(crate) async fn sync(runtime: &Arc<Service>, cluster: &Cluster) -> Result<(), sqlx::Error> {
    let rows: Vec<Row> =
        sqlx::query_as("SELECT id, number, seq, running <> 0 AS running FROM queue")
            .fetch_all(&cluster.pool)
            .await?;
    let known = runtime.queue.ids();
    let unknown: Vec<String> =
        rows.iter().filter(|row| !known.contains(&row.id)).map(|row| row.id.clone()).collect();
    let mut new = HashMap::new();
    if !unknown.is_empty() {
        let payloads: Vec<(String, String, String)> =
            sqlx::query_as("SELECT id, workspace, payload FROM queue WHERE id = ANY($1)")
                .bind(&unknown)
                .fetch_all(&cluster.pool)
                .await?;
        let workspaces = runtime.workspaces.clone();
        new = tokio::task::spawn_blocking(move || {
            payloads
                .into_iter()
                .filter_map(|(id, workspace, payload)| {
                    match Queued::from_stored(&workspaces, &workspace, &payload) {
                        Ok(queued) => Some((id, queued)),
                        Err(error) => {
                            tracing::debug!(%id, %error, "a queued prompt this node cannot show");
                            None
                        }
                    }
                })
                .collect()
        })
        .await
        .unwrap_or_default();
    }
    let rows: Vec<SyncRow> = rows
        .into_iter()
        .map(|row| SyncRow {
            id: row.id,
            number: row.number,
            seq: row.seq.max(0) as u64,
            running: row.running,
        })
        .collect();
    let changed = rows.len() != known.len() || rows.iter().any(|row| !known.contains(&row.id));
    let running_now: HashSet<String> =
        runtime.queue.running().into_iter().map(|entry| entry.id).collect();
    let runs_changed = rows.iter().any(|row| row.running != running_now.contains(&row.id));
    if changed || runs_changed {
        runtime.queue.sync(&rows, new);
    }
    Ok(())
}

/// Follows the queue table until the server stops.
pub(crate) async fn follow(runtime: Arc<Service>, cluster: Arc<Cluster>) {
    let mut listener = listener(&cluster.pool, QUEUE_CHANNEL).await;
    while !runtime.stop.load(std::sync::atomic::Ordering::SeqCst) {
        if let Err(error) = sync(&runtime, &cluster).await {
            tracing::warn!(%error, "cannot read the shared queue");
        }
        wait_for(&mut listener, &cluster.pool, QUEUE_CHANNEL, POLL).await;
    }
}
