//! The websocket side of the server: engine events as `Ws*` messages (`messages.rs`) and the hub that routes
//! them to sockets by client id (`hub.rs`). The axum handler that pumps a hub connection into a real socket comes
//! with the server's implementation of the generated trait.

mod hub;
mod messages;

#[allow(unused_imports)]
// Used by the server's implementation of the generated trait (the server issue).
pub(crate) use hub::{Connection, Frame, Hub};
#[allow(unused_imports)]
pub(crate) use messages::{Audience, ProgressState, executing, message, node_output, status};
