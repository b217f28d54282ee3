//! Observations of text-action agents: tool output that arrives as a user
//! message.
//!
//! Many agents do not use the tool-calling API: the model writes its action
//! as text (a fenced shell block, SWE-agent's `thought`/`action`) and the
//! harness sends the output back as a *user* message. Such a message is a
//! tool result, not a user ask. It is recognised here, from:
//!
//! - the transcript where the file says so: a user message marked
//!   `message_type: "observation"` (SWE-agent trajectories) right after an
//!   assistant message;
//! - the shape of the message right after an assistant action, for live
//!   traffic: mini-swe-agent's template (`<returncode>N</returncode>` then
//!   `<output>…`), SWE-agent's (`OBSERVATION:` first, or the
//!   `(Open file: …)` / `(Current directory: …)` trailer), or the patterns
//!   configured in `context.text_actions`.
//!
//! The assistant message must carry an action ([`text_action`]): its
//! `action` field, else its fenced shell blocks (or, without one, its last
//! unlabelled block). A user message that merely looks like an observation
//! but follows no action is a user turn: when in doubt, a user turn.

use std::sync::Arc;

use regex_automata::meta::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, Role};

/// `context.text_actions` as written in the config: `auto` (the known
/// agents' shapes, the default), `off`, or a list whose entries are
/// `mini-swe-agent`, `swe-agent` (the built-in shapes) or regular
/// expressions matched against a user message that follows an assistant
/// action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TextActionsConfig {
    /// `auto` or `off`.
    Mode(TextActionsMode),
    /// Shapes and patterns; the built-ins apply only when listed.
    Patterns(Vec<String>),
}

impl Default for TextActionsConfig {
    fn default() -> TextActionsConfig {
        TextActionsConfig::Mode(TextActionsMode::Auto)
    }
}

/// The two named settings of [`TextActionsConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextActionsMode {
    /// The built-in shapes of the known agents.
    Auto,
    /// No observations: every user message is a user turn (text envelopes,
    /// which name themselves, still are re-entries).
    Off,
}

/// A pattern of `context.text_actions` that is not a regular expression.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("context.text_actions[{index}]: `{pattern}` is not a valid regular expression: {reason}")]
pub struct TextActionsError {
    /// Position in the list.
    pub index: usize,
    /// The pattern as written.
    pub pattern: String,
    /// What the regex parser said.
    pub reason: String,
}

#[derive(Clone, Debug)]
enum Shape {
    MiniSweAgent,
    SweAgent,
    Pattern(Box<Regex>),
}

/// The compiled text-action setting: which observation shapes count.
/// Cheap to clone (shared); two settings are equal when compiled from the
/// same configuration. It travels in the options of whatever reads
/// transcripts (digest, prune, summaries, replay): there is no process-wide
/// setting.
#[derive(Clone, Debug)]
pub struct TextActions {
    shapes: Arc<[Shape]>,
    source: TextActionsConfig,
}

impl PartialEq for TextActions {
    fn eq(&self, other: &TextActions) -> bool {
        self.source == other.source
    }
}

impl Eq for TextActions {}

/// The default setting ([`TextActions::auto`]), shared: what a request or
/// option built without a configuration reads transcripts with.
pub fn auto_text_actions() -> &'static TextActions {
    static AUTO: std::sync::LazyLock<TextActions> = std::sync::LazyLock::new(TextActions::auto);
    &AUTO
}

impl Default for TextActions {
    fn default() -> TextActions {
        TextActions::auto()
    }
}

impl TextActions {
    /// The built-in shapes (mini-swe-agent, SWE-agent).
    pub fn auto() -> TextActions {
        TextActions {
            shapes: Arc::new([Shape::MiniSweAgent, Shape::SweAgent]),
            source: TextActionsConfig::Mode(TextActionsMode::Auto),
        }
    }

    /// No observations.
    pub fn off() -> TextActions {
        TextActions {
            shapes: Arc::new([]),
            source: TextActionsConfig::Mode(TextActionsMode::Off),
        }
    }

    /// Whether no observation is ever recognised.
    pub fn is_off(&self) -> bool {
        self.shapes.is_empty()
    }

    /// Compiles the config's setting; a bad pattern is an error naming it.
    pub fn from_config(config: &TextActionsConfig) -> Result<TextActions, TextActionsError> {
        match config {
            TextActionsConfig::Mode(TextActionsMode::Auto) => Ok(TextActions::auto()),
            TextActionsConfig::Mode(TextActionsMode::Off) => Ok(TextActions::off()),
            TextActionsConfig::Patterns(list) => {
                let mut shapes = Vec::with_capacity(list.len());
                for (index, pattern) in list.iter().enumerate() {
                    shapes.push(match pattern.trim() {
                        "mini-swe-agent" => Shape::MiniSweAgent,
                        "swe-agent" => Shape::SweAgent,
                        "auto" => {
                            shapes.extend(TextActions::auto().shapes.iter().cloned());
                            continue;
                        }
                        _ => Shape::Pattern(Box::new(Regex::new(pattern).map_err(|e| {
                            TextActionsError {
                                index,
                                pattern: pattern.clone(),
                                reason: e.to_string(),
                            }
                        })?)),
                    });
                }
                Ok(TextActions {
                    shapes: shapes.into(),
                    source: config.clone(),
                })
            }
        }
    }
}

/// The action an assistant message wrote as text: the "call" of the
/// observation that follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextAction {
    /// The commands as the agent will run them, in order (one for
    /// SWE-agent's `action` field and most fenced replies).
    pub commands: Vec<String>,
    /// Whether it came from the message's `action` field rather than its
    /// text.
    pub from_field: bool,
}

impl TextAction {
    /// The commands on one string, one per line group.
    pub fn command(&self) -> String {
        self.commands.join("\n")
    }
}

/// The action of an assistant message without tool calls: its `action`
/// field (SWE-agent), else its fenced shell blocks.
pub fn text_action(message: &Message) -> Option<TextAction> {
    if message.role != Role::Assistant || message.has_tool_calls() {
        return None;
    }
    if let Some(action) = message
        .extra
        .get("action")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        return Some(TextAction {
            commands: vec![action.to_owned()],
            from_field: true,
        });
    }
    // A compaction summary merged into the turn is not the agent's action.
    let text = message.text();
    let commands = fenced_commands(&crate::message::summary_marks::outside_summaries(&text));
    (!commands.is_empty()).then_some(TextAction {
        commands,
        from_field: false,
    })
}

/// An observation: which shape matched and the action it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The action of the assistant message before it.
    pub action: TextAction,
    /// `marked`, `mini-swe-agent`, `swe-agent` or `pattern`.
    pub shape: &'static str,
}

/// Whether message `i` is an observation under `actions` (see the module
/// docs).
pub fn observation_with(
    messages: &[Message],
    i: usize,
    actions: &TextActions,
) -> Option<Observation> {
    if actions.is_off() {
        return None;
    }
    let message = messages.get(i)?;
    if message.role != Role::User {
        return None;
    }
    let prev = messages.get(i.checked_sub(1)?)?;
    if prev.role != Role::Assistant || prev.has_tool_calls() {
        return None;
    }
    let action = text_action(prev);
    if message.extra.get("message_type").and_then(Value::as_str) == Some("observation") {
        return Some(Observation {
            action: action.unwrap_or(TextAction {
                commands: Vec::new(),
                from_field: false,
            }),
            shape: "marked",
        });
    }
    let action = action?;
    let text = message.text();
    let shape = actions.shapes.iter().find_map(|s| match s {
        Shape::MiniSweAgent => is_mini_swe_agent(&text).then_some("mini-swe-agent"),
        Shape::SweAgent => is_swe_agent(&text).then_some("swe-agent"),
        Shape::Pattern(re) => re.is_match(text.as_ref()).then_some("pattern"),
    })?;
    Some(Observation { action, shape })
}

/// mini-swe-agent's observation templates: `<returncode>N</returncode>`
/// first, then `<output>` (or `<output_head>`, or a `<warning>` before it);
/// or its timeout notice, `The last command <command>…` with the partial
/// `<output>`.
fn is_mini_swe_agent(text: &str) -> bool {
    let text = text.trim_start();
    if let Some(rest) = text.strip_prefix("The last command <command>") {
        return rest.contains("</command>") && rest.contains("<output>");
    }
    let Some(rest) = text.strip_prefix("<returncode>") else {
        return false;
    };
    let Some((code, after)) = rest.split_once("</returncode>") else {
        return false;
    };
    let code = code.trim();
    let numeric = !code.is_empty()
        && code
            .strip_prefix('-')
            .unwrap_or(code)
            .bytes()
            .all(|b| b.is_ascii_digit());
    numeric && (after.contains("<output") || after.contains("<warning>"))
}

/// SWE-agent's observation: `OBSERVATION:` first (1.x), or the
/// `(Open file: …)` / `(Current directory: …)` trailer in its last lines
/// (0.x).
pub(crate) fn is_swe_agent(text: &str) -> bool {
    if text.trim_start().starts_with("OBSERVATION:") {
        return true;
    }
    text.lines()
        .rev()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .any(|l| l.starts_with("(Current directory: ") || l.starts_with("(Open file: "))
}

/// Fence labels of a shell command in an assistant's text (mini-swe-agent
/// writes `mswea_bash_command`).
const SHELL_FENCES: &[&str] = &[
    "bash",
    "sh",
    "shell",
    "console",
    "zsh",
    "mswea_bash_command",
];

/// The commands of a text-action assistant message: the bodies of its
/// fenced blocks labelled as shell, or, when it has no such block, of its
/// last unlabelled block (SWE-agent's text actions), as those agents run
/// them.
pub(crate) fn fenced_commands(text: &str) -> Vec<String> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((info.trim().to_ascii_lowercase(), Vec::new()));
                }
            }
            Some((info, mut body)) => {
                if trimmed == "```" {
                    blocks.push((info, body.join("\n")));
                } else {
                    body.push(line);
                    open = Some((info, body));
                }
            }
        }
    }
    let shell: Vec<String> = blocks
        .iter()
        .filter(|(info, _)| SHELL_FENCES.contains(&info.as_str()))
        .map(|(_, body)| body.clone())
        .collect();
    let commands = if shell.is_empty() {
        blocks
            .into_iter()
            .next_back()
            .filter(|(info, _)| info.is_empty())
            .map(|(_, body)| body)
            .into_iter()
            .collect()
    } else {
        shell
    };
    commands
        .into_iter()
        .filter(|c| !c.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_quoting_a_fenced_block_is_not_an_action() {
        use crate::message::summary_marks::{SUMMARY_END, SUMMARY_PREFIX};
        // SWE-agent's task ends with its observations' trailer.
        let task = Message::user(
            "We're solving this issue: …\n\n(Open file: n/a)\n(Current directory: /r)\nbash-$",
        );
        let summary = format!("{SUMMARY_PREFIX}\n- an ask: run\n```\nsubmit\n```\n{SUMMARY_END}");
        let alone = [Message::assistant(summary.clone()), task.clone()];
        assert!(observation_with(&alone, 1, &TextActions::auto()).is_none());
        // The turn's own action still counts.
        let merged = [
            Message::assistant(format!("{summary}\n\nNow:\n```\nls\n```")),
            task,
        ];
        assert!(observation_with(&merged, 1, &TextActions::auto()).is_some());
    }

    #[test]
    fn mini_swe_agent_templates() {
        assert!(is_mini_swe_agent(
            "<returncode>0</returncode>\n<output>\nx\n</output>"
        ));
        assert!(is_mini_swe_agent(
            "<returncode>1</returncode>\n<warning>\ntoo long\n</warning><output_head>\na\n</output_head>"
        ));
        assert!(is_mini_swe_agent(
            "The last command <command>sleep 99</command> timed out and has been killed.\nThe output of the command was:\n <output>\n</output>\nPlease try another command."
        ));
        assert!(!is_mini_swe_agent("<returncode>ok</returncode>\n<output>"));
        assert!(!is_mini_swe_agent(
            "please check <returncode>0</returncode> <output>"
        ));
        assert!(is_swe_agent("OBSERVATION:\nfile.py"));
        assert!(is_swe_agent(
            "x\n\n(Open file: n/a)\n(Current directory: /r)\nbash-$"
        ));
        assert!(!is_swe_agent("I opened the file (Open file: x) yesterday"));
    }

    #[test]
    fn fenced_commands_by_label() {
        let text = "THOUGHT: look\n\n```bash\ncat a.py\n```\n";
        assert_eq!(fenced_commands(text), vec!["cat a.py"]);
        let text = "x\n```mswea_bash_command\nls -la\n```";
        assert_eq!(fenced_commands(text), vec!["ls -la"]);
        let text = "code:\n```python\nprint(1)\n```\nnow run\n```\npython reproduce_bug.py\n```";
        assert_eq!(fenced_commands(text), vec!["python reproduce_bug.py"]);
        assert!(fenced_commands("```python\nprint(1)\n```").is_empty());
        assert!(fenced_commands("no fences").is_empty());
    }
}
