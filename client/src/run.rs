//! `run_prompt`: submit a workflow, follow its events to the end, and return its history entry.

use futures::StreamExt as _;

use crate::events::{Event, EventsError};
use crate::{Client, types};

/// A finished prompt.
#[derive(Debug, Clone)]
pub struct PromptRun {
    /// The prompt id.
    pub prompt_id: uuid::Uuid,
    /// Outputs that failed validation and were dropped (the rest ran).
    pub node_errors: kiln_spec::IndexMap<String, types::NodeValidationError>,
    /// The history entry: outputs by node id, status and its messages.
    pub history: types::HistoryEntry,
}

/// Why `run_prompt` failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The event stream could not be opened or broke.
    #[error("event stream failed")]
    Events(#[from] EventsError),
    /// The server rejected or could not take the prompt.
    #[error("submitting the prompt failed")]
    Submit(#[source] progenitor_client::Error<types::PromptErrorResponse>),
    /// A node failed while running.
    #[error("node {} ({}) failed: {}", .0.node_id, .0.node_type, .0.exception_message.trim_end())]
    Execution(Box<types::WsExecutionError>),
    /// The prompt was interrupted.
    #[error("the prompt was interrupted at node {}", .0.node_id)]
    Interrupted(Box<types::WsExecutionInterrupted>),
    /// The event stream ended before the prompt did.
    #[error("the server closed the event stream before the prompt finished")]
    StreamEnded,
    /// The history entry could not be read.
    #[error("reading the history entry failed")]
    History(#[source] progenitor_client::Error<()>),
    /// The server finished the prompt but has no history entry for it.
    #[error("the server has no history entry for prompt {0}")]
    NoHistory(uuid::Uuid),
}

impl Client {
    /// Submits `request` (its `client_id` is set to a fresh id), follows its events until it finishes, and
    /// returns its history entry. A node failure or an interruption is an error.
    pub async fn run_prompt(
        &self,
        mut request: types::PromptRequest,
    ) -> Result<PromptRun, RunError> {
        let client_id = uuid::Uuid::new_v4().simple().to_string();
        let mut events = self.events(&client_id).await?;
        // The server greets every socket with `status`; once it arrives, the socket is registered.
        loop {
            match events.next().await.ok_or(RunError::StreamEnded)?? {
                Event::Message(message)
                    if matches!(*message, types::WsMessage::StatusMessage(_)) =>
                {
                    break;
                }
                _ => continue,
            }
        }
        request.client_id = Some(client_id);
        let accepted =
            self.execute_prompt(None, &request).await.map_err(RunError::Submit)?.into_inner();
        let prompt_id = accepted.prompt_id;
        while let Some(event) = events.next().await {
            let Event::Message(message) = event? else { continue };
            match *message {
                types::WsMessage::ExecutionErrorMessage(m) if m.data.prompt_id == prompt_id => {
                    return Err(RunError::Execution(Box::new(m.data)));
                }
                types::WsMessage::ExecutionInterruptedMessage(m)
                    if m.data.prompt_id == prompt_id =>
                {
                    return Err(RunError::Interrupted(Box::new(m.data)));
                }
                types::WsMessage::ExecutingMessage(m)
                    if m.data.node.is_none() && m.data.prompt_id == Some(prompt_id) =>
                {
                    let history = self
                        .get_history_for_prompt(&prompt_id.to_string())
                        .await
                        .map_err(RunError::History)?
                        .into_inner()
                        .0
                        .shift_remove(&prompt_id.to_string())
                        .ok_or(RunError::NoHistory(prompt_id))?;
                    return Ok(PromptRun { prompt_id, node_errors: accepted.node_errors, history });
                }
                _ => {}
            }
        }
        Err(RunError::StreamEnded)
    }
}
