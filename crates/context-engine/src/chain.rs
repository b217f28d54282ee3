//! [`chain`]: an error and its sources as one line, for the warnings and
//! logs that have no error chain printer. A leaf every module may use
//! (the crate-wide [`Error`](crate::Error) wraps the module errors; this
//! imports none).

/// `error` and each of its sources, joined by `": "`, each text once (a
/// source whose text the previous message already contains is skipped).
/// For warnings and logs that have no error chain printer.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
