//! `ctx serve`: run the engine as an OpenAI-compatible proxy. Flags and
//! `serve.*` configuration in, `context_engine_serve::run` out.

use crate::exit::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use context_engine::builder::Engines;
use context_engine::engine::ContextEngine;
use context_engine::redact::Egress;
use context_engine::store::{SessionStore, StoreError};
use context_engine::validate::Profile;
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_serve::config::env_value;
use context_engine_serve::{FactoryError, ServeOptions, SessionContext, UpstreamSummarizer};

/// Arguments of `ctx serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The provider's base URL, as in the OpenAI SDKs (`https://…/v1`);
    /// overrides `serve.upstream.url`.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Address to listen on (default `serve.listen`, 127.0.0.1:8787). Any
    /// non-loopback address needs `serve.auth_token_env`.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Provider rules every request must keep: `openai` or `strict`.
    #[arg(long, default_value = "openai")]
    pub profile: Profile,
    /// Offer the engine's tools (`context_recall`) to the model on requests
    /// that carry tools of their own (overrides `serve.engine_tools`, on by
    /// default).
    #[arg(long, overrides_with = "no_engine_tools")]
    pub engine_tools: bool,
    /// Do not offer the engine's tools (overrides `serve.engine_tools`).
    #[arg(long, overrides_with = "engine_tools")]
    pub no_engine_tools: bool,
    /// Observe mode (`serve.mode: observe`): every request goes upstream
    /// exactly as the client sent it; the engine runs beside the traffic
    /// and the page, `/metrics` and `/ctx/sessions/{id}` show what it would
    /// have sent.
    #[arg(long)]
    pub observe: bool,
    /// Keep sessions in a store: a SQLite file, `:memory:`, or
    /// `postgres://user@host:port/db` shared by a fleet of instances (the
    /// password from the variable `store.password_env` names). Overrides
    /// `store.url` / `store.path`; without either, sessions live in this
    /// process only.
    #[arg(long, value_name = "PATH|URL")]
    pub store: Option<String>,
    #[command(flatten)]
    pub engine: super::engine::EngineArgs,
}

/// Run `ctx serve` until Ctrl-C or SIGTERM.
pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let Proxy {
        options,
        ctx,
        window,
    } = prepare(args)?;
    let listen = options.listen;
    if options.mode == context_engine_serve::ServeMode::Observe {
        eprintln!(
            "ctx serve: observe mode: requests go upstream as the clients send them; the engine only shows what it would have sent"
        );
    }
    eprintln!(
        "ctx serve: http://{listen}/v1 -> {} (window {} tokens); metrics at http://{listen}/metrics{}",
        options.upstream.url,
        window,
        if options.ui.enabled {
            format!("; the page at http://{listen}/ui")
        } else {
            String::new()
        }
    );
    context_engine_serve::run(options, ctx)?;
    Ok(ExitCode::SUCCESS)
}

/// The proxy `args` and the configuration describe, ready to serve.
pub struct Proxy {
    pub options: ServeOptions,
    /// Its sessions' engine (a plugin started and checked, the first
    /// request's work done).
    pub ctx: SessionContext,
    /// The model's window, in tokens.
    pub window: u64,
}

/// The proxy `args` and the configuration describe (see [`Proxy`]).
pub fn prepare(args: &ServeArgs) -> anyhow::Result<Proxy> {
    // The one place config becomes an engine; a broken configuration fails
    // here, at start, not on the first request.
    let profile = args.profile;
    let (mut builder, warnings) = args.engine.builder(profile)?;
    for w in &warnings {
        eprintln!("ctx: warning: {w}");
    }
    let config = builder.config().clone();
    // A flag means what its key means: applied over `serve.*`, then the
    // one mapping (in the serve crate) makes the options.
    let mut s = config.serve.clone();
    if let Some(url) = &args.upstream {
        s.upstream.url = Some(url.clone());
    }
    if let Some(listen) = &args.listen {
        s.listen = listen.clone();
    }
    s.engine_tools = !args.no_engine_tools && (args.engine_tools || s.engine_tools);
    if args.observe {
        s.mode = context_engine_serve::ServeMode::Observe;
    }
    let env = super::engine::process_env();
    let mut options = ServeOptions::from_config(&s, &env)?.with_store(open_store(
        args.store.as_deref(),
        &config,
        &env,
    )?);
    let egress = Egress::new(Some(Arc::new(config.redactor()?)));
    if options.ui.enabled {
        options.ui = options
            .ui
            .with_price(config.pricing.price_model())
            .with_egress(egress.clone());
    }
    // `summarizer.kind: upstream`: summaries asked of this upstream, in
    // each client's API, with its credential (prepared in the background).
    if let Some(summary) = config.upstream_summary_config() {
        let upstream = UpstreamSummarizer::new(summary, egress)?;
        builder = builder.with_upstream_summarizer(Arc::new(upstream));
    }
    let engines = builder.build().map_err(super::engine::flagged)?;

    // One engine now (a plugin is started and checked); each session then
    // gets a fresh one of the same configuration, sharing the counter, the
    // redactor and the summarizer client.
    let probe = engines.engine().map_err(super::engine::flagged)?;
    for w in &probe.warnings {
        eprintln!("ctx: warning: {w}");
    }
    // A plugin process blocks on I/O: such engines run on the blocking pool.
    let blocking = Engines::blocks(&probe.source);
    // What the first request would pay for (tokenizer tables, rules, the
    // engine's first step) is paid now, on the probe, before the proxy
    // reports ready.
    engines.warm_up(probe.engine);
    let (counter, context_length) = (Arc::clone(engines.counter()), engines.context_length());
    // A model summarizer never runs on the request path: its summaries are
    // prepared in the background from `serve.summary_watermark` of the
    // threshold and swapped in when the threshold is crossed.
    let watermark = engines
        .summarizer_client()
        .is_some()
        .then_some(s.summary_watermark);
    let host = engines.host_options().with_summary_watermark(watermark);
    let build = move |_id: &str| -> Result<Box<dyn ContextEngine>, FactoryError> {
        Ok(engines.engine()?.engine)
    };
    let ctx = SessionContext {
        factory: Arc::new(build),
        counter,
        host,
        blocking,
    };
    Ok(Proxy {
        options,
        ctx,
        window: context_length,
    })
}

/// The session store `ctx serve` keeps sessions in: `--store`, else
/// `store.url`, else an explicit `store.path`; `None` without any.
fn open_store(
    flag: Option<&str>,
    full: &context_engine::config::Config,
    env: &context_engine::config::Env,
) -> anyhow::Result<Option<Arc<dyn SessionStore>>> {
    let config = &full.store;
    let spec = flag
        .map(str::to_owned)
        .or_else(|| config.url.clone())
        .or_else(|| config.path.as_ref().map(|p| p.display().to_string()));
    let Some(spec) = spec else { return Ok(None) };
    // What the store keeps: redacted unless store.verbatim (then encrypted
    // with the key store.encryption_key_env names, or in the clear, loudly).
    let at_rest = full.at_rest(env)?;
    if let Some(warning) = at_rest.warning() {
        eprintln!("ctx: WARNING: {warning}");
    }
    if !context_engine_postgres::is_postgres_url(&spec) {
        let store = context_engine_sqlite::open_at_rest(std::path::Path::new(&spec), &at_rest)?;
        eprintln!("ctx serve: sessions kept in {}", store.location());
        return Ok(Some(store));
    }
    if context_engine_postgres::url_has_password(&spec) {
        anyhow::bail!(
            "the store URL must not carry a password ({}): put it in an environment variable and name it in store.password_env",
            context_engine_postgres::redacted_url(&spec)
        );
    }
    let password = env_value(env, config.password_env.as_deref(), "store.password_env")?;
    let options = PgOptions::new(spec)
        .with_password(password)
        .with_pool_size(config.pool_size)
        .with_timeout(Duration::from_secs(config.timeout_seconds.max(1)))
        .with_durable_records(config.durable_records);
    let store = PgStore::new(&options)?;
    match store.check() {
        Ok(()) => {
            eprintln!("ctx serve: sessions kept in {}", store.location());
            // The first requests need not open connections.
            if let Err(e) = store.warm() {
                eprintln!("ctx: warning: the store's connections are opened on demand: {e}");
            }
        }
        // A newer schema is a deployment error: refuse to start.
        Err(e @ StoreError::NewerSchema { .. }) => return Err(e.into()),
        // Unreachable: serve unmanaged until it answers (fail open).
        Err(e) => eprintln!(
            "ctx: warning: session store unavailable, serving unmanaged until it answers: {e}"
        ),
    }
    Ok(Some(at_rest.wrap(Arc::new(store))))
}
