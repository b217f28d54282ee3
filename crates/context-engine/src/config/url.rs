//! A URL's credentials, read once, by the `url` crate's parse: whether a
//! URL carries a password, and the URL with every password hidden. The
//! configuration (`config::load`) and the Postgres store's URL (`ctx serve
//! --store`, its messages) both use it, so that they never disagree on
//! what is refused or shown.

use url::Url;

/// Whether the query parameter `name` holds a password (any case:
/// `password`, `sslpassword`).
fn is_password_param(name: &str) -> bool {
    name.trim().to_ascii_lowercase().ends_with("password")
}

/// Whether `s` is a URL (`scheme://…`) that carries a password: in its
/// user info (`user:password@host`), or as a query parameter whose name
/// ends in `password`. An empty password carries no secret; text that is
/// not a URL carries none that could reach a connection.
pub fn url_has_password(s: &str) -> bool {
    let Ok(url) = Url::parse(s) else {
        return false;
    };
    url.password().is_some_and(|p| !p.is_empty())
        || url.query_pairs().any(|(name, _)| is_password_param(&name))
}

/// `s` with every password (user info, `…password=` parameters) replaced
/// by `***`, for messages; text that is not a URL is not shown at all.
pub fn redacted_url(s: &str) -> String {
    let Ok(mut url) = Url::parse(s) else {
        return "(not a URL)".to_owned();
    };
    if url.password().is_some() {
        // Only a URL without a host refuses a password, and it has none.
        let _ = url.set_password(Some("***"));
    }
    if url.query_pairs().any(|(name, _)| is_password_param(&name)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_password_param(&name) {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::{redacted_url, url_has_password};

    #[test]
    fn passwords_in_user_info_or_query() {
        // (url, has a password). The first rows are where the configuration's
        // check and the Postgres store's check once disagreed.
        let table = [
            // A fragment ends the authority.
            ("postgres://db#x:y@z", false),
            // Not a scheme.
            ("1x://u:p@h", false),
            // Spaces around a URL do not hide its password.
            (" postgres://u:p@h", true),
            // A `password=` outside the query.
            ("postgres://db/password=x", false),
            ("https://h/p#password=x", false),
            ("postgres://db/x?user=password", false),
            ("postgres://u:secret@db:5432/x", true),
            // An empty password holds no secret.
            ("postgresql://u:@db/x", false),
            ("postgres://db/x?password=secret", true),
            ("postgres://db/x?sslmode=require&PASSWORD=secret", true),
            ("postgres://db/x?sslpassword=secret", true),
            ("postgres://u@db:5432/x", false),
            ("postgres://db/x", false),
            ("https://user@host/path?q=1", false),
            ("https://u:p@host", true),
            ("svn+ssh://u:p@host/repo", true),
            ("not a url", false),
            ("u:p@host", false),
        ];
        for (url, expected) in table {
            assert_eq!(url_has_password(url), expected, "{url}");
        }
    }

    #[test]
    fn every_password_is_hidden_and_the_rest_shown() {
        let shown = redacted_url("postgres://u:secret@db:5432/x?password=s2&sslmode=disable");
        assert!(
            !shown.contains("secret") && !shown.contains("s2"),
            "{shown}"
        );
        assert!(shown.contains("u:***@db:5432/x"), "{shown}");
        assert!(shown.contains("sslmode=disable"), "{shown}");
        let shown = redacted_url("postgres://db/x?SSLPASSWORD=s3#frag");
        assert!(!shown.contains("s3"), "{shown}");
        assert_eq!(redacted_url("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redacted_url("not a url"), "(not a URL)");
    }
}
