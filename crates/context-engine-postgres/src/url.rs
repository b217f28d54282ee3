//! Database URLs: which ones name Postgres, and never showing a password
//! (the check and the redaction are `context_engine::config`'s).

/// Whether `url` names a Postgres database (`postgres://` or
/// `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

// Whether a URL carries a password, and the URL with its passwords
// hidden: the library's one reading of a URL's credentials.
pub use context_engine::config::{redacted_url, url_has_password};

/// `postgres://user@host:port/db` from a parsed config (no password).
pub(crate) fn describe(config: &tokio_postgres::Config, fallback: &str) -> String {
    let host = config.get_hosts().first().map(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => name.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    });
    match host {
        Some(host) => {
            let port = config.get_ports().first().copied().unwrap_or(5432);
            let user = config
                .get_user()
                .map(|u| format!("{u}@"))
                .unwrap_or_default();
            let db = config.get_dbname().unwrap_or("");
            format!("postgres://{user}{host}:{port}/{db}")
        }
        None => fallback.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_and_hidden() {
        assert!(url_has_password("postgres://u:secret@db:5432/x"));
        assert!(url_has_password("postgres://db/x?password=secret"));
        assert!(!url_has_password("postgres://u@db:5432/x"));
        assert!(!url_has_password("postgres://db/x"));
        let shown = redacted_url("postgres://u:secret@db:5432/x?password=s2&sslmode=disable");
        assert!(
            !shown.contains("secret") && !shown.contains("s2"),
            "{shown}"
        );
        assert!(shown.contains("u:***@db:5432/x"), "{shown}");
        assert!(shown.contains("sslmode=disable"), "{shown}");
    }
}
