//! Generates the progenitor client (`client/src/generated.rs`) over the shared wire types.
//!
//! progenitor 0.15 cannot take every construct the wire truth needs, so [`lower_for_progenitor`] removes those
//! operations from the copy of the spec it sees; the client crate supplies them by hand. Spectral's
//! `kiln-progenitor-*` rules keep everything else within what progenitor accepts.

use openapiv3::{OpenAPI, Parameter, ParameterSchemaOrContent, ReferenceOr, SchemaKind, Type};
use quote::quote;

use crate::Error;

/// Operations the generated client leaves out, with the reason, and the hand-written method in `kiln-client`
/// that takes their place.
pub const HAND_WRITTEN: &[(&str, &str)] = &[
    ("uploadImage", "multipart/form-data body: `Client::upload_image`"),
    ("uploadMask", "multipart/form-data body: `Client::upload_mask`"),
    ("webSocketConnect", "websocket upgrade (101): `Client::events`"),
    ("mcpPost", "MCP Streamable HTTP: use an MCP client (such as rmcp's) with `<base>/mcp`"),
    ("mcpGet", "MCP Streamable HTTP: use an MCP client (such as rmcp's) with `<base>/mcp`"),
    ("mcpDelete", "MCP Streamable HTTP: use an MCP client (such as rmcp's) with `<base>/mcp`"),
];

/// The one place the spec is changed for progenitor: drops the operations in [`HAND_WRITTEN`] (multipart
/// bodies and the websocket upgrade, which progenitor rejects or cannot call), and the value constraints of
/// string parameters (`pattern`, lengths). progenitor would make a validating newtype for each such parameter
/// in its own `types` module, which the client replaces with kiln-spec's; the server checks them and answers
/// with the operation's error body.
pub fn lower_for_progenitor(spec: &mut OpenAPI) {
    for item in spec.paths.paths.values_mut() {
        let ReferenceOr::Item(item) = item else { continue };
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ] {
            let hand_written = op
                .as_ref()
                .and_then(|op| op.operation_id.as_deref())
                .is_some_and(|id| HAND_WRITTEN.iter().any(|(name, _)| *name == id));
            if hand_written {
                *op = None;
            }
            if let Some(op) = op {
                op.parameters.iter_mut().for_each(drop_string_constraints);
            }
        }
    }
    spec.paths.paths.retain(|_, item| match item {
        ReferenceOr::Item(item) => item.iter().next().is_some(),
        ReferenceOr::Reference { .. } => true,
    });
}

/// Leaves a string parameter's schema a plain string.
fn drop_string_constraints(parameter: &mut ReferenceOr<Parameter>) {
    let ReferenceOr::Item(parameter) = parameter else { return };
    let (Parameter::Query { parameter_data, .. }
    | Parameter::Header { parameter_data, .. }
    | Parameter::Path { parameter_data, .. }
    | Parameter::Cookie { parameter_data, .. }) = parameter;
    if let ParameterSchemaOrContent::Schema(ReferenceOr::Item(schema)) = &mut parameter_data.format
        && let SchemaKind::Type(Type::String(string)) = &mut schema.schema_kind
    {
        string.pattern = None;
        string.min_length = None;
        string.max_length = None;
    }
}

/// Generates the unformatted tokens of the client module.
pub(crate) fn generate(spec: &OpenAPI) -> Result<proc_macro2::TokenStream, Error> {
    let mut lowered = spec.clone();
    lower_for_progenitor(&mut lowered);
    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Positional)
        .with_tag(progenitor::TagStyle::Merged)
        // The same map type as the shared wire types (`kiln_codegen::generate_types`).
        .with_map_type("::indexmap::IndexMap")
        // The client keeps its credentials (`client/src/connect.rs`): HTTP requests carry them as the
        // reqwest client's default headers, the hand-written websocket reads them here.
        .with_inner_type(quote!(crate::Credentials));
    let mut generator = progenitor::Generator::new(&settings);
    let tokens =
        generator.generate_tokens(&lowered).map_err(|e| Error::Progenitor(e.to_string()))?;
    let mut file: syn::File = syn::parse2(tokens).map_err(Error::Parse)?;
    // Share the wire types: drop progenitor's own copy and use kiln-spec's (same typify settings).
    file.items.retain(|item| !matches!(item, syn::Item::Mod(m) if m.ident == "types"));
    let items = file.items;
    Ok(quote! {
        pub use kiln_spec::types;
        #(#items)*
    })
}
