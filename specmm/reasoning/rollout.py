"""RolloutBatch: what step speculation produced, in the form RL trainers consume.

Behaviour log-probs are under the model that sampled each token, after the sampling order (temperature,
top-k, top-p), so a trainer can form importance ratios. A mixed rollout is off-policy at the step level:
a kept draft step's log-probs ignore the judge's selection, so `exact` is True only when every token was
sampled from the target's own distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specmm.core.stats import GenerationStats
from specmm.reasoning.timing import busy_share

DRAFT, TARGET = 0, 1  # values of `source`


@dataclass
class RolloutBatch:
    prompt_ids: Tensor  # [B, L] left-padded as given
    prompt_mask: Tensor  # [B, L]
    completion_ids: Tensor  # [B, N] right-padded with pad_token_id
    completion_mask: Tensor  # [B, N] 1 for generated tokens (through EOS)
    behaviour_logprobs: Tensor  # [B, N] float32, 0 at padding
    source: Tensor  # [B, N] int8: DRAFT, TARGET, -1 at padding
    step_spans: list[list[tuple[int, int]]]  # per row: [start, end) of each step in completion_ids
    scores: list[list[float]]  # per row and step: the policy's score (nan when nothing was scored)
    decisions: list[list[bool | None]]  # per row and step: draft step kept (True), regenerated (False), None: no check
    exact: bool  # every token sampled from the target's own distribution
    stats: GenerationStats = field(default_factory=GenerationStats)  # with `reasoning` extras; wall time included
    phase_time_s: dict = field(default_factory=dict)  # device-synchronised exclusive seconds per phase (timing.py)
    latency_s: list[float] = field(default_factory=list)  # per row: seconds from joining the batch to its last step

    @property
    def busy_share(self) -> dict[str, float]:
        """Share of the wall time each model ('draft', 'target') was busy."""
        return busy_share(self.phase_time_s, self.stats.wall_time_s)

    @property
    def completions(self) -> list[list[int]]:
        return [row[mask.bool()].tolist() for row, mask in zip(self.completion_ids, self.completion_mask)]

    @property
    def acceptance_rate(self) -> float:
        """Share of checked draft steps that were kept."""
        checked = [d for row in self.decisions for d in row if d is not None]
        return sum(checked) / len(checked) if checked else float("nan")

    def to_trl(self) -> dict:
        """What a TRL GRPOTrainer `rollout_func` returns: prompt_ids, completion_ids, logprobs (lists per row);
        the extra keys reach reward functions."""
        prompts = [row[mask.bool()].tolist() for row, mask in zip(self.prompt_ids, self.prompt_mask)]
        logprobs = [row[mask.bool()].tolist() for row, mask in zip(self.behaviour_logprobs, self.completion_mask)]
        sources = [row[mask.bool()].tolist() for row, mask in zip(self.source, self.completion_mask)]
        return {"prompt_ids": prompts, "completion_ids": self.completions, "logprobs": logprobs,
                "source": sources, "step_spans": self.step_spans, "exact": [self.exact] * len(prompts)}


@dataclass
class RowRecords:
    """What every row produced, in prompt order (per-row lists), before `assemble` pads them."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    sources: list[list[int]]
    spans: list[list[tuple[int, int]]]
    scores: list[list[float]]
    decisions: list[list[bool | None]]
    latency: list[float]

    @classmethod
    def empty(cls, rows: int) -> RowRecords:
        return cls(*([[] for _ in range(rows)] for _ in range(6)), [0.0] * rows)

    def write(self, first: int, run) -> None:
        """Copy a lockstep run's rows (its per-row lists) to rows first, first + 1, ..."""
        for name in ("tokens", "logprobs", "sources", "spans", "scores", "decisions", "latency"):
            values = getattr(run, name)
            getattr(self, name)[first: first + len(values)] = values


def assemble(prompt_ids: Tensor, prompt_mask: Tensor, tokens: list[list[int]], logprobs: list[list[float]],
             sources: list[list[int]], pad_token_id: int, **fields) -> RolloutBatch:
    """Right-pad per-row lists into a RolloutBatch."""
    width = max((len(t) for t in tokens), default=0)
    batch = len(tokens)
    ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    lp = torch.zeros(batch, width, dtype=torch.float32)
    src = torch.full((batch, width), -1, dtype=torch.int8)
    for b in range(batch):
        n = len(tokens[b])
        ids[b, :n] = torch.tensor(tokens[b], dtype=torch.long)
        mask[b, :n] = 1
        lp[b, :n] = torch.tensor(logprobs[b], dtype=torch.float32)
        src[b, :n] = torch.tensor(sources[b], dtype=torch.int8)
    return RolloutBatch(prompt_ids.cpu(), prompt_mask.cpu(), ids, mask, lp, src, **fields)
