//! Serving an [`AppState`]: the accept loop, the session sweeper, shutdown.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::accept;
use crate::error::StartError;
use crate::options::ServeOptions;
use crate::router::app;
use crate::session::SessionContext;
use crate::state::AppState;

/// Serves `state` on `listener` until `shutdown` resolves, then lets
/// in-flight requests (streams included) finish for at most the shutdown
/// grace. Connections are served by [`accept::accept`] (timeouts,
/// `TCP_NODELAY`). Idle sessions are swept once a minute by one task, which also
/// puts sessions to sleep (on the blocking pool: it deflates) as often as
/// the hibernation time asks (at most once a second).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let sweeper = {
        let state = state.clone();
        let mut rx = rx.clone();
        tokio::spawn(async move {
            const SWEEP: Duration = Duration::from_secs(60);
            let hibernate = state.sessions().hibernation();
            let period = hibernate.map_or(SWEEP, |h| (h / 2).clamp(Duration::from_secs(1), SWEEP));
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_sweep = tokio::time::Instant::now();
            loop {
                let stop = tokio::select! {
                    _ = tick.tick() => false,
                    _ = rx.wait_for(|stop| *stop) => true,
                };
                if stop {
                    break;
                }
                if let Some(after) = hibernate {
                    let s = state.clone();
                    let _ = tokio::task::spawn_blocking(move || s.sessions().hibernate_idle(after))
                        .await;
                }
                if last_sweep.elapsed() >= SWEEP {
                    last_sweep = tokio::time::Instant::now();
                    let left = state.sessions().sweep();
                    state.metrics().set_sessions(left);
                }
            }
        })
    };
    let grace = state.options().shutdown_grace;
    let timeouts = accept::Timeouts {
        header_read: state.options().header_read_timeout,
        keepalive_idle: state.options().keepalive_idle,
    };
    let server = accept::accept(listener, app(state), timeouts, rx.clone());
    let mut expired = rx;
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(true);
    });
    let result = tokio::select! {
        r = server => r,
        _ = async {
            let _ = expired.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(grace_s = grace.as_secs(), "in-flight requests cut off after the grace period");
            Ok(())
        }
    };
    sweeper.abort();
    result
}

/// Binds `options.listen` and serves until Ctrl-C or SIGTERM, on a
/// multi-threaded runtime of its own.
pub fn run(options: ServeOptions, ctx: SessionContext) -> Result<(), StartError> {
    // Engine steps that may block (model summarizer, plugin process) run on
    // the blocking pool, bounded so a burst cannot spawn a thread per session.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(64)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listen = options.listen;
        let state = AppState::new(options, ctx)?;
        let listener = TcpListener::bind(listen).await?;
        tracing::info!(addr = %listener.local_addr()?, "ctx serve listening");
        serve(listener, state, shutdown_signal()).await?;
        Ok(())
    })
}

/// Ctrl-C, or SIGTERM on Unix.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
