//! Asking an OpenAI-compatible server for the summary model's window
//! (what [`context_engine::summarize::window`] reads from its answers).

use std::time::Duration;

use context_engine::summarize::window::{Window, WindowSource, models_window, props_n_ctx};
use serde_json::Value;

/// Longest wait for one discovery request: the window is a nicety, the
/// summary must not wait on it.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest discovery reply read, in bytes.
const DISCOVERY_REPLY_BYTES: u64 = 1 << 20;

/// Asks the server at `base_url` (e.g. `http://host:8080/v1`) for the
/// window of `model`: `GET /props` at the server root (and under the base
/// URL), then `GET {base_url}/models`. [`Window::UNKNOWN`] when none
/// answers with a number. Never an error: failures only mean "unknown".
pub fn discover(agent: &ureq::Agent, base_url: &str, model: &str, key: &str) -> Window {
    let base = base_url.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let mut props_urls = vec![format!("{root}/props")];
    if root != base {
        props_urls.push(format!("{base}/props"));
    }
    for url in props_urls {
        if let Some(n) = get_json(agent, &url, key).as_ref().and_then(props_n_ctx) {
            return Window::known(n, WindowSource::ServerProps);
        }
    }
    if let Some(n) = get_json(agent, &format!("{base}/models"), key)
        .as_ref()
        .and_then(|v| models_window(v, model))
    {
        return Window::known(n, WindowSource::ModelsList);
    }
    Window::UNKNOWN
}

/// `GET url` as JSON, `None` on any failure.
fn get_json(agent: &ureq::Agent, url: &str, key: &str) -> Option<Value> {
    let mut response = agent
        .get(url)
        .header("Authorization", format!("Bearer {key}"))
        .header("Accept", "application/json")
        .config()
        .timeout_global(Some(DISCOVERY_TIMEOUT))
        .build()
        .call()
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let bytes = response
        .body_mut()
        .with_config()
        .limit(DISCOVERY_REPLY_BYTES)
        .read_to_vec()
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}
