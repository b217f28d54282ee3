//! A stream that broke off before its end: why ([`Cut`]), what the client
//! gets instead of a clean end (an error event in its own API's format),
//! and the one place such a cut is logged and counted ([`Cut::report`]).
//!
//! A stream has ended when its last event went by: `data: [DONE]` (chat
//! completions), `message_stop` or `error` (Anthropic), `response.completed`,
//! `response.failed`, `response.incomplete` or `error` (Responses). An
//! upstream body that closes before it (a body without length or chunking
//! that just stops), a read that fails (a reset, a chunked body cut mid-event,
//! a silence past the read timeout), or an engine-tool continuation that
//! could not be had, ends the client's stream with an error event instead:
//!
//! - chat completions: `data: {"error":{"message",…}}`, the shape on which
//!   the OpenAI SDKs raise;
//! - Anthropic: `event: error` with
//!   `{"type":"error","error":{"type":"api_error","message"}}`, on which
//!   the Anthropic SDKs and Claude Code raise;
//! - Responses: an `error` event carrying its fields both flat (as the API
//!   reference documents them) and nested under `error` (as the API sends
//!   them, and on which the OpenAI SDKs raise), then `response.failed` with
//!   `response.error` (what Codex reads as a failed, retryable turn).
//!
//! Only whole events reach the client before it: a partial event the cut
//! left behind is dropped, never sent. What a cut round held (from an
//! engine call on) is dropped too, and the cut stream's usage is not fed to
//! the engine.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::error::ServeError;
use crate::metrics::Metrics;

/// Why a stream broke off.
#[derive(Debug)]
pub enum Cut {
    /// The upstream's body ended before the stream's last event.
    Closed,
    /// Reading the upstream's body failed.
    Broken(ServeError),
    /// The upstream refused an engine-tool round's continuation, with this
    /// status and body.
    Refused {
        /// Its status.
        status: axum::http::StatusCode,
        /// Its body, as text.
        body: String,
    },
    /// An engine-tool round's continuation could not be sent.
    Unsent(ServeError),
}

impl Cut {
    /// The metric's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Cut::Closed => "closed",
            Cut::Broken(_) => "read_error",
            Cut::Refused { .. } => "continuation_refused",
            Cut::Unsent(_) => "continuation_failed",
        }
    }

    /// What the client's error event says.
    pub fn message(&self) -> String {
        match self {
            Cut::Closed => {
                "the upstream stream broke off before its end (the connection closed early)"
                    .to_owned()
            }
            Cut::Broken(e) => format!("the upstream stream broke off before its end: {e}"),
            Cut::Refused { status, body } => {
                format!("upstream error {status} after an engine tool call: {body}")
            }
            Cut::Unsent(e) => format!("the continuation after an engine tool call failed: {e}"),
        }
    }

    /// Logs the cut (a warning naming the route and why; never a body) and
    /// counts it.
    pub fn report(&self, metrics: &Metrics, route: &str) {
        let detail = match self {
            Cut::Closed => String::new(),
            Cut::Broken(e) | Cut::Unsent(e) => e.to_string(),
            Cut::Refused { status, .. } => status.to_string(),
        };
        tracing::warn!(
            route,
            reason = self.reason(),
            detail = %detail,
            "a stream broke off before its end; the client gets an error event"
        );
        metrics.stream_cut(route, self.reason());
    }
}

/// The error event of a chat-completions stream.
pub fn chat_event(message: &str) -> Bytes {
    let body = json!({
        "error": { "message": message, "type": "api_error", "param": null, "code": "upstream_error" }
    });
    Bytes::from(format!("data: {body}\n\n"))
}

/// The error event of an Anthropic Messages stream.
pub fn anthropic_event(message: &str) -> Bytes {
    Bytes::from(encode("error", &anthropic_error(message)))
}

/// The data of an Anthropic Messages stream's `error` event.
pub fn anthropic_error(message: &str) -> Value {
    json!({"type": "error", "error": {"type": "api_error", "message": message}})
}

/// The events that end a failed Responses stream, as `(event, data)`:
/// `error`, then `response.failed`. Each has a `sequence_number` (0) and
/// the second a `response` without an id: the caller numbers them after
/// the events the client received and names its response.
pub fn responses_events(message: &str) -> [(&'static str, Value); 2] {
    let error =
        json!({"type": "server_error", "code": "server_error", "message": message, "param": null});
    [
        (
            "error",
            json!({
                "type": "error", "sequence_number": 0, "code": "server_error",
                "message": message, "param": null, "error": error,
            }),
        ),
        (
            "response.failed",
            json!({
                "type": "response.failed", "sequence_number": 0,
                "response": {
                    "object": "response", "status": "failed",
                    "error": {"code": "server_error", "message": message},
                    "incomplete_details": null, "output": [],
                },
            }),
        ),
    ]
}

/// An event as the Anthropic and Responses streams write it.
pub(crate) fn encode(kind: &str, data: &Value) -> Vec<u8> {
    format!("event: {kind}\ndata: {data}\n\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::Event;

    fn data(event: &[u8]) -> Value {
        let event = Event::parse(Bytes::copy_from_slice(event));
        event.json().cloned().unwrap()
    }

    #[test]
    fn each_format_carries_the_message_where_its_clients_read_it() {
        let m = "gone";
        // The OpenAI SDKs raise on a top-level `error` with a `message`.
        assert_eq!(data(&chat_event(m))["error"]["message"], m);
        let a = anthropic_event(m);
        assert!(a.starts_with(b"event: error\n"));
        assert_eq!(data(&a)["type"], "error");
        assert_eq!(data(&a)["error"]["type"], "api_error");
        assert_eq!(data(&a)["error"]["message"], m);
        let [(e, error), (f, failed)] = responses_events(m);
        assert_eq!((e, f), ("error", "response.failed"));
        assert_eq!(error["message"], m);
        assert_eq!(error["error"]["message"], m);
        assert_eq!(failed["response"]["status"], "failed");
        assert_eq!(failed["response"]["error"]["message"], m);
    }

    #[test]
    fn messages_name_no_body_but_a_refusal_s() {
        let cut = Cut::Refused {
            status: axum::http::StatusCode::TOO_MANY_REQUESTS,
            body: "slow down".into(),
        };
        assert!(cut.message().contains("429") && cut.message().contains("slow down"));
        assert_eq!(Cut::Closed.reason(), "closed");
        assert!(
            Cut::Broken(ServeError::UpstreamTimeout)
                .message()
                .contains("timeout")
        );
    }
}
