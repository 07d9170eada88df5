//! Generates the wire types (`spec/src/types.rs`) from the spec's component schemas with typify.
//!
//! The typify settings are progenitor's for its positional interface (`types` module, no struct builders), so
//! the progenitor client can drop its own `types` module and use these instead.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use std::collections::HashMap;

use quote::{ToTokens as _, format_ident, quote};
use serde_json::Value;
use typify::{TypeSpace, TypeSpaceSettings};

use crate::Error;
use crate::schema::to_json_schema;

/// Generates the formatted contents of `spec/src/types.rs` from the spec's YAML text.
///
/// `repo_root` locates `rustfmt.toml`, so the output is formatted exactly as `cargo fmt` would.
pub fn generate_types(spec_yaml: &str, repo_root: &Path) -> Result<String, Error> {
    let document: Value = serde_yaml::from_str(spec_yaml).map_err(Error::Yaml)?;
    // Reading the document with openapiv3 proves progenitor will be able to read it too.
    parse_openapi(spec_yaml)?;

    let empty = serde_json::Map::new();
    let schemas =
        document.pointer("/components/schemas").and_then(Value::as_object).unwrap_or(&empty);
    let mut converted = Vec::with_capacity(schemas.len());
    for (name, schema) in schemas {
        let schema: schemars::schema::Schema = serde_json::from_value(to_json_schema(schema))
            .map_err(|source| Error::Schema { name: name.clone(), source })?;
        // A schema kept as raw JSON also gets its typed twin, `<Name>Shape`, which the server reads the raw
        // value into to check it against the spec.
        if RAW_JSON.iter().any(|(raw, _, _)| raw == name) {
            converted.push((shape_name(name), schema.clone()));
        }
        converted.push((name.clone(), schema));
    }

    let mut settings = TypeSpaceSettings::default();
    // Maps are ordered: a JSON object's key order carries meaning on ComfyUI's wire (object_info inputs in
    // declaration order, history oldest first), so a wire map must keep the order it was built or read in.
    settings
        .with_type_mod("types")
        .with_struct_builder(false)
        .with_map_type("::indexmap::IndexMap");
    for (name, _, raw) in RAW_JSON {
        settings.with_replacement(name, raw, std::iter::empty());
    }
    let mut type_space = TypeSpace::new(&settings);
    type_space.add_ref_types(converted).map_err(Error::Typify)?;

    let mut file: syn::File = syn::parse2(type_space.to_stream()).map_err(Error::Parse)?;
    order_fields_as_the_spec(&mut file, &property_orders(schemas));
    let mut tokens = file.into_token_stream();
    for (name, doc, raw) in RAW_JSON {
        let name = format_ident!("{name}");
        let raw = syn::parse_str::<syn::Type>(raw).map_err(Error::Parse)?;
        tokens.extend(quote! {
            #[doc = #doc]
            pub type #name = #raw;
        });
    }
    crate::format_file(
        tokens,
        "The wire types of every component schema in `spec/openapi.yaml`.",
        repo_root,
    )
}

/// The schemas whose Rust type is JSON kept as sent (name, doc of the generated alias, type): what a client
/// sends in them is stored and echoed (history, queue, PNG metadata) with its keys in the client's order, as
/// ComfyUI does, and a generated struct would put them in declaration order. Each also has a typed twin
/// ([`shape_name`]) that checks a raw value against the schema.
const RAW_JSON: [(&str, &str, &str); 2] = [
    (
        "Prompt",
        " An API-format workflow: nodes keyed by id, each node a JSON object (`class_type`, `inputs`, `_meta`;\n \
         see `PromptNode`), kept as the client sent it; `PromptShape` is its typed form.",
        "::indexmap::IndexMap<::std::string::String, ::serde_json::Map<::std::string::String, ::serde_json::Value>>",
    ),
    (
        "ExtraData",
        " Free-form data kept with a prompt (`client_id`, `extra_pnginfo`, `create_time`, ...), kept as the\n \
         client sent it; `ExtraDataShape` is its typed form.",
        "::serde_json::Map<::std::string::String, ::serde_json::Value>",
    ),
];

/// The name of the typed twin of a raw JSON schema: `ExtraData` → `ExtraDataShape`.
fn shape_name(raw: &str) -> String {
    format!("{raw}Shape")
}

/// Each component schema's property names (wire names), in the spec's order (twins included).
fn property_orders(schemas: &serde_json::Map<String, Value>) -> HashMap<String, Vec<String>> {
    let mut orders: HashMap<String, Vec<String>> = schemas
        .iter()
        .filter_map(|(name, schema)| {
            let properties = schema.get("properties")?.as_object()?;
            Some((name.clone(), properties.keys().cloned().collect()))
        })
        .collect();
    for (raw, _, _) in RAW_JSON {
        if let Some(order) = orders.get(raw).cloned() {
            orders.insert(shape_name(raw), order);
        }
    }
    orders
}

/// Puts every generated struct's fields in the order of its schema's properties.
///
/// typify sorts fields by name, and serde writes fields in declaration order, so without this every object
/// would go out with its keys sorted. ComfyUI sends keys in declaration order and clients rely on it (positional
/// arguments bound by the order of `input.required`, for one); the spec lists properties in ComfyUI's order.
/// A struct typify made for a nullable schema is called `<Schema>Inner`.
fn order_fields_as_the_spec(file: &mut syn::File, orders: &HashMap<String, Vec<String>>) {
    for item in &mut file.items {
        let syn::Item::Struct(item) = item else { continue };
        let name = item.ident.to_string();
        let Some(order) = orders.get(&name).or_else(|| orders.get(name.strip_suffix("Inner")?))
        else {
            continue;
        };
        let syn::Fields::Named(fields) = &mut item.fields else { continue };
        let mut sorted: Vec<syn::Field> = std::mem::take(&mut fields.named).into_iter().collect();
        // Fields that are not properties (a flattened map of other keys) go last, as typify puts them.
        sorted.sort_by_key(|field| {
            let wire = wire_name(field);
            order.iter().position(|p| *p == wire).unwrap_or(usize::MAX)
        });
        fields.named = sorted.into_iter().collect();
    }
}

/// A field's JSON name: its `#[serde(rename = "...")]`, or its identifier.
fn wire_name(field: &syn::Field) -> String {
    let mut renamed = None;
    for attribute in field.attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attribute.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                renamed = Some(meta.value()?.parse::<syn::LitStr>()?.value());
            } else if meta.input.peek(syn::Token![=]) {
                meta.value()?.parse::<proc_macro2::TokenStream>()?;
            }
            Ok(())
        });
    }
    renamed.unwrap_or_else(|| {
        field
            .ident
            .as_ref()
            .map(|i| i.to_string().trim_start_matches("r#").to_owned())
            .unwrap_or_default()
    })
}

/// Reads the spec's YAML text as an openapiv3 document.
pub(crate) fn parse_openapi(spec_yaml: &str) -> Result<openapiv3::OpenAPI, Error> {
    let document: Value = serde_yaml::from_str(spec_yaml).map_err(Error::Yaml)?;
    serde_json::from_value(document).map_err(Error::OpenApi)
}

/// Formats Rust source with the workspace's rustfmt configuration.
pub(crate) fn rustfmt(source: &str, repo_root: &Path) -> Result<String, Error> {
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout", "--quiet"])
        .current_dir(repo_root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Rustfmt(format!("cannot start rustfmt: {e}")))?;
    child
        .stdin
        .take()
        .ok_or_else(|| Error::Rustfmt("no stdin".to_owned()))?
        .write_all(source.as_bytes())
        .map_err(|e| Error::Rustfmt(format!("cannot write to rustfmt: {e}")))?;
    let output = child
        .wait_with_output()
        .map_err(|e| Error::Rustfmt(format!("rustfmt did not finish: {e}")))?;
    if !output.status.success() {
        return Err(Error::Rustfmt(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    String::from_utf8(output.stdout)
        .map_err(|e| Error::Rustfmt(format!("output is not UTF-8: {e}")))
}
