//! The local runtime's state: the history of finished prompts and the jobs view over queue and history.

pub(crate) mod history;
pub(crate) mod jobs;

#[cfg(test)]
mod tests;
