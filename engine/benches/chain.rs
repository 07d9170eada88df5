//! A 1000-node chain of `PrimitiveInt` → `ChainStep` ×1000 → `PreviewAny`, executed cold (no cache) and then
//! fully cached, to measure what the executor itself costs per node.

use std::sync::Arc;

use criterion::{Criterion, criterion_group};
use kiln_engine::cache::{Cache, CachePolicy};
use kiln_engine::exec::{Event, EventSink, Executor, Run};
use kiln_engine::graph::{Prompt, validate};
use kiln_engine::nodes::{
    Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef, builtin_registry,
};
use kiln_engine::roots::Roots;
use kiln_engine::value::Value;

const CHAIN: usize = 1000;

/// Adds one to an INT: as little work as a node can do, so the executor's overhead dominates.
struct ChainStep(Arc<NodeSpec>);

impl Node for ChainStep {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        Ok(NodeResult::values([Value::Int(inputs.int("value")? + 1)]))
    }
}

struct Discard;

impl EventSink for Discard {
    fn emit(&self, _: &str, _: Event) {}
}

fn chain_prompt() -> Prompt {
    let mut nodes = serde_json::Map::new();
    nodes.insert(
        "0".into(),
        serde_json::json!({"class_type": "PrimitiveInt", "inputs": {"value": 0}}),
    );
    for i in 1..=CHAIN {
        nodes.insert(i.to_string(), serde_json::json!({"class_type": "ChainStep", "inputs": {"value": [(i - 1).to_string(), 0]}}));
    }
    nodes.insert("out".into(), serde_json::json!({"class_type": "PreviewAny", "inputs": {"source": [CHAIN.to_string(), 0]}}));
    Prompt::from_json(&serde_json::Value::Object(nodes)).expect("an object")
}

fn bench_chain(c: &mut Criterion) {
    let dir = std::env::temp_dir().join("kiln-bench-chain");
    let roots = Roots { input: dir.clone(), output: dir.join("output"), temp: dir.join("temp") };
    let mut registry =
        builtin_registry(&roots, kiln_engine::models::ModelEnv::cpu(dir.join("models")));
    registry.register(ChainStep(Arc::new(
        NodeSpec::new("ChainStep", "Chain Step", "testing")
            .input(InputDef::typed("value", "INT"))
            .output(OutputDef::new("INT")),
    )));
    let registry = Arc::new(registry);
    let prompt = validate(&chain_prompt(), &registry, None).expect("the chain validates");
    let roots = Roots { input: dir.clone(), output: dir.clone(), temp: dir };
    let sink: Arc<dyn EventSink> = Arc::new(Discard);
    let run = Run {
        prompt_id: "bench",
        prompt: &prompt,
        prompt_json: Arc::new(prompt.prompt.to_json()),
        extra_pnginfo: Arc::new(serde_json::Value::Null),
        preview_method: kiln_engine::nodes::PreviewMethod::None,
        scope: None,
    };

    let mut group = c.benchmark_group("cpu_chain_1000");
    let mut cold = Executor::new(registry.clone(), Cache::new(CachePolicy::None), roots.clone());
    group.bench_function("cold", |b| b.iter(|| cold.run(&run, sink.clone())));
    let mut cached = Executor::new(registry.clone(), Cache::new(CachePolicy::Classic), roots);
    cached.run(&run, sink.clone());
    group.bench_function("cached", |b| b.iter(|| cached.run(&run, sink.clone())));
    group.bench_function("validate", |b| b.iter(|| validate(&chain_prompt(), &registry, None)));
    group.finish();
}

criterion_group!(benches, bench_chain);
