//! Node declarations: inputs, outputs and flags, in the terms of ComfyUI's `object_info`.
//!
//! Input options are kept as the JSON object `object_info` shows (`default`, `min`, `max`, `step`, `multiline`,
//! `tooltip`, `options`, `lazy`, ...), so what a node declares is exactly what the frontend sees and what
//! validation checks.

use serde_json::{Map, Value as Json};

/// The type of an input as `object_info` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputType {
    /// A type name: `INT`, `FLOAT`, `STRING`, `BOOLEAN`, `COMBO` (choices in `options.options`), `IMAGE`, `*`, ...
    Named(String),
    /// A legacy combo: the list of choices in place of the type name.
    Choices(Vec<String>),
}

impl InputType {
    /// The type as JSON (a string or a list of choices).
    pub fn to_json(&self) -> Json {
        match self {
            InputType::Named(name) => Json::String(name.clone()),
            InputType::Choices(choices) => Json::from(choices.clone()),
        }
    }
}

/// The type of V3 match-type inputs and outputs: validation accepts any type there, as the frontend keeps
/// the template's types in step (ComfyUI's `validate_node_input`).
pub const MATCHTYPE: &str = "COMFY_MATCHTYPE_V3";

/// The type of a V3 `Autogrow` input: the frontend grows it into inputs named after it (`values.a`, ...).
pub const AUTOGROW: &str = "COMFY_AUTOGROW_V3";

/// The type of a V3 `DynamicCombo` input: a choice whose inputs follow it (`format.bit_depth`, ...).
pub const DYNAMIC_COMBO: &str = "COMFY_DYNAMICCOMBO_V3";

/// One declared input.
#[derive(Debug, Clone, PartialEq)]
pub struct InputDef {
    /// The input name.
    pub name: String,
    /// Its type.
    pub ty: InputType,
    /// Its options, as `object_info` shows them.
    pub options: Map<String, Json>,
    /// Whether a V1 class declares an options dict even when it is empty, so `object_info` shows `[TYPE, {}]`
    /// rather than `[TYPE]` (V3 inputs always show theirs).
    pub options_declared: bool,
}

impl InputDef {
    fn new(name: &str, ty: InputType) -> InputDef {
        InputDef { name: name.to_owned(), ty, options: Map::new(), options_declared: false }
    }

    /// An `INT` input.
    pub fn int(name: &str, default: i64, min: i64, max: i64) -> InputDef {
        InputDef::new(name, InputType::Named("INT".to_owned()))
            .option("default", default)
            .option("min", min)
            .option("max", max)
    }

    /// A `FLOAT` input.
    pub fn float(name: &str, default: f64, min: f64, max: f64) -> InputDef {
        InputDef::new(name, InputType::Named("FLOAT".to_owned()))
            .option("default", default)
            .option("min", min)
            .option("max", max)
    }

    /// A `STRING` input.
    pub fn string(name: &str, default: &str) -> InputDef {
        InputDef::new(name, InputType::Named("STRING".to_owned())).option("default", default)
    }

    /// A `BOOLEAN` input.
    pub fn boolean(name: &str, default: bool) -> InputDef {
        InputDef::new(name, InputType::Named("BOOLEAN".to_owned())).option("default", default)
    }

    /// A legacy combo (`[[choices], {...}]`).
    pub fn choices(name: &str, choices: &[&str]) -> InputDef {
        InputDef::new(name, InputType::Choices(choices.iter().map(|c| (*c).to_owned()).collect()))
    }

    /// A `COMBO` input (`["COMBO", {"options": [...]}]`).
    pub fn combo(name: &str, choices: Vec<String>) -> InputDef {
        InputDef::new(name, InputType::Named("COMBO".to_owned())).option("options", choices)
    }

    /// A V3 `COMBO` input (`["COMBO", {"multiselect": false, "options": [...]}]`); more options follow in V3's
    /// order (`default`, `tooltip`, ...).
    pub fn v3_combo(name: &str, choices: &[&str]) -> InputDef {
        InputDef::new(name, InputType::Named("COMBO".to_owned()))
            .option("multiselect", false)
            .option("options", choices.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
    }

    /// A V3 `COMBO` input with a tooltip and a default, in the order V3 writes them (`tooltip`, `default`,
    /// `multiselect`, `options`).
    pub fn v3_combo_described(
        name: &str,
        choices: &[&str],
        tooltip: &str,
        default: &str,
    ) -> InputDef {
        InputDef::new(name, InputType::Named("COMBO".to_owned()))
            .tooltip(tooltip)
            .option("default", default)
            .option("multiselect", false)
            .option("options", choices.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
    }

    /// A bare input of a type (`INT`, `STRING`, ...) whose options the caller adds in the order ComfyUI
    /// declares them (V3 writes `tooltip` before `default`; some primitives declare no default).
    pub fn bare(name: &str, ty: &str) -> InputDef {
        InputDef::new(name, InputType::Named(ty.to_owned()))
    }

    /// Marks a V1 input as declared with an options dict, even an empty one (`[TYPE, {}]`).
    pub fn with_options(mut self) -> InputDef {
        self.options_declared = true;
        self
    }

    /// Adds the `template` option of a V3 match-type input (type [`MATCHTYPE`]): its template id and the
    /// types it allows (`*` for any).
    pub fn template(self, template: &str, allowed: &str) -> InputDef {
        self.option(
            "template",
            serde_json::json!({"template_id": template, "allowed_types": allowed}),
        )
    }

    /// An input of a link type (`IMAGE`, `LATENT`, `*`, ...).
    pub fn typed(name: &str, ty: &str) -> InputDef {
        InputDef::new(name, InputType::Named(ty.to_owned()))
    }

    /// Adds an option.
    pub fn option(mut self, key: &str, value: impl Into<Json>) -> InputDef {
        self.options.insert(key.to_owned(), value.into());
        self
    }

    /// Adds a tooltip.
    pub fn tooltip(self, text: &str) -> InputDef {
        self.option("tooltip", text)
    }

    /// Marks the input lazy: the node asks for it only when it needs it.
    pub fn lazy(self) -> InputDef {
        self.option("lazy", true)
    }

    /// Whether the input is lazy.
    pub fn is_lazy(&self) -> bool {
        self.options.get("lazy") == Some(&Json::Bool(true))
    }

    /// The combo choices, for a legacy or `COMBO` input.
    pub fn choices_list(&self) -> Option<Vec<&str>> {
        match &self.ty {
            InputType::Choices(choices) => Some(choices.iter().map(String::as_str).collect()),
            InputType::Named(name) if name == "COMBO" => Some(
                self.options
                    .get("options")
                    .and_then(Json::as_array)
                    .map(|items| items.iter().filter_map(Json::as_str).collect())
                    .unwrap_or_default(),
            ),
            InputType::Named(_) => None,
        }
    }

    /// `[TYPE, options]`, the `input_config` of validation errors and the `object_info` input spec.
    pub fn config_json(&self) -> Json {
        Json::Array(vec![self.ty.to_json(), Json::Object(self.options.clone())])
    }
}

/// Hidden inputs the executor fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hidden {
    /// The whole prompt (`PROMPT`).
    Prompt,
    /// `extra_data.extra_pnginfo` (`EXTRA_PNGINFO`).
    ExtraPngInfo,
    /// The node's own id (`UNIQUE_ID`).
    UniqueId,
}

impl Hidden {
    /// The kind as `object_info` writes it.
    pub fn kind(self) -> &'static str {
        match self {
            Hidden::Prompt => "PROMPT",
            Hidden::ExtraPngInfo => "EXTRA_PNGINFO",
            Hidden::UniqueId => "UNIQUE_ID",
        }
    }
}

/// One declared output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputDef {
    /// The type name (`IMAGE`, `INT`, `*`, ...).
    pub ty: String,
    /// The name shown in the UI (defaults to the type).
    pub name: String,
    /// Whether the output is a list.
    pub is_list: bool,
    /// A tooltip.
    pub tooltip: Option<String>,
    /// The template id of a V3 match-type output (`COMFY_MATCHTYPE_V3`: its type is the linked input's).
    pub matchtype: Option<String>,
}

impl OutputDef {
    /// An output named after its type.
    pub fn new(ty: &str) -> OutputDef {
        OutputDef {
            ty: ty.to_owned(),
            name: ty.to_owned(),
            is_list: false,
            tooltip: None,
            matchtype: None,
        }
    }

    /// Renames the output.
    pub fn named(mut self, name: &str) -> OutputDef {
        self.name = name.to_owned();
        self
    }

    /// Marks the output as a list.
    pub fn list(mut self) -> OutputDef {
        self.is_list = true;
        self
    }

    /// A V3 match-type output of template `template` (`COMFY_MATCHTYPE_V3`), named `name`.
    pub fn matchtype(name: &str, template: &str) -> OutputDef {
        OutputDef { matchtype: Some(template.to_owned()), ..OutputDef::new(MATCHTYPE).named(name) }
    }

    /// Adds a tooltip.
    pub fn tooltip(mut self, text: &str) -> OutputDef {
        self.tooltip = Some(text.to_owned());
        self
    }
}

/// Everything a node class declares.
///
/// For a V3 node (`v3`) an empty `display_name` means none is declared (served as `null`), and
/// input options must be added in the order V3 writes them (`tooltip` before `default`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// The class name (`ImageInvert`).
    pub name: String,
    /// The name shown in the UI.
    pub display_name: String,
    /// What the node does.
    pub description: String,
    /// The menu path.
    pub category: String,
    /// Required inputs in declaration order.
    pub required: Vec<InputDef>,
    /// Optional inputs in declaration order.
    pub optional: Vec<InputDef>,
    /// Hidden inputs.
    pub hidden: Vec<(String, Hidden)>,
    /// Outputs in order.
    pub outputs: Vec<OutputDef>,
    /// Output tooltips past the last output, served after the outputs' own: ComfyUI's `LoraLoaderModelOnly`
    /// inherits the two tooltips of `LoraLoader` for its one output.
    pub extra_output_tooltips: Vec<String>,
    /// Whether the node is an output (execution starts from outputs).
    pub output_node: bool,
    /// Whether the node receives whole lists instead of being mapped over them.
    pub is_input_list: bool,
    /// Whether the node must run every time (its id enters its cache key).
    pub not_idempotent: bool,
    /// Inputs whose built-in checks (range, combo) the node's own validation replaces.
    pub validates_inputs: Vec<String>,
    /// Whether the node also receives the inputs a prompt gives it that it does not declare (ComfyUI's
    /// `accept_all_inputs`: frontend-defined widgets), as their JSON values.
    pub accept_all_inputs: bool,
    /// Extra search terms.
    pub search_aliases: Vec<String>,
    /// The essentials panel section.
    pub essentials_category: Option<String>,
    /// The Python module ComfyUI reports for the node (`nodes`, or a custom node's module).
    pub python_module: String,
    /// Whether ComfyUI marks the node deprecated (hidden from search, still runs).
    pub deprecated: bool,
    /// Whether ComfyUI marks the node experimental.
    pub experimental: bool,
    /// Whether ComfyUI declares the node with its V3 schema (`comfy_api`, `io.ComfyNode`) rather than as a
    /// classic V1 class. `object_info` differs: `server.py` describes a V1 class field by field (absent fields
    /// omitted), a V3 class by the dump of its `NodeInfoV1` dataclass (every field present, absent ones `null`,
    /// another key order).
    pub v3: bool,
    /// The inputs V3 `Autogrow` inputs grow into (`values.a`, `values.b`, ...), by the declared input's name,
    /// each with whether it is required: what validation and execution see in its place.
    pub grown: Vec<(String, Vec<(InputDef, bool)>)>,
    /// Whether cached results are shared between cache partitions (workspaces of a multi-user server): only
    /// for nodes whose result depends on nothing a partition owns, the model loaders (model folders are the
    /// server's; a cache hit on one can tell a workspace that the file was loaded recently). Every other node's
    /// results are kept per partition.
    pub shared_between_partitions: bool,
    /// Whether ComfyUI marks the node as showing an output while it runs (`has_intermediate_output`: a
    /// preview from a node that is not an output node, such as `Painter`'s).
    pub intermediate_output: bool,
}

impl NodeSpec {
    /// A spec with a name, display name and category, and nothing else yet.
    pub fn new(name: &str, display_name: &str, category: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_owned(),
            display_name: display_name.to_owned(),
            description: String::new(),
            category: category.to_owned(),
            required: Vec::new(),
            optional: Vec::new(),
            hidden: Vec::new(),
            outputs: Vec::new(),
            extra_output_tooltips: Vec::new(),
            output_node: false,
            is_input_list: false,
            not_idempotent: false,
            validates_inputs: Vec::new(),
            accept_all_inputs: false,
            search_aliases: Vec::new(),
            essentials_category: None,
            python_module: "nodes".to_owned(),
            deprecated: false,
            experimental: false,
            grown: Vec::new(),
            v3: false,
            shared_between_partitions: false,
            intermediate_output: false,
        }
    }

    /// Marks the node as showing an output while it runs (see `intermediate_output`).
    pub fn intermediate_output(mut self) -> NodeSpec {
        self.intermediate_output = true;
        self
    }

    /// Marks the node's cached results as shared between partitions (see `shared_between_partitions`).
    pub fn shared_between_partitions(mut self) -> NodeSpec {
        self.shared_between_partitions = true;
        self
    }

    /// Marks the node deprecated.
    pub fn deprecated(mut self) -> NodeSpec {
        self.deprecated = true;
        self
    }

    /// Marks the node experimental.
    pub fn experimental(mut self) -> NodeSpec {
        self.experimental = true;
        self
    }

    /// Marks the node as declared with ComfyUI's V3 schema (see the `v3` field).
    pub fn v3(mut self) -> NodeSpec {
        self.v3 = true;
        self
    }

    /// Adds output tooltips past the last output (see [`NodeSpec::extra_output_tooltips`]).
    pub fn extra_output_tooltips(mut self, tooltips: &[&str]) -> NodeSpec {
        self.extra_output_tooltips.extend(tooltips.iter().map(|t| (*t).to_owned()));
        self
    }

    /// The display name the node declares, if any (`None` only for a V3 node without one).
    pub fn declared_display_name(&self) -> Option<&str> {
        if self.v3 && self.display_name.is_empty() { None } else { Some(&self.display_name) }
    }

    /// Sets the Python module ComfyUI reports (default `nodes`).
    pub fn python_module(mut self, module: &str) -> NodeSpec {
        self.python_module = module.to_owned();
        self
    }

    /// Sets the description.
    pub fn description(mut self, text: &str) -> NodeSpec {
        self.description = text.to_owned();
        self
    }

    /// Adds a required input.
    pub fn input(mut self, input: InputDef) -> NodeSpec {
        self.required.push(input);
        self
    }

    /// Adds an optional input.
    pub fn optional(mut self, input: InputDef) -> NodeSpec {
        self.optional.push(input);
        self
    }

    /// Adds a hidden input.
    pub fn hidden(mut self, name: &str, kind: Hidden) -> NodeSpec {
        self.hidden.push((name.to_owned(), kind));
        self
    }

    /// Adds an output.
    pub fn output(mut self, output: OutputDef) -> NodeSpec {
        self.outputs.push(output);
        self
    }

    /// Marks the node as an output node.
    pub fn output_node(mut self) -> NodeSpec {
        self.output_node = true;
        self
    }

    /// Marks the node as not idempotent.
    pub fn not_idempotent(mut self) -> NodeSpec {
        self.not_idempotent = true;
        self
    }

    /// Marks the node as receiving whole input lists.
    pub fn input_list(mut self) -> NodeSpec {
        self.is_input_list = true;
        self
    }

    /// Replaces the built-in checks of these inputs by the node's own validation.
    pub fn validates(mut self, inputs: &[&str]) -> NodeSpec {
        self.validates_inputs = inputs.iter().map(|i| (*i).to_owned()).collect();
        self
    }

    /// Passes the node the inputs it does not declare too (see [`NodeSpec::accept_all_inputs`]).
    pub fn accepts_all_inputs(mut self) -> NodeSpec {
        self.accept_all_inputs = true;
        self
    }

    /// Sets the search aliases.
    pub fn aliases(mut self, aliases: &[&str]) -> NodeSpec {
        self.search_aliases = aliases.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Sets the essentials panel section.
    pub fn essentials(mut self, section: &str) -> NodeSpec {
        self.essentials_category = Some(section.to_owned());
        self
    }

    /// A spec's input by name (a grown input included), and whether it is required.
    pub fn input_def(&self, name: &str) -> Option<(&InputDef, bool)> {
        self.live_inputs().find(|(i, _)| i.name == name)
    }

    /// Every input a prompt gives the node, required first, in declaration order: an `Autogrow` input stands
    /// for the inputs it grows into.
    pub fn inputs(&self) -> impl Iterator<Item = &InputDef> {
        self.live_inputs().map(|(def, _)| def)
    }

    /// [`NodeSpec::inputs`] with whether each is required.
    pub fn live_inputs(&self) -> impl Iterator<Item = (&InputDef, bool)> {
        let declared =
            self.required.iter().map(|d| (d, true)).chain(self.optional.iter().map(|d| (d, false)));
        declared.flat_map(move |(def, required)| {
            let grown = self.grown.iter().find(|(name, _)| *name == def.name);
            let items: Vec<(&InputDef, bool)> = match grown {
                Some((_, inputs)) => inputs.iter().map(|(d, r)| (d, *r)).collect(),
                None => vec![(def, required)],
            };
            items
        })
    }

    /// Adds a required V3 `Autogrow` input `name` whose template is `template` (named as ComfyUI names it,
    /// e.g. `value`), grown under `names` (`name.a`, `name.b`, ...), the first `min` required.
    pub fn autogrow(self, name: &str, template: InputDef, names: &[&str], min: usize) -> NodeSpec {
        self.grow_names(name, None, template, names, min)
    }

    /// [`NodeSpec::autogrow`] with a tooltip on the autogrow input itself (written before its template, as
    /// `io.Autogrow.Input(tooltip=...)` writes it).
    pub fn described_autogrow(
        self,
        name: &str,
        tooltip: &str,
        template: InputDef,
        names: &[&str],
        min: usize,
    ) -> NodeSpec {
        self.grow_names(name, Some(tooltip), template, names, min)
    }

    fn grow_names(
        self,
        name: &str,
        tooltip: Option<&str>,
        template: InputDef,
        names: &[&str],
        min: usize,
    ) -> NodeSpec {
        let grown: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut config = Map::new();
        if let Some(tooltip) = tooltip {
            config.insert("tooltip".to_owned(), Json::from(tooltip));
        }
        config.insert(
            "template".to_owned(),
            serde_json::json!({
                "input": {"required": {template.name.clone(): template.config_json()}},
                "names": names,
                "min": min,
            }),
        );
        self.grow(name, template, Json::Object(config), grown, min)
    }

    /// Adds a required V3 `Autogrow` input `name` grown under `prefix0` … `prefix{max − 1}` (`TemplatePrefix`),
    /// the first `min` required.
    pub fn autogrow_prefix(
        self,
        name: &str,
        template: InputDef,
        prefix: &str,
        range: (usize, usize),
    ) -> NodeSpec {
        self.grow_prefix(name, None, template, prefix, range)
    }

    /// [`NodeSpec::autogrow_prefix`] with a tooltip on the autogrow input itself (written before its template,
    /// as `io.Autogrow.Input(tooltip=...)` writes it).
    pub fn described_autogrow_prefix(
        self,
        name: &str,
        tooltip: &str,
        template: InputDef,
        prefix: &str,
        range: (usize, usize),
    ) -> NodeSpec {
        self.grow_prefix(name, Some(tooltip), template, prefix, range)
    }

    fn grow_prefix(
        self,
        name: &str,
        tooltip: Option<&str>,
        template: InputDef,
        prefix: &str,
        (min, max): (usize, usize),
    ) -> NodeSpec {
        let grown: Vec<String> = (0..max).map(|i| format!("{prefix}{i}")).collect();
        let mut config = Map::new();
        if let Some(tooltip) = tooltip {
            config.insert("tooltip".to_owned(), Json::from(tooltip));
        }
        config.insert(
            "template".to_owned(),
            serde_json::json!({
                "input": {"required": {template.name.clone(): template.config_json()}},
                "prefix": prefix,
                "min": min,
                "max": max,
            }),
        );
        self.grow(name, template, Json::Object(config), grown, min)
    }

    /// [`NodeSpec::autogrow_prefix`] declared among the optional inputs (`io.Autogrow.Input(optional=True)`,
    /// with `min` 0 so that none of the grown inputs is required).
    pub fn optional_autogrow_prefix(
        self,
        name: &str,
        template: InputDef,
        prefix: &str,
        max: usize,
    ) -> NodeSpec {
        let mut spec = self.autogrow_prefix(name, template, prefix, (0, max));
        if let Some(declared) = spec.required.pop() {
            spec.optional.push(declared);
        }
        spec
    }

    /// Adds a required V3 `DynamicCombo` input `name` (type [`DYNAMIC_COMBO`]): a choice among `options`, each
    /// bringing its own inputs, which the frontend sends as `name.<input>` (the chosen option's only).
    /// Validation sees `name` as a combo of the option keys and each `name.<input>` as optional, a combo of every
    /// option's choices for it (in order of first appearance) or the first option's declaration; the node
    /// checks that the inputs of the chosen option are there and belong to it.
    pub fn dynamic_combo(
        self,
        name: &str,
        tooltip: &str,
        options: &[(&str, Vec<InputDef>)],
    ) -> NodeSpec {
        let options: Vec<DynamicOption<'_>> = options
            .iter()
            .map(|(key, required)| DynamicOption {
                key,
                required: required.clone(),
                optional: Vec::new(),
            })
            .collect();
        self.dynamic_combo_of(InputDef::bare(name, DYNAMIC_COMBO).tooltip(tooltip), &options)
    }

    /// [`NodeSpec::dynamic_combo`] declared as `declared` (type [`DYNAMIC_COMBO`], with the options ComfyUI
    /// writes before `options`: `tooltip`, `display_name`), whose options may bring optional inputs too.
    pub fn dynamic_combo_of(
        mut self,
        declared: InputDef,
        options: &[DynamicOption<'_>],
    ) -> NodeSpec {
        let name = declared.name.clone();
        let name = name.as_str();
        let listed: Vec<Json> = options
            .iter()
            .map(|option| {
                let of = |defs: &[InputDef]| -> Map<String, Json> {
                    defs.iter().map(|d| (d.name.clone(), d.config_json())).collect()
                };
                let mut inputs = Map::new();
                inputs.insert("required".to_owned(), Json::Object(of(&option.required)));
                if !option.optional.is_empty() {
                    inputs.insert("optional".to_owned(), Json::Object(of(&option.optional)));
                }
                serde_json::json!({"key": option.key, "inputs": inputs})
            })
            .collect();
        let declared = declared.option("options", listed);
        let keys: Vec<&str> = options.iter().map(|option| option.key).collect();
        let mut grown = vec![(InputDef::v3_combo(name, &keys), true)];
        for option in options {
            for input in option.required.iter().chain(&option.optional) {
                let child = format!("{name}.{}", input.name);
                let Some(choices) = input.choices_list() else {
                    // Not a combo: the first option's declaration stands for all.
                    if !grown.iter().any(|(d, _)| d.name == child) {
                        grown.push((InputDef { name: child, ..input.clone() }, false));
                    }
                    continue;
                };
                match grown.iter_mut().find(|(d, _)| d.name == child) {
                    Some((existing, _)) => {
                        let mut all: Vec<String> = existing
                            .choices_list()
                            .unwrap_or_default()
                            .into_iter()
                            .map(str::to_owned)
                            .collect();
                        for choice in &choices {
                            if !all.iter().any(|c| c == choice) {
                                all.push((*choice).to_owned());
                            }
                        }
                        let all: Vec<&str> = all.iter().map(String::as_str).collect();
                        *existing = InputDef::v3_combo(&child, &all);
                    }
                    None => grown.push((InputDef::v3_combo(&child, &choices), false)),
                }
            }
        }
        self.grown.push((name.to_owned(), grown));
        self.input(declared)
    }

    /// Declares Autogrow input `name` with its `config` and records the inputs it grows into.
    fn grow(
        mut self,
        name: &str,
        template: InputDef,
        config: Json,
        names: Vec<String>,
        min: usize,
    ) -> NodeSpec {
        let declared = InputDef {
            name: name.to_owned(),
            ty: InputType::Named(AUTOGROW.to_owned()),
            options: match config {
                Json::Object(map) => map,
                _ => Map::new(),
            },
            options_declared: false,
        };
        let grown = names
            .iter()
            .enumerate()
            .map(|(i, n)| (InputDef { name: format!("{name}.{n}"), ..template.clone() }, i < min))
            .collect();
        self.grown.push((name.to_owned(), grown));
        self.input(declared)
    }
}

/// One option of a V3 `DynamicCombo` input: its key and the inputs it brings.
#[derive(Debug, Clone)]
pub struct DynamicOption<'a> {
    /// The choice.
    pub key: &'a str,
    /// The inputs the choice requires.
    pub required: Vec<InputDef>,
    /// The inputs the choice may take.
    pub optional: Vec<InputDef>,
}
