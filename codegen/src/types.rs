//! Generates the wire types (`spec/src/types.rs`) from the spec's component schemas with typify.
//!
//! The typify settings are progenitor's for its positional interface (`types` module, no struct builders), so
//! the progenitor client can drop its own `types` module and use these instead.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

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
        converted.push((name.clone(), schema));
    }

    let mut settings = TypeSpaceSettings::default();
    settings.with_type_mod("types").with_struct_builder(false);
    let mut type_space = TypeSpace::new(&settings);
    type_space.add_ref_types(converted).map_err(Error::Typify)?;

    crate::format_file(
        type_space.to_stream(),
        "The wire types of every component schema in `spec/openapi.yaml`.",
        repo_root,
    )
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
