"""Random draws per row, and the tape that lets a sampled round run as one compiled graph with eager mode's draws.

Glossary:
- draw: a [batch, *shape] tensor of U(0, 1) or Exp(1) variates, row b from its own generator when given per row.
- tape: a round's draws, made eagerly before the round from the generators, in the order the round asks for
  them, and read back by the round from one buffer. Generators cannot enter a compiled graph; the buffer can.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

Generators = torch.Generator | Sequence[torch.Generator] | None
"""`None` (global RNG), one generator for the whole batch, or one generator per row (or a `DrawTape`)."""


def _rand(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    return torch.rand(shape, generator=generator, device=device)


def _exponential(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    return torch.empty(shape, device=device).exponential_(generator=generator)


KINDS = {"uniform": _rand, "exponential": _exponential}


def draw(kind: str, batch: int, shape: tuple[int, ...], generators: Generators, device: torch.device) -> Tensor:
    """[batch, *shape] draws of `kind` ('uniform' | 'exponential'); from the tape when `generators` is one."""
    if isinstance(generators, DrawTape):
        return generators.take(kind, batch, shape)
    make = KINDS[kind]
    if generators is None or isinstance(generators, torch.Generator):
        return make((batch, *shape), generators, device)
    if len(generators) != batch:
        raise ValueError(f"generator: expected {batch} per-row generators, got {len(generators)}")
    return torch.stack([make(shape, g, device) for g in generators])


class DrawTape:
    """The draws of one round, recorded once and then made up front every round.

    1. Recording (the first round it is given to): each draw is made from `generators` as usual, and its kind and
       shape are written down.
    2. `refill()`: before each later round, every recorded draw is made again from `generators`, in the recorded
       order, into one [B, total] buffer (the same generator calls a round in eager mode makes).
    3. Replay: the round's `take` calls read the buffer in order (static offsets: no host sync, traceable; views,
       valid until the next refill), and `finish()` checks the round took exactly what was recorded.
    Rounds of one generation ask for the same draws (static shapes per tree spec and batch), so seeded outputs
    are eager mode's.
    """

    def __init__(self, generators: Generators, device: torch.device):
        self.generators, self.device = generators, device
        self.entries: list[tuple[str, int, tuple[int, ...]]] = []  # (kind, batch, shape) in draw order
        self.recording = True
        self.buffer: Tensor | None = None  # [B, total] the round's draws, flattened per row
        self.index = self.offset = 0

    def take(self, kind: str, batch: int, shape: tuple[int, ...]) -> Tensor:
        shape = tuple(shape)
        if self.recording:
            out = draw(kind, batch, shape, self.generators, self.device)
            self.entries.append((kind, batch, shape))
            return out
        if self.index >= len(self.entries) or self.entries[self.index] != (kind, batch, shape):
            raise RuntimeError(f"draw tape: the round asked for {kind} {(batch, *shape)} as draw {self.index}, but "
                               f"the recorded round drew {self.entries[self.index:self.index + 1]}")
        size = math.prod(shape)
        out = self.buffer[:, self.offset:self.offset + size].reshape(batch, *shape)
        self.index, self.offset = self.index + 1, self.offset + size
        return out

    def refill(self) -> None:
        """Stop recording (after the first round) and make the next round's draws, eagerly, in recorded order."""
        self.recording = False
        draws = [draw(kind, batch, shape, self.generators, self.device).flatten(1)
                 for kind, batch, shape in self.entries]
        if draws:
            if self.buffer is None:  # one buffer for every round: a compiled round sees the same input
                self.buffer = torch.empty(draws[0].shape[0], sum(d.shape[1] for d in draws), device=draws[0].device)
            torch.cat(draws, 1, out=self.buffer)  # [B, total]
        self.index = self.offset = 0

    def finish(self) -> None:
        """After a replayed round: it must have taken every recorded draw (else later draws would shift)."""
        if self.index != len(self.entries):
            raise RuntimeError(f"draw tape: the round took {self.index} of the {len(self.entries)} recorded draws")
