//! Proactive pruning: a deterministic, LLM-free pass that reclaims re-sent
//! tool output long before a full compaction is due (the engine's
//! `prune_tool_results_only` hook).
//!
//! Every prune changes the request's prefix and so costs the provider's
//! prompt cache, which is why the pass has its own cost trigger: it runs only
//! when the prompt is above [`PruneOptions::proactive_prune_tokens`] (0 =
//! off) and commits only when it frees at least
//! [`PruneOptions::min_reclaim_tokens`]; otherwise it returns the input
//! borrowed and reports 0 pruned.
//!
//! Outside the protected tail (the last [`PruneOptions::protect_last_n`]
//! messages, extended back to a safe boundary of
//! [`crate::validate::CutPoints`], so a tool batch is never split), in order:
//!
//! 1. **Duplicates**: a tool result whose text equals a later result's
//!    becomes a marker naming the newer one by its `tool_call_id`.
//! 2. **Superseded reads**: a result that only shows files (`cat`, `sed -n`,
//!    `head`, `tail` in a shell command; `view`/`open`/`read` file tools) is
//!    stale once a later call reads the same part (or all) of each file, or
//!    edits it (`str_replace_editor`, `edit`, `create`, `sed -i`, `>`).
//! 3. **Re-runs**: a result superseded by a later call of the same tool with
//!    the same arguments (edits excepted).
//! 4. **Large results**: digested exactly as [`crate::digest`] does.
//! 5. **Long arguments**: tool-call arguments longer than
//!    [`PruneOptions::args_max_chars`] have their long string leaves clipped;
//!    valid JSON stays valid JSON and invalid JSON is left alone.
//!
//! A marker keeps the writ and a recall handle, so nothing is lost:
//!
//! ```text
//! [pruned] bash {"command": "cat a.py"} → superseded by call c9 (edit of a.py); full output: context_recall {"handle":"c3"}
//! ```
//!
//! Only content and arguments change: every message, role and
//! `tool_call_id` stays, the output passes [`crate::validate::validate`]
//! whenever the input does, no message costs more tokens than before, and
//! the input is never mutated.
//!
//! ```
//! use context_engine::prune::{PruneOptions, prune};
//! use context_engine::tokens::{BpeCounter, Encoding};
//! use context_engine::{Message, ToolCall};
//!
//! let cat = |id: &str| Message::assistant_tool_calls("", vec![
//!     ToolCall::function(id, "bash", r#"{"command": "cat setup.py"}"#)]);
//! let body = "x = 1\n".repeat(3000);
//! let history = vec![
//!     Message::user("fix the build"),
//!     cat("c1"), Message::tool_result("c1", body.clone()),
//!     cat("c2"), Message::tool_result("c2", body),
//!     Message::user("thanks"),
//! ];
//! let opts = PruneOptions { proactive_prune_tokens: 1000, protect_last_n: 2, ..PruneOptions::default() };
//! let counter = BpeCounter::new(Encoding::O200kBase);
//! let out = prune(&history, None, &opts, &counter);
//! assert_eq!(out.pruned, 1);
//! assert!(out.messages[2].text().starts_with("[pruned] bash"));
//! assert!(out.messages[2].text().contains("same output as call c2"));
//! assert_eq!(out.messages[4], history[4]);
//! ```

mod args;

pub(crate) use args::clip_arguments;
pub(crate) mod effect;

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::PruneConfig;
use crate::digest::{self, DIGEST_MARK, DigestOptions};
use crate::message::{Message, ToolCall};
use crate::recall::RECALL_TOOL;
use crate::tokens::TokenCounter;
use crate::validate::{self, CutPoints, Profile, TextActions, validate};

use effect::Effect;

pub use crate::tool_output::PRUNE_MARK;

/// Pruning switches and thresholds. `Default` is the documented behaviour
/// (off until a token level is configured); a config layer fills the fields
/// in, missing fields taking their default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PruneOptions {
    /// Run only when the prompt is above this many tokens; 0 turns the pass
    /// off.
    pub proactive_prune_tokens: u64,
    /// Commit only when at least this many tokens are freed: below it the
    /// lost prompt-cache prefix costs more than the prune saves.
    pub min_reclaim_tokens: u64,
    /// The last this-many messages (extended back to a safe cut point, so a
    /// tool batch stays whole) are never touched: the model is working on
    /// them.
    pub protect_last_n: usize,
    /// Tool-call arguments longer than this (in characters) get their long
    /// string leaves clipped.
    pub args_max_chars: usize,
    /// What a clipped string leaf keeps, in characters.
    pub args_leaf_chars: usize,
    /// How large results are digested (`keep_batches` is ignored: the
    /// protected tail decides what stays whole).
    pub digest: DigestOptions,
}

impl Default for PruneOptions {
    fn default() -> PruneOptions {
        PruneOptions::from_config(&PruneConfig::default(), TextActions::default())
    }
}

impl PruneOptions {
    /// The options `context.prune` sets, with the compiled
    /// `context.text_actions`.
    pub fn from_config(config: &PruneConfig, text_actions: TextActions) -> PruneOptions {
        PruneOptions {
            proactive_prune_tokens: config.proactive_prune_tokens,
            min_reclaim_tokens: config.min_reclaim_tokens,
            protect_last_n: config.protect_last_n,
            args_max_chars: config.args_max_chars,
            args_leaf_chars: config.args_leaf_chars,
            digest: DigestOptions::from_config(&config.digest, text_actions),
        }
    }
}

/// Why a message was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PruneReason {
    /// Same text as a later tool result.
    Duplicate,
    /// A file read made stale by a later read or edit of the same files.
    SupersededRead,
    /// Superseded by a later call with the same tool and arguments.
    Rerun,
    /// Large result (or text envelope) digested.
    Digested,
    /// Long string leaves of tool-call arguments clipped.
    ArgsClipped,
}

/// One changed message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PruneChange {
    /// Its index in the transcript.
    pub index: usize,
    /// Why it changed.
    pub reason: PruneReason,
    /// Tokens it costs less than before (always > 0).
    pub tokens_reclaimed: u64,
}

/// Changed messages per reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PruneCounts {
    /// [`PruneReason::Duplicate`].
    pub duplicates: usize,
    /// [`PruneReason::SupersededRead`].
    pub superseded_reads: usize,
    /// [`PruneReason::Rerun`].
    pub reruns: usize,
    /// [`PruneReason::Digested`].
    pub digested: usize,
    /// [`PruneReason::ArgsClipped`].
    pub args_clipped: usize,
}

/// Why nothing was committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum PruneSkip {
    /// `proactive_prune_tokens` is 0.
    Disabled,
    /// The prompt is at or below `proactive_prune_tokens`.
    BelowThreshold,
    /// Pruning would free fewer than `min_reclaim_tokens`.
    TooLittle {
        /// What it would have freed.
        reclaimable: u64,
    },
    /// The pruned transcript would have more provider violations than the
    /// input (a safety net: content and argument changes should never do
    /// that).
    WouldBreak,
}

/// What [`prune`] returns.
#[derive(Clone, Debug)]
pub struct PruneOutcome<'a> {
    /// The pruned transcript, or the input borrowed when nothing was
    /// committed.
    pub messages: Cow<'a, [Message]>,
    /// Messages changed (results replaced plus calls clipped); 0 when
    /// nothing was committed.
    pub pruned: usize,
    /// Tokens freed (by the counter's per-message counts).
    pub reclaimed_tokens: u64,
    /// The prompt size the decision used: `current_tokens`, or the
    /// counter's count (0 when the pass is off and none was given).
    pub tokens_before: u64,
    /// `tokens_before - reclaimed_tokens`.
    pub tokens_after: u64,
    /// Every committed change, in transcript order.
    pub changes: Vec<PruneChange>,
    /// Committed changes per reason.
    pub counts: PruneCounts,
    /// Why nothing was committed, if so.
    pub skipped: Option<PruneSkip>,
}

impl<'a> PruneOutcome<'a> {
    fn unchanged(messages: &'a [Message], tokens: u64, skip: PruneSkip) -> PruneOutcome<'a> {
        PruneOutcome {
            messages: Cow::Borrowed(messages),
            pruned: 0,
            reclaimed_tokens: 0,
            tokens_before: tokens,
            tokens_after: tokens,
            changes: Vec::new(),
            counts: PruneCounts::default(),
            skipped: Some(skip),
        }
    }
}

/// Prunes `messages` for the next request (see the module docs).
/// `current_tokens` is the prompt's size as last reported by the provider;
/// when `None` it is counted with `counter`, which also measures what each
/// change frees.
pub fn prune<'a>(
    messages: &'a [Message],
    current_tokens: Option<u64>,
    opts: &PruneOptions,
    counter: &dyn TokenCounter,
) -> PruneOutcome<'a> {
    if opts.proactive_prune_tokens == 0 {
        return PruneOutcome::unchanged(messages, current_tokens.unwrap_or(0), PruneSkip::Disabled);
    }
    let before = current_tokens.unwrap_or_else(|| counter.count_messages(messages) as u64);
    if before <= opts.proactive_prune_tokens {
        return PruneOutcome::unchanged(messages, before, PruneSkip::BelowThreshold);
    }
    let mut changes = Vec::new();
    let mut replacements = Vec::new();
    for (index, new, reason) in plan(messages, opts) {
        let Some(old) = messages.get(index) else {
            continue;
        };
        let saved = counter
            .count_message(old)
            .saturating_sub(counter.count_message(&new));
        if saved > 0 {
            changes.push(PruneChange {
                index,
                reason,
                tokens_reclaimed: saved as u64,
            });
            replacements.push((index, new));
        }
    }
    let reclaimed: u64 = changes.iter().map(|c| c.tokens_reclaimed).sum();
    if changes.is_empty() || reclaimed < opts.min_reclaim_tokens {
        return PruneOutcome::unchanged(
            messages,
            before,
            PruneSkip::TooLittle {
                reclaimable: reclaimed,
            },
        );
    }
    let mut out = messages.to_vec();
    for (index, new) in replacements {
        if let Some(slot) = out.get_mut(index) {
            *slot = new;
        }
    }
    if validate(&out, Profile::OpenAi).len() > validate(messages, Profile::OpenAi).len() {
        return PruneOutcome::unchanged(messages, before, PruneSkip::WouldBreak);
    }
    changes.sort_by_key(|c| c.index);
    let mut counts = PruneCounts::default();
    for c in &changes {
        *match c.reason {
            PruneReason::Duplicate => &mut counts.duplicates,
            PruneReason::SupersededRead => &mut counts.superseded_reads,
            PruneReason::Rerun => &mut counts.reruns,
            PruneReason::Digested => &mut counts.digested,
            PruneReason::ArgsClipped => &mut counts.args_clipped,
        } += 1;
    }
    PruneOutcome {
        messages: Cow::Owned(out),
        pruned: changes.len(),
        reclaimed_tokens: reclaimed,
        tokens_before: before,
        tokens_after: before.saturating_sub(reclaimed),
        changes,
        counts,
        skipped: None,
    }
}

/// Where the protected tail starts: `protect_last_n` messages from the end,
/// moved back to a safe boundary so no tool batch is split.
pub fn protected_from(messages: &[Message], protect_last_n: usize, actions: &TextActions) -> usize {
    CutPoints::new(messages, actions).at_or_before(messages.len().saturating_sub(protect_last_n))
}

/// One call as the rules see it.
struct CallInfo {
    /// Index of the assistant message that made it (calls of one message
    /// run together: none is later than another).
    at: usize,
    /// How a marker names it: the `tool_call_id`, or `at message N` for a
    /// text action.
    id: String,
    /// Tool name and arguments (a text action's command).
    name: String,
    arguments: String,
    /// The message holding its output.
    result: Option<usize>,
    effect: Effect,
    /// Tool name and canonical arguments; `None` for calls a re-run does not
    /// supersede (edits, calls without arguments such as `scroll_down`).
    rerun_key: Option<String>,
    /// Whether it is a text action (its output an observation).
    text_action: bool,
}

/// A later event on a file: a read of some scope, or an edit.
struct FileEvent<'m> {
    at: usize,
    id: &'m str,
    read: Option<effect::Scope>,
}

/// Every candidate change (index, new message, reason), one per index,
/// before the token check.
fn plan(messages: &[Message], opts: &PruneOptions) -> Vec<(usize, Message, PruneReason)> {
    let actions = &opts.digest.text_actions;
    let tail = protected_from(messages, opts.protect_last_n, actions);
    let calls = call_infos(messages, actions);
    let mut result_call: Vec<Option<usize>> = vec![None; messages.len()];
    for (k, c) in calls.iter().enumerate() {
        if let Some(slot) = c.result.and_then(|r| result_call.get_mut(r)) {
            *slot = Some(k);
        }
    }
    let observations = validate::reentries_with(messages, &opts.digest.text_actions);
    let result_text = |i: usize, m: &'_ Message| -> Option<String> {
        plain_result_text(m, observations.get(i).copied().unwrap_or(false)).map(str::to_owned)
    };
    let mut files: HashMap<&str, Vec<FileEvent>> = HashMap::new();
    let mut last_run: HashMap<&str, (usize, &str)> = HashMap::new();
    for c in &calls {
        let id = c.id.as_str();
        for (path, scope) in &c.effect.reads {
            files.entry(path).or_default().push(FileEvent {
                at: c.at,
                id,
                read: Some(scope.clone()),
            });
        }
        for path in &c.effect.edits {
            files.entry(path).or_default().push(FileEvent {
                at: c.at,
                id,
                read: None,
            });
        }
        if let Some(key) = &c.rerun_key {
            last_run.insert(key, (c.at, id));
        }
    }
    // The newest tool result with each text.
    let mut newest: HashMap<String, usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(text) = result_text(i, m) {
            newest.insert(text, i);
        }
    }

    let mut out: Vec<(usize, Message, PruneReason)> = Vec::new();
    let mut taken = vec![false; messages.len()];
    for (i, m) in messages.iter().enumerate().take(tail) {
        let Some(text) = result_text(i, m) else {
            continue;
        };
        let text = text.as_str();
        if text.starts_with(PRUNE_MARK)
            || text.starts_with(DIGEST_MARK)
            || text
                .lines()
                .any(|l| l.starts_with(PRUNE_MARK) || l.starts_with(DIGEST_MARK))
        {
            continue;
        }
        let info = result_call
            .get(i)
            .copied()
            .flatten()
            .and_then(|k| calls.get(k));
        let found = duplicate_of(messages, &newest, i, text)
            .or_else(|| info.and_then(|c| superseded_read(c, &files)))
            .or_else(|| info.and_then(|c| rerun_of(c, &last_run)));
        if let Some((what, reason)) = found {
            let writ = match info {
                Some(c) if c.text_action => crate::tool_output::clip(
                    &crate::tool_output::one_line(&c.arguments),
                    opts.digest.writ_max_bytes,
                ),
                Some(c) => digest::clipped_writ(&c.name, &c.arguments, opts.digest.writ_max_bytes),
                None => m.name.clone().unwrap_or_else(|| "tool result".to_owned()),
            };
            let marker = if digest::names_recall_handle(m) {
                let handle = serde_json::json!({ "handle": digest::result_handle(m, text) });
                format!("{PRUNE_MARK} {writ} → {what}; full output: {RECALL_TOOL} {handle}")
            } else {
                format!("{PRUNE_MARK} {writ} → {what}")
            };
            let mut new = m.clone();
            new.content = crate::message::Content::Text(if m.is_tool_result() {
                marker
            } else {
                digest::observation_shape(text, marker)
            });
            out.push((i, new, reason));
            if let Some(t) = taken.get_mut(i) {
                *t = true;
            }
        }
    }

    let digest_opts = DigestOptions {
        keep_batches: 0,
        ..opts.digest.clone()
    };
    let (view, _) = digest::digest_view(messages, &digest_opts);
    for (i, m) in view.into_iter().enumerate().take(tail) {
        if let Cow::Owned(m) = m
            && !taken.get(i).copied().unwrap_or(true)
        {
            out.push((i, m, PruneReason::Digested));
        }
    }

    for (i, m) in messages.iter().enumerate().take(tail) {
        if let Some(new) = clip_calls(m, opts) {
            out.push((i, new, PruneReason::ArgsClipped));
        }
    }
    out
}

/// The text of a tool result whose content is text only (binary parts are
/// the digest's business).
fn plain_result_text(m: &Message, observation: bool) -> Option<&str> {
    // An observation is a result; an envelope's blocks are the digest's.
    let result = m.is_tool_result() || (observation && !validate::is_tool_reentry(m));
    if !result {
        return None;
    }
    match &m.content {
        crate::message::Content::Text(t) => Some(t.as_str()),
        _ => None,
    }
}

/// Every call in order (tool calls and text actions, see
/// [`crate::tool_output::calls`]), with its file effect; tracks the file a
/// windowed editor has open across calls.
fn call_infos(messages: &[Message], actions: &TextActions) -> Vec<CallInfo> {
    let mut current = None;
    crate::tool_output::calls(messages, actions)
        .into_iter()
        .map(|c| {
            let effect = if c.text_action {
                effect::of_text_action(&c.arguments, &mut current)
            } else {
                effect::of_call(&c.name, &c.arguments, &mut current)
            };
            let rerun_key = (effect.edits.is_empty() || effect.other)
                .then(|| rerun_key(&c.name, &c.arguments))
                .flatten();
            let id = c.id.unwrap_or_else(|| format!("at message {}", c.at));
            CallInfo {
                at: c.at,
                id,
                name: c.name,
                arguments: c.arguments,
                result: c.result,
                text_action: c.text_action,
                effect,
                rerun_key,
            }
        })
        .collect()
}

/// `name` plus the arguments with object keys sorted, so key order does
/// not hide a re-run; `None` for empty arguments (`scroll_down` re-run
/// shows something new).
fn rerun_key(name: &str, arguments: &str) -> Option<String> {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(mut v) => {
            if v.as_object().is_some_and(|o| o.is_empty()) {
                return None;
            }
            v.sort_all_objects();
            v.to_string()
        }
        Err(_) => arguments.trim().to_owned(),
    };
    (!args.is_empty()).then(|| format!("{name}\u{0}{args}"))
}

/// How the marker names a newer result.
fn name_of(messages: &[Message], index: usize) -> String {
    match messages.get(index).and_then(|m| m.tool_call_id.as_deref()) {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => format!("at message {index}"),
    }
}

fn duplicate_of(
    messages: &[Message],
    newest: &HashMap<String, usize>,
    i: usize,
    text: &str,
) -> Option<(String, PruneReason)> {
    let &j = newest.get(text)?;
    (j > i).then(|| {
        (
            format!("same output as call {}", name_of(messages, j)),
            PruneReason::Duplicate,
        )
    })
}

fn superseded_read(
    call: &CallInfo,
    files: &HashMap<&str, Vec<FileEvent<'_>>>,
) -> Option<(String, PruneReason)> {
    if !call.effect.is_pure_read() {
        return None;
    }
    let mut first = None;
    for (path, scope) in &call.effect.reads {
        let event = files
            .get(path.as_str())?
            .iter()
            .find(|e| e.at > call.at && e.read.as_ref().is_none_or(|later| later.covers(scope)))?;
        first.get_or_insert((path, event));
    }
    let (path, event) = first?;
    let verb = if event.read.is_some() {
        "later read"
    } else {
        "edit"
    };
    Some((
        format!("superseded by call {} ({verb} of {path})", event.id),
        PruneReason::SupersededRead,
    ))
}

fn rerun_of(
    call: &CallInfo,
    last_run: &HashMap<&str, (usize, &str)>,
) -> Option<(String, PruneReason)> {
    let (at, id) = last_run.get(call.rerun_key.as_deref()?)?;
    (*at > call.at).then(|| {
        (
            format!("superseded by re-run call {id}"),
            PruneReason::Rerun,
        )
    })
}

/// `m` with the long arguments of its tool calls clipped, if any were.
fn clip_calls(m: &Message, opts: &PruneOptions) -> Option<Message> {
    let calls = m.tool_calls.as_ref()?;
    let mut changed = false;
    let clipped: Vec<ToolCall> = calls
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(f) = c.function.as_mut()
                && f.arguments.chars().count() > opts.args_max_chars
                && let Some(short) = args::clip_arguments(&f.arguments, opts.args_leaf_chars)
                && short.len() < f.arguments.len()
            {
                f.arguments = short;
                changed = true;
            }
            c
        })
        .collect();
    changed.then(|| {
        let mut new = m.clone();
        new.tool_calls = Some(clipped);
        new
    })
}
