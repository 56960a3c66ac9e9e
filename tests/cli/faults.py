"""Fault injection for job tests: run a command in a forked child that SIGKILLs itself at its n-th write of an
output (optionally half-way through that write), so a test can resume the job and compare with an uninterrupted run.

Forking keeps these tests fast (no new interpreter, no re-import of torch). The kill point is where a real kill
does the most damage: inside or right after an output write. Tests draw it with a seeded `random.Random`, so every
run of the suite kills at the same place and a failure reproduces.
"""

from __future__ import annotations

import io
import os
import random
import signal
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

import specmm.jobs
from specmm.cli import main
from specmm.jobs import Journal


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def write_hooks(kind: str, on_write: Callable[[int, Callable[[], None], Callable[[], None]], None]):
    """Patch the writes of `kind` ("journal": result lines, "png": class images, "torch": torch.save). Each write
    calls `on_write(number, write_whole, write_half)` (numbers from 1), which decides what happens."""
    saved = []

    def patch(owner, name, new):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    count = [0]
    if kind == "journal":
        original = Journal.append

        def append(self, records):
            records = list(records)
            if not records:
                return original(self, records)
            count[0] += 1

            def half():
                text = "".join(__import__("json").dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
                with open(self.path, "ab") as f:
                    f.write(text[: len(text) // 2])
                    f.flush()
                    os.fsync(f.fileno())
            on_write(count[0], lambda: original(self, records), half)
        patch(Journal, "append", append)
    elif kind == "png":
        original = specmm.jobs.atomic_save_image

        def save(image, path, format="PNG"):
            path = Path(path)
            if not path.name.startswith("class"):
                return original(image, path, format)
            count[0] += 1

            def half():  # a killed atomic write leaves half a temporary, never half a PNG under its name
                buffer = io.BytesIO()
                image.save(buffer, format=format)
                (path.parent / f".{path.name}.{os.getpid()}.tmp").write_bytes(buffer.getvalue()[:100])
            on_write(count[0], lambda: original(image, path, format), half)
        patch(specmm.jobs, "atomic_save_image", save)
    elif kind == "torch":
        original = torch.save

        def save(obj, f, *args, **kwargs):
            count[0] += 1

            def half():
                buffer = io.BytesIO()
                original(obj, buffer, *args, **kwargs)
                data = buffer.getvalue()[: buffer.tell() // 2]
                if hasattr(f, "write"):
                    f.write(data)
                    f.flush()
                else:
                    Path(f).write_bytes(data)
            on_write(count[0], lambda: original(obj, f, *args, **kwargs), half)
        patch(torch, "save", save)
    else:
        raise ValueError(f"kind: expected journal, png or torch, got {kind!r}")
    try:
        yield count
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def count_writes(kind: str, run: Callable[[], object]) -> int:
    """Run `run()` here, uninterrupted, and return how many writes of `kind` it made."""
    with write_hooks(kind, lambda n, whole, half: whole()) as count:
        run()
    return count[0]


def kill_point(seed: int, writes: int) -> tuple[int, bool]:
    """(write number in 1..writes-1, whether to die half-way through it), drawn from `seed`."""
    assert writes >= 2, f"the job made {writes} writes: too few to kill it in the middle"
    rng = random.Random(seed)
    return rng.randint(1, writes - 1), rng.random() < 0.5


def run_killed(kind: str, at: int, torn: bool, run: Callable[[], object]) -> None:
    """Run `run()` in a forked child that SIGKILLs itself at its `at`-th write of `kind` (after writing half of it
    when `torn`, else after the whole write); asserts the child died by that SIGKILL."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            def on_write(number, whole, half):
                if number == at:
                    half() if torn else whole()
                    _die()
                whole()
            with write_hooks(kind, on_write):
                run()
            os._exit(3)  # finished before the kill point
        except BaseException:  # noqa: BLE001
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the job was meant to die by SIGKILL at write {at}, exit status {status}")


def cli(argv: list[str]) -> Callable[[], None]:
    """A run of `specmm argv` that must succeed."""
    def run():
        code = main(argv)
        assert code == 0, f"specmm {' '.join(argv)} exited {code}"
    return run
