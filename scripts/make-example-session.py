#!/usr/bin/env python3
"""Writes the project's own example transcripts into examples/ (or --out-dir):

- bugfix-session.json: a short, made-up but realistic OpenAI tool-calling
  session (an agent fixing a rounding bug in a small invoicing library), with
  bulky tool output the way real agents produce it;
- coding-session.json: a long multi-turn session (four asks, ~50k tokens at
  its peak) built by coding_session.py, for replays that compact.

Deterministic: re-running gives the same bytes. Standard library only.
"""
import argparse
import json
import pathlib
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import coding_session  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def source_listing():
    lines = ['"""Invoice arithmetic for the billing service."""', "", "from decimal import Decimal", ""]
    for i in range(1, 61):
        lines.append(f"def line_total_{i}(qty, unit_price, discount=Decimal('0')):")
        lines.append(f'    """Total of line kind {i}: quantity times unit price, minus discount."""')
        lines.append("    gross = qty * unit_price")
        lines.append("    return round(float(gross - discount), 2)" if i == 37 else "    return (gross - discount).quantize(Decimal('0.01'))")
        lines.append("")
    return "\n".join(f"{n + 1:4d}  {l}" for n, l in enumerate(lines))


def test_log(failing):
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
           "rootdir: /repo", "collected 184 items", ""]
    for mod in ["test_tax.py", "test_currency.py", "test_invoice.py", "test_reports.py"]:
        dots = "." * 46
        out.append(f"tests/{mod} {dots}{'F' if failing and mod == 'test_invoice.py' else '.'}   [ {25 * (1 + ['test_tax.py', 'test_currency.py', 'test_invoice.py', 'test_reports.py'].index(mod))}%]")
    if failing:
        out += ["", "=================================== FAILURES ===================================",
                "_____________________________ test_line_total_37 ______________________________", "",
                "    def test_line_total_37():",
                ">       assert line_total_37(Decimal('3'), Decimal('19.99')) == Decimal('59.97')",
                "E       AssertionError: assert 59.97 == Decimal('59.97')",
                "E        +  where 59.97 = line_total_37(Decimal('3'), Decimal('19.99'))", "",
                "tests/test_invoice.py:211: AssertionError",
                "=========================== short test summary info ============================",
                "FAILED tests/test_invoice.py::test_line_total_37 - AssertionError: assert 59.97 == Decimal('59.97')",
                "========================= 1 failed, 183 passed in 2.41s ========================="]
    else:
        out += ["", "============================= 184 passed in 2.38s =============================="]
    return "\n".join(out)


def grep_output():
    rows = []
    for i in range(1, 61):
        rows.append(f"billing/invoice.py:{5 * i}:def line_total_{i}(qty, unit_price, discount=Decimal('0')):")
    for i in range(1, 41):
        rows.append(f"tests/test_invoice.py:{5 * i + 11}:    assert line_total_{i}(Decimal('2'), Decimal('1.10')) == Decimal('2.20')")
    return "\n".join(rows)


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def bugfix_session():
    return [
        {"role": "system", "content": "You are a careful coding agent working in /repo. Use the bash tool to inspect and change files. Run the tests before you finish."},
        {"role": "user", "content": "Invoices for kind-37 lines come out as floats and the nightly reconciliation fails with `TypeError: unsupported operand type(s) for +: 'float' and 'decimal.Decimal'`. Please find the cause and fix it without changing the public API."},
        {"role": "assistant", "content": "I'll start by locating the line-total functions.", "tool_calls": [call("call_01", "bash", {"command": "grep -rn 'line_total_' billing tests | head -100"})]},
        {"role": "tool", "tool_call_id": "call_01", "content": grep_output()},
        {"role": "assistant", "content": None, "tool_calls": [call("call_02", "bash", {"command": "cat -n billing/invoice.py"}), call("call_03", "bash", {"command": "python -m pytest -q tests"})]},
        {"role": "tool", "tool_call_id": "call_02", "content": source_listing()},
        {"role": "tool", "tool_call_id": "call_03", "content": test_log(True)},
        {"role": "assistant", "content": "`line_total_37` converts to float and rounds, unlike every other kind, which quantizes the Decimal. That explains both the failing test and the TypeError downstream. I'll make it quantize like the others.", "tool_calls": [call("call_04", "bash", {"command": "sed -i \"s/    return round(float(gross - discount), 2)/    return (gross - discount).quantize(Decimal('0.01'))/\" billing/invoice.py && sed -n 184,188p billing/invoice.py"})]},
        {"role": "tool", "tool_call_id": "call_04", "content": "def line_total_37(qty, unit_price, discount=Decimal('0')):\n    \"\"\"Total of line kind 37: quantity times unit price, minus discount.\"\"\"\n    gross = qty * unit_price\n    return (gross - discount).quantize(Decimal('0.01'))\n"},
        {"role": "user", "content": "Also make sure the reconciliation script itself would have caught this: it should fail loudly on a float."},
        {"role": "assistant", "content": None, "tool_calls": [call("call_05", "bash", {"command": "cat -n billing/reconcile.py | head -80"})]},
        {"role": "tool", "tool_call_id": "call_05", "content": "\n".join(f"{n:4d}  " + t for n, t in enumerate([
            '"""Nightly reconciliation of invoices against the ledger."""', "", "from decimal import Decimal", "from billing import invoice, ledger", "",
            "def reconcile(day):", "    total = Decimal('0')", "    for line in invoice.lines_for(day):", "        total += line.total", "    return ledger.compare(day, total)",
        ] * 6, start=1))},
        {"role": "assistant", "content": "I'll add a type check that names the offending line.", "tool_calls": [call("call_06", "bash", {"command": "python - <<'EOF'\nimport re, pathlib\np = pathlib.Path('billing/reconcile.py')\ns = p.read_text()\ns = s.replace(\"        total += line.total\", \"        if not isinstance(line.total, Decimal):\\n            raise TypeError(f'line {line.id}: total is {type(line.total).__name__}, expected Decimal')\\n        total += line.total\", 1)\np.write_text(s)\nEOF\npython -m pytest -q tests"})]},
        {"role": "tool", "tool_call_id": "call_06", "content": test_log(False)},
        {"role": "assistant", "content": "Fixed. `line_total_37` now quantizes the Decimal like the other kinds (billing/invoice.py:187), and `reconcile()` raises a TypeError naming the line if a total is ever not a Decimal (billing/reconcile.py:9). All 184 tests pass."},
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out-dir", type=pathlib.Path, default=ROOT / "examples")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    bugfix = bugfix_session()
    out = args.out_dir / "bugfix-session.json"
    out.write_text(json.dumps(bugfix, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({len(bugfix)} messages)")
    out = args.out_dir / "coding-session.json"
    out.write_text(coding_session.render())
    print(f"wrote {out} ({len(coding_session.build())} messages)")


if __name__ == "__main__":
    main()
