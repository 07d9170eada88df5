//! Several Kiln processes on one Postgres database (`kiln --role api|worker`): API nodes serve the clients,
//! workers run the prompts, and the database is the system of record for the queue, the history and the prompt
//! counter (the processes also share one data directory: inputs, outputs, keys).
//!
//! - The queue table is the queue: an API node inserts an accepted prompt (numbered from the shared counter,
//!   arrival from the `queue_seq` sequence) and keeps a mirror of the table for `/queue`, `/api/jobs` and the
//!   `status` counters (`mirror.rs`); a worker claims the first pending prompt in ComfyUI's order with one
//!   `FOR UPDATE SKIP LOCKED` statement, holds it with a lease it renews, and finishes it in one transaction
//!   fenced by the claim's attempt number (`claims.rs`).
//! - The events table carries what a run tells the clients ([`Delivery`]): workers append, every API node reads
//!   the rows after the last one it delivered and hands them to its hub (`events.rs`).
//! - The sweeper takes back claims whose lease ran out (the worker died): queued again, or recorded as
//!   interrupted once the prompt had its attempts; and it drops old events (`sweeper.rs`).
//!
//! NOTIFY `kiln_queue` follows every change of the queue table and `kiln_events` every batch of events: wake-up
//! hints only (a listener that reconnects has missed them), so every reader also polls.

mod claims;
mod events;
mod mirror;
mod sweeper;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kiln_engine::queue::Placement;
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPool, PgPoolOptions};

use crate::config::{Claims, ProcessRole};
use crate::ws::Delivery;

pub(crate) use claims::Unrunnable;
pub(crate) use events::{
    EventSink, TableFeed, follow as follow_events, latest_event, load_history,
};
pub(crate) use mirror::{MirrorStore, follow as follow_queue, sync as sync_queue};
pub(crate) use sweeper::sweep_forever;

/// The channel notified after every change of the queue table.
const QUEUE_CHANNEL: &str = "kiln_queue";
/// The channel notified after events are written.
const EVENTS_CHANNEL: &str = "kiln_events";
/// The channel of `/free` for the workers: `unload` or `free` (unload and drop the node result cache).
const FREE_CHANNEL: &str = "kiln_free";
/// How often a reader looks without a notification.
const POLL: Duration = Duration::from_secs(1);

/// This process's part in a cluster, and its connections to the shared database.
pub(crate) struct Cluster {
    /// API node or worker.
    pub(crate) role: ProcessRole,
    pool: PgPool,
    /// The name this process claims prompts under (the `worker` column, the log).
    pub(crate) node: String,
    /// How long a claim lasts without a heartbeat.
    lease: Duration,
    /// How many claims a prompt of this worker may have.
    max_attempts: u32,
    /// How long a prompt may wait while workers holding other models pass it by (model affinity).
    affinity_wait: Duration,
    /// The model files a worker holds: those of the prompt it claimed last.
    held: std::sync::Mutex<Vec<String>>,
    /// An API node's mirror's memory between syncs (taken while a sync runs).
    mirror: std::sync::Mutex<mirror::MirrorState>,
    /// Prompts an API node heard stop running, and when: a sync that read the table before they ended
    /// must not bring them back.
    ended: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Where a worker's events go.
    events: Option<Box<dyn EventSink>>,
    /// What `/free` asked of a worker and it has not done yet: 1 unload, 2 free.
    free_asked: std::sync::atomic::AtomicU8,
}

impl Cluster {
    /// Connects as `role` (a worker also starts its events writer) and moves the arrival sequence past the
    /// prompts a single server queued on this database before.
    pub(crate) async fn open(
        url: &str,
        role: ProcessRole,
        claims: &Claims,
    ) -> Result<Arc<Cluster>, sqlx::Error> {
        let mut options: PgConnectOptions = url.parse()?;
        if role == ProcessRole::Worker {
            // A worker's writes are bookkeeping, as the single server's (`storage.rs`): committed when
            // answered, flushed by Postgres within its `wal_writer_delay`. A claim lost to a crash of Postgres
            // is taken again; a lost finish runs the prompt again.
            options = options.options([("synchronous_commit", "off")]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await?;
        // Arrivals and numbers continue past what a single server stored on this database before.
        // Only ever forward: a node starting while others take values must not set them back.
        sqlx::query(
            "SELECT setval('queue_seq', stored) FROM (SELECT MAX(seq) AS stored FROM queue) AS q \
             WHERE stored > (SELECT last_value FROM queue_seq)",
        )
        .execute(&pool)
        .await?;
        // Built from constants only.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT setval('prompt_number', next, false) FROM counter WHERE next > ({})",
            crate::storage::NEXT_FROM_SEQUENCE
        )))
        .execute(&pool)
        .await?;
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "kiln".to_owned());
        let node = format!(
            "{host}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let events = (role == ProcessRole::Worker)
            .then(|| Box::new(events::Writer::start(pool.clone())) as Box<dyn EventSink>);
        Ok(Arc::new(Cluster {
            role,
            pool,
            node,
            lease: claims.lease,
            max_attempts: claims.max_attempts.max(1),
            affinity_wait: claims.affinity_wait,
            held: std::sync::Mutex::new(Vec::new()),
            mirror: std::sync::Mutex::new(mirror::MirrorState::default()),
            ended: std::sync::Mutex::new(HashMap::new()),
            events,
            free_asked: std::sync::atomic::AtomicU8::new(0),
        }))
    }

    /// The number of a new prompt request (see `PromptQueue::take_number`), from the shared counter.
    pub(crate) async fn take_number(&self, placement: Placement) -> Result<f64, sqlx::Error> {
        if let Placement::Number(number) = placement {
            return Ok(number);
        }
        let taken: i64 =
            sqlx::query_scalar("SELECT nextval('prompt_number')").fetch_one(&self.pool).await?;
        Ok(placement.number(taken.max(0) as u64))
    }

    /// Queues a prompt: its arrival order, or `None` if a prompt with this id is queued or running already.
    pub(crate) async fn enqueue(
        &self,
        id: &str,
        number: f64,
        queued: &crate::service::queued::Queued,
    ) -> Result<Option<u64>, sqlx::Error> {
        let seq: Option<i64> = sqlx::query_scalar(
            "INSERT INTO queue (workspace, id, number, seq, payload, models) \
             VALUES ($1, $2, $3, nextval('queue_seq'), $4, $5) ON CONFLICT (id) DO NOTHING RETURNING seq",
        )
        .bind(&*queued.workspace.id)
        .bind(id)
        .bind(number)
        .bind(queued.stored_payload())
        .bind(queued.model_files())
        .fetch_optional(&self.pool)
        .await?;
        // Notified apart: a commit that notifies holds Postgres' notification lock through its WAL flush, so
        // inserts that notified would each wait for the one before (no group commit); a notification
        // alone writes no WAL.
        if seq.is_some() {
            notify(&mut *self.pool.acquire().await?, QUEUE_CHANNEL).await?;
        }
        Ok(seq.map(|seq| seq as u64))
    }

    /// Removes pending prompts; one that a worker claimed since the client saw it pending is interrupted
    /// instead (it was taken out of the client's queue: it must not run to its end).
    pub(crate) async fn dequeue(&self, ids: &[String]) -> Result<(), sqlx::Error> {
        let mut transaction = self.pool.begin().await?;
        sqlx::query(
            "WITH removed AS (DELETE FROM queue WHERE id = ANY($1) AND running = 0 RETURNING id) \
             UPDATE queue SET interrupt = TRUE WHERE id = ANY($1) AND running = 1 \
             AND id NOT IN (SELECT id FROM removed)",
        )
        .bind(ids)
        .execute(&mut *transaction)
        .await?;
        notify(&mut transaction, QUEUE_CHANNEL).await?;
        transaction.commit().await
    }

    /// Asks the worker running a prompt to interrupt it (it reads the flag with its next heartbeat).
    pub(crate) async fn interrupt(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE queue SET interrupt = TRUE WHERE id = $1 AND running = 1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Tells every API node (this one included) what happened, through the events table.
    pub(crate) async fn announce(&self, deliveries: &[Delivery]) -> Result<(), sqlx::Error> {
        let mut transaction = self.pool.begin().await?;
        events::insert(&mut transaction, deliveries).await?;
        transaction.commit().await
    }

    /// Tells every worker what `/free` asked (a worker acts between prompts, as a single server does).
    pub(crate) async fn ask_workers_to_free(
        &self,
        unload: bool,
        free: bool,
    ) -> Result<(), sqlx::Error> {
        for (asked, payload) in [(unload, "unload"), (free, "free")] {
            if asked {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(FREE_CHANNEL)
                    .bind(payload)
                    .execute(&self.pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// What `/free` asked of this worker since the last call: (unload the models, also drop the cache).
    pub(crate) fn take_free_request(&self) -> (bool, bool) {
        let asked = self.free_asked.swap(0, std::sync::atomic::Ordering::SeqCst);
        (asked & 1 != 0, asked & 2 != 0)
    }

    /// A worker's events: sent in order, without waiting (see `events.rs`).
    pub(crate) fn deliver(&self, delivery: Delivery) {
        if let Some(events) = &self.events {
            events.send(delivery);
        }
    }
}

/// A listener on `channels`; `None` while the database cannot be reached (the caller polls, and
/// [`wait_for`] tries again).
async fn listener(pool: &PgPool, channels: &'static [&'static str]) -> Option<PgListener> {
    let listening = async {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen_all(channels.iter().copied()).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match listening.await {
        Ok(listener) => Some(listener),
        Err(error) => {
            tracing::warn!(%error, ?channels, "cannot listen for notifications; polling");
            None
        }
    }
}

/// Waits for a notification on `channels` or `timeout`; the notifications that came (with those already
/// there).
async fn wait_for(
    listener: &mut Option<PgListener>,
    pool: &PgPool,
    channels: &'static [&'static str],
    timeout: Duration,
) -> Vec<PgNotification> {
    let Some(listening) = listener else {
        tokio::time::sleep(timeout).await;
        *listener = self::listener(pool, channels).await;
        return Vec::new();
    };
    match tokio::time::timeout(timeout, listening.try_recv()).await {
        // The connection was lost: listen again (what was sent meanwhile is lost; the caller reads anyway).
        Ok(Ok(None)) | Ok(Err(_)) => {
            *listener = self::listener(pool, channels).await;
            Vec::new()
        }
        Ok(Ok(Some(first))) => {
            let mut came = vec![first];
            came.extend(std::iter::from_fn(|| listening.next_buffered()));
            came
        }
        Err(_) => Vec::new(),
    }
}

/// Notifies a channel when the transaction commits.
async fn notify(
    connection: &mut sqlx::PgConnection,
    channel: &'static str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, '')").bind(channel).execute(connection).await.map(drop)
}

/// Stores a history entry (replacing one under the same id, which then moves to the end, as the single
/// server's writer does).
async fn store_history(
    connection: &mut sqlx::PgConnection,
    record: &crate::service::history::Record,
) -> Result<(), sqlx::Error> {
    let entry = serde_json::to_string(&record.entry()).unwrap_or_default();
    sqlx::query(
        "INSERT INTO history (workspace, id, number, entry) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (workspace, id) DO UPDATE \
         SET seq = excluded.seq, number = excluded.number, entry = excluded.entry",
    )
    .bind(&*record.workspace)
    .bind(&record.prompt_id)
    .bind(record.number)
    .bind(entry)
    .execute(connection)
    .await
    .map(drop)
}
