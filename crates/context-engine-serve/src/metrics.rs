//! Prometheus metrics, all prefixed `ctx_`, labelled by route, status and
//! a reason from a fixed set only (session ids would make the label set
//! unbounded; per-session figures are at `/ctx/sessions/{id}`).

use std::sync::atomic::{AtomicU64, Ordering};

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

type Histograms = Family<Route, Histogram, fn() -> Histogram>;

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
    fallbacks: Counter,
    unmanaged: Family<RouteReason, Counter>,
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
            fallbacks: Counter::default(),
            unmanaged: Family::default(),
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
        };
        registry.register(
            "store_seconds",
            "Time of each session store call (version check, load, commit), answered or not",
            m.store_latency.clone(),
        );
        registry.register(
            "requests",
            "Responses sent, by route and status",
            m.requests.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time the upstream took to answer (whole body, or the stream to its end)",
            m.upstream_latency.clone(),
        );
        registry.register(
            "overhead_seconds",
            "Latency the proxy added: request time minus upstream time",
            m.overhead.clone(),
        );
        registry.register(
            "stream_ttfb_overhead_seconds",
            "Time from the request's arrival to the upstream call of a stream",
            m.ttfb_overhead.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens the upstream reported",
            m.tokens_in.clone(),
        );
        registry.register(
            "completion_tokens",
            "Completion tokens the upstream reported",
            m.tokens_out.clone(),
        );
        registry.register("compactions", "Compactions accepted", m.compactions.clone());
        registry.register(
            "fallbacks",
            "Requests sent unmanaged because the engine failed or its request was invalid",
            m.fallbacks.clone(),
        );
        registry.register(
            "unmanaged",
            "Requests passed through without the engine by design, by route and reason (e.g. a Responses request on server-side state)",
            m.unmanaged.clone(),
        );
        registry.register(
            "stream_cuts",
            "Streams that broke off before their end (the client got an error event), by route and reason",
            m.stream_cuts.clone(),
        );
        registry.register(
            "upstream_connect_retries",
            "Upstream connections retried after failing before any byte of the request was sent",
            m.connect_retries.clone(),
        );
        registry.register(
            "cache_read_tokens",
            "Prompt tokens the upstream reported as read from its prompt cache",
            m.cache_read.clone(),
        );
        registry.register(
            "cache_write_tokens",
            "Prompt tokens the upstream reported as written to its prompt cache",
            m.cache_write.clone(),
        );
        registry.register(
            "lineages",
            "New lineages started because a client history diverged",
            m.lineages.clone(),
        );
        registry.register(
            "engine_tool_rounds",
            "Upstream round trips spent resolving engine-tool calls",
            m.tool_rounds.clone(),
        );
        registry.register(
            "prompt_bytes",
            "Bytes of managed message arrays sent upstream",
            m.prompt_bytes.clone(),
        );
        registry.register(
            "prompt_prefix_reused_bytes",
            "Bytes of those arrays identical to the session's previous request (cacheable prefix)",
            m.prefix_bytes.clone(),
        );
        registry.register(
            "cache_hit_share_estimate",
            "Share of prompt bytes a provider prompt cache could serve (prefix reused / total)",
            m.cache_share.clone(),
        );
        registry.register("sessions", "Sessions held in memory", m.sessions.clone());
        registry.register(
            "inflight_request_bytes",
            "Request body bytes held by requests in flight (capped by serve.max_inflight_bytes)",
            m.inflight_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// One response on `route` with `status`.
    pub fn request(&self, route: &str, status: u16) {
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

    /// A request went out unmanaged.
    pub fn fallback(&self) {
        self.fallbacks.inc();
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
