#!/usr/bin/env python3
"""last-turns: an example context engine plugin (standard library only).

Compaction keeps every system message and the last N real user turns, a
turn being a user message and everything after it up to the next one. The
cut is made only just before a real user message, so an assistant's tool
calls always stay with their results. `should_compress` fires at the
threshold; `get_status` reports what was dropped.

Protocol: JSON-RPC 2.0, one JSON object per line on stdin/stdout
(docs/plugin-protocol.md). Diagnostics go to stderr, never stdout.
"""

import json
import sys

PROTOCOL_VERSION = 1
METHODS = ("initialize", "should_compress", "compress", "has_content_to_compress",
           "get_status", "shutdown")
END_TOOL_RESULTS = "[END TOOL RESULTS]"


def log(text):
    print(f"last-turns: {text}", file=sys.stderr, flush=True)


def text_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict)
        )
    return ""


def is_real_user_turn(message):
    """A user message that is not a text tool-result re-entry."""
    if message.get("role") != "user":
        return False
    text = text_of(message)
    reentry = END_TOOL_RESULTS in text and any(
        line.startswith("[/") for line in text.splitlines()
    )
    return not reentry


class Engine:
    def __init__(self):
        self.keep_turns = 4
        self.threshold_percent = None
        self.compressions = 0
        self.dropped_messages = 0

    def initialize(self, params):
        config = params.get("config") or {}
        keep = config.get("keep_turns", 4)
        if not isinstance(keep, int) or keep < 1:
            raise RpcError(-32602, f"keep_turns must be a positive integer, got {keep!r}")
        self.keep_turns = keep
        self.threshold_percent = config.get("threshold_percent")
        log(f"keeping the last {self.keep_turns} user turns")
        return {
            "name": "last-turns",
            "protocol_version": PROTOCOL_VERSION,
            "capabilities": [
                "should_compress",
                "compress",
                "has_content_to_compress",
                "get_status",
            ],
            "tools": [],
        }

    def threshold(self, state):
        if self.threshold_percent is not None:
            return int(state.get("context_length", 0) * self.threshold_percent)
        return state.get("threshold_tokens", 0)

    def should_compress(self, params):
        tokens = params.get("prompt_tokens")
        threshold = self.threshold(params.get("state") or {})
        return tokens is not None and threshold > 0 and tokens >= threshold

    def cut(self, messages):
        """Index of the first kept non-system message, or None."""
        users = [i for i, m in enumerate(messages) if is_real_user_turn(m)]
        if len(users) <= self.keep_turns:
            return None
        start = users[-self.keep_turns]
        dropped = [m for m in messages[:start] if m.get("role") != "system"]
        return start if dropped else None

    def has_content_to_compress(self, params):
        return self.cut(params["messages"]) is not None

    def compress(self, params):
        messages = params["messages"]
        start = self.cut(messages)
        if start is None:
            raise RpcError(1, f"at most {self.keep_turns} user turns: nothing to drop")
        head = [m for m in messages[:start] if m.get("role") == "system"]
        kept = head + messages[start:]
        self.compressions += 1
        self.dropped_messages += len(messages) - len(kept)
        log(f"dropped {len(messages) - len(kept)} of {len(messages)} messages")
        return {"messages": kept}

    def get_status(self, params):
        return {
            "keep_turns": self.keep_turns,
            "compressions": self.compressions,
            "dropped_messages": self.dropped_messages,
        }

    def shutdown(self, params):
        return None


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def reply(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main():
    engine = Engine()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as e:
            log(f"ignoring a line that is not JSON: {e}")
            continue
        method = request.get("method") or ""
        if "id" not in request:  # a notification
            if method == "exit":
                break
            continue
        rid = request["id"]
        handler = getattr(engine, method, None) if method in METHODS else None
        if handler is None:
            reply({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": -32601, "message": f"unknown method {method}"}})
            continue
        try:
            result = handler(request.get("params") or {})
            reply({"jsonrpc": "2.0", "id": rid, "result": result})
        except RpcError as e:
            reply({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": e.code, "message": e.message}})
        except Exception as e:  # report, keep serving
            log(f"{method} failed: {e!r}")
            reply({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": -32603, "message": f"{type(e).__name__}: {e}"}})
    log("bye")


if __name__ == "__main__":
    main()
