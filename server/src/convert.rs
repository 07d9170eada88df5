//! Conversions from the engine's types to the wire types: node declarations to `NodeInfo` (object_info),
//! validation results to ComfyUI's error shape, and node failures to ComfyUI's exception names (`failure.rs`).
//! The engine knows nothing of the wire; this is where its values become the spec's types.

mod failure;

use kiln_engine::graph::{NodeErrors, PromptRejection, ValidationError};
use kiln_engine::nodes::{FileKind, InputDef, NodeSpec};
use kiln_spec::types;

pub(crate) use failure::{exception_message, exception_type};

/// `object_info` of one node class, in ComfyUI's NodeInfo shape: `[TYPE]` for inputs without options,
/// `[TYPE, options]` otherwise; output names default to the types; every always-present flag is present.
pub(crate) fn node_info(spec: &NodeSpec) -> types::NodeInfo {
    let input_spec = |def: &InputDef| {
        let mut elements = vec![types::InputSpecElement(def.ty.to_json())];
        if !def.options.is_empty() {
            elements.push(types::InputSpecElement(serde_json::Value::Object(def.options.clone())));
        }
        types::InputSpec(elements)
    };
    let names =
        |defs: &[InputDef]| types::StringList(defs.iter().map(|d| d.name.clone()).collect());
    let mut input_order = kiln_spec::IndexMap::new();
    if !spec.required.is_empty() {
        input_order.insert("required".to_owned(), names(&spec.required));
    }
    if !spec.optional.is_empty() {
        input_order.insert("optional".to_owned(), names(&spec.optional));
    }
    if !spec.hidden.is_empty() {
        input_order.insert(
            "hidden".to_owned(),
            types::StringList(spec.hidden.iter().map(|h| h.0.clone()).collect()),
        );
    }
    types::NodeInfo {
        api_node: None,
        category: spec.category.clone(),
        deprecated: None,
        description: spec.description.clone(),
        dev_only: None,
        display_name: spec.display_name.clone(),
        essentials_category: spec.essentials_category.clone(),
        experimental: None,
        has_intermediate_output: false,
        input: types::NodeInputs {
            hidden: spec
                .hidden
                .iter()
                .map(|(name, kind)| (name.clone(), kind.kind().to_owned()))
                .collect(),
            optional: spec.optional.iter().map(|d| (d.name.clone(), input_spec(d))).collect(),
            required: spec.required.iter().map(|d| (d.name.clone(), input_spec(d))).collect(),
        },
        input_order,
        is_input_list: spec.is_input_list,
        name: spec.name.clone(),
        output: spec.outputs.iter().map(|o| types::NodeType::String(o.ty.clone())).collect(),
        output_is_list: spec.outputs.iter().map(|o| o.is_list).collect(),
        output_name: spec.outputs.iter().map(|o| o.name.clone()).collect(),
        output_node: spec.output_node,
        output_tooltips: if spec.outputs.iter().any(|o| o.tooltip.is_some()) {
            spec.outputs.iter().map(|o| o.tooltip.clone().unwrap_or_default()).collect()
        } else {
            Vec::new()
        },
        python_module: spec.python_module.clone(),
        search_aliases: spec.search_aliases.clone(),
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
