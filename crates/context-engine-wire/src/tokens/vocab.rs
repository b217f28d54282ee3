//! The exact counter's tables, built at run time from the embedded
//! vocabularies (the `compact-vocab` feature).
//!
//! `bpe-openai` embeds tables it precomputes at compile time: 47 MB for
//! `o200k_base` and `cl100k_base`, most of a binary's size. Under
//! `compact-vocab` the binary carries tiktoken's vocabulary text instead
//! (2.5 MB gzipped, `vocab/`), and the same tables are built from it once,
//! on first use, by `bpe`'s own constructor with `bpe-openai`'s hash factor
//! and `bpe-openai`'s pre-tokenization patterns: the counts are the same
//! (the tests below compare both builds token for token). Building takes
//! about 1.6 s for `o200k_base` and 0.5 s for `cl100k_base` on one core, so
//! hosts start it in the background at start ([`super::prepare`]); a count
//! that comes first waits for it.

use std::io::Read;
use std::sync::LazyLock;

use bpe::byte_pair_encoding::{BytePairEncoding, read_tiktoken};
use bpe_openai::Tokenizer;

use super::Encoding;

/// `bpe-openai`'s hash factor: no two tokens of either vocabulary hash alike.
const HASH_FACTOR: u64 = 17846336922010275747;

const O200K_GZ: &[u8] = include_bytes!("../../vocab/o200k_base.tiktoken.gz");
const CL100K_GZ: &[u8] = include_bytes!("../../vocab/cl100k_base.tiktoken.gz");

static O200K: LazyLock<Tokenizer> = LazyLock::new(|| {
    let pat1 = [
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "\\p{N}{1,3}",
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
        "\\s*[\\r\\n]+",
        "\\s+$",
    ]
    .join("|");
    build(O200K_GZ, &pat1)
});

static CL100K: LazyLock<Tokenizer> = LazyLock::new(|| {
    build(
        CL100K_GZ,
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+$",
    )
});

/// The tokenizer of `encoding`, built on the first call (later and
/// concurrent callers wait for that one build).
pub(super) fn tokenizer(encoding: Encoding) -> &'static Tokenizer {
    match encoding {
        Encoding::O200kBase => &O200K,
        Encoding::Cl100kBase => &CL100K,
    }
}

/// `bpe-openai`'s construction, from the vocabulary text: the pattern with
/// its look-ahead companions (`\s+(?!\S)` rewritten as `\s+\s` minus the
/// last character), no normalization.
// The vocabularies and patterns are constants of the build, checked by the
// tests below: a failure here is a broken build, never bad input, as in
// `bpe-openai`, which expects the same.
#[allow(clippy::expect_used)]
fn build(gz: &[u8], pattern: &str) -> Tokenizer {
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .expect("the embedded vocabulary is gzipped UTF-8");
    let tokens = read_tiktoken(&text).expect("the embedded vocabulary is tiktoken text");
    let bpe = BytePairEncoding::from_dictionary(tokens, Some(HASH_FACTOR));
    Tokenizer::new_lookahead(
        bpe,
        &[(pattern, false), ("\\s+\\s", true), ("\\s+", false)],
        false,
    )
    .expect("the pre-tokenization patterns compile")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts that exercise the patterns: contractions, case runs, digits,
    /// punctuation runs, line breaks and trailing spaces, scripts without
    /// spaces, emoji, and the repository's recorded sessions whole.
    fn samples() -> Vec<String> {
        let mut texts: Vec<String> = [
            "",
            " ",
            "hello world",
            "Hello, World! I'm here; you'll see. They've DONE it, we'd say.",
            "CamelCaseIdentifier snake_case_name SCREAMING_CASE x1y2z3",
            "1234567890 3.14159 -42 0x1F 1e-9 12,345,678",
            "   leading and trailing spaces   ",
            "tabs\tand\nnew\r\nlines\n\n\n  indented\n",
            "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
            "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
            "path/to/file.rs:12:34 error[E0308]: mismatched types ==> src/lib.rs",
            "日本語のテキストと中文文本和한국어 텍스트",
            "Ünïcödé àccents ßtraße naïve café résumé",
            "emoji 🎉🚀👍🏽 and ZWJ 👩‍👩‍👧‍👦 sequences",
            "مرحبا بالعالم שלום עולם Привет мир",
            "<|endoftext|> <|im_start|>user special strings as text",
            "!!!???...,,,;;;:::---___===+++***",
            "\u{0}\u{1}\u{7f} control characters",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        texts.push("word ".repeat(5000));
        texts.push("a".repeat(10_000));
        texts.push("🙂".repeat(500));
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for name in ["coding-session.json", "bugfix-session.json"] {
            let path = examples.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => texts.push(text),
                Err(e) => panic!("{} unreadable: {e}", path.display()),
            }
        }
        texts
    }

    #[test]
    fn counts_and_tokens_match_the_precomputed_tables() {
        let precomputed = [
            (Encoding::O200kBase, bpe_openai::o200k_base()),
            (Encoding::Cl100kBase, bpe_openai::cl100k_base()),
        ];
        let texts = samples();
        for (encoding, reference) in precomputed {
            let built = tokenizer(encoding);
            assert_eq!(built.bpe.num_tokens(), reference.bpe.num_tokens());
            for text in &texts {
                let head: String = text.chars().take(40).collect();
                assert_eq!(
                    built.count(text.as_str()),
                    reference.count(text.as_str()),
                    "{encoding:?} count of {head:?}"
                );
                assert_eq!(
                    built.encode(text.as_str()),
                    reference.encode(text.as_str()),
                    "{encoding:?} tokens of {head:?}"
                );
            }
        }
    }

    #[test]
    fn every_token_decodes_to_the_same_bytes() {
        for (encoding, reference) in [
            (Encoding::O200kBase, bpe_openai::o200k_base()),
            (Encoding::Cl100kBase, bpe_openai::cl100k_base()),
        ] {
            let built = tokenizer(encoding);
            for id in 0..reference.bpe.num_tokens() as u32 {
                assert_eq!(
                    built.bpe.token_bytes(id),
                    reference.bpe.token_bytes(id),
                    "{encoding:?} token {id}"
                );
            }
        }
    }
}
