//! A socket's send queue, bounded in bytes: the hub puts frames in without ever waiting, the socket's pump
//! takes them out as fast as the client reads, and a client that stops reading is dropped once its backlog
//! passes [`MAX_QUEUED_BYTES`], instead of the server holding every frame it is sent.
//!
//! The bound is in bytes, not frames, because frames range from a hundred-byte `status` to a preview or a
//! `SaveImageWebsocket` image of megabytes; a count of frames would bound nothing. Invariant: there is one
//! producer (the hub, under its lock), so checking the budget and then adding to it cannot race another send;
//! the pump only ever takes bytes off.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

use super::hub::Frame;

/// The most bytes of frames that may wait for one socket. A frame that would take the backlog past it drops
/// the socket, unless nothing is waiting: a single frame larger than this (a very large image) still goes out.
pub(crate) const MAX_QUEUED_BYTES: usize = 64 << 20;

/// What a queued frame costs besides its payload (the frame, its allocation and the channel's slot), so that
/// a flood of tiny frames is bounded too.
const FRAME_OVERHEAD: usize = 64;

fn cost(frame: &Frame) -> usize {
    FRAME_OVERHEAD
        + match frame {
            Frame::Text(text) => text.len(),
            Frame::Binary(bytes) => bytes.len(),
        }
}

/// What both ends share: the bytes waiting, and whether the socket was dropped for not reading.
#[derive(Default)]
struct Backlog {
    queued: AtomicUsize,
    overflowed: AtomicBool,
    dropped: Notify,
}

/// The hub's end of a socket's queue.
pub(crate) struct Outbox {
    tx: mpsc::UnboundedSender<Frame>,
    backlog: Arc<Backlog>,
}

/// The pump's end: the frames waiting to go out to the socket.
#[derive(Debug)]
pub(crate) struct Outgoing {
    rx: mpsc::UnboundedReceiver<Frame>,
    backlog: Arc<Backlog>,
}

impl std::fmt::Debug for Backlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backlog")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .field("overflowed", &self.overflowed.load(Ordering::Relaxed))
            .finish()
    }
}

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The pump is gone (the socket closed).
    Closed,
    /// The client stopped reading: `queued` bytes were already waiting. The pump has been told to close.
    Overflow {
        /// The bytes waiting when the frame came.
        queued: usize,
    },
}

/// A new, empty queue.
pub(crate) fn queue() -> (Outbox, Outgoing) {
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = Arc::new(Backlog::default());
    (Outbox { tx, backlog: backlog.clone() }, Outgoing { rx, backlog })
}

impl Outbox {
    /// Queues a frame without waiting; refuses it when the pump is gone or the backlog would pass
    /// [`MAX_QUEUED_BYTES`], in which case the pump is told to drop the socket.
    pub(crate) fn try_send(&self, frame: Frame) -> Result<(), Refused> {
        let backlog = &self.backlog;
        let cost = cost(&frame);
        let queued = backlog.queued.load(Ordering::Acquire);
        if backlog.overflowed.load(Ordering::Acquire)
            || (queued > 0 && queued.saturating_add(cost) > MAX_QUEUED_BYTES)
        {
            backlog.overflowed.store(true, Ordering::Release);
            // A stored permit: the pump sees it even if it is not waiting yet.
            backlog.dropped.notify_one();
            return Err(Refused::Overflow { queued });
        }
        backlog.queued.fetch_add(cost, Ordering::AcqRel);
        self.tx.send(frame).map_err(|_| Refused::Closed)
    }
}

impl Outgoing {
    /// The next frame to send; `None` once the hub is done with the socket (it was replaced, or dropped for
    /// not reading, in which case the frames still waiting are discarded).
    pub(crate) async fn recv(&mut self) -> Option<Frame> {
        if self.backlog.overflowed.load(Ordering::Acquire) {
            return None;
        }
        let frame = self.rx.recv().await?;
        self.backlog.queued.fetch_sub(cost(&frame), Ordering::AcqRel);
        Some(frame)
    }

    /// Completes once the socket has been dropped for not reading.
    pub(crate) fn dropped(&self) -> impl Future<Output = ()> + Send + 'static {
        let backlog = self.backlog.clone();
        async move { backlog.dropped.notified().await }
    }

    /// The next frame if one is waiting (tests read queues without a socket).
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Result<Frame, mpsc::error::TryRecvError> {
        let frame = self.rx.try_recv()?;
        self.backlog.queued.fetch_sub(cost(&frame), Ordering::AcqRel);
        Ok(frame)
    }

    /// The bytes waiting, overheads included.
    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.backlog.queued.load(Ordering::Acquire)
    }

    /// Whether the socket was dropped for not reading.
    #[cfg(test)]
    pub(crate) fn overflowed(&self) -> bool {
        self.backlog.overflowed.load(Ordering::Acquire)
    }
}
