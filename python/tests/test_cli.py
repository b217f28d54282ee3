"""The `ctx` command the package installs (`[project.scripts]`): the Rust
command line running inside the extension (`context_engine._cli`).

It must behave as the binary does: same version and exit codes, the
README's main job, `ctx serve` answering (its first request costing what the
second does: the tokenizer tables are ready before it listens), a closed
stdout (`ctx ... | head`) and Ctrl-C ending it quietly, never with a Python
traceback.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import context_engine as ce
from conftest import EXAMPLES, ROOT, require
from scripted_server import ScriptedServer


def ctx_bin() -> str:
    exe = Path(sys.executable).with_name("ctx")
    require(exe.exists(), f"the `ctx` console script is not installed beside {sys.executable}")
    return str(exe)


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ctx_bin(), *args], cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_version_and_bad_flags():
    p = run("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"ctx {ce.__version__}"
    bad = run("--no-such-flag")
    assert bad.returncode == 2
    assert "unexpected argument" in bad.stderr and "Traceback" not in bad.stderr


def test_the_readme_main_job():
    p = run("replay", "examples/coding-session.json", "--context-length", "16000")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "37 model calls replayed" in p.stdout
    assert "Traceback" not in p.stderr


def test_exit_code_of_a_check_that_finds_wanting(tmp_path):
    # A tool result without its call: `ctx validate` exits 1, as the binary.
    bad = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "orphan"}]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    p = run("validate", str(path))
    assert p.returncode == 1, (p.stdout, p.stderr)


def test_piped_into_head_ends_quietly():
    # `ctx redact` writes the 180 KB session back: more than a pipe holds,
    # so the reader closing early is a write to a closed pipe.
    proc = subprocess.Popen(
        [ctx_bin(), "redact", str(EXAMPLES / "coding-session.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode(errors="replace")
    code = proc.wait(timeout=60)
    assert head.startswith(b"[")
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert code in (-signal.SIGPIPE, 141), (code, err)


def test_ctrl_c_ends_a_waiting_command():
    # `ctx redact -` waits on stdin, inside the extension.
    proc = subprocess.Popen(
        [ctx_bin(), "redact", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err


def chat(url: str, content: str) -> float:
    body: Dict[str, Any] = {
        "model": "scripted-model",
        "messages": [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": content},
        ],
    }
    req = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test-not-a-real-key"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        reply = json.loads(r.read())
    elapsed = time.perf_counter() - start
    assert reply["choices"][0]["message"]["content"]
    return elapsed


def test_serve_answers_and_stops_on_ctrl_c():
    upstream = ScriptedServer([], final_text="done")
    port = free_port()
    proc = subprocess.Popen(
        [ctx_bin(), "serve", "--upstream", upstream.base_url, "--listen", f"127.0.0.1:{port}",
         "--context-length", "16000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        while True:
            try:
                assert get(f"{base}/healthz") is not None
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.perf_counter() - started < 60, "ctx serve did not answer /healthz in 60 s"
                time.sleep(0.05)
        ready = time.perf_counter() - started
        text = "Read notes.txt and report. " * 200
        times: List[float] = [chat(f"{base}/v1", text + str(i)) for i in range(4)]
        metrics = get(f"{base}/metrics")
        assert "ctx_requests_total" in metrics
        first, second = times[0], min(times[1:])
        print(f"ctx serve: ready in {ready * 1000:.0f} ms; first request {first * 1000:.1f} ms, "
              f"next {', '.join(f'{t * 1000:.1f}' for t in times[1:])} ms")
        # The tables are built before the proxy listens: no request pays
        # for them (a build would cost over a second here). The bound has
        # room for a busy machine; the figures above are the measurement.
        assert first <= 2 * second + 0.25, times
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            upstream.close()
    assert proc.returncode == 0, err[-2000:]
    assert b"Traceback" not in err, err[-2000:]
