//! The writer's behaviour, each scenario on SQLite and on Postgres (a throwaway cluster per test).

use kiln_tests::postgres::Postgres;

use super::{Durability, Write};
use crate::config::Database;
use crate::storage::{Reader, Storage};

/// A fresh database in its own directory (removed on drop), with its Postgres cluster if it is one.
struct Db {
    dir: std::path::PathBuf,
    storage: Storage,
    _postgres: Option<Postgres>,
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn open(name: &str, postgres: Option<Postgres>) -> Db {
    let dir = std::env::temp_dir().join(format!("kiln-writer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let database = match &postgres {
        Some(cluster) => Database::Postgres(cluster.url()),
        None => Database::Embedded,
    };
    let storage = Storage::open(&dir, &database, false).await.expect("opens");
    Db { dir, storage, _postgres: postgres }
}

/// The embedded database.
async fn sqlite(name: &str) -> Db {
    open(name, None).await
}

/// A Postgres database.
async fn postgres(name: &str) -> Db {
    let cluster = tokio::task::spawn_blocking({
        let name = name.to_owned();
        move || Postgres::start(&name)
    })
    .await
    .expect("the cluster starts");
    open(&format!("{name}-postgres"), Some(cluster)).await
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

/// One column of text rows.
#[derive(sqlx::FromRow)]
struct Id {
    id: String,
}

async fn ids(db: &Db, sql: &'static str) -> Vec<String> {
    let rows: Vec<Id> = db.storage.reader().fetch_all(sql).await.expect("reads");
    rows.into_iter().map(|row| row.id).collect()
}

async fn queue_ids(db: &Db) -> Vec<String> {
    ids(db, "SELECT id FROM queue ORDER BY seq").await
}

async fn running_ids(db: &Db) -> Vec<String> {
    ids(db, "SELECT id FROM queue WHERE running = 1 ORDER BY seq").await
}

async fn history_ids(db: &Db) -> Vec<String> {
    ids(db, "SELECT id FROM history ORDER BY seq").await
}

async fn counter(db: &Db) -> i64 {
    db.storage.reader().counter().await.expect("reads")
}

fn history(id: &str) -> Write {
    Write::History {
        workspace: "default".to_owned(),
        id: id.to_owned(),
        number: 0.0,
        entry: "{}".to_owned(),
    }
}

/// A real database failure in the middle of a group: a trigger refuses the queue row `poison`.
async fn poison(db: &Db) {
    match db.storage.reader() {
        Reader::Sqlite(pool) => {
            sqlx::query(
                "CREATE TRIGGER poison BEFORE INSERT ON queue WHEN NEW.id = 'poison' \
                 BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
            )
            .execute(pool)
            .await
            .expect("trigger");
        }
        Reader::Postgres(pool) => {
            sqlx::raw_sql(
                "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.id = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER poison BEFORE INSERT ON queue FOR EACH ROW EXECUTE FUNCTION poison();",
            )
            .execute(pool)
            .await
            .expect("trigger");
        }
    }
}

/// A transaction holding the lock [`holding_the_writer`] took.
enum Lock {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

impl Lock {
    /// Commits, releasing the writes that waited.
    async fn release(self) {
        match self {
            Lock::Sqlite(mut c) => {
                sqlx::query("COMMIT").execute(&mut *c).await.expect("released");
            }
            Lock::Postgres(mut c) => {
                sqlx::query("COMMIT").execute(&mut *c).await.expect("released");
            }
        }
    }
}

/// Makes the writes submitted next wait together, as one group: the test takes the write lock (SQLite's, or
/// Postgres' on the history table), and the writer, given a first write of no consequence here (history is
/// empty), waits for the lock with it. The writes are released together by [`Lock::release`]. (The writer has
/// its own thread, so without this it could take the first of them before the others are submitted.)
async fn holding_the_writer(db: &Db) -> Lock {
    let lock = match db.storage.reader() {
        Reader::Sqlite(pool) => {
            let mut lock = pool.acquire().await.expect("a connection");
            sqlx::query("BEGIN IMMEDIATE").execute(&mut *lock).await.expect("the write lock");
            Lock::Sqlite(lock)
        }
        Reader::Postgres(pool) => {
            let mut lock = pool.acquire().await.expect("a connection");
            sqlx::query("BEGIN").execute(&mut *lock).await.expect("a transaction");
            sqlx::query("LOCK TABLE history IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *lock)
                .await
                .expect("the table lock");
            Lock::Postgres(lock)
        }
    };
    drop(db.storage.writer.submit(Write::ClearHistory("default".to_owned()), Durability::Disk));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    lock
}

#[tokio::test]
async fn a_failed_group_answers_every_write_with_the_error_and_applies_none() {
    a_failed_group_applies_nothing(sqlite("failed-group").await).await;
}

#[tokio::test]
async fn on_postgres_a_failed_group_answers_every_write_with_the_error_and_applies_none() {
    a_failed_group_applies_nothing(postgres("failed-group").await).await;
}

async fn a_failed_group_applies_nothing(db: Db) {
    poison(&db).await;
    let writer = &db.storage.writer;
    let lock = holding_the_writer(&db).await;
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
    lock.release().await;
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
    arrival_order(sqlite("order").await).await;
}

#[tokio::test]
async fn on_postgres_a_group_applies_its_writes_in_arrival_order() {
    arrival_order(postgres("order").await).await;
}

async fn arrival_order(db: Db) {
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
    assert_eq!(running_ids(&db).await, ["c"]);
    assert_eq!(history_ids(&db).await, ["b"]);
    assert_eq!(counter(&db).await, 9, "the counter only grows");
}

#[tokio::test]
async fn a_dequeue_removes_every_id_in_one_statement() {
    dequeue(sqlite("dequeue").await).await;
}

#[tokio::test]
async fn on_postgres_a_dequeue_removes_every_id_in_one_statement() {
    dequeue(postgres("dequeue").await).await;
}

async fn dequeue(db: Db) {
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
    lone_note(sqlite("note").await).await;
}

#[tokio::test]
async fn on_postgres_a_note_with_nothing_to_ride_along_with_commits_on_its_own() {
    lone_note(postgres("note").await).await;
}

async fn lone_note(db: Db) {
    let writer = &db.storage.writer;
    writer.submit(queued("a", 0), Durability::Disk).done().await.expect("commits");
    writer.send(Write::Running("a".to_owned()));
    writer.send(Write::Counter(3));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if running_ids(&db).await == ["a"] && counter(&db).await == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the notes were never committed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
