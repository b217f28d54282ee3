//! [`Hook`]: the optional engine hooks a plugin may declare in
//! `initialize`'s `capabilities`, one variant per JSON-RPC method name.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An optional hook of the plugin protocol (`docs/plugin-protocol.md`);
/// its serde and [`as_str`](Hook::as_str) form is the method name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// `update_from_response`: the usage of a provider call.
    UpdateFromResponse,
    /// `should_compress`: whether compaction fires.
    ShouldCompress,
    /// `should_compress_info`: the same, with a block reason.
    ShouldCompressInfo,
    /// `compress`: the compaction itself.
    Compress,
    /// `select_context`: replace one request's context.
    SelectContext,
    /// `prune_tool_results_only`: the proactive prune.
    PruneToolResultsOnly,
    /// `on_turn_complete`: a finished turn.
    OnTurnComplete,
    /// `should_compress_preflight`: the cheap check before a call.
    ShouldCompressPreflight,
    /// `should_defer_preflight_to_real_usage`.
    ShouldDeferPreflightToRealUsage,
    /// `has_content_to_compress`: the manual compaction guard.
    HasContentToCompress,
    /// `on_session_start`.
    OnSessionStart,
    /// `on_session_end`.
    OnSessionEnd,
    /// `on_session_reset`.
    OnSessionReset,
    /// `handle_tool_call`: one of the plugin's tools.
    HandleToolCall,
    /// `get_status`: extra status fields.
    GetStatus,
    /// `update_model`: a model switch.
    UpdateModel,
}

impl Hook {
    /// Every hook, in the protocol document's order.
    pub const ALL: [Hook; 16] = [
        Hook::UpdateFromResponse,
        Hook::ShouldCompress,
        Hook::ShouldCompressInfo,
        Hook::Compress,
        Hook::SelectContext,
        Hook::PruneToolResultsOnly,
        Hook::OnTurnComplete,
        Hook::ShouldCompressPreflight,
        Hook::ShouldDeferPreflightToRealUsage,
        Hook::HasContentToCompress,
        Hook::OnSessionStart,
        Hook::OnSessionEnd,
        Hook::OnSessionReset,
        Hook::HandleToolCall,
        Hook::GetStatus,
        Hook::UpdateModel,
    ];

    /// The JSON-RPC method name.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::UpdateFromResponse => "update_from_response",
            Hook::ShouldCompress => "should_compress",
            Hook::ShouldCompressInfo => "should_compress_info",
            Hook::Compress => "compress",
            Hook::SelectContext => "select_context",
            Hook::PruneToolResultsOnly => "prune_tool_results_only",
            Hook::OnTurnComplete => "on_turn_complete",
            Hook::ShouldCompressPreflight => "should_compress_preflight",
            Hook::ShouldDeferPreflightToRealUsage => "should_defer_preflight_to_real_usage",
            Hook::HasContentToCompress => "has_content_to_compress",
            Hook::OnSessionStart => "on_session_start",
            Hook::OnSessionEnd => "on_session_end",
            Hook::OnSessionReset => "on_session_reset",
            Hook::HandleToolCall => "handle_tool_call",
            Hook::GetStatus => "get_status",
            Hook::UpdateModel => "update_model",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A capability name that is not a hook of this protocol version.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown hook `{0}`")]
pub struct UnknownHook(pub String);

impl FromStr for Hook {
    type Err = UnknownHook;

    fn from_str(s: &str) -> Result<Hook, UnknownHook> {
        Hook::ALL
            .into_iter()
            .find(|h| h.as_str() == s)
            .ok_or_else(|| UnknownHook(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for hook in Hook::ALL {
            assert_eq!(hook.as_str().parse::<Hook>(), Ok(hook));
            assert_eq!(
                serde_json::to_value(hook).unwrap(),
                serde_json::Value::String(hook.as_str().to_owned())
            );
        }
        assert!("telepathy".parse::<Hook>().is_err());
    }
}
