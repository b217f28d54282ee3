//! How to reach the database.

use std::time::Duration;

use crate::url::redacted_url;

/// How to reach the database.
#[derive(Clone)]
#[non_exhaustive]
pub struct PgOptions {
    /// `postgres://user@host:port/db` (no password: see
    /// [`password`](Self::password)); any libpq-style URL tokio-postgres
    /// reads.
    pub url: String,
    /// The password, from the environment; never logged.
    pub password: Option<String>,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Connecting, waiting for a pooled connection, and each call as a
    /// whole are bounded by this.
    pub timeout: Duration,
    /// Whether a write (a session record, an archive) waits for the disk
    /// flush (`synchronous_commit`). Off (the default): the store's
    /// connections commit asynchronously, a write is still atomic and
    /// visible at once and survives a crash of the caller, and only a crash
    /// of the database server may lose its last fraction of a second of
    /// writes, each transaction whole or not at all (an archive with the
    /// record that names it): the guarantee of the SQLite store's
    /// `synchronous = NORMAL`.
    pub durable_records: bool,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &redacted_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("durable_records", &self.durable_records)
            .finish()
    }
}

impl PgOptions {
    /// Defaults (16 connections, 5 s timeout) for `url`.
    pub fn new(url: impl Into<String>) -> PgOptions {
        PgOptions {
            url: url.into(),
            password: None,
            pool_size: 16,
            timeout: Duration::from_secs(5),
            durable_records: false,
        }
    }

    /// Sets [`durable_records`](Self::durable_records).
    pub fn with_durable_records(mut self, durable: bool) -> PgOptions {
        self.durable_records = durable;
        self
    }

    /// Sets [`password`](Self::password).
    pub fn with_password(mut self, password: Option<String>) -> PgOptions {
        self.password = password.filter(|p| !p.is_empty());
        self
    }

    /// Sets [`pool_size`](Self::pool_size).
    pub fn with_pool_size(mut self, n: usize) -> PgOptions {
        self.pool_size = n.max(1);
        self
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> PgOptions {
        self.timeout = timeout;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_never_show_the_password() {
        let o = PgOptions::new("postgres://u@h/db").with_password(Some("hunter2".into()));
        assert!(!format!("{o:?}").contains("hunter2"));
    }
}
