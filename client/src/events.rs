//! The `/ws` event stream, written by hand (a websocket is not an HTTP call progenitor can make).
//!
//! Text frames are parsed into [`types::WsMessage`]; frames of a type this SDK does not know (custom nodes
//! send their own) arrive as [`Event::Other`] instead of ending the stream. Binary frames (previews) arrive as
//! [`Event::Binary`].

use futures::{Stream, StreamExt as _};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::{Client, types};

/// One frame from the server.
#[derive(Debug, Clone)]
pub enum Event {
    /// A known text frame.
    Message(Box<types::WsMessage>),
    /// A text frame of a type the spec does not describe, as JSON.
    Other(serde_json::Value),
    /// A binary frame: `[u32 big-endian event type][payload]` (1: preview image).
    Binary {
        /// The event type.
        event_type: u32,
        /// The rest of the frame.
        payload: bytes::Bytes,
    },
}

/// Why the event stream failed.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The base URL is not `http://` (`https://` needs TLS, which this build leaves out).
    #[error("cannot open a websocket for base URL {0}: only http:// is supported")]
    UnsupportedUrl(String),
    /// The websocket failed.
    #[error("websocket error")]
    WebSocket(#[source] tokio_tungstenite::tungstenite::Error),
    /// The client's credentials cannot be sent in a header.
    #[error("the credentials cannot be sent in a header")]
    Credentials(#[source] reqwest::header::InvalidHeaderValue),
    /// A text frame is not JSON.
    #[error("the server sent a text frame that is not JSON")]
    NotJson(#[source] serde_json::Error),
}

impl Client {
    /// Opens `/ws?clientId=<client_id>`: every event of prompts submitted with this `client_id`, plus the
    /// broadcast ones (`status`, `progress_state`). The first event is `status` with `sid`. The handshake
    /// carries the client's [`crate::Credentials`].
    pub async fn events(
        &self,
        client_id: &str,
    ) -> Result<impl Stream<Item = Result<Event, EventsError>> + Send + Unpin + 'static, EventsError>
    {
        let rest = self
            .baseurl
            .strip_prefix("http://")
            .ok_or_else(|| EventsError::UnsupportedUrl(self.baseurl.clone()))?;
        let url = format!("ws://{rest}/ws?clientId={}", encode_query(client_id));
        let mut request = url.into_client_request().map_err(EventsError::WebSocket)?;
        if let Some((name, value)) = self.inner.header().map_err(EventsError::Credentials)? {
            request.headers_mut().insert(name, value);
        }
        let (socket, _) =
            tokio_tungstenite::connect_async(request).await.map_err(EventsError::WebSocket)?;
        Ok(Box::pin(socket.filter_map(|frame| async move {
            match frame {
                Ok(Message::Text(text)) => Some(parse_text(text.as_str())),
                Ok(Message::Binary(bytes)) => parse_binary(bytes).map(Ok),
                Ok(_) => None,
                Err(e) => Some(Err(EventsError::WebSocket(e))),
            }
        })))
    }
}

fn parse_text(text: &str) -> Result<Event, EventsError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(EventsError::NotJson)?;
    Ok(match serde_json::from_value::<types::WsMessage>(value.clone()) {
        Ok(message) => Event::Message(Box::new(message)),
        Err(_) => Event::Other(value),
    })
}

fn parse_binary(bytes: bytes::Bytes) -> Option<Event> {
    let head: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    Some(Event::Binary { event_type: u32::from_be_bytes(head), payload: bytes.slice(4..) })
}

fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Event, encode_query, parse_binary, parse_text};

    #[test]
    fn known_frames_are_typed_and_unknown_ones_kept() {
        let status = r#"{"type":"status","data":{"status":{"exec_info":{"queue_remaining":0}},"sid":"abc"}}"#;
        assert!(matches!(parse_text(status), Ok(Event::Message(_))));
        let custom = r#"{"type":"my_node.progress","data":{"x":1}}"#;
        assert!(matches!(parse_text(custom), Ok(Event::Other(_))));
        assert!(parse_text("not json").is_err());
    }

    #[test]
    fn binary_frames_split_their_event_type() {
        let Some(Event::Binary { event_type, payload }) =
            parse_binary(vec![0, 0, 0, 1, 9, 9].into())
        else {
            panic!("a binary event");
        };
        assert_eq!((event_type, payload.as_ref()), (1, &[9u8, 9][..]));
        assert!(parse_binary(vec![0, 1].into()).is_none());
    }

    #[test]
    fn client_ids_are_query_encoded() {
        assert_eq!(encode_query("a b&c"), "a%20b%26c");
    }
}
