//! The writer's SQLite database (`kiln.sqlite`).
//!
//! Groups commit with `synchronous=NORMAL` (no fsync in the commit), and the syncer thread then `fdatasync`s
//! the WAL file for the groups that hold a disk write, one sync for every group committed before it starts. So
//! the writer never waits for the disk, the worker's bookkeeping never waits behind a client's fsync, and
//! prompts that arrive together share one transaction and one fsync. This is as durable as
//! `synchronous=FULL`: in WAL mode a commit appends its frames to the WAL, and SQLite overwrites WAL frames only
//! after a checkpoint has synced them into the database file. A bookkeeping group (`Durability::Wal`) is
//! answered once committed to the WAL, which survives the process being killed and reaches the disk with the
//! next sync.
//!
//! A sync that fails answers its writes with the error although they are committed; the accept path then
//! removes the prompt's row (`Storage::forget_queued`).

use std::path::{Path, PathBuf};

use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteSynchronous};
use sqlx::{Arguments as _, AssertSqlSafe, ConnectOptions as _, Connection as _};

use super::{Commit, Job, Reply, Write, WriteError, Writer};

/// How often the WAL is copied into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// What the syncer is handed after a commit: the answers that wait for the disk.
type Synced = Vec<Reply>;

/// Starts the writer on `file` (which must exist, in WAL mode): its thread with the checkpoints, and the
/// syncer thread. Must be called within the tokio runtime.
pub(crate) async fn start(file: &Path) -> Result<Writer, sqlx::Error> {
    let file = file.to_owned();
    super::spawn(move || Sqlite::open(file)).await
}

/// The write connection and the way to the syncer.
struct Sqlite {
    connection: SqliteConnection,
    to_sync: std::sync::mpsc::Sender<Synced>,
}

impl Sqlite {
    /// Opens the write connection, starts the checkpoints (on the writer's runtime) and the syncer thread.
    async fn open(file: PathBuf) -> Result<Sqlite, sqlx::Error> {
        let mut connection = SqliteConnectOptions::new()
            .filename(&file)
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
            tokio::spawn(checkpointer(
                SqliteConnectOptions::new().filename(&file).connect().await?,
            ));
            Some(wal)
        } else {
            // Without WAL (a filesystem that cannot share memory maps), each commit syncs itself.
            tracing::warn!(%mode, "SQLite could not use WAL mode; every commit waits for the disk");
            sqlx::query("PRAGMA synchronous = FULL").execute(&mut connection).await?;
            None
        };
        let (to_sync, syncs) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kiln-db-sync".to_owned())
            .spawn(move || syncer(wal, syncs))
            .map_err(sqlx::Error::Io)?;
        Ok(Sqlite { connection, to_sync })
    }
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

impl Commit for Sqlite {
    async fn commit(&mut self, group: &[Job]) -> Result<(), WriteError> {
        commit(&mut self.connection, group).await
    }

    /// Hands the answers to the syncer, which answers them once the WAL is on disk.
    fn answer_on_disk(&mut self, replies: Vec<Reply>) {
        if self.to_sync.send(replies).is_err() {
            tracing::error!("the database syncer has stopped");
        }
    }

    async fn close(self) {
        let _ = self.connection.close().await;
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
