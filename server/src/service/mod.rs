//! The application service both runtimes serve (the cloud runtime through the caller's workspace): its
//! shared state and worker ([`worker::Service`], `worker.rs`), its implementation of the generated traits
//! (`api.rs`, `api_local.rs`), prompts (`prompts.rs`), prompt numbers (`numbering.rs`), the history and jobs
//! views, model folders and user data.

pub(crate) mod api;
pub(crate) mod api_key;
mod api_local;
pub(crate) mod history;
pub(crate) mod jobs;
mod models;
pub(crate) mod numbering;
mod prompts;
pub(crate) mod queued;
mod userdata;
pub(crate) mod worker;

#[cfg(test)]
mod tests;
