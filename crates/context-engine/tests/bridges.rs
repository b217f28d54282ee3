#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The bridges of the two client formats under the engine's own rewrites:
//! a digest changes only the rewritten block or item, and a compaction
//! yields a request the provider accepts (thinking and reasoning intact).
//! (The bridges live in `context-engine-wire`; the digest and compressor
//! here, so these tests are the engine's.)

use std::sync::Arc;

use context_engine::compressor::Compressor;
use context_engine::digest::{DigestOptions, digest};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::tokens::{CountOptions, EstimateCounter};
use context_engine::validate::Profile;

use context_engine_testkit::requests;

mod anthropic {
    use super::*;
    use context_engine::anthropic::Request;
    use context_engine::anthropic::bridge::{from_chat, to_chat};
    use context_engine::validate::anthropic::{thinking_changed, validate};
    use requests::{claude_code_request, long_session};

    #[test]
    fn a_digested_result_changes_only_that_block() {
        let text = claude_code_request(&"line of output\n".repeat(400));
        let request = Request::parse(&text).unwrap();
        let bridged = to_chat(&request);
        let opts = DigestOptions {
            keep_batches: 1,
            ..DigestOptions::default()
        };
        let digested = digest(&bridged.messages, &opts);
        assert_ne!(digested, bridged.messages, "the big result is digested");
        let back = from_chat(&request, &bridged, &digested);
        let (a, b) = (request.to_value(), back.to_value());
        assert_eq!(a["system"], b["system"]);
        for i in [0, 1, 3, 4, 5, 6, 7] {
            assert_eq!(a["messages"][i], b["messages"][i], "message {i}");
        }
        let (old, new) = (&a["messages"][2]["content"], &b["messages"][2]["content"]);
        assert_eq!(old[1], new[1]);
        assert_eq!(old[2], new[2]);
        assert_eq!(new[0]["tool_use_id"], "toolu_01A");
        assert!(new[0]["content"].as_str().unwrap().len() < 200);
        // The rest of the result block's keys stay, in order.
        let keys: Vec<_> = new[0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["type", "tool_use_id", "content"]);
        assert!(validate(&back).is_empty());
        assert!(thinking_changed(&request, &back).is_empty());
    }

    #[test]
    fn a_compaction_yields_a_valid_anthropic_request() {
        let text = long_session(40);
        let request = Request::parse(&text).unwrap();
        assert!(validate(&request).is_empty());
        let bridged = to_chat(&request);
        let counter = Arc::new(EstimateCounter::new(CountOptions::default()));
        let mut engine = Compressor::with_options(
            counter,
            20_000,
            context_engine::compressor::CompressorOptions::default().with_profile(Profile::Strict),
        );
        let out = engine
            .compress(&bridged.messages, &CompressRequest::new())
            .unwrap()
            .messages;
        assert!(out.len() < bridged.messages.len());
        let back = from_chat(&request, &bridged, &out);
        assert!(validate(&back).is_empty(), "{:#?}", validate(&back));
        assert!(thinking_changed(&request, &back).is_empty());
        assert!(back.messages.len() < request.messages.len());
        // The kept tail is byte-identical, breakpoint included.
        let (a, b) = (request.to_value(), back.to_value());
        let (am, bm) = (
            a["messages"].as_array().unwrap(),
            b["messages"].as_array().unwrap(),
        );
        assert_eq!(am.last(), bm.last());
        assert_eq!(am[am.len() - 2], bm[bm.len() - 2]);
        // The system prompt carries the compaction note after the original text.
        assert!(
            b["system"]
                .as_str()
                .unwrap()
                .starts_with("You are a coding agent.")
        );
        // And the summary names the task.
        assert!(b.to_string().contains("Refactor the parser."));
    }
}

mod responses {
    use super::*;
    use context_engine::responses::Request;
    use context_engine::responses::bridge::{from_chat, to_chat};
    use context_engine::validate::responses::validate;
    use requests::{codex_request, long_codex};

    #[test]
    fn a_digested_output_changes_only_that_item() {
        let text = codex_request(&"output line\n".repeat(500));
        let request = Request::parse(&text).unwrap();
        let bridged = to_chat(&request);
        let opts = DigestOptions {
            keep_batches: 1,
            ..DigestOptions::default()
        };
        let digested = digest(&bridged.messages, &opts);
        let back = from_chat(&request, &bridged, &digested);
        let (a, b) = (request.to_value(), back.to_value());
        for i in (0..16).filter(|&i| i != 5) {
            assert_eq!(a["input"][i], b["input"][i], "item {i}");
        }
        assert_eq!(b["input"][5]["call_id"], "call_1");
        assert!(b["input"][5]["output"].as_str().unwrap().len() < 200);
        assert_eq!(a["instructions"], b["instructions"]);
        assert!(validate(&back).is_empty());
    }

    #[test]
    fn a_compaction_yields_a_valid_responses_request() {
        let text = long_codex(40);
        let request = Request::parse(&text).unwrap();
        assert!(validate(&request).is_empty());
        let bridged = to_chat(&request);
        let counter = Arc::new(EstimateCounter::new(CountOptions::default()));
        let mut engine = Compressor::new(counter, 20_000);
        let out = engine
            .compress(&bridged.messages, &CompressRequest::new())
            .unwrap()
            .messages;
        assert!(out.len() < bridged.messages.len());
        let back = from_chat(&request, &bridged, &out);
        assert!(validate(&back).is_empty(), "{:#?}", validate(&back));
        let (a, b) = (request.to_value(), back.to_value());
        let (ai, bi) = (
            a["input"].as_array().unwrap(),
            b["input"].as_array().unwrap(),
        );
        assert!(bi.len() < ai.len());
        // Append-only prefix: the first item and the kept tail are unchanged.
        assert_eq!(ai[0], bi[0]);
        assert_eq!(ai.last(), bi.last());
        // Every kept call has its reasoning right before it, unchanged.
        for (k, item) in bi.iter().enumerate() {
            if item["type"] == "function_call" {
                assert_eq!(bi[k - 1]["type"], "reasoning");
            }
        }
        assert!(b.to_string().contains("Port the parser to Rust."));
    }
}
