"""The `specmm` console script: `specmm.cli.main`, with Ctrl-C during start-up (importing torch and transformers
takes seconds) reported in one line, as Ctrl-C later is. It lives outside the `specmm` package because importing
anything inside it runs `specmm/__init__.py`, which imports torch."""

from __future__ import annotations

import sys

INTERRUPTED = "specmm: interrupted; what was finished is kept (a job or bench with --resume goes on from there)"


def main() -> int:
    try:
        from specmm.cli import main as run
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    return run()
