//! Secrets planted in tool outputs, and scans of what a store left behind
//! for them (the store tests of every crate).

#[cfg(unix)]
use std::path::Path;

/// An AWS access key id.
pub const AWS: &str = "AKIAZ7Q3R5T2W4X6Y3V2";
/// A GitHub personal access token.
pub const GITHUB: &str = "ghp_R8mK2vQ9xL4tN7pW3sZ6yB1cD5fH0jG2aE8u";
/// An RSA private key PEM block.
pub const PEM: &str = "-----BEGIN RSA PRIVATE KEY-----\n\
MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n\
VTLw7onLRnrq0IzW7yWR7QkrmBL7jTKEn5uqKhbwKfBstIsbMY2Zkp18gnTxKxyz\n\
-----END RSA PRIVATE KEY-----";
/// The user's own pattern (`security.redact_patterns`) and a secret it
/// matches (no built-in rule does).
pub const USER_PATTERN: &str = "ACMESECRET[a-z0-9]{12}";
/// A secret only the user's pattern masks.
pub const USER: &str = "ACMESECRETq7x2k9m4p1z8";

/// Each secret by name with what a scan looks for: a part the mask never
/// keeps (the mask shows the first 6 and last 4 characters), lowercased
/// (a full-text index folds case), within one index token.
pub fn needles() -> Vec<(&'static str, String)> {
    vec![
        ("aws", "q3r5t2w4x6".to_owned()),
        ("github", "vq9xl4tn7pw3sz6yb1cd5".to_owned()),
        ("pem", "h2mo4lgoeepznm0trgelezv6".to_owned()),
        ("user-pattern", "cretq7x2k9m4".to_owned()),
    ]
}

/// A tool output holding every secret.
pub fn planted(what: &str) -> String {
    format!(
        "{what}\n$ cat ~/.aws/credentials\naws_access_key_id = {AWS}\n$ git remote -v\n\
         origin https://x:{GITHUB}@github.com/acme/tinyq.git (fetch)\n$ cat deploy.pem\n{PEM}\n\
         $ env | grep ACME\nACME_LICENSE={USER}\n"
    )
}

/// The secrets found in `bytes` (ASCII case folded).
pub fn found(bytes: &[u8]) -> Vec<&'static str> {
    let hay = bytes.to_ascii_lowercase();
    needles()
        .into_iter()
        .filter(|(_, n)| hay.windows(n.len()).any(|w| w == n.as_bytes()))
        .map(|(name, _)| name)
        .collect()
}

/// The Unix mode bits of `path` (permissions only).
#[cfg(unix)]
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}
