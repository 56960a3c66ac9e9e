"""Where a round's time goes: draft, verify, accept+commit, and the loop's other bookkeeping.

Profiling synchronises the device at every phase boundary, so it changes what it measures a little and
adds host syncs: benchmarks report the split from a separate profiled run, never from a timed row.
"""

from __future__ import annotations

import time

import torch

PHASES = ("draft", "verify", "accept_commit", "other")


class RoundTimer:
    """Accumulates device-synchronised seconds per phase; `mark(phase)` closes the phase that just ran."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.last = time.perf_counter()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def reset(self) -> None:
        """Start timing from now (what ran before is not a round's)."""
        self.last = self._now()

    def mark(self, phase: str) -> None:
        now = self._now()
        self.seconds[phase] += now - self.last
        self.last = now
