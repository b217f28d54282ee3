//! Headless Chromium for the page tests (`#[path = "common/browser.rs"] mod
//! browser;` beside `mod common;`), driven through chromedriver's
//! WebDriver with `fantoccini`: one chromedriver on a free port, one
//! browser session, the browser's console log (the `goog:loggingPrefs`
//! capability and chromedriver's log endpoint), screenshots under
//! `target/browser-artifacts/`.
//!
//! `scripts/browser.sh install` installs Debian's `chromium` and
//! `chromium-driver`; `CTX_CHROMIUM` / `CTX_CHROMEDRIVER` name other
//! binaries. Without them [`Browser::start`] returns `None` with the reason
//! printed, a failure under `CI=true` (see `common::skip`).
#![allow(dead_code)]

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

/// A browser session and the chromedriver serving it; closed (browser
/// quit, driver killed) by [`Browser::finish`] or, failing that, on drop.
pub struct Browser {
    pub client: Client,
    driver: Child,
    stopped: bool,
    profile: PathBuf,
    name: String,
}

/// The binary `var` names, else the first of `names` on `PATH`.
fn find_binary(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Where screenshots go: `target/browser-artifacts/` (under
/// `CARGO_TARGET_DIR` when set).
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::common::root().join("target"));
    let dir = target.join("browser-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// chromedriver's log command (`POST /session/{id}/se/log`), which
/// returns and clears the entries of one log (`browser`: the console).
#[derive(Debug)]
struct GetLog(&'static str);

impl WebDriverCompatibleCommand for GetLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/se/log", session_id.unwrap_or("")))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({ "type": self.0 }).to_string()),
        )
    }
}

impl Browser {
    /// Starts chromedriver and a headless browser session (`name` names
    /// its screenshots); `None`, with the reason printed, when chromium or
    /// chromedriver is missing (a failure under `CI=true`).
    pub async fn start(name: &str) -> Option<Browser> {
        let Some(chromium) = find_binary("CTX_CHROMIUM", &["chromium", "chromium-browser"]) else {
            crate::common::skip(
                "chromium is not installed (run scripts/browser.sh install, or set CTX_CHROMIUM)",
            );
            return None;
        };
        let Some(chromedriver) = find_binary("CTX_CHROMEDRIVER", &["chromedriver"]) else {
            crate::common::skip(
                "chromedriver is not installed (run scripts/browser.sh install, or set CTX_CHROMEDRIVER)",
            );
            return None;
        };
        let port = crate::common::free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a test that fails before `finish`
            // still takes the browser down with the driver.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not listen on port {port} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile =
            std::env::temp_dir().join(format!("ctx-browser-{name}-{}-{port}", std::process::id()));
        let caps: Capabilities = serde_json::from_value(json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // The tests run as root in CI, where the sandbox
                    // cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--disable-extensions",
                    "--window-size=1280,1800",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        }))
        .unwrap();
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let mut browser = None;
        // A cold browser may take a while to come up on a loaded machine.
        for attempt in 0..3 {
            match ClientBuilder::new(connector.clone())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => {
                    browser = Some(client);
                    break;
                }
                Err(e) if attempt < 2 => eprintln!("browser session not started, retrying: {e}"),
                Err(e) => panic!("cannot start a browser session through chromedriver: {e}"),
            }
        }
        Some(Browser {
            client: browser.unwrap(),
            driver,
            stopped: false,
            profile,
            name: name.to_owned(),
        })
    }

    /// Opens `url` and waits until `ready` (a JavaScript expression) is
    /// true, for at most 20 s.
    pub async fn open(&self, url: &str, ready: &str) {
        self.client.goto(url).await.unwrap();
        self.wait_for(ready).await;
    }

    /// Waits until the JavaScript expression `ready` is true (20 s at most).
    pub async fn wait_for(&self, ready: &str) {
        let started = Instant::now();
        loop {
            let v = self.eval(&format!("return !!({ready});")).await;
            if v == Value::Bool(true) {
                return;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let errors = self.console().await;
                let text = self
                    .eval("return document.body ? document.body.innerText.slice(0, 3000) : '';")
                    .await;
                let shot = self.screenshot("timeout").await;
                panic!(
                    "the page never got to `{ready}` (console: {errors:#?}; screenshot {}; text:\n{})",
                    shot.display(),
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    /// The console entries since the last call: `(level, message)`.
    pub async fn console(&self) -> Vec<(String, String)> {
        let entries = self.client.issue_cmd(GetLog("browser")).await.unwrap();
        entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Fails on any console error or warning since the last call (a
    /// script error, a request the page's policy refused, a failed fetch).
    pub async fn assert_no_console_errors(&self) {
        let bad: Vec<_> = self
            .console()
            .await
            .into_iter()
            .filter(|(level, _)| level == "SEVERE" || level == "WARNING")
            .collect();
        assert!(bad.is_empty(), "console errors: {bad:#?}");
    }

    /// Saves a screenshot as `target/browser-artifacts/{name}-{what}.png`
    /// and returns its path.
    pub async fn screenshot(&self, what: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        let path = artifacts_dir().join(format!("{}-{what}.png", self.name));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// Quits the browser and stops chromedriver.
    pub async fn finish(mut self) {
        let client = self.client.clone();
        let _ = client.close().await;
        self.stop();
    }

    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        // The whole group: chromedriver and any browser it left.
        let _ = Command::new("kill")
            .arg("--")
            .arg(format!("-{}", self.driver.id()))
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `file://` URL for `path` (absolute).
pub fn file_url(path: &Path) -> String {
    let path = path.canonicalize().unwrap();
    url::Url::from_file_path(&path).unwrap().to_string()
}
