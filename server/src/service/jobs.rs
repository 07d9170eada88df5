//! `/api/jobs`: queued, running and finished prompts seen as jobs (comfy-api.md §6.3).
//!
//! A finished prompt is `completed` on success, `cancelled` when it was interrupted and `failed` otherwise;
//! times come from its status messages; `preview_output` is the first saved image, else any image, else text.

use kiln_spec::types;
use serde_json::{Map, Value};

use super::history::Record;

/// A prompt in the queue.
#[derive(Debug, Clone)]
pub(crate) struct Queued<'a> {
    pub(crate) prompt_id: &'a str,
    pub(crate) number: f64,
    pub(crate) prompt: &'a Value,
    pub(crate) extra_data: &'a Map<String, Value>,
    pub(crate) running: bool,
}

/// Where a job comes from.
#[derive(Debug, Clone)]
pub(crate) enum Source<'a> {
    Queue(Queued<'a>),
    Done(&'a Record),
}

impl Source<'_> {
    fn prompt_id(&self) -> &str {
        match self {
            Source::Queue(q) => q.prompt_id,
            Source::Done(r) => &r.prompt_id,
        }
    }

    fn extra_data(&self) -> &Map<String, Value> {
        match self {
            Source::Queue(q) => q.extra_data,
            Source::Done(r) => &r.extra_data,
        }
    }

    fn status(&self) -> types::JobStatus {
        match self {
            Source::Queue(q) if q.running => types::JobStatus::InProgress,
            Source::Queue(_) => types::JobStatus::Pending,
            Source::Done(r) if r.success => types::JobStatus::Completed,
            Source::Done(r) if r.message("execution_interrupted").is_some() => {
                types::JobStatus::Cancelled
            }
            Source::Done(_) => types::JobStatus::Failed,
        }
    }

    fn create_time(&self) -> i64 {
        self.extra_data().get("create_time").and_then(Value::as_i64).unwrap_or(0)
    }

    fn times(&self) -> (Option<i64>, Option<i64>) {
        let Source::Done(record) = self else { return (None, None) };
        let at = |name: &str| {
            record.message(name).and_then(|d| d.get("timestamp")).and_then(Value::as_i64)
        };
        let end = at("execution_success")
            .or_else(|| at("execution_error"))
            .or_else(|| at("execution_interrupted"));
        (at("execution_start"), end)
    }

    fn workflow_id(&self) -> Option<String> {
        self.extra_data()
            .get("extra_pnginfo")?
            .get("workflow")?
            .get("id")?
            .as_str()
            .map(str::to_owned)
    }
}

const PREVIEWABLE: [&str; 4] = ["images", "video", "audio", "3d"];

fn counts(outputs: &kiln_spec::IndexMap<String, types::NodeOutput>) -> (i64, i64) {
    let mut all = 0;
    let mut previewable = 0;
    for output in outputs.values() {
        let value = serde_json::to_value(output).unwrap_or_default();
        for (key, items) in value.as_object().into_iter().flatten() {
            let n = items.as_array().map_or(0, Vec::len) as i64;
            if key != "animated" {
                all += n;
            }
            if PREVIEWABLE.contains(&key.as_str()) {
                previewable += n;
            }
        }
    }
    (all, previewable)
}

fn preview(
    outputs: &kiln_spec::IndexMap<String, types::NodeOutput>,
) -> Option<types::PreviewOutput> {
    let image = |saved: bool| {
        outputs.iter().find_map(|(node, output)| {
            output.images.iter().find(|i| !saved || i.type_ == types::FileType::Output).map(|i| {
                types::PreviewOutput {
                    filename: Some(i.filename.clone()),
                    media_type: "images".to_owned(),
                    node_id: node.clone(),
                    subfolder: Some(i.subfolder.clone()),
                    text: None,
                    truncated: None,
                    type_: Some(i.type_),
                }
            })
        })
    };
    image(true).or_else(|| image(false)).or_else(|| {
        outputs.iter().find_map(|(node, output)| {
            output.text.first().map(|text| {
                let truncated = text.chars().count() > 1024;
                types::PreviewOutput {
                    filename: None,
                    media_type: "text".to_owned(),
                    node_id: node.clone(),
                    subfolder: None,
                    text: Some(text.chars().take(1024).collect()),
                    truncated: Some(truncated),
                    type_: None,
                }
            })
        })
    })
}

fn error(record: &Record) -> Option<types::WsExecutionError> {
    serde_json::from_value(record.message("execution_error")?.clone()).ok()
}

/// The job view of a prompt.
pub(crate) fn job(source: &Source<'_>) -> Option<types::Job> {
    let (start, end) = source.times();
    let (outputs_count, previewable, preview_output, execution_error) = match source {
        Source::Done(r) => {
            let (all, previewable) = counts(&r.outputs);
            (Some(all), Some(previewable), preview(&r.outputs), error(r))
        }
        Source::Queue(_) => (None, None, None, None),
    };
    let number = match source {
        Source::Queue(q) => q.number,
        Source::Done(r) => r.number,
    };
    Some(types::Job {
        create_time: source.create_time(),
        execution_end_time: end,
        execution_error,
        execution_start_time: start,
        id: source.prompt_id().parse().ok()?,
        outputs_count,
        preview_output,
        previewable_outputs_count: previewable,
        priority: number,
        status: source.status(),
        workflow_id: source.workflow_id(),
    })
}

/// The detail view of a job: the job plus outputs, raw status and workflow.
pub(crate) fn detail(source: &Source<'_>) -> Option<types::JobDetail> {
    let job = job(source)?;
    let (outputs, execution_status, prompt) = match source {
        Source::Done(r) => (r.entry().outputs, Some(r.entry().status), r.prompt.clone()),
        Source::Queue(q) => (Default::default(), None, q.prompt.clone()),
    };
    let mut extra_data = source.extra_data().clone();
    extra_data.remove("api_key_comfy_org");
    extra_data.remove("auth_token_comfy_org");
    Some(types::JobDetail {
        create_time: job.create_time,
        execution_end_time: job.execution_end_time,
        execution_error: job.execution_error,
        execution_start_time: job.execution_start_time,
        execution_status,
        id: job.id,
        outputs,
        outputs_count: job.outputs_count,
        preview_output: job.preview_output,
        previewable_outputs_count: job.previewable_outputs_count,
        priority: job.priority,
        status: job.status,
        workflow: serde_json::from_value(Value::Object(extra_data))
            .ok()
            .zip(serde_json::from_value(prompt).ok())
            .map(|(extra_data, prompt)| types::JobWorkflow { extra_data, prompt }),
        workflow_id: job.workflow_id,
    })
}

/// What `GET /api/jobs` asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) statuses: Option<Vec<String>>,
    pub(crate) workflow_id: Option<String>,
    pub(crate) by_duration: bool,
    pub(crate) ascending: bool,
    pub(crate) limit: Option<i64>,
    pub(crate) offset: i64,
}

/// A page of jobs.
pub(crate) fn list(sources: &[Source<'_>], filter: &Filter) -> types::JobsListResponse {
    let mut jobs: Vec<types::Job> = sources
        .iter()
        .filter_map(job)
        .filter(|j| {
            filter.statuses.as_ref().is_none_or(|s| s.iter().any(|s| *s == j.status.to_string()))
        })
        .filter(|j| filter.workflow_id.as_ref().is_none_or(|w| j.workflow_id.as_ref() == Some(w)))
        .collect();
    let key = |j: &types::Job| {
        if filter.by_duration {
            j.execution_end_time.zip(j.execution_start_time).map_or(0, |(e, s)| e - s)
        } else {
            j.create_time
        }
    };
    jobs.sort_by(|a, b| {
        let order = key(a).cmp(&key(b)).then(a.priority.total_cmp(&b.priority));
        if filter.ascending { order } else { order.reverse() }
    });
    let total = jobs.len() as i64;
    let offset = filter.offset.max(0);
    let page: Vec<types::Job> = jobs
        .into_iter()
        .skip(offset as usize)
        .take(filter.limit.map_or(usize::MAX, |l| l.max(0) as usize))
        .collect();
    let has_more = offset + (page.len() as i64) < total;
    types::JobsListResponse {
        jobs: page,
        pagination: types::Pagination { has_more, limit: filter.limit, offset, total },
    }
}
