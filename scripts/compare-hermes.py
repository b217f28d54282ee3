#!/usr/bin/env python3
"""Compaction size beside Hermes 0.19's own compressor, on the same input.

    python3 scripts/compare-hermes.py SESSION.json [SESSION.json ...]

For each chat-completions transcript (a JSON array of messages) it compacts
the whole transcript once at a 64K window (`--window` to change it) with:

- `ctx compact` under the default (`openai`) profile,
- `ctx compact --profile strict` (roles alternate, the talk opens with a
  user turn: what Anthropic-like chat templates of local servers enforce),
- Hermes's `agent.context_compressor.ContextCompressor`, forced, with no
  model reachable (its summary call fails at once, on a closed loopback
  port, and it inserts its deterministic "summary unavailable" handoff),

and prints the tokens after (counted by `ctx inspect`, o200k), whether the
result passes `ctx validate --profile strict`, and the ratios the issue
asks for (strict/default, strict/Hermes). Run it with the Python that has
`hermes-agent==0.19.0` (scripts/python-tests.sh install puts one in
.cache/python-venv) and `CTX` naming the `ctx` binary (default
target/debug/ctx). Nothing here is a test: the figures go in
docs/benchmarks.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CTX = os.environ.get("CTX", "target/debug/ctx")


def ctx(*args):
    return subprocess.run([CTX, *args], capture_output=True, text=True)


def tokens(path):
    out = ctx("inspect", path, "--json")
    if out.returncode != 0:
        sys.exit(f"ctx inspect {path}: {out.stderr.strip()}")
    return json.loads(out.stdout)["tokens"]


def strict_valid(path):
    return ctx("validate", path, "--profile", "strict").returncode == 0


def ctx_compact(path, window, profile, out):
    run = ctx(
        "compact", path, "--context-length", str(window), "--profile", profile,
        "-o", out, "--report", "json",
    )
    if run.returncode not in (0, 1):
        sys.exit(f"ctx compact {path} ({profile}): {run.stderr.strip()}")


def hermes_compact(messages, window, out):
    from agent.context_compressor import ContextCompressor

    compressor = ContextCompressor(
        model="gpt-4o",
        config_context_length=window,
        base_url="http://127.0.0.1:9/v1",
        api_key="unused",
        provider="openai",
        quiet_mode=True,
    )
    compacted = compressor.compress(messages, force=True)
    with open(out, "w") as f:
        json.dump(compacted, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sessions", nargs="+")
    parser.add_argument("--window", type=int, default=64_000)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="ctx-hermes-")
    print(f"{'session':40} {'before':>8} {'ctx':>8} {'strict':>8} {'hermes':>8}"
          f" {'strict/ctx':>10} {'strict/hermes':>13}  strict-valid (ctx, strict, hermes)")
    for path in args.sessions:
        with open(path) as f:
            messages = json.load(f)
        name = os.path.basename(path)
        outs = {k: os.path.join(tmp, f"{name}.{k}.json") for k in ("ctx", "strict", "hermes")}
        ctx_compact(path, args.window, "openai", outs["ctx"])
        ctx_compact(path, args.window, "strict", outs["strict"])
        hermes_compact(messages, args.window, outs["hermes"])
        t = {k: tokens(p) for k, p in outs.items()}
        valid = ", ".join("yes" if strict_valid(p) else "no" for p in outs.values())
        print(f"{name:40} {tokens(path):8} {t['ctx']:8} {t['strict']:8} {t['hermes']:8}"
              f" {t['strict'] / t['ctx']:10.2f} {t['strict'] / t['hermes']:13.2f}  {valid}")


if __name__ == "__main__":
    main()
