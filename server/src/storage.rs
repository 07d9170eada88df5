//! Durable state: the queue, the history and the prompt counter, so accepted prompts survive a restart, a
//! prompt that was running when the process died is recorded as interrupted, and prompt numbers keep growing
//! across restarts. In SQLite under `--data-dir` (`kiln.sqlite`, the default) or in Postgres
//! (`--database-url`); the same tables in both (`migrations/sqlite`, `migrations/postgres`).
//!
//! Every write goes through one [`Writer`] (`writer.rs`), which commits the writes that arrive together as one
//! transaction; the pool only reads, at startup (and for `/readyz`). The engine's queue calls its store
//! synchronously; [`StoredQueue`] waits for the writer's answer, so it must be called from a thread that
//! is not running async tasks (the worker thread, or `spawn_blocking`). Handlers await the writer directly.

use std::path::Path;
use std::sync::Arc;

use kiln_engine::queue::{QueueEntry, QueueStore, StoreError};
use kiln_spec::types;
use sqlx::AnyPool;
use sqlx::ConnectOptions as _;
use sqlx::any::AnyPoolOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::config::Database;
use crate::service::history::Record;
use crate::service::queued::Queued;
use crate::workspace::Workspaces;

mod writer;

pub(crate) use writer::{Durability, Pending, Write, WriteError, Writer};

/// Why the database could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database failed.
    #[error("the database failed")]
    Database(#[from] sqlx::Error),
    /// The Postgres database named by `--database-url` cannot be reached (the message names it, without
    /// its password).
    #[error("cannot connect to the database {0}")]
    Connect(String, #[source] sqlx::Error),
    /// Another Kiln server holds the Postgres database (the message names it, without its password).
    #[error(
        "another kiln server is using the database {0}: a single server (--role all) needs the database to \
         itself; the API nodes and workers of a cluster (--role api, --role worker) share one"
    )]
    InUse(String),
    /// A migration failed.
    #[error("the database schema could not be brought up to date")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A write failed.
    #[error("a database write failed")]
    Write(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<WriteError> for StorageError {
    fn from(error: WriteError) -> StorageError {
        StorageError::Write(Box::new(error))
    }
}

/// The database: a reading pool (used at startup and by `/readyz`) and the [`Writer`] every change goes
/// through.
///
/// What a client is told is done (an accepted prompt, a deletion) is on disk before the answer
/// ([`Durability::Disk`]). The worker's own bookkeeping (a finished prompt's history entry with the removal of
/// its queue row) is committed to the WAL when it is answered, so it survives the process being killed, and
/// reaches the disk with the next sync ([`Durability::Wal`]): a power cut can lose that last bookkeeping, which
/// at worst runs a finished prompt again. That a prompt started running is noted without waiting (it commits
/// within [`writer`]'s ride-along delay): a crash just after a prompt started runs it again after the restart
/// instead of recording it as interrupted.
#[derive(Clone)]
pub(crate) struct Storage {
    reader: Reader,
    handle: tokio::runtime::Handle,
    writer: Writer,
    /// On Postgres, the connection holding [`SERVER_LOCK`] for as long as the server runs.
    _server_lock: Option<Arc<std::sync::Mutex<sqlx::PgConnection>>>,
}

/// The session-level advisory lock a Kiln server holds on its Postgres database, so that a second server on the
/// same database is refused rather than running the same queue ("kiln" in ASCII).
const SERVER_LOCK: i64 = 0x6b69_6c6e;

/// How long a starting server waits for the lock (a server killed a moment ago: Postgres ends its session when
/// it sees the connection closed).
const SERVER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The number a cluster's sequence `prompt_number` gives next (a query of one value): where a single server's
/// counter must continue, and below which the sequence must never be set.
pub(crate) const NEXT_FROM_SEQUENCE: &str =
    "SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM prompt_number";

/// The reading pool of either database.
#[derive(Clone)]
pub(crate) enum Reader {
    /// `kiln.sqlite` (one connection).
    Sqlite(SqlitePool),
    /// The `--database-url` database.
    Postgres(PgPool),
}

/// How long `/readyz` and a read wait for a Postgres connection.
const POSTGRES_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Storage {
    /// Opens the database (creating `kiln.sqlite` in `data_dir` if it is the embedded one), brings its schema up
    /// to date and starts the writer. On Postgres a single server holds [`SERVER_LOCK`] exclusively; the
    /// processes of a cluster (`in_cluster`) hold it shared, so a single server and a cluster never run on one
    /// database together.
    pub(crate) async fn open(
        data_dir: &Path,
        database: &Database,
        in_cluster: bool,
    ) -> Result<Storage, StorageError> {
        let mut server_lock = None;
        let (reader, writer) = match database {
            Database::Embedded => {
                let file = data_dir.join("kiln.sqlite");
                let options = SqliteConnectOptions::new()
                    .filename(&file)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal);
                let pool =
                    SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
                sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
                (Reader::Sqlite(pool), writer::start_sqlite(&file).await?)
            }
            Database::Postgres(url) => {
                let options: PgConnectOptions = url.parse()?;
                let name = format!(
                    "postgres://{}:{}/{}",
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap_or_default()
                );
                let connect_failed = |error| StorageError::Connect(name.clone(), error);
                let mut lock = options.connect().await.map_err(connect_failed)?;
                let deadline = tokio::time::Instant::now() + SERVER_LOCK_WAIT;
                loop {
                    let sql = if in_cluster {
                        "SELECT pg_try_advisory_lock_shared($1)"
                    } else {
                        "SELECT pg_try_advisory_lock($1)"
                    };
                    let held: bool =
                        sqlx::query_scalar(sql).bind(SERVER_LOCK).fetch_one(&mut lock).await?;
                    if held {
                        break;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(StorageError::InUse(name));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                server_lock = Some(Arc::new(std::sync::Mutex::new(lock)));
                let pool = PgPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(POSTGRES_WAIT)
                    .connect_with(options.clone())
                    .await
                    .map_err(connect_failed)?;
                sqlx::migrate!("./migrations/postgres").run(&pool).await?;
                let writer = writer::start_postgres(options).await.map_err(connect_failed)?;
                (Reader::Postgres(pool), writer)
            }
        };
        Ok(Storage {
            reader,
            handle: tokio::runtime::Handle::current(),
            writer,
            _server_lock: server_lock,
        })
    }

    /// Runs a future to completion from a thread that is not running async tasks.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }

    /// Stores an accepted prompt; the answer comes once it is on disk (the queue's `insert`, for the async
    /// accept path that takes a place with `PromptQueue::reserve` and admits the prompt after this). Prompts
    /// stored at the same time share one transaction and one fsync.
    pub(crate) fn insert_queued(&self, entry: &QueueEntry<Queued>) -> Pending {
        let write = Write::Queue {
            workspace: entry.payload.workspace.id.to_string(),
            id: entry.id.clone(),
            number: entry.number,
            seq: entry.seq,
            payload: entry.payload.stored_payload(),
        };
        self.writer.submit(write, Durability::Disk)
    }

    /// Removes queue rows without waiting (a prompt whose insert was reported failed: if its group committed
    /// after all, the row must not come back as queued after a restart).
    pub(crate) fn forget_queued(&self, id: &str) {
        self.writer.send(Write::Dequeue(vec![id.to_owned()]));
    }

    /// Records that the prompt counter reached `next` (not waited for: it commits with the next group).
    pub(crate) fn note_counter(&self, next: u64) {
        self.writer.send(Write::Counter(next));
    }

    /// Stores a history entry and removes the prompt's queue row in the same transaction (worker bookkeeping:
    /// committed to the WAL when answered, see [`Storage`]).
    pub(crate) fn insert_history(&self, record: &Record) -> Pending {
        let entry = serde_json::to_string(&record.entry()).unwrap_or_default();
        let write = Write::History {
            workspace: record.workspace.to_string(),
            id: record.prompt_id.clone(),
            number: record.number,
            entry,
        };
        self.writer.submit(write, Durability::Wal)
    }

    /// Puts a running prompt back to pending (a draining server handing it back), answered once on disk.
    pub(crate) fn hand_back(&self, id: &str) -> Pending {
        self.writer.submit(Write::HandBack(id.to_owned()), Durability::Disk)
    }

    /// Whether the database takes writes: its writer has not stopped and, for Postgres, the server answers.
    pub(crate) async fn is_writable(&self) -> bool {
        if !self.writer.is_running() {
            return false;
        }
        match &self.reader {
            Reader::Sqlite(_) => true,
            Reader::Postgres(pool) => {
                let answered =
                    tokio::time::timeout(POSTGRES_WAIT, sqlx::query("SELECT 1").execute(pool));
                matches!(answered.await, Ok(Ok(_)))
            }
        }
    }

    /// Removes history entries of a workspace.
    pub(crate) async fn delete_history(
        &self,
        workspace: &str,
        ids: &[String],
    ) -> Result<(), StorageError> {
        if ids.is_empty() {
            return Ok(());
        }
        let write = Write::DeleteHistory { workspace: workspace.to_owned(), ids: ids.to_vec() };
        Ok(self.writer.submit(write, Durability::Disk).done().await?)
    }

    /// Removes every history entry of a workspace.
    pub(crate) async fn clear_history(&self, workspace: &str) -> Result<(), StorageError> {
        let write = Write::ClearHistory(workspace.to_owned());
        Ok(self.writer.submit(write, Durability::Disk).done().await?)
    }

    /// Every stored history entry, oldest first.
    pub(crate) async fn load_history(&self) -> Result<Vec<Record>, StorageError> {
        let rows: Vec<HistoryRow> = self
            .reader
            .fetch_all("SELECT workspace, id, number, entry FROM history ORDER BY seq")
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let entry: types::HistoryEntry = serde_json::from_str(&row.entry).ok()?;
                Record::from_entry(&row.workspace, &row.id, &entry)
            })
            .collect())
    }

    /// The reading pool (tests look at the tables).
    #[cfg(test)]
    pub(crate) fn reader(&self) -> &Reader {
        &self.reader
    }

    /// The queue store over this database; stored prompts are validated again in their workspace.
    pub(crate) fn queue_store(&self, workspaces: Arc<Workspaces>) -> StoredQueue {
        StoredQueue { storage: self.clone(), workspaces }
    }
}

/// A pool on the database for the stores that keep their tables beside the queue's (the accounts, the OAuth
/// server), through sqlx's `Any` driver so that their SQL (`$N` parameters, portable statements) serves both
/// databases; the schema is brought up to date first. On SQLite: `kiln.sqlite` in `data_dir` (created if
/// needed) with sqlx's defaults, a 5 s busy timeout and foreign keys on.
pub(crate) async fn shared_pool(
    data_dir: &Path,
    database: &Database,
    connections: u32,
) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    let url = match database {
        Database::Embedded => SqliteConnectOptions::new()
            .filename(data_dir.join("kiln.sqlite"))
            .create_if_missing(true)
            .to_url_lossy()
            .to_string(),
        Database::Postgres(url) => url.clone(),
    };
    let pool = AnyPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(POSTGRES_WAIT)
        .connect(&url)
        .await?;
    match database {
        Database::Embedded => sqlx::migrate!("./migrations/sqlite").run(&pool).await?,
        Database::Postgres(_) => sqlx::migrate!("./migrations/postgres").run(&pool).await?,
    }
    Ok(pool)
}

/// A stored history entry.
#[derive(sqlx::FromRow)]
struct HistoryRow {
    workspace: String,
    id: String,
    entry: String,
}

/// A stored queue row.
#[derive(sqlx::FromRow)]
struct QueueRow {
    workspace: String,
    id: String,
    number: f64,
    seq: i64,
    running: bool,
    payload: String,
}

impl Reader {
    /// The rows a query without parameters returns (the same SQL on both databases).
    pub(crate) async fn fetch_all<T>(&self, sql: &'static str) -> Result<Vec<T>, sqlx::Error>
    where
        T: Send + Unpin,
        T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        match self {
            Reader::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Reader::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
    }

    /// The next prompt number the counter holds (on Postgres, past the numbers a cluster took from its
    /// sequence too).
    pub(crate) async fn counter(&self) -> Result<i64, sqlx::Error> {
        match self {
            Reader::Sqlite(pool) => {
                sqlx::query_scalar("SELECT next FROM counter").fetch_one(pool).await
            }
            Reader::Postgres(pool) => {
                let sql = format!("SELECT GREATEST(next, ({NEXT_FROM_SEQUENCE})) FROM counter");
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(pool).await
            }
        }
    }
}

/// The engine's queue store, in the `queue` table.
pub(crate) struct StoredQueue {
    storage: Storage,
    workspaces: Arc<Workspaces>,
}

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl QueueStore<Queued> for StoredQueue {
    fn insert(&self, entry: &QueueEntry<Queued>) -> Result<(), StoreError> {
        self.storage.insert_queued(entry).wait().map_err(failed)
    }

    fn mark_running(&self, id: &str) -> Result<(), StoreError> {
        // Not waited for: it commits before any later write of this prompt (see `QueueStore::mark_running`).
        self.storage.writer.send(Write::Running(id.to_owned()));
        Ok(())
    }

    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        // In key order, the deletions walk the table's pages in order.
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        self.storage.writer.submit(Write::Dequeue(ids), Durability::Disk).wait().map_err(failed)
    }

    fn load_counter(&self) -> Result<Option<u64>, StoreError> {
        let next = self.storage.block_on(self.storage.reader.counter()).map_err(failed)?;
        Ok(Some(next.max(0) as u64))
    }

    fn load(&self) -> Result<Vec<(QueueEntry<Queued>, bool)>, StoreError> {
        let rows: Vec<QueueRow> = self
            .storage
            .block_on(self.storage.reader.fetch_all(
                "SELECT workspace, id, number, seq, running <> 0 AS running, payload \
                 FROM queue ORDER BY seq",
            ))
            .map_err(failed)?;
        let mut entries = Vec::new();
        for row in rows {
            let id = row.id;
            match Queued::from_stored(&self.workspaces, &row.workspace, &row.payload) {
                Ok(queued) => {
                    let entry =
                        QueueEntry { id, number: row.number, seq: row.seq as u64, payload: queued };
                    entries.push((entry, row.running));
                }
                Err(error) => tracing::warn!(%id, %error, "dropping a stored prompt"),
            }
        }
        Ok(entries)
    }
}
