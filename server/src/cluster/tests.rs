//! The claim's order and fencing on a real Postgres (a throwaway cluster per test): ComfyUI's order among
//! equals, model affinity bounded by its wait, no prompt claimed twice by workers claiming at once, a finish
//! refused to a worker whose claim was taken back, and the sweeper's two outcomes.

use std::sync::Arc;
use std::time::Duration;

use kiln_tests::postgres::Postgres;
use sqlx::postgres::PgPool;

use super::Cluster;
use crate::config::{Claims, ProcessRole};

/// A migrated database on its own cluster.
async fn database(name: &str) -> (Postgres, String, PgPool) {
    let postgres = Postgres::start(name);
    let url = postgres.database("kiln");
    let pool = PgPool::connect(&url).await.expect("connects");
    sqlx::migrate!("./migrations/postgres").run(&pool).await.expect("migrates");
    (postgres, url, pool)
}

async fn worker(url: &str, claims: Claims) -> Arc<Cluster> {
    Cluster::open(url, ProcessRole::Worker, &claims).await.expect("opens")
}

/// Queues a row as an API node would, `age` seconds ago, naming `models`.
async fn queue(pool: &PgPool, id: &str, number: f64, models: &[&str], age: f64) {
    sqlx::query(
        "INSERT INTO queue (workspace, id, number, seq, payload, models, queued_at) \
         VALUES ('default', $1, $2, nextval('queue_seq'), '{}', $3, now() - make_interval(secs => $4))",
    )
    .bind(id)
    .bind(number)
    .bind(models.iter().map(|m| m.to_string()).collect::<Vec<_>>())
    .bind(age)
    .execute(pool)
    .await
    .expect("queued");
}

async fn claim(cluster: &Cluster) -> Option<String> {
    cluster.claim_row().await.expect("claims").map(|row| row.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_follow_comfyuis_order_and_prefer_the_models_a_worker_holds_for_a_bounded_wait() {
    let (_postgres, url, pool) = database("claim-order").await;
    let strict = worker(&url, Claims { affinity_wait: Duration::ZERO, ..Claims::default() }).await;
    queue(&pool, "a", 2.0, &[], 0.0).await;
    queue(&pool, "b", 1.0, &["x.safetensors"], 0.0).await;
    queue(&pool, "c", 1.0, &[], 0.0).await;
    let order = [claim(&strict).await, claim(&strict).await, claim(&strict).await];
    assert_eq!(order.map(Option::unwrap_or_default), ["b", "c", "a"], "number, then arrival");
    assert_eq!(claim(&strict).await, None);

    let affine = worker(&url, Claims::default()).await;
    *affine.held.lock().expect("lock") = vec!["x.safetensors".to_owned()];
    queue(&pool, "needs-y", 1.0, &["y.safetensors"], 0.0).await;
    queue(&pool, "needs-x", 2.0, &["x.safetensors"], 0.0).await;
    queue(&pool, "needs-nothing", 3.0, &[], 0.0).await;
    queue(&pool, "needs-x-too", 4.0, &["x.safetensors"], 0.0).await;
    assert_eq!(claim(&affine).await.as_deref(), Some("needs-x"), "the held model first");
    assert_eq!(claim(&affine).await.as_deref(), Some("needs-nothing"), "then what needs no model");
    // An earlier prompt that has waited past the affinity wait comes first again.
    sqlx::query("UPDATE queue SET queued_at = now() - interval '1 minute' WHERE id = 'needs-y'")
        .execute(&pool)
        .await
        .expect("aged");
    assert_eq!(claim(&affine).await.as_deref(), Some("needs-y"), "nobody starves");
    assert_eq!(claim(&affine).await.as_deref(), Some("needs-x-too"));
    assert_eq!(
        *affine.held.lock().expect("lock"),
        ["x.safetensors"],
        "holds the last prompt's files"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_claiming_at_once_never_take_the_same_prompt() {
    let (_postgres, url, pool) = database("claim-race").await;
    for i in 0..60 {
        queue(&pool, &format!("p{i:02}"), f64::from(i), &[], 0.0).await;
    }
    let workers = [worker(&url, Claims::default()).await, worker(&url, Claims::default()).await];
    let tasks = workers.map(|cluster| {
        tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Some(id) = claim(&cluster).await {
                mine.push(id);
            }
            mine
        })
    });
    let mut claimed = Vec::new();
    for task in tasks {
        claimed.extend(task.await.expect("joins"));
    }
    claimed.sort();
    let expected: Vec<String> = (0..60).map(|i| format!("p{i:02}")).collect();
    assert_eq!(claimed, expected, "every prompt claimed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claim_is_queued_again_until_its_attempts_are_spent_and_its_old_worker_cannot_finish()
 {
    let (_postgres, url, pool) = database("claim-sweep").await;
    let claims = Claims { lease: Duration::from_millis(500), max_attempts: 2, ..Claims::default() };
    let first = worker(&url, claims.clone()).await;
    let second = worker(&url, claims).await;
    queue(&pool, "p", 1.0, &[], 0.0).await;
    let row = first.claim_row().await.expect("claims").expect("a row");
    assert_eq!(row.attempt, 1);
    let expire = "UPDATE queue SET lease_until = now() - interval '1 second'";
    sqlx::query(expire).execute(&pool).await.expect("expired");
    super::sweeper::sweep(&second).await.expect("sweeps");
    let again = second.claim_row().await.expect("claims").expect("queued again");
    assert_eq!((again.id.as_str(), again.attempt), ("p", 2));

    let record = crate::service::history::Record::interrupted(
        "default",
        "p",
        1.0,
        serde_json::json!({}),
        Default::default(),
        Vec::new(),
    );
    assert!(
        !first.finish(1, &record, &[]).await.expect("answers"),
        "the first claim was taken back"
    );
    let running: i64 = sqlx::query_scalar("SELECT count(*) FROM queue WHERE running = 1")
        .fetch_one(&pool)
        .await
        .expect("counts");
    assert_eq!(running, 1, "the second claim is untouched");

    sqlx::query(expire).execute(&pool).await.expect("expired");
    super::sweeper::sweep(&first).await.expect("sweeps");
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM queue").fetch_one(&pool).await.expect("counts");
    assert_eq!(left, 0, "two attempts spent: out of the queue");
    let entry: String = sqlx::query_scalar("SELECT entry FROM history WHERE id = 'p'")
        .fetch_one(&pool)
        .await
        .expect("recorded");
    let entry: serde_json::Value = serde_json::from_str(&entry).expect("JSON");
    assert_eq!(entry["status"]["status_str"], "error");
    assert_eq!(entry["status"]["messages"][0][0], "execution_interrupted");
    let events: Vec<String> = sqlx::query_scalar("SELECT body FROM events ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("events");
    let kinds: Vec<String> = events
        .iter()
        .map(|e| serde_json::from_str::<serde_json::Value>(e).expect("JSON")["kind"].to_string())
        .collect();
    assert_eq!(
        kinds,
        ["\"history_stored\"", "\"message\"", "\"running\""],
        "stored, execution_interrupted, no longer running (no executing frame: the prompt has no owner)"
    );
}
