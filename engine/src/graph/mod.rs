//! The prompt model: an API-format workflow as the engine sees it.
//!
//! Node ids are strings (the frontend sends ids such as `"19:7"`); an input is a literal or a link
//! `[node_id, output_index]`. A two-element array of a string and a non-negative integer is always a link, as in
//! ComfyUI; any other array stays a literal and validation reports it as a bad link.

mod validate;

use std::collections::BTreeMap;

pub use crate::nodes::NodeId;
pub use validate::{NodeErrors, PromptRejection, ValidatedPrompt, ValidationError, validate};
pub(crate) use validate::{literal_value, py_str};

/// One input of a prompt node.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A literal value as sent.
    Literal(serde_json::Value),
    /// A link to an output of another node.
    Link {
        /// The source node.
        node: NodeId,
        /// The source output index.
        slot: usize,
    },
}

/// One node of a prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptNode {
    /// The node class (`None` when the prompt omits it).
    pub class_type: Option<String>,
    /// Inputs by name.
    pub inputs: BTreeMap<String, Input>,
    /// `_meta.title`, used in error messages.
    pub title: Option<String>,
}

/// An API-format workflow.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt {
    /// The nodes by id.
    pub nodes: BTreeMap<NodeId, PromptNode>,
}

/// A prompt that is not a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the prompt must be a JSON object of nodes keyed by id, got {found}")]
pub struct NotAnObject {
    /// What was found instead (`array`, `string`, ...).
    pub found: &'static str,
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl Prompt {
    /// Reads a prompt from its JSON form. Never panics: malformed nodes become nodes without a class (which
    /// validation reports as `missing_node_type`).
    pub fn from_json(value: &serde_json::Value) -> Result<Prompt, NotAnObject> {
        let serde_json::Value::Object(nodes) = value else {
            return Err(NotAnObject { found: kind_of(value) });
        };
        let nodes = nodes
            .iter()
            .map(|(id, node)| (NodeId(id.clone()), PromptNode::from_json(node)))
            .collect();
        Ok(Prompt { nodes })
    }

    /// The prompt back in its JSON form (for PNG metadata and history), links as `[id, slot]`.
    pub fn to_json(&self) -> serde_json::Value {
        let nodes = self
            .nodes
            .iter()
            .map(|(id, node)| {
                let inputs: serde_json::Map<String, serde_json::Value> = node
                    .inputs
                    .iter()
                    .map(|(name, input)| {
                        let value = match input {
                            Input::Literal(v) => v.clone(),
                            Input::Link { node, slot } => serde_json::json!([node.0, slot]),
                        };
                        (name.clone(), value)
                    })
                    .collect();
                let mut object = serde_json::Map::new();
                object.insert("inputs".to_owned(), inputs.into());
                if let Some(class_type) = &node.class_type {
                    object.insert("class_type".to_owned(), class_type.clone().into());
                }
                if let Some(title) = &node.title {
                    object.insert("_meta".to_owned(), serde_json::json!({"title": title}));
                }
                (id.0.clone(), serde_json::Value::Object(object))
            })
            .collect::<serde_json::Map<_, _>>();
        serde_json::Value::Object(nodes)
    }
}

impl PromptNode {
    fn from_json(value: &serde_json::Value) -> PromptNode {
        let class_type = value.get("class_type").and_then(|c| c.as_str()).map(str::to_owned);
        let title = value.pointer("/_meta/title").and_then(|t| t.as_str()).map(str::to_owned);
        let inputs = value
            .get("inputs")
            .and_then(|i| i.as_object())
            .map(|inputs| {
                inputs.iter().map(|(name, v)| (name.clone(), Input::from_json(v))).collect()
            })
            .unwrap_or_default();
        PromptNode { class_type, inputs, title }
    }
}

impl Input {
    fn from_json(value: &serde_json::Value) -> Input {
        if let serde_json::Value::Array(items) = value
            && let [serde_json::Value::String(node), serde_json::Value::Number(slot)] =
                items.as_slice()
            && let Some(slot) = slot.as_u64().and_then(|s| usize::try_from(s).ok())
        {
            return Input::Link { node: NodeId(node.clone()), slot };
        }
        Input::Literal(value.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::{Input, NodeId, Prompt};
    use serde_json::json;

    #[test]
    fn links_literals_and_titles_are_read() {
        let prompt = Prompt::from_json(&json!({
            "19:7": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0], "list": [1, 2]}, "_meta": {"title": "Inv"}}
        }))
        .expect("an object");
        let node = &prompt.nodes[&NodeId::from("19:7")];
        assert_eq!(node.class_type.as_deref(), Some("ImageInvert"));
        assert_eq!(node.title.as_deref(), Some("Inv"));
        assert_eq!(node.inputs["image"], Input::Link { node: NodeId::from("3"), slot: 0 });
        assert_eq!(node.inputs["list"], Input::Literal(json!([1, 2])));
    }

    #[test]
    fn malformed_prompts_never_panic() {
        assert!(Prompt::from_json(&json!([1, 2])).is_err());
        let prompt =
            Prompt::from_json(&json!({"1": "not a node", "2": {"inputs": 5}})).expect("an object");
        assert!(prompt.nodes.values().all(|n| n.class_type.is_none() && n.inputs.is_empty()));
    }

    #[test]
    fn json_round_trips() {
        let value = json!({"1": {"class_type": "A", "inputs": {"x": ["2", 1], "y": 3}, "_meta": {"title": "T"}}});
        assert_eq!(Prompt::from_json(&value).expect("object").to_json(), value);
    }
}
