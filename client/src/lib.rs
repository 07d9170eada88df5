//! The Rust SDK for Kiln and other ComfyUI-compatible servers.
//!
//! The typed HTTP client is generated from `spec/openapi.yaml` by `kiln-codegen`; hand-written extras
//! (multipart upload, the websocket event stream, `run_prompt`) sit beside it. Today the crate exposes the wire
//! types every request and response uses, shared with the server so the two cannot drift.

#![deny(missing_docs)]

pub use kiln_spec::types;
