//! Durable state in SQLite under `--data-dir` (`kiln.sqlite`): the queue and the history, so accepted prompts
//! survive a restart and a prompt that was running when the process died is recorded as interrupted.
//!
//! The engine's queue calls its store synchronously; [`SqliteQueueStore`] bridges to sqlx with the runtime's
//! handle, so it must be called from a thread that is not running async tasks (the worker thread, or
//! `spawn_blocking`). History writes are async and awaited by handlers, or bridged the same way by the worker.

use std::path::Path;
use std::sync::Arc;

use kiln_engine::graph::{Prompt, validate};
use kiln_engine::nodes::Registry;
use kiln_engine::queue::{QueueEntry, QueueStore, StoreError};
use kiln_spec::types;
use serde_json::{Map, Value};
use sqlx::Row as _;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::local::history::Record;
use crate::local::runtime::Queued;

/// Why the database could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// SQLite failed.
    #[error("the database failed")]
    Sqlite(#[from] sqlx::Error),
    /// A migration failed.
    #[error("the database schema could not be brought up to date")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// The database: one connection (WAL mode), so writers queue in the process instead of meeting SQLite's lock
/// and its busy-wait sleeps.
///
/// Each write says how durable it must be. [`Durability::Disk`] (`synchronous=FULL`): what a client is told is
/// done (an accepted prompt, a deletion) is on disk before the answer. [`Durability::Wal`]
/// (`synchronous=NORMAL`): the worker's own bookkeeping (a prompt became running, a finished prompt's queue row,
/// its history entry) is in the WAL when the call returns, so it survives the process being killed, and reaches
/// the disk with the next fsync (the next accepted prompt, or a checkpoint). A power cut can lose that last
/// bookkeeping, which at worst runs a finished prompt again; it keeps one fsync per prompt instead of four.
#[derive(Clone)]
pub(crate) struct Storage {
    pool: SqlitePool,
    handle: tokio::runtime::Handle,
}

/// How far a write must have gone when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// On disk (fsync'd).
    Disk,
    /// In the WAL file (survives the process, not a power cut).
    Wal,
}

impl Storage {
    /// Opens (or creates) `kiln.sqlite` in `data_dir` and brings its schema up to date.
    pub(crate) async fn open(data_dir: &Path) -> Result<Storage, StorageError> {
        let options = SqliteConnectOptions::new()
            .filename(data_dir.join("kiln.sqlite"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Storage { pool, handle: tokio::runtime::Handle::current() })
    }

    /// The connection, set for writes of this durability.
    async fn connection(
        &self,
        durability: Durability,
    ) -> Result<PoolConnection<Sqlite>, sqlx::Error> {
        let mut connection = self.pool.acquire().await?;
        let pragma = match durability {
            Durability::Disk => "PRAGMA synchronous = FULL",
            Durability::Wal => "PRAGMA synchronous = NORMAL",
        };
        sqlx::query(pragma).execute(&mut *connection).await?;
        Ok(connection)
    }

    /// Runs a future to completion from a thread that is not running async tasks.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }

    /// Stores an accepted prompt, on disk when this returns (the queue's `insert`, for the async accept path
    /// that takes a place with `PromptQueue::reserve` and admits the prompt after this).
    pub(crate) async fn insert_queued(
        &self,
        entry: &QueueEntry<Queued>,
    ) -> Result<(), sqlx::Error> {
        let payload = serde_json::json!({
            "prompt": entry.payload.prompt_json,
            "extra_data": entry.payload.extra_data,
            "client_id": entry.payload.client_id,
            "outputs": entry.payload.outputs,
        });
        sqlx::query("INSERT INTO queue (id, number, seq, running, payload) VALUES (?, ?, ?, 0, ?)")
            .bind(&entry.id)
            .bind(entry.number)
            .bind(entry.seq as i64)
            .bind(payload.to_string())
            .execute(&mut *self.connection(Durability::Disk).await?)
            .await?;
        Ok(())
    }

    /// Stores a finished prompt (worker bookkeeping: not waited for on disk, see [`Storage`]).
    pub(crate) async fn insert_history(&self, record: &Record) -> Result<(), StorageError> {
        let entry = serde_json::to_string(&record.entry()).unwrap_or_default();
        sqlx::query("INSERT OR REPLACE INTO history (id, seq, number, entry) VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM history), ?, ?)")
            .bind(&record.prompt_id)
            .bind(record.number)
            .bind(entry)
            .execute(&mut *self.connection(Durability::Wal).await?)
            .await?;
        Ok(())
    }

    /// Removes history entries.
    pub(crate) async fn delete_history(&self, ids: &[String]) -> Result<(), StorageError> {
        let mut connection = self.connection(Durability::Disk).await?;
        for id in ids {
            sqlx::query("DELETE FROM history WHERE id = ?")
                .bind(id)
                .execute(&mut *connection)
                .await?;
        }
        Ok(())
    }

    /// Removes every history entry.
    pub(crate) async fn clear_history(&self) -> Result<(), StorageError> {
        sqlx::query("DELETE FROM history")
            .execute(&mut *self.connection(Durability::Disk).await?)
            .await?;
        Ok(())
    }

    /// Every stored history entry, oldest first.
    pub(crate) async fn load_history(&self) -> Result<Vec<Record>, StorageError> {
        let rows = sqlx::query("SELECT id, number, entry FROM history ORDER BY seq")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: String = row.get("id");
                let entry: types::HistoryEntry =
                    serde_json::from_str(row.get::<&str, _>("entry")).ok()?;
                Record::from_entry(&id, &entry)
            })
            .collect())
    }

    /// The queue store over this database.
    pub(crate) fn queue_store(&self, registry: Arc<Registry>) -> SqliteQueueStore {
        SqliteQueueStore { storage: self.clone(), registry }
    }
}

/// The engine's queue store, in the `queue` table.
pub(crate) struct SqliteQueueStore {
    storage: Storage,
    registry: Arc<Registry>,
}

fn failed(e: sqlx::Error) -> StoreError {
    StoreError(e.to_string())
}

impl SqliteQueueStore {
    /// Runs `statement` once per id (bound as its one parameter) on one connection, from the worker's thread.
    fn write(
        &self,
        durability: Durability,
        statement: &'static str,
        ids: &[&str],
    ) -> Result<(), StoreError> {
        self.storage
            .block_on(async {
                let mut connection = self.storage.connection(durability).await?;
                for id in ids {
                    sqlx::query(statement).bind(id).execute(&mut *connection).await?;
                }
                Ok::<(), sqlx::Error>(())
            })
            .map_err(failed)
    }
}

impl QueueStore<Queued> for SqliteQueueStore {
    fn insert(&self, entry: &QueueEntry<Queued>) -> Result<(), StoreError> {
        self.storage.block_on(self.storage.insert_queued(entry)).map_err(failed)
    }

    fn mark_running(&self, id: &str) -> Result<(), StoreError> {
        self.write(Durability::Wal, "UPDATE queue SET running = 1 WHERE id = ?", &[id])
    }

    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.write(Durability::Disk, "DELETE FROM queue WHERE id = ?", &ids)
    }

    fn finished(&self, id: &str) -> Result<(), StoreError> {
        self.write(Durability::Wal, "DELETE FROM queue WHERE id = ?", &[id])
    }

    fn load(&self) -> Result<Vec<(QueueEntry<Queued>, bool)>, StoreError> {
        let rows = self
            .storage
            .block_on(
                sqlx::query("SELECT id, number, seq, running, payload FROM queue ORDER BY seq")
                    .fetch_all(&self.storage.pool),
            )
            .map_err(failed)?;
        let mut entries = Vec::new();
        for row in rows {
            let id: String = row.get("id");
            let payload: Value =
                serde_json::from_str(row.get::<&str, _>("payload")).unwrap_or_default();
            let Ok(prompt) = Prompt::from_json(&payload["prompt"]) else {
                tracing::warn!(%id, "dropping a stored prompt that is not an object");
                continue;
            };
            let outputs: Vec<kiln_engine::graph::NodeId> = payload["outputs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(|s| kiln_engine::graph::NodeId(s.to_owned())))
                .collect();
            let validated = match validate(&prompt, &self.registry, Some(&outputs)) {
                Ok(validated) => validated,
                Err(rejection) => {
                    tracing::warn!(%id, error = %rejection.error.message, "dropping a stored prompt that no longer validates");
                    continue;
                }
            };
            let queued = Queued {
                prompt_json: payload["prompt"].clone(),
                prompt: Arc::new(validated),
                extra_data: payload["extra_data"].as_object().cloned().unwrap_or_else(Map::new),
                client_id: payload["client_id"].as_str().map(str::to_owned),
                outputs: outputs.into_iter().map(|o| o.0).collect(),
            };
            let entry = QueueEntry {
                id,
                number: row.get("number"),
                seq: row.get::<i64, _>("seq") as u64,
                payload: queued,
            };
            entries.push((entry, row.get::<i64, _>("running") != 0));
        }
        Ok(entries)
    }
}
