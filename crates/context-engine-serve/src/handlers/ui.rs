//! The page at `/ui` and the JSON it polls: the proxy's overview (the
//! counters `/metrics` reports), the caller's sessions, one session's calls
//! and its compactions (the summary beside the messages it replaced, from
//! the session store).
//!
//! Access follows the proxy's rules. The page itself holds no data. Its
//! JSON needs the access token when one is configured (the router's
//! layer), and:
//!
//! - the overview's counters are the proxy's aggregates, as `/metrics`;
//!   the fallbacks' reasons (which may quote a session's messages) only
//!   to the operator;
//! - sessions are listed and shown only to their own identity (see
//!   [`identity`](crate::identity)): its own provider key, or the
//!   gateway's identity header; a request without an identity sees none;
//! - the operator's token (`serve.ui.operator_token_env`, sent as
//!   [`OPERATOR_HEADER`]) sees every identity's sessions;
//! - a session's archive is searched through the store's search (what
//!   `context_search` reads), within that session only;
//! - a call's request (what the client sent against what went upstream)
//!   is read from the server's request log (the last calls'
//!   bodies, bounded in bytes) and shows its texts redacted with the user's
//!   patterns, whatever the store keeps.
//!
//! Everything answers only on connections that arrived on a loopback
//! address unless `serve.ui.remote` is set, passes the edge's site rule
//! (Host, Origin: no DNS rebinding, no cross-site read), and 404s when the
//! page is off. Texts from a store are as the store keeps them (redacted
//! unless `store.verbatim`).

use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use context_engine::message::Message;
use context_engine::request_map::{self, Fate, Source};
use context_engine::store::{ArchivedCompaction, archived_compactions};
use context_engine::summary_text::is_summary;
use serde::Serialize;
use serde_json::json;
use subtle::ConstantTimeEq;

use crate::accept::LocalAddr;
use crate::edge;
use crate::error::ServeError;
use crate::identity::Identity;
use crate::session::calls::{CompactionMark, Marks};
use crate::session::key::SessionKey;
use crate::session::persist::store_id;
use crate::session::requests::Wire;
use crate::state::AppState;
use crate::token::digest;

/// The header the operator's token is presented in.
pub const OPERATOR_HEADER: &str = "x-ctx-operator-token";

/// Who is looking.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Viewer {
    /// The operator: every session.
    Operator,
    /// An identity: its own sessions (by scope).
    Own(String),
    /// No identity: no session.
    Nobody,
}

impl Viewer {
    fn of(state: &AppState, headers: &HeaderMap, identity: &Identity) -> Viewer {
        if let (Some(expected), Some(presented)) =
            (state.operator_digest(), headers.get(OPERATOR_HEADER))
            && bool::from(digest(presented.as_bytes()).ct_eq(expected))
        {
            return Viewer::Operator;
        }
        match identity.reader() {
            Some(_) => Viewer::Own(identity.scope()),
            None => Viewer::Nobody,
        }
    }

    fn sees(&self, scope: &str) -> bool {
        match self {
            Viewer::Operator => true,
            Viewer::Own(own) => own == scope,
            Viewer::Nobody => false,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Viewer::Operator => "operator",
            Viewer::Own(_) => "identity",
            Viewer::Nobody => "anonymous",
        }
    }
}

/// The rules every `/ui` route keeps: on, loopback unless remote, the site
/// rule.
fn gate(
    state: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
    local: Option<&LocalAddr>,
) -> Result<(), Refused> {
    let ui = &state.options().ui;
    if !ui.enabled {
        return Err(Refused::Off);
    }
    let local_ip = local.map(|l| l.0.ip());
    if !ui.remote && !local_ip.is_some_and(|ip| ip.is_loopback()) {
        return Err(ServeError::Forbidden(
            "the page answers on loopback connections only; set serve.ui.remote to serve it \
             to others (the access token and identity rules still hold)"
                .into(),
        )
        .into());
    }
    edge::site::check(
        state.allowed_hosts(),
        headers,
        uri,
        local_ip,
        edge::site::RouteKind::Passthrough,
    )
    .map_err(Refused::from)
}

/// The caller of a `/ui` route, past the page's rules ([`gate`]): who is
/// looking. A request the rules refuse is answered here.
pub struct Caller(Viewer);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Response> {
        let local = parts.extensions.get::<LocalAddr>().copied();
        gate(state, &parts.headers, &parts.uri, local.as_ref()).map_err(|e| answer(Err(e)))?;
        let identity = match Identity::from_request_parts(parts, state).await {
            Ok(identity) => identity,
            Err(never) => match never {},
        };
        Ok(Caller(Viewer::of(state, &parts.headers, &identity)))
    }
}

/// Why a `/ui` request is refused.
#[derive(Debug)]
enum Refused {
    /// The page is off: as if there were no such route.
    Off,
    /// Refused as any request is.
    Error(ServeError),
}

impl From<ServeError> for Refused {
    fn from(e: ServeError) -> Refused {
        Refused::Error(e)
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Off => (
                StatusCode::NOT_FOUND,
                "the page is off (serve.ui.enabled: false)\n",
            )
                .into_response(),
            Refused::Error(e) => e.into_response(),
        }
    }
}

/// Headers of every `/ui` answer: no caching, no sniffing, no framing,
/// the page's policy.
fn private(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(context_engine_view::ui_csp_header()),
    );
    response
}

fn answer(result: Result<Response, Refused>) -> Response {
    private(result.unwrap_or_else(IntoResponse::into_response))
}

/// `GET /ui`: the page (HTML, CSS and JavaScript in one document; no data).
pub async fn page(_: Caller) -> Response {
    private(
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            )],
            context_engine_view::ui_page(),
        )
            .into_response(),
    )
}

/// `GET /ui/api/overview`: the proxy's counters (as `/metrics`), the
/// sessions held, the store's health, and who is looking.
pub async fn overview(State(state): State<AppState>, Caller(viewer): Caller) -> Response {
    let mut metrics = state.metrics().overview();
    if viewer != Viewer::Operator {
        metrics.fallback_reasons.clear();
    }
    let store = match state.sessions().store() {
        None => json!({ "kind": "none" }),
        Some(s) => match s.health.degraded() {
            // Where the store is (a file path, a database host) is the
            // operator's to know.
            None if viewer == Viewer::Operator => {
                json!({ "kind": "ok", "location": s.store.location() })
            }
            None => json!({ "kind": "ok" }),
            Some((_, since)) => json!({ "kind": "degraded", "for_s": since.as_secs() }),
        },
    };
    let observed = state.options().mode == crate::options::ServeMode::Observe;
    let cost = state
        .options()
        .ui
        .price
        .as_ref()
        .map(|price| Estimate::of(price, &metrics, observed));
    private(
        Json(json!({
            "metrics": metrics,
            "cost": cost,
            "sessions": state.sessions().len(),
            "store": store,
            "viewer": viewer.name(),
            "mode": if observed { "observe" } else { "managed" },
            "calls_per_session": state.sessions().call_log(),
        }))
        .into_response(),
    )
}

/// The bill of the requests the proxy saw, estimated at the configured
/// prices: as sent (the prompt tokens the upstream reported, its cache
/// reads, the completions), and as the agents would have sent them without
/// the engine (the same, plus the prompt tokens the engine left out). The
/// second is a floor: without the engine the provider's cache might have
/// served more of the longer prompts, but never more than they held. The
/// first includes the engine's own summary calls (`summarizer.kind:
/// upstream`).
#[derive(Debug, Serialize)]
struct Estimate {
    /// The price model's name (a preset, or `custom`).
    price: String,
    with_engine: f64,
    without_engine: f64,
}

impl Estimate {
    /// In observe mode (`observed`) what the upstream reported is the bill
    /// without the engine, and the engine's is the same less what it would
    /// have left out.
    fn of(
        price: &context_engine::pricing::PriceModel,
        m: &crate::metrics::Overview,
        observed: bool,
    ) -> Estimate {
        let left_out = m
            .client_prompt_tokens
            .saturating_sub(m.managed_prompt_tokens);
        let bill = |prompt: u64| price.cost(prompt, m.cache_read_tokens, 0, m.completion_tokens);
        let (with, without) = if observed {
            (m.prompt_tokens.saturating_sub(left_out), m.prompt_tokens)
        } else {
            (m.prompt_tokens, m.prompt_tokens + left_out)
        };
        // The engine's own summary calls are part of its bill (observed:
        // what it would have spent).
        let summaries = price.cost(m.summary_prompt_tokens, 0, 0, m.summary_completion_tokens);
        Estimate {
            price: price.name.clone(),
            with_engine: bill(with) + summaries,
            without_engine: bill(without),
        }
    }
}

/// One session in the list.
#[derive(Serialize)]
struct Listed {
    scope: String,
    id: String,
    calls: u64,
    last_ms: u64,
    /// Sums over the calls kept.
    client_tokens: u64,
    upstream_tokens: u64,
    compactions: usize,
}

/// `GET /ui/api/sessions`: the caller's sessions (the operator's: all),
/// most recent first.
pub async fn sessions(State(state): State<AppState>, Caller(viewer): Caller) -> Response {
    if viewer == Viewer::Nobody {
        return answer(Err(no_identity().into()));
    }
    let mut listed: Vec<Listed> = state
        .sessions()
        .list()
        .into_iter()
        .filter(|(key, _)| viewer.sees(&key.scope))
        .map(|(key, slot)| {
            let log = slot
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (client_tokens, upstream_tokens) = log.sums();
            Listed {
                scope: key.scope,
                id: key.id,
                calls: log.total(),
                last_ms: log.last_ms(),
                client_tokens,
                upstream_tokens,
                compactions: log.compactions().count(),
            }
        })
        .collect();
    listed.sort_by(|a, b| b.last_ms.cmp(&a.last_ms).then(a.id.cmp(&b.id)));
    answer(Ok(Json(
        json!({ "viewer": viewer.name(), "sessions": listed }),
    )
    .into_response()))
}

fn no_identity() -> ServeError {
    ServeError::NoIdentity(
        "the page shows a caller's own sessions: send your provider key (Authorization) or, \
         behind the access token, the identity header your gateway sets; the operator's \
         token (serve.ui.operator_token_env) shows all"
            .into(),
    )
}

/// The session `scope`/`id` if the caller may see it.
fn visible(
    state: &AppState,
    viewer: &Viewer,
    scope: String,
    id: String,
) -> Result<(SessionKey, std::sync::Arc<crate::session::Slot>), ServeError> {
    if *viewer == Viewer::Nobody {
        return Err(no_identity());
    }
    // Another identity's session is answered as a missing one.
    if !viewer.sees(&scope) {
        return Err(ServeError::SessionNotFound(id));
    }
    let key = SessionKey { scope, id };
    let slot = state
        .sessions()
        .get(&key)
        .ok_or_else(|| ServeError::SessionNotFound(key.id.clone()))?;
    Ok((key, slot))
}

/// One call as the chart draws it.
#[derive(Serialize)]
struct Call {
    n: u64,
    client: u32,
    upstream: u32,
    at_s: u32,
    #[serde(flatten)]
    marks: Marks,
}

/// `GET /ui/api/sessions/{scope}/{id}`: the session's calls kept, its
/// compactions, window and threshold, and its figures.
pub async fn session(
    State(state): State<AppState>,
    Caller(viewer): Caller,
    Path((scope, id)): Path<(String, String)>,
) -> Response {
    let (key, slot) = match visible(&state, &viewer, scope, id) {
        Ok(v) => v,
        Err(e) => return answer(Err(e.into())),
    };
    let (calls, compactions): (Vec<Call>, Vec<CompactionMark>) = {
        let log = slot
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (
            log.points()
                .map(|(n, p)| Call {
                    n,
                    client: p.client_tokens,
                    upstream: p.upstream_tokens,
                    at_s: p.at_s,
                    marks: p.marks(),
                })
                .collect(),
            log.compactions().cloned().collect(),
        )
    };
    // The engine's figures, unless a request holds the session long.
    let engine = match tokio::time::timeout(Duration::from_secs(2), slot.state.lock()).await {
        Ok(guard) => guard.as_ref().map(|m| {
            let s = m.host().engine().state();
            json!({
                "engine": m.host().engine().name(),
                "window": s.context_length,
                "threshold": s.threshold_tokens,
                "stats": m.stats,
                "asleep": m.is_asleep(),
                "managed_messages": m.managed_messages(),
            })
        }),
        Err(_) => None,
    };
    let requests = state.sessions().requests().calls_of(&key);
    answer(Ok(Json(json!({
        "scope": key.scope,
        "id": key.id,
        "calls": calls,
        "compactions": compactions,
        "requests": requests,
        "session": engine,
    }))
    .into_response()))
}

/// One message of a call's request as the page shows it: the message
/// (redacted), its tokens, and what became of it (client side) or where it
/// came from (upstream).
#[derive(Serialize)]
struct Shown<T> {
    message: Message,
    tokens: usize,
    #[serde(flatten)]
    how: T,
}

#[derive(Serialize)]
struct FateOf {
    fate: Fate,
}

/// `GET /ui/api/sessions/{scope}/{id}/calls/{n}`: call `n`'s request,
/// when the request log still holds it: what the client sent and what went
/// upstream, message by message ([`request_map`]), texts redacted with
/// the user's patterns.
pub async fn request(
    State(state): State<AppState>,
    Caller(viewer): Caller,
    Path((scope, id, call)): Path<(String, String, u64)>,
) -> Response {
    let (key, _slot) = match visible(&state, &viewer, scope, id) {
        Ok(v) => v,
        Err(e) => return answer(Err(e.into())),
    };
    let Some(kept) = state.sessions().requests().get(&key, call) else {
        return answer(Err(ServeError::NotFound(format!(
            "call {call} of this session is not kept: the page keeps the last calls' requests, \
             {} bytes in all (serve.ui.request_bytes)",
            state.options().ui.request_bytes
        ))
        .into()));
    };
    let counter = std::sync::Arc::clone(&state.sessions().context().counter);
    let egress = state.options().ui.egress.clone();
    let shown = tokio::task::spawn_blocking(move || {
        let (client, upstream) = kept.messages()?;
        let view = request_map::map(&client, &upstream);
        let show = |m: &Message| (egress.message(m), counter.count_message(m));
        let client: Vec<Shown<FateOf>> = client
            .iter()
            .zip(view.client)
            .map(|(m, fate)| {
                let (message, tokens) = show(m);
                Shown {
                    message,
                    tokens,
                    how: FateOf { fate },
                }
            })
            .collect();
        let upstream: Vec<Shown<Source>> = upstream
            .iter()
            .zip(view.upstream)
            .map(|(m, source)| {
                let (message, tokens) = show(m);
                Shown {
                    message,
                    tokens,
                    how: source,
                }
            })
            .collect();
        Ok::<_, ServeError>(json!({
            "call": call,
            "format": match kept.wire {
                Wire::Chat => "chat",
                Wire::Front(kind) => kind.name(),
            },
            "client": client,
            "upstream": upstream,
        }))
    })
    .await;
    match shown {
        Ok(Ok(v)) => answer(Ok(Json(v).into_response())),
        Ok(Err(e)) => answer(Err(e.into())),
        Err(_) => answer(Err(ServeError::Internal(
            "reading the call's request failed".into(),
        )
        .into())),
    }
}

/// `GET /ui/api/sessions/{scope}/{id}/compactions`: each compaction the
/// session's store recorded, with the summary it added and the messages it
/// replaced; without a store, the summary the managed history carries now.
pub async fn compactions(
    State(state): State<AppState>,
    Caller(viewer): Caller,
    Path((scope, id)): Path<(String, String)>,
) -> Response {
    let (key, slot) = match visible(&state, &viewer, scope, id) {
        Ok(v) => v,
        Err(e) => return answer(Err(e.into())),
    };
    let marks: Vec<CompactionMark> = slot
        .calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .compactions()
        .cloned()
        .collect();
    if let Some(store) = state.sessions().store().cloned() {
        let name = store_id(&key);
        let read = tokio::task::spawn_blocking(move || {
            archived_compactions(store.store.as_ref(), &name, 1..=u64::MAX)
        })
        .await;
        let archived: Vec<ArchivedCompaction> = match read {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "page: cannot read the session's compactions");
                return answer(Err(ServeError::Internal(
                    "the session store does not answer".into(),
                )
                .into()));
            }
            Err(_) => {
                return answer(Err(
                    ServeError::Internal("the store read failed".into()).into()
                ));
            }
        };
        return answer(Ok(Json(json!({
            "store": true,
            "marks": marks,
            "archived": archived,
        }))
        .into_response()));
    }
    let summary: Vec<Message> =
        match tokio::time::timeout(Duration::from_secs(2), slot.state.lock()).await {
            Ok(guard) => guard
                .as_ref()
                .map(|m| {
                    m.history()
                        .iter()
                        .filter(|m| is_summary(m))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
    answer(Ok(Json(json!({
        "store": false,
        "marks": marks,
        "summary": summary,
    }))
    .into_response()))
}

/// Longest query the page's search takes, in bytes.
const MAX_QUERY_BYTES: usize = 200;

/// Hits the page's search returns.
const SEARCH_HITS: usize = 10;

/// `GET /ui/api/sessions/{scope}/{id}/search/{query}`: the session's
/// archive searched as `context_search` searches it (the store's full-text
/// index), each hit with its handle and the lines that matched (the
/// query's words as byte ranges, which the page marks); needs a session
/// store.
pub async fn search(
    State(state): State<AppState>,
    Caller(viewer): Caller,
    Path((scope, id, query)): Path<(String, String, String)>,
) -> Response {
    let (key, _slot) = match visible(&state, &viewer, scope, id) {
        Ok(v) => v,
        Err(e) => return answer(Err(e.into())),
    };
    let query = query.trim().to_owned();
    if query.is_empty() || query.len() > MAX_QUERY_BYTES {
        return answer(Err(ServeError::BadRequest(format!(
            "the search takes 1 to {MAX_QUERY_BYTES} bytes"
        ))
        .into()));
    }
    let Some(store) = state.sessions().store().cloned() else {
        return answer(Ok(
            Json(json!({ "store": false, "hits": [] })).into_response()
        ));
    };
    let name = store_id(&key);
    let read =
        tokio::task::spawn_blocking(move || store.store.search(Some(&name), &query, SEARCH_HITS))
            .await;
    match read {
        Ok(Ok(hits)) => answer(Ok(
            Json(json!({ "store": true, "hits": hits })).into_response()
        )),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "page: the session's search failed");
            answer(Err(ServeError::Internal(
                "the session store does not answer".into(),
            )
            .into()))
        }
        Err(_) => answer(Err(ServeError::Internal("the search failed".into()).into())),
    }
}
