//! The websocket side of the server: engine events as `Ws*` messages and binary preview frames (`messages.rs`),
//! the hub that routes them to sockets by client id (`hub.rs`), what a run tells the sockets as data
//! (`delivery.rs`, carried between processes in a cluster), and each socket's bounded send queue
//! (`outbox.rs`). The axum handler that pumps a hub connection into a real socket is in `service/api.rs`.

mod delivery;
mod hub;
mod messages;
mod outbox;

pub(crate) use delivery::Delivery;
pub(crate) use hub::{Connection, Frame, Hub};
pub(crate) use messages::{
    Audience, ProgressState, executing, message, node_output, preview_frames,
};
