//! Claims whose lease ran out: their worker died or lost the database. (A running row without a lease is a
//! single server's that died: a single server and a cluster never run on one database together.) Every node of a cluster sweeps
//! periodically, one at a time (behind a transaction-level advisory lock): a prompt with attempts left goes
//! back to its place in the queue; one that had them all is recorded as interrupted (its history entry and the
//! run's last events, as a single server records a prompt that was running when it died). Events older than
//! [`EVENTS_KEPT`] go too.

use std::sync::Arc;
use std::time::Duration;

use super::{Cluster, QUEUE_CHANNEL, notify, store_history};
use crate::service::history::Record;
use crate::service::queued::StoredPrompt;
use crate::service::worker::Service;
use crate::ws::{Audience, Delivery};

/// The transaction-level advisory lock one sweeper holds at a time ("swee" in ASCII).
const SWEEP_LOCK: i64 = 0x7377_6565;
/// How long events are kept for API nodes that fell behind.
const EVENTS_KEPT: Duration = Duration::from_secs(600);

#[derive(sqlx::FromRow)]
struct Expired {
    id: String,
    workspace: String,
    number: f64,
    attempt: i32,
    max_attempts: i32,
    worker: Option<String>,
    payload: String,
}

/// Sweeps every half lease (at least every second) until the server stops.
pub(crate) async fn sweep_forever(runtime: Arc<Service>, cluster: Arc<Cluster>) {
    let every = (cluster.lease / 2).clamp(Duration::from_millis(200), Duration::from_secs(1));
    while !runtime.stop.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(every).await;
        if let Err(error) = sweep(&cluster).await {
            tracing::warn!(%error, "cannot sweep expired claims");
        }
    }
}

/// One sweep; nothing if another node sweeps now.
pub(crate) async fn sweep(cluster: &Cluster) -> Result<(), sqlx::Error> {
    let mut transaction = cluster.pool.begin().await?;
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(SWEEP_LOCK)
        .fetch_one(&mut *transaction)
        .await?;
    if !ours {
        return transaction.commit().await;
    }
    let expired: Vec<Expired> = sqlx::query_as(
        "SELECT id, workspace, number, attempt, max_attempts, worker, payload FROM queue \
         WHERE running = 1 AND (lease_until < now() OR lease_until IS NULL) FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&mut *transaction)
    .await?;
    for claim in &expired {
        let worker = claim.worker.as_deref().unwrap_or("?");
        if claim.attempt < claim.max_attempts {
            tracing::warn!(prompt = %claim.id, worker, attempt = claim.attempt, "a worker stopped renewing its claim; the prompt is queued again");
            sqlx::query(
                "UPDATE queue SET running = 0, worker = NULL, lease_until = NULL WHERE id = $1",
            )
            .bind(&claim.id)
            .execute(&mut *transaction)
            .await?;
            continue;
        }
        tracing::warn!(prompt = %claim.id, worker, attempt = claim.attempt, "a worker stopped renewing its claim; the prompt is recorded as interrupted");
        sqlx::query("DELETE FROM queue WHERE id = $1")
            .bind(&claim.id)
            .execute(&mut *transaction)
            .await?;
        let stored = StoredPrompt::parse(&claim.payload);
        let client_id = stored.client_id.clone();
        let record = Record::interrupted(
            &claim.workspace,
            &claim.id,
            claim.number,
            stored.prompt,
            stored.extra_data,
            stored.outputs,
        );
        store_history(&mut transaction, &record).await?;
        super::events::insert(&mut transaction, &interrupted(&record, client_id.as_deref()))
            .await?;
    }
    if !expired.is_empty() {
        notify(&mut transaction, QUEUE_CHANNEL).await?;
    }
    transaction.commit().await?;
    // Apart, so the events above commit at once (readers wait only briefly for ids committed late).
    sqlx::query("DELETE FROM events WHERE at < now() - make_interval(secs => $1)")
        .bind(EVENTS_KEPT.as_secs_f64())
        .execute(&cluster.pool)
        .await
        .map(drop)
}

/// What the owner of a prompt recorded as interrupted hears: the entry is stored, `execution_interrupted`
/// (to everyone when the prompt has no owner, as ComfyUI), the prompt no longer runs, `executing` null.
fn interrupted(record: &Record, client_id: Option<&str>) -> Vec<Delivery> {
    let workspace = &*record.workspace;
    let mut deliveries = vec![Delivery::HistoryStored {
        workspace: workspace.to_owned(),
        prompt_id: record.prompt_id.clone(),
    }];
    let data = record.message("execution_interrupted").cloned().unwrap_or_default();
    let message = serde_json::json!({"type": "execution_interrupted", "data": data});
    deliveries.push(Delivery::Message {
        workspace: workspace.to_owned(),
        client_id: client_id.map(str::to_owned),
        text: message.to_string(),
        audience: Audience::OwnerOrAll,
    });
    deliveries.extend(Delivery::ended(workspace, &record.prompt_id, client_id));
    deliveries
}
