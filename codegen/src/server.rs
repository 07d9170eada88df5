//! Generates the server side of the spec (`server/src/api/generated.rs`): one response enum per operation,
//! query structs, the `Api` trait with one async method per operation, the axum handlers and `router`.
//!
//! The generated code leans on `server/src/api/support.rs` (hand-written) for body parsing, rejections and
//! response building, so the generated text stays declarative. Input that fails to parse is answered with the
//! operation's declared 400 response; an operation whose input can fail without declaring a 400 is refused here.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::Error;
use crate::model::{Body, Content, Operation, ParamType, Response};

/// Generates the unformatted tokens of the server module.
pub(crate) fn generate(ops: &[Operation]) -> Result<TokenStream, Error> {
    let infos = ops.iter().map(operation_info);
    let mut items = Vec::new();
    let mut shared = Vec::new();
    let mut local = Vec::new();
    let mut cloud = Vec::new();
    let mut handlers = Vec::new();
    for op in ops {
        if let Some(query) = query_struct(op) {
            items.push(query);
        }
        if !op.is_websocket() && !op.raw {
            items.push(response_enum(op));
        }
        match trait_of(op)?.to_string().as_str() {
            "SharedApi" => shared.push(trait_method(op)),
            "LocalApi" => local.push(trait_method(op)),
            _ => cloud.push(trait_method(op)),
        }
        handlers.push(handler(op)?);
    }
    let router = router(ops);
    Ok(quote! {
        use std::sync::Arc;

        use axum::extract::{Path, State};
        use axum::http::StatusCode;
        use axum::http::request::Parts;
        use axum::response::{IntoResponse, Response};
        use axum::routing::MethodRouter;
        use axum::Router;
        use bytes::Bytes;
        use kiln_spec::types;

        use super::support::{self, Binary, OperationInfo, Runtime};

        /// Every operation of the spec, in document order.
        pub const OPERATIONS: &[OperationInfo] = &[#(#infos),*];

        #(#items)*

        /// The operations both runtimes serve (`x-runtime: [local, cloud]`), one method each.
        ///
        /// Each method receives the request's `Parts` (headers, extensions), its typed parameters and body, and
        /// answers with the operation's response enum, whose variants are exactly the statuses the spec declares.
        pub trait SharedApi: Send + Sync + 'static {
            #(#shared)*
        }

        /// The operations only the local runtime serves (`x-runtime: [local]`).
        pub trait LocalApi: Send + Sync + 'static {
            #(#local)*
        }

        /// The operations only the cloud runtime serves (`x-runtime: [cloud]`).
        pub trait CloudApi: Send + Sync + 'static {
            #(#cloud)*
        }

        #(#handlers)*

        #router
    })
}

/// The trait an operation's method belongs to, by its runtimes.
fn trait_of(op: &Operation) -> Result<proc_macro2::Ident, Error> {
    let name = match (op.mounts("local"), op.mounts("cloud")) {
        (true, true) => "SharedApi",
        (true, false) => "LocalApi",
        (false, true) => "CloudApi",
        (false, false) => {
            return Err(Error::Unsupported {
                operation: op.id.clone(),
                what: "an x-runtime with neither local nor cloud".to_owned(),
            });
        }
    };
    Ok(format_ident!("{}", name))
}

fn operation_info(op: &Operation) -> TokenStream {
    let id = &op.id;
    let method = op.method.to_uppercase();
    let path = &op.path;
    let runtimes = &op.runtimes;
    let security = op.security.iter().map(|schemes| quote! { &[#(#schemes),*] });
    quote! {
        OperationInfo {
            id: #id,
            method: #method,
            path: #path,
            runtimes: &[#(#runtimes),*],
            security: &[#(#security),*],
        }
    }
}

fn param_type(ty: &ParamType) -> TokenStream {
    match ty {
        ParamType::String => quote!(String),
        ParamType::Integer => quote!(i64),
        ParamType::Number => quote!(f64),
        ParamType::Boolean => quote!(bool),
        ParamType::Named(name) => {
            let name = format_ident!("{}", name);
            quote!(types::#name)
        }
    }
}

fn query_struct_name(op: &Operation) -> proc_macro2::Ident {
    format_ident!("{}Query", op.camel())
}

fn query_struct(op: &Operation) -> Option<TokenStream> {
    if op.query_params.is_empty() {
        return None;
    }
    let name = query_struct_name(op);
    let fields = op.query_params.iter().map(|p| {
        let field = format_ident!("{}", p.rust_name);
        let wire = &p.name;
        let doc = &p.description;
        let ty = param_type(&p.ty);
        if p.required {
            quote! { #[doc = #doc] #[serde(rename = #wire)] pub #field: #ty, }
        } else {
            quote! { #[doc = #doc] #[serde(rename = #wire, default)] pub #field: Option<#ty>, }
        }
    });
    let doc = format!("The query parameters of `{}`.", op.id);
    Some(quote! {
        #[doc = #doc]
        #[derive(Debug, Clone, Default, serde::Deserialize)]
        pub struct #name { #(#fields)* }
    })
}

/// The variant name of a status code.
fn status_variant(status: u16) -> proc_macro2::Ident {
    let name = match status {
        200 => "Ok",
        201 => "Created",
        202 => "Accepted",
        204 => "NoContent",
        302 => "Found",
        303 => "SeeOther",
        304 => "NotModified",
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        413 => "PayloadTooLarge",
        415 => "UnsupportedMediaType",
        422 => "UnprocessableEntity",
        429 => "TooManyRequests",
        500 => "InternalServerError",
        503 => "ServiceUnavailable",
        other => return format_ident!("Status{}", other),
    };
    format_ident!("{}", name)
}

fn payload_type(content: &Content) -> Option<TokenStream> {
    match content {
        Content::None => None,
        Content::Json(schema) => {
            let schema = format_ident!("{}", schema);
            Some(quote!(types::#schema))
        }
        Content::Text => Some(quote!(String)),
        Content::Binary => Some(quote!(Binary)),
    }
}

fn response_enum_name(op: &Operation) -> proc_macro2::Ident {
    format_ident!("{}Response", op.camel())
}

fn response_enum(op: &Operation) -> TokenStream {
    let name = response_enum_name(op);
    let variants = op.responses.iter().map(|r| {
        let variant = status_variant(r.status);
        let doc = format!("{}: {}", r.status, r.description);
        let payload = payload_type(&r.content);
        if r.headers.is_empty() {
            match payload {
                Some(ty) => quote! { #[doc = #doc] #variant(#ty), },
                None => quote! { #[doc = #doc] #variant, },
            }
        } else {
            let body = payload.map(|ty| {
                quote! { /// The body.
                body: #ty, }
            });
            let headers = r.headers.iter().map(|h| {
                let field = format_ident!("{}", h.rust_name);
                let doc = format!("`{}`: {}", h.name, h.description);
                let ty = if h.integer { quote!(i64) } else { quote!(String) };
                quote! { #[doc = #doc] #field: Option<#ty>, }
            });
            quote! { #[doc = #doc] #variant { #body #(#headers)* }, }
        }
    });
    let arms = op.responses.iter().map(response_arm);
    let doc = format!("The responses of `{}` (`{} {}`).", op.id, op.method.to_uppercase(), op.path);
    quote! {
        #[doc = #doc]
        #[derive(Debug)]
        pub enum #name { #(#variants)* }

        impl IntoResponse for #name {
            fn into_response(self) -> Response {
                match self { #(#arms)* }
            }
        }
    }
}

fn body_to_response(content: &Content, status: &TokenStream) -> TokenStream {
    match content {
        Content::None => quote! { #status.into_response() },
        Content::Json(_) => quote! { support::json(#status, &body) },
        Content::Text => quote! { support::text(#status, body) },
        Content::Binary => quote! { body.into_response_with(#status) },
    }
}

fn response_arm(r: &Response) -> TokenStream {
    let variant = status_variant(r.status);
    let code = r.status;
    let status =
        quote! { StatusCode::from_u16(#code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR) };
    let build = body_to_response(&r.content, &status);
    let has_body = r.content != Content::None;
    if r.headers.is_empty() {
        return if has_body {
            quote! { Self::#variant(body) => #build, }
        } else {
            quote! { Self::#variant => #build, }
        };
    }
    let fields: Vec<_> = r.headers.iter().map(|h| format_ident!("{}", h.rust_name)).collect();
    let names = r.headers.iter().map(|h| h.name.as_str());
    let body_field = has_body.then(|| quote!(body,));
    quote! {
        Self::#variant { #body_field #(#fields),* } => {
            let mut response = #build;
            #( support::set_header(&mut response, #names, #fields); )*
            response
        }
    }
}

/// The arguments of a trait method after `parts`, as (name, type) pairs.
fn method_args(op: &Operation) -> Vec<(proc_macro2::Ident, TokenStream)> {
    let mut args = Vec::new();
    for p in &op.path_params {
        args.push((format_ident!("{}", p.rust_name), param_type(&p.ty)));
    }
    if !op.query_params.is_empty() {
        let query = query_struct_name(op);
        args.push((format_ident!("query"), quote!(#query)));
    }
    for p in &op.header_params {
        let ty = param_type(&p.ty);
        let ty = if p.required { ty } else { quote!(Option<#ty>) };
        args.push((format_ident!("{}", p.rust_name), ty));
    }
    if op.is_websocket() {
        args.push((format_ident!("upgrade"), quote!(axum::extract::ws::WebSocketUpgrade)));
    }
    match &op.body {
        None => {}
        Some(Body::Json { schema, required }) => {
            let schema = format_ident!("{}", schema);
            let ty =
                if *required { quote!(types::#schema) } else { quote!(Option<types::#schema>) };
            args.push((format_ident!("body"), ty));
        }
        Some(Body::Form { schema }) => {
            let schema = format_ident!("{}", schema);
            args.push((format_ident!("body"), quote!(types::#schema)));
        }
        Some(Body::Multipart { .. }) => {
            args.push((format_ident!("body"), quote!(axum::extract::Multipart)))
        }
        Some(Body::Binary) => args.push((format_ident!("body"), quote!(Bytes))),
    }
    args
}

fn trait_method(op: &Operation) -> TokenStream {
    let name = format_ident!("{}", op.snake());
    let args: Vec<TokenStream> = if op.raw {
        vec![quote! { request: axum::extract::Request }]
    } else {
        let args = method_args(op).into_iter().map(|(n, t)| quote! { #n: #t });
        std::iter::once(quote! { parts: Parts }).chain(args).collect()
    };
    let output = if op.is_websocket() || op.raw {
        quote!(Response)
    } else {
        let name = response_enum_name(op);
        quote!(#name)
    };
    let mut doc = String::new();
    if let Some(summary) = &op.summary {
        doc.push_str(summary);
        doc.push_str(".\n\n");
    }
    doc.push_str(op.description.trim());
    doc.push_str(&format!(
        "\n\n`{} {}` (operationId `{}`), `x-runtime: [{}]`.",
        op.method.to_uppercase(),
        op.path,
        op.id,
        op.runtimes.join(", ")
    ));
    quote! {
        #[doc = #doc]
        fn #name(&self, #(#args),*) -> impl Future<Output = #output> + Send;
    }
}

/// How a handler answers input it cannot parse: with the operation's declared 400 response.
fn rejection(op: &Operation) -> Result<TokenStream, Error> {
    let Some(response) = op.response(400) else {
        return Err(Error::Unsupported {
            operation: op.id.clone(),
            what: "input that can fail to parse but no 400 response to answer it with".to_owned(),
        });
    };
    Ok(match &response.content {
        Content::Json(schema) => {
            let schema = format_ident!("{}", schema);
            quote! { support::reject_json::<types::#schema>(problem) }
        }
        Content::Text => quote! { support::reject_text(problem) },
        Content::None | Content::Binary => quote! { support::reject_empty(problem) },
    })
}

fn handler(op: &Operation) -> Result<TokenStream, Error> {
    let handler = format_ident!("handle_{}", op.snake());
    let method = format_ident!("{}", op.snake());
    let bound = trait_of(op)?;
    if op.raw {
        return Ok(quote! {
            async fn #handler<A: #bound>(State(api): State<Arc<A>>, request: axum::extract::Request) -> Response {
                api.#method(request).await
            }
        });
    }
    let mut extractors = vec![quote! { State(api): State<Arc<A>> }];
    let mut steps = Vec::new();
    // `fallible`: input that can fail to parse, which needs a declared 400. `may_reject`: any rejection at all,
    // including string path parameters that are not UTF-8 once decoded (answered 400 without a body when the
    // operation declares no 400).
    let mut fallible = false;
    let mut may_reject = false;

    if !op.path_params.is_empty() {
        let names: Vec<_> =
            op.path_params.iter().map(|p| format_ident!("{}", p.rust_name)).collect();
        let types: Vec<_> = op.path_params.iter().map(|p| param_type(&p.ty)).collect();
        fallible |= op.path_params.iter().any(|p| p.ty != ParamType::String);
        may_reject = true;
        if names.len() == 1 {
            let (name, ty) = (&names[0], &types[0]);
            extractors
                .push(quote! { path: Result<Path<#ty>, axum::extract::rejection::PathRejection> });
            steps.push(quote! {
                let #name = match path { Ok(Path(value)) => value, Err(e) => { return reject(support::Problem::path(e)); } };
            });
        } else {
            extractors.push(quote! { path: Result<Path<(#(#types),*)>, axum::extract::rejection::PathRejection> });
            steps.push(quote! {
                let (#(#names),*) = match path { Ok(Path(value)) => value, Err(e) => { return reject(support::Problem::path(e)); } };
            });
        }
    }
    extractors.push(quote! { parts: Parts });
    if !op.query_params.is_empty() {
        let query = query_struct_name(op);
        let infallible = op.query_params.iter().all(|p| !p.required && p.ty == ParamType::String);
        if infallible {
            // Only optional strings: with first-wins duplicates nothing can fail.
            steps.push(quote! { let query: #query = support::query(&parts).unwrap_or_default(); });
        } else {
            fallible = true;
            steps.push(quote! {
                let query: #query = match support::query(&parts) { Ok(query) => query, Err(problem) => return reject(problem) };
            });
        }
    }
    for p in &op.header_params {
        let name = format_ident!("{}", p.rust_name);
        let wire = &p.name;
        if p.required {
            fallible = true;
            steps.push(quote! {
                let Some(#name) = support::header(&parts, #wire) else {
                    return reject(support::Problem::missing_header(#wire));
                };
            });
        } else {
            steps.push(quote! { let #name = support::header(&parts, #wire); });
        }
    }
    if op.is_websocket() {
        extractors.push(quote! {
            upgrade: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>
        });
        steps.push(quote! {
            let upgrade = match upgrade { Ok(upgrade) => upgrade, Err(rejection) => return rejection.into_response() };
        });
    }
    match &op.body {
        None => {}
        Some(Body::Json { schema, required: true }) => {
            let schema = format_ident!("{}", schema);
            fallible = true;
            extractors.push(quote! { body: Bytes });
            steps.push(quote! {
                let body: types::#schema = match support::json_body(&body) { Ok(body) => body, Err(problem) => return reject(problem) };
            });
        }
        Some(Body::Json { schema, required: false }) => {
            let schema = format_ident!("{}", schema);
            fallible = true;
            extractors.push(quote! { body: Bytes });
            steps.push(quote! {
                let body: Option<types::#schema> = match support::optional_json_body(&body) { Ok(body) => body, Err(problem) => return reject(problem) };
            });
        }
        Some(Body::Form { schema }) => {
            let schema = format_ident!("{}", schema);
            fallible = true;
            extractors.push(quote! { body: Bytes });
            steps.push(quote! {
                let body: types::#schema = match support::form_body(&body) { Ok(body) => body, Err(problem) => return reject(problem) };
            });
        }
        Some(Body::Multipart { .. }) => {
            fallible = true;
            extractors.push(quote! { body: Result<axum::extract::Multipart, axum::extract::multipart::MultipartRejection> });
            steps.push(quote! {
                let body = match body { Ok(body) => body, Err(e) => { return reject(support::Problem::multipart(e)); } };
            });
        }
        Some(Body::Binary) => extractors.push(quote! { body: Bytes }),
    }
    let reject = if fallible || may_reject {
        let rejection = match rejection(op) {
            Ok(rejection) => rejection,
            Err(error) if fallible => return Err(error),
            Err(_) => quote! { support::reject_empty(problem) },
        };
        quote! { let reject = |problem: support::Problem| -> Response { #rejection }; }
    } else {
        quote! {}
    };
    let args = method_args(op).into_iter().map(|(name, _)| name);
    let call = if op.is_websocket() {
        quote! { api.#method(parts, #(#args),*).await }
    } else {
        quote! { api.#method(parts, #(#args),*).await.into_response() }
    };
    Ok(quote! {
        async fn #handler<A: #bound>(#(#extractors),*) -> Response {
            #reject
            #(#steps)*
            #call
        }
    })
}

/// The alias a local route is also served at: `/api/X` ↔ `/X`, and `/ws` ↔ `/api/ws`.
fn alias(op: &Operation) -> Option<String> {
    if !op.mounts("local") {
        return None;
    }
    if let Some(bare) = op.path.strip_prefix("/api") {
        return Some(bare.to_owned());
    }
    (op.path == "/ws").then(|| "/api/ws".to_owned())
}

fn router(ops: &[Operation]) -> TokenStream {
    let local = runtime_router(ops, "local");
    let cloud = runtime_router(ops, "cloud");
    quote! {
        /// The routes of the local runtime: every operation whose `x-runtime` contains `local`.
        ///
        /// Local routes documented as `/api/X` are also served at `/X` (and `/ws` at `/api/ws`), as ComfyUI does.
        /// JSON bodies are parsed whatever the `Content-Type` says.
        pub fn local_router<A: SharedApi + LocalApi>(api: Arc<A>) -> Router {
            #local
        }

        /// The routes of the cloud runtime: every operation whose `x-runtime` contains `cloud`.
        pub fn cloud_router<A: SharedApi + CloudApi>(api: Arc<A>) -> Router {
            #cloud
        }

        /// The routes of `runtime`, for an implementation of every operation.
        pub fn router<A: SharedApi + LocalApi + CloudApi>(runtime: Runtime, api: Arc<A>) -> Router {
            match runtime {
                Runtime::Local => local_router(api),
                Runtime::Cloud => cloud_router(api),
            }
        }
    }
}

/// The body of a runtime's router function: its operations grouped by path, with the bare aliases.
fn runtime_router(ops: &[Operation], runtime: &str) -> TokenStream {
    let mounted: Vec<&Operation> = ops.iter().filter(|op| op.mounts(runtime)).collect();
    let mut paths: Vec<&str> = Vec::new();
    for op in &mounted {
        if !paths.contains(&op.path.as_str()) {
            paths.push(&op.path);
        }
    }
    let blocks = paths.iter().map(|path| {
        let on_path: Vec<&&Operation> = mounted.iter().filter(|op| op.path == *path).collect();
        let methods = on_path.iter().map(|op| {
            let method = format_ident!("{}", op.method);
            let handler = format_ident!("handle_{}", op.snake());
            quote! { .#method(#handler::<A>) }
        });
        let alias = on_path
            .iter()
            .find_map(|op| alias(op))
            .map(|alias| quote! { .route(#alias, route.clone()) });
        quote! {
            let route: MethodRouter<Arc<A>> = MethodRouter::new() #(#methods)*;
            let router = router #alias .route(#path, route);
        }
    });
    quote! {
        let router: Router<Arc<A>> = Router::new();
        #(#blocks)*
        router.with_state(api)
    }
}
