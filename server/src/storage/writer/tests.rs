use super::{Durability, Write};
use crate::storage::Storage;

/// A fresh database in its own directory (removed on drop).
struct Db {
    dir: std::path::PathBuf,
    storage: Storage,
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn db(name: &str) -> Db {
    let dir = std::env::temp_dir().join(format!("kiln-writer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let storage = Storage::open(&dir).await.expect("opens");
    Db { dir, storage }
}

fn queued(id: &str, seq: u64) -> Write {
    Write::Queue {
        workspace: "default".to_owned(),
        id: id.to_owned(),
        number: seq as f64,
        seq,
        payload: "{}".to_owned(),
    }
}

async fn queue_ids(db: &Db) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM queue ORDER BY seq")
        .fetch_all(&db.storage.pool)
        .await
        .expect("reads")
}

async fn history_ids(db: &Db) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM history ORDER BY seq")
        .fetch_all(&db.storage.pool)
        .await
        .expect("reads")
}

async fn counter(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT next FROM counter").fetch_one(&db.storage.pool).await.expect("reads")
}

fn history(id: &str) -> Write {
    Write::History {
        workspace: "default".to_owned(),
        id: id.to_owned(),
        number: 0.0,
        entry: "{}".to_owned(),
    }
}

/// Makes the writes submitted next wait together, as one group: the test takes SQLite's write lock, and the
/// writer, given a first write of no consequence here (history is empty), waits for the lock with it. The writes
/// are released together when the returned connection commits. (The writer has its own thread, so without this
/// it could take the first of them before the others are submitted.)
async fn holding_the_writer(db: &Db) -> sqlx::pool::PoolConnection<sqlx::Sqlite> {
    let mut lock = db.storage.pool.acquire().await.expect("a connection");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *lock).await.expect("the write lock");
    drop(db.storage.writer.submit(Write::ClearHistory("default".to_owned()), Durability::Disk));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    lock
}

#[tokio::test]
async fn a_failed_group_answers_every_write_with_the_error_and_applies_none() {
    let db = db("failed-group").await;
    // A real SQLite failure in the middle of the group: a trigger refuses one row.
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON queue WHEN NEW.id = 'poison' \
         BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
    )
    .execute(&db.storage.pool)
    .await
    .expect("trigger");
    let writer = &db.storage.writer;
    let mut lock = holding_the_writer(&db).await;
    let answers = [
        writer.submit(queued("a", 0), Durability::Disk),
        writer.submit(queued("poison", 1), Durability::Disk),
        writer.submit(
            Write::DeleteHistory { workspace: "default".to_owned(), ids: vec!["x".to_owned()] },
            Durability::Disk,
        ),
        writer.submit(queued("b", 2), Durability::Disk),
    ];
    // The worker's bookkeeping that arrived with them is its own group, and commits.
    let bookkeeping = writer.submit(history("h"), Durability::Wal);
    sqlx::query("COMMIT").execute(&mut *lock).await.expect("the lock released");
    drop(lock);
    for answer in answers {
        let error = answer.done().await.expect_err("the whole group fails");
        assert!(error.to_string().contains("poisoned row"), "{error}");
    }
    bookkeeping.done().await.expect("commits");
    assert!(queue_ids(&db).await.is_empty(), "no row of the failed group is stored");
    assert_eq!(history_ids(&db).await, ["h"]);

    // The writer goes on: the next group commits.
    writer.submit(queued("c", 3), Durability::Disk).done().await.expect("commits");
    assert_eq!(queue_ids(&db).await, ["c"]);
}

#[tokio::test]
async fn a_group_applies_its_writes_in_arrival_order() {
    let db = db("order").await;
    let writer = &db.storage.writer;
    let answers = [
        writer.submit(queued("a", 0), Durability::Disk),
        writer.submit(queued("b", 1), Durability::Disk),
        writer.submit(Write::Dequeue(vec!["a".to_owned()]), Durability::Disk),
        writer.submit(queued("a", 2), Durability::Disk),
        writer.submit(queued("c", 3), Durability::Disk),
    ];
    for answer in answers {
        answer.done().await.expect("commits");
    }
    assert_eq!(queue_ids(&db).await, ["b", "a", "c"], "a was removed, then queued again");

    let answers = [
        writer.submit(Write::Running("c".to_owned()), Durability::Wal),
        writer.submit(history("b"), Durability::Wal),
        writer.submit(Write::Counter(9), Durability::Wal),
        writer.submit(Write::Counter(4), Durability::Wal),
    ];
    for answer in answers {
        answer.done().await.expect("commits");
    }
    assert_eq!(queue_ids(&db).await, ["a", "c"], "b left with its history entry");
    let running: Vec<String> = sqlx::query_scalar("SELECT id FROM queue WHERE running = 1")
        .fetch_all(&db.storage.pool)
        .await
        .expect("reads");
    assert_eq!(running, ["c"]);
    assert_eq!(history_ids(&db).await, ["b"]);
    assert_eq!(counter(&db).await, 9, "the counter only grows");
}

#[tokio::test]
async fn a_dequeue_removes_every_id_in_one_statement() {
    let db = db("dequeue").await;
    let writer = &db.storage.writer;
    let answers: Vec<_> =
        (0..2000).map(|i| writer.submit(queued(&format!("p{i}"), i), Durability::Disk)).collect();
    for answer in answers {
        answer.done().await.expect("commits");
    }
    let doomed: Vec<String> = (0..2000).filter(|i| i % 2 == 0).map(|i| format!("p{i}")).collect();
    writer.submit(Write::Dequeue(doomed.clone()), Durability::Disk).done().await.expect("commits");
    let left = queue_ids(&db).await;
    assert_eq!(left.len(), 1000);
    assert!(left.iter().all(|id| !doomed.contains(id)));
}

#[tokio::test]
async fn a_note_with_nothing_to_ride_along_with_commits_on_its_own() {
    let db = db("note").await;
    let writer = &db.storage.writer;
    writer.submit(queued("a", 0), Durability::Disk).done().await.expect("commits");
    writer.send(Write::Running("a".to_owned()));
    writer.send(Write::Counter(3));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let running: Vec<String> = sqlx::query_scalar("SELECT id FROM queue WHERE running = 1")
            .fetch_all(&db.storage.pool)
            .await
            .expect("reads");
        if running == ["a"] && counter(&db).await == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the notes were never committed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
