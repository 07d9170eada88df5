//! Stopping without losing work: after SIGTERM or SIGINT the server drains. It stops taking prompts to run
//! (it still accepts them: they are stored and run at the next start), reports not ready on `/readyz`, and
//! lets the running prompt finish. If that takes longer than `--drain-timeout`, or a second signal comes, the
//! running prompt is interrupted and handed back: its queue row is pending again, so it runs again at the
//! next start instead of being recorded as interrupted.
//!
//! The worker acknowledges the drain ([`Drain::worker_stopped`]) only between prompts, so once the drain sees
//! the acknowledgement nothing runs and nothing will.

use std::sync::atomic::{AtomicBool, Ordering};

/// The drain's state, shared by the signal handling, the worker and `/readyz`.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    draining: AtomicBool,
    handing_back: AtomicBool,
    worker_stopped: AtomicBool,
}

impl Drain {
    /// Starts draining: the worker takes no new prompt.
    pub(crate) fn start(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the server drains.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// From now on, an interrupted prompt is handed back to the queue rather than recorded.
    pub(crate) fn hand_back(&self) {
        self.handing_back.store(true, Ordering::SeqCst);
    }

    /// Whether an interrupted prompt goes back to the queue.
    pub(crate) fn is_handing_back(&self) -> bool {
        self.handing_back.load(Ordering::SeqCst)
    }

    /// The worker, between prompts, saw the drain: it runs nothing and takes nothing more.
    pub(crate) fn note_worker_stopped(&self) {
        self.worker_stopped.store(true, Ordering::SeqCst);
    }

    /// Whether the worker has stopped for the drain.
    pub(crate) fn worker_stopped(&self) -> bool {
        self.worker_stopped.load(Ordering::SeqCst)
    }
}
