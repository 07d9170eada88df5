//! The history record of a run: its outcome, what its output nodes showed, and the `execution_*` status
//! messages with their timestamps, as ComfyUI keeps them in `/history`.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Event, EventSink};

/// A status message: an `execution_*` event and when it happened (ms since the epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusMessage {
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The event (`ExecutionStart`, `ExecutionCached`, `ExecutionSuccess`, `ExecutionError` or
    /// `ExecutionInterrupted`).
    pub event: Event,
}

/// Records the status messages of runs while forwarding every event to another sink.
pub struct HistoryRecorder {
    inner: Arc<dyn EventSink>,
    messages: Mutex<Vec<StatusMessage>>,
}

impl HistoryRecorder {
    /// A recorder forwarding to `inner`.
    pub fn new(inner: Arc<dyn EventSink>) -> HistoryRecorder {
        HistoryRecorder { inner, messages: Mutex::new(Vec::new()) }
    }

    /// The status messages recorded so far, oldest first, leaving none behind.
    pub fn take(&self) -> Vec<StatusMessage> {
        std::mem::take(&mut *self.messages.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl EventSink for HistoryRecorder {
    fn emit(&self, prompt_id: &str, event: Event) {
        let is_status = matches!(
            event,
            Event::ExecutionStart
                | Event::ExecutionCached { .. }
                | Event::ExecutionSuccess
                | Event::ExecutionError(_)
                | Event::ExecutionInterrupted { .. }
        );
        if is_status {
            let timestamp_ms =
                SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let message = StatusMessage { timestamp_ms, event: event.clone() };
            self.messages.lock().unwrap_or_else(|p| p.into_inner()).push(message);
        }
        self.inner.emit(prompt_id, event);
    }
}
