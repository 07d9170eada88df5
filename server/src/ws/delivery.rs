//! What a run tells the sockets, as data: a single server hands each [`Delivery`] to its hub at once; in a
//! cluster a worker writes them to the database's events table and every API node hands them to its own hub
//! (`cluster/events.rs`), so a client hears of its prompt on whichever API node its socket is connected to.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::hub::json;
use super::{Audience, executing};
use kiln_spec::types;

/// One thing a run tells the sockets (or, in a cluster, the other API nodes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Delivery {
    /// A message for its audience in a workspace, as the JSON text that goes on the wire.
    Message {
        /// The prompt's workspace.
        workspace: String,
        /// The prompt's owner.
        client_id: Option<String>,
        /// The message's JSON text.
        text: String,
        /// Who receives it.
        audience: Audience,
    },
    /// A preview's two binary frames ([`super::preview_frames`]).
    Preview {
        /// The prompt's workspace.
        workspace: String,
        /// The prompt's owner.
        client_id: Option<String>,
        /// The frame for sockets without `supports_preview_metadata`.
        #[serde(with = "base64_bytes")]
        plain: bytes::Bytes,
        /// The frame for sockets with it.
        #[serde(with = "base64_bytes")]
        with_metadata: bytes::Bytes,
    },
    /// A prompt runs (on `node`, once one started) or, with `running` false, stopped: a reconnecting owner
    /// is told where it is.
    Running {
        /// The prompt's workspace.
        workspace: String,
        /// The prompt.
        prompt_id: String,
        /// The prompt's owner.
        client_id: Option<String>,
        /// The node it runs.
        node: Option<String>,
        /// Whether it runs.
        running: bool,
    },
    /// A prompt's history entry was stored: an API node reads it before it delivers what follows, so the
    /// entry is there when its owner hears that the prompt ended.
    HistoryStored {
        /// The prompt's workspace.
        workspace: String,
        /// The prompt.
        prompt_id: String,
    },
    /// History entries were removed through one API node: the others forget them too.
    HistoryRemoved {
        /// The workspace.
        workspace: String,
        /// Every entry of the workspace.
        clear: bool,
        /// These entries.
        ids: Vec<String>,
    },
}

impl Delivery {
    /// A message for its audience; `None` if it does not serialize (logged).
    pub(crate) fn message(
        workspace: &str,
        client_id: Option<&str>,
        message: &types::WsMessage,
        audience: Audience,
    ) -> Option<Delivery> {
        Some(Delivery::Message {
            workspace: workspace.to_owned(),
            client_id: client_id.map(str::to_owned),
            text: json(message)?,
            audience,
        })
    }

    /// That a prompt runs (on `node`) or stopped.
    pub(crate) fn running(
        workspace: &str,
        prompt_id: &str,
        client_id: Option<&str>,
        node: Option<&str>,
        running: bool,
    ) -> Delivery {
        Delivery::Running {
            workspace: workspace.to_owned(),
            prompt_id: prompt_id.to_owned(),
            client_id: client_id.map(str::to_owned),
            node: node.map(str::to_owned),
            running,
        }
    }
}

impl Delivery {
    /// What follows a run's terminal event: the prompt no longer runs, then `executing` null to its owner
    /// (only sent when it has one: nobody else would receive it).
    pub(crate) fn ended(workspace: &str, id: &str, client_id: Option<&str>) -> Vec<Delivery> {
        let mut ended = vec![Delivery::running(workspace, id, None, None, false)];
        if client_id.is_some() {
            let done = executing(None, id.parse::<uuid::Uuid>().ok());
            ended.extend(Delivery::message(workspace, client_id, &done, Audience::Owner));
        }
        ended
    }
}

/// Binary frames as base64 text in the events table's JSON.
mod base64_bytes {
    use base64::Engine as _;

    use super::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &bytes::Bytes, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<bytes::Bytes, D::Error> {
        let text = String::deserialize(from)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(bytes::Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::Delivery;
    use crate::ws::Audience;

    #[test]
    fn deliveries_survive_the_events_table() {
        let deliveries = [
            Delivery::Message {
                workspace: "default".into(),
                client_id: Some("tab".into()),
                text: r#"{"type":"executing","data":{"node":"3"}}"#.into(),
                audience: Audience::OwnerOrAll,
            },
            Delivery::Preview {
                workspace: "w".into(),
                client_id: None,
                plain: bytes::Bytes::from_static(&[0, 0, 0, 1, 255, 216]),
                with_metadata: bytes::Bytes::from_static(&[0, 0, 0, 4]),
            },
            Delivery::running("w", "p", None, Some("7"), true),
            Delivery::HistoryRemoved { workspace: "w".into(), clear: true, ids: vec!["a".into()] },
        ];
        for delivery in deliveries {
            let text = serde_json::to_string(&delivery).expect("serializes");
            let back: Delivery = serde_json::from_str(&text).expect("deserializes");
            assert_eq!(back, delivery, "{text}");
        }
    }
}
