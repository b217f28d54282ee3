#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The OpenAI-compatible summarizer against a real HTTP server on loopback
//! that speaks the chat-completions protocol and injects faults.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use context_engine::Message;
use context_engine::summarize::openai::{CallStats, OpenAiConfig};
use context_engine::summarize::{FailureAction, SummarizeError, Summarizer, SummaryRequest};
use context_engine_openai::OpenAiSummarizer;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};

/// What the server does for one request.
#[derive(Clone, Debug)]
enum Reply {
    /// 200 with a completion whose content is this text.
    Completion(&'static str),
    /// Never answers (the connection stays open until the test ends).
    Silent,
    /// This status with this body and optional `Retry-After`.
    Status(u16, Option<&'static str>, &'static str),
    /// 200 with a body that is not JSON.
    NotJson,
    /// 200 announcing a long body, sending part of it, then closing.
    Truncated,
}

/// One request as the server saw it.
#[derive(Debug)]
struct Seen {
    path: String,
    authorization: Option<String>,
    body: Value,
    at: Instant,
}

/// What the server answers to `GET` requests (window discovery): path →
/// JSON body; any other path is a 404.
type Discovery = Vec<(&'static str, Value)>;

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Paths of the `GET` requests, in order (not in `seen`).
    gets: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts a server answering the n-th `POST` with `script[n]` (the last
    /// entry repeats) and every `GET` with a 404.
    fn start(script: Vec<Reply>) -> Server {
        Server::start_with(script, Vec::new())
    }

    /// Like [`start`](Self::start), answering `GET`s from `discovery`.
    fn start_with(script: Vec<Reply>, discovery: Discovery) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gets = Arc::new(Mutex::new(Vec::new()));
        let state = (
            Arc::new(script),
            seen.clone(),
            Arc::new(discovery),
            gets.clone(),
        );
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let (script, seen, discovery, gets) = state.clone();
                            handle(req, script, seen, discovery, gets)
                        });
                        let _ = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Server { addr, seen, gets }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1/", self.addr)
    }

    fn seen_count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn handle(
    req: Request<Incoming>,
    script: Arc<Vec<Reply>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    discovery: Arc<Discovery>,
    gets: Arc<Mutex<Vec<String>>>,
) -> Result<Response<TestBody>, Infallible> {
    let at = Instant::now();
    let path = req.uri().path().to_owned();
    if req.method() == hyper::Method::GET {
        gets.lock().unwrap().push(path.clone());
        let found = discovery.iter().find(|(p, _)| *p == path);
        return Ok(match found {
            Some((_, body)) => Response::builder()
                .header("content-type", "application/json")
                .body(TestBody::full(body.to_string()))
                .unwrap(),
            None => Response::builder()
                .status(404)
                .body(TestBody::full("not found"))
                .unwrap(),
        });
    }
    let authorization = req
        .headers()
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame.unwrap().into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    let index = {
        let mut seen = seen.lock().unwrap();
        seen.push(Seen {
            path,
            authorization,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            at,
        });
        seen.len() - 1
    };
    let reply = script[index.min(script.len() - 1)].clone();
    let response = match reply {
        Reply::Completion(text) => completion(text),
        Reply::Silent => std::future::pending().await,
        Reply::Status(status, retry_after, body) => {
            let mut builder = Response::builder()
                .status(status)
                .header("content-type", "application/json");
            if let Some(secs) = retry_after {
                builder = builder.header("retry-after", secs);
            }
            builder.body(TestBody::full(body)).unwrap()
        }
        Reply::NotJson => Response::builder()
            .header("content-type", "text/html")
            .body(TestBody::full("<html>502 from a proxy</html>"))
            .unwrap(),
        Reply::Truncated => Response::builder()
            .header("content-type", "application/json")
            .header("content-length", "4096")
            .body(TestBody {
                data: Some(Bytes::from_static(
                    b"{\"choices\":[{\"message\":{\"content\":\"par",
                )),
                fail_after: true,
            })
            .unwrap(),
    };
    Ok(response)
}

fn completion(text: &str) -> Response<TestBody> {
    let body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(TestBody::full(body.to_string()))
        .unwrap()
}

/// A response body that can break off after its first frame.
struct TestBody {
    data: Option<Bytes>,
    fail_after: bool,
}

impl TestBody {
    fn full(text: impl Into<String>) -> TestBody {
        TestBody {
            data: Some(Bytes::from(text.into())),
            fail_after: false,
        }
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if self.fail_after {
            self.fail_after = false;
            return Poll::Ready(Some(Err(io::Error::other("connection dropped"))));
        }
        Poll::Ready(None)
    }
}

const KEY: &str = "sk-test-0123456789";

/// A generous timeout so that a loaded machine does not turn a success into
/// a timeout; the timeout test sets its own short one.
fn config(base_url: &str) -> OpenAiConfig {
    OpenAiConfig::new(base_url, "test-model")
        .with_api_key(KEY)
        .with_timeout(Duration::from_secs(20))
        .with_retry_base_delay(Duration::from_millis(10))
        // These tests pin the transport: the model's text comes back as is.
        .with_deterministic_sections(false)
}

fn turns() -> Vec<Message> {
    vec![
        Message::user("deploy with token [REDACTED:api_key] and fix src/main.rs"),
        Message::assistant("Looking at src/main.rs."),
    ]
}

fn run(config: OpenAiConfig) -> (Result<String, SummarizeError>, CallStats) {
    let summarizer = OpenAiSummarizer::new(config).unwrap();
    let turns = turns();
    let outcome = summarizer.summarize_with_stats(&SummaryRequest::new(&turns, 400));
    assert_eq!(summarizer.last_call(), outcome.1);
    assert_eq!(summarizer.last_attempts(), outcome.1.attempts);
    outcome
}

#[test]
fn success_sends_the_openai_request_shape() {
    let server = Server::start(vec![Reply::Completion(
        "  ## Primary request and intent\nDeploy.\n",
    )]);
    let summarizer = OpenAiSummarizer::new(config(&server.base_url())).unwrap();
    let turns = turns();
    let summary = summarizer
        .summarize(&SummaryRequest::new(&turns, 400).with_focus_topic("deploy"))
        .unwrap();
    assert_eq!(summary, "## Primary request and intent\nDeploy.");
    assert_eq!(summarizer.last_attempts(), 1);

    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = request.body.as_object().unwrap();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["temperature"], 0);
    assert!(!body.contains_key("max_tokens"));
    assert!(!body.contains_key("max_completion_tokens"));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[1]["role"], "user");
    let user = messages[1]["content"].as_str().unwrap();
    assert!(user.contains("deploy with token [REDACTED:api_key] and fix src/main.rs"));
    assert!(user.contains("<focus-topic>\ndeploy\n</focus-topic>"));
    assert!(!messages[0]["content"].as_str().unwrap().contains(KEY));
}

#[test]
fn slow_reply_past_the_timeout_is_a_timeout_and_falls_back() {
    let server = Server::start(vec![Reply::Silent]);
    let (result, stats) = run(config(&server.base_url()).with_timeout(Duration::from_millis(300)));
    let error = result.unwrap_err();
    assert!(
        matches!(error, SummarizeError::Timeout(d) if d == Duration::from_millis(300)),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 1);
    assert_eq!(server.seen_count(), 1);
}

#[test]
fn rate_limit_waits_for_retry_after_then_succeeds() {
    let server = Server::start(vec![
        Reply::Status(429, Some("1"), r#"{"error":{"message":"slow down"}}"#),
        Reply::Completion("summary after the wait"),
    ]);
    let (result, stats) = run(config(&server.base_url()));
    assert_eq!(result.unwrap(), "summary after the wait");
    assert_eq!(stats.attempts, 2);
    // Retry-After (1 s) wins over the 10 ms backoff.
    assert!(stats.waited >= Duration::from_secs(1), "{stats:?}");
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].at.duration_since(seen[0].at) >= Duration::from_secs(1));
}

#[test]
fn retry_after_beyond_the_cap_gives_up_at_once() {
    let server = Server::start(vec![Reply::Status(429, Some("120"), "{}")]);
    let (result, stats) =
        run(config(&server.base_url()).with_max_retry_wait(Duration::from_secs(5)));
    let error = result.unwrap_err();
    assert!(
        matches!(error, SummarizeError::RateLimited { retry_after: Some(d) } if d == Duration::from_secs(120)),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 1);
    assert_eq!(stats.waited, Duration::ZERO);
}

#[test]
fn repeated_server_errors_spend_the_retries() {
    let server = Server::start(vec![Reply::Status(
        500,
        None,
        r#"{"error":{"message":"internal error"}}"#,
    )]);
    let (result, stats) = run(config(&server.base_url()));
    let error = result.unwrap_err();
    assert!(
        matches!(&error, SummarizeError::Server { status: 500, message } if message == "internal error"),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    // max_retries (3) + 1, with backoff 10 + 20 + 40 ms between them.
    assert_eq!(stats.attempts, 4);
    assert_eq!(stats.waited, Duration::from_millis(70));
    assert_eq!(server.seen_count(), 4);
}

#[test]
fn a_transient_server_error_is_retried() {
    let server = Server::start(vec![
        Reply::Status(503, None, "Service Unavailable"),
        Reply::Completion("second time lucky"),
    ]);
    let (result, stats) = run(config(&server.base_url()));
    assert_eq!(result.unwrap(), "second time lucky");
    assert_eq!(stats.attempts, 2);
    assert_eq!(stats.waited, Duration::from_millis(10));
}

#[test]
fn auth_and_quota_errors_abort_without_retry() {
    for status in [401, 402, 403] {
        let server = Server::start(vec![Reply::Status(
            status,
            None,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#,
        )]);
        let (result, stats) = run(config(&server.base_url()));
        let error = result.unwrap_err();
        assert!(
            matches!(&error, SummarizeError::Auth { status: s, message } if *s == status && message == "Incorrect API key provided"),
            "{error:?}"
        );
        assert_eq!(error.action(), FailureAction::Abort);
        assert_eq!(stats.attempts, 1);
        assert_eq!(server.seen_count(), 1);
        assert!(!error.to_string().contains(KEY));
    }
}

#[test]
fn other_client_errors_are_not_retried() {
    let server = Server::start(vec![Reply::Status(
        400,
        None,
        r#"{"error":{"message":"context length exceeded"}}"#,
    )]);
    let (result, stats) = run(config(&server.base_url()));
    let error = result.unwrap_err();
    assert!(
        matches!(error, SummarizeError::Server { status: 400, .. }),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 1);
}

#[test]
fn a_reply_that_is_not_json_is_malformed() {
    let server = Server::start(vec![Reply::NotJson]);
    let (result, stats) = run(config(&server.base_url()));
    let error = result.unwrap_err();
    assert!(
        matches!(&error, SummarizeError::Malformed(m) if m.contains("<html>502 from a proxy</html>")),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 1);
}

#[test]
fn a_wrongly_shaped_reply_is_malformed() {
    let server = Server::start(vec![Reply::Status(
        200,
        None,
        r#"{"object":"list","data":[]}"#,
    )]);
    let (result, stats) = run(config(&server.base_url()));
    assert!(
        matches!(result, Err(SummarizeError::Malformed(_))),
        "{result:?}"
    );
    assert_eq!(stats.attempts, 1);
}

#[test]
fn whitespace_content_is_empty() {
    let server = Server::start(vec![Reply::Completion(" \n\t ")]);
    let (result, stats) = run(config(&server.base_url()));
    let error = result.unwrap_err();
    assert!(matches!(error, SummarizeError::Empty), "{error:?}");
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 1);
}

#[test]
fn a_connection_dropped_mid_body_is_a_network_failure() {
    let server = Server::start(vec![Reply::Truncated]);
    let (result, stats) = run(config(&server.base_url()));
    let error = result.unwrap_err();
    assert!(matches!(error, SummarizeError::Network(_)), "{error:?}");
    assert_eq!(error.action(), FailureAction::Abort);
    assert_eq!(stats.attempts, 1);
    assert_eq!(server.seen_count(), 1);
}

#[test]
fn connection_refused_is_a_network_failure() {
    // Bind to learn a free loopback port, then close it: nothing listens.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (result, stats) = run(config(&format!("http://127.0.0.1:{port}/v1")));
    let error = result.unwrap_err();
    assert!(
        matches!(&error, SummarizeError::Network(m) if m.contains(&format!("127.0.0.1:{port}/v1/chat/completions"))),
        "{error:?}"
    );
    assert_eq!(error.action(), FailureAction::Abort);
    assert_eq!(stats.attempts, 1);
}

#[test]
fn works_through_the_trait_object() {
    let server = Server::start(vec![Reply::Completion("via dyn")]);
    let summarizer: Box<dyn Summarizer> =
        Box::new(OpenAiSummarizer::new(config(&server.base_url())).unwrap());
    assert_eq!(summarizer.name(), "openai:test-model");
    let turns = turns();
    assert_eq!(
        summarizer
            .summarize(&SummaryRequest::new(&turns, 100))
            .unwrap(),
        "via dyn"
    );
}

#[test]
fn the_input_is_bounded_and_previous_summary_is_updated() {
    let server = Server::start(vec![Reply::Completion("updated")]);
    let config = config(&server.base_url())
        .with_max_input_chars(6_000)
        .with_max_message_chars(500);
    let summarizer = OpenAiSummarizer::new(config).unwrap();
    let turns: Vec<Message> = (0..200)
        .map(|i| Message::user(format!("turn {i}: {}", "z".repeat(900))))
        .collect();
    let request =
        SummaryRequest::new(&turns, 300).with_previous_summary("## Current state\nlexer ported");
    assert_eq!(summarizer.summarize(&request).unwrap(), "updated");

    let seen = server.seen.lock().unwrap();
    let messages = seen[0].body["messages"].as_array().unwrap();
    let system = messages[0]["content"].as_str().unwrap();
    assert!(system.contains("Update this summary with the new turns"));
    let user = messages[1]["content"].as_str().unwrap();
    // The cap plus the omission markers; each message keeps head and tail.
    assert!(
        user.chars().count() <= 6_000 + 100,
        "{}",
        user.chars().count()
    );
    assert!(
        user.contains("<previous-summary>\n## Current state\nlexer ported\n</previous-summary>")
    );
    assert!(user.contains("turn 0: "));
    assert!(user.contains("turn 199: "));
    assert!(!user.contains("turn 100: "));
    assert!(user.contains("characters omitted"));
}

#[test]
fn a_window_bounds_the_request_sends_max_tokens_and_seed_and_appends_the_record() {
    let server = Server::start(vec![Reply::Completion("The agent fixed the parser.")]);
    let summarizer = OpenAiSummarizer::new(
        config(&server.base_url())
            .with_deterministic_sections(true)
            .with_context_length(2048)
            .with_max_output_tokens(300),
    )
    .unwrap();
    let mut turns = vec![Message::user("first ask: port the lexer in src/lexer.rs")];
    for i in 0..60 {
        turns.push(Message::assistant(format!(
            "step {i}: {}",
            "word ".repeat(300)
        )));
    }
    turns.push(Message::user("LATEST ASK: now fix src/parser.rs"));
    turns.push(Message::assistant("NEWEST TURN: reading src/parser.rs"));
    let summary = summarizer
        .summarize(&SummaryRequest::new(&turns, 5000))
        .unwrap();
    // The model's text, then the extracted record with the asks and files.
    assert!(summary.starts_with("The agent fixed the parser.\n\n## State record"));
    assert!(summary.contains("### User asks\n- first ask: port the lexer in src/lexer.rs\n"));
    assert!(summary.contains("- LATEST ASK: now fix src/parser.rs"));
    // No tool call read a file: the empty section is left out.
    assert!(!summary.contains("### Files read or written"));
    assert!(
        summary.ends_with("### Next\n- NEWEST TURN: reading src/parser.rs"),
        "{summary}"
    );
    assert!(summary.contains("src/parser.rs"));

    let stats = summarizer.last_call();
    assert_eq!(stats.max_tokens, Some(300));
    assert!(stats.counted_prompt_tokens + 300 <= 2048, "{stats:?}");
    assert_eq!(stats.prompt_tokens, Some(10));
    assert_eq!(stats.completion_tokens, Some(5));
    let seen = server.seen.lock().unwrap();
    let body = seen[0].body.as_object().unwrap();
    assert_eq!(body["max_tokens"], 300);
    assert_eq!(body["seed"], 42);
    assert_eq!(body["temperature"], 0);
    let system = body["messages"][0]["content"].as_str().unwrap();
    let user = body["messages"][1]["content"].as_str().unwrap();
    // The target asked for fits the reply (3/4 of it), not the 5000 requested.
    assert!(system.contains("Aim for about 225 tokens"), "{system}");
    let transcript = user.split("<transcript>").nth(1).unwrap();
    assert!(transcript.contains("NEWEST TURN"));
    assert!(transcript.contains("LATEST ASK: now fix src/parser.rs"));
    assert!(transcript.contains("folded to fit the summarizer's window"));
    assert!(!transcript.contains("step 0:"));
}

#[test]
fn a_window_too_small_for_the_instructions_falls_back_without_a_request() {
    let server = Server::start(vec![Reply::Completion("unused")]);
    let (result, stats) = run(config(&server.base_url())
        .with_context_length(600)
        .with_max_output_tokens(200));
    let error = result.unwrap_err();
    assert!(
        matches!(error, SummarizeError::NotConfigured(ref m) if m.contains("600")),
        "{error}"
    );
    assert_eq!(error.action(), FailureAction::Fallback);
    assert_eq!(stats.attempts, 0);
    assert_eq!(server.seen_count(), 0);
}

// --- the summary model's window ---------------------------------------------

use context_engine::summarize::window::WindowSource;

/// A request whose prompt is far larger than a 2,000-token window.
fn long_turns() -> Vec<Message> {
    (0..60)
        .map(|i| {
            Message::user(format!(
                "step {i}: edit src/module_{i}.rs and rerun the suite; {}",
                "the parser rejects nested generics in trait bounds. ".repeat(20)
            ))
        })
        .collect()
}

/// Summarizes `long_turns` with no configured window; returns the stats.
fn run_long(server: &Server) -> (Result<String, SummarizeError>, CallStats) {
    let summarizer = OpenAiSummarizer::new(config(&server.base_url())).unwrap();
    let turns = long_turns();
    summarizer.summarize_with_stats(&SummaryRequest::new(&turns, 400))
}

#[test]
fn the_window_comes_from_llama_cpp_props() {
    let server = Server::start_with(
        vec![
            Reply::Completion("summary"),
            Reply::Completion("summary"),
            Reply::Completion("summary"),
        ],
        vec![(
            "/props",
            json!({"default_generation_settings": {"n_ctx": 2048}}),
        )],
    );
    let (result, stats) = run_long(&server);
    assert_eq!(result.unwrap(), "summary");
    assert_eq!(stats.window_tokens, Some(2048));
    assert_eq!(stats.window_source, WindowSource::ServerProps);
    // The request fits the window it learned: prompt plus max_tokens.
    let seen = server.seen.lock().unwrap();
    let max_tokens = seen[0].body["max_tokens"].as_u64().unwrap();
    assert!(
        stats.counted_prompt_tokens as u64 + max_tokens <= 2048,
        "{stats:?}"
    );
    drop(seen);
    // Asked once per client (one client serves every session of a
    // configuration; there is no process-wide cache): the same summarizer
    // asks no more, a new one asks once.
    let summarizer = OpenAiSummarizer::new(config(&server.base_url())).unwrap();
    let turns = long_turns();
    for _ in 0..2 {
        let (_, again) = summarizer.summarize_with_stats(&SummaryRequest::new(&turns, 400));
        assert_eq!(again.window_source, WindowSource::ServerProps);
    }
    assert_eq!(*server.gets.lock().unwrap(), ["/props", "/props"]);
}

#[test]
fn the_window_comes_from_the_models_list() {
    let server = Server::start_with(
        vec![Reply::Completion("summary")],
        vec![(
            "/v1/models",
            json!({"object": "list", "data": [
                {"id": "other-model", "max_model_len": 99999},
                {"id": "test-model", "max_model_len": 3000},
            ]}),
        )],
    );
    let (result, stats) = run_long(&server);
    assert_eq!(result.unwrap(), "summary");
    assert_eq!(stats.window_tokens, Some(3000));
    assert_eq!(stats.window_source, WindowSource::ModelsList);
    // /props was asked first (root, then under the base URL), then /models.
    assert_eq!(
        *server.gets.lock().unwrap(),
        ["/props", "/v1/props", "/v1/models"]
    );
    let seen = server.seen.lock().unwrap();
    assert!(seen[0].body["max_tokens"].as_u64().is_some());
}

#[test]
fn an_overflow_error_naming_the_limit_is_retried_once_within_it() {
    let overflow = r#"{"error":{"code":400,"message":"the request exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error"}}"#;
    let server = Server::start(vec![
        Reply::Status(400, None, overflow),
        Reply::Completion("summary"),
    ]);
    let (result, stats) = run_long(&server);
    assert_eq!(result.unwrap(), "summary");
    assert_eq!(stats.attempts, 2);
    assert_eq!(stats.window_tokens, Some(2048));
    assert_eq!(stats.window_source, WindowSource::LearnedFromError);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    // The first request was unbounded; the retry fits the named limit.
    assert!(seen[0].body.get("max_tokens").is_none());
    let first = seen[0].body.to_string().len();
    let retry = seen[1].body.to_string().len();
    assert!(retry < first, "{retry} >= {first}");
    let max_tokens = seen[1].body["max_tokens"].as_u64().unwrap();
    assert!(stats.counted_prompt_tokens as u64 + max_tokens <= 2048);
}

#[test]
fn an_overflow_that_repeats_is_retried_only_once() {
    let overflow = r#"{"error":{"message":"This model's maximum context length is 2048 tokens. However, you requested 9000 tokens."}}"#;
    let server = Server::start(vec![Reply::Status(400, None, overflow)]);
    let (result, stats) = run_long(&server);
    let err = result.unwrap_err();
    assert!(
        matches!(err, SummarizeError::Server { status: 400, .. }),
        "{err}"
    );
    assert_eq!(err.action(), FailureAction::Fallback);
    assert_eq!(server.seen_count(), 2);
    assert_eq!(stats.window_source, WindowSource::LearnedFromError);
}

#[test]
fn a_server_that_says_nothing_leaves_the_window_unknown() {
    // No /props, no /models, and a 400 that names no limit.
    let server = Server::start(vec![Reply::Completion("summary")]);
    let (result, stats) = run_long(&server);
    assert_eq!(result.unwrap(), "summary");
    assert_eq!(stats.window_tokens, None);
    assert_eq!(stats.window_source, WindowSource::Unknown);
    assert!(
        server.seen.lock().unwrap()[0]
            .body
            .get("max_tokens")
            .is_none()
    );
    let server = Server::start(vec![Reply::Status(
        400,
        None,
        r#"{"error":{"message":"bad"}}"#,
    )]);
    let (result, _) = run_long(&server);
    assert!(result.is_err());
    assert_eq!(server.seen_count(), 1, "no retry without a named limit");
}

#[test]
fn a_configured_window_is_never_asked_of_the_server() {
    let server = Server::start_with(
        vec![Reply::Completion("summary")],
        vec![("/props", json!({"n_ctx": 2048}))],
    );
    let summarizer =
        OpenAiSummarizer::new(config(&server.base_url()).with_context_length(4096)).unwrap();
    let turns = long_turns();
    let (_, stats) = summarizer.summarize_with_stats(&SummaryRequest::new(&turns, 400));
    assert_eq!(stats.window_tokens, Some(4096));
    assert_eq!(stats.window_source, WindowSource::Configured);
    assert!(server.gets.lock().unwrap().is_empty());
}

// --- degenerate model summaries ---------------------------------------------

use context_engine::compressor::Compressor;
use context_engine::engine::{CompressRequest, ContextEngine, Outcome};

/// Compacts a 40-turn session with the model answering `reply`; returns the
/// report's outcome, summarizer and reason, and the summary text inserted.
fn compact_with_reply(reply: &'static str) -> (Outcome, String, String, String) {
    let server = Server::start(vec![Reply::Completion(reply)]);
    let summarizer = OpenAiSummarizer::new(config(&server.base_url())).unwrap();
    let mut messages = vec![Message::system("You are a coding agent.")];
    for i in 0..20 {
        messages.push(Message::user(format!(
            "Task {i}: fix the overflow in src/buffer_{i}.rs and rerun the tests."
        )));
        messages.push(Message::assistant(format!(
            "Fixed src/buffer_{i}.rs: the length check was off by one; tests pass."
        )));
    }
    let counter = context_engine::tokens::counter_for(None);
    let mut engine = Compressor::new(counter, 2_000).with_summarizer(Box::new(summarizer));
    let out = engine
        .compress(&messages, &CompressRequest::new().with_force(true))
        .unwrap();
    let report = out.report;
    let summary = out
        .messages
        .iter()
        .map(|m| m.text().into_owned())
        .find(|t| t.contains("[END CONTEXT SUMMARY]"))
        .unwrap();
    (
        report.outcome,
        report.summarizer.unwrap_or_default(),
        report.reason.unwrap_or_default(),
        summary,
    )
}

#[test]
fn degenerate_model_summaries_fall_back_to_the_extractive_one_with_the_reason() {
    let cases: [(&'static str, &str); 4] = [
        (
            "alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha \
             alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha",
            "repeats itself",
        ),
        (
            "<transcript>\n[1] user:\nTask 0: fix the overflow in src/buffer_0.rs\n</transcript>",
            "echoes the transcript",
        ),
        (
            "## Primary request and intent\n\n## Progress\n\n## Next steps\n",
            "no content",
        ),
        (
            // Far longer than the 40 short turns it would replace.
            (0..400)
                .map(|i| format!("Step {i} touched module_{i} and its tests passed. "))
                .collect::<String>()
                .leak(),
            "longer than",
        ),
    ];
    for (reply, defect) in cases {
        let (outcome, summarizer, reason, summary) = compact_with_reply(reply);
        assert_eq!(outcome, Outcome::Fallback, "{defect}: {reason}");
        assert_eq!(summarizer, "extractive", "{defect}");
        assert!(reason.contains("degenerate summary rejected"), "{reason}");
        assert!(reason.contains(defect), "{defect}: {reason}");
        // The extractive summary went in, not the model's text.
        assert!(!summary.contains("alpha alpha"), "{summary}");
        assert!(summary.contains("src/buffer_"), "{summary}");
    }
    // A real summary is kept.
    let (outcome, summarizer, _, summary) = compact_with_reply(
        "## Primary request and intent\nFix buffer overflows in src/buffer_*.rs.\n\n\
         ## Progress\nAll twenty length checks fixed; tests pass.",
    );
    assert_eq!(outcome, Outcome::Compacted);
    assert_eq!(summarizer, "openai:test-model");
    assert!(
        summary.contains("All twenty length checks fixed"),
        "{summary}"
    );
}

/// A caller that hands the summarizer unredacted turns still sends no
/// secret and no match of the user's patterns: the prompt goes through the
/// egress helper once more.
#[test]
fn unredacted_input_is_redacted_before_it_is_sent() {
    const TOKEN: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
    let server = Server::start(vec![Reply::Completion("## Summary\nPushed the fix.\n")]);
    let redactor = context_engine::redact::Redactor::builder()
        .pattern("ACME-[0-9]{6}")
        .build()
        .unwrap();
    let summarizer = OpenAiSummarizer::new(config(&server.base_url()))
        .unwrap()
        .with_redactor(Arc::new(redactor));
    let turns = vec![
        Message::user(format!("push with {TOKEN} for ticket ACME-123456")),
        Message::assistant("Pushing."),
    ];
    summarizer
        .summarize(&SummaryRequest::new(&turns, 400))
        .unwrap();
    let seen = server.seen.lock().unwrap();
    let sent = seen[0].body.to_string();
    assert!(sent.contains("push with"), "{sent}");
    assert!(!sent.contains(TOKEN), "{sent}");
    assert!(!sent.contains("ACME-123456"), "{sent}");
}
