//! Durable state in SQLite under `--data-dir` (`kiln.sqlite`): the queue, the history and the prompt counter,
//! so accepted prompts survive a restart, a prompt that was running when the process died is recorded as
//! interrupted, and prompt numbers keep growing across restarts.
//!
//! Every write goes through one [`Writer`] (`writer.rs`), which commits the writes that arrive together as one
//! transaction; the pool's connection only reads, at startup. The engine's queue calls its store
//! synchronously; [`SqliteQueueStore`] waits for the writer's answer, so it must be called from a thread that
//! is not running async tasks (the worker thread, or `spawn_blocking`). Handlers await the writer directly.

use std::path::Path;
use std::sync::Arc;

use kiln_engine::graph::{Prompt, validate};
use kiln_engine::queue::{QueueEntry, QueueStore, StoreError};
use kiln_spec::types;
use serde_json::{Map, Value};
use sqlx::Row as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::service::history::Record;
use crate::service::queued::Queued;
use crate::workspace::Workspaces;

mod writer;

pub(crate) use writer::{Durability, Pending, Write, WriteError, Writer};

/// Why the database could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// SQLite failed.
    #[error("the database failed")]
    Sqlite(#[from] sqlx::Error),
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

/// The database: a reading pool (one connection, used at startup) and the [`Writer`] every change goes
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
    pool: SqlitePool,
    handle: tokio::runtime::Handle,
    writer: Writer,
}

impl Storage {
    /// Opens (or creates) `kiln.sqlite` in `data_dir`, brings its schema up to date and starts the writer.
    pub(crate) async fn open(data_dir: &Path) -> Result<Storage, StorageError> {
        let file = data_dir.join("kiln.sqlite");
        let options = SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        let writer = Writer::start(&file).await?;
        Ok(Storage { pool, handle: tokio::runtime::Handle::current(), writer })
    }

    /// Runs a future to completion from a thread that is not running async tasks.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }

    /// Stores an accepted prompt; the answer comes once it is on disk (the queue's `insert`, for the async
    /// accept path that takes a place with `PromptQueue::reserve` and admits the prompt after this). Prompts
    /// stored at the same time share one transaction and one fsync.
    pub(crate) fn insert_queued(&self, entry: &QueueEntry<Queued>) -> Pending {
        let payload = serde_json::json!({
            "prompt": entry.payload.prompt_json,
            "extra_data": entry.payload.extra_data,
            "client_id": entry.payload.client_id,
            "outputs": entry.payload.outputs,
        });
        let write = Write::Queue {
            workspace: entry.payload.workspace.id.to_string(),
            id: entry.id.clone(),
            number: entry.number,
            seq: entry.seq,
            payload: payload.to_string(),
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

    /// Whether the database takes writes (its writer has not stopped).
    pub(crate) fn is_writable(&self) -> bool {
        self.writer.is_running()
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
        let rows = sqlx::query("SELECT workspace, id, number, entry FROM history ORDER BY seq")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: String = row.get("id");
                let entry: types::HistoryEntry =
                    serde_json::from_str(row.get::<&str, _>("entry")).ok()?;
                Record::from_entry(row.get::<&str, _>("workspace"), &id, &entry)
            })
            .collect())
    }

    /// The queue store over this database; stored prompts are validated again in their workspace.
    pub(crate) fn queue_store(&self, workspaces: Arc<Workspaces>) -> SqliteQueueStore {
        SqliteQueueStore { storage: self.clone(), workspaces }
    }
}

/// The engine's queue store, in the `queue` table.
pub(crate) struct SqliteQueueStore {
    storage: Storage,
    workspaces: Arc<Workspaces>,
}

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl QueueStore<Queued> for SqliteQueueStore {
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
        let next: i64 = self
            .storage
            .block_on(sqlx::query_scalar("SELECT next FROM counter").fetch_one(&self.storage.pool))
            .map_err(failed)?;
        Ok(Some(next.max(0) as u64))
    }

    fn load(&self) -> Result<Vec<(QueueEntry<Queued>, bool)>, StoreError> {
        let rows = self
            .storage
            .block_on(
                sqlx::query(
                    "SELECT workspace, id, number, seq, running, payload FROM queue ORDER BY seq",
                )
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
            let workspace = match self.workspaces.get(row.get::<&str, _>("workspace")) {
                Ok(workspace) => workspace,
                Err(error) => {
                    tracing::warn!(%id, %error, "dropping a stored prompt whose workspace cannot open");
                    continue;
                }
            };
            let validated = match validate(&prompt, workspace.registry(), Some(&outputs)) {
                Ok(validated) => validated,
                Err(rejection) => {
                    tracing::warn!(%id, error = %rejection.error.message, "dropping a stored prompt that no longer validates");
                    continue;
                }
            };
            let queued = Queued {
                workspace,
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
