use std::sync::Arc;
use std::time::Duration;

use super::{MemoryStore, Placement, PromptQueue, QueueEntry, QueueStore, StoreError};

/// A store shared between two queue "processes", to test restore.
#[derive(Default, Clone)]
struct Shared(Arc<MemoryStore<&'static str>>);

impl QueueStore<&'static str> for Shared {
    fn insert(&self, entry: &QueueEntry<&'static str>) -> Result<(), StoreError> {
        self.0.insert(entry)
    }
    fn mark_running(&self, id: &str) -> Result<(), StoreError> {
        self.0.mark_running(id)
    }
    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        self.0.remove(ids)
    }
    fn load(&self) -> Result<Vec<(QueueEntry<&'static str>, bool)>, StoreError> {
        self.0.load()
    }
}

fn queue() -> PromptQueue<&'static str> {
    PromptQueue::restore(Box::new(MemoryStore::default())).expect("empty store").0
}

fn next(q: &PromptQueue<&'static str>) -> String {
    let entry = q.pop(Duration::ZERO).expect("store ok").expect("an entry");
    q.finish(&entry.id).expect("store ok");
    entry.id
}

#[test]
fn lower_numbers_run_first_and_ties_keep_arrival_order() {
    let q = queue();
    assert_eq!(q.push("a".into(), Placement::Back, "").expect("ok"), 0.0);
    assert_eq!(q.push("b".into(), Placement::Number(42.5), "").expect("ok"), 42.5);
    assert_eq!(
        q.push("c".into(), Placement::Back, "").expect("ok"),
        1.0,
        "a client number does not move the counter"
    );
    q.push("d".into(), Placement::Number(1.0), "").expect("ok");
    assert_eq!([next(&q), next(&q), next(&q), next(&q)], ["a", "c", "d", "b"]);
    assert!(q.pop(Duration::ZERO).expect("ok").is_none());
}

#[test]
fn front_goes_ahead_of_everything_pending() {
    let q = queue();
    q.push("a".into(), Placement::Back, "").expect("ok");
    q.push("b".into(), Placement::Back, "").expect("ok");
    let number = q.push("urgent".into(), Placement::Front, "").expect("ok");
    assert!(number < 0.0);
    assert_eq!(next(&q), "urgent");
}

#[test]
fn delete_and_clear_touch_only_pending_prompts() {
    let q = queue();
    for id in ["a", "b", "c"] {
        q.push(id.into(), Placement::Back, "").expect("ok");
    }
    let running = q.pop(Duration::ZERO).expect("ok").expect("a");
    assert_eq!(
        q.delete(&["b".into(), "a".into(), "zzz".into()]).expect("ok"),
        1,
        "a runs; zzz is unknown"
    );
    assert_eq!(q.running().map(|e| e.id), Some(running.id.clone()));
    assert_eq!(q.remaining(), 2);
    assert_eq!(q.clear().expect("ok"), 1);
    assert_eq!(q.remaining(), 1, "the running prompt is not cleared");
}

#[test]
fn restore_requeues_pending_and_reports_running() {
    let store = Shared::default();
    let (q, _) = PromptQueue::restore(Box::new(store.clone())).expect("ok");
    for id in ["a", "b", "c"] {
        q.push(id.into(), Placement::Back, "payload").expect("ok");
    }
    let _running = q.pop(Duration::ZERO).expect("ok");
    drop(q); // the process dies without finishing `a`
    let (q, interrupted) = PromptQueue::restore(Box::new(store.clone())).expect("ok");
    assert_eq!(interrupted.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["a"]);
    assert_eq!(q.pending().iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["b", "c"]);
    drop(q); // dies again before recording `a`: it is reported again
    let (q, interrupted) = PromptQueue::restore(Box::new(store.clone())).expect("ok");
    assert_eq!(interrupted.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["a"]);
    q.settle(&interrupted).expect("ok");
    drop(q); // recorded and settled: gone
    let (q, interrupted) = PromptQueue::restore(Box::new(store)).expect("ok");
    assert!(interrupted.is_empty());
    assert_eq!(
        q.push("d".into(), Placement::Back, "").expect("ok"),
        3.0,
        "the counter continues after restore"
    );
}

#[test]
fn pop_waits_for_a_push_from_another_thread() {
    let q = Arc::new(queue());
    let pusher = q.clone();
    let handle = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        pusher.push("late".into(), Placement::Back, "").expect("ok");
    });
    let entry = q.pop(Duration::from_secs(5)).expect("ok").expect("woken by the push");
    assert_eq!(entry.id, "late");
    handle.join().expect("pusher");
}

#[test]
fn the_listener_hears_every_change_in_order() {
    let q = queue();
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    q.on_change(Box::new(move |remaining| sink.lock().expect("lock").push(remaining)));
    q.push("a".into(), Placement::Back, "").expect("ok");
    q.push("b".into(), Placement::Back, "").expect("ok");
    let a = q.pop(Duration::ZERO).expect("ok").expect("a");
    q.finish(&a.id).expect("ok");
    q.clear().expect("ok");
    assert_eq!(*heard.lock().expect("lock"), [1, 2, 2, 1, 0]);
}

/// A store whose every write waits until the test has read the queue from another thread.
struct Gate {
    inner: MemoryStore<&'static str>,
    entered: std::sync::mpsc::Sender<&'static str>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Gate {
    fn wait(&self, what: &'static str) -> Result<(), StoreError> {
        self.entered.send(what).expect("the test listens");
        let release = self.release.lock().expect("release");
        release
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| StoreError(format!("{what}: the reader never got through")))
    }
}

impl QueueStore<&'static str> for Gate {
    fn insert(&self, entry: &QueueEntry<&'static str>) -> Result<(), StoreError> {
        self.wait("insert")?;
        self.inner.insert(entry)
    }
    fn mark_running(&self, id: &str) -> Result<(), StoreError> {
        self.wait("mark_running")?;
        self.inner.mark_running(id)
    }
    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        self.wait("remove")?;
        self.inner.remove(ids)
    }
    fn load(&self) -> Result<Vec<(QueueEntry<&'static str>, bool)>, StoreError> {
        self.inner.load()
    }
}

#[test]
fn the_queue_can_be_read_while_the_store_works() {
    // The server's store waits on its async runtime; if the queue's lock were held meanwhile, async threads
    // reading the queue would block the very runtime the store waits for.
    let (entered, store_working) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel();
    let gate =
        Gate { inner: MemoryStore::default(), entered, release: std::sync::Mutex::new(released) };
    let q = Arc::new(PromptQueue::restore(Box::new(gate)).expect("empty store").0);
    let writer = {
        let q = q.clone();
        std::thread::spawn(move || {
            q.push("a".into(), Placement::Back, "").expect("push");
            q.push("b".into(), Placement::Back, "").expect("push");
            let a = q.pop(Duration::ZERO).expect("pop").expect("an entry");
            q.finish(&a.id).expect("finish");
            q.delete(&["b".to_owned()]).expect("delete");
        })
    };
    for step in ["insert", "insert", "mark_running", "remove", "remove"] {
        assert_eq!(
            store_working.recv_timeout(Duration::from_secs(10)).expect("the store is called"),
            step
        );
        let _ = q.pending();
        let _ = q.remaining();
        release.send(()).expect("the store waits");
    }
    writer.join().expect("every write went through");
    assert_eq!(q.remaining(), 0);
}

#[test]
fn a_failed_store_write_puts_memory_back() {
    let q = PromptQueue::restore(Box::new(Failing)).expect("empty store").0;
    assert!(q.push("a".into(), Placement::Back, "").is_err());
    assert_eq!(q.remaining(), 0, "a prompt that was not stored is not queued");
}

/// A store that refuses every write.
struct Failing;

impl QueueStore<&'static str> for Failing {
    fn insert(&self, _: &QueueEntry<&'static str>) -> Result<(), StoreError> {
        Err(StoreError("disk full".to_owned()))
    }
    fn mark_running(&self, _: &str) -> Result<(), StoreError> {
        Err(StoreError("disk full".to_owned()))
    }
    fn remove(&self, _: &[String]) -> Result<(), StoreError> {
        Err(StoreError("disk full".to_owned()))
    }
    fn load(&self) -> Result<Vec<(QueueEntry<&'static str>, bool)>, StoreError> {
        Ok(Vec::new())
    }
}
