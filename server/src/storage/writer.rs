//! The database writer: one thread owns the write connection and commits the writes that are waiting as
//! groups, one transaction each (group commit), to SQLite (`sqlite.rs`) or Postgres (`postgres.rs`).
//!
//! Each [`Write`] says how durable it must be when it is answered. [`Durability::Disk`] (what a client is told
//! is done: an accepted prompt, a deletion) is answered once its group is on disk; [`Durability::Wal`] (the
//! worker's bookkeeping) once its group is committed, which survives Kiln's process being killed (see each
//! database's module for how it gets to the disk).
//!
//! Of the writes waiting at once, the worker's bookkeeping commits first as its own group, then the clients'
//! writes as another, each in arrival order. Notes nobody waits for (a prompt started running, the counter
//! moved) ride along with the next group, or commit on their own after [`RIDE_ALONG`].
//!
//! Invariant: a group that fails is rolled back whole and every write in it is answered with the error; none
//! of it is applied. (On SQLite, a sync that fails answers its writes with the error although they are committed; the
//! accept path then removes the prompt's row, see `Storage::forget_queued`.)

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

mod postgres;
mod sqlite;

/// The most writes committed as one group (it bounds the statement's size and its bound parameters).
const MAX_GROUP: usize = 256;

/// How long a note nobody waits for (see [`writer`]) may wait for a group to ride along with.
const RIDE_ALONG: std::time::Duration = std::time::Duration::from_millis(100);

/// How far a write must have gone when it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// On disk (fsync'd).
    Disk,
    /// Committed (survives Kiln's process being killed, not a power cut).
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

pub(crate) use postgres::start as start_postgres;
pub(crate) use sqlite::start as start_sqlite;

/// A database the writer commits its groups to.
trait Commit {
    /// Commits one group as one transaction (when it fails, none of it is applied).
    async fn commit(&mut self, group: &[Job]) -> Result<(), WriteError>;

    /// Answers the disk writes of a committed group, once they are on disk.
    fn answer_on_disk(&mut self, replies: Vec<Reply>);

    /// Lets go of the connection: the writer stops.
    async fn close(self);
}

/// Commits one group and answers it: the bookkeeping now, the disk writes once on disk, every write with the
/// error if the group failed.
async fn commit_group(database: &mut impl Commit, group: Vec<Job>) {
    let started = std::time::Instant::now();
    let result = database.commit(&group).await;
    tracing::debug!(
        writes = group.len(),
        micros = started.elapsed().as_micros(),
        "group committed"
    );
    if let Err(error) = &result {
        tracing::error!(%error, "a group of database writes failed and was rolled back");
    }
    let on_disk = answer(group, &result);
    if !on_disk.is_empty() {
        database.answer_on_disk(on_disk);
    }
}

/// Runs `writer` on a thread of its own with its own runtime, connecting first with `connect`; answers once
/// connected (or with the error). Under a flood of requests, the runtime serving them would make every commit
/// (and the worker waiting for it) queue behind their tasks.
async fn spawn<C, F>(connect: impl FnOnce() -> F + Send + 'static) -> Result<Writer, sqlx::Error>
where
    C: Commit,
    F: std::future::Future<Output = Result<C, sqlx::Error>>,
{
    let (jobs, queue) = mpsc::unbounded_channel();
    let (connected, answer) = oneshot::channel();
    std::thread::Builder::new()
        .name("kiln-db-writer".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime {
                Ok(runtime) => runtime.block_on(async move {
                    match connect().await {
                        Ok(database) => {
                            let _ = connected.send(Ok(()));
                            writer(database, queue).await;
                        }
                        Err(error) => {
                            let _ = connected.send(Err(error));
                        }
                    }
                }),
                Err(error) => {
                    let _ = connected.send(Err(sqlx::Error::Io(error)));
                }
            }
        })
        .map_err(sqlx::Error::Io)?;
    answer.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))?;
    Ok(Writer { jobs })
}

/// Commits groups of writes until every [`Writer`] is gone.
///
/// Of the writes waiting, the worker's bookkeeping ([`Durability::Wal`]) commits first, as its own group, so
/// the worker does not wait behind the clients' writes that arrived with it; the clients' writes follow as a
/// second group. Notes nobody waits for ride along with the next group that commits anyway, or commit on
/// their own after [`RIDE_ALONG`]: a trivial prompt's running mark costs no commit of its own.
async fn writer(mut database: impl Commit, mut queue: mpsc::UnboundedReceiver<Job>) {
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
                commit_group(&mut database, group).await;
            }
        }
    }
    if !notes.is_empty() {
        commit_group(&mut database, notes).await;
    }
    database.close().await;
}

/// Answers the writes of a group that committed (`Ok`) or was rolled back (`Err`), except the disk writes of a
/// committed group, which are returned: they wait for the disk.
fn answer(group: Vec<Job>, result: &Result<(), WriteError>) -> Vec<Reply> {
    let mut on_disk = Vec::new();
    for job in group {
        let Some(reply) = job.reply else { continue };
        match (result, job.durability) {
            (Ok(()), Durability::Disk) => on_disk.push(reply),
            _ => {
                let _ = reply.send(result.clone());
            }
        }
    }
    on_disk
}

#[cfg(test)]
mod tests;
