//! Conversions from the engine's types to the wire types: node declarations to `NodeDefinition` (object_info),
//! validation results to ComfyUI's error shape, and node failures to ComfyUI's exception names (`failure.rs`).
//! The engine knows nothing of the wire; this is where its values become the spec's types.

mod failure;

use kiln_engine::graph::{NodeErrors, PromptRejection, ValidationError};
use kiln_engine::nodes::{FileKind, InputDef, NodeSpec};
use kiln_spec::types;

pub(crate) use failure::{exception_message, exception_type};

/// `object_info` of one node class, in the shape ComfyUI gives its kind of class: V1 or V3 (see `NodeSpec::v3`).
pub(crate) fn node_info(spec: &NodeSpec) -> types::NodeDefinition {
    if spec.v3 { node_info_v3(spec).into() } else { node_info_v1(spec).into() }
}

/// Input names per category, in declaration order.
fn input_order(
    spec: &NodeSpec,
    always_required: bool,
) -> kiln_spec::IndexMap<String, types::StringList> {
    let names =
        |defs: &[InputDef]| types::StringList(defs.iter().map(|d| d.name.clone()).collect());
    let mut order = kiln_spec::IndexMap::new();
    if always_required || !spec.required.is_empty() {
        order.insert("required".to_owned(), names(&spec.required));
    }
    if !spec.optional.is_empty() {
        order.insert("optional".to_owned(), names(&spec.optional));
    }
    if !spec.hidden.is_empty() {
        order.insert(
            "hidden".to_owned(),
            types::StringList(spec.hidden.iter().map(|h| h.0.clone()).collect()),
        );
    }
    order
}

/// `[TYPE, options]`, or `[TYPE]` when the input declares no options and `short` allows it.
fn input_spec(def: &InputDef, short: bool) -> types::InputSpec {
    let mut elements = vec![types::InputSpecElement(def.ty.to_json())];
    if !(short && def.options.is_empty() && !def.options_declared) {
        elements.push(types::InputSpecElement(serde_json::Value::Object(def.options.clone())));
    }
    types::InputSpec(elements)
}

/// A V1 class as `server.py` describes it: `[TYPE]` for inputs without options, `[TYPE, options]` otherwise;
/// output names default to the types; every always-present flag is present, the others only when set.
fn node_info_v1(spec: &NodeSpec) -> types::NodeInfo {
    let declared =
        |defs: &[InputDef]| defs.iter().map(|d| (d.name.clone(), input_spec(d, true))).collect();
    let has_tooltips =
        spec.outputs.iter().any(|o| o.tooltip.is_some()) || !spec.extra_output_tooltips.is_empty();
    types::NodeInfo {
        api_node: None,
        category: spec.category.clone(),
        deprecated: spec.deprecated.then_some(true),
        description: spec.description.clone(),
        dev_only: None,
        display_name: spec.display_name.clone(),
        essentials_category: spec.essentials_category.clone(),
        experimental: spec.experimental.then_some(true),
        has_intermediate_output: false,
        input: types::NodeInputs {
            hidden: spec
                .hidden
                .iter()
                .map(|(name, kind)| (name.clone(), kind.kind().to_owned()))
                .collect(),
            optional: declared(&spec.optional),
            required: declared(&spec.required),
        },
        input_order: input_order(spec, false),
        is_input_list: spec.is_input_list,
        name: spec.name.clone(),
        output: spec.outputs.iter().map(|o| types::NodeType::String(o.ty.clone())).collect(),
        output_is_list: spec.outputs.iter().map(|o| o.is_list).collect(),
        output_name: spec.outputs.iter().map(|o| o.name.clone()).collect(),
        output_node: spec.output_node,
        output_tooltips: if has_tooltips {
            spec.outputs
                .iter()
                .map(|o| o.tooltip.clone().unwrap_or_default())
                .chain(spec.extra_output_tooltips.iter().cloned())
                .collect()
        } else {
            Vec::new()
        },
        python_module: spec.python_module.clone(),
        search_aliases: spec.search_aliases.clone(),
    }
}

/// A V3 class as ComfyUI dumps it: every field present, `null` where the node declares nothing; inputs always
/// `[TYPE, options]`; hidden inputs valued `[KIND]`. Kiln has no developer-only or API nodes and no price
/// badges, so those are `false` or `null`.
fn node_info_v3(spec: &NodeSpec) -> types::NodeInfoV3 {
    let declared =
        |defs: &[InputDef]| defs.iter().map(|d| (d.name.clone(), input_spec(d, false))).collect();
    types::NodeInfoV3 {
        api_node: false,
        category: spec.category.clone(),
        deprecated: spec.deprecated,
        description: spec.description.clone(),
        dev_only: false,
        display_name: spec.declared_display_name().map(str::to_owned),
        essentials_category: spec.essentials_category.clone(),
        experimental: spec.experimental,
        has_intermediate_output: spec.intermediate_output,
        input: types::NodeInputsV3 {
            hidden: spec
                .hidden
                .iter()
                .map(|(name, kind)| (name.clone(), types::StringList(vec![kind.kind().to_owned()])))
                .collect(),
            optional: declared(&spec.optional),
            required: declared(&spec.required),
        },
        input_order: input_order(spec, true),
        is_input_list: spec.is_input_list,
        name: spec.name.clone(),
        output: spec.outputs.iter().map(|o| types::NodeType::String(o.ty.clone())).collect(),
        output_is_list: spec.outputs.iter().map(|o| o.is_list).collect(),
        output_matchtypes: spec
            .outputs
            .iter()
            .any(|o| o.matchtype.is_some())
            .then(|| spec.outputs.iter().map(|o| o.matchtype.clone()).collect()),
        output_name: spec.outputs.iter().map(|o| o.name.clone()).collect(),
        output_node: spec.output_node,
        output_tooltips: spec
            .outputs
            .iter()
            .map(|o| o.tooltip.clone())
            .chain(spec.extra_output_tooltips.iter().cloned().map(Some))
            .collect(),
        price_badge: None,
        python_module: spec.python_module.clone(),
        search_aliases: (!spec.search_aliases.is_empty()).then(|| spec.search_aliases.clone()),
    }
}

/// One validation error.
pub(crate) fn prompt_error(error: &ValidationError) -> types::PromptError {
    types::PromptError {
        details: error.details.clone(),
        extra_info: (*error.extra_info).clone(),
        message: error.message.clone(),
        type_: error.kind.clone(),
    }
}

/// Per-node validation errors keyed by node id.
pub(crate) fn node_errors<'a>(
    errors: impl IntoIterator<Item = (&'a kiln_engine::graph::NodeId, &'a NodeErrors)>,
) -> kiln_spec::IndexMap<String, types::NodeValidationError> {
    errors
        .into_iter()
        .map(|(id, e)| {
            let converted = types::NodeValidationError {
                class_type: e.class_type.clone(),
                dependent_outputs: e.dependent_outputs.iter().map(|o| o.0.clone()).collect(),
                errors: e.errors.iter().map(prompt_error).collect(),
            };
            (id.0.clone(), converted)
        })
        .collect()
}

/// The 400 body of a rejected prompt.
pub(crate) fn rejection(rejection: &PromptRejection) -> types::PromptErrorResponse {
    types::PromptErrorResponse {
        error: prompt_error(&rejection.error),
        node_errors: node_errors(&rejection.node_errors),
    }
}

#[cfg(test)]
mod tests;

/// A wire `type` (`input`, `output`, `temp`) as the engine's root kind.
pub(crate) fn file_kind(file_type: types::FileType) -> FileKind {
    match file_type {
        types::FileType::Input => FileKind::Input,
        types::FileType::Output => FileKind::Output,
        types::FileType::Temp => FileKind::Temp,
    }
}

/// The engine's root kind as a wire `type`.
pub(crate) fn file_type(kind: FileKind) -> types::FileType {
    match kind {
        FileKind::Input => types::FileType::Input,
        FileKind::Output => types::FileType::Output,
        FileKind::Temp => types::FileType::Temp,
    }
}
