use std::time::Duration;

use super::{Finished, Metrics, Snapshot, Submitted, WorkerState};

fn snapshot() -> Snapshot {
    Snapshot {
        pending: 3,
        running: 1,
        worker: WorkerState::Running,
        websockets: 2,
        device_used: 10,
        device_budget: 20,
        device_capacity: 30,
        device_weights: 5,
        host_weights: 7,
        pinned_weights: 6,
        pageable_copies: 0,
        models: 1,
        model_loads: 4,
        host_total: 1 << 40,
        host_available: 1 << 39,
    }
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn counts_what_happened_and_what_is_held_in_openmetrics_text() {
    let metrics = Metrics::default();
    metrics.submitted(Submitted::Accepted, Duration::from_millis(2));
    metrics.submitted(Submitted::Accepted, Duration::from_millis(3));
    metrics.submitted(Submitted::Rejected, Duration::from_millis(1));
    metrics.finished(Finished::Success, Duration::from_secs(2), 3, 1);
    metrics.finished(Finished::HandedBack, Duration::from_secs(1), 1, 0);
    let text = metrics.encode(&snapshot());
    let lines = lines(&text);
    for expected in [
        "# TYPE kiln_prompts_submitted counter",
        r#"kiln_prompts_submitted_total{result="accepted"} 2"#,
        r#"kiln_prompts_submitted_total{result="rejected"} 1"#,
        "# TYPE kiln_prompt_accept_seconds histogram",
        "# UNIT kiln_prompt_accept_seconds seconds",
        "kiln_prompt_accept_seconds_count 2",
        r#"kiln_prompts_finished_total{outcome="success"} 1"#,
        r#"kiln_prompts_finished_total{outcome="handed_back"} 1"#,
        "kiln_prompt_run_seconds_count 2",
        "kiln_prompt_run_seconds_sum 3.0",
        r#"kiln_nodes_total{result="executed"} 4"#,
        r#"kiln_nodes_total{result="cached"} 1"#,
        r#"kiln_queue_prompts{state="pending"} 3"#,
        r#"kiln_queue_prompts{state="running"} 1"#,
        r#"kiln_worker_state{state="idle"} 0"#,
        r#"kiln_worker_state{state="running"} 1"#,
        r#"kiln_worker_state{state="draining"} 0"#,
        "kiln_websockets 2",
        r#"kiln_device_memory_bytes{kind="budget"} 20"#,
        r#"kiln_host_memory_bytes{kind="pinned"} 6"#,
        "kiln_host_memory_bytes{kind=\"total\"} 1099511627776",
        "kiln_models 1",
        "kiln_model_loads_total 4",
    ] {
        assert!(lines.contains(&expected), "`{expected}` is missing from:\n{text}");
    }
    assert_eq!(lines.last(), Some(&"# EOF"), "OpenMetrics text ends with `# EOF`");
}

#[test]
fn a_rejected_prompt_is_counted_without_an_accept_latency() {
    let metrics = Metrics::default();
    metrics.submitted(Submitted::Failed, Duration::from_secs(9));
    let text = metrics.encode(&snapshot());
    assert!(lines(&text).contains(&r#"kiln_prompts_submitted_total{result="failed"} 1"#), "{text}");
    assert!(lines(&text).contains(&"kiln_prompt_accept_seconds_count 0"), "{text}");
}
