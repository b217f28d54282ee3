//! Provider rules and safe cut points: the one place that knows what a
//! chat-completions request may look like, and (in [`anthropic`] and
//! [`responses`]) what an Anthropic Messages or OpenAI Responses request
//! may look like, on their own lossless models.
//!
//! Two questions are answered here, from the same set of rules:
//!
//! * [`validate`]: is this transcript a request a provider accepts? Every
//!   violation is reported (not just the first), with its message index, a
//!   [`Rule`] with a stable kebab-case name, and a human detail.
//! * [`CutPoints`]: where may an engine cut it? A *boundary* `i` (for
//!   `0 <= i <= len`) is the gap before message `i`; it is *safe* when a kept
//!   tail may start at `i` and a kept head may end just before `i`.
//!
//! Each rule is a [`Property`] (after OpenHands' `View` properties): it
//! reports its violations and names the boundaries a cut must not use. A
//! [`Profile`] is a list of properties, and [`CutPoints`] intersects what they
//! allow, so adding a rule updates both answers at once.
//!
//! # The invariant
//!
//! If `validate(m, p)` is empty and `a <= b` are both safe boundaries of
//! `CutPoints::with_profile(m, p)`, then `m[..a] ++ m[b..]` (the range
//! `a..b` removed) is also accepted by `validate(_, Profile::OpenAi)`. Under
//! [`Profile::Strict`] the same holds when [`CutPoints::can_remove`]`(a, b)`,
//! because role alternation depends on which two messages meet at the join,
//! not on either boundary alone. Boundaries `0` and `len` are always safe.
//! This is checked by a property test over generated transcripts.
//!
//! Concretely, the atomic units that a safe boundary never splits are: an
//! assistant message that calls tools together with all of its results (a
//! kept tail never starts on a tool result), and an assistant turn followed by
//! a *tool re-entry*: a user message that carries text tool-result
//! envelopes (see [`is_tool_reentry`]) or the observation of a text-action
//! agent (the output of the action the assistant wrote as text, see
//! [`observation`] and [`is_reentry_at`]).
//!
//! Everything here is O(n) in the number of messages (plus the length of the
//! user texts scanned for envelopes): engines call it on every compaction of
//! transcripts with thousands of messages.

pub mod anthropic;
mod cut;
pub mod envelope;
pub(crate) mod observation;
mod pairing;
mod place;
mod reentry;
pub mod responses;
mod strict;
mod wire;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::message::Message;

pub use cut::{CutPoints, atomic_groups};
pub use envelope::ENVELOPE_HEADER;
pub use observation::{
    Observation, TextAction, TextActions, TextActionsConfig, TextActionsError, TextActionsMode,
    auto_text_actions, observation_with, text_action,
};
pub use pairing::{ToolCallShape, ToolResultPairing};
pub use place::{introduced_adjacency, may_join, may_place};
pub use reentry::{is_real_user_turn, is_reentry_with, is_tool_reentry, reentries_with};
pub use strict::StrictAlternation;
pub use wire::{InternalKeys, KnownRoles};

/// Which provider's rules to check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// OpenAI chat completions (and the many servers that copy it).
    #[default]
    OpenAi,
    /// Anthropic-like: additionally, the conversation starts with a user
    /// message and roles alternate (tool results count as a user turn).
    Strict,
}

impl Profile {
    /// Every profile, for help texts and tests.
    pub const ALL: [Profile; 2] = [Profile::OpenAi, Profile::Strict];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Profile::OpenAi => "openai",
            Profile::Strict => "strict",
        }
    }

    /// The properties this profile checks, in reporting order.
    pub fn properties(self) -> &'static [&'static dyn Property] {
        const OPENAI: &[&dyn Property] = &[
            &KnownRoles,
            &InternalKeys,
            &ToolCallShape,
            &ToolResultPairing,
        ];
        const STRICT: &[&dyn Property] = &[
            &KnownRoles,
            &InternalKeys,
            &ToolCallShape,
            &ToolResultPairing,
            &StrictAlternation,
        ];
        match self {
            Profile::OpenAi => OPENAI,
            Profile::Strict => STRICT,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A profile name that is neither `openai` nor `strict`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile `{given}` (expected `openai` or `strict`)")]
pub struct UnknownProfile {
    /// The name as given.
    pub given: String,
}

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Profile, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProfile {
                given: s.to_owned(),
            })
    }
}

/// A provider rule. The kebab-case [`Rule::name`] is stable: CLI output and
/// JSON reports use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// A role the provider does not know (e.g. mini-swe-agent's `exit`).
    UnknownRole,
    /// A key starting with `_` in a message's or tool call's extra fields:
    /// agent bookkeeping that must not reach the provider.
    InternalKey,
    /// An assistant tool call without an `id` (no result can answer it).
    ToolCallWithoutId,
    /// An assistant tool call without a function name.
    ToolCallWithoutName,
    /// A tool-call id used a second time in the transcript.
    DuplicateToolCallId,
    /// A `tool` message without a `tool_call_id`.
    ToolResultWithoutId,
    /// A `tool` message whose id matches no call of its assistant turn.
    OrphanToolResult,
    /// A second result for the same tool call.
    DuplicateToolResult,
    /// A result that answers its call, but with a non-tool message between.
    ToolResultNotAdjacent,
    /// A tool call that no result answers before the next assistant turn or
    /// the end of the transcript.
    UnansweredToolCall,
    /// Strict: the first non-instruction message is not from the user.
    FirstNotUser,
    /// Strict: two consecutive turns with the same role.
    ConsecutiveSameRole,
    /// Anthropic: a `tool_result` block after other content in its message.
    ToolResultNotFirst,
    /// Anthropic: a rewrite changed the thinking blocks of a turn that uses
    /// tools.
    ThinkingChanged,
    /// Responses: a `reasoning` item not followed by the item it belongs to.
    ReasoningNotFollowed,
}

impl Rule {
    /// Every rule, in a fixed order.
    pub const ALL: [Rule; 15] = [
        Rule::UnknownRole,
        Rule::InternalKey,
        Rule::ToolCallWithoutId,
        Rule::ToolCallWithoutName,
        Rule::DuplicateToolCallId,
        Rule::ToolResultWithoutId,
        Rule::OrphanToolResult,
        Rule::DuplicateToolResult,
        Rule::ToolResultNotAdjacent,
        Rule::UnansweredToolCall,
        Rule::FirstNotUser,
        Rule::ConsecutiveSameRole,
        Rule::ToolResultNotFirst,
        Rule::ThinkingChanged,
        Rule::ReasoningNotFollowed,
    ];

    /// The stable kebab-case name (the same as the serde form).
    pub fn name(self) -> &'static str {
        match self {
            Rule::UnknownRole => "unknown-role",
            Rule::InternalKey => "internal-key",
            Rule::ToolCallWithoutId => "tool-call-without-id",
            Rule::ToolCallWithoutName => "tool-call-without-name",
            Rule::DuplicateToolCallId => "duplicate-tool-call-id",
            Rule::ToolResultWithoutId => "tool-result-without-id",
            Rule::OrphanToolResult => "orphan-tool-result",
            Rule::DuplicateToolResult => "duplicate-tool-result",
            Rule::ToolResultNotAdjacent => "tool-result-not-adjacent",
            Rule::UnansweredToolCall => "unanswered-tool-call",
            Rule::FirstNotUser => "first-not-user",
            Rule::ConsecutiveSameRole => "consecutive-same-role",
            Rule::ToolResultNotFirst => "tool-result-not-first",
            Rule::ThinkingChanged => "thinking-changed",
            Rule::ReasoningNotFollowed => "reasoning-not-followed",
        }
    }

    /// Looks a rule up by its [`Rule::name`].
    pub fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule at one message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Index of the offending message in the transcript.
    pub index: usize,
    /// The rule broken.
    pub rule: Rule,
    /// What exactly is wrong, for a human.
    pub detail: String,
}

impl Violation {
    /// A violation of `rule` at message `index`.
    pub fn new(index: usize, rule: Rule, detail: impl Into<String>) -> Violation {
        Violation {
            index,
            rule,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "message {}: {}: {}", self.index, self.rule, self.detail)
    }
}

/// One provider rule, seen both as a check and as a constraint on cuts.
///
/// Implementations must run in O(n): they are called on every compaction.
pub trait Property: Sync {
    /// A short name for diagnostics.
    fn name(&self) -> &'static str;

    /// Appends every violation of this rule in `messages` to `out`.
    fn check(&self, messages: &[Message], out: &mut Vec<Violation>);

    /// Sets `forbidden[i]` for every boundary `i` (`forbidden.len()` is
    /// `messages.len() + 1`) at which a cut could break this rule in a
    /// transcript that satisfies it. Never clears an entry: properties are
    /// intersected by letting each one forbid. The default forbids nothing,
    /// for rules about single messages, which a cut cannot break.
    fn forbid(&self, messages: &[Message], forbidden: &mut [bool]) {
        let _ = (messages, forbidden);
    }
}

/// Every violation of `profile`'s rules in `messages`, ordered by message
/// index (then by rule, in [`Profile::properties`] order). Empty means a
/// provider following that profile accepts the transcript as a request.
pub fn validate(messages: &[Message], profile: Profile) -> Vec<Violation> {
    let mut out = Vec::new();
    for property in profile.properties() {
        property.check(messages, &mut out);
    }
    // Stable: keeps property order within one message.
    out.sort_by_key(|v| v.index);
    out
}

/// The first violation of `profile` in `output` that `input` did not
/// already have (compared rule by rule, by count), or `None`.
///
/// Whoever rewrites a transcript (an engine's compaction, a plugin's
/// result, a request view) must not add a problem, and is not the place to
/// repair one the host sent in: corpus transcripts are often invalid
/// already, so "no new violations" is the contract, not "no violations".
pub fn introduced_violation(
    input: &[Message],
    output: &[Message],
    profile: Profile,
) -> Option<Violation> {
    // A valid output (the common case) adds nothing: the input is then
    // not checked at all.
    let found = validate(output, profile);
    if found.is_empty() {
        return None;
    }
    let mut budget: HashMap<Rule, usize> = HashMap::new();
    for v in validate(input, profile) {
        *budget.entry(v.rule).or_default() += 1;
    }
    found.into_iter().find(|v| match budget.get_mut(&v.rule) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    })
}
