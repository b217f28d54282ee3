"""The interpreter is released during engine work, and one engine can be
shared by threads."""

from __future__ import annotations

import threading

import context_engine as ce
from conftest import tool_session


def test_other_threads_run_while_the_engine_works():
    big = tool_session(300, result_bytes=8000)  # ~2.4 MB
    done = threading.Event()
    started = threading.Event()
    result = {}

    def work():
        started.set()
        result["n"] = ce.count_tokens(big)
        result["out"] = ce.Compressor(16000, use_config=False).compress(big)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    spins = 0
    while not done.is_set():
        spins += 1
    t.join()
    assert result["n"] > 0 and len(result["out"]) < len(big)
    # With the interpreter held for the whole call this loop could not run
    # while the engine parsed, counted and compacted ~2.4 MB.
    assert spins > 1000, spins


def test_one_engine_shared_by_threads():
    e = ce.Compressor(16000, use_config=False)
    session = tool_session(40)
    errors = []

    def work(i):
        try:
            for _ in range(3):
                e.update_from_response({"prompt_tokens": i, "completion_tokens": 1, "total_tokens": i + 1})
                e.should_compress()
                assert ce.validate(e.select_context(session) or session) == []
                e.count_tokens(session)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert e.last_prompt_tokens in range(4)
