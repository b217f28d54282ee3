#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx replay --html`, opened from disk in headless Chromium: the page
//! shows the figures `--json` reports, one chart point per call, each
//! compaction's summary beside the messages it replaced, and makes no
//! request (its policy refuses any, which would show in the console).

#[path = "common/browser.rs"]
mod browser;
mod common;

use browser::{Browser, file_url};
use common::{TempDir, ctx, stderr, stdout};
use serde_json::Value;

const EXAMPLE: &str = "examples/coding-session.json";

/// The JSON text a page embeds in `<script type="application/json"
/// id="report">`, with the `\u003c` escapes read back.
fn embedded_report(html: &str) -> Value {
    let open = "<script type=\"application/json\" id=\"report\">";
    let start = html.find(open).expect("no embedded report") + open.len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).expect("the embedded report is JSON")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A figure as the page shows it ("144,456" → 144456).
fn shown(v: &Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("no figure: {v}"));
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("not a whole number: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_html_report_shows_what_the_json_report_says_and_loads_nothing() {
    let dir = TempDir::new("browser", "replay");
    let page = dir.0.join("out.html");
    // One run writes both: the page's data is the JSON's, byte for byte
    // (timings included).
    let out = ctx(&[
        "replay",
        EXAMPLE,
        "--context-length",
        "16000",
        "--json",
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(embedded_report(&html), json);
    assert!(
        html.len() < 300 * 1024 + stdout(&out).len(),
        "{} bytes",
        html.len()
    );
    let compactions = json["compactions"].as_array().unwrap();
    assert!(!compactions.is_empty(), "the example compacts at 16k");

    let Some(browser) = Browser::start("replay").await else {
        return;
    };
    browser
        .open(
            &file_url(&page),
            "document.querySelector('[data-figure=calls]')",
        )
        .await;
    let seen = browser
        .eval(
            r#"
            const figures = {};
            for (const e of document.querySelectorAll('[data-figure]')) figures[e.dataset.figure] = e.textContent;
            return {
              figures,
              points: document.querySelectorAll('svg.chart circle.point').length,
              compactionMarks: document.querySelectorAll('svg.chart .mark-compaction').length,
              windowLine: document.querySelectorAll('svg.chart line.window').length,
              thresholdLine: document.querySelectorAll('svg.chart line.threshold').length,
              costRows: document.querySelectorAll('table.costs tbody tr').length,
              compactions: [...document.querySelectorAll('section.compaction')].map(s => ({
                summary: [...s.querySelectorAll('.summary pre')].map(p => p.textContent).join('\n'),
                stateRecord: [...s.querySelectorAll('.summary pre.state-record')].length,
                replaced: s.querySelectorAll('.replaced .message').length,
                firstReplaced: (s.querySelector('.replaced .message pre') || {}).textContent,
              })),
              lost: document.querySelectorAll('table.lost tbody tr').length,
              recallable: document.querySelectorAll('table.recallable tbody tr').length,
            };"#,
        )
        .await;
    let t = &json["totals"];
    let f = &seen["figures"];
    for key in [
        "calls",
        "prompt_tokens_without_engine",
        "prompt_tokens_with_engine",
        "largest_request_with_engine",
        "compactions",
        "selected",
    ] {
        assert_eq!(shown(&f[key]), u(&t[key]), "figure {key}");
    }
    let r = &json["retention"];
    for (figure, key) in [
        ("retention_verbatim", "verbatim"),
        ("retention_in", "in_summary"),
        ("retention_recallable", "recallable"),
        ("retention_lost", "lost"),
    ] {
        assert_eq!(shown(&f[figure]), u(&r[key]), "figure {figure}");
    }
    // Every lost and every recallable fact is listed.
    assert_eq!(
        u(&seen["lost"]),
        r["lost_probes"].as_array().unwrap().len() as u64
    );
    assert_eq!(
        u(&seen["recallable"]),
        r["recallable_probes"].as_array().unwrap().len() as u64
    );
    // One point per call; the window, the threshold and each compaction drawn.
    assert_eq!(u(&seen["points"]), u(&t["calls"]));
    assert_eq!(u(&seen["compactionMarks"]), compactions.len() as u64);
    assert_eq!(u(&seen["windowLine"]), 1);
    assert_eq!(u(&seen["thresholdLine"]), 1);
    assert_eq!(u(&seen["costRows"]), 3);
    // Each compaction: the summary as sent, with its state record, beside
    // the messages it replaced, as archived.
    let shown_compactions = seen["compactions"].as_array().unwrap();
    assert_eq!(shown_compactions.len(), compactions.len());
    for (s, c) in shown_compactions.iter().zip(compactions) {
        let summary = s["summary"].as_str().unwrap();
        assert!(summary.contains("[CONTEXT SUMMARY"), "{summary}");
        assert!(summary.contains("## State record"), "{summary}");
        assert_eq!(u(&s["stateRecord"]), 1);
        let replaced: u64 = c["archived"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["replaced"].as_array().unwrap().len() as u64)
            .sum();
        assert!(replaced > 0, "the compaction archived what it replaced");
        assert_eq!(u(&s["replaced"]), replaced);
        let first = &c["archived"][0]["replaced"][0];
        let first_text = first["content"].as_str().unwrap_or_default();
        assert!(
            s["firstReplaced"]
                .as_str()
                .unwrap()
                .starts_with(first_text.trim_end()),
            "the first replaced message is shown as archived"
        );
    }
    // No script error and no request refused: the page loaded nothing.
    browser.assert_no_console_errors().await;
    let shot = browser.screenshot("report").await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    browser.finish().await;
}
