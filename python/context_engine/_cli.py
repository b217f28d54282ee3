"""The ``ctx`` command a wheel installs (``[project.scripts]``).

The command line is the Rust ``ctx`` itself, linked into the extension
(``_native.run_cli``): same flags, output and exit codes as the binary, no
second native program in the wheel. Signals behave as for a native tool:
Ctrl-C (SIGINT) ends the process (``ctx serve`` catches it and shuts down
cleanly, as the binary does), and a closed stdout (``ctx ... | head``)
ends it quietly, without a Python traceback.
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> None:
    """Runs ``ctx`` with ``argv`` (default ``sys.argv``, the program name
    first) and exits with its status."""
    # The default actions, as a C or Rust program has them: Python's own
    # handlers only set a flag, which nothing reads while the engine runs.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        from ._native import run_cli

        code = run_cli(list(sys.argv if argv is None else argv))
    except KeyboardInterrupt:  # Ctrl-C before the handler above was set
        code = 128 + signal.SIGINT
    sys.exit(code)


if __name__ == "__main__":
    main()
