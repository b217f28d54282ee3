//! A `ctx serve` a test starts: the real binary with the test's
//! arguments on a free loopback port, its standard error kept in a log
//! file, ready once `/healthz` answers, killed with the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `ctx serve`.
pub struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `ctx serve --listen 127.0.0.1:PORT ARGS`, its standard error
    /// in `dir/serve-stderr.log`; waits for `/healthz` (a process that
    /// exits first fails the test with its standard error).
    pub async fn start(dir: &Path, args: &[&str]) -> Serve {
        installs_tls_provider();
        let addr = format!("127.0.0.1:{}", super::free_port());
        let log = dir.join("serve-stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_ctx"))
            .args(["serve", "--listen", &addr])
            .args(args)
            .current_dir(super::root())
            .env("RUST_LOG", "warn")
            .env_remove("CTX_TOOL_DIGEST_DISABLED")
            .env_remove("CTX_REDACT_SECRETS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn ctx serve");
        let mut serve = Serve { child, addr, log };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client
                .get(format!("http://{}/healthz", serve.addr))
                .send()
                .await
                && r.status() == 200
            {
                return serve;
            }
            if let Ok(Some(status)) = serve.child.try_wait() {
                panic!("ctx serve exited ({status}): {}", serve.stderr());
            }
            assert!(Instant::now() < deadline, "ctx serve did not start");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// What it wrote to standard error so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// reqwest is built without a TLS provider; the proxy's upstream client
/// installs the process-wide one (the tests speak plain HTTP anyway).
fn installs_tls_provider() {
    let _ = context_engine_serve::Upstream::new(&context_engine_serve::UpstreamOptions::new(
        "http://127.0.0.1:9/v1",
    ));
}
