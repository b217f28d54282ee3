//! `ctx demo`: the proxy and its page at work within a minute, offline.
//!
//! Starts `ctx serve` (the same configuration path, a session store in
//! memory) in front of a stand-in model that answers each call with the
//! recorded session's next assistant message, and drives the recorded
//! session through it call by call, as its agent did: the page at `/ui`
//! fills in live (savings, the chart, each compaction's summary beside what
//! it replaced, the archive's search, each call's request). The stand-in
//! reports the prompt tokens it received, counted with the proxy's own
//! tokenizer, as a provider would. Nothing leaves the machine; no key.

use crate::exit::ExitCode;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use clap::Parser;
use context_engine::message::{Message, Role};
use context_engine::tokens::TokenCounter;
use context_engine::transcript::Transcript;
use context_engine_serve::AppState;
use serde_json::{Value, json};

/// The session `ctx demo` drives unless given one: the repository's
/// recorded 37-call coding session (the README's first command replays it).
const BUNDLED: &str = include_str!("../../../../examples/coding-session.json");

/// The key the demo's agent sends: the page shows its sessions.
const DEMO_KEY: &str = "demo";

/// Arguments of `ctx demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// A recorded session to drive (any format `ctx replay` reads); default:
    /// the bundled coding session.
    pub file: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: String,
    /// The model's window: small enough that the session compacts.
    #[arg(long, default_value_t = 16_000)]
    pub context_length: u64,
    /// Pause between calls, in milliseconds (the page polls every two
    /// seconds, so it shows the session growing).
    #[arg(long, default_value_t = 250)]
    pub pace_ms: u64,
    /// Stop once the session is driven, instead of serving the page until
    /// Ctrl-C.
    #[arg(long)]
    pub exit: bool,
}

/// The stand-in model's next answers, in order.
type Answers = Arc<Mutex<VecDeque<Message>>>;

#[derive(Clone)]
struct Model {
    answers: Answers,
    counter: Arc<dyn TokenCounter>,
}

/// `POST /v1/chat/completions` of the stand-in model: the next recorded
/// answer, with the prompt's tokens as its usage.
async fn answer(State(model): State<Model>, Json(request): Json<Value>) -> Json<Value> {
    let messages: Vec<Message> =
        serde_json::from_value(request["messages"].clone()).unwrap_or_default();
    let prompt = model.counter.count_messages(&messages);
    let next = model
        .answers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
        .unwrap_or_else(|| Message::assistant("(the recorded session has ended)"));
    let completion = model.counter.count_message(&next);
    Json(json!({
        "id": "demo",
        "object": "chat.completion",
        "created": 0,
        "model": "recorded",
        "choices": [{"index": 0, "message": next, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }))
}

/// Run `ctx demo`.
pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let transcript = match &args.file {
        Some(path) => super::load(path, None)?,
        None => Transcript::parse(BUNDLED, "the bundled coding session")
            .context("the bundled session does not load")?,
    };
    let messages = transcript.messages;
    // Each call sends the history up to an assistant message and gets it
    // back as the answer.
    let calls: Vec<usize> = (1..messages.len())
        .filter(|&i| messages[i].role == Role::Assistant)
        .collect();
    anyhow::ensure!(
        !calls.is_empty(),
        "the session has no assistant message to answer with"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let answers: Answers = Arc::default();
        let model_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the stand-in model's port")?;
        let model_url = format!("http://{}/v1", model_listener.local_addr()?);

        // The proxy, exactly as `ctx serve` builds it.
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            args: super::serve::ServeArgs,
        }
        let window = args.context_length.to_string();
        let serve = Serve::try_parse_from([
            "ctx serve",
            "--upstream",
            &model_url,
            "--listen",
            &args.listen,
            "--store",
            ":memory:",
            "--context-length",
            &window,
            "--no-engine-tools",
        ])
        .context("the demo's serve arguments")?;
        let super::serve::Proxy { options, ctx, .. } = super::serve::prepare(&serve.args)?;
        let model = Model {
            answers: Arc::clone(&answers),
            counter: Arc::clone(&ctx.counter),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(model);
        tokio::spawn(async move { axum::serve(model_listener, app).await });

        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let state = AppState::new(options, ctx)?;
        let proxy = tokio::spawn(context_engine_serve::serve(
            listener,
            state,
            context_engine_serve::shutdown_signal(),
        ));
        println!("ctx demo: the page is at http://{addr}/ui#key={DEMO_KEY}");
        println!(
            "ctx demo: driving {} calls of the recorded session through the proxy (window {} tokens)",
            calls.len(),
            args.context_length
        );

        let client = reqwest::Client::new();
        for (n, &i) in calls.iter().enumerate() {
            answers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_back(messages[i].clone());
            let body = json!({"model": "recorded", "messages": &messages[..i]});
            let resp = client
                .post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", format!("Bearer {DEMO_KEY}"))
                .header("x-ctx-session", "demo")
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .with_context(|| format!("call {} of the demo", n + 1))?;
            anyhow::ensure!(
                resp.status().is_success(),
                "call {} answered {}: {}",
                n + 1,
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(args.pace_ms)).await;
        }
        let metrics = client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let figure = |name: &str| {
            metrics
                .lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        };
        let (sent, upstream) = (
            figure("ctx_client_prompt_tokens_total"),
            figure("ctx_managed_prompt_tokens_total"),
        );
        println!(
            "ctx demo: done: the agent sent {sent} prompt tokens, the proxy {upstream} upstream \
             ({:.0}% less), {} compaction(s)",
            100.0 * (1.0 - upstream as f64 / sent.max(1) as f64),
            figure("ctx_compactions_total")
        );
        if args.exit {
            proxy.abort();
            return Ok(());
        }
        println!("ctx demo: the page stays up until Ctrl-C");
        proxy.await.context("the proxy stopped")??;
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
