"""End to end: Hermes's own CLI (`hermes -z`) compacting through our engine.

Offline: a temporary HERMES_HOME with the plugin installed by
`python -m context_engine.hermes install`, a config that selects `ctx` and
points a custom provider at a scripted OpenAI-compatible server. The server
plays the model: it has Hermes's real `terminal` tool read files the test
wrote until the conversation crosses the threshold at a 64K window.

With the local model installed (`scripts/local-llm.sh install`, in
$LOCAL_LLM_DIR, default .cache/local-llm), a second test runs Hermes's agent
loop against llama.cpp for a few steps; it skips with a printed reason when
the model is not installed, and fails instead with CTX_REQUIRE_LOCAL_LLM=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import context_engine as ce
from conftest import ROOT, require
from scripted_server import ScriptedServer

TASK = "Read every notes file in the work folder and report the measurements."
FILES = 12
SUMMARY = "[CONTEXT SUMMARY"


def hermes_bin() -> str:
    exe = Path(sys.executable).with_name("hermes")
    found = str(exe) if exe.exists() else shutil.which("hermes")
    require(found is not None, "the `hermes` CLI (hermes-agent) is not installed")
    return found  # type: ignore[return-value]


def install_plugin(home: Path) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "context_engine.hermes", "install", "--hermes-home", str(home)],
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def write_config(home: Path, base_url: str, model: str, extra: str = "", model_extra: str = "") -> None:
    (home / "config.yaml").write_text(
        f"""model:
  provider: custom
  base_url: {base_url}
  default: {model}
  context_length: 64000
{model_extra}plugins:
  enabled: [ctx]
  entries:
    ctx:
      context:
        threshold_percent: 0.3
context:
  engine: ctx
{extra}""",
        encoding="utf-8",
    )


def run_hermes(home: Path, work: Path, prompt: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        HERMES_HOME=str(home),
        OPENAI_API_KEY="sk-test-not-a-real-key",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    env.pop("CTX_CONFIG", None)
    return subprocess.run(
        [hermes_bin(), "-z", prompt, "-t", "terminal"],
        cwd=str(work), env=env, capture_output=True, text=True, timeout=timeout,
    )


def text_of(request: Dict[str, Any]) -> str:
    return json.dumps(request.get("messages") or [])


def test_hermes_cli_compacts_through_our_engine(tmp_path):
    hermes_bin()
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    out = install_plugin(home)
    assert "plugins.enabled: [ctx]" in out and "context.engine: ctx" in out
    commands = []
    for i in range(FILES):
        path = work / f"notes_{i}.txt"
        path.write_text(
            "".join(f"notes_{i}.txt line {j}: measurement {i * 1000 + j} at station {j % 17} ok\n" for j in range(180)),
            encoding="utf-8",
        )
        commands.append(f"cat {path}")
    server = ScriptedServer(commands, final_text="FINISHED: all notes files were read.")
    try:
        write_config(home, server.base_url, server.model)
        p = run_hermes(home, work, TASK)
    finally:
        server.close()

    # Hermes finished the session.
    assert p.returncode == 0, p.stderr[-3000:]
    assert "FINISHED: all notes files were read." in p.stdout
    # The plugin registered, and Hermes selected it.
    log = (home / "logs" / "agent.log").read_text(encoding="utf-8", errors="replace")
    assert "registered context engine: ctx" in log

    requests: List[Dict[str, Any]] = server.agent_requests
    assert len(requests) == FILES + 1, [len(r["messages"]) for r in requests]
    # Hermes called our compress: our summary marker appears, first at k.
    marked = [SUMMARY in text_of(r) for r in requests]
    assert any(marked), "no request carries the engine's summary: compress never ran"
    k = marked.index(True)
    assert k >= 2 and all(marked[k:])
    tokens = [ce.count_tokens(r["messages"]) for r in requests]
    # Every request after the compaction is valid for the provider...
    for r in requests[k:]:
        assert ce.validate(r["messages"]) == [], ce.validate(r["messages"])
    # ... and smaller than the one that triggered it.
    assert tokens[k] < tokens[k - 1], tokens
    # Each later compaction shrank the request again.
    drops = [i for i in range(1, len(tokens)) if tokens[i] < tokens[i - 1]]
    assert drops and drops[0] == k
    # The user's task and the files read before the compaction are still
    # named in the request.
    after = text_of(requests[k])
    assert TASK in after
    for i in range(k):
        assert f"notes_{i}.txt" in after, f"notes_{i}.txt lost by the compaction before request {k}"
    # And the task survives every later compaction too.
    assert all(TASK in text_of(r) for r in requests[k:])


LOCAL_LLM = Path(os.environ.get("LOCAL_LLM_DIR") or ROOT / ".cache" / "local-llm")


def test_hermes_agent_loop_against_the_local_model(tmp_path):
    script = ROOT / "scripts" / "local-llm.sh"
    check = subprocess.run(["bash", str(script), "installed"], env=dict(os.environ, LOCAL_LLM_DIR=str(LOCAL_LLM)))
    installed = check.returncode == 0
    if not installed and os.environ.get("CTX_REQUIRE_LOCAL_LLM") != "1":
        import pytest

        pytest.skip(f"the local model is not installed in {LOCAL_LLM} (scripts/local-llm.sh install)")
    require(installed, f"the local model is not installed in {LOCAL_LLM} (scripts/local-llm.sh install)")
    hermes_bin()
    state = tmp_path / "llm.state"
    env = dict(os.environ, LOCAL_LLM_DIR=str(LOCAL_LLM), LOCAL_LLM_STATE=str(state), LOCAL_LLM_CTX="16384")
    start = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=300)
    require(start.returncode == 0, f"the local model server did not start: {start.stderr[-500:]}")
    base_url = start.stdout.strip().splitlines()[-1]
    try:
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        (work / "hello.txt").write_text("hello from the test\n", encoding="utf-8")
        install_plugin(home)
        # A few short steps: the model is tiny and the machine may be busy.
        write_config(home, base_url, "local", extra="agent:\n  max_turns: 3\n", model_extra="  max_tokens: 128\n")
        p = run_hermes(home, work, "Run `cat hello.txt` with the terminal tool and tell me what it says.", timeout=900)
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    log = (home / "logs" / "agent.log").read_text(encoding="utf-8", errors="replace")
    assert "registered context engine: ctx" in log
    assert "Context engine 'ctx' not found" not in log
