//! Small helpers of many suites: a temporary directory, a free port, a
//! child run of one test with a variable set, a deterministic generator.

use std::path::PathBuf;

/// A temporary directory for one test (`ctx-{suite}-{tag}-{pid}`), emptied
/// when made and removed with it.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(suite: &str, tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ctx-{suite}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free loopback port (for a process that takes its address as an
/// argument).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Re-runs the ignored test `child` of this test binary in a child process
/// with `key=value` set, and asserts it passed. Environment switches are
/// checked this way because setting a variable in this process would race
/// with the other tests.
pub fn run_child_with_env(child: &str, key: &str, value: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--include-ignored"])
        .env(key, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {child} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tiny deterministic generator (an LCG), so the sessions are the same
/// on every run and every machine.
pub struct Rng(pub u64);

impl Rng {
    /// The next value (31 bits).
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// Installs the process-wide TLS provider (ring) that the HTTP clients
/// built without one need (the tests speak plain HTTP on loopback, but a
/// client is not built without a provider); a second call does nothing.
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
