#!/usr/bin/env python3
"""A test plugin that misbehaves on demand.

Config section (from `initialize`): `mode` (or env MISBEHAVE_MODE), `on`
(the method that misbehaves, default `compress`), `log` (a file receiving
one line per request method: how tests count round trips), `capabilities`
(what to declare; default every hook implemented here), `stdin_log` (a
file receiving every line read from stdin, verbatim: what left the host).

Modes: ok, crash, crash_once (crash the first time only, across restarts),
hang, garbage, wrong_id, invalid (an orphan tool result), bigger (not
smaller), stderr_noise (lots of stderr, then ok), log_note (a `log`
notification, then ok).
"""

import json
import os
import sys
import time

config = {}


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def record(method):
    path = config.get("log")
    if path:
        with open(path, "a") as f:
            f.write(method + "\n")


def shorter(messages):
    """The system messages plus the last message, which must be a user
    message for the result to be valid."""
    head = [m for m in messages if m.get("role") == "system"]
    return head + messages[-1:]


def answer(method, params):
    if method == "initialize":
        caps = config.get("capabilities")
        if caps is None:
            caps = ["compress", "should_compress", "select_context", "get_status",
                    "prune_tool_results_only", "handle_tool_call"]
        return {"name": "misbehave", "protocol_version": 1, "capabilities": caps,
                "tools": [{"type": "function", "function": {"name": "noop", "parameters": {}}}]}
    if method == "compress":
        return {"messages": shorter(params["messages"])}
    if method == "should_compress":
        return True
    if method == "select_context":
        return {"messages": None}
    if method == "prune_tool_results_only":
        return {"messages": None, "pruned": 0}
    if method == "get_status":
        return {"mode": config.get("mode")}
    if method == "handle_tool_call":
        return json.dumps({"ok": params.get("name")})
    return None


def misbehave(mode, method, rid, params):
    """Returns True when the request was answered (or must not be)."""
    if mode == "crash_once":
        marker = (config.get("log") or "/nonexistent") + ".crashed"
        if os.path.exists(marker):
            return False
        open(marker, "w").close()
        mode = "crash"
    if mode == "crash":
        print("misbehave: crashing on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    if mode == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        return True
    if mode == "wrong_id":
        reply({"jsonrpc": "2.0", "id": rid + 100, "result": answer(method, params)})
        return True
    if mode == "invalid":
        orphan = {"role": "tool", "tool_call_id": "nope", "content": "orphan"}
        if method == "select_context":
            reply({"jsonrpc": "2.0", "id": rid, "result": {"messages": [orphan]}})
        else:
            reply({"jsonrpc": "2.0", "id": rid,
                   "result": {"messages": params["messages"][:1] + [orphan]}})
        return True
    if mode == "bigger":
        extra = {"role": "user", "content": "more " * 50}
        reply({"jsonrpc": "2.0", "id": rid,
               "result": {"messages": params["messages"] + [extra]}})
        return True
    if mode == "stderr_noise":
        for i in range(2000):
            print(f"noise line {i} " + "x" * 100, file=sys.stderr)
        sys.stderr.flush()
        return False
    if mode == "log_note":
        reply({"jsonrpc": "2.0", "method": "log", "params": {"message": "a note from the plugin"}})
        return False
    return False


def main():
    global config
    stdin_log = None
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("method") == "initialize":
            stdin_log = ((request.get("params") or {}).get("config") or {}).get("stdin_log")
        if stdin_log:
            with open(stdin_log, "a") as f:
                f.write(line)
        method = request.get("method") or ""
        if "id" not in request:
            if method == "exit":
                return
            continue
        rid = request["id"]
        params = request.get("params") or {}
        if method == "initialize":
            config = params.get("config") or {}
        record(method)
        mode = config.get("mode") or os.environ.get("MISBEHAVE_MODE") or "ok"
        if method == config.get("on", "compress") and misbehave(mode, method, rid, params):
            continue
        reply({"jsonrpc": "2.0", "id": rid, "result": answer(method, params)})


if __name__ == "__main__":
    main()
