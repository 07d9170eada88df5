//! The decommit thread: gives committed host memory back to the system off the caller's thread.
//!
//! Freeing gigabytes of pages takes the kernel a while, so [`super::HostBuffer::truncate`] queues the work in
//! chunks of at most [`DECOMMIT_QUEUE_LIMIT`] bytes to one process-wide thread that runs them in order; a
//! producer blocks while more than that limit is queued, so a burst of truncations cannot run far ahead of
//! the memory actually coming back (memory-manager.md §3). Each buffer counts its own queued jobs
//! ([`Pending`]) and waits for them before committing again, so a late decommit never hits new memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::vm;

/// Largest chunk of one decommit job, and the queued bytes above which producers wait.
pub(super) const DECOMMIT_QUEUE_LIMIT: usize = 384 << 20;

/// A buffer's count of queued jobs.
#[derive(Default)]
pub(super) struct Pending {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Pending {
    /// Waits until every job the buffer queued has run.
    pub(super) fn wait_idle(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            count = self.idle.wait(count).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn add(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn done(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *count -= 1;
        if *count == 0 {
            self.idle.notify_all();
        }
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Decommit a committed range (its bytes count against the queue limit).
    Decommit,
    /// Release a whole reservation whose committed ranges were decommitted by earlier jobs.
    Release,
}

struct Job {
    op: Op,
    addr: usize,
    len: usize,
    pending: Arc<Pending>,
}

impl Job {
    fn queued_bytes(&self) -> usize {
        match self.op {
            Op::Decommit => self.len,
            Op::Release => 0,
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Bytes of queued and running decommits.
    bytes: usize,
}

/// The process-wide decommit thread and its queue.
pub(super) struct Decommitter {
    queue: Mutex<Queue>,
    has_items: Condvar,
    has_space: Condvar,
    /// Whether the thread runs; without it jobs run on the submitting thread.
    threaded: AtomicBool,
}

impl Decommitter {
    /// The decommitter, its thread started on first use.
    pub(super) fn global() -> &'static Decommitter {
        static DECOMMITTER: OnceLock<&'static Decommitter> = OnceLock::new();
        DECOMMITTER.get_or_init(|| {
            let d: &'static Decommitter = Box::leak(Box::new(Decommitter {
                queue: Mutex::new(Queue::default()),
                has_items: Condvar::new(),
                has_space: Condvar::new(),
                threaded: AtomicBool::new(true),
            }));
            if let Err(e) =
                std::thread::Builder::new().name("kiln-decommit".into()).spawn(move || d.worker())
            {
                tracing::warn!(
                    "no decommit thread, host memory is freed on the caller's thread: {e}"
                );
                d.threaded.store(false, Ordering::Relaxed);
            }
            d
        })
    }

    /// Queues `op` on `[addr, addr + len)` for the buffer counting its jobs in `pending`; blocks while more than
    /// [`DECOMMIT_QUEUE_LIMIT`] bytes are queued. Decommit ranges must be at most that limit long.
    pub(super) fn submit(&self, op: Op, addr: usize, len: usize, pending: &Arc<Pending>) {
        debug_assert!(op == Op::Release || len <= DECOMMIT_QUEUE_LIMIT);
        let job = Job { op, addr, len, pending: pending.clone() };
        pending.add();
        if !self.threaded.load(Ordering::Relaxed) {
            run(&job);
            job.pending.done();
            return;
        }
        let mut queue = self.lock();
        while queue.bytes > DECOMMIT_QUEUE_LIMIT {
            queue = self.has_space.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        queue.bytes += job.queued_bytes();
        queue.jobs.push_back(job);
        self.has_items.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn worker(&self) {
        loop {
            let job = {
                let mut queue = self.lock();
                loop {
                    match queue.jobs.pop_front() {
                        Some(job) => break job,
                        None => {
                            queue = self.has_items.wait(queue).unwrap_or_else(|p| p.into_inner())
                        }
                    }
                }
            };
            run(&job);
            {
                let mut queue = self.lock();
                queue.bytes -= job.queued_bytes();
                self.has_space.notify_all();
            }
            job.pending.done();
        }
    }
}

fn run(job: &Job) {
    let result = match job.op {
        Op::Decommit => vm::decommit(job.addr, job.len),
        Op::Release => vm::release(job.addr, job.len),
    };
    if let Err(e) = result {
        // The memory stays committed (or reserved); nothing else can be done from here.
        tracing::warn!("{:?} of {} host bytes at {:#x} failed: {e}", job.op, job.len, job.addr);
    }
}
