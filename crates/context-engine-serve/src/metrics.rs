//! Prometheus metrics, all prefixed `ctx_`, labelled by route, status and
//! a reason from a fixed set only (session ids would make the label set
//! unbounded; per-session figures are at `/ctx/sessions/{id}`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteStatus {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

type Histograms = Family<Route, Histogram, fn() -> Histogram>;

/// What model summaries cost (`summarizer.kind: upstream`), counted where
/// a background summary ends (off the request path): the calls by outcome
/// and the tokens the upstream reported for them, apart from the agents'.
#[derive(Clone, Debug, Default)]
pub struct SummaryMeter {
    calls: Family<Outcome, Counter>,
    prompt_tokens: Counter,
    completion_tokens: Counter,
}

impl SummaryMeter {
    /// One summary call: `ok` or why it failed, what it spent.
    pub fn call(&self, ok: bool, stats: &context_engine::summarize::openai::CallStats) {
        let outcome = if ok { "ok" } else { "failed" };
        self.calls
            .get_or_create(&Outcome {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.prompt_tokens.inc_by(stats.prompt_tokens.unwrap_or(0));
        self.completion_tokens
            .inc_by(stats.completion_tokens.unwrap_or(0));
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~100 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
}

/// The proxy's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    requests: Family<RouteStatus, Counter>,
    upstream_latency: Histograms,
    overhead: Histograms,
    ttfb_overhead: Histograms,
    tokens_in: Counter,
    tokens_out: Counter,
    compactions: Counter,
    compaction_thrash: Counter,
    ledger_cuts: Counter,
    fallbacks: Counter,
    unmanaged: Family<RouteReason, Counter>,
    observed: Family<RouteReason, Counter>,
    observe_errors: Family<RouteReason, Counter>,
    stream_cuts: Family<RouteReason, Counter>,
    connect_retries: Counter,
    cache_read: Counter,
    cache_write: Counter,
    lineages: Counter,
    tool_rounds: Counter,
    prompt_bytes: Counter,
    prefix_bytes: Counter,
    cache_share: Gauge<f64, AtomicU64>,
    sessions: Gauge,
    inflight_bytes: Gauge,
    prompt_total: AtomicU64,
    prefix_total: AtomicU64,
    store_latency: Histogram,
    client_tokens: Counter,
    managed_tokens: Counter,
    summaries: SummaryMeter,
    api_requests: AtomicU64,
    recent: Mutex<Recent>,
}

/// What the page's overview shows besides the counters: the added latency
/// of the last requests and the last fallbacks' reasons (bounded).
#[derive(Debug, Default)]
struct Recent {
    overhead_ms: VecDeque<f32>,
    fallbacks: VecDeque<(u64, String)>,
}

/// Added-latency samples kept for the overview's percentiles.
const OVERHEAD_SAMPLES: usize = 1024;
/// Fallback reasons kept for the overview.
const FALLBACK_REASONS: usize = 10;

/// The counters the page's overview shows, read at once (see
/// [`Metrics::overview`]): the same values `/metrics` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Overview {
    /// Responses on the `/v1/` routes (`ctx_requests_total` over them).
    pub requests: u64,
    /// Prompt tokens of the clients' histories, counted
    /// (`ctx_client_prompt_tokens_total`).
    pub client_prompt_tokens: u64,
    /// Prompt tokens of the managed requests, counted
    /// (`ctx_managed_prompt_tokens_total`).
    pub managed_prompt_tokens: u64,
    /// Prompt tokens the upstream reported (`ctx_prompt_tokens_total`).
    pub prompt_tokens: u64,
    /// Completion tokens the upstream reported.
    pub completion_tokens: u64,
    /// Prompt tokens the upstream read from its cache.
    pub cache_read_tokens: u64,
    /// Compactions accepted.
    pub compactions: u64,
    /// Compactions within a few calls of the previous one (thrash).
    pub compaction_thrash: u64,
    /// Requests whose window could not hold the summary's state record.
    pub ledger_cuts: u64,
    /// Requests sent unmanaged because the engine failed.
    pub fallbacks: u64,
    /// New lineages.
    pub lineages: u64,
    /// Added latency of the last requests (up to 1,024), in milliseconds:
    /// 50th, 90th and 99th percentiles (nearest rank); `None` before any.
    pub overhead_ms: Option<[f64; 3]>,
    /// The last fallbacks' reasons (newest last), with their Unix
    /// milliseconds.
    pub fallback_reasons: Vec<(u64, String)>,
    /// Prompt tokens the upstream reported for the engine's own summary
    /// calls (`ctx_summary_prompt_tokens_total`).
    pub summary_prompt_tokens: u64,
    /// Completion tokens of those calls.
    pub summary_completion_tokens: u64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// All metrics, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ctx");
        let requests = Family::<RouteStatus, Counter>::default();
        let upstream_latency: Histograms = Family::new_with_constructor(latency_histogram);
        let overhead: Histograms = Family::new_with_constructor(latency_histogram);
        let ttfb_overhead: Histograms = Family::new_with_constructor(latency_histogram);
        let m = Metrics {
            registry: Registry::default(),
            requests,
            upstream_latency,
            overhead,
            ttfb_overhead,
            tokens_in: Counter::default(),
            tokens_out: Counter::default(),
            compactions: Counter::default(),
            compaction_thrash: Counter::default(),
            ledger_cuts: Counter::default(),
            fallbacks: Counter::default(),
            unmanaged: Family::default(),
            observed: Family::default(),
            observe_errors: Family::default(),
            stream_cuts: Family::default(),
            connect_retries: Counter::default(),
            cache_read: Counter::default(),
            cache_write: Counter::default(),
            lineages: Counter::default(),
            tool_rounds: Counter::default(),
            prompt_bytes: Counter::default(),
            prefix_bytes: Counter::default(),
            cache_share: Gauge::default(),
            sessions: Gauge::default(),
            inflight_bytes: Gauge::default(),
            prompt_total: AtomicU64::new(0),
            prefix_total: AtomicU64::new(0),
            store_latency: latency_histogram(),
            client_tokens: Counter::default(),
            managed_tokens: Counter::default(),
            summaries: SummaryMeter::default(),
            api_requests: AtomicU64::new(0),
            recent: Mutex::default(),
        };
        m.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Registers every metric under its name and help text.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_seconds",
            "Time of each session store call (version check, load, commit), answered or not",
            self.store_latency.clone(),
        );
        registry.register(
            "requests",
            "Responses sent, by route and status",
            self.requests.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time the upstream took to answer (whole body, or the stream to its end)",
            self.upstream_latency.clone(),
        );
        registry.register(
            "overhead_seconds",
            "Latency the proxy added: request time minus upstream time",
            self.overhead.clone(),
        );
        registry.register(
            "stream_ttfb_overhead_seconds",
            "Time from the request's arrival to the upstream call of a stream",
            self.ttfb_overhead.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens the upstream reported",
            self.tokens_in.clone(),
        );
        registry.register(
            "completion_tokens",
            "Completion tokens the upstream reported",
            self.tokens_out.clone(),
        );
        registry.register(
            "client_prompt_tokens",
            "Prompt tokens of the clients' histories of managed requests, counted (what went upstream without the engine)",
            self.client_tokens.clone(),
        );
        registry.register(
            "managed_prompt_tokens",
            "Prompt tokens of the managed requests sent upstream, counted",
            self.managed_tokens.clone(),
        );
        registry.register(
            "compactions",
            "Compactions accepted",
            self.compactions.clone(),
        );
        registry.register(
            "compaction_thrash",
            "Compactions within a few calls of the previous one (the window barely holds the system prompt and the tail; each compacted deeper)",
            self.compaction_thrash.clone(),
        );
        registry.register(
            "ledger_cuts",
            "Requests whose window could not hold the summary's state record whole (the history keeps it)",
            self.ledger_cuts.clone(),
        );
        registry.register(
            "fallbacks",
            "Requests sent unmanaged because the engine failed or its request was invalid",
            self.fallbacks.clone(),
        );
        registry.register(
            "unmanaged",
            "Requests passed through without the engine, by route and reason (e.g. a Responses request on server-side state, or `session_busy`: the session still held by another call past serve.session_wait_seconds)",
            self.unmanaged.clone(),
        );
        registry.register(
            "observed_requests",
            "Observe mode: requests sent upstream untouched with the engine run beside them, by route and what the engine would have done (managed, or unmanaged by design)",
            self.observed.clone(),
        );
        registry.register(
            "observe_errors",
            "Observe mode: requests the engine could not observe (an unreadable body, an engine or store failure), by route and reason; the request went upstream as it came",
            self.observe_errors.clone(),
        );
        registry.register(
            "stream_cuts",
            "Streams that broke off before their end (the client got an error event), by route and reason",
            self.stream_cuts.clone(),
        );
        registry.register(
            "upstream_connect_retries",
            "Upstream connections retried after failing before any byte of the request was sent",
            self.connect_retries.clone(),
        );
        registry.register(
            "cache_read_tokens",
            "Prompt tokens the upstream reported as read from its prompt cache",
            self.cache_read.clone(),
        );
        registry.register(
            "cache_write_tokens",
            "Prompt tokens the upstream reported as written to its prompt cache",
            self.cache_write.clone(),
        );
        registry.register(
            "lineages",
            "New lineages started because a client history diverged",
            self.lineages.clone(),
        );
        registry.register(
            "engine_tool_rounds",
            "Upstream round trips spent resolving engine-tool calls",
            self.tool_rounds.clone(),
        );
        registry.register(
            "prompt_bytes",
            "Bytes of managed message arrays sent upstream",
            self.prompt_bytes.clone(),
        );
        registry.register(
            "prompt_prefix_reused_bytes",
            "Bytes of those arrays identical to the session's previous request (cacheable prefix)",
            self.prefix_bytes.clone(),
        );
        registry.register(
            "cache_hit_share_estimate",
            "Share of prompt bytes a provider prompt cache could serve (prefix reused / total)",
            self.cache_share.clone(),
        );
        registry.register("sessions", "Sessions held in memory", self.sessions.clone());
        registry.register(
            "summary_calls",
            "The engine's own summary calls to the upstream (summarizer.kind: upstream), by outcome",
            self.summaries.calls.clone(),
        );
        registry.register(
            "summary_prompt_tokens",
            "Prompt tokens the upstream reported for the engine's summary calls (apart from the agents')",
            self.summaries.prompt_tokens.clone(),
        );
        registry.register(
            "summary_completion_tokens",
            "Completion tokens the upstream reported for the engine's summary calls",
            self.summaries.completion_tokens.clone(),
        );
        registry.register(
            "inflight_request_bytes",
            "Request body bytes held by requests in flight (capped by serve.max_inflight_bytes)",
            self.inflight_bytes.clone(),
        );
    }

    /// One response on `route` with `status`.
    pub fn request(&self, route: &str, status: u16) {
        if route.starts_with("/v1/") {
            self.api_requests.fetch_add(1, Ordering::Relaxed);
        }
        self.requests
            .get_or_create(&RouteStatus {
                route: route.to_owned(),
                status,
            })
            .inc();
    }

    /// Upstream time and proxy overhead of one request.
    pub fn latency(&self, route: &str, upstream: f64, overhead: f64) {
        let r = Route {
            route: route.to_owned(),
        };
        self.upstream_latency.get_or_create(&r).observe(upstream);
        self.overhead.get_or_create(&r).observe(overhead);
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.overhead_ms.len() >= OVERHEAD_SAMPLES {
            recent.overhead_ms.pop_front();
        }
        recent.overhead_ms.push_back((overhead * 1e3) as f32);
    }

    /// Time from a stream's arrival to its upstream call.
    pub fn ttfb_overhead(&self, route: &str, seconds: f64) {
        self.ttfb_overhead
            .get_or_create(&Route {
                route: route.to_owned(),
            })
            .observe(seconds);
    }

    /// Usage the upstream reported.
    pub fn tokens(&self, prompt: u64, completion: u64) {
        self.tokens_in.inc_by(prompt);
        self.tokens_out.inc_by(completion);
    }

    /// Prompt-cache reads and writes the upstream reported.
    pub fn cache_tokens(&self, read: Option<u64>, write: Option<u64>) {
        self.cache_read.inc_by(read.unwrap_or(0));
        self.cache_write.inc_by(write.unwrap_or(0));
    }

    /// Observe mode: a request on `route` went upstream untouched and the
    /// engine would have `what` it (`managed`, or a reason it would not).
    pub fn observed(&self, route: &str, what: &str) {
        self.observed
            .get_or_create(&RouteReason {
                route: route.to_owned(),
                reason: what.to_owned(),
            })
            .inc();
    }

    /// Observe mode: the engine could not observe a request on `route`.
    pub fn observe_error(&self, route: &str, reason: &str) {
        self.observe_errors
            .get_or_create(&RouteReason {
                route: route.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A request on `route` passed through without the engine, by design.
    pub fn unmanaged(&self, route: &str, reason: &str) {
        self.unmanaged
            .get_or_create(&RouteReason {
                route: route.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A stream on `route` broke off before its end, for `reason`.
    pub fn stream_cut(&self, route: &str, reason: &str) {
        self.stream_cuts
            .get_or_create(&RouteReason {
                route: route.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The counter of upstream connect retries (shared with the upstream
    /// client, which counts into it).
    pub fn connect_retries(&self) -> Counter {
        self.connect_retries.clone()
    }

    /// A compaction was accepted.
    pub fn compaction(&self) {
        self.compactions.inc();
    }

    /// What the engine warned of on a request: compaction thrash, a state
    /// record cut to fit the window.
    pub fn engine_warnings(&self, notices: &[context_engine::host::Notice]) {
        for n in notices {
            if n.text.starts_with(context_engine::host::THRASH) {
                self.compaction_thrash.inc();
            } else if n.text.starts_with(context_engine::host::LEDGER_CUT) {
                self.ledger_cuts.inc();
            }
        }
    }

    /// A request went out unmanaged.
    pub fn fallback(&self) {
        self.fallbacks.inc();
    }

    /// A request went out unmanaged for `reason` (kept for the page's
    /// overview, the last few only).
    pub fn fallback_because(&self, reason: &str) {
        self.fallback();
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.fallbacks.len() >= FALLBACK_REASONS {
            recent.fallbacks.pop_front();
        }
        let reason: String = reason.chars().take(300).collect();
        recent
            .fallbacks
            .push_back((context_engine::store::now_ms(), reason));
    }

    /// A managed request: the tokens of the client's history and of the
    /// request that went upstream, both counted.
    pub fn managed_tokens(&self, client: u64, upstream: u64) {
        self.client_tokens.inc_by(client);
        self.managed_tokens.inc_by(upstream);
    }

    /// The counters of the page's overview.
    pub fn overview(&self) -> Overview {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let mut samples: Vec<f64> = recent.overhead_ms.iter().map(|&v| f64::from(v)).collect();
        samples.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let k = (q * samples.len() as f64).ceil() as usize;
            samples[k.clamp(1, samples.len()) - 1]
        };
        Overview {
            requests: self.api_requests.load(Ordering::Relaxed),
            client_prompt_tokens: self.client_tokens.get(),
            managed_prompt_tokens: self.managed_tokens.get(),
            prompt_tokens: self.tokens_in.get(),
            completion_tokens: self.tokens_out.get(),
            cache_read_tokens: self.cache_read.get(),
            compactions: self.compactions.get(),
            compaction_thrash: self.compaction_thrash.get(),
            ledger_cuts: self.ledger_cuts.get(),
            fallbacks: self.fallbacks.get(),
            lineages: self.lineages.get(),
            overhead_ms: (!samples.is_empty()).then(|| [rank(0.5), rank(0.9), rank(0.99)]),
            fallback_reasons: recent.fallbacks.iter().cloned().collect(),
            summary_prompt_tokens: self.summaries.prompt_tokens.get(),
            summary_completion_tokens: self.summaries.completion_tokens.get(),
        }
    }

    /// The meter background summaries report to.
    pub fn summaries(&self) -> SummaryMeter {
        self.summaries.clone()
    }

    /// A diverging history started a new lineage.
    pub fn lineage(&self) {
        self.lineages.inc();
    }

    /// An engine-tool round trip.
    pub fn tool_round(&self) {
        self.tool_rounds.inc();
    }

    /// Bytes of a managed message array and of its prefix identical to the
    /// session's previous one.
    pub fn prompt(&self, total: usize, reused: usize) {
        self.prompt_bytes.inc_by(total as u64);
        self.prefix_bytes.inc_by(reused as u64);
        let t = self.prompt_total.fetch_add(total as u64, Ordering::Relaxed) + total as u64;
        let p = self
            .prefix_total
            .fetch_add(reused as u64, Ordering::Relaxed)
            + reused as u64;
        if t > 0 {
            self.cache_share.set(p as f64 / t as f64);
        }
    }

    /// Sessions held now.
    pub fn set_sessions(&self, n: usize) {
        self.sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Request body bytes in flight now.
    pub fn set_inflight_bytes(&self, n: usize) {
        self.inflight_bytes
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The histogram session store calls are timed into.
    pub fn store_latency(&self) -> Histogram {
        self.store_latency.clone()
    }

    /// The Prometheus/OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use context_engine::host::{LEDGER_CUT, Notice, NoticeKind, THRASH};

    #[test]
    fn thrash_and_state_record_cuts_are_counted() {
        let m = Metrics::new();
        let warn = |text: String| Notice {
            kind: NoticeKind::Warning,
            text,
        };
        m.engine_warnings(&[
            warn(format!("{THRASH}: compacted again 1 call(s) after")),
            warn(format!("{LEDGER_CUT}: the window (1024 tokens) …")),
            warn("the request is over the window".to_owned()),
        ]);
        m.engine_warnings(&[warn(format!("{THRASH}: again"))]);
        let text = m.encode();
        assert!(text.contains("ctx_compaction_thrash_total 2"), "{text}");
        assert!(text.contains("ctx_ledger_cuts_total 1"), "{text}");
        let o = m.overview();
        assert_eq!((o.compaction_thrash, o.ledger_cuts), (2, 1));
    }
}
