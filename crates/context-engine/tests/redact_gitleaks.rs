#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Coverage against gitleaks' default rules: for every rule, generate a string
//! that matches its regex (a small generator over the regex's HIR), and check
//! that our redactor masks the secret part. Fails below 90 %; prints misses.

use context_engine::redact::{RedactOptions, Redactor};
use regex_automata::meta::Regex;
use regex_automata::util::syntax;
use regex_syntax::hir::{Class, Hir, HirKind};

use context_engine_testkit as common;

/// Deterministic xorshift, so the samples (and the figure) are stable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Bytes (printable ASCII, plus space and newline) that a class accepts.
fn class_bytes(class: &Class) -> Vec<u8> {
    let accepts = |b: u8| match class {
        Class::Bytes(c) => c.ranges().iter().any(|r| r.start() <= b && b <= r.end()),
        Class::Unicode(c) => c
            .ranges()
            .iter()
            .any(|r| r.start() <= char::from(b) && char::from(b) <= r.end()),
    };
    (0x20u8..0x7f)
        .chain([b'\n'])
        .filter(|&b| accepts(b))
        .collect()
}

fn pick(class: &Class, rng: &mut Rng) -> u8 {
    let bytes = class_bytes(class);
    // `.`: a literal dot reads best (host names, `xoxe.xoxb`).
    if bytes.len() > 90 {
        return b'.';
    }
    let alnum: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(u8::is_ascii_alphanumeric)
        .collect();
    if !alnum.is_empty() {
        return alnum[rng.below(alnum.len())];
    }
    if bytes.contains(&b' ') {
        return b' ';
    }
    bytes.first().copied().unwrap_or(b'x')
}

fn generate(hir: &Hir, rng: &mut Rng, out: &mut Vec<u8>) {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(lit) => out.extend_from_slice(&lit.0),
        HirKind::Class(class) => out.push(pick(class, rng)),
        HirKind::Repetition(rep) => {
            // Unbounded repetitions get a realistic length; optional parts
            // (padding, prefixes) are left out.
            let n = match rep.max {
                None if rep.min > 0 => rep.min.max(12),
                _ => rep.min,
            };
            for _ in 0..n {
                generate(&rep.sub, rng, out);
            }
        }
        HirKind::Capture(cap) => generate(&cap.sub, rng, out),
        HirKind::Concat(parts) => {
            for p in parts {
                generate(p, rng, out);
            }
        }
        HirKind::Alternation(alts) => generate(&alts[0], rng, out),
    }
}

/// The HIR to generate from comes from the pattern without `(?i)`, so that
/// literals keep the case they are written in (`-----BEGIN`, `CLOJARS_`); the
/// regex that checks the sample is the real one.
fn parse(pattern: &str) -> Option<(Hir, Regex)> {
    let config = syntax::Config::new().unicode(false).utf8(false);
    let cased = pattern.replace("(?i)", "").replace("(?i:", "(?:");
    let hir = regex_syntax::ParserBuilder::new()
        .unicode(false)
        .utf8(false)
        .build()
        .parse(&cased)
        .ok()?;
    let re = Regex::builder().syntax(config).build(pattern).ok()?;
    Some((hir, re))
}

/// The secret gitleaks would report in `sample`: its secretGroup, else the
/// first group that took part, else the whole match.
fn gitleaks_secret(re: &Regex, sample: &[u8], group: Option<usize>) -> Option<(usize, usize)> {
    let mut caps = re.create_captures();
    re.captures(sample, &mut caps);
    let whole = caps.get_match()?;
    let span = match group {
        Some(g) => caps.get_group(g)?,
        None => (1..caps.group_len())
            .find_map(|g| caps.get_group(g))
            .unwrap_or(whole.span()),
    };
    Some((span.start, span.end))
}

#[test]
fn gitleaks_rules_are_covered() {
    let Some(path) = common::shared("reference/gitleaks.toml") else {
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let rules = table["rules"].as_array().unwrap();
    let redactor = Redactor::builder().build().unwrap();
    let opts = RedactOptions {
        force: true,
        ..RedactOptions::default()
    };

    let (mut total, mut covered) = (0usize, 0usize);
    let mut misses = Vec::new();
    let mut no_sample = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let id = rule["id"].as_str().unwrap();
        let Some(pattern) = rule.get("regex").and_then(|r| r.as_str()) else {
            continue; // path-only rules (e.g. pkcs12-file) match no text
        };
        let group = rule
            .get("secretGroup")
            .and_then(|g| g.as_integer())
            .map(|g| g as usize);
        let Some((hir, re)) = parse(pattern) else {
            no_sample.push(format!("{id}: regex not parsed"));
            continue;
        };
        if let Some(sample) = hand_written(id) {
            total += 1;
            let out = redactor.redact(sample.0, &opts);
            if out.contains(sample.1) {
                misses.push(format!("{id}: {:?} (hand-written)", sample.0));
            } else {
                covered += 1;
            }
            continue;
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1));
        let mut body = Vec::new();
        generate(&hir, &mut rng, &mut body);
        let mut sample = b"config:\n".to_vec();
        sample.extend_from_slice(&body);
        sample.extend_from_slice(b"\nend\n");
        let Some((s, e)) = gitleaks_secret(&re, &sample, group) else {
            no_sample.push(format!("{id}: generated sample does not match"));
            continue;
        };
        let Ok(sample) = String::from_utf8(sample) else {
            no_sample.push(format!("{id}: sample not UTF-8"));
            continue;
        };
        total += 1;
        let secret = &sample[s..e];
        let out = redactor.redact(&sample, &opts);
        if out.contains(secret) {
            misses.push(format!("{id}: {:?}", body_str(&body)));
        } else {
            covered += 1;
        }
    }
    let pct = 100.0 * covered as f64 / total.max(1) as f64;
    eprintln!("gitleaks coverage: {covered}/{total} = {pct:.1}%");
    for m in &misses {
        eprintln!("  miss {m}");
    }
    for n in &no_sample {
        eprintln!("  no sample {n}");
    }
    assert!(total >= 200, "only {total} rules produced a sample");
    assert!(pct >= 90.0, "coverage {pct:.1}% is below 90%");
}

/// Rules whose regex the generator cannot turn into a realistic sample:
/// (text, secret part).
fn hand_written(id: &str) -> Option<(&'static str, &'static str)> {
    match id {
        "private-key" => Some((
            "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oW3ZbVQfS1n0oAoGCCqGSM49\nAwEHoUQDQgAEl9rYzRmSm0tCs3E2Vt4Kxw1uR0nDdp9Y6sK8qzJ4b5xT1mE2nQ3w\n-----END EC PRIVATE KEY-----\n",
            "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oW3ZbVQfS1n0oAoGCCqGSM49",
        )),
        "kubernetes-secret-yaml" => Some((
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ndata:\n  password: cDRzc3cwcmQtZm9yLXRlc3Rz\n",
            "cDRzc3cwcmQtZm9yLXRlc3Rz",
        )),
        _ => None,
    }
}

fn body_str(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 120 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(120).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s.into_owned()
    }
}
