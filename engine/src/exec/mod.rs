//! The executor: runs a validated prompt from its outputs backwards, only what the outputs need.
//!
//! Nodes are visited with an explicit stack (no recursion, so long chains are fine). A node runs once its
//! non-lazy linked inputs are available; a node with lazy inputs is then asked which of them it needs, and only
//! those are evaluated, so an unused branch never runs. Results come from the cache when the node's key hits.
//! Inputs that are lists are mapped like upstream: a node that is not `is_input_list` runs once per element
//! (shorter lists repeat their last element) and its outputs are collected into lists. The interrupt flag is
//! checked before each node and by long nodes through their [`Context`].
//!
//! With a memory manager ([`Executor::with_memory`]) every node that ran is followed by the manager's per-node
//! reset and, in RAM-pressure cache mode, by its RAM arbitration between the cached outputs and the weight
//! pins (memory-manager.md §4.4, §7.6), which replaces the cache's own post-node trim.

mod events;
mod history;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use indexmap::IndexMap;
use kiln_compute::memory::MemoryManager;
use kiln_compute::memory::pressure::Arbitration;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use events::{Event, EventSink, NodeFailure};
pub use history::{HistoryRecorder, StatusMessage};

use crate::cache::{Cache, CachePolicy, CachedOutput, compute_keys};
use crate::graph::{Input, NodeId, Prompt, ValidatedPrompt, literal_value};
use crate::nodes::{
    Context, ErrorKind, Inputs, NodeError, NodeSpec, Output, PreviewMethod, ProgressSink, Registry,
    UiOutput,
};
use crate::roots::{Roots, SharedFiles};
use crate::value::Value;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every output ran.
    Success,
    /// A node failed.
    Failed(Box<NodeFailure>),
    /// The prompt was interrupted.
    Interrupted {
        /// The node that was about to run or running.
        node: NodeId,
        /// Its class.
        class_type: String,
        /// Nodes that ran before.
        executed: Vec<NodeId>,
    },
}

/// The result of a run: how it ended and what the output nodes showed (also those served from the cache).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// How it ended.
    pub outcome: Outcome,
    /// UI outputs by node id, in the order the nodes produced them (history lists them so, as ComfyUI does).
    pub outputs: IndexMap<NodeId, UiOutput>,
    /// Nodes that ran (not served from the cache), in order.
    pub executed: Vec<NodeId>,
    /// Nodes whose results were in the cache when the run started.
    pub cached: Vec<NodeId>,
}

/// One prompt to run.
pub struct Run<'a> {
    /// The prompt id events carry.
    pub prompt_id: &'a str,
    /// The prompt.
    pub prompt: &'a ValidatedPrompt,
    /// The prompt as the client sent it (nodes and keys in the client's order): the hidden `PROMPT` input,
    /// which SaveImage writes into PNG metadata.
    pub prompt_json: Arc<serde_json::Value>,
    /// `extra_data.extra_pnginfo`, or null.
    pub extra_pnginfo: Arc<serde_json::Value>,
    /// How sampling nodes show previews during this run.
    pub preview_method: PreviewMethod,
    /// The run's own registry, roots and cache partition (a workspace of a multi-user server); the
    /// executor's when `None`.
    pub scope: Option<&'a Scope>,
}

/// Where a run reads and writes files, which node classes it sees, and whose cached results it may reuse: one
/// workspace of a multi-user server.
///
/// Cache keys include the partition, so a run is never served another partition's results (their file names in
/// its history) and its `execution_cached` tells it nothing of what another partition ran but which model files
/// were loaded: only the model loaders' results (`NodeSpec::shared_between_partitions`) are shared, so a model
/// is loaded once for every workspace.
pub struct Scope {
    /// The node classes (`LoadImage` lists and reads this scope's input directory).
    pub registry: Arc<Registry>,
    /// The input, output and temp directories.
    pub roots: Roots,
    /// The cache partition (a workspace id).
    pub partition: String,
    /// Where saved files are shared beyond this machine, if anywhere.
    pub shared: Option<Arc<dyn SharedFiles>>,
}

/// Runs prompts one at a time, keeping the cache between them.
pub struct Executor {
    registry: Arc<Registry>,
    cache: Cache,
    roots: Roots,
    interrupt: Arc<AtomicBool>,
    memory: Option<Arc<MemoryManager>>,
}

impl Executor {
    /// An executor over a registry, a cache and the file roots, without a memory manager.
    pub fn new(registry: Arc<Registry>, cache: Cache, roots: Roots) -> Executor {
        Executor {
            registry,
            cache,
            roots,
            interrupt: Arc::new(AtomicBool::new(false)),
            memory: None,
        }
    }

    /// The same executor with a memory manager: after every node that runs, the manager's per-node reset
    /// (§4.4) and, when the cache is in RAM-pressure mode, its RAM arbitration (§7.6) in place of the cache's
    /// own trim, so the cache and the pins give way in one order.
    pub fn with_memory(mut self, manager: Arc<MemoryManager>) -> Executor {
        self.memory = Some(manager);
        self
    }

    /// The memory manager, if there is one.
    pub fn memory(&self) -> Option<&Arc<MemoryManager>> {
        self.memory.as_ref()
    }

    /// The flag that interrupts the running prompt when set (it is cleared when the next prompt starts).
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        self.interrupt.clone()
    }

    /// The cache (to inspect or clear it).
    pub fn cache_mut(&mut self) -> &mut Cache {
        &mut self.cache
    }

    /// Runs one prompt, sending its events to `sink`.
    pub fn run(&mut self, run: &Run<'_>, sink: Arc<dyn EventSink>) -> RunSummary {
        self.interrupt.store(false, Ordering::SeqCst);
        let prompt = &run.prompt.prompt;
        let (registry, roots, shared) = match run.scope {
            Some(scope) => (scope.registry.clone(), scope.roots.clone(), scope.shared.clone()),
            None => (self.registry.clone(), self.roots.clone(), None),
        };
        let keys = compute_keys(prompt, &registry, run.scope.map(|s| s.partition.as_str()));
        self.cache.begin_prompt(keys.values());
        sink.emit(run.prompt_id, Event::ExecutionStart);

        let mut cached: Vec<NodeId> = Vec::new();
        let mut hits: HashMap<NodeId, Arc<CachedOutput>> = HashMap::new();
        for (id, key) in &keys {
            if let Some(hit) = self.cache.get(key) {
                cached.push(id.clone());
                hits.insert(id.clone(), hit);
            }
        }
        cached.sort();
        sink.emit(run.prompt_id, Event::ExecutionCached { nodes: cached.clone() });

        // Whether the output cache tracks this prompt's nodes, which a failure reports as `current_outputs`
        // (upstream's `caches.outputs.all_node_ids()`: every node of the prompt, none when nothing is cached).
        let tracked = match self.cache.policy() {
            CachePolicy::None => None,
            CachePolicy::Classic | CachePolicy::Lru(_) | CachePolicy::RamPressure(_) => {
                Some(&run.prompt.prompt)
            }
        };
        let mut state = RunState {
            prompt_id: run.prompt_id,
            sink: sink.clone(),
            tracked,
            cached,
            results: HashMap::new(),
            requested_lazy: HashMap::new(),
            ui: IndexMap::new(),
            executed: Vec::new(),
        };
        let progress: Arc<dyn ProgressSink> =
            Arc::new(events::Progress { prompt_id: run.prompt_id.to_owned(), sink: sink.clone() });
        let prompt_json = run.prompt_json.clone();

        let mut stack: Vec<NodeId> = run.prompt.outputs.iter().rev().cloned().collect();
        // Nodes whose dependencies were pushed and which have not run yet: the path being resolved.
        let mut expanded: HashSet<NodeId> = HashSet::new();
        while let Some(id) = stack.last().cloned() {
            if state.results.contains_key(&id) {
                stack.pop();
                continue;
            }
            let node = &prompt.nodes[&id];
            let class_type = node.class_type.clone().unwrap_or_default();
            // A node whose key hits (at the start of the run, or because an identical node just ran) is served
            // from the cache.
            let hit =
                hits.get(&id).cloned().or_else(|| keys.get(&id).and_then(|k| self.cache.get(k)));
            if let Some(hit) = hit {
                if let Some(ui) = &hit.ui {
                    // A cached output node still shows its output, and is reported finished, as upstream.
                    state.emit(Event::Executed { node: id.clone(), ui: ui.clone() });
                    state.emit(Event::NodeFinished { node: id.clone() });
                    state.ui.insert(id.clone(), ui.clone());
                }
                state.results.insert(id.clone(), hit);
                stack.pop();
                continue;
            }
            let Some(class) = registry.get(&class_type).cloned() else {
                let error = NodeError::of_kind(
                    ErrorKind::MissingNode,
                    format!("node class {class_type} is not registered"),
                );
                return state.fail(&id, &class_type, error, BTreeMap::new());
            };
            let spec = class.spec();

            // Dependencies: non-lazy links, plus the lazy ones the node asked for.
            let requested = state.requested_lazy.entry(id.clone()).or_default().clone();
            let mut missing = Vec::new();
            for (name, input) in &node.inputs {
                // Only declared inputs take part; validation checked exactly those.
                let Some((def, _)) = spec.input_def(name) else { continue };
                if let Input::Link { node: source, .. } = input
                    && (!def.is_lazy() || requested.contains(name))
                    && !state.results.contains_key(source)
                {
                    if !prompt.nodes.contains_key(source) {
                        let error = NodeError::of_kind(
                            ErrorKind::MissingNode,
                            format!("node {id} links to missing node {source}"),
                        );
                        return state.fail(&id, &class_type, error, BTreeMap::new());
                    }
                    missing.push(source.clone());
                }
            }
            if !missing.is_empty() {
                // A dependency that is itself waiting on its own dependencies lies on the path to this node: a
                // cycle. One that is merely queued lower on the stack (a diamond: two nodes share an input) is
                // pushed again and runs now.
                if let Some(cycle) = missing.iter().find(|m| expanded.contains(*m)) {
                    let error = NodeError::of_kind(
                        ErrorKind::DependencyCycle,
                        format!("node {id} depends on {cycle}, which depends on it"),
                    );
                    return state.fail(&id, &class_type, error, BTreeMap::new());
                }
                expanded.insert(id.clone());
                stack.extend(missing.into_iter().rev());
                continue;
            }
            if spec.inputs().any(|d| d.is_lazy()) {
                let available = single_inputs(node, &spec, &state.results, &requested);
                let wanted: BTreeSet<String> = class
                    .check_lazy(&available, &spec)
                    .into_iter()
                    .filter(|name| {
                        matches!(node.inputs.get(name), Some(Input::Link { .. }))
                            && !requested.contains(name)
                    })
                    .collect();
                if !wanted.is_empty() {
                    state.requested_lazy.entry(id.clone()).or_default().extend(wanted);
                    continue;
                }
            }

            if self.interrupt.load(Ordering::SeqCst) {
                return state.interrupted(&id, &class_type);
            }
            state.emit(Event::Executing { node: id.clone() });
            let lists = input_lists(node, &spec, &state.results, &requested);
            let ctx = Context {
                node: id.clone(),
                prompt: prompt_json.clone(),
                extra_pnginfo: run.extra_pnginfo.clone(),
                input_dir: roots.input.clone(),
                output_dir: roots.output.clone(),
                temp_dir: roots.temp.clone(),
                shared: shared.clone(),
                preview_method: run.preview_method,
                interrupt: self.interrupt.clone(),
                progress: progress.clone(),
            };
            let result = execute_mapped(class.as_ref(), &spec, &lists, &ctx);
            let reset = self.reset_after_node();
            if let (Err(_), Err(message)) = (&result, &reset) {
                tracing::warn!(node = %id, %message, "after a failed node");
            }
            match result {
                Ok(output) => {
                    if let Err(message) = reset {
                        // The device failed while finishing the node's work: its outputs cannot be trusted.
                        let current = current_inputs(&lists);
                        return state.fail(&id, &class_type, NodeError::new(message), current);
                    }
                    let output = Arc::new(output);
                    if let Some(key) = keys.get(&id) {
                        self.cache.set(key, output.clone());
                    }
                    self.trim_after_node();
                    if let Some(ui) = &output.ui {
                        sink.emit(
                            run.prompt_id,
                            Event::Executed { node: id.clone(), ui: ui.clone() },
                        );
                        state.ui.insert(id.clone(), ui.clone());
                    }
                    state.emit(Event::NodeFinished { node: id.clone() });
                    state.results.insert(id.clone(), output);
                    state.executed.push(id.clone());
                    stack.pop();
                }
                Err(error)
                    if error.kind == ErrorKind::Interrupted
                        || self.interrupt.load(Ordering::SeqCst) =>
                {
                    return state.interrupted(&id, &class_type);
                }
                Err(error) => {
                    return state.fail(&id, &class_type, error, current_inputs(&lists));
                }
            }
        }
        state.emit(Event::ExecutionSuccess);
        RunSummary {
            outcome: Outcome::Success,
            outputs: state.ui,
            executed: state.executed,
            cached: state.cached,
        }
    }

    /// The memory manager's per-node reset, after every node that ran (whatever its result). An error is the
    /// device's, reported as the message the node fails with.
    fn reset_after_node(&self) -> Result<(), String> {
        let Some(manager) = &self.memory else { return Ok(()) };
        manager.after_node().map_err(|e| format!("the device failed after the node ran: {e}"))
    }

    /// After a node's output is stored: with a memory manager in RAM-pressure mode, its RAM arbitration;
    /// otherwise the cache's own trim.
    fn trim_after_node(&mut self) {
        let (Some(manager), CachePolicy::RamPressure(pressure)) =
            (&self.memory, self.cache.policy())
        else {
            return self.cache.after_node();
        };
        let (manager, thresholds) = (manager.clone(), pressure.thresholds);
        let report = manager.arbitrate_ram(&thresholds, &mut self.cache);
        if report != Arbitration::default() {
            tracing::debug!(?report, "RAM arbitration after the node");
        }
    }
}

/// A node's inputs as the failure report shows them (`current_inputs`).
fn current_inputs(lists: &BTreeMap<String, Vec<Value>>) -> BTreeMap<String, Vec<String>> {
    lists
        .iter()
        .map(|(name, values)| (name.clone(), values.iter().map(Value::repr).collect()))
        .collect()
}

/// Everything one run accumulates; it ends in a [`RunSummary`].
struct RunState<'a> {
    prompt_id: &'a str,
    sink: Arc<dyn EventSink>,
    /// The prompt, when the output cache tracks its nodes (see `current_outputs`).
    tracked: Option<&'a Prompt>,
    cached: Vec<NodeId>,
    results: HashMap<NodeId, Arc<CachedOutput>>,
    requested_lazy: HashMap<NodeId, BTreeSet<String>>,
    ui: IndexMap<NodeId, UiOutput>,
    executed: Vec<NodeId>,
}

impl RunState<'_> {
    fn emit(&self, event: Event) {
        self.sink.emit(self.prompt_id, event);
    }

    /// Ends the run with a node failure.
    fn fail(
        self,
        node: &NodeId,
        class_type: &str,
        error: NodeError,
        current_inputs: BTreeMap<String, Vec<String>>,
    ) -> RunSummary {
        let failure = NodeFailure {
            node: node.clone(),
            class_type: class_type.to_owned(),
            executed: self.executed.clone(),
            message: error.message,
            kind: error.kind,
            current_inputs,
            current_outputs: self
                .tracked
                .map(|prompt| prompt.nodes.keys().cloned().collect())
                .unwrap_or_default(),
        };
        self.emit(Event::ExecutionError(Box::new(failure.clone())));
        RunSummary {
            outcome: Outcome::Failed(Box::new(failure)),
            outputs: self.ui,
            executed: self.executed,
            cached: self.cached,
        }
    }

    /// Ends the run as interrupted.
    fn interrupted(self, node: &NodeId, class_type: &str) -> RunSummary {
        self.emit(Event::ExecutionInterrupted {
            node: node.clone(),
            class_type: class_type.to_owned(),
            executed: self.executed.clone(),
        });
        RunSummary {
            outcome: Outcome::Interrupted {
                node: node.clone(),
                class_type: class_type.to_owned(),
                executed: self.executed.clone(),
            },
            outputs: self.ui,
            executed: self.executed,
            cached: self.cached,
        }
    }
}

/// The inputs available now, as lists: literals, and links whose source has run (lazy links only if
/// requested).
fn input_lists(
    node: &crate::graph::PromptNode,
    spec: &NodeSpec,
    results: &HashMap<NodeId, Arc<CachedOutput>>,
    requested: &BTreeSet<String>,
) -> BTreeMap<String, Vec<Value>> {
    let mut lists = BTreeMap::new();
    for (name, input) in &node.inputs {
        let def = spec.input_def(name).map(|(def, _)| def);
        if def.is_none() && !spec.accept_all_inputs {
            continue;
        }
        match input {
            Input::Literal(json) => {
                lists.insert(name.clone(), vec![literal_value(def, json)]);
            }
            Input::Link { node: source, slot } => {
                let lazy = def.is_some_and(|d| d.is_lazy());
                if lazy && !requested.contains(name) {
                    continue;
                }
                if let Some(values) = results.get(source).and_then(|r| r.outputs.get(*slot)) {
                    lists.insert(name.clone(), values.clone());
                }
            }
        }
    }
    lists
}

/// The available inputs with one value each (the first of a list), for `check_lazy`.
fn single_inputs(
    node: &crate::graph::PromptNode,
    spec: &NodeSpec,
    results: &HashMap<NodeId, Arc<CachedOutput>>,
    requested: &BTreeSet<String>,
) -> Inputs {
    let lists = input_lists(node, spec, results, requested);
    Inputs::from_values(
        lists.into_iter().filter_map(|(k, mut v)| (!v.is_empty()).then(|| (k, v.swap_remove(0)))),
    )
}

/// Runs a node over its input lists like upstream's `map_node_over_list`.
fn execute_mapped(
    class: &dyn crate::nodes::Node,
    spec: &NodeSpec,
    lists: &BTreeMap<String, Vec<Value>>,
    ctx: &Context,
) -> Result<CachedOutput, NodeError> {
    let slots = spec.outputs.len();
    let mut outputs: Vec<Vec<Value>> = vec![Vec::new(); slots];
    let mut ui: Option<UiOutput> = None;
    let mut collect = |result: crate::nodes::NodeResult| -> Result<(), NodeError> {
        if result.outputs.len() != slots {
            return Err(NodeError::new(format!(
                "node {} returned {} outputs, declares {slots}",
                spec.name,
                result.outputs.len()
            )));
        }
        for (slot, output) in result.outputs.into_iter().enumerate() {
            match output {
                Output::One(value) => outputs[slot].push(value),
                Output::List(values) => outputs[slot].extend(values),
            }
        }
        if let Some(more) = result.ui {
            ui.get_or_insert_with(UiOutput::default).extend(more);
        }
        Ok(())
    };
    if spec.is_input_list {
        collect(execute_guarded(class, spec, &Inputs::from_lists(lists.clone()), ctx)?)?;
    } else {
        let runs = if lists.values().any(Vec::is_empty) {
            0
        } else {
            lists.values().map(Vec::len).max().unwrap_or(1)
        };
        for index in 0..runs {
            if index > 0 {
                ctx.check_interrupt()?;
            }
            let inputs =
                Inputs::from_values(lists.iter().map(|(name, values)| {
                    (name.clone(), values[index.min(values.len() - 1)].clone())
                }));
            collect(execute_guarded(class, spec, &inputs, ctx)?)?;
        }
    }
    Ok(CachedOutput { outputs, ui })
}

/// Runs a node once. A panic inside it (a library choking on a damaged file, say) becomes the node's error, as
/// an exception does in a ComfyUI node: the prompt fails with the message, and the worker goes on to the next
/// prompt instead of dying with it.
fn execute_guarded(
    class: &dyn crate::nodes::Node,
    spec: &NodeSpec,
    inputs: &Inputs,
    ctx: &Context,
) -> Result<crate::nodes::NodeResult, NodeError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| class.execute(inputs, ctx))) {
        Ok(result) => result,
        Err(payload) => {
            let message = (payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(NodeError::new(format!("{} panicked: {message}", spec.name)))
        }
    }
}
