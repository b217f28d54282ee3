//! Whether a URL carries a password: the one check the configuration
//! (`config::load`) and the Postgres store's URL (`ctx serve --store`) both
//! use, so that they never disagree on what is refused.

/// Whether `s` is a URL (`scheme://…`, the scheme a letter then letters,
/// digits, `+`, `-` or `.`) that carries a password: in its user info
/// (`user:password@host`, even an empty one), or as a query parameter
/// whose name ends in `password` (any case: `password=`, `sslpassword=`).
/// The authority ends at the first `/`, `?` or `#`; the query at `#`.
pub fn url_has_password(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return false;
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let in_userinfo = authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    let query = tail
        .split_once('?')
        .map_or("", |(_, q)| q.split('#').next().unwrap_or(""));
    let in_query = query.split('&').any(|param| {
        param
            .split_once('=')
            .is_some_and(|(name, _)| name.trim().to_ascii_lowercase().ends_with("password"))
    });
    in_userinfo || in_query
}

#[cfg(test)]
mod tests {
    use super::url_has_password;

    #[test]
    fn passwords_in_user_info_or_query() {
        // (url, has a password). The first rows are where the configuration's
        // check and the Postgres store's check used to disagree.
        let table = [
            // A fragment ends the authority (the store's check read on).
            ("postgres://db#x:y@z", false),
            // Not a scheme (the store's check took any text before `://`).
            ("1x://u:p@h", false),
            (" postgres://u:p@h", false),
            // A `password=` outside the query (both checks matched the text).
            ("postgres://db/password=x", false),
            ("https://h/p#password=x", false),
            ("postgres://db/x?user=password", false),
            // Where both agreed, and still do.
            ("postgres://u:secret@db:5432/x", true),
            ("postgresql://u:@db/x", true),
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
}
