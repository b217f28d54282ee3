#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The digest over generated transcripts: the output is valid whenever the
//! input is, never costs more tokens, keeps every message's role and
//! `tool_call_id`, and digesting it again changes nothing.

use context_engine::digest::{DigestOptions, digest};
use context_engine::message::{Content, ContentPart};
use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
use context_engine::validate::{Profile, validate};
use context_engine::{Message, ToolCall};
use proptest::prelude::*;

/// A tool body: size, whether it fails, whether it carries an image.
#[derive(Clone, Debug)]
struct Body {
    size: usize,
    error: bool,
    image: bool,
}

#[derive(Clone, Debug)]
enum Block {
    User,
    Text,
    Tools(Vec<Body>),
    Envelope(Vec<Body>),
}

fn body() -> impl Strategy<Value = Body> {
    (
        prop_oneof![0usize..200, 3000usize..9000],
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(size, error, image)| Body { size, error, image })
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        Just(Block::User),
        Just(Block::Text),
        prop::collection::vec(body(), 1..=3).prop_map(Block::Tools),
        prop::collection::vec(body(), 1..=3).prop_map(Block::Envelope),
    ]
}

fn text_of(b: &Body, k: usize) -> String {
    let mut s = String::new();
    if b.error {
        s.push_str("<returncode>1</returncode>\n");
    }
    let line = format!("line {k} of output [/not a writ]\n");
    while s.len() < b.size {
        s.push_str(&line);
    }
    s.truncate(b.size);
    s
}

fn transcript() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(block(), 0..12).prop_map(|blocks| {
        let mut out = vec![Message::system("agent")];
        let mut next = 0usize;
        for b in blocks {
            match b {
                Block::User => out.push(Message::user("please")),
                Block::Text => out.push(Message::assistant("thinking")),
                Block::Tools(bodies) => {
                    let ids: Vec<String> = bodies
                        .iter()
                        .map(|_| {
                            next += 1;
                            format!("call_{next}")
                        })
                        .collect();
                    let calls = ids
                        .iter()
                        .map(|id| ToolCall::function(id.as_str(), "bash", r#"{"command":"ls"}"#))
                        .collect();
                    out.push(Message::assistant_tool_calls("", calls));
                    for (id, b) in ids.iter().zip(&bodies) {
                        let mut m = Message::tool_result(id.as_str(), text_of(b, next));
                        if b.image {
                            m.content = Content::Parts(vec![
                                ContentPart::new_text(text_of(b, next)),
                                ContentPart::new_image_url("data:image/png;base64,QUJD"),
                            ]);
                        }
                        out.push(m);
                    }
                }
                Block::Envelope(bodies) => {
                    out.push(Message::assistant("[/exec ls]"));
                    let mut t = String::new();
                    for (k, b) in bodies.iter().enumerate() {
                        t.push_str(&format!(
                            "[/exec step {k}]\n{}\n[END EXEC]\n",
                            text_of(b, k)
                        ));
                    }
                    t.push_str("[END TOOL RESULTS]");
                    out.push(Message::user(t));
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn digest_is_valid_shorter_and_faithful(m in transcript(), keep in 0usize..3, min in prop_oneof![Just(0usize), Just(64), Just(4096)]) {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let opts = DigestOptions { keep_batches: keep, min_bytes: min, ..DigestOptions::default() };
        prop_assert_eq!(validate(&m, Profile::OpenAi), vec![]);
        let out = digest(&m, &opts);
        prop_assert_eq!(validate(&out, Profile::OpenAi), vec![]);
        prop_assert_eq!(out.len(), m.len());
        prop_assert!(counter.count_messages(&out) <= counter.count_messages(&m));
        for (a, b) in out.iter().zip(&m) {
            prop_assert_eq!(&a.role, &b.role);
            prop_assert_eq!(&a.tool_call_id, &b.tool_call_id);
            prop_assert_eq!(&a.tool_calls, &b.tool_calls);
            // Text messages never grow.
            if b.content.parts().is_empty() {
                prop_assert!(a.text().len() <= b.text().len());
            }
        }
        prop_assert_eq!(digest(&out, &opts), out);
    }
}
