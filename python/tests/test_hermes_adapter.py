"""The Hermes adapter against Hermes's real ABC (hermes-agent installed)."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import context_engine as ce
from conftest import require, tool_session

require(importlib.util.find_spec("agent") is not None, "hermes-agent is not installed")

from agent.context_engine import ContextEngine  # noqa: E402

from context_engine.hermes import CtxEngine  # noqa: E402
from context_engine.hermes.__main__ import main as install_main  # noqa: E402


def adapter(**settings) -> CtxEngine:
    e = CtxEngine(settings)
    e.update_model("scripted-model", 64000, base_url="http://127.0.0.1:1/v1", provider="custom")
    return e


def test_is_a_hermes_engine():
    e = adapter()
    assert isinstance(e, ContextEngine)
    assert e.name == "ctx"
    assert e.context_length == 64000 and e.threshold_tokens == 48000
    assert [t["function"]["name"] for t in e.get_tool_schemas()] == ["context_recall", "context_status", "context_compact"]
    status = e.get_status()
    for key in ("last_prompt_tokens", "threshold_tokens", "context_length", "usage_percent", "compression_count"):
        assert key in status
    assert status["engine"] == "ctx"


def test_settings_from_the_hermes_section():
    e = adapter(context={"threshold_percent": 0.3}, enabled=True)
    assert e.threshold_tokens == 19200


def test_hermes_settings_read_from_hermes_config(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text(
        "plugins:\n  enabled: [ctx]\n  entries:\n    ctx:\n      context:\n        threshold_percent: 0.5\n"
    )
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    from context_engine.hermes import hermes_settings

    assert hermes_settings() == {"context": {"threshold_percent": 0.5}}
    e = CtxEngine()
    e.update_model("m", 100000)
    assert e.threshold_tokens == 50000


def test_attributes_hermes_writes():
    e = adapter()
    e.update_from_response({"prompt_tokens": 50000, "completion_tokens": 5, "total_tokens": 50005})
    assert e.should_compress() and e.last_prompt_tokens == 50000
    # What Hermes does after its compaction boundary:
    e.last_compression_rough_tokens = 1234
    e.last_prompt_tokens = -1
    e.last_completion_tokens = 0
    e.awaiting_real_usage_after_compression = True
    assert e.awaiting_real_usage_after_compression
    assert e.get_status()["last_prompt_tokens"] == 0
    assert e.should_defer_preflight_to_real_usage(10**6)
    # A response without usage ends the wait.
    e.update_from_response({})
    assert not e.awaiting_real_usage_after_compression
    e._verify_compaction_cleared_threshold = True  # Hermes sets arbitrary flags
    # Its summary model is smaller: Hermes lowers the threshold directly.
    e.threshold_tokens = 40000
    e.threshold_percent = 40000 / 64000
    assert e.threshold_tokens == 40000
    e.compression_count = 2
    e.on_session_reset()
    assert e.compression_count == 0
    assert e.last_real_prompt_tokens == 0


def test_deepcopy_per_agent_is_independent():
    template = adapter()
    a = copy.deepcopy(template)
    b = copy.deepcopy(template)
    a.update_model("big", 200000)
    assert template.context_length == 64000 and b.context_length == 64000
    assert a.engine is not template.engine


def test_compress_without_the_system_message():
    e = adapter(context={"threshold_percent": 0.1})
    history = tool_session(40)[1:]  # Hermes never passes the system prompt
    out = e.compress(history, current_tokens=ce.count_tokens(history))
    assert e._last_compression_made_progress and not e._last_compress_aborted
    assert ce.validate(out) == [] and len(out) < len(history)
    assert out[0] == history[0]  # the task
    assert e.compression_count == 1


def test_compress_failure_returns_the_input_unchanged():
    e = adapter()
    short = tool_session(1)[1:]
    assert e.compress(short) is short
    assert not e._last_compression_made_progress
    bad = [{"role": "user", "content": 5}]
    assert e.compress(bad) is bad  # never raises into Hermes


def test_newer_hooks_work_when_present():
    e = adapter()
    session = tool_session(10)
    view = e.select_context(session, conversation_messages=session, budget_tokens=64000)
    assert view is not None and ce.count_tokens(view) < ce.count_tokens(session)
    e.on_turn_complete(session, None, turn_id="t", interrupted=True)
    assert e.prune_tool_results_only(session) == (session, 0)
    assert e.has_content_to_compress(session)
    assert e.should_compress_preflight(session) is False


def test_install_writes_the_plugin_and_prints_the_config(tmp_path, capsys):
    assert install_main(["install", "--hermes-home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plugins.enabled: [ctx]" in out and "context.engine: ctx" in out
    plugin = tmp_path / "plugins" / "ctx"
    assert "name: ctx" in (plugin / "plugin.yaml").read_text()

    registered = []

    class FakeContext:
        def register_context_engine(self, engine):
            registered.append(engine)

    spec = importlib.util.spec_from_file_location("ctx_plugin_under_test", plugin / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register(FakeContext())
    assert len(registered) == 1 and isinstance(registered[0], ContextEngine)


def test_install_defaults_to_hermes_home(tmp_path):
    env = {"HERMES_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-m", "context_engine.hermes", "install"],
        env=env, capture_output=True, text=True, cwd=str(Path(tmp_path)),
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "plugins" / "ctx" / "__init__.py").is_file()


def test_unreachable_summarizer_aborts_and_hermes_is_told(monkeypatch):
    monkeypatch.setenv("CTX_TEST_SUMMARY_KEY", "sk-test-not-a-real-key")
    e = adapter(
        context={"threshold_percent": 0.1},
        summarizer={
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",  # discard port: connection refused
            "model": "m",
            "api_key_env": "CTX_TEST_SUMMARY_KEY",
            "timeout_seconds": 5,
        },
    )
    history = tool_session(40)[1:]
    assert e.compress(history) is history
    assert e._last_compress_aborted and e._last_summary_error
    assert not e._last_compression_made_progress
    ok, reason = e.should_compress_info(10**6)
    assert not ok and "cooling down" in reason


def test_missing_key_variable_is_a_config_error(monkeypatch):
    monkeypatch.delenv("CTX_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ce.ConfigError, match="CTX_TEST_MISSING_KEY"):
        adapter(summarizer={"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                            "api_key_env": "CTX_TEST_MISSING_KEY"})
