//! The HTTP surface generated from `spec/openapi.yaml`: the `Api` trait, its response enums, and `router`.
//!
//! `generated.rs` is written by `kiln-codegen` and never edited by hand; `support.rs` is its hand-written
//! runtime; `document.rs` builds the OpenAPI document a runtime serves. Implementations of the traits (`SharedApi`, `LocalApi`, `CloudApi`) live elsewhere in the server (and in tests).

mod document;
mod failure;
#[allow(clippy::all, missing_docs, unused_imports, unreachable_pub)]
mod generated;
mod requests;
mod strict;
mod support;

pub use document::{DocumentError, document};
pub(crate) use failure::{internal, internal_prompt_error};
pub(crate) use strict::from_value as strict_from_value;

pub use generated::*;
pub use requests::{bearer, operation, refuse};
#[allow(unused_imports)]
// Used by the local runtime (tests today; its handlers with the server issue).
pub(crate) use support::integral_floats_as_ints;
pub use support::{Binary, OperationInfo, Problem, RejectionBody, Runtime};
