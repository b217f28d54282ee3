use serde_json::json;

use super::*;
use crate::engine::BlockReason;
use crate::plugin::wire::{
    CompressAnswer, CompressInfoAnswer, NotifyAnswer, PruneAnswer, StatusAnswer, ToolCallAnswer,
};

/// The refusal text of `answer` read as `T`.
fn refused<T: DeserializeOwned + std::fmt::Debug>(method: &'static str, answer: Value) -> String {
    let refusal = decode_object::<T>(method, &answer).expect_err("refused");
    assert_eq!(refusal.method, method);
    refusal.to_string()
}

/// `text` names `method` and the field at `path`.
fn names(text: &str, method: &str, path: &str) {
    assert!(text.starts_with(&format!("`{method}` answer: ")), "{text}");
    assert!(text.contains(&format!("at `{path}`: ")), "{text}");
}

#[test]
fn boolean_hooks_refuse_what_is_not_a_boolean() {
    for method in [
        "should_compress",
        "should_compress_preflight",
        "should_defer_preflight_to_real_usage",
        "has_content_to_compress",
    ] {
        assert!(decode::<bool>(method, &json!(true)).unwrap());
        let text = decode::<bool>(method, &json!("yes"))
            .unwrap_err()
            .to_string();
        assert!(text.starts_with(&format!("`{method}` answer: ")), "{text}");
        assert!(text.contains("expected a boolean"), "{text}");
        assert!(text.contains("(got \"yes\")"), "{text}");
    }
}

#[test]
fn compress_answers_name_the_wrong_field() {
    let m = "compress";
    let ok: CompressAnswer = decode_object(
        m,
        &json!({"messages": [{"role": "user", "content": "hi"}], "extra": 1}),
    )
    .unwrap();
    assert_eq!(ok.messages.len(), 1, "unknown fields are ignored");

    let text = refused::<CompressAnswer>(m, json!({"message": []}));
    assert!(text.contains("missing field `messages`"), "{text}");
    assert!(text.contains(r#"(got {"message":[]})"#), "{text}");

    let text = refused::<CompressAnswer>(m, json!({"messages": "all of them"}));
    names(&text, m, "messages");
    assert!(text.contains("expected a sequence"), "{text}");

    let text = refused::<CompressAnswer>(
        m,
        json!({"messages": [{"role": "user", "content": "a"}, {"content": "no role"}]}),
    );
    names(&text, m, "messages[1]");
    assert!(text.contains("missing field `role`"), "{text}");

    let text = refused::<CompressAnswer>(
        m,
        json!({"messages": [{"role": "user"}], "state": {"threshold_tokens": "many"}}),
    );
    names(&text, m, "state.threshold_tokens");

    let text = refused::<CompressAnswer>(m, json!([{"role": "user"}]));
    assert!(text.contains("expected an object"), "{text}");
}

#[test]
fn prune_answers_name_the_wrong_field() {
    let m = "prune_tool_results_only";
    assert_eq!(
        decode_object::<Option<PruneAnswer>>(m, &json!(null)).unwrap(),
        None
    );
    let none = decode_object::<Option<PruneAnswer>>(m, &json!({"messages": null})).unwrap();
    assert_eq!(none.and_then(|a| a.messages), None);

    let text = refused::<Option<PruneAnswer>>(m, json!({"messages": [], "pruned": "three"}));
    names(&text, m, "pruned");
    let text = refused::<Option<PruneAnswer>>(m, json!({"messages": [7]}));
    names(&text, m, "messages[0]");
    assert!(text.contains("expected a JSON object"), "{text}");
    let text = refused::<Option<PruneAnswer>>(m, json!(true));
    assert!(text.contains("expected null or an object"), "{text}");
}

#[test]
fn select_context_answers_name_the_wrong_field() {
    let m = "select_context";
    assert_eq!(select_messages(m, &json!(null)).unwrap(), None);
    assert_eq!(
        select_messages(m, &json!({"messages": null})).unwrap(),
        None
    );
    let bare = select_messages(m, &json!([{"role": "user", "content": "x"}])).unwrap();
    assert_eq!(
        bare.map(|v| v.len()),
        Some(1),
        "a bare list is the messages"
    );
    let wrapped = select_messages(m, &json!({"messages": [{"role": "user"}]})).unwrap();
    assert_eq!(wrapped.map(|v| v.len()), Some(1));

    let text = select_messages(m, &json!({"messages": {"role": "user"}}))
        .unwrap_err()
        .to_string();
    names(&text, m, "messages");
    let text = select_messages(m, &json!([{"role": "user"}, {"role": 3}]))
        .unwrap_err()
        .to_string();
    names(&text, m, "[1]");
    assert!(text.contains("field `role` must be a string"), "{text}");
    let text = select_messages(m, &json!("keep")).unwrap_err().to_string();
    assert!(text.contains("(got \"keep\")"), "{text}");
}

#[test]
fn should_compress_info_answers_name_the_wrong_field() {
    let m = "should_compress_info";
    let ok: CompressInfoAnswer = decode_object(
        m,
        &json!({"should_compress": false, "block_reason": {"kind": "other", "message": "busy"}}),
    )
    .unwrap();
    assert_eq!(
        ok.block_reason,
        Some(BlockReason::Other {
            message: "busy".into()
        })
    );
    let text = refused::<CompressInfoAnswer>(m, json!({"should_compress": "yes"}));
    names(&text, m, "should_compress");
    let text = refused::<CompressInfoAnswer>(
        m,
        json!({"should_compress": false, "block_reason": {"kind": "cooldown", "seconds_left": -1}}),
    );
    // A tagged enum is read whole: the path ends at it, serde names the rest.
    names(&text, m, "block_reason");
    assert!(text.contains("integer `-1`, expected u64"), "{text}");
    let text = refused::<CompressInfoAnswer>(m, json!({}));
    assert!(text.contains("missing field `should_compress`"), "{text}");
}

#[test]
fn notify_hooks_refuse_a_bad_state_patch() {
    for m in [
        "update_from_response",
        "on_turn_complete",
        "on_session_start",
        "on_session_end",
        "on_session_reset",
        "update_model",
    ] {
        assert_eq!(
            decode_object::<Option<NotifyAnswer>>(m, &json!(null)).unwrap(),
            None
        );
        let text = refused::<Option<NotifyAnswer>>(m, json!({"state": {"protect_last_n": -2}}));
        names(&text, m, "state.protect_last_n");
        let text = refused::<Option<NotifyAnswer>>(m, json!({"state": "reset"}));
        names(&text, m, "state");
        let text = refused::<Option<NotifyAnswer>>(m, json!({"state": {"threshold_percent": "x"}}));
        names(&text, m, "state.threshold_percent");
        let text = refused::<Option<NotifyAnswer>>(m, json!(1));
        assert!(text.contains("expected null or an object"), "{text}");
    }
}

#[test]
fn status_answers_are_objects() {
    let m = "get_status";
    assert_eq!(
        decode_object::<Option<StatusAnswer>>(m, &json!(null)).unwrap(),
        None
    );
    let ok = decode_object::<Option<StatusAnswer>>(m, &json!({"turns": 2})).unwrap();
    assert_eq!(ok.map(|s| s.0.len()), Some(1));
    let text = refused::<Option<StatusAnswer>>(m, json!(["turns"]));
    assert!(text.starts_with("`get_status` answer: "), "{text}");
    let text = refused::<Option<StatusAnswer>>(m, json!("fine"));
    assert!(text.contains("(got \"fine\")"), "{text}");
}

#[test]
fn a_tool_answer_is_any_json() {
    let m = "handle_tool_call";
    assert_eq!(
        decode::<ToolCallAnswer>(m, &json!("hits")).unwrap(),
        ToolCallAnswer::Text("hits".into())
    );
    assert_eq!(
        decode::<ToolCallAnswer>(m, &json!({"hits": []})).unwrap(),
        ToolCallAnswer::Json(json!({"hits": []}))
    );
}

#[test]
fn a_state_patch_sets_the_keys_it_gives() {
    let mut state = EngineState::default();
    let patch: NotifyAnswer = decode_object(
        "update_model",
        &json!({"state": {"threshold_tokens": 900, "last_prompt_tokens": null, "bogus": 1}}),
    )
    .unwrap();
    apply_state(&mut state, &patch.state.unwrap());
    assert_eq!(state.threshold_tokens, 900);
    assert_eq!(state.last_prompt_tokens, PromptTokens::AwaitingRealUsage);

    let patch: StatePatch = decode_object(
        "x",
        &json!({"last_prompt_tokens": 12, "protect_first_n": 4}),
    )
    .unwrap();
    apply_state(&mut state, &patch);
    assert_eq!(state.last_prompt_tokens, PromptTokens::Known(12));
    assert_eq!(state.protect_first_n, 4);
    assert_eq!(state.threshold_tokens, 900, "a key not given stays");

    let patch: StatePatch = decode_object("x", &json!({"threshold_tokens": null})).unwrap();
    apply_state(&mut state, &patch);
    assert_eq!(state.threshold_tokens, 900, "null leaves a key as it is");
    assert_eq!(state.last_prompt_tokens, PromptTokens::Known(12));
}

#[test]
fn refusals_keep_the_broken_rule_and_the_path_typed() {
    let refusal =
        decode_object::<CompressAnswer>("compress", &json!({"messages": [1]})).unwrap_err();
    assert_eq!(refusal.path(), Some("messages[0]"));
    assert!(refusal.violation().is_none());
    let missing = decode_object::<CompressAnswer>("compress", &json!({})).unwrap_err();
    assert_eq!(missing.path(), Some(""));
}
