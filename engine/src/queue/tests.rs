use std::sync::Arc;
use std::time::Duration;

use super::{
    InUse, MemoryStore, Placement, PromptQueue, PushError, QueueEntry, QueueStore, StoreError,
    SyncRow,
};

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
        q.delete(&["b".into(), "a".into(), "zzz".into()]).expect("ok").len(),
        1,
        "a runs; zzz is unknown"
    );
    assert_eq!(q.running().into_iter().map(|e| e.id).collect::<Vec<_>>(), [running.id]);
    assert_eq!(q.remaining(), 2);
    assert_eq!(q.clear().expect("ok").len(), 1);
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
    q.on_change(Box::new(move |queue| sink.lock().expect("lock").push(queue.remaining())));
    q.push("a".into(), Placement::Back, "").expect("ok");
    q.push("b".into(), Placement::Back, "").expect("ok");
    let a = q.pop(Duration::ZERO).expect("ok").expect("a");
    q.finish(&a.id).expect("ok");
    q.clear().expect("ok");
    assert_eq!(*heard.lock().expect("lock"), [1, 2, 2, 1, 0]);
}

#[test]
fn remaining_where_counts_the_matching_pending_and_running_prompts() {
    let q = queue();
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    q.on_change(Box::new(move |queue| {
        sink.lock().expect("lock").push(queue.remaining_where(|p| *p == "mine"))
    }));
    q.push("a".into(), Placement::Back, "mine").expect("ok");
    q.push("b".into(), Placement::Back, "theirs").expect("ok");
    q.push("c".into(), Placement::Back, "mine").expect("ok");
    let a = q.pop(Duration::ZERO).expect("ok").expect("a");
    assert_eq!(q.remaining_where(|p| *p == "mine"), 2);
    assert_eq!(q.remaining_where(|p| *p == "theirs"), 1);
    q.finish(&a.id).expect("ok");
    let removed = q.delete_where(|e| e.payload == "theirs").expect("ok");
    assert_eq!(removed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(q.pending().iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["c"]);
    assert_eq!(*heard.lock().expect("lock"), [1, 1, 2, 2, 1, 1]);
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
    assert!(matches!(q.push("a".into(), Placement::Back, ""), Err(PushError::Store(_))));
    assert_eq!(q.remaining(), 0, "a prompt that was not stored is not queued");
    assert!(q.reserve("a".into(), 5.0).is_ok(), "and its id is free again");
}

#[test]
fn a_rejected_prompt_still_takes_a_number() {
    // ComfyUI's post_prompt takes the number before validating: 0 and 1 go to prompts that are then
    // rejected, so the next accepted prompt is 2 (and a front one -3).
    let q = queue();
    assert_eq!(q.take_number(Placement::Back), 0.0);
    assert_eq!(q.take_number(Placement::Back), 1.0);
    assert_eq!(q.push("a".into(), Placement::Back, "").expect("ok"), 2.0);
    assert_eq!(q.take_number(Placement::Number(42.5)), 42.5, "a client number takes none");
    assert_eq!(q.push("b".into(), Placement::Front, "").expect("ok"), -3.0);
    assert_eq!(q.counter(), 4);
    assert_eq!([next(&q), next(&q)], ["b", "a"]);
}

#[test]
fn an_id_in_use_cannot_be_queued_again_until_it_is_gone() {
    let q = queue();
    q.push("a".into(), Placement::Back, "").expect("ok");
    let reserved = q.reserve("b".into(), 7.0).expect("free");
    assert_eq!(q.reserve("a".into(), 1.0), Err(InUse("a".into())), "pending");
    assert_eq!(q.reserve("b".into(), 1.0), Err(InUse("b".into())), "reserved, being stored");
    let a = q.pop(Duration::ZERO).expect("ok").expect("a");
    assert!(q.reserve("a".into(), 1.0).is_err(), "running");
    q.retire(&a.id);
    assert!(q.reserve("a".into(), 1.0).is_ok(), "finished: free again");
    q.abandon(&reserved.id);
    assert!(q.reserve("b".into(), 1.0).is_ok(), "abandoned: free again");
}

#[test]
fn retire_leaves_the_store_to_the_caller() {
    let store = Shared::default();
    let (q, _) = PromptQueue::restore(Box::new(store.clone())).expect("ok");
    q.push("a".into(), Placement::Back, "").expect("ok");
    let a = q.pop(Duration::ZERO).expect("ok").expect("a");
    q.retire(&a.id);
    assert_eq!(q.remaining(), 0);
    assert_eq!(store.load().expect("ok").len(), 1, "the caller removes the row itself");
}

#[test]
fn deleting_many_removes_exactly_those_in_one_store_call() {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let q = PromptQueue::restore(Box::new(Recording { calls: calls.clone() })).expect("ok").0;
    for i in 0..1000 {
        q.push(format!("p{i}"), Placement::Back, "").expect("ok");
    }
    let doomed: Vec<String> = (0..1000).filter(|i| i % 3 == 0).map(|i| format!("p{i}")).collect();
    let deleted = q.delete(&doomed).expect("ok");
    assert_eq!(deleted.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), doomed, "in run order");
    assert_eq!(q.remaining(), 1000 - doomed.len());
    assert!(q.pending().iter().all(|e| !doomed.contains(&e.id)));
    assert_eq!(q.clear().expect("ok").len(), 1000 - doomed.len());
    let calls = calls.lock().expect("calls");
    assert_eq!(calls.len(), 2, "one remove per delete and per clear: {:?}", calls.len());
    assert_eq!(calls[0].len(), doomed.len());
    assert_eq!(calls[1].len(), 1000 - doomed.len());
}

#[test]
fn restore_takes_the_stored_counter_over_the_entries() {
    let q = PromptQueue::restore(Box::new(Counted(17))).expect("ok").0;
    assert_eq!(q.take_number(Placement::Back), 17.0);
}

/// A store that records the ids of every `remove`.
struct Recording {
    calls: Arc<std::sync::Mutex<Vec<Vec<String>>>>,
}

impl QueueStore<&'static str> for Recording {
    fn insert(&self, _: &QueueEntry<&'static str>) -> Result<(), StoreError> {
        Ok(())
    }
    fn mark_running(&self, _: &str) -> Result<(), StoreError> {
        Ok(())
    }
    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        self.calls.lock().expect("calls").push(ids.to_vec());
        Ok(())
    }
    fn load(&self) -> Result<Vec<(QueueEntry<&'static str>, bool)>, StoreError> {
        Ok(Vec::new())
    }
}

/// A store with an entry numbered 99 by its client and a stored counter.
struct Counted(u64);

impl QueueStore<&'static str> for Counted {
    fn insert(&self, _: &QueueEntry<&'static str>) -> Result<(), StoreError> {
        Ok(())
    }
    fn mark_running(&self, _: &str) -> Result<(), StoreError> {
        Ok(())
    }
    fn remove(&self, _: &[String]) -> Result<(), StoreError> {
        Ok(())
    }
    fn load(&self) -> Result<Vec<(QueueEntry<&'static str>, bool)>, StoreError> {
        Ok(vec![(QueueEntry { id: "x".into(), number: 99.0, seq: 0, payload: "" }, false)])
    }
    fn load_counter(&self) -> Result<Option<u64>, StoreError> {
        Ok(Some(self.0))
    }
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

fn row(id: &str, number: f64, seq: u64, running: bool) -> SyncRow {
    SyncRow { id: id.to_owned(), number, seq, running }
}

#[test]
fn a_mirror_follows_the_shared_queue_keeping_payloads_and_reservations() {
    let q = queue();
    let changes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = changes.clone();
    q.on_change(Box::new(move |_| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    let new = |pairs: &[(&str, &'static str)]| {
        pairs.iter().map(|(id, p)| ((*id).to_owned(), *p)).collect()
    };
    q.sync(
        &[row("a", 1.0, 1, true), row("b", 2.0, 2, false), row("c", 3.0, 3, true)],
        new(&[("a", "pa"), ("b", "pb"), ("c", "pc")]),
    );
    assert_eq!(q.counts(), (1, 2), "two workers run a and c");
    assert_eq!(changes.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A place reserved by a submission in flight survives a sync that does not list it yet.
    let ticket = q.reserve("d".into(), 4.0).expect("free");
    // a finished elsewhere; b started; e arrived without its payload yet (left for the next sync).
    q.sync(&[row("b", 2.0, 2, true), row("c", 3.0, 3, true), row("e", 5.0, 5, false)], new(&[]));
    let running: Vec<_> = q.running().into_iter().map(|e| (e.id, e.payload)).collect();
    assert_eq!(running, [("b".to_owned(), "pb"), ("c".to_owned(), "pc")], "payloads kept");
    assert!(q.pending().is_empty());
    assert!(matches!(q.reserve("d".into(), 4.0), Err(InUse(_))), "d stays reserved");
    assert!(matches!(q.reserve("b".into(), 4.0), Err(InUse(_))), "b runs");
    q.admit(ticket.entry("pd"));
    assert_eq!(q.pending().into_iter().map(|e| e.id).collect::<Vec<_>>(), ["d"]);
    assert_eq!(q.states().get("d"), Some(&false));
    // A submission whose prompt a sync brought in (and a worker started) first is not admitted twice.
    let ticket = q.reserve("f".into(), 6.0).expect("free");
    q.sync(
        &[row("b", 2.0, 2, true), row("c", 3.0, 3, true), row("f", 6.0, 6, true)],
        new(&[("f", "pf")]),
    );
    assert!(!q.admit_new(ticket.entry("pf")));
    assert_eq!(q.counts(), (0, 3), "f runs, once (d left the shared queue)");
    assert_eq!(q.states().get("f"), Some(&true));
    assert!(q.reserve("a".into(), 1.0).is_ok(), "a is gone");
}
