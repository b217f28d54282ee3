#!/usr/bin/env python3
"""path-includes.py [ROOT]: no `#[path]` include reaches into another crate.

Test support shared by several crates lives in `crates/context-engine-testkit` (a dev-dependency),
never in one crate's `tests/` included by the others through `#[path = "../../other/…"]`. Resolves
each `#[path = "…"]` under ROOT/crates (relative to the including file's folder) and fails, with
file:line, when the target lies outside the including file's crate. A crate's own submodules may
still use `#[path]` (an integration test's helpers in a folder named for it).
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
crates = os.path.join(root, "crates")
PATH = re.compile(r'^\s*#\[path\s*=\s*"([^"]+)"\]', re.M)

bad = []
for crate in sorted(os.listdir(crates)):
    base = os.path.join(crates, crate)
    for folder, _, files in os.walk(base):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in PATH.finditer(text):
                target = os.path.normpath(os.path.join(folder, m.group(1)))
                if os.path.commonpath([target, base]) != base:
                    line = text.count("\n", 0, m.start()) + 1
                    bad.append(f"{os.path.relpath(path, root)}:{line}: includes {m.group(1)}")
if bad:
    print("\n".join(bad))
    print("path-includes: share test code through crates/context-engine-testkit, not #[path]", file=sys.stderr)
    sys.exit(1)
