//! Prompt validation with ComfyUI's error types and shape.
//!
//! The algorithm follows upstream `execution.validate_prompt`: prompt-level checks first (every node has a
//! registered class; at least one output), then each output is validated recursively with results memoised per
//! node. A node whose upstream failed is invalid but carries no errors of its own. If any output validates the
//! prompt is accepted with `node_errors` for the rest; otherwise it is rejected with
//! `prompt_outputs_failed_validation`, whose details list the output nodes' own errors. Upstream quirks that
//! clients can see are kept (where a broken link's error is filed, which outputs count as dependent).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value as Json, json};

use super::{Input, NodeId, Prompt};
use crate::nodes::{InputDef, InputType, Inputs, MATCHTYPE, NodeSpec, Registry};
use crate::value::Value;

/// One validation error, in ComfyUI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationError {
    /// The error type (`required_input_missing`, `value_not_in_list`, ...).
    pub kind: String,
    /// A short message.
    pub message: String,
    /// Details, or an empty string.
    pub details: String,
    /// Type-specific fields (boxed: errors travel in `Result`s, and an ordered map is large).
    pub extra_info: Box<Map<String, Json>>,
}

impl ValidationError {
    fn new(
        kind: &str,
        message: impl Into<String>,
        details: impl Into<String>,
        extra_info: Json,
    ) -> ValidationError {
        let extra_info = match extra_info {
            Json::Object(map) => map,
            _ => Map::new(),
        };
        ValidationError {
            kind: kind.to_owned(),
            message: message.into(),
            details: details.into(),
            extra_info: Box::new(extra_info),
        }
    }
}

/// The errors of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeErrors {
    /// The node's own errors.
    pub errors: Vec<ValidationError>,
    /// Output nodes that depend on it.
    pub dependent_outputs: Vec<NodeId>,
    /// The node's class.
    pub class_type: String,
}

/// A prompt that cannot run at all.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRejection {
    /// The prompt-level error.
    pub error: ValidationError,
    /// Per-node errors (empty for prompt-level checks).
    pub node_errors: BTreeMap<NodeId, NodeErrors>,
}

/// A prompt that can run: the outputs that validated, and the errors of those that did not.
#[derive(Debug, Clone)]
pub struct ValidatedPrompt {
    /// The prompt with literal inputs converted to their declared types.
    pub prompt: Prompt,
    /// The output nodes to execute.
    pub outputs: Vec<NodeId>,
    /// Errors of the outputs that were dropped.
    pub node_errors: BTreeMap<NodeId, NodeErrors>,
}

/// An exception raised while validating a node, as upstream's `KeyError`/`IndexError` from a broken link.
#[derive(Debug, Clone)]
struct Raised {
    kind: &'static str,
    message: String,
}

/// Validates `prompt` against `registry`. With `targets`, only those output nodes run (an empty list is
/// `prompt_no_outputs`).
pub fn validate(
    prompt: &Prompt,
    registry: &Registry,
    targets: Option<&[NodeId]>,
) -> Result<ValidatedPrompt, PromptRejection> {
    let mut specs = HashMap::new();
    let mut outputs = Vec::new();
    for (id, node) in &prompt.nodes {
        let Some(class_type) = &node.class_type else {
            return Err(rejection(ValidationError::new(
                "missing_node_type",
                format!(
                    "Node '{}' has no class_type. The workflow may be corrupted or a custom node is missing.",
                    title_or(node.title.as_deref(), id)
                ),
                format!("Node ID '#{id}'"),
                json!({"node_id": id.0, "class_type": null, "node_title": node.title}),
            )));
        };
        let Some(class) = registry.get(class_type) else {
            let title = node.title.clone().unwrap_or_else(|| class_type.clone());
            return Err(rejection(ValidationError::new(
                "missing_node_type",
                format!("Node '{title}' not found. The custom node may not be installed."),
                format!("Node ID '#{id}'"),
                json!({"node_id": id.0, "class_type": class_type, "node_title": title}),
            )));
        };
        let spec = class.spec();
        if spec.output_node && targets.is_none_or(|t| t.contains(id)) {
            outputs.push(id.clone());
        }
        specs.insert(id.clone(), spec);
    }
    if outputs.is_empty() {
        return Err(rejection(ValidationError::new(
            "prompt_no_outputs",
            "Prompt has no outputs",
            "",
            json!({}),
        )));
    }

    let mut validator = Validator {
        prompt: prompt.clone(),
        specs,
        registry,
        validated: HashMap::new(),
        raised: HashMap::new(),
    };
    validator.mark_cycles(&outputs);

    let mut good = Vec::new();
    let mut failed: Vec<(NodeId, Vec<ValidationError>)> = Vec::new();
    let mut node_errors: BTreeMap<NodeId, NodeErrors> = BTreeMap::new();
    for output in &outputs {
        let (valid, reasons) = match validator.node(output) {
            Ok(valid) => {
                (valid, validator.validated.get(output).map(|r| r.1.clone()).unwrap_or_default())
            }
            Err(raised) => {
                let reasons = vec![ValidationError::new(
                    "exception_during_validation",
                    "Exception when validating node",
                    raised.message.clone(),
                    json!({"exception_type": raised.kind, "traceback": [format!("validating node {output}")]}),
                )];
                validator.validated.insert(output.clone(), (false, reasons.clone()));
                (false, reasons)
            }
        };
        if valid {
            good.push(output.clone());
            continue;
        }
        // As upstream: every node validated so far that failed with reasons counts this output as dependent.
        let mut failing: Vec<_> =
            validator.validated.iter().filter(|(_, r)| !r.0 && !r.1.is_empty()).collect();
        failing.sort_by(|a, b| a.0.cmp(b.0));
        for (id, (_, reasons)) in failing {
            let entry = node_errors.entry(id.clone()).or_insert_with(|| NodeErrors {
                errors: reasons.clone(),
                dependent_outputs: Vec::new(),
                class_type: prompt.nodes[id].class_type.clone().unwrap_or_default(),
            });
            entry.dependent_outputs.push(output.clone());
        }
        failed.push((output.clone(), reasons));
    }

    if good.is_empty() {
        let details: Vec<String> = failed
            .iter()
            .flat_map(|(_, errors)| errors.iter().map(|e| format!("{}: {}", e.message, e.details)))
            .collect();
        return Err(PromptRejection {
            error: ValidationError::new(
                "prompt_outputs_failed_validation",
                "Prompt outputs failed validation",
                details.join("\n"),
                json!({}),
            ),
            node_errors,
        });
    }
    Ok(ValidatedPrompt { prompt: validator.prompt, outputs: good, node_errors })
}

fn rejection(error: ValidationError) -> PromptRejection {
    PromptRejection { error, node_errors: BTreeMap::new() }
}

fn title_or(title: Option<&str>, id: &NodeId) -> String {
    title.map_or_else(|| format!("ID #{id}"), str::to_owned)
}

struct Validator<'a> {
    prompt: Prompt,
    specs: HashMap<NodeId, std::sync::Arc<NodeSpec>>,
    registry: &'a Registry,
    validated: HashMap<NodeId, (bool, Vec<ValidationError>)>,
    raised: HashMap<NodeId, Raised>,
}

impl Validator<'_> {
    /// Finds dependency cycles reachable from the outputs and files `dependency_cycle` on every node of each.
    fn mark_cycles(&mut self, outputs: &[NodeId]) {
        let mut done = BTreeSet::new();
        for output in outputs {
            let mut stack: Vec<(NodeId, Vec<NodeId>)> =
                vec![(output.clone(), self.links_of(output))];
            let mut on_stack = vec![output.clone()];
            while let Some((_, pending)) = stack.last_mut() {
                let Some(next) = pending.pop() else {
                    let (finished, _) = stack.pop().expect("non-empty");
                    on_stack.pop();
                    done.insert(finished);
                    continue;
                };
                if let Some(start) = on_stack.iter().position(|n| *n == next) {
                    let cycle: Vec<NodeId> = on_stack[start..].to_vec();
                    self.file_cycle(&cycle);
                    continue;
                }
                if done.contains(&next) || !self.prompt.nodes.contains_key(&next) {
                    continue;
                }
                let links = self.links_of(&next);
                on_stack.push(next.clone());
                stack.push((next, links));
            }
        }
    }

    fn links_of(&self, id: &NodeId) -> Vec<NodeId> {
        let mut links: Vec<NodeId> = self.prompt.nodes[id]
            .inputs
            .values()
            .filter_map(|input| match input {
                Input::Link { node, .. } => Some(node.clone()),
                Input::Literal(_) => None,
            })
            .collect();
        links.reverse();
        links
    }

    fn file_cycle(&mut self, cycle: &[NodeId]) {
        let describe = |id: &NodeId| {
            format!("{id} ({})", self.prompt.nodes[id].class_type.as_deref().unwrap_or(""))
        };
        let mut path: Vec<String> = cycle.iter().map(describe).collect();
        path.push(describe(&cycle[0]));
        let details = path.join(" -> ");
        let cycle_nodes: Vec<&str> = cycle.iter().map(|n| n.0.as_str()).collect();
        for id in cycle {
            let error = ValidationError::new(
                "dependency_cycle",
                "Dependency cycle detected",
                details.clone(),
                json!({"node_id": id.0, "cycle_nodes": cycle_nodes}),
            );
            self.validated.insert(id.clone(), (false, vec![error]));
        }
    }

    /// Validates a node and everything it depends on (memoised), without recursion: the links upstream would
    /// follow are walked in post-order, then each node is checked once its sources are. `Err` is an exception
    /// that propagates to the node's consumer, as upstream's `KeyError`/`IndexError` does.
    fn node(&mut self, root: &NodeId) -> Result<bool, Raised> {
        let mut stack = vec![(root.clone(), false)];
        while let Some((id, expanded)) = stack.pop() {
            if self.validated.contains_key(&id) || self.raised.contains_key(&id) {
                continue;
            }
            if !expanded {
                stack.push((id.clone(), true));
                for child in self.followed_links(&id) {
                    if !self.validated.contains_key(&child) && !self.raised.contains_key(&child) {
                        stack.push((child, false));
                    }
                }
                continue;
            }
            match self.check(&id) {
                Ok(result) => {
                    self.validated.insert(id, result);
                }
                Err(raised) => {
                    self.raised.insert(id, raised);
                }
            }
        }
        match (self.validated.get(root), self.raised.get(root)) {
            (Some((valid, _)), _) => Ok(*valid),
            (None, Some(raised)) => Err(raised.clone()),
            (None, None) => Ok(false),
        }
    }

    /// The sources upstream recurses into: type-matched links, in declaration order, up to the first broken one.
    fn followed_links(&self, id: &NodeId) -> Vec<NodeId> {
        let spec = &self.specs[id];
        let node = &self.prompt.nodes[id];
        let mut followed = Vec::new();
        for def in spec.inputs() {
            let Some(Input::Link { node: source, slot }) = node.inputs.get(&def.name) else {
                continue;
            };
            let Some(output) = self.specs.get(source).and_then(|s| s.outputs.get(*slot)) else {
                break;
            };
            if spec.validates_inputs.contains(&def.name) || types_match(&output.ty, &def.ty) {
                followed.push(source.clone());
            }
        }
        followed
    }

    /// Checks one node whose followed sources are already checked.
    fn check(&mut self, id: &NodeId) -> Result<(bool, Vec<ValidationError>), Raised> {
        let spec = self.specs[id].clone();
        let node = self.prompt.nodes[id].clone();
        let mut errors = Vec::new();
        let mut valid = true;
        let mut converted: BTreeMap<String, Value> = BTreeMap::new();

        for (def, required) in spec.live_inputs() {
            let name = def.name.as_str();
            let Some(input) = node.inputs.get(name) else {
                if required {
                    errors.push(ValidationError::new(
                        "required_input_missing",
                        "Required input is missing",
                        name,
                        json!({"input_name": name}),
                    ));
                }
                continue;
            };
            let info = def.config_json();
            match input {
                Input::Link { node: source, slot } => {
                    let link = json!([source.0, slot]);
                    let Some(source_spec) = self.specs.get(source).cloned() else {
                        return Err(Raised { kind: "KeyError", message: format!("'{source}'") });
                    };
                    let Some(output) = source_spec.outputs.get(*slot) else {
                        return Err(Raised {
                            kind: "IndexError",
                            message: "tuple index out of range".to_owned(),
                        });
                    };
                    if !spec.validates_inputs.iter().any(|v| v == name)
                        && !types_match(&output.ty, &def.ty)
                    {
                        errors.push(ValidationError::new(
                            "return_type_mismatch",
                            "Return type mismatch between linked nodes",
                            format!("{name}, received_type({}) mismatch input_type({})", output.ty, type_repr(&def.ty)),
                            json!({"input_name": name, "input_config": info, "received_type": output.ty, "linked_node": link}),
                        ));
                        continue;
                    }
                    if let Some((source_valid, _)) = self.validated.get(source) {
                        valid &= *source_valid;
                    } else if let Some(raised) = self.raised.get(source).cloned() {
                        valid = false;
                        let reasons = vec![ValidationError::new(
                            "exception_during_inner_validation",
                            "Exception when validating inner node",
                            raised.message.clone(),
                            json!({
                                "input_name": name, "input_config": info, "exception_message": raised.message,
                                "exception_type": raised.kind, "traceback": [format!("validating node {source}")],
                                "linked_node": link,
                            }),
                        )];
                        self.validated.insert(source.clone(), (false, reasons));
                    }
                }
                Input::Literal(Json::Array(items))
                    if items.len() != 2 || !def_accepts_lists(def) =>
                {
                    errors.push(ValidationError::new(
                        "bad_linked_input",
                        "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                        name,
                        json!({"input_name": name, "input_config": info, "received_value": items}),
                    ));
                }
                Input::Literal(raw) => {
                    match check_literal(name, def, raw, &info, &spec.validates_inputs) {
                        Ok((value, normalized)) => {
                            if let Some(n) =
                                self.prompt.nodes.get_mut(id).and_then(|n| n.inputs.get_mut(name))
                            {
                                *n = Input::Literal(normalized);
                            }
                            converted.insert(name.to_owned(), value);
                        }
                        Err(error) => errors.push(error),
                    }
                }
            }
        }

        if !spec.validates_inputs.is_empty()
            && let Some(class) = node.class_type.as_deref().and_then(|c| self.registry.get(c))
        {
            let checked: Vec<String> = spec
                .validates_inputs
                .iter()
                .filter(|n| converted.contains_key(n.as_str()))
                .cloned()
                .collect();
            if !checked.is_empty()
                && let Err(message) = class.validate(&Inputs::from_values(converted.clone()))
            {
                for name in checked {
                    errors.push(ValidationError::new(
                        "custom_validation_failed",
                        "Custom validation failed for node",
                        format!("{name} - {message}"),
                        json!({"input_name": name}),
                    ));
                }
            }
        }

        Ok((errors.is_empty() && valid, errors))
    }
}

/// Array literals only make sense for `*` and JSON-typed inputs; anywhere else ComfyUI reads them as links.
fn def_accepts_lists(_def: &InputDef) -> bool {
    false
}

fn type_repr(ty: &InputType) -> String {
    match ty {
        InputType::Named(name) => name.clone(),
        InputType::Choices(choices) => py_list(choices.iter().map(String::as_str)),
    }
}

/// ComfyUI's `validate_node_input`: equal types, `*` on either side, or overlapping comma-separated unions.
fn types_match(received: &str, input: &InputType) -> bool {
    let InputType::Named(input) = input else {
        return received == "COMBO" || received == "*";
    };
    // A match-type input or output takes any type: the frontend keeps a template's types in step.
    if received == input || received == MATCHTYPE || input == MATCHTYPE {
        return true;
    }
    let received: BTreeSet<&str> = received.split(',').map(str::trim).collect();
    let input: BTreeSet<&str> = input.split(',').map(str::trim).collect();
    received.contains("*") || input.contains("*") || received.intersection(&input).next().is_some()
}

/// Converts and checks a literal input. Returns the runtime value and the normalised JSON.
fn check_literal(
    name: &str,
    def: &InputDef,
    raw: &Json,
    info: &Json,
    validates: &[String],
) -> Result<(Value, Json), ValidationError> {
    let type_name = match &def.ty {
        InputType::Named(n) => n.as_str(),
        InputType::Choices(_) => "COMBO",
    };
    let converted = match type_name {
        "INT" => literal_int(raw).map(|(v, normalized)| (Value::Int(v), normalized)),
        "FLOAT" => py_float(raw).map(|v| (Value::Float(v), json_f64(v))),
        "STRING" => {
            let s = py_str(raw);
            Ok((Value::String(s.clone()), Json::String(s)))
        }
        "BOOLEAN" => {
            let b = py_bool(raw);
            Ok((Value::Bool(b), Json::Bool(b)))
        }
        "COMBO" => Ok((
            raw.as_str()
                .map_or_else(|| Value::Json(raw.clone().into()), |s| Value::String(s.to_owned())),
            raw.clone(),
        )),
        _ => Ok((Value::Json(raw.clone().into()), raw.clone())),
    };
    let (value, normalized) = converted.map_err(|exception| {
        ValidationError::new(
            "invalid_input_type",
            format!("Failed to convert an input value to a {type_name} value"),
            format!("{name}, {}, {exception}", py_display(raw)),
            json!({"input_name": name, "input_config": info, "received_value": raw, "exception_message": exception}),
        )
    })?;
    if validates.iter().any(|v| v == name) {
        return Ok((value, normalized));
    }
    let number = match &value {
        Value::Int(_) => normalized.as_f64(),
        Value::Float(v) => Some(*v),
        _ => None,
    };
    if let Some(v) = number {
        if let Some(min) = def.options.get("min").and_then(Json::as_f64)
            && v < min
        {
            return Err(ValidationError::new(
                "value_smaller_than_min",
                format!(
                    "Value {} smaller than min of {}",
                    py_number(&normalized),
                    py_number(&def.options["min"])
                ),
                name,
                json!({"input_name": name, "input_config": info, "received_value": normalized}),
            ));
        }
        if let Some(max) = def.options.get("max").and_then(Json::as_f64)
            && v > max
        {
            return Err(ValidationError::new(
                "value_bigger_than_max",
                format!(
                    "Value {} bigger than max of {}",
                    py_number(&normalized),
                    py_number(&def.options["max"])
                ),
                name,
                json!({"input_name": name, "input_config": info, "received_value": normalized}),
            ));
        }
    }
    if let Some(choices) = def.choices_list()
        && !choices.iter().any(|c| Some(*c) == normalized.as_str())
    {
        let (list_info, input_config) = if choices.len() > 20 {
            (format!("(list of length {})", choices.len()), Json::Null)
        } else {
            (py_list(choices.iter().copied()), info.clone())
        };
        return Err(ValidationError::new(
            "value_not_in_list",
            "Value not in list",
            format!("{name}: {} not in {list_info}", py_repr(&normalized)),
            json!({"input_name": name, "input_config": input_config, "received_value": normalized}),
        ));
    }
    Ok((value, normalized))
}

fn json_f64(v: f64) -> Json {
    serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number)
}

fn py_type(value: &Json) -> &'static str {
    match value {
        Json::Null => "NoneType",
        Json::Bool(_) => "bool",
        Json::Number(n) if n.is_f64() => "float",
        Json::Number(_) => "int",
        Json::String(_) => "str",
        Json::Array(_) => "list",
        Json::Object(_) => "dict",
    }
}

/// An `INT` literal: its runtime value and its normalised JSON. A number above i64::MAX (a 64-bit seed:
/// ComfyUI's seed widgets go to 2^64 − 1) travels as its two's-complement bits, which a node reads back with
/// `as u64`; range checks use the JSON number.
fn literal_int(raw: &Json) -> Result<(i64, Json), String> {
    match raw.as_u64().filter(|&u| u > i64::MAX as u64) {
        Some(big) => Ok((big as i64, Json::from(big))),
        None => py_int(raw).map(|v| (v, Json::from(v))),
    }
}

/// Python's `int(value)`.
fn py_int(value: &Json) -> Result<i64, String> {
    match value {
        Json::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64().filter(|f| f.is_finite() && f.abs() < 9.2e18).map(|f| f.trunc() as i64)
            })
            .ok_or_else(|| "int too large to convert".to_owned()),
        Json::Bool(b) => Ok(i64::from(*b)),
        Json::String(s) => {
            let cleaned: String = s.trim().replace('_', "");
            let valid_underscores =
                !s.trim().starts_with('_') && !s.trim().ends_with('_') && !s.contains("__");
            cleaned
                .parse::<i64>()
                .ok()
                .filter(|_| valid_underscores && !cleaned.is_empty())
                .ok_or_else(|| {
                    format!("invalid literal for int() with base 10: {}", py_repr_str(s))
                })
        }
        other => Err(format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{}'",
            py_type(other)
        )),
    }
}

/// Python's `float(value)`.
fn py_float(value: &Json) -> Result<f64, String> {
    match value {
        Json::Number(n) => n.as_f64().ok_or_else(|| "number out of range".to_owned()),
        Json::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Json::String(s) => {
            let t = s.trim().to_ascii_lowercase();
            match t.as_str() {
                "inf" | "+inf" | "infinity" | "+infinity" => Some(f64::INFINITY),
                "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
                _ => t.replace('_', "").parse::<f64>().ok().filter(|_| !t.is_empty() && t != "nan"),
            }
            .ok_or_else(|| format!("could not convert string to float: {}", py_repr_str(s)))
        }
        other => Err(format!(
            "float() argument must be a string or a real number, not '{}'",
            py_type(other)
        )),
    }
}

/// Python's `str(value)` of a JSON value (`None`, `True`, dicts and lists as their reprs).
pub(crate) fn py_str(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        other => py_display(other),
    }
}

/// Python's `bool(value)`.
fn py_bool(value: &Json) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// How Python's `str()` shows a JSON value.
fn py_display(value: &Json) -> String {
    match value {
        Json::Null => "None".to_owned(),
        Json::Bool(true) => "True".to_owned(),
        Json::Bool(false) => "False".to_owned(),
        Json::Number(_) => py_number(value),
        Json::String(s) => s.clone(),
        Json::Array(items) => {
            format!("[{}]", items.iter().map(py_repr).collect::<Vec<_>>().join(", "))
        }
        Json::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", py_repr_str(k), py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// How Python's `repr()` shows a JSON value.
fn py_repr(value: &Json) -> String {
    match value {
        Json::String(s) => py_repr_str(s),
        other => py_display(other),
    }
}

fn py_number(value: &Json) -> String {
    match value.as_i64() {
        Some(i) if !value.is_f64() => i.to_string(),
        _ => crate::value::python_float(value.as_f64().unwrap_or(f64::NAN)),
    }
}

fn py_repr_str(s: &str) -> String {
    if s.contains('\'') && !s.contains('"') {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn py_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    format!("[{}]", items.map(py_repr_str).collect::<Vec<_>>().join(", "))
}

/// The runtime value of a literal input of a validated prompt, by its declared type.
pub(crate) fn literal_value(def: Option<&InputDef>, raw: &Json) -> Value {
    let type_name = match def.map(|d| &d.ty) {
        Some(InputType::Named(n)) => n.as_str(),
        Some(InputType::Choices(_)) => "COMBO",
        None => "*",
    };
    let converted = match type_name {
        "INT" => literal_int(raw).ok().map(|(v, _)| Value::Int(v)),
        "FLOAT" => py_float(raw).ok().map(Value::Float),
        "STRING" => Some(Value::String(py_str(raw))),
        "BOOLEAN" => Some(Value::Bool(py_bool(raw))),
        "COMBO" => raw.as_str().map(|s| Value::String(s.to_owned())),
        _ => None,
    };
    converted.unwrap_or_else(|| Value::Json(raw.clone().into()))
}

#[cfg(test)]
mod tests {
    use super::{py_float, py_int, py_number};
    use serde_json::json;

    #[test]
    fn int_conversion_follows_python() {
        assert_eq!(py_int(&json!("64")), Ok(64));
        assert_eq!(py_int(&json!(" 6_4 ")), Ok(64));
        assert_eq!(py_int(&json!(64.7)), Ok(64));
        assert_eq!(py_int(&json!(true)), Ok(1));
        assert_eq!(
            py_int(&json!("abc")),
            Err("invalid literal for int() with base 10: 'abc'".to_owned())
        );
        assert_eq!(
            py_int(&json!("64.5")),
            Err("invalid literal for int() with base 10: '64.5'".to_owned())
        );
        assert!(py_int(&json!(null)).unwrap_err().ends_with("not 'NoneType'"));
    }

    #[test]
    fn float_conversion_follows_python() {
        assert_eq!(py_float(&json!("0.25")), Ok(0.25));
        assert_eq!(py_float(&json!(3)), Ok(3.0));
        assert_eq!(py_float(&json!("x")), Err("could not convert string to float: 'x'".to_owned()));
    }

    #[test]
    fn numbers_print_like_python() {
        assert_eq!(py_number(&json!(99999)), "99999");
        assert_eq!(py_number(&json!(1.0)), "1.0");
        assert_eq!(py_number(&json!(0.25)), "0.25");
    }
}
