#![allow(clippy::unwrap_used, clippy::expect_used)]
use context_engine::redact::{RedactOptions, Redactor};
fn main() {
    let r = Redactor::builder().honour_env(false).build().unwrap();
    for arg in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&arg).unwrap();
        for url in [false, true] {
            let opts = RedactOptions {
                force: true,
                url_credentials: url,
                code_file: false,
            };
            let rep = r.redact_report(&text, &opts);
            for f in &rep.findings {
                let lo = f.start.saturating_sub(60);
                let hi = (f.end + 30).min(text.len());
                let lo = (0..=lo).rev().find(|&i| text.is_char_boundary(i)).unwrap();
                let hi = (hi..=text.len())
                    .find(|&i| text.is_char_boundary(i))
                    .unwrap();
                println!(
                    "{arg} url={url} {} L{} secret={:?}\n    ctx={:?}",
                    f.rule,
                    f.line,
                    &text[f.start..f.end],
                    &text[lo..hi]
                );
            }
        }
    }
}
