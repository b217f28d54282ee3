#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every real transcript of the shared corpus loads, is detected as the right
//! format, and writes back to the same JSON.

use std::path::PathBuf;

use context_engine::Message;
use context_engine::message::Role;
use context_engine::transcript::{Format, Transcript};
use serde_json::Value;

use common::corpus_files as corpus;
use context_engine_testkit as common;

fn read_value(path: &PathBuf) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The raw message values of a whole-file JSON transcript.
fn raw_messages(value: &Value) -> &Vec<Value> {
    match value {
        Value::Array(items) => items,
        Value::Object(map) => map
            .get("messages")
            .or_else(|| map.get("history"))
            .and_then(Value::as_array)
            .unwrap(),
        other => panic!("unexpected top level {other}"),
    }
}

#[test]
fn every_corpus_message_round_trips_to_the_same_json_text() {
    let Some(files) = corpus() else { return };
    let mut count = 0;
    for path in &files {
        let value = read_value(path);
        for (i, raw) in raw_messages(&value).iter().enumerate() {
            let message = Message::from_value(raw.clone())
                .unwrap_or_else(|e| panic!("{}: message {i}: {e}", path.display()));
            assert_eq!(
                serde_json::to_string(&message).unwrap(),
                serde_json::to_string(raw).unwrap(),
                "{}: message {i}",
                path.display()
            );
            count += 1;
        }
    }
    assert!(count > 200, "only {count} messages in the corpus");
}

#[test]
fn every_corpus_file_writes_back_to_the_same_json() {
    let Some(files) = corpus() else { return };
    for path in &files {
        let original = read_value(path);
        let t = Transcript::load(path).unwrap();
        assert_eq!(t.messages.len(), raw_messages(&original).len());
        for written in [t.to_json_string(), t.to_json_string_pretty()] {
            let back: Value = serde_json::from_str(&written).unwrap();
            assert_eq!(back, original, "{}", path.display());
            // Same keys in the same order, everywhere.
            assert_eq!(
                serde_json::to_string(&back).unwrap(),
                serde_json::to_string(&original).unwrap(),
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn conversions_keep_every_message() {
    let Some(files) = corpus() else { return };
    for path in &files {
        let t = Transcript::load(path).unwrap();
        // The normalised messages (`to_array_string` of an array transcript
        // would undo the normalisation: it is that transcript's own format).
        let standard = serde_json::to_string(&t.messages).unwrap();
        for format in Format::CHAT {
            let text = t.render(format);
            let back = Transcript::parse_as(&text, "converted", format).unwrap();
            assert_eq!(back.format, format);
            assert_eq!(
                serde_json::to_string(&back.messages).unwrap(),
                standard,
                "{} via {format}",
                path.display()
            );
            // Detection finds the format again.
            assert_eq!(
                Transcript::parse(&text, "converted").unwrap().format,
                format
            );
        }
    }
}

#[test]
fn detection_picks_the_right_format() {
    let Some(files) = corpus() else { return };
    let mut checked = 0;
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let expected = match name.as_ref() {
            "mini_astropy12907.traj.json" => Format::MiniSweAgent,
            "mini_github_issue.traj.json" | "mini_local.traj.json" => Format::Array,
            n if n.starts_with("sweagent_") => Format::SweAgent,
            _ => continue,
        };
        assert_eq!(Transcript::load(path).unwrap().format, expected, "{name}");
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} known corpus files");
}

#[test]
fn mini_swe_agent_envelope_is_kept() {
    let Some(files) = corpus() else { return };
    let Some(path) = files
        .iter()
        .find(|p| p.ends_with("mini_astropy12907.traj.json"))
    else {
        common::skip("mini_astropy12907.traj.json not in the corpus");
        return;
    };
    let t = Transcript::load(path).unwrap();
    let keys: Vec<_> = t.metadata().keys().map(String::as_str).collect();
    assert_eq!(keys, ["info", "trajectory_format", "instance_id"]);
    assert_eq!(t.messages.last().unwrap().role, Role::Other("exit".into()));
    assert!(t.warnings().is_empty());
}

#[test]
fn swe_agent_tool_messages_get_their_tool_call_id() {
    let Some(files) = corpus() else { return };
    let mut normalised = 0;
    for path in files.iter().filter(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("sweagent_"))
    }) {
        let t = Transcript::load(path).unwrap();
        assert!(t.warnings().is_empty(), "{:?}", t.warnings());
        let mut open_calls: Vec<String> = Vec::new();
        for (i, m) in t.messages.iter().enumerate() {
            open_calls.extend(m.tool_calls().iter().filter_map(|c| c.id.clone()));
            if m.role != Role::Tool {
                continue;
            }
            let ids = m.extra["tool_call_ids"].as_array().unwrap();
            let id = m
                .tool_call_id
                .as_deref()
                .unwrap_or_else(|| panic!("{}: message {i}", path.display()));
            assert_eq!(ids.len(), 1);
            assert_eq!(ids[0], id);
            // It answers a call made before it.
            let pos = open_calls.iter().position(|c| c == id).unwrap();
            open_calls.remove(pos);
            normalised += 1;
        }
        // Own format: `tool_call_id` is gone again.
        let written: Value = serde_json::from_str(&t.to_json_string()).unwrap();
        for m in written["history"].as_array().unwrap() {
            assert!(m.get("tool_call_id").is_none());
        }
        // Conversion: it is there.
        let standard: Value = serde_json::from_str(&t.to_array_string()).unwrap();
        for m in standard.as_array().unwrap() {
            assert_eq!(m["role"] == "tool", m.get("tool_call_id").is_some());
        }
    }
    if normalised == 0 {
        common::skip("no SWE-agent tool messages in the corpus");
    }
}
