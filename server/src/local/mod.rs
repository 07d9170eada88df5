//! The local runtime: its state and worker (`runtime.rs`), its implementation of the generated traits
//! (`api.rs`, `api_local.rs`), prompt numbers (`numbering.rs`), the history and jobs views, model folders and
//! user data.

pub(crate) mod api;
pub(crate) mod api_key;
mod api_local;
pub(crate) mod history;
pub(crate) mod jobs;
mod models;
pub(crate) mod numbering;
mod prompts;
pub(crate) mod queued;
pub(crate) mod runtime;
mod userdata;

#[cfg(test)]
mod tests;
