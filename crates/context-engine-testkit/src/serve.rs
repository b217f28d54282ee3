//! The one spawner of the real `ctx serve` for the end-to-end suites: the
//! binary with the test's arguments on a free loopback port (or the
//! address its config names), its standard error kept in a log file,
//! ready once `/healthz` answers: a bounded wait of short steps, never a
//! fixed sleep. Killed with the test.
//!
//! ```ignore
//! let serve = Spawn::new(env!("CARGO_BIN_EXE_ctx"))
//!     .args(["--upstream", &upstream])
//!     .start()
//!     .await;
//! ```

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a `ctx serve` may take to answer `/healthz`.
const START_WITHIN: Duration = Duration::from_secs(30);
use crate::STEP;

/// What counts as ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// `/healthz` answers 200 (the default).
    Healthy,
    /// `/healthz` answers, whatever its status (a proxy whose store is
    /// down answers 503 and serves all the same).
    Answers,
}

/// A `ctx serve` about to start: `program serve --listen ADDR`, without the switches a developer's shell might carry (the
/// digest and redaction opt-outs), run from the repository root, its
/// standard error in a log file (a temporary one unless [`Spawn::log`]).
pub struct Spawn {
    cmd: Command,
    addr: String,
    log: Option<PathBuf>,
    ready: Ready,
}

static NEXT_LOG: AtomicU32 = AtomicU32::new(0);

impl Spawn {
    /// `program serve --listen 127.0.0.1:PORT` (a free port).
    pub fn new(program: impl AsRef<OsStr>) -> Spawn {
        let addr = format!("127.0.0.1:{}", crate::free_port());
        let mut spawn = Spawn::listening(program, &addr);
        spawn.cmd.args(["--listen", &addr]);
        spawn
    }

    /// `program serve` that listens on `addr` by its configuration (no
    /// `--listen`).
    pub fn listening(program: impl AsRef<OsStr>, addr: &str) -> Spawn {
        let mut cmd = Command::new(program);
        cmd.arg("serve")
            .current_dir(repository_root())
            .env_remove("CTX_TOOL_DIGEST_DISABLED")
            .env_remove("CTX_REDACT_SECRETS");
        Spawn {
            cmd,
            addr: addr.to_owned(),
            log: None,
            ready: Ready::Healthy,
        }
    }

    /// Its standard error goes to `path` (kept after the process).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Spawn {
        self.log = Some(path.into());
        self
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Spawn {
        self.cmd.arg(arg);
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Spawn
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// An environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Spawn {
        self.cmd.env(key, value);
        self
    }

    /// What counts as ready (default [`Ready::Healthy`]).
    pub fn ready(mut self, ready: Ready) -> Spawn {
        self.ready = ready;
        self
    }

    /// Runs it to its exit (a configuration it must refuse): its status
    /// and output.
    pub fn output(mut self) -> std::process::Output {
        self.cmd
            .stdin(Stdio::null())
            .output()
            .expect("run ctx serve")
    }

    /// Starts it and waits at most `within` for it to exit (a
    /// configuration it must refuse): its status and standard error, or
    /// `None` if it kept running (then killed).
    pub async fn exit_within(self, within: Duration) -> Option<(ExitStatus, String)> {
        let (mut serve, _) = self.spawn();
        let status = serve.exit(within).await?;
        Some((status, serve.stderr()))
    }

    fn spawn(mut self) -> (Serve, Ready) {
        crate::tls_provider();
        let (log, temporary) = match self.log {
            Some(path) => (path, false),
            None => (
                std::env::temp_dir().join(format!(
                    "ctx-serve-{}-{}.log",
                    std::process::id(),
                    NEXT_LOG.fetch_add(1, Ordering::Relaxed)
                )),
                true,
            ),
        };
        let stderr =
            std::fs::File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn ctx serve");
        let serve = Serve {
            child,
            addr: self.addr,
            log,
            temporary,
        };
        (serve, self.ready)
    }

    /// Starts it and waits until it is ready (a process that exits first,
    /// or one not ready within 30 s, fails the test with its standard
    /// error).
    pub async fn start(self) -> Serve {
        let (mut serve, ready) = self.spawn();
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Some(status) = healthz(&serve.addr).await
                && (ready == Ready::Answers || status == 200)
            {
                return serve;
            }
            serve.not_exited_before(deadline);
            tokio::time::sleep(STEP).await;
        }
    }

    /// [`Spawn::start`] for a test without a runtime.
    pub fn start_blocking(self) -> Serve {
        let (mut serve, ready) = self.spawn();
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Some(status) = healthz_blocking(&serve.addr)
                && (ready == Ready::Answers || status == 200)
            {
                return serve;
            }
            serve.not_exited_before(deadline);
            std::thread::sleep(STEP);
        }
    }
}

/// A running `ctx serve`, killed when dropped.
pub struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: PathBuf,
    temporary: bool,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.temporary {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Serve {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its address.
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        self.addr.parse().expect("a socket address")
    }

    /// What it wrote to standard error so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills it now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its exit status, when it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait on ctx serve")
    }

    /// Waits at most `within` for it to exit (steps of 10 ms).
    pub async fn exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(STEP).await;
        }
    }

    /// Sends SIGTERM and waits for the exit (at most 20 s).
    pub async fn terminate(&mut self) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM");
        match self.exit(Duration::from_secs(20)).await {
            Some(status) => status,
            None => panic!("ctx serve ignored SIGTERM: {}", self.stderr()),
        }
    }

    fn not_exited_before(&mut self, deadline: Instant) {
        if let Some(status) = self.try_wait() {
            panic!("ctx serve exited ({status}): {}", self.stderr());
        }
        assert!(
            Instant::now() < deadline,
            "ctx serve did not start on {}: {}",
            self.addr,
            self.stderr()
        );
    }
}

/// The repository root (`ctx` runs there, as in the README).
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

/// The status of `GET /healthz` at `addr`, if it answers within a second.
async fn healthz(addr: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(HEALTHZ).await.ok()?;
        let mut head = [0u8; 16];
        let mut n = 0;
        while n < head.len() {
            match s.read(&mut head[n..]).await.ok()? {
                0 => break,
                k => n += k,
            }
        }
        status(&head[..n])
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

/// [`healthz`] without a runtime.
fn healthz_blocking(addr: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let addr = addr.parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(HEALTHZ).ok()?;
    let mut head = [0u8; 16];
    let mut n = 0;
    while n < head.len() {
        match s.read(&mut head[n..]).ok()? {
            0 => break,
            k => n += k,
        }
    }
    status(&head[..n])
}

/// The status of an HTTP/1.1 status line (`HTTP/1.1 200 OK`).
fn status(head: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(head).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}
