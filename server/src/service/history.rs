//! Finished prompts, oldest first, as `/history` and `/api/jobs` show them.
//!
//! Pagination follows ComfyUI's `get_history`: without `offset`, `max_items` returns the newest entries;
//! `offset` counts from the oldest. At most [`CAPACITY`] entries are kept; the oldest go first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kiln_spec::{IndexMap, types};
use serde_json::{Map, Value};

/// How many finished prompts are kept.
pub(crate) const CAPACITY: usize = 10_000;

/// One finished prompt.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The workspace the prompt ran in.
    pub(crate) workspace: Arc<str>,
    pub(crate) prompt_id: String,
    pub(crate) number: f64,
    /// The prompt as queued (API format JSON).
    pub(crate) prompt: Value,
    pub(crate) extra_data: Map<String, Value>,
    pub(crate) outputs_to_execute: Vec<String>,
    /// UI outputs by node id, in the order the nodes produced them.
    pub(crate) outputs: IndexMap<String, types::NodeOutput>,
    pub(crate) success: bool,
    /// The `execution_*` status messages as `[name, data]`.
    pub(crate) messages: Vec<(String, Value)>,
}

impl Record {
    /// The `/history` entry.
    pub(crate) fn entry(&self) -> types::HistoryEntry {
        let prompt = queue_item(
            self.number,
            &self.prompt_id,
            &self.prompt,
            &self.extra_data,
            &self.outputs_to_execute,
        );
        let meta = self
            .outputs
            .keys()
            .map(|id| {
                let meta = types::HistoryNodeMeta {
                    display_node: id.clone(),
                    node_id: id.clone(),
                    parent_node: None,
                    real_node_id: id.clone(),
                };
                (id.clone(), meta)
            })
            .collect();
        types::HistoryEntry {
            meta,
            outputs: self.outputs.clone(),
            prompt,
            status: types::HistoryStatus {
                completed: self.success,
                messages: self
                    .messages
                    .iter()
                    .map(|(name, data)| {
                        types::StatusMessage([
                            types::StatusMessageElement(Value::String(name.clone())),
                            types::StatusMessageElement(data.clone()),
                        ])
                    })
                    .collect(),
                status_str: if self.success {
                    types::HistoryStatusStr::Success
                } else {
                    types::HistoryStatusStr::Error
                },
            },
        }
    }

    /// A record back from its `/history` entry (as stored in the database).
    pub(crate) fn from_entry(
        workspace: &str,
        id: &str,
        entry: &types::HistoryEntry,
    ) -> Option<Record> {
        let [number, _, prompt, extra_data, outputs] = &entry.prompt.0;
        Some(Record {
            workspace: workspace.into(),
            prompt_id: id.to_owned(),
            number: number.0.as_f64()?,
            prompt: prompt.0.clone(),
            extra_data: extra_data.0.as_object().cloned().unwrap_or_default(),
            outputs_to_execute: serde_json::from_value(outputs.0.clone()).unwrap_or_default(),
            outputs: entry.outputs.clone(),
            success: entry.status.status_str == types::HistoryStatusStr::Success,
            messages: entry
                .status
                .messages
                .iter()
                .filter_map(|m| Some((m.0[0].0.as_str()?.to_owned(), m.0[1].0.clone())))
                .collect(),
        })
    }

    /// The record of a prompt that was running when its process stopped (or its worker died): interrupted,
    /// with ComfyUI's `execution_interrupted` message naming no node.
    pub(crate) fn interrupted(
        workspace: &str,
        prompt_id: &str,
        number: f64,
        prompt: Value,
        extra_data: Map<String, Value>,
        outputs_to_execute: Vec<String>,
    ) -> Record {
        let data = serde_json::json!({
            "prompt_id": prompt_id, "node_id": "", "node_type": "", "executed": [],
            "timestamp": super::worker::now_ms(),
        });
        Record {
            workspace: workspace.into(),
            prompt_id: prompt_id.to_owned(),
            number,
            prompt,
            extra_data,
            outputs_to_execute,
            outputs: IndexMap::default(),
            success: false,
            messages: vec![("execution_interrupted".to_owned(), data)],
        }
    }

    /// The data of a status message, if the record has it.
    pub(crate) fn message(&self, name: &str) -> Option<&Value> {
        self.messages.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }
}

/// `[number, prompt_id, prompt, extra_data, outputs_to_execute]`.
pub(crate) fn queue_item(
    number: f64,
    id: &str,
    prompt: &Value,
    extra: &Map<String, Value>,
    outputs: &[String],
) -> types::QueueItem {
    let number = if number.fract() == 0.0 && number.abs() < 9e15 {
        Value::from(number as i64)
    } else {
        Value::from(number)
    };
    types::QueueItem(
        [
            number,
            Value::from(id),
            prompt.clone(),
            Value::Object(extra.clone()),
            Value::from(outputs.to_vec()),
        ]
        .map(types::QueueItemElement),
    )
}

/// The history, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    order: VecDeque<String>,
    records: HashMap<String, Record>,
}

impl History {
    /// Adds a finished prompt, dropping the oldest beyond [`CAPACITY`].
    pub(crate) fn insert(&mut self, record: Record) {
        if self.records.insert(record.prompt_id.clone(), record.clone()).is_none() {
            self.order.push_back(record.prompt_id);
        }
        while self.order.len() > CAPACITY {
            if let Some(oldest) = self.order.pop_front() {
                self.records.remove(&oldest);
            }
        }
    }

    /// One entry.
    pub(crate) fn get(&self, id: &str) -> Option<&Record> {
        self.records.get(id)
    }

    /// Every entry, oldest first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Record> {
        self.order.iter().filter_map(|id| self.records.get(id))
    }

    /// ComfyUI's pagination: `offset` from the oldest; without it, `max_items` gives the newest.
    pub(crate) fn page(&self, max_items: Option<i64>, offset: Option<i64>) -> Vec<&Record> {
        let len = self.order.len() as i64;
        let mut offset = offset.unwrap_or(-1);
        if offset < 0
            && let Some(max) = max_items
        {
            offset = len.saturating_sub(max);
        }
        let take = max_items.map_or(usize::MAX, |m| m.max(0) as usize);
        self.all().skip(offset.max(0) as usize).take(take).collect()
    }

    /// Removes entries (unknown ids are ignored).
    pub(crate) fn delete(&mut self, ids: &[String]) {
        for id in ids {
            if self.records.remove(id).is_some() {
                self.order.retain(|o| o != id);
            }
        }
    }

    /// Removes every entry.
    pub(crate) fn clear(&mut self) {
        self.order.clear();
        self.records.clear();
    }
}

/// Every workspace's history.
#[derive(Debug, Default)]
pub(crate) struct Histories(HashMap<Arc<str>, History>);

impl Histories {
    /// Stores a finished prompt in its workspace's history.
    pub(crate) fn insert(&mut self, record: Record) {
        self.0.entry(record.workspace.clone()).or_default().insert(record);
    }

    /// One workspace's history (empty if it has none).
    pub(crate) fn of(&self, workspace: &str) -> &History {
        static EMPTY: std::sync::LazyLock<History> = std::sync::LazyLock::new(History::default);
        self.0.get(workspace).unwrap_or(&EMPTY)
    }

    /// One workspace's history, to change it.
    pub(crate) fn of_mut(&mut self, workspace: &str) -> &mut History {
        self.0.entry(workspace.into()).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::{Histories, History, Record};

    fn record(id: &str) -> Record {
        Record {
            workspace: "default".into(),
            prompt_id: id.to_owned(),
            number: 1.0,
            prompt: serde_json::json!({}),
            extra_data: serde_json::Map::new(),
            outputs_to_execute: vec![],
            outputs: Default::default(),
            success: true,
            messages: vec![],
        }
    }

    fn ids(records: Vec<&Record>) -> Vec<&str> {
        records.into_iter().map(|r| r.prompt_id.as_str()).collect()
    }

    #[test]
    fn pagination_follows_comfyui() {
        let mut history = History::default();
        for id in ["a", "b", "c", "d"] {
            history.insert(record(id));
        }
        assert_eq!(ids(history.page(None, None)), ["a", "b", "c", "d"]);
        assert_eq!(ids(history.page(Some(2), None)), ["c", "d"], "max_items alone: the newest");
        assert_eq!(
            ids(history.page(Some(2), Some(0))),
            ["a", "b"],
            "offset counts from the oldest"
        );
        assert_eq!(ids(history.page(None, Some(3))), ["d"]);
        assert!(history.page(None, Some(9)).is_empty());
        history.delete(&["b".to_owned(), "zzz".to_owned()]);
        assert_eq!(ids(history.page(None, None)), ["a", "c", "d"]);
        history.clear();
        assert!(history.page(None, None).is_empty());
    }

    #[test]
    fn each_workspace_sees_only_its_own_history() {
        let mut histories = Histories::default();
        histories.insert(record("a"));
        histories.insert(Record { workspace: "other".into(), ..record("b") });
        assert_eq!(ids(histories.of("default").page(None, None)), ["a"]);
        assert_eq!(ids(histories.of("other").page(None, None)), ["b"]);
        assert!(histories.of("default").get("b").is_none());
        assert!(histories.of("nobody").page(None, None).is_empty());
        histories.of_mut("other").clear();
        assert_eq!(ids(histories.of("default").page(None, None)), ["a"]);
    }
}
