"""``python -m context_engine.hermes install [--hermes-home DIR]``.

Writes the Hermes plugin ``DIR/plugins/ctx/`` (``plugin.yaml`` and an
``__init__.py`` whose ``register(ctx)`` registers the engine) and prints the
two lines to add to Hermes's ``config.yaml``. ``DIR`` defaults to
``$HERMES_HOME``, else ``~/.hermes``. Hermes itself is not imported: the
plugin needs it only when Hermes loads it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from .. import __version__

PLUGIN = "ctx"

MANIFEST = f"""\
name: {PLUGIN}
version: "{__version__}"
description: "context-engine: Hermes's context compaction done by the Rust engine (exact tokens, provider-valid cuts, structured summaries)"
author: context-engine
"""

INIT = '''\
"""Hermes plugin `ctx`: context-engine as Hermes's context engine.

Written by `python -m context_engine.hermes install`; enable it with
`plugins.enabled: [ctx]` and select it with `context.engine: ctx`.
"""


def register(ctx):
    from context_engine.hermes import register as _register

    _register(ctx)
'''


def default_home() -> Path:
    """``$HERMES_HOME``, else ``~/.hermes``."""
    env = os.environ.get("HERMES_HOME")
    return Path(env).expanduser() if env else Path.home() / ".hermes"


def install(home: Path) -> Path:
    """Writes ``home/plugins/ctx/`` and returns its path."""
    target = home / "plugins" / PLUGIN
    target.mkdir(parents=True, exist_ok=True)
    (target / "plugin.yaml").write_text(MANIFEST, encoding="utf-8")
    (target / "__init__.py").write_text(INIT, encoding="utf-8")
    return target


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m context_engine.hermes",
        description="Install context-engine as a Hermes Agent context engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="write the Hermes plugin `ctx`")
    inst.add_argument(
        "--hermes-home",
        type=Path,
        default=None,
        help="Hermes's home folder (default: $HERMES_HOME, else ~/.hermes)",
    )
    args = parser.parse_args(argv)
    home = (args.hermes_home or default_home()).expanduser()
    try:
        target = install(home)
    except OSError as exc:
        print(f"error: cannot write the plugin under {home}: {exc}", file=sys.stderr)
        return 2
    print(f"installed the Hermes plugin `{PLUGIN}` in {target}")
    print(f"add these two settings to {home / 'config.yaml'}:")
    print()
    print(f"  plugins.enabled: [{PLUGIN}]")
    print(f"  context.engine: {PLUGIN}")
    print()
    print("that is, in YAML:")
    print(f"  plugins:\n    enabled: [{PLUGIN}]\n  context:\n    engine: {PLUGIN}")
    try:
        import agent.context_engine  # noqa: F401
    except ImportError:
        print(
            f"warning: Hermes (hermes-agent) is not importable from {sys.executable}; "
            "install context-engine into the Python environment Hermes runs in",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
