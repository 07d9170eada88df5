//! The spec's operations reduced to what the generators need: parameters, bodies and responses by kind.
//!
//! Building the model is where unsupported constructs are refused with an error naming the operation, so the
//! generators can assume a well-formed spec (Spectral has already checked the conventions).

use heck::{ToSnakeCase, ToUpperCamelCase};
use openapiv3::{
    OpenAPI, Parameter, ParameterSchemaOrContent, ReferenceOr, RequestBody, Schema, SchemaKind,
    StatusCode, Type,
};

use crate::Error;

/// One operation of the spec.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    /// The operationId (camelCase).
    pub(crate) id: String,
    /// The HTTP method, lower case.
    pub(crate) method: String,
    /// The path as written in the spec, with `{param}` segments.
    pub(crate) path: String,
    /// The runtimes that mount it (`local`, `cloud`).
    pub(crate) runtimes: Vec<String>,
    /// Who may call it: alternatives, each the security schemes that must all be satisfied (the operation's
    /// `security`, else the document's). No alternative: anyone; an empty alternative: anyone too.
    pub(crate) security: Vec<Vec<String>>,
    /// The summary, if any.
    pub(crate) summary: Option<String>,
    /// The description.
    pub(crate) description: String,
    /// Path parameters in path order.
    pub(crate) path_params: Vec<Param>,
    /// Query parameters.
    pub(crate) query_params: Vec<Param>,
    /// Header parameters.
    pub(crate) header_params: Vec<Param>,
    /// The request body, if any.
    pub(crate) body: Option<Body>,
    /// Responses sorted by status (none for a raw operation: its handler builds the answer itself).
    pub(crate) responses: Vec<Response>,
    /// `x-kiln-raw`: the handler takes the whole request and answers any `Response` (a protocol served by a
    /// library, such as MCP's Streamable HTTP); the spec still documents its body and answers.
    pub(crate) raw: bool,
}

impl Operation {
    /// The operationId in snake_case: the trait method and client method name.
    pub(crate) fn snake(&self) -> String {
        self.id.to_snake_case()
    }

    /// The operationId in UpperCamelCase, the prefix of generated type names.
    pub(crate) fn camel(&self) -> String {
        self.id.to_upper_camel_case()
    }

    /// Whether the runtime list contains `runtime`.
    pub(crate) fn mounts(&self, runtime: &str) -> bool {
        self.runtimes.iter().any(|r| r == runtime)
    }

    /// The response declared for a status.
    pub(crate) fn response(&self, status: u16) -> Option<&Response> {
        self.responses.iter().find(|r| r.status == status)
    }

    /// Whether this is the websocket upgrade (a 101 response).
    pub(crate) fn is_websocket(&self) -> bool {
        self.response(101).is_some()
    }
}

/// A path, query or header parameter.
#[derive(Debug, Clone)]
pub(crate) struct Param {
    /// The name on the wire.
    pub(crate) name: String,
    /// The Rust identifier.
    pub(crate) rust_name: String,
    /// Its type.
    pub(crate) ty: ParamType,
    /// Whether it must be present.
    pub(crate) required: bool,
    /// The description.
    pub(crate) description: String,
}

/// The type of a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParamType {
    /// A string.
    String,
    /// A 64-bit integer.
    Integer,
    /// A float.
    Number,
    /// A boolean.
    Boolean,
    /// A component schema (an enum), by name.
    Named(String),
}

/// A request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    /// JSON of a component schema. Optional bodies that fail to parse count as absent.
    Json { schema: String, required: bool },
    /// `application/x-www-form-urlencoded` of a component schema.
    Form { schema: String },
    /// `multipart/form-data`, handed to the implementation as a stream of parts.
    Multipart { schema: String },
    /// Raw bytes (`application/octet-stream`).
    Binary,
}

/// A declared response.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// The status code.
    pub(crate) status: u16,
    /// The body.
    pub(crate) content: Content,
    /// Declared response headers.
    pub(crate) headers: Vec<ResponseHeader>,
    /// The description.
    pub(crate) description: String,
}

/// The body of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Content {
    /// No body.
    None,
    /// JSON of a component schema.
    Json(String),
    /// `text/plain`.
    Text,
    /// Bytes with a content type chosen by the implementation.
    Binary,
}

/// A declared response header.
#[derive(Debug, Clone)]
pub(crate) struct ResponseHeader {
    /// The header name on the wire.
    pub(crate) name: String,
    /// The Rust field name.
    pub(crate) rust_name: String,
    /// Whether it is an integer (otherwise a string).
    pub(crate) integer: bool,
    /// The description.
    pub(crate) description: String,
}

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// Reads every operation of the spec, in document order.
pub(crate) fn operations(spec: &OpenAPI) -> Result<Vec<Operation>, Error> {
    let mut out = Vec::new();
    for (path, item) in &spec.paths.paths {
        let ReferenceOr::Item(item) = item else {
            return Err(unsupported(path, "a $ref path item"));
        };
        for method in METHODS {
            let op = match method {
                "get" => &item.get,
                "put" => &item.put,
                "post" => &item.post,
                "delete" => &item.delete,
                "options" => &item.options,
                "head" => &item.head,
                "patch" => &item.patch,
                _ => &item.trace,
            };
            if let Some(op) = op {
                let mut operation = operation(path, method, op)?;
                let security = op.security.as_ref().or(spec.security.as_ref());
                operation.security = security
                    .into_iter()
                    .flatten()
                    .map(|requirement| requirement.keys().cloned().collect())
                    .collect();
                out.push(operation);
            }
        }
    }
    Ok(out)
}

fn unsupported(operation: &str, what: &str) -> Error {
    Error::Unsupported { operation: operation.to_owned(), what: what.to_owned() }
}

fn operation(path: &str, method: &str, op: &openapiv3::Operation) -> Result<Operation, Error> {
    let id = op
        .operation_id
        .clone()
        .ok_or_else(|| unsupported(path, "an operation without operationId"))?;
    let runtimes = op
        .extensions
        .get("x-runtime")
        .and_then(serde_json::Value::as_array)
        .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect::<Vec<_>>())
        .filter(|r| !r.is_empty())
        .ok_or_else(|| unsupported(&id, "a missing x-runtime"))?;

    let mut path_params = Vec::new();
    let mut query_params = Vec::new();
    let mut header_params = Vec::new();
    for parameter in &op.parameters {
        let ReferenceOr::Item(parameter) = parameter else {
            return Err(unsupported(&id, "a $ref parameter"));
        };
        match parameter {
            Parameter::Path { parameter_data, .. } => path_params.push(param(&id, parameter_data)?),
            Parameter::Query { parameter_data, .. } => {
                query_params.push(param(&id, parameter_data)?)
            }
            Parameter::Header { parameter_data, .. } => {
                header_params.push(param(&id, parameter_data)?)
            }
            Parameter::Cookie { .. } => return Err(unsupported(&id, "a cookie parameter")),
        }
    }
    // Path parameters in the order they appear in the path.
    path_params.sort_by_key(|p| path.find(&format!("{{{}}}", p.name)).unwrap_or(usize::MAX));

    // A raw operation's handler takes the whole request and builds its answer: its body and responses are
    // documentation only.
    let raw = op.extensions.get("x-kiln-raw").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let body = match &op.request_body {
        _ if raw => None,
        None => None,
        Some(ReferenceOr::Reference { .. }) => return Err(unsupported(&id, "a $ref request body")),
        Some(ReferenceOr::Item(body)) => Some(request_body(&id, body)?),
    };

    if op.responses.default.is_some() {
        return Err(unsupported(&id, "a default response"));
    }
    let mut responses = Vec::new();
    for (status, response) in op.responses.responses.iter().filter(|_| !raw) {
        let StatusCode::Code(status) = status else {
            return Err(unsupported(&id, "a status range"));
        };
        let ReferenceOr::Item(response) = response else {
            return Err(unsupported(&id, "a $ref response"));
        };
        responses.push(self::response(&id, *status, response)?);
    }
    responses.sort_by_key(|r| r.status);

    Ok(Operation {
        id,
        method: method.to_owned(),
        path: path.to_owned(),
        runtimes,
        security: Vec::new(),
        summary: op.summary.clone(),
        description: op.description.clone().unwrap_or_default(),
        path_params,
        query_params,
        header_params,
        body,
        responses,
        raw,
    })
}

fn param(id: &str, data: &openapiv3::ParameterData) -> Result<Param, Error> {
    let ParameterSchemaOrContent::Schema(schema) = &data.format else {
        return Err(unsupported(id, "a parameter declared with `content`"));
    };
    Ok(Param {
        name: data.name.clone(),
        rust_name: rust_ident(&data.name),
        ty: param_type(id, schema)?,
        required: data.required,
        description: data.description.clone().unwrap_or_default(),
    })
}

fn param_type(id: &str, schema: &ReferenceOr<Schema>) -> Result<ParamType, Error> {
    match schema {
        ReferenceOr::Reference { reference } => Ok(ParamType::Named(schema_name(reference))),
        ReferenceOr::Item(schema) => match &schema.schema_kind {
            SchemaKind::Type(Type::String(_)) => Ok(ParamType::String),
            SchemaKind::Type(Type::Integer(_)) => Ok(ParamType::Integer),
            SchemaKind::Type(Type::Number(_)) => Ok(ParamType::Number),
            SchemaKind::Type(Type::Boolean(_)) => Ok(ParamType::Boolean),
            _ => Err(unsupported(id, "a parameter that is not a string, number, boolean or $ref")),
        },
    }
}

fn request_body(id: &str, body: &RequestBody) -> Result<Body, Error> {
    let mut media = body.content.iter();
    let (Some((media_type, content)), None) = (media.next(), media.next()) else {
        return Err(unsupported(id, "a request body without exactly one media type"));
    };
    let schema = || -> Result<String, Error> {
        match &content.schema {
            Some(ReferenceOr::Reference { reference }) => Ok(schema_name(reference)),
            _ => Err(unsupported(id, "a request body schema that is not a $ref")),
        }
    };
    match media_type.as_str() {
        "application/json" => Ok(Body::Json { schema: schema()?, required: body.required }),
        "application/x-www-form-urlencoded" => Ok(Body::Form { schema: schema()? }),
        "multipart/form-data" => Ok(Body::Multipart { schema: schema()? }),
        "application/octet-stream" => Ok(Body::Binary),
        other => Err(unsupported(id, &format!("a request body of type {other}"))),
    }
}

fn response(id: &str, status: u16, response: &openapiv3::Response) -> Result<Response, Error> {
    let content = if response.content.is_empty() {
        Content::None
    } else if let Some(json) = response.content.get("application/json") {
        if response.content.len() > 1 {
            return Err(unsupported(id, "a JSON response with other media types"));
        }
        match &json.schema {
            Some(ReferenceOr::Reference { reference }) => Content::Json(schema_name(reference)),
            _ => return Err(unsupported(id, "a JSON response schema that is not a $ref")),
        }
    } else if response.content.len() == 1 && response.content.contains_key("text/plain") {
        Content::Text
    } else {
        Content::Binary
    };
    let mut headers = Vec::new();
    for (name, header) in &response.headers {
        let ReferenceOr::Item(header) = header else {
            return Err(unsupported(id, "a $ref response header"));
        };
        let integer = matches!(
            &header.format,
            ParameterSchemaOrContent::Schema(ReferenceOr::Item(Schema {
                schema_kind: SchemaKind::Type(Type::Integer(_)),
                ..
            }))
        );
        headers.push(ResponseHeader {
            name: name.clone(),
            rust_name: rust_ident(name),
            integer,
            description: header.description.clone().unwrap_or_default(),
        });
    }
    Ok(Response { status, content, headers, description: response.description.clone() })
}

/// `#/components/schemas/Name` → `Name`.
pub(crate) fn schema_name(reference: &str) -> String {
    reference.rsplit('/').next().unwrap_or(reference).to_owned()
}

/// A wire name as a Rust identifier: snake_case, with `type` and other keywords suffixed.
pub(crate) fn rust_ident(name: &str) -> String {
    let snake = name.to_snake_case();
    match snake.as_str() {
        "type" | "ref" | "use" | "match" | "move" | "self" | "static" | "struct" | "fn"
        | "impl" => {
            format!("{snake}_")
        }
        _ => snake,
    }
}
