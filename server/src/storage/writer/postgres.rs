//! The writer's Postgres database (`--database-url postgres://…`).
//!
//! A group is one transaction. A client's write is answered once its commit returns (Postgres has flushed its
//! WAL: `synchronous_commit` as the server sets it); a group of the worker's bookkeeping alone commits with
//! `synchronous_commit = off`, answered without waiting for that flush, which survives Kiln's process being
//! killed (the commit is Postgres'), not a crash of Postgres itself within its `wal_writer_delay`. Postgres
//! shares WAL flushes between concurrent commits itself.
//!
//! A group that fails because the connection broke (Postgres restarted, the network dropped: no answer from
//! the database, so none of it was applied) is tried once more on a new connection; if that fails too it is
//! answered with the error, and the next group connects again. Every write is safe to try twice: had the
//! lost answer been that of a commit that went through, the queue insert fails on its key (answered as
//! failed, and the accept path removes the row, as after SQLite's failed sync) and the others change nothing
//! more.

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions as _, Connection as _};

use super::{Commit, Durability, Job, Reply, Write, WriteError, Writer};

/// Starts the writer on its own connection to the database `options` name (migrated already).
pub(crate) async fn start(options: PgConnectOptions) -> Result<Writer, sqlx::Error> {
    super::spawn(move || async move {
        let connection = options.connect().await?;
        Ok(Postgres { options, connection: Some(connection) })
    })
    .await
}

/// The write connection (`None` after a failed group, until the next one opens it again).
struct Postgres {
    options: PgConnectOptions,
    connection: Option<PgConnection>,
}

impl Commit for Postgres {
    async fn commit(&mut self, group: &[Job]) -> Result<(), WriteError> {
        let mut result = self.transaction(group).await;
        if let Err(error) = &result
            && !matches!(error, sqlx::Error::Database(_))
        {
            tracing::warn!(%error, "the database connection broke; trying the group again on a new one");
            self.connection = None;
            result = self.transaction(group).await;
        }
        if result.is_err() {
            self.connection = None;
        }
        result.map_err(WriteError::new)
    }

    /// Answers at once: the commit has returned, so Postgres has flushed it.
    fn answer_on_disk(&mut self, replies: Vec<Reply>) {
        for reply in replies {
            let _ = reply.send(Ok(()));
        }
    }

    async fn close(self) {
        if let Some(connection) = self.connection {
            let _ = connection.close().await;
        }
    }
}

impl Postgres {
    /// One transaction for the group, on the connection (opened first if there is none).
    async fn transaction(&mut self, group: &[Job]) -> Result<(), sqlx::Error> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            slot => slot.insert(self.options.connect().await?),
        };
        // One round trip either way (a custom `BEGIN` goes as one simple query).
        let mut transaction = if group.iter().all(|job| job.durability == Durability::Wal) {
            connection.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await?
        } else {
            connection.begin().await?
        };
        apply(&mut transaction, group).await?;
        // Dropped without a commit (an error above), the transaction rolls back.
        transaction.commit().await
    }
}

/// The statements of a group, in order; consecutive queue rows are one insert, and the counter is written
/// once (its highest value), last.
async fn apply(connection: &mut PgConnection, group: &[Job]) -> Result<(), sqlx::Error> {
    let mut counter = None;
    let mut rows = QueueRows::default();
    for job in group {
        if !matches!(job.write, Write::Queue { .. } | Write::Counter(_)) {
            rows.insert(connection).await?;
        }
        match &job.write {
            Write::Queue { workspace, id, number, seq, payload } => {
                rows.workspaces.push(workspace.clone());
                rows.ids.push(id.clone());
                rows.numbers.push(*number);
                rows.seqs.push(*seq as i64);
                rows.payloads.push(payload.clone());
            }
            Write::Counter(next) => counter = counter.max(Some(*next)),
            Write::Running(id) => {
                sqlx::query("UPDATE queue SET running = 1 WHERE id = $1")
                    .bind(id)
                    .execute(&mut *connection)
                    .await?;
            }
            Write::HandBack(id) => {
                sqlx::query("UPDATE queue SET running = 0 WHERE id = $1")
                    .bind(id)
                    .execute(&mut *connection)
                    .await?;
            }
            Write::Dequeue(ids) => {
                sqlx::query("DELETE FROM queue WHERE id = ANY($1)")
                    .bind(ids)
                    .execute(&mut *connection)
                    .await?;
            }
            Write::History { workspace, id, number, entry } => {
                sqlx::query(
                    "WITH dequeued AS (DELETE FROM queue WHERE id = $2) \
                     INSERT INTO history (workspace, id, number, entry) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (workspace, id) DO UPDATE \
                     SET seq = excluded.seq, number = excluded.number, entry = excluded.entry",
                )
                .bind(workspace)
                .bind(id)
                .bind(number)
                .bind(entry)
                .execute(&mut *connection)
                .await?;
            }
            Write::DeleteHistory { workspace, ids } => {
                sqlx::query("DELETE FROM history WHERE workspace = $1 AND id = ANY($2)")
                    .bind(workspace)
                    .bind(ids)
                    .execute(&mut *connection)
                    .await?;
            }
            Write::ClearHistory(workspace) => {
                sqlx::query("DELETE FROM history WHERE workspace = $1")
                    .bind(workspace)
                    .execute(&mut *connection)
                    .await?;
            }
        }
    }
    rows.insert(connection).await?;
    if let Some(next) = counter {
        sqlx::query("UPDATE counter SET next = GREATEST(next, $1)")
            .bind(next as i64)
            .execute(&mut *connection)
            .await?;
    }
    Ok(())
}

/// Queue rows gathered for one multi-row insert (column by column, for `UNNEST`).
#[derive(Default)]
struct QueueRows {
    workspaces: Vec<String>,
    ids: Vec<String>,
    numbers: Vec<f64>,
    seqs: Vec<i64>,
    payloads: Vec<String>,
}

impl QueueRows {
    /// Inserts the gathered rows, if any, and starts over.
    async fn insert(&mut self, connection: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(self);
        sqlx::query(
            "INSERT INTO queue (workspace, id, number, seq, running, payload) \
             SELECT workspace, id, number, seq, 0, payload \
             FROM UNNEST($1::text[], $2::text[], $3::float8[], $4::int8[], $5::text[]) \
             AS row (workspace, id, number, seq, payload)",
        )
        .bind(rows.workspaces)
        .bind(rows.ids)
        .bind(rows.numbers)
        .bind(rows.seqs)
        .bind(rows.payloads)
        .execute(connection)
        .await?;
        Ok(())
    }
}
