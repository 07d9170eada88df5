//! The websocket hub: which sockets exist, under which client id, and who receives each message.
//!
//! Sockets are plain channels here (the axum handler pumps a channel into the real socket), so the routing rules
//! are tested without sockets. Rules (comfy-api.md §8.1): a socket is registered under its `clientId` (a random
//! 32-hex id when none is given); re-using an id replaces the earlier socket, and cleanup goes by connection
//! identity, so a late close of a replaced socket does not unregister its successor. Only the first text
//! message from a client is read, as a `feature_flags` announcement. Every socket belongs to a workspace, and
//! client ids are per workspace: a message only ever reaches sockets of the workspace it is published to, so
//! another workspace's socket cannot listen in by registering the same `clientId`. Sending never waits: each socket's queue
//! is bounded (`outbox.rs`), and a socket whose client stops reading is dropped, so one slow client holds up
//! neither the worker nor the other sockets.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_spec::types;

use super::delivery::Delivery;
use super::messages::{Audience, executing, status};
use super::outbox::{Outbox, Outgoing, Refused, queue};

/// A frame for a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A JSON text frame.
    Text(String),
    /// A binary frame: `[u32 big-endian event type][payload]` (previews).
    Binary(bytes::Bytes),
}

/// A connected socket's handle: its connection id, the client id it is registered under, and its frames.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) id: u64,
    pub(crate) sid: String,
    pub(crate) frames: Outgoing,
}

struct Socket {
    workspace: Arc<str>,
    sid: String,
    outbox: Outbox,
    read_first_message: bool,
    flags: Option<serde_json::Value>,
}

impl Socket {
    fn wants_preview_metadata(&self) -> bool {
        self.flags
            .as_ref()
            .and_then(|f| f.get("supports_preview_metadata"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }
}

struct Running {
    workspace: Arc<str>,
    client_id: Option<String>,
    last_node: Option<String>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    sockets: HashMap<u64, Socket>,
    by_sid: HashMap<(Arc<str>, String), u64>,
    /// The prompts running, by id (one on a single server; one per worker on an API node of a cluster).
    running: HashMap<String, Running>,
    /// The counter each workspace's last `status` broadcast carried.
    last_status: HashMap<Arc<str>, i64>,
}

impl Inner {
    /// Forgets a socket; its client id stays registered if a newer socket took it over.
    fn remove(&mut self, id: u64) {
        if let Some(socket) = self.sockets.remove(&id) {
            let key = (socket.workspace, socket.sid);
            if self.by_sid.get(&key) == Some(&id) {
                self.by_sid.remove(&key);
            }
        }
    }

    /// Queues a frame for a socket; a socket that is gone, or whose client stopped reading, is forgotten.
    fn deliver(&mut self, id: u64, frame: Frame) {
        let Some(socket) = self.sockets.get(&id) else { return };
        match socket.outbox.try_send(frame) {
            Ok(()) => return,
            Err(Refused::Closed) => {}
            // The sid is the client's own `clientId`: logged quoted and escaped.
            Err(Refused::Overflow { queued }) => tracing::warn!(
                sid = ?socket.sid,
                queued_bytes = queued,
                "websocket client stopped reading; disconnecting it"
            ),
        }
        self.remove(id);
    }
}

/// The registry of sockets and the routing of messages.
#[derive(Default)]
pub(crate) struct Hub {
    inner: Mutex<Inner>,
}

/// A message's JSON text as it goes on the wire.
pub(crate) fn json(message: &types::WsMessage) -> Option<String> {
    let value = serde_json::to_value(message)
        .map_err(|e| tracing::error!(error = %e, "a websocket message did not serialize"))
        .ok()?;
    // `progress` carries a progress bar's step counts, which ComfyUI sends as integers (`0` of `1`); the wire
    // type is a JSON number. `progress_state` goes out as floats, as ComfyUI sends it for a node that runs.
    let value = match message {
        types::WsMessage::ProgressMessage(_) => crate::api::integral_floats_as_ints(value),
        _ => value,
    };
    Some(value.to_string())
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a socket and sends it `status` with its `sid`; if this client owns the running prompt, also
    /// `executing` with the node it is on, so a reconnecting tab resumes.
    pub(crate) fn connect(
        &self,
        workspace: &Arc<str>,
        client_id: Option<&str>,
        queue_remaining: i64,
    ) -> Connection {
        let sid = client_id
            .filter(|c| !c.is_empty())
            .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
        let (outbox, frames) = queue();
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.sockets.insert(
            id,
            Socket {
                workspace: workspace.clone(),
                sid: sid.clone(),
                outbox,
                read_first_message: false,
                flags: None,
            },
        );
        inner.by_sid.insert((workspace.clone(), sid.clone()), id);
        // The greeting carries the counter: a later broadcast of the same value says nothing new.
        inner.last_status.insert(workspace.clone(), queue_remaining);
        if let Some(text) = json(&status(queue_remaining, Some(&sid))) {
            inner.deliver(id, Frame::Text(text));
        }
        let resumed: Vec<String> = inner
            .running
            .values()
            .filter(|r| r.workspace == *workspace && r.client_id.as_deref() == Some(sid.as_str()))
            .filter_map(|r| json(&executing(Some(r.last_node.as_deref()?), None)))
            .collect();
        for text in resumed {
            inner.deliver(id, Frame::Text(text));
        }
        Connection { id, sid, frames }
    }

    /// Forgets a socket; its client id stays registered if a newer socket took it over.
    pub(crate) fn disconnect(&self, id: u64) {
        self.lock().remove(id);
    }

    /// A text message from a client: only the first is read; `feature_flags` is stored and answered with the
    /// server's flags. Anything else is ignored.
    pub(crate) fn client_text(&self, id: u64, text: &str, server_flags: &types::FeatureFlags) {
        let mut inner = self.lock();
        let Some(socket) = inner.sockets.get_mut(&id) else { return };
        if std::mem::replace(&mut socket.read_first_message, true) {
            return;
        }
        let Ok(message) = serde_json::from_str::<types::WsClientMessage>(text) else { return };
        socket.flags = serde_json::to_value(&message.data).ok();
        let reply = types::WsMessage::FeatureFlagsMessage(types::WsFeatureFlagsMessage {
            data: server_flags.clone(),
            type_: types::WsFeatureFlagsMessageType::FeatureFlags,
        });
        if let Some(text) = json(&reply) {
            inner.deliver(id, Frame::Text(text));
        }
    }

    /// Sends a preview of a prompt owned by `client_id` to the owner (every socket when there is none):
    /// `with_metadata` (type 4) to sockets that announced `supports_preview_metadata`, `plain` (type 1) to the
    /// others, as ComfyUI.
    pub(crate) fn send_preview(
        &self,
        workspace: &str,
        client_id: Option<&str>,
        plain: &bytes::Bytes,
        with_metadata: &bytes::Bytes,
    ) {
        self.send(workspace, client_id, Audience::OwnerOrAll, |socket| {
            let chosen = if socket.wants_preview_metadata() { with_metadata } else { plain };
            Frame::Binary(chosen.clone())
        });
    }

    /// Sends a message of a prompt of `workspace` owned by `client_id` to its audience in that workspace.
    pub(crate) fn publish(
        &self,
        workspace: &str,
        client_id: Option<&str>,
        message: &types::WsMessage,
        audience: Audience,
    ) {
        let Some(text) = json(message) else { return };
        self.publish_text(workspace, client_id, &text, audience);
    }

    /// [`Hub::publish`] of a message already in its JSON text ([`Delivery::text`]).
    fn publish_text(
        &self,
        workspace: &str,
        client_id: Option<&str>,
        text: &str,
        audience: Audience,
    ) {
        self.send(workspace, client_id, audience, |_| Frame::Text(text.to_owned()));
    }

    /// Does what a [`Delivery`] says (one that is no business of the sockets is ignored).
    pub(crate) fn deliver(&self, delivery: &Delivery) {
        match delivery {
            Delivery::Message { workspace, client_id, text, audience } => {
                self.publish_text(workspace, client_id.as_deref(), text, *audience);
            }
            Delivery::Preview { workspace, client_id, plain, with_metadata } => {
                self.send_preview(workspace, client_id.as_deref(), plain, with_metadata);
            }
            Delivery::Running { workspace, prompt_id, client_id, node, running } => {
                self.set_running(
                    prompt_id,
                    workspace,
                    client_id.as_deref(),
                    node.as_deref(),
                    *running,
                );
            }
            Delivery::HistoryStored { .. } | Delivery::HistoryRemoved { .. } => {}
        }
    }

    /// Queues for every socket of the audience in `workspace` the frame `frame_for` makes for it; sockets that
    /// are gone or whose client stopped reading are dropped.
    fn send(
        &self,
        workspace: &str,
        client_id: Option<&str>,
        audience: Audience,
        frame_for: impl Fn(&Socket) -> Frame,
    ) {
        let mut inner = self.lock();
        let everyone = match audience {
            Audience::All => true,
            Audience::OwnerOrAll => client_id.is_none(),
            Audience::Owner => false,
        };
        let targets: Vec<u64> = if everyone {
            inner
                .sockets
                .iter()
                .filter(|(_, socket)| &*socket.workspace == workspace)
                .map(|(id, _)| *id)
                .collect()
        } else {
            client_id
                .and_then(|c| inner.by_sid.get(&(Arc::from(workspace), c.to_owned())).copied())
                .into_iter()
                .collect()
        };
        for id in targets {
            if let Some(frame) = inner.sockets.get(&id).map(&frame_for) {
                inner.deliver(id, frame);
            }
        }
    }

    /// Broadcasts `status` to every socket with its own workspace's queue counter (on every queue change). With
    /// `only_changes` (several tenants), a workspace hears only of changes to its own counter, so its sockets
    /// never learn when another workspace's queue moves; without it (the local runtime), every change is
    /// announced, as ComfyUI does.
    pub(crate) fn broadcast_status(
        &self,
        queue_remaining: impl Fn(&str) -> i64,
        only_changes: bool,
    ) {
        let workspaces: BTreeSet<Arc<str>> =
            self.lock().sockets.values().map(|s| s.workspace.clone()).collect();
        for workspace in workspaces {
            let remaining = queue_remaining(&workspace);
            let previous = self.lock().last_status.insert(workspace.clone(), remaining);
            if only_changes && previous == Some(remaining) {
                continue;
            }
            self.publish(&workspace, None, &status(remaining, None), Audience::All);
        }
    }

    /// Records that a prompt runs, in which workspace, for whom, and on which node (for reconnecting owners),
    /// or with `running` false that it stopped.
    pub(crate) fn set_running(
        &self,
        prompt_id: &str,
        workspace: &str,
        client_id: Option<&str>,
        node: Option<&str>,
        running: bool,
    ) {
        let mut inner = self.lock();
        if !running {
            inner.running.remove(prompt_id);
            return;
        }
        let entry = Running {
            workspace: Arc::from(workspace),
            client_id: client_id.map(str::to_owned),
            last_node: node.map(str::to_owned),
        };
        inner.running.insert(prompt_id.to_owned(), entry);
    }

    /// Number of registered sockets.
    pub(crate) fn len(&self) -> usize {
        self.lock().sockets.len()
    }
}

#[cfg(test)]
mod tests;
