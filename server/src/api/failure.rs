//! Failures of Kiln itself (a store, a disk, a task), as opposed to bad requests: each is logged once, here, with
//! its cause, and answered with a 500 the operation declares, whose message says what failed without the
//! cause's internals.

use std::fmt::Display;

use kiln_spec::types;

/// Logs `cause` once under `what` failed, and gives the `ErrorResponse` (code `internal`) to answer with.
pub(crate) fn internal(what: &str, cause: impl Display) -> types::ErrorResponse {
    tracing::error!(%cause, "{what} failed");
    types::ErrorResponse {
        code: "internal".to_owned(),
        details: None,
        message: format!("{what} failed; the server log has the cause"),
    }
}

/// [`internal`] in the shape of `POST /api/prompt`'s errors (error type `internal`).
pub(crate) fn internal_prompt_error(what: &str, cause: impl Display) -> types::PromptErrorResponse {
    let body = internal(what, cause);
    types::PromptErrorResponse {
        error: types::PromptError {
            details: String::new(),
            extra_info: Default::default(),
            message: body.message,
            type_: body.code,
        },
        node_errors: Default::default(),
    }
}
