"""Output locks: a second writer is refused with the first one's PID, and a SIGKILLed holder frees the lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from specmm.jobs import JobLockedError, OutputLock
from specmm.jobs import lock as lock_module


def test_a_second_writer_is_refused_naming_the_holder_pid(tmp_path):
    out = tmp_path / "captions.jsonl"
    with OutputLock(tmp_path / "captions.jsonl.lock", "--out", out):
        with pytest.raises(JobLockedError, match=rf"--out: .*captions.jsonl is being written by another specmm job "
                                                 rf"\(PID {os.getpid()}"):
            OutputLock(tmp_path / "captions.jsonl.lock", "--out", out).acquire()
    with OutputLock(tmp_path / "captions.jsonl.lock"):  # released on exit
        pass


def test_a_killed_holder_releases_the_lock(tmp_path):
    lock = tmp_path / "job.lock"
    # the lock module alone (it imports only the standard library): no torch import in the child
    holder = subprocess.Popen([sys.executable, "-c", (
        "import importlib.util, sys, time; spec = importlib.util.spec_from_file_location('lock', sys.argv[2]); "
        "lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock); "
        "lock.OutputLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)"),
        str(lock), lock_module.__file__], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(JobLockedError, match=f"PID {holder.pid}"):
            OutputLock(lock).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 10
        while True:  # the kernel drops a dead process's flock at once; allow for a slow reaper anyway
            try:
                OutputLock(lock).acquire().release()
                break
            except JobLockedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
