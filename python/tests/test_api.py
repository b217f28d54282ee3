"""The Python API over OpenAI-format dicts: round trips, functions, hooks,
errors."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

import context_engine as ce
from conftest import EXAMPLES, ROOT, example, require, tool_session


def engine(context_length: int = 16000, **kw) -> ce.Compressor:
    return ce.Compressor(context_length, use_config=False, **kw)


# -- lossless round trips -------------------------------------------------------

ODD = [
    {"content": "You are terse.", "role": "system", "x_meta": {"b": 1, "a": [1, 2.5, None, True]}},
    {"role": "user", "name": "alice", "content": [{"type": "text", "text": "hi"}, {"type": "x", "z": 1}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "id": "c1", "function": {"arguments": "{}", "name": "ls"}, "x": 0}
        ],
        "refusal": None,
        "function_call": None,
    },
    {"tool_call_id": "c1", "role": "tool", "content": "a\nb", "big": 2**63 + 5},
    {"role": "assistant", "content": "done", "reasoning_content": "thought", "unicode": "é✓🙂"},
]


def test_round_trip_keeps_keys_order_and_unknown_fields():
    out = ce.digest(ODD)
    assert out == ODD
    for a, b in zip(out, ODD):
        assert list(a.keys()) == list(b.keys())
    assert list(out[2]["tool_calls"][0].keys()) == ["type", "id", "function", "x"]
    assert out[3]["big"] == 2**63 + 5


def test_tuple_input_and_input_not_mutated():
    before = copy.deepcopy(ODD)
    ce.validate(tuple(ODD))
    ce.count_tokens(ODD)
    assert ODD == before


def test_load_transcript_matches_the_file():
    path = EXAMPLES / "bugfix-session.json"
    require(path.is_file(), f"{path} is absent")
    assert ce.load_transcript(path) == json.loads(path.read_text(encoding="utf-8"))
    with pytest.raises(OSError):
        ce.load_transcript(EXAMPLES / "no-such-file.json")


# -- functions ---------------------------------------------------------------------


def test_count_tokens_text_messages_and_encodings():
    assert ce.count_tokens("hello world") == 2
    text = "Привет мир " * 10
    assert (ce.count_tokens(text), ce.count_tokens(text, encoding="cl100k_base")) == (31, 51)
    msgs = [{"role": "user", "content": "hello world"}]
    # Per-message and per-request overhead on top of the text.
    assert ce.count_tokens(msgs) > ce.count_tokens("hello world")
    assert ce.count_tokens(msgs, model="gpt-4o") == ce.count_tokens(msgs)
    with pytest.raises(ValueError, match="unknown encoding"):
        ce.count_tokens("x", encoding="p50k")


def test_validate_and_ensure_valid():
    bad = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "x"},
    ]
    violations = ce.validate(bad)
    assert violations and violations[0]["index"] == 1
    assert violations[0]["rule"] == "orphan-tool-result"
    assert ce.validate(ODD) == []
    with pytest.raises(ce.ValidationError, match="message 1: orphan-tool-result"):
        ce.ensure_valid(bad)
    assert ce.ensure_valid(ODD) is None
    assert ce.validate([{"role": "assistant", "content": "x"}], profile="strict")
    with pytest.raises(ValueError):
        ce.validate(bad, profile="nope")


def test_digest_replaces_old_bulky_results():
    msgs = tool_session(5)
    view, report = ce.digest_with_report(msgs)
    assert report["results_digested"] == 4
    assert report["bytes_after"] < report["bytes_before"]
    assert len(view) == len(msgs)
    assert "call_0" in view[3]["content"]  # the recall handle
    assert view[-3] == msgs[-3]  # the newest batch is whole
    assert ce.digest(msgs, keep_batches=10) == msgs


def test_redact_masks_secrets_and_user_patterns():
    key = "sk-proj-" + "abcdefghij0123456789ABCDEFGHIJ"
    out = ce.redact(f"export OPENAI_API_KEY={key}")
    assert key not in out
    assert ce.redact("nothing here") == "nothing here"
    assert ce.redact("ticket ACME-12345", patterns=[r"ACME-\d+"]) != "ticket ACME-12345"
    with pytest.raises(ce.ConfigError):
        ce.redact("x", patterns=["("])


def test_digest_and_redact_read_the_configuration(tmp_path):
    """A key means here what it means to `ctx`: `context.digest` and
    `security.redact_patterns` from the file or the settings; an explicit
    argument wins."""
    msgs = tool_session(5)
    config = tmp_path / "config.yaml"
    config.write_text(
        "context:\n  digest:\n    keep_batches: 10\n"
        "security:\n  redact_patterns: ['ACME-\\d+']\n",
        encoding="utf-8",
    )
    assert ce.digest(msgs, config=config) == msgs
    assert ce.digest(msgs, config=config, keep_batches=1) != msgs
    assert ce.digest(msgs, use_config=False, settings={"context": {"digest": {"keep_batches": 10}}}) == msgs
    assert ce.digest(msgs, use_config=False) != msgs
    assert "ACME-12345" not in ce.redact("ticket ACME-12345", config=config)
    assert ce.redact("ticket ACME-12345", use_config=False) == "ticket ACME-12345"
    with pytest.raises(ce.ConfigError):
        ce.digest(msgs, use_config=False, settings={"context": {"digest": {"keep_batches": "many"}}})


def test_digest_is_exactly_ctx_digest(tmp_path):
    """`digest()` and `ctx digest` read the same configuration into the same
    options: the same view, text actions included."""
    ctx = Path(os.environ.get("CTX_BIN", ROOT / "target" / "debug" / "ctx"))
    require(ctx.is_file(), f"the ctx binary ({ctx}) is not built: cargo build -p ctx")
    path = EXAMPLES / "coding-session.json"
    require(path.is_file(), f"{path} is absent")
    config = tmp_path / "config.yaml"
    config.write_text(
        "context:\n"
        "  text_actions: [mini-swe-agent]\n"
        "  digest:\n    min_bytes: 512\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    out = subprocess.run(
        [str(ctx), "digest", str(path), "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    want = json.loads(out.stdout)
    got = ce.digest(ce.load_transcript(path), config=config)
    assert got == want
    assert got != ce.load_transcript(path), "the file's min_bytes should digest something"


def test_compress_is_exactly_ctx_compact(tmp_path):
    """`Compressor(config=F).compress(..., force=True)` and `ctx compact
    --config F` build one engine from one file (`EngineBuilder`): the same
    transcript comes out."""
    ctx = Path(os.environ.get("CTX_BIN", ROOT / "target" / "debug" / "ctx"))
    require(ctx.is_file(), f"the ctx binary ({ctx}) is not built: cargo build -p ctx")
    path = EXAMPLES / "coding-session.json"
    require(path.is_file(), f"{path} is absent")
    config = tmp_path / "config.yaml"
    config.write_text(
        "context:\n  context_length: 16000\n  text_actions: [mini-swe-agent]\n",
        encoding="utf-8",
    )
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    run = subprocess.run(
        [str(ctx), "compact", str(path), "--config", str(config), "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    want = json.loads(out.read_text(encoding="utf-8"))
    messages = ce.load_transcript(path)
    got = ce.Compressor(config=config).compress(messages, force=True)
    assert got == want
    assert len(got) < len(messages)


def test_replay_returns_the_ctx_report():
    path = EXAMPLES / "coding-session.json"
    require(path.is_file(), f"{path} is absent")
    report = ce.replay(str(path), context_length=16000, use_config=False)
    assert report["engine"] == "compressor"
    assert report["context_length"] == 16000
    assert len(report["compactions"]) >= 1
    assert report["totals"]["calls"] == len(report["calls"])
    assert all(c["violations_introduced"] == 0 for c in report["calls"])
    from_messages = ce.replay(ce.load_transcript(path), context_length=16000, use_config=False)
    assert from_messages["totals"]["calls"] == report["totals"]["calls"]
    with pytest.raises(ce.ContextEngineError, match="cannot replay"):
        ce.replay([{"role": "user", "content": "no assistant"}], use_config=False)


# -- the engine ----------------------------------------------------------------------


def test_compress_compacts_validly_and_reports(session):
    e = engine()
    before = copy.deepcopy(session)
    out = e.compress(session)
    assert session == before
    assert len(out) < len(session)
    assert ce.validate(out) == []
    assert ce.count_tokens(out) < ce.count_tokens(session)
    assert any("[CONTEXT SUMMARY" in (m.get("content") or "") for m in out)
    assert out[1] == session[1]  # the task, verbatim
    assert out[-1] == session[-1]
    report = e.last_report
    assert report["outcome"] == "compacted"
    assert report["messages_before"] == len(session)
    assert e.compression_count == 1
    assert e.last_prompt_tokens == -1 and e.awaiting_real_usage


def test_compress_failure_is_an_exception_and_keeps_nothing():
    e = engine()
    short = tool_session(1)
    with pytest.raises(ce.ContextEngineError, match="nothing to compress"):
        e.compress(short)
    assert e.last_report["outcome"] == "nothing_to_compress"
    assert e.compression_count == 0


def test_token_hooks_and_state():
    e = engine(64000)
    assert e.name == "compressor"
    assert e.threshold_tokens == 48000
    assert not e.should_compress()
    e.update_from_response({"prompt_tokens": 50000, "completion_tokens": 10, "total_tokens": 50010})
    assert e.last_prompt_tokens == 50000 and e.last_total_tokens == 50010
    assert e.should_compress()
    assert e.should_compress_info() == (True, None)
    assert not e.should_compress(1000)
    e.update_from_response({"input_tokens": 7, "output_tokens": 3})  # Anthropic dialect
    assert e.last_prompt_tokens == 7
    with pytest.raises(ValueError, match="usage"):
        e.update_from_response({"completion_tokens": 3})
    e.last_prompt_tokens = -1
    assert e.awaiting_real_usage and e.should_defer_preflight_to_real_usage(10**6)
    e.threshold_tokens = 1000
    assert e.threshold_tokens == 1000
    status = e.get_status()
    assert status["last_prompt_tokens"] == 0 and status["awaiting_real_usage"] is True
    e.update_model("gpt-4.1", 128000)
    assert e.context_length == 128000 and e.threshold_tokens == 96000
    e.compression_count = 4
    e.on_session_reset()
    assert e.compression_count == 0 and e.last_prompt_tokens == 0


def test_optional_hooks(session):
    e = engine()
    assert e.should_compress_preflight(session)
    assert e.has_content_to_compress(session)
    assert not e.has_content_to_compress(tool_session(1))
    view = e.select_context(session, conversation_messages=session, budget_tokens=16000)
    assert view is not None and len(view) == len(session)
    assert ce.count_tokens(view) < ce.count_tokens(session)
    assert e.select_context(session[:2]) is None
    same, n = e.prune_tool_results_only(session)
    assert n == 0 and same is session
    e.on_turn_complete(session, {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                       turn_id="t1", api_call_count=2, interrupted=False)
    e.on_session_start("s1", hermes_home="/tmp", platform="cli", model="m", unknown=1)
    e.on_session_end("s1", session)
    assert e.get_automatic_compaction_status_message(phase="compress", default_message=" hi ") == "hi"
    e.emit_automatic_compaction_status = False
    assert e.get_automatic_compaction_status_message(phase="preflight", default_message="x") is None
    with pytest.raises(ValueError, match="phase"):
        e.get_automatic_compaction_status_message(phase="later", default_message="x")


def test_tools_recall_a_digested_result():
    e = engine()
    msgs = tool_session(5)
    names = [t["function"]["name"] for t in e.get_tool_schemas()]
    assert names == ["context_recall", "context_status", "context_compact"]
    out = json.loads(e.handle_tool_call("context_recall", {"handle": "call_0"}, messages=msgs))
    assert json.dumps(out).find("function_0_3") >= 0
    unknown = json.loads(e.handle_tool_call("nope", {}))
    assert "Unknown context engine tool: nope" in unknown["error"]


def test_deepcopy_is_independent():
    e = engine(64000)
    e.update_from_response({"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11})
    c = copy.deepcopy(e)
    assert c.last_prompt_tokens == 10
    c.update_model("x", 200000)
    assert e.context_length == 64000 and c.context_length == 200000


def test_settings_and_config_layers(tmp_path):
    e = ce.Compressor(100000, use_config=False, settings={"context": {"threshold_percent": 0.5, "model_thresholds": {"gpt-4.1": 0.6}}})
    assert e.threshold_tokens == 50000
    e.update_model("gpt-4.1-mini", 100000)
    assert e.threshold_tokens == 60000
    cfg = tmp_path / "config.yaml"
    cfg.write_text("context:\n  threshold_percent: 0.4\n  no_such_key: 1\n")
    e = ce.Compressor(100000, config=cfg)
    assert e.threshold_tokens == 40000
    assert e.config_file == cfg
    assert any("no_such_key" in w for w in e.config_warnings)
    cfg.write_text("context:\n  protect_last_n: many\n")
    with pytest.raises(ce.ConfigError, match="protect_last_n"):
        ce.Compressor(100000, config=cfg)
    with pytest.raises(ce.ConfigError, match="summarizer"):
        ce.Compressor(1000, use_config=False, settings={"summarizer": {"kind": "openai"}})
    with pytest.raises(ce.ConfigError):
        ce.Compressor(1000, use_config=False, settings=["not", "a", "dict"])


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages, match",
    [
        ({"role": "user"}, "messages must be a list of dicts, found dict"),
        ("text", "messages must be a list of dicts, found str"),
        ([{"role": "user", "content": "a"}, ["role"]], "message 1: expected a dict, found list"),
        ([{"content": "a"}], "message 0, field `role`: missing field `role`"),
        ([{"role": 3}], "message 0, field `role`"),
        ([{"role": "user", "content": 5}], "message 0, field `content`: expected a string"),
        ([{"role": "user", "content": [1]}], "message 0, field `content`"),
        ([{"role": "tool", "tool_call_id": 7, "content": "x"}], "field `tool_call_id`: expected a string, found a number"),
        ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": 1, "arguments": "{}"}}]}], "field `tool_calls[0].function`"),
        ([{"role": "assistant", "tool_calls": ["x"]}], "field `tool_calls[0]`: expected a dict"),
        ([{"role": "user", "content": "\ud800"}], "field `content`: text is not valid UTF-8"),
        ([{"role": "user", "content": "x", "meta": {"deep": [b"bytes"]}}], "field `meta.deep[0]`: expected a JSON value"),
        ([{"role": "user", "content": "x", 3: "y"}], "dict keys must be strings"),
        ([{"role": "user", "content": "x", "n": float("nan")}], "field `n`: NaN"),
        ([{"role": "user", "content": "x", "n": 2**70}], "field `n`: integer out of the 64-bit range"),
    ],
)
def test_bad_input_is_a_value_error_naming_index_and_field(messages, match):
    calls = [ce.validate, ce.digest, engine().compress]
    if not isinstance(messages, str):  # a str is a text to count
        calls.append(ce.count_tokens)
    for call in calls:
        with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("]", r"\]").replace("`", "`")):
            call(messages)


def test_self_referencing_input_is_an_error_not_a_crash():
    m = {"role": "user", "content": "x"}
    m["self"] = m
    with pytest.raises(ValueError, match="nested deeper"):
        ce.validate([m])


def test_null_optional_fields_are_accepted():
    msgs = [{"role": "assistant", "content": "x", "tool_calls": None, "name": None}]
    assert ce.digest(msgs) == msgs


def test_exception_hierarchy():
    assert issubclass(ce.ValidationError, ce.ContextEngineError)
    assert issubclass(ce.ConfigError, ce.ContextEngineError)
    assert issubclass(ce.ContextEngineError, Exception)


def test_replay_is_exactly_ctx_replay_json(tmp_path):
    """`replay()` and `ctx replay --json` are one library call
    (`Engines::replay`): the same arguments give the same report, with the
    window, text actions and prices set in the file."""
    ctx = Path(os.environ.get("CTX_BIN", ROOT / "target" / "debug" / "ctx"))
    require(ctx.is_file(), f"the ctx binary ({ctx}) is not built: cargo build -p ctx")
    path = EXAMPLES / "coding-session.json"
    require(path.is_file(), f"{path} is absent")
    config = tmp_path / "config.yaml"
    config.write_text(
        "context:\n"
        "  context_length: 16000\n"
        "  text_actions: [mini-swe-agent, '^EXIT CODE: \\\\d+']\n"
        "pricing:\n"
        "  provider: anthropic\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    out = subprocess.run(
        [str(ctx), "replay", str(path), "--json", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    want = json.loads(out.stdout)
    got = ce.replay(str(path), config=str(config))
    assert without_timings(got) == without_timings(want)
    assert got["context_length"] == 16000 and got["costs"] is not None
    no_baseline = ce.replay(str(path), config=str(config), baseline=False, archive=False)
    out = subprocess.run(
        [str(ctx), "replay", str(path), "--json", "--config", str(config), "--no-baseline", "--no-store"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert without_timings(no_baseline) == without_timings(json.loads(out.stdout))


def without_timings(report):
    """The report without the wall-clock timings of this machine (engine
    time per call and per compaction), which differ run to run."""
    if isinstance(report, dict):
        return {
            k: without_timings(v)
            for k, v in report.items()
            if k not in ("engine_time_ms", "elapsed_ms", "engine_time")
        }
    if isinstance(report, list):
        return [without_timings(v) for v in report]
    return report
