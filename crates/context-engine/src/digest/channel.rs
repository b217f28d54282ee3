//! [`ToolChannel`]: whether the agent of a session calls tools, so that
//! what the engine writes into its request names the engine's tools
//! (`context_recall`, `context_expand`, `context_search`) only where the
//! agent can call them.

use serde::{Deserialize, Serialize};

use super::names_recall_handle;
use crate::message::Message;
use crate::validate::{TextActions, observation_with};

/// How the agent reading a request reaches what left it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChannel {
    /// The agent calls tools (the engine's are offered beside its own):
    /// notes name the engine's tools and the handle to pass them.
    #[default]
    Tools,
    /// A text-action agent: it writes its actions as text and its requests
    /// carry no tools, so the engine offers none of its own (`ctx serve`
    /// offers them only beside the request's own tools). Notes say only
    /// that the content was archived, and retention counts nothing as
    /// recallable.
    TextActions,
}

impl ToolChannel {
    /// The channel `messages` (a session's history) show: [`TextActions`]
    /// when they hold a text-action observation (under `actions`) and no
    /// tool call, tool result or tool-result envelope; else [`Tools`] (a
    /// history with neither keeps the tools a host may offer it).
    ///
    /// [`TextActions`]: ToolChannel::TextActions
    /// [`Tools`]: ToolChannel::Tools
    pub fn of(messages: &[Message], actions: &TextActions) -> ToolChannel {
        let mut text_actions = false;
        for (i, m) in messages.iter().enumerate() {
            if names_recall_handle(m) || m.has_tool_calls() || m.function_call.is_some() {
                return ToolChannel::Tools;
            }
            text_actions = text_actions || observation_with(messages, i, actions).is_some();
        }
        if text_actions {
            ToolChannel::TextActions
        } else {
            ToolChannel::Tools
        }
    }

    /// Whether the agent can call the engine's tools.
    pub fn calls_tools(self) -> bool {
        self == ToolChannel::Tools
    }
}
