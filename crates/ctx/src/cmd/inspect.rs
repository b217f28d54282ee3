//! `ctx inspect`: a transcript broken down by tokens.

use crate::exit::ExitCode;
use std::collections::HashMap;

use context_engine::message::Message;
use context_engine::tokens::{
    BpeCounter, CalibrationReport, CountOptions, Encoding, EstimateCounter, TokenCounter,
    calibrate, recorded_model,
};
use context_engine::validate::{
    Profile, Rule, TextActions, is_tool_reentry, observation_with, reentries_with, validate,
};
use serde::Serialize;

use crate::output::{self, Table, percent, thousands};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum EncodingArg {
    /// o200k_base (gpt-4o, gpt-4.1, gpt-5, o-series): exact.
    O200k,
    /// cl100k_base (gpt-4, gpt-3.5): exact.
    Cl100k,
    /// Characters / 4: fast, rough.
    Estimate,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub input: super::Input,
    /// How to count tokens.
    #[arg(long, value_enum, default_value = "o200k")]
    encoding: EncodingArg,
    /// How many of the largest messages to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print a JSON report instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    config: super::ConfigArgs,
}

#[derive(Serialize)]
struct Report {
    file: String,
    format: &'static str,
    encoding: &'static str,
    messages: usize,
    /// What the whole transcript costs as one request.
    tokens: u64,
    by_role: Vec<RoleRow>,
    tool_output: ToolOutput,
    largest: Vec<Largest>,
    pairing: Pairing,
    /// Present when the file records the provider's usage per call.
    calibration: Option<Calibration>,
}

#[derive(Serialize)]
struct RoleRow {
    role: String,
    messages: usize,
    tokens: u64,
}

#[derive(Serialize)]
struct ToolOutput {
    /// Tool results plus text tool-result envelopes.
    messages: usize,
    tokens: u64,
    /// Share of the request's tokens, 0..1.
    share: f64,
}

#[derive(Serialize)]
struct Largest {
    index: usize,
    role: String,
    /// The tool that produced a result, or the tools an assistant turn calls.
    tool: Option<String>,
    tokens: u64,
}

#[derive(Serialize)]
struct Pairing {
    tool_calls: usize,
    tool_results: usize,
    text_envelopes: usize,
    /// Text actions answered by an observation (a user message that is the
    /// action's output).
    text_actions: usize,
    unanswered_calls: usize,
    orphan_results: usize,
    duplicate_ids: usize,
}

#[derive(Serialize)]
struct Calibration {
    /// The model the provider reported, when recorded.
    model: Option<String>,
    #[serde(flatten)]
    report: CalibrationReport,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let transcript = args.input.load()?;
    let messages = &transcript.messages;
    let actions = args.config.load()?.text_actions()?;
    let counter: Box<dyn TokenCounter> = match args.encoding {
        EncodingArg::O200k => Box::new(BpeCounter::new(Encoding::O200kBase)),
        EncodingArg::Cl100k => Box::new(BpeCounter::new(Encoding::Cl100kBase)),
        EncodingArg::Estimate => Box::new(EstimateCounter::new(CountOptions::default())),
    };
    let counts: Vec<u64> = messages
        .iter()
        .map(|m| counter.count_message(m) as u64)
        .collect();
    let tokens = counter.request_overhead() as u64 + counts.iter().sum::<u64>();
    let report = Report {
        file: args.input.file.display().to_string(),
        format: transcript.format.name(),
        encoding: match args.encoding {
            EncodingArg::O200k => Encoding::O200kBase.name(),
            EncodingArg::Cl100k => Encoding::Cl100kBase.name(),
            EncodingArg::Estimate => "estimate",
        },
        messages: messages.len(),
        tokens,
        by_role: by_role(messages, &counts),
        tool_output: tool_output(messages, &counts, tokens, &actions),
        largest: largest(messages, &counts, args.top, &actions),
        pairing: pairing(messages, &actions),
        calibration: calibrate(counter.as_ref(), messages)
            .ok()
            .map(|report| Calibration {
                model: messages.iter().find_map(recorded_model).map(str::to_owned),
                report,
            }),
    };
    if args.json {
        output::json(&report)?;
    } else {
        print!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn by_role(messages: &[Message], counts: &[u64]) -> Vec<RoleRow> {
    let mut rows: Vec<RoleRow> = Vec::new();
    for (m, &n) in messages.iter().zip(counts) {
        let role = m.role.as_str();
        match rows.iter_mut().find(|r| r.role == role) {
            Some(row) => {
                row.messages += 1;
                row.tokens += n;
            }
            None => rows.push(RoleRow {
                role: role.to_owned(),
                messages: 1,
                tokens: n,
            }),
        }
    }
    rows
}

fn tool_output(
    messages: &[Message],
    counts: &[u64],
    total: u64,
    actions: &TextActions,
) -> ToolOutput {
    let (n, tokens) = messages
        .iter()
        .zip(counts)
        .zip(reentries_with(messages, actions))
        .filter(|((m, _), reentry)| m.is_tool_result() || *reentry)
        .fold((0, 0), |(n, t), ((_, &c), _)| (n + 1, t + c));
    ToolOutput {
        messages: n,
        tokens,
        share: if total == 0 {
            0.0
        } else {
            tokens as f64 / total as f64
        },
    }
}

fn largest(
    messages: &[Message],
    counts: &[u64],
    top: usize,
    actions: &TextActions,
) -> Vec<Largest> {
    let names: HashMap<&str, &str> = messages
        .iter()
        .flat_map(Message::tool_calls)
        .filter_map(|c| Some((c.id.as_deref()?, c.name()?)))
        .collect();
    let mut order: Vec<usize> = (0..messages.len()).collect();
    // Largest first; ties keep transcript order.
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    order
        .into_iter()
        .take(top)
        .map(|i| {
            let m = &messages[i];
            let tool = if m.has_tool_calls() {
                let called: Vec<&str> = m.tool_calls().iter().filter_map(|c| c.name()).collect();
                Some(called.join(","))
            } else {
                m.tool_call_id
                    .as_deref()
                    .and_then(|id| names.get(id))
                    .map(|s| (*s).to_owned())
                    .or_else(|| m.name.clone())
                    .or_else(|| {
                        // An observation: named after its action's command.
                        let action = observation_with(messages, i, actions)?.action;
                        let first = action.commands.first()?.split_whitespace().next()?;
                        Some(format!("text: {first}"))
                    })
            };
            Largest {
                index: i,
                role: m.role.as_str().to_owned(),
                tool,
                tokens: counts[i],
            }
        })
        .collect()
}

fn pairing(messages: &[Message], actions: &TextActions) -> Pairing {
    let violations = validate(messages, Profile::OpenAi);
    let count = |rules: &[Rule]| {
        violations
            .iter()
            .filter(|v| rules.contains(&v.rule))
            .count()
    };
    Pairing {
        tool_calls: messages.iter().map(|m| m.tool_calls().len()).sum(),
        tool_results: messages.iter().filter(|m| m.is_tool_result()).count(),
        text_envelopes: messages.iter().filter(|m| is_tool_reentry(m)).count(),
        text_actions: (0..messages.len())
            .filter(|&i| {
                !is_tool_reentry(&messages[i]) && observation_with(messages, i, actions).is_some()
            })
            .count(),
        unanswered_calls: count(&[Rule::UnansweredToolCall]),
        orphan_results: count(&[Rule::OrphanToolResult, Rule::ToolResultWithoutId]),
        duplicate_ids: count(&[Rule::DuplicateToolCallId, Rule::DuplicateToolResult]),
    }
}

fn render(r: &Report) -> String {
    let mut out = format!(
        "{}  ({}, {} messages, {})\n\n",
        r.file, r.format, r.messages, r.encoding
    );
    out += &format!(
        "  total        {} tokens\n  tool output  {} tokens in {} messages ({})\n\n",
        thousands(r.tokens),
        thousands(r.tool_output.tokens),
        r.tool_output.messages,
        percent(r.tool_output.tokens, r.tokens),
    );
    out += "by role\n";
    let mut t = Table::new(["role", "messages", "tokens", "share"]);
    for row in &r.by_role {
        t.row([
            row.role.clone(),
            row.messages.to_string(),
            thousands(row.tokens),
            percent(row.tokens, r.tokens),
        ]);
    }
    out += &t.render(2);
    out += &format!("\n{} largest messages\n", r.largest.len());
    let mut t = Table::new(["index", "role", "tool", "tokens"]);
    for l in &r.largest {
        t.row([
            l.index.to_string(),
            l.role.clone(),
            l.tool.clone().unwrap_or_default(),
            thousands(l.tokens),
        ]);
    }
    out += &t.render(2);
    let p = &r.pairing;
    out += &format!(
        "\ntool calls\n  {} calls, {} results, {} text envelopes, {} text actions with observations; {} unanswered, {} orphan results, {} duplicate ids\n",
        p.tool_calls,
        p.tool_results,
        p.text_envelopes,
        p.text_actions,
        p.unanswered_calls,
        p.orphan_results,
        p.duplicate_ids
    );
    if let Some(c) = &r.calibration {
        let c_model = c.model.as_deref().unwrap_or("model not recorded");
        let rep = &c.report;
        out += &format!(
            "\ncalibration against provider usage ({} calls, {c_model})\n  \
             mean error {:+.0} tokens, mean |error| {:.1}%, max {:.1}%\n  \
             provider adds a median {:.0} tokens the transcript does not show (tool schemas, template);\n  \
             after that offset: mean |error| {:.1}%, max {:.1}%\n",
            rep.calls,
            rep.mean_signed_error,
            rep.mean_abs_pct_error,
            rep.max_abs_pct_error,
            rep.median_offset,
            rep.mean_abs_pct_error_after_offset,
            rep.max_abs_pct_error_after_offset,
        );
    }
    out
}
