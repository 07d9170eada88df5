//! The recent server log, kept in memory for `/internal/logs` and the `logs` websocket events: a tracing layer
//! that records each event's message with its time.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// How many entries are kept.
const CAPACITY: usize = 2000;

/// One log entry: when and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Sequence number, increasing.
    pub(crate) seq: u64,
    /// RFC 3339 time.
    pub(crate) time: String,
    /// The formatted line.
    pub(crate) message: String,
}

/// The shared ring of recent entries.
#[derive(Debug, Clone, Default)]
pub struct LogRing {
    inner: Arc<Mutex<(u64, VecDeque<Entry>)>>,
}

impl LogRing {
    /// An empty ring.
    pub fn new() -> LogRing {
        LogRing::default()
    }

    /// The tracing layer that fills this ring.
    pub fn layer(&self) -> RingLayer {
        RingLayer { ring: self.clone() }
    }

    fn push(&self, message: String) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.0 += 1;
        let seq = inner.0;
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        inner.1.push_back(Entry { seq, time, message });
        while inner.1.len() > CAPACITY {
            inner.1.pop_front();
        }
    }

    /// Entries with a sequence number above `after`, oldest first.
    pub(crate) fn since(&self, after: u64) -> Vec<Entry> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.1.iter().filter(|e| e.seq > after).cloned().collect()
    }
}

/// A tracing layer recording events into a [`LogRing`].
pub struct RingLayer {
    ring: LogRing,
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut message =
            Message(format!("{} {}: ", event.metadata().level(), event.metadata().target()));
        event.record(&mut message);
        self.ring.push(message.0);
    }
}
