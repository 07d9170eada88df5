//! The database writer: one thread owns the write connection and commits the writes that are waiting as
//! groups, one transaction each (group commit); another thread makes committed groups durable.
//!
//! Each [`Write`] says how durable it must be when it is answered. [`Durability::Disk`] (what a client is told
//! is done: an accepted prompt, a deletion) is answered once its group is on disk; [`Durability::Wal`] (the
//! worker's bookkeeping) once its group is committed to the WAL, which survives the process being killed and
//! reaches the disk with the next sync. Groups commit with `synchronous=NORMAL` (no fsync in the commit), and
//! the syncer thread then `fdatasync`s the WAL file for the groups that hold a disk write, one sync for every
//! group committed before it starts. So the writer never waits for the disk, the worker's bookkeeping never
//! waits behind a client's fsync, and prompts that arrive together share one transaction and one fsync.
//! This is as durable as `synchronous=FULL`: in WAL mode a commit appends its frames to the WAL, and SQLite
//! overwrites WAL frames only after a checkpoint has synced them into the database file.
//!
//! Of the writes waiting at once, the worker's bookkeeping commits first as its own group, then the clients'
//! writes as another, each in arrival order. Notes nobody waits for (a prompt started running, the counter
//! moved) ride along with the next group, or commit on their own after [`RIDE_ALONG`].
//!
//! Invariant: a group that fails is rolled back whole and every write in it is answered with the error; none
//! of it is applied. (A sync that fails answers its writes with the error although they are committed; the
//! accept path then removes the prompt's row, see `Storage::forget_queued`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteSynchronous};
use sqlx::{Arguments as _, AssertSqlSafe, ConnectOptions as _, Connection as _};
use tokio::sync::{mpsc, oneshot};

/// The most writes committed as one group (it bounds the statement's size and its bound parameters).
const MAX_GROUP: usize = 256;

/// How often the WAL is copied into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a note nobody waits for (see [`writer`]) may wait for a group to ride along with.
const RIDE_ALONG: std::time::Duration = std::time::Duration::from_millis(100);

/// How far a write must have gone when it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// On disk (fsync'd).
    Disk,
    /// Committed to the WAL (survives the process, not a power cut).
    Wal,
}

/// A change to the database.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// An accepted prompt joins the queue table.
    Queue {
        /// The workspace it belongs to.
        workspace: String,
        /// The prompt id.
        id: String,
        /// Its number.
        number: f64,
        /// Its arrival order.
        seq: u64,
        /// The stored payload (JSON).
        payload: String,
    },
    /// The prompt counter reached this value (the next number); the stored one only grows.
    Counter(u64),
    /// A queued prompt started running.
    Running(String),
    /// A running prompt was handed back by a draining server: it is pending again (and runs again at the
    /// next start instead of being recorded as interrupted).
    HandBack(String),
    /// Pending prompts removed by a client (one statement for all of them).
    Dequeue(Vec<String>),
    /// A history entry, stored or replaced, and the prompt's queue row removed with it (if any).
    History {
        /// The workspace it belongs to.
        workspace: String,
        /// The prompt id.
        id: String,
        /// Its number.
        number: f64,
        /// The `/history` entry (JSON).
        entry: String,
    },
    /// History entries of a workspace removed by a client (other workspaces' ids are left alone).
    DeleteHistory {
        /// The workspace.
        workspace: String,
        /// The prompt ids.
        ids: Vec<String>,
    },
    /// Every history entry of a workspace removed by a client.
    ClearHistory(String),
}

/// A write failed: its group was rolled back, or was committed but could not be synced to disk.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the database write failed: {0}")]
pub(crate) struct WriteError(Arc<str>);

impl WriteError {
    fn new(error: impl std::fmt::Display) -> WriteError {
        WriteError(error.to_string().into())
    }
}

type Reply = oneshot::Sender<Result<(), WriteError>>;

struct Job {
    write: Write,
    durability: Durability,
    reply: Option<Reply>,
}

/// The handle writes are sent through (cheap to clone).
#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::UnboundedSender<Job>,
}

/// The answer to a write: resolves once the write is as durable as asked, or failed.
pub(crate) struct Pending(Option<oneshot::Receiver<Result<(), WriteError>>>);

impl Pending {
    /// Waits for the answer (async).
    pub(crate) async fn done(self) -> Result<(), WriteError> {
        match self.0 {
            Some(answer) => answer.await.unwrap_or_else(|_| Err(stopped())),
            None => Err(stopped()),
        }
    }

    /// Waits for the answer from a thread that is not running async tasks.
    pub(crate) fn wait(self) -> Result<(), WriteError> {
        match self.0 {
            Some(answer) => answer.blocking_recv().unwrap_or_else(|_| Err(stopped())),
            None => Err(stopped()),
        }
    }
}

fn stopped() -> WriteError {
    WriteError::new("the database writer has stopped")
}

impl Writer {
    /// Opens the write connection to `file` (which must exist, in WAL mode) and starts the writer thread (with
    /// the checkpoints) and the syncer thread. Must be called within the tokio runtime.
    pub(crate) async fn start(file: &Path) -> Result<Writer, sqlx::Error> {
        let mut connection = SqliteConnectOptions::new()
            .filename(file)
            .synchronous(SqliteSynchronous::Normal)
            .connect()
            .await?;
        let mode: String =
            sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut connection).await?;
        let wal = if mode.eq_ignore_ascii_case("wal") {
            let mut name = file.as_os_str().to_owned();
            name.push("-wal");
            let wal = PathBuf::from(name);
            // The WAL file exists (migrations wrote it): make its directory entry durable once.
            if let Some(dir) = file.parent() {
                std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(sqlx::Error::Io)?;
            }
            // Checkpoints (copying the WAL into the database, two fsyncs) run on a connection of their own,
            // not inside a commit of the writer, which they would stall.
            sqlx::query("PRAGMA wal_autocheckpoint = 0").execute(&mut connection).await?;
            Some(wal)
        } else {
            // Without WAL (a filesystem that cannot share memory maps), each commit syncs itself.
            tracing::warn!(%mode, "SQLite could not use WAL mode; every commit waits for the disk");
            sqlx::query("PRAGMA synchronous = FULL").execute(&mut connection).await?;
            None
        };
        let checkpoints = match &wal {
            Some(_) => Some(SqliteConnectOptions::new().filename(file).connect().await?),
            None => None,
        };
        let (jobs, queue) = mpsc::unbounded_channel();
        let (to_sync, syncs) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kiln-db-sync".to_owned())
            .spawn(move || syncer(wal, syncs))
            .map_err(sqlx::Error::Io)?;
        // Its own thread and runtime: under a flood of requests, the runtime serving them would make every
        // commit (and the worker waiting for it) queue behind their tasks.
        std::thread::Builder::new()
            .name("kiln-db-writer".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                match runtime {
                    Ok(runtime) => runtime.block_on(async move {
                        if let Some(connection) = checkpoints {
                            tokio::spawn(checkpointer(connection));
                        }
                        writer(connection, queue, to_sync).await;
                    }),
                    Err(error) => tracing::error!(%error, "cannot start the database writer"),
                }
            })
            .map_err(sqlx::Error::Io)?;
        Ok(Writer { jobs })
    }

    /// Queues a write; the answer comes once it is as durable as `durability` asks.
    pub(crate) fn submit(&self, write: Write, durability: Durability) -> Pending {
        let (reply, answer) = oneshot::channel();
        let job = Job { write, durability, reply: Some(reply) };
        Pending(self.jobs.send(job).is_ok().then_some(answer))
    }

    /// Whether the writer still takes writes (its thread has not stopped).
    pub(crate) fn is_running(&self) -> bool {
        !self.jobs.is_closed()
    }

    /// Queues a write nobody waits for (it commits with the next group, in order).
    pub(crate) fn send(&self, write: Write) {
        let job = Job { write, durability: Durability::Wal, reply: None };
        if self.jobs.send(job).is_err() {
            tracing::error!("the database writer has stopped; a write was dropped");
        }
    }
}

/// What the syncer is handed after a commit: the answers that wait for the disk.
type Synced = Vec<Reply>;

/// Commits groups of writes until every [`Writer`] is gone.
///
/// Of the writes waiting, the worker's bookkeeping ([`Durability::Wal`]) commits first, as its own group, so
/// the worker does not wait behind the clients' writes that arrived with it; the clients' writes follow as a
/// second group. Notes nobody waits for ride along with the next group that commits anyway, or commit on
/// their own after [`RIDE_ALONG`]: a trivial prompt's running mark costs no commit of its own.
async fn writer(
    mut connection: SqliteConnection,
    mut queue: mpsc::UnboundedReceiver<Job>,
    to_sync: std::sync::mpsc::Sender<Synced>,
) {
    let mut waiting = Vec::new();
    let mut notes: Vec<Job> = Vec::new();
    let mut notes_due: Option<tokio::time::Instant> = None;
    loop {
        let received = match notes_due {
            None => Some(queue.recv_many(&mut waiting, MAX_GROUP).await),
            Some(due) => tokio::select! {
                received = queue.recv_many(&mut waiting, MAX_GROUP) => Some(received),
                () = tokio::time::sleep_until(due) => None,
            },
        };
        if received == Some(0) {
            break;
        }
        let (mut bookkeeping, mut clients) = (Vec::new(), Vec::new());
        for job in waiting.drain(..) {
            match (&job.write, job.durability, &job.reply) {
                (Write::Counter(_) | Write::Running(_), _, None) => notes.push(job),
                (_, Durability::Wal, _) => bookkeeping.push(job),
                (_, Durability::Disk, _) => clients.push(job),
            }
        }
        // Notes go first (a running mark before the history entry that removes its row).
        if !bookkeeping.is_empty() || received.is_none() {
            bookkeeping.splice(0..0, notes.drain(..));
        } else if !clients.is_empty() {
            clients.splice(0..0, notes.drain(..));
        }
        notes_due = match notes_due {
            _ if notes.is_empty() => None,
            Some(due) => Some(due),
            None => Some(tokio::time::Instant::now() + RIDE_ALONG),
        };
        for group in [bookkeeping, clients] {
            if !group.is_empty() {
                commit_group(&mut connection, group, &to_sync).await;
            }
        }
    }
    if !notes.is_empty() {
        commit_group(&mut connection, notes, &to_sync).await;
    }
    let _ = connection.close().await;
}

/// Copies the WAL into the database every [`CHECKPOINT_EVERY`] (a passive checkpoint: it never waits for the
/// writer, nor the writer for it), for as long as the writer runs.
async fn checkpointer(mut connection: SqliteConnection) {
    let mut every = tokio::time::interval(CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(error) =
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut connection).await
        {
            tracing::warn!(%error, "a WAL checkpoint failed");
        }
    }
}

/// Commits one group and answers it: [`Durability::Wal`] writes now, [`Durability::Disk`] ones through the
/// syncer once the WAL is on disk, every write with the error if the group failed.
async fn commit_group(
    connection: &mut SqliteConnection,
    group: Vec<Job>,
    to_sync: &std::sync::mpsc::Sender<Synced>,
) {
    let started = std::time::Instant::now();
    let result = commit(connection, &group).await;
    tracing::debug!(
        writes = group.len(),
        micros = started.elapsed().as_micros(),
        "group committed"
    );
    if let Err(error) = &result {
        tracing::error!(%error, "a group of database writes failed and was rolled back");
    }
    let mut on_disk = Vec::new();
    for job in group {
        let Some(reply) = job.reply else { continue };
        match (&result, job.durability) {
            (Ok(()), Durability::Disk) => on_disk.push(reply),
            _ => {
                let _ = reply.send(result.clone());
            }
        }
    }
    if !on_disk.is_empty() && to_sync.send(on_disk).is_err() {
        tracing::error!("the database syncer has stopped");
    }
}

/// One transaction for the whole group, sent to SQLite as one multi-statement query.
async fn commit(connection: &mut SqliteConnection, group: &[Job]) -> Result<(), WriteError> {
    let (sql, arguments) = statements(group).map_err(WriteError::new)?;
    let executed = sqlx::query_with(AssertSqlSafe(sql), arguments).execute(&mut *connection).await;
    if let Err(error) = executed {
        // The group stopped part way, inside its transaction: undo what it did.
        if let Err(rollback) = sqlx::query("ROLLBACK").execute(&mut *connection).await {
            tracing::debug!(%rollback, "no transaction to roll back");
        }
        return Err(WriteError::new(error));
    }
    Ok(())
}

/// The statements of a group, in order, between `BEGIN` and `COMMIT`; consecutive queue rows are one
/// multi-row insert, and the counter is written once (its highest value).
fn statements(group: &[Job]) -> Result<(String, SqliteArguments), sqlx::error::BoxDynError> {
    let mut sql = String::from("BEGIN IMMEDIATE;");
    let mut arguments = SqliteArguments::default();
    let mut counter = None;
    let mut rows_open = false;
    for job in group {
        if rows_open && !matches!(job.write, Write::Queue { .. } | Write::Counter(_)) {
            sql.push(';');
            rows_open = false;
        }
        match &job.write {
            Write::Queue { workspace, id, number, seq, payload } => {
                if rows_open {
                    sql.push(',');
                } else {
                    sql.push_str(
                        "INSERT INTO queue (workspace, id, number, seq, running, payload) VALUES ",
                    );
                    rows_open = true;
                }
                sql.push_str("(?, ?, ?, ?, 0, ?)");
                arguments.add(workspace.clone())?;
                arguments.add(id.clone())?;
                arguments.add(*number)?;
                arguments.add(*seq as i64)?;
                arguments.add(payload.clone())?;
            }
            Write::Counter(next) => counter = counter.max(Some(*next)),
            Write::Running(id) => {
                sql.push_str("UPDATE queue SET running = 1 WHERE id = ?;");
                arguments.add(id.clone())?;
            }
            Write::HandBack(id) => {
                sql.push_str("UPDATE queue SET running = 0 WHERE id = ?;");
                arguments.add(id.clone())?;
            }
            Write::Dequeue(ids) => {
                sql.push_str("DELETE FROM queue WHERE id IN (SELECT value FROM json_each(?));");
                arguments.add(serde_json::to_string(ids)?)?;
            }
            Write::History { workspace, id, number, entry } => {
                sql.push_str(
                    "INSERT OR REPLACE INTO history (workspace, id, seq, number, entry) \
                     VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM history), ?, ?);\
                     DELETE FROM queue WHERE id = ?;",
                );
                arguments.add(workspace.clone())?;
                arguments.add(id.clone())?;
                arguments.add(*number)?;
                arguments.add(entry.clone())?;
                arguments.add(id.clone())?;
            }
            Write::DeleteHistory { workspace, ids } => {
                sql.push_str(
                    "DELETE FROM history WHERE workspace = ? \
                     AND id IN (SELECT value FROM json_each(?));",
                );
                arguments.add(workspace.clone())?;
                arguments.add(serde_json::to_string(ids)?)?;
            }
            Write::ClearHistory(workspace) => {
                sql.push_str("DELETE FROM history WHERE workspace = ?;");
                arguments.add(workspace.clone())?;
            }
        }
    }
    if rows_open {
        sql.push(';');
    }
    if let Some(next) = counter {
        sql.push_str("UPDATE counter SET next = MAX(next, ?);");
        arguments.add(next as i64)?;
    }
    sql.push_str("COMMIT;");
    Ok((sql, arguments))
}

/// Makes committed groups durable: one `fdatasync` of the WAL file for every group handed over before it
/// starts, then their answers. Without a WAL file (commits sync themselves) it answers at once.
fn syncer(wal: Option<PathBuf>, syncs: std::sync::mpsc::Receiver<Synced>) {
    while let Ok(first) = syncs.recv() {
        let mut waiting = first;
        while let Ok(more) = syncs.try_recv() {
            waiting.extend(more);
        }
        let started = std::time::Instant::now();
        let result = match &wal {
            Some(wal) => std::fs::OpenOptions::new()
                .write(true)
                .open(wal)
                .and_then(|file| file.sync_data())
                .map_err(|e| WriteError::new(format!("cannot sync {}: {e}", wal.display()))),
            None => Ok(()),
        };
        if let Err(error) = &result {
            tracing::error!(%error, "committed writes could not be made durable");
        }
        tracing::debug!(
            answers = waiting.len(),
            micros = started.elapsed().as_micros(),
            "WAL synced"
        );
        for reply in waiting {
            let _ = reply.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests;
