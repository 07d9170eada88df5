//! Execution semantics, after upstream's `test_execution.py` (memory-manager.md §9.5), under every cache mode.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::cache::{CachePolicy, RamPressure, RamProbe};
use kiln_engine::exec::{Event, Outcome};
use kiln_engine::graph::{NodeId, Prompt, validate};
use kiln_engine::nodes::ErrorKind;
use serde_json::json;

use crate::harness::{Harness, ids};

struct Plenty;

impl RamProbe for Plenty {
    fn available(&self) -> u64 {
        u64::MAX
    }
}

/// The cached modes: classic, LRU(100) and RAM pressure (the default).
fn cached_modes() -> Vec<CachePolicy> {
    vec![
        CachePolicy::Classic,
        CachePolicy::Lru(100),
        CachePolicy::RamPressure(RamPressure::defaults(16 << 30, Arc::new(Plenty))),
    ]
}

fn const_graph(a: f64, b: f64) -> serde_json::Value {
    json!({
        "1": {"class_type": "TestConst", "inputs": {"value": a}},
        "2": {"class_type": "TestConst", "inputs": {"value": b}},
        "3": {"class_type": "TestMix", "inputs": {"a": ["1", 0], "b": ["2", 0], "t": 0.5}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["3", 0]}},
    })
}

#[test]
fn lazy_inputs_the_node_does_not_need_never_run() {
    let mut h = Harness::new(CachePolicy::Classic);
    let mut graph = const_graph(1.0, 2.0);
    graph["3"]["inputs"]["t"] = json!(0.0);
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success);
    assert_eq!(ran.executed(), ids(&["1", "3", "4"]), "node 2 feeds only the unused lazy input b");
    assert_eq!(ran.text("4"), ["1.0"]);
}

#[test]
fn the_lazy_switch_runs_only_the_branch_taken() {
    let mut h = Harness::new(CachePolicy::Classic);
    let graph = json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestConst", "inputs": {"value": 2.0}},
        "3": {"class_type": "ComfySwitchNode", "inputs": {"switch": true, "on_false": ["1", 0], "on_true": ["2", 0]}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["3", 0]}},
    });
    let ran = h.run(graph);
    assert_eq!(ran.executed(), ids(&["2", "3", "4"]));
    assert_eq!(ran.text("4"), ["2.0"]);
}

#[test]
fn an_identical_second_run_executes_nothing_in_cached_modes_and_everything_in_none() {
    for policy in cached_modes() {
        let mut h = Harness::new(policy.clone());
        h.run(const_graph(1.0, 2.0));
        let again = h.run(const_graph(1.0, 2.0));
        assert!(again.executed().is_empty(), "{policy:?}: {:?}", again.executed());
        assert_eq!(
            again.text("4"),
            ["1.5"],
            "{policy:?}: cached output nodes still show their output"
        );
        assert!(
            again.events.iter().any(|e| matches!(e, Event::Executed { node, .. } if node.0 == "4")),
            "{policy:?}"
        );
        assert_eq!(again.summary.cached.len(), 4, "{policy:?}");
    }
    let mut h = Harness::new(CachePolicy::None);
    h.run(const_graph(1.0, 2.0));
    assert_eq!(h.run(const_graph(1.0, 2.0)).executed(), ids(&["1", "2", "3", "4"]));
}

#[test]
fn changing_one_input_reruns_only_its_dependants() {
    for policy in cached_modes() {
        let mut h = Harness::new(policy.clone());
        h.run(const_graph(1.0, 2.0));
        let ran = h.run(const_graph(1.0, 3.0));
        assert_eq!(ran.executed(), ids(&["2", "3", "4"]), "{policy:?}");
        assert_eq!(ran.text("4"), ["2.0"], "{policy:?}");
    }
}

#[test]
fn fingerprints_decide_reruns() {
    let graph = |fingerprint: &str| {
        json!({
            "1": {"class_type": "TestConst", "inputs": {"value": 0.25}},
            "2": {"class_type": "TestFingerprint", "inputs": {"value": ["1", 0], "fingerprint": fingerprint}},
            "3": {"class_type": "TestOutput", "inputs": {"value": ["2", 0]}},
        })
    };
    for policy in cached_modes() {
        let mut h = Harness::new(policy.clone());
        h.run(graph("false"));
        assert!(
            h.run(graph("false")).executed().is_empty(),
            "{policy:?}: false is cached on the 2nd run"
        );
        let changed = h.run(graph("v2"));
        assert_eq!(
            changed.executed(),
            ids(&["2", "3"]),
            "{policy:?}: a new fingerprint forces a re-run"
        );
        for _ in 0..2 {
            let ran = h.run(graph("nan"));
            assert_eq!(
                ran.executed(),
                ids(&["2", "3"]),
                "{policy:?}: NaN runs every time, with its dependants"
            );
            assert_eq!(ran.text("3"), ["0.25"], "{policy:?}: the output stays correct");
        }
    }
}

#[test]
fn identical_nodes_share_a_result_unless_not_idempotent() {
    // Upstream's NOT_IDEMPOTENT puts the node id in the cache key: identical nodes are not deduplicated.
    let mut h = Harness::new(CachePolicy::Classic);
    h.run(json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "3": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["2", 0]}},
    }));
    assert_eq!(h.const_runs.load(Ordering::SeqCst), 1, "two identical idempotent nodes run once");
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestVolatile", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestVolatile", "inputs": {"value": 1.0}},
        "3": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["2", 0]}},
    }));
    assert_eq!(
        h.const_runs.load(Ordering::SeqCst),
        2,
        "two identical not-idempotent nodes each run"
    );
    assert_eq!((ran.text("3"), ran.text("4")), (vec!["1.0".to_owned()], vec!["1.0".to_owned()]));
}

#[test]
fn lru_keeps_the_most_recent_prompts() {
    let mut h = Harness::new(CachePolicy::Lru(2));
    let graph = |v: f64| json!({"1": {"class_type": "TestConst", "inputs": {"value": v}}, "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}}});
    for v in [1.0, 2.0, 3.0] {
        h.run(graph(v));
    }
    assert!(h.run(graph(3.0)).executed().is_empty(), "the latest prompt is cached");
    assert_eq!(h.run(graph(1.0)).executed(), ids(&["1", "2"]), "the oldest fell out");
}

#[test]
fn two_outputs_sharing_an_input_each_get_it() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 7.0}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
    }));
    assert_eq!((ran.text("2"), ran.text("3")), (vec!["7.0".to_owned()], vec!["7.0".to_owned()]));
    assert_eq!(h.const_runs.load(Ordering::SeqCst), 1, "the shared input ran once");
}

#[test]
fn partial_execution_runs_only_the_targets() {
    let mut h = Harness::new(CachePolicy::Classic);
    let prompt = Prompt::from_json(&json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "TestConst", "inputs": {"value": 2.0}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["3", 0]}},
    }))
    .expect("object");
    let targets = [NodeId::from("4")];
    let validated = validate(&prompt, &h.registry, Some(&targets)).expect("valid");
    let ran = h.run_validated(&validated, json!(null));
    assert_eq!(ran.executed(), ids(&["3", "4"]));
    let rejection = validate(&prompt, &h.registry, Some(&[])).expect_err("an empty target list");
    assert_eq!(rejection.error.kind, "prompt_no_outputs");
}

#[test]
fn list_outputs_map_nodes_over_their_elements() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestRange", "inputs": {"count": 3}},
        "2": {"class_type": "TestFingerprint", "inputs": {"value": ["1", 0], "fingerprint": "false"}},
        "3": {"class_type": "TestOutput", "inputs": {"value": ["2", 0]}},
        "4": {"class_type": "TestSum", "inputs": {"value": ["1", 0]}},
        "5": {"class_type": "TestOutput", "inputs": {"value": ["4", 0]}},
    }));
    assert_eq!(
        ran.text("3"),
        ["0.0", "1.0", "2.0"],
        "node 2 ran once per element, its outputs collected into a list"
    );
    assert_eq!(ran.text("5"), ["3.0"], "an is_input_list node sees the whole list");
}

#[test]
fn events_come_in_comfyuis_order() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestSlow", "inputs": {"steps": 2, "fail": false}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
    }));
    let names: Vec<&str> = ran
        .events
        .iter()
        .map(|e| match e {
            Event::ExecutionStart => "start",
            Event::ExecutionCached { .. } => "cached",
            Event::Executing { .. } => "executing",
            Event::Progress { .. } => "progress",
            Event::Preview { .. } => "preview",
            Event::Executed { .. } => "executed",
            Event::NodeFinished { .. } => "finished",
            Event::ExecutionSuccess => "success",
            Event::ExecutionError(_) => "error",
            Event::ExecutionInterrupted { .. } => "interrupted",
        })
        .collect();
    assert_eq!(
        names,
        [
            "start",
            "cached",
            "executing",
            "progress",
            "progress",
            "finished",
            "executing",
            "executed",
            "finished",
            "success"
        ]
    );
}

#[test]
fn a_failing_node_reports_its_inputs_and_what_ran() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestSlow", "inputs": {"steps": 1, "fail": true}},
        "3": {"class_type": "TestMix", "inputs": {"a": ["1", 0], "b": ["2", 0], "t": 0.5}},
        "4": {"class_type": "TestOutput", "inputs": {"value": ["3", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure: {:?}", ran.summary.outcome)
    };
    assert_eq!(
        (failure.node.0.as_str(), failure.class_type.as_str(), failure.kind),
        ("2", "TestSlow", ErrorKind::InvalidValue)
    );
    assert_eq!(failure.message, "asked to fail");
    assert_eq!(failure.current_inputs["fail"], ["True"]);
    assert_eq!(failure.executed, [NodeId::from("1")]);
    assert!(matches!(ran.events.last(), Some(Event::ExecutionError(_))));
}

#[test]
fn a_panicking_node_fails_its_prompt_and_the_next_prompt_runs() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "TestPanic", "inputs": {}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure: {:?}", ran.summary.outcome)
    };
    assert_eq!((failure.node.0.as_str(), failure.class_type.as_str()), ("1", "TestPanic"));
    assert_eq!(failure.message, "TestPanic panicked: the decoder choked");
    assert!(matches!(ran.events.last(), Some(Event::ExecutionError(_))));
    // The same executor runs the next prompt.
    let ran = h.run(json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 2.0}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
}

/// ComfyUI reports as `current_outputs` the nodes its output cache tracks for the prompt (`all_node_ids()`):
/// every node, those that produced outputs before the failure as well as those that never ran; none when
/// caching is off. See tests/golden/comfyui/ws_execution_error.json (`["2", "1"]` for a failure at node 1).
#[test]
fn a_failure_reports_the_nodes_the_cache_tracks_as_current_outputs() {
    let prompt = json!({
        "1": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "TestSlow", "inputs": {"steps": 1, "fail": true}},
        "4": {"class_type": "TestMix", "inputs": {"a": ["1", 0], "b": ["3", 0], "t": 0.5}},
        "5": {"class_type": "TestOutput", "inputs": {"value": ["4", 0]}},
    });
    let failure = |ran: &crate::harness::Ran| match &ran.summary.outcome {
        Outcome::Failed(failure) => failure.clone(),
        other => panic!("expected a failure: {other:?}"),
    };
    fn sorted(nodes: &[NodeId]) -> Vec<&str> {
        let mut ids: Vec<&str> = nodes.iter().map(|n| n.0.as_str()).collect();
        ids.sort_unstable();
        ids
    }

    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(prompt.clone());
    let first = failure(&ran);
    assert_eq!(first.node, NodeId::from("3"));
    assert_eq!(ran.text("2"), ["1.0"], "node 2 showed its output before node 3 failed");
    assert_eq!(sorted(&first.executed), ["1", "2"]);
    assert_eq!(sorted(&first.current_outputs), ["1", "2", "3", "4", "5"]);

    // Rerun: 1 and 2 come from the cache, so nothing ran before the failure, and the cache still tracks all.
    let again = failure(&h.run(prompt.clone()));
    assert!(again.executed.is_empty(), "{:?}", again.executed);
    assert_eq!(sorted(&again.current_outputs), ["1", "2", "3", "4", "5"]);

    let mut uncached = Harness::new(CachePolicy::None);
    let none = failure(&uncached.run(prompt));
    assert_eq!(sorted(&none.executed), ["1", "2"]);
    assert!(none.current_outputs.is_empty(), "no cache tracks nothing: {:?}", none.current_outputs);
}

#[test]
fn interrupt_stops_a_long_node_and_the_next_prompt_runs() {
    struct InterruptOnProgress(Arc<std::sync::atomic::AtomicBool>, std::sync::Mutex<Vec<Event>>);
    impl kiln_engine::exec::EventSink for InterruptOnProgress {
        fn emit(&self, _: &str, event: Event) {
            if matches!(event, Event::Progress { .. }) {
                self.0.store(true, Ordering::SeqCst);
            }
            self.1.lock().expect("events").push(event);
        }
    }
    let mut h = Harness::new(CachePolicy::Classic);
    let prompt = h.validate(json!({
        "1": {"class_type": "TestSlow", "inputs": {"steps": 100000, "fail": false}},
        "2": {"class_type": "TestOutput", "inputs": {"value": ["1", 0]}},
    }));
    let sink = Arc::new(InterruptOnProgress(h.executor.interrupt_flag(), Default::default()));
    let run = kiln_engine::exec::Run {
        prompt_id: "p",
        prompt: &prompt,
        prompt_json: Arc::new(prompt.prompt.to_json()),
        extra_pnginfo: Arc::new(json!(null)),
        preview_method: kiln_engine::nodes::PreviewMethod::None,
        scope: None,
    };
    let summary = h.executor.run(&run, sink.clone());
    assert!(
        matches!(&summary.outcome, Outcome::Interrupted { node, .. } if node.0 == "1"),
        "{:?}",
        summary.outcome
    );
    assert!(matches!(
        sink.1.lock().expect("events").last(),
        Some(Event::ExecutionInterrupted { .. })
    ));
    // The flag is cleared for the next prompt.
    let ran = h.run(const_graph(1.0, 2.0));
    assert_eq!(ran.summary.outcome, Outcome::Success);
}

#[test]
fn scopes_share_no_results_but_those_of_shared_nodes() {
    use kiln_engine::exec::Scope;
    let mut h = Harness::new(CachePolicy::Lru(10));
    let scope = |partition: &str| Scope {
        registry: h.registry.clone(),
        roots: h.roots.clone(),
        shared: None,
        partition: partition.to_owned(),
    };
    let (a, b) = (scope("a"), scope("b"));
    let prompt = h.validate(const_graph(1.0, 2.0));
    let first = h.run_in(&prompt, json!(null), Some(&a));
    assert_eq!(first.executed(), ids(&["1", "2", "3", "4"]));
    // Another workspace computes everything itself: nothing tells it the first one ran this graph.
    let other = h.run_in(&prompt, json!(null), Some(&b));
    assert_eq!(other.executed(), ids(&["1", "2", "3", "4"]));
    // The first workspace is served from the cache again.
    assert!(h.run_in(&prompt, json!(null), Some(&a)).executed().is_empty());
}

#[test]
fn cache_keys_survive_renumbering_the_graph() {
    let mut h = Harness::new(CachePolicy::Lru(10));
    h.run(const_graph(1.0, 2.0));
    let renumbered = json!({
        "10": {"class_type": "TestConst", "inputs": {"value": 1.0}},
        "20": {"class_type": "TestConst", "inputs": {"value": 2.0}},
        "30": {"class_type": "TestMix", "inputs": {"a": ["10", 0], "b": ["20", 0], "t": 0.5}},
        "40": {"class_type": "TestOutput", "inputs": {"value": ["30", 0]}},
    });
    assert!(h.run(renumbered).executed().is_empty());
}

#[test]
fn the_history_recorder_keeps_the_status_messages_with_timestamps() {
    use kiln_engine::exec::{HistoryRecorder, Run};
    let mut h = Harness::new(CachePolicy::Classic);
    let prompt = h.validate(const_graph(1.0, 2.0));
    let forwarded = Arc::new(crate::harness::Recorder::default());
    let recorder = Arc::new(HistoryRecorder::new(forwarded.clone()));
    let run = Run {
        prompt_id: "p",
        prompt: &prompt,
        prompt_json: Arc::new(prompt.prompt.to_json()),
        extra_pnginfo: Arc::new(json!(null)),
        preview_method: kiln_engine::nodes::PreviewMethod::None,
        scope: None,
    };
    let summary = h.executor.run(&run, recorder.clone());
    assert_eq!(summary.outcome, Outcome::Success);
    let messages = recorder.take();
    let kinds: Vec<_> = messages.iter().map(|m| std::mem::discriminant(&m.event)).collect();
    assert_eq!(
        kinds,
        [
            std::mem::discriminant(&Event::ExecutionStart),
            std::mem::discriminant(&Event::ExecutionCached { nodes: vec![] }),
            std::mem::discriminant(&Event::ExecutionSuccess),
        ]
    );
    assert!(
        messages.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms)
            && messages[0].timestamp_ms > 1_700_000_000_000
    );
    assert!(
        forwarded.events.lock().expect("events").len() > messages.len(),
        "every event is forwarded"
    );
    assert!(recorder.take().is_empty(), "take leaves nothing behind");
}

#[test]
fn a_node_shared_by_two_inputs_of_one_node_is_not_a_cycle() {
    // ImageBlend's first input depends on its second: the shared node is queued below the node that needs it
    // first (the shape of ComfyUI's template, where ConditioningZeroOut takes the positive prompt).
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "ImageBlend", "inputs": {"image1": ["2", 0], "image2": ["1", 0], "blend_factor": 0.5, "blend_mode": "normal"}},
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(ran.executed(), ["1", "2", "3", "4"]);
}

#[test]
fn only_the_model_loaders_share_cache_keys_between_partitions() {
    use kiln_engine::cache::compute_keys;
    let dir = std::env::temp_dir().join(format!("kiln-partition-keys-{}", std::process::id()));
    let roots = kiln_engine::roots::Roots {
        input: dir.join("input"),
        output: dir.join("output"),
        temp: dir.join("temp"),
    };
    let registry = kiln_engine::nodes::builtin_registry(
        &roots,
        kiln_engine::models::ModelEnv::cpu(dir.join("models")),
    );
    let prompt = Prompt::from_json(&json!({
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }))
    .expect("an object");
    let (a, b) =
        (compute_keys(&prompt, &registry, Some("a")), compute_keys(&prompt, &registry, Some("b")));
    let node = |id: &str| NodeId::from(id);
    assert_eq!(a[&node("1")], b[&node("1")], "a loaded model is shared");
    assert_ne!(a[&node("2")], b[&node("2")], "a computed image is not");
    assert_ne!(a[&node("3")], b[&node("3")], "an output is not");
    assert_eq!(
        a,
        compute_keys(&prompt, &registry, Some("a")),
        "keys are stable within a partition"
    );
}
