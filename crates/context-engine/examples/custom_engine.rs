//! A small custom context engine, driven through a session's lifecycle.
//!
//! `DropOldestTurns` compacts by dropping the oldest whole user turns (a user
//! message and everything up to the next one), so tool calls and their
//! results always leave together and the transcript stays valid. System
//! messages and the latest turn are always kept. It also exposes one tool.
//!
//! Run with `cargo run -p context-engine --example custom_engine`.

use context_engine::Message;
use context_engine::engine::{
    Compaction, CompactionPhase, CompactionStatusContext, CompressRequest, ContextEngine,
    EngineError, EngineState, ModelInfo, SessionInfo, ToolCallContext, TurnInfo, Usage,
    automatic_compaction_status_message, unknown_tool,
};
use context_engine::message::Role;
use context_engine::message::ToolCall;
use context_engine::tokens::{CountOptions, EstimateCounter};
use serde_json::{Value, json};

/// Drops the oldest user turns until the rough size is under the threshold.
struct DropOldestTurns {
    state: EngineState,
    turns_dropped: u64,
}

impl DropOldestTurns {
    fn new() -> DropOldestTurns {
        let mut state = EngineState::default();
        state.threshold_percent = 0.5;
        DropOldestTurns {
            state,
            turns_dropped: 0,
        }
    }
}

/// About four characters per token: good enough for an example, and keeps it
/// free of a tokenizer.
fn rough_tokens(messages: &[Message]) -> u64 {
    let chars: usize = messages.iter().map(|m| m.text().chars().count()).sum();
    (chars / 4) as u64
}

impl ContextEngine for DropOldestTurns {
    fn name(&self) -> &str {
        "drop-oldest-turns"
    }

    fn state(&self) -> &EngineState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }

    fn update_from_response(&mut self, usage: &Usage) {
        self.state.record_usage(usage);
    }

    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        self.state.exceeds_threshold(prompt_tokens)
    }

    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        messages.iter().filter(|m| m.role == Role::User).count() > 1
    }

    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        if !self.has_content_to_compress(messages) {
            return Err(EngineError::NothingToCompress {
                engine: self.name().to_owned(),
                reason: "only one user turn".to_owned(),
            });
        }
        let (system, rest): (Vec<&Message>, Vec<&Message>) =
            messages.iter().partition(|m| m.role.is_instruction());
        // Split the non-system messages into turns, each starting at a user message.
        let mut turns: Vec<Vec<&Message>> = Vec::new();
        for m in rest {
            match turns.last_mut() {
                Some(turn) if m.role != Role::User => turn.push(m),
                _ => turns.push(vec![m]),
            }
        }
        let budget = request
            .current_tokens
            .map_or(self.state.threshold_tokens / 2, |t| t / 2);
        let mut kept: &[Vec<&Message>] = &turns;
        while kept.len() > 1 {
            let size: usize = kept
                .iter()
                .flatten()
                .map(|m| m.text().chars().count())
                .sum();
            if (size / 4) as u64 <= budget {
                break;
            }
            kept = &kept[1..];
        }
        self.turns_dropped += (turns.len() - kept.len()) as u64;
        self.state.record_compression();
        let out = system
            .into_iter()
            .chain(kept.iter().flatten().copied())
            .cloned()
            .collect();
        // The report (kept head and tail, the summarized span) from comparing
        // input and output; a rough counter is enough for its token figures.
        let counter = EstimateCounter::new(CountOptions::default());
        Ok(Compaction::from_diff(
            messages,
            out,
            &counter,
            self.state.threshold_tokens,
        ))
    }

    fn on_turn_complete(&mut self, messages: &[Message], usage: Option<&Usage>, turn: &TurnInfo) {
        println!(
            "  turn {:?} complete: {} messages, usage {:?}",
            turn.turn_id,
            messages.len(),
            usage.map(|u| u.total_tokens)
        );
    }

    fn tool_schemas(&self) -> Vec<Value> {
        vec![json!({
            "type": "function",
            "function": {
                "name": "context_stats",
                "description": "How much of the conversation this engine has dropped.",
                "parameters": {"type": "object", "properties": {}}
            }
        })]
    }

    fn handle_tool_call(&mut self, name: &str, _args: &Value, ctx: &ToolCallContext<'_>) -> String {
        match name {
            "context_stats" => json!({
                "turns_dropped": self.turns_dropped,
                "live_messages": ctx.messages.map(<[Message]>::len),
            })
            .to_string(),
            other => unknown_tool(other),
        }
    }
}

/// A conversation of `turns` user turns, each with one tool round trip.
fn conversation(turns: usize) -> Vec<Message> {
    let mut out = vec![Message::system("You are a careful coding agent.")];
    for i in 0..turns {
        let id = format!("call_{i}");
        out.push(Message::user(format!("Step {i}: inspect the repository.")));
        out.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(&id, "bash", r#"{"cmd":"ls -R"}"#)],
        ));
        out.push(Message::tool_result(&id, "src/lib.rs\n".repeat(40)));
        out.push(Message::assistant(format!("Step {i} done.")));
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut engine: Box<dyn ContextEngine> = Box::new(DropOldestTurns::new());
    engine.on_session_start("demo", &SessionInfo::default().with_platform("cli"));
    engine.update_model(&ModelInfo::new("small-model", 2_000).with_provider("local"));
    println!("start:  {}", serde_json::to_string(&engine.status())?);

    let mut messages = conversation(10);
    let prompt = rough_tokens(&messages);
    // A host would take these from the provider's response.
    let usage = Usage::from_openai(&json!({"prompt_tokens": prompt, "completion_tokens": 12}))?;
    engine.update_from_response(&usage);
    engine.on_turn_complete(
        &messages,
        Some(&usage),
        &TurnInfo::default()
            .with_turn_id("t1")
            .with_api_call_count(1),
    );
    println!("usage:  {}", serde_json::to_string(&engine.status())?);

    let decision = engine.should_compress_info(None);
    println!("should compress: {decision:?}");
    if decision.should_compress {
        let ctx = CompactionStatusContext::default()
            .with_approx_tokens(prompt)
            .with_threshold_tokens(engine.state().threshold_tokens);
        if let Some(msg) = automatic_compaction_status_message(
            engine.as_ref(),
            CompactionPhase::Compress,
            "Compacting context…",
            &ctx,
        ) {
            println!("status message: {msg}");
        }
        let before = messages.len();
        let compaction = engine.compress(
            &messages,
            &CompressRequest::new().with_current_tokens(prompt),
        )?;
        if let Some(span) = compaction.report.summarized {
            println!("summarized input messages {}..{}", span.start, span.end);
        }
        messages = compaction.messages;
        println!(
            "compressed {before} -> {} messages (~{} tokens)",
            messages.len(),
            rough_tokens(&messages)
        );
    }
    println!("after:  {}", serde_json::to_string(&engine.status())?);

    let tool_ctx = ToolCallContext::default().with_messages(&messages);
    println!(
        "tool:   {}",
        engine.handle_tool_call("context_stats", &json!({}), &tool_ctx)
    );
    println!(
        "tool:   {}",
        engine.handle_tool_call("nope", &json!({}), &tool_ctx)
    );

    engine.on_session_end("demo", &messages);
    engine.on_session_reset();
    println!("reset:  {}", serde_json::to_string(&engine.status())?);
    Ok(())
}
