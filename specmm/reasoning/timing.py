"""Where a reasoning rollout's time goes: exclusive, device-synchronised seconds per phase.

Phases nest (a judge forward inside a policy decision is the target's time, not the policy's): entering a
phase pauses the one around it. `draft` and `target` are the models' busy time (forwards and the sampling
of their tokens); `policy` is deciding, `prefill` is prompts joining the batch, `other` is bookkeeping.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("draft", "target", "policy", "prefill", "other")


class PhaseTimer:
    """Accumulates exclusive seconds per phase; syncs the device at every phase boundary (CUDA)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}
        self._stack: list[str] = []
        self._mark = 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def __call__(self, phase: str):
        now = self._now()
        if self._stack:
            self._add(self._stack[-1], now - self._mark)
        self._stack.append(phase)
        self._mark = now
        try:
            yield
        finally:
            now = self._now()
            self._add(self._stack.pop(), now - self._mark)
            self._mark = now

    def move(self, seconds: float, phase: str) -> None:
        """Charge `seconds` of the running phase to `phase` instead (e.g. the draft part of a core round)."""
        self._add(phase, seconds)
        self._add(self._stack[-1], -seconds)


def busy_share(seconds: dict[str, float], wall_s: float) -> dict[str, float]:
    """Share of the wall time each model was busy: {'draft': ..., 'target': ...}."""
    return {model: seconds.get(model, 0.0) / wall_s if wall_s > 0 else 0.0 for model in ("draft", "target")}
