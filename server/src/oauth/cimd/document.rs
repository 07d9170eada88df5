//! The client metadata document itself: the JSON rules a fetched body must meet (§5.10 of the OAuth reference).
//!
//! Invariant: a [`ClientMetadataDocument`] describes a public client whose document names itself (`client_id`
//! string-equal to the URL it was fetched from), with a `client_name` and at least one redirect URI; a document
//! that asks for a shared secret in any form never becomes one.

use serde_json::{Map, Value};

/// A validated client metadata document: the fields Kiln uses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientMetadataDocument {
    /// The document's URL, which is the client's id.
    pub(crate) client_id: String,
    /// The client's name, shown on the consent page next to the `client_id` host.
    pub(crate) client_name: String,
    /// The redirect URIs the client may use (at least one), compared by the authorization endpoint.
    pub(crate) redirect_uris: Vec<String>,
    /// The client's home page, when given.
    pub(crate) client_uri: Option<String>,
    /// The client's logo, when given (not fetched by this module).
    pub(crate) logo_uri: Option<String>,
    /// The scopes the client says it uses, when given (informational).
    pub(crate) scope: Option<String>,
    /// `web` or `native`, when given (informational).
    pub(crate) application_type: Option<String>,
}

/// Why a fetched document is not acceptable; shown to the user (never quotes the document).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DocumentProblem {
    /// The body is not JSON.
    #[error("it is not valid JSON")]
    NotJson,
    /// The body is JSON but not an object.
    #[error("it is not a JSON object")]
    NotObject,
    /// `client_id` is missing or not string-equal to the URL.
    #[error("its `client_id` is not exactly the URL it was fetched from")]
    ClientIdMismatch,
    /// `client_name` is missing, empty or not a string.
    #[error("it has no `client_name`")]
    MissingClientName,
    /// `redirect_uris` is missing, empty or not an array.
    #[error("it has no `redirect_uris`")]
    MissingRedirectUris,
    /// An entry of `redirect_uris` is not a non-empty string.
    #[error("an entry of `redirect_uris` is not a URI string")]
    InvalidRedirectUri,
    /// `client_secret` or `client_secret_expires_at` is present.
    #[error("it contains a client secret; client metadata documents describe public clients")]
    ClientSecret,
    /// `token_endpoint_auth_method` names a shared-secret method.
    #[error("its `token_endpoint_auth_method` uses a shared secret; only `none` is accepted")]
    SharedSecretAuthMethod,
    /// `token_endpoint_auth_method` is `private_key_jwt`, which Kiln does not support yet.
    #[error(
        "its `token_endpoint_auth_method` is `private_key_jwt`, which this server does not support; only `none` is accepted"
    )]
    PrivateKeyJwt,
    /// `token_endpoint_auth_method` is something else.
    #[error("its `token_endpoint_auth_method` is not supported; only `none` is accepted")]
    UnsupportedAuthMethod,
    /// An optional field Kiln reads is present but not a string.
    #[error("its `{0}` is not a string")]
    NotAString(&'static str),
}

/// The token endpoint authentication methods that rest on a secret shared with the server.
const SHARED_SECRET_METHODS: &[&str] =
    &["client_secret_post", "client_secret_basic", "client_secret_jwt"];

/// Parses and validates the document fetched from `client_id`.
pub(super) fn parse(
    client_id: &str,
    body: &[u8],
) -> Result<ClientMetadataDocument, DocumentProblem> {
    let value: Value = serde_json::from_slice(body).map_err(|_| DocumentProblem::NotJson)?;
    let Value::Object(fields) = value else { return Err(DocumentProblem::NotObject) };
    if fields.get("client_id").and_then(Value::as_str) != Some(client_id) {
        return Err(DocumentProblem::ClientIdMismatch);
    }
    if fields.contains_key("client_secret") || fields.contains_key("client_secret_expires_at") {
        return Err(DocumentProblem::ClientSecret);
    }
    match optional_string(&fields, "token_endpoint_auth_method")?.as_deref() {
        None | Some("none") => {}
        Some(method) if SHARED_SECRET_METHODS.contains(&method) => {
            return Err(DocumentProblem::SharedSecretAuthMethod);
        }
        Some("private_key_jwt") => return Err(DocumentProblem::PrivateKeyJwt),
        Some(_) => return Err(DocumentProblem::UnsupportedAuthMethod),
    }
    let client_name = match fields.get("client_name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
        _ => return Err(DocumentProblem::MissingClientName),
    };
    let redirect_uris = match fields.get("redirect_uris") {
        Some(Value::Array(uris)) if !uris.is_empty() => uris
            .iter()
            .map(|uri| match uri {
                Value::String(uri) if !uri.is_empty() => Ok(uri.clone()),
                _ => Err(DocumentProblem::InvalidRedirectUri),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(DocumentProblem::MissingRedirectUris),
    };
    Ok(ClientMetadataDocument {
        client_id: client_id.to_owned(),
        client_name,
        redirect_uris,
        client_uri: optional_string(&fields, "client_uri")?,
        logo_uri: optional_string(&fields, "logo_uri")?,
        scope: optional_string(&fields, "scope")?,
        application_type: optional_string(&fields, "application_type")?,
    })
}

/// A string field that may be absent (or `null`).
fn optional_string(
    fields: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<String>, DocumentProblem> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(DocumentProblem::NotAString(name)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{ClientMetadataDocument, DocumentProblem, parse};

    const URL: &str = "https://client.example/oauth/metadata.json";

    /// A minimal valid document for [`URL`], with `change` applied to its fields.
    fn document(change: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Vec<u8> {
        let mut value = json!({
            "client_id": URL,
            "client_name": "Example Client",
            "redirect_uris": ["http://127.0.0.1/callback", "https://client.example/callback"],
        });
        if let Value::Object(fields) = &mut value {
            change(fields);
        }
        value.to_string().into_bytes()
    }

    /// Asserts that the document built with `change` is refused for `problem`.
    fn refused(change: impl FnOnce(&mut serde_json::Map<String, Value>), problem: DocumentProblem) {
        assert_eq!(parse(URL, &document(change)), Err(problem));
    }

    #[test]
    fn a_minimal_document_is_accepted() {
        let parsed = parse(URL, &document(|_| {})).expect("valid document");
        assert_eq!(
            parsed,
            ClientMetadataDocument {
                client_id: URL.to_owned(),
                client_name: "Example Client".to_owned(),
                redirect_uris: vec![
                    "http://127.0.0.1/callback".to_owned(),
                    "https://client.example/callback".to_owned()
                ],
                client_uri: None,
                logo_uri: None,
                scope: None,
                application_type: None,
            }
        );
    }

    #[test]
    fn optional_fields_and_the_none_method_are_read() {
        let parsed = parse(
            URL,
            &document(|f| {
                f.insert("token_endpoint_auth_method".into(), json!("none"));
                f.insert("client_uri".into(), json!("https://client.example"));
                f.insert("logo_uri".into(), json!("https://client.example/logo.png"));
                f.insert("scope".into(), json!("kiln:read kiln:run"));
                f.insert("application_type".into(), json!("native"));
                f.insert("grant_types".into(), json!(["authorization_code", "refresh_token"]));
            }),
        )
        .expect("valid document");
        assert_eq!(parsed.client_uri.as_deref(), Some("https://client.example"));
        assert_eq!(parsed.logo_uri.as_deref(), Some("https://client.example/logo.png"));
        assert_eq!(parsed.scope.as_deref(), Some("kiln:read kiln:run"));
        assert_eq!(parsed.application_type.as_deref(), Some("native"));
    }

    #[test]
    fn the_client_id_must_be_the_url_exactly() {
        refused(|f| drop(f.remove("client_id")), DocumentProblem::ClientIdMismatch);
        refused(
            |f| {
                drop(f.insert("client_id".into(), json!("https://client.example/oauth/other.json")))
            },
            DocumentProblem::ClientIdMismatch,
        );
        refused(
            |f| drop(f.insert("client_id".into(), json!(format!("{URL}/")))),
            DocumentProblem::ClientIdMismatch,
        );
        refused(
            |f| {
                drop(f.insert(
                    "client_id".into(),
                    json!("HTTPS://client.example/oauth/metadata.json"),
                ))
            },
            DocumentProblem::ClientIdMismatch,
        );
    }

    #[test]
    fn secrets_and_shared_secret_methods_are_refused() {
        refused(
            |f| drop(f.insert("client_secret".into(), json!("s3cret"))),
            DocumentProblem::ClientSecret,
        );
        refused(
            |f| drop(f.insert("client_secret_expires_at".into(), json!(0))),
            DocumentProblem::ClientSecret,
        );
        for method in ["client_secret_post", "client_secret_basic", "client_secret_jwt"] {
            refused(
                |f| drop(f.insert("token_endpoint_auth_method".into(), json!(method))),
                DocumentProblem::SharedSecretAuthMethod,
            );
        }
        refused(
            |f| drop(f.insert("token_endpoint_auth_method".into(), json!("private_key_jwt"))),
            DocumentProblem::PrivateKeyJwt,
        );
        refused(
            |f| drop(f.insert("token_endpoint_auth_method".into(), json!("tls_client_auth"))),
            DocumentProblem::UnsupportedAuthMethod,
        );
    }

    #[test]
    fn name_and_redirect_uris_are_required() {
        refused(|f| drop(f.remove("client_name")), DocumentProblem::MissingClientName);
        refused(
            |f| drop(f.insert("client_name".into(), json!("  "))),
            DocumentProblem::MissingClientName,
        );
        refused(|f| drop(f.remove("redirect_uris")), DocumentProblem::MissingRedirectUris);
        refused(
            |f| drop(f.insert("redirect_uris".into(), json!([]))),
            DocumentProblem::MissingRedirectUris,
        );
        refused(
            |f| drop(f.insert("redirect_uris".into(), json!("https://client.example/callback"))),
            DocumentProblem::MissingRedirectUris,
        );
        refused(
            |f| drop(f.insert("redirect_uris".into(), json!([42]))),
            DocumentProblem::InvalidRedirectUri,
        );
        refused(
            |f| drop(f.insert("logo_uri".into(), json!(7))),
            DocumentProblem::NotAString("logo_uri"),
        );
    }

    #[test]
    fn non_objects_are_refused() {
        assert_eq!(parse(URL, b"<html></html>"), Err(DocumentProblem::NotJson));
        assert_eq!(parse(URL, b"[1, 2]"), Err(DocumentProblem::NotObject));
        assert_eq!(parse(URL, b""), Err(DocumentProblem::NotJson));
    }
}
