//! The peer bench's report: each target's figures as JSON, and the table
//! (rows: measurements; columns: direct, then the targets).

use serde_json::{Value, json};

use super::{Target, pct, sorted};

/// A target's figures, with the added latencies over `direct`'s.
pub fn figures(t: &Target, direct: &Target) -> Value {
    if let Some(why) = &t.down {
        return json!({"name": t.name, "status": format!("unavailable: {why}")});
    }
    let status = t.stopped.clone().unwrap_or_else(|| "ok".to_owned());
    let (bare, stream, load) = (sorted(&t.bare), sorted(&t.bare_stream), sorted(&t.load));
    let (dbare, dstream) = (sorted(&direct.bare), sorted(&direct.bare_stream));
    let paired: Vec<f64> = t
        .session
        .iter()
        .zip(&direct.session)
        .map(|(a, d)| a - d)
        .collect();
    let added = sorted(&paired);
    let lat = sorted(&t.session);
    let per = |ns: u64, n: usize| {
        if t.pid.is_some() && n > 0 {
            json!(ns as f64 / 1e6 / n as f64)
        } else {
            Value::Null
        }
    };
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    json!({
        "name": t.name,
        "url": t.url,
        "status": status,
        "bare": {"requests": bare.len(), "errors": t.bare_errors,
            "p50_ms": num(pct(&bare, 0.5)), "p99_ms": num(pct(&bare, 0.99)),
            "added_p50_ms": num(pct(&bare, 0.5) - pct(&dbare, 0.5)),
            "added_p99_ms": num(pct(&bare, 0.99) - pct(&dbare, 0.99)),
            "stream_p50_ms": num(pct(&stream, 0.5)),
            "stream_added_p50_ms": num(pct(&stream, 0.5) - pct(&dstream, 0.5)),
            "stream_added_p99_ms": num(pct(&stream, 0.99) - pct(&dstream, 0.99)),
            "cpu_ms_per_request": per(t.bare_cpu_ns, bare.len())},
        "sessions": {"requests": t.replies, "errors": t.session_errors,
            "p50_ms": num(pct(&lat, 0.5)), "p99_ms": num(pct(&lat, 0.99)),
            "added_p50_ms": num(pct(&added, 0.5)), "added_p99_ms": num(pct(&added, 0.99)),
            "client_bytes": t.client_bytes, "upstream_bytes": t.upstream_bytes,
            "upstream_requests": t.upstream_requests,
            "upstream_share": num(t.upstream_bytes as f64 / t.client_bytes as f64),
            "replies_changed": t.changed, "first_change": t.first_change,
            "cpu_ms_per_request": per(t.session_cpu_ns, t.replies as usize)},
        "concurrent": {"requests": t.load_done, "errors": t.load_errors, "sessions": t.load_sessions,
            "req_per_s": num(t.load_done as f64 / t.load_seconds),
            "p50_ms": num(pct(&load, 0.5)), "p99_ms": num(pct(&load, 0.99)),
            "cpu_ms_per_request": per(t.load_cpu_ns, t.load_done as usize)},
        "memory_kb": t.memory.iter().map(|(p, rss, hwm)| json!({"after": p, "rss": rss, "hwm": hwm})).collect::<Vec<_>>(),
        "first_error": t.first_error,
        "other_upstream_paths": t.other_paths,
    })
}

/// A figure of a column, `—` where there is none.
fn cell(v: &Value, path: &str, digits: usize) -> String {
    match v.pointer(path) {
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.digits$}"),
            _ => n.to_string(),
        },
        Some(Value::Null) | None => "—".to_owned(),
        Some(other) => other.to_string(),
    }
}

/// The table's rows: a label, one or two figures (`a / b`), their digits.
const ROWS: &[(&str, &str, Option<&str>, usize)] = &[
    (
        "bare request p50 / p99 (ms)",
        "/bare/p50_ms",
        Some("/bare/p99_ms"),
        3,
    ),
    (
        "bare: added p50 / p99 (ms)",
        "/bare/added_p50_ms",
        Some("/bare/added_p99_ms"),
        3,
    ),
    (
        "bare streamed: added p50 / p99 (ms)",
        "/bare/stream_added_p50_ms",
        Some("/bare/stream_added_p99_ms"),
        3,
    ),
    (
        "bare: CPU per request (ms)",
        "/bare/cpu_ms_per_request",
        None,
        2,
    ),
    (
        "sessions: calls / errors",
        "/sessions/requests",
        Some("/sessions/errors"),
        0,
    ),
    (
        "sessions: p50 / p99 (ms)",
        "/sessions/p50_ms",
        Some("/sessions/p99_ms"),
        2,
    ),
    (
        "sessions: added p50 / p99 (ms)",
        "/sessions/added_p50_ms",
        Some("/sessions/added_p99_ms"),
        2,
    ),
    (
        "sessions: upstream / client bytes",
        "/sessions/upstream_share",
        None,
        2,
    ),
    (
        "sessions: replies changed",
        "/sessions/replies_changed",
        None,
        0,
    ),
    (
        "sessions: CPU per request (ms)",
        "/sessions/cpu_ms_per_request",
        None,
        2,
    ),
    ("concurrent: req/s", "/concurrent/req_per_s", None, 0),
    (
        "concurrent: p50 / p99 (ms)",
        "/concurrent/p50_ms",
        Some("/concurrent/p99_ms"),
        1,
    ),
    ("concurrent: errors", "/concurrent/errors", None, 0),
    (
        "concurrent: requests / sessions",
        "/concurrent/requests",
        Some("/concurrent/sessions"),
        0,
    ),
    (
        "concurrent: CPU per request (ms)",
        "/concurrent/cpu_ms_per_request",
        None,
        2,
    ),
];

/// The phases after which memory is read, in order.
pub const PHASES: [&str; 4] = ["start", "bare", "sessions", "concurrent"];

pub fn print_table(columns: &[Value]) {
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut row = |label: String, f: &dyn Fn(&Value) -> String| {
        lines.push(
            std::iter::once(label)
                .chain(columns.iter().map(f))
                .collect(),
        );
    };
    row(String::new(), &|c| {
        c["name"].as_str().unwrap_or("").to_owned()
    });
    row("status".to_owned(), &|c| {
        c["status"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect()
    });
    for &(label, a, b, digits) in ROWS {
        row(label.to_owned(), &|c| {
            if c["bare"].is_null() {
                return String::new();
            }
            match b {
                Some(b) => format!("{} / {}", cell(c, a, digits), cell(c, b, digits)),
                None => cell(c, a, digits),
            }
        });
    }
    for phase in PHASES {
        row(format!("RSS / peak after {phase} (MB)"), &|c| {
            c["memory_kb"]
                .as_array()
                .and_then(|m| m.iter().find(|x| x["after"] == phase))
                .map_or_else(String::new, |m| {
                    let mb = |k: &str| m[k].as_f64().unwrap_or(0.0) / 1024.0;
                    format!("{:.0} / {:.0}", mb("rss"), mb("hwm"))
                })
        });
    }
    let width: Vec<usize> = (0..lines[0].len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("| {} |", cells.join(" | "));
    }
}
