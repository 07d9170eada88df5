//! The events table: a worker appends what its runs tell the clients ([`Delivery`]), every API node reads the
//! rows in id order and hands them to its hub.
//!
//! A worker's events go through one [`Writer`] task, in batches (one transaction and one NOTIFY each, committed
//! without waiting for the WAL flush: progress that a Postgres crash loses is harmless); a run's last events are
//! written in the transaction that finishes it, after [`Writer::flush`], so they follow its progress.
//!
//! Ids come from a sequence, taken when a row is inserted, while rows become visible when their transaction
//! commits: two workers committing at once can make id 8 visible before id 7. A reader therefore stops at a gap
//! and waits for it to fill, up to [`GAP_WAIT`] (a gap that stays is a rolled-back transaction's).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::{Cluster, EVENTS_CHANNEL, POLL, listener, notify, wait_for};
use crate::service::history::Record;
use crate::service::worker::Service;
use crate::ws::Delivery;

/// How long a reader waits for a missing id before it reads past it.
const GAP_WAIT: Duration = Duration::from_secs(2);
/// Rows read at once.
const BATCH: i64 = 500;

/// Writes the deliveries of one transaction, in order, and notifies the API nodes at its commit.
pub(super) async fn insert(
    transaction: &mut Transaction<'_, Postgres>,
    deliveries: &[Delivery],
) -> Result<(), sqlx::Error> {
    let bodies: Vec<String> =
        deliveries.iter().filter_map(|d| serde_json::to_string(d).ok()).collect();
    if bodies.is_empty() {
        return Ok(());
    }
    // `WITH ORDINALITY`: the ids follow the order of the array.
    sqlx::query(
        "INSERT INTO events (body) SELECT body FROM UNNEST($1::text[]) WITH ORDINALITY AS t(body, n) \
         ORDER BY n",
    )
    .bind(&bodies)
    .execute(&mut **transaction)
    .await?;
    notify(transaction, EVENTS_CHANNEL).await
}

/// Where a worker's events go on their way to the API nodes, in order: [`Writer`], into the events table. A
/// message bus (NATS) can carry them instead; the events written with a prompt's finish (its last frames and
/// history announcement, in the finishing transaction) then reach it from the table as an outbox.
#[async_trait::async_trait]
pub(crate) trait EventSink: Send + Sync {
    /// Sends a delivery without waiting.
    fn send(&self, delivery: Delivery);
    /// Waits until everything sent before is where the API nodes read (or given up on).
    async fn flush(&self);
}

/// Where an API node reads the cluster's events, in the order they were written: [`TableFeed`], the events
/// table; a message bus (NATS) later.
#[async_trait::async_trait]
pub(crate) trait EventFeed: Send {
    /// The next events in order; empty when none came within a poll interval.
    async fn next(&mut self) -> Vec<Delivery>;
}

enum Command {
    Deliver(Delivery),
    Flush(oneshot::Sender<()>),
}

/// A worker's events writer: [`Writer::send`] never waits; a task writes what has arrived in batches.
pub(super) struct Writer {
    sender: mpsc::UnboundedSender<Command>,
}

impl Writer {
    /// Starts the task on the current runtime.
    pub(super) fn start(pool: PgPool) -> Writer {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(write_batches(pool, receiver));
        Writer { sender }
    }
}

#[async_trait::async_trait]
impl EventSink for Writer {
    fn send(&self, delivery: Delivery) {
        let _ = self.sender.send(Command::Deliver(delivery));
    }

    async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.sender.send(Command::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }
}

async fn write_batches(pool: PgPool, mut receiver: mpsc::UnboundedReceiver<Command>) {
    let mut batch = Vec::new();
    let mut flushed = Vec::new();
    while let Some(first) = receiver.recv().await {
        let mut next = Some(first);
        while let Some(command) = next.take().or_else(|| receiver.try_recv().ok()) {
            match command {
                Command::Deliver(delivery) => batch.push(delivery),
                Command::Flush(done) => flushed.push(done),
            }
            if batch.len() >= 256 {
                break;
            }
        }
        write_batch(&pool, &batch).await;
        batch.clear();
        for done in flushed.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Writes one batch, trying a few times while the database is away; dropped after that (logged): they are
/// progress messages, and the history keeps every outcome.
async fn write_batch(pool: &PgPool, batch: &[Delivery]) {
    if batch.is_empty() {
        return;
    }
    for attempt in 1..=5u32 {
        let written = async {
            let mut transaction = pool.begin().await?;
            sqlx::query("SET LOCAL synchronous_commit = off").execute(&mut *transaction).await?;
            insert(&mut transaction, batch).await?;
            transaction.commit().await
        };
        match written.await {
            Ok(()) => return,
            Err(error) if attempt == 5 => {
                tracing::error!(%error, events = batch.len(), "cannot write events; dropping them")
            }
            Err(error) => {
                tracing::warn!(%error, "cannot write events; trying again");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
        }
    }
}

/// The id of the newest event, where a starting API node begins to read (taken before it loads the history,
/// so what a worker stores meanwhile arrives through the events).
pub(crate) async fn latest_event(cluster: &Cluster) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events").fetch_one(&cluster.pool).await
}

/// How long ids read past stay looked for (a transaction that commits later than [`GAP_WAIT`]).
const LATE_WAIT: Duration = Duration::from_secs(120);
/// The most ids of one gap looked for later (a wider gap is rolled-back transactions').
const LATE_IDS: i64 = 256;

/// Where a reader is in the events: the last id it delivered, since when it waits at a gap after it, and the
/// ids it read past, still looked for in case their transaction commits late.
#[derive(Debug)]
struct Cursor {
    at: i64,
    gap_since: Option<Instant>,
    late: std::collections::BTreeMap<i64, Instant>,
}

impl Cursor {
    fn new(at: i64) -> Cursor {
        Cursor { at, gap_since: None, late: Default::default() }
    }

    /// Whether the next row read, `id`, may be delivered now (the cursor then moves to it): it follows the
    /// last one, or the reader has waited [`GAP_WAIT`] for the ids between (which it then looks for late).
    fn admit(&mut self, id: i64, now: Instant) -> bool {
        if id != self.at + 1 {
            let since = *self.gap_since.get_or_insert(now);
            if now.duration_since(since) < GAP_WAIT {
                return false;
            }
            for missing in (self.at + 1).max(id - LATE_IDS)..id {
                self.late.insert(missing, now);
            }
        }
        self.gap_since = None;
        self.at = id;
        true
    }

    /// The ids still looked for (those looked for longer than [`LATE_WAIT`] are given up).
    fn late_ids(&mut self, now: Instant) -> Vec<i64> {
        self.late.retain(|_, since| now.duration_since(*since) < LATE_WAIT);
        self.late.keys().copied().collect()
    }
}

/// An API node's reader: hands every event `feed` gives to the runtime, in order, until the server stops.
pub(crate) async fn follow(
    runtime: Arc<Service>,
    cluster: Arc<Cluster>,
    mut feed: Box<dyn EventFeed>,
) {
    while !runtime.stop.load(std::sync::atomic::Ordering::SeqCst) {
        let deliveries = feed.next().await;
        deliver_all(&runtime, &cluster, deliveries).await;
    }
}

/// The events table read in id order from a cursor, waiting briefly at gaps (see the module's note), woken by
/// NOTIFY and polling.
pub(crate) struct TableFeed {
    pool: PgPool,
    listener: Option<sqlx::postgres::PgListener>,
    cursor: Cursor,
    /// The last read found everything there was: wait for a notification before reading again.
    caught_up: bool,
}

impl TableFeed {
    /// A feed of the events after id `cursor` (from [`latest_event`]).
    pub(crate) async fn open(cluster: &Cluster, cursor: i64) -> TableFeed {
        TableFeed {
            pool: cluster.pool.clone(),
            listener: listener(&cluster.pool, &[EVENTS_CHANNEL]).await,
            cursor: Cursor::new(cursor),
            caught_up: false,
        }
    }

    /// The rows read past that have committed since (out of order, rather than never).
    async fn late(&mut self) -> Vec<Delivery> {
        let late = self.cursor.late_ids(Instant::now());
        if late.is_empty() {
            return Vec::new();
        }
        let rows: Vec<(i64, String)> =
            match sqlx::query_as("SELECT id, body FROM events WHERE id = ANY($1) ORDER BY id")
                .bind(&late)
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => rows,
                Err(_) => return Vec::new(),
            };
        let mut deliveries = Vec::new();
        for (id, body) in rows {
            self.cursor.late.remove(&id);
            tracing::debug!(id, "an event committed late");
            deliveries.extend(serde_json::from_str::<Delivery>(&body).ok());
        }
        deliveries
    }
}

#[async_trait::async_trait]
impl EventFeed for TableFeed {
    async fn next(&mut self) -> Vec<Delivery> {
        if std::mem::take(&mut self.caught_up) {
            wait_for(&mut self.listener, &self.pool, &[EVENTS_CHANNEL], POLL).await;
        }
        let mut deliveries = self.late().await;
        let rows: Vec<(i64, String)> =
            match sqlx::query_as("SELECT id, body FROM events WHERE id > $1 ORDER BY id LIMIT $2")
                .bind(self.cursor.at)
                .bind(BATCH)
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => rows,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the events");
                    tokio::time::sleep(POLL).await;
                    return deliveries;
                }
            };
        let full = rows.len() as i64 == BATCH;
        let mut stalled = false;
        for (id, body) in rows {
            if !self.cursor.admit(id, Instant::now()) {
                stalled = true;
                break;
            }
            match serde_json::from_str::<Delivery>(&body) {
                Ok(delivery) => deliveries.push(delivery),
                Err(error) => tracing::warn!(id, %error, "skipping an event this node cannot read"),
            }
        }
        if stalled {
            // A gap is nearly always a commit in flight that lands within a millisecond or two.
            tokio::time::sleep(Duration::from_millis(2)).await;
        } else if !full {
            self.caught_up = true;
        }
        deliveries
    }
}

/// The history entries a batch of events announces, read in one query: (workspace, id) → entry.
type Prefetched = HashMap<(String, String), Record>;

/// Applies `deliveries` in order, with the history entries they announce read first, in one query.
async fn deliver_all(runtime: &Service, cluster: &Cluster, deliveries: Vec<Delivery>) {
    let ids: Vec<String> = deliveries
        .iter()
        .filter_map(|d| match d {
            Delivery::HistoryStored { prompt_id, .. } => Some(prompt_id.clone()),
            _ => None,
        })
        .collect();
    let mut prefetched = Prefetched::new();
    if !ids.is_empty() {
        let rows: Result<Vec<(String, String, String)>, _> =
            sqlx::query_as("SELECT workspace, id, entry FROM history WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&cluster.pool)
                .await;
        // Read one by one (with retries) below if this fails.
        for (workspace, id, entry) in rows.unwrap_or_default() {
            let record = serde_json::from_str(&entry)
                .ok()
                .and_then(|entry| Record::from_entry(&workspace, &id, &entry));
            if let Some(record) = record {
                prefetched.insert((workspace, id), record);
            }
        }
    }
    for delivery in deliveries {
        apply(runtime, cluster, delivery, &mut prefetched).await;
    }
}

/// What an API node does with an event.
async fn apply(
    runtime: &Service,
    cluster: &Cluster,
    delivery: Delivery,
    prefetched: &mut Prefetched,
) {
    match &delivery {
        Delivery::HistoryStored { workspace, prompt_id } => {
            // Before what follows: the owner fetches the entry when it hears the prompt ended.
            if let Some(record) = prefetched.remove(&(workspace.clone(), prompt_id.clone())) {
                runtime.history().insert(record);
                return;
            }
            for attempt in 1..=3u64 {
                match load_history(cluster, workspace, prompt_id).await {
                    Ok(Some(record)) => runtime.history().insert(record),
                    Ok(None) => {}
                    Err(error) if attempt < 3 => {
                        tracing::debug!(%error, prompt_id, "cannot read a stored history entry yet");
                        tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                        continue;
                    }
                    // `/history/{id}` reads it from the database when asked.
                    Err(error) => {
                        tracing::warn!(%error, prompt_id, "cannot read a stored history entry")
                    }
                }
                break;
            }
        }
        Delivery::HistoryRemoved { workspace, clear, ids } => {
            let mut histories = runtime.history();
            let history = histories.of_mut(workspace);
            if *clear {
                history.clear();
            }
            history.delete(ids);
        }
        Delivery::Running { prompt_id, running: false, .. } => {
            let now = Instant::now();
            cluster.ended.lock().unwrap_or_else(|p| p.into_inner()).insert(prompt_id.clone(), now);
            runtime.hub.deliver(&delivery);
            // Gone from this node's queue now, so its `status` comes before the run's last `executing`.
            runtime.queue.retire(prompt_id);
        }
        Delivery::Running { prompt_id, running: true, .. } => {
            // Running again (claimed anew after a hand-back).
            cluster.ended.lock().unwrap_or_else(|p| p.into_inner()).remove(prompt_id);
            runtime.hub.deliver(&delivery);
        }
        _ => runtime.hub.deliver(&delivery),
    }
}

/// A stored history entry.
pub(crate) async fn load_history(
    cluster: &Cluster,
    workspace: &str,
    id: &str,
) -> Result<Option<Record>, sqlx::Error> {
    let entry: Option<String> =
        sqlx::query_scalar("SELECT entry FROM history WHERE workspace = $1 AND id = $2")
            .bind(workspace)
            .bind(id)
            .fetch_optional(&cluster.pool)
            .await?;
    Ok(entry
        .and_then(|entry| serde_json::from_str(&entry).ok())
        .and_then(|entry| Record::from_entry(workspace, id, &entry)))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Cursor, GAP_WAIT};

    #[test]
    fn a_reader_waits_at_a_gap_for_a_late_commit_then_reads_past_it() {
        let start = Instant::now();
        let mut cursor = Cursor::new(4);
        assert!(cursor.admit(5, start), "the next id");
        // 7 committed before 6: wait for 6.
        assert!(!cursor.admit(7, start));
        assert!(!cursor.admit(7, start + GAP_WAIT / 2), "still waiting");
        assert!(cursor.admit(6, start + GAP_WAIT / 2), "6 arrived");
        assert!(cursor.admit(7, start + GAP_WAIT / 2));
        // 9 never comes (a rolled-back transaction): read past it after the wait.
        assert!(!cursor.admit(10, start + GAP_WAIT));
        assert!(!cursor.admit(10, start + GAP_WAIT + GAP_WAIT / 2));
        assert!(cursor.admit(10, start + GAP_WAIT * 2 + Duration::from_millis(1)));
        assert_eq!(cursor.at, 10);
        assert!(cursor.gap_since.is_none(), "a new gap waits its own time");
        // 8 and 9 were read past: looked for a while, in case their transaction commits late.
        let later = start + GAP_WAIT * 2 + Duration::from_millis(1);
        assert_eq!(cursor.late_ids(later), [8, 9]);
        assert!(cursor.late_ids(later + super::LATE_WAIT).is_empty(), "then given up");
    }
}
