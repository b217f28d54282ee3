//! Checks on a candidate secret after its regex matched: entropy, "is this
//! already a mask", and the value shapes of assignment-style rules.

use super::rules::Filter;

/// Shannon entropy in bits per byte: random keys score high, words and
/// repeated characters low.
pub(crate) fn entropy(bytes: &[u8]) -> f64 {
    if bytes.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// How a candidate relates to our own output (`***`, `abcdef...wxyz`,
/// `[REDACTED ...]`), so that a second pass leaves that output alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Masked {
    /// Not ours.
    No,
    /// Exactly a mask: nothing overlapping it may be masked either.
    Mask,
    /// Holds or touches a mask (or `...`): not masked, but no zone.
    Touches,
}

pub(crate) fn masked_state(hay: &[u8], start: usize, end: usize) -> Masked {
    let secret = &hay[start..end];
    let mask_shape = secret == b"***"
        || secret.windows(3).enumerate().any(|(pos, w)| {
            w == b"..." && chars(&secret[..pos]) == 6 && chars(&secret[pos + 3..]) == 4
        });
    if mask_shape {
        return Masked::Mask;
    }
    // Anything holding `...` may hold one of our masks; masking around it
    // again would not be idempotent. Real secrets do not contain `...`.
    if contains(secret, b"***") || contains(secret, b"[REDACTED") || contains(secret, b"...") {
        return Masked::Touches;
    }
    let before = &hay[..start];
    let after = &hay[end..];
    if (after.starts_with(b"...") && chars(secret) <= 6)
        || (before.ends_with(b"...") && chars(secret) <= 4)
        || before.ends_with(b"*")
        || after.starts_with(b"*")
    {
        return Masked::Touches;
    }
    Masked::No
}

#[cfg(test)]
fn is_masked(hay: &[u8], start: usize, end: usize) -> bool {
    masked_state(hay, start, end) != Masked::No
}

/// Number of UTF-8 characters in a byte string (masks count characters).
pub(crate) fn chars(b: &[u8]) -> usize {
    b.iter().filter(|&&x| x & 0xC0 != 0x80).count()
}

/// Apply a rule's extra filter; `true` keeps the candidate.
pub(crate) fn passes(filter: Filter, hay: &[u8], start: usize, end: usize) -> bool {
    let v = &hay[start..end];
    match filter {
        Filter::Assignment => assignment_value(hay, start, end, v),
        Filter::Random => random_value(v),
        Filter::Credential => !(is_path(v) || contains(v, b"://") || has_host_part(v)),
        Filter::Jwt => jwt_header(v),
    }
}

/// `v` starts with a JWT header: its first dot-separated segment is the
/// base64url of a JSON object with an `alg` or `typ` member. The payload
/// may be anything (encrypted, or not JSON at all).
fn jwt_header(v: &[u8]) -> bool {
    use base64::Engine as _;
    let header = v.split(|&b| b == b'.').next().unwrap_or_default();
    let header = header.strip_suffix(b"=").unwrap_or(header);
    let header = header.strip_suffix(b"=").unwrap_or(header);
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&json)
        .is_ok_and(|o| o.contains_key("alg") || o.contains_key("typ"))
}

fn assignment_value(hay: &[u8], start: usize, end: usize, v: &[u8]) -> bool {
    if is_number(v) || is_path(v) || contains(v, b"://") || has_host_part(v) {
        return false;
    }
    let quoted = start > 0 && matches!(hay[start - 1], b'"' | b'\'' | b'`');
    if quoted {
        // Prose and templates, not secrets: descriptions in JSON schemas,
        // format strings, f-strings.
        return v.len() >= 3
            && !v.contains(&b' ')
            && !v.contains(&b'{')
            && !contains(v, b"%s")
            && !contains(v, b"%(");
    }
    // Unquoted: code references (`self.token`, `get_password()`,
    // `tokens[0]`, type hints) are not secrets.
    if matches!(hay.get(end), Some(b'(' | b'[' | b'.')) {
        return false;
    }
    if is_identifier_path(v) && v.split(|&b| b == b'.').all(|part| part.len() < 20) {
        let has_digit = v.iter().any(u8::is_ascii_digit);
        let plain_word = !v.contains(&b'.') && !v.contains(&b'_');
        return (has_digit && !v.contains(&b'.'))
            || (plain_word && v.len() >= 16 && entropy(v) >= 3.5);
    }
    true
}

fn random_value(v: &[u8]) -> bool {
    v.iter().any(u8::is_ascii_digit)
        && v.iter().any(u8::is_ascii_alphabetic)
        && !is_path(v)
        && !contains(v, b"://")
        && !(v.contains(&b'.')
            && is_identifier_path(v)
            && v.split(|&b| b == b'.').all(|part| part.len() < 20))
}

/// `x@host.tld...`: the value runs into a URL's host (the key was part of a
/// URL's userinfo) or is an e-mail address; URL rules handle those.
fn has_host_part(v: &[u8]) -> bool {
    let Some(at) = v.iter().position(|&b| b == b'@') else {
        return false;
    };
    let host: Vec<&[u8]> = v[at + 1..]
        .split(|&b| b == b'/' || b == b':')
        .next()
        .unwrap_or_default()
        .split(|&b| b == b'.')
        .collect();
    host.len() >= 2
        && host
            .iter()
            .all(|l| !l.is_empty() && l.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-'))
}

fn is_number(v: &[u8]) -> bool {
    v.first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'-' || *b == b'+')
        && v.iter()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'e' | b'E' | b'+' | b'-'))
}

fn is_path(v: &[u8]) -> bool {
    v.starts_with(b"/")
        || v.starts_with(b"./")
        || v.starts_with(b"../")
        || v.starts_with(b"~/")
        || (v.len() > 2 && v[0].is_ascii_alphabetic() && v[1] == b':' && v[2] == b'\\')
}

/// `name`, `obj.attr`, `module.func`: letters, digits and `_`, dot-separated,
/// each part starting with a letter or `_`.
fn is_identifier_path(v: &[u8]) -> bool {
    !v.is_empty()
        && v.split(|&b| b == b'.').all(|part| {
            part.first()
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
                && part.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_orders_random_above_words() {
        assert!(entropy(b"aaaaaaaa") < 0.1);
        assert!(entropy(b"wJalrXUtnFEMI/K7MDENG/bPxRfiCY") > 4.0);
        assert!(entropy(b"password") < entropy(b"p4Ssw0rD!x"));
    }

    #[test]
    fn masked_forms_are_recognised() {
        assert!(is_masked(b"***", 0, 3));
        assert!(is_masked(b"ghp_ab...wxyz", 0, 13));
        assert!(is_masked(b"x=abc...wxyz", 2, 5));
        assert!(!is_masked(b"hunter22", 0, 8));
    }

    #[test]
    fn assignment_values() {
        let check = |hay: &str, v: &str| {
            let start = hay.find(v).unwrap();
            passes(Filter::Assignment, hay.as_bytes(), start, start + v.len())
        };
        assert!(check("PASSWORD=hunter2", "hunter2"));
        assert!(check("password: \"s3cr3t\"", "s3cr3t"));
        assert!(!check("token = self.token", "self.token"));
        assert!(!check("token = next_token(x)", "next_token"));
        assert!(!check("\"max_tokens\": 4096", "4096"));
        assert!(!check("PWD=/testbed", "/testbed"));
        assert!(!check(
            "\"password\": \"Password of the user\"",
            "Password of the user"
        ));
        assert!(!check("token: str", "str"));
    }
}
