//! A `ctx serve` a test starts: the test kit's spawner
//! (`context_engine_testkit::serve`) on this crate's binary.

use std::path::Path;

#[allow(unused_imports)]
pub use context_engine_testkit::serve::{Ready, Serve, Spawn};

/// `ctx serve --listen 127.0.0.1:PORT`, its standard error in
/// `dir/serve-stderr.log`.
pub fn spawn(dir: &Path) -> Spawn {
    Spawn::new(env!("CARGO_BIN_EXE_ctx")).log(dir.join("serve-stderr.log"))
}

/// Starts `ctx serve --listen 127.0.0.1:PORT ARGS` (see [`spawn`]) and
/// waits until `/healthz` answers 200.
pub async fn start(dir: &Path, args: &[&str]) -> Serve {
    spawn(dir).args(args).start().await
}
