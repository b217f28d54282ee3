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
        let step = self
            .script
            .pop_front()
            .ok_or("the model's script ran out")?;
        let reply = match step {
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
    let lines = |n: usize, line: &str| {
        (1..=n)
            .map(|i| format!("{line} #{i}\n"))
            .collect::<String>()
    };
    let end =
        "E   AssertionError: assert [1, 2, None] == [1, 2]\nFAILED test_trailing_comma\n[exit 1]\n";
    match (name, args) {
        ("bash", a) if a.contains("pytest -x") => lines(140, "tests/test_parser.py PASSED") + end,
        ("bash", a) if a.contains("grep") => lines(110, "src/parser/fields.py:12: text.split(',')"),
        ("bash", _) => {
            lines(160, "tests/test_suite.py ......... [ ok ]") + "312 passed\n[exit 0]\n"
        }
        ("read_file", path) => lines(55, &format!("    value = tokens.pop().strip()  # {path}")),
        _ => json!({ "error": format!("unknown tool {name}") }).to_string(),
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
    /// Manual compactions accepted.
    pub manual_compactions: usize,
}

/// The agent: its session, model, persisted history and tool outputs.
struct Agent {
    session: Session,
    model: ScriptedModel,
    history: Vec<Message>,
    outputs: HashMap<String, String>,
    stats: Stats,
}

impl Agent {
    /// Replaces the persisted history when the driver says so, and says why.
    fn apply(&mut self, update: Update) {
        if let Some(c) = &update.compaction {
            let manual = c.trigger == Trigger::Manual;
            self.stats.manual_compactions += usize::from(manual);
            self.stats.auto_compactions += usize::from(!manual);
            println!("    {:?} compaction in {} pass(es)", c.trigger, c.passes);
        }
        if let Some(new) = update.new_history {
            println!("    history replaced ({} messages)", new.len());
            self.history = new;
        }
        for notice in &update.notices {
            println!("    notice ({:?}): {}", notice.kind, notice.text);
        }
    }

    /// One user turn: model calls and tool runs until the model answers.
    fn turn(&mut self, ask: &str) -> Result<()> {
        let tools = self.session.tools(&agent_tools());
        println!("user: {ask}");
        self.history.push(Message::user(ask));
        loop {
            let prepared = self.session.before_request(&self.history);
            self.apply(prepared.update);
            if let Some(v) = validate(&prepared.request, Profile::OpenAi).first() {
                return Err(format!("invalid request for OpenAI: {v}").into());
            }
            let history_tokens = self.model.counter.count_messages(&self.history) as u64;
            self.stats.requests += 1;
            if prepared.selected && prepared.request_tokens < history_tokens {
                self.stats.digest_views += 1;
            }
            let (reply, usage) = self.model.complete(&prepared.request, &tools)?;
            let what = match reply.tool_calls().first().and_then(|c| c.function.as_ref()) {
                Some(f) => format!("{} {}", f.name, f.arguments),
                None => format!("answer: {}", reply.text()),
            };
            let digested = if prepared.selected { " (digested)" } else { "" };
            println!(
                "call {:>2} | history {history_tokens:>5} tok, {:>2} msgs | request {:>5} tok{digested} | {what}",
                self.stats.requests,
                self.history.len(),
                prepared.request_tokens,
            );
            self.history.push(reply.clone());
            self.session.after_response(&usage);
            if !reply.has_tool_calls() {
                return Ok(());
            }
            for call in reply.tool_calls() {
                let (Some(id), Some(f)) = (&call.id, &call.function) else {
                    return Err("the model sent a tool call without id or function".into());
                };
                // Engine tools first (Some); the agent runs the others itself.
                let engine = self
                    .session
                    .handle_tool_call(&f.name, &f.arguments, &self.history);
                let output = match engine {
                    Some(answer) => self.check_recall(answer)?,
                    None => run_agent_tool(&f.name, &f.arguments),
                };
                self.outputs.insert(id.clone(), output.clone());
                self.history.push(Message::tool_result(id, output));
            }
            let update = self.session.after_tools(&self.history);
            self.apply(update);
        }
    }

    /// A recall must give back exactly what the tool returned at the time.
    fn check_recall(&mut self, answer: String) -> Result<String> {
        let value: Value = serde_json::from_str(&answer)?;
        let handle = value["handle"]
            .as_str()
            .ok_or(format!("recall: {answer}"))?;
        let original = self
            .outputs
            .get(handle)
            .ok_or("recall of an unknown call")?;
        if value["content"].as_str() != Some(original.as_str()) {
            return Err(format!("recall of {handle} changed its bytes").into());
        }
        println!(
            "    context_recall {handle}: {} original bytes",
            original.len()
        );
        self.stats.exact_recalls += 1;
        Ok(answer)
    }
}

/// Runs the whole scenario and checks that it showed what it is meant to.
pub fn run() -> Result<Stats> {
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let engine = Compressor::new(Arc::clone(&counter), CONTEXT_LENGTH);
    let mut session = Session::new("demo", Box::new(engine), Arc::clone(&counter));
    session.start(&SessionInfo::default().with_platform("example"));
    let tools = session.tools(&agent_tools());
    let names = tools.iter().filter_map(|t| t["function"]["name"].as_str());
    println!("tools sent to the model: {:?}", names.collect::<Vec<_>>());

    let script = [
        Step::Call("bash", r#"{"command":"pytest -x tests/test_parser.py"}"#),
        Step::Call("read_file", r#"{"path":"src/parser/core.py"}"#),
        Step::Call("bash", r#"{"command":"grep -rn \"split(',')\" src/"}"#),
        Step::RecallDigested,
        Step::Call("read_file", r#"{"path":"src/parser/lexer.py"}"#),
        Step::Call("read_file", r#"{"path":"src/parser/tokens.py"}"#),
        Step::Call("read_file", r#"{"path":"tests/test_parser.py"}"#),
        Step::Answer("A trailing comma left an empty item; core.py now drops it."),
        Step::Call("bash", r#"{"command":"pytest -q"}"#),
        Step::Call("read_file", r#"{"path":"CHANGELOG.md"}"#),
        Step::Answer("All 312 tests pass; the fix is noted in CHANGELOG.md."),
    ];
    let model = ScriptedModel {
        script: script.into(),
        counter,
        calls: 0,
    };
    let system = Message::system("You are a careful coding agent. Use the tools.");
    let (history, outputs, stats) = (vec![system], HashMap::new(), Stats::default());
    let mut agent = Agent {
        session,
        model,
        history,
        outputs,
        stats,
    };
    let asks = [
        "tests/test_parser.py fails on trailing commas; find out why and fix it.",
        "Now run the whole test suite and update the changelog.",
    ];
    for (i, ask) in asks.into_iter().enumerate() {
        agent.turn(ask)?;
        let turn = TurnInfo::default().with_turn_id(format!("t{}", i + 1));
        agent.session.turn_complete(&agent.history, &turn);
    }

    println!("/compress parser fix");
    let session = &mut agent.session;
    let update = session.compact_now(&agent.history, Some("parser fix"));
    agent.apply(update);
    agent.session.end(&agent.history);
    let status = serde_json::to_string(&agent.session.status())?;
    println!("status: {status}");

    let stats = agent.stats;
    let why = if stats.digest_views == 0 {
        "no request view digested tool output"
    } else if stats.auto_compactions == 0 {
        "no automatic compaction happened"
    } else if stats.exact_recalls == 0 {
        "no context_recall gave back a digested result's bytes"
    } else if stats.manual_compactions == 0 {
        "the manual compaction was not accepted"
    } else {
        return Ok(stats);
    };
    Err(why.into())
}

fn main() -> Result<()> {
    let stats = run()?;
    println!("ok: {stats:?}");
    Ok(())
}
