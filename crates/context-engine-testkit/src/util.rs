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

/// One step of a bounded wait: short, so a wait ends soon after its
/// condition holds.
pub const STEP: std::time::Duration = std::time::Duration::from_millis(10);

/// Polls `probe` every [`STEP`] until it gives `Some`, for at most
/// `within`: what it gave, or `None` when time ran out (the caller's
/// assertion then says what never happened). For what a server does after
/// its client has the answer (usage written after the response, a store
/// write, a connection seen closed).
pub async fn eventually<T, F, Fut>(within: std::time::Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(found) = probe().await {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(STEP).await;
    }
}

/// [`eventually`] for a test without a runtime.
pub fn eventually_blocking<T>(
    within: std::time::Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(STEP);
    }
}

/// Waits (at most `within`, steps of [`STEP`]) until the server listening
/// on loopback `port` holds no open connection (none established nor
/// half-closed by the peer, by `/proc/net/tcp` and `tcp6`): the signal
/// that it has seen its client go away and dropped the connection.
/// Whether that came; off Linux (no `/proc/net`), `true` at once.
pub async fn server_connections_closed(port: u16, within: std::time::Duration) -> bool {
    eventually(within, || async {
        (!open_server_connections(port)).then_some(())
    })
    .await
    .is_some()
}

/// Whether some process of this machine holds an established connection
/// to `port` (by `/proc/net/tcp` and `tcp6`): a client's call to a server
/// is in flight. Off Linux (no `/proc/net`), `true`.
pub fn connected_to(port: u16) -> bool {
    !has_proc_net() || any_socket(|_, remote, state| remote == port && state == "01")
}

/// Whether a socket with local `port` is established or in CLOSE_WAIT.
fn open_server_connections(port: u16) -> bool {
    has_proc_net()
        && any_socket(|local, _, state| local == port && (state == "01" || state == "08"))
}

fn has_proc_net() -> bool {
    std::path::Path::new("/proc/net/tcp").exists()
}

/// Whether a TCP socket's `(local port, remote port, state)` passes `f`.
fn any_socket(f: impl Fn(u16, u16, &str) -> bool) -> bool {
    // `sl local_address rem_address st ...`: addresses as `HEX:PORT`, the
    // state in hex (01 established, 08 close-wait).
    let port = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                match (fields.get(1), fields.get(2), fields.get(3)) {
                    (Some(local), Some(remote), Some(state)) => match (port(local), port(remote)) {
                        (Some(l), Some(r)) => f(l, r, state),
                        _ => false,
                    },
                    _ => false,
                }
            })
        })
    })
}
