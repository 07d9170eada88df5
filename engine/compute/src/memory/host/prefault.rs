//! The prefault pool: six threads that fault in a buffer's pages ahead of use, so registering them later is
//! cheap (registering prefaulted pages runs at ~21 GB/s on our H200 host, locking cold pages at 1–2 GB/s;
//! performance-anchors.md §1.1, §2.2).
//!
//! One job is in flight at a time, process-wide (memory-manager.md §3): a job splits its range into six
//! spans, each worker faults one. Jobs are numbered; [`PrefaultPool::join`] waits for a given job only. The
//! invariant callers keep: a range handed to [`PrefaultPool::start`] stays committed until its job is joined.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use super::vm;

/// Threads of the pool.
pub(super) const PREFAULT_THREADS: usize = 6;

/// Spans start on this alignment (a multiple of every page size we run on, so `madvise` accepts them).
const SPAN_ALIGN: usize = 64 << 10;

/// Failed jobs kept for a later `join` (older ones are forgotten).
const ERRORS_KEPT: u64 = 64;

#[derive(Clone, Copy)]
struct Job {
    addr: usize,
    len: usize,
}

#[derive(Default)]
struct State {
    /// Worker threads running (fewer than [`PREFAULT_THREADS`] only if the system refused some).
    threads: usize,
    /// Number of the latest job started.
    generation: u64,
    /// The job in flight, if any.
    job: Option<Job>,
    /// Workers still on the job in flight.
    running: usize,
    /// Latest job all workers have finished.
    finished: u64,
    /// Errors of finished jobs nobody has joined yet, by job number.
    errors: BTreeMap<u64, io::Error>,
}

/// The process-wide prefault pool.
pub(super) struct PrefaultPool {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

impl PrefaultPool {
    /// The pool, its threads started on first use.
    pub(super) fn global() -> &'static PrefaultPool {
        static POOL: OnceLock<&'static PrefaultPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let pool: &'static PrefaultPool = Box::leak(Box::new(PrefaultPool {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                done: Condvar::new(),
            }));
            for index in 0..PREFAULT_THREADS {
                let spawned = std::thread::Builder::new()
                    .name(format!("kiln-prefault-{index}"))
                    .spawn(move || pool.worker(index));
                match spawned {
                    Ok(_) => pool.lock().threads += 1,
                    Err(e) => {
                        // Fewer threads only make jobs slower; with none, `start` faults inline.
                        tracing::warn!("the prefault pool runs with {index} threads: {e}");
                        break;
                    }
                }
            }
            pool
        })
    }

    /// Starts prefaulting `[addr, addr + len)` once the job in flight (any buffer's) has finished, and returns
    /// the new job's number. The range must stay committed until [`PrefaultPool::join`] of that number returns.
    pub(super) fn start(&self, addr: usize, len: usize) -> u64 {
        if len == 0 {
            // Job numbers start at 1, so joining 0 returns at once and takes no one's error.
            return 0;
        }
        let mut state = self.lock();
        while state.job.is_some() {
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.generation += 1;
        let generation = state.generation;
        if state.threads == 0 {
            if let Err(e) = vm::prefault(addr, len) {
                state.errors.insert(generation, e);
            }
            state.finished = generation;
            return generation;
        }
        state.job = Some(Job { addr, len });
        state.running = state.threads;
        self.work.notify_all();
        generation
    }

    /// Waits until job `ticket` has finished; returns its error if one of its spans failed.
    pub(super) fn join(&self, ticket: u64) -> io::Result<()> {
        let mut state = self.lock();
        while state.finished < ticket {
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        match state.errors.remove(&ticket) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn worker(&self, index: usize) {
        let mut seen = 0u64;
        loop {
            let (generation, job, threads) = {
                let mut state = self.lock();
                loop {
                    match state.job {
                        Some(job) if state.generation != seen => {
                            break (state.generation, job, state.threads);
                        }
                        _ => state = self.work.wait(state).unwrap_or_else(|p| p.into_inner()),
                    }
                }
            };
            seen = generation;
            let (start, len) = span(job.len, index, threads);
            let result = vm::prefault(job.addr + start, len);
            let mut state = self.lock();
            if let Err(e) = result {
                state.errors.entry(generation).or_insert(e);
            }
            state.running -= 1;
            if state.running == 0 {
                state.finished = generation;
                state.job = None;
                let oldest = generation.saturating_sub(ERRORS_KEPT);
                state.errors.retain(|&g, _| g > oldest);
                self.done.notify_all();
            }
        }
    }
}

/// The span `(offset, len)` of a `len`-byte job that worker `index` of `threads` faults.
fn span(len: usize, index: usize, threads: usize) -> (usize, usize) {
    let per = len.div_ceil(threads).next_multiple_of(SPAN_ALIGN);
    let start = (per * index).min(len);
    (start, per.min(len - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_a_job_exactly_once() {
        for len in [1usize, 4096, SPAN_ALIGN * 6, (3 << 20) + 12345, 64 << 20] {
            let mut next = 0;
            for index in 0..PREFAULT_THREADS {
                let (start, n) = span(len, index, PREFAULT_THREADS);
                if n > 0 {
                    assert_eq!(start, next, "len {len}: spans are contiguous");
                    assert_eq!(start % SPAN_ALIGN, 0, "len {len}: spans are aligned");
                }
                next = start + n;
            }
            assert_eq!(next, len, "spans cover the job");
        }
    }
}
