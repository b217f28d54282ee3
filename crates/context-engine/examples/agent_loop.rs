//! A complete agent loop on the host driver ([`Session`]) with the built-in
//! `Compressor`, against a scripted model (no network).
//!
//! It shows what an agent author writes around each model call: preflight
//! and context selection before the request (`before_request`), usage after
//! the response, tool calls (the engine's `context_recall` routed to the
//! engine, the agent's `bash`/`read_file` run locally), the post-tool check
//! (`after_tools`), turn boundaries, a manual `/compress focus` and the end
//! of the session. The window is small (6000 tokens) so that the scenario
//! visibly digests old tool output in the request view, compacts on its own,
//! and recalls a digested result byte for byte; the example checks all three
//! and that every request passes `validate(.., Profile::OpenAi)`, and exits
//! non-zero with the reason otherwise.
//!
//! Run with `cargo run -p context-engine --example agent_loop`.

use std::collections::{HashMap, VecDeque};
use std::error::Error;
use std::sync::Arc;

use context_engine::compressor::Compressor;
use context_engine::engine::{SessionInfo, TurnInfo, Usage};
use context_engine::host::{Session, Trigger, Update};
use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
use context_engine::validate::{Profile, validate};
use context_engine::{Message, ToolCall};
use serde_json::{Value, json};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The pretend model's window: small, so that a short scenario compacts.
const CONTEXT_LENGTH: u64 = 6000;

/// What the scripted model answers next.
enum Step {
    /// Call an agent tool with these JSON arguments.
    Call(&'static str, &'static str),
    /// Call `context_recall` on the first digest line the request shows.
    RecallDigested,
    /// End the turn with this text.
    Answer(&'static str),
}

/// A model that plays a script and reports usage the way a provider
/// would: the tokens of the request (messages and tool schemas) it received.
struct ScriptedModel {
    script: VecDeque<Step>,
    counter: Arc<dyn TokenCounter>,
    calls: usize,
}

impl ScriptedModel {
    fn complete(&mut self, request: &[Message], tools: &[Value]) -> Result<(Message, Usage)> {
        self.calls += 1;
        let id = format!("call_{}", self.calls);
        let call = |name: &str, args: String| {
            Message::assistant_tool_calls("", vec![ToolCall::function(&id, name, args)])
        };
        let reply = match self
            .script
            .pop_front()
            .ok_or("the model's script ran out")?
        {
            Step::Call(name, args) => call(name, args.to_owned()),
            Step::RecallDigested => {
                // A real model reads the handle off the digest line it sees.
                let handle = request
                    .iter()
                    .find_map(digest_handle)
                    .ok_or("the request shows no digested tool result to recall")?;
                call("context_recall", json!({ "handle": handle }).to_string())
            }
            Step::Answer(text) => Message::assistant(text),
        };
        let prompt = self.counter.count_messages(request) + self.counter.count_tools(tools);
        let usage = Usage::new(prompt as u64, self.counter.count_message(&reply) as u64);
        Ok((reply, usage))
    }
}

/// The recall handle of a digested tool result (`… context_recall {"handle":"…"}`).
fn digest_handle(message: &Message) -> Option<String> {
    let text = message.text();
    if !message.is_tool_result() || !text.starts_with("[digested]") {
        return None;
    }
    let args: Value = serde_json::from_str(text.rsplit_once("context_recall ")?.1).ok()?;
    args.get("handle")?.as_str().map(str::to_owned)
}

/// The agent's own tools, as sent to the model.
fn agent_tools() -> Vec<Value> {
    let tool = |name: &str, param: &str, what: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {param: {"type": "string"}},
            "required": [param]}}})
    };
    vec![
        tool("bash", "command", "Run a shell command."),
        tool("read_file", "path", "Read a file."),
    ]
}

/// Canned outputs of the agent's tools: test logs and grep hits are large
/// (digested once older), source files are medium (always sent whole).
fn run_agent_tool(name: &str, args: &str) -> String {
    let args: Value = serde_json::from_str(args).unwrap_or_default();
    let arg = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or("");
    let lines = |n: usize, f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<String>();
    match (name, arg("command"), arg("path")) {
        ("bash", "pytest -x tests/test_parser.py", _) => format!(
            "{}tests/test_parser.py:88: in test_trailing_comma\n    assert parse(\"[1, 2,]\") == [1, 2]\n\
             E   AssertionError: assert [1, 2, None] == [1, 2]\nFAILED tests/test_parser.py::test_trailing_comma\n[exit 1]\n",
            lines(140, &|i| format!(
                "tests/test_parser.py::test_case_{i:03} PASSED [{:>3}%]\n",
                i * 100 / 141
            ))
        ),
        ("bash", "grep -rn \"split(',')\" src/", _) => lines(110, &|i| {
            format!(
                "src/parser/module_{i:03}.py:{}:    items = text.split(',')  # fields\n",
                10 + i
            )
        }),
        ("bash", "pytest -q", _) => format!(
            "{}312 passed in 4.21s\n[exit 0]\n",
            lines(160, &|i| format!(
                "tests/test_module_{i:03}.py ..................  [{:>3}%]\n",
                i * 100 / 160
            ))
        ),
        ("read_file", _, path) if !path.is_empty() => lines(60, &|i| {
            format!("    value_{i} = tokens[{i}].strip()  # {path}:{}\n", i + 1)
        }),
        _ => json!({ "error": format!("unknown tool call {name} {args}") }).to_string(),
    }
}

/// What the scenario must show; the example fails unless all happened.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests sent to the model.
    pub requests: usize,
    /// Requests whose view digested tool output and was smaller than the history.
    pub digest_views: usize,
    /// Automatic compactions accepted (preflight or post-tool).
    pub auto_compactions: usize,
    /// `context_recall` calls that returned the original bytes.
    pub exact_recalls: usize,
    /// Tokens of the history before and after the manual compaction.
    pub manual: Option<(u64, u64)>,
}

/// Replaces the persisted history when the driver says so, and prints why.
fn apply(history: &mut Vec<Message>, update: Update, stats: &mut Stats) {
    if let Some(c) = &update.compaction {
        if c.trigger != Trigger::Manual {
            stats.auto_compactions += 1;
        }
        println!(
            "    compaction ({:?}, {} pass): {} → {} tokens, {} → {} messages",
            c.trigger,
            c.passes,
            c.tokens_before,
            c.tokens_after,
            c.messages_before,
            c.messages_after
        );
    }
    if let Some(new) = update.new_history {
        println!(
            "    history replaced: {} → {} messages",
            history.len(),
            new.len()
        );
        *history = new;
    }
    for notice in &update.notices {
        println!("    notice ({:?}): {}", notice.kind, notice.text);
    }
}

/// One user turn: model calls and tool runs until the model answers.
fn run_turn(
    s: &mut Session,
    model: &mut ScriptedModel,
    history: &mut Vec<Message>,
    ask: &str,
    stats: &mut Stats,
    outputs: &mut HashMap<String, String>,
) -> Result<()> {
    let tools = s.tools(&agent_tools());
    println!("user: {ask}");
    history.push(Message::user(ask));
    loop {
        let prepared = s.before_request(history);
        apply(history, prepared.update, stats);
        let violations = validate(&prepared.request, Profile::OpenAi);
        if let Some(v) = violations.first() {
            return Err(format!(
                "request {} is not valid for OpenAI: {v}",
                stats.requests + 1
            )
            .into());
        }
        let history_tokens = model.counter.count_messages(history) as u64;
        stats.requests += 1;
        if prepared.selected && prepared.request_tokens < history_tokens {
            stats.digest_views += 1;
        }
        let (reply, usage) = model.complete(&prepared.request, &tools)?;
        let what = match reply.tool_calls().first().and_then(|c| c.function.as_ref()) {
            Some(f) => format!("{} {}", f.name, f.arguments),
            None => format!("answer: {}", reply.text()),
        };
        println!(
            "call {:>2} | history {:>5} tok, {:>2} msgs | request {:>5} tok{} | {what}",
            stats.requests,
            history_tokens,
            history.len(),
            prepared.request_tokens,
            if prepared.selected { " (digested)" } else { "" },
        );
        history.push(reply.clone());
        s.after_response(&usage);
        if !reply.has_tool_calls() {
            return Ok(());
        }
        for call in reply.tool_calls() {
            let (id, f) = match (&call.id, &call.function) {
                (Some(id), Some(f)) => (id.clone(), f),
                _ => return Err("the model sent a tool call without id or function".into()),
            };
            let output = match s.handle_tool_call(&f.name, &f.arguments, history) {
                Some(answer) => {
                    check_recall(&answer, outputs, stats)?;
                    answer
                }
                None => run_agent_tool(&f.name, &f.arguments),
            };
            outputs.insert(id.clone(), output.clone());
            history.push(Message::tool_result(id, output));
        }
        let update = s.after_tools(history);
        apply(history, update, stats);
    }
}

/// A recall must give back exactly what the tool returned at the time.
fn check_recall(answer: &str, outputs: &HashMap<String, String>, stats: &mut Stats) -> Result<()> {
    let answer: Value = serde_json::from_str(answer)?;
    let handle = answer["handle"]
        .as_str()
        .ok_or(format!("recall failed: {answer}"))?;
    let original = outputs
        .get(handle)
        .ok_or(format!("recall of unknown call {handle}"))?;
    if answer["content"].as_str() != Some(original.as_str()) {
        return Err(format!("context_recall {handle} did not return the original bytes").into());
    }
    println!(
        "    context_recall {handle}: {} original bytes back",
        original.len()
    );
    stats.exact_recalls += 1;
    Ok(())
}

/// Runs the whole scenario and checks that it showed what it is meant to.
pub fn run() -> Result<Stats> {
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let engine = Compressor::new(Arc::clone(&counter), CONTEXT_LENGTH);
    let mut s = Session::new("demo", Box::new(engine), Arc::clone(&counter));
    s.start(
        &SessionInfo::default()
            .with_platform("example")
            .with_model("scripted"),
    );
    let names: Vec<Value> = s
        .tools(&agent_tools())
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    println!("tools sent to the model: {}", Value::Array(names));

    let mut model = ScriptedModel {
        script: VecDeque::from([
            Step::Call("bash", r#"{"command":"pytest -x tests/test_parser.py"}"#),
            Step::Call("read_file", r#"{"path":"src/parser/core.py"}"#),
            Step::Call("bash", r#"{"command":"grep -rn \"split(',')\" src/"}"#),
            Step::RecallDigested,
            Step::Call("read_file", r#"{"path":"src/parser/lexer.py"}"#),
            Step::Call("read_file", r#"{"path":"src/parser/tokens.py"}"#),
            Step::Call("read_file", r#"{"path":"tests/test_parser.py"}"#),
            Step::Answer(
                "The parser keeps an empty item after a trailing comma; core.py now drops it.",
            ),
            Step::Call("bash", r#"{"command":"pytest -q"}"#),
            Step::Call("read_file", r#"{"path":"CHANGELOG.md"}"#),
            Step::Answer("All 312 tests pass; the fix is noted in CHANGELOG.md."),
        ]),
        counter: Arc::clone(&counter),
        calls: 0,
    };
    let mut history = vec![Message::system(
        "You are a careful coding agent. Use the tools.",
    )];
    let mut stats = Stats::default();
    let mut outputs = HashMap::new();
    let asks = [
        "tests/test_parser.py fails on trailing commas; find out why and fix it.",
        "Now run the whole test suite and update the changelog.",
    ];
    for (i, ask) in asks.iter().enumerate() {
        run_turn(
            &mut s,
            &mut model,
            &mut history,
            ask,
            &mut stats,
            &mut outputs,
        )?;
        s.turn_complete(
            &history,
            &TurnInfo::default().with_turn_id(format!("t{}", i + 1)),
        );
    }

    println!("/compress parser fix");
    let update = s.compact_now(&history, Some("parser fix"));
    stats.manual = update
        .compaction
        .as_ref()
        .map(|c| (c.tokens_before, c.tokens_after));
    apply(&mut history, update, &mut stats);
    s.end(&history);
    println!("status: {}", serde_json::to_string(&s.status())?);

    if stats.digest_views == 0 {
        return Err("no request view digested tool output below the history's size".into());
    }
    if stats.auto_compactions == 0 {
        return Err("no automatic compaction happened".into());
    }
    if stats.exact_recalls == 0 {
        return Err("context_recall never returned the original bytes of a digested result".into());
    }
    if stats.manual.is_none() {
        return Err("the manual compaction was not accepted".into());
    }
    Ok(stats)
}

fn main() -> Result<()> {
    let stats = run()?;
    println!("ok: {stats:?}");
    Ok(())
}
