//! The history entry and the job view against ComfyUI's captures.

use kiln_spec::types;
use serde_json::{Value, json};

use super::history::{History, Record};
use super::jobs::{Filter, Queued, Source, detail, job, list};

fn golden(case: &str) -> Value {
    kiln_tests::golden(case)
}

/// Placeholders → typed values (`<PROMPT_ID_n>` → a UUID, timestamps → a number).
fn fill(value: &Value) -> Value {
    match value {
        Value::String(s) if s.starts_with("<PROMPT_ID_") => {
            let n: u64 =
                s.trim_start_matches("<PROMPT_ID_").trim_end_matches('>').parse().expect("n");
            json!(format!("00000000-0000-4000-8000-{n:012}"))
        }
        Value::String(s) if s.ends_with("TIME>") || s == "<TIMESTAMP>" => {
            json!(1_764_460_800_000_i64)
        }
        Value::String(s) if s.starts_with("<TRACEBACK") => json!("frame"),
        Value::Array(items) => Value::Array(items.iter().map(fill).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (fill(&json!(k)).as_str().unwrap_or(k).to_owned(), fill(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A record from a recorded `/history` entry.
fn record(id: &str, entry: &Value) -> Record {
    let prompt = entry["prompt"].as_array().expect("a queue item");
    Record {
        workspace: "default".into(),
        prompt_id: id.to_owned(),
        number: prompt[0].as_f64().expect("number"),
        prompt: prompt[2].clone(),
        extra_data: prompt[3].as_object().cloned().unwrap_or_default(),
        outputs_to_execute: serde_json::from_value(prompt[4].clone()).expect("ids"),
        outputs: serde_json::from_value(entry["outputs"].clone()).expect("outputs"),
        success: entry["status"]["status_str"] == "success",
        messages: entry["status"]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| (m[0].as_str().expect("name").to_owned(), m[1].clone()))
            .collect(),
    }
}

#[test]
fn a_history_entry_has_comfyuis_shape() {
    let recorded = fill(&golden("ws_success")["history_after"]);
    let (id, entry) = recorded.as_object().and_then(|m| m.iter().next()).expect("one entry");
    let ours = serde_json::to_value(record(id, entry).entry()).expect("serializes");
    assert_eq!(&ours, entry);
}

#[test]
fn jobs_have_comfyuis_statuses_counts_and_previews() {
    let history = fill(&golden("get_history_max_items_2")["response"]["body"]["json"]);
    let records: Vec<Record> =
        history.as_object().expect("entries").iter().map(|(id, e)| record(id, e)).collect();
    let expected = fill(&golden("get_api_jobs_limit_5")["response"]["body"]["json"]["jobs"]);
    // The capture's first job is the failed LoadImage prompt, its second the completed ws_nocid prompt.
    let pairs = [(&records[1], &expected[0]), (&records[0], &expected[1])];
    for (record, expected) in pairs {
        let job =
            serde_json::to_value(job(&Source::Done(record)).expect("a job")).expect("serializes");
        let mut ours = crate::api::integral_floats_as_ints(job);
        let mut expected = expected.clone();
        for v in [&mut ours, &mut expected] {
            // Prompt ids are numbered per capture file, so they differ between the two captures.
            let object = v.as_object_mut().expect("object");
            object.remove("id");
            if let Some(error) = object.get_mut("execution_error").and_then(Value::as_object_mut) {
                error.remove("prompt_id");
            }
        }
        assert_eq!(ours, expected);
    }
    let detail = detail(&Source::Done(&records[0])).expect("detail");
    assert_eq!(
        detail.execution_status.expect("status").status_str,
        types::HistoryStatusStr::Success
    );
    assert!(detail.outputs.contains_key("3"));
}

#[test]
fn job_lists_filter_sort_and_page() {
    let history = fill(&golden("get_history_max_items_2")["response"]["body"]["json"]);
    let records: Vec<Record> =
        history.as_object().expect("entries").iter().map(|(id, e)| record(id, e)).collect();
    let extra =
        serde_json::Map::from_iter([("create_time".to_owned(), json!(1_764_460_900_000_i64))]);
    let prompt = json!({});
    let pending = Source::Queue(Queued {
        prompt_id: "00000000-0000-4000-8000-000000000009",
        number: 30.0,
        prompt: &prompt,
        extra_data: &extra,
        running: false,
    });
    let sources = vec![Source::Done(&records[0]), Source::Done(&records[1]), pending];
    let all = list(&sources, &Filter { limit: Some(2), ..Default::default() });
    assert_eq!((all.pagination.total, all.pagination.has_more, all.jobs.len()), (3, true, 2));
    assert_eq!(all.jobs[0].status, types::JobStatus::Pending, "newest first");
    let failed =
        list(&sources, &Filter { statuses: Some(vec!["failed".to_owned()]), ..Default::default() });
    assert_eq!(failed.jobs.len(), 1);
    let ascending = list(&sources, &Filter { ascending: true, offset: 2, ..Default::default() });
    assert_eq!((ascending.jobs.len(), ascending.jobs[0].status), (1, types::JobStatus::Pending));
}

#[test]
fn history_keeps_insertion_order() {
    let recorded = fill(&golden("get_history_max_items_2")["response"]["body"]["json"]);
    let mut history = History::default();
    for (id, entry) in recorded.as_object().expect("entries") {
        history.insert(record(id, entry));
    }
    assert_eq!(history.page(Some(1), None).len(), 1);
    assert_eq!(history.all().count(), 2);
}
