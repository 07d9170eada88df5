//! Test nodes and a harness that runs prompts and records what ran, like upstream's execution test client.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln_engine::cache::{Cache, CachePolicy};
use kiln_engine::exec::{Event, EventSink, Executor, Run, RunSummary};
use kiln_engine::graph::{NodeId, Prompt, ValidatedPrompt, validate};
use kiln_engine::nodes::{
    Context, ErrorKind, Fingerprint, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec,
    Output, OutputDef, Registry, builtin_registry,
};
use kiln_engine::roots::Roots;
use kiln_engine::value::Value;
use serde_json::json;

/// A fresh directory under the system temp dir.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kiln-engine-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

// A harness removes its folders (the synthesized model files are tens of MB per test).
impl Drop for Harness {
    fn drop(&mut self) {
        for dir in [&self.roots.input, &self.roots.output, &self.roots.temp] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `TestConst`: outputs its FLOAT `value`; counts its runs.
struct TestConst(Arc<NodeSpec>, Arc<AtomicUsize>);

impl Node for TestConst {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        Ok(NodeResult::values([Value::Float(inputs.float("value")?)]))
    }
}

/// `TestFingerprint`: passes `value` through; its fingerprint is its `fingerprint` input ("nan" = always).
struct TestFingerprint(Arc<NodeSpec>);

impl Node for TestFingerprint {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        match inputs.string("fingerprint") {
            Ok("nan") => Fingerprint::Always,
            Ok("false") | Err(_) => Fingerprint::Unchanged,
            Ok(other) => Fingerprint::Value(other.to_owned()),
        }
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        Ok(NodeResult::values([inputs.get("value").cloned().unwrap_or(Value::Float(0.0))]))
    }
}

/// `TestMix`: lazy `a` and `b`, mixed by `t` (0 → a only, 1 → b only): only the inputs it needs run.
struct TestMix(Arc<NodeSpec>);

impl Node for TestMix {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn check_lazy(&self, inputs: &Inputs, _: &NodeSpec) -> Vec<String> {
        let t = inputs.float("t").unwrap_or(0.5);
        let mut needed = Vec::new();
        if t < 1.0 && !inputs.has("a") {
            needed.push("a".to_owned());
        }
        if t > 0.0 && !inputs.has("b") {
            needed.push("b".to_owned());
        }
        needed
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let t = inputs.float("t")?;
        let a = if t < 1.0 { inputs.float("a")? } else { 0.0 };
        let b = if t > 0.0 { inputs.float("b")? } else { 0.0 };
        Ok(NodeResult::values([Value::Float(a * (1.0 - t) + b * t)]))
    }
}

/// `TestOutput`: an output node that shows its FLOAT input as text.
struct TestOutput(Arc<NodeSpec>);

impl Node for TestOutput {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let values: Vec<String> = inputs.list("value").iter().map(Value::repr).collect();
        Ok(NodeResult::ui(kiln_engine::nodes::UiOutput { text: values, ..Default::default() }))
    }
}

/// `TestRange`: outputs the list `0..count` (`output_is_list`).
struct TestRange(Arc<NodeSpec>);

impl Node for TestRange {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let count = inputs.int("count")?;
        Ok(NodeResult {
            outputs: vec![Output::List((0..count).map(|i| Value::Float(i as f64)).collect())],
            ui: None,
        })
    }
}

/// `TestSum`: `is_input_list`: sums its whole `value` list.
struct TestSum(Arc<NodeSpec>);

impl Node for TestSum {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let sum: f64 = inputs
            .list("value")
            .iter()
            .map(|v| if let Value::Float(f) = v { *f } else { 0.0 })
            .sum();
        Ok(NodeResult::values([Value::Float(sum)]))
    }
}

/// `TestSlow`: runs `steps` steps of a millisecond, reporting progress and checking the interrupt flag;
/// `fail` makes it fail instead.
struct TestSlow(Arc<NodeSpec>);

impl Node for TestSlow {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        if inputs.bool("fail")? {
            return Err(NodeError::of_kind(ErrorKind::InvalidValue, "asked to fail"));
        }
        let steps = inputs.int("steps")?;
        for step in 0..steps {
            ctx.progress((step + 1) as f64, steps as f64);
            ctx.check_interrupt()?;
            if steps > 10 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(NodeResult::values([Value::Float(steps as f64)]))
    }
}

/// `TestPanic`: panics, as a library can on input it chokes on.
struct TestPanic(Arc<NodeSpec>);

impl Node for TestPanic {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, _: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        panic!("the decoder choked")
    }
}

/// Everything a test needs: the registry (built-ins + test nodes), an executor, and run counters.
pub(crate) struct Harness {
    pub(crate) registry: Arc<Registry>,
    pub(crate) executor: Executor,
    pub(crate) const_runs: Arc<AtomicUsize>,
    pub(crate) roots: Roots,
}

/// Records events.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) events: Mutex<Vec<Event>>,
}

impl EventSink for Recorder {
    fn emit(&self, _: &str, event: Event) {
        self.events.lock().expect("events").push(event);
    }
}

/// What one run did.
pub(crate) struct Ran {
    pub(crate) summary: RunSummary,
    pub(crate) events: Vec<Event>,
}

impl Ran {
    /// The nodes that started executing, in order.
    pub(crate) fn executed(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Executing { node } => Some(node.0.clone()),
                _ => None,
            })
            .collect()
    }

    /// The text a node showed.
    pub(crate) fn text(&self, node: &str) -> Vec<String> {
        self.summary.outputs.get(&NodeId::from(node)).map(|ui| ui.text.clone()).unwrap_or_default()
    }
}

impl Harness {
    pub(crate) fn new(policy: CachePolicy) -> Harness {
        let input = temp_dir("input");
        let roots =
            Roots { input: input.clone(), output: temp_dir("output"), temp: temp_dir("temp") };
        let mut registry =
            builtin_registry(&roots, kiln_engine::models::ModelEnv::cpu(input.join("models")));
        let const_runs = Arc::new(AtomicUsize::new(0));
        registry.register(TestConst(
            Arc::new(
                NodeSpec::new("TestConst", "Const", "testing")
                    .input(InputDef::float("value", 0.0, -1e9, 1e9))
                    .output(OutputDef::new("FLOAT")),
            ),
            const_runs.clone(),
        ));
        registry.register(TestFingerprint(Arc::new(
            NodeSpec::new("TestFingerprint", "Fingerprint", "testing")
                .input(InputDef::typed("value", "FLOAT"))
                .input(InputDef::string("fingerprint", "false"))
                .output(OutputDef::new("FLOAT")),
        )));
        registry.register(TestMix(Arc::new(
            NodeSpec::new("TestMix", "Mix", "testing")
                .input(InputDef::typed("a", "FLOAT").lazy())
                .input(InputDef::typed("b", "FLOAT").lazy())
                .input(InputDef::float("t", 0.5, 0.0, 1.0))
                .output(OutputDef::new("FLOAT")),
        )));
        registry.register(TestOutput(Arc::new(
            NodeSpec::new("TestOutput", "Output", "testing")
                .input(InputDef::typed("value", "FLOAT"))
                .output_node()
                .input_list(),
        )));
        registry.register(TestRange(Arc::new(
            NodeSpec::new("TestRange", "Range", "testing")
                .input(InputDef::int("count", 3, 0, 100))
                .output(OutputDef::new("FLOAT").list()),
        )));
        registry.register(TestSum(Arc::new(
            NodeSpec::new("TestSum", "Sum", "testing")
                .input(InputDef::typed("value", "FLOAT"))
                .output(OutputDef::new("FLOAT"))
                .input_list(),
        )));
        registry.register(TestPanic(Arc::new(
            NodeSpec::new("TestPanic", "Panic", "testing").output(OutputDef::new("FLOAT")),
        )));
        registry.register(TestSlow(Arc::new(
            NodeSpec::new("TestSlow", "Slow", "testing")
                .input(InputDef::int("steps", 3, 0, 1_000_000))
                .input(InputDef::boolean("fail", false))
                .output(OutputDef::new("FLOAT")),
        )));
        registry.register(TestConst(
            Arc::new(
                NodeSpec::new("TestVolatile", "Volatile", "testing")
                    .input(InputDef::float("value", 0.0, -1e9, 1e9))
                    .output(OutputDef::new("FLOAT"))
                    .not_idempotent(),
            ),
            const_runs.clone(),
        ));
        let registry = Arc::new(registry);
        let executor = Executor::new(registry.clone(), Cache::new(policy), roots.clone());
        Harness { registry, executor, const_runs, roots }
    }

    pub(crate) fn validate(&self, prompt: serde_json::Value) -> ValidatedPrompt {
        let prompt = Prompt::from_json(&prompt).expect("an object");
        validate(&prompt, &self.registry, None).unwrap_or_else(|r| panic!("prompt rejected: {r:?}"))
    }

    pub(crate) fn run(&mut self, prompt: serde_json::Value) -> Ran {
        let validated = self.validate(prompt);
        self.run_validated(&validated, json!(null))
    }

    pub(crate) fn run_validated(
        &mut self,
        prompt: &ValidatedPrompt,
        extra_pnginfo: serde_json::Value,
    ) -> Ran {
        self.run_in(prompt, extra_pnginfo, None)
    }

    /// Runs a prompt in a scope (a workspace's registry, roots and cache partition).
    pub(crate) fn run_in(
        &mut self,
        prompt: &ValidatedPrompt,
        extra_pnginfo: serde_json::Value,
        scope: Option<&kiln_engine::exec::Scope>,
    ) -> Ran {
        let recorder = Arc::new(Recorder::default());
        let run = Run {
            prompt_id: "p",
            prompt,
            prompt_json: Arc::new(prompt.prompt.to_json()),
            extra_pnginfo: Arc::new(extra_pnginfo),
            preview_method: kiln_engine::nodes::PreviewMethod::None,
            scope,
        };
        let summary = self.executor.run(&run, recorder.clone());
        let events = recorder.events.lock().expect("events").clone();
        Ran { summary, events }
    }
}

/// Node ids of a JSON list, for assertions.
pub(crate) fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[allow(dead_code)]
pub(crate) fn by_node(events: &[Event]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in events {
        if let Event::Executing { node } = e {
            *counts.entry(node.0.clone()).or_insert(0) += 1;
        }
    }
    counts
}
