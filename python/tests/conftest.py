"""Shared helpers: prerequisites that skip locally and fail under CI=true,
and transcripts to work on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CORPUS = ROOT.parent / "shared" / "corpus"


def in_ci() -> bool:
    """Whether the tests run under CI: `CI` is `true` (any case) or `1`,
    the rule of the Rust suites' test kit (`context_engine_testkit::in_ci`);
    `.ci/run` exports `CI=true` itself."""
    value = os.environ.get("CI", "")
    return value.lower() == "true" or value == "1"


def require(condition: bool, reason: str) -> None:
    """Skips the test with `reason` unless under CI ([`in_ci`]), where a
    missing prerequisite is a failure (a test must never pass silently)."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"prerequisite missing under CI=true: {reason}")
    pytest.skip(reason)


def example(name: str) -> List[Dict[str, Any]]:
    path = EXAMPLES / name
    require(path.is_file(), f"{path} is absent")
    return json.loads(path.read_text(encoding="utf-8"))


def tool_session(turns: int, result_bytes: int = 6000) -> List[Dict[str, Any]]:
    """A synthetic coding session: a task, then `turns` tool calls with big
    results and a short note after each."""
    msgs: List[Dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing test in tests/test_parser.py"},
    ]
    for i in range(turns):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"cat src/module_{i}.py"}),
                        },
                    }
                ],
            }
        )
        body = "\n".join(
            f"def function_{i}_{j}(x):  # line {j} of module {i}\n    return x * {j}"
            for j in range(result_bytes // 60)
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": body})
        msgs.append({"role": "assistant", "content": f"Read module {i}; nothing wrong yet."})
    msgs.append({"role": "user", "content": "Now run the tests again."})
    return msgs


@pytest.fixture
def session() -> List[Dict[str, Any]]:
    return tool_session(40)
