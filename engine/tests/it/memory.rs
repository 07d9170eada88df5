//! The executor with the compute layer's memory manager: the per-node reset after every node, and in
//! RAM-pressure mode the manager's RAM arbitration (memory-manager.md §4.4, §7.6, §9.3) instead of the cache's
//! own trim.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_engine::cache::{Cache, CachePolicy, CacheThresholds, RamPressure, RamProbe};
use kiln_engine::exec::{Event, EventSink, Executor, Outcome, Run, RunSummary};
use kiln_engine::graph::{NodeId, Prompt, validate};
use kiln_engine::kiln_compute::memory::{ManagerConfig, MemoryManager, SimDevice};
use kiln_engine::nodes::{
    Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef, Registry,
};
use kiln_engine::roots::Roots;
use kiln_engine::tensor::Tensor;
use kiln_engine::value::Value;
use serde_json::json;

use crate::harness::temp_dir;

const MIB: i64 = 1 << 20;

/// Reads no RAM available for as many readings as `low` says (counting down), then plenty.
struct Squeezable {
    low: Arc<AtomicUsize>,
}

impl RamProbe for Squeezable {
    fn available(&self) -> u64 {
        let low = self.low.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if low.is_ok() { 0 } else { u64::MAX }
    }
}

/// `Blob`: an output node whose IMAGE holds `bytes` bytes; `tag` tells blobs of one size apart.
struct Blob(Arc<NodeSpec>);

impl Node for Blob {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let floats = usize::try_from(inputs.int("bytes")? / 4).unwrap_or(0);
        Ok(NodeResult::values([Value::Image(Tensor::full(vec![floats], 0.0))]))
    }
}

/// `Squeeze`: an output node that, once its `value` is computed, makes the next `low` RAM readings report
/// nothing available (as if it had just used the machine's RAM).
struct Squeeze(Arc<NodeSpec>, Arc<AtomicUsize>);

impl Node for Squeeze {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        self.1.store(usize::try_from(inputs.int("low")?).unwrap_or(0), Ordering::SeqCst);
        Ok(NodeResult::values(Vec::new()))
    }
}

struct Ignore;

impl EventSink for Ignore {
    fn emit(&self, _: &str, _: Event) {}
}

struct Setup {
    executor: Executor,
    registry: Arc<Registry>,
    device: Arc<SimDevice>,
}

/// An executor with a RAM-pressure cache read through a [`Squeezable`] probe, and, when `with_manager`, a
/// memory manager on a simulated device. The active threshold is 0, so the manager's own RAM reading never
/// shows a shortfall and only the cache's probe decides.
fn setup(with_manager: bool) -> Setup {
    let low = Arc::new(AtomicUsize::new(0));
    let mut registry = Registry::new();
    registry.register(Blob(Arc::new(
        NodeSpec::new("Blob", "Blob", "testing")
            .input(InputDef::int("bytes", 4, 0, 1 << 30))
            .input(InputDef::int("tag", 0, 0, 1000))
            .output(OutputDef::new("IMAGE"))
            .output_node(),
    )));
    registry.register(Squeeze(
        Arc::new(
            NodeSpec::new("Squeeze", "Squeeze", "testing")
                .input(InputDef::typed("value", "IMAGE"))
                .input(InputDef::int("low", 0, 0, 1000))
                .output_node(),
        ),
        low.clone(),
    ));
    let registry = Arc::new(registry);
    let pressure = RamPressure {
        thresholds: CacheThresholds { active: 0, inactive: 1 << 30 },
        probe: Arc::new(Squeezable { low }),
    };
    let roots =
        Roots { input: temp_dir("input"), output: temp_dir("output"), temp: temp_dir("temp") };
    let mut executor =
        Executor::new(registry.clone(), Cache::new(CachePolicy::RamPressure(pressure)), roots);
    let device = Arc::new(SimDevice::new(1 << 30));
    if with_manager {
        let manager = MemoryManager::new(device.clone(), ManagerConfig::for_this_machine(false))
            .expect("a manager on the simulated device");
        executor = executor.with_memory(manager);
    }
    Setup { executor, registry, device }
}

impl Setup {
    fn run(&mut self, prompt: serde_json::Value) -> RunSummary {
        let prompt = Prompt::from_json(&prompt).expect("an object");
        let validated = validate(&prompt, &self.registry, None).expect("a valid prompt");
        let run = Run {
            prompt_id: "p",
            prompt: &validated,
            prompt_json: Arc::new(validated.prompt.to_json()),
            extra_pnginfo: Arc::new(serde_json::Value::Null),
            preview_method: kiln_engine::nodes::PreviewMethod::None,
            scope: None,
        };
        let summary = self.executor.run(&run, Arc::new(Ignore));
        assert_eq!(summary.outcome, Outcome::Success);
        summary
    }
}

fn blob(bytes: i64, tag: i64) -> serde_json::Value {
    json!({"class_type": "Blob", "inputs": {"bytes": bytes, "tag": tag}})
}

/// Three prompts: A (4 MiB) and B (1 MiB); then C and D (5 MiB each); then E (64 MiB), after which `Squeeze`
/// makes the next `low` RAM readings report none available. Returns which of A–D a fourth prompt finds cached.
fn squeeze_after_three_prompts(setup: &mut Setup, low: usize) -> Vec<String> {
    setup.run(json!({"a": blob(4 * MIB, 1), "b": blob(MIB, 2)}));
    setup.run(json!({"c": blob(5 * MIB, 3), "d": blob(5 * MIB, 4)}));
    setup.run(json!({
        "e": blob(64 * MIB, 5),
        "s": {"class_type": "Squeeze", "inputs": {"value": ["e", 0], "low": low}},
    }));
    let all = json!({
        "a": blob(4 * MIB, 1), "b": blob(MIB, 2), "c": blob(5 * MIB, 3), "d": blob(5 * MIB, 4),
    });
    let summary = setup.run(all);
    summary.cached.iter().map(|id| id.0.clone()).collect()
}

#[test]
fn the_manager_arbitrates_after_each_node_evicting_older_outputs_by_score() {
    let mut setup = setup(true);
    // Two low readings after Squeeze ran: the arbitration reads once, evicts, reads again, evicts, then RAM
    // is back. Scores in prompt 3's generation: A 1.3² × 4 MiB ≈ 6.8 MiB, C = D = 1.3 × 5 MiB = 6.5 MiB,
    // B 1.3² × 1 MiB: so the older, smaller A goes first, then C (touched before D).
    let cached = squeeze_after_three_prompts(&mut setup, 2);
    assert_eq!(cached, vec!["b", "d"]);
}

#[test]
fn with_persistent_pressure_the_running_prompts_outputs_stay() {
    let mut setup = setup(true);
    setup.run(json!({"a": blob(4 * MIB, 1)}));
    let summary = setup.run(json!({
        "e": blob(64 * MIB, 5),
        "s": {"class_type": "Squeeze", "inputs": {"value": ["e", 0], "low": 1000}},
    }));
    assert_eq!(summary.executed, vec![NodeId::from("e"), NodeId::from("s")]);
    // Every older output went; the running prompt's own were kept (no shortfall against the manager's
    // active threshold of 0, so current outputs are never released).
    let ran = setup.run(json!({"a": blob(4 * MIB, 1), "e": blob(64 * MIB, 5)}));
    assert_eq!(ran.cached, vec![NodeId::from("e")]);
}

#[test]
fn without_a_manager_the_caches_own_trim_runs_instead() {
    // The cache's own post-node trim restores only the active threshold (0 here), so the same pressure
    // evicts nothing: the eviction above is the manager's arbitration.
    let mut setup = setup(false);
    let cached = squeeze_after_three_prompts(&mut setup, 2);
    assert_eq!(cached, vec!["a", "b", "c", "d"]);
}

#[test]
fn the_manager_resets_after_every_node_that_runs() {
    let mut setup = setup(true);
    let syncs = setup.device.counters().syncs;
    let summary = setup.run(json!({"a": blob(4, 1), "b": blob(8, 2)}));
    assert_eq!(summary.executed.len(), 2);
    // The reset synchronises the device once per node (nothing else here touches it).
    assert_eq!(setup.device.counters().syncs - syncs, 2);
    // Nodes served from the cache did not run, so no reset.
    let summary = setup.run(json!({"a": blob(4, 1), "b": blob(8, 2)}));
    assert!(summary.executed.is_empty());
    assert_eq!(setup.device.counters().syncs - syncs, 2);
}
