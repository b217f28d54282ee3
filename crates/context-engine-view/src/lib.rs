//! The pages that show what context-engine did: the self-contained report
//! `ctx replay --html` writes, and the live page `ctx serve` answers at
//! `/ui`.
//!
//! Both pages are one HTML document each, with their CSS and JavaScript
//! inline (the files under `assets/`, compiled in with `include_str!`), so
//! they need no network and no build step: no Node toolchain, no vendored
//! library. The data is JSON: the replay report is embedded in the file
//! (`<script type="application/json" id="report">`, the exact text
//! `ctx replay --json` prints), the live page polls the proxy's JSON
//! endpoints. `assets/view.js` draws both (the per-call chart, the cost
//! table, a compaction with its summary and the messages it replaced, the
//! retention lists) with DOM calls only: text is set as text, never parsed
//! as HTML.
//!
//! Each page carries a strict Content-Security-Policy: styles only inline,
//! scripts only the page's own (each inline script named by its SHA-256 in
//! `script-src`, no `'unsafe-inline'`: a script anything injected would
//! run is refused), images only as `data:` URLs, and no other source at
//! all (the live page may also fetch from its own origin), so any request
//! a page made elsewhere would be refused and show as a console error.
//!
//! This crate knows no engine type: it takes JSON text and gives HTML text,
//! so the CLI and the proxy share it without depending on each other.

use std::sync::LazyLock;

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The report's policy: nothing loads from anywhere; inline styles, the
/// report's own scripts (by hash), `data:` images.
pub fn replay_csp() -> &'static str {
    static CSP: LazyLock<String> = LazyLock::new(|| {
        format!(
            "default-src 'none'; style-src 'unsafe-inline'; script-src {}; img-src data:; base-uri 'none'; form-action 'none'",
            hashes(&[VIEW_JS, REPLAY_JS])
        )
    });
    &CSP
}

/// The live page's policy: as the report's with the live page's scripts,
/// plus fetches from its own origin (the proxy's JSON endpoints).
pub fn ui_csp() -> &'static str {
    static CSP: LazyLock<String> = LazyLock::new(|| {
        format!(
            "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src {}; img-src data:; base-uri 'none'; form-action 'none'",
            hashes(&[VIEW_JS, UI_JS])
        )
    });
    &CSP
}

/// [`ui_csp`] as the proxy sends it in a header, where `frame-ancestors`
/// also holds (a `<meta>` policy may not carry it).
pub fn ui_csp_header() -> &'static str {
    static CSP: LazyLock<String> =
        LazyLock::new(|| format!("{}; frame-ancestors 'none'", ui_csp()));
    &CSP
}

/// The `script-src` sources of `scripts`: each element's text by its
/// SHA-256, as [`scripts`] writes it.
fn hashes(scripts: &[&str]) -> String {
    scripts
        .iter()
        .map(|code| {
            let digest = Sha256::digest(script_text(code).as_bytes());
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text of the `<script>` element that carries `code`.
fn script_text(code: &str) -> String {
    // The assets are this crate's own files; escaping keeps any `</script`
    // in them from ending the element.
    format!("\n{}", html_escape::encode_script(code))
}

const CSS: &str = include_str!("../assets/view.css");
const VIEW_JS: &str = include_str!("../assets/view.js");
const REPLAY_JS: &str = include_str!("../assets/replay.js");
const UI_JS: &str = include_str!("../assets/ui.js");

/// The id of the element the report's JSON is embedded in.
pub const REPORT_ELEMENT_ID: &str = "report";

/// The self-contained report of one replay: `title` (shown as text) and
/// `report_json`, the JSON text of the report (`ctx replay --json`'s),
/// embedded as it is for the page (and tests) to read.
pub fn replay_page(title: &str, report_json: &str) -> String {
    let mut html = head(title, replay_csp());
    html.push_str("<script type=\"application/json\" id=\"");
    html.push_str(REPORT_ELEMENT_ID);
    html.push_str("\">");
    html.push_str(&json_for_script(report_json));
    html.push_str("</script>\n");
    html.push_str(&scripts(REPLAY_JS));
    html.push_str("</body>\n</html>\n");
    html
}

/// The live page of `ctx serve` (`/ui`): the same for every caller; what
/// it shows comes from the JSON endpoints, under the caller's access.
pub fn ui_page() -> String {
    let mut html = head("ctx serve", ui_csp());
    html.push_str(&scripts(UI_JS));
    html.push_str("</body>\n</html>\n");
    html
}

/// The document up to the application's mount point.
fn head(title: &str, csp: &str) -> String {
    let mut html = String::with_capacity(CSS.len() + VIEW_JS.len() + 4096);
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    html.push_str("<meta http-equiv=\"Content-Security-Policy\" content=\"");
    html.push_str(&html_escape::encode_double_quoted_attribute(csp));
    html.push_str(
        "\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
    );
    html.push_str("<meta name=\"referrer\" content=\"no-referrer\">\n<title>");
    html.push_str(&html_escape::encode_text(title));
    html.push_str("</title>\n<style>\n");
    html.push_str(CSS);
    html.push_str("</style>\n</head>\n<body>\n<main id=\"app\"><h1>");
    html.push_str(&html_escape::encode_text(title));
    html.push_str("</h1><p class=\"muted\">This page needs JavaScript.</p></main>\n");
    html
}

/// The shared view code, then the page's own.
fn scripts(page: &str) -> String {
    let mut s = String::with_capacity(VIEW_JS.len() + page.len() + 64);
    for code in [VIEW_JS, page] {
        s.push_str("<script>");
        s.push_str(&script_text(code));
        s.push_str("</script>\n");
    }
    s
}

/// JSON text made safe inside a `<script>` element: every `<` written as
/// the JSON escape `\u003c`. A `<` can only stand inside a JSON string, so
/// the value is unchanged, and neither `</script>` nor `<!--` can appear.
/// (`html_escape::encode_script` is not for JSON: its `<\!--` is not a
/// JSON escape; its documentation prescribes exactly this for JSON.)
fn json_for_script(json: &str) -> String {
    json.replace('<', "\\u003c")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each inline script runs only by its hash: the policy names the
    /// SHA-256 of exactly the text of each `<script>` element the page
    /// holds, and allows no other inline script.
    #[test]
    fn the_scripts_run_by_hash_never_by_unsafe_inline() {
        for (page, csp) in [
            (replay_page("r", "{}"), replay_csp()),
            (ui_page(), ui_csp()),
        ] {
            let script_src = csp
                .split(';')
                .map(str::trim)
                .find(|d| d.starts_with("script-src"))
                .expect("a script-src");
            assert!(!script_src.contains("unsafe-inline"), "{script_src}");
            let mut rest = page.as_str();
            let mut scripts = 0;
            while let Some(at) = rest.find("<script>") {
                let body = &rest[at + "<script>".len()..];
                let end = body.find("</script>").expect("closed");
                let digest = Sha256::digest(&body.as_bytes()[..end]);
                let source = format!(
                    "'sha256-{}'",
                    base64::engine::general_purpose::STANDARD.encode(digest)
                );
                assert!(script_src.contains(&source), "{source} not in {script_src}");
                scripts += 1;
                rest = &body[end..];
            }
            assert_eq!(scripts, 2);
            assert_eq!(script_src.matches("'sha256-").count(), 2);
        }
    }

    #[test]
    fn the_report_embeds_the_json_so_that_no_text_can_end_the_script() {
        let json = r#"{"file":"</script><script>alert(1)</script>","x":"<!-- a"}"#;
        let page = replay_page("a <b> & \"c\"", json);
        // One JSON script element, closed once, at its end.
        let start = page
            .find("<script type=\"application/json\" id=\"report\">")
            .unwrap();
        let body = &page[start..];
        let end = body.find("</script>").unwrap();
        let embedded = &body[body.find('>').unwrap() + 1..end];
        assert!(!embedded.contains('<'));
        // The same JSON text once `\u003c` is read back.
        assert_eq!(embedded.replace("\\u003c", "<"), json);
        // The title is text, not markup.
        assert!(page.contains("<title>a &lt;b&gt; &amp; \"c\"</title>"));
        assert!(!page.contains("<b>"));
    }

    #[test]
    fn each_page_carries_its_policy_and_weighs_under_300_kb() {
        let report = replay_page("r", "{}");
        assert!(
            report.contains("default-src &#x27;none&#x27;")
                || report.contains("default-src 'none'")
        );
        assert!(!report.contains("connect-src"));
        let ui = ui_page();
        assert!(ui.contains("connect-src"));
        // A meta policy may not carry frame-ancestors (the browser says so
        // in the console); the header does.
        assert!(!ui.contains("frame-ancestors"));
        assert!(ui_csp_header().starts_with(ui_csp()));
        for page in [&report, &ui] {
            assert!(page.len() < 300 * 1024, "{} bytes", page.len());
        }
    }
}
