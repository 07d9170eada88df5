//! The prompt queue: priority by `number` (lower first, ties in arrival order), `front` ahead of everything
//! pending, deletion and clearing of pending prompts, the running prompt visible, and a [`QueueStore`] that
//! makes every change durable before it is acknowledged (the server implements it with SQLite).
//!
//! Invariant: a prompt is in exactly one of pending, running, or gone, in memory and in the store alike, once
//! the call that changed it returns. The queue's lock is never held while the store works: it guards memory
//! only, so async threads may take it without waiting on the disk (or on whatever the store itself waits for).
//! A change reaches the store after memory and before the call returns; if the store fails, memory is put back.
//! The one exception: entries that were running when the previous process stopped stay in the store after
//! `restore` until the caller has recorded them and calls `settle`.

use std::collections::BTreeMap;
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

/// Durable storage of the queue.
pub trait QueueStore<P>: Send + Sync {
    /// Stores a new pending entry.
    fn insert(&self, entry: &QueueEntry<P>) -> Result<(), StoreError>;
    /// Marks an entry running.
    fn mark_running(&self, id: &str) -> Result<(), StoreError>;
    /// Removes entries (deleted or cleared by a client, or running when the previous process stopped).
    fn remove(&self, ids: &[String]) -> Result<(), StoreError>;
    /// Removes the entry of the prompt that just finished running. A store may make this cheaper than a
    /// client's `remove` (the server does not wait for the disk here: losing it to a power cut reruns the prompt).
    fn finished(&self, id: &str) -> Result<(), StoreError> {
        self.remove(&[id.to_owned()])
    }
    /// Every stored entry, and whether it was running.
    fn load(&self) -> Result<Vec<(QueueEntry<P>, bool)>, StoreError>;
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

struct State<P> {
    pending: Vec<QueueEntry<P>>,
    running: Option<QueueEntry<P>>,
    counter: u64,
    seq: u64,
}

/// A place in the queue: the prompt's number (priority) and arrival order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ticket {
    /// The priority the prompt gets.
    pub number: f64,
    /// Its arrival order.
    pub seq: u64,
}

impl Ticket {
    /// The queue entry of prompt `id` at this place.
    pub fn entry<P>(self, id: String, payload: P) -> QueueEntry<P> {
        QueueEntry { id, number: self.number, seq: self.seq, payload }
    }
}

fn reserve<P>(state: &mut State<P>, placement: Placement) -> Ticket {
    let number = match placement {
        Placement::Number(n) => n,
        Placement::Back => {
            state.counter += 1;
            (state.counter - 1) as f64
        }
        Placement::Front => {
            state.counter += 1;
            -((state.counter - 1) as f64)
        }
    };
    let seq = state.seq;
    state.seq += 1;
    Ticket { number, seq }
}

/// Told the number of remaining prompts (pending plus running) after every change.
pub type ChangeListener = Box<dyn Fn(usize) + Send + Sync>;

/// The prompt queue.
pub struct PromptQueue<P> {
    state: Mutex<State<P>>,
    ready: Condvar,
    store: Box<dyn QueueStore<P>>,
    listener: std::sync::OnceLock<ChangeListener>,
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

impl<P: Clone + Send> PromptQueue<P> {
    /// A queue over a store, restored from it. Returns the queue and the entries that were running when the
    /// previous process stopped: they did not finish, and stay in the store until the caller has recorded them
    /// (as interrupted) and calls [`PromptQueue::settle`], so a crash in between loses nothing.
    pub fn restore(
        store: Box<dyn QueueStore<P>>,
    ) -> Result<(PromptQueue<P>, Vec<QueueEntry<P>>), StoreError> {
        let mut pending = Vec::new();
        let mut was_running = Vec::new();
        let mut counter = 0u64;
        let mut seq = 0u64;
        for (entry, running) in store.load()? {
            if entry.number.is_finite() && entry.number >= 0.0 {
                counter = counter.max(entry.number.floor() as u64 + 1);
            }
            seq = seq.max(entry.seq + 1);
            if running { was_running.push(entry) } else { pending.push(entry) }
        }
        let state = State { pending, running: None, counter, seq };
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
    pub fn on_change(&self, listener: ChangeListener) {
        let _ = self.listener.set(listener);
    }

    fn changed(&self, state: &State<P>) {
        if let Some(listener) = self.listener.get() {
            listener(state.pending.len() + usize::from(state.running.is_some()));
        }
    }

    /// Queues a prompt durably and returns its number.
    pub fn push(&self, id: String, placement: Placement, payload: P) -> Result<f64, StoreError> {
        let entry = self.reserve(placement).entry(id, payload);
        self.store.insert(&entry)?;
        let number = entry.number;
        self.admit(entry);
        Ok(number)
    }

    /// Takes a place (number and arrival order) for a prompt the caller will store itself, without holding
    /// the queue while it does: [`PromptQueue::admit`] then makes it pending. For a server whose store is
    /// asynchronous; [`PromptQueue::push`] does all three steps.
    pub fn reserve(&self, placement: Placement) -> Ticket {
        reserve(&mut lock(&self.state), placement)
    }

    /// Makes pending an entry whose number and arrival order come from a [`Ticket`], once the caller has
    /// stored it durably (as [`QueueStore::insert`] would have).
    pub fn admit(&self, entry: QueueEntry<P>) {
        let mut state = lock(&self.state);
        state.pending.push(entry);
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
        let Some(index) = (0..state.pending.len()).min_by(|&a, &b| {
            let (x, y) = (&state.pending[a], &state.pending[b]);
            x.number.total_cmp(&y.number).then(x.seq.cmp(&y.seq))
        }) else {
            return Ok(None);
        };
        let entry = state.pending.remove(index);
        state.running = Some(entry.clone());
        self.changed(&state);
        drop(state);
        if let Err(error) = self.store.mark_running(&entry.id) {
            let mut state = lock(&self.state);
            state.running = None;
            state.pending.push(entry);
            self.changed(&state);
            return Err(error);
        }
        Ok(Some(entry))
    }

    /// The running prompt has finished (whatever the outcome).
    pub fn finish(&self, id: &str) -> Result<(), StoreError> {
        let mut state = lock(&self.state);
        if state.running.as_ref().is_some_and(|r| r.id == id) {
            state.running = None;
        }
        self.changed(&state);
        drop(state);
        self.store.finished(id)
    }

    /// Removes pending prompts by id (unknown ids are ignored); returns how many were removed.
    pub fn delete(&self, ids: &[String]) -> Result<usize, StoreError> {
        let mut state = lock(&self.state);
        let (removed, kept) =
            std::mem::take(&mut state.pending).into_iter().partition(|e| ids.contains(&e.id));
        state.pending = kept;
        self.remove_stored(state, removed)
    }

    /// Removes every pending prompt.
    pub fn clear(&self) -> Result<usize, StoreError> {
        let mut state = lock(&self.state);
        let removed = std::mem::take(&mut state.pending);
        self.remove_stored(state, removed)
    }

    /// Announces the removal of `removed` from pending, then removes them from the store (outside the lock);
    /// if the store fails they are pending again.
    fn remove_stored(
        &self,
        state: MutexGuard<'_, State<P>>,
        removed: Vec<QueueEntry<P>>,
    ) -> Result<usize, StoreError> {
        self.changed(&state);
        drop(state);
        let ids: Vec<String> = removed.iter().map(|e| e.id.clone()).collect();
        if let Err(error) = self.store.remove(&ids) {
            let mut state = lock(&self.state);
            state.pending.extend(removed);
            self.changed(&state);
            return Err(error);
        }
        Ok(ids.len())
    }

    /// The pending prompts in run order.
    pub fn pending(&self) -> Vec<QueueEntry<P>> {
        let mut pending = lock(&self.state).pending.clone();
        pending.sort_by(|x, y| x.number.total_cmp(&y.number).then(x.seq.cmp(&y.seq)));
        pending
    }

    /// The running prompt.
    pub fn running(&self) -> Option<QueueEntry<P>> {
        lock(&self.state).running.clone()
    }

    /// Pending plus running.
    pub fn remaining(&self) -> usize {
        let state = lock(&self.state);
        state.pending.len() + usize::from(state.running.is_some())
    }
}

#[cfg(test)]
mod tests;
