//! [`ServeOptions`] from the `serve.*` configuration: the one mapping, for
//! the binary and for anyone embedding the proxy.
//!
//! Variables the configuration names (the provider key, the access token,
//! the page's operator token) are read from the [`Env`] snapshot given, so
//! a process reads its environment once. What the configuration alone
//! cannot give stays with the caller: the session store (opened by the
//! binary, which knows its backends), the page's prices and redaction (from
//! the engine's builder).

use std::net::SocketAddr;
use std::time::Duration;

use context_engine::config::{Env, ServeConfig};

use crate::error::StartError;
use crate::options::{ServeOptions, UiOptions};
use crate::upstream::UpstreamOptions;

impl ServeOptions {
    /// The options `serve` describes, with the variables it names read
    /// from `env`. A flag that overrides a key is applied to `serve`
    /// first (a flag means what its key means).
    pub fn from_config(serve: &ServeConfig, env: &Env) -> Result<ServeOptions, StartError> {
        let s = serve;
        let url = s.upstream.url.clone().ok_or(StartError::NoUpstream)?;
        let listen: SocketAddr = s
            .listen
            .parse()
            .map_err(|_| StartError::BadListen(s.listen.clone()))?;
        let mut upstream = UpstreamOptions::new(url);
        upstream.api_key = env_value(
            env,
            s.upstream.api_key_env.as_deref(),
            "serve.upstream.api_key_env",
        )?;
        upstream.timeout = Duration::from_secs(s.upstream.timeout_seconds.max(1));
        upstream.connect_timeout = Duration::from_secs(s.upstream.connect_timeout_seconds.max(1));
        upstream.connect_retries = s.upstream.connect_retries;
        let token = env_value(env, s.auth_token_env.as_deref(), "serve.auth_token_env")?;
        let ui = if s.ui.enabled {
            UiOptions::default()
                .with_remote(s.ui.remote)
                .with_operator_token(env_value(
                    env,
                    s.ui.operator_token_env.as_deref(),
                    "serve.ui.operator_token_env",
                )?)
                .with_calls_per_session(s.ui.calls_per_session)
                .with_request_bytes(s.ui.request_bytes)
        } else {
            UiOptions::off()
        };
        ServeOptions::new(upstream)
            .with_listen(listen)
            .with_auth_token(token)
            .with_allowed_hosts(s.allowed_hosts.clone())
            .with_max_inflight_bytes(s.max_inflight_bytes)
            .with_timeouts(
                Duration::from_secs(s.header_read_timeout_seconds.max(1)),
                Duration::from_secs(s.body_read_timeout_seconds.max(1)),
                Duration::from_secs(s.keepalive_idle_seconds.max(1)),
            )
            .with_mode(s.mode)
            .with_engine_tools(s.engine_tools)
            .with_identity_header(s.identity_header.as_deref())
            .map(|o| {
                o.with_max_body_bytes(s.max_body_bytes)
                    .with_max_tool_rounds(s.max_tool_rounds)
                    .with_sessions(s.max_sessions, Duration::from_secs(s.session_idle_seconds))
                    .with_hibernation(
                        (s.hibernate_seconds > 0).then(|| Duration::from_secs(s.hibernate_seconds)),
                    )
                    .with_shutdown_grace(Duration::from_secs(s.shutdown_grace_seconds))
                    .with_session_wait(Duration::from_secs(s.session_wait_seconds))
                    .with_ui(ui)
            })
    }
}

/// The value of the variable `name` (named by config key `key`) in `env`,
/// if one is named; a named variable that is unset or empty is an error.
pub fn env_value(
    env: &Env,
    name: Option<&str>,
    key: &'static str,
) -> Result<Option<String>, StartError> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    match env.get(name) {
        Some(v) if !v.is_empty() => Ok(Some(v.to_owned())),
        _ => Err(StartError::MissingEnv {
            name: name.to_owned(),
            key,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(url: Option<&str>) -> ServeConfig {
        let mut s = ServeConfig::default();
        s.upstream.url = url.map(str::to_owned);
        s
    }

    #[test]
    fn every_key_reaches_its_option_and_variables_come_from_the_snapshot() {
        let mut s = serve(Some("http://127.0.0.1:9/v1"));
        s.session_wait_seconds = 7;
        s.max_tool_rounds = 5;
        s.auth_token_env = Some("TOK".into());
        let env = Env::from_pairs([("TOK", "secret")]);
        let o = ServeOptions::from_config(&s, &env).unwrap();
        assert_eq!(o.session_wait, Duration::from_secs(7));
        assert_eq!(o.max_tool_rounds, 5);
        assert_eq!(o.auth_token.as_deref(), Some("secret"));
        assert_eq!(o.upstream.url, "http://127.0.0.1:9/v1");
    }

    #[test]
    fn a_missing_upstream_or_variable_says_which_key() {
        let err = ServeOptions::from_config(&serve(None), &Env::empty()).unwrap_err();
        assert!(err.to_string().contains("serve.upstream.url"), "{err}");
        let mut s = serve(Some("http://127.0.0.1:9/v1"));
        s.auth_token_env = Some("NOT_SET_ANYWHERE".into());
        let err = ServeOptions::from_config(&s, &Env::empty()).unwrap_err();
        assert!(err.to_string().contains("serve.auth_token_env"), "{err}");
        s.auth_token_env = None;
        s.listen = "nowhere".into();
        let err = ServeOptions::from_config(&s, &Env::empty()).unwrap_err();
        assert!(err.to_string().contains("nowhere"), "{err}");
    }
}
