//! The prompt queue: priority by `number` (lower first, ties in arrival order), `front` ahead of everything
//! pending, deletion and clearing of pending prompts, the running prompt visible, and a [`QueueStore`] that
//! makes every change durable before it is acknowledged (the server implements it with SQLite).
//!
//! Numbers follow ComfyUI's `post_prompt`: every prompt request without a client `number` takes the next
//! number from the counter ([`PromptQueue::take_number`]) before it is validated, so a rejected prompt uses
//! one too; `front` negates it. A place in the queue ([`PromptQueue::reserve`]) is taken separately, once the
//! prompt is valid.
//!
//! Invariant: a prompt is in exactly one of pending, running, or gone, in memory and in the store alike, once
//! the call that changed it returns (a store may let the running mark follow, see
//! [`QueueStore::mark_running`]). The queue's lock is never held while the store works: it guards memory
//! only, so async threads may take it without waiting on the disk (or on whatever the store itself waits for).
//! A change reaches the store after memory and before the call returns; if the store fails, memory is put back.
//! The one exception: entries that were running when the previous process stopped stay in the store after
//! `restore` until the caller has recorded them and calls `settle`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// A stored queue entry.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueEntry<P> {
    /// The prompt id.
    pub id: String,
    /// The priority (lower runs first).
    pub number: f64,
    /// Arrival order, which breaks ties.
    pub seq: u64,
    /// What the server keeps with the prompt.
    pub payload: P,
}

/// A queue change could not be made durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the queue store failed: {0}")]
pub struct StoreError(pub String);

/// A place could not be reserved: a prompt with this id is already queued, running, or being queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a prompt with id {0} is already queued or running")]
pub struct InUse(pub String);

/// Why [`PromptQueue::push`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// The id is taken.
    #[error(transparent)]
    InUse(#[from] InUse),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Durable storage of the queue.
pub trait QueueStore<P>: Send + Sync {
    /// Stores a new pending entry.
    fn insert(&self, entry: &QueueEntry<P>) -> Result<(), StoreError>;
    /// Marks an entry running. A store may return before the mark is durable, as long as it reaches the
    /// store before any later change of the same entry: losing it to a crash runs the prompt again after a
    /// restart instead of recording it as interrupted.
    fn mark_running(&self, id: &str) -> Result<(), StoreError>;
    /// Removes entries (deleted or cleared by a client, or running when the previous process stopped), all
    /// at once.
    fn remove(&self, ids: &[String]) -> Result<(), StoreError>;
    /// Removes the entry of the prompt that just finished running. A store may make this cheaper than a
    /// client's `remove` (the server does not wait for the disk here: losing it to a power cut reruns the prompt).
    fn finished(&self, id: &str) -> Result<(), StoreError> {
        self.remove(&[id.to_owned()])
    }
    /// Every stored entry, and whether it was running.
    fn load(&self) -> Result<Vec<(QueueEntry<P>, bool)>, StoreError>;
    /// The stored counter (the next number to give), for stores that keep it; without one,
    /// [`PromptQueue::restore`] continues after the highest stored number.
    fn load_counter(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
}

/// A store that keeps nothing across restarts (for tests and ephemeral use).
#[derive(Debug)]
pub struct MemoryStore<P> {
    entries: Mutex<BTreeMap<String, (QueueEntry<P>, bool)>>,
}

impl<P> Default for MemoryStore<P> {
    fn default() -> MemoryStore<P> {
        MemoryStore { entries: Mutex::new(BTreeMap::new()) }
    }
}

impl<P: Clone + Send> QueueStore<P> for MemoryStore<P> {
    fn insert(&self, entry: &QueueEntry<P>) -> Result<(), StoreError> {
        lock(&self.entries).insert(entry.id.clone(), (entry.clone(), false));
        Ok(())
    }
    fn mark_running(&self, id: &str) -> Result<(), StoreError> {
        if let Some(e) = lock(&self.entries).get_mut(id) {
            e.1 = true;
        }
        Ok(())
    }
    fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        let mut entries = lock(&self.entries);
        for id in ids {
            entries.remove(id);
        }
        Ok(())
    }
    fn load(&self) -> Result<Vec<(QueueEntry<P>, bool)>, StoreError> {
        Ok(lock(&self.entries).values().cloned().collect())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every update is one insert or remove).
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run order: number (total order on floats), then arrival.
#[derive(Debug, Clone, Copy)]
struct Key {
    number: f64,
    seq: u64,
}

impl Key {
    fn of<P>(entry: &QueueEntry<P>) -> Key {
        Key { number: entry.number, seq: entry.seq }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.number.total_cmp(&other.number).then(self.seq.cmp(&other.seq))
    }
}

struct State<P> {
    /// Pending entries in run order.
    pending: BTreeMap<Key, QueueEntry<P>>,
    /// Running entries, in the order they started (one on a single worker; one per worker in a mirror of a
    /// shared queue, [`PromptQueue::sync`]).
    running: Vec<QueueEntry<P>>,
    /// Ids pending, running, or reserved and being stored.
    in_use: HashSet<String>,
    counter: u64,
    seq: u64,
}

impl<P> State<P> {
    fn remaining(&self) -> usize {
        self.pending.len() + self.running.len()
    }

    fn make_pending(&mut self, entry: QueueEntry<P>) {
        self.in_use.insert(entry.id.clone());
        self.pending.insert(Key::of(&entry), entry);
    }
}

/// A place in the queue for one prompt id: its number (priority) and arrival order. The id stays reserved
/// until the entry is admitted or the reservation is given up with [`PromptQueue::abandon`].
#[derive(Debug, Clone, PartialEq)]
pub struct Ticket {
    /// The prompt id.
    pub id: String,
    /// The priority the prompt gets.
    pub number: f64,
    /// Its arrival order.
    pub seq: u64,
}

impl Ticket {
    /// The queue entry of the prompt at this place.
    pub fn entry<P>(self, payload: P) -> QueueEntry<P> {
        QueueEntry { id: self.id, number: self.number, seq: self.seq, payload }
    }
}

/// A row of a queue kept elsewhere, for [`PromptQueue::sync`].
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRow {
    /// The prompt id.
    pub id: String,
    /// Its priority.
    pub number: f64,
    /// Its arrival order.
    pub seq: u64,
    /// Whether it runs.
    pub running: bool,
}

/// Shown the queue after every change.
pub type ChangeListener<P> = Box<dyn Fn(&Snapshot<'_, P>) + Send + Sync>;

/// The queue as a change left it, for a [`ChangeListener`] (which runs under the queue's lock).
pub struct Snapshot<'a, P>(&'a State<P>);

impl<P> Snapshot<'_, P> {
    /// Pending plus running.
    pub fn remaining(&self) -> usize {
        self.0.remaining()
    }

    /// Pending plus running prompts whose payload `matches` (one pass over the pending prompts).
    pub fn remaining_where(&self, matches: impl Fn(&P) -> bool) -> usize {
        let pending = self.0.pending.values().filter(|e| matches(&e.payload)).count();
        pending + self.0.running.iter().filter(|e| matches(&e.payload)).count()
    }
}

/// The prompt queue.
pub struct PromptQueue<P> {
    state: Mutex<State<P>>,
    ready: Condvar,
    store: Box<dyn QueueStore<P>>,
    listener: std::sync::OnceLock<ChangeListener<P>>,
}

/// Where a new prompt goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Placement {
    /// After everything (the server's counter).
    Back,
    /// Ahead of everything pending.
    Front,
    /// At this priority, as the client asked.
    Number(f64),
}

impl Placement {
    /// The number of a prompt placed so when the counter gave `taken`: `taken` at the back, negated at the
    /// front (ComfyUI negates an int, so the first front prompt is 0, not -0), the client's own number as is.
    pub fn number(self, taken: u64) -> f64 {
        match self {
            Placement::Number(number) => number,
            Placement::Front if taken > 0 => -(taken as f64),
            Placement::Back | Placement::Front => taken as f64,
        }
    }
}

impl<P: Clone + Send> PromptQueue<P> {
    /// A queue over a store, restored from it. Returns the queue and the entries that were running when the
    /// previous process stopped: they did not finish, and stay in the store until the caller has recorded them
    /// (as interrupted) and calls [`PromptQueue::settle`], so a crash in between loses nothing.
    pub fn restore(
        store: Box<dyn QueueStore<P>>,
    ) -> Result<(PromptQueue<P>, Vec<QueueEntry<P>>), StoreError> {
        let mut state = State {
            pending: BTreeMap::new(),
            running: Vec::new(),
            in_use: HashSet::new(),
            counter: 0,
            seq: 0,
        };
        let mut was_running = Vec::new();
        for (entry, running) in store.load()? {
            if entry.number.is_finite() && entry.number >= 0.0 {
                state.counter = state.counter.max(entry.number.floor() as u64 + 1);
            }
            state.seq = state.seq.max(entry.seq + 1);
            if running { was_running.push(entry) } else { state.make_pending(entry) }
        }
        if let Some(counter) = store.load_counter()? {
            state.counter = counter;
        }
        let queue = PromptQueue {
            state: Mutex::new(state),
            ready: Condvar::new(),
            store,
            listener: std::sync::OnceLock::new(),
        };
        Ok((queue, was_running))
    }

    /// Removes from the store the entries [`PromptQueue::restore`] reported as running, once the caller has
    /// recorded what became of them.
    pub fn settle(&self, was_running: &[QueueEntry<P>]) -> Result<(), StoreError> {
        if was_running.is_empty() {
            return Ok(());
        }
        self.store.remove(&was_running.iter().map(|e| e.id.clone()).collect::<Vec<_>>())
    }

    /// Calls `listener` after every change, while the change is still the latest one (under the queue's lock),
    /// so announcements of changes come in the order of the changes. Only the first listener set is kept.
    pub fn on_change(&self, listener: ChangeListener<P>) {
        let _ = self.listener.set(listener);
    }

    fn changed(&self, state: &State<P>) {
        if let Some(listener) = self.listener.get() {
            listener(&Snapshot(state));
        }
    }

    /// Queues a prompt durably and returns its number ([`PromptQueue::take_number`], [`PromptQueue::reserve`],
    /// the store's insert and [`PromptQueue::admit`] in one call).
    pub fn push(&self, id: String, placement: Placement, payload: P) -> Result<f64, PushError> {
        let number = self.take_number(placement);
        let entry = self.reserve(id, number)?.entry(payload);
        if let Err(error) = self.store.insert(&entry) {
            self.abandon(&entry.id);
            return Err(error.into());
        }
        let number = entry.number;
        self.admit(entry);
        Ok(number)
    }

    /// The number of a new prompt request: the client's own, or the next from the counter (negated for
    /// `front`). Taken before the prompt is validated, as ComfyUI does, so a rejected prompt uses one too.
    pub fn take_number(&self, placement: Placement) -> f64 {
        let mut state = lock(&self.state);
        let taken = state.counter;
        if !matches!(placement, Placement::Number(_)) {
            state.counter += 1;
        }
        placement.number(taken)
    }

    /// The next number the counter gives (what a store keeps to continue after a restart).
    pub fn counter(&self) -> u64 {
        lock(&self.state).counter
    }

    /// Takes a place (arrival order) at `number` for a prompt the caller will store itself, without holding
    /// the queue while it does: [`PromptQueue::admit`] then makes it pending, or [`PromptQueue::abandon`]
    /// frees the id if storing failed. For a server whose store is asynchronous; [`PromptQueue::push`] does
    /// every step. Fails if a prompt with this id is pending, running, or reserved.
    pub fn reserve(&self, id: String, number: f64) -> Result<Ticket, InUse> {
        let mut state = lock(&self.state);
        if !state.in_use.insert(id.clone()) {
            return Err(InUse(id));
        }
        let seq = state.seq;
        state.seq += 1;
        Ok(Ticket { id, number, seq })
    }

    /// Gives up a reservation whose entry could not be stored: the id is free again (the number stays used).
    pub fn abandon(&self, id: &str) {
        lock(&self.state).in_use.remove(id);
    }

    /// Makes pending an entry whose place comes from a [`Ticket`], once the caller has stored it durably (as
    /// [`QueueStore::insert`] would have).
    pub fn admit(&self, entry: QueueEntry<P>) {
        let mut state = lock(&self.state);
        state.make_pending(entry);
        self.changed(&state);
        drop(state);
        self.ready.notify_one();
    }

    /// Takes the next prompt (lowest number, then oldest), waiting up to `timeout` for one; it becomes running.
    pub fn pop(&self, timeout: Duration) -> Result<Option<QueueEntry<P>>, StoreError> {
        let mut state = lock(&self.state);
        if state.pending.is_empty() {
            state = self
                .ready
                .wait_timeout(state, timeout)
                .map(|(s, _)| s)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let Some((_, entry)) = state.pending.pop_first() else {
            return Ok(None);
        };
        state.running.push(entry.clone());
        self.changed(&state);
        drop(state);
        if let Err(error) = self.store.mark_running(&entry.id) {
            let mut state = lock(&self.state);
            state.running.retain(|r| r.id != entry.id);
            state.make_pending(entry);
            self.changed(&state);
            return Err(error);
        }
        Ok(Some(entry))
    }

    /// The running prompt has finished (whatever the outcome): it leaves memory and the store.
    pub fn finish(&self, id: &str) -> Result<(), StoreError> {
        self.retire(id);
        self.store.finished(id)
    }

    /// The running prompt has finished and the caller has already removed it from the store (the server does
    /// so in the transaction that stores its history entry): it leaves memory only.
    pub fn retire(&self, id: &str) {
        let mut state = lock(&self.state);
        if let Some(at) = state.running.iter().position(|r| r.id == id) {
            state.running.remove(at);
            state.in_use.remove(id);
        }
        self.changed(&state);
    }

    /// Removes pending prompts by id (unknown ids are ignored); returns the removed entries, for the caller to
    /// drop when it suits it (dropping thousands of prompts takes a while).
    pub fn delete(&self, ids: &[String]) -> Result<Vec<QueueEntry<P>>, StoreError> {
        let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
        self.delete_where(|entry| ids.contains(entry.id.as_str()))
    }

    /// Removes the pending prompts that `matches` (one tenant's, say); returns them, as
    /// [`PromptQueue::delete`].
    pub fn delete_where(
        &self,
        matches: impl Fn(&QueueEntry<P>) -> bool,
    ) -> Result<Vec<QueueEntry<P>>, StoreError> {
        let mut state = lock(&self.state);
        let mut removed = Vec::new();
        state.pending.retain(|_, entry| {
            let delete = matches(entry);
            if delete {
                removed.push(entry.clone());
            }
            !delete
        });
        self.remove_stored(state, removed)
    }

    /// Removes every pending prompt; returns the removed entries, as [`PromptQueue::delete`].
    pub fn clear(&self) -> Result<Vec<QueueEntry<P>>, StoreError> {
        let mut state = lock(&self.state);
        let removed = std::mem::take(&mut state.pending).into_values().collect();
        self.remove_stored(state, removed)
    }

    /// Announces the removal of `removed` from pending, then removes them from the store (outside the lock,
    /// in one call); if the store fails they are pending again.
    fn remove_stored(
        &self,
        mut state: MutexGuard<'_, State<P>>,
        removed: Vec<QueueEntry<P>>,
    ) -> Result<Vec<QueueEntry<P>>, StoreError> {
        for entry in &removed {
            state.in_use.remove(&entry.id);
        }
        self.changed(&state);
        drop(state);
        if removed.is_empty() {
            return Ok(removed);
        }
        let ids: Vec<String> = removed.iter().map(|e| e.id.clone()).collect();
        if let Err(error) = self.store.remove(&ids) {
            let mut state = lock(&self.state);
            for entry in removed {
                state.make_pending(entry);
            }
            self.changed(&state);
            return Err(error);
        }
        Ok(removed)
    }

    /// The pending prompts in run order.
    pub fn pending(&self) -> Vec<QueueEntry<P>> {
        lock(&self.state).pending.values().cloned().collect()
    }

    /// The running prompts, in the order they started.
    pub fn running(&self) -> Vec<QueueEntry<P>> {
        lock(&self.state).running.clone()
    }

    /// The prompts pending or running, by id: whether each runs.
    pub fn states(&self) -> std::collections::HashMap<String, bool> {
        let state = lock(&self.state);
        let pending = state.pending.values().map(|e| (e.id.clone(), false));
        pending.chain(state.running.iter().map(|e| (e.id.clone(), true))).collect()
    }

    /// [`PromptQueue::admit`], unless a prompt with this id is pending or running already (a mirror that a
    /// sync brought it to first); whether it was admitted. The reservation ends either way.
    pub fn admit_new(&self, entry: QueueEntry<P>) -> bool {
        let mut state = lock(&self.state);
        let known = state.running.iter().chain(state.pending.values()).any(|e| e.id == entry.id);
        if known {
            return false;
        }
        state.make_pending(entry);
        self.changed(&state);
        drop(state);
        self.ready.notify_one();
        true
    }

    /// Makes this queue a mirror of a queue kept elsewhere (several processes sharing one database): pending
    /// and running become `rows` (id, number, arrival, whether it runs), each with the payload it already has
    /// here or, for a prompt new to this queue, the one in `new`; a row with neither is left out (it comes
    /// with the next sync). Reserved places are kept, and listeners hear of the change.
    pub fn sync(&self, rows: &[SyncRow], mut new: std::collections::HashMap<String, P>) {
        let mut state = lock(&self.state);
        let mut known: std::collections::HashMap<String, P> = std::mem::take(&mut state.pending)
            .into_values()
            .chain(std::mem::take(&mut state.running))
            .map(|e| {
                state.in_use.remove(&e.id);
                (e.id, e.payload)
            })
            .collect();
        for row in rows {
            let Some(payload) = known.remove(&row.id).or_else(|| new.remove(&row.id)) else {
                continue;
            };
            let entry =
                QueueEntry { id: row.id.clone(), number: row.number, seq: row.seq, payload };
            if row.running {
                state.in_use.insert(entry.id.clone());
                state.running.push(entry);
            } else {
                state.make_pending(entry);
            }
        }
        self.changed(&state);
    }

    /// Pending plus running.
    pub fn remaining(&self) -> usize {
        lock(&self.state).remaining()
    }

    /// How many prompts are pending and how many run, read together.
    pub fn counts(&self) -> (usize, usize) {
        let state = lock(&self.state);
        (state.pending.len(), state.running.len())
    }

    /// Pending plus running prompts whose payload `matches`.
    pub fn remaining_where(&self, matches: impl Fn(&P) -> bool) -> usize {
        Snapshot(&*lock(&self.state)).remaining_where(matches)
    }
}

#[cfg(test)]
mod tests;
