"""Real clients through `ctx serve` in front of the local llama.cpp server.

Run by scripts/e2e-clients.sh with CTX_SERVE_URL (the proxy's /v1 base URL)
set. Checks: the official `openai` SDK (non-streamed, streamed, tools) and
mini-swe-agent (its litellm model pointed at the proxy) running a few steps;
after each, the proxy's own view of the session (`/ctx/sessions/{id}`):
every request managed, none sent unmanaged, usage fed back. Prints
"N passed, N failed" and exits non-zero on any failure.
"""

import json
import os
import sys
import tempfile
import traceback
import urllib.request

BASE = os.environ["CTX_SERVE_URL"].rstrip("/")
ROOT = BASE[: -len("/v1")] if BASE.endswith("/v1") else BASE
MODEL = os.environ.get("CTX_E2E_MODEL", "smollm2")


def session(sid):
    # Sessions are scoped by the credential: ask with the clients' own.
    req = urllib.request.Request(f"{ROOT}/ctx/sessions/{sid}", headers={"Authorization": "Bearer unused"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def check_session(sid, requests):
    s = session(sid)["stats"]
    assert s["requests"] == requests, s
    assert s["managed"] == requests, s
    assert s["fallbacks"] == 0, s
    assert s["prompt_tokens"] > 0, s


def client():
    from openai import OpenAI

    return OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=300)


def test_openai_plain():
    c = client()
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    before = json.dumps(messages)
    r = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0,
        extra_headers={"x-ctx-session": "sdk-plain"},
    )
    assert r.choices[0].message.role == "assistant"
    assert r.usage and r.usage.prompt_tokens > 0
    messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    messages.append({"role": "user", "content": "Again."})
    r2 = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0,
        extra_headers={"x-ctx-session": "sdk-plain"},
    )
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert json.dumps(messages[:2]) == before, "the client's own history is untouched"
    check_session("sdk-plain", 2)


def test_openai_stream():
    c = client()
    stream = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=16, temperature=0, stream=True,
        extra_headers={"x-ctx-session": "sdk-stream"},
    )
    text, usage_chunks, finished = "", 0, False
    for chunk in stream:
        if chunk.usage is not None:
            usage_chunks += 1
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finished |= ch.finish_reason is not None
    assert finished, "the stream reached its finish chunk"
    assert usage_chunks == 0, "the usage chunk the proxy asked for is not shown"
    check_session("sdk-stream", 1)
    stream = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-ctx-session": "sdk-stream-usage"},
    )
    usage = [ch.usage for ch in stream if ch.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens > 0, usage


def test_openai_tools():
    c = client()
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }]
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = c.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=64, temperature=0,
        extra_headers={"x-ctx-session": "sdk-tools"},
    )
    msg = r.choices[0].message
    calls = msg.tool_calls or []
    names = {t.function.name for t in calls}
    assert names <= {"get_weather"}, f"the client only sees its own tools: {names}"
    # Answer whatever came back, as an agent would, and call again.
    messages.append(msg.model_dump(exclude_none=True))
    for t in calls:
        messages.append({"role": "tool", "tool_call_id": t.id, "content": "sunny, 21 C"})
    if not calls:
        messages.append({"role": "user", "content": "Thanks."})
    r = c.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=32, temperature=0,
        extra_headers={"x-ctx-session": "sdk-tools"},
    )
    assert r.choices[0].message.role == "assistant"
    check_session("sdk-tools", 2)


def test_models_passthrough():
    with urllib.request.urlopen(f"{BASE}/models", timeout=30) as r:
        data = json.load(r)
    assert data.get("data"), data


def test_mini_swe_agent():
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel
    import minisweagent.config as cfg
    import yaml

    config = yaml.safe_load(open(os.path.join(os.path.dirname(cfg.__file__), "mini_textbased.yaml")))
    agent_cfg = config["agent"]
    agent_cfg["step_limit"] = 3
    agent_cfg["cost_limit"] = 0
    model_cfg = config.get("model", {})
    model_cfg.pop("model_name", None)
    model_kwargs = dict(model_cfg.pop("model_kwargs", {}) or {})
    model_kwargs.update({
        "api_base": BASE, "api_key": "unused", "max_tokens": 128, "temperature": 0,
        "extra_headers": {"x-ctx-session": "mini-swe-agent"},
    })
    model = LitellmTextbasedModel(
        model_name=f"openai/{MODEL}", model_kwargs=model_kwargs, cost_tracking="ignore_errors", **model_cfg,
    )
    work = tempfile.mkdtemp(prefix="ctx-e2e-")
    env = LocalEnvironment(cwd=work, timeout=30)
    agent = DefaultAgent(model, env, **agent_cfg)
    try:
        agent.run("List the files in the current directory, then finish.")
    except Exception as e:  # step limit or format errors end the run; both are fine here
        print(f"  mini-swe-agent stopped: {type(e).__name__}")
    # Every model call leaves its response in the transcript: the
    # assistant message, or the format-error message a tiny model earns.
    calls = sum(1 for m in agent.messages if (m.get("extra") or {}).get("response") is not None)
    assert calls >= 1, "the agent made model calls through the proxy"
    s = session("mini-swe-agent")["stats"]
    assert s["requests"] == calls, (s, calls)
    assert s["fallbacks"] == 0, s
    # The agent's own transcript starts as it always does: the proxy changed nothing on its side.
    assert agent.messages[0]["role"] == "system"
    print(f"  mini-swe-agent: {calls} model calls, {len(agent.messages)} messages in its transcript")


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = 0
    for t in tests:
        try:
            t()
            passed += 1
            print(f"ok   {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
