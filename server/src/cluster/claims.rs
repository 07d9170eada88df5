//! A worker's hold on the prompts it runs: the claim (the first pending prompt in ComfyUI's order, with one
//! `FOR UPDATE SKIP LOCKED` statement, so workers never wait on each other's claims), the lease it renews
//! while the prompt runs (which also brings it a client's interrupt), and the end of the claim: finished in one
//! transaction with the history entry and the run's last events, or handed back to the queue. Every write
//! after the claim names its attempt number: a worker whose lease was taken back (it stalled past the lease,
//! and the prompt went to another worker or into the history) changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kiln_engine::queue::QueueEntry;
use sqlx::postgres::PgListener;

use super::{Cluster, FREE_CHANNEL, POLL, QUEUE_CHANNEL, notify, store_history, wait_for};
use crate::service::history::Record;
use crate::service::queued::{Queued, StoredPrompt};
use crate::workspace::Workspaces;
use crate::ws::Delivery;

/// A prompt this worker claimed.
pub(crate) struct Claimed {
    /// The prompt's id.
    pub(crate) id: String,
    /// The claim's attempt number (1 for the first claim of the prompt).
    pub(crate) attempt: i32,
    /// The prompt, ready to run; or why this worker cannot run it (it is recorded as failed).
    pub(crate) prompt: Result<QueueEntry<Queued>, Unrunnable>,
}

/// A claimed prompt this worker cannot run (its workspace does not open, or it no longer validates).
pub(crate) struct Unrunnable {
    /// Its workspace.
    pub(crate) workspace: String,
    /// Its number.
    pub(crate) number: f64,
    /// What was stored.
    pub(crate) stored: StoredPrompt,
    /// Why.
    pub(crate) why: String,
}

/// A claimed queue row.
#[derive(sqlx::FromRow)]
pub(super) struct ClaimRow {
    pub(super) id: String,
    workspace: String,
    number: f64,
    seq: i64,
    pub(super) attempt: i32,
    payload: String,
    models: Vec<String>,
}

/// What a worker listens to: the queue's changes, and `/free`.
const WORKER_CHANNELS: &[&str] = &[QUEUE_CHANNEL, FREE_CHANNEL];

impl Cluster {
    /// Notes the `/free` requests among notifications, for [`Cluster::take_free_request`].
    fn note_free_requests(&self, came: &[sqlx::postgres::PgNotification]) {
        for notification in came.iter().filter(|n| n.channel() == FREE_CHANNEL) {
            let bit = if notification.payload() == "free" { 2 } else { 1 };
            self.free_asked.fetch_or(bit, Ordering::SeqCst);
        }
    }

    /// Claims the first pending prompt (number, then arrival), waiting up to `wait` for one; `None` if none
    /// came.
    pub(crate) async fn claim(
        &self,
        workspaces: &Arc<Workspaces>,
        listener: &mut Option<PgListener>,
        wait: Duration,
    ) -> Result<Option<Claimed>, sqlx::Error> {
        if listener.is_none() {
            *listener = super::listener(&self.pool, WORKER_CHANNELS).await;
        }
        let row = match self.claim_row().await? {
            Some(row) => row,
            None => {
                let came = wait_for(listener, &self.pool, WORKER_CHANNELS, wait.min(POLL)).await;
                self.note_free_requests(&came);
                match self.claim_row().await? {
                    Some(row) => row,
                    None => return Ok(None),
                }
            }
        };
        // Off the async threads: a workspace with an object store brings in the files the prompt names first.
        let (reading, workspace, payload) =
            (workspaces.clone(), row.workspace.clone(), row.payload.clone());
        let read = tokio::task::spawn_blocking(move || {
            Queued::from_stored(&reading, &workspace, &payload)
        })
        .await
        .unwrap_or_else(|e| Err(format!("reading it failed: {e}")));
        let prompt = match read {
            Ok(queued) => Ok(QueueEntry {
                id: row.id.clone(),
                number: row.number,
                seq: row.seq.max(0) as u64,
                payload: queued,
            }),
            Err(why) => Err(Unrunnable {
                workspace: row.workspace,
                number: row.number,
                stored: StoredPrompt::parse(&row.payload),
                why,
            }),
        };
        Ok(Some(Claimed { id: row.id, attempt: row.attempt, prompt }))
    }

    /// Claims the first pending prompt in ComfyUI's order among those this worker is best placed to run:
    /// the prompts whose model files it holds (all of them: the files of the prompt it ran last), or that
    /// name none, or that have waited longer than the affinity wait; then the others. Holds the claimed
    /// prompt's files from then on. Both scans walk the pending index in order and stop at the first row
    /// they can take (the head, usually), whatever the queue's length.
    pub(super) async fn claim_row(&self) -> Result<Option<ClaimRow>, sqlx::Error> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let row: Option<ClaimRow> = sqlx::query_as(
            "UPDATE queue SET running = 1, attempt = attempt + 1, max_attempts = $1, worker = $2, \
             lease_until = now() + make_interval(secs => $3), interrupt = FALSE \
             WHERE id = COALESCE( \
                 (SELECT id FROM queue WHERE running = 0 \
                  AND (models <@ $4::text[] OR queued_at <= now() - make_interval(secs => $5)) \
                  ORDER BY number, seq LIMIT 1 FOR UPDATE SKIP LOCKED), \
                 (SELECT id FROM queue WHERE running = 0 \
                  ORDER BY number, seq LIMIT 1 FOR UPDATE SKIP LOCKED)) \
             RETURNING id, workspace, number, seq, attempt, payload, models",
        )
        .bind(self.max_attempts as i32)
        .bind(&self.node)
        .bind(self.lease.as_secs_f64())
        .bind(&held)
        .bind(self.affinity_wait.as_secs_f64())
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = &row {
            // The API nodes' mirrors show it running (only after a claim: an idle worker's empty claims
            // must not wake the others).
            notify(&mut *self.pool.acquire().await?, QUEUE_CHANNEL).await?;
            *self.held.lock().unwrap_or_else(|p| p.into_inner()) = row.models.clone();
        }
        Ok(row)
    }

    /// Renews the lease of a claim: whether a client asked to interrupt the prompt, or `None` if the claim
    /// is no longer this worker's.
    async fn renew(&self, id: &str, attempt: i32) -> Result<Option<bool>, sqlx::Error> {
        sqlx::query_scalar(
            "UPDATE queue SET lease_until = now() + make_interval(secs => $3) \
             WHERE id = $1 AND attempt = $2 AND running = 1 RETURNING interrupt",
        )
        .bind(id)
        .bind(attempt)
        .bind(self.lease.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
    }

    /// Ends a claim: the prompt leaves the queue, its history entry is stored and `closing` (the run's last
    /// events, after everything it sent before) is written, in one transaction. `false` if the claim was no
    /// longer this worker's (nothing is written).
    pub(crate) async fn finish(
        &self,
        attempt: i32,
        record: &Record,
        closing: &[Delivery],
    ) -> Result<bool, sqlx::Error> {
        if let Some(events) = &self.events {
            events.flush().await;
        }
        let mut transaction = self.pool.begin().await?;
        let ours = sqlx::query("DELETE FROM queue WHERE id = $1 AND attempt = $2 AND running = 1")
            .bind(&record.prompt_id)
            .bind(attempt)
            .execute(&mut *transaction)
            .await?
            .rows_affected()
            == 1;
        if !ours {
            transaction.rollback().await?;
            return Ok(false);
        }
        store_history(&mut transaction, record).await?;
        let stored = Delivery::HistoryStored {
            workspace: record.workspace.to_string(),
            prompt_id: record.prompt_id.clone(),
        };
        let mut deliveries = vec![stored];
        deliveries.extend_from_slice(closing);
        super::events::insert(&mut transaction, &deliveries).await?;
        notify(&mut transaction, QUEUE_CHANNEL).await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// Puts a claimed prompt back in the queue, at its place, without counting the attempt (a draining worker
    /// that will not wait for it); the API nodes hear that it stopped running in the same transaction, so that
    /// comes before its next claim's events.
    pub(crate) async fn hand_back(
        &self,
        id: &str,
        workspace: &str,
        attempt: i32,
    ) -> Result<(), sqlx::Error> {
        if let Some(events) = &self.events {
            events.flush().await;
        }
        let mut transaction = self.pool.begin().await?;
        sqlx::query(
            "UPDATE queue SET running = 0, attempt = attempt - 1, worker = NULL, lease_until = NULL \
             WHERE id = $1 AND attempt = $2 AND running = 1",
        )
        .bind(id)
        .bind(attempt)
        .execute(&mut *transaction)
        .await?;
        let stopped = Delivery::running(workspace, id, None, None, false);
        super::events::insert(&mut transaction, &[stopped]).await?;
        notify(&mut transaction, QUEUE_CHANNEL).await?;
        transaction.commit().await
    }

    /// Renews a claim's lease until the returned [`Heartbeat`] is stopped or dropped, and calls
    /// `interrupt` when a client asks for it or the claim is lost (taken back, or not renewed for a whole
    /// lease: the database is out of reach, and another worker may get the prompt), with the heartbeat's
    /// quiet flag: `interrupt` must check it under the same lock [`Heartbeat::quiet`] is called under, so an
    /// interrupt meant for this prompt never stops the next one.
    pub(crate) fn heartbeat(
        self: &Arc<Cluster>,
        id: &str,
        attempt: i32,
        interrupt: impl Fn(&AtomicBool) + Send + Sync + 'static,
    ) -> Heartbeat {
        let beat = Heartbeat {
            stopped: Arc::new(AtomicBool::new(false)),
            quiet: Arc::new(AtomicBool::new(false)),
            lost: Arc::new(AtomicBool::new(false)),
        };
        let (stopped, quiet, lost) = (beat.stopped.clone(), beat.quiet.clone(), beat.lost.clone());
        let cluster = self.clone();
        let id = id.to_owned();
        // Often enough that an interrupt is felt within half a second, and the lease renewed well before it ends.
        let every = (self.lease / 4).min(Duration::from_millis(500));
        tokio::spawn(async move {
            let mut renewed = std::time::Instant::now();
            loop {
                tokio::time::sleep(every).await;
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let lose = |why: &str| {
                    tracing::warn!(prompt = %id, "{why}; stopping the running prompt");
                    lost.store(true, Ordering::SeqCst);
                    interrupt(&quiet);
                };
                match cluster.renew(&id, attempt).await {
                    Ok(Some(false)) => renewed = std::time::Instant::now(),
                    Ok(Some(true)) => {
                        renewed = std::time::Instant::now();
                        interrupt(&quiet);
                    }
                    Ok(None) => return lose("the claim on the running prompt was taken back"),
                    Err(_) if renewed.elapsed() >= cluster.lease => {
                        return lose("the claim could not be renewed for a whole lease");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot renew the lease of the running prompt")
                    }
                }
            }
        });
        beat
    }
}

/// The lease renewal of a running prompt ([`Cluster::heartbeat`]); it stops when dropped.
pub(crate) struct Heartbeat {
    stopped: Arc<AtomicBool>,
    quiet: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// The run ended: no more interrupts (the lease is still renewed until the claim ends).
    pub(crate) fn quiet(&self) {
        self.quiet.store(true, Ordering::SeqCst);
    }

    /// Whether the claim was lost while the prompt ran.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}
