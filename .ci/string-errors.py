#!/usr/bin/env python3
"""string-errors.py [ROOT]: production code returns typed errors, never `Result<_, String>`.

Scans crates/*/src and python/src under ROOT for a `Result<T, String>` (any spelling: multi-line,
`std::result::Result`, a type alias, a closure's return type), comments left out. Test code is left
out: files named tests.rs, `tests/` folders, and items under `#[cfg(test)]` (an inline module, a
function, or a `mod x;` whose file is then skipped). Exit 1 with file:line for each offender.
Clippy has no lint for this (`result_unit_err` covers `Result<_, ()>` only).
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."

# Files allowed an offender for now; each entry must still have one (a stale one fails).
PENDING: set[str] = set()

CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


CHAR = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'")
RAW = re.compile(r'\br(#*)"')


def strip_comments(text):
    """Comments, string and char literals blanked (so that braces and words in them do not count);
    newlines kept, so line numbers stay."""
    out, i, n = [], 0, len(text)
    while i < n:
        raw = RAW.match(text, i) if text[i] == "r" else None
        char = CHAR.match(text, i) if text[i] == "'" else None
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif raw:
            j = text.find('"' + raw.group(1), raw.end())
            j = n if j < 0 else j + 1 + len(raw.group(1))
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif char:
            j = char.end()
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(" " + "\n" * text.count("\n", i, j))
        i = j
    return "".join(out)


def strip_cfg_test(text):
    """Blanks the item after each `#[cfg(test)]` (newlines kept); returns the text and the names
    of `mod x;` declared under it."""
    file_mods = []
    while True:
        m = CFG_TEST.search(text)
        if not m:
            return text, file_mods
        i = m.end()
        semi, brace = text.find(";", i), text.find("{", i)
        if brace < 0 or 0 <= semi < brace:
            end = len(text) if semi < 0 else semi + 1
            decl = re.search(r"\bmod\s+(\w+)\s*;", text[i:end])
            if decl:
                file_mods.append(decl.group(1))
        else:
            depth, end = 0, brace
            while end < len(text):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
                if depth == 0:
                    break
        text = text[: m.start()] + "\n" * text.count("\n", m.start(), end) + text[end:]


def offenders(text):
    """(line, type) of each `Result<_, String>` in `text`."""
    for m in re.finditer(r"\bResult\s*<", text):
        depth, j, args, cur = 1, m.end(), [], ""
        while j < len(text) and depth:
            c = text[j]
            if c in "<([":
                depth += 1
            elif c in ")]" or (c == ">" and text[j - 1] != "-"):
                depth -= 1
            if depth == 1 and c == ",":
                args.append(cur)
                cur = ""
            elif depth:
                cur += c
            j += 1
        args.append(cur)
        if len(args) >= 2 and args[1].strip() in ("String", "std::string::String", "alloc::string::String"):
            yield text.count("\n", 0, m.start()) + 1, " ".join(text[m.start() : j].split())


def sources():
    tops = [os.path.join(root, "crates", c, "src") for c in sorted(os.listdir(os.path.join(root, "crates")))]
    tops.append(os.path.join(root, "python", "src"))
    skipped = set()
    for top in tops:
        for dirpath, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "tests" and os.path.join(dirpath, d) not in skipped)
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if not f.endswith(".rs") or f == "tests.rs" or path in skipped:
                    continue
                text, test_mods = strip_cfg_test(strip_comments(open(path, encoding="utf-8").read()))
                stem = f[:-3]
                base = dirpath if stem in ("mod", "lib", "main") else os.path.join(dirpath, stem)
                for name in test_mods:
                    skipped.add(os.path.join(base, name + ".rs"))
                    skipped.add(os.path.join(base, name))
                yield os.path.relpath(path, root), text


found, pending_seen = 0, set()
for rel, text in sources():
    for line, ty in offenders(text):
        if rel in PENDING:
            pending_seen.add(rel)
            continue
        found += 1
        print(f"{rel}:{line}: {ty}")
for rel in sorted(PENDING - pending_seen):
    found += 1
    print(f"{rel}: no `Result<_, String>` left: remove it from PENDING in {sys.argv[0]}")
if found:
    print(f"ci: {found} production `Result<_, String>` (above): return a thiserror type of the module "
          "that owns the failure, with its context", file=sys.stderr)
sys.exit(1 if found else 0)
