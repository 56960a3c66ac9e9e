"""Entry point for `accelerate launch` in the multi-process job tests: `launched.py [--kill-rank R] ARGS [--then
ARGS ...]` runs `specmm ARGS` for each command in turn (one launch, so the processes start once); with --kill-rank
the process of rank R SIGKILLs itself right after its first result write."""

from __future__ import annotations

import os
import signal
import sys

from specmm.cli import main
from specmm.jobs import Journal


def kill_after_first_write(rank: int) -> None:
    original = Journal.append

    def append(self, records):
        records = list(records)
        original(self, records)
        if records and int(os.environ.get("RANK", "0")) == rank:
            os.kill(os.getpid(), signal.SIGKILL)
    Journal.append = append


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--kill-rank"]:
        kill_after_first_write(int(argv[1]))
        argv = argv[2:]
    commands, current = [], []
    for arg in argv:
        if arg == "--then":
            commands.append(current)
            current = []
        else:
            current.append(arg)
    for command in [*commands, current]:
        code = main(command)
        if code:
            sys.exit(code)
