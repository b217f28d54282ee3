"""Benchmarks of the Python layer (timeit; build the package in release
first: `PY_PROFILE=release bash scripts/python-tests.sh`, or
`pip install ./python`).

    python python/bench/bench.py

Prints microseconds per cheap hook call (native class and Hermes adapter),
dict conversion per MB (in, and in + out), and `compress` on a ~1 MB
session from Python; compare the last with
`cargo bench --manifest-path python/Cargo.toml --bench compress`, which
runs the same call on the same session from Rust.
"""

from __future__ import annotations

import json
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import context_engine as ce  # noqa: E402
from conftest import tool_session  # noqa: E402 (same generator as benches/compress.rs)

TURNS, RESULT_BYTES = 160, 6000  # ~1 MB, as in benches/compress.rs


def per_call_us(fn, number: int = 200_000, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def per_run_ms(fn, repeat: int = 15) -> float:
    times = timeit.repeat(fn, number=1, repeat=repeat)
    return statistics.median(times) * 1e3


def main() -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010}
    e = ce.Compressor(64000, use_config=False)
    rows = [
        ("native should_compress()", per_call_us(lambda: e.should_compress())),
        ("native update_from_response(usage)", per_call_us(lambda: e.update_from_response(usage))),
    ]
    try:
        from context_engine.hermes import CtxEngine

        a = CtxEngine({})
        a.update_model("m", 64000)
        rows += [
            ("hermes adapter should_compress()", per_call_us(lambda: a.should_compress())),
            ("hermes adapter update_from_response(usage)", per_call_us(lambda: a.update_from_response(usage))),
        ]
    except ImportError:
        print("(hermes-agent not installed: adapter rows skipped)", file=sys.stderr)
    baseline = per_call_us(lambda: None)
    rows.append(("python: empty lambda call (baseline)", baseline))

    msgs = tool_session(TURNS, RESULT_BYTES)
    mb = sum(len(json.dumps(m)) for m in msgs) / 1e6
    keep_all = 10**9
    conv_in = per_run_ms(lambda: ce.validate(msgs))
    conv_both = per_run_ms(lambda: ce.digest(msgs, keep_batches=keep_all))
    compress = per_run_ms(lambda: e.compress(msgs, force=True))
    count = per_run_ms(lambda: ce.count_tokens(msgs))

    print(f"{'hook':48} {'us/call':>8}")
    for name, us in rows:
        print(f"{name:48} {us:8.2f}")
    print()
    print(f"session: {len(msgs)} messages, {mb:.2f} MB of JSON")
    print(f"{'dicts -> Rust (validate: conversion + rules)':48} {conv_in:8.2f} ms  ({conv_in / mb:.2f} ms/MB)")
    print(f"{'dicts -> Rust -> dicts (digest, nothing digested)':48} {conv_both:8.2f} ms  ({conv_both / mb:.2f} ms/MB)")
    print(f"{'count_tokens(messages)':48} {count:8.2f} ms")
    print(f"{'compress from Python (median)':48} {compress:8.2f} ms")


if __name__ == "__main__":
    main()
