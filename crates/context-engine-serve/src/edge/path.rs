//! The passthrough path rule: `/v1/{rest}` goes to `{upstream base}/{rest}`
//! only when `rest` stays under the base. Each segment is percent-decoded
//! (twice, so that a doubly encoded dot or slash is seen too) and refused
//! when it is a dot segment (`.`, `..`, also with `;` parameters), holds an
//! encoded separator (`%2f`, `%5c`), a backslash or a control character.
//! The path then goes upstream as it came (still encoded); the URL built
//! from it is checked once more against the base path
//! ([`Upstream::passthrough_url`](crate::upstream::Upstream::passthrough_url)).

use std::borrow::Cow;

use percent_encoding::percent_decode;

use crate::error::ServeError;

/// Checks the raw (still percent-encoded) path after `/v1`; the error says
/// which segment is refused and why.
pub fn check(rest: &str) -> Result<(), ServeError> {
    for segment in rest.split('/') {
        let once: Cow<'_, [u8]> = percent_decode(segment.as_bytes()).into();
        let twice: Cow<'_, [u8]> = percent_decode(&once).into();
        for decoded in [&*once, &*twice] {
            if let Some(why) = refused(decoded) {
                return Err(ServeError::BadRequest(format!(
                    "the path segment `{}` {why}: paths must stay under /v1",
                    segment.escape_debug()
                )));
            }
        }
    }
    Ok(())
}

/// Why a decoded segment is refused, if it is.
fn refused(decoded: &[u8]) -> Option<&'static str> {
    if decoded.contains(&b'/') {
        return Some("holds an encoded `/`");
    }
    if decoded.contains(&b'\\') {
        return Some("holds a backslash");
    }
    if decoded.iter().any(u8::is_ascii_control) {
        return Some("holds a control character");
    }
    let name = decoded.split(|b| *b == b';').next().unwrap_or_default();
    if name == b"." || name == b".." {
        return Some("is a dot segment");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_pass() {
        for ok in [
            "/models",
            "/files/file-abc/content",
            "/models/ft:gpt-4o:org:custom:id",
            "/vector_stores/vs_1/files",
            "/models/",
            "/a.b/..c/c..",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn escapes_are_refused_with_the_reason() {
        for (bad, why) in [
            ("/../secret-admin", "dot segment"),
            ("/%2e%2e/secret-admin", "dot segment"),
            ("/%2E%2e/secret-admin", "dot segment"),
            ("/.%2E/secret-admin", "dot segment"),
            ("/./models", "dot segment"),
            ("/..;/admin", "dot segment"),
            ("/%252e%252e/admin", "dot segment"),
            ("/files%2f..%2fadmin", "encoded `/`"),
            ("/files%2F..", "encoded `/`"),
            ("/files%252Fadmin", "encoded `/`"),
            ("/..%5cadmin", "backslash"),
            ("/a\\..\\admin", "backslash"),
            ("/a%00b", "control character"),
        ] {
            let e = check(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("must stay under /v1"), "{e}");
        }
    }
}
