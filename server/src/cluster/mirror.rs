//! An API node's queue: a mirror of the queue table, so `/queue`, `/api/jobs`, cancel, interrupt and the
//! `status` counters read memory as on a single server. It follows the table on every `kiln_queue`
//! notification and every [`POLL`](super::POLL); a prompt this node accepts is in it at once (its own submits
//! and deletions change it directly, through [`MirrorStore`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long a prompt heard to have stopped is kept out of the mirror (longer than a sync's read can lag).
const ENDED_KEPT: Duration = Duration::from_secs(30);

/// The shortest time between two syncs.
const SYNC_EVERY: Duration = Duration::from_millis(100);

/// How long a prompt that left the table stays running in the mirror, waiting for the event that it stopped
/// (so `status` follows its terminal frame, as on a single server).
const LEAVING_WAIT: Duration = Duration::from_secs(10);

/// What a mirror remembers between syncs.
#[derive(Default)]
pub(crate) struct MirrorState {
    /// Prompts running here that left the table, since when.
    leaving: HashMap<String, Instant>,
    /// Rows this node cannot show (their workspace does not open or they do not validate here).
    unshowable: HashSet<String>,
}

/// Brings the runtime's queue up to the table once: the rows' places and states, the payloads of the prompts
/// new to this node (validated in their workspace off the async threads).
pub(crate) async fn sync(runtime: &Arc<Service>, cluster: &Cluster) -> Result<(), sqlx::Error> {
    let table: Vec<Row> =
        sqlx::query_as("SELECT id, number, seq, running <> 0 AS running FROM queue")
            .fetch_all(&cluster.pool)
            .await?;
    let states = runtime.queue.states();
    let in_table: HashSet<&str> = table.iter().map(|row| row.id.as_str()).collect();
    let mut mirror = std::mem::take(&mut *cluster.mirror.lock().unwrap_or_else(|p| p.into_inner()));
    mirror.unshowable.retain(|id| in_table.contains(id.as_str()));
    let ended: HashSet<String> = {
        let mut ended = cluster.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.retain(|_, at| at.elapsed() < ENDED_KEPT);
        ended.keys().cloned().collect()
    };
    let mut rows: Vec<SyncRow> = table
        .iter()
        .filter(|row| !mirror.unshowable.contains(&row.id))
        // A stale read of a prompt that ended since (one handed back shows pending again).
        .filter(|row| !(row.running && ended.contains(&row.id)))
        .map(|row| SyncRow {
            id: row.id.clone(),
            number: row.number,
            seq: row.seq.max(0) as u64,
            running: row.running,
        })
        .collect();
    // A prompt that ended stays running here until the event that says so, or LEAVING_WAIT.
    let now = Instant::now();
    for entry in runtime.queue.running() {
        if in_table.contains(entry.id.as_str()) || ended.contains(&entry.id) {
            continue;
        }
        let since = *mirror.leaving.entry(entry.id.clone()).or_insert(now);
        if now.duration_since(since) < LEAVING_WAIT {
            rows.push(SyncRow {
                id: entry.id,
                number: entry.number,
                seq: entry.seq,
                running: true,
            });
        }
    }
    mirror.leaving.retain(|id, _| states.get(id) == Some(&true));
    let unknown: Vec<String> =
        rows.iter().filter(|row| !states.contains_key(&row.id)).map(|row| row.id.clone()).collect();
    let mut new = HashMap::new();
    if !unknown.is_empty() {
        let payloads: Vec<(String, String, String)> =
            sqlx::query_as("SELECT id, workspace, payload FROM queue WHERE id = ANY($1)")
                .bind(&unknown)
                .fetch_all(&cluster.pool)
                .await?;
        let workspaces = runtime.workspaces.clone();
        let (shown, unshowable) = tokio::task::spawn_blocking(move || {
            let mut shown = HashMap::new();
            let mut unshowable = Vec::new();
            for (id, workspace, payload) in payloads {
                match Queued::from_stored(&workspaces, &workspace, &payload) {
                    Ok(queued) => {
                        shown.insert(id, queued);
                    }
                    Err(error) => {
                        tracing::warn!(%id, %error, "a queued prompt this node cannot show");
                        unshowable.push(id);
                    }
                }
            }
            (shown, unshowable)
        })
        .await
        .unwrap_or_default();
        new = shown;
        mirror.unshowable.extend(unshowable);
    }
    let changed = rows.len() != states.len()
        || rows.iter().any(|row| states.get(&row.id) != Some(&row.running));
    *cluster.mirror.lock().unwrap_or_else(|p| p.into_inner()) = mirror;
    if changed {
        runtime.queue.sync(&rows, new);
    }
    Ok(())
}

/// Follows the queue table until the server stops.
pub(crate) async fn follow(runtime: Arc<Service>, cluster: Arc<Cluster>) {
    let mut listener = listener(&cluster.pool, &[QUEUE_CHANNEL]).await;
    while !runtime.stop.load(std::sync::atomic::Ordering::SeqCst) {
        if let Err(error) = sync(&runtime, &cluster).await {
            tracing::warn!(%error, "cannot read the shared queue");
        }
        // At most SYNC_EVERY apart: under a flood every insert notifies, and a sync reads the whole table.
        tokio::time::sleep(SYNC_EVERY).await;
        wait_for(&mut listener, &cluster.pool, &[QUEUE_CHANNEL], POLL).await;
    }
}
